//! Checks between the objects of one file, made only when the referenced object is in the file:
//! the Services a Rollout names must select its pods, and the AnalysisTemplates it names must be
//! given every argument that has no value of its own.

use std::collections::BTreeMap;

use rollouts_crds::analysis::{AnalysisTemplate, ClusterAnalysisTemplate};
use rollouts_crds::rollout::{
    AnalysisRunArgument, DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY, Rollout, RolloutAnalysis,
};
use serde_json::Value;

use super::{Finding, Severity};

/// The Services and analysis templates defined in a file, by name.
#[derive(Debug, Default)]
pub struct FileObjects {
    service_selectors: BTreeMap<String, BTreeMap<String, String>>,
    template_args: BTreeMap<String, Vec<AnalysisRunArgument>>,
    cluster_template_args: BTreeMap<String, Vec<AnalysisRunArgument>>,
}

impl FileObjects {
    /// Collects the Services and templates among `documents` (others are ignored).
    pub fn collect(documents: &[Value]) -> Self {
        let mut objects = Self::default();
        for document in documents {
            let name = document
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            match document.get("kind").and_then(Value::as_str) {
                Some("Service") if document.get("apiVersion") == Some(&Value::from("v1")) => {
                    let selector = document
                        .pointer("/spec/selector")
                        .and_then(Value::as_object)
                        .map(|s| {
                            s.iter()
                                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                                .collect()
                        })
                        .unwrap_or_default();
                    objects.service_selectors.insert(name, selector);
                }
                Some("AnalysisTemplate") => {
                    if let Ok(template) =
                        serde_json::from_value::<AnalysisTemplate>(document.clone())
                    {
                        objects
                            .template_args
                            .insert(name, template.spec.args.clone());
                    }
                }
                Some("ClusterAnalysisTemplate") => {
                    if let Ok(template) =
                        serde_json::from_value::<ClusterAnalysisTemplate>(document.clone())
                    {
                        objects
                            .cluster_template_args
                            .insert(name, template.spec.args.clone());
                    }
                }
                _ => {}
            }
        }
        objects
    }
}

/// Every reference from `rollout` to an object of the file that does not fit.
pub fn check(rollout: &Rollout, objects: &FileObjects) -> Vec<Finding> {
    let mut findings = Vec::new();
    for (path, service) in named_services(rollout) {
        if let Some(selector) = objects.service_selectors.get(service) {
            findings.extend(service_selects_pods(rollout, &path, service, selector));
        }
    }
    for (path, analysis) in analyses(rollout) {
        findings.extend(missing_args(&path, analysis, objects));
    }
    findings
}

fn named_services(rollout: &Rollout) -> Vec<(String, &str)> {
    let mut named = Vec::new();
    if let Some(canary) = rollout.canary() {
        let path = "spec.strategy.canary";
        named.push((
            format!("{path}.canaryService"),
            canary.canary_service.as_deref(),
        ));
        named.push((
            format!("{path}.stableService"),
            canary.stable_service.as_deref(),
        ));
        if let Some(ping_pong) = &canary.ping_pong {
            named.push((
                format!("{path}.pingPong.pingService"),
                Some(ping_pong.ping_service.as_str()),
            ));
            named.push((
                format!("{path}.pingPong.pongService"),
                Some(ping_pong.pong_service.as_str()),
            ));
        }
    }
    if let Some(blue_green) = rollout.blue_green() {
        let path = "spec.strategy.blueGreen";
        named.push((
            format!("{path}.activeService"),
            blue_green.active_service.as_deref(),
        ));
        named.push((
            format!("{path}.previewService"),
            blue_green.preview_service.as_deref(),
        ));
    }
    named
        .into_iter()
        .filter_map(|(path, name)| Some((path, name.filter(|n| !n.is_empty())?)))
        .collect()
}

/// A Service whose selector asks for a label the pods do not carry never reaches them.
fn service_selects_pods(
    rollout: &Rollout,
    path: &str,
    service: &str,
    selector: &BTreeMap<String, String>,
) -> Vec<Finding> {
    let labels = rollout
        .spec
        .template
        .as_ref()
        .map(|t| t.labels())
        .unwrap_or_default();
    if labels.is_empty() {
        // With workloadRef the labels live in the Deployment, which lint does not see.
        return Vec::new();
    }
    selector
        .iter()
        .filter(|(key, _)| key.as_str() != DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY)
        .filter(|(key, value)| labels.get(*key) != Some(*value))
        .map(|(key, value)| {
            Finding::new(
                Severity::Error,
                path,
                format!(
                    "Service {service:?} in this file selects {key}={value}, which spec.template.metadata.labels does not carry, so it would reach no pod of this rollout"
                ),
                format!("make the Service's selector a subset of the template's labels, or add {key}: {value} to spec.template.metadata.labels"),
            )
        })
        .collect()
}

fn analyses(rollout: &Rollout) -> Vec<(String, &RolloutAnalysis)> {
    let mut found = Vec::new();
    if let Some(canary) = rollout.canary() {
        if let Some(background) = &canary.analysis {
            found.push((
                "spec.strategy.canary.analysis".to_string(),
                &background.analysis,
            ));
        }
        for (index, step) in canary.steps.iter().flatten().enumerate() {
            if let Some(analysis) = &step.analysis {
                found.push((
                    format!("spec.strategy.canary.steps[{index}].analysis"),
                    analysis,
                ));
            }
        }
    }
    if let Some(blue_green) = rollout.blue_green() {
        let path = "spec.strategy.blueGreen";
        if let Some(analysis) = &blue_green.pre_promotion_analysis {
            found.push((format!("{path}.prePromotionAnalysis"), analysis));
        }
        if let Some(analysis) = &blue_green.post_promotion_analysis {
            found.push((format!("{path}.postPromotionAnalysis"), analysis));
        }
    }
    found
}

/// Arguments a template in the file declares without a value, that `analysis` does not pass.
fn missing_args(path: &str, analysis: &RolloutAnalysis, objects: &FileObjects) -> Vec<Finding> {
    let passed: Vec<&str> = analysis.args().iter().map(|a| a.name.as_str()).collect();
    let mut findings = Vec::new();
    for reference in analysis.templates() {
        let (kind, declared) = if reference.cluster_scope == Some(true) {
            (
                "ClusterAnalysisTemplate",
                objects.cluster_template_args.get(&reference.template_name),
            )
        } else {
            (
                "AnalysisTemplate",
                objects.template_args.get(&reference.template_name),
            )
        };
        for arg in declared.into_iter().flatten() {
            let needs_value = arg.value.is_none() && arg.value_from.is_none();
            if needs_value && !passed.contains(&arg.name.as_str()) {
                findings.push(Finding::new(
                    Severity::Error,
                    format!("{path}.args"),
                    format!(
                        "{kind} {:?} in this file needs argument {:?}, which this analysis does not pass, so the AnalysisRun could not start",
                        reference.template_name, arg.name
                    ),
                    format!("add {{name: {}, value: ...}} (or valueFrom) to {path}.args", arg.name),
                ));
            }
        }
    }
    findings
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rollout() -> Rollout {
        serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": "web"},
            "spec": {
                "template": {"metadata": {"labels": {"app": "web"}}},
                "strategy": {"canary": {
                    "canaryService": "web-canary", "stableService": "web-stable",
                    "steps": [{"analysis": {"templates": [{"templateName": "rate"}],
                                            "args": [{"name": "service", "value": "web"}]}}]
                }}
            }
        }))
        .unwrap()
    }

    fn file(extra: Vec<Value>) -> FileObjects {
        FileObjects::collect(&extra)
    }

    #[test]
    fn matching_services_and_passed_args_are_fine() {
        let objects = file(vec![
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-stable"},
                   "spec": {"selector": {"app": "web", "rollouts-pod-template-hash": "abc"}}}),
            json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisTemplate", "metadata": {"name": "rate"},
                   "spec": {"args": [{"name": "service"}, {"name": "window", "value": "5m"}], "metrics": []}}),
        ]);
        assert_eq!(check(&rollout(), &objects), vec![]);
    }

    #[test]
    fn a_service_selecting_other_pods_and_a_missing_arg_are_errors() {
        let objects = file(vec![
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-canary"},
                   "spec": {"selector": {"app": "api"}}}),
            json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisTemplate", "metadata": {"name": "rate"},
                   "spec": {"args": [{"name": "service"}, {"name": "namespace"}], "metrics": []}}),
        ]);
        let findings = check(&rollout(), &objects);
        let paths: Vec<&str> = findings.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            vec![
                "spec.strategy.canary.canaryService",
                "spec.strategy.canary.steps[0].analysis.args"
            ]
        );
        assert!(findings[0].reason.contains("selects app=api"));
        assert!(findings[1].reason.contains("needs argument \"namespace\""));
    }
}
