//! The whole loop a controller runs for an AnalysisRun, against a Prometheus stand-in on
//! 127.0.0.1: plan, resolve arguments (a secret included), measure, conclude, requeue.

use k8s_openapi::jiff::Timestamp;
use rollouts_analysis::engine::{self, Outcome, Plan};
use rollouts_analysis::{args, provider};
use rollouts_crds::analysis::{AnalysisPhase, AnalysisRun, AnalysisRunStatus};
use rollouts_e2e::fake_prometheus::FakePrometheus;

fn run_manifest(address: &str) -> AnalysisRun {
    let yaml = format!(
        r#"
apiVersion: argoproj.io/v1alpha1
kind: AnalysisRun
metadata:
  name: checkout-abc-1
  namespace: shop
spec:
  args:
  - name: service
    value: checkout
  - name: tenant
    valueFrom:
      secretKeyRef: {{name: prometheus-tenant, key: id}}
  metrics:
  - name: error-rate
    interval: 30s
    consecutiveFailureLimit: 2
    successCondition: result[0] < 0.05
    provider:
      prometheus:
        address: {address}
        query: errors{{service="{{{{args.service}}}}"}}
        headers:
        - key: X-Scope-OrgID
          value: "{{{{args.tenant}}}}"
"#
    );
    serde_json::from_value(serde_saphyr::from_str::<serde_json::Value>(&yaml).expect("yaml"))
        .expect("an AnalysisRun")
}

/// One reconcile at `now`.
async fn reconcile(
    run: &AnalysisRun,
    status: &AnalysisRunStatus,
    prometheus: &provider::PrometheusProvider,
    now: Timestamp,
) -> Outcome {
    let schedule = match engine::plan(&run.spec, status, now) {
        Plan::Completed => panic!("reconciled a finished run"),
        Plan::Invalid { message } => return engine::invalid(status, &message, now),
        Plan::Measure(schedule) => schedule,
    };
    let values = args::values(&run.spec.args, |secret| {
        assert_eq!(
            (secret.name.as_str(), secret.key.as_str()),
            ("prometheus-tenant", "id")
        );
        Ok("tenant-7".to_string())
    })
    .expect("arguments");
    let context = provider::RunContext {
        namespace: "shop",
        run_name: "checkout-abc-1",
        run_uid: "6c1c0a52-0000-4000-8000-000000000001",
        measurement_number: 1,
        now,
    };
    let mut taken = Vec::new();
    for task in &schedule.tasks {
        let metric = args::resolve_metric(&task.metric, &values).expect("resolved metric");
        taken.push(provider::take(prometheus, context, task, &metric).await);
    }
    engine::conclude(&run.spec, status, &schedule, taken, now)
}

#[tokio::test]
async fn two_bad_measurements_in_a_row_fail_the_run() {
    let server = FakePrometheus::start().await;
    server.script(
        "errors{service=\"checkout\"}",
        &["0.01", "0.09", "0.02", "0.08", "0.07"],
    );
    let run = run_manifest(&server.address);
    let prometheus = provider::PrometheusProvider::new().expect("http clients");

    let mut status = AnalysisRunStatus::default();
    let mut now: Timestamp = "2024-05-01T10:00:00Z".parse().expect("time");
    let mut passes = 0;
    while !status.phase.is_completed() {
        passes += 1;
        assert!(passes <= 10, "the run never finished: {status:?}");
        let outcome = reconcile(&run, &status, &prometheus, now).await;
        status = outcome.status;
        if let Some(next) = outcome.requeue_at {
            now = next;
        }
    }

    assert_eq!(status.phase, AnalysisPhase::Failed);
    assert_eq!(
        status.message,
        "Metric \"error-rate\" assessed Failed due to consecutiveFailures (2) >= consecutiveFailureLimit (2)"
    );
    let result = &status.metric_results[0];
    assert_eq!((result.count, result.successful, result.failed), (5, 2, 3));
    let values: Vec<&str> = result
        .measurements
        .iter()
        .map(|m| m.value.as_str())
        .collect();
    assert_eq!(values, ["[0.01]", "[0.09]", "[0.02]", "[0.08]", "[0.07]"]);
    assert_eq!(
        result.metadata["ResolvedPrometheusQuery"],
        "errors{service=\"checkout\"}"
    );
    let seen = server.requests();
    assert_eq!(seen.len(), 5);
    assert!(
        seen.iter()
            .all(|s| s.headers["x-scope-orgid"] == "tenant-7")
    );
    // One query every 30 seconds of (injected) time.
    let times: Vec<i64> = seen
        .iter()
        .map(|s| s.params["time"].parse().expect("time"))
        .collect();
    assert!(times.windows(2).all(|w| w[1] - w[0] == 30), "{times:?}");
}
