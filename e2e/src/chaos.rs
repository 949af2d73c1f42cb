//! The fault soak: N Rollouts (basic canaries, canaries behind nginx, canaries with an
//! analysis step, blue-greens with pre-promotion analysis, and canaries whose analysis fails)
//! released at once on kube-sim while it injects seeded faults (500s, 409s on writes, 429s with
//! Retry-After, watches cut every few seconds, forced relists, latency spikes), and the
//! `rollouts-controller` binary is SIGKILLed at seeded moments and restarted.
//!
//! Afterwards it counts what the controller must never do: a release that does not reach the
//! outcome it has without faults (promoted, or rolled back when its analysis fails), a second
//! ReplicaSet for one pod template hash, a step completed twice or skipped (the
//! RolloutStepCompleted events), a second AnalysisRun for one analysis, and a step index going
//! back. `chaos-soak` (`make chaos`) prints the figures; `tests/chaos_fault_soak.rs` runs a
//! short seeded version. Every report and failure names the seed that replays it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::fake_prometheus::FakePrometheus;
use crate::harness::{RolloutView, profile_dir};
use crate::sim::faults::{FaultCounts, RandomFaults};
use crate::sim::{Faults, SimHandle, SimOptions, start};

const NAMESPACE: &str = "default";
const GOOD_QUERY: &str = "soak_error_ratio{release=\"good\"}";
const BAD_QUERY: &str = "soak_error_ratio{release=\"bad\"}";
/// How often the soak samples every Rollout's status.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);

/// What one soak does.
#[derive(Debug, Clone)]
pub struct SoakConfig {
    /// Seeds the faults, the kill moments and nothing else: the Rollouts are the same per N.
    pub seed: u64,
    pub rollouts: usize,
    /// How many times the controller is SIGKILLed (and restarted) during the release.
    pub kills: u32,
    /// The kills fall within this long after the release starts.
    pub kill_window: Duration,
    /// How long the releases may take to settle, faults and kills included.
    pub deadline: Duration,
    /// Controller logs and the kubeconfig go here.
    pub log_dir: PathBuf,
}

impl SoakConfig {
    /// A soak of `rollouts` Rollouts with deadlines that grow with N; logs under
    /// `target/chaos/<seed>/`.
    pub fn new(seed: u64, rollouts: usize) -> Result<Self, String> {
        let target = crate::harness::target_dir()?;
        let extra = u64::try_from(rollouts)
            .unwrap_or(u64::MAX)
            .saturating_mul(2);
        Ok(Self {
            seed,
            rollouts,
            kills: 3,
            kill_window: Duration::from_secs(12),
            deadline: Duration::from_secs(90u64.saturating_add(extra)),
            log_dir: target.join("chaos").join(seed.to_string()),
        })
    }
}

/// The five kinds of Rollout in the soak, in turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Canary,
    Routed,
    Analysed,
    BlueGreen,
    FailingAnalysis,
}

impl Kind {
    fn of(index: usize) -> Kind {
        match index % 5 {
            0 => Kind::Canary,
            1 => Kind::Routed,
            2 => Kind::Analysed,
            3 => Kind::BlueGreen,
            _ => Kind::FailingAnalysis,
        }
    }

    fn promotes(self) -> bool {
        self != Kind::FailingAnalysis
    }

    /// AnalysisRuns one release makes.
    fn analyses(self) -> usize {
        match self {
            Kind::Analysed | Kind::BlueGreen | Kind::FailingAnalysis => 1,
            Kind::Canary | Kind::Routed => 0,
        }
    }
}

fn service(name: &str, app: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": app}, "ports": [{"port": 80, "targetPort": 8080}]},
    })
}

fn template(name: &str, query: &str, prometheus: &str) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AnalysisTemplate",
        "metadata": {"name": name},
        "spec": {"metrics": [{
            "name": "error-ratio",
            "interval": "1s",
            "count": 2,
            "successCondition": "result[0] < 0.05",
            "provider": {"prometheus": {"address": prometheus, "query": query}},
        }]},
    })
}

fn pause() -> Value {
    json!({"pause": {"duration": "1s"}})
}

fn weight(percent: u32) -> Value {
    json!({"setWeight": percent})
}

/// The Rollout `name` of `kind` at `version`, and the objects it needs.
fn objects(name: &str, kind: Kind, version: u32) -> (Value, Vec<Value>) {
    let analysis =
        |template: &str| json!({"analysis": {"templates": [{"templateName": template}]}});
    let mut others = Vec::new();
    let (replicas, strategy) = match kind {
        Kind::Canary => (
            4,
            json!({"canary": {"steps": [weight(25), pause(), weight(50), pause(), weight(75), pause()]}}),
        ),
        Kind::Analysed => (
            4,
            json!({"canary": {"steps": [weight(25), pause(), analysis("soak-good"), weight(50), pause()]}}),
        ),
        Kind::FailingAnalysis => (
            2,
            json!({"canary": {"steps": [weight(50), analysis("soak-bad"), weight(100)]}}),
        ),
        Kind::Routed => {
            let (stable, canary) = (format!("{name}-stable"), format!("{name}-canary"));
            others.push(service(&stable, name));
            others.push(service(&canary, name));
            others.push(json!({
                "apiVersion": "networking.k8s.io/v1",
                "kind": "Ingress",
                "metadata": {"name": name},
                "spec": {"ingressClassName": "nginx", "rules": [{
                    "host": format!("{name}.example.com"),
                    "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {
                        "service": {"name": stable, "port": {"number": 80}}}}]},
                }]},
            }));
            (
                2,
                json!({"canary": {
                    "stableService": stable,
                    "canaryService": canary,
                    "scaleDownDelaySeconds": 1,
                    "trafficRouting": {"nginx": {"stableIngress": name}},
                    "steps": [weight(20), pause(), weight(50), pause()],
                }}),
            )
        }
        Kind::BlueGreen => {
            let (active, preview) = (name.to_string(), format!("{name}-preview"));
            others.push(service(&active, name));
            others.push(service(&preview, name));
            (
                2,
                json!({"blueGreen": {
                    "activeService": active,
                    "previewService": preview,
                    "scaleDownDelaySeconds": 1,
                    "prePromotionAnalysis": {"templates": [{"templateName": "soak-good"}]},
                }}),
            )
        }
    };
    let rollout = json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{
                    "name": "app",
                    "image": "rollouts-e2e/app:1",
                    "ports": [{"containerPort": 8080}],
                    "env": [{"name": "APP_VERSION", "value": version.to_string()}],
                }]},
            },
            "strategy": strategy,
        },
    });
    (rollout, others)
}

/// The controller binary as a child process, its output appended to a log file.
struct Controller {
    path: PathBuf,
    kubeconfig: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    starts: u32,
}

impl Controller {
    fn start(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("opening {}: {e}", self.log.display()))?;
        let err = log
            .try_clone()
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        let child = Command::new(&self.path)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--leader-elect=false", "--log-level", "info"])
            .args([
                "--health-addr",
                "127.0.0.1:0",
                "--metrics-addr",
                "127.0.0.1:0",
            ])
            .env_remove("RUST_LOG")
            .env_remove("ROLLOUTS_NAMESPACE")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.path.display()))?;
        self.child = Some(child);
        self.starts = self.starts.saturating_add(1);
        Ok(())
    }

    /// SIGKILL: no shutdown, no last write.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Already gone is as good as killed; the exit status is of no interest.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Why the controller is not running, if it exited by itself.
    fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            _ => None,
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One Rollout under watch.
struct Tracked {
    name: String,
    kind: Kind,
    uid: String,
    v1_hash: String,
    /// (currentPodHash, currentStepIndex, aborted) at every sample that differed from the last.
    trace: Vec<(String, Option<u64>, bool)>,
    settled: bool,
    /// Looks that found traffic sent to pods that were not available, and the first of them.
    unavailable_traffic: (usize, Option<String>),
}

impl Tracked {
    fn outcome_reached(&self, rollout: &RolloutView) -> bool {
        let moved = !rollout.current_hash().is_empty() && rollout.current_hash() != self.v1_hash;
        if self.kind.promotes() {
            moved && rollout.is_healthy() && !rollout.aborted()
        } else {
            moved && rollout.aborted() && rollout.stable_hash() == self.v1_hash
        }
    }
}

/// The figures of one soak.
#[derive(Debug, Clone, Default)]
pub struct SoakReport {
    pub seed: u64,
    pub rollouts: usize,
    pub converged: usize,
    pub kills: u32,
    pub faults: FaultCounts,
    pub duplicate_replica_sets: usize,
    pub repeated_steps: usize,
    pub skipped_steps: usize,
    pub duplicate_analysis_runs: usize,
    pub status_backwards: usize,
    /// Looks (every 200 ms) that found a weight or an active Service on pods not available.
    pub traffic_to_unavailable_pods: usize,
    /// How long the releases took to settle (or the deadline, when some did not).
    pub settle_time: Duration,
    /// Each finding, naming the Rollout.
    pub problems: Vec<String>,
    pub log_dir: PathBuf,
}

impl SoakReport {
    pub fn passed(&self) -> bool {
        self.problems.is_empty()
    }
}

impl fmt::Display for SoakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "fault soak, seed {}:", self.seed)?;
        writeln!(
            f,
            "  Rollouts converged / total:  {} / {} (settled in {:.1}s)",
            self.converged,
            self.rollouts,
            self.settle_time.as_secs_f64()
        )?;
        writeln!(f, "  controller SIGKILLs:         {}", self.kills)?;
        writeln!(
            f,
            "  faults injected:             {} ({} in all)",
            self.faults,
            self.faults.total()
        )?;
        writeln!(
            f,
            "  duplicate ReplicaSets:       {}",
            self.duplicate_replica_sets
        )?;
        writeln!(f, "  repeated steps:              {}", self.repeated_steps)?;
        writeln!(f, "  skipped steps:               {}", self.skipped_steps)?;
        writeln!(
            f,
            "  AnalysisRuns created twice:  {}",
            self.duplicate_analysis_runs
        )?;
        writeln!(
            f,
            "  status gone backwards:       {}",
            self.status_backwards
        )?;
        writeln!(
            f,
            "  traffic to unavailable pods: {} looks",
            self.traffic_to_unavailable_pods
        )?;
        for problem in &self.problems {
            writeln!(f, "  - {problem}")?;
        }
        if !self.passed() {
            writeln!(
                f,
                "  replay with seed {} (controller logs in {})",
                self.seed,
                self.log_dir.display()
            )?;
        }
        Ok(())
    }
}

fn crd_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."))
        .join("crds")
        .join("yaml")
}

/// The soak's faults: the rates of issue 17.
pub fn soak_faults(seed: u64) -> Faults {
    Faults {
        error_rate: 0.05,
        conflict_rate: 0.05,
        random: RandomFaults {
            seed: Some(seed),
            too_many_rate: 0.01,
            retry_after_seconds: 1,
            watch_cut_within: Some(Duration::from_secs(4)),
            gone_rate: 0.1,
            spike_rate: 0.02,
            spike: Duration::from_millis(200),
        },
        ..Faults::default()
    }
}

fn rollouts(sim: &SimHandle) -> BTreeMap<String, RolloutView> {
    sim.list(NAMESPACE, "argoproj.io/v1alpha1", "Rollout")
        .into_iter()
        .map(|r| {
            let name = r["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            (name, RolloutView(r))
        })
        .collect()
}

fn names(objects: &[Value]) -> BTreeSet<String> {
    objects
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

/// One look at where traffic goes: a routed canary's nginx weight needs as large a share of
/// its replicas available on the canary Service's revision, and the rest needs the stable
/// Service's revision available; a blue-green's active Service must select available pods.
/// Routers and Services are read before the ReplicaSets, so a weight is compared with pods
/// counted after it was set (pods in the soak never stop being available).
fn look_at_traffic(sim: &SimHandle, tracked: &mut [Tracked]) {
    let ingresses = sim.list(NAMESPACE, "networking.k8s.io/v1", "Ingress");
    let services = sim.list(NAMESPACE, "v1", "Service");
    let replica_sets = sim.list(NAMESPACE, "apps/v1", "ReplicaSet");
    let named = |objects: &[Value], name: &str| {
        objects
            .iter()
            .find(|o| o["metadata"]["name"] == name)
            .cloned()
    };
    let selected = |name: &str| {
        named(&services, name).and_then(|s| {
            s["spec"]["selector"]["rollouts-pod-template-hash"]
                .as_str()
                .map(str::to_string)
        })
    };
    for t in tracked
        .iter_mut()
        .filter(|t| matches!(t.kind, Kind::Routed | Kind::BlueGreen))
    {
        let available = |hash: &str| {
            owned_by(&replica_sets, &t.uid)
                .find(|rs| rs["metadata"]["labels"]["rollouts-pod-template-hash"] == hash)
                .map_or(0, |rs| {
                    rs["status"]["availableReplicas"].as_i64().unwrap_or(0)
                })
        };
        let mut problems = Vec::new();
        if t.kind == Kind::Routed {
            let weight = named(&ingresses, &format!("{0}-{0}-canary", t.name))
                .and_then(|i| {
                    i["metadata"]["annotations"]["nginx.ingress.kubernetes.io/canary-weight"]
                        .as_str()
                        .and_then(|w| w.parse::<i64>().ok())
                })
                .unwrap_or(0);
            let replicas = 2;
            if let Some(canary) = selected(&format!("{}-canary", t.name))
                && weight > 0
                && available(&canary).saturating_mul(100) < weight.saturating_mul(replicas)
            {
                problems.push(format!(
                    "canary weight {weight}% with {} of {replicas} pods of {canary} available",
                    available(&canary)
                ));
            }
            if let Some(stable) = selected(&format!("{}-stable", t.name))
                && weight < 100
                && available(&stable) == 0
            {
                problems.push(format!(
                    "{}% of traffic to the stable Service, whose pods ({stable}) are not available",
                    100 - weight
                ));
            }
        } else if let Some(active) = selected(&t.name)
            && available(&active) == 0
        {
            problems.push(format!(
                "the active Service selects {active}, which has no available pods"
            ));
        }
        if let Some(first) = problems.into_iter().next() {
            t.unavailable_traffic.0 += 1;
            t.unavailable_traffic.1.get_or_insert(first);
        }
    }
}

fn owned_by<'a>(objects: &'a [Value], uid: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    objects.iter().filter(move |o| {
        o["metadata"]["ownerReferences"]
            .as_array()
            .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid))
    })
}

/// Runs one soak. Err is a soak that could not run (a binary missing, the first release not
/// healthy); findings about the controller are in the report.
pub fn run(config: &SoakConfig) -> Result<SoakReport, String> {
    let seed = config.seed;
    let fail = |what: String| format!("{what} (seed {seed})");
    std::fs::create_dir_all(&config.log_dir)
        .map_err(|e| fail(format!("creating {}: {e}", config.log_dir.display())))?;
    let controller_path = profile_dir()?.join(format!(
        "rollouts-controller{}",
        std::env::consts::EXE_SUFFIX
    ));
    if !controller_path.is_file() {
        return Err(format!(
            "{} is not built: run `cargo build -p rollouts-controller` first",
            controller_path.display()
        ));
    }
    let runtime = tokio::runtime::Runtime::new().map_err(|e| fail(format!("a runtime: {e}")))?;
    let prometheus = runtime.block_on(FakePrometheus::start());
    prometheus.answer_every_query("0.01");
    prometheus.values(BAD_QUERY, &["0.5"]);
    let prometheus_url = prometheus.address.clone();

    let sim = start(SimOptions {
        crd_dirs: vec![crd_dir()],
        pod_ready_after: Duration::from_millis(300),
        faults: Faults {
            random: RandomFaults {
                seed: Some(seed),
                ..RandomFaults::default()
            },
            ..Faults::default()
        },
        ..SimOptions::default()
    })
    .map_err(|e| fail(format!("starting kube-sim: {e}")))?;
    let kubeconfig = config.log_dir.join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig)
        .map_err(|e| fail(format!("writing {}: {e}", kubeconfig.display())))?;
    let create = |obj: Value| {
        sim.create(NAMESPACE, obj)
            .map(|_| ())
            .map_err(|e| fail(format!("creating an object: {}", e.message)))
    };
    create(template("soak-good", GOOD_QUERY, &prometheus_url))?;
    create(template("soak-bad", BAD_QUERY, &prometheus_url))?;
    let mut kinds = BTreeMap::new();
    for i in 0..config.rollouts {
        let name = format!("soak-{i:03}");
        let kind = Kind::of(i);
        let (rollout, others) = objects(&name, kind, 1);
        for other in others {
            create(other)?;
        }
        create(rollout)?;
        kinds.insert(name, kind);
    }

    let log = config.log_dir.join("controller.log");
    // A log of an earlier run with this seed would mislead.
    let _ = std::fs::remove_file(&log);
    let mut controller = Controller {
        path: controller_path,
        kubeconfig,
        log,
        child: None,
        starts: 0,
    };
    controller.start().map_err(&fail)?;

    // The first revision, without faults.
    let first_deadline = Instant::now() + Duration::from_secs(60) + config.deadline / 2;
    let mut tracked = loop {
        let now = rollouts(&sim);
        let healthy = now.values().filter(|r| r.is_healthy()).count();
        if healthy == config.rollouts {
            break now
                .into_iter()
                .filter_map(|(name, r)| {
                    let kind = *kinds.get(&name)?;
                    Some(Tracked {
                        uid: r.0["metadata"]["uid"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        v1_hash: r.stable_hash().to_string(),
                        name,
                        kind,
                        trace: Vec::new(),
                        settled: false,
                        unavailable_traffic: (0, None),
                    })
                })
                .collect::<Vec<_>>();
        }
        if let Some(status) = controller.exited() {
            return Err(fail(format!(
                "the controller exited ({status}) before the first revision was healthy; see {}",
                controller.log.display()
            )));
        }
        if Instant::now() > first_deadline {
            return Err(fail(format!(
                "only {healthy} of {} Rollouts became healthy on their first revision, without faults; see {}",
                config.rollouts,
                controller.log.display()
            )));
        }
        std::thread::sleep(SAMPLE_EVERY);
    };
    let before_events = names(&sim.list(NAMESPACE, "events.k8s.io/v1", "Event"));
    let before_runs = names(&sim.list(NAMESPACE, "argoproj.io/v1alpha1", "AnalysisRun"));

    // The release, under faults and kills.
    let mut rng = StdRng::seed_from_u64(seed ^ 0x05ee_d0fc_4a05);
    let window = u64::try_from(config.kill_window.as_millis())
        .unwrap_or(u64::MAX)
        .max(1000);
    let mut kills: Vec<Duration> = (0..config.kills)
        .map(|_| Duration::from_millis(rng.random_range(500..=window)))
        .collect();
    kills.sort();
    kills.reverse();
    sim.set_faults(soak_faults(seed));
    for t in &tracked {
        let (rollout, _) = objects(&t.name, t.kind, 2);
        sim.replace(NAMESPACE, rollout)
            .map_err(|e| fail(format!("releasing {}: {}", t.name, e.message)))?;
    }
    let started = Instant::now();
    let mut killed = 0u32;
    let mut extra = Vec::new();
    let settle_time = loop {
        let elapsed = started.elapsed();
        if kills.last().is_some_and(|at| *at <= elapsed) {
            kills.pop();
            controller.kill();
            killed = killed.saturating_add(1);
            controller.start().map_err(&fail)?;
        }
        if let Some(status) = controller.exited() {
            // The controller must survive every fault but a kill: a finding, then restarted
            // so the rest of the soak still tells something.
            extra.push(format!(
                "the controller exited by itself ({status}) {:.1}s into the release",
                elapsed.as_secs_f64()
            ));
            controller.start().map_err(&fail)?;
        }
        look_at_traffic(&sim, &mut tracked);
        let now = rollouts(&sim);
        for t in &mut tracked {
            let Some(r) = now.get(&t.name) else { continue };
            let sample = (
                r.current_hash().to_string(),
                r.current_step_index(),
                r.aborted(),
            );
            if t.trace.last() != Some(&sample) {
                t.trace.push(sample);
            }
            t.settled = t.outcome_reached(r);
        }
        if kills.is_empty() && tracked.iter().all(|t| t.settled) {
            break elapsed;
        }
        if elapsed > config.deadline {
            break elapsed;
        }
        std::thread::sleep(SAMPLE_EVERY);
    };
    let report = finish(FinishArgs {
        config,
        sim: &sim,
        tracked: &tracked,
        before_events: &before_events,
        before_runs: &before_runs,
        kills: killed,
        settle_time,
        extra,
    });
    controller.kill();
    prometheus.stop();
    report
}

struct FinishArgs<'a> {
    config: &'a SoakConfig,
    sim: &'a SimHandle,
    tracked: &'a [Tracked],
    before_events: &'a BTreeSet<String>,
    before_runs: &'a BTreeSet<String>,
    kills: u32,
    settle_time: Duration,
    extra: Vec<String>,
}

/// Reads the final state and counts every finding.
fn finish(args: FinishArgs<'_>) -> Result<SoakReport, String> {
    let FinishArgs {
        config,
        sim,
        tracked,
        before_events,
        before_runs,
        kills,
        settle_time,
        extra,
    } = args;
    let mut report = SoakReport {
        seed: config.seed,
        rollouts: config.rollouts,
        kills,
        faults: sim.fault_counts(),
        settle_time,
        problems: extra,
        log_dir: config.log_dir.clone(),
        ..SoakReport::default()
    };
    let now = rollouts(sim);
    let replica_sets = sim.list(NAMESPACE, "apps/v1", "ReplicaSet");
    let events: Vec<Value> = sim
        .list(NAMESPACE, "events.k8s.io/v1", "Event")
        .into_iter()
        .filter(|e| {
            e["metadata"]["name"]
                .as_str()
                .is_some_and(|n| !before_events.contains(n))
        })
        .collect();
    let runs: Vec<Value> = sim
        .list(NAMESPACE, "argoproj.io/v1alpha1", "AnalysisRun")
        .into_iter()
        .filter(|r| {
            r["metadata"]["name"]
                .as_str()
                .is_some_and(|n| !before_runs.contains(n))
        })
        .collect();
    for t in tracked {
        let name = &t.name;
        let Some(rollout) = now.get(name) else {
            report.problems.push(format!("{name}: the Rollout is gone"));
            continue;
        };
        if t.outcome_reached(rollout) {
            report.converged += 1;
        } else {
            let want = if t.kind.promotes() {
                "promoted"
            } else {
                "rolled back"
            };
            let message: String = rollout.message().chars().take(300).collect();
            report.problems.push(format!(
                "{name} ({:?}) was not {want}: phase {:?}, step {:?}, stableRS {:?}, \
                 currentPodHash {:?}, message {message:?}",
                t.kind,
                rollout.phase(),
                rollout.current_step_index(),
                rollout.stable_hash(),
                rollout.current_hash(),
            ));
        }

        if let (looks @ 1.., Some(first)) = &t.unavailable_traffic {
            report.traffic_to_unavailable_pods += looks;
            report.problems.push(format!(
                "{name}: traffic to pods not available at {looks} looks, first: {first}"
            ));
        }

        let mut per_hash: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for rs in owned_by(&replica_sets, &t.uid) {
            let hash = rs["metadata"]["labels"]["rollouts-pod-template-hash"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let rs_name = rs["metadata"]["name"].as_str().unwrap_or_default();
            per_hash.entry(hash).or_default().push(rs_name.to_string());
        }
        for (hash, sets) in &per_hash {
            if sets.len() > 1 {
                report.duplicate_replica_sets += sets.len() - 1;
                report.problems.push(format!(
                    "{name}: {} ReplicaSets for pod template hash {hash:?}: {sets:?}",
                    sets.len()
                ));
            }
        }
        if per_hash.len() > 2 {
            report.problems.push(format!(
                "{name}: {} pod template hashes for two revisions: {:?}",
                per_hash.len(),
                per_hash.keys().collect::<Vec<_>>()
            ));
        }

        let step_count = rollout.step_count();
        if step_count > 0 {
            let mut completed = vec![0i64; step_count];
            for event in events.iter().filter(|e| {
                e["regarding"]["name"] == name.as_str()
                    && e["regarding"]["kind"] == "Rollout"
                    && e["reason"] == "RolloutStepCompleted"
            }) {
                let note = event["note"].as_str().unwrap_or_default();
                let step = note
                    .strip_prefix("Rollout step ")
                    .and_then(|rest| rest.split('/').next())
                    .and_then(|s| s.parse::<usize>().ok());
                let count = event["series"]["count"].as_i64().unwrap_or(1).max(1);
                if let Some(slot) = step
                    .and_then(|s| s.checked_sub(1))
                    .and_then(|i| completed.get_mut(i))
                {
                    *slot = slot.saturating_add(count);
                }
            }
            for (i, times) in completed.iter().enumerate() {
                let step = i + 1;
                if *times > 1 {
                    report.repeated_steps += 1;
                    report
                        .problems
                        .push(format!("{name}: step {step} completed {times} times"));
                } else if *times == 0 && t.kind.promotes() {
                    report.skipped_steps += 1;
                    report.problems.push(format!(
                        "{name}: step {step} of {step_count} has no RolloutStepCompleted event"
                    ));
                }
            }
        }

        let mine = owned_by(&runs, &t.uid).count();
        if mine > t.kind.analyses() {
            report.duplicate_analysis_runs += mine - t.kind.analyses();
            report.problems.push(format!(
                "{name}: {mine} AnalysisRuns for a release with {} analysis",
                t.kind.analyses()
            ));
        }

        // On the new revision, before any abort, the step index only moves forward.
        let release_hash = rollout.current_hash();
        let steps: Vec<u64> = t
            .trace
            .iter()
            .filter(|(hash, _, aborted)| hash == release_hash && !aborted)
            .filter_map(|(_, step, _)| *step)
            .collect();
        if steps.windows(2).any(|w| w[1] < w[0]) {
            report.status_backwards += 1;
            report
                .problems
                .push(format!("{name}: currentStepIndex went back: {steps:?}"));
        }
    }
    Ok(report)
}
