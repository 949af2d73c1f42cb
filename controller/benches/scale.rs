//! Scale benchmark of the real `rollouts-controller` binary against kube-sim (in-process, CRDs
//! from crds/yaml). It prints figures and exits 0; it asserts nothing.
//!
//! Run: `cargo bench -p rollouts-controller --bench scale`
//!   ROLLOUTS_BENCH_ROLLOUTS=1000,10000   Rollouts at rest, one run per size (default 1000)
//!   ROLLOUTS_BENCH_IDLE_SECS=60     length of the idle window (default 60)
//!   ROLLOUTS_BENCH_SETUP_SECS=900   how long the Rollouts may take to become Healthy (default 900)
//!
//! Figures (every count comes from kube-sim's request log, controller requests told apart by the
//! `rollouts-controller/` user agent; leases are left out, leader election is off):
//! 1. Writes per canary step: one Rollout, 4 replicas, setWeight 25 / pause 1s / setWeight 50 /
//!    pause 1s / setWeight 75 / pause 1s, moved from v1 to v2. Writes (create, update, patch,
//!    delete) are split by kind: ReplicaSet scale (patch/update of a ReplicaSet or its scale),
//!    ReplicaSet create, Rollout status patch, events, other. They are attributed to a step by
//!    polling `status.currentStepIndex` every few milliseconds and cutting the request log where
//!    it changes, so a write made just before a cut may land in the neighbouring row; the totals
//!    are exact. The last row ("completion") runs from the last step to Healthy, plus the writes
//!    until the controller is quiet for 2 s. DESIGN.md's target: one scale + one status patch per
//!    step, events extra.
//! 2. Idle cost: N Rollouts (replicas 1, so one ReplicaSet and one pod each; 50 of them in their
//!    own namespaces lat-0..lat-49 for figure 3, the rest in `default`) are created in the
//!    simulator's store before the controller starts, so the time to all Healthy (seen through a
//!    watch, ROLLOUTS_BENCH_SETUP_SECS at most) is a cold start of N Rollouts; the time to rest
//!    is from the controller's start to its last write once all are Healthy. Once all are
//!    Healthy and the controller has been quiet for 5 s (or 60 s have passed), a window of
//!    ROLLOUTS_BENCH_IDLE_SECS: the controller's writes (target zero; also per idle Rollout per
//!    minute) and other requests, its CPU time (utime+stime from /proc/<pid>/stat) and resident
//!    memory (VmRSS and peak VmHWM from /proc/<pid>/status). The benchmark process's own CPU and
//!    memory are mostly kube-sim's (the benchmark only sleeps in the window) and are shown as
//!    such. Each size in ROLLOUTS_BENCH_ROLLOUTS gets its own simulator and controller.
//! 3. Reconcile latency: for each of the 50 Rollouts in lat-*, one at a time while the rest are at
//!    rest, the time from sending the image change (the PATCH round trip included) to the first
//!    write the controller makes in that Rollout's namespace, seen by polling the request log
//!    every millisecond. Median and p99 (with 50 samples p99 is the slowest one).

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::ReplicaSet;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use rollouts_crds::rollout::{Rollout, RolloutStatus};
use rollouts_e2e::sim::{RequestRecord, SimHandle, SimOptions, start};
use serde_json::{Value, json};
use tokio::process::{Child, Command};

mod support;
use support::{cpu_seconds, memory};

/// The prefix of the controller's `User-Agent`, which tells its requests from the benchmark's.
const CONTROLLER_AGENT: &str = "rollouts-controller/";
const LATENCY_SAMPLES: usize = 50;
const POD_READY_AFTER: Duration = Duration::from_millis(200);

fn main() {
    let sizes = env_sizes("ROLLOUTS_BENCH_ROLLOUTS", 1000);
    let idle = Duration::from_secs(env_number("ROLLOUTS_BENCH_IDLE_SECS", 60) as u64);
    let setup = Duration::from_secs(env_number("ROLLOUTS_BENCH_SETUP_SECS", 900) as u64);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        writes_per_step().await;
        for rollouts in sizes {
            at_rest(rollouts, idle, setup).await;
        }
    });
}

/// Positive numbers separated by commas from the environment, or `default` when unset.
fn env_sizes(name: &str, default: usize) -> Vec<usize> {
    match std::env::var(name) {
        Ok(text) => text
            .split(',')
            .map(|size| {
                size.trim()
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .unwrap_or_else(|| {
                        panic!("{name}={text:?} is not a list of positive whole numbers: set it to e.g. 1000,10000")
                    })
            })
            .collect(),
        Err(_) => vec![default],
    }
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

/// Figure 1: the controller's writes while one canary moves through six steps.
async fn writes_per_step() {
    let cluster = Cluster::start("steps", 10_000);
    let controller = ControllerProcess::start(&cluster.kubeconfig);
    let steps = json!([
        {"setWeight": 25}, {"pause": {"duration": "1s"}},
        {"setWeight": 50}, {"pause": {"duration": "1s"}},
        {"setWeight": 75}, {"pause": {"duration": "1s"}}
    ]);
    let labels = [
        "0 setWeight 25",
        "1 pause 1s",
        "2 setWeight 50",
        "3 pause 1s",
        "4 setWeight 75",
        "5 pause 1s",
        "completion",
    ];
    let rollouts: Api<Rollout> = Api::namespaced(cluster.client.clone(), "default");
    rollouts
        .create(
            &PostParams::default(),
            &rollout("web", "default", 4, "app:v1", steps),
        )
        .await
        .expect("creates the Rollout");
    let v1 = poll("web Healthy on v1", Duration::from_secs(60), || async {
        let status = status_of(&rollouts, "web").await?;
        healthy(&status, 4).then_some(status.current_pod_hash)
    })
    .await;
    let mark = cluster.sim.requests().len();
    set_image(&rollouts, "web", "app:v2").await;

    // Cuts in the request log where currentStepIndex changes: cuts[k] opens row k.
    let mut cuts = vec![mark];
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = status_of(&rollouts, "web").await.unwrap_or_default();
        let index = if status.current_pod_hash == v1 {
            0
        } else {
            status.current_step_index.unwrap_or(0).max(0) as usize
        };
        while cuts.len() <= index.min(labels.len() - 1) {
            cuts.push(cluster.sim.requests().len());
        }
        if status.current_pod_hash != v1 && index == 6 && healthy(&status, 4) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "web did not finish its six steps within 60 s: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let old = format!("web-{v1}");
    poll(
        "the v1 ReplicaSet scaled to 0",
        Duration::from_secs(60),
        || {
            let replica_sets: Api<ReplicaSet> = Api::namespaced(cluster.client.clone(), "default");
            let old = old.clone();
            async move {
                let rs = replica_sets.get(&old).await.ok()?;
                (rs.spec?.replicas == Some(0)).then_some(())
            }
        },
    )
    .await;
    cluster
        .quiet(Duration::from_secs(2), Duration::from_secs(30))
        .await;
    let requests = cluster.sim.requests();
    drop(controller);

    println!("\n== 1. API writes by the controller per canary step (v1 -> v2, 4 replicas) ==");
    println!(
        "{:<16} {:>9} {:>9} {:>9} {:>7} {:>6} {:>6}  other",
        "step", "rs scale", "rs create", "status", "events", "other", "total"
    );
    let mut total = Tally::default();
    let mut others: BTreeMap<String, usize> = BTreeMap::new();
    for (row, label) in labels.iter().enumerate() {
        let from = cuts.get(row).copied().unwrap_or(requests.len());
        let to = cuts.get(row + 1).copied().unwrap_or(requests.len());
        let mut tally = Tally::default();
        for record in controller_writes(&requests[from..to]) {
            tally.add(record);
        }
        println!("{label:<16} {}", tally.row());
        for (kind, n) in &tally.other {
            *others.entry(kind.clone()).or_default() += n;
        }
        total.merge(&tally);
    }
    println!("{:<16} {}", "total", total.row());
    let without_events = total.total() - total.events;
    println!(
        "per step (6 steps, completion included): {:.2} writes without events \
         ({:.2} rs scale, {:.2} status), {:.2} events; target 1 scale + 1 status",
        without_events as f64 / 6.0,
        total.scale as f64 / 6.0,
        total.status as f64 / 6.0,
        total.events as f64 / 6.0
    );
    if !others.is_empty() {
        println!("other writes: {others:?}");
    }
}

/// Figures 2 and 3: N Rollouts at rest, then image changes one at a time.
async fn at_rest(n: usize, idle: Duration, setup: Duration) {
    let cluster = Cluster::start("rest", 8 * n + 10_000);
    let latency_rollouts = LATENCY_SAMPLES.min(n);
    let created = Instant::now();
    for i in 0..latency_rollouts {
        cluster
            .sim
            .create(
                "",
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("lat-{i}")}}),
            )
            .expect("creates a namespace");
    }
    let steps = json!([{"setWeight": 50}, {"pause": {"duration": "1s"}}]);
    for i in 0..n {
        let namespace = if i < latency_rollouts {
            format!("lat-{i}")
        } else {
            "default".to_string()
        };
        let object = serde_json::to_value(rollout(
            &format!("idle-{i}"),
            &namespace,
            1,
            "app:v1",
            steps.clone(),
        ))
        .expect("a Rollout serialises");
        cluster
            .sim
            .create(&namespace, object)
            .expect("creates a Rollout in the store");
    }
    let stored_in = created.elapsed();
    let started = Instant::now();
    let controller = ControllerProcess::start(&cluster.kubeconfig);
    // A watch decodes each change once; listing 10,000 Rollouts every few seconds cost the
    // benchmark process (shared with kube-sim) more CPU than kube-sim itself.
    let all: Api<Rollout> = Api::all(cluster.client.clone());
    let mut changes = watcher(all, watcher::Config::default()).boxed();
    let mut healthy_now: HashSet<String> = HashSet::new();
    let mut last_report = Instant::now();
    let deadline = tokio::time::Instant::now() + setup;
    while healthy_now.len() < n {
        let change = match tokio::time::timeout_at(deadline, changes.next()).await {
            Ok(Some(Ok(change))) => change,
            Ok(Some(Err(_))) => continue,
            Ok(None) | Err(_) => break,
        };
        match change {
            watcher::Event::Apply(r) | watcher::Event::InitApply(r) => {
                let key = format!("{}/{}", r.namespace().unwrap_or_default(), r.name_any());
                if r.status.as_ref().is_some_and(|s| healthy(s, 1)) {
                    healthy_now.insert(key);
                } else {
                    healthy_now.remove(&key);
                }
            }
            watcher::Event::Delete(r) => {
                healthy_now.remove(&format!(
                    "{}/{}",
                    r.namespace().unwrap_or_default(),
                    r.name_any()
                ));
            }
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
        if last_report.elapsed() > Duration::from_secs(15) {
            eprintln!(
                "scale bench: {}/{n} Healthy after {:.0} s",
                healthy_now.len(),
                started.elapsed().as_secs_f64()
            );
            last_report = Instant::now();
        }
    }
    drop(changes);
    let healthy_count = healthy_now.len();
    let cold_start = started.elapsed();
    let setup_writes = controller_writes(&cluster.sim.requests()).count();
    let rss_healthy = memory(controller.pid);
    // Keeps the log (and the snapshots `quiet` takes of it) small.
    cluster.sim.clear_requests();
    let quiet_for = Duration::from_secs(5);
    let settled = cluster.quiet(quiet_for, Duration::from_secs(60)).await;
    // `quiet` returns once the last write is `quiet_for` old: rest began then.
    let at_rest_after = started.elapsed().saturating_sub(quiet_for);

    cluster.sim.clear_requests();
    let cpu_before = cpu_seconds(controller.pid);
    let own_before = cpu_seconds(std::process::id());
    let window_start = Instant::now();
    tokio::time::sleep(idle).await;
    let window = window_start.elapsed().as_secs_f64();
    let cpu = cpu_seconds(controller.pid) - cpu_before;
    let own_cpu = cpu_seconds(std::process::id()) - own_before;
    let rss_idle = memory(controller.pid);
    let own_memory = memory(std::process::id());
    let requests = cluster.sim.requests();
    let mut writes = Tally::default();
    for record in controller_writes(&requests) {
        writes.add(record);
    }
    let mut reads: BTreeMap<String, usize> = BTreeMap::new();
    for record in requests
        .iter()
        .filter(|r| r.user_agent.starts_with(CONTROLLER_AGENT) && !is_write(r))
    {
        *reads
            .entry(format!("{} {}", record.verb, record.resource))
            .or_default() += 1;
    }

    println!("\n== 2. {n} Rollouts at rest (replicas 1) ==");
    println!(
        "setup: {n} Rollouts stored in {:.2} s; {healthy_count}/{n} Healthy {:.1} s after the \
         controller started, with {setup_writes} controller writes; quiet before the window: {}",
        stored_in.as_secs_f64(),
        cold_start.as_secs_f64(),
        if settled {
            "yes"
        } else {
            "no (still writing after 60 s)"
        }
    );
    if settled && healthy_count == n {
        println!(
            "at rest (all Healthy, last write) {:.1} s after the controller started",
            at_rest_after.as_secs_f64()
        );
    } else {
        println!("did not reach rest: {healthy_count}/{n} Healthy, quiet: {settled}");
    }
    println!("objects in kube-sim: {}", cluster.sim.object_count());
    println!("idle window: {window:.1} s");
    println!(
        "  controller writes: {} (target 0){}",
        writes.total(),
        if writes.total() > 0 {
            format!(
                ": rs scale {}, rs create {}, status {}, events {}, other {:?}",
                writes.scale, writes.create, writes.status, writes.events, writes.other
            )
        } else {
            String::new()
        }
    );
    println!(
        "  controller writes per idle Rollout per minute: {:.4}",
        writes.total() as f64 / n as f64 / (window / 60.0)
    );
    println!("  controller reads and watches: {reads:?}");
    println!(
        "  controller CPU: {cpu:.2} s ({:.2}% of one core)",
        100.0 * cpu / window
    );
    println!(
        "  controller memory: VmRSS {} MB once Healthy, {} MB after the window, peak VmHWM {} MB \
         (budget at 10,000: < 500 MB)",
        rss_healthy.rss_mb, rss_idle.rss_mb, rss_idle.hwm_mb
    );
    println!(
        "  kube-sim + benchmark process: CPU {own_cpu:.2} s ({:.2}% of one core), VmRSS {} MB",
        100.0 * own_cpu / window,
        own_memory.rss_mb
    );

    let mut samples = Vec::new();
    let mut missed = 0;
    for i in 0..latency_rollouts {
        // A stalled simulator would otherwise cost 30 s per sample.
        if missed >= 3 {
            break;
        }
        let namespace = format!("lat-{i}");
        let api: Api<Rollout> = Api::namespaced(cluster.client.clone(), &namespace);
        cluster.sim.clear_requests();
        let sent = Instant::now();
        set_image(&api, &format!("idle-{i}"), "app:v2").await;
        let deadline = sent + Duration::from_secs(30);
        loop {
            let seen = controller_writes(&cluster.sim.requests()).any(|r| r.namespace == namespace);
            if seen {
                samples.push(sent.elapsed());
                break;
            }
            if Instant::now() > deadline {
                missed += 1;
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    drop(controller);
    samples.sort();
    println!("\n== 3. Reconcile latency at rest ({n} Rollouts) ==");
    if samples.is_empty() {
        println!("no write seen within 30 s of any of {latency_rollouts} image changes");
    } else {
        let at = |q: f64| {
            let index = ((samples.len() - 1) as f64 * q).round() as usize;
            samples[index].as_secs_f64() * 1000.0
        };
        println!(
            "image change -> first controller write: median {:.1} ms, p99 {:.1} ms, max {:.1} ms \
             over {} samples{}",
            at(0.5),
            at(0.99),
            at(1.0),
            samples.len(),
            if missed > 0 {
                format!(" ({missed} saw no write within 30 s; stopped after 3 such)")
            } else {
                String::new()
            }
        );
    }
}

/// A simulator with the project's CRDs, a kubeconfig for it and a client.
struct Cluster {
    sim: SimHandle,
    kubeconfig: PathBuf,
    client: Client,
    _dir: TempDir,
}

impl Cluster {
    fn start(name: &str, event_log_capacity: usize) -> Self {
        let crds = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../crds/yaml");
        let sim = start(SimOptions {
            crd_dirs: vec![crds],
            pod_ready_after: POD_READY_AFTER,
            // Watchers that fall behind a burst of N creates must not be forced to relist.
            event_log_capacity,
            // The traffic and metrics simulation would only add load to the figures.
            metrics_listen: None,
            ..SimOptions::default()
        })
        .expect("kube-sim starts on a loopback port");
        let dir = TempDir::new(name);
        let kubeconfig = dir.0.join("kubeconfig.yaml");
        sim.write_kubeconfig(&kubeconfig)
            .expect("writes the kubeconfig");
        let config = kube::Config::new(sim.url().parse().expect("the simulator URL is a URI"));
        let client = Client::try_from(config).expect("a client for a plain-HTTP server");
        Self {
            sim,
            kubeconfig,
            client,
            _dir: dir,
        }
    }

    /// Waits until the controller has made no write for `quiet`; false if `limit` passed first.
    async fn quiet(&self, quiet: Duration, limit: Duration) -> bool {
        let started = Instant::now();
        let mut count = controller_writes(&self.sim.requests()).count();
        let mut since = Instant::now();
        while started.elapsed() < limit {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = controller_writes(&self.sim.requests()).count();
            if now != count {
                count = now;
                since = Instant::now();
            } else if since.elapsed() >= quiet {
                return true;
            }
        }
        false
    }
}

fn is_write(record: &RequestRecord) -> bool {
    matches!(
        record.verb.as_str(),
        "create" | "update" | "patch" | "delete" | "deletecollection"
    )
}

/// The controller's writes, leases aside.
fn controller_writes(requests: &[RequestRecord]) -> impl Iterator<Item = &RequestRecord> {
    requests.iter().filter(|r| {
        r.user_agent.starts_with(CONTROLLER_AGENT) && is_write(r) && r.resource != "leases"
    })
}

/// Writes counted by kind.
#[derive(Default)]
struct Tally {
    scale: usize,
    create: usize,
    status: usize,
    events: usize,
    other: BTreeMap<String, usize>,
}

impl Tally {
    fn add(&mut self, record: &RequestRecord) {
        match (
            record.resource.as_str(),
            record.subresource.as_str(),
            record.verb.as_str(),
        ) {
            ("replicasets", "" | "scale", "patch" | "update") => self.scale += 1,
            ("replicasets", "", "create") => self.create += 1,
            ("rollouts", "status", "patch" | "update") => self.status += 1,
            ("events", _, _) => self.events += 1,
            (resource, subresource, verb) => {
                let kind = if subresource.is_empty() {
                    format!("{verb} {resource}")
                } else {
                    format!("{verb} {resource}/{subresource}")
                };
                *self.other.entry(kind).or_default() += 1;
            }
        }
    }

    fn merge(&mut self, other: &Tally) {
        self.scale += other.scale;
        self.create += other.create;
        self.status += other.status;
        self.events += other.events;
        for (kind, n) in &other.other {
            *self.other.entry(kind.clone()).or_default() += n;
        }
    }

    fn others(&self) -> usize {
        self.other.values().sum()
    }

    fn total(&self) -> usize {
        self.scale + self.create + self.status + self.events + self.others()
    }

    fn row(&self) -> String {
        format!(
            "{:>9} {:>9} {:>9} {:>7} {:>6} {:>6}",
            self.scale,
            self.create,
            self.status,
            self.events,
            self.others(),
            self.total()
        )
    }
}

/// A canary Rollout of `replicas` pods of `image` with the given steps.
fn rollout(name: &str, namespace: &str, replicas: i32, image: &str, steps: Value) -> Rollout {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": image}]}
            },
            "strategy": {"canary": {"steps": steps}}
        }
    }))
    .expect("a valid Rollout")
}

async fn status_of(api: &Api<Rollout>, name: &str) -> Option<RolloutStatus> {
    api.get(name).await.ok()?.status
}

/// Healthy on its current revision with every pod available (what Argo CD calls Healthy).
fn healthy(status: &RolloutStatus, replicas: i32) -> bool {
    status.phase == "Healthy"
        && !status.current_pod_hash.is_empty()
        && status.stable_rs == status.current_pod_hash
        && status.available_replicas == replicas
        && status.replicas == replicas
}

async fn set_image(api: &Api<Rollout>, name: &str, image: &str) {
    let patch =
        json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "image": image}]}}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("changes the image of Rollout {name}: {e}"));
}

/// Polls `check` until it gives a value; panics with `what` after `limit`.
async fn poll<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The controller binary; killed when dropped.
struct ControllerProcess {
    _child: Child,
    pid: u32,
}

impl ControllerProcess {
    fn start(kubeconfig: &PathBuf) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_rollouts-controller"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--leader-elect=false", "--log-level", "warn"])
            .args([
                "--metrics-addr",
                "127.0.0.1:0",
                "--health-addr",
                "127.0.0.1:0",
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
    fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "rollouts-scale-bench-{name}-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&path).expect("creates temp dir");
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
