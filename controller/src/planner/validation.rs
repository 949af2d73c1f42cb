//! Checks on a Rollout's spec (canary or blue-green) that the planner relies on, with errors
//! that name the field and the fix. Argo's controller rejects the same specs.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use rollouts_crds::FieldError;
use rollouts_crds::rollout::{BlueGreenStrategy, CanaryStrategy, Rollout, RolloutAnalysis};

use super::replicas::{Fenceposts, MAX_WEIGHT, resolve_fenceposts};

/// What validation resolved for planning.
pub(super) struct ValidSpec {
    pub template: serde_json::Value,
    pub fenceposts: Fenceposts,
    /// Per step: the pause length of a timed pause step, `None` otherwise.
    pub pause_durations: Vec<Option<Duration>>,
}

/// Checks what the planner relies on; Argo rejects the same specs.
pub(super) fn validate(
    rollout: &Rollout,
    canary: &CanaryStrategy,
) -> Result<ValidSpec, FieldError> {
    let template = validate_template(rollout)?;
    let replicas = rollout.spec.effective_replicas();
    if is_zero(canary.max_surge.as_ref()) && is_zero(canary.max_unavailable.as_ref()) {
        return Err(FieldError::new(
            "spec.strategy.canary.maxSurge",
            "maxSurge and maxUnavailable are both zero, so no pod could ever be replaced",
            "set maxSurge or maxUnavailable above zero",
        ));
    }
    let fenceposts = resolve_fenceposts(
        canary.max_surge.as_ref(),
        canary.max_unavailable.as_ref(),
        replicas,
    )?;
    if canary.canary_service.is_some() && canary.canary_service == canary.stable_service {
        return Err(FieldError::new(
            "spec.strategy.canary.canaryService",
            "the stable and canary services are the same Service, but two are required",
            "name a different Service in canaryService or stableService",
        ));
    }
    for (field, present) in [
        (
            "scaleDownDelaySeconds",
            canary.scale_down_delay_seconds.is_some(),
        ),
        (
            "dynamicStableScale",
            canary.dynamic_stable_scale == Some(true),
        ),
    ] {
        if present {
            return Err(FieldError::new(
                format!("spec.strategy.canary.{field}"),
                "only takes effect with spec.strategy.canary.trafficRouting",
                format!("remove {field} or configure trafficRouting"),
            ));
        }
    }
    let mut pause_durations = Vec::new();
    for (index, step) in canary.steps().iter().enumerate() {
        let path = format!("spec.strategy.canary.steps[{index}]");
        let kinds = step.kinds();
        if kinds.len() != 1 {
            return Err(FieldError::new(
                &path,
                format!(
                    "a step sets exactly one kind, this one sets {}",
                    kinds.len()
                ),
                "split it into one step per setWeight, pause or analysis",
            ));
        }
        let mut pause_duration = None;
        match kinds[0] {
            "setWeight" => {
                let weight = step.set_weight.unwrap_or_default();
                if !(0..=MAX_WEIGHT).contains(&weight) {
                    return Err(FieldError::new(
                        format!("{path}.setWeight"),
                        format!("{weight} is outside 0..=100"),
                        "use a percentage between 0 and 100",
                    ));
                }
            }
            "pause" => {
                let pause = step.pause.as_ref().map(|pause| pause.duration());
                pause_duration = match pause {
                    Some(Ok(duration)) => duration,
                    Some(Err(reason)) => {
                        return Err(FieldError::new(
                            format!("{path}.pause.duration"),
                            reason,
                            "write seconds (30) or a duration (\"30s\", \"5m\", \"1h\")",
                        ));
                    }
                    None => None,
                };
            }
            "analysis" => {
                let templates = step.analysis.as_ref().map_or(0, |a| a.templates().len());
                if templates == 0 {
                    return Err(FieldError::new(
                        format!("{path}.analysis.templates"),
                        "an analysis step needs at least one template",
                        "list the AnalysisTemplate(s) to run under templates",
                    ));
                }
            }
            "setCanaryScale" | "setHeaderRoute" | "setMirrorRoute" => {
                return Err(FieldError::new(
                    format!("{path}.{}", kinds[0]),
                    format!("{} requires trafficRouting", kinds[0]),
                    "configure spec.strategy.canary.trafficRouting or remove the step",
                ));
            }
            other => {
                return Err(FieldError::new(
                    format!("{path}.{other}"),
                    format!("{other} steps are not supported by this controller yet"),
                    "remove the step",
                ));
            }
        }
        pause_durations.push(pause_duration);
    }
    Ok(ValidSpec {
        template,
        fenceposts,
        pause_durations,
    })
}

/// The pod template and replica count every strategy needs.
fn validate_template(rollout: &Rollout) -> Result<serde_json::Value, FieldError> {
    let spec = &rollout.spec;
    if spec.workload_ref.is_some() {
        return Err(FieldError::new(
            "spec.workloadRef",
            "templates referenced from a Deployment are not supported by this controller yet",
            "write the pod template inline in spec.template",
        ));
    }
    let Some(template) = spec.template.as_ref() else {
        return Err(FieldError::new(
            "spec.template",
            "the Rollout has no pod template",
            "add spec.template with the pods to run",
        ));
    };
    let replicas = spec.effective_replicas();
    if replicas < 0 {
        return Err(FieldError::new(
            "spec.replicas",
            format!("{replicas} is negative"),
            "set spec.replicas to 0 or more",
        ));
    }
    Ok(serde_json::Value::Object(template.0.clone()))
}

/// Checks a blue-green spec; returns the pod template.
pub(super) fn validate_blue_green(
    rollout: &Rollout,
    blue_green: &BlueGreenStrategy,
) -> Result<serde_json::Value, FieldError> {
    let template = validate_template(rollout)?;
    let path = "spec.strategy.blueGreen";
    if rollout.spec.strategy.canary.is_some() {
        return Err(FieldError::new(
            "spec.strategy",
            "both blueGreen and canary are set, but a Rollout follows one strategy",
            "keep either spec.strategy.blueGreen or spec.strategy.canary",
        ));
    }
    let active = blue_green.active_service.as_deref().unwrap_or_default();
    if active.is_empty() {
        return Err(FieldError::new(
            format!("{path}.activeService"),
            "a blue-green rollout needs the Service that receives production traffic",
            "name an existing Service in activeService",
        ));
    }
    if blue_green.preview_service.as_deref() == Some(active) {
        return Err(FieldError::new(
            format!("{path}.activeService"),
            "the active and preview services are the same Service, but two are required",
            "name a different Service in previewService or activeService",
        ));
    }
    let replicas = rollout.spec.effective_replicas();
    if let Some(count) = blue_green.preview_replica_count
        && !(0..=replicas).contains(&count)
    {
        return Err(FieldError::new(
            format!("{path}.previewReplicaCount"),
            format!("{count} is outside 0..={replicas} (spec.replicas)"),
            "set previewReplicaCount between 0 and spec.replicas",
        ));
    }
    for (field, seconds) in [
        ("autoPromotionSeconds", blue_green.auto_promotion_seconds),
        ("scaleDownDelaySeconds", blue_green.scale_down_delay_seconds),
        (
            "scaleDownDelayRevisionLimit",
            blue_green.scale_down_delay_revision_limit,
        ),
        (
            "abortScaleDownDelaySeconds",
            blue_green.abort_scale_down_delay_seconds,
        ),
    ] {
        if let Some(value) = seconds
            && value < 0
        {
            return Err(FieldError::new(
                format!("{path}.{field}"),
                format!("{value} is negative"),
                format!("set {field} to 0 or more"),
            ));
        }
    }
    for (field, analysis) in [
        ("prePromotionAnalysis", &blue_green.pre_promotion_analysis),
        ("postPromotionAnalysis", &blue_green.post_promotion_analysis),
    ] {
        if analysis.as_ref().is_some_and(|a| a.templates().is_empty()) {
            return Err(no_templates(format!("{path}.{field}.templates")));
        }
    }
    if blue_green.anti_affinity.is_some() {
        return Err(FieldError::new(
            format!("{path}.antiAffinity"),
            "anti-affinity between revisions is not supported by this controller yet",
            "remove antiAffinity",
        ));
    }
    Ok(template)
}

fn no_templates(path: String) -> FieldError {
    FieldError::new(
        path,
        "an analysis needs at least one template",
        "list the AnalysisTemplate(s) to run under templates",
    )
}

/// Whether `analysis` has templates to run.
pub(super) fn has_templates(analysis: Option<&RolloutAnalysis>) -> bool {
    analysis.is_some_and(|a| !a.templates().is_empty())
}

fn is_zero(value: Option<&IntOrString>) -> bool {
    match value {
        Some(IntOrString::Int(0)) => true,
        Some(IntOrString::String(text)) => text.trim_end_matches('%').trim() == "0",
        _ => false,
    }
}
