//! Advice beyond validation: things that are valid but probably not what the author meant.

use rollouts_crds::rollout::{CanaryStrategy, Rollout};
use serde_json::Value;

use rollouts_controller::planner::replicas::resolve_fenceposts;

use super::{Finding, Severity};
use crate::verbs::plan::basic_canary_split;

/// A replica-count weight this many percentage points away from the asked weight is reported.
const WEIGHT_TOLERANCE_POINTS: f64 = 5.0;

/// Every piece of advice for `rollout`.
pub fn advise(rollout: &Rollout) -> Vec<Finding> {
    let mut findings = image_tags(rollout);
    if let Some(canary) = rollout.canary() {
        findings.extend(missing_analysis(canary));
        findings.extend(header_routes(canary));
        findings.extend(replica_weights(rollout, canary));
    }
    findings
}

/// Images without a tag, or tagged `latest`: the version analysed may not be the one running.
fn image_tags(rollout: &Rollout) -> Vec<Finding> {
    let Some(template) = &rollout.spec.template else {
        return Vec::new();
    };
    let mut findings = Vec::new();
    for list in ["initContainers", "containers"] {
        let containers = template
            .0
            .get("spec")
            .and_then(|spec| spec.get(list))
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        for (index, container) in containers.iter().enumerate() {
            let Some(image) = container.get("image").and_then(Value::as_str) else {
                continue;
            };
            let problem = match image_tag(image) {
                ImageTag::Digest | ImageTag::Tag(_) if !is_latest(image) => continue,
                ImageTag::None => "has no tag, so it means :latest",
                _ => "is tagged latest",
            };
            findings.push(Finding::new(
                Severity::Warning,
                format!("spec.template.spec.{list}[{index}].image"),
                format!(
                    "image {image:?} {problem}: pods started later may run a different version than the one analysed"
                ),
                format!(
                    "pin a version tag ({}:1.2.3) or a digest ({}@sha256:...)",
                    repository(image),
                    repository(image)
                ),
            ));
        }
    }
    findings
}

enum ImageTag<'a> {
    None,
    Tag(&'a str),
    Digest,
}

/// The tag of an image reference; a `:` before the last `/` is a registry port, not a tag.
fn image_tag(image: &str) -> ImageTag<'_> {
    if image.contains('@') {
        return ImageTag::Digest;
    }
    let last_segment = image.rsplit('/').next().unwrap_or(image);
    match last_segment.split_once(':') {
        Some((_, tag)) => ImageTag::Tag(tag),
        None => ImageTag::None,
    }
}

fn is_latest(image: &str) -> bool {
    matches!(image_tag(image), ImageTag::Tag("latest"))
}

fn repository(image: &str) -> &str {
    match image_tag(image) {
        ImageTag::Tag(tag) => &image[..image.len() - tag.len() - 1],
        _ => image,
    }
}

/// A canary that no analysis watches is only ever stopped by a person.
fn missing_analysis(canary: &CanaryStrategy) -> Option<Finding> {
    let steps = canary.steps.as_deref().unwrap_or_default();
    let step_analysis = steps.iter().any(|step| {
        step.analysis.is_some()
            || step
                .experiment
                .as_ref()
                .is_some_and(|e| e.analyses.as_ref().is_some_and(|a| !a.is_empty()))
    });
    (canary.analysis.is_none() && !step_analysis).then(|| {
        Finding::new(
            Severity::Warning,
            "spec.strategy.canary",
            "no analysis runs during this canary, so a bad version is only stopped by a person",
            "add spec.strategy.canary.analysis (background) or an analysis step naming an AnalysisTemplate",
        )
    })
}

/// Header routes the configured router cannot carry out. ingress-nginx routes a canary on one
/// header only, so the controller refuses a step with several when it reaches it.
fn header_routes(canary: &CanaryStrategy) -> Vec<Finding> {
    let nginx = canary
        .traffic_routing
        .as_ref()
        .is_some_and(|routing| routing.nginx.is_some());
    if !nginx {
        return Vec::new();
    }
    let steps = canary.steps.as_deref().unwrap_or_default();
    steps
        .iter()
        .enumerate()
        .filter_map(|(index, step)| {
            let matches = step.set_header_route.as_ref()?.match_.as_ref()?;
            (matches.len() > 1).then(|| {
                Finding::new(
                    Severity::Error,
                    format!("spec.strategy.canary.steps[{index}].setHeaderRoute.match"),
                    format!(
                        "the nginx router matches canary requests on exactly one header, this step gives {}; the rollout would stop with InvalidSpec at this step",
                        matches.len()
                    ),
                    "keep one header match (a regex can cover several values), or route with istio or the Gateway API",
                )
            })
        })
        .collect()
}

/// setWeight steps that pod counts cannot give closely (a canary without a traffic router
/// splits traffic by pods), sized with the controller's own arithmetic, as `plan` shows them.
fn replica_weights(rollout: &Rollout, canary: &CanaryStrategy) -> Vec<Finding> {
    if canary.traffic_routing.is_some() {
        return Vec::new();
    }
    let replicas = rollout.spec.effective_replicas();
    // A maxSurge that does not resolve is reported by validation; there is nothing to size.
    let Ok(fenceposts) = resolve_fenceposts(
        canary.max_surge.as_ref(),
        canary.max_unavailable.as_ref(),
        replicas,
    ) else {
        return Vec::new();
    };
    let steps = canary.steps.as_deref().unwrap_or_default();
    steps
        .iter()
        .enumerate()
        .filter_map(|(index, step)| {
            let weight = step.set_weight?;
            if weight <= 0 || weight >= 100 || replicas <= 0 {
                return None;
            }
            let split = basic_canary_split(replicas, weight, fenceposts.max_surge);
            (f64::from((split.weight - weight).abs()) > WEIGHT_TOLERANCE_POINTS).then(|| {
                Finding::new(
                    Severity::Warning,
                    format!("spec.strategy.canary.steps[{index}].setWeight"),
                    format!(
                        "with {replicas} replica{} and no traffic router, {weight}% becomes {}% ({} canary and {} stable pods; traffic splits by pod count; see `kubectl rollouts plan`)",
                        if replicas == 1 { "" } else { "s" },
                        split.weight,
                        split.canary,
                        split.stable,
                    ),
                    format!(
                        "use a weight that is a multiple of {:.0}%, raise spec.replicas, or configure spec.strategy.canary.trafficRouting for exact weights",
                        100.0 / f64::from(replicas)
                    ),
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_far_from_what_pods_give_are_reported_with_the_controllers_split() {
        let rollout: Rollout = serde_json::from_value(serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": "web"},
            "spec": {"replicas": 4, "strategy": {"canary": {"maxSurge": 1, "maxUnavailable": 0,
                "steps": [{"setWeight": 5}, {"setWeight": 25}, {"setWeight": 100}]}}}
        }))
        .expect("a Rollout");
        let findings = replica_weights(&rollout, rollout.canary().expect("canary"));
        assert_eq!(findings.len(), 1, "{findings:?}");
        let split = basic_canary_split(4, 5, 1);
        let text = format!("{findings:?}");
        assert!(text.contains("steps[0].setWeight"), "{text}");
        assert!(
            text.contains(&format!("5% becomes {}%", split.weight)),
            "{text}"
        );
    }

    #[test]
    fn tags_ports_and_digests_are_told_apart() {
        assert!(matches!(image_tag("nginx"), ImageTag::None));
        assert!(matches!(
            image_tag("registry:5000/team/app"),
            ImageTag::None
        ));
        assert!(matches!(
            image_tag("registry:5000/team/app:1.2"),
            ImageTag::Tag("1.2")
        ));
        assert!(matches!(image_tag("app@sha256:abc"), ImageTag::Digest));
        assert!(is_latest("nginx:latest"));
        assert_eq!(
            repository("registry:5000/team/app:latest"),
            "registry:5000/team/app"
        );
    }
}
