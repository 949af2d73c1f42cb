//! `promote NAME [--full]`: move a paused or analysing rollout to its next step, or to the end.
//!
//! Patches, as Argo's plugin sends them (merge patches):
//! - `spec.paused: false` on the main resource when the rollout is paused by spec;
//! - on the status subresource, one of: `pauseConditions: null` when paused by a step or by the
//!   controller; `pauseConditions: null, currentStepIndex: i+1` for a canary with steps that is
//!   not paused (skips the running analysis or experiment step); and for an inconclusive step
//!   analysis that paused the controller, also `controllerPause: false`.
//! - `--full`: `status.promoteFull: true` unless the new version is already stable.

use serde_json::json;

use rollouts_crds::rollout::Rollout;

use crate::args::OutputFlag;
use crate::cluster::Cluster;
use crate::error::Result;
use crate::patch::PatchRequest;
use crate::verbs::report;

/// `promote` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Name of the rollout.
    pub name: String,
    /// Skip the remaining steps, pauses and analyses and go straight to the new version.
    #[arg(long)]
    pub full: bool,
    #[command(flatten)]
    pub output: OutputFlag,
}

/// The patches that promote `rollout`, in the order they are sent (status before spec, so the
/// controller never sees an unpaused spec with the old pause conditions).
pub fn promote_patch(rollout: &Rollout, full: bool) -> Vec<PatchRequest> {
    let name = rollout.metadata.name.as_deref().unwrap_or_default();
    let status = rollout.status.clone().unwrap_or_default();
    let paused_by_spec = rollout.spec.paused == Some(true);
    let mut patches = Vec::new();
    if full {
        if status.current_pod_hash != status.stable_rs {
            patches.push(PatchRequest::rollout_status(
                name,
                json!({"status": {"promoteFull": true}}),
            ));
        }
    } else if let Some(status_body) = step_status_patch(rollout) {
        patches.push(PatchRequest::rollout_status(name, status_body));
    }
    if paused_by_spec {
        patches.push(PatchRequest::rollout_spec(
            name,
            json!({"spec": {"paused": false}}),
        ));
    }
    patches
}

/// The status change of a plain promote, if any.
fn step_status_patch(rollout: &Rollout) -> Option<serde_json::Value> {
    let status = rollout.status.clone().unwrap_or_default();
    let inconclusive = rollout.canary().is_some()
        && status
            .canary
            .current_step_analysis_run_status
            .as_ref()
            .is_some_and(|run| run.status == "Inconclusive");
    if inconclusive && !status.pause_conditions.is_empty() && status.controller_pause {
        // Clearing the pause alone would leave the inconclusive step to pause again.
        return next_step_index(rollout).map(|index| {
            json!({"status": {"pauseConditions": null, "controllerPause": false, "currentStepIndex": index}})
        });
    }
    if !status.pause_conditions.is_empty() {
        return Some(json!({"status": {"pauseConditions": null}}));
    }
    // Not paused: skip the step that is running (an analysis or an experiment).
    next_step_index(rollout)
        .map(|index| json!({"status": {"pauseConditions": null, "currentStepIndex": index}}))
}

/// The index after the current canary step, capped at the number of steps; `None` without steps.
fn next_step_index(rollout: &Rollout) -> Option<i32> {
    let steps = rollout.canary()?.steps.as_deref().unwrap_or_default();
    if steps.is_empty() {
        return None;
    }
    let current = rollout
        .status
        .as_ref()
        .and_then(|s| s.current_step_index)
        .unwrap_or(0);
    let count = i32::try_from(steps.len()).unwrap_or(i32::MAX);
    Some(if current < count {
        current + 1
    } else {
        current
    })
}

/// The sentence printed after promoting (or finding nothing to do).
pub fn promote_message(name: &str, full: bool, patched: bool) -> String {
    match (full, patched) {
        (true, true) => format!("rollout '{name}' fully promoted"),
        (false, true) => format!("rollout '{name}' promoted"),
        (true, false) => format!("rollout '{name}' is already fully promoted"),
        (false, false) => {
            format!("rollout '{name}' is not paused and has no step to skip; nothing to promote")
        }
    }
}

/// Reads the rollout, sends the promote patches, prints the result.
pub async fn run(cluster: &Cluster, args: &Args) -> Result<()> {
    let rollout = cluster.rollout(&args.name).await?;
    let patches = promote_patch(&rollout, args.full);
    let mut last = None;
    for patch in &patches {
        last = Some(cluster.apply(patch).await?);
    }
    let sentence = promote_message(&args.name, args.full, !patches.is_empty());
    match last {
        Some(object) => report(&sentence, &object, args.output.output),
        None => report(&sentence, &rollout, args.output.output),
    }
}

#[cfg(test)]
mod tests {
    use rollouts_crds::rollout::{
        CanaryStep, CanaryStrategy, PauseCondition, RolloutAnalysisRunStatus, RolloutSpec,
        RolloutStatus,
    };
    use serde_json::json;

    use super::*;
    use crate::patch::{PatchType, TargetKind};

    fn canary(steps: usize) -> Rollout {
        let mut rollout = Rollout::new(
            "web",
            RolloutSpec {
                strategy: rollouts_crds::rollout::RolloutStrategy {
                    canary: Some(CanaryStrategy {
                        steps: Some(vec![CanaryStep::default(); steps]),
                        ..Default::default()
                    }),
                    blue_green: None,
                },
                ..Default::default()
            },
        );
        rollout.status = Some(RolloutStatus {
            current_pod_hash: "new".into(),
            stable_rs: "old".into(),
            ..Default::default()
        });
        rollout
    }

    fn status_mut(rollout: &mut Rollout) -> &mut RolloutStatus {
        rollout.status.get_or_insert_with(Default::default)
    }

    fn paused_by_step(rollout: &mut Rollout) {
        status_mut(rollout).pause_conditions = vec![PauseCondition {
            reason: "CanaryPauseStep".into(),
            start_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        }];
    }

    fn bodies(patches: &[PatchRequest]) -> Vec<(Option<&str>, serde_json::Value)> {
        for p in patches {
            assert_eq!(p.patch_type, PatchType::Merge);
            assert_eq!(p.target, TargetKind::Rollout);
            assert_eq!(p.name, "web");
        }
        patches
            .iter()
            .map(|p| (p.subresource, p.body.clone()))
            .collect()
    }

    #[test]
    fn a_step_pause_is_cleared_on_the_status_subresource() {
        let mut rollout = canary(3);
        status_mut(&mut rollout).current_step_index = Some(1);
        paused_by_step(&mut rollout);
        assert_eq!(
            bodies(&promote_patch(&rollout, false)),
            vec![(Some("status"), json!({"status": {"pauseConditions": null}}))]
        );
    }

    #[test]
    fn a_spec_pause_is_cleared_on_the_main_resource_after_the_status() {
        let mut rollout = canary(3);
        rollout.spec.paused = Some(true);
        paused_by_step(&mut rollout);
        assert_eq!(
            bodies(&promote_patch(&rollout, false)),
            vec![
                (Some("status"), json!({"status": {"pauseConditions": null}})),
                (None, json!({"spec": {"paused": false}})),
            ]
        );
    }

    #[test]
    fn an_unpaused_canary_skips_its_running_step() {
        let mut rollout = canary(3);
        status_mut(&mut rollout).current_step_index = Some(1);
        assert_eq!(
            bodies(&promote_patch(&rollout, false)),
            vec![(
                Some("status"),
                json!({"status": {"pauseConditions": null, "currentStepIndex": 2}})
            )]
        );
    }

    #[test]
    fn the_step_index_never_passes_the_step_count() {
        let mut rollout = canary(2);
        status_mut(&mut rollout).current_step_index = Some(2);
        assert_eq!(
            bodies(&promote_patch(&rollout, false)),
            vec![(
                Some("status"),
                json!({"status": {"pauseConditions": null, "currentStepIndex": 2}})
            )]
        );
        // No index written yet means step 0.
        let fresh = canary(2);
        assert_eq!(
            bodies(&promote_patch(&fresh, false))[0].1,
            json!({"status": {"pauseConditions": null, "currentStepIndex": 1}})
        );
    }

    #[test]
    fn an_inconclusive_analysis_also_clears_the_controller_pause() {
        let mut rollout = canary(4);
        paused_by_step(&mut rollout);
        let status = status_mut(&mut rollout);
        status.current_step_index = Some(2);
        status.controller_pause = true;
        status.canary.current_step_analysis_run_status = Some(RolloutAnalysisRunStatus {
            name: "web-abc-2".into(),
            status: "Inconclusive".into(),
            message: String::new(),
        });
        assert_eq!(
            bodies(&promote_patch(&rollout, false)),
            vec![(
                Some("status"),
                json!({"status": {"pauseConditions": null, "controllerPause": false, "currentStepIndex": 3}})
            )]
        );
    }

    #[test]
    fn full_sets_promote_full_and_unpauses() {
        let mut rollout = canary(3);
        rollout.spec.paused = Some(true);
        assert_eq!(
            bodies(&promote_patch(&rollout, true)),
            vec![
                (Some("status"), json!({"status": {"promoteFull": true}})),
                (None, json!({"spec": {"paused": false}})),
            ]
        );
    }

    #[test]
    fn full_on_a_stable_rollout_sends_nothing() {
        let mut rollout = canary(3);
        status_mut(&mut rollout).stable_rs = "new".into();
        assert!(promote_patch(&rollout, true).is_empty());
        assert_eq!(
            promote_message("web", true, false),
            "rollout 'web' is already fully promoted"
        );
    }

    #[test]
    fn an_unpaused_blue_green_has_nothing_to_promote() {
        let mut rollout = canary(0);
        rollout.spec.strategy.canary = None;
        rollout.spec.strategy.blue_green = Some(Default::default());
        assert!(promote_patch(&rollout, false).is_empty());
        paused_by_step(&mut rollout);
        assert_eq!(
            bodies(&promote_patch(&rollout, false)),
            vec![(Some("status"), json!({"status": {"pauseConditions": null}}))]
        );
    }

    #[test]
    fn messages_match_the_argo_plugin() {
        assert_eq!(
            promote_message("web", false, true),
            "rollout 'web' promoted"
        );
        assert_eq!(
            promote_message("web", true, true),
            "rollout 'web' fully promoted"
        );
    }
}
