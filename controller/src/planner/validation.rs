//! Turns a Rollout's spec (canary or blue-green) into what the planner works from: the pod
//! template, the surge and unavailable fenceposts and the pause lengths. The rules a spec must
//! follow live in [`rollouts_crds::validation`]; a spec that breaks one is refused with its
//! first finding.

use std::time::Duration;

use rollouts_crds::FieldError;
use rollouts_crds::rollout::{BlueGreenStrategy, CanaryStrategy, Rollout, RolloutAnalysis};
use rollouts_crds::validation::{
    missing_template, negative_replicas, pause_duration, planning_limits, unsupported_features,
    validate_strategy,
};

use super::replicas::{Fenceposts, resolve_fenceposts};

/// What validation resolved for planning.
pub(super) struct ValidSpec {
    pub template: serde_json::Value,
    pub fenceposts: Fenceposts,
    /// Per step: the pause length of a timed pause step, `None` otherwise.
    pub pause_durations: Vec<Option<Duration>>,
}

/// Refuses a canary spec the planner cannot plan, else resolves it for planning.
pub(super) fn validate_canary(
    rollout: &Rollout,
    canary: &CanaryStrategy,
) -> Result<ValidSpec, FieldError> {
    let template = template(rollout)?;
    let fenceposts = resolve_fenceposts(
        canary.max_surge.as_ref(),
        canary.max_unavailable.as_ref(),
        rollout.spec.effective_replicas(),
    )?;
    let pause_durations = canary
        .steps()
        .iter()
        .enumerate()
        .map(|(index, step)| match &step.pause {
            Some(pause) => pause_duration(pause, &format!("spec.strategy.canary.steps[{index}]")),
            None => Ok(None),
        })
        .collect::<Result<_, _>>()?;
    Ok(ValidSpec {
        template,
        fenceposts,
        pause_durations,
    })
}

/// Refuses a blue-green spec the planner cannot plan; returns the pod template.
pub(super) fn validate_blue_green(
    rollout: &Rollout,
    _blue_green: &BlueGreenStrategy,
) -> Result<serde_json::Value, FieldError> {
    template(rollout)
}

/// The pod template, once no rule refuses the spec.
fn template(rollout: &Rollout) -> Result<serde_json::Value, FieldError> {
    if let Some(finding) = first_finding(rollout) {
        return Err(finding);
    }
    let template = rollout
        .spec
        .template
        .as_ref()
        .ok_or_else(missing_template)?;
    Ok(serde_json::Value::Object(template.0.clone()))
}

/// The first finding that stops planning. The selector and the template's contents are not
/// checked here: reconcile checked them on the Rollout as written, and with `workloadRef` the
/// planner sees the Deployment's template instead.
fn first_finding(rollout: &Rollout) -> Option<FieldError> {
    negative_replicas(&rollout.spec)
        .into_iter()
        .chain(validate_strategy(rollout))
        .chain(unsupported_features(rollout))
        .chain(planning_limits(rollout))
        .next()
}

/// Whether `analysis` has templates to run.
pub(super) fn has_templates(analysis: Option<&RolloutAnalysis>) -> bool {
    analysis.is_some_and(|a| !a.templates().is_empty())
}
