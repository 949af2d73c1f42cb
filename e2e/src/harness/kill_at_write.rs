//! Kill at every write: one release (a routed canary with an analysis step, or a blue-green
//! with pre-promotion analysis) is run once cleanly to count the controller's writes (W), then
//! once per N: from the same starting state, kube-sim's write-cut rule lets the controller make
//! exactly N writes, the controller is SIGKILLed, restarted with the rule cleared, and the
//! release must finish as the clean one did. While it runs, every look checks that status never
//! goes back and that no traffic is sent to pods that are not available.
//!
//! Each N gets a fresh in-process kube-sim (started in milliseconds), so every run starts from
//! the same objects; only the controller is a process, so it can be SIGKILLed.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use super::objects::{EventView, ReplicaSetView, RolloutView, owned_by};
use super::process::{Process, poll};
use super::{Binaries, target_dir};
use crate::fake_prometheus::FakePrometheus;
use crate::sim::faults::WriteCut;
use crate::sim::{Faults, SimHandle, SimOptions, start};

/// Environment variable: set to 1 to kill at every N from 1 to W instead of a seeded sample.
pub const ALL_WRITES_ENV: &str = "ROLLOUTS_CHAOS_ALL_WRITES";
/// Environment variable: the seed of the sample of N (printed by every run).
pub const SEED_ENV: &str = "ROLLOUTS_CHAOS_SEED";
/// Environment variable: only this N (to reproduce one failure).
pub const ONLY_N_ENV: &str = "ROLLOUTS_CHAOS_N";

const NAMESPACE: &str = "default";
const ROLLOUT: &str = "web";
/// How long a release (or the controller's start) may take before the run fails.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(40);

/// Which release the harness runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// 2 replicas, nginx routing, steps setWeight 50, an analysis step, a 1s pause.
    RoutedCanary,
    /// 2 replicas, preview Service, pre-promotion analysis, automatic promotion.
    BlueGreen,
}

impl Release {
    pub fn name(self) -> &'static str {
        match self {
            Release::RoutedCanary => "routed-canary",
            Release::BlueGreen => "blue-green",
        }
    }
}

/// What one release did, as the checks see it.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Converged: Healthy on the new revision, the old one scaled to zero.
    pub converged: bool,
    /// Controller writes let through after the version changed (without a kill: W).
    pub writes: u64,
    /// Whether the cut happened (false: the release needed fewer than N writes this time).
    pub cut: bool,
    /// ReplicaSets of the Rollout at the end.
    pub replica_sets: usize,
    /// RolloutStepCompleted notes and how often each appeared (series counts included).
    pub step_events: BTreeMap<String, i64>,
    /// AnalysisRuns of the Rollout at the end.
    pub analysis_runs: usize,
    /// Invariant breaks seen while looking: status going back, traffic to unavailable pods.
    pub violations: Vec<String>,
    /// The release's final phase.
    pub phase: String,
}

/// One in-process kube-sim, a stand-in Prometheus and the controller process.
pub struct Run {
    sim: SimHandle,
    _prometheus: FakePrometheus,
    /// Serves the stand-in Prometheus.
    _runtime: tokio::runtime::Runtime,
    kubeconfig: PathBuf,
    dir: PathBuf,
    controller: Option<Process>,
    controller_binary: PathBuf,
    starts: u32,
    release: Release,
}

impl Run {
    /// A fresh simulator holding the release's objects at version 1, the controller started,
    /// and version 1 Healthy.
    pub fn start(release: Release, label: &str) -> Result<Run, String> {
        let binaries = Binaries::find()?;
        let dir = target_dir()?.join("e2e").join(format!(
            "kill_at_write-{}-{label}-{}",
            release.name(),
            std::process::id()
        ));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .map_err(|e| format!("clearing {}: {e}", dir.display()))?;
        }
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| format!("a runtime for the stand-in Prometheus: {e}"))?;
        let prometheus = runtime.block_on(FakePrometheus::start());
        // An error ratio of 0: every measurement is Successful.
        prometheus.answer_every_query("0");
        let sim = start(SimOptions {
            crd_dirs: vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds/yaml")],
            pod_ready_after: Duration::from_millis(100),
            metrics_listen: None,
            ..SimOptions::default()
        })
        .map_err(|e| format!("kube-sim: {e}"))?;
        let kubeconfig = dir.join("kubeconfig.yaml");
        sim.write_kubeconfig(&kubeconfig)
            .map_err(|e| format!("writing {}: {e}", kubeconfig.display()))?;
        for object in objects(release, &prometheus.address) {
            sim.create(NAMESPACE, object)
                .map_err(|e| format!("seeding kube-sim: {e:?}"))?;
        }
        let mut run = Run {
            sim,
            _prometheus: prometheus,
            _runtime: runtime,
            kubeconfig,
            dir,
            controller: None,
            controller_binary: binaries.controller,
            starts: 0,
            release,
        };
        run.start_controller()?;
        let mut ignored = Vec::new();
        run.wait_converged(1, &mut ignored)?;
        Ok(run)
    }

    fn start_controller(&mut self) -> Result<(), String> {
        self.starts += 1;
        let port = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.to_string())
                .map_err(|e| format!("no free loopback port: {e}"))
        };
        let health = port()?;
        let metrics = port()?;
        let mut command = Command::new(&self.controller_binary);
        command
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--leader-elect=false", "--log-level", "info"])
            .args(["--health-addr", &health, "--metrics-addr", &metrics])
            .env_remove("RUST_LOG")
            .env_remove("ROLLOUTS_NAMESPACE");
        let log = self.dir.join(format!("controller-{}.log", self.starts));
        let mut controller = Process::spawn("rollouts-controller", command, &log)?;
        let ready = poll(RELEASE_TIMEOUT, || {
            if let Some(status) = controller.exited() {
                return Some(Err(status));
            }
            matches!(super::http::get(&health, "/readyz"), Ok((200, _))).then_some(Ok(()))
        });
        match ready {
            Some(Ok(())) => {
                self.controller = Some(controller);
                Ok(())
            }
            Some(Err(status)) => Err(format!(
                "the controller exited ({status}) before it was ready:\n{}",
                controller.log_tail(30)
            )),
            None => Err(format!(
                "the controller was not ready within {RELEASE_TIMEOUT:?}:\n{}",
                controller.log_tail(30)
            )),
        }
    }

    /// Releases version 2 with the controller cut after `cut_after` writes (None: no cut),
    /// SIGKILLs it once cut, restarts it, and waits for the release to converge.
    pub fn release(&mut self, cut_after: Option<u64>) -> Result<Outcome, String> {
        let mut outcome = Outcome::default();
        let mut looks = Looks::default();
        self.sim.set_faults(Faults {
            // Without a cut the rule only counts: it never refuses.
            write_cut: Some(WriteCut::controller(cut_after.unwrap_or(u64::MAX))),
            ..Faults::default()
        });
        self.sim.clear_requests();
        self.bump_version()?;
        let mut killed_writes = 0;
        if let Some(n) = cut_after {
            let cut = poll(RELEASE_TIMEOUT, || {
                looks.look(self);
                // Killed once the Nth write has been answered (a write is logged when served).
                if self.controller_writes_served() >= n {
                    return Some(true);
                }
                (self.converged(2).unwrap_or(false) && self.controller_writes_served() < n)
                    .then_some(false)
            })
            .ok_or_else(|| {
                format!("the controller made neither {n} writes nor finished the release")
            })?;
            if cut {
                if let Some(mut controller) = self.controller.take() {
                    controller.kill();
                }
                killed_writes = self.sim.write_cut_counts().0;
                outcome.cut = true;
                self.sim.set_faults(Faults::default());
                self.start_controller()?;
            }
        }
        let converged = self.wait_converged(2, &mut outcome.violations);
        outcome.converged = converged.is_ok();
        if let Err(e) = converged {
            outcome.violations.push(e);
        }
        outcome.writes = if outcome.cut {
            killed_writes
        } else {
            self.sim.write_cut_counts().0
        };
        looks.look(self);
        self.final_checks(&mut outcome)?;
        outcome.violations.extend(looks.violations);
        Ok(outcome)
    }

    /// Controller writes the simulator has answered since the requests were cleared.
    /// Refused writes (500, the only code the controller gets here without a cut) are not
    /// counted: one refused while the Nth is still being served must not trigger the kill early.
    fn controller_writes_served(&self) -> u64 {
        let cut = WriteCut::controller(0);
        let count = self
            .sim
            .requests()
            .iter()
            .filter(|r| cut.matches(&r.user_agent) && r.code != 500)
            .filter(|r| {
                matches!(
                    r.verb.as_str(),
                    "create" | "update" | "patch" | "delete" | "deletecollection"
                )
            })
            .count();
        u64::try_from(count).unwrap_or(u64::MAX)
    }

    fn bump_version(&self) -> Result<(), String> {
        let patch = json!({"spec": {"template": {"metadata": {"annotations": {"version": "2"}}}}});
        let (code, body) = send(
            &self.sim.address().to_string(),
            "PATCH",
            &format!("/apis/argoproj.io/v1alpha1/namespaces/{NAMESPACE}/rollouts/{ROLLOUT}"),
            "application/merge-patch+json",
            &patch.to_string(),
        )?;
        if code != 200 {
            return Err(format!("updating the Rollout to version 2: {code} {body}"));
        }
        Ok(())
    }

    fn get(&self, path: &str) -> Result<Value, String> {
        let (code, body) = super::http::get(&self.sim.address().to_string(), path)?;
        if code != 200 {
            return Err(format!("GET {path}: {code} {body}"));
        }
        serde_json::from_str(&body).map_err(|e| format!("GET {path}: {e}"))
    }

    fn rollout(&self) -> Result<RolloutView, String> {
        self.get(&format!(
            "/apis/argoproj.io/v1alpha1/namespaces/{NAMESPACE}/rollouts/{ROLLOUT}"
        ))
        .map(RolloutView)
    }

    fn replica_sets(&self) -> Result<Vec<ReplicaSetView>, String> {
        let list = self.get(&format!("/apis/apps/v1/namespaces/{NAMESPACE}/replicasets"))?;
        Ok(owned_by(&list, ROLLOUT)
            .map(ReplicaSetView::from_json)
            .collect())
    }

    /// Healthy on the ReplicaSet whose template carries `version` (its `version` annotation,
    /// none for 1), every other ReplicaSet scaled to zero.
    fn converged(&self, version: u32) -> Result<bool, String> {
        let rollout = self.rollout()?;
        if !rollout.is_healthy() {
            return Ok(false);
        }
        let current = rollout.current_hash();
        let list = self.get(&format!("/apis/apps/v1/namespaces/{NAMESPACE}/replicasets"))?;
        let mut current_is_version = false;
        for rs in owned_by(&list, ROLLOUT) {
            let view = ReplicaSetView::from_json(rs);
            if view.hash == current {
                let annotation = &rs["spec"]["template"]["metadata"]["annotations"]["version"];
                let template_version = annotation.as_str().map_or(Some(1), |v| v.parse().ok());
                current_is_version = template_version == Some(version);
            } else if view.replicas != 0 {
                return Ok(false);
            }
        }
        Ok(current_is_version)
    }

    fn wait_converged(&self, version: u32, violations: &mut Vec<String>) -> Result<(), String> {
        let mut looks = Looks::default();
        let done = poll(RELEASE_TIMEOUT, || {
            looks.look(self);
            self.converged(version).unwrap_or(false).then_some(())
        });
        violations.append(&mut looks.violations);
        done.ok_or_else(|| {
            let status = self
                .rollout()
                .map(|r| r.status_text())
                .unwrap_or_else(|e| e);
            let tail = self
                .controller
                .as_ref()
                .map(|c| c.log_tail(20))
                .unwrap_or_default();
            format!(
                "version {version} did not converge within {RELEASE_TIMEOUT:?}; status:\n{status}\ncontroller log:\n{tail}"
            )
        })
    }

    fn final_checks(&self, outcome: &mut Outcome) -> Result<(), String> {
        let rollout = self.rollout()?;
        outcome.phase = rollout.phase().to_string();
        outcome.replica_sets = self.replica_sets()?.len();
        let runs = self.get(&format!(
            "/apis/argoproj.io/v1alpha1/namespaces/{NAMESPACE}/analysisruns"
        ))?;
        outcome.analysis_runs = owned_by(&runs, ROLLOUT).count();
        let events = self.get(&format!(
            "/apis/events.k8s.io/v1/namespaces/{NAMESPACE}/events"
        ))?;
        for event in events["items"].as_array().into_iter().flatten() {
            if event["regarding"]["kind"] != "Rollout" || event["reason"] != "RolloutStepCompleted"
            {
                continue;
            }
            let view = EventView::from_json(event);
            *outcome.step_events.entry(view.note).or_default() += view.count;
        }
        Ok(())
    }
}

impl Run {
    /// Stops the controller and removes this run's logs (call when every check passed; a
    /// failed run keeps them, and its controller is killed when the run is dropped).
    pub fn remove_logs(mut self) {
        if let Some(mut controller) = self.controller.take() {
            controller.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn release_kind(&self) -> Release {
        self.release
    }
}

/// What the looks during one release remember.
#[derive(Default)]
struct Looks {
    /// The highest currentStepIndex seen per currentPodHash.
    steps: BTreeMap<String, u64>,
    violations: Vec<String>,
}

impl Looks {
    /// One look: status never goes back; traffic only to available pods. Routers and Services
    /// are read before the ReplicaSets, so a weight is compared with pods counted after it
    /// was set (pods here never stop being available).
    fn look(&mut self, run: &Run) {
        let Ok(rollout) = run.rollout() else { return };
        let hash = rollout.current_hash().to_string();
        if let Some(step) = rollout.current_step_index() {
            let highest = self.steps.entry(hash.clone()).or_insert(step);
            if step < *highest {
                self.violations.push(format!(
                    "currentStepIndex went back from {highest} to {step} on revision {hash}"
                ));
            }
            *highest = (*highest).max(step);
        }
        let replicas = rollout.0["spec"]["replicas"].as_i64().unwrap_or(1);
        let services = |name: &str| {
            run.get(&format!("/api/v1/namespaces/{NAMESPACE}/services/{name}"))
                .ok()
                .and_then(|s| {
                    s["spec"]["selector"]["rollouts-pod-template-hash"]
                        .as_str()
                        .map(str::to_string)
                })
        };
        match run.release {
            Release::RoutedCanary => {
                let weight = run
                    .get(&format!(
                        "/apis/networking.k8s.io/v1/namespaces/{NAMESPACE}/ingresses/{ROLLOUT}-{ROLLOUT}-canary"
                    ))
                    .ok()
                    .and_then(|i| {
                        i["metadata"]["annotations"]["nginx.ingress.kubernetes.io/canary-weight"]
                            .as_str()
                            .and_then(|w| w.parse::<i64>().ok())
                    })
                    .unwrap_or(0);
                let canary = services("web-canary");
                let stable = services("web-stable");
                let Ok(sets) = run.replica_sets() else { return };
                let available = |hash: &Option<String>| {
                    hash.as_ref()
                        .and_then(|h| sets.iter().find(|rs| &rs.hash == h))
                        .map_or(0, |rs| rs.available)
                };
                if weight > 0
                    && available(&canary).saturating_mul(100) < weight.saturating_mul(replicas)
                {
                    self.violations.push(format!(
                        "canary weight {weight}% with {} of {replicas} canary pods available ({canary:?})",
                        available(&canary)
                    ));
                }
                if weight < 100 && stable.is_some() && available(&stable) == 0 {
                    self.violations.push(format!(
                        "{}% of traffic to the stable Service, whose pods ({stable:?}) are not available",
                        100 - weight
                    ));
                }
            }
            Release::BlueGreen => {
                let active = services("web");
                let Ok(sets) = run.replica_sets() else { return };
                if let Some(hash) = &active {
                    let available = sets
                        .iter()
                        .find(|rs| &rs.hash == hash)
                        .map_or(0, |rs| rs.available);
                    if available == 0 {
                        self.violations.push(format!(
                            "the active Service selects {hash}, which has no available pods"
                        ));
                    }
                }
            }
        }
    }
}

/// The release's objects at version 1.
fn objects(release: Release, prometheus: &str) -> Vec<Value> {
    let service = |name: &str| {
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        })
    };
    let template = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisTemplate",
        "metadata": {"name": "error-ratio", "namespace": NAMESPACE},
        "spec": {
            "args": [{"name": "hash"}],
            "metrics": [{
                "name": "error-ratio",
                "count": 1,
                "successCondition": "result[0] < 0.05",
                "provider": {"prometheus": {
                    "address": prometheus,
                    "query": "sum(rate(http_requests_total{code=~\"5..\",rollouts_pod_template_hash=\"{{args.hash}}\"}[3s]))",
                }},
            }],
        },
    });
    let pod_template = json!({
        "metadata": {"labels": {"app": "web"}},
        "spec": {"containers": [{"name": "web", "image": "rollouts-e2e/app:1", "ports": [{"containerPort": 8080}]}]},
    });
    let hash_arg = json!([{"name": "hash", "valueFrom": {"podTemplateHashValue": "Latest"}}]);
    let strategy = match release {
        Release::RoutedCanary => json!({"canary": {
            "stableService": "web-stable",
            "canaryService": "web-canary",
            "scaleDownDelaySeconds": 1,
            "trafficRouting": {"nginx": {"stableIngress": ROLLOUT}},
            "steps": [
                {"setWeight": 50},
                {"analysis": {"templates": [{"templateName": "error-ratio"}], "args": hash_arg}},
                {"pause": {"duration": "1s"}},
            ],
        }}),
        Release::BlueGreen => json!({"blueGreen": {
            "activeService": "web",
            "previewService": "web-preview",
            "scaleDownDelaySeconds": 1,
            "prePromotionAnalysis": {"templates": [{"templateName": "error-ratio"}], "args": hash_arg},
        }}),
    };
    let rollout = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
        "metadata": {"name": ROLLOUT, "namespace": NAMESPACE},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": pod_template,
            "strategy": strategy,
        },
    });
    let mut objects = vec![template];
    match release {
        Release::RoutedCanary => {
            objects.push(service("web-stable"));
            objects.push(service("web-canary"));
            objects.push(json!({
                "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                "metadata": {"name": ROLLOUT, "namespace": NAMESPACE},
                "spec": {"ingressClassName": "nginx", "rules": [{"host": "web.example.com", "http": {"paths": [{
                    "path": "/", "pathType": "Prefix",
                    "backend": {"service": {"name": "web-stable", "port": {"number": 80}}},
                }]}}]},
            }));
        }
        Release::BlueGreen => {
            objects.push(service("web"));
            objects.push(service("web-preview"));
        }
    }
    objects.push(rollout);
    objects
}

/// One HTTP/1.0 request with a body: (status, body).
fn send(
    authority: &str,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> Result<(u16, String), String> {
    let io = |e: std::io::Error| format!("{method} http://{authority}{path}: {e}");
    let mut stream = TcpStream::connect(authority).map_err(io)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(io)?;
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: {authority}\r\nUser-Agent: kill-at-write-harness\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .map_err(io)?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).map_err(io)?;
    let reply = String::from_utf8_lossy(&reply);
    let (head, body) = reply
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{method} http://{authority}{path}: a malformed reply"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{method} http://{authority}{path}: no status in {head:?}"))?;
    Ok((status, body.to_string()))
}

/// The N to kill at: every one from 1 to `writes` when `ROLLOUTS_CHAOS_ALL_WRITES=1`, only
/// `ROLLOUTS_CHAOS_N` when set, else `sample` of them drawn from `seed` (always with 1 and W).
pub fn kill_points(writes: u64, sample: usize, seed: u64) -> Vec<u64> {
    if let Some(n) = std::env::var(ONLY_N_ENV).ok().and_then(|n| n.parse().ok()) {
        return vec![n];
    }
    let all: Vec<u64> = (1..=writes).collect();
    if std::env::var(ALL_WRITES_ENV).is_ok_and(|v| v == "1") || all.len() <= sample {
        return all;
    }
    // A small xorshift: the same seed gives the same sample on every machine.
    let mut state = seed.max(1);
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut chosen = std::collections::BTreeSet::from([1, writes]);
    while chosen.len() < sample {
        chosen.insert(1 + next() % writes);
    }
    chosen.into_iter().collect()
}

/// The seed of the sample: `ROLLOUTS_CHAOS_SEED`, else one from the clock.
pub fn seed() -> u64 {
    std::env::var(SEED_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_secs())
        })
}
