//! A Rollout's health from its status alone, computed the way Argo CD's built-in health check
//! for `argoproj.io/Rollout` computes it, so the plugin and a GitOps dashboard agree.

use serde_json::Value;

/// Argo CD's health states for a Rollout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthStatus {
    Healthy,
    Progressing,
    /// Argo CD's word for a paused Rollout; the plugin prints it as Argo's plugin does, "Paused".
    Suspended,
    Degraded,
}

impl HealthStatus {
    /// The word Argo's plugin prints for this state.
    pub fn phase_word(self) -> &'static str {
        match self {
            HealthStatus::Healthy => "Healthy",
            HealthStatus::Progressing => "Progressing",
            HealthStatus::Suspended => "Paused",
            HealthStatus::Degraded => "Degraded",
        }
    }

    /// The icon Argo's plugin draws next to the state.
    pub fn icon(self) -> &'static str {
        match self {
            HealthStatus::Healthy => "✔",
            HealthStatus::Progressing => "◌",
            HealthStatus::Suspended => "॥",
            HealthStatus::Degraded => "✖",
        }
    }

    /// Whether `status --watch` stops here.
    pub fn is_final(self) -> bool {
        matches!(self, HealthStatus::Healthy | HealthStatus::Degraded)
    }
}

/// A health state and the message that explains it (empty when there is nothing to say).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    pub status: HealthStatus,
    pub message: String,
}

impl Health {
    fn new(status: HealthStatus, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    /// `Phase - message`, or the phase alone when there is no message (as `status` prints).
    pub fn line(&self) -> String {
        if self.message.is_empty() {
            self.status.phase_word().to_string()
        } else {
            format!("{} - {}", self.status.phase_word(), self.message)
        }
    }
}

fn count(value: &Value, pointer: &str, default: i64) -> i64 {
    value
        .pointer(pointer)
        .and_then(Value::as_i64)
        .unwrap_or(default)
}

fn text<'a>(value: &'a Value, pointer: &str) -> Option<&'a str> {
    value.pointer(pointer).and_then(Value::as_str)
}

/// Whether the controller has seen the current spec. A non-numeric observedGeneration (written
/// by Argo before v0.10) counts as observed, as Argo CD treats it.
fn generation_observed(rollout: &Value) -> bool {
    let observed = match rollout.pointer("/status/observedGeneration") {
        Some(Value::String(text)) => match text.parse::<i64>() {
            Ok(n) => n,
            Err(_) => return true,
        },
        Some(Value::Number(n)) => match n.as_i64() {
            Some(n) => n,
            None => return true,
        },
        _ => return false,
    };
    observed == count(rollout, "/metadata/generation", 0)
}

fn replicas_health(rollout: &Value) -> Option<Health> {
    let desired = count(rollout, "/spec/replicas", 1);
    let current = count(rollout, "/status/replicas", 0);
    let updated = count(rollout, "/status/updatedReplicas", 0);
    let available = count(rollout, "/status/availableReplicas", 0);
    if updated < desired {
        return Some(Health::new(
            HealthStatus::Progressing,
            "Waiting for roll out to finish: More replicas need to be updated",
        ));
    }
    // Blue-green keeps old pods for scaleDownDelaySeconds, so only a canary waits for them.
    if rollout.pointer("/spec/strategy/canary").is_some() && current > updated {
        return Some(Health::new(
            HealthStatus::Progressing,
            "Waiting for roll out to finish: old replicas are pending termination",
        ));
    }
    if available < updated {
        return Some(Health::new(
            HealthStatus::Progressing,
            "Waiting for roll out to finish: updated replicas are still becoming available",
        ));
    }
    None
}

/// The health of `rollout` (its JSON), in Argo CD's order of checks: spec observed, the
/// controller's own phase when it wrote one, degrading conditions, pauses, replica counts, and
/// finally whether the stable (and, for blue-green, the active) ReplicaSet is the current one.
pub fn rollout_health(rollout: &Value) -> Health {
    if !generation_observed(rollout) {
        return Health::new(
            HealthStatus::Progressing,
            "Waiting for rollout spec update to be observed",
        );
    }
    if let Some(phase) = text(rollout, "/status/phase").filter(|p| !p.is_empty()) {
        let message = text(rollout, "/status/message").unwrap_or_default();
        let status = match phase {
            "Healthy" => HealthStatus::Healthy,
            "Paused" => HealthStatus::Suspended,
            "Degraded" => HealthStatus::Degraded,
            _ => HealthStatus::Progressing,
        };
        return Health::new(status, message);
    }
    let conditions = rollout
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for condition in conditions {
        let kind = text(condition, "/type").unwrap_or_default();
        let reason = text(condition, "/reason").unwrap_or_default();
        let degraded = kind == "InvalidSpec"
            || (kind == "Progressing"
                && (reason == "RolloutAborted" || reason == "ProgressDeadlineExceeded"));
        if degraded {
            return Health::new(
                HealthStatus::Degraded,
                text(condition, "/message").unwrap_or_default(),
            );
        }
    }
    let pause_conditions = rollout
        .pointer("/status/pauseConditions")
        .and_then(Value::as_array)
        .is_some_and(|list| !list.is_empty());
    let spec_paused = rollout
        .pointer("/spec/paused")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if pause_conditions || spec_paused {
        return Health::new(HealthStatus::Suspended, "Rollout is paused");
    }
    let Some(current_hash) = text(rollout, "/status/currentPodHash") else {
        return Health::new(
            HealthStatus::Progressing,
            "Waiting for rollout to finish: status has not been reconciled.",
        );
    };
    if let Some(health) = replicas_health(rollout) {
        return health;
    }
    let stable = text(rollout, "/status/stableRS");
    if rollout.pointer("/spec/strategy/blueGreen").is_some() {
        if text(rollout, "/status/blueGreen/activeSelector") != Some(current_hash) {
            return Health::new(HealthStatus::Progressing, "active service cutover pending");
        }
        if stable.is_some_and(|s| s != current_hash) {
            return Health::new(
                HealthStatus::Progressing,
                "waiting for analysis to complete",
            );
        }
    } else if rollout.pointer("/spec/strategy/canary").is_some()
        && stable.is_some_and(|s| s != current_hash)
    {
        return Health::new(
            HealthStatus::Progressing,
            "Waiting for rollout to finish steps",
        );
    }
    Health::new(HealthStatus::Healthy, "")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canary(status: Value) -> Value {
        json!({
            "metadata": {"name": "web", "generation": 2},
            "spec": {"replicas": 4, "strategy": {"canary": {"steps": [{"setWeight": 25}]}}},
            "status": status
        })
    }

    fn settled() -> Value {
        json!({
            "observedGeneration": "2", "conditions": [], "currentPodHash": "abc", "stableRS": "abc",
            "replicas": 4, "updatedReplicas": 4, "availableReplicas": 4
        })
    }

    #[test]
    fn a_settled_canary_is_healthy() {
        assert_eq!(
            rollout_health(&canary(settled())),
            Health::new(HealthStatus::Healthy, "")
        );
    }

    #[test]
    fn an_unobserved_spec_is_progressing() {
        let mut status = settled();
        status["observedGeneration"] = json!("1");
        let health = rollout_health(&canary(status));
        assert_eq!(health.status, HealthStatus::Progressing);
        assert_eq!(
            health.message,
            "Waiting for rollout spec update to be observed"
        );
        let missing = rollout_health(&canary(json!({})));
        assert_eq!(missing.status, HealthStatus::Progressing);
    }

    #[test]
    fn a_non_numeric_observed_generation_counts_as_observed() {
        let mut status = settled();
        status["observedGeneration"] = json!("7d9f8b");
        assert_eq!(
            rollout_health(&canary(status)).status,
            HealthStatus::Healthy
        );
    }

    #[test]
    fn the_controllers_phase_wins_and_paused_is_suspended() {
        let mut status = settled();
        status["phase"] = json!("Paused");
        status["message"] = json!("CanaryPauseStep");
        let health = rollout_health(&canary(status));
        assert_eq!(health.status, HealthStatus::Suspended);
        assert_eq!(health.line(), "Paused - CanaryPauseStep");
    }

    #[test]
    fn aborted_deadline_and_invalid_spec_are_degraded() {
        for (kind, reason) in [
            ("Progressing", "RolloutAborted"),
            ("Progressing", "ProgressDeadlineExceeded"),
            ("InvalidSpec", "InvalidSpec"),
        ] {
            let mut status = settled();
            status["conditions"] = json!([{"type": kind, "reason": reason, "status": "True", "message": "went wrong"}]);
            let health = rollout_health(&canary(status));
            assert_eq!(
                health,
                Health::new(HealthStatus::Degraded, "went wrong"),
                "{kind}/{reason}"
            );
        }
    }

    #[test]
    fn pauses_suspend() {
        let mut status = settled();
        status["pauseConditions"] = json!([{"reason": "CanaryPauseStep"}]);
        assert_eq!(
            rollout_health(&canary(status)).status,
            HealthStatus::Suspended
        );
        let mut paused = canary(settled());
        paused["spec"]["paused"] = json!(true);
        assert_eq!(rollout_health(&paused).line(), "Paused - Rollout is paused");
    }

    #[test]
    fn replica_counts_hold_back_health() {
        let cases = [
            ("updatedReplicas", 3, "More replicas need to be updated"),
            ("replicas", 5, "old replicas are pending termination"),
            ("availableReplicas", 3, "still becoming available"),
        ];
        for (field, value, expected) in cases {
            let mut status = settled();
            status[field] = json!(value);
            let health = rollout_health(&canary(status));
            assert_eq!(health.status, HealthStatus::Progressing, "{field}");
            assert!(health.message.ends_with(expected), "{}", health.message);
        }
    }

    #[test]
    fn a_canary_waits_for_its_steps_until_stable_is_current() {
        let mut status = settled();
        status["stableRS"] = json!("old");
        assert_eq!(
            rollout_health(&canary(status)).message,
            "Waiting for rollout to finish steps"
        );
        let mut status = settled();
        status.as_object_mut().unwrap().remove("currentPodHash");
        assert_eq!(
            rollout_health(&canary(status)).status,
            HealthStatus::Progressing
        );
    }

    #[test]
    fn blue_green_needs_the_active_selector_on_the_current_hash() {
        let mut rollout = canary(settled());
        rollout["spec"]["strategy"] = json!({"blueGreen": {"activeService": "web"}});
        rollout["status"]["replicas"] = json!(8);
        assert_eq!(
            rollout_health(&rollout).message,
            "active service cutover pending"
        );
        rollout["status"]["blueGreen"] = json!({"activeSelector": "abc"});
        assert_eq!(rollout_health(&rollout).status, HealthStatus::Healthy);
    }
}
