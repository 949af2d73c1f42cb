//! The Job controller, enough for analysis Job metrics: a Job starts at once and finishes
//! after a run time, succeeding unless its pod template says it fails.

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use super::{Scheduler, Work};
use crate::sim::meta::{meta_str, parse_duration, rfc3339};
use crate::sim::registry::ResourceKey;
use crate::sim::store::{State, Target};

/// Pod template annotation: how long the Job runs, e.g. `2s` (default: the pod start-up delay).
pub const RUN_FOR_ANNOTATION: &str = "sim.rollouts.dev/run-for";
/// Pod template annotation `"true"`: the Job fails instead of completing.
pub const FAILS_ANNOTATION: &str = "sim.rollouts.dev/job-fails";

pub fn jobs() -> ResourceKey {
    ResourceKey {
        group: "batch".into(),
        plural: "jobs".into(),
    }
}

fn template_annotation<'a>(job: &'a Value, key: &str) -> Option<&'a str> {
    job["spec"]["template"]["metadata"]["annotations"][key].as_str()
}

fn finished(job: &Value) -> bool {
    job["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| (c["type"] == "Complete" || c["type"] == "Failed") && c["status"] == "True")
    })
}

/// Starts a new Job: records its start and schedules its end.
pub fn reconcile(
    state: &mut State,
    ns: &str,
    name: &str,
    default_run: Duration,
    scheduler: &Scheduler,
) {
    let Some(job) = state.get(&jobs(), ns, name).cloned() else {
        return;
    };
    let Some(info) = state.registry.get("batch", "v1", "jobs") else {
        return;
    };
    if finished(&job) || job["status"].get("startTime").is_some() {
        return;
    }
    let mut next = (*job).clone();
    next["status"] = json!({"startTime": rfc3339(SystemTime::now()), "active": 1});
    // The Job was read under this same lock, so the status write cannot miss it.
    let _ = state.update(&info, ns, name, next, Target::Status);
    let run_for = template_annotation(&job, RUN_FOR_ANNOTATION)
        .and_then(parse_duration)
        .unwrap_or(default_run);
    scheduler.after(
        run_for,
        Work::JobFinished(ns.into(), name.into(), meta_str(&job, "uid").into()),
    );
}

/// Ends a Job whose run time has passed, as Complete or Failed.
pub fn finish(state: &mut State, ns: &str, name: &str, uid: &str) {
    let Some(job) = state.get(&jobs(), ns, name).cloned() else {
        return;
    };
    let Some(info) = state.registry.get("batch", "v1", "jobs") else {
        return;
    };
    if meta_str(&job, "uid") != uid || finished(&job) {
        return;
    }
    let now = rfc3339(SystemTime::now());
    let fails = template_annotation(&job, FAILS_ANNOTATION) == Some("true");
    let (kind, reason, counts) = if fails {
        ("Failed", "BackoffLimitExceeded", json!({"failed": 1}))
    } else {
        ("Complete", "", json!({"succeeded": 1}))
    };
    let mut status = job["status"].clone();
    if let Some(s) = status.as_object_mut() {
        s.remove("active");
        s.extend(counts.as_object().cloned().unwrap_or_default());
        if !fails {
            s.insert("completionTime".into(), now.clone().into());
        }
        s.insert(
            "conditions".into(),
            json!([{"type": kind, "status": "True", "reason": reason, "lastProbeTime": now, "lastTransitionTime": now}]),
        );
    }
    let mut next = (*job).clone();
    next["status"] = status;
    // The Job was read under this same lock, so the status write cannot miss it.
    let _ = state.update(&info, ns, name, next, Target::Status);
}
