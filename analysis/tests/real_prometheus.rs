//! The analysis engine's whole loop (plan, arguments, measure, conclude, requeue) driven in real
//! time against a real Prometheus that scrapes an exporter the test controls: passing,
//! failing after exactly `consecutiveFailureLimit` bad measurements in a row, `initialDelay`,
//! and Prometheus going away mid-run.

mod real_prometheus_support;

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use real_prometheus_support::{
    Exporter, GAUGE, Providers, TempDir, analysis_run, drive, instant_at, prometheus_address,
    prometheus_scraping, reconcile, wait_for_gauge,
};
use rollouts_analysis::engine;
use rollouts_crds::analysis::{AnalysisPhase, AnalysisRun, AnalysisRunStatus, MetricResult};
use serde_json::{Value, json};

const GOOD: f64 = 0.99;
const BAD: f64 = 0.8;
/// Long enough for any run here, short enough to fail fast when one hangs.
const RUN_DEADLINE: Duration = Duration::from_secs(45);

/// A run with one `success-rate` metric on the exporter's gauge, plus `fields` on the metric.
fn success_rate_run(prometheus: &str, fields: Value) -> AnalysisRun {
    let mut metric = json!({
        "name": "success-rate",
        "interval": "1s",
        "successCondition": "result[0] >= 0.95",
        "provider": {"prometheus": {
            "address": prometheus,
            "query": format!("{GAUGE}{{service=\"{{{{args.service}}}}\"}}"),
        }},
    });
    if let (Some(metric), Some(fields)) = (metric.as_object_mut(), fields.as_object()) {
        metric.extend(fields.clone());
    }
    analysis_run(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AnalysisRun",
        "metadata": {"name": "checkout-6d4f8c9b7-1", "namespace": "default"},
        "spec": {
            "args": [{"name": "service", "value": "checkout"}],
            "metrics": [metric],
        },
    }))
}

fn result(status: &AnalysisRunStatus) -> &MetricResult {
    engine::metric_result(status, "success-rate").expect("the metric has a result")
}

fn values(status: &AnalysisRunStatus) -> Vec<String> {
    result(status)
        .measurements
        .iter()
        .map(|m| m.value.clone())
        .collect()
}

fn phases(status: &AnalysisRunStatus) -> Vec<AnalysisPhase> {
    result(status)
        .measurements
        .iter()
        .map(|m| m.phase)
        .collect()
}

#[tokio::test]
async fn a_success_rate_that_stays_high_passes() {
    let exporter = Exporter::start(GOOD);
    let dir = TempDir::new("stays-high");
    let prometheus = prometheus_scraping(&dir, exporter.address);
    wait_for_gauge(&prometheus, GOOD);
    let run = success_rate_run(&prometheus_address(&prometheus), json!({"count": 3}));

    let providers = Providers::new();
    let (status, after_each) = drive(
        &run,
        &providers,
        AnalysisRunStatus::default(),
        RUN_DEADLINE,
        |_| {},
    )
    .await;

    assert_eq!(status.phase, AnalysisPhase::Successful, "{status:#?}");
    assert_eq!(after_each.len(), 3);
    let result = result(&status);
    assert_eq!(
        (result.count, result.successful, result.failed, result.error),
        (3, 3, 0, 0)
    );
    assert_eq!(values(&status), ["[0.99]", "[0.99]", "[0.99]"]);
    assert_eq!(
        result.metadata["ResolvedPrometheusQuery"],
        "success_rate{service=\"checkout\"}"
    );
    // One measurement per interval at most: each starts at least a second after the last.
    let starts: Vec<Timestamp> = result
        .measurements
        .iter()
        .map(|m| m.started_at.as_ref().expect("startedAt").0)
        .collect();
    assert!(
        starts
            .windows(2)
            .all(|w| w[1].duration_since(w[0]).as_secs_f64() >= 1.0),
        "{starts:?}"
    );
}

#[tokio::test]
async fn a_success_rate_that_drops_fails_after_exactly_the_consecutive_failure_limit() {
    // The value Prometheus answers for each measurement, in order: a bad one between good
    // ones is not enough; two bad ones in a row are.
    let script = [GOOD, BAD, GOOD, BAD, 0.7];
    let exporter = Exporter::start(script[0]);
    let dir = TempDir::new("drops");
    let prometheus = prometheus_scraping(&dir, exporter.address);
    wait_for_gauge(&prometheus, script[0]);
    let run = success_rate_run(
        &prometheus_address(&prometheus),
        json!({"count": 10, "consecutiveFailureLimit": 2}),
    );

    let providers = Providers::new();
    let mut next = script.iter().skip(1);
    let (status, after_each) = drive(
        &run,
        &providers,
        AnalysisRunStatus::default(),
        RUN_DEADLINE,
        |_| {
            let value = *next.next().expect("the run ended with the script");
            exporter.set(value);
            wait_for_gauge(&prometheus, value);
        },
    )
    .await;

    assert_eq!(status.phase, AnalysisPhase::Failed, "{status:#?}");
    assert_eq!(
        status.message,
        "Metric \"success-rate\" assessed Failed due to consecutiveFailures (2) >= consecutiveFailureLimit (2)"
    );
    assert_eq!(
        values(&status),
        ["[0.99]", "[0.8]", "[0.99]", "[0.8]", "[0.7]"]
    );
    // The counters after each measurement: the good one in between resets the run of failures.
    let counters: Vec<(AnalysisPhase, i32, i32, i32)> = after_each
        .iter()
        .map(|s| {
            let r = result(s);
            (s.phase, r.successful, r.failed, r.consecutive_failure)
        })
        .collect();
    assert_eq!(
        counters,
        [
            (AnalysisPhase::Running, 1, 0, 0),
            (AnalysisPhase::Running, 1, 1, 1),
            (AnalysisPhase::Running, 2, 1, 0),
            (AnalysisPhase::Running, 2, 2, 1),
            (AnalysisPhase::Failed, 2, 3, 2),
        ]
    );
    assert_eq!(result(&status).count, 5);
}

#[tokio::test]
async fn bad_values_during_the_initial_delay_are_not_judged() {
    let delay = Duration::from_secs(3);
    let exporter = Exporter::start(BAD);
    let dir = TempDir::new("initial-delay");
    let prometheus = prometheus_scraping(&dir, exporter.address);
    wait_for_gauge(&prometheus, BAD);
    let run = success_rate_run(
        &prometheus_address(&prometheus),
        json!({"count": 2, "initialDelay": "3s"}),
    );
    let providers = Providers::new();

    // The first reconcile starts the run; the delay counts from here.
    let (outcome, measured) = reconcile(
        &run,
        &AnalysisRunStatus::default(),
        &providers,
        Timestamp::now(),
    )
    .await;
    assert_eq!(measured, 0);
    let started = outcome.status.started_at.as_ref().expect("startedAt").0;
    assert_eq!(outcome.requeue_at, Some(started + delay));

    // Within the delay Prometheus answers the bad value, and a reconcile measures nothing.
    let now = Timestamp::now();
    let seen = instant_at(&prometheus, GAUGE, now.as_second());
    let (within, measured) = reconcile(&run, &outcome.status, &providers, now).await;
    assert!(
        now < started + delay,
        "the machine is too slow for a {delay:?} delay"
    );
    assert_eq!(seen, Some(vec![BAD]));
    assert_eq!(measured, 0);
    assert!(
        within.status.metric_results.is_empty(),
        "{:#?}",
        within.status
    );
    assert_eq!(within.status.phase, AnalysisPhase::Running);
    assert_eq!(within.requeue_at, Some(started + delay));

    exporter.set(GOOD);
    wait_for_gauge(&prometheus, GOOD);
    let (status, _) = drive(&run, &providers, within.status, RUN_DEADLINE, |_| {}).await;

    assert_eq!(status.phase, AnalysisPhase::Successful, "{status:#?}");
    assert_eq!(values(&status), ["[0.99]", "[0.99]"]);
    let first = result(&status).measurements[0]
        .started_at
        .as_ref()
        .expect("startedAt")
        .0;
    assert!(
        first >= started + delay,
        "measured at {first} before the delay ended"
    );
}

#[tokio::test]
async fn prometheus_stopped_mid_run_gives_errors_then_an_error_run() {
    let exporter = Exporter::start(GOOD);
    let dir = TempDir::new("stopped");
    let mut prometheus = Some(prometheus_scraping(&dir, exporter.address));
    let address = prometheus_address(prometheus.as_ref().expect("running"));
    wait_for_gauge(prometheus.as_ref().expect("running"), GOOD);
    let run = success_rate_run(&address, json!({"count": 10, "consecutiveErrorLimit": 1}));

    let providers = Providers::new();
    let (status, after_each) = drive(
        &run,
        &providers,
        AnalysisRunStatus::default(),
        RUN_DEADLINE,
        |status| {
            if result(status).successful == 2 {
                // Dropping the helper kills the process.
                prometheus.take();
            }
        },
    )
    .await;

    assert_eq!(status.phase, AnalysisPhase::Error, "{status:#?}");
    assert!(
        status
            .message
            .starts_with("Metric \"success-rate\" assessed Error due to consecutiveErrors (2) > consecutiveErrorLimit (1)"),
        "{}",
        status.message
    );
    assert!(
        after_each
            .iter()
            .all(|s| s.phase != AnalysisPhase::Successful),
        "a run without Prometheus was never Successful"
    );
    assert_eq!(
        phases(&status),
        [
            AnalysisPhase::Successful,
            AnalysisPhase::Successful,
            AnalysisPhase::Error,
            AnalysisPhase::Error
        ]
    );
    // After the first error the run kept going: one error is within the limit.
    assert_eq!(after_each[2].phase, AnalysisPhase::Running);
    let result = result(&status);
    assert_eq!(
        (
            result.count,
            result.successful,
            result.error,
            result.consecutive_error
        ),
        (2, 2, 2, 2)
    );
    // Each Error measurement says where it could not connect, leaving out the query string
    // (which can hold a secret argument).
    for error in &result.measurements[2..] {
        assert!(
            error.message.contains(&format!("({address}/api/v1/query)"))
                && error.message.contains("connect")
                && !error.message.contains("query="),
            "{}",
            error.message
        );
    }
}
