//! Status rules that Argo CD and Argo's tools read: progress, health, time-out and the
//! phase/message pair, computed from a Rollout's spec and a status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use rollouts_crds::conditions::*;
use rollouts_crds::rollout::{Rollout, RolloutCondition, RolloutSpec, RolloutStatus};

use std::time::Duration;

use rollouts_crds::FieldError;

use super::{Event, EventType, Observed, ObservedReplicaSet, Plan, ReplicaFailure};

/// Whether the status shows progress since `previous`: pods updated, old pods gone, more pods
/// ready or available, a new stable, a step taken or new steps.
pub fn made_progress(previous: &RolloutStatus, next: &RolloutStatus) -> bool {
    let step_moved = matches!(
        (previous.current_step_index, next.current_step_index),
        (Some(before), Some(after)) if before != after
    );
    let old_before = previous.replicas.saturating_sub(previous.updated_replicas);
    let old_after = next.replicas.saturating_sub(next.updated_replicas);
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
    let step_count = spec.strategy.canary.as_ref().map_or(0, |canary| {
        i32::try_from(canary.steps().len()).unwrap_or(i32::MAX)
    });
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

/// A blue-green rollout is healthy when every updated pod is available, both services select the
/// current revision and the spec generation was already observed. Old pods kept for the
/// scale-down delay do not count against it.
pub fn is_healthy_blue_green(
    spec: &RolloutSpec,
    generation: &str,
    previous: &RolloutStatus,
    next: &RolloutStatus,
) -> bool {
    let replicas = spec.effective_replicas();
    let preview_set = spec
        .strategy
        .blue_green
        .as_ref()
        .is_some_and(|blue_green| blue_green.preview_service.is_some());
    let active_done = next.blue_green.active_selector == next.current_pod_hash;
    let preview_done = !preview_set || next.blue_green.preview_selector == next.current_pod_hash;
    next.updated_replicas == replicas
        && next.available_replicas == replicas
        && previous.observed_generation == generation
        && active_done
        && preview_done
}

/// Whether an AnalysisRun phase name (as status records it) is final.
fn run_completed(phase: &str) -> bool {
    matches!(phase, "Successful" | "Failed" | "Error" | "Inconclusive")
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

/// `status.phase` and `status.message` as Argo computes them (canary or blue-green).
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
    if let Some(blue_green) = &spec.strategy.blue_green {
        let active = &status.blue_green.active_selector;
        if active.is_empty() || *active != status.current_pod_hash {
            return (
                PHASE_PROGRESSING.into(),
                "active service cutover pending".into(),
            );
        }
        if status.stable_rs.is_empty() || status.stable_rs != status.current_pod_hash {
            let analysing = blue_green.post_promotion_analysis.is_some()
                && status
                    .blue_green
                    .post_promotion_analysis_run_status
                    .as_ref()
                    .is_none_or(|run| !run_completed(&run.status));
            let message = if analysing {
                "waiting for analysis to complete"
            } else {
                "waiting for post-promotion verification to complete"
            };
            return (PHASE_PROGRESSING.into(), message.into());
        }
        return (PHASE_HEALTHY.into(), String::new());
    }
    let basic_canary = spec
        .strategy
        .canary
        .as_ref()
        .is_some_and(|canary| canary.traffic_routing.is_none());
    if basic_canary && status.replicas > status.updated_replicas {
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

/// What [`set_conditions`] needs to know about the plan besides the statuses.
pub(super) struct Progress<'a> {
    pub rollout: &'a Rollout,
    pub now: Timestamp,
    /// The strategy's health rule holds for the next status.
    pub healthy: bool,
    /// Why this plan aborts the update, when it does.
    pub abort_reason: Option<&'a str>,
    pub revision: i64,
    /// Name of the current revision's ReplicaSet.
    pub rs_name: &'a str,
    pub current_hash: &'a str,
    /// Waiting on a person, an analysis or a scale-down delay: the progress deadline stops.
    pub deadline_paused: bool,
    /// The ReplicaSets' `ReplicaFailure` to carry (see [`replica_failure`]).
    pub replica_failure: Option<&'a ReplicaFailure>,
}

/// The `ReplicaFailure` the Rollout's status carries, as Argo chooses it: the current
/// revision's, else any other ReplicaSet's.
pub(super) fn replica_failure<'a>(
    observed: &'a Observed,
    current_hash: &str,
) -> Option<&'a ReplicaFailure> {
    let failing = |rs: &'a ObservedReplicaSet| rs.replica_failure.as_ref();
    observed
        .replica_sets
        .iter()
        .filter(|rs| rs.pod_template_hash == current_hash)
        .find_map(failing)
        .or_else(|| observed.replica_sets.iter().find_map(failing))
}

/// Sets Paused, Healthy, Progressing, Available and Completed as Argo does; returns the events
/// the transitions ask for.
pub(super) fn set_conditions(progress: &Progress, next: &mut RolloutStatus) -> Vec<Event> {
    let mut events = Vec::new();
    let deadline_seconds = progress.rollout.spec.effective_progress_deadline_seconds();
    let now = Time(progress.now);
    let previous = progress.rollout.status.clone().unwrap_or_default();
    let condition = |type_: &str, status: &str, reason: &str, message: String| {
        RolloutCondition::new(type_, status, reason, message, now.clone())
    };
    next.remove_condition(INVALID_SPEC);
    let is_paused = !next.pause_conditions.is_empty() || progress.rollout.spec.is_paused();
    let was_aborted = previous
        .condition(PROGRESSING)
        .is_some_and(|c| c.reason == ROLLOUT_ABORTED_REASON);
    let revision = progress.revision;
    let rs_name = progress.rs_name;

    let paused_true = next
        .condition(PAUSED)
        .is_some_and(RolloutCondition::is_true);
    if is_paused != paused_true && !next.abort {
        let status = if is_paused { STATUS_TRUE } else { STATUS_FALSE };
        next.set_condition(condition(
            PAUSED,
            status,
            ROLLOUT_PAUSED_REASON,
            ROLLOUT_PAUSED_MESSAGE.into(),
        ));
    }

    let healthy = progress.healthy;
    let mut became_unhealthy = false;
    if !is_paused && healthy {
        next.set_condition(condition(
            HEALTHY,
            STATUS_TRUE,
            ROLLOUT_HEALTHY_REASON,
            ROLLOUT_HEALTHY_MESSAGE.into(),
        ));
    } else if next.condition(HEALTHY).is_some() {
        became_unhealthy = next.set_condition(condition(
            HEALTHY,
            STATUS_FALSE,
            ROLLOUT_HEALTHY_REASON,
            ROLLOUT_NOT_HEALTHY_MESSAGE.into(),
        ));
    }

    if next.abort {
        let mut message = format!("Rollout aborted update to revision {revision}");
        if let Some(reason) = progress.abort_reason {
            message = format!("{message}: {reason}");
        }
        let aborted = condition(
            PROGRESSING,
            STATUS_FALSE,
            ROLLOUT_ABORTED_REASON,
            message.clone(),
        );
        if next.set_condition(aborted) {
            events.push(Event {
                type_: EventType::Warning,
                reason: ROLLOUT_ABORTED_REASON.into(),
                message,
            });
        }
    } else if is_paused {
        next.set_condition(condition(
            PROGRESSING,
            STATUS_UNKNOWN,
            ROLLOUT_PAUSED_REASON,
            ROLLOUT_PAUSED_MESSAGE.into(),
        ));
    } else {
        let current = previous.condition(PROGRESSING).cloned();
        if was_aborted {
            next.set_condition(condition(
                PROGRESSING,
                STATUS_UNKNOWN,
                ROLLOUT_RETRY_REASON,
                ROLLOUT_RETRY_MESSAGE.into(),
            ));
        } else if current
            .as_ref()
            .is_some_and(|c| c.reason == ROLLOUT_PAUSED_REASON)
        {
            next.set_condition(condition(
                PROGRESSING,
                STATUS_UNKNOWN,
                ROLLOUT_RESUMED_REASON,
                ROLLOUT_RESUMED_MESSAGE.into(),
            ));
        }
        if healthy {
            next.set_condition(condition(
                PROGRESSING,
                STATUS_TRUE,
                NEW_RS_AVAILABLE_REASON,
                format!("ReplicaSet \"{rs_name}\" has successfully progressed."),
            ));
        } else if made_progress(&previous, next) || became_unhealthy {
            let stable_again = next.stable_rs == next.current_pod_hash && became_unhealthy;
            let (reason, message) = if stable_again {
                (
                    REPLICA_SET_NOT_AVAILABLE_REASON,
                    NOT_AVAILABLE_MESSAGE.to_string(),
                )
            } else {
                (
                    REPLICA_SET_UPDATED_REASON,
                    format!("ReplicaSet \"{rs_name}\" is progressing."),
                )
            };
            let mut progressing = condition(PROGRESSING, STATUS_TRUE, reason, message);
            // Progress refreshes lastUpdateTime even when the reason stays the same.
            if let Some(current) = next.condition(PROGRESSING)
                && current.status == STATUS_TRUE
            {
                progressing.last_transition_time = current.last_transition_time.clone();
            }
            next.remove_condition(PROGRESSING);
            next.set_condition(progressing);
        } else if !progress.deadline_paused && timed_out(next, deadline_seconds, progress.now) {
            next.set_condition(condition(
                PROGRESSING,
                STATUS_FALSE,
                TIMED_OUT_REASON,
                format!("ReplicaSet \"{rs_name}\" has timed out progressing."),
            ));
        }
    }

    let (status, message) = if next.available_replicas >= progress.rollout.spec.effective_replicas()
    {
        (STATUS_TRUE, AVAILABLE_MESSAGE)
    } else {
        (STATUS_FALSE, NOT_AVAILABLE_MESSAGE)
    };
    next.set_condition(condition(
        AVAILABLE,
        status,
        AVAILABLE_REASON,
        message.into(),
    ));

    // A ReplicaSet that cannot create its pods (a quota, an admission policy) says why on the
    // Rollout, as Argo copies it; gone once no ReplicaSet fails.
    match progress.replica_failure {
        Some(failure) => {
            let since = failure.since.map_or_else(|| now.clone(), Time);
            next.set_condition(RolloutCondition::new(
                REPLICA_FAILURE,
                STATUS_TRUE,
                &failure.reason,
                failure.message.clone(),
                since,
            ));
        }
        None => next.remove_condition(REPLICA_FAILURE),
    }

    let completed = !next.stable_rs.is_empty() && next.stable_rs == next.current_pod_hash;
    let status = if completed { STATUS_TRUE } else { STATUS_FALSE };
    let changed = next.set_condition(condition(
        COMPLETED,
        status,
        ROLLOUT_COMPLETED_REASON,
        ROLLOUT_COMPLETED_REASON.into(),
    ));
    if changed && !completed {
        let message = format!(
            "Rollout not completed, started update to revision {revision} ({})",
            progress.current_hash
        );
        events.push(Event {
            type_: EventType::Normal,
            reason: ROLLOUT_NOT_COMPLETED_REASON.into(),
            message,
        });
    }
    events
}

/// What a strategy's planner emits besides the status: events, and the soonest time anything
/// it waits for (a pause, a deadline, a delay) is due.
#[derive(Debug, Default)]
pub(super) struct Outbox {
    pub events: Vec<Event>,
    pub requeue: Option<Duration>,
}

impl Outbox {
    pub fn event(&mut self, type_: EventType, reason: &str, message: String) {
        self.events.push(Event {
            type_,
            reason: reason.into(),
            message,
        });
    }

    /// Look again after `after`, or sooner if something else is due sooner.
    pub fn requeue_in(&mut self, after: Duration) {
        self.requeue = Some(self.requeue.map_or(after, |current| current.min(after)));
    }

    /// Look again at `at` (at once if that has passed).
    pub fn requeue_at(&mut self, now: Timestamp, at: Timestamp) {
        let remaining = at.duration_since(now);
        let after = if remaining.is_negative() {
            Duration::ZERO
        } else {
            remaining.unsigned_abs()
        };
        self.requeue_in(after);
    }
}

/// Sets `InvalidSpec` and touches nothing running.
pub(super) fn invalid_spec(rollout: &Rollout, error: &FieldError, now: Timestamp) -> Plan {
    let mut plan = Plan::unchanged(rollout);
    let previous = plan.status.clone();
    let message = error.to_string();
    let condition = RolloutCondition::new(
        INVALID_SPEC,
        STATUS_TRUE,
        INVALID_SPEC_REASON,
        message.clone(),
        Time(now),
    );
    let replaced = previous
        .condition(INVALID_SPEC)
        .is_some_and(|current| current.message != message);
    if replaced {
        plan.status.remove_condition(INVALID_SPEC);
    }
    if plan.status.set_condition(condition) {
        plan.events.push(Event {
            type_: EventType::Warning,
            reason: INVALID_SPEC_REASON.into(),
            message,
        });
    }
    plan.status.observed_generation = generation_string(rollout);
    (plan.status.phase, plan.status.message) = phase(&rollout.spec, &plan.status);
    plan.status_changed = plan.status != previous;
    plan
}

pub(super) fn generation_string(rollout: &Rollout) -> String {
    rollout.metadata.generation.unwrap_or_default().to_string()
}
