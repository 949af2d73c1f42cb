//! Shared by the tests that run the analysis engine against a real Prometheus (the `prometheus`
//! binary on PATH, started through kube-sim's helper): an exporter whose gauge the test sets,
//! file_sd targets, instant queries at a chosen second, polling with a deadline, and the
//! controller's reconcile of one AnalysisRun (plan, arguments, measure, conclude) in real time.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use rollouts_analysis::args;
use rollouts_analysis::engine::{self, Outcome, Plan};
use rollouts_analysis::provider::{
    self, BaselineJudgeProvider, MetricProvider, PrometheusProvider,
};
use rollouts_crds::analysis::{AnalysisRun, AnalysisRunStatus};
use rollouts_e2e::sim::traffic::prometheus::Prometheus;
use serde_json::Value;

/// A directory removed when the test ends.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(label: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let path = std::env::temp_dir().join(format!(
            "rollouts-analysis-{label}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&path).expect("a temp dir");
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // Best effort: a leftover temp dir harms nothing.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A tiny Prometheus exporter on 127.0.0.1 serving one gauge whose value the test sets; it runs
/// on its own thread so blocking calls in the test never delay a scrape.
pub struct Exporter {
    pub address: SocketAddr,
    value: Arc<Mutex<String>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The gauge the exporter serves.
pub const GAUGE: &str = "success_rate";

impl Exporter {
    /// Serves `success_rate{service="checkout"} <value>` at `/metrics`.
    pub fn start(value: f64) -> Exporter {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let address = listener.local_addr().expect("a bound address");
        let shared = Arc::new(Mutex::new(value.to_string()));
        let stop = Arc::new(AtomicBool::new(false));
        let (served, stopping) = (shared.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                // A scrape that fails to connect is retried by Prometheus a second later.
                if let Ok(stream) = stream {
                    let value = served.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    serve_scrape(stream, &value);
                }
            }
        });
        Exporter {
            address,
            value: shared,
            stop,
            thread: Some(thread),
        }
    }

    /// The value later scrapes see.
    pub fn set(&self, value: f64) {
        *self.value.lock().unwrap_or_else(|p| p.into_inner()) = value.to_string();
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag; a failure means it is gone already.
        let _ = TcpStream::connect(self.address);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve_scrape(mut stream: TcpStream, value: &str) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut head = Vec::new();
    let mut buffer = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buffer) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buffer[..n]),
        }
    }
    let body = format!(
        "# HELP {GAUGE} Share of requests answered successfully.\n# TYPE {GAUGE} gauge\n{GAUGE}{{service=\"checkout\"}} {value}\n"
    );
    // A scrape cut short is retried by Prometheus at its next interval.
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// Writes a file_sd file with one target, the exporter.
pub fn write_targets(sd_file: &Path, target: SocketAddr) {
    let targets =
        serde_json::json!([{"targets": [target.to_string()], "labels": {"app": "checkout"}}]);
    std::fs::write(sd_file, targets.to_string()).expect("file_sd targets written");
}

/// A real Prometheus scraping `target` every second, with its data under `dir`.
pub fn prometheus_scraping(dir: &TempDir, target: SocketAddr) -> Prometheus {
    let sd_file = dir.0.join("targets.json");
    write_targets(&sd_file, target);
    Prometheus::start(&sd_file).unwrap_or_else(|e| panic!("{e}"))
}

pub fn prometheus_address(prometheus: &Prometheus) -> String {
    format!("http://{}", prometheus.address())
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An instant query evaluated at Unix second `at` (as the provider evaluates one): every
/// sample value of the answer, or None when Prometheus does not answer.
pub fn instant_at(prometheus: &Prometheus, promql: &str, at: i64) -> Option<Vec<f64>> {
    let (status, body) = prometheus
        .get(&format!(
            "/api/v1/query?query={}&time={at}",
            percent_encode(promql)
        ))
        .ok()?;
    let reply: Value = serde_json::from_str(&body).ok()?;
    if status != 200 || reply["status"] != "success" {
        return None;
    }
    reply["data"]["result"]
        .as_array()?
        .iter()
        .map(|sample| sample["value"][1].as_str()?.parse().ok())
        .collect()
}

/// Polls `check` every 50 ms until it gives Some, failing with `what` after `timeout`.
pub fn eventually<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until an instant query of the exporter's gauge, evaluated at the current second, gives
/// `value`: from then on a measurement taken now sees it.
pub fn wait_for_gauge(prometheus: &Prometheus, value: f64) {
    eventually(
        &format!("Prometheus to answer {GAUGE} = {value}"),
        Duration::from_secs(20),
        || {
            let at = Timestamp::now().as_second();
            (instant_at(prometheus, GAUGE, at)? == [value]).then_some(())
        },
    );
}

/// An AnalysisRun from its JSON manifest.
pub fn analysis_run(manifest: Value) -> AnalysisRun {
    serde_json::from_value(manifest).expect("an AnalysisRun")
}

/// The providers a controller holds, sharing one Prometheus client.
pub struct Providers {
    pub prometheus: PrometheusProvider,
    pub judge: BaselineJudgeProvider,
}

impl Providers {
    pub fn new() -> Providers {
        let prometheus = PrometheusProvider::new().expect("http clients");
        Providers {
            judge: BaselineJudgeProvider::new(prometheus.clone()),
            prometheus,
        }
    }
}

/// One reconcile of `run` at `now`, as the controller does it: plan, resolve arguments, take the
/// due measurements with each metric's provider, conclude. Also gives the number of
/// measurements taken.
pub async fn reconcile(
    run: &AnalysisRun,
    status: &AnalysisRunStatus,
    providers: &Providers,
    now: Timestamp,
) -> (Outcome, usize) {
    let schedule = match engine::plan(&run.spec, status, now) {
        Plan::Completed => panic!("reconciled a finished run: {status:?}"),
        Plan::Invalid { message } => return (engine::invalid(status, &message, now), 0),
        Plan::Measure(schedule) => schedule,
    };
    let values = args::values(&run.spec.args, |secret| {
        Err(format!(
            "the test gives no secrets, asked for {}",
            secret.name
        ))
    })
    .expect("arguments");
    let context = provider::RunContext {
        namespace: "default",
        run_name: run.metadata.name.as_deref().unwrap_or("run"),
        run_uid: "6c1c0a52-0000-4000-8000-000000000002",
        measurement_number: 1,
        now,
    };
    let mut taken = Vec::new();
    for task in &schedule.tasks {
        let metric = args::resolve_metric(&task.metric, &values).expect("resolved metric");
        let chosen: &dyn MetricProvider = if metric.provider.judge.is_some() {
            &providers.judge
        } else {
            &providers.prometheus
        };
        taken.push(provider::take(chosen, context, task, &metric).await);
    }
    let measured = taken.len();
    (
        engine::conclude(&run.spec, status, &schedule, taken, now),
        measured,
    )
}

/// Runs `run` to completion in real time from `status`: reconciles, calls `between` with the
/// status after each reconcile that took a measurement (to change what Prometheus will answer),
/// then waits for the time the engine asked to be requeued at, as a controller's timer does.
/// Gives the final status and the status after each measurement.
pub async fn drive(
    run: &AnalysisRun,
    providers: &Providers,
    mut status: AnalysisRunStatus,
    deadline: Duration,
    mut between: impl FnMut(&AnalysisRunStatus),
) -> (AnalysisRunStatus, Vec<AnalysisRunStatus>) {
    let give_up = Instant::now() + deadline;
    let mut after_each = Vec::new();
    loop {
        let (outcome, measured) = reconcile(run, &status, providers, Timestamp::now()).await;
        status = outcome.status;
        if measured > 0 {
            after_each.push(status.clone());
        }
        if status.phase.is_completed() {
            return (status, after_each);
        }
        assert!(
            Instant::now() < give_up,
            "the run did not finish within {deadline:?}: {status:#?}"
        );
        if measured > 0 {
            between(&status);
        }
        let at = outcome
            .requeue_at
            .unwrap_or_else(|| panic!("a running run is requeued: {status:#?}"));
        let wait = at.duration_since(Timestamp::now());
        if let Ok(wait) = Duration::try_from(wait) {
            tokio::time::sleep(wait).await;
        }
    }
}
