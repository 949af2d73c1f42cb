//! Advice beyond validation: things that are valid but probably not what the author meant.

use rollouts_crds::rollout::{CanaryStrategy, Rollout};
use serde_json::Value;

use super::{Finding, Severity};

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

/// setWeight steps whose pod-count approximation is far from the weight (a canary without a
/// traffic router splits traffic by pods).
fn replica_weights(rollout: &Rollout, canary: &CanaryStrategy) -> Vec<Finding> {
    if canary.traffic_routing.is_some() {
        return Vec::new();
    }
    let replicas = rollout.spec.effective_replicas();
    let steps = canary.steps.as_deref().unwrap_or_default();
    steps
        .iter()
        .enumerate()
        .filter_map(|(index, step)| {
            let weight = step.set_weight?;
            let approximation = approximate_weight(weight, replicas)?;
            ((approximation.percent - f64::from(weight)).abs() > WEIGHT_TOLERANCE_POINTS).then(|| {
                Finding::new(
                    Severity::Warning,
                    format!("spec.strategy.canary.steps[{index}].setWeight"),
                    format!(
                        "with {replicas} replica{} and no traffic router, {weight}% becomes about {:.0}% ({} of {replicas} pods; approximate: traffic splits by pod count)",
                        if replicas == 1 { "" } else { "s" },
                        approximation.percent,
                        approximation.canary_pods,
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

/// What a weight turns into when traffic follows pod counts.
#[derive(Debug, PartialEq)]
pub struct WeightApproximation {
    pub canary_pods: i32,
    pub percent: f64,
}

/// Our nearest-count rule (approximate; the controller's exact arithmetic also depends on surge):
/// the nearest whole number of canary pods, at least one for any weight above zero.
/// `None` for weights 0 and 100 and for zero replicas, which are exact.
pub fn approximate_weight(weight: i32, replicas: i32) -> Option<WeightApproximation> {
    if weight <= 0 || weight >= 100 || replicas <= 0 {
        return None;
    }
    let exact = f64::from(weight) * f64::from(replicas) / 100.0;
    // A weight asked for is never zero pods, and never the whole set while it is below 100%.
    let canary_pods = (exact.round() as i32).clamp(1, replicas);
    Some(WeightApproximation {
        canary_pods,
        percent: 100.0 * f64::from(canary_pods) / f64::from(replicas),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_percent_of_four_pods_is_one_pod() {
        assert_eq!(
            approximate_weight(5, 4),
            Some(WeightApproximation {
                canary_pods: 1,
                percent: 25.0
            })
        );
        assert_eq!(
            approximate_weight(30, 10),
            Some(WeightApproximation {
                canary_pods: 3,
                percent: 30.0
            })
        );
        assert_eq!(approximate_weight(100, 4), None);
        assert_eq!(approximate_weight(50, 0), None);
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
