//! Scenario 10: the judge against a fresh baseline. The Rollout's one step is an experiment that
//! starts, side by side and of equal size, a baseline of the stable template and a canary of the
//! new one, and the baseline judge compares those two (each selected by its own experiment
//! ReplicaSet's pod-template hash), not the long-running stable pods. A release as good as
//! stable passes the experiment and is promoted; one failing 20% of its requests fails the
//! experiment after two High verdicts in a row, and the Rollout is rolled back. The judge's
//! figures (verdicts, means, ratios, intervals) are printed for both releases (`--nocapture`).

use std::time::Duration;

use rollouts_e2e::harness::{AnalysisRunView, Scenario};
use serde_json::Value;

const STABLE_ERROR_RATE: &str = "0.01";
const BAD_ERROR_RATE: &str = "0.2";
const RPS: &str = "1000";
/// The judge metric of errors-vs-stable.yaml, and its `count` and `consecutiveFailureLimit`.
const METRIC: &str = "errors-vs-stable";
const COUNT: usize = 3;
const CONSECUTIVE_FAILURE_LIMIT: usize = 2;
/// The experiment step's analysis, whose run is `<experiment>-judge`.
const ANALYSIS: &str = "judge";

/// The Experiment of revision `hash`, once it reached one of `phases`.
fn experiment(s: &Scenario, hash: &str, phases: &[&str], deadline: Duration) -> Value {
    s.then().eventually(
        &format!("the experiment of revision {hash} to be {phases:?}"),
        deadline,
        |_| {
            let list = s.kubectl().get_json(&["experiments"]).ok()?;
            list["items"]
                .as_array()?
                .iter()
                .find(|ex| {
                    ex["metadata"]["labels"]["rollouts-pod-template-hash"] == hash
                        && phases.contains(&ex["status"]["phase"].as_str().unwrap_or_default())
                })
                .cloned()
        },
    )
}

/// The pod-template hash of each experiment template's ReplicaSet (`<experiment>-<template>`),
/// by template name.
fn template_hashes(s: &Scenario, experiment: &Value) -> Vec<(String, String)> {
    let name = experiment["metadata"]["name"].as_str().unwrap_or_default();
    ["baseline", "canary"]
        .into_iter()
        .map(|template| {
            let rs = s
                .kubectl()
                .get_json(&["replicaset", &format!("{name}-{template}")])
                .unwrap_or_else(|e| panic!("the experiment's ReplicaSet for {template}: {e}"));
            let hash = rs["metadata"]["labels"]["rollouts-pod-template-hash"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            (template.to_string(), hash)
        })
        .collect()
}

/// The experiment's judge run.
fn judge_run(s: &Scenario, experiment: &Value) -> AnalysisRunView {
    let name = format!(
        "{}-{ANALYSIS}",
        experiment["metadata"]["name"].as_str().unwrap_or_default()
    );
    let run = s
        .kubectl()
        .get_json(&["analysisrun", &name])
        .unwrap_or_else(|e| panic!("the experiment's run {name}: {e}"));
    AnalysisRunView(run)
}

/// Prints the judge's measurements: phase and the value's figures, one line each.
fn print_figures(release: &str, run: &AnalysisRunView) {
    println!(
        "judge on the fresh baseline, {release}: run {} {}",
        run.name(),
        run.phase()
    );
    let measurements = run
        .metric(METRIC)
        .and_then(|m| m["measurements"].as_array())
        .cloned()
        .unwrap_or_default();
    for (i, measurement) in measurements.iter().enumerate() {
        let value: Value = measurement["value"]
            .as_str()
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or(Value::Null);
        println!(
            "  measurement {}: {} verdict={} canaryMean={} baselineMean={} meanRatio={} shift={} interval=[{}, {}] samples={}/{}",
            i + 1,
            measurement["phase"].as_str().unwrap_or_default(),
            value["verdict"],
            value["canaryMean"],
            value["baselineMean"],
            value["meanRatio"],
            value["shift"],
            value["lower"],
            value["upper"],
            value["canarySamples"],
            value["baselineSamples"],
        );
    }
}

/// The verdicts of the judge's measurements, oldest first.
fn verdicts(run: &AnalysisRunView) -> Vec<String> {
    run.metric(METRIC)
        .and_then(|m| m["measurements"].as_array())
        .into_iter()
        .flatten()
        .map(|m| {
            m["value"]
                .as_str()
                .and_then(|text| serde_json::from_str::<Value>(text).ok())
                .and_then(|value| value["verdict"].as_str().map(str::to_string))
                .unwrap_or_default()
        })
        .collect()
}

fn the_judge_compares_the_canary_with_a_fresh_baseline(s: &Scenario) {
    let given = s.given();
    given
        .controller_is_running()
        .manifest("service.yaml", &[("RPS", RPS)])
        .manifest("errors-vs-stable.yaml", &[])
        .manifest(
            "s10-rollout-experiment.yaml",
            &[("VERSION", "1"), ("ERROR_RATE", STABLE_ERROR_RATE)],
        );
    let first = given.rollout_is_healthy(Duration::from_secs(20));
    given.prometheus_has_seen_requests(&first, 2, Duration::from_secs(20));

    // A release as good as stable.
    s.when().manifest(
        "s10-rollout-experiment.yaml",
        &[("VERSION", "2"), ("ERROR_RATE", STABLE_ERROR_RATE)],
    );
    let then = s.then();
    let good = then.new_revision(&first, Duration::from_secs(10));
    let finished = experiment(
        s,
        &good,
        &["Successful", "Failed", "Error", "Inconclusive"],
        Duration::from_secs(60),
    );
    let run = judge_run(s, &finished);
    print_figures("a release as good as stable", &run);
    let hashes = template_hashes(s, &finished);
    then.holds(
        hashes.len() == 2
            && hashes
                .iter()
                .all(|(_, hash)| !hash.is_empty() && *hash != first && *hash != good),
        || {
            format!(
                "the experiment's templates run ReplicaSets of their own hashes, not the \
                 Rollout's ({first}, {good}): {hashes:?}"
            )
        },
    );
    let args: Vec<String> = run.0["spec"]["args"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|arg| arg["value"].as_str().unwrap_or_default().to_string())
        .collect();
    let template_hash = |name: &str| {
        hashes
            .iter()
            .find(|(template, _)| template == name)
            .map(|(_, hash)| hash.clone())
            .unwrap_or_default()
    };
    then.holds(
        args.contains(&template_hash("canary")) && args.contains(&template_hash("baseline")),
        || format!("the judge's arguments {args:?} should be the templates' hashes {hashes:?}"),
    );
    let phases = run.measurement_phases(METRIC);
    then.holds(
        finished["status"]["phase"] == "Successful"
            && run.phase() == "Successful"
            && phases == ["Successful"; COUNT],
        || {
            format!(
                "the experiment ended {} and its judge run {} with measurements {phases:?}; want \
                 both Successful after {COUNT} Successful measurements:\n{}",
                finished["status"]["phase"],
                run.phase(),
                serde_json::to_string_pretty(&run.0["status"]).unwrap_or_default()
            )
        },
    );
    then.eventually(
        "the good release promoted: stable at the new revision with all 5 pods",
        Duration::from_secs(20),
        |t| {
            let rollout = t.rollout();
            let replicas = t.replicas_by_hash();
            (rollout.is_healthy()
                && rollout.stable_hash() == good
                && replicas.get(&good) == Some(&(5, 5)))
            .then_some(())
        },
    );

    // A release failing 20% of its requests.
    s.when().manifest(
        "s10-rollout-experiment.yaml",
        &[("VERSION", "3"), ("ERROR_RATE", BAD_ERROR_RATE)],
    );
    let bad = then.new_revision(&good, Duration::from_secs(10));
    let failed = experiment(
        s,
        &bad,
        &["Successful", "Failed", "Error", "Inconclusive"],
        Duration::from_secs(60),
    );
    let run = judge_run(s, &failed);
    print_figures("a release failing 20% of its requests", &run);
    let phases = run.measurement_phases(METRIC);
    let verdicts = verdicts(&run);
    then.holds(
        failed["status"]["phase"] == "Failed"
            && run.phase() == "Failed"
            && phases == ["Failed"; CONSECUTIVE_FAILURE_LIMIT]
            && verdicts == ["High"; CONSECUTIVE_FAILURE_LIMIT],
        || {
            format!(
                "the experiment ended {} and its judge run {} with measurements {phases:?} \
                 (verdicts {verdicts:?}); want both Failed after {CONSECUTIVE_FAILURE_LIMIT} \
                 High verdicts:\n{}",
                failed["status"]["phase"],
                run.phase(),
                serde_json::to_string_pretty(&run.0["status"]).unwrap_or_default()
            )
        },
    );
    let rollout = then.eventually(
        "the abort back to stable: all 5 pods on the good release, none on the bad",
        Duration::from_secs(20),
        |t| {
            let rollout = t.rollout();
            let replicas = t.replicas_by_hash();
            let back = rollout.aborted()
                && rollout.phase() == "Degraded"
                && rollout.stable_hash() == good
                && replicas.get(&good) == Some(&(5, 5))
                && replicas.get(&bad).is_none_or(|counts| *counts == (0, 0));
            back.then_some(rollout)
        },
    );
    then.holds(
        rollout
            .message()
            .contains("Experiment analysis phase is error/failed"),
        || {
            format!(
                "the status message should say the experiment failed: {:?}",
                rollout.message()
            )
        },
    );
}

#[test]
fn scenario_10_on_kube_sim() {
    the_judge_compares_the_canary_with_a_fresh_baseline(&Scenario::on_sim(
        "scenario_10_experiment_fresh_baseline",
        "web",
    ));
}

#[test]
fn scenario_10_on_a_real_cluster() {
    if let Some(s) = Scenario::on_real_cluster("scenario_10_experiment_fresh_baseline", "web") {
        the_judge_compares_the_canary_with_a_fresh_baseline(&s);
    }
}
