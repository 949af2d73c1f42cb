//! Pause and abort bookkeeping shared by both strategies: the decisions one plan takes
//! (add or remove pause conditions, abort, clear) applied to status at the end, and when a
//! timed pause runs out.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use rollouts_crds::rollout::{PauseCondition, RolloutStatus};

/// Pause and abort decisions taken during one plan, applied to status at the end.
#[derive(Default)]
pub(super) struct PauseDecisions {
    pub add: Vec<&'static str>,
    pub remove: Vec<&'static str>,
    pub clear: bool,
    pub add_abort: Option<String>,
    pub remove_abort: bool,
}

impl PauseDecisions {
    /// The update is aborted once this plan's decisions apply to `base`.
    pub fn is_aborted(&self, base: &RolloutStatus) -> bool {
        !self.remove_abort && (self.add_abort.is_some() || base.abort)
    }

    /// Writes the decisions over `base` into `next`: abort, pause conditions, controllerPause.
    pub fn apply(&self, base: &RolloutStatus, now: Timestamp, next: &mut RolloutStatus) {
        let now = Time(now);
        if self.is_aborted(base) {
            next.abort = true;
            next.aborted_at = Some(base.aborted_at.clone().unwrap_or(now));
            next.pause_conditions.clear();
            next.controller_pause = false;
            return;
        }
        next.abort = false;
        next.aborted_at = None;
        if self.clear {
            next.pause_conditions.clear();
            next.controller_pause = false;
            return;
        }
        let present = |reason: &str| base.pause_conditions.iter().any(|c| c.reason == reason);
        let mut conditions: Vec<PauseCondition> = base
            .pause_conditions
            .iter()
            .filter(|condition| !self.remove.contains(&condition.reason.as_str()))
            .cloned()
            .collect();
        let mut controller_pause = base.controller_pause;
        for reason in &self.add {
            if !present(reason) {
                conditions.push(PauseCondition {
                    reason: (*reason).into(),
                    start_time: now.clone(),
                });
                controller_pause = true;
            }
        }
        next.controller_pause = controller_pause && !conditions.is_empty();
        next.pause_conditions = conditions;
    }
}

/// When a pause that started at `start` and lasts `duration` is over.
pub(super) fn pause_expiry(start: &Time, duration: Duration) -> Timestamp {
    let duration = SignedDuration::try_from(duration).unwrap_or(SignedDuration::MAX);
    start.0.checked_add(duration).unwrap_or(Timestamp::MAX)
}
