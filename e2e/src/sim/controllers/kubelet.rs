//! The kubelet: starts pods and makes them Ready after a delay, or never, or crash-looping,
//! as their annotations ask.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use super::{Scheduler, Work, pods};
use crate::sim::meta::{meta_str, parse_duration, rfc3339};
use crate::sim::store::{State, Target};

/// Pod (template) annotation: how long the pod takes to become Ready, e.g. `3s`.
pub const READY_AFTER_ANNOTATION: &str = "sim.rollouts.dev/ready-after";
/// Pod (template) annotation `"true"`: the pod runs but never becomes Ready.
pub const NEVER_READY_ANNOTATION: &str = "sim.rollouts.dev/never-ready";
/// Pod (template) annotation `"true"`: the pod's container crash-loops.
pub const CRASH_LOOP_ANNOTATION: &str = "sim.rollouts.dev/crash-loop";

pub struct Kubelet {
    default_ready_after: Duration,
    /// Pods whose start is already scheduled, by uid.
    starting: HashSet<String>,
    next_ip: u32,
}

impl Kubelet {
    pub fn new(default_ready_after: Duration) -> Self {
        Self {
            default_ready_after,
            starting: HashSet::new(),
            next_ip: 0,
        }
    }

    pub fn forget(&mut self, uid: &str) {
        self.starting.remove(uid);
    }

    /// Schedules the start of a pending pod.
    pub fn pod_created(&mut self, state: &State, ns: &str, name: &str, scheduler: &Scheduler) {
        let Some(pod) = state.get(&pods(), ns, name) else {
            return;
        };
        let uid = meta_str(pod, "uid").to_string();
        let pending = pod["status"]["phase"]
            .as_str()
            .is_none_or(|p| p == "Pending");
        if !pending || !self.starting.insert(uid.clone()) {
            return;
        }
        let delay = annotation(pod, READY_AFTER_ANNOTATION)
            .and_then(parse_duration)
            .unwrap_or(self.default_ready_after);
        scheduler.after(delay, Work::PodStarted(ns.into(), name.into(), uid));
    }

    /// Writes the running status of a pod whose start-up delay has passed.
    pub fn pod_started(&mut self, state: &mut State, ns: &str, name: &str, uid: &str) {
        let Some(pod) = state.get(&pods(), ns, name).cloned() else {
            return;
        };
        if meta_str(&pod, "uid") != uid
            || pod["metadata"]
                .get("deletionTimestamp")
                .is_some_and(|t| !t.is_null())
        {
            return;
        }
        let Some(info) = state.registry.get("", "v1", "pods") else {
            return;
        };
        self.next_ip += 1;
        let now = rfc3339(SystemTime::now());
        let crash_loop = annotation(&pod, CRASH_LOOP_ANNOTATION) == Some("true");
        let ready = !crash_loop && annotation(&pod, NEVER_READY_ANNOTATION) != Some("true");
        let containers: Vec<Value> = pod["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let state = if crash_loop {
                    json!({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting failed container (simulated)"}})
                } else {
                    json!({"running": {"startedAt": now}})
                };
                json!({
                    "name": c["name"], "image": c["image"], "imageID": "", "ready": ready,
                    "started": !crash_loop, "restartCount": u32::from(crash_loop), "state": state,
                })
            })
            .collect();
        let condition = |t: &str, ok: bool| json!({"type": t, "status": if ok { "True" } else { "False" }, "lastProbeTime": null, "lastTransitionTime": now});
        let mut next = (*pod).clone();
        next["status"] = json!({
            "phase": "Running",
            "conditions": [
                condition("PodScheduled", true),
                condition("Initialized", true),
                condition("ContainersReady", ready),
                condition("Ready", ready),
            ],
            "hostIP": "10.0.0.1",
            "podIP": format!("10.244.{}.{}", (self.next_ip / 250) % 250, self.next_ip % 250 + 1),
            "startTime": pod["metadata"]["creationTimestamp"],
            "containerStatuses": containers,
            "qosClass": "BestEffort",
        });
        // The pod was read under this same lock, so the status write cannot miss it.
        let _ = state.update(&info, ns, name, next, Target::Status);
    }
}

fn annotation<'a>(pod: &'a Value, key: &str) -> Option<&'a str> {
    pod["metadata"]["annotations"][key].as_str()
}

/// When the pod became Ready, if it is.
pub fn ready_since(pod: &Value) -> Option<SystemTime> {
    pod["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready" && c["status"] == "True")
        .and_then(|c| crate::sim::meta::parse_rfc3339(c["lastTransitionTime"].as_str()?))
}
