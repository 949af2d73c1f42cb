//! Scale benchmark of the real `rollouts-controller` binary against kube-sim (in-process, CRDs
//! from crds/yaml, and e2e/crds for the realistic profile). It prints figures and exits 0; it
//! asserts nothing (the smoke test `controller/tests/scale_smoke_on_sim.rs` asserts).
//!
//! Run: `cargo bench -p rollouts-controller --bench scale`
//!   ROLLOUTS_BENCH_PROFILES=easy,realistic  profiles, each run at every size (default easy)
//!   ROLLOUTS_BENCH_ROLLOUTS=1000,10000   Rollouts, one run per size and profile (default 1000)
//!   ROLLOUTS_BENCH_IDLE_SECS=600    length of the idle window (default 60; 600 or more lets
//!                                   the watches' 290 s renewals happen inside it)
//!   ROLLOUTS_BENCH_SETUP_SECS=900   how long the Rollouts may take to become Healthy (default 900)
//!   ROLLOUTS_BENCH_TRICKLE_SECS=120 how long releases trickle (default 120)
//!   ROLLOUTS_BENCH_SEED=1           seed of the realistic profile's pod readiness (default 1)
//!   ROLLOUTS_BENCH_QPS, ROLLOUTS_BENCH_BURST  the controller's --qps and --burst (both or
//!                                   neither; default: the controller's defaults)
//!   ROLLOUTS_BENCH_EVENT_LOG=70000  kube-sim's watch event log, in events (default 40 per
//!                                   Rollout + 10,000; each event holds an object version, so
//!                                   10,000 realistic Rollouts need a shorter one to fit in memory)
//!   ROLLOUTS_BENCH_CONTROLLER_WRAPPER=path  a program started instead of the controller, with
//!                                   the controller's path and arguments; it must `exec` them
//!                                   (so the pid is the controller's), e.g. a script that sets
//!                                   LD_PRELOAD for a heap profiler
//!
//! Profiles: `easy` is one replica per Rollout, one container with only an image, no Services,
//! routers or analysis, pods Ready 200 ms after creation. `realistic` is
//! `rollouts_e2e::scale_profile`: 3 to 10 replicas with full pod templates, a stable and a canary
//! Service each, a router for a third (nginx, Istio, Gateway API), a background or step analysis
//! whose query carries the Rollout's canary hash, pods Ready after 2 to 10 s (seeded), 5% of them
//! failing their first start; ten Rollouts per namespace.
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
//! 2. Cold start and rest: N Rollouts (and their objects) are created in the simulator's store
//!    before the controller starts, so the time to all Healthy (seen through a watch,
//!    ROLLOUTS_BENCH_SETUP_SECS at most) is a cold start of N Rollouts; meanwhile the
//!    controller's requests are counted each second (peak and mean, against --qps). The time to
//!    rest is from the controller's start to its last write once all are Healthy. Once all are
//!    Healthy and the controller has been quiet for 5 s (or 60 s have passed), a window of
//!    ROLLOUTS_BENCH_IDLE_SECS: the controller's writes (target zero; also per idle Rollout per
//!    minute) and reads (target: watch renewals only), its CPU time (utime+stime from
//!    /proc/<pid>/stat) and resident memory (VmRSS, per Rollout, and peak VmHWM from
//!    /proc/<pid>/status). The benchmark process's own CPU and memory are mostly kube-sim's (the
//!    benchmark only sleeps in the window) and are shown as such.
//! 3. Reaction at rest: for 50 Rollouts each alone in its namespace (easy: lat-0..lat-49;
//!    realistic: the first of 50 namespaces), one at a time while the rest are at rest, the time
//!    from sending the image change (the PATCH round trip included, and shown on its own) to
//!    the first write the controller makes in that namespace, polling the request log every
//!    millisecond. Median and p99 (with 50 samples p99 is the slowest one).
//! 4. Reaction while releases trickle: for ROLLOUTS_BENCH_TRICKLE_SECS, 1% of the Rollouts per
//!    minute get a new image (easy: the 50 lat-* Rollouts in turn), each in a namespace with no
//!    other release under way, timed as in 3; the controller's writes meanwhile; with the
//!    realistic profile, the queries the Prometheus stand-in received (distinct per canary hash).
//! 5. Restart: once every Rollout is Healthy again and the controller quiet, it is killed and
//!    started again: the time until its /readyz answers 200 and its writes in the first 30 s
//!    (target 0).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::ReplicaSet;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use rollouts_crds::rollout::{Rollout, RolloutStatus};
use rollouts_e2e::fake_prometheus::FakePrometheus;
use rollouts_e2e::scale_profile;
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
    let profiles: Vec<Profile> = std::env::var("ROLLOUTS_BENCH_PROFILES")
        .unwrap_or_else(|_| "easy".to_string())
        .split(',')
        .map(Profile::parse)
        .collect();
    let sizes = env_sizes("ROLLOUTS_BENCH_ROLLOUTS", 1000);
    let settings = Settings {
        idle: Duration::from_secs(env_number("ROLLOUTS_BENCH_IDLE_SECS", 60) as u64),
        setup: Duration::from_secs(env_number("ROLLOUTS_BENCH_SETUP_SECS", 900) as u64),
        trickle: Duration::from_secs(env_number("ROLLOUTS_BENCH_TRICKLE_SECS", 120) as u64),
        seed: env_number("ROLLOUTS_BENCH_SEED", 1) as u64,
        event_log: std::env::var("ROLLOUTS_BENCH_EVENT_LOG")
            .ok()
            .map(|_| env_number("ROLLOUTS_BENCH_EVENT_LOG", 70_000)),
        client_limit: match (
            std::env::var("ROLLOUTS_BENCH_QPS"),
            std::env::var("ROLLOUTS_BENCH_BURST"),
        ) {
            (Ok(qps), Ok(burst)) => Some((qps, burst)),
            (Err(_), Err(_)) => None,
            _ => panic!("set ROLLOUTS_BENCH_QPS and ROLLOUTS_BENCH_BURST together, or neither"),
        },
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        writes_per_step(&settings).await;
        for profile in profiles {
            for &rollouts in &sizes {
                at_rest(profile, rollouts, &settings).await;
            }
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
async fn writes_per_step(settings: &Settings) {
    let cluster = Cluster::start("steps", 10_000, Profile::Easy, settings.seed);
    let controller = ControllerProcess::start(&cluster.kubeconfig, settings);
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

/// Where the Rollouts of a run live and how they are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Profile {
    /// One replica, one container with only an image, no Services, routers or analysis, pods
    /// Ready 200 ms after creation; 50 Rollouts in namespaces of their own (lat-*), the rest
    /// in `default`.
    Easy,
    /// `rollouts_e2e::scale_profile`: 3 to 10 replicas, full pod templates, two Services each,
    /// a router for a third, analysis with per-Rollout arguments, pods Ready after 2 to 10 s
    /// (seeded), 5% failing their first start; ten Rollouts per namespace.
    Realistic,
}

impl Profile {
    fn parse(text: &str) -> Self {
        match text.trim() {
            "easy" => Profile::Easy,
            "realistic" => Profile::Realistic,
            other => panic!(
                "ROLLOUTS_BENCH_PROFILES: {other:?} is not a profile: use easy, realistic or both (easy,realistic)"
            ),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Profile::Easy => "easy",
            Profile::Realistic => "realistic",
        }
    }

    /// How long after a release its namespace is left alone by the trickle, so the first
    /// controller write seen there belongs to the new release.
    fn release_takes(self) -> Duration {
        match self {
            Profile::Easy => Duration::from_secs(10),
            // Two pauses, an analysis, pods Ready after up to 10 s (20 s after a failed start)
            // and the previous stable's 30 s scale-down delay behind a router.
            Profile::Realistic => Duration::from_secs(180),
        }
    }
}

/// The environment's settings for the at-rest runs.
struct Settings {
    idle: Duration,
    setup: Duration,
    trickle: Duration,
    seed: u64,
    /// kube-sim's event log for the run at rest; 40 per Rollout + 10,000 when unset.
    event_log: Option<usize>,
    /// `--qps` and `--burst` for the controller; its defaults when unset.
    client_limit: Option<(String, String)>,
}

/// One Rollout the benchmark releases and times.
#[derive(Clone)]
struct Target {
    namespace: String,
    name: String,
}

/// Figures 2 to 6: N Rollouts from cold start to rest, image changes one at a time, releases
/// trickling, and a controller restart.
async fn at_rest(profile: Profile, n: usize, settings: &Settings) {
    let event_log = settings.event_log.unwrap_or(40 * n + 10_000);
    let cluster = Cluster::start("rest", event_log, profile, settings.seed);
    // Kept for the whole run: the analysis template's provider.
    let prometheus = match profile {
        Profile::Easy => None,
        Profile::Realistic => {
            let prometheus = FakePrometheus::start().await;
            prometheus.answer_every_query("0.99");
            Some(prometheus)
        }
    };
    let created = Instant::now();
    let (targets, candidates) = store_rollouts(&cluster, profile, n, prometheus.as_ref());
    let stored_in = created.elapsed();
    let started = Instant::now();
    let mut controller = ControllerProcess::start(&cluster.kubeconfig, settings);
    let cold = wait_healthy(&cluster, n, settings.setup, started).await;
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
    tokio::time::sleep(settings.idle).await;
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
    let reads = controller_reads(&requests);

    let title = format!("{n} Rollouts, {} profile", profile.label());
    println!("\n== 2. {title}: cold start and rest ==");
    println!(
        "setup: {n} Rollouts stored in {:.2} s; {}/{n} Healthy {:.1} s after the controller \
         started, with {setup_writes} controller writes; quiet before the window: {}",
        stored_in.as_secs_f64(),
        cold.healthy,
        cold.elapsed.as_secs_f64(),
        if settled {
            "yes"
        } else {
            "no (still writing after 60 s)"
        }
    );
    println!(
        "cold-start API load (controller requests per second): peak {}, mean {:.1}, over {} s; \
         configured --qps {} --burst {}",
        cold.peak_rps,
        cold.mean_rps,
        cold.seconds,
        settings.client_limit.as_ref().map_or_else(
            || format!("{} (default)", rollouts_controller::cli::DEFAULT_QPS),
            |(qps, _)| qps.clone()
        ),
        settings.client_limit.as_ref().map_or_else(
            || format!("{} (default)", rollouts_controller::cli::DEFAULT_BURST),
            |(_, burst)| burst.clone()
        ),
    );
    if settled && cold.healthy == n {
        println!(
            "at rest (all Healthy, last write) {:.1} s after the controller started",
            at_rest_after.as_secs_f64()
        );
    } else {
        println!(
            "did not reach rest: {}/{n} Healthy, quiet: {settled}",
            cold.healthy
        );
    }
    println!(
        "objects in kube-sim: {} (watch event log: {event_log} events)",
        cluster.sim.object_count()
    );
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
    println!("  controller reads and watches (target: watch renewals only): {reads:?}");
    println!(
        "  controller CPU: {cpu:.2} s ({:.2}% of one core)",
        100.0 * cpu / window
    );
    println!(
        "  controller memory: VmRSS {} MB once Healthy, {} MB after the window ({:.1} KB per \
         Rollout; target < 30 KB), peak VmHWM {} MB; after the window RssAnon {} MB ({:.1} KB \
         per Rollout), RssFile {} MB (the binary's code)",
        rss_healthy.rss_mb,
        rss_idle.rss_mb,
        rss_idle.rss_mb as f64 * 1024.0 / n as f64,
        rss_idle.hwm_mb,
        rss_idle.anon_mb,
        rss_idle.anon_mb as f64 * 1024.0 / n as f64,
        rss_idle.file_mb
    );
    println!(
        "  kube-sim + benchmark process: CPU {own_cpu:.2} s ({:.2}% of one core), VmRSS {} MB",
        100.0 * own_cpu / window,
        own_memory.rss_mb
    );

    let (samples, round_trips, missed) = one_at_a_time(&cluster, &targets).await;
    println!("\n== 3. {title}: image change -> first controller write, one at a time at rest ==");
    print_latency(&samples, missed, targets.len());
    print_latency_line("  of which the image PATCH round trip", &round_trips);

    let trickled = trickle(&cluster, profile, n, &candidates, settings.trickle).await;
    println!(
        "\n== 4. {title}: releases trickling (1% of the Rollouts per minute) for {} s ==",
        settings.trickle.as_secs()
    );
    println!(
        "  {} releases, controller writes meanwhile {} ({:.1} per release, events {})",
        trickled.releases,
        trickled.writes.total(),
        trickled.writes.total() as f64 / trickled.releases.max(1) as f64,
        trickled.writes.events
    );
    print_latency(&trickled.samples, trickled.missed, trickled.releases);
    if let Some(prometheus) = &prometheus {
        let queries = prometheus.requests();
        let distinct: HashSet<&str> = queries.iter().map(|q| q.query()).collect();
        println!(
            "  Prometheus queries since the start: {} ({} distinct queries, one per canary \
             hash and Rollout)",
            queries.len(),
            distinct.len()
        );
    }

    // Restart once every release has finished and the controller is quiet.
    let settled = wait_healthy(&cluster, n, Duration::from_secs(300), Instant::now()).await;
    let quiet = cluster
        .quiet(Duration::from_secs(5), Duration::from_secs(120))
        .await;
    cluster.sim.clear_requests();
    drop(controller);
    let restarted = Instant::now();
    controller = ControllerProcess::start(&cluster.kubeconfig, settings);
    let ready = controller.wait_ready(Duration::from_secs(120)).await;
    let ready_after = restarted.elapsed();
    let restart_window = Duration::from_secs(30);
    tokio::time::sleep(restart_window.saturating_sub(restarted.elapsed())).await;
    let requests = cluster.sim.requests();
    let mut restart_writes = Tally::default();
    for record in controller_writes(&requests) {
        restart_writes.add(record);
    }
    println!("\n== 5. {title}: controller restart ==");
    println!(
        "  before: {}/{n} Healthy after the releases, quiet: {quiet}",
        settled.healthy
    );
    println!(
        "  /readyz answered 200 {:.2} s after the restart{}",
        ready_after.as_secs_f64(),
        if ready { "" } else { " (timed out)" }
    );
    println!(
        "  writes in the first {} s: {} (target 0){}",
        restart_window.as_secs(),
        restart_writes.total(),
        if restart_writes.total() > 0 {
            format!(
                ": rs scale {}, rs create {}, status {}, events {}, other {:?}",
                restart_writes.scale,
                restart_writes.create,
                restart_writes.status,
                restart_writes.events,
                restart_writes.other
            )
        } else {
            String::new()
        }
    );
    println!("  reads: {:?}", controller_reads(&requests));
    drop(controller);
}

/// Puts the namespaces, objects and Rollouts of `profile` into the store; returns the Rollouts
/// timed one at a time (each alone in its namespace) and those the trickle may release.
fn store_rollouts(
    cluster: &Cluster,
    profile: Profile,
    n: usize,
    prometheus: Option<&FakePrometheus>,
) -> (Vec<Target>, Vec<Target>) {
    let create = |namespace: &str, object: Value| {
        cluster
            .sim
            .create(namespace, object)
            .unwrap_or_else(|e| panic!("creates an object in the store: {e:?}"))
    };
    match profile {
        Profile::Easy => {
            let latency_rollouts = LATENCY_SAMPLES.min(n);
            for i in 0..latency_rollouts {
                create(
                    "",
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("lat-{i}")}}),
                );
            }
            let steps = json!([{"setWeight": 50}, {"pause": {"duration": "1s"}}]);
            let mut targets = Vec::new();
            for i in 0..n {
                let namespace = if i < latency_rollouts {
                    format!("lat-{i}")
                } else {
                    "default".to_string()
                };
                let name = format!("idle-{i}");
                let object =
                    serde_json::to_value(rollout(&name, &namespace, 1, "app:v1", steps.clone()))
                        .expect("a Rollout serialises");
                create(&namespace, object);
                if i < latency_rollouts {
                    targets.push(Target { namespace, name });
                }
            }
            // The trickle releases the Rollouts alone in their namespaces, again and again.
            (targets.clone(), targets)
        }
        Profile::Realistic => {
            let address = prometheus.map_or("", |p| p.address.as_str());
            create("", scale_profile::analysis_template(address));
            for namespace in scale_profile::namespaces(n) {
                create("", namespace);
            }
            let mut all = Vec::with_capacity(n);
            for i in 0..n {
                for (namespace, object) in scale_profile::objects(i, "app:v1") {
                    create(&namespace, object);
                }
                all.push(Target {
                    namespace: scale_profile::namespace(i),
                    name: scale_profile::name(i),
                });
            }
            let targets = all
                .iter()
                .step_by(scale_profile::PER_NAMESPACE)
                .take(LATENCY_SAMPLES)
                .cloned()
                .collect();
            (targets, all)
        }
    }
}

/// How a wait for every Rollout to be Healthy went, with the controller's request rate.
struct Healthy {
    healthy: usize,
    elapsed: Duration,
    peak_rps: usize,
    mean_rps: f64,
    seconds: usize,
}

/// Waits (at most `limit`) until all `n` Rollouts are Healthy, seen through a watch; counts
/// the controller's requests each second meanwhile.
async fn wait_healthy(cluster: &Cluster, n: usize, limit: Duration, started: Instant) -> Healthy {
    // A watch decodes each change once; listing 10,000 Rollouts every few seconds cost the
    // benchmark process (shared with kube-sim) more CPU than kube-sim itself.
    let all: Api<Rollout> = Api::all(cluster.client.clone());
    let mut changes = watcher(all, watcher::Config::default()).boxed();
    let mut healthy_now: HashSet<String> = HashSet::new();
    // The latest state of each Rollout not Healthy, to say why if the wait ends short.
    let mut pending: HashMap<String, Rollout> = HashMap::new();
    let mut last_report = Instant::now();
    let deadline = tokio::time::Instant::now() + limit;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut seen = cluster.sim.request_count();
    let mut per_second: Vec<usize> = Vec::new();
    while healthy_now.len() < n {
        let change = tokio::select! {
            change = tokio::time::timeout_at(deadline, changes.next()) => change,
            _ = tick.tick() => {
                let new = cluster.sim.requests_since(seen);
                seen += new.len();
                per_second.push(
                    new.iter().filter(|r| r.user_agent.starts_with(CONTROLLER_AGENT)).count(),
                );
                continue;
            }
        };
        let change = match change {
            Ok(Some(Ok(change))) => change,
            Ok(Some(Err(_))) => continue,
            Ok(None) | Err(_) => break,
        };
        match change {
            watcher::Event::Apply(r) | watcher::Event::InitApply(r) => {
                let key = format!("{}/{}", r.namespace().unwrap_or_default(), r.name_any());
                if rollout_healthy(&r) {
                    pending.remove(&key);
                    healthy_now.insert(key);
                } else {
                    healthy_now.remove(&key);
                    pending.insert(key, r);
                }
            }
            watcher::Event::Delete(r) => {
                let key = format!("{}/{}", r.namespace().unwrap_or_default(), r.name_any());
                healthy_now.remove(&key);
                pending.remove(&key);
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
    if healthy_now.len() < n {
        report_not_healthy(cluster, n, healthy_now.len(), &pending).await;
    }
    // The first tick fires at once, before any request: it is not a second of load.
    let counted = per_second.get(1..).unwrap_or_default();
    Healthy {
        healthy: healthy_now.len(),
        elapsed: started.elapsed(),
        peak_rps: counted.iter().copied().max().unwrap_or(0),
        mean_rps: counted.iter().sum::<usize>() as f64 / counted.len().max(1) as f64,
        seconds: counted.len(),
    }
}

/// Says why a wait ended short: how many Rollouts the watch never showed, and for up to ten
/// of those it last showed not Healthy, their status as read again now, so a change the watch
/// missed shows as a newer resourceVersion.
async fn report_not_healthy(
    cluster: &Cluster,
    n: usize,
    healthy: usize,
    pending: &HashMap<String, Rollout>,
) {
    let unseen = n.saturating_sub(healthy + pending.len());
    if unseen > 0 {
        eprintln!("scale bench: {unseen} Rollouts never seen through the watch");
    }
    let mut keys: Vec<&String> = pending.keys().collect();
    keys.sort();
    for key in keys.into_iter().take(10) {
        let watched = &pending[key];
        let api: Api<Rollout> = Api::namespaced(
            cluster.client.clone(),
            &watched.namespace().unwrap_or_default(),
        );
        let now = match api.get(&watched.name_any()).await {
            Ok(now) => now,
            Err(error) => {
                eprintln!("scale bench: not Healthy: {key}: cannot read it again: {error}");
                continue;
            }
        };
        eprintln!(
            "scale bench: not Healthy: {key} (resourceVersion {:?} watched, {:?} now; Healthy \
             now: {}): {}",
            watched.resource_version(),
            now.resource_version(),
            rollout_healthy(&now),
            why_not_healthy(&now)
        );
    }
}

/// What a Rollout's status says, for one that is not Healthy: phase, message, step, revision
/// hashes, replica counts and its conditions.
fn why_not_healthy(rollout: &Rollout) -> String {
    let Some(status) = rollout.status.as_ref() else {
        return "no status".to_string();
    };
    let conditions: Vec<String> = status
        .conditions
        .iter()
        .map(|c| format!("{}={} ({}: {})", c.type_, c.status, c.reason, c.message))
        .collect();
    format!(
        "phase {:?}, message {:?}, step {:?}, abort {}, pauses {}, current {:?}, stable {:?}, \
         replicas {} updated {} ready {} available {} of {}, generation {:?} observed {:?}, \
         conditions [{}]",
        status.phase,
        status.message,
        status.current_step_index,
        status.abort,
        status.pause_conditions.len(),
        status.current_pod_hash,
        status.stable_rs,
        status.replicas,
        status.updated_replicas,
        status.ready_replicas,
        status.available_replicas,
        rollout.spec.replicas.unwrap_or(1),
        rollout.metadata.generation,
        status.observed_generation,
        conditions.join("; ")
    )
}

/// Healthy on its current revision with every pod of the spec available.
fn rollout_healthy(rollout: &Rollout) -> bool {
    rollout.status.as_ref().is_some_and(|status| {
        status.phase == "Healthy"
            && !status.current_pod_hash.is_empty()
            && status.stable_rs == status.current_pod_hash
            && status.available_replicas == rollout.spec.replicas.unwrap_or(1)
    })
}

/// Releases each target in turn while the rest are at rest: the time from sending the image
/// change to the first controller write in its namespace, and the PATCH's own round trip.
async fn one_at_a_time(
    cluster: &Cluster,
    targets: &[Target],
) -> (Vec<Duration>, Vec<Duration>, usize) {
    let mut samples = Vec::new();
    let mut round_trips = Vec::new();
    let mut missed = 0;
    for target in targets {
        // A stalled simulator would otherwise cost 30 s per sample.
        if missed >= 3 {
            break;
        }
        let api: Api<Rollout> = Api::namespaced(cluster.client.clone(), &target.namespace);
        cluster.sim.clear_requests();
        let sent = Instant::now();
        set_image(&api, &target.name, "app:v2").await;
        round_trips.push(sent.elapsed());
        let deadline = sent + Duration::from_secs(30);
        let mut seen = 0;
        loop {
            let new = cluster.sim.requests_since(seen);
            seen += new.len();
            if controller_writes(&new).any(|r| r.namespace == target.namespace) {
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
    (samples, round_trips, missed)
}

/// What the trickle of releases measured.
struct Trickled {
    releases: usize,
    samples: Vec<Duration>,
    missed: usize,
    writes: Tally,
}

/// For `length`, releases 1% of the `n` Rollouts per minute, each to a new image, picking
/// among `candidates` one whose namespace has seen no release for the profile's release time;
/// times each release to the controller's first write in its namespace.
async fn trickle(
    cluster: &Cluster,
    profile: Profile,
    n: usize,
    candidates: &[Target],
    length: Duration,
) -> Trickled {
    let every = Duration::from_secs_f64(60.0 / (0.01 * n as f64).max(1.0 / 60.0));
    let mut released_at: HashMap<String, Instant> = HashMap::new();
    let mut pending: Vec<(String, Instant)> = Vec::new();
    let mut samples = Vec::new();
    let mut releases = 0;
    let mut missed = 0;
    let mut writes = Tally::default();
    cluster.sim.clear_requests();
    let mut seen = 0;
    let started = Instant::now();
    let mut next_release = started;
    let mut pick = 0usize;
    while started.elapsed() < length || !pending.is_empty() {
        let now = Instant::now();
        if now >= next_release && started.elapsed() < length {
            next_release += every;
            // A stride coprime with most lengths walks every candidate in a scattered order.
            let free = (0..candidates.len()).find_map(|step| {
                let target = &candidates[(pick * 7919 + step) % candidates.len()];
                let busy = released_at
                    .get(&target.namespace)
                    .is_some_and(|at| at.elapsed() < profile.release_takes());
                (!busy).then_some(target)
            });
            pick += 1;
            if let Some(target) = free {
                releases += 1;
                let api: Api<Rollout> = Api::namespaced(cluster.client.clone(), &target.namespace);
                let sent = Instant::now();
                released_at.insert(target.namespace.clone(), sent);
                pending.push((target.namespace.clone(), sent));
                set_image(&api, &target.name, &format!("app:t{releases}")).await;
            }
        }
        let new = cluster.sim.requests_since(seen);
        seen += new.len();
        for record in controller_writes(&new) {
            writes.add(record);
            if let Some(at) = pending.iter().position(|(ns, _)| *ns == record.namespace) {
                samples.push(pending.swap_remove(at).1.elapsed());
            }
        }
        pending.retain(|(_, sent)| {
            let late = sent.elapsed() > Duration::from_secs(30);
            missed += usize::from(late);
            !late
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Trickled {
        releases,
        samples,
        missed,
        writes,
    }
}

fn print_latency(samples: &[Duration], missed: usize, tried: usize) {
    if samples.is_empty() {
        println!("  no write seen within 30 s of any of {tried} image changes");
        return;
    }
    print_latency_line("  image change -> first controller write", samples);
    if missed > 0 {
        println!("  {missed} of {tried} saw no write within 30 s");
    }
}

/// Median, p99 and max of `samples` in milliseconds (with 50 samples p99 is the slowest).
fn print_latency_line(label: &str, samples: &[Duration]) {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let Some(last) = sorted.len().checked_sub(1) else {
        return;
    };
    let at = |q: f64| sorted[(last as f64 * q).round() as usize].as_secs_f64() * 1000.0;
    println!(
        "{label}: median {:.1} ms, p99 {:.1} ms, max {:.1} ms over {} samples",
        at(0.5),
        at(0.99),
        at(1.0),
        sorted.len()
    );
}

/// The controller's reads, by verb and resource.
fn controller_reads(requests: &[RequestRecord]) -> BTreeMap<String, usize> {
    let mut reads: BTreeMap<String, usize> = BTreeMap::new();
    for record in requests
        .iter()
        .filter(|r| r.user_agent.starts_with(CONTROLLER_AGENT) && !is_write(r))
    {
        *reads
            .entry(format!("{} {}", record.verb, record.resource))
            .or_default() += 1;
    }
    reads
}

/// A simulator with the project's CRDs, a kubeconfig for it and a client.
struct Cluster {
    sim: SimHandle,
    kubeconfig: PathBuf,
    client: Client,
    _dir: TempDir,
}

impl Cluster {
    fn start(name: &str, event_log_capacity: usize, profile: Profile, seed: u64) -> Self {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let (crd_dirs, pod_readiness) = match profile {
            Profile::Easy => (vec![root.join("crds/yaml")], None),
            Profile::Realistic => (
                vec![root.join("crds/yaml"), root.join("e2e/crds")],
                Some(scale_profile::pod_readiness(seed)),
            ),
        };
        let sim = start(SimOptions {
            crd_dirs,
            pod_ready_after: POD_READY_AFTER,
            pod_readiness,
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
    health: std::net::SocketAddr,
}

impl ControllerProcess {
    fn start(kubeconfig: &PathBuf, settings: &Settings) -> Self {
        // A free port for /readyz, so the restart figure can poll it.
        let health = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port");
        let binary = env!("CARGO_BIN_EXE_rollouts-controller");
        let mut command = match std::env::var_os("ROLLOUTS_BENCH_CONTROLLER_WRAPPER") {
            Some(wrapper) => {
                let mut command = Command::new(wrapper);
                command.arg(binary);
                command
            }
            None => Command::new(binary),
        };
        command
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--leader-elect=false", "--log-level", "warn"])
            .args(["--metrics-addr", "127.0.0.1:0", "--health-addr"])
            .arg(health.to_string());
        if let Some((qps, burst)) = &settings.client_limit {
            command.args(["--qps", qps, "--burst", burst]);
        }
        let child = command
            .env_remove("RUST_LOG")
            .env_remove("ROLLOUTS_NAMESPACE")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("starts the controller");
        let pid = child.id().expect("the controller has a pid");
        Self {
            _child: child,
            pid,
            health,
        }
    }

    /// Polls /readyz until it answers 200; false if `limit` passed first.
    async fn wait_ready(&self, limit: Duration) -> bool {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(mut stream) = tokio::net::TcpStream::connect(self.health).await {
                let mut answer = Vec::new();
                let asked = stream
                    .write_all(b"GET /readyz HTTP/1.0\r\nHost: controller\r\n\r\n")
                    .await;
                if asked.is_ok()
                    && stream.read_to_end(&mut answer).await.is_ok()
                    && (answer.starts_with(b"HTTP/1.1 200") || answer.starts_with(b"HTTP/1.0 200"))
                {
                    return true;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
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
