//! The kubelet: starts pods and makes them Ready after a delay, or never, or crash-looping,
//! as their annotations ask; or, with [`PodReadiness`], after a random delay of their own, a
//! share of them failing their first start.

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

/// Readiness drawn per pod, as on a real cluster: each pod takes its own time between `min`
/// and `max`, and a `fail_share` of them fail their first start (Running, not Ready, one
/// restart) and become Ready after a second draw. Draws hash the seed with the pod's namespace
/// and name, so a seed replays the same delays. A template's ready-after, never-ready or
/// crash-loop annotation still wins.
#[derive(Debug, Clone, PartialEq)]
pub struct PodReadiness {
    pub seed: u64,
    pub min: Duration,
    pub max: Duration,
    /// Share of pods (0..1) whose first start fails.
    pub fail_share: f64,
}

impl PodReadiness {
    /// Why these settings cannot be used, naming the setting to correct.
    pub fn validate(&self) -> Result<(), String> {
        if self.min > self.max {
            return Err(format!(
                "pod readiness: the shortest delay ({:?}) is longer than the longest ({:?}): swap them",
                self.min, self.max
            ));
        }
        if !(0.0..=1.0).contains(&self.fail_share) {
            return Err(format!(
                "pod readiness: the failing share {} must be between 0 and 1",
                self.fail_share
            ));
        }
        Ok(())
    }

    /// A number in [0, 1) drawn for this pod and purpose.
    fn draw(&self, ns: &str, name: &str, purpose: u64) -> f64 {
        // FNV-1a over the pod's key, then SplitMix64's finaliser mixes in the seed.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in ns.bytes().chain([b'/']).chain(name.bytes()) {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
        let mut z = hash
            ^ self
                .seed
                .wrapping_add(purpose.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    fn delay(&self, ns: &str, name: &str, attempt: u64) -> Duration {
        self.min + (self.max - self.min).mul_f64(self.draw(ns, name, 2 * attempt))
    }

    fn fails_first_start(&self, ns: &str, name: &str) -> bool {
        self.draw(ns, name, 1) < self.fail_share
    }
}

pub struct Kubelet {
    default_ready_after: Duration,
    readiness: Option<PodReadiness>,
    /// Pods whose start is already scheduled, by uid.
    starting: HashSet<String>,
    /// Pods whose first start failed and whose restart is scheduled, by uid.
    restarting: HashSet<String>,
    next_ip: u32,
}

impl Kubelet {
    pub fn new(default_ready_after: Duration, readiness: Option<PodReadiness>) -> Self {
        Self {
            default_ready_after,
            readiness,
            starting: HashSet::new(),
            restarting: HashSet::new(),
            next_ip: 0,
        }
    }

    pub fn forget(&mut self, uid: &str) {
        self.starting.remove(uid);
        self.restarting.remove(uid);
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
            .or_else(|| self.readiness.as_ref().map(|r| r.delay(ns, name, 0)))
            .unwrap_or(self.default_ready_after);
        scheduler.after(delay, Work::PodStarted(ns.into(), name.into(), uid));
    }

    /// Writes the running status of a pod whose start-up delay has passed.
    pub fn pod_started(
        &mut self,
        state: &mut State,
        ns: &str,
        name: &str,
        uid: &str,
        scheduler: &Scheduler,
    ) {
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
        // A drawn first-start failure: not Ready this time, Ready after the restart's delay.
        let failed_start = match &self.readiness {
            Some(readiness)
                if annotation(&pod, READY_AFTER_ANNOTATION).is_none()
                    && !self.restarting.contains(uid)
                    && readiness.fails_first_start(ns, name) =>
            {
                self.restarting.insert(uid.to_string());
                scheduler.after(
                    readiness.delay(ns, name, 1),
                    Work::PodStarted(ns.into(), name.into(), uid.into()),
                );
                true
            }
            _ => false,
        };
        let restarts = u32::from(crash_loop) + u32::from(self.restarting.contains(uid));
        let ready = !crash_loop
            && !failed_start
            && annotation(&pod, NEVER_READY_ANNOTATION) != Some("true");
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
                    "started": !crash_loop, "restartCount": restarts, "state": state,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn readiness(fail_share: f64) -> PodReadiness {
        PodReadiness {
            seed: 7,
            min: Duration::from_secs(2),
            max: Duration::from_secs(10),
            fail_share,
        }
    }

    #[test]
    fn delays_stay_in_range_differ_per_pod_and_replay_from_the_seed() {
        let r = readiness(0.0);
        let delays: Vec<Duration> = (0..200)
            .map(|i| r.delay("shop", &format!("web-abc-{i}"), 0))
            .collect();
        assert!(
            delays
                .iter()
                .all(|d| (Duration::from_secs(2)..=Duration::from_secs(10)).contains(d))
        );
        let distinct: HashSet<Duration> = delays.iter().copied().collect();
        assert!(distinct.len() > 190, "{} distinct delays", distinct.len());
        let again: Vec<Duration> = (0..200)
            .map(|i| readiness(0.0).delay("shop", &format!("web-abc-{i}"), 0))
            .collect();
        assert_eq!(delays, again);
        let other_seed = PodReadiness { seed: 8, ..r };
        assert_ne!(
            delays[0..10],
            (0..10)
                .map(|i| other_seed.delay("shop", &format!("web-abc-{i}"), 0))
                .collect::<Vec<_>>()[..]
        );
    }

    #[test]
    fn about_the_failing_share_of_pods_fails_its_first_start() {
        let r = readiness(0.1);
        let failing = (0..10_000)
            .filter(|i| r.fails_first_start("shop", &format!("pod-{i}")))
            .count();
        assert!((800..1200).contains(&failing), "{failing} of 10000 failed");
        assert!((0..1000).all(|i| !readiness(0.0).fails_first_start("shop", &format!("pod-{i}"))));
    }

    #[test]
    fn settings_that_cannot_work_are_refused_naming_the_fix() {
        let swapped = PodReadiness {
            min: Duration::from_secs(10),
            max: Duration::from_secs(2),
            ..readiness(0.0)
        };
        assert!(swapped.validate().unwrap_err().contains("swap"));
        assert!(
            readiness(1.5)
                .validate()
                .unwrap_err()
                .contains("between 0 and 1")
        );
        assert_eq!(readiness(0.2).validate(), Ok(()));
    }
}
