//! The ReplicaSet controller: creates and deletes pods to match `spec.replicas` and keeps the
//! ReplicaSet's status counts true.

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use super::kubelet::ready_since;
use super::{Scheduler, Work, apps};
use crate::sim::meta::{controller_uid, meta_str};
use crate::sim::store::{DeleteOptions, State, Target};

fn is_deleting(obj: &Value) -> bool {
    obj["metadata"]
        .get("deletionTimestamp")
        .is_some_and(|t| !t.is_null())
}

pub fn reconcile(state: &mut State, ns: &str, name: &str, scheduler: &Scheduler) {
    let Some(rs) = state.get(&apps("replicasets"), ns, name).cloned() else {
        return;
    };
    let (Some(rs_info), Some(pod_info)) = (
        state.registry.get("apps", "v1", "replicasets"),
        state.registry.get("", "v1", "pods"),
    ) else {
        return;
    };
    let uid = meta_str(&rs, "uid").to_string();
    let owned = |state: &State| -> Vec<Value> {
        state
            .dependents_of(&uid)
            .into_iter()
            .filter(|(key, pod)| {
                key.plural == "pods"
                    && controller_uid(pod) == Some(uid.as_str())
                    && !is_deleting(pod)
            })
            .map(|(_, pod)| (*pod).clone())
            .collect()
    };
    let mut pods = owned(state);
    let desired = rs["spec"]["replicas"].as_u64().unwrap_or(1) as usize;
    if !is_deleting(&rs) {
        if pods.len() < desired {
            let template = &rs["spec"]["template"];
            for _ in pods.len()..desired {
                let pod = json!({
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "generateName": format!("{name}-"),
                        "namespace": ns,
                        "labels": template["metadata"]["labels"],
                        "annotations": template["metadata"]["annotations"],
                        "ownerReferences": [{
                            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name, "uid": uid,
                            "controller": true, "blockOwnerDeletion": true,
                        }],
                    },
                    "spec": template["spec"],
                });
                // A template the API server refuses (bad labels) leaves the ReplicaSet short, as in a cluster.
                let _ = state.create(&pod_info, ns, strip_nulls(pod));
            }
        } else if pods.len() > desired {
            // Not-ready pods go first, then the newest, as the ReplicaSet controller prefers.
            pods.sort_by_key(|p| {
                (
                    ready_since(p).is_some(),
                    std::cmp::Reverse(
                        p["metadata"]["creationTimestamp"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                    ),
                )
            });
            for pod in &pods[..pods.len() - desired] {
                let _ = state.delete(
                    &pod_info,
                    ns,
                    meta_str(pod, "name"),
                    &DeleteOptions::default(),
                );
            }
        }
        pods = owned(state);
    }
    let template_labels = rs["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let min_ready = Duration::from_secs(rs["spec"]["minReadySeconds"].as_u64().unwrap_or(0));
    let now = SystemTime::now();
    let (mut ready, mut available, mut fully_labeled) = (0, 0, 0);
    let mut next_available: Option<Duration> = None;
    for pod in &pods {
        let labels = pod["metadata"]["labels"].as_object();
        if template_labels
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
        {
            fully_labeled += 1;
        }
        if let Some(since) = ready_since(pod) {
            ready += 1;
            let ready_for = now.duration_since(since).unwrap_or_default();
            if ready_for >= min_ready {
                available += 1;
            } else {
                let wait = min_ready - ready_for;
                next_available = Some(next_available.map_or(wait, |w| w.min(wait)));
            }
        }
    }
    if let Some(wait) = next_available {
        // Round up so the recheck lands after the second boundary the timestamps use.
        scheduler.after(
            wait + Duration::from_millis(50),
            Work::ReplicaSet(ns.into(), name.into()),
        );
    }
    let mut next = (*rs).clone();
    next["status"] = json!({
        "replicas": pods.len(),
        "fullyLabeledReplicas": fully_labeled,
        "readyReplicas": ready,
        "availableReplicas": available,
        "observedGeneration": rs["metadata"]["generation"],
    });
    // The ReplicaSet was read under this same lock, so the status write cannot miss it.
    let _ = state.update(&rs_info, ns, name, next, Target::Status);
}

/// Drops null fields (an absent template annotation map) so stored pods stay clean.
fn strip_nulls(mut v: Value) -> Value {
    if let Some(meta) = v["metadata"].as_object_mut() {
        meta.retain(|_, x| !x.is_null());
    }
    v
}
