//! The Prometheus provider against a small in-test server on 127.0.0.1 that answers
//! `/api/v1/query` and `/api/v1/query_range` with canned Prometheus JSON.

use k8s_openapi::jiff::Timestamp;
use rollouts_analysis::provider::{MetricProvider, PrometheusProvider, RunContext};
use rollouts_crds::analysis::{
    AnalysisPhase, Authentication, BasicAuthConfig, Measurement, Metric,
    MetricProvider as Provider, OAuth2Config, PrometheusMetric, PrometheusRangeQueryArgs,
    WebMetricHeader,
};
use rollouts_e2e::fake_prometheus::FakePrometheus;
use tokio::net::TcpListener;

fn now() -> Timestamp {
    "2024-05-01T10:00:00Z".parse().expect("timestamp")
}

fn metric(address: &str, query: &str, success: &str) -> Metric {
    Metric {
        name: "m".into(),
        success_condition: Some(success.into()),
        provider: Provider {
            prometheus: Some(PrometheusMetric {
                address: Some(address.into()),
                query: Some(query.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

async fn measure(provider: &PrometheusProvider, metric: &Metric) -> Measurement {
    let run = RunContext {
        namespace: "default",
        run_name: "run",
        run_uid: "6c1c0a52-0000-4000-8000-000000000001",
        measurement_number: 1,
        now: now(),
    };
    provider.run(run, metric).await
}

fn provider() -> PrometheusProvider {
    PrometheusProvider::new().expect("http clients")
}

#[tokio::test]
async fn a_vector_becomes_a_list_of_floats() {
    let server = FakePrometheus::start().await;
    let p = provider();
    let good = measure(
        &p,
        &metric(&server.address, "vector_good", "result[0] >= 0.95"),
    )
    .await;
    assert_eq!(good.phase, AnalysisPhase::Successful, "{}", good.message);
    assert_eq!(good.value, "[0.99,0.97]");
    assert!(good.finished_at.is_some());
    let all = measure(
        &p,
        &metric(&server.address, "vector_good", "all(result, {# > 0.96})"),
    )
    .await;
    assert_eq!(all.phase, AnalysisPhase::Successful);
    let bad = measure(
        &p,
        &metric(&server.address, "vector_bad", "result[0] >= 0.95"),
    )
    .await;
    assert_eq!(bad.phase, AnalysisPhase::Failed);
    assert_eq!(bad.value, "[0.5]");

    let seen = server.requests();
    assert_eq!(seen[0].path, "/api/v1/query");
    assert_eq!(seen[0].params["query"], "vector_good");
    assert_eq!(seen[0].params["time"], now().as_second().to_string());
}

#[tokio::test]
async fn nan_and_empty_results_follow_argo() {
    let server = FakePrometheus::start().await;
    let p = provider();
    let nan = measure(
        &p,
        &metric(&server.address, "vector_nan", "result[0] >= 0.95"),
    )
    .await;
    assert_eq!(nan.phase, AnalysisPhase::Failed);
    assert_eq!(nan.value, "[NaN]");
    let guarded = measure(
        &p,
        &metric(
            &server.address,
            "vector_nan",
            "isNaN(result[0]) || result[0] >= 0.95",
        ),
    )
    .await;
    assert_eq!(guarded.phase, AnalysisPhase::Successful);
    let empty = measure(
        &p,
        &metric(&server.address, "vector_empty", "result[0] >= 0.95"),
    )
    .await;
    assert_eq!(empty.phase, AnalysisPhase::Error);
    assert!(
        empty.message.contains("no data returned"),
        "{}",
        empty.message
    );
    let tolerant = measure(
        &p,
        &metric(
            &server.address,
            "vector_empty",
            "len(result) == 0 || result[0] >= 0.95",
        ),
    )
    .await;
    assert_eq!(tolerant.phase, AnalysisPhase::Successful);
}

#[tokio::test]
async fn a_scalar_is_a_number_and_a_range_query_flattens_the_matrix() {
    let server = FakePrometheus::start().await;
    let p = provider();
    let scalar = measure(&p, &metric(&server.address, "scalar", "result == 42")).await;
    assert_eq!(
        scalar.phase,
        AnalysisPhase::Successful,
        "{}",
        scalar.message
    );
    assert_eq!(scalar.value, "42");

    let mut range = metric(&server.address, "matrix", "all(result, {# < 0.3})");
    range
        .provider
        .prometheus
        .as_mut()
        .expect("prometheus")
        .range_query = Some(PrometheusRangeQueryArgs {
        start: Some("now() - duration(\"5m\")".into()),
        end: Some("now()".into()),
        step: Some("1m".into()),
    });
    let measured = measure(&p, &range).await;
    assert_eq!(
        measured.phase,
        AnalysisPhase::Successful,
        "{}",
        measured.message
    );
    assert_eq!(measured.value, "[0.1,0.2,0.25]");
    let seen = server.requests();
    let request = seen
        .iter()
        .find(|s| s.path == "/api/v1/query_range")
        .expect("range query");
    assert_eq!(
        request.params["start"],
        (now().as_second() - 300).to_string()
    );
    assert_eq!(request.params["end"], now().as_second().to_string());
    assert_eq!(request.params["step"], "60");
}

#[tokio::test]
async fn headers_and_basic_auth_are_sent() {
    let server = FakePrometheus::start().await;
    let mut m = metric(&server.address, "scalar", "result == 42");
    let config = m.provider.prometheus.as_mut().expect("prometheus");
    config.headers = vec![WebMetricHeader {
        key: "X-Scope-OrgID".into(),
        value: "tenant-a".into(),
    }];
    config.authentication = Some(Authentication {
        basic_auth: Some(BasicAuthConfig {
            username: Some("user".into()),
            password: Some("pass".into()),
        }),
        ..Default::default()
    });
    let measured = measure(&provider(), &m).await;
    assert_eq!(
        measured.phase,
        AnalysisPhase::Successful,
        "{}",
        measured.message
    );
    let seen = server.requests();
    assert_eq!(seen[0].headers["x-scope-orgid"], "tenant-a");
    assert_eq!(seen[0].headers["authorization"], "Basic dXNlcjpwYXNz");
}

#[tokio::test]
async fn failures_are_error_measurements_with_the_reason() {
    let server = FakePrometheus::start().await;
    let p = provider();
    let rejected = measure(&p, &metric(&server.address, "sum(", "result[0] > 0")).await;
    assert_eq!(rejected.phase, AnalysisPhase::Error);
    assert!(
        rejected.message.contains("parse error"),
        "{}",
        rejected.message
    );

    // A port nothing listens on: bind one, then close it.
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = format!("http://{}", closed.local_addr().expect("address"));
    drop(closed);
    let refused = measure(&p, &metric(&address, "vector_good", "result[0] > 0")).await;
    assert_eq!(refused.phase, AnalysisPhase::Error);
    assert!(!refused.message.is_empty());

    let no_address = measure(&p, &metric("", "vector_good", "result[0] > 0")).await;
    assert_eq!(no_address.phase, AnalysisPhase::Error);
    assert!(
        no_address
            .message
            .contains("set provider.prometheus.address")
    );
    let defaulted = measure(
        &provider().with_default_address(server.address.clone()),
        &metric("", "vector_good", "result[0] > 0"),
    )
    .await;
    assert_eq!(
        defaulted.phase,
        AnalysisPhase::Successful,
        "{}",
        defaulted.message
    );

    let not_url = measure(
        &p,
        &metric("prometheus:9090", "vector_good", "result[0] > 0"),
    )
    .await;
    assert!(
        not_url.message.contains("is not a URL"),
        "{}",
        not_url.message
    );

    let mut negative = metric(&server.address, "vector_good", "result[0] > 0");
    negative
        .provider
        .prometheus
        .as_mut()
        .expect("prometheus")
        .timeout = Some(-1);
    let negative = measure(&p, &negative).await;
    assert_eq!(
        negative.message,
        "prometheus timeout should not be negative"
    );
}

#[tokio::test]
async fn the_resolved_query_is_the_metric_result_metadata() {
    let p = provider();
    let m = metric("http://127.0.0.1:9", "up{job=\"x\"}", "result[0] > 0");
    assert_eq!(p.metadata(&m)["ResolvedPrometheusQuery"], "up{job=\"x\"}");
    assert_eq!(p.kind(), "Prometheus");
}

#[tokio::test]
async fn identical_queries_at_the_same_time_share_one_request() {
    let server = FakePrometheus::start().await;
    let p = provider();
    let m = metric(&server.address, "vector_good", "result[0] >= 0.95");
    let context = |now| RunContext {
        namespace: "default",
        run_name: "run",
        run_uid: "6c1c0a52-0000-4000-8000-000000000001",
        measurement_number: 1,
        now,
    };
    // Twenty runs of one template, measured in the same second, through clones of the provider.
    let handles: Vec<_> = (0..20)
        .map(|_| {
            let (p, m) = (p.clone(), m.clone());
            tokio::spawn(async move { p.run(context(now()), &m).await })
        })
        .collect();
    for handle in handles {
        let measured = handle.await.expect("task");
        assert_eq!(
            measured.phase,
            AnalysisPhase::Successful,
            "{}",
            measured.message
        );
    }
    assert_eq!(server.requests().len(), 1);

    // Another evaluation time, or another header, is another request.
    let later = now()
        .checked_add(std::time::Duration::from_secs(30))
        .expect("time");
    p.run(context(later), &m).await;
    let mut tenant = m.clone();
    tenant
        .provider
        .prometheus
        .as_mut()
        .expect("prometheus")
        .headers = vec![WebMetricHeader {
        key: "X-Scope-OrgID".into(),
        value: "b".into(),
    }];
    p.run(context(now()), &tenant).await;
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn oauth2_client_credentials_fetch_a_bearer_token() {
    let server = FakePrometheus::start().await;
    let mut m = metric(&server.address, "scalar", "result == 42");
    m.provider
        .prometheus
        .as_mut()
        .expect("prometheus")
        .authentication = Some(Authentication {
        oauth2: Some(OAuth2Config {
            token_url: Some(format!("{}/oauth/token", server.address)),
            client_id: Some("rollouts".into()),
            client_secret: Some("s3cr3t".into()),
            scopes: vec!["metrics.read".into(), "metrics.list".into()],
        }),
        ..Default::default()
    });
    let measured = measure(&provider(), &m).await;
    assert_eq!(
        measured.phase,
        AnalysisPhase::Successful,
        "{}",
        measured.message
    );
    let seen = server.requests();
    assert_eq!(seen[0].path, "/oauth/token");
    assert_eq!(
        seen[0].body,
        "grant_type=client_credentials&client_id=rollouts&client_secret=s3cr3t&scope=metrics.read+metrics.list"
    );
    assert_eq!(seen[1].headers["authorization"], "Bearer tok-1");

    m.provider
        .prometheus
        .as_mut()
        .expect("prometheus")
        .authentication = Some(Authentication {
        oauth2: Some(OAuth2Config {
            token_url: Some(format!("{}/oauth/token", server.address)),
            ..Default::default()
        }),
        ..Default::default()
    });
    let measured = measure(&provider(), &m).await;
    assert_eq!(measured.phase, AnalysisPhase::Error);
    assert!(
        measured.message.contains("missing mandatory parameter"),
        "{}",
        measured.message
    );
}
