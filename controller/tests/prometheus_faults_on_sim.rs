//! Prometheus down during a canary's analysis step, with the real `rollouts-controller` binary
//! on kube-sim and the Prometheus stand-in stopped (connection refused) while the step's run
//! measures. Down for fewer errors in a row than `consecutiveErrorLimit`, then back: the run
//! goes on and the canary is promoted. Down past the limit: the run ends in Error and, as in
//! Argo Rollouts, the update is aborted back to stable.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::{Api, ListParams};
use rollouts_crds::analysis::{AnalysisPhase, AnalysisRun, MetricResult};
use rollouts_e2e::fake_prometheus::FakePrometheus;
use serde_json::json;

use support::{Controller, NAMESPACE, Sim, canary_rollout, eventually};

/// An Error measurement is retried after 10 seconds (as in Argo), so a run that errors out
/// takes tens of seconds.
const DEADLINE: Duration = Duration::from_secs(90);
const QUERY: &str = "sum(rate(http_requests_total{code=\"500\"}[1m]))";

/// kube-sim, the stand-in answering 0.01 (a good release), the controller, and Rollout `web`
/// of 2 pods Healthy on `app:v1` whose steps are 50%, then an analysis of template
/// `error-rate` (measured every second, twice, `consecutiveErrorLimit: 1`). Returns the
/// stable hash too.
async fn start(name: &str) -> (Sim, FakePrometheus, Controller, String) {
    let sim = Sim::start_named("rollouts-prometheus-faults", name);
    let prometheus = FakePrometheus::start().await;
    prometheus.values(QUERY, &["0.01"]);
    let controller = Controller::start(&sim.kubeconfig, DEADLINE);
    sim.create_template(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AnalysisTemplate",
        "metadata": {"name": "error-rate", "namespace": NAMESPACE},
        "spec": {"metrics": [{
            "name": "error-rate",
            "interval": "1s",
            "count": 2,
            "consecutiveErrorLimit": 1,
            "successCondition": "result[0] < 0.05",
            "provider": {"prometheus": {
                "address": prometheus.address,
                "query": QUERY,
                "timeout": 1,
            }},
        }]},
    }))
    .await;
    sim.create_rollout(canary_rollout(
        "web",
        2,
        "app:v1",
        json!([
            {"setWeight": 50},
            {"analysis": {"templates": [{"templateName": "error-rate"}]}},
        ]),
    ))
    .await;
    let stable = sim.wait_healthy(DEADLINE, "web", 2).await.current_pod_hash;
    (sim, prometheus, controller, stable)
}

/// The step analysis runs of `web`.
async fn step_runs(sim: &Sim) -> Vec<AnalysisRun> {
    Api::<AnalysisRun>::namespaced(sim.client.clone(), NAMESPACE)
        .list(&ListParams::default().labels("rollout-type=Step"))
        .await
        .expect("lists AnalysisRuns")
        .items
}

/// The metric result of the one step run, once there is one.
async fn step_result(sim: &Sim) -> Option<MetricResult> {
    let runs = step_runs(sim).await;
    assert!(
        runs.len() <= 1,
        "one run for the one analysis step: {runs:#?}"
    );
    runs.first()?
        .status
        .as_ref()?
        .metric_results
        .first()
        .cloned()
}

/// `web`'s ReplicaSets by pod-template hash (their names are `web-<hash>`): (spec.replicas,
/// availableReplicas).
async fn by_hash(sim: &Sim) -> BTreeMap<String, (i32, i32)> {
    sim.replica_sets("web")
        .await
        .into_iter()
        .map(|(name, counts)| (name.trim_start_matches("web-").to_string(), counts))
        .collect()
}

fn phases(result: &MetricResult) -> Vec<AnalysisPhase> {
    result.measurements.iter().map(|m| m.phase).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_down_for_less_than_the_error_limit_then_back_promotes_the_canary() {
    let (sim, prometheus, _controller, v1) = start("back").await;
    prometheus.stop_and_wait().await;
    sim.set_image("web", "app:v2").await;

    // The first measurement errors; the next one comes 10 seconds later, by when the stand-in
    // is back.
    eventually(DEADLINE, "an Error measurement", || async {
        step_result(&sim)
            .await
            .filter(|result| result.consecutive_error >= 1)
    })
    .await;
    prometheus.resume().await;

    let status = sim.wait_healthy(DEADLINE, "web", 2).await;
    assert_ne!(status.current_pod_hash, v1, "v2 is promoted");
    assert!(!status.abort, "{status:#?}");
    let runs = step_runs(&sim).await;
    assert_eq!(runs.len(), 1);
    let run = runs[0].status.clone().unwrap_or_default();
    assert_eq!(run.phase, AnalysisPhase::Successful, "{run:#?}");
    let result = &run.metric_results[0];
    use AnalysisPhase::{Error, Successful};
    assert_eq!(
        phases(result),
        [Error, Successful, Successful],
        "{result:#?}"
    );
    assert_eq!(
        (result.error, result.consecutive_error, result.successful),
        (1, 0, 2)
    );
    assert_eq!(
        by_hash(&sim).await,
        BTreeMap::from([(v1, (0, 0)), (status.current_pod_hash, (2, 2))])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_down_past_the_error_limit_aborts_the_update() {
    let (sim, prometheus, _controller, v1) = start("down").await;
    prometheus.stop_and_wait().await;
    sim.set_image("web", "app:v2").await;

    let status = eventually(DEADLINE, "an abort back to stable", || async {
        let status = sim.status("web").await;
        let done = status.abort
            && status.phase == "Degraded"
            && status.stable_rs == v1
            && status.current_pod_hash != v1
            && by_hash(&sim).await.get(&status.current_pod_hash) == Some(&(0, 0))
            && by_hash(&sim).await.get(&v1) == Some(&(2, 2));
        done.then_some(status)
    })
    .await;
    let progressing = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Progressing")
        .expect("a Progressing condition");
    assert_eq!(progressing.reason, "RolloutAborted");
    assert!(
        progressing
            .message
            .contains("Step-based analysis phase error/failed")
            && progressing
                .message
                .contains("consecutiveErrors (2) > consecutiveErrorLimit (1)"),
        "{progressing:?}"
    );

    let runs = step_runs(&sim).await;
    assert_eq!(runs.len(), 1);
    let run = runs[0].status.clone().unwrap_or_default();
    assert_eq!(run.phase, AnalysisPhase::Error, "{run:#?}");
    let result = &run.metric_results[0];
    use AnalysisPhase::Error;
    assert_eq!(phases(result), [Error, Error], "{result:#?}");
    assert_eq!((result.error, result.successful), (2, 0));
    assert!(
        result.measurements[0]
            .message
            .contains("Connection refused"),
        "{result:#?}"
    );
}
