//! Status rules that Argo CD and Argo's tools read: progress, health, time-out and the
//! phase/message pair, computed from a Rollout's spec and a status.

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use rollouts_crds::conditions::{
    INVALID_SPEC, PHASE_DEGRADED, PHASE_HEALTHY, PHASE_PAUSED, PHASE_PROGRESSING, PROGRESSING,
    ROLLOUT_ABORTED_REASON, ROLLOUT_PAUSED_REASON, TIMED_OUT_REASON,
};
use rollouts_crds::rollout::{RolloutSpec, RolloutStatus};

/// Whether the status shows progress since `previous`: pods updated, old pods gone, more pods
/// ready or available, a new stable, a step taken or new steps.
pub fn made_progress(previous: &RolloutStatus, next: &RolloutStatus) -> bool {
    let step_moved = matches!(
        (previous.current_step_index, next.current_step_index),
        (Some(before), Some(after)) if before != after
    );
    let old_before = previous.replicas - previous.updated_replicas;
    let old_after = next.replicas - next.updated_replicas;
    next.updated_replicas != previous.updated_replicas
        || old_after < old_before
        || next.ready_replicas > previous.ready_replicas
        || next.available_replicas > previous.available_replicas
        || next.stable_rs != previous.stable_rs
        || step_moved
        || next.current_step_hash != previous.current_step_hash
}

/// A canary rollout is healthy when every pod runs the current revision, that revision is
/// stable, every step ran and the spec generation was already observed.
pub fn is_healthy(
    spec: &RolloutSpec,
    generation: &str,
    previous: &RolloutStatus,
    next: &RolloutStatus,
) -> bool {
    let replicas = spec.effective_replicas();
    let step_count = spec
        .strategy
        .canary
        .as_ref()
        .map_or(0, |canary| canary.steps().len() as i32);
    let executed_all_steps = match next.current_step_index {
        Some(index) if step_count > 0 => index == step_count,
        _ => true,
    };
    let current_is_stable = !next.stable_rs.is_empty() && next.stable_rs == next.current_pod_hash;
    next.updated_replicas == replicas
        && next.available_replicas == replicas
        && previous.observed_generation == generation
        && executed_all_steps
        && current_is_stable
        && next.replicas == replicas
}

/// Whether the Progressing condition has gone `deadline_seconds` without an update.
pub fn timed_out(status: &RolloutStatus, deadline_seconds: i32, now: Timestamp) -> bool {
    let Some(progressing) = status.condition(PROGRESSING) else {
        return false;
    };
    match progressing.reason.as_str() {
        ROLLOUT_ABORTED_REASON | ROLLOUT_PAUSED_REASON => false,
        TIMED_OUT_REASON => true,
        _ => deadline_of(progressing.last_update_time.0, deadline_seconds) < now,
    }
}

/// `from` plus the progress deadline.
pub fn deadline_of(from: Timestamp, deadline_seconds: i32) -> Timestamp {
    from.checked_add(SignedDuration::from_secs(i64::from(deadline_seconds)))
        .unwrap_or(Timestamp::MAX)
}

/// `status.phase` and `status.message` as Argo computes them for a canary without a router.
pub fn phase(spec: &RolloutSpec, status: &RolloutStatus) -> (String, String) {
    for condition in &status.conditions {
        if condition.type_ == INVALID_SPEC {
            return (
                PHASE_DEGRADED.into(),
                format!("{INVALID_SPEC}: {}", condition.message),
            );
        }
        if condition.reason == ROLLOUT_ABORTED_REASON || condition.reason == TIMED_OUT_REASON {
            return (
                PHASE_DEGRADED.into(),
                format!("{}: {}", condition.reason, condition.message),
            );
        }
    }
    if spec.is_paused() {
        return (PHASE_PAUSED.into(), "manually paused".into());
    }
    if let Some(pause) = status.pause_conditions.first() {
        return (PHASE_PAUSED.into(), pause.reason.clone());
    }
    let restarting = spec.restart_at.as_ref().is_some_and(|restart_at| {
        status.restarted_at.as_ref().map(|time| time.0) != Some(restart_at.0)
    });
    if restarting {
        return (PHASE_PROGRESSING.into(), "rollout is restarting".into());
    }
    if status.updated_replicas < spec.effective_replicas() {
        return (
            PHASE_PROGRESSING.into(),
            "more replicas need to be updated".into(),
        );
    }
    if status.available_replicas < status.updated_replicas {
        return (
            PHASE_PROGRESSING.into(),
            "updated replicas are still becoming available".into(),
        );
    }
    if status.replicas > status.updated_replicas {
        return (
            PHASE_PROGRESSING.into(),
            "old replicas are pending termination".into(),
        );
    }
    let fully_promoted =
        !status.stable_rs.is_empty() && status.stable_rs == status.current_pod_hash;
    if !fully_promoted {
        return (
            PHASE_PROGRESSING.into(),
            "waiting for all steps to complete".into(),
        );
    }
    (PHASE_HEALTHY.into(), String::new())
}
