//! Fewer status writes per canary step, on top of [`super::plan_resolved`]: a step that completes with
//! nothing else to write is followed at once by the next step's plan, so the step change and
//! the next step's first move share one status patch; and a status that differs from the
//! stored one only in pod counts (and what follows from them) waits a moment for the counts to
//! settle rather than being written on every pod that moves.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use rollouts_crds::conditions::{AVAILABLE, PROGRESSING};
use rollouts_crds::rollout::{Rollout, RolloutStatus};

use super::{Observed, Plan};

/// How long a status that only moved pod counts may wait for them to settle: kept well under
/// the progress deadline, and short enough that `kubectl rollouts get` stays current.
pub const COUNTS_SETTLE: Duration = Duration::from_secs(5);

/// [`super::plan_resolved`], with completed steps followed at once and count-only status writes held
/// back for [`COUNTS_SETTLE`].
pub(super) fn coalesced(rollout: &Rollout, observed: &Observed, now: Timestamp) -> Plan {
    let first = super::plan_resolved(rollout, observed, now);
    let mut plan = follow_completed_steps(rollout, observed, now, first);
    hold_count_only_status(rollout, &mut plan, now);
    plan
}

/// While a plan only completes a step of a basic canary (it writes nothing but status and
/// events), plans the next step from the status it would write, with the same observations:
/// they are still true, as nothing was written.
fn follow_completed_steps(
    rollout: &Rollout,
    observed: &Observed,
    now: Timestamp,
    first: Plan,
) -> Plan {
    let step_count = rollout
        .spec
        .strategy
        .canary
        .as_ref()
        .map_or(0, |canary| canary.steps().len());
    let stored = rollout.status.clone().unwrap_or_default();
    let mut base = stored.clone();
    let mut plan = first;
    let mut events = Vec::new();
    // Each round takes one more step, so there are at most as many rounds as steps.
    for _ in 0..step_count {
        if !only_completes_a_step(rollout, &base, &plan) {
            break;
        }
        let mut advanced = rollout.clone();
        advanced.status = Some(plan.status.clone());
        let next = super::plan_resolved(&advanced, observed, now);
        let completed = std::mem::replace(&mut plan, next);
        events.extend(completed.events);
        base = completed.status;
    }
    events.append(&mut plan.events);
    plan.events = events;
    plan.status_changed = Some(&plan.status) != rollout.status.as_ref();
    plan
}

/// The plan moves the step index on from `base` and writes nothing but status and events; its
/// canary has no traffic router (a router's weight is verified against the stored status, so
/// the next step must be planned from a status that was written).
fn only_completes_a_step(rollout: &Rollout, base: &RolloutStatus, plan: &Plan) -> bool {
    let moved_on = matches!(
        (base.current_step_index, plan.status.current_step_index),
        (Some(before), Some(after)) if after > before
    );
    let mut writes = plan.clone();
    writes.status_changed = false;
    writes.events.clear();
    moved_on
        && writes.is_noop()
        && plan.traffic.is_none()
        && !plan.status.abort
        && !rollout.spec.is_paused()
        && rollout.spec.strategy.canary.is_some()
}

/// Keeps the stored status when the planned one differs only in pod counts and what follows
/// from them, and the stored one recorded progress less than [`COUNTS_SETTLE`] ago (at most
/// half the progress deadline); the plan looks again when that time is up, so counts that stay
/// put are still written.
fn hold_count_only_status(rollout: &Rollout, plan: &mut Plan, now: Timestamp) {
    let Some(stored) = rollout.status.as_ref() else {
        return;
    };
    let Some(canary) = rollout.spec.strategy.canary.as_ref() else {
        return;
    };
    if !plan.status_changed {
        return;
    }
    let routed = canary.traffic_routing.is_some();
    if without_counts(stored, routed) != without_counts(&plan.status, routed) {
        return;
    }
    let Some(progressing) = stored.condition(PROGRESSING) else {
        return;
    };
    let deadline = u64::try_from(rollout.spec.effective_progress_deadline_seconds()).unwrap_or(0);
    let settle = COUNTS_SETTLE.min(Duration::from_secs(deadline) / 2);
    let Ok(settle) = SignedDuration::try_from(settle) else {
        return;
    };
    let until = progressing
        .last_update_time
        .0
        .checked_add(settle)
        .unwrap_or(Timestamp::MAX);
    if until <= now {
        return;
    }
    let remaining = until.duration_since(now).unsigned_abs();
    plan.status = stored.clone();
    plan.status_changed = false;
    plan.requeue_after = Some(
        plan.requeue_after
            .map_or(remaining, |after| after.min(remaining)),
    );
}

/// `status` without the pod counts and what the planner derives from them alone: phase and
/// message, the `Available` condition, the `Progressing` condition's times and message, and a
/// basic canary's weights (its pods' split).
fn without_counts(status: &RolloutStatus, routed: bool) -> RolloutStatus {
    let mut rest = status.clone();
    rest.replicas = 0;
    rest.updated_replicas = 0;
    rest.ready_replicas = 0;
    rest.available_replicas = 0;
    rest.hpa_replicas = 0;
    rest.phase.clear();
    rest.message.clear();
    rest.conditions
        .retain(|condition| condition.type_ != AVAILABLE);
    // Progress re-adds the Progressing condition at the end: the order says nothing.
    rest.conditions
        .sort_by(|left, right| left.type_.cmp(&right.type_));
    for condition in &mut rest.conditions {
        if condition.type_ == PROGRESSING {
            condition.last_update_time = Time(Timestamp::UNIX_EPOCH);
            condition.last_transition_time = Time(Timestamp::UNIX_EPOCH);
            condition.message.clear();
        }
    }
    if !routed && let Some(weights) = rest.canary.weights.as_mut() {
        weights.canary.weight = 0;
        weights.stable.weight = 0;
    }
    rest
}

#[cfg(test)]
mod tests {
    use rollouts_crds::rollout::CanaryStep;

    use super::*;
    use crate::planner::test_world::{apply_writes, at};

    /// Applies a plan's writes the way the act phase would; pods are available at once when
    /// `ready`, else they exist and are not ready.
    fn act(observed: &mut Observed, plan: &Plan, ready: bool) {
        apply_writes(observed, plan, at(0), ready);
    }

    /// Pods that were not ready become available.
    fn pods_ready(observed: &mut Observed) {
        for rs in &mut observed.replica_sets {
            rs.ready_replicas = rs.replicas;
            rs.available_replicas = rs.replicas;
        }
    }

    /// A Rollout of 4 pods Healthy on v1, then changed to v2, with its observations.
    fn updating(steps: Vec<CanaryStep>, now: Timestamp) -> (Rollout, Observed) {
        let mut rollout = Rollout::test_canary("web", steps)
            .with_replicas(4)
            .with_image("app:v1");
        let mut observed = Observed::default();
        for _ in 0..10 {
            let plan = coalesced(&rollout, &observed, now);
            act(&mut observed, &plan, true);
            crate::planner::test_world::apply_to_rollout(&mut rollout, &plan);
        }
        let status = rollout.status.as_ref().expect("status");
        assert_eq!(status.phase, "Healthy", "{status:?}");
        rollout = rollout.with_image("app:v2");
        (rollout, observed)
    }

    #[test]
    fn a_completed_weight_step_and_the_pause_after_it_share_one_status() {
        let steps = vec![CanaryStep::weight(25), CanaryStep::pause_indefinitely()];
        let (mut rollout, mut observed) = updating(steps, at(0));
        let started = coalesced(&rollout, &observed, at(1));
        act(&mut observed, &started, false);
        crate::planner::test_world::apply_to_rollout(&mut rollout, &started);
        pods_ready(&mut observed);

        let next = coalesced(&rollout, &observed, at(2));
        assert_eq!(next.status.current_step_index, Some(1));
        assert_eq!(
            next.status
                .pause_conditions
                .iter()
                .map(|pause| pause.reason.as_str())
                .collect::<Vec<_>>(),
            vec!["CanaryPauseStep"],
            "the pause step is entered in the same plan"
        );
        assert!(next.status_changed);
        assert!(
            next.events
                .iter()
                .any(|event| event.reason == "RolloutStepCompleted"),
            "the completed step's event is kept: {:?}",
            next.events
        );
        let again = coalesced(
            &rollout.clone().with_status(next.status.clone()),
            &observed,
            at(2),
        );
        assert!(!again.status_changed, "nothing is left for a second write");
    }

    #[test]
    fn an_expired_pause_and_the_next_weight_share_one_reconcile() {
        let steps = vec![
            CanaryStep::weight(25),
            CanaryStep::pause_seconds(1),
            CanaryStep::weight(50),
        ];
        let (mut rollout, mut observed) = updating(steps, at(0));
        for second in 1..4 {
            let plan = coalesced(&rollout, &observed, at(second));
            act(&mut observed, &plan, true);
            crate::planner::test_world::apply_to_rollout(&mut rollout, &plan);
        }
        let status = rollout.status.clone().expect("status");
        assert_eq!(status.current_step_index, Some(1), "{status:?}");

        let expired = coalesced(&rollout, &observed, at(10));
        assert_eq!(expired.status.current_step_index, Some(2));
        assert!(expired.status.pause_conditions.is_empty());
        let scaled: Vec<i32> = expired
            .scale_replica_sets
            .iter()
            .map(|scale| scale.to)
            .collect();
        assert_eq!(scaled.len(), 2, "canary up and stable down: {scaled:?}");
        assert!(scaled.contains(&2));
    }

    #[test]
    fn counts_that_moved_alone_wait_for_the_pods_then_are_written() {
        let steps = vec![CanaryStep::weight(25), CanaryStep::pause_indefinitely()];
        let (mut rollout, mut observed) = updating(steps, at(0));
        let started = coalesced(&rollout, &observed, at(0));
        act(&mut observed, &started, false);
        crate::planner::test_world::apply_to_rollout(&mut rollout, &started);
        // The canary pod exists and is not ready, the stable lost one: only counts moved.
        let held = coalesced(&rollout, &observed, at(1));
        assert!(!held.status_changed, "{:?}", held.status);
        assert_eq!(Some(&held.status), rollout.status.as_ref());
        let wait = held
            .requeue_after
            .expect("looks again when the counts may be written");
        assert!(wait <= COUNTS_SETTLE, "{wait:?}");

        let late = coalesced(&rollout, &observed, at(60));
        assert!(late.status_changed, "counts that stay put are written");
        assert_eq!(late.status.updated_replicas, 1);
    }

    #[test]
    fn a_step_change_is_never_held() {
        let steps = vec![CanaryStep::weight(25), CanaryStep::pause_indefinitely()];
        let (rollout, observed) = updating(steps, at(0));
        let started = coalesced(&rollout, &observed, at(0));
        assert!(started.status_changed, "a new revision is written at once");
        assert_eq!(started.status.current_step_index, Some(0));
    }
}
