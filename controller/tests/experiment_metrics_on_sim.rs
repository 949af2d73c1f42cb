//! Argo's Experiment metrics as the real `rollouts-controller` binary serves them on /metrics,
//! against kube-sim: `experiment_info` follows an Experiment from Running to Successful, the
//! deprecated `experiment_phase` with it, `experiment_reconcile` counts its reconciles, and
//! every series of it goes once it is deleted while another experiment's stay.

mod support;

use std::net::SocketAddr;

use kube::api::{Api, DeleteParams};
use rollouts_crds::experiment::Experiment;
use serde_json::{Value, json};

use support::NAMESPACE;
use support::analysis_runs::{DEADLINE, RunHarness as Harness};

/// A template of one pod labelled `app: metrics, role: <name>`.
fn template(name: &str) -> Value {
    json!({
        "name": name,
        "replicas": 1,
        "selector": {"matchLabels": {"app": "metrics", "role": name}},
        "template": {
            "metadata": {"labels": {"app": "metrics", "role": name}},
            "spec": {"containers": [{"name": "app", "image": format!("shop:{name}")}]},
        },
    })
}

/// The /metrics address, from the line the controller logs when it listens (both address
/// flags name 127.0.0.1:0, so one listener serves /healthz and /metrics).
async fn metrics_addr(h: &Harness) -> SocketAddr {
    support::eventually(DEADLINE, "the metrics address in the log", || async {
        h.log()
            .lines()
            .find(|line| line.contains("serving /healthz and /readyz"))
            .and_then(|line| line.split("addr=").nth(1))
            .map(|rest| {
                rest.chars()
                    .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | ':'))
                    .collect::<String>()
            })
            .and_then(|addr| addr.parse().ok())
    })
    .await
}

/// Scrapes /metrics until `ready` holds for its text; fails with the last scrape and the log.
async fn scrape_until(h: &Harness, addr: SocketAddr, what: &str, ready: impl Fn(&str) -> bool) {
    let deadline = std::time::Instant::now() + DEADLINE;
    loop {
        let text = support::http_get(addr, "/metrics").await;
        if ready(&text) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {DEADLINE:?} waiting for /metrics to show {what}; last scrape:\n{text}\ncontroller log:\n{}",
            h.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn experiment_series_follow_its_phase_and_go_when_it_is_deleted() {
    let h = Harness::start("rollouts-experiment-metrics", &["--log-level", "info"]).await;
    let addr = metrics_addr(&h).await;
    h.create_experiment("kept", json!({"templates": [template("kept")]}))
        .await;
    h.create_experiment(
        "fresh",
        json!({"duration": "2s", "scaleDownDelaySeconds": 0, "templates": [template("baseline")]}),
    )
    .await;

    let series = |metric: &str, name: &str, phase: &str| {
        format!(r#"{metric}{{namespace="{NAMESPACE}",name="{name}",phase="{phase}"}} 1"#)
    };
    let reconciled = |name: &str| {
        format!(r#"experiment_reconcile_count{{namespace="{NAMESPACE}",name="{name}"}} "#)
    };

    // Given time, both run: info says so, and their reconciles are timed.
    scrape_until(
        &h,
        addr,
        "both experiments Running and reconciled",
        |text| {
            ["kept", "fresh"].iter().all(|name| {
                text.contains(&series("experiment_info", name, "Running"))
                    && text.contains(&series("experiment_phase", name, "Running"))
                    && text.contains(&reconciled(name))
            })
        },
    )
    .await;

    // When its duration has passed, "fresh" is Successful on both gauges.
    scrape_until(&h, addr, "fresh Successful", |text| {
        text.contains(&series("experiment_info", "fresh", "Successful"))
            && text.contains(&series("experiment_phase", "fresh", "Successful"))
            && text.contains(&format!(
                r#"experiment_phase{{namespace="{NAMESPACE}",name="fresh",phase="Running"}} 0"#
            ))
    })
    .await;

    // Deleted, none of its series is left; the other experiment's stay.
    Api::<Experiment>::namespaced(h.client.clone(), NAMESPACE)
        .delete("fresh", &DeleteParams::background())
        .await
        .expect("deletes the Experiment");
    scrape_until(&h, addr, "no series of the deleted experiment", |text| {
        !text.contains(r#"name="fresh""#)
    })
    .await;
    let text = support::http_get(addr, "/metrics").await;
    assert!(
        text.contains(&series("experiment_info", "kept", "Running")),
        "{text}"
    );
    assert!(text.contains(&reconciled("kept")), "{text}");
    assert!(
        !text.contains("experiment_reconcile_error_total{"),
        "no reconcile failed: {text}"
    );
}
