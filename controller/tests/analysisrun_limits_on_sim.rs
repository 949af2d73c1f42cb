//! What one AnalysisRun may cost, and what it may reveal, with the real `rollouts-controller`
//! binary against kube-sim started in-process and a Prometheus stand-in on 127.0.0.1:
//! intervals of 0s or absurd lengths end their run in Error naming the metric, the field, the
//! value and the fix, while a control run is still measured; an oversized web answer is an
//! Error naming the cap; a `secretKeyRef` value appears nowhere the controller writes or says
//! (status, events, log, metrics), in any encoding; twelve runs stuck on a provider that
//! never answers do not hold up a control run; every written status of a large run stays
//! within the status budget.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, PostParams};
use rollouts_crds::analysis::AnalysisPhase;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use support::NAMESPACE;
use support::analysis_runs::{DEADLINE, RunHarness as Harness};

/// The cap the controller is started with (`--analysis-max-response-bytes`).
const CAP: usize = 2048;

impl Harness {
    /// Creates the run `name` with these metrics and args.
    async fn create_run(&self, name: &str, metrics: Value, args: Value) {
        self.create(json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "AnalysisRun",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"metrics": metrics, "args": args},
        }))
        .await;
    }

    /// Notes of the run's events, once it has an `AnalysisRun<Phase>` one.
    async fn wait_for_event_notes(&self, name: &str) -> Vec<String> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), NAMESPACE);
        let deadline = Instant::now() + DEADLINE;
        loop {
            let found: Vec<Event> = events
                .list(&ListParams::default())
                .await
                .expect("lists events")
                .items
                .into_iter()
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
                .collect();
            if found.iter().any(|e| {
                e.reason
                    .as_deref()
                    .is_some_and(|r| r.starts_with("AnalysisRun"))
            }) {
                return found
                    .into_iter()
                    .map(|e| {
                        format!(
                            "{} {}",
                            e.reason.unwrap_or_default(),
                            e.note.unwrap_or_default()
                        )
                    })
                    .collect();
            }
            assert!(
                Instant::now() < deadline,
                "no AnalysisRun event for {name}: {found:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_intervals_end_in_error_while_a_control_run_is_measured() {
    let h = Harness::start(
        "rollouts-analysisrun-limits",
        &[
            "--log-level",
            "debug",
            "--analysis-max-response-bytes",
            &CAP.to_string(),
        ],
    )
    .await;
    h.prometheus.values("control", &["1"]);
    h.prometheus.values("spin", &["1"]);
    // Web, measured every 0s: would spin the controller.
    h.create_run(
        "zero-interval",
        json!([{
            "name": "spin",
            "interval": "0s",
            "successCondition": "true",
            "provider": {"web": {"url": format!("{}/api/v1/query?query=spin", h.prometheus.address)}},
        }]),
        json!([]),
    )
    .await;
    // An interval no timer can hold (it used to panic the AnalysisRun controller).
    h.create_run(
        "absurd-interval",
        json!([{
            "name": "forever",
            "interval": "100000000000000000000s",
            "successCondition": "result[0] == 1",
            "provider": {"prometheus": {"query": "control"}},
        }]),
        json!([]),
    )
    .await;
    h.create_run(
        "control",
        json!([{
            "name": "rate",
            "interval": "1s",
            "count": 2,
            "successCondition": "result[0] == 1",
            "provider": {"prometheus": {"query": "control"}},
        }]),
        json!([]),
    )
    .await;

    let zero = h.wait_completed("zero-interval").await;
    assert_eq!(zero.phase, AnalysisPhase::Error, "{zero:#?}");
    assert!(
        zero.message
            .contains("spec.metrics[0].interval (metric \"spin\")")
            && zero.message.contains("\"0s\" is below the minimum of 1s")
            && zero.message.contains("set interval to 1s or more"),
        "{}",
        zero.message
    );
    assert!(zero.metric_results.is_empty(), "measured: {zero:#?}");

    let absurd = h.wait_completed("absurd-interval").await;
    assert_eq!(absurd.phase, AnalysisPhase::Error, "{absurd:#?}");
    assert!(
        absurd
            .message
            .contains("spec.metrics[0].interval (metric \"forever\")")
            && absurd.message.contains("100000000000000000000s")
            && absurd.message.contains("8760h"),
        "{}",
        absurd.message
    );

    let control = h.wait_completed("control").await;
    assert_eq!(control.phase, AnalysisPhase::Successful, "{control:#?}");
    assert_eq!(control.metric_results[0].count, 2, "{control:#?}");
    assert!(
        h.prometheus.queries("spin").is_empty(),
        "the 0s metric was measured"
    );
    assert!(
        !h.log().contains("panicked"),
        "controller log:\n{}",
        h.log()
    );
}

/// A server that accepts connections and never answers; it holds them until dropped, and
/// counts them.
async fn black_hole() -> (
    String,
    std::sync::Arc<AtomicUsize>,
    tokio::task::JoinHandle<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = format!("http://{}", listener.local_addr().expect("address"));
    let accepted = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    let server = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
            counter.fetch_add(1, Ordering::SeqCst);
        }
    });
    (address, accepted, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_stuck_on_a_slow_provider_do_not_hold_up_the_others() {
    let h = Harness::start(
        "rollouts-analysisrun-limits",
        &[
            "--log-level",
            "debug",
            "--analysis-max-response-bytes",
            &CAP.to_string(),
        ],
    )
    .await;
    let (silent, accepted, server) = black_hole().await;
    // More stuck runs than the default --concurrency (10): each waits its full 60s timeout.
    for i in 0..12 {
        h.create_run(
            &format!("stuck-{i}"),
            json!([{
                "name": "silent",
                "successCondition": "true",
                "provider": {"web": {"url": format!("{silent}/check"), "timeoutSeconds": 60}},
            }]),
            json!([]),
        )
        .await;
    }
    // Every stuck run is waiting on the provider at once (with one reconcile slot per run,
    // and no more slots than --concurrency, only 10 would be).
    let deadline = Instant::now() + DEADLINE;
    while accepted.load(Ordering::SeqCst) < 12 {
        assert!(
            Instant::now() < deadline,
            "only {} of 12 stuck runs reached their provider; controller log:\n{}",
            accepted.load(Ordering::SeqCst),
            h.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h.prometheus.values("control", &["1"]);
    h.create_run(
        "control",
        json!([{
            "name": "rate",
            "successCondition": "result[0] == 1",
            "provider": {"prometheus": {"query": "control"}},
        }]),
        json!([]),
    )
    .await;
    let control = h.wait_completed("control").await;
    assert_eq!(control.phase, AnalysisPhase::Successful, "{control:#?}");
    // The stuck runs are still waiting on their provider.
    let stuck = h
        .runs()
        .get("stuck-0")
        .await
        .expect("reads the run")
        .status
        .unwrap_or_default();
    assert!(!stuck.phase.is_completed(), "{stuck:#?}");
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_web_answer_is_an_error_naming_the_cap() {
    let h = Harness::start(
        "rollouts-analysisrun-limits",
        &[
            "--log-level",
            "debug",
            "--analysis-max-response-bytes",
            &CAP.to_string(),
        ],
    )
    .await;
    let huge = "9".repeat(CAP * 2);
    h.prometheus.values("huge", &[&huge]);
    h.create_run(
        "oversized",
        json!([{
            "name": "web",
            "consecutiveErrorLimit": 0,
            "successCondition": "true",
            "provider": {"web": {"url": format!("{}/api/v1/query?query=huge", h.prometheus.address)}},
        }]),
        json!([]),
    )
    .await;
    let status = h.wait_completed("oversized").await;
    assert_eq!(status.phase, AnalysisPhase::Error, "{status:#?}");
    let message = &status.metric_results[0].measurements[0].message;
    assert!(
        message.contains(&format!("limit of {CAP} bytes"))
            && message.contains("--analysis-max-response-bytes"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_metrics_with_large_values_keep_every_written_status_within_budget() {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};

    let h = Harness::start(
        "rollouts-analysisrun-limits",
        &[
            "--log-level",
            "debug",
            "--analysis-max-response-bytes",
            &CAP.to_string(),
        ],
    )
    .await;
    // Each answer just under the cap; each stored value about 1.9 KiB.
    let large = "7".repeat(CAP - 150);
    h.prometheus.values("large", &[&large]);
    let metrics: Vec<Value> = (0..100)
        .map(|i| {
            json!({
                "name": format!("metric-{i}"),
                "interval": "1s",
                "count": 4,
                "successCondition": "len(result) > 0",
                "provider": {"web": {
                    "url": format!("{}/api/v1/query?query=large", h.prometheus.address),
                    "jsonPath": "{$.data.result[0].value[1]}",
                }},
            })
        })
        .collect();
    // Every version of the run the API server stores, as a watch sees them.
    let largest = std::sync::Arc::new(AtomicUsize::new(0));
    let seen = largest.clone();
    /// Stops the watch however the test ends: the simulator waits for open watches to close.
    struct AbortOnDrop(tokio::task::JoinHandle<()>);
    impl Drop for AbortOnDrop {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let watch = AbortOnDrop(tokio::spawn(
        // With a backoff, a watch that fails (the simulator gone once the test ends) waits
        // between tries, so the abort below lands instead of the task retrying in a hot loop.
        watcher(h.runs(), watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .for_each(move |run| {
                if let Ok(run) = run {
                    let size = serde_json::to_vec(&run.status).map_or(0, |v| v.len());
                    seen.fetch_max(size, Ordering::SeqCst);
                }
                std::future::ready(())
            }),
    ));
    h.create_run("many-large", json!(metrics), json!([])).await;
    let status = h.wait_completed("many-large").await;
    drop(watch);

    assert_eq!(
        status.phase,
        AnalysisPhase::Successful,
        "{}",
        status.message
    );
    assert!(status.metric_results.iter().all(|r| r.count == 4));
    let budget = rollouts_controller::analysisrun::budget::STATUS_BUDGET;
    let largest = largest.load(Ordering::SeqCst);
    assert!(
        largest > 0 && largest <= budget,
        "a status of {largest} bytes was written (budget {budget})"
    );
    // 400 measurements of ~2 KiB do not fit: the oldest were dropped, the last of each kept.
    let kept: usize = status
        .metric_results
        .iter()
        .map(|r| r.measurements.len())
        .sum();
    assert!(kept < 400, "{kept} measurements kept");
    assert!(
        status
            .metric_results
            .iter()
            .all(|r| !r.measurements.is_empty())
    );
}

/// Every text a secret could hide in: as written, percent-encoded (both cases, `+` for a
/// space), JSON-escaped, and base64-encoded.
fn secret_shapes(secret: &str) -> Vec<String> {
    let mut upper = String::new();
    let mut form = String::new();
    for byte in secret.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            upper.push(char::from(byte));
            form.push(char::from(byte));
        } else if byte == b' ' {
            upper.push_str("%20");
            form.push('+');
        } else {
            upper.push_str(&format!("%{byte:02X}"));
            form.push_str(&format!("%{byte:02X}"));
        }
    }
    let json = serde_json::Value::String(secret.into()).to_string();
    vec![
        secret.to_string(),
        upper.clone(),
        upper.to_lowercase(),
        form,
        json.trim_matches('"').to_string(),
        base64(secret.as_bytes()),
    ]
}

fn base64(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in input.chunks(3) {
        let bytes = [
            chunk.first().copied().unwrap_or(0),
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(bytes[0]) << 16) | (u32::from(bytes[1]) << 8) | u32::from(bytes[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_values_appear_in_no_status_event_or_log() {
    let h = Harness::start(
        "rollouts-analysisrun-limits",
        &[
            "--log-level",
            "debug",
            "--analysis-max-response-bytes",
            &CAP.to_string(),
        ],
    )
    .await;
    let secret = "t0k3n/with+odd=chars&a space\"quoted\"";
    let secrets: Api<Secret> = Api::namespaced(h.client.clone(), NAMESPACE);
    secrets
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("api".into()),
                    ..ObjectMeta::default()
                },
                data: Some(BTreeMap::from([(
                    "token".to_string(),
                    ByteString(secret.as_bytes().to_vec()),
                )])),
                ..Secret::default()
            },
        )
        .await
        .expect("creates the Secret");
    // A web endpoint that echoes the secret back as the measured value.
    h.prometheus.values("echo", &[secret]);
    // A port nothing listens on: bind one, then close it.
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let closed_address = format!("http://{}", closed.local_addr().expect("address"));
    drop(closed);
    h.create_run(
        "secretive",
        json!([
            {
                // The secret comes back in the answer: the measured value.
                "name": "echo",
                "successCondition": "result == 'something else'",
                "provider": {"web": {
                    "url": format!("{}/api/v1/query?query=echo&token={{{{args.token}}}}", h.prometheus.address),
                    "jsonPath": "{$.data.result[0].value[1]}",
                    "headers": [{"key": "X-Token", "value": "{{args.token}}"}],
                    "authentication": {"basic": {"username": "u", "password": "{{args.token}}"}},
                }},
            },
            {
                // The secret is in the query: the resolved query kept in the metric result,
                // and the error text of a query Prometheus refuses.
                "name": "query",
                "consecutiveErrorLimit": 0,
                "successCondition": "result[0] == 1",
                "provider": {"prometheus": {"query": "rate{token=\"{{args.token}}\"}"}},
            },
            {
                // The secret is in the URL of a request that fails.
                "name": "unreachable",
                "consecutiveErrorLimit": 0,
                "successCondition": "true",
                "provider": {"web": {"url": format!("{closed_address}/check?token={{{{args.token}}}}")}},
            },
        ]),
        json!([{"name": "token", "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}}]),
    )
    .await;
    let status = h.wait_completed("secretive").await;
    let notes = h.wait_for_event_notes("secretive").await;
    let written = serde_json::to_string(&status).expect("encodes");
    let run = h.runs().get("secretive").await.expect("reads the run");
    let metadata = serde_json::to_string(&run.metadata).expect("encodes");

    // The measurements did take place, with the secret.
    let echo = status
        .metric_results
        .iter()
        .find(|r| r.name == "echo")
        .unwrap_or_else(|| panic!("echo was measured: {status:#?}"));
    assert_eq!(
        echo.measurements[0].phase,
        AnalysisPhase::Failed,
        "{echo:#?}"
    );
    assert!(
        echo.measurements[0].value.contains("*****"),
        "{:#?}",
        echo.measurements[0]
    );
    // Substituted as written (as Argo does), so the URL's parser splits it at `&`.
    let echoed = h.prometheus.queries("echo");
    assert!(
        echoed
            .first()
            .and_then(|r| r.params.get("token"))
            .is_some_and(|t| t.starts_with("t0k3n/with")),
        "the request carried the secret: {echoed:?}"
    );
    let query = status
        .metric_results
        .iter()
        .find(|r| r.name == "query")
        .unwrap_or_else(|| panic!("query was measured: {status:#?}"));
    assert!(
        query
            .metadata
            .get("ResolvedPrometheusQuery")
            .is_some_and(|q| q.starts_with("rate{token=\"") && q.contains("*****")),
        "{query:#?}"
    );

    let log = h.log();
    // The controller's own metrics, served beside /healthz (both flags name 127.0.0.1:0).
    let metrics_addr: std::net::SocketAddr = log
        .lines()
        .find(|line| line.contains("serving /healthz and /readyz"))
        .and_then(|line| line.split("addr=").nth(1))
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | ':'))
                .collect::<String>()
        })
        .and_then(|addr| addr.parse().ok())
        .unwrap_or_else(|| panic!("no metrics address in the log:\n{log}"));
    let metrics = support::http_get(metrics_addr, "/metrics").await;
    assert!(
        metrics.contains("analysis_run_measurements_total"),
        "{metrics}"
    );
    for shape in secret_shapes(secret) {
        for (surface, text) in [
            ("status", &written),
            ("metadata", &metadata),
            ("log", &log),
            ("metrics", &metrics),
        ] {
            assert!(!text.contains(&shape), "{surface} holds {shape:?}:\n{text}");
        }
        for note in &notes {
            assert!(!note.contains(&shape), "an event holds {shape:?}: {note}");
        }
    }
}
