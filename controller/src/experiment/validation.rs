//! What makes an Experiment impossible to run, each finding naming the field and the fix:
//! Argo's `VerifyExperimentSpec` (a selector on every template, not empty, names set and
//! unique, `minReadySeconds` within the progress deadline), and what Argo leaves to fail later
//! (a duration that does not parse, names too long for the objects they make, a selector that
//! does not select the template's pods, argument values that name nothing).

use std::collections::BTreeSet;

use kube::ResourceExt;
use rollouts_crds::FieldError;
use rollouts_crds::experiment::Experiment;
use serde_json::Value;

use super::build;
use super::plan::DEFAULT_PROGRESS_DEADLINE_SECONDS;

/// The most templates, and the most analyses, one experiment may have: each is an object
/// written and a status entry kept.
pub const MAX_TEMPLATES: usize = 50;

/// Longest name of an object the experiment creates (a DNS subdomain).
const MAX_OBJECT_NAME: usize = 253;
/// Longest Service name (a DNS label).
const MAX_SERVICE_NAME: usize = 63;

/// Every finding; empty when the experiment can run.
pub fn validate(experiment: &Experiment) -> Vec<FieldError> {
    let mut findings = Vec::new();
    let spec = &experiment.spec;
    let name = experiment.name_any();
    let deadline = spec
        .progress_deadline_seconds
        .unwrap_or(DEFAULT_PROGRESS_DEADLINE_SECONDS);
    if let Some(duration) = &spec.duration
        && let Err(error) = rollouts_crds::duration::parse(duration)
    {
        findings.push(FieldError::new(
            "spec.duration",
            error.to_string(),
            "write a duration such as 30s, 5m or 1h, or leave it out to run until terminated",
        ));
    }
    if deadline <= 0 {
        findings.push(FieldError::new(
            "spec.progressDeadlineSeconds",
            format!("{deadline} is not a positive number of seconds"),
            "set a positive number of seconds, or leave it out for 600",
        ));
    }
    if let Some(delay) = spec.scale_down_delay_seconds
        && delay < 0
    {
        findings.push(FieldError::new(
            "spec.scaleDownDelaySeconds",
            format!("{delay} is negative"),
            "set 0 or more seconds, or leave it out for 30",
        ));
    }
    if spec.templates.len() > MAX_TEMPLATES {
        findings.push(FieldError::new(
            "spec.templates",
            format!(
                "{} templates, more than {MAX_TEMPLATES}",
                spec.templates.len()
            ),
            "split the experiment",
        ));
    }
    if spec.analyses.len() > MAX_TEMPLATES {
        findings.push(FieldError::new(
            "spec.analyses",
            format!(
                "{} analyses, more than {MAX_TEMPLATES}",
                spec.analyses.len()
            ),
            "split the experiment",
        ));
    }
    if spec.templates.len() > MAX_TEMPLATES || spec.analyses.len() > MAX_TEMPLATES {
        // Not looked into one by one: that would cost as much as they do.
        return findings;
    }
    let mut names = BTreeSet::new();
    for (i, template) in spec.templates.iter().enumerate() {
        let path = format!("spec.templates[{i}]");
        if template.name.is_empty() {
            findings.push(FieldError::new(
                format!("{path}.name"),
                "the template has no name",
                "name every template",
            ));
        } else if !names.insert(template.name.as_str()) {
            findings.push(FieldError::new(
                format!("{path}.name"),
                format!("template name '{}' is repeated", template.name),
                "give every template its own name",
            ));
        } else {
            let rs = build::replica_set_name(&name, &template.name);
            if !is_subdomain(&rs) {
                findings.push(FieldError::new(
                    format!("{path}.name"),
                    format!("its ReplicaSet would be named {rs:?}, not a valid object name"),
                    format!(
                        "use lowercase letters, digits and '-' so that the experiment and template names together stay within {MAX_OBJECT_NAME} characters"
                    ),
                ));
            }
            if template.service.is_some() {
                let service = build::service_name(&name, template);
                if !is_label(&service) {
                    findings.push(FieldError::new(
                        format!("{path}.service"),
                        format!("its Service would be named {service:?}, not a valid Service name"),
                        format!(
                            "set service.name to lowercase letters, digits and '-', at most {MAX_SERVICE_NAME} characters"
                        ),
                    ));
                }
            }
        }
        if let Some(replicas) = template.replicas
            && replicas < 0
        {
            findings.push(FieldError::new(
                format!("{path}.replicas"),
                format!("{replicas} is negative"),
                "set 0 or more replicas",
            ));
        }
        if let Some(seconds) = template.min_ready_seconds {
            if seconds < 0 {
                findings.push(FieldError::new(
                    format!("{path}.minReadySeconds"),
                    format!("{seconds} is negative"),
                    "set 0 or more seconds",
                ));
            } else if seconds > deadline {
                findings.push(FieldError::new(
                    format!("{path}.minReadySeconds"),
                    format!("{seconds} is longer than progressDeadlineSeconds ({deadline})"),
                    "lower minReadySeconds or raise spec.progressDeadlineSeconds",
                ));
            }
        }
        let labels = template.template.labels();
        match &template.selector {
            None => findings.push(FieldError::new(
                format!("{path}.selector"),
                "missing",
                "set selector.matchLabels to labels of the pod template",
            )),
            Some(selector)
                if selector.match_labels.as_ref().is_none_or(|m| m.is_empty())
                    && selector
                        .match_expressions
                        .as_ref()
                        .is_none_or(|m| m.is_empty()) =>
            {
                findings.push(FieldError::new(
                    format!("{path}.selector"),
                    "the selector is empty and would select every pod",
                    "set selector.matchLabels to labels of the pod template",
                ));
            }
            Some(selector) => {
                for (key, value) in selector.match_labels.iter().flatten() {
                    if labels.get(key) != Some(value) {
                        findings.push(FieldError::new(
                            format!("{path}.selector.matchLabels[{key:?}]"),
                            format!(
                                "the pod template's labels do not have {key}: {value}, so the ReplicaSet would select none of its pods"
                            ),
                            format!("add {key}: {value} to {path}.template.metadata.labels"),
                        ));
                    }
                }
            }
        }
        let containers = template
            .template
            .0
            .get("spec")
            .and_then(|s| s.get("containers"))
            .and_then(Value::as_array);
        if containers.is_none_or(Vec::is_empty) {
            findings.push(FieldError::new(
                format!("{path}.template.spec.containers"),
                "the pod template has no containers",
                "give the pod template at least one container",
            ));
        }
    }
    let known: BTreeSet<String> = spec
        .templates
        .iter()
        .flat_map(|t| {
            [
                format!("templates.{}.podTemplateHash", t.name),
                format!("templates.{}.replicaset.name", t.name),
            ]
        })
        .chain(["experiment.availableAt".to_string()])
        .chain(
            spec.duration
                .iter()
                .map(|_| "experiment.finishedAt".to_string()),
        )
        .collect();
    let mut analyses = BTreeSet::new();
    for (i, analysis) in spec.analyses.iter().enumerate() {
        let path = format!("spec.analyses[{i}]");
        if analysis.name.is_empty() {
            findings.push(FieldError::new(
                format!("{path}.name"),
                "the analysis has no name",
                "name every analysis",
            ));
        } else if !analyses.insert(analysis.name.as_str()) {
            findings.push(FieldError::new(
                format!("{path}.name"),
                format!("analysis name '{}' is repeated", analysis.name),
                "give every analysis its own name",
            ));
        } else if !is_subdomain(&build::analysis_run_name(&name, &analysis.name)) {
            findings.push(FieldError::new(
                format!("{path}.name"),
                format!(
                    "its AnalysisRun would be named {:?}, not a valid object name",
                    build::analysis_run_name(&name, &analysis.name)
                ),
                "use lowercase letters, digits and '-'",
            ));
        }
        if analysis.template_name.is_empty() {
            findings.push(FieldError::new(
                format!("{path}.templateName"),
                "missing",
                "name the AnalysisTemplate (or ClusterAnalysisTemplate with clusterScope: true) to run",
            ));
        }
        for arg in &analysis.args {
            let arg_path = format!("{path}.args[{:?}]", arg.name);
            if let Some(value) = &arg.value {
                for tag in build::tags(value) {
                    if !known.contains(tag) {
                        findings.push(FieldError::new(
                            format!("{arg_path}.value"),
                            format!("{{{{{tag}}}}} names nothing an experiment knows"),
                            "use {{templates.NAME.podTemplateHash}}, {{templates.NAME.replicaset.name}}, {{experiment.availableAt}} or, with a duration, {{experiment.finishedAt}}",
                        ));
                    }
                }
            }
            if let Some(from) = &arg.value_from {
                if from.pod_template_hash_value.is_some() {
                    findings.push(FieldError::new(
                        format!("{arg_path}.valueFrom.podTemplateHashValue"),
                        "an Experiment has no stable or latest ReplicaSet (Argo ignores it here)",
                        "use value: \"{{templates.NAME.podTemplateHash}}\"",
                    ));
                }
                if from.field_ref.is_some() {
                    findings.push(FieldError::new(
                        format!("{arg_path}.valueFrom.fieldRef"),
                        "an Experiment's analyses take no fieldRef (Argo ignores it here)",
                        "write the value itself, or use {{templates.NAME.podTemplateHash}}",
                    ));
                }
            }
        }
    }
    findings
}

/// A DNS-1123 subdomain: lowercase alphanumerics, '-' and '.', starting and ending with an
/// alphanumeric, at most 253 characters.
fn is_subdomain(name: &str) -> bool {
    name.len() <= MAX_OBJECT_NAME && name.split('.').all(is_label_part)
}

/// A DNS-1035 label as Service names must be: at most 63, starting with a letter.
fn is_label(name: &str) -> bool {
    name.len() <= MAX_SERVICE_NAME
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && is_label_part(name)
}

fn is_label_part(part: &str) -> bool {
    !part.is_empty()
        && part
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !part.starts_with('-')
        && !part.ends_with('-')
}
