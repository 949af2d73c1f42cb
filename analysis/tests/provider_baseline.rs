//! The baseline judge provider against the Prometheus stand-in: canary and baseline range
//! queries over the same window, judged, with the verdict going to the successCondition.

use k8s_openapi::jiff::Timestamp;
use rollouts_analysis::provider::{
    BaselineJudgeProvider, MetricProvider, PrometheusProvider, RunContext,
};
use rollouts_crds::analysis::{AnalysisPhase, Measurement, Metric, MetricProvider as Provider};
use rollouts_e2e::fake_prometheus::FakePrometheus;
use serde_json::{Value, json};

const QUERY: &str = "errors{hash=\"{{hash}}\"}";

fn metric(address: &str, extra: Value) -> Metric {
    let mut judge = json!({
        "prometheus": {"address": address},
        "query": QUERY,
        "canary": "canary1",
        "baseline": "stable1",
        "window": "5m",
        "step": "15s",
        "direction": "increase",
        "minSamples": 8
    });
    if let (Some(judge), Some(extra)) = (judge.as_object_mut(), extra.as_object()) {
        judge.extend(extra.clone());
    }
    Metric {
        name: "errors-vs-stable".into(),
        success_condition: Some("result.verdict != \"High\"".into()),
        provider: Provider {
            judge: Some(judge),
            ..Default::default()
        },
        ..Default::default()
    }
}

async fn measure(metric: &Metric) -> Measurement {
    let provider = BaselineJudgeProvider::new(PrometheusProvider::new().expect("http clients"));
    let run = RunContext {
        namespace: "default",
        run_name: "run",
        run_uid: "6c1c0a52-0000-4000-8000-000000000001",
        measurement_number: 1,
        now: "2024-05-01T10:00:00Z".parse::<Timestamp>().expect("time"),
    };
    provider.run(run, metric).await
}

const LOW: &str = "0.010,0.011,0.009,0.010,0.012,0.010,0.011,0.009,0.010,0.011";
const HIGH: &str = "0.050,0.052,0.049,0.051,0.055,0.050,0.048,0.053,0.051,0.050";

#[tokio::test]
async fn a_canary_worse_than_stable_fails_the_condition() {
    let server = FakePrometheus::start().await;
    server.script("errors{hash=\"canary1\"}", &[HIGH]);
    server.script("errors{hash=\"stable1\"}", &[LOW]);
    let measured = measure(&metric(&server.address, json!({}))).await;
    assert_eq!(
        measured.phase,
        AnalysisPhase::Failed,
        "{}",
        measured.message
    );
    let value: Value = serde_json::from_str(&measured.value).expect("JSON value");
    assert_eq!(value["verdict"], "High");
    assert_eq!(value["canarySamples"], 10);
    assert!(value["meanRatio"].as_f64().expect("ratio") > 4.0);

    let seen = server.requests();
    assert_eq!(seen.len(), 2);
    for request in &seen {
        assert_eq!(request.path, "/api/v1/query_range");
        assert_eq!(request.params["end"], "1714557600");
        assert_eq!(request.params["start"], "1714557300");
        assert_eq!(request.params["step"], "15");
    }
}

#[tokio::test]
async fn a_canary_like_stable_passes() {
    let server = FakePrometheus::start().await;
    server.script("errors{hash=\"canary1\"}", &[LOW]);
    server.script("errors{hash=\"stable1\"}", &[LOW]);
    let measured = measure(&metric(&server.address, json!({}))).await;
    assert_eq!(
        measured.phase,
        AnalysisPhase::Successful,
        "{}",
        measured.message
    );
    assert!(measured.value.contains("\"verdict\":\"Pass\""));
}

#[tokio::test]
async fn too_few_samples_take_the_no_data_policy() {
    let server = FakePrometheus::start().await;
    server.script("errors{hash=\"canary1\"}", &["0.05,0.06", "0.05,0.06"]);
    server.script("errors{hash=\"stable1\"}", &[LOW, LOW]);
    let inconclusive = measure(&metric(&server.address, json!({}))).await;
    assert_eq!(inconclusive.phase, AnalysisPhase::Inconclusive);
    assert!(
        inconclusive.message.contains("fewer than minSamples 8"),
        "{}",
        inconclusive.message
    );
    let failed = measure(&metric(&server.address, json!({"noData": "fail"}))).await;
    assert_eq!(failed.phase, AnalysisPhase::Failed);
}

#[tokio::test]
async fn a_failing_side_is_an_error_naming_it() {
    let server = FakePrometheus::start().await;
    server.script("errors{hash=\"canary1\"}", &[LOW]);
    let measured = measure(&metric(&server.address, json!({}))).await;
    assert_eq!(measured.phase, AnalysisPhase::Error);
    assert!(
        measured.message.starts_with("baseline query:"),
        "{}",
        measured.message
    );
}

const ERRORS: &str = "sum(increase(requests{code=\"500\",hash=\"{{hash}}\"}[{{window}}]))";
const TOTAL: &str = "sum(increase(requests{hash=\"{{hash}}\"}[{{window}}]))";

fn ratio_metric(address: &str) -> Metric {
    Metric {
        name: "errors-vs-stable".into(),
        success_condition: Some("result.verdict != \"High\"".into()),
        provider: Provider {
            judge: Some(json!({
                "prometheus": {"address": address},
                "kind": "ratio",
                "errors": ERRORS,
                "total": TOTAL,
                "canary": "canary1",
                "baseline": "stable1",
                "window": "5m",
                "direction": "increase",
            })),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[tokio::test]
async fn ratio_kind_compares_error_counts_with_instant_queries_over_the_window() {
    let server = FakePrometheus::start().await;
    let resolved =
        |text: &str, hash: &str| text.replace("{{hash}}", hash).replace("{{window}}", "5m");
    // 0.2% against 0.05%: few errors, which sampled ratios would mostly see as zeros.
    server.values(&resolved(ERRORS, "canary1"), &["60"]);
    server.values(&resolved(TOTAL, "canary1"), &["30000"]);
    server.values(&resolved(ERRORS, "stable1"), &["60"]);
    server.values(&resolved(TOTAL, "stable1"), &["120000"]);
    let measured = measure(&ratio_metric(&server.address)).await;
    assert_eq!(
        measured.phase,
        AnalysisPhase::Failed,
        "{}",
        measured.message
    );
    let value: Value = serde_json::from_str(&measured.value).expect("JSON value");
    assert_eq!(value["verdict"], "High");
    assert_eq!(value["canaryErrors"], 60);
    assert_eq!(value["baselineTotal"], 120000);
    assert_eq!(value["meanRatio"], 4.0);
    assert!(value["lower"].as_f64().expect("lower") > 1.0);
    assert!(
        measured.message.contains("canary 0.2% (60 errors)"),
        "{}",
        measured.message
    );
    let seen = server.requests();
    assert_eq!(seen.len(), 4);
    assert!(seen.iter().all(|r| r.path == "/api/v1/query"), "{seen:?}");
}

#[tokio::test]
async fn ratio_kind_passes_a_canary_like_stable_and_names_a_missing_count() {
    let server = FakePrometheus::start().await;
    let resolved =
        |text: &str, hash: &str| text.replace("{{hash}}", hash).replace("{{window}}", "5m");
    server.values(&resolved(ERRORS, "canary1"), &["30"]);
    server.values(&resolved(TOTAL, "canary1"), &["30000"]);
    server.values(&resolved(ERRORS, "stable1"), &["120"]);
    server.values(&resolved(TOTAL, "stable1"), &["120000"]);
    let measured = measure(&ratio_metric(&server.address)).await;
    assert_eq!(
        measured.phase,
        AnalysisPhase::Successful,
        "{}",
        measured.message
    );

    let mut no_total = ratio_metric(&server.address);
    if let Some(judge) = no_total
        .provider
        .judge
        .as_mut()
        .and_then(Value::as_object_mut)
    {
        judge.remove("total");
    }
    let measured = measure(&no_total).await;
    assert_eq!(measured.phase, AnalysisPhase::Error);
    assert!(
        measured.message.contains("provider.judge.total"),
        "{}",
        measured.message
    );
}
