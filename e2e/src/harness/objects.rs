//! What a scenario reads back, as kubectl prints it: a Rollout's status, its ReplicaSets, its
//! AnalysisRuns and the events about it, each a thin view over the JSON.

use serde_json::Value;

/// A Rollout as read from the cluster.
#[derive(Debug, Clone)]
pub struct RolloutView(pub Value);

impl RolloutView {
    fn status_str(&self, field: &str) -> &str {
        self.0["status"][field].as_str().unwrap_or_default()
    }

    /// `status.phase`: Healthy, Progressing, Paused, Degraded.
    pub fn phase(&self) -> &str {
        self.status_str("phase")
    }

    pub fn message(&self) -> &str {
        self.status_str("message")
    }

    pub fn stable_hash(&self) -> &str {
        self.status_str("stableRS")
    }

    pub fn current_hash(&self) -> &str {
        self.status_str("currentPodHash")
    }

    pub fn current_step_index(&self) -> Option<u64> {
        self.0["status"]["currentStepIndex"].as_u64()
    }

    pub fn step_count(&self) -> usize {
        self.0["spec"]["strategy"]["canary"]["steps"]
            .as_array()
            .map_or(0, Vec::len)
    }

    pub fn aborted(&self) -> bool {
        self.0["status"]["abort"].as_bool().unwrap_or(false)
    }

    /// Reasons of `status.pauseConditions` (`CanaryPauseStep`, `InconclusiveAnalysisRun`...).
    pub fn pause_reasons(&self) -> Vec<String> {
        self.0["status"]["pauseConditions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["reason"].as_str().map(String::from))
            .collect()
    }

    /// The reason and message of a condition of `status.conditions`.
    pub fn condition(&self, type_: &str) -> Option<(String, String)> {
        self.0["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == type_)
            .map(|c| {
                (
                    c["reason"].as_str().unwrap_or_default().to_string(),
                    c["message"].as_str().unwrap_or_default().to_string(),
                )
            })
    }

    /// Healthy on its current revision with every replica updated and available.
    pub fn is_healthy(&self) -> bool {
        let status = &self.0["status"];
        let replicas = self.0["spec"]["replicas"].as_i64().unwrap_or(1);
        let count = |field: &str| status[field].as_i64().unwrap_or(0);
        self.phase() == "Healthy"
            && !self.current_hash().is_empty()
            && self.stable_hash() == self.current_hash()
            && count("updatedReplicas") >= replicas
            && count("availableReplicas") >= replicas
            && count("replicas") == replicas
    }

    /// The status as indented JSON, for failure messages.
    pub fn status_text(&self) -> String {
        serde_json::to_string_pretty(&self.0["status"]).unwrap_or_default()
    }
}

/// A ReplicaSet of the Rollout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaSetView {
    pub name: String,
    /// Its `rollouts-pod-template-hash` label.
    pub hash: String,
    /// `spec.replicas`.
    pub replicas: i64,
    /// `status.availableReplicas`.
    pub available: i64,
}

impl ReplicaSetView {
    pub fn from_json(rs: &Value) -> ReplicaSetView {
        ReplicaSetView {
            name: rs["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            hash: rs["metadata"]["labels"]["rollouts-pod-template-hash"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            replicas: rs["spec"]["replicas"].as_i64().unwrap_or(1),
            available: rs["status"]["availableReplicas"].as_i64().unwrap_or(0),
        }
    }
}

/// An AnalysisRun of the Rollout.
#[derive(Debug, Clone)]
pub struct AnalysisRunView(pub Value);

impl AnalysisRunView {
    pub fn name(&self) -> &str {
        self.0["metadata"]["name"].as_str().unwrap_or_default()
    }

    /// `status.phase`: Pending, Running, Successful, Failed, Error, Inconclusive.
    pub fn phase(&self) -> &str {
        self.0["status"]["phase"].as_str().unwrap_or_default()
    }

    /// Its `rollouts-pod-template-hash` label: the revision it analysed.
    pub fn hash(&self) -> &str {
        self.0["metadata"]["labels"]["rollouts-pod-template-hash"]
            .as_str()
            .unwrap_or_default()
    }

    /// The result of one metric.
    pub fn metric(&self, name: &str) -> Option<&Value> {
        self.0["status"]["metricResults"]
            .as_array()?
            .iter()
            .find(|m| m["name"] == name)
    }

    /// Phases of a metric's measurements, oldest first.
    pub fn measurement_phases(&self, metric: &str) -> Vec<String> {
        self.metric(metric)
            .and_then(|m| m["measurements"].as_array())
            .into_iter()
            .flatten()
            .map(|m| m["phase"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// A counter of a metric's result (`count`, `successful`, `failed`, `inconclusive`, `error`).
    pub fn metric_count(&self, metric: &str, counter: &str) -> i64 {
        self.metric(metric)
            .and_then(|m| m[counter].as_i64())
            .unwrap_or(0)
    }
}

/// An event about the Rollout (events.k8s.io/v1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventView {
    pub reason: String,
    pub note: String,
    /// 1, or `series.count` when the recorder folded repeats into one event.
    pub count: i64,
    pub time: String,
}

impl EventView {
    pub fn from_json(event: &Value) -> EventView {
        let time = [
            "eventTime",
            "deprecatedLastTimestamp",
            "deprecatedFirstTimestamp",
        ]
        .iter()
        .find_map(|f| event[*f].as_str())
        .or_else(|| event["metadata"]["creationTimestamp"].as_str())
        .unwrap_or_default();
        EventView {
            reason: event["reason"].as_str().unwrap_or_default().to_string(),
            note: event["note"].as_str().unwrap_or_default().to_string(),
            count: event["series"]["count"].as_i64().unwrap_or(1).max(1),
            time: event["series"]["lastObservedTime"]
                .as_str()
                .unwrap_or(time)
                .to_string(),
        }
    }
}

/// Items of a list whose controller ownerReference is the named Rollout.
pub fn owned_by<'a>(list: &'a Value, rollout: &str) -> impl Iterator<Item = &'a Value> {
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(move |item| {
            item["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|o| o["kind"] == "Rollout" && o["name"] == rollout)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_rollout_is_healthy_only_with_every_replica_on_the_stable_revision() {
        let mut rollout = json!({
            "spec": {"replicas": 3, "strategy": {"canary": {"steps": [{"setWeight": 20}, {"pause": {}}]}}},
            "status": {"phase": "Healthy", "stableRS": "abc", "currentPodHash": "abc",
                       "updatedReplicas": 3, "availableReplicas": 3, "replicas": 3,
                       "currentStepIndex": 2,
                       "conditions": [{"type": "Progressing", "reason": "RolloutAborted", "message": "Rollout aborted update to revision 2"}]},
        });
        assert!(RolloutView(rollout.clone()).is_healthy());
        let view = RolloutView(rollout.clone());
        assert_eq!(view.step_count(), 2);
        assert_eq!(view.current_step_index(), Some(2));
        assert_eq!(
            view.condition("Progressing"),
            Some((
                "RolloutAborted".into(),
                "Rollout aborted update to revision 2".into()
            ))
        );
        rollout["status"]["currentPodHash"] = json!("def");
        assert!(!RolloutView(rollout).is_healthy());
    }

    #[test]
    fn only_the_rollouts_own_objects_are_kept() {
        let list = json!({"items": [
            {"metadata": {"name": "web-abc", "labels": {"rollouts-pod-template-hash": "abc"},
                          "ownerReferences": [{"kind": "Rollout", "name": "web"}]},
             "spec": {"replicas": 2}, "status": {"availableReplicas": 1}},
            {"metadata": {"name": "other-def", "ownerReferences": [{"kind": "Rollout", "name": "other"}]}},
        ]});
        let owned: Vec<ReplicaSetView> = owned_by(&list, "web")
            .map(ReplicaSetView::from_json)
            .collect();
        assert_eq!(
            owned,
            vec![ReplicaSetView {
                name: "web-abc".into(),
                hash: "abc".into(),
                replicas: 2,
                available: 1
            }]
        );
    }

    #[test]
    fn folded_events_count_their_series() {
        let event = EventView::from_json(&json!({
            "reason": "RolloutStepCompleted", "note": "Rollout step 1/2 completed (setWeight: 20)",
            "eventTime": "2026-01-01T00:00:00.000000Z", "series": {"count": 3, "lastObservedTime": "2026-01-01T00:00:09.000000Z"},
        }));
        assert_eq!(event.count, 3);
        assert_eq!(event.time, "2026-01-01T00:00:09.000000Z");
    }
}
