//! The end-to-end scenario harness: a scenario starts kube-sim as a process (with our CRDs and
//! the Istio / Gateway API ones), a real Prometheus scraping the simulated pods, and the
//! `rollouts-controller` binary, then drives everything through the real `kubectl` and
//! `kubectl rollouts`, read as given / when / then. Against a real cluster
//! (`ROLLOUTS_E2E_KUBECONFIG`) the same scenario runs the controller locally against it.
//!
//! Every process's log and every kubectl call goes to `target/e2e/<scenario>/`, kept when the
//! scenario fails and removed when it passes; every process is killed when the scenario is
//! dropped, panicking or not. Each scenario has its own processes, so scenarios run in
//! parallel test threads.

mod binaries;
mod http;
pub mod kill_at_write;
mod kubectl;
pub mod leader_election;
mod objects;
mod process;
pub mod routers;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub use binaries::{Binaries, on_path, profile_dir, target_dir};
pub use http::BaseUrl;
pub use kubectl::{Kubectl, Output};
pub use objects::{AnalysisRunView, EventView, ReplicaSetView, RolloutView, owned_by};
pub use process::{Process, cpu_time, poll, tail};

/// Environment variable: a kubeconfig of a real cluster to run the scenarios against too.
pub const REAL_KUBECONFIG_ENV: &str = "ROLLOUTS_E2E_KUBECONFIG";
/// Environment variable: the real cluster's Prometheus, reachable from this machine (http://).
pub const REAL_PROMETHEUS_ENV: &str = "ROLLOUTS_E2E_PROMETHEUS_URL";
/// Environment variable: the app image of the real-cluster scenarios (see e2e/README.md).
pub const REAL_IMAGE_ENV: &str = "ROLLOUTS_E2E_IMAGE";
/// Environment variable: the image of the real-cluster load generator (default busybox).
pub const REAL_LOAD_IMAGE_ENV: &str = "ROLLOUTS_E2E_LOAD_IMAGE";
/// Environment variable: keep every scenario's logs, passed or not.
pub const KEEP_LOGS_ENV: &str = "ROLLOUTS_E2E_KEEP_LOGS";
/// Image the simulated pods "run": kube-sim pulls nothing.
const SIM_IMAGE: &str = "rollouts-e2e/app:1";
const DEFAULT_LOAD_IMAGE: &str = "busybox:1.36";
/// Real clusters pull images and schedule pods: every deadline is this many times longer.
const REAL_DEADLINE_FACTOR: u32 = 4;
/// How long kube-sim, Prometheus and the controller may take to start.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// File in a scenario's directory holding the id of the test process using it.
const OWNER_FILE: &str = "owner.pid";
/// How many times a failed `kubectl get` is tried.
const READ_ATTEMPTS: u32 = 3;
/// How often `eventually` looks again.
const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// One running scenario. Read it through [`Scenario::given`], [`Scenario::when`] and
/// [`Scenario::then`].
pub struct Scenario {
    name: String,
    dir: PathBuf,
    binaries: Binaries,
    kubeconfig: PathBuf,
    kubectl: Kubectl,
    prometheus_url: BaseUrl,
    prometheus_address: String,
    image: String,
    controller: RefCell<Option<Process>>,
    /// The running controller's /healthz and /readyz address.
    controller_health: RefCell<String>,
    controller_starts: Cell<u32>,
    /// The Rollout the failure messages describe.
    rollout: String,
    deadline_factor: u32,
    real: bool,
    /// Started by the scenario on kube-sim; None on a real cluster. Stopped by `Drop` after
    /// the controller, Prometheus before kube-sim.
    prometheus: Option<Process>,
    kube_sim: Option<Process>,
    /// kube-sim's pod metrics (`/metrics`, every pod's counters read at one instant); None on
    /// a real cluster.
    sim_metrics: Option<String>,
}

impl Scenario {
    /// Starts kube-sim and Prometheus for the scenario `name` (its log directory is
    /// `target/e2e/<name>/`); `rollout` is the Rollout its failure messages describe.
    pub fn on_sim(name: &str, rollout: &str) -> Scenario {
        Self::start_on_sim(name, rollout).unwrap_or_else(|e| panic!("scenario {name}: {e}"))
    }

    /// The same scenario against the real cluster of `ROLLOUTS_E2E_KUBECONFIG`; None (after
    /// printing one line saying why) when it is not set.
    pub fn on_real_cluster(name: &str, rollout: &str) -> Option<Scenario> {
        let Some(kubeconfig) = std::env::var_os(REAL_KUBECONFIG_ENV) else {
            println!(
                "scenario {name} on a real cluster: skipped, {REAL_KUBECONFIG_ENV} is not set \
                 (see e2e/README.md, \"End-to-end scenarios\")"
            );
            return None;
        };
        Some(
            Self::start_on_real_cluster(name, rollout, PathBuf::from(kubeconfig))
                .unwrap_or_else(|e| panic!("scenario {name} on a real cluster: {e}")),
        )
    }

    fn start_on_sim(name: &str, rollout: &str) -> Result<Scenario, String> {
        let binaries = Binaries::find()?;
        let dir = scenario_dir(name)?;
        let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let kubeconfig = dir.join("kubeconfig.yaml");
        let sd_file = dir.join("prometheus-targets.json");
        let sim_metrics = free_loopback_port()?;
        let mut command = Command::new(&binaries.kube_sim);
        command
            .args(["--listen", "127.0.0.1:0", "--metrics-listen", &sim_metrics])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--crds")
            .arg(manifest_dir.join("../crds/yaml"))
            .arg("--crds")
            .arg(manifest_dir.join("crds"))
            .arg("--prometheus-sd-file")
            .arg(&sd_file)
            .args(["--pod-ready-after-ms", "500"]);
        let (kube_sim, address) =
            Process::spawn_reading_first_line("kube-sim", command, &dir.join("kube-sim.log"))?;
        if !address.starts_with("127.0.0.1:") {
            return Err(format!(
                "kube-sim printed {address:?}, not its loopback address"
            ));
        }
        let prometheus = start_prometheus(&dir, &sd_file)?;
        let prometheus_address = format!("http://{}", prometheus.1);
        let kubectl = Kubectl::new(&kubeconfig, "default", binaries.plugin_dir(), &dir)?;
        Ok(Scenario {
            name: name.to_string(),
            dir,
            binaries,
            kubeconfig,
            kubectl,
            prometheus_url: BaseUrl::parse(&prometheus_address)?,
            prometheus_address,
            image: SIM_IMAGE.to_string(),
            controller: RefCell::new(None),
            controller_health: RefCell::new(String::new()),
            controller_starts: Cell::new(0),
            rollout: rollout.to_string(),
            deadline_factor: 1,
            real: false,
            prometheus: Some(prometheus.0),
            kube_sim: Some(kube_sim),
            sim_metrics: Some(sim_metrics),
        })
    }

    fn start_on_real_cluster(
        name: &str,
        rollout: &str,
        kubeconfig: PathBuf,
    ) -> Result<Scenario, String> {
        let required = |var: &str, what: &str| {
            std::env::var(var).map_err(|_| {
                format!(
                    "{REAL_KUBECONFIG_ENV} is set, so {var} must be too: {what} (see e2e/README.md)"
                )
            })
        };
        let prometheus_address = required(
            REAL_PROMETHEUS_ENV,
            "the http:// URL of a Prometheus that scrapes the scenario pods, reachable from here and from the controller",
        )?;
        let image = required(
            REAL_IMAGE_ENV,
            "an app image that honours SIM_ERROR_RATE, SIM_WARMUP_SECONDS and SIM_WARMUP_ERROR_RATE and serves http_requests_total",
        )?;
        if !kubeconfig.is_file() {
            return Err(format!(
                "{REAL_KUBECONFIG_ENV}={} is not a file: point it at the cluster's kubeconfig",
                kubeconfig.display()
            ));
        }
        let binaries = Binaries::find()?;
        let dir = scenario_dir(&format!("{name}-real-cluster"))?;
        let namespace = format!(
            "rollouts-e2e-{}-{}",
            name.replace('_', "-"),
            std::process::id()
        );
        let kubectl = Kubectl::new(&kubeconfig, &namespace, binaries.plugin_dir(), &dir)?;
        kubectl.ok(
            &["apply", "-f", "-"],
            Some(&format!(
                "{{\"apiVersion\":\"v1\",\"kind\":\"Namespace\",\"metadata\":{{\"name\":\"{namespace}\"}}}}"
            )),
        )?;
        Ok(Scenario {
            name: name.to_string(),
            dir,
            binaries,
            kubeconfig,
            kubectl,
            prometheus_url: BaseUrl::parse(&prometheus_address)?,
            prometheus_address,
            image,
            controller: RefCell::new(None),
            controller_health: RefCell::new(String::new()),
            controller_starts: Cell::new(0),
            rollout: rollout.to_string(),
            deadline_factor: REAL_DEADLINE_FACTOR,
            real: true,
            prometheus: None,
            kube_sim: None,
            sim_metrics: None,
        })
    }

    pub fn given(&self) -> Given<'_> {
        Given(self)
    }

    pub fn when(&self) -> When<'_> {
        When(self)
    }

    pub fn then(&self) -> Then<'_> {
        Then(self)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The directory holding this scenario's logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn kubectl(&self) -> &Kubectl {
        &self.kubectl
    }

    /// Running against a real cluster rather than kube-sim.
    pub fn is_real_cluster(&self) -> bool {
        self.real
    }

    /// Where kube-sim serves every simulated pod's counters (host:port, GET `/metrics`);
    /// None on a real cluster.
    pub fn sim_metrics(&self) -> Option<&str> {
        self.sim_metrics.as_deref()
    }

    /// Prometheus as the AnalysisTemplates address it.
    pub fn prometheus_address(&self) -> &str {
        &self.prometheus_address
    }

    /// A deadline scaled for where the scenario runs (real clusters are slower).
    pub fn deadline(&self, on_sim: Duration) -> Duration {
        on_sim * self.deadline_factor
    }

    /// A fixture of `e2e/tests/scenarios/` with `${NAME}` replaced by `vars` and by
    /// `${IMAGE}`, `${PROMETHEUS_URL}` and `${NAMESPACE}`; a placeholder left over is an error.
    pub fn render(&self, fixture: &str, vars: &[(&str, &str)]) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/scenarios")
            .join(fixture);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()));
        let builtins = [
            ("IMAGE", self.image.as_str()),
            ("PROMETHEUS_URL", self.prometheus_address.as_str()),
            ("NAMESPACE", self.kubectl.namespace()),
        ];
        let rendered = render(&text, vars.iter().chain(builtins.iter()));
        if let Some(at) = rendered.find("${") {
            let name: String = rendered[at..].chars().take_while(|c| *c != '}').collect();
            panic!("fixture {fixture}: no value for {name}}} (pass it in the vars)");
        }
        rendered
    }

    /// Applies a rendered fixture with `kubectl apply -f -`.
    fn apply(&self, fixture: &str, vars: &[(&str, &str)]) {
        let manifest = self.render(fixture, vars);
        self.kubectl
            .ok(&["apply", "-f", "-"], Some(&manifest))
            .unwrap_or_else(|e| panic!("applying {fixture}: {e}"));
    }

    fn start_controller(&self) {
        let mut slot = self.controller.borrow_mut();
        if slot.is_some() {
            panic!("the controller is already running: kill it first");
        }
        let starts = self.controller_starts.get() + 1;
        self.controller_starts.set(starts);
        let health = free_loopback_port().unwrap_or_else(|e| panic!("{e}"));
        let metrics = free_loopback_port().unwrap_or_else(|e| panic!("{e}"));
        let mut command = Command::new(&self.binaries.controller);
        command
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--leader-elect=false", "--log-level", "info"])
            .args(["--health-addr", &health, "--metrics-addr", &metrics])
            .env_remove("RUST_LOG")
            .env_remove("ROLLOUTS_NAMESPACE");
        if self.real {
            command.args(["--namespace", self.kubectl.namespace()]);
        }
        let log = self.dir.join(format!("controller-{starts}.log"));
        let mut controller =
            Process::spawn("rollouts-controller", command, &log).unwrap_or_else(|e| panic!("{e}"));
        let ready = poll(START_TIMEOUT, || {
            if let Some(status) = controller.exited() {
                return Some(Err(status));
            }
            matches!(http::get(&health, "/readyz"), Ok((200, _))).then_some(Ok(()))
        });
        match ready {
            Some(Ok(())) => {}
            Some(Err(status)) => panic!(
                "rollouts-controller exited ({status}) before it was ready; {}:\n{}",
                log.display(),
                controller.log_tail(40)
            ),
            None => panic!(
                "rollouts-controller did not answer /readyz on {health} within {START_TIMEOUT:?}; {}:\n{}",
                log.display(),
                controller.log_tail(40)
            ),
        }
        *slot = Some(controller);
        *self.controller_health.borrow_mut() = health;
    }

    /// The running controller as seen from outside: alive or how it exited, `/readyz`, and
    /// the CPU time it has used so far (user + system, from `/proc`).
    pub fn controller_state(&self) -> ControllerState {
        let mut slot = self.controller.borrow_mut();
        let Some(controller) = slot.as_mut() else {
            return ControllerState {
                exited: Some("not started".to_string()),
                ready: false,
                cpu: None,
            };
        };
        let exited = controller.exited();
        let ready = exited.is_none()
            && matches!(
                http::get(&self.controller_health.borrow(), "/readyz"),
                Ok((200, _))
            );
        ControllerState {
            cpu: exited
                .is_none()
                .then(|| process::cpu_time(controller.id()))
                .flatten(),
            exited,
            ready,
        }
    }

    /// What a failure message shows: the Rollout's status, its recent events and the
    /// controller's last log lines.
    pub fn describe(&self) -> String {
        let status = match self.kubectl.get_json(&["rollout", &self.rollout]) {
            Ok(rollout) => RolloutView(rollout).status_text(),
            Err(e) => format!("(cannot read it: {e})"),
        };
        let events = match self.events() {
            Ok(events) => {
                let recent = &events[events.len().saturating_sub(12)..];
                recent
                    .iter()
                    .map(|e| format!("  {} {} {} (x{})", e.time, e.reason, e.note, e.count))
                    .collect::<Vec<_>>()
                    .join("\n")
            }
            Err(e) => format!("  (cannot read them: {e})"),
        };
        let controller = self
            .controller
            .borrow()
            .as_ref()
            .map(|c| c.log_tail(15))
            .unwrap_or_else(|| "(not running)".into());
        format!(
            "Rollout {} status:\n{status}\nrecent events:\n{events}\ncontroller log (last lines):\n{controller}\nlogs kept in {}",
            self.rollout,
            self.dir.display()
        )
    }

    fn events(&self) -> Result<Vec<EventView>, String> {
        let list = self.kubectl.get_json(&["events.events.k8s.io"])?;
        let mut events: Vec<EventView> = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| {
                e["regarding"]["kind"] == "Rollout"
                    && e["regarding"]["name"] == self.rollout.as_str()
            })
            .map(EventView::from_json)
            .collect();
        events.sort_by(|a, b| a.time.cmp(&b.time));
        Ok(events)
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        if let Some(mut controller) = self.controller.borrow_mut().take() {
            controller.kill();
        }
        for process in [self.prometheus.as_mut(), self.kube_sim.as_mut()]
            .into_iter()
            .flatten()
        {
            process.kill();
        }
        if self.real {
            // Best effort: a namespace left behind is named after the scenario.
            let _ = self.kubectl.run(
                &[
                    "delete",
                    "namespace",
                    self.kubectl.namespace(),
                    "--wait=false",
                ],
                None,
            );
        }
        if std::thread::panicking() || std::env::var_os(KEEP_LOGS_ENV).is_some() {
            eprintln!(
                "scenario {}: logs kept in {}",
                self.name,
                self.dir.display()
            );
        } else {
            // Best effort: a leftover log directory is harmless.
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `target/e2e/<name>/`, emptied; `target/e2e/<name>-<pid>/` while another test process
/// still runs the same scenario there, so two `cargo test` runs do not clear each other's.
fn scenario_dir(name: &str) -> Result<PathBuf, String> {
    let base = target_dir()?.join("e2e");
    let mut dir = base.join(name);
    let owner = std::fs::read_to_string(dir.join(OWNER_FILE)).unwrap_or_default();
    let me = std::process::id().to_string();
    if !owner.is_empty() && owner != me && process_is_alive(&owner) {
        dir = base.join(format!("{name}-{me}"));
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .map_err(|e| format!("cannot clear {}: {e}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    std::fs::write(dir.join(OWNER_FILE), &me)
        .map_err(|e| format!("cannot write in {}: {e}", dir.display()))?;
    Ok(dir)
}

/// A process with this id exists (`kill -0`).
fn process_is_alive(pid: &str) -> bool {
    Command::new("kill")
        .args(["-0", pid])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// A loopback address with a port free right now, for programs that cannot bind port 0.
fn free_loopback_port() -> Result<String, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.to_string())
        .map_err(|e| format!("no free loopback port: {e}"))
}

/// Starts Prometheus scraping the file_sd targets every second; returns it and its address.
fn start_prometheus(dir: &Path, sd_file: &Path) -> Result<(Process, String), String> {
    let binary = on_path("prometheus").ok_or(
        "prometheus is not on PATH: install the Debian package (`apt-get install -y prometheus`; \
         no service needed, the scenarios start the binary)",
    )?;
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        crate::sim::traffic::prometheus::config_yaml(sd_file),
    )
    .map_err(|e| format!("cannot write {}: {e}", config.display()))?;
    let address = free_loopback_port()?;
    let mut command = Command::new(binary);
    command
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("prometheus-data").display()
        ))
        .arg(format!("--web.listen-address={address}"));
    let mut prometheus = Process::spawn("prometheus", command, &dir.join("prometheus.log"))?;
    let ready = poll(START_TIMEOUT, || {
        if let Some(status) = prometheus.exited() {
            return Some(Err(status));
        }
        matches!(http::get(&address, "/-/ready"), Ok((200, _))).then_some(Ok(()))
    });
    match ready {
        Some(Ok(())) => Ok((prometheus, address)),
        Some(Err(status)) => Err(format!(
            "prometheus exited ({status}) before it was ready:\n{}",
            prometheus.log_tail(20)
        )),
        None => Err(format!(
            "prometheus on {address} not ready within {START_TIMEOUT:?}:\n{}",
            prometheus.log_tail(20)
        )),
    }
}

/// `${NAME}` replaced by each value.
fn render<'a>(text: &str, vars: impl Iterator<Item = &'a (&'a str, &'a str)>) -> String {
    vars.fold(text.to_string(), |text, (name, value)| {
        text.replace(&format!("${{{name}}}"), value)
    })
}

/// The controller process at one moment, see [`Scenario::controller_state`].
#[derive(Debug, Clone)]
pub struct ControllerState {
    /// How it exited, when it did.
    pub exited: Option<String>,
    /// `/readyz` answered 200.
    pub ready: bool,
    /// CPU time used since it started (None where `/proc` cannot be read).
    pub cpu: Option<Duration>,
}

/// The state a scenario starts from.
pub struct Given<'a>(&'a Scenario);

impl Given<'_> {
    /// The controller runs (waits for its /readyz).
    pub fn controller_is_running(&self) -> &Self {
        self.0.start_controller();
        self
    }

    /// A fixture is applied (`kubectl apply -f -`). On a real cluster a Service fixture
    /// (`service*.yaml`) also brings the load generator, since the rps annotation does nothing
    /// there.
    pub fn manifest(&self, fixture: &str, vars: &[(&str, &str)]) -> &Self {
        self.0.apply(fixture, vars);
        if self.0.real && fixture.starts_with("service") {
            // A real Service gets no load from an annotation: a load generator sends it.
            let image =
                std::env::var(REAL_LOAD_IMAGE_ENV).unwrap_or_else(|_| DEFAULT_LOAD_IMAGE.into());
            self.0
                .apply("real-cluster-load.yaml", &[("LOAD_IMAGE", &image)]);
        }
        self
    }

    /// The Rollout is Healthy with every replica on one revision; returns its pod hash.
    pub fn rollout_is_healthy(&self, deadline: Duration) -> String {
        self.0
            .then()
            .eventually("the Rollout to be Healthy", deadline, |then| {
                let rollout = then.rollout();
                rollout
                    .is_healthy()
                    .then(|| rollout.current_hash().to_string())
            })
    }

    /// Prometheus has scraped requests to the pods of `hash` for at least `seconds`.
    pub fn prometheus_has_seen_requests(&self, hash: &str, seconds: u64, deadline: Duration) {
        let query = format!(
            "min(count_over_time(http_requests_total{{rollouts_pod_template_hash=\"{hash}\"}}[{}s]))",
            seconds + 1
        );
        self.0.then().eventually(
            &format!("Prometheus to hold {seconds}s of requests to the pods of {hash}"),
            deadline,
            |then| {
                let scrapes = then.prometheus_values(&query).ok()?;
                (scrapes.first().copied()? >= seconds as f64).then_some(())
            },
        );
    }
}

/// What happens in a scenario.
pub struct When<'a>(&'a Scenario);

impl When<'_> {
    /// A fixture is applied (`kubectl apply -f -`), e.g. a new release of the Rollout.
    pub fn manifest(&self, fixture: &str, vars: &[(&str, &str)]) -> &Self {
        self.0.apply(fixture, vars);
        self
    }

    /// `kubectl rollouts ARGS...`: returns its stdout; a failure fails the scenario.
    pub fn plugin<const N: usize>(&self, args: [&str; N]) -> String {
        let mut full = vec!["rollouts"];
        full.extend(args);
        self.0
            .kubectl
            .ok(&full, None)
            .unwrap_or_else(|e| panic!("{e}\n{}", self.0.describe()))
    }

    /// `kubectl ARGS...`: returns its stdout; a failure fails the scenario.
    pub fn kubectl<const N: usize>(&self, args: [&str; N]) -> String {
        self.0
            .kubectl
            .ok(&args, None)
            .unwrap_or_else(|e| panic!("{e}\n{}", self.0.describe()))
    }

    /// The controller is killed with SIGKILL: no shutdown, no last writes.
    pub fn controller_is_killed(&self) -> &Self {
        let mut controller = self
            .0
            .controller
            .borrow_mut()
            .take()
            .expect("a running controller to kill");
        controller.kill();
        self
    }

    /// A new controller process starts (waits for its /readyz).
    pub fn controller_restarts(&self) -> &Self {
        self.0.start_controller();
        self
    }
}

/// What a scenario checks.
pub struct Then<'a>(&'a Scenario);

impl<'a> Then<'a> {
    /// Polls `check` until it gives a value; after `deadline` (scaled for real clusters) the
    /// scenario fails saying what it waited for, with the Rollout's status and recent events.
    pub fn eventually<T>(
        &self,
        what: &str,
        deadline: Duration,
        mut check: impl FnMut(&Then<'a>) -> Option<T>,
    ) -> T {
        let deadline = self.0.deadline(deadline);
        let end = Instant::now() + deadline;
        loop {
            if let Some(value) = check(self) {
                return value;
            }
            if Instant::now() >= end {
                panic!(
                    "scenario {}: waited {deadline:?} for {what}, in vain.\n{}",
                    self.0.name,
                    self.0.describe()
                );
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// Fails the scenario with `message` and the Rollout's status and events unless `ok`.
    pub fn holds(&self, ok: bool, message: impl FnOnce() -> String) {
        if !ok {
            panic!(
                "scenario {}: {}\n{}",
                self.0.name,
                message(),
                self.0.describe()
            );
        }
    }

    /// Waits for the Rollout to move to a revision other than `stable`; returns its hash.
    pub fn new_revision(&self, stable: &str, deadline: Duration) -> String {
        self.eventually("the new revision's pod hash", deadline, |t| {
            let hash = t.rollout().current_hash().to_string();
            (hash != stable && !hash.is_empty()).then_some(hash)
        })
    }

    /// Waits for an AnalysisRun of revision `hash` to end (Successful, Failed, Error or
    /// Inconclusive) and returns it; `what` names the run in the failure message.
    pub fn finished_run(&self, what: &str, hash: &str, deadline: Duration) -> AnalysisRunView {
        self.eventually(&format!("{what} to finish"), deadline, |t| {
            t.analysis_runs().into_iter().find(|run| {
                run.hash() == hash
                    && matches!(
                        run.phase(),
                        "Successful" | "Failed" | "Error" | "Inconclusive"
                    )
            })
        })
    }

    /// The Rollout as it is now.
    pub fn rollout(&self) -> RolloutView {
        RolloutView(self.read(&["rollout", &self.0.rollout]))
    }

    /// The Rollout's ReplicaSets, by name.
    pub fn replica_sets(&self) -> Vec<ReplicaSetView> {
        let list = self.get_list("replicasets");
        let mut sets: Vec<ReplicaSetView> = owned_by(&list, &self.0.rollout)
            .map(ReplicaSetView::from_json)
            .collect();
        sets.sort_by(|a, b| a.name.cmp(&b.name));
        sets
    }

    /// (spec.replicas, availableReplicas) of each of the Rollout's ReplicaSets, by hash.
    pub fn replicas_by_hash(&self) -> BTreeMap<String, (i64, i64)> {
        self.replica_sets()
            .into_iter()
            .map(|rs| (rs.hash, (rs.replicas, rs.available)))
            .collect()
    }

    /// The Rollout's AnalysisRuns, oldest first.
    pub fn analysis_runs(&self) -> Vec<AnalysisRunView> {
        let list = self.get_list("analysisruns");
        let mut runs: Vec<AnalysisRunView> = owned_by(&list, &self.0.rollout)
            .cloned()
            .map(AnalysisRunView)
            .collect();
        runs.sort_by_key(|r| {
            r.0["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        });
        runs
    }

    /// Events about the Rollout, oldest first.
    pub fn events(&self) -> Vec<EventView> {
        self.0
            .events()
            .unwrap_or_else(|e| panic!("scenario {}: {e}", self.0.name))
    }

    /// The values of a Prometheus instant query's vector.
    pub fn prometheus_values(&self, promql: &str) -> Result<Vec<f64>, String> {
        self.0.prometheus_url.values(promql)
    }

    fn get_list(&self, resource: &str) -> serde_json::Value {
        self.read(&[resource])
    }

    /// `kubectl get ARGS -o json`; a failed call is tried again a few times (a busy machine
    /// can time one out), then fails the scenario with kubectl's error.
    fn read(&self, args: &[&str]) -> serde_json::Value {
        let mut last_error = String::new();
        for attempt in 0..READ_ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(POLL_INTERVAL);
            }
            match self.0.kubectl.get_json(args) {
                Ok(value) => return value,
                Err(e) => last_error = e,
            }
        }
        panic!(
            "scenario {}: {last_error} ({READ_ATTEMPTS} attempts)\nlogs kept in {}",
            self.0.name,
            self.0.dir.display()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scenario_directory_in_use_by_a_live_process_is_left_alone() {
        let name = "harness-unit-owner";
        let shared = target_dir().expect("a target dir").join("e2e").join(name);
        std::fs::create_dir_all(&shared).expect("creates the directory");
        // Process 1 always runs: the directory is another run's.
        std::fs::write(shared.join(OWNER_FILE), "1").expect("writes the owner");
        let mine = scenario_dir(name).expect("a directory");
        assert_eq!(
            mine.file_name().and_then(|n| n.to_str()),
            Some(format!("{name}-{}", std::process::id()).as_str())
        );
        assert!(
            shared.join(OWNER_FILE).exists(),
            "the other run's directory was cleared"
        );
        // A dead owner's directory is taken over.
        std::fs::write(shared.join(OWNER_FILE), "999999999").expect("writes the owner");
        assert_eq!(scenario_dir(name).expect("a directory"), shared);
        for dir in [mine, shared] {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    #[test]
    fn placeholders_are_replaced_by_name() {
        let vars = [("VERSION", "2"), ("ERROR_RATE", "0.2")];
        assert_eq!(
            render(
                "v${VERSION} errs ${ERROR_RATE}; {{args.canary-hash}}",
                vars.iter()
            ),
            "v2 errs 0.2; {{args.canary-hash}}"
        );
    }
}
