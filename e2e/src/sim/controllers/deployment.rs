//! The Deployment controller, enough for `workloadRef`: owns one ReplicaSet per pod template
//! (named by the template hash), scales the new one up and the old ones down as the new
//! one becomes available, and writes the Deployment's status and conditions.

use std::time::SystemTime;

use serde_json::{Map, Value, json};

use super::apps;
use crate::sim::meta::{controller_uid, meta_str, rfc3339, safe_hash};
use crate::sim::store::{State, Target};

const HASH_LABEL: &str = "pod-template-hash";
const REVISION: &str = "deployment.kubernetes.io/revision";

fn count(rs: &Value, field: &str) -> i64 {
    rs["status"][field].as_i64().unwrap_or(0)
}

pub fn reconcile(state: &mut State, ns: &str, name: &str) {
    let Some(deployment) = state.get(&apps("deployments"), ns, name).cloned() else {
        return;
    };
    let (Some(d_info), Some(rs_info)) = (
        state.registry.get("apps", "v1", "deployments"),
        state.registry.get("apps", "v1", "replicasets"),
    ) else {
        return;
    };
    if deployment["metadata"]
        .get("deletionTimestamp")
        .is_some_and(|t| !t.is_null())
    {
        return;
    }
    let uid = meta_str(&deployment, "uid").to_string();
    let owned = |state: &State| -> Vec<Value> {
        state
            .dependents_of(&uid)
            .into_iter()
            .filter(|(key, rs)| {
                key.plural == "replicasets" && controller_uid(rs) == Some(uid.as_str())
            })
            .map(|(_, rs)| (*rs).clone())
            .collect()
    };
    let spec = &deployment["spec"];
    let desired = spec["replicas"].as_i64().unwrap_or(1);
    let template = &spec["template"];
    let hash = safe_hash(
        serde_json::to_string(template)
            .unwrap_or_default()
            .as_bytes(),
    );
    let mut replica_sets = owned(state);
    let is_new = |rs: &Value| rs["metadata"]["labels"][HASH_LABEL].as_str() == Some(hash.as_str());
    if !replica_sets.iter().any(is_new) {
        let revision = replica_sets
            .iter()
            .filter_map(|rs| {
                rs["metadata"]["annotations"][REVISION]
                    .as_str()?
                    .parse::<i64>()
                    .ok()
            })
            .max()
            .unwrap_or(0)
            + 1;
        let mut labels = template["metadata"]["labels"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        labels.insert(HASH_LABEL.into(), hash.clone().into());
        let mut rs_template = template.clone();
        rs_template["metadata"]["labels"] = Value::Object(labels.clone());
        let mut selector = spec["selector"].clone();
        if !selector.is_object() {
            selector = json!({});
        }
        let mut match_labels = selector["matchLabels"]
            .as_object()
            .cloned()
            .unwrap_or_else(Map::new);
        match_labels.insert(HASH_LABEL.into(), hash.clone().into());
        selector["matchLabels"] = Value::Object(match_labels);
        let rs = json!({
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": format!("{name}-{hash}"),
                "namespace": ns,
                "labels": labels,
                "annotations": {REVISION: revision.to_string()},
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "Deployment", "name": name, "uid": uid,
                    "controller": true, "blockOwnerDeletion": true,
                }],
            },
            "spec": {
                "replicas": 0,
                "minReadySeconds": spec["minReadySeconds"].as_i64().unwrap_or(0),
                "selector": selector,
                "template": rs_template,
            },
        });
        // A name taken by a ReplicaSet this Deployment does not own leaves it without one, as in a cluster.
        let _ = state.create(&rs_info, ns, rs);
        replica_sets = owned(state);
    }
    let paused = spec["paused"].as_bool() == Some(true);
    let recreate = spec["strategy"]["type"].as_str() == Some("Recreate");
    let (new_rs, mut old_rs): (Vec<Value>, Vec<Value>) = replica_sets.into_iter().partition(is_new);
    old_rs.sort_by_key(|rs| {
        std::cmp::Reverse(
            rs["metadata"]["annotations"][REVISION]
                .as_str()
                .and_then(|r| r.parse::<i64>().ok())
                .unwrap_or(0),
        )
    });
    let new_available = new_rs
        .first()
        .map_or(0, |rs| count(rs, "availableReplicas"));
    if !paused {
        let old_running: i64 = old_rs.iter().map(|rs| count(rs, "replicas")).sum();
        let new_target = if recreate && old_running > 0 {
            0
        } else {
            desired
        };
        // Old pods stay until the new ones can take over: the rollout never drops below desired.
        let mut old_allowance = if recreate {
            0
        } else {
            (desired - new_available).max(0)
        };
        let scale = |state: &mut State, rs: &Value, replicas: i64| {
            if rs["spec"]["replicas"].as_i64() != Some(replicas) {
                let mut next = rs.clone();
                next["spec"]["replicas"] = replicas.into();
                let _ = state.update(&rs_info, ns, meta_str(rs, "name"), next, Target::Main);
            }
        };
        if let Some(rs) = new_rs.first() {
            scale(state, rs, new_target);
        }
        for rs in &old_rs {
            let keep = count(rs, "replicas")
                .min(rs["spec"]["replicas"].as_i64().unwrap_or(0))
                .min(old_allowance);
            old_allowance -= keep;
            scale(state, rs, keep);
        }
    }
    let all: Vec<Value> = owned(state);
    let sum = |field: &str| all.iter().map(|rs| count(rs, field)).sum::<i64>();
    let updated = all
        .iter()
        .find(|rs| is_new(rs))
        .map_or(0, |rs| count(rs, "replicas"));
    let available = sum("availableReplicas");
    let old_replicas: i64 = all
        .iter()
        .filter(|rs| !is_new(rs))
        .map(|rs| count(rs, "replicas"))
        .sum();
    let complete = updated == desired && old_replicas == 0 && new_available >= desired;
    let previous = deployment["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let now = rfc3339(SystemTime::now());
    let condition = |kind: &str, ok: bool, reason: &str, message: String| {
        let status = if ok { "True" } else { "False" };
        let same = previous
            .iter()
            .find(|c| c["type"] == kind && c["status"] == status && c["reason"] == reason);
        let since = same.map_or_else(
            || Value::from(now.clone()),
            |c| c["lastTransitionTime"].clone(),
        );
        json!({"type": kind, "status": status, "lastUpdateTime": since, "lastTransitionTime": since, "reason": reason, "message": message})
    };
    let rs_name = format!("{name}-{hash}");
    let conditions = vec![
        if available >= desired {
            condition(
                "Available",
                true,
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.".into(),
            )
        } else {
            condition(
                "Available",
                false,
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.".into(),
            )
        },
        if complete {
            condition(
                "Progressing",
                true,
                "NewReplicaSetAvailable",
                format!("ReplicaSet \"{rs_name}\" has successfully progressed."),
            )
        } else {
            condition(
                "Progressing",
                true,
                "ReplicaSetUpdated",
                format!("ReplicaSet \"{rs_name}\" is progressing."),
            )
        },
    ];
    let mut next = (*deployment).clone();
    next["status"] = json!({
        "observedGeneration": deployment["metadata"]["generation"],
        "replicas": sum("replicas"),
        "updatedReplicas": updated,
        "readyReplicas": sum("readyReplicas"),
        "availableReplicas": available,
        "unavailableReplicas": (desired - available).max(0),
        "conditions": conditions,
    });
    // The Deployment was read under this same lock, so the status write cannot miss it.
    let _ = state.update(&d_info, ns, name, next, Target::Status);
}
