//! The baseline judge on real traffic: kube-sim's load generator sends requests to stable and
//! canary ReplicaSets whose pods answer by their SIM_ERROR_RATE, a real Prometheus scrapes the
//! pods through kube-sim's file_sd file, and the engine runs AnalysisRuns whose judge metric
//! range-queries both versions over the same window. One simulated cluster holds every
//! scenario (a namespace each), so the series warm up once and the scenarios run side by side.

mod real_prometheus_support;

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use real_prometheus_support::{Providers, TempDir, analysis_run, drive, eventually, instant_at};
use rollouts_analysis::engine;
use rollouts_crds::analysis::{AnalysisPhase, AnalysisRun, AnalysisRunStatus, MetricResult};
use rollouts_e2e::sim::traffic::prometheus::Prometheus;
use rollouts_e2e::sim::{self, SimHandle, SimOptions};
use serde_json::{Value, json};

/// Requests per second a version's Service gets: 1% of it is two errors a second.
const RPS: &str = "200";
/// The judge's window; the test waits until every series is older than it plus the rate range.
const WINDOW_SECONDS: i64 = 15;
/// The rate range of the query, in seconds: three scrapes.
const RATE_SECONDS: i64 = 3;
const RUN_DEADLINE: Duration = Duration::from_secs(30);

/// The error ratio of one version, `{{hash}}` standing for its pod-template hash.
const ERROR_RATIO: &str = "sum(rate(http_requests_total{code=\"500\",rollouts_pod_template_hash=\"{{hash}}\"}[3s])) / sum(rate(http_requests_total{rollouts_pod_template_hash=\"{{hash}}\"}[3s]))";

/// A stable and a canary version in their own namespace.
#[derive(Clone, Copy)]
struct Scenario {
    namespace: &'static str,
    stable_hash: &'static str,
    canary_hash: &'static str,
    /// Shares of requests answered 500.
    stable_errors: f64,
    canary_errors: f64,
    /// Requests per second to the canary's Service (the stable one gets [`RPS`]).
    canary_rps: &'static str,
}

/// Stable and canary both fail 1% of their requests.
const AS_BAD_AS_STABLE: Scenario = Scenario {
    namespace: "same",
    stable_hash: "5d8f7c6b4",
    canary_hash: "7b9c4d2f6",
    stable_errors: 0.01,
    canary_errors: 0.01,
    canary_rps: RPS,
};

/// The canary fails 5% of its requests, stable 1%.
const FIVE_TIMES_WORSE: Scenario = Scenario {
    namespace: "worse",
    stable_hash: "6c4b8d9f5",
    canary_hash: "9f5d6c7b8",
    stable_errors: 0.01,
    canary_errors: 0.05,
    canary_rps: RPS,
};

/// The canary's pods run but its Service gets no requests.
const NO_CANARY_TRAFFIC: Scenario = Scenario {
    namespace: "idle",
    stable_hash: "4f7c9b6d8",
    canary_hash: "8d6b5f4c9",
    stable_errors: 0.01,
    canary_errors: 0.01,
    canary_rps: "0",
};

/// kube-sim with load on and the scenarios' versions, and a real Prometheus scraping their pods;
/// dropped in field order (Prometheus first).
struct Traffic {
    prometheus: Prometheus,
    _sim: SimHandle,
    _dir: TempDir,
}

impl Traffic {
    /// Each scenario's stable (2 pods) and canary (1 pod) versions, each behind its own Service;
    /// returns once every pod's series is older than the judge's window plus the rate range.
    fn start(scenarios: &[Scenario]) -> Traffic {
        let dir = TempDir::new("judge");
        let sd_file = dir.0.join("targets.json");
        let sim = sim::start(SimOptions {
            prometheus_sd_file: Some(sd_file.clone()),
            pod_ready_after: Duration::from_millis(100),
            ..SimOptions::default()
        })
        .expect("kube-sim starts on a loopback port");
        for s in scenarios {
            sim.create(
                "",
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": s.namespace}}),
            )
            .expect("namespace created");
            version(&sim, s.namespace, s.stable_hash, 2, s.stable_errors, RPS);
            version(
                &sim,
                s.namespace,
                s.canary_hash,
                1,
                s.canary_errors,
                s.canary_rps,
            );
        }
        let pods = 3 * scenarios.len();
        eventually(
            &format!("{pods} pod targets in the file_sd file"),
            Duration::from_secs(10),
            || {
                let text = std::fs::read_to_string(&sd_file).ok()?;
                let targets: Value = serde_json::from_str(&text).ok()?;
                (targets.as_array()?.len() == pods).then_some(())
            },
        );
        let prometheus = Prometheus::start(&sd_file).unwrap_or_else(|e| panic!("{e}"));
        // Rates are exact once every series is older than the window plus the rate's range.
        let wanted = WINDOW_SECONDS + RATE_SECONDS;
        let full = format!(
            "min(count_over_time(http_requests_total[{}s])) and on() count(http_requests_total) == {}",
            wanted + 1,
            2 * pods
        );
        eventually(
            &format!("every pod's series to cover {wanted}s"),
            Duration::from_secs(60),
            || {
                let scrapes = instant_at(&prometheus, &full, Timestamp::now().as_second())?;
                (scrapes.first().copied()? >= wanted as f64).then_some(())
            },
        );
        Traffic {
            prometheus,
            _sim: sim,
            _dir: dir,
        }
    }

    fn address(&self) -> String {
        format!("http://{}", self.prometheus.address())
    }
}

/// A ReplicaSet of `app: web` pods with a template hash and SIM_ERROR_RATE, and a Service for
/// exactly its pods receiving `rps` requests a second.
fn version(sim: &SimHandle, namespace: &str, hash: &str, replicas: u32, errors: f64, rps: &str) {
    let labels = json!({"app": "web", "rollouts-pod-template-hash": hash});
    sim.create(
        namespace,
        json!({
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": format!("web-{hash}"), "labels": labels},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{
                        "name": "web",
                        "image": "web:1",
                        "env": [{"name": "SIM_ERROR_RATE", "value": errors.to_string()}],
                    }]},
                },
            },
        }),
    )
    .expect("ReplicaSet created");
    sim.create(
        namespace,
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": format!("web-{hash}"), "annotations": {"sim.rollouts.dev/rps": rps}},
            "spec": {"selector": labels, "ports": [{"port": 80}]},
        }),
    )
    .expect("Service created");
}

/// A run comparing the scenario's canary error ratio with its stable one, plus `judge_fields`
/// on the judge (its statistics settings).
fn judge_run(prometheus: &str, s: Scenario, count: u32, judge_fields: Value) -> AnalysisRun {
    let mut judge = json!({
        "prometheus": {"address": prometheus},
        "query": ERROR_RATIO,
        "canary": "{{args.canary-hash}}",
        "baseline": "{{args.stable-hash}}",
        "window": format!("{WINDOW_SECONDS}s"),
        "step": "1s",
        "direction": "increase",
        // Float noise on two 1% ratios must not count as an increase.
        "allowedIncrease": 1.2,
        "minSamples": 8,
    });
    if let (Some(judge), Some(fields)) = (judge.as_object_mut(), judge_fields.as_object()) {
        judge.extend(fields.clone());
    }
    analysis_run(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AnalysisRun",
        "metadata": {"name": format!("web-{}-judge", s.canary_hash), "namespace": s.namespace},
        "spec": {
            "args": [
                {"name": "canary-hash", "value": s.canary_hash},
                {"name": "stable-hash", "value": s.stable_hash},
            ],
            "metrics": [{
                "name": "errors-vs-stable",
                "interval": "1s",
                "count": count,
                "successCondition": "result.verdict != \"High\"",
                "provider": {"judge": judge},
            }],
        },
    }))
}

fn result(status: &AnalysisRunStatus) -> &MetricResult {
    status
        .metric_results
        .first()
        .unwrap_or_else(|| panic!("the run has a metric result: {status:#?}"))
}

/// The judge's outcomes (the measurement values), in order.
fn outcomes(status: &AnalysisRunStatus) -> Vec<Value> {
    result(status)
        .measurements
        .iter()
        .map(|m| serde_json::from_str(&m.value).expect("a JSON measurement value"))
        .collect()
}

async fn run_to_completion(run: &AnalysisRun) -> AnalysisRunStatus {
    let providers = Providers::new();
    let (status, _) = drive(
        run,
        &providers,
        AnalysisRunStatus::default(),
        RUN_DEADLINE,
        |_| {},
    )
    .await;
    status
}

#[tokio::test]
async fn the_baseline_judge_on_real_traffic() {
    let traffic = Traffic::start(&[AS_BAD_AS_STABLE, FIVE_TIMES_WORSE, NO_CANARY_TRAFFIC]);
    tokio::join!(
        a_canary_as_bad_as_stable_passes_where_a_fixed_threshold_fails(&traffic),
        a_canary_with_five_times_the_errors_is_high_within_two_measurements(&traffic),
        a_canary_without_traffic_is_no_data_handled_by_policy(&traffic),
    );
}

async fn a_canary_as_bad_as_stable_passes_where_a_fixed_threshold_fails(traffic: &Traffic) {
    let s = AS_BAD_AS_STABLE;
    let status = run_to_completion(&judge_run(&traffic.address(), s, 3, json!({}))).await;
    assert_eq!(status.phase, AnalysisPhase::Successful, "{status:#?}");
    let outcomes = outcomes(&status);
    assert_eq!(outcomes.len(), 3);
    for outcome in &outcomes {
        assert_eq!(outcome["verdict"], "Pass", "{outcome}");
        for side in ["canarySamples", "baselineSamples"] {
            let samples = outcome[side].as_u64().expect("a count");
            assert!(samples >= 8, "{side} {samples}: {outcome}");
        }
        // Both versions fail 1% of their requests, above a fixed 0.5% threshold.
        for side in ["canaryMean", "baselineMean"] {
            let mean = outcome[side].as_f64().expect("a mean");
            assert!((0.007..0.013).contains(&mean), "{side} {mean}: {outcome}");
        }
    }
    assert_eq!(
        result(&status).metadata["ResolvedCanaryQuery"],
        ERROR_RATIO.replace("{{hash}}", s.canary_hash)
    );

    // The same canary against a fixed threshold fails: it cannot tell the canary from stable.
    let threshold = analysis_run(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AnalysisRun",
        "metadata": {"name": format!("web-{}-threshold", s.canary_hash), "namespace": s.namespace},
        "spec": {"metrics": [{
            "name": "error-ratio",
            "count": 1,
            "successCondition": "result[0] < 0.005",
            "provider": {"prometheus": {
                "address": traffic.address(),
                "query": ERROR_RATIO
                    .replace("{{hash}}", s.canary_hash)
                    .replace("[3s]", &format!("[{WINDOW_SECONDS}s]")),
            }},
        }]},
    }));
    let status = run_to_completion(&threshold).await;
    assert_eq!(status.phase, AnalysisPhase::Failed, "{status:#?}");
    let measured = &engine::metric_result(&status, "error-ratio")
        .expect("a result")
        .measurements[0];
    let ratio: f64 = measured
        .value
        .trim_matches(['[', ']'])
        .parse()
        .unwrap_or_else(|e| panic!("{:?}: {e}", measured.value));
    assert!((0.007..0.013).contains(&ratio), "{ratio}");
}

async fn a_canary_with_five_times_the_errors_is_high_within_two_measurements(traffic: &Traffic) {
    let s = FIVE_TIMES_WORSE;
    let status = run_to_completion(&judge_run(&traffic.address(), s, 5, json!({}))).await;
    assert_eq!(status.phase, AnalysisPhase::Failed, "{status:#?}");
    let outcomes = outcomes(&status);
    assert!(
        outcomes.len() <= 2,
        "High only after {} measurements: {outcomes:#?}",
        outcomes.len()
    );
    let last = outcomes.last().expect("a measurement");
    assert_eq!(last["verdict"], "High", "{last}");
    let ratio = last["meanRatio"].as_f64().expect("a mean ratio");
    assert!((3.5..6.5).contains(&ratio), "{last}");
    assert!(last["lower"].as_f64().expect("an interval") > 0.0, "{last}");
    assert!(
        status.message.starts_with(
            "Metric \"errors-vs-stable\" assessed Failed due to failed (1) > failureLimit (0): \"Error Message: shift interval ["
        ),
        "{}",
        status.message
    );
}

async fn a_canary_without_traffic_is_no_data_handled_by_policy(traffic: &Traffic) {
    let s = NO_CANARY_TRAFFIC;
    for (policy, phase) in [
        (json!({}), AnalysisPhase::Inconclusive),
        (
            json!({"noData": "inconclusive"}),
            AnalysisPhase::Inconclusive,
        ),
        (json!({"noData": "fail"}), AnalysisPhase::Failed),
        (json!({"noData": "pass"}), AnalysisPhase::Successful),
    ] {
        let run = judge_run(&traffic.address(), s, 1, policy.clone());
        let status = run_to_completion(&run).await;
        // One measurement, so the run takes the measurement's phase.
        assert_eq!(status.phase, phase, "noData {policy}: {status:#?}");
        let taken = &result(&status).measurements[0];
        assert_eq!(taken.phase, phase, "noData {policy}: {taken:#?}");
        let outcome: Value = serde_json::from_str(&taken.value).expect("a JSON value");
        assert_eq!(outcome["verdict"], "NoData", "{outcome}");
        assert_eq!(outcome["canarySamples"], 0, "{outcome}");
        let baseline = outcome["baselineSamples"].as_u64().expect("a count");
        assert!(baseline >= 8, "{outcome}");
        assert_eq!(
            taken.message,
            format!("0 canary and {baseline} baseline samples, fewer than minSamples 8 on a side")
        );
    }
}
