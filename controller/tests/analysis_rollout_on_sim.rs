//! The Rollout side of analysis, measured for real: the `rollouts-controller` binary (Rollout
//! and AnalysisRun controllers) against kube-sim started in-process, with the AnalysisRuns
//! measured against a Prometheus stand-in on 127.0.0.1 whose answer each test controls. A
//! good metric promotes a canary past its analysis step; a bad one aborts it back to stable
//! after exactly `consecutiveFailureLimit` bad measurements; a background analysis from
//! `startingStep` aborts mid-rollout when the metric turns bad, and is terminated when an update
//! completes; run history limits delete old runs. Each test has its own simulator, stand-in
//! and controller, so they run in parallel.

mod support;

use std::collections::BTreeMap;
use std::ops::Deref;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use rollouts_crds::analysis::{AnalysisPhase, AnalysisRun, AnalysisTemplate, MetricResult};
use rollouts_crds::rollout::{Rollout, RolloutStatus};
use rollouts_e2e::fake_prometheus::FakePrometheus;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use support::{NAMESPACE, Sim};

const DEADLINE: Duration = Duration::from_secs(40);
/// The query of every test's AnalysisTemplate.
const ERROR_RATE: &str = "sum(rate(http_requests_total{code=\"500\"}[1m]))";

/// kube-sim with our CRDs, the Prometheus stand-in, and the controller binary using both.
struct Harness {
    sim: Sim,
    prometheus: FakePrometheus,
    controller: Child,
}

impl Deref for Harness {
    type Target = Sim;

    fn deref(&self) -> &Sim {
        &self.sim
    }
}

impl Harness {
    async fn start(name: &str) -> Self {
        let sim = Sim::start_named("rollouts-analysis-rollout", name);
        let prometheus = FakePrometheus::start().await;
        let log = std::fs::File::create(sim.dir.0.join("controller.log")).expect("creates the log");
        let controller = Command::new(env!("CARGO_BIN_EXE_rollouts-controller"))
            .arg("--kubeconfig")
            .arg(&sim.kubeconfig)
            .args([
                "--leader-elect=false",
                "--metrics-addr",
                "127.0.0.1:0",
                "--health-addr",
                "127.0.0.1:0",
                "--log-level",
                "info",
                "--prometheus-address",
                &prometheus.address,
            ])
            .env_remove("RUST_LOG")
            .env_remove("ROLLOUTS_NAMESPACE")
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("starts rollouts-controller");
        Self {
            sim,
            prometheus,
            controller,
        }
    }

    fn runs(&self) -> Api<AnalysisRun> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    /// An AnalysisTemplate `error-rate` measuring [`ERROR_RATE`] every second; `fields` add to
    /// or override its one metric.
    async fn create_template(&self, fields: Value) {
        let mut metric = json!({
            "name": "error-rate",
            "interval": "1s",
            "successCondition": "result[0] < 0.05",
            "provider": {"prometheus": {"query": ERROR_RATE}},
        });
        for (key, value) in fields.as_object().cloned().unwrap_or_default() {
            metric[key] = value;
        }
        let template: AnalysisTemplate = serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "AnalysisTemplate",
            "metadata": {"name": "error-rate", "namespace": NAMESPACE},
            "spec": {"metrics": [metric]},
        }))
        .expect("a valid AnalysisTemplate");
        Api::<AnalysisTemplate>::namespaced(self.client.clone(), NAMESPACE)
            .create(&PostParams::default(), &template)
            .await
            .expect("creates the AnalysisTemplate");
    }

    /// A canary Rollout `web` of `replicas` pods of `app:v1`; `canary` adds to its strategy.
    async fn create_rollout(&self, replicas: i32, canary: Value, analysis: Value) {
        let rollout: Rollout = serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Rollout",
            "metadata": {"name": "web", "namespace": NAMESPACE},
            "spec": {
                "replicas": replicas,
                "analysis": analysis,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "app", "image": "app:v1"}]}
                },
                "strategy": {"canary": canary}
            }
        }))
        .expect("a valid Rollout");
        self.rollouts()
            .create(&PostParams::default(), &rollout)
            .await
            .expect("creates the Rollout");
    }

    async fn status(&self) -> RolloutStatus {
        self.rollouts()
            .get("web")
            .await
            .expect("reads the Rollout")
            .status
            .unwrap_or_default()
    }

    async fn set_image(&self, image: &str) {
        self.sim.set_image("web", image).await;
    }

    /// `kubectl rollouts promote`: clears the pause conditions.
    async fn promote(&self) {
        self.sim
            .patch_status("web", json!({"pauseConditions": null}))
            .await;
    }

    /// The Rollout's ReplicaSets by pod-template hash: (spec.replicas, availableReplicas).
    async fn replica_sets(&self) -> BTreeMap<String, (i32, i32)> {
        let api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), NAMESPACE);
        api.list(&ListParams::default())
            .await
            .expect("lists ReplicaSets")
            .items
            .iter()
            .map(|rs| {
                let hash = rs
                    .labels()
                    .get("rollouts-pod-template-hash")
                    .cloned()
                    .unwrap_or_default();
                let replicas = rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                let available = rs
                    .status
                    .as_ref()
                    .and_then(|s| s.available_replicas)
                    .unwrap_or(0);
                (hash, (replicas, available))
            })
            .collect()
    }

    /// The runs of `web` with the `rollout-type` label `rollout_type`, oldest first.
    async fn runs_of_type(&self, rollout_type: &str) -> Vec<AnalysisRun> {
        let mut runs = self
            .runs()
            .list(&ListParams::default().labels(&format!("rollout-type={rollout_type}")))
            .await
            .expect("lists AnalysisRuns")
            .items;
        runs.sort_by_key(|run| run.metadata.creation_timestamp.clone().map(|t| t.0));
        runs
    }

    /// Waits until `web` is Healthy on its current revision with all pods; returns the hash.
    async fn healthy(&self, replicas: i32) -> String {
        self.eventually("web Healthy", || async {
            let status = self.status().await;
            let done = status.phase == "Healthy"
                && !status.current_pod_hash.is_empty()
                && status.stable_rs == status.current_pod_hash
                && status.available_replicas == replicas
                && status.replicas == replicas;
            done.then_some(status.current_pod_hash)
        })
        .await
    }

    /// Sets a new image and waits for the new revision's hash.
    async fn update_to(&self, image: &str, from: &str) -> String {
        self.set_image(image).await;
        self.eventually("the new revision's hash", || async {
            let hash = self.status().await.current_pod_hash;
            (hash != from).then_some(hash)
        })
        .await
    }

    /// Waits until the update is aborted back to `stable` (all `replicas` pods, canary at 0)
    /// and Degraded; returns the status.
    async fn aborted_to(&self, stable: &str, canary: &str, replicas: i32) -> RolloutStatus {
        let want = BTreeMap::from([
            (stable.to_string(), (replicas, replicas)),
            (canary.to_string(), (0, 0)),
        ]);
        self.eventually("an abort back to stable", || async {
            let status = self.status().await;
            let done = status.abort
                && status.phase == "Degraded"
                && status.stable_rs == stable
                && self.replica_sets().await == want;
            done.then_some(status)
        })
        .await
    }

    /// Polls `check` until it gives a value; fails after [`DEADLINE`] with the controller's log.
    async fn eventually<T, F, Fut>(&self, what: &str, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let log = || {
            let log =
                std::fs::read_to_string(self.sim.dir.0.join("controller.log")).unwrap_or_default();
            format!("; controller log:\n{log}")
        };
        support::eventually_with_log(DEADLINE, Duration::from_millis(100), what, log, check).await
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = self.controller.start_kill();
    }
}

/// Steps: 50%, then an analysis step running the `error-rate` template.
fn analysis_step_canary() -> Value {
    json!({"steps": [
        {"setWeight": 50},
        {"analysis": {"templates": [{"templateName": "error-rate"}]}},
    ]})
}

fn only_result(run: &AnalysisRun) -> MetricResult {
    let status = run.status.clone().unwrap_or_default();
    assert_eq!(status.metric_results.len(), 1, "{status:#?}");
    status.metric_results[0].clone()
}

fn values(result: &MetricResult) -> Vec<&str> {
    result
        .measurements
        .iter()
        .map(|m| m.value.as_str())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_metric_promotes_the_canary_past_its_analysis_step() {
    let h = Harness::start("good").await;
    h.prometheus.values(ERROR_RATE, &["0.01"]);
    h.create_template(json!({"count": 2})).await;
    h.create_rollout(2, analysis_step_canary(), json!({})).await;
    let v1 = h.healthy(2).await;
    assert!(
        h.runs_of_type("Step").await.is_empty(),
        "no run on the initial deploy"
    );

    let v2 = h.update_to("app:v2", &v1).await;
    assert_eq!(h.healthy(2).await, v2);
    let runs = h.runs_of_type("Step").await;
    assert_eq!(runs.len(), 1, "one run for the one analysis step");
    let run = &runs[0];
    assert_eq!(run.labels().get("rollouts-pod-template-hash"), Some(&v2));
    assert_eq!(
        run.annotations()
            .get("rollout.argoproj.io/revision")
            .map(String::as_str),
        Some("2"),
        "the run names the revision it analyses, so tools group it under that revision"
    );
    assert_eq!(
        run.labels().get("step-index").map(String::as_str),
        Some("1")
    );
    assert_eq!(
        run.status.clone().unwrap_or_default().phase,
        AnalysisPhase::Successful
    );
    let result = only_result(run);
    assert_eq!((result.count, result.successful), (2, 2), "{result:#?}");
    assert_eq!(values(&result), ["[0.01]", "[0.01]"]);
    assert_eq!(
        h.replica_sets().await,
        BTreeMap::from([(v1, (0, 0)), (v2, (2, 2))])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_metric_aborts_to_stable_after_exactly_the_consecutive_failure_limit() {
    let h = Harness::start("bad").await;
    h.create_template(json!({"consecutiveFailureLimit": 3}))
        .await;
    h.create_rollout(2, analysis_step_canary(), json!({})).await;
    let v1 = h.healthy(2).await;
    // Two bad, one good (the streak resets), then three bad in a row fail the run.
    h.prometheus.values(
        ERROR_RATE,
        &["0.5", "0.5", "0.01", "0.5", "0.5", "0.5", "0.01"],
    );

    let v2 = h.update_to("app:v2", &v1).await;
    let status = h.aborted_to(&v1, &v2, 2).await;
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
            && progressing.message.contains("\"error-rate\""),
        "the message names the metric: {progressing:?}"
    );
    assert!(status.message.contains("error-rate"), "{status:?}");

    let runs = h.runs_of_type("Step").await;
    assert_eq!(runs.len(), 1);
    let run_status = runs[0].status.clone().unwrap_or_default();
    assert_eq!(run_status.phase, AnalysisPhase::Failed, "{run_status:#?}");
    let result = only_result(&runs[0]);
    assert_eq!(
        (
            result.count,
            result.successful,
            result.failed,
            result.consecutive_failure
        ),
        (6, 1, 5, 3),
        "{result:#?}"
    );
    assert_eq!(
        values(&result),
        ["[0.5]", "[0.5]", "[0.01]", "[0.5]", "[0.5]", "[0.5]"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_analysis_from_starting_step_aborts_mid_rollout() {
    let h = Harness::start("background").await;
    h.prometheus.values(ERROR_RATE, &["0.01"]);
    h.create_template(json!({"consecutiveFailureLimit": 2}))
        .await;
    let canary = json!({
        "analysis": {"templates": [{"templateName": "error-rate"}], "startingStep": 1},
        "steps": [{"setWeight": 25}, {"pause": {}}, {"setWeight": 50}, {"pause": {}}],
    });
    h.create_rollout(4, canary, json!({})).await;
    let v1 = h.healthy(4).await;
    assert!(h.runs_of_type("Background").await.is_empty());

    let v2 = h.update_to("app:v2", &v1).await;
    // Paused at step 1 with the background run measuring good values.
    let run = h
        .eventually("a background run with good measurements", || async {
            let status = h.status().await;
            let runs = h.runs_of_type("Background").await;
            let run = runs.first()?;
            let measured = run
                .status
                .as_ref()
                .and_then(|s| s.metric_results.first())
                .is_some_and(|r| r.successful >= 2);
            (status.current_step_index == Some(1) && measured).then(|| run.clone())
        })
        .await;
    assert_eq!(run.labels().get("rollouts-pod-template-hash"), Some(&v2));
    assert!(!run.labels().contains_key("step-index"));
    assert_eq!(
        h.status()
            .await
            .canary
            .current_background_analysis_run_status
            .map(|pointer| pointer.name),
        Some(run.name_any())
    );
    h.promote().await;
    h.eventually("step 3, the second pause", || async {
        (h.status().await.current_step_index == Some(3)).then_some(())
    })
    .await;
    assert_eq!(
        h.runs_of_type("Background").await.len(),
        1,
        "one run throughout"
    );

    h.prometheus.values(ERROR_RATE, &["0.5"]);
    let status = h.aborted_to(&v1, &v2, 4).await;
    let progressing = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Progressing")
        .expect("a Progressing condition");
    assert!(
        progressing
            .message
            .contains("Background analysis phase error/failed")
            && progressing.message.contains("\"error-rate\""),
        "{progressing:?}"
    );
    let runs = h.runs_of_type("Background").await;
    assert_eq!(runs.len(), 1);
    let result = only_result(&runs[0]);
    assert_eq!(result.phase, AnalysisPhase::Failed, "{result:#?}");
    assert_eq!(result.consecutive_failure, 2, "{result:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_limits_delete_the_older_runs() {
    let h = Harness::start("history").await;
    h.prometheus.values(ERROR_RATE, &["0.01"]);
    h.create_template(json!({"count": 1})).await;
    h.create_rollout(
        1,
        analysis_step_canary(),
        json!({"successfulRunHistoryLimit": 1, "unsuccessfulRunHistoryLimit": 1}),
    )
    .await;
    let mut stable = h.healthy(1).await;
    let mut names = Vec::new();
    for image in ["app:v2", "app:v3"] {
        let next = h.update_to(image, &stable).await;
        assert_eq!(h.healthy(1).await, next);
        let runs = h.runs_of_type("Step").await;
        let run = runs
            .iter()
            .find(|run| run.labels().get("rollouts-pod-template-hash") == Some(&next))
            .expect("a run of the new revision");
        names.push(run.name_any());
        stable = next;
    }
    let kept = h
        .eventually("only the newest successful run left", || async {
            let runs = h.runs_of_type("Step").await;
            (runs.len() == 1).then(|| runs[0].name_any())
        })
        .await;
    assert_eq!(kept, names[1], "the older run {} is deleted", names[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_run_is_terminated_when_the_rollout_completes() {
    let h = Harness::start("complete").await;
    h.prometheus.values(ERROR_RATE, &["0.01"]);
    h.create_template(json!({})).await;
    let canary = json!({
        "analysis": {"templates": [{"templateName": "error-rate"}]},
        "steps": [{"setWeight": 50}, {"pause": {"duration": "2s"}}],
    });
    h.create_rollout(2, canary, json!({})).await;
    let v1 = h.healthy(2).await;
    let v2 = h.update_to("app:v2", &v1).await;
    assert_eq!(h.healthy(2).await, v2);
    let run = h
        .eventually("the background run stopped", || async {
            let runs = h.runs_of_type("Background").await;
            let run = runs.first()?;
            let stopped = run.spec.terminate
                && run
                    .status
                    .as_ref()
                    .is_some_and(|status| status.phase.is_completed());
            stopped.then(|| run.clone())
        })
        .await;
    let status = run.status.clone().unwrap_or_default();
    assert_eq!(status.phase, AnalysisPhase::Successful, "{status:#?}");
    assert_eq!(h.runs_of_type("Background").await.len(), 1);
    assert!(
        h.status()
            .await
            .canary
            .current_background_analysis_run_status
            .is_none()
    );
}
