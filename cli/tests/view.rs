//! The pure views on fixtures: the `get rollout` and `get experiment` trees and the
//! `list rollouts` and `list experiments` tables of `tests/fixtures/get/*.json`, compared with
//! the `.expected` files next to them. Set
//! `UPDATE_EXPECTED=1` to rewrite those after an intended change (then read the diff).

use std::path::{Path, PathBuf};

use k8s_openapi::jiff::Timestamp;
use kubectl_rollouts::view::tree::{
    Observed, ObservedExperiment, age, experiment_tree, judge_summary, rollout_tree,
};
use kubectl_rollouts::view::{experiment_row, experiment_table, list_row, list_table};
use serde_json::{Value, json};

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/get")
}

fn load(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture_dir().join(format!("{name}.json")))
        .expect("fixture exists");
    serde_json::from_str(&text).expect("fixture is JSON")
}

fn assert_expected(file: &str, actual: &str) {
    let path = fixture_dir().join(file);
    if std::env::var_os("UPDATE_EXPECTED").is_some() {
        std::fs::write(&path, actual).expect("expected file is writable");
    }
    let expected = std::fs::read_to_string(&path).expect("expected file exists");
    assert_eq!(actual, expected, "{file} changed");
}

fn list(fixture: &Value, key: &str) -> Vec<Value> {
    fixture[key].as_array().cloned().unwrap_or_default()
}

fn tree_of(fixture: &Value, colour: bool) -> Vec<String> {
    let (replica_sets, pods, runs, experiments) = (
        list(fixture, "replicaSets"),
        list(fixture, "pods"),
        list(fixture, "analysisRuns"),
        list(fixture, "experiments"),
    );
    let now: Timestamp = fixture["now"].as_str().unwrap().parse().unwrap();
    rollout_tree(
        Observed {
            rollout: &fixture["rollout"],
            replica_sets: &replica_sets,
            pods: &pods,
            analysis_runs: &runs,
            experiments: &experiments,
        },
        now,
        colour,
    )
}

fn now_of(fixture: &Value) -> Timestamp {
    fixture["now"].as_str().unwrap().parse().unwrap()
}

#[test]
fn an_experiment_step_is_drawn_under_its_revision_with_its_sets_pods_and_runs() {
    let fixture = load("canary-experiment");
    let lines = tree_of(&fixture, false);
    assert_expected("canary-experiment.expected", &(lines.join("\n") + "\n"));
    // Another Rollout's Experiment never shows up, nor do the experiment's ReplicaSets at the
    // Rollout's level (they are not the Rollout's).
    assert!(!lines.iter().any(|l| l.contains("api-ccc")));
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains("web-bbb-2-0-canary "))
            .count(),
        1
    );
}

#[test]
fn get_experiment_draws_its_images_sets_pods_and_runs() {
    let fixture = load("canary-experiment");
    let (replica_sets, pods, runs) = (
        list(&fixture, "replicaSets"),
        list(&fixture, "pods"),
        list(&fixture, "analysisRuns"),
    );
    let lines = experiment_tree(
        ObservedExperiment {
            experiment: &fixture["experiments"][0],
            replica_sets: &replica_sets,
            pods: &pods,
            analysis_runs: &runs,
        },
        now_of(&fixture),
        false,
    );
    assert_expected("experiment.expected", &(lines.join("\n") + "\n"));
    // The Rollout's own ReplicaSets are not the experiment's.
    assert!(!lines.iter().any(|l| l.contains("web-aaa ")));
}

#[test]
fn list_experiments_shows_status_duration_remaining_and_age() {
    let fixture = load("canary-experiment");
    let now = now_of(&fixture);
    let running = fixture["experiments"][0].clone();
    let mut done = running.clone();
    done["metadata"]["name"] = json!("web-aaa-1-0");
    done["metadata"]["creationTimestamp"] = json!("2026-02-27T12:00:00Z");
    done["status"]["phase"] = json!("Successful");
    let mut open_ended = running.clone();
    open_ended["metadata"]["name"] = json!("soak");
    open_ended["metadata"]["namespace"] = json!("edge");
    open_ended["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("duration");
    let mut fresh = running.clone();
    fresh["metadata"]["name"] = json!("fresh");
    fresh["metadata"]["creationTimestamp"] = json!("2026-03-01T12:09:50Z");
    fresh.as_object_mut().expect("object").remove("status");
    let rows: Vec<_> = [&running, &done, &open_ended, &fresh]
        .iter()
        .map(|e| experiment_row(e, now))
        .collect();
    assert_eq!(rows[0].remaining, "6m", "10m from 12:06, at 12:10");
    assert_eq!(
        rows[1].remaining, "-",
        "a finished experiment has none left"
    );
    assert_eq!(rows[2].duration, "-");
    assert_eq!(rows[3].status, "");
    assert_expected(
        "experiments-list.expected",
        &(experiment_table(&rows, false).join("\n") + "\n"),
    );
    assert_expected(
        "experiments-list-all.expected",
        &(experiment_table(&rows, true).join("\n") + "\n"),
    );
}

#[test]
fn a_paused_canary_draws_its_revisions_pods_and_analysis() {
    let fixture = load("canary-paused");
    let lines = tree_of(&fixture, false);
    assert_expected("canary-paused.expected", &(lines.join("\n") + "\n"));
    // Another Rollout's ReplicaSet never shows up.
    assert!(!lines.iter().any(|l| l.contains("other-ccc")));
}

#[test]
fn an_aborted_blue_green_marks_active_and_preview_and_says_why() {
    let fixture = load("blue-green-aborted");
    let lines = tree_of(&fixture, false);
    assert_expected("blue-green-aborted.expected", &(lines.join("\n") + "\n"));
}

#[test]
fn colour_wraps_only_the_icons() {
    let fixture = load("canary-paused");
    let plain = tree_of(&fixture, false);
    let coloured = tree_of(&fixture, true);
    let stripped: Vec<String> = coloured
        .iter()
        .map(|l| {
            l.replace("\x1b[32m", "")
                .replace("\x1b[31m", "")
                .replace("\x1b[33m", "")
                .replace("\x1b[0m", "")
        })
        .collect();
    assert_eq!(stripped, plain);
    assert!(
        coloured
            .iter()
            .any(|l| l.contains("\x1b[33m॥\x1b[0m Paused"))
    );
}

#[test]
fn list_shows_status_step_weight_and_counts() {
    let fixture = load("canary-paused");
    let mut healthy = fixture["rollout"].clone();
    healthy["metadata"]["name"] = json!("api");
    healthy["metadata"]["namespace"] = json!("edge");
    healthy["status"] = json!({
        "observedGeneration": "3", "phase": "Healthy", "currentStepIndex": 4,
        "currentPodHash": "bbb", "stableRS": "bbb",
        "replicas": 4, "updatedReplicas": 4, "readyReplicas": 4, "availableReplicas": 4
    });
    let rows = [list_row(&fixture["rollout"]), list_row(&healthy)];
    assert_expected(
        "list.expected",
        &(list_table(&rows, false).join("\n") + "\n"),
    );
    assert_expected(
        "list-all.expected",
        &(list_table(&rows, true).join("\n") + "\n"),
    );
}

#[test]
fn judge_measurements_read_as_canary_versus_stable() {
    let object =
        json!({"verdict": "High", "canaryMean": 0.041, "baselineMean": 0.009, "meanRatio": 4.5});
    assert_eq!(
        judge_summary(&object).as_deref(),
        Some("canary 4.1% vs stable 0.9% (High)")
    );
    assert_eq!(
        judge_summary(&Value::String(object.to_string())).as_deref(),
        Some("canary 4.1% vs stable 0.9% (High)")
    );
    assert_eq!(judge_summary(&json!("[0.01]")), None);
    let latency = json!({"verdict": "High", "canaryMean": 0.152, "baselineMean": 0.12,
        "meanRatio": 1.27, "unit": "seconds"});
    assert_eq!(
        judge_summary(&latency).as_deref(),
        Some("canary 152ms vs stable 120ms (High)")
    );
    let rare = json!({"verdict": "High", "canaryMean": 0.002, "baselineMean": 0.0,
        "meanRatio": null, "unit": "ratio"});
    assert_eq!(
        judge_summary(&rare).as_deref(),
        Some("canary 0.2% vs stable 0% (High)")
    );
}

#[test]
fn ages_read_like_kubectl() {
    let now: Timestamp = "2026-03-01T12:00:00Z".parse().unwrap();
    for (created, expected) in [
        ("2026-03-01T11:59:15Z", "45s"),
        ("2026-03-01T11:56:40Z", "3m20s"),
        ("2026-03-01T11:30:00Z", "30m"),
        ("2026-03-01T07:00:00Z", "5h"),
        ("2026-02-26T12:00:00Z", "3d"),
    ] {
        assert_eq!(age(Some(created), now), expected, "{created}");
    }
    assert_eq!(age(None, now), "<unknown>");
}
