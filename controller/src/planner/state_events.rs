//! The events Argo records on a change of the Rollout's state rather than of a step, planned on
//! top of the whole plan: `RolloutUpdated` when the Rollout's revision annotation moves to a
//! new revision (Argo's `setRolloutRevision`), and `RolloutPaused` when pause conditions
//! appear or `RolloutResumed` when they clear without an abort (Argo's
//! `sendStateChangeEvents`, comparing the stored status with the one written). Notifications'
//! `on-rollout-updated` and `on-rollout-paused` triggers fire on them.

use rollouts_crds::conditions::{
    ROLLOUT_PAUSED_MESSAGE, ROLLOUT_PAUSED_REASON, ROLLOUT_RESUMED_MESSAGE, ROLLOUT_RESUMED_REASON,
    ROLLOUT_UPDATED_REASON,
};
use rollouts_crds::rollout::Rollout;

use super::{Event, EventType, Plan};

/// Adds the state-change events of `plan` for `rollout`: `RolloutUpdated` first (Argo records
/// it before the steps move), `RolloutPaused` or `RolloutResumed` last (Argo records them once
/// the status is written).
pub(super) fn add(rollout: &Rollout, plan: &mut Plan) {
    if let Some(revision) = &plan.rollout_revision {
        plan.events.insert(
            0,
            Event {
                type_: EventType::Normal,
                reason: ROLLOUT_UPDATED_REASON.into(),
                message: format!("Rollout updated to revision {revision}"),
            },
        );
    }
    let was_paused = rollout
        .status
        .as_ref()
        .is_some_and(|status| !status.pause_conditions.is_empty());
    let pause = plan.status.pause_conditions.first();
    match (was_paused, pause) {
        (false, Some(pause)) => plan.events.push(Event {
            type_: EventType::Normal,
            reason: ROLLOUT_PAUSED_REASON.into(),
            message: format!("{ROLLOUT_PAUSED_MESSAGE} ({})", pause.reason),
        }),
        // An abort clears the pause conditions too; that is not a resume.
        (true, None) if !plan.status.abort => plan.events.push(Event {
            type_: EventType::Normal,
            reason: ROLLOUT_RESUMED_REASON.into(),
            message: ROLLOUT_RESUMED_MESSAGE.into(),
        }),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::test_world::at;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use rollouts_crds::rollout::{PauseCondition, RolloutStatus};

    fn rollout(paused: bool) -> Rollout {
        let mut rollout = Rollout::new("web", Default::default());
        rollout.status = Some(status(paused));
        rollout
    }

    fn status(paused: bool) -> RolloutStatus {
        RolloutStatus {
            pause_conditions: if paused {
                vec![PauseCondition {
                    reason: "CanaryPauseStep".into(),
                    start_time: Time(at(0)),
                }]
            } else {
                Vec::new()
            },
            ..Default::default()
        }
    }

    fn events(rollout: &Rollout, plan: Plan) -> Vec<(String, String)> {
        let mut plan = plan;
        add(rollout, &mut plan);
        plan.events
            .into_iter()
            .map(|e| (e.reason, e.message))
            .collect()
    }

    fn step_completed() -> Event {
        Event {
            type_: EventType::Normal,
            reason: "RolloutStepCompleted".into(),
            message: "Rollout step 1/2 completed (setWeight: 25)".into(),
        }
    }

    #[test]
    fn a_new_revision_is_an_update_recorded_before_the_steps_move() {
        let plan = Plan {
            rollout_revision: Some("2".into()),
            events: vec![step_completed()],
            status: status(false),
            ..Plan::unchanged(&rollout(false))
        };
        assert_eq!(
            events(&rollout(false), plan),
            [
                (
                    "RolloutUpdated".to_string(),
                    "Rollout updated to revision 2".to_string()
                ),
                (
                    "RolloutStepCompleted".to_string(),
                    "Rollout step 1/2 completed (setWeight: 25)".to_string()
                )
            ]
        );
        let unchanged = Plan {
            status: status(false),
            ..Plan::unchanged(&rollout(false))
        };
        assert!(events(&rollout(false), unchanged).is_empty());
    }

    #[test]
    fn a_pause_that_starts_is_a_pause_and_one_that_ends_a_resume() {
        let pausing = Plan {
            events: vec![step_completed()],
            status: status(true),
            ..Plan::unchanged(&rollout(false))
        };
        assert_eq!(
            events(&rollout(false), pausing).last(),
            Some(&(
                "RolloutPaused".to_string(),
                "Rollout is paused (CanaryPauseStep)".to_string()
            ))
        );
        let still = Plan {
            status: status(true),
            ..Plan::unchanged(&rollout(false))
        };
        assert!(events(&rollout(true), still).is_empty());
        let resuming = Plan {
            status: status(false),
            ..Plan::unchanged(&rollout(false))
        };
        assert_eq!(
            events(&rollout(true), resuming),
            [(
                "RolloutResumed".to_string(),
                "Rollout is resumed".to_string()
            )]
        );
    }

    #[test]
    fn an_abort_that_clears_the_pause_is_no_resume() {
        let mut aborted = status(false);
        aborted.abort = true;
        let plan = Plan {
            status: aborted,
            ..Plan::unchanged(&rollout(false))
        };
        assert!(events(&rollout(true), plan).is_empty());
    }
}
