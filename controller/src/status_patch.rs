//! What the runtime shell writes to a Rollout's status before the planner acts (the
//! `InvalidSpec` condition, `observedGeneration`, a `conditions` list), and the merge patch
//! from the status the controller saw to the one it wants: `None` when nothing changed, so an
//! unchanged Rollout costs no write, no resourceVersion bump and no event.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use rollouts_crds::FieldError;
use rollouts_crds::conditions;
use rollouts_crds::rollout::{Rollout, RolloutCondition, RolloutStatus};
use serde::Serialize;
use serde_json::{Map, Value};

/// Argo's phase for a Rollout whose spec cannot be acted on.
pub const DEGRADED_PHASE: &str = "Degraded";

/// The `InvalidSpec` condition's message, worded as Argo words it.
pub fn invalid_spec_message(rollout: &Rollout, findings: &[FieldError]) -> String {
    let details: Vec<String> = findings.iter().map(ToString::to_string).collect();
    format!(
        "The Rollout \"{}\" is invalid: {}",
        rollout.name_any(),
        details.join("; ")
    )
}

/// The status of a Rollout whose spec has `findings`: the `InvalidSpec` condition (its times
/// kept while the message is unchanged), `observedGeneration`, and Argo's Degraded phase.
pub fn invalid_spec_status(
    rollout: &Rollout,
    findings: &[FieldError],
    now: Timestamp,
) -> RolloutStatus {
    let mut status = rollout.status.clone().unwrap_or_default();
    let message = invalid_spec_message(rollout, findings);
    let unchanged = status
        .conditions
        .iter()
        .any(|c| c.type_ == conditions::INVALID_SPEC && c.message == message);
    if !unchanged {
        status
            .conditions
            .retain(|c| c.type_ != conditions::INVALID_SPEC);
        status.conditions.push(RolloutCondition {
            type_: conditions::INVALID_SPEC.to_string(),
            status: conditions::STATUS_TRUE.to_string(),
            last_update_time: Time(now),
            last_transition_time: Time(now),
            reason: conditions::INVALID_SPEC_REASON.to_string(),
            message: message.clone(),
        });
    }
    status.observed_generation = observed_generation(rollout);
    status.phase = DEGRADED_PHASE.to_string();
    status.message = format!("{}: {message}", conditions::INVALID_SPEC);
    status
}

/// The status of a valid Rollout while no plan is applied: `observedGeneration` recorded, a
/// previous `InvalidSpec` condition (and the Degraded phase it caused) cleared, all else kept.
pub fn observed_status(rollout: &Rollout) -> RolloutStatus {
    let mut status = rollout.status.clone().unwrap_or_default();
    let was_invalid = status
        .conditions
        .iter()
        .any(|c| c.type_ == conditions::INVALID_SPEC);
    if was_invalid {
        status
            .conditions
            .retain(|c| c.type_ != conditions::INVALID_SPEC);
        if status.phase == DEGRADED_PHASE {
            status.phase.clear();
            status.message.clear();
        }
    }
    status.observed_generation = observed_generation(rollout);
    status
}

/// `metadata.generation` as the string of digits Argo writes.
pub fn observed_generation(rollout: &Rollout) -> String {
    rollout.metadata.generation.unwrap_or_default().to_string()
}

/// The merge patch (`{"status": ...}`) taking the Rollout's status to `desired`, or `None`
/// when they are equal. A Rollout with no status gets the whole of `desired`.
pub fn status_patch(
    rollout: &Rollout,
    desired: &RolloutStatus,
) -> Result<Option<Value>, serde_json::Error> {
    let desired = serde_json::to_value(desired)?;
    let change = match &rollout.status {
        None => Some(desired),
        Some(current) => merge_diff(&serde_json::to_value(current)?, &desired),
    };
    Ok(change.map(|status| serde_json::json!({ "status": status })))
}

/// The merge patch (`{"status": ...}`) from an object's status to `desired`, or `None` when
/// they are equal. An object with no status gets the whole of `desired`. For the kinds whose
/// status can be compared whole (AnalysisRun, Experiment).
pub fn patch_when_changed<S: Serialize + PartialEq>(
    current: Option<&S>,
    desired: &S,
) -> Result<Option<Value>, serde_json::Error> {
    let want = serde_json::to_value(desired)?;
    let change = match current {
        None => Some(want),
        Some(current) if current == desired => None,
        Some(current) => merge_diff(&serde_json::to_value(current)?, &want),
    };
    Ok(change.map(|status| serde_json::json!({ "status": status })))
}

/// RFC 7386 merge patch from `current` to `desired`: changed keys, removed keys as `null`,
/// arrays replaced whole. `None` when nothing differs.
pub fn merge_diff(current: &Value, desired: &Value) -> Option<Value> {
    match (current, desired) {
        (Value::Object(current), Value::Object(desired)) => {
            let mut patch = Map::new();
            for (key, want) in desired {
                match current.get(key) {
                    Some(have) => {
                        if let Some(change) = merge_diff(have, want) {
                            patch.insert(key.clone(), change);
                        }
                    }
                    None => {
                        patch.insert(key.clone(), want.clone());
                    }
                }
            }
            for key in current.keys().filter(|key| !desired.contains_key(*key)) {
                patch.insert(key.clone(), Value::Null);
            }
            (!patch.is_empty()).then_some(Value::Object(patch))
        }
        (current, desired) if current == desired => None,
        (_, desired) => Some(desired.clone()),
    }
}

#[cfg(test)]
mod tests {
    use rollouts_crds::rollout::CanaryStep;
    use serde_json::json;

    use super::*;

    fn rollout() -> Rollout {
        Rollout::test_canary("web", vec![CanaryStep::weight(20)]).with_generation(3)
    }

    fn finding() -> FieldError {
        FieldError::new(
            "spec.strategy.canary.steps[0].setWeight",
            "must be between 0 and 100",
            "set a weight from 0 to 100",
        )
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).expect("in range")
    }

    #[test]
    fn a_rollout_without_status_gets_generation_and_an_empty_condition_list() {
        let rollout = rollout();
        let patch = status_patch(&rollout, &observed_status(&rollout))
            .expect("encodes")
            .expect("a status must be written");
        assert_eq!(patch["status"]["observedGeneration"], json!("3"));
        assert_eq!(patch["status"]["conditions"], json!([]));
    }

    #[test]
    fn nothing_is_written_when_the_status_is_already_current() {
        let mut rollout = rollout();
        rollout.status = Some(observed_status(&rollout));
        assert_eq!(
            status_patch(&rollout, &observed_status(&rollout)).expect("encodes"),
            None
        );
    }

    #[test]
    fn a_new_generation_patches_only_observed_generation() {
        let mut rollout = rollout();
        rollout.status = Some(RolloutStatus {
            observed_generation: "2".into(),
            current_pod_hash: "abc".into(),
            ..RolloutStatus::default()
        });
        let patch = status_patch(&rollout, &observed_status(&rollout)).expect("encodes");
        assert_eq!(
            patch,
            Some(json!({ "status": { "observedGeneration": "3" } }))
        );
    }

    #[test]
    fn invalid_spec_condition_names_the_field_and_degrades_the_rollout() {
        let rollout = rollout();
        let status = invalid_spec_status(&rollout, &[finding()], at(100));
        let condition = status
            .conditions
            .iter()
            .find(|c| c.type_ == conditions::INVALID_SPEC)
            .expect("InvalidSpec condition");
        assert_eq!(condition.status, "True");
        assert_eq!(condition.reason, "InvalidSpec");
        assert_eq!(
            condition.message,
            "The Rollout \"web\" is invalid: spec.strategy.canary.steps[0].setWeight: must be between 0 and 100 (fix: set a weight from 0 to 100)"
        );
        assert_eq!(status.phase, "Degraded");
        assert_eq!(
            status.message,
            format!("InvalidSpec: {}", condition.message)
        );
        assert_eq!(status.observed_generation, "3");
    }

    #[test]
    fn the_same_finding_again_writes_nothing_even_later() {
        let mut rollout = rollout();
        rollout.status = Some(invalid_spec_status(&rollout, &[finding()], at(100)));
        let again = invalid_spec_status(&rollout, &[finding()], at(500));
        assert_eq!(status_patch(&rollout, &again).expect("encodes"), None);
    }

    #[test]
    fn a_different_finding_replaces_the_condition() {
        let mut rollout = rollout();
        rollout.status = Some(invalid_spec_status(&rollout, &[finding()], at(100)));
        let other = FieldError::new("spec.selector", "is missing", "set spec.selector");
        let status = invalid_spec_status(&rollout, &[other], at(200));
        let invalid: Vec<_> = status
            .conditions
            .iter()
            .filter(|c| c.type_ == conditions::INVALID_SPEC)
            .collect();
        assert_eq!(invalid.len(), 1);
        assert!(invalid[0].message.contains("spec.selector: is missing"));
        assert_eq!(invalid[0].last_transition_time, Time(at(200)));
        let patch = status_patch(&rollout, &status)
            .expect("encodes")
            .expect("changed");
        assert!(
            patch["status"]["conditions"].is_array(),
            "conditions are replaced whole"
        );
    }

    #[test]
    fn fixing_the_spec_clears_the_condition_and_the_degraded_phase() {
        let mut rollout = rollout();
        rollout.status = Some(invalid_spec_status(&rollout, &[finding()], at(100)));
        let status = observed_status(&rollout);
        assert!(status.conditions.is_empty());
        assert!(status.phase.is_empty());
        let patch = status_patch(&rollout, &status)
            .expect("encodes")
            .expect("changed");
        assert_eq!(patch["status"]["conditions"], json!([]));
        assert_eq!(patch["status"]["phase"], Value::Null);
        assert_eq!(patch["status"]["message"], Value::Null);
    }

    #[test]
    fn merge_diff_nulls_removed_keys_and_recurses_into_objects() {
        let current = json!({ "a": 1, "b": { "c": 2, "d": 3 }, "e": [1, 2] });
        let desired = json!({ "a": 1, "b": { "c": 2, "d": 4 }, "e": [1] });
        assert_eq!(
            merge_diff(&current, &desired),
            Some(json!({ "b": { "d": 4 }, "e": [1] }))
        );
        assert_eq!(
            merge_diff(&json!({ "a": 1 }), &json!({})),
            Some(json!({ "a": null }))
        );
        assert_eq!(merge_diff(&current, &current), None);
    }
}
