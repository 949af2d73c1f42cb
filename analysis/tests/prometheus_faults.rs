//! Prometheus faults during analysis: the whole loop a controller runs for an AnalysisRun
//! (plan, measure, conclude, requeue, on an injected clock) against the Prometheus stand-in
//! while it is stopped (connection refused), answers 503, answers after the metric's timeout,
//! answers an empty vector, or answers NaN; for the Prometheus provider and the baseline judge.
//! Each fault gives the outcome `docs/analysis-limits.md` ("Prometheus faults") documents, never
//! a false Successful, and a Prometheus that comes back before `consecutiveErrorLimit` lets the
//! analysis go on as if nothing happened.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use rollouts_analysis::engine::{self, Plan};
use rollouts_analysis::provider::{
    self, BaselineJudgeProvider, MetricProvider, PrometheusProvider, RunContext,
};
use rollouts_crds::analysis::{AnalysisPhase, AnalysisRun, AnalysisRunStatus, MetricResult};
use rollouts_e2e::fake_prometheus::{FakePrometheus, Reply};
use serde_json::{Value, json};

const QUERY: &str = "sum(rate(http_requests_total{code=\"500\"}[1m]))";
const JUDGE_QUERY: &str = "errors{hash=\"{{hash}}\"}";
const CANARY_QUERY: &str = "errors{hash=\"canary1\"}";
const BASELINE_QUERY: &str = "errors{hash=\"stable1\"}";
/// Ten samples a side, the same on both: a Pass.
const SAMPLES: &str = "0.010,0.011,0.009,0.010,0.012,0.010,0.011,0.009,0.010,0.011";
const START: &str = "2024-05-01T10:00:00Z";

/// A run of one metric `error-rate` measuring every second, three times, with
/// `consecutiveErrorLimit: 2`; `fields` add to or override the metric.
fn run(fields: Value) -> AnalysisRun {
    let mut metric = json!({
        "name": "error-rate",
        "interval": "1s",
        "count": 3,
        "consecutiveErrorLimit": 2,
    });
    for (key, value) in fields.as_object().cloned().unwrap_or_default() {
        metric[key] = value;
    }
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AnalysisRun",
        "metadata": {"name": "web-6c4b8d9f5-2-1", "namespace": "shop"},
        "spec": {"metrics": [metric]},
    }))
    .expect("a valid AnalysisRun")
}

/// A Prometheus metric on `address` asking "error rate under 5%?".
fn prometheus_run(address: &str, fields: Value) -> AnalysisRun {
    let mut metric = json!({
        "successCondition": "result[0] < 0.05",
        "provider": {"prometheus": {"address": address, "query": QUERY, "timeout": 1}},
    });
    for (key, value) in fields.as_object().cloned().unwrap_or_default() {
        metric[key] = value;
    }
    run(metric)
}

/// A baseline judge metric on `address`; `judge` adds to or overrides `provider.judge`.
fn judge_run(address: &str, judge: Value) -> AnalysisRun {
    let mut provider = json!({
        "prometheus": {"address": address, "timeout": 1},
        "query": JUDGE_QUERY,
        "canary": "canary1",
        "baseline": "stable1",
        "window": "5m",
        "step": "15s",
        "direction": "increase",
        "minSamples": 8,
    });
    for (key, value) in judge.as_object().cloned().unwrap_or_default() {
        provider[key] = value;
    }
    run(json!({
        "successCondition": "result.verdict != \"High\"",
        "provider": {"judge": provider},
    }))
}

/// A run being measured on an injected clock.
struct Driver<'a> {
    run: AnalysisRun,
    provider: &'a dyn MetricProvider,
    status: AnalysisRunStatus,
    now: Timestamp,
    passes: usize,
}

impl<'a> Driver<'a> {
    fn new(run: AnalysisRun, provider: &'a dyn MetricProvider) -> Self {
        Self {
            run,
            provider,
            status: AnalysisRunStatus::default(),
            now: START.parse().expect("time"),
            passes: 0,
        }
    }

    /// One reconcile, then the clock moves to the time it asks to be woken at.
    async fn pass(&mut self) {
        self.passes += 1;
        assert!(
            self.passes <= 20,
            "the run never finished: {:#?}",
            self.status
        );
        let schedule = match engine::plan(&self.run.spec, &self.status, self.now) {
            Plan::Completed => panic!("reconciled a finished run: {:#?}", self.status),
            Plan::Invalid { message } => panic!("an invalid run: {message}"),
            Plan::Measure(schedule) => schedule,
        };
        let context = RunContext {
            namespace: "shop",
            run_name: "web-6c4b8d9f5-2-1",
            run_uid: "6c1c0a52-0000-4000-8000-000000000001",
            measurement_number: 1,
            now: self.now,
        };
        let mut taken = Vec::new();
        for task in &schedule.tasks {
            taken.push(provider::take(self.provider, context, task, &task.metric).await);
        }
        let outcome = engine::conclude(&self.run.spec, &self.status, &schedule, taken, self.now);
        self.status = outcome.status;
        if let Some(next) = outcome.requeue_at {
            self.now = next;
        }
    }

    /// Passes until the metric has `n` finished measurements.
    async fn measured(&mut self, n: usize) {
        while finished(&self.status) < n {
            self.pass().await;
        }
    }

    /// Passes until the run is over; its status.
    async fn finish(&mut self) -> AnalysisRunStatus {
        while !self.status.phase.is_completed() {
            self.pass().await;
        }
        self.status.clone()
    }
}

fn finished(status: &AnalysisRunStatus) -> usize {
    status.metric_results.first().map_or(0, |result| {
        result
            .measurements
            .iter()
            .filter(|m| m.phase.is_completed())
            .count()
    })
}

fn only_result(status: &AnalysisRunStatus) -> &MetricResult {
    assert_eq!(status.metric_results.len(), 1, "{status:#?}");
    &status.metric_results[0]
}

fn phases(result: &MetricResult) -> Vec<AnalysisPhase> {
    result.measurements.iter().map(|m| m.phase).collect()
}

/// The run ended Error after three Error measurements in a row (`consecutiveErrorLimit: 2`),
/// each saying `why`; nothing was counted Successful.
fn errored_after_the_limit(status: &AnalysisRunStatus, why: &str) {
    use AnalysisPhase::Error;
    assert_eq!(status.phase, Error, "{status:#?}");
    assert!(
        status
            .message
            .contains("consecutiveErrors (3) > consecutiveErrorLimit (2)"),
        "{}",
        status.message
    );
    let result = only_result(status);
    assert_eq!(phases(result), [Error, Error, Error], "{result:#?}");
    assert_eq!(
        (result.error, result.consecutive_error, result.successful),
        (3, 3, 0)
    );
    for measurement in &result.measurements {
        assert!(
            measurement.message.contains(why),
            "{why:?} not in {:?}",
            measurement.message
        );
    }
}

/// Two Error measurements, then three Successful: the run is Successful and the error streak
/// was reset by the first success.
fn recovered(status: &AnalysisRunStatus) {
    use AnalysisPhase::{Error, Successful};
    assert_eq!(status.phase, Successful, "{status:#?}");
    let result = only_result(status);
    assert_eq!(
        phases(result),
        [Error, Error, Successful, Successful, Successful],
        "{result:#?}"
    );
    assert_eq!(
        (
            result.error,
            result.consecutive_error,
            result.successful,
            result.count
        ),
        (2, 0, 3, 3)
    );
}

fn prometheus() -> PrometheusProvider {
    PrometheusProvider::new().expect("http clients")
}

fn judge() -> BaselineJudgeProvider {
    BaselineJudgeProvider::new(prometheus())
}

fn status_503() -> Reply {
    Reply::Status(503, "no healthy upstream".into())
}

#[tokio::test]
async fn a_stopped_prometheus_is_an_error_and_the_run_errors_after_the_limit() {
    let server = FakePrometheus::start().await;
    server.stop_and_wait().await;
    let provider = prometheus();
    let mut driver = Driver::new(prometheus_run(&server.address, json!({})), &provider);
    let status = driver.finish().await;
    errored_after_the_limit(&status, "Connection refused");
}

#[tokio::test]
async fn a_prometheus_back_before_the_limit_resets_the_error_streak() {
    let server = FakePrometheus::start().await;
    server.values(QUERY, &["0.01"]);
    server.stop_and_wait().await;
    let provider = prometheus();
    let mut driver = Driver::new(prometheus_run(&server.address, json!({})), &provider);
    driver.measured(2).await;
    assert_eq!(only_result(&driver.status).consecutive_error, 2);
    server.resume().await;
    recovered(&driver.finish().await);
}

#[tokio::test]
async fn answers_of_503_are_errors_and_the_run_errors_after_the_limit() {
    let server = FakePrometheus::start().await;
    server.replies(QUERY, &[status_503()]);
    let provider = prometheus();
    let mut driver = Driver::new(prometheus_run(&server.address, json!({})), &provider);
    errored_after_the_limit(
        &driver.finish().await,
        "prometheus answered 503 Service Unavailable with a body that is not a query result: no healthy upstream",
    );

    // Prometheus' own 503 (a query result of status "error") is an Error too.
    let server = FakePrometheus::start().await;
    server.replies(
        QUERY,
        &[Reply::Status(
            503,
            r#"{"status":"error","errorType":"unavailable","error":"too many queries in flight"}"#
                .into(),
        )],
    );
    let mut driver = Driver::new(prometheus_run(&server.address, json!({})), &provider);
    errored_after_the_limit(&driver.finish().await, "too many queries in flight");
}

#[tokio::test]
async fn two_503s_then_answers_give_a_successful_run() {
    let server = FakePrometheus::start().await;
    server.replies(
        QUERY,
        &[status_503(), status_503(), Reply::Value("0.01".into())],
    );
    let provider = prometheus();
    let mut driver = Driver::new(prometheus_run(&server.address, json!({})), &provider);
    recovered(&driver.finish().await);
}

#[tokio::test]
async fn an_answer_after_the_timeout_is_an_error_and_a_timely_one_counts_again() {
    let late = Reply::Late(Duration::from_secs(3), "0.01".into());
    let server = FakePrometheus::start().await;
    server.replies(QUERY, std::slice::from_ref(&late));
    let provider = prometheus();
    let mut driver = Driver::new(prometheus_run(&server.address, json!({})), &provider);
    errored_after_the_limit(
        &driver.finish().await,
        "prometheus query timed out after 1s",
    );

    let server = FakePrometheus::start().await;
    server.replies(QUERY, &[late.clone(), late, Reply::Value("0.01".into())]);
    let mut driver = Driver::new(prometheus_run(&server.address, json!({})), &provider);
    recovered(&driver.finish().await);
}

#[tokio::test]
async fn an_empty_vector_is_an_error_that_says_no_data() {
    let server = FakePrometheus::start().await;
    server.replies(QUERY, &[Reply::Empty]);
    let provider = prometheus();
    let mut driver = Driver::new(prometheus_run(&server.address, json!({})), &provider);
    let status = driver.finish().await;
    errored_after_the_limit(&status, "no data returned from the metric provider");

    // A condition that expects no data says what it makes of it.
    let server = FakePrometheus::start().await;
    server.replies(QUERY, &[Reply::Empty]);
    let guarded = json!({"successCondition": "len(result) > 0 && result[0] < 0.05"});
    let mut driver = Driver::new(prometheus_run(&server.address, guarded), &provider);
    let status = driver.finish().await;
    assert_eq!(status.phase, AnalysisPhase::Failed, "{status:#?}");
}

#[tokio::test]
async fn nan_never_passes_a_success_condition() {
    use AnalysisPhase::{Failed, Inconclusive, Successful};
    let server = FakePrometheus::start().await;
    server.values(QUERY, &["NaN"]);
    let provider = prometheus();
    let outcome = |fields: Value| {
        let provider = &provider;
        let run = prometheus_run(&server.address, fields);
        async move {
            let mut driver = Driver::new(run, provider);
            let status = driver.finish().await;
            let result = only_result(&status);
            assert_eq!(result.measurements[0].value, "[NaN]");
            (status.phase, result.measurements[0].phase)
        }
    };

    // A success condition compares NaN false: the measurement fails.
    assert_eq!(outcome(json!({})).await, (Failed, Failed));
    // Both conditions false: Inconclusive.
    let both = json!({"failureCondition": "result[0] >= 0.05"});
    assert_eq!(outcome(both).await, (Inconclusive, Inconclusive));
    // As in Argo, a failure condition alone does not hold for NaN, so NaN passes it...
    let failure_only = json!({"successCondition": null, "failureCondition": "result[0] >= 0.05"});
    assert_eq!(outcome(failure_only).await, (Successful, Successful));
    // ...unless the condition names NaN.
    let guarded = json!({"successCondition": null, "failureCondition": "isNaN(result[0]) || result[0] >= 0.05"});
    assert_eq!(outcome(guarded).await, (Failed, Failed));
}

#[tokio::test]
async fn the_judge_errors_while_prometheus_is_stopped_and_judges_once_it_is_back() {
    let server = FakePrometheus::start().await;
    server.values(CANARY_QUERY, &[SAMPLES]);
    server.values(BASELINE_QUERY, &[SAMPLES]);
    server.stop_and_wait().await;
    let provider = judge();
    let mut driver = Driver::new(judge_run(&server.address, json!({})), &provider);
    driver.measured(2).await;
    server.resume().await;
    let status = driver.finish().await;
    recovered(&status);
    let value: Value =
        serde_json::from_str(&only_result(&status).measurements[4].value).expect("JSON value");
    assert_eq!(value["verdict"], "Pass");

    let server = FakePrometheus::start().await;
    server.stop_and_wait().await;
    let mut driver = Driver::new(judge_run(&server.address, json!({})), &provider);
    errored_after_the_limit(&driver.finish().await, "Connection refused");
}

#[tokio::test]
async fn the_judge_errors_on_503_and_late_answers() {
    let provider = judge();
    for (fault, why) in [
        (status_503(), "503 Service Unavailable"),
        (
            Reply::Late(Duration::from_secs(3), SAMPLES.into()),
            "timed out after 1s",
        ),
    ] {
        let server = FakePrometheus::start().await;
        server.replies(CANARY_QUERY, std::slice::from_ref(&fault));
        server.replies(BASELINE_QUERY, std::slice::from_ref(&fault));
        let mut driver = Driver::new(judge_run(&server.address, json!({})), &provider);
        errored_after_the_limit(&driver.finish().await, why);

        // Back after two faults: judged again.
        let server = FakePrometheus::start().await;
        let back = Reply::Value(SAMPLES.into());
        server.replies(CANARY_QUERY, &[fault.clone(), fault.clone(), back.clone()]);
        server.replies(BASELINE_QUERY, &[fault.clone(), fault, back]);
        let mut driver = Driver::new(judge_run(&server.address, json!({})), &provider);
        recovered(&driver.finish().await);
    }
}

#[tokio::test]
async fn the_judge_gives_empty_and_nan_answers_to_the_no_data_policy() {
    use AnalysisPhase::{Failed, Inconclusive, Successful};
    let all_nan = ["NaN"; 10].join(",");
    let provider = judge();
    for (canary, policy, want) in [
        (Reply::Empty, None, Inconclusive),
        (Reply::Empty, Some("fail"), Failed),
        (Reply::Empty, Some("pass"), Successful),
        (Reply::Value(all_nan.clone()), None, Inconclusive),
        (Reply::Value(all_nan.clone()), Some("fail"), Failed),
    ] {
        let server = FakePrometheus::start().await;
        server.replies(CANARY_QUERY, std::slice::from_ref(&canary));
        server.values(BASELINE_QUERY, &[SAMPLES]);
        let judge = policy.map_or(json!({}), |policy| json!({"noData": policy}));
        let mut driver = Driver::new(judge_run(&server.address, judge), &provider);
        let status = driver.finish().await;
        assert_eq!(status.phase, want, "{canary:?} {policy:?}: {status:#?}");
        let first = &only_result(&status).measurements[0];
        assert_eq!(first.phase, want, "{canary:?} {policy:?}: {first:#?}");
        let value: Value = serde_json::from_str(&first.value).expect("JSON value");
        assert_eq!(value["verdict"], "NoData", "{canary:?}: {value}");
        assert_eq!(value["canarySamples"], 0, "{canary:?}: {value}");
    }

    // NaN counted as zero (nanHandling: zero) is data: a canary of zeros is no worse.
    let server = FakePrometheus::start().await;
    server.values(CANARY_QUERY, &[&all_nan]);
    server.values(BASELINE_QUERY, &[SAMPLES]);
    let mut driver = Driver::new(
        judge_run(&server.address, json!({"nanHandling": "zero"})),
        &provider,
    );
    let status = driver.finish().await;
    assert_eq!(status.phase, Successful, "{status:#?}");
}
