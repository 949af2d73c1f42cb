//! Rollout condition types, condition reasons, pause reasons and phases, spelled as Argo
//! Rollouts writes them (Argo CD and dashboards match on these strings), plus the rules for
//! setting a condition in `status.conditions`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::rollout::{RolloutCondition, RolloutStatus};

// Condition types.
/// The spec cannot be acted on; nothing progresses until it is fixed.
pub const INVALID_SPEC: &str = "InvalidSpec";
/// The active/stable pods have minimum availability.
pub const AVAILABLE: &str = "Available";
/// The rollout is making progress (or has stopped making it: see the reason).
pub const PROGRESSING: &str = "Progressing";
/// Pods of a ReplicaSet could not be created or deleted.
pub const REPLICA_FAILURE: &str = "ReplicaFailure";
/// The rollout is paused.
pub const PAUSED: &str = "Paused";
/// The rollout finished updating to the desired revision.
pub const COMPLETED: &str = "Completed";
/// Completed and every pod is available.
pub const HEALTHY: &str = "Healthy";

// Condition status values.
pub const STATUS_TRUE: &str = "True";
pub const STATUS_FALSE: &str = "False";
pub const STATUS_UNKNOWN: &str = "Unknown";

// Condition reasons.
pub const INVALID_SPEC_REASON: &str = "InvalidSpec";
/// Argo spells the Available reason with the `Reason` suffix.
pub const AVAILABLE_REASON: &str = "AvailableReason";
pub const REPLICA_SET_UPDATED_REASON: &str = "ReplicaSetUpdated";
pub const FAILED_RS_CREATE_REASON: &str = "ReplicaSetCreateError";
pub const NEW_REPLICA_SET_REASON: &str = "NewReplicaSetCreated";
pub const FOUND_NEW_RS_REASON: &str = "FoundNewReplicaSet";
pub const ROLLOUT_UPDATED_REASON: &str = "RolloutUpdated";
pub const ROLLOUT_COMPLETED_REASON: &str = "RolloutCompleted";
pub const ROLLOUT_NOT_COMPLETED_REASON: &str = "RolloutNotCompleted";
pub const ROLLOUT_HEALTHY_REASON: &str = "RolloutHealthy";
pub const ROLLOUT_ABORTED_REASON: &str = "RolloutAborted";
pub const ROLLOUT_RETRY_REASON: &str = "RolloutRetry";
pub const ROLLOUT_PAUSED_REASON: &str = "RolloutPaused";
pub const REPLICA_SET_NOT_AVAILABLE_REASON: &str = "ReplicaSetNotAvailable";
pub const ROLLOUT_RESUMED_REASON: &str = "RolloutResumed";
pub const ROLLOUT_STEP_COMPLETED_REASON: &str = "RolloutStepCompleted";
pub const TRAFFIC_WEIGHT_UPDATED_REASON: &str = "TrafficWeightUpdated";
pub const NEW_RS_AVAILABLE_REASON: &str = "NewReplicaSetAvailable";
pub const ANALYSIS_RUN_FAILED_REASON: &str = "AnalysisRunFailed";
pub const EXPERIMENT_FAILED_REASON: &str = "ExperimentFailed";
pub const RECONCILIATION_ERROR_REASON: &str = "ReconciliationError";
/// The Progressing reason when `progressDeadlineSeconds` passed without progress.
pub const TIMED_OUT_REASON: &str = "ProgressDeadlineExceeded";
pub const ROLLOUT_DELETED_REASON: &str = "RolloutDeleted";
pub const SCALING_REPLICA_SET_REASON: &str = "ScalingReplicaSet";
pub const SERVICE_REFERENCE_REASON: &str = "ServiceReferenceError";
pub const STEP_PLUGIN_TRANSITION_REASON: &str = "StepPluginTransition";
pub const TARGET_GROUP_VERIFIED_REASON: &str = "TargetGroupVerified";
pub const TARGET_GROUP_UNVERIFIED_REASON: &str = "TargetGroupUnverified";
pub const TARGET_GROUP_VERIFY_ERROR_REASON: &str = "TargetGroupVerifyError";
pub const WEIGHT_VERIFY_ERROR_REASON: &str = "WeightVerifyError";
pub const LOAD_BALANCER_NOT_FOUND_REASON: &str = "LoadBalancerNotFound";
pub const ROLLOUT_ADDED_TO_INFORMER_REASON: &str = "RolloutAddedToInformer";

// Fixed condition messages (messages with parameters are formatted where they are used).
pub const ROLLOUT_SELECT_ALL_MESSAGE: &str =
    "This rollout is selecting all pods. A non-empty selector is required.";
pub const NOT_AVAILABLE_MESSAGE: &str = "Rollout does not have minimum availability";
pub const AVAILABLE_MESSAGE: &str = "Rollout has minimum availability";
pub const ROLLOUT_HEALTHY_MESSAGE: &str = "Rollout is healthy";
pub const ROLLOUT_NOT_HEALTHY_MESSAGE: &str = "Rollout is not healthy";
pub const ROLLOUT_RETRY_MESSAGE: &str = "Retrying Rollout after abort";
pub const ROLLOUT_PAUSED_MESSAGE: &str = "Rollout is paused";
pub const ROLLOUT_RESUMED_MESSAGE: &str = "Rollout is resumed";

/// Messages with parameters, worded as Argo's (its `%q` is a double-quoted string).
pub mod messages {
    pub fn missing_field(field: &str) -> String {
        format!("Rollout has missing field '{field}'")
    }
    pub fn rollout_progressing(rollout: &str) -> String {
        format!("Rollout {rollout:?} is progressing.")
    }
    pub fn replica_set_progressing(replica_set: &str) -> String {
        format!("ReplicaSet {replica_set:?} is progressing.")
    }
    pub fn new_replica_set(replica_set: &str) -> String {
        format!("Created new replica set {replica_set:?}")
    }
    pub fn new_replica_set_detailed(replica_set: &str, revision: i64) -> String {
        format!("Created ReplicaSet {replica_set} (revision {revision})")
    }
    pub fn found_new_replica_set(replica_set: &str) -> String {
        format!("Found new replica set {replica_set:?}")
    }
    pub fn rollout_updated(revision: &str) -> String {
        format!("Rollout updated to revision {revision}")
    }
    pub fn rollout_completed(revision: i64, pod_hash: &str, reason: &str) -> String {
        format!("Rollout completed update to revision {revision} ({pod_hash}): {reason}")
    }
    pub fn rollout_not_completed(revision: i64, pod_hash: &str) -> String {
        format!("Rollout not completed, started update to revision {revision} ({pod_hash})")
    }
    pub fn rollout_aborted(revision: i64) -> String {
        format!("Rollout aborted update to revision {revision}")
    }
    pub fn rollout_step_completed(step: usize, steps: usize, description: &str) -> String {
        format!("Rollout step {step}/{steps} completed ({description})")
    }
    pub fn traffic_weight_updated(description: &str) -> String {
        format!("Traffic weight updated {description}")
    }
    pub fn analysis_run_failed(run: &str, rollout: &str) -> String {
        format!("AnalysisRun '{run}' owned by the Rollout '{rollout:?}' failed.")
    }
    pub fn experiment_failed(experiment: &str, rollout: &str) -> String {
        format!("Experiment '{experiment}' owned by the Rollout '{rollout:?}' has timed out.")
    }
    pub fn reconciliation_error(error: &str) -> String {
        format!("Reconciliation failed with error: {error}")
    }
    pub fn rollout_timed_out(rollout: &str) -> String {
        format!("Rollout {rollout:?} has timed out progressing.")
    }
    pub fn replica_set_timed_out(replica_set: &str) -> String {
        format!("ReplicaSet {replica_set:?} has timed out progressing.")
    }
    pub fn replica_set_completed(replica_set: &str) -> String {
        format!("ReplicaSet {replica_set:?} has successfully progressed.")
    }
    /// `operation` is `up` or `down`.
    pub fn scaling_replica_set(
        operation: &str,
        replica_set: &str,
        revision: i64,
        from: i32,
        to: i32,
    ) -> String {
        format!(
            "Scaled {operation} ReplicaSet {replica_set} (revision {revision}) from {from} to {to}"
        )
    }
    pub fn weight_verify_error(error: &str) -> String {
        format!("Failed to verify weight: {error}")
    }
}

// Pause reasons (`status.pauseConditions[].reason`).
/// Paused on an inconclusive AnalysisRun until a person promotes or aborts.
pub const PAUSE_REASON_INCONCLUSIVE_ANALYSIS: &str = "InconclusiveAnalysisRun";
/// Paused on an inconclusive Experiment.
pub const PAUSE_REASON_INCONCLUSIVE_EXPERIMENT: &str = "InconclusiveExperiment";
/// Paused on a canary `pause` step.
pub const PAUSE_REASON_CANARY_PAUSE_STEP: &str = "CanaryPauseStep";
/// Blue-green waiting for promotion.
pub const PAUSE_REASON_BLUE_GREEN_PAUSE: &str = "BlueGreenPause";

// Phases (`status.phase`).
pub const PHASE_HEALTHY: &str = "Healthy";
pub const PHASE_DEGRADED: &str = "Degraded";
pub const PHASE_PROGRESSING: &str = "Progressing";
pub const PHASE_PAUSED: &str = "Paused";

// Completion statuses (`status.duration.completionStatus`).
pub const COMPLETION_PROMOTED: &str = "Promoted";
pub const COMPLETION_FAST_PROMOTED: &str = "FastPromoted";
pub const COMPLETION_ABORTED: &str = "Aborted";
pub const COMPLETION_SUPERSEDED: &str = "Superseded";
pub const COMPLETION_ROLLED_BACK: &str = "RolledBack";
pub const COMPLETION_FAST_ROLLED_BACK: &str = "FastRolledBack";

impl crate::rollout::PauseCondition {
    /// A pause for `reason` starting at `now`.
    pub fn new(reason: &str, now: Time) -> Self {
        Self {
            reason: reason.to_string(),
            start_time: now,
        }
    }
}

impl RolloutCondition {
    /// A condition first seen at `now` (both timestamps set to it).
    pub fn new(
        type_: &str,
        status: &str,
        reason: &str,
        message: impl Into<String>,
        now: Time,
    ) -> Self {
        Self {
            type_: type_.to_string(),
            status: status.to_string(),
            last_update_time: now.clone(),
            last_transition_time: now,
            reason: reason.to_string(),
            message: message.into(),
        }
    }

    /// Whether the condition's status is `True`.
    pub fn is_true(&self) -> bool {
        self.status == STATUS_TRUE
    }
}

impl RolloutStatus {
    /// Sets a condition as Argo does: unchanged (returns false) when one of the same type already
    /// has the same status and reason; otherwise replaces it, keeping its `lastTransitionTime`
    /// when only the reason changed, and moves it to the end of the list.
    pub fn set_condition(&mut self, mut condition: RolloutCondition) -> bool {
        if let Some(current) = self.condition(&condition.type_) {
            if current.status == condition.status && current.reason == condition.reason {
                return false;
            }
            if current.status == condition.status {
                condition.last_transition_time = current.last_transition_time.clone();
            }
        }
        self.remove_condition(&condition.type_);
        self.conditions.push(condition);
        true
    }

    /// Removes the condition of the given type, if present.
    pub fn remove_condition(&mut self, type_: &str) {
        self.conditions.retain(|c| c.type_ != type_);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("valid timestamp"))
    }

    #[test]
    fn messages_read_as_argo_writes_them() {
        assert_eq!(
            messages::rollout_aborted(3),
            "Rollout aborted update to revision 3"
        );
        assert_eq!(
            messages::rollout_timed_out("web"),
            "Rollout \"web\" has timed out progressing."
        );
        assert_eq!(
            messages::scaling_replica_set("up", "web-abc", 2, 0, 3),
            "Scaled up ReplicaSet web-abc (revision 2) from 0 to 3"
        );
        assert_eq!(
            messages::missing_field(".spec.selector"),
            "Rollout has missing field '.spec.selector'"
        );
    }

    #[test]
    fn same_status_and_reason_is_not_an_update() {
        let mut status = RolloutStatus::default();
        let first = RolloutCondition::new(
            PROGRESSING,
            STATUS_TRUE,
            NEW_REPLICA_SET_REASON,
            "a",
            at(10),
        );
        assert!(status.set_condition(first.clone()));
        let again = RolloutCondition::new(
            PROGRESSING,
            STATUS_TRUE,
            NEW_REPLICA_SET_REASON,
            "b",
            at(20),
        );
        assert!(!status.set_condition(again));
        assert_eq!(status.conditions, vec![first]);
    }

    #[test]
    fn reason_change_keeps_transition_time_status_change_resets_it() {
        let mut status = RolloutStatus::default();
        status.set_condition(RolloutCondition::new(
            PROGRESSING,
            STATUS_TRUE,
            NEW_REPLICA_SET_REASON,
            "",
            at(10),
        ));
        status.set_condition(RolloutCondition::new(
            PROGRESSING,
            STATUS_TRUE,
            REPLICA_SET_UPDATED_REASON,
            "",
            at(20),
        ));
        let progressing = status.condition(PROGRESSING).expect("Progressing is set");
        assert_eq!(progressing.last_transition_time, at(10));
        assert_eq!(progressing.last_update_time, at(20));

        status.set_condition(RolloutCondition::new(
            PROGRESSING,
            STATUS_FALSE,
            TIMED_OUT_REASON,
            "",
            at(30),
        ));
        let progressing = status.condition(PROGRESSING).expect("Progressing is set");
        assert_eq!(progressing.last_transition_time, at(30));
        assert_eq!(status.conditions.len(), 1);
    }

    #[test]
    fn updated_condition_moves_to_the_end_and_remove_drops_it() {
        let mut status = RolloutStatus::default();
        status.set_condition(RolloutCondition::new(
            PROGRESSING,
            STATUS_TRUE,
            NEW_REPLICA_SET_REASON,
            "",
            at(1),
        ));
        status.set_condition(RolloutCondition::new(
            AVAILABLE,
            STATUS_TRUE,
            AVAILABLE_REASON,
            "",
            at(1),
        ));
        status.set_condition(RolloutCondition::new(
            PROGRESSING,
            STATUS_FALSE,
            ROLLOUT_ABORTED_REASON,
            "",
            at(2),
        ));
        let types: Vec<_> = status.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, [AVAILABLE, PROGRESSING]);
        status.remove_condition(AVAILABLE);
        assert!(status.condition(AVAILABLE).is_none());
        assert!(
            !status
                .condition(PROGRESSING)
                .expect("still there")
                .is_true()
        );
    }
}
