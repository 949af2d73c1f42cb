//! `get rollout`'s picture: the Rollout's summary, then a tree of revisions, their ReplicaSets,
//! pods, Experiments and AnalysisRuns; and `get experiment`'s: the Experiment's summary, then its
//! ReplicaSets, pods and AnalysisRuns. Pure functions of the objects (as JSON) and the time.

use std::collections::BTreeSet;

use k8s_openapi::jiff::Timestamp;
use rollouts_analysis::judge::Unit;
use serde_json::Value;

use super::health::rollout_health;

/// Everything `get rollout` draws, as the server returned it.
#[derive(Clone, Copy, Debug)]
pub struct Observed<'a> {
    pub rollout: &'a Value,
    pub replica_sets: &'a [Value],
    pub pods: &'a [Value],
    pub analysis_runs: &'a [Value],
    /// Experiments (the Rollout's are drawn under their revision); their ReplicaSets, pods and
    /// AnalysisRuns are found in the slices above by ownership.
    pub experiments: &'a [Value],
}

const REVISION_ANNOTATION: &str = "rollout.argoproj.io/revision";
const HASH_LABEL: &str = "rollouts-pod-template-hash";
/// The template of an Experiment a ReplicaSet runs, as Argo's experiment controller writes it.
const TEMPLATE_NAME_ANNOTATION: &str = "experiment.argoproj.io/template-name";

fn text<'a>(value: &'a Value, pointer: &str) -> Option<&'a str> {
    value.pointer(pointer).and_then(Value::as_str)
}

fn number(value: &Value, pointer: &str) -> i64 {
    value.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

fn name(value: &Value) -> &str {
    text(value, "/metadata/name").unwrap_or_default()
}

fn label<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value
        .pointer("/metadata/labels")
        .and_then(|labels| labels.get(key))
        .and_then(Value::as_str)
}

fn annotation<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value
        .pointer("/metadata/annotations")
        .and_then(|annotations| annotations.get(key))
        .and_then(Value::as_str)
}

fn revision(value: &Value) -> Option<i64> {
    annotation(value, REVISION_ANNOTATION).and_then(|r| r.parse().ok())
}

/// Whether `child` names `owner` among its ownerReferences (by uid when both have one).
pub(crate) fn owned_by(child: &Value, owner: &Value) -> bool {
    let owner_uid = text(owner, "/metadata/uid");
    let owner_name = name(owner);
    child
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| {
            refs.iter().any(|r| match (owner_uid, text(r, "/uid")) {
                (Some(owner_uid), Some(uid)) => owner_uid == uid,
                _ => text(r, "/name") == Some(owner_name),
            })
        })
}

/// Age as kubectl prints it: `45s`, `3m20s`, `12m`, `5h`, `3d`.
pub fn age(created: Option<&str>, now: Timestamp) -> String {
    let Some(created) = created.and_then(|c| c.parse::<Timestamp>().ok()) else {
        return "<unknown>".to_string();
    };
    human_duration(now.as_second() - created.as_second())
}

/// A span of seconds as kubectl prints ages (negative spans are `0s`).
pub fn human_duration(seconds: i64) -> String {
    let seconds = seconds.max(0);
    let (minutes, hours, days) = (seconds / 60, seconds / 3600, seconds / 86_400);
    if seconds < 120 {
        format!("{seconds}s")
    } else if minutes < 10 {
        match seconds % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        }
    } else if hours < 3 {
        format!("{minutes}m")
    } else if hours < 8 {
        match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        }
    } else if days < 2 {
        format!("{hours}h")
    } else {
        format!("{days}d")
    }
}

fn object_age(value: &Value, now: Timestamp) -> String {
    age(text(value, "/metadata/creationTimestamp"), now)
}

/// The icon for a status word of any object in the tree.
fn status_icon(status: &str) -> &'static str {
    match status {
        "Healthy" | "Running" | "Successful" | "Completed" | "Succeeded" => "✔",
        "Progressing" | "Pending" | "ContainerCreating" | "Terminating" => "◌",
        "Paused" => "॥",
        "Degraded" | "Failed" | "Error" | "CrashLoopBackOff" | "ImagePullBackOff"
        | "ErrImagePull" => "✖",
        "Inconclusive" => "⚠",
        "ScaledDown" => "•",
        _ => "?",
    }
}

fn colour_for(icon: &str) -> Option<&'static str> {
    match icon {
        "✔" => Some("\x1b[32m"),
        "✖" => Some("\x1b[31m"),
        "◌" | "॥" | "⚠" => Some("\x1b[33m"),
        _ => None,
    }
}

/// An icon, coloured for a terminal when `colour` is on.
fn paint(icon: &str, colour: bool) -> String {
    match colour_for(icon) {
        Some(code) if colour => format!("{code}{icon}\x1b[0m"),
        _ => icon.to_string(),
    }
}

/// One line of the tree before the columns are aligned.
struct Row {
    name: String,
    kind: &'static str,
    status: String,
    age: String,
    info: String,
}

fn replica_set_status(rs: &Value) -> &'static str {
    let desired = rs
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    if desired == 0 {
        return "ScaledDown";
    }
    if number(rs, "/status/availableReplicas") < desired {
        "Progressing"
    } else {
        "Healthy"
    }
}

/// `(status, ready "n/m", restarts)` of a pod, with the waiting or terminated reason of its
/// first unhappy container taking the place of the phase, as kubectl shows it.
fn pod_status(pod: &Value) -> (String, String, i64) {
    let statuses = pod
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let containers = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map_or(statuses.len(), Vec::len);
    let ready = statuses
        .iter()
        .filter(|s| s.get("ready").and_then(Value::as_bool) == Some(true))
        .count();
    let restarts = statuses.iter().map(|s| number(s, "/restartCount")).sum();
    let reason = statuses.iter().find_map(|s| {
        text(s, "/state/waiting/reason").or_else(|| text(s, "/state/terminated/reason"))
    });
    let status = if pod.pointer("/metadata/deletionTimestamp").is_some() {
        "Terminating".to_string()
    } else if let Some(reason) = reason {
        reason.to_string()
    } else {
        text(pod, "/status/phase").unwrap_or("Unknown").to_string()
    };
    (status, format!("{ready}/{containers}"), restarts)
}

/// A baseline-judge measurement value: `canary 4.1% vs stable 0.9% (High)`, or in the value's
/// `unit` (`canary 152ms vs stable 120ms (High)`). The value is an object, or (as Argo stores
/// measurement values) a string holding one.
pub fn judge_summary(value: &Value) -> Option<String> {
    let parsed;
    let object = match value {
        Value::String(text) => {
            parsed = serde_json::from_str::<Value>(text).ok()?;
            &parsed
        }
        other => other,
    };
    let verdict = object.get("verdict")?.as_str()?;
    let canary = object.get("canaryMean")?.as_f64()?;
    let baseline = object.get("baselineMean")?.as_f64()?;
    object.get("meanRatio")?;
    // With a unit the means are written in it; without one they are taken as ratios.
    let unit = object
        .get("unit")
        .and_then(|u| serde_json::from_value::<Unit>(u.clone()).ok());
    Some(match unit {
        Some(unit) => format!(
            "canary {} vs stable {} ({verdict})",
            unit.format(canary),
            unit.format(baseline)
        ),
        None => format!(
            "canary {:.1}% vs stable {:.1}% ({verdict})",
            canary * 100.0,
            baseline * 100.0
        ),
    })
}

/// The markers of a ReplicaSet: stable, canary, active, preview.
fn markers(rollout: &Value, hash: Option<&str>) -> Vec<&'static str> {
    let Some(hash) = hash else {
        return Vec::new();
    };
    let status = |pointer| text(rollout, pointer);
    let stable = status("/status/stableRS") == Some(hash);
    let mut markers = Vec::new();
    if stable {
        markers.push("stable");
    }
    if rollout.pointer("/spec/strategy/canary").is_some() {
        if !stable && status("/status/currentPodHash") == Some(hash) {
            markers.push("canary");
        }
    } else if status("/status/blueGreen/activeSelector") == Some(hash) {
        markers.push("active");
    } else if status("/status/blueGreen/previewSelector") == Some(hash) {
        markers.push("preview");
    }
    markers
}

/// The icon of an AnalysisRun's or an Experiment's phase: one that runs is still making up its
/// mind (a pod that runs is fine).
fn analysis_icon(phase: &str) -> &'static str {
    if phase == "Running" {
        "◌"
    } else {
        status_icon(phase)
    }
}

fn analysis_rows(run: &Value, now: Timestamp, colour: bool, prefix: &str, rows: &mut Vec<Row>) {
    let phase = text(run, "/status/phase").unwrap_or("Pending");
    let run_icon = analysis_icon(phase);
    let results = run
        .pointer("/status/metricResults")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let total = |field: &str| -> i64 { results.iter().map(|r| number(r, field)).sum() };
    let mut info = Vec::new();
    for (icon, count) in [
        ("✔", total("/successful")),
        ("✖", total("/failed")),
        ("⚠", total("/inconclusive") + total("/error")),
    ] {
        if count > 0 {
            info.push(format!("{} {count}", paint(icon, colour)));
        }
    }
    rows.push(Row {
        name: format!("{prefix}α {}", name(run)),
        kind: "AnalysisRun",
        status: format!("{} {phase}", paint(run_icon, colour)),
        age: object_age(run, now),
        info: info.join(","),
    });
    let judged: Vec<(&str, &Value, String)> = results
        .iter()
        .filter_map(|result| {
            let last = result
                .pointer("/measurements")
                .and_then(Value::as_array)?
                .last()?;
            let summary = judge_summary(last.get("value")?)?;
            Some((text(result, "/name").unwrap_or_default(), last, summary))
        })
        .collect();
    for (i, (metric, measurement, summary)) in judged.iter().enumerate() {
        let measured = text(measurement, "/phase").unwrap_or("Pending");
        rows.push(Row {
            name: format!(
                "{}{}──· {metric}",
                child_prefix(prefix),
                if i + 1 == judged.len() { "└" } else { "├" }
            ),
            kind: "Metric",
            status: format!("{} {measured}", paint(status_icon(measured), colour)),
            age: age(text(measurement, "/finishedAt"), now),
            info: summary.clone(),
        });
    }
}

/// The continuation a node's children draw under it: `│  ` below a `├──`, blanks below `└──`.
fn child_prefix(prefix: &str) -> String {
    prefix.replace("├──", "│  ").replace("└──", "   ")
}

/// A child's connector under `parent`'s own connector.
fn connector(parent: &str, last: bool) -> String {
    format!(
        "{}{}",
        child_prefix(parent),
        if last { "└──" } else { "├──" }
    )
}

/// The summary block and the tree, one string per line, without trailing newlines.
pub fn rollout_tree(observed: Observed<'_>, now: Timestamp, colour: bool) -> Vec<String> {
    let rollout = observed.rollout;
    let health = rollout_health(rollout);
    let mut lines = Vec::new();
    let field = |label: &str, value: &str| format!("{label:<17}{value}");
    lines.push(field("Name:", name(rollout)));
    lines.push(field(
        "Namespace:",
        text(rollout, "/metadata/namespace").unwrap_or_default(),
    ));
    lines.push(field(
        "Status:",
        &format!(
            "{} {}",
            paint(health.status.icon(), colour),
            health.status.phase_word()
        ),
    ));
    if !health.message.is_empty() {
        lines.push(field("Message:", &health.message));
    }
    let owned_sets: Vec<&Value> = observed
        .replica_sets
        .iter()
        .filter(|rs| owned_by(rs, rollout))
        .collect();
    let canary = rollout.pointer("/spec/strategy/canary");
    if let Some(canary) = canary {
        lines.push(field("Strategy:", "Canary"));
        let steps = canary
            .get("steps")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        if let Some(index) = rollout
            .pointer("/status/currentStepIndex")
            .and_then(Value::as_i64)
            .filter(|_| steps > 0)
        {
            lines.push(field("  Step:", &format!("{index}/{steps}")));
        }
        let (set_weight, actual_weight) = weights(rollout, &owned_sets);
        lines.push(field("  SetWeight:", &set_weight.to_string()));
        lines.push(field("  ActualWeight:", &actual_weight.to_string()));
    } else if rollout.pointer("/spec/strategy/blueGreen").is_some() {
        lines.push(field("Strategy:", "BlueGreen"));
    }
    let images = images(rollout, &owned_sets);
    for (i, image) in images.iter().enumerate() {
        lines.push(field(if i == 0 { "Images:" } else { "" }, image));
    }
    lines.push("Replicas:".to_string());
    let desired = rollout
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    for (label, value) in [
        ("  Desired:", desired),
        ("  Current:", number(rollout, "/status/replicas")),
        ("  Updated:", number(rollout, "/status/updatedReplicas")),
        ("  Ready:", number(rollout, "/status/readyReplicas")),
        ("  Available:", number(rollout, "/status/availableReplicas")),
    ] {
        lines.push(field(label, &value.to_string()));
    }
    lines.push(String::new());

    let mut rows = vec![Row {
        name: format!("⟳ {}", name(rollout)),
        kind: "Rollout",
        status: format!(
            "{} {}",
            paint(health.status.icon(), colour),
            health.status.phase_word()
        ),
        age: object_age(rollout, now),
        info: String::new(),
    }];
    let runs: Vec<&Value> = observed
        .analysis_runs
        .iter()
        .filter(|run| owned_by(run, rollout))
        .collect();
    let experiments: Vec<&Value> = observed
        .experiments
        .iter()
        .filter(|experiment| owned_by(experiment, rollout))
        .collect();
    let revisions: BTreeSet<i64> = owned_sets
        .iter()
        .chain(runs.iter())
        .chain(experiments.iter())
        .filter_map(|object| revision(object))
        .collect();
    let revisions: Vec<i64> = revisions.into_iter().rev().collect();
    for (i, rev) in revisions.iter().enumerate() {
        let rev_prefix = connector("", i + 1 == revisions.len());
        rows.push(Row {
            name: format!("{rev_prefix}# revision:{rev}"),
            kind: "",
            status: String::new(),
            age: String::new(),
            info: String::new(),
        });
        let sets: Vec<&&Value> = owned_sets
            .iter()
            .filter(|rs| revision(rs) == Some(*rev))
            .collect();
        // Oldest first within a revision, as Argo's plugin orders them.
        let mut rev_experiments: Vec<&&Value> = experiments
            .iter()
            .filter(|experiment| revision(experiment) == Some(*rev))
            .collect();
        rev_experiments.sort_by_key(|experiment| {
            (
                text(experiment, "/metadata/creationTimestamp").unwrap_or_default(),
                name(experiment),
            )
        });
        let mut rev_runs: Vec<&&Value> = runs
            .iter()
            .filter(|run| revision(run) == Some(*rev))
            .collect();
        rev_runs.sort_by_key(|run| name(run).to_string());
        let children = sets.len() + rev_experiments.len() + rev_runs.len();
        let mut child = 0;
        let mut next_prefix = || {
            child += 1;
            connector(&rev_prefix, child == children)
        };
        for rs in &sets {
            let info = markers(rollout, label(rs, HASH_LABEL)).join(",");
            replica_set_rows(
                rs,
                info,
                observed.pods,
                now,
                colour,
                &next_prefix(),
                &mut rows,
            );
        }
        for experiment in &rev_experiments {
            experiment_rows(experiment, observed, now, colour, &next_prefix(), &mut rows);
        }
        for run in &rev_runs {
            analysis_rows(run, now, colour, &next_prefix(), &mut rows);
        }
    }
    lines.extend(align(&rows));
    lines
}

/// A ReplicaSet's row (`info` in its INFO column) and a row per pod it owns.
fn replica_set_rows(
    rs: &Value,
    info: String,
    pods: &[Value],
    now: Timestamp,
    colour: bool,
    prefix: &str,
    rows: &mut Vec<Row>,
) {
    let status = replica_set_status(rs);
    rows.push(Row {
        name: format!("{prefix}⧉ {}", name(rs)),
        kind: "ReplicaSet",
        status: format!("{} {status}", paint(status_icon(status), colour)),
        age: object_age(rs, now),
        info,
    });
    let mut pods: Vec<&Value> = pods.iter().filter(|p| owned_by(p, rs)).collect();
    pods.sort_by_key(|pod| name(pod).to_string());
    for (k, pod) in pods.iter().enumerate() {
        let pod_prefix = connector(prefix, k + 1 == pods.len());
        let (status, ready, restarts) = pod_status(pod);
        let mut info = format!("ready:{ready}");
        if restarts > 0 {
            info.push_str(&format!(",restarts:{restarts}"));
        }
        rows.push(Row {
            name: format!("{pod_prefix}□ {}", name(pod)),
            kind: "Pod",
            status: format!("{} {status}", paint(status_icon(&status), colour)),
            age: object_age(pod, now),
            info,
        });
    }
}

/// The phase an Experiment shows: its status's, `Pending` before the controller wrote one.
fn experiment_phase(experiment: &Value) -> &str {
    text(experiment, "/status/phase")
        .filter(|phase| !phase.is_empty())
        .unwrap_or("Pending")
}

/// The ReplicaSets an Experiment owns, newest revision first, then by name (Argo's order).
fn experiment_sets<'a>(experiment: &Value, replica_sets: &'a [Value]) -> Vec<&'a Value> {
    let mut sets: Vec<&Value> = replica_sets
        .iter()
        .filter(|rs| owned_by(rs, experiment))
        .collect();
    sets.sort_by(|a, b| {
        revision(b)
            .cmp(&revision(a))
            .then_with(|| name(a).cmp(name(b)))
    });
    sets
}

/// An Experiment's row, then its ReplicaSets (with their pods) and its AnalysisRuns.
fn experiment_rows(
    experiment: &Value,
    observed: Observed<'_>,
    now: Timestamp,
    colour: bool,
    prefix: &str,
    rows: &mut Vec<Row>,
) {
    let phase = experiment_phase(experiment);
    rows.push(Row {
        name: format!("{prefix}Σ {}", name(experiment)),
        kind: "Experiment",
        status: format!("{} {phase}", paint(analysis_icon(phase), colour)),
        age: object_age(experiment, now),
        info: String::new(),
    });
    let sets = experiment_sets(experiment, observed.replica_sets);
    let mut runs: Vec<&Value> = observed
        .analysis_runs
        .iter()
        .filter(|run| owned_by(run, experiment))
        .collect();
    runs.sort_by_key(|run| name(run).to_string());
    let children = sets.len() + runs.len();
    for (j, rs) in sets.iter().enumerate() {
        let rs_prefix = connector(prefix, j + 1 == children);
        replica_set_rows(
            rs,
            String::new(),
            observed.pods,
            now,
            colour,
            &rs_prefix,
            rows,
        );
    }
    for (j, run) in runs.iter().enumerate() {
        let run_prefix = connector(prefix, sets.len() + j + 1 == children);
        analysis_rows(run, now, colour, &run_prefix, rows);
    }
}

/// Everything `get experiment` draws, as the server returned it.
#[derive(Clone, Copy, Debug)]
pub struct ObservedExperiment<'a> {
    pub experiment: &'a Value,
    pub replica_sets: &'a [Value],
    pub pods: &'a [Value],
    pub analysis_runs: &'a [Value],
}

/// `get experiment`'s summary block and tree, one string per line, as Argo's plugin draws them:
/// the images of its running ReplicaSets tagged with their template (`web:2 (Σ:canary)`).
pub fn experiment_tree(
    observed: ObservedExperiment<'_>,
    now: Timestamp,
    colour: bool,
) -> Vec<String> {
    let experiment = observed.experiment;
    let phase = experiment_phase(experiment);
    let field = |label: &str, value: &str| format!("{label:<17}{value}");
    let mut lines = vec![
        field("Name:", name(experiment)),
        field(
            "Namespace:",
            text(experiment, "/metadata/namespace").unwrap_or_default(),
        ),
        field(
            "Status:",
            &format!("{} {phase}", paint(analysis_icon(phase), colour)),
        ),
    ];
    if let Some(message) = text(experiment, "/status/message").filter(|m| !m.is_empty()) {
        lines.push(field("Message:", message));
    }
    let sets = experiment_sets(experiment, observed.replica_sets);
    let mut images: Vec<(String, Vec<String>)> = Vec::new();
    for rs in sets.iter().filter(|rs| number(rs, "/status/replicas") > 0) {
        let tag = annotation(rs, TEMPLATE_NAME_ANNOTATION).map(|t| format!("Σ:{t}"));
        for container in rs
            .pointer("/spec/template/spec/containers")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            let Some(image) = text(container, "/image") else {
                continue;
            };
            let tags = match images.iter_mut().find(|(i, _)| i == image) {
                Some((_, tags)) => tags,
                None => {
                    images.push((image.to_string(), Vec::new()));
                    &mut images.last_mut().expect("just pushed").1
                }
            };
            if let Some(tag) = &tag
                && !tags.contains(tag)
            {
                tags.push(tag.clone());
            }
        }
    }
    for (i, (image, tags)) in images.iter().enumerate() {
        let shown = if tags.is_empty() {
            image.clone()
        } else {
            format!("{image} ({})", tags.join(", "))
        };
        lines.push(field(if i == 0 { "Images:" } else { "" }, &shown));
    }
    lines.push(String::new());
    let mut rows = Vec::new();
    experiment_rows(
        experiment,
        Observed {
            rollout: experiment,
            replica_sets: observed.replica_sets,
            pods: observed.pods,
            analysis_runs: observed.analysis_runs,
            experiments: &[],
        },
        now,
        colour,
        "",
        &mut rows,
    );
    lines.extend(align(&rows));
    lines
}

/// Text width as a terminal shows it, ignoring colour escapes.
fn width(text: &str) -> usize {
    let mut width = 0;
    let mut in_escape = false;
    for c in text.chars() {
        match (in_escape, c) {
            (false, '\x1b') => in_escape = true,
            (true, 'm') => in_escape = false,
            (true, _) => {}
            (false, _) => width += 1,
        }
    }
    width
}

fn pad(text: &str, to: usize) -> String {
    format!("{text}{}", " ".repeat(to.saturating_sub(width(text))))
}

/// Lines up NAME, KIND, STATUS, AGE and INFO with two spaces between columns.
fn align(rows: &[Row]) -> Vec<String> {
    let header = Row {
        name: "NAME".into(),
        kind: "KIND",
        status: "STATUS".into(),
        age: "AGE".into(),
        info: "INFO".into(),
    };
    let all: Vec<&Row> = std::iter::once(&header).chain(rows).collect();
    let name_width = all.iter().map(|r| width(&r.name)).max().unwrap_or(0);
    let kind_width = all.iter().map(|r| r.kind.len()).max().unwrap_or(0);
    let status_width = all.iter().map(|r| width(&r.status)).max().unwrap_or(0);
    let age_width = all.iter().map(|r| r.age.len()).max().unwrap_or(0);
    all.iter()
        .map(|r| {
            let line = format!(
                "{}  {}  {}  {}  {}",
                pad(&r.name, name_width),
                pad(r.kind, kind_width),
                pad(&r.status, status_width),
                pad(&r.age, age_width),
                r.info
            );
            line.trim_end().to_string()
        })
        .collect()
}

/// The weight the current step asks for (0 once aborted, 100 once past the last step) and the
/// weight the canary really gets: the router's, else its share of available pods.
pub fn weights(rollout: &Value, owned_sets: &[&Value]) -> (i64, i64) {
    let steps = rollout
        .pointer("/spec/strategy/canary/steps")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    // No index yet means the first step; an index past the last step means done.
    let index = rollout
        .pointer("/status/currentStepIndex")
        .and_then(Value::as_i64)
        .unwrap_or(0)
        .max(0) as usize;
    let done = index >= steps.len();
    let aborted = rollout
        .pointer("/status/abort")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let set_weight = if aborted {
        0
    } else if done {
        100
    } else {
        // The weight in force is the last setWeight at or before the current step.
        steps[..=index]
            .iter()
            .rev()
            .find_map(|s| s.get("setWeight").and_then(Value::as_i64))
            .unwrap_or(0)
    };
    if let Some(weight) = rollout
        .pointer("/status/canary/weights/canary/weight")
        .and_then(Value::as_i64)
    {
        return (set_weight, weight);
    }
    if done {
        return (set_weight, 100);
    }
    if rollout
        .pointer("/spec/strategy/canary/trafficRouting")
        .is_some()
    {
        return (set_weight, set_weight);
    }
    let available = number(rollout, "/status/availableReplicas");
    let canary_hash = text(rollout, "/status/currentPodHash");
    let stable_hash = text(rollout, "/status/stableRS");
    let canary_available: i64 = owned_sets
        .iter()
        .filter(|rs| label(rs, HASH_LABEL).is_some() && label(rs, HASH_LABEL) == canary_hash)
        .filter(|_| canary_hash != stable_hash)
        .map(|rs| number(rs, "/status/availableReplicas"))
        .sum();
    let actual = if available > 0 {
        canary_available * 100 / available
    } else {
        0
    };
    (set_weight, actual)
}

/// Each container image running, tagged with the ReplicaSets' markers (`web:2 (canary)`).
fn images(rollout: &Value, owned_sets: &[&Value]) -> Vec<String> {
    let mut images: Vec<(String, Vec<&'static str>)> = Vec::new();
    let add =
        |images: &mut Vec<(String, Vec<&'static str>)>, image: &str, tags: &[&'static str]| {
            match images.iter_mut().find(|(i, _)| i == image) {
                Some((_, existing)) => {
                    for tag in tags {
                        if !existing.contains(tag) {
                            existing.push(tag);
                        }
                    }
                }
                None => images.push((image.to_string(), tags.to_vec())),
            }
        };
    for rs in owned_sets {
        if number(rs, "/status/replicas") == 0 && number(rs, "/spec/replicas") == 0 {
            continue;
        }
        let tags = markers(rollout, label(rs, HASH_LABEL));
        for container in rs
            .pointer("/spec/template/spec/containers")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            if let Some(image) = text(container, "/image") {
                add(&mut images, image, &tags);
            }
        }
    }
    if images.is_empty() {
        for container in rollout
            .pointer("/spec/template/spec/containers")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            if let Some(image) = text(container, "/image") {
                add(&mut images, image, &[]);
            }
        }
    }
    images
        .into_iter()
        .map(|(image, tags)| {
            if tags.is_empty() {
                image
            } else {
                format!("{image} ({})", tags.join(", "))
            }
        })
        .collect()
}
