//! What the read-only verbs show, as pure functions of objects (JSON) and the time: a Rollout's
//! health, the `get rollout` and `get experiment` trees, and the `list rollouts` and
//! `list experiments` tables.

pub mod health;
pub mod tree;

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use health::rollout_health;

/// One `list rollouts` row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListRow {
    pub namespace: String,
    pub name: String,
    pub strategy: &'static str,
    pub status: &'static str,
    pub step: String,
    pub set_weight: String,
    /// `ready/current`, as Argo's plugin prints it.
    pub ready: String,
    pub desired: i64,
    pub up_to_date: i64,
    pub available: i64,
}

/// The row `list rollouts` prints for `rollout` (its JSON).
pub fn list_row(rollout: &Value) -> ListRow {
    let get = |pointer: &str| rollout.pointer(pointer);
    let count = |pointer: &str| get(pointer).and_then(Value::as_i64).unwrap_or(0);
    let steps = get("/spec/strategy/canary/steps")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let (strategy, step, set_weight) = if get("/spec/strategy/canary").is_some() {
        let step = get("/status/currentStepIndex")
            .and_then(Value::as_i64)
            .filter(|_| steps > 0)
            .map_or("-".to_string(), |i| format!("{i}/{steps}"));
        let (set_weight, _) = tree::weights(rollout, &[]);
        ("Canary", step, set_weight.to_string())
    } else if get("/spec/strategy/blueGreen").is_some() {
        ("BlueGreen", "-".to_string(), "-".to_string())
    } else {
        ("-", "-".to_string(), "-".to_string())
    };
    let text = |pointer: &str| get(pointer).and_then(Value::as_str).unwrap_or_default();
    ListRow {
        namespace: text("/metadata/namespace").to_string(),
        name: text("/metadata/name").to_string(),
        strategy,
        status: rollout_health(rollout).status.phase_word(),
        step,
        set_weight,
        ready: format!(
            "{}/{}",
            count("/status/readyReplicas"),
            count("/status/replicas")
        ),
        desired: get("/spec/replicas").and_then(Value::as_i64).unwrap_or(1),
        up_to_date: count("/status/updatedReplicas"),
        available: count("/status/availableReplicas"),
    }
}

/// The `list rollouts` table, columns aligned, NAMESPACE first when `all_namespaces`.
pub fn list_table(rows: &[ListRow], all_namespaces: bool) -> Vec<String> {
    let mut cells: Vec<Vec<String>> = vec![
        [
            "NAMESPACE",
            "NAME",
            "STRATEGY",
            "STATUS",
            "STEP",
            "SET-WEIGHT",
            "READY",
            "DESIRED",
            "UP-TO-DATE",
            "AVAILABLE",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for row in rows {
        cells.push(vec![
            row.namespace.clone(),
            row.name.clone(),
            row.strategy.to_string(),
            row.status.to_string(),
            row.step.clone(),
            row.set_weight.clone(),
            row.ready.clone(),
            row.desired.to_string(),
            row.up_to_date.to_string(),
            row.available.to_string(),
        ]);
    }
    if !all_namespaces {
        for line in &mut cells {
            line.remove(0);
        }
    }
    align_columns(&cells)
}

/// Cells padded to their column's widest, two spaces apart, trailing blanks trimmed.
fn align_columns(cells: &[Vec<String>]) -> Vec<String> {
    let columns = cells.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            cells
                .iter()
                .map(|l| l[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    cells
        .iter()
        .map(|line| {
            let padded: Vec<String> = line
                .iter()
                .zip(&widths)
                .map(|(cell, width)| format!("{cell:<width$}"))
                .collect();
            padded.join("  ").trim_end().to_string()
        })
        .collect()
}

/// One `list experiments` row, Argo's columns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExperimentRow {
    pub namespace: String,
    pub name: String,
    /// The phase, empty before the controller wrote one (as Argo's plugin prints it).
    pub status: String,
    /// `spec.duration`, or `-` when it runs until its analyses end or it is terminated.
    pub duration: String,
    /// Time left of the duration while it runs and is available, else `-`.
    pub remaining: String,
    pub age: String,
}

/// The row `list experiments` prints for `experiment` (its JSON) at `now`.
pub fn experiment_row(experiment: &Value, now: Timestamp) -> ExperimentRow {
    let text = |pointer: &str| {
        experiment
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    let status = text("/status/phase");
    let completed = matches!(status, "Successful" | "Failed" | "Error" | "Inconclusive");
    let duration = experiment
        .pointer("/spec/duration")
        .and_then(Value::as_str)
        .and_then(|d| rollouts_crds::duration::parse(d).ok());
    let (mut shown_duration, mut remaining) = ("-".to_string(), "-".to_string());
    if let Some(duration) = duration {
        shown_duration = tree::human_duration(duration.as_secs() as i64);
        let available_at = text("/status/availableAt").parse::<Timestamp>().ok();
        if let Some(available_at) = available_at.filter(|_| !completed) {
            let left = available_at.as_second() + duration.as_secs() as i64 - now.as_second();
            if left > 0 {
                remaining = tree::human_duration(left);
            }
        }
    }
    ExperimentRow {
        namespace: text("/metadata/namespace").to_string(),
        name: text("/metadata/name").to_string(),
        status: status.to_string(),
        duration: shown_duration,
        remaining,
        age: tree::age(Some(text("/metadata/creationTimestamp")), now),
    }
}

/// The `list experiments` table, columns aligned, NAMESPACE first when `all_namespaces`.
pub fn experiment_table(rows: &[ExperimentRow], all_namespaces: bool) -> Vec<String> {
    let header = [
        "NAMESPACE",
        "NAME",
        "STATUS",
        "DURATION",
        "REMAINING",
        "AGE",
    ];
    let mut cells: Vec<Vec<String>> = vec![header.map(String::from).to_vec()];
    for row in rows {
        cells.push(vec![
            row.namespace.clone(),
            row.name.clone(),
            row.status.clone(),
            row.duration.clone(),
            row.remaining.clone(),
            row.age.clone(),
        ]);
    }
    if !all_namespaces {
        for line in &mut cells {
            line.remove(0);
        }
    }
    align_columns(&cells)
}
