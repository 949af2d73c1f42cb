//! AnalysisRun benchmark of the real `rollouts-controller` binary against kube-sim (in-process,
//! CRDs from crds/yaml) and a Prometheus stand-in on 127.0.0.1. It prints figures and exits 0;
//! it asserts nothing.
//!
//! Run: `cargo bench -p rollouts-controller --bench analysis`
//!   ROLLOUTS_BENCH_RUNS=1000        AnalysisRuns created at once (default 1000)
//!   ROLLOUTS_BENCH_REST_SECS=30     length of the window at rest (default 30)
//!   ROLLOUTS_BENCH_SETUP_SECS=600   how long the runs may take to finish (default 600)
//!   ROLLOUTS_BENCH_PROFILE=realistic  each run carries its own argument (a canary hash) that
//!                                   its query names, as a Rollout's runs do, so no two runs
//!                                   send the same query (default easy: one query for all)
//!   ROLLOUTS_BENCH_QPS, ROLLOUTS_BENCH_BURST  the controller's --qps and --burst (both or
//!                                   neither; default: the controller's defaults)
//!
//! N AnalysisRuns with the same metric (prometheus query `errors{service="checkout"}`,
//! successCondition `result[0] < 0.05`, interval 2s, count 3) are put into the simulator's store
//! (SimHandle::create, no HTTP round trip) while the controller is running; in the realistic
//! profile run i has the argument canary-hash=<hash i> and its query is
//! `errors{service="checkout",rollouts_pod_template_hash="{{args.canary-hash}}"}`. The stand-in
//! answers every `/api/v1/query` with a one-sample vector of 0.01.
//! Figures (controller requests are told apart in kube-sim's request log by the
//! `rollouts-controller/` user agent; leader election is off, so there are no lease requests):
//! 1. Time to Successful: from the first create until all N runs are Successful (seen through a
//!    watch), and how long the N creates took.
//! 2. Queries: every request the stand-in received, and the distinct (query, evaluation time)
//!    pairs among them, `time` as the controller sent it. DESIGN.md's target is one query per
//!    distinct pair, so the ratio total / distinct is 1 at best; N runs x 3 measurements is the
//!    count with no sharing at all.
//! 3. Controller API writes until all runs are finished and the controller has been quiet for
//!    5 s, by verb, resource and subresource; per run as well (target 3 status writes per run,
//!    one per measurement, plus events).
//! 4. At rest: with all runs finished, a window of ROLLOUTS_BENCH_REST_SECS: the controller's
//!    CPU time (utime + stime from /proc/<pid>/stat), its API writes and its reads (target zero
//!    for both; open watches are counted once, when they start), queries to the stand-in (target
//!    zero), and its resident memory (VmRSS, peak VmHWM from /proc/<pid>/status).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use rollouts_crds::analysis::{AnalysisPhase, AnalysisRun};
use rollouts_e2e::fake_prometheus::FakePrometheus;
use rollouts_e2e::sim::{RequestRecord, SimHandle, SimOptions, start};
use serde_json::json;
use tokio::process::{Child, Command};

mod support;
use support::{cpu_seconds, memory};

/// The prefix of the controller's `User-Agent`, which tells its requests from the benchmark's.
const CONTROLLER_AGENT: &str = "rollouts-controller/";
const QUERY: &str = r#"errors{service="checkout"}"#;
const QUERY_WITH_ARGS: &str =
    r#"errors{service="checkout",rollouts_pod_template_hash="{{args.canary-hash}}"}"#;
/// Measurements per run (the metric's count).
const COUNT: usize = 3;
const NAMESPACE: &str = "default";

fn main() {
    let runs = env_number("ROLLOUTS_BENCH_RUNS", 1000);
    let rest = Duration::from_secs(env_number("ROLLOUTS_BENCH_REST_SECS", 30) as u64);
    let setup = Duration::from_secs(env_number("ROLLOUTS_BENCH_SETUP_SECS", 600) as u64);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let per_run_args = match std::env::var("ROLLOUTS_BENCH_PROFILE").as_deref() {
        Err(_) | Ok("easy") => false,
        Ok("realistic") => true,
        Ok(other) => {
            panic!("ROLLOUTS_BENCH_PROFILE={other:?} is not a profile: use easy or realistic")
        }
    };
    let client_limit = match (
        std::env::var("ROLLOUTS_BENCH_QPS"),
        std::env::var("ROLLOUTS_BENCH_BURST"),
    ) {
        (Ok(qps), Ok(burst)) => Some((qps, burst)),
        (Err(_), Err(_)) => None,
        _ => panic!("set ROLLOUTS_BENCH_QPS and ROLLOUTS_BENCH_BURST together, or neither"),
    };
    runtime.block_on(bench(runs, rest, setup, per_run_args, client_limit));
}

/// A positive number from the environment, or `default` when unset.
fn env_number(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(text) => text
            .trim()
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .unwrap_or_else(|| {
                panic!("{name}={text:?} is not a positive whole number: set it to e.g. {default}")
            }),
        Err(_) => default,
    }
}

async fn bench(
    n: usize,
    rest: Duration,
    setup: Duration,
    per_run_args: bool,
    client_limit: Option<(String, String)>,
) {
    let crds = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../crds/yaml");
    let sim = start(SimOptions {
        crd_dirs: vec![crds],
        // Watchers that fall behind a burst of N creates and 3N status writes must not relist.
        event_log_capacity: 10 * n + 10_000,
        // The traffic and metrics simulation would only add load to the figures.
        metrics_listen: None,
        ..SimOptions::default()
    })
    .expect("kube-sim starts on a loopback port");
    let dir = TempDir::new();
    let kubeconfig = dir.0.join("kubeconfig.yaml");
    sim.write_kubeconfig(&kubeconfig)
        .expect("writes the kubeconfig");
    let config = kube::Config::new(sim.url().parse().expect("the simulator URL is a URI"));
    let client = Client::try_from(config).expect("a client for a plain-HTTP server");
    let prometheus = FakePrometheus::start().await;
    prometheus.answer_every_query("0.01");
    let controller = ControllerProcess::start(&kubeconfig, &prometheus.address, &client_limit);
    wait_for_controller_watch(&sim).await;

    // Watch before creating, so no transition to Successful is missed.
    let all: Api<AnalysisRun> = Api::namespaced(client.clone(), NAMESPACE);
    let mut changes = watcher(all, watcher::Config::default()).boxed();
    let mut successful: HashSet<String> = HashSet::new();
    let mut other_ends: BTreeMap<String, usize> = BTreeMap::new();
    let mut ended: HashSet<String> = HashSet::new();

    let started = Instant::now();
    for i in 0..n {
        sim.create(
            NAMESPACE,
            run_manifest(&format!("checkout-{i}"), i, per_run_args),
        )
        .unwrap_or_else(|e| panic!("creates AnalysisRun checkout-{i}: {e:?}"));
    }
    let created_in = started.elapsed();

    let deadline = tokio::time::Instant::now() + setup;
    let mut last_report = Instant::now();
    while ended.len() < n {
        let change = match tokio::time::timeout_at(deadline, changes.next()).await {
            Ok(Some(Ok(change))) => change,
            Ok(Some(Err(_))) => continue,
            Ok(None) | Err(_) => break,
        };
        if let watcher::Event::Apply(run) | watcher::Event::InitApply(run) = change {
            let phase = run.status.as_ref().map(|s| s.phase).unwrap_or_default();
            if phase.is_completed() && ended.insert(run.name_any()) {
                if phase == AnalysisPhase::Successful {
                    successful.insert(run.name_any());
                } else {
                    *other_ends.entry(format!("{phase:?}")).or_default() += 1;
                }
            }
        }
        if last_report.elapsed() > Duration::from_secs(15) {
            eprintln!(
                "analysis bench: {}/{n} finished after {:.0} s",
                ended.len(),
                started.elapsed().as_secs_f64()
            );
            last_report = Instant::now();
        }
    }
    let finished_in = started.elapsed();
    drop(changes);
    let settled = quiet(&sim, Duration::from_secs(5), Duration::from_secs(60)).await;
    let rss_finished = memory(controller.pid);
    let run_requests = sim.requests();
    let run_queries = Queries::take(&prometheus);

    println!(
        "\n== 1. {n} AnalysisRuns of one metric (interval 2s, count 3){} ==",
        if per_run_args {
            ", each with its own canary-hash argument in the query"
        } else {
            ", one query for all"
        }
    );
    println!(
        "created in {:.2} s; {}/{n} Successful {:.1} s after the first create{}",
        created_in.as_secs_f64(),
        successful.len(),
        finished_in.as_secs_f64(),
        if other_ends.is_empty() {
            String::new()
        } else {
            format!("; ended otherwise: {other_ends:?}")
        }
    );
    if ended.len() < n {
        println!(
            "  {} runs had not finished within {} s (ROLLOUTS_BENCH_SETUP_SECS)",
            n - ended.len(),
            setup.as_secs()
        );
    }

    let total = run_queries.total;
    let distinct = run_queries.pairs.len();
    let queries: HashSet<&str> = run_queries.pairs.keys().map(|(q, _)| q.as_str()).collect();
    let times: HashSet<&str> = run_queries.pairs.keys().map(|(_, t)| t.as_str()).collect();
    println!("\n== 2. Queries to the Prometheus stand-in ==");
    println!(
        "total {total}; distinct (query, time) pairs {distinct} ({} queries, {} evaluation \
         times); total / distinct = {:.2} (target 1.00); without sharing: {} ({n} x 3)",
        queries.len(),
        times.len(),
        if distinct == 0 {
            0.0
        } else {
            total as f64 / distinct as f64
        },
        3 * n
    );
    let most = run_queries.pairs.values().max().copied().unwrap_or(0);
    println!("most requests for one pair: {most}");
    println!(
        "queries per interval (each run measures {COUNT} times): {:.1} for {n} runs, {} distinct \
         queries (the fewest an interval can take)",
        total as f64 / COUNT as f64,
        queries.len()
    );

    let writes = tally(controller_requests(&run_requests).filter(|r| is_write(r)));
    let write_total: usize = writes.values().sum();
    println!("\n== 3. Controller API writes until all runs finished and 5 s quiet ==");
    println!(
        "total {write_total} ({:.2} per run); quiet before the window: {}",
        write_total as f64 / n as f64,
        if settled {
            "yes"
        } else {
            "no (still writing after 60 s)"
        }
    );
    for (kind, count) in &writes {
        println!(
            "  {kind:<40} {count:>7} ({:.2} per run)",
            *count as f64 / n as f64
        );
    }
    let reads = tally(controller_requests(&run_requests).filter(|r| !is_write(r)));
    println!("controller reads and watches: {reads:?}");
    drop(run_requests);

    sim.clear_requests();
    Queries::take(&prometheus);
    let cpu_before = cpu_seconds(controller.pid);
    let window_start = Instant::now();
    tokio::time::sleep(rest).await;
    let window = window_start.elapsed().as_secs_f64();
    let cpu = cpu_seconds(controller.pid) - cpu_before;
    let rss_rest = memory(controller.pid);
    let rest_requests = sim.requests();
    let rest_queries = Queries::take(&prometheus);
    let rest_writes = tally(controller_requests(&rest_requests).filter(|r| is_write(r)));
    let rest_reads = tally(controller_requests(&rest_requests).filter(|r| !is_write(r)));
    drop(controller);

    println!("\n== 4. At rest: {n} finished runs, {window:.1} s window ==");
    println!(
        "  controller writes: {} (target 0) {rest_writes:?}",
        rest_writes.values().sum::<usize>()
    );
    println!(
        "  controller reads and watches: {} (target 0) {rest_reads:?}",
        rest_reads.values().sum::<usize>()
    );
    println!(
        "  queries to the stand-in: {} (target 0)",
        rest_queries.total
    );
    println!(
        "  controller CPU: {cpu:.2} s ({:.2}% of one core)",
        100.0 * cpu / window
    );
    println!(
        "  controller memory: VmRSS {} MB once finished, {} MB after the window (RssAnon {} MB, \
         RssFile {} MB: the binary's code), peak VmHWM {} MB",
        rss_finished.rss_mb, rss_rest.rss_mb, rss_rest.anon_mb, rss_rest.file_mb, rss_rest.hwm_mb
    );
    println!("  objects in kube-sim: {}", sim.object_count());
}

/// An AnalysisRun with the benchmark's one metric; with `per_run_args`, run `i`'s own
/// canary-hash argument in its query.
fn run_manifest(name: &str, i: usize, per_run_args: bool) -> serde_json::Value {
    let (query, args) = if per_run_args {
        (
            QUERY_WITH_ARGS,
            json!([{"name": "canary-hash", "value": format!("{:010x}", i.wrapping_mul(2_654_435_761) % 0xff_ffff_ffff)}]),
        )
    } else {
        (QUERY, json!([]))
    };
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AnalysisRun",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"args": args, "metrics": [{
            "name": "error-rate",
            "interval": "2s",
            "count": COUNT,
            "successCondition": "result[0] < 0.05",
            "provider": {"prometheus": {"query": query}},
        }]},
    })
}

/// Waits until the controller lists or watches AnalysisRuns, so the timing starts with it ready.
async fn wait_for_controller_watch(sim: &SimHandle) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !controller_requests(&sim.requests())
        .any(|r| r.resource == "analysisruns" && matches!(r.verb.as_str(), "list" | "watch"))
    {
        if Instant::now() > deadline {
            eprintln!("analysis bench: no list or watch of analysisruns seen within 60 s");
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the controller has made no write for `quiet`; false if `limit` passed first.
async fn quiet(sim: &SimHandle, quiet: Duration, limit: Duration) -> bool {
    let started = Instant::now();
    let mut count = writes_of(sim);
    let mut since = Instant::now();
    while started.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = writes_of(sim);
        if now != count {
            count = now;
            since = Instant::now();
        } else if since.elapsed() >= quiet {
            return true;
        }
    }
    false
}

fn writes_of(sim: &SimHandle) -> usize {
    controller_requests(&sim.requests())
        .filter(|r| is_write(r))
        .count()
}

fn is_write(record: &RequestRecord) -> bool {
    matches!(
        record.verb.as_str(),
        "create" | "update" | "patch" | "delete" | "deletecollection"
    )
}

fn controller_requests(requests: &[RequestRecord]) -> impl Iterator<Item = &RequestRecord> {
    requests
        .iter()
        .filter(|r| r.user_agent.starts_with(CONTROLLER_AGENT))
}

/// Requests counted by "verb resource[/subresource]" (or the path, for non-resource requests).
fn tally<'a>(records: impl Iterator<Item = &'a RequestRecord>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for record in records {
        let what = if record.resource.is_empty() {
            record.path.clone()
        } else if record.subresource.is_empty() {
            record.resource.clone()
        } else {
            format!("{}/{}", record.resource, record.subresource)
        };
        *counts.entry(format!("{} {what}", record.verb)).or_default() += 1;
    }
    counts
}

/// Queries the stand-in received since the last `take`.
#[derive(Default)]
struct Queries {
    total: usize,
    /// Requests per (query, evaluation time as sent).
    pairs: HashMap<(String, String), usize>,
}

impl Queries {
    /// The stand-in's requests since the last call, counted.
    fn take(prometheus: &FakePrometheus) -> Self {
        let mut queries = Self::default();
        for request in prometheus.take_requests() {
            let time = request.params.get("time").cloned().unwrap_or_default();
            queries.total += 1;
            *queries
                .pairs
                .entry((request.query().to_string(), time))
                .or_default() += 1;
        }
        queries
    }
}

/// The controller binary; killed when dropped.
struct ControllerProcess {
    _child: Child,
    pid: u32,
}

impl ControllerProcess {
    fn start(
        kubeconfig: &PathBuf,
        prometheus: &str,
        client_limit: &Option<(String, String)>,
    ) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rollouts-controller"));
        if let Some((qps, burst)) = client_limit {
            command.args(["--qps", qps, "--burst", burst]);
        }
        let child = command
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--leader-elect=false", "--log-level", "warn"])
            .args([
                "--metrics-addr",
                "127.0.0.1:0",
                "--health-addr",
                "127.0.0.1:0",
                "--prometheus-address",
                prometheus,
            ])
            .env_remove("RUST_LOG")
            .env_remove("ROLLOUTS_NAMESPACE")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("starts the controller");
        let pid = child.id().expect("the controller has a pid");
        Self { _child: child, pid }
    }
}

/// A directory removed when the benchmark ends.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let path =
            std::env::temp_dir().join(format!("rollouts-analysis-bench-{}", std::process::id()));
        std::fs::create_dir_all(&path).expect("creates a temp dir");
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
