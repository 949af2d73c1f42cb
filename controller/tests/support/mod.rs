//! What the kube-sim test files share: a simulator with the project's CRDs and a client for it,
//! the real controller binary as a child process, polling with a deadline, a temp dir, a plain
//! HTTP GET, and the Rollout reads and writes (`kubectl rollouts`-style status patches) they all do.

// Each test file is its own crate and uses a different subset of these helpers.
#![allow(dead_code)]

pub mod analysis_runs;

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use rollouts_crds::analysis::{AnalysisRun, AnalysisTemplate};
use rollouts_crds::rollout::{Rollout, RolloutStatus};
use rollouts_e2e::sim::{SimHandle, SimOptions, start};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

pub const NAMESPACE: &str = "default";

/// A simulator with the project's CRDs, a kubeconfig for it in a temp dir and a client.
pub struct Sim {
    pub sim: SimHandle,
    pub kubeconfig: PathBuf,
    pub client: Client,
    /// Holds the kubeconfig; tests may keep other files (a controller log) here too.
    pub dir: TempDir,
}

impl Sim {
    /// CRDs from crds/yaml, pods ready 200ms after they are created.
    pub fn start_named(prefix: &str, name: &str) -> Self {
        Self::start_with(
            prefix,
            name,
            SimOptions {
                crd_dirs: vec![workspace_root().join("crds/yaml")],
                pod_ready_after: Duration::from_millis(200),
                ..SimOptions::default()
            },
        )
    }

    /// A simulator started with `options`; its kubeconfig lives in `<prefix>-<name>-<pid>`.
    pub fn start_with(prefix: &str, name: &str, options: SimOptions) -> Self {
        let sim = start(options).expect("kube-sim starts on a loopback port");
        let dir = TempDir::new(&format!("{prefix}-{name}"));
        let kubeconfig = dir.0.join("kubeconfig.yaml");
        sim.write_kubeconfig(&kubeconfig)
            .expect("writes the kubeconfig");
        let config = kube::Config::new(sim.url().parse().expect("the simulator URL is a URI"));
        let client = Client::try_from(config).expect("a client for a plain-HTTP server");
        Self {
            sim,
            kubeconfig,
            client,
            dir,
        }
    }

    pub fn rollouts(&self) -> Api<Rollout> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    pub async fn create_rollout(&self, rollout: Rollout) {
        self.rollouts()
            .create(&PostParams::default(), &rollout)
            .await
            .expect("creates the Rollout");
    }

    /// Rollout `name`'s status (the default while it has none).
    pub async fn status(&self, name: &str) -> RolloutStatus {
        self.rollouts()
            .get(name)
            .await
            .expect("reads the Rollout")
            .status
            .unwrap_or_default()
    }

    /// Waits until the Rollout is Healthy on its current revision with `replicas` pods, all
    /// available; returns its status.
    pub async fn wait_healthy(
        &self,
        deadline: Duration,
        name: &str,
        replicas: i32,
    ) -> RolloutStatus {
        eventually(deadline, &format!("{name} Healthy"), || async {
            let status = self.status(name).await;
            let done = status.phase == "Healthy"
                && !status.current_pod_hash.is_empty()
                && status.stable_rs == status.current_pod_hash
                && status.available_replicas == replicas
                && status.replicas == replicas;
            done.then_some(status)
        })
        .await
    }

    pub fn services(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    /// ReplicaSets with an owner reference to Rollout `rollout`.
    pub async fn owned_replica_sets(&self, rollout: &str) -> Vec<ReplicaSet> {
        let api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), NAMESPACE);
        api.list(&ListParams::default())
            .await
            .expect("lists ReplicaSets")
            .items
            .into_iter()
            .filter(|rs| rs.owner_references().iter().any(|o| o.name == rollout))
            .collect()
    }

    /// The Rollout's ReplicaSets: name -> (spec.replicas, availableReplicas).
    pub async fn replica_sets(&self, rollout: &str) -> BTreeMap<String, (i32, i32)> {
        self.owned_replica_sets(rollout)
            .await
            .iter()
            .map(|rs| {
                let replicas = rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                let available = rs
                    .status
                    .as_ref()
                    .and_then(|s| s.available_replicas)
                    .unwrap_or(0);
                (rs.name_any(), (replicas, available))
            })
            .collect()
    }

    /// Changes the image of the Rollout's `app` container.
    pub async fn set_image(&self, name: &str, image: &str) {
        let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "image": image}]}}}});
        self.rollouts()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("changes the image");
    }

    /// Patches status the way `kubectl rollouts` does (promote, abort, retry).
    pub async fn patch_status(&self, name: &str, status: Value) {
        self.rollouts()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .expect("patches status");
    }

    /// Creates the AnalysisTemplate `template` (a manifest).
    pub async fn create_template(&self, template: Value) {
        let template: AnalysisTemplate =
            serde_json::from_value(template).expect("a valid AnalysisTemplate");
        Api::<AnalysisTemplate>::namespaced(self.client.clone(), NAMESPACE)
            .create(&PostParams::default(), &template)
            .await
            .expect("creates the AnalysisTemplate");
    }

    /// Sets AnalysisRun `name`'s phase, playing the AnalysisRun controller.
    pub async fn finish_run(&self, name: &str, phase: &str) {
        Api::<AnalysisRun>::namespaced(self.client.clone(), NAMESPACE)
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"status": {"phase": phase, "message": format!("run {phase}")}}),
                ),
            )
            .await
            .expect("sets the run's phase");
    }

    /// A Service selecting the pods of Rollout `app`.
    pub async fn create_service(&self, name: &str, app: &str) {
        let service: Service = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"selector": {"app": app}, "ports": [{"port": 80}]}
        }))
        .expect("a valid Service");
        self.services()
            .create(&PostParams::default(), &service)
            .await
            .expect("creates the Service");
    }
}

/// The workspace root, from this crate's manifest dir.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("controller/ sits in the workspace root")
        .to_path_buf()
}

/// A canary Rollout of `replicas` pods of `image` (container `app`, label `app: <name>`) with
/// the given steps.
pub fn canary_rollout(name: &str, replicas: i32, image: &str, steps: Value) -> Rollout {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": name, "namespace": NAMESPACE},
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

/// What happens to the controller's log.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ControllerLog {
    /// JSON lines, echoed to stderr (shown when a test fails) and kept for [`Controller::logs`].
    Json,
    /// The default text format, discarded: nothing waits on a log line.
    Discarded,
}

/// The controller binary, its JSON log lines collected as they arrive.
pub struct Controller {
    child: Child,
    logs: Arc<Mutex<VecDeque<Value>>>,
    deadline: Duration,
}

impl Controller {
    /// Without leader election, JSON logs at info, metrics and health on one ephemeral port;
    /// `deadline` bounds the waits on it.
    pub fn start(kubeconfig: &Path, deadline: Duration) -> Self {
        Self::start_with(kubeconfig, deadline, ControllerLog::Json)
    }

    /// Like [`Self::start`], with the log handled as `log` says.
    pub fn start_with(kubeconfig: &Path, deadline: Duration, log: ControllerLog) -> Self {
        Self::start_with_args(kubeconfig, deadline, log, &[])
    }

    /// Like [`Self::start_with`], with more flags.
    pub fn start_with_args(
        kubeconfig: &Path,
        deadline: Duration,
        log: ControllerLog,
        args: &[&str],
    ) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rollouts-controller"));
        command.arg("--kubeconfig").arg(kubeconfig).args(args);
        match log {
            ControllerLog::Json => {
                command
                    .args(["--leader-elect=false", "--log-format", "json"])
                    .args(["--log-level", "info"])
                    .stdout(Stdio::piped());
            }
            ControllerLog::Discarded => {
                command
                    .args(["--leader-elect=false", "--log-level", "info"])
                    .stdout(Stdio::null());
            }
        }
        let mut child = command
            .args([
                "--metrics-addr",
                "127.0.0.1:0",
                "--health-addr",
                "127.0.0.1:0",
            ])
            .env_remove("RUST_LOG")
            .env_remove("ROLLOUTS_NAMESPACE")
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("starts the controller");
        let logs = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(stdout) = child.stdout.take() {
            let sink = logs.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    // Shown only when a test fails.
                    eprintln!("controller: {line}");
                    if let Ok(entry) = serde_json::from_str::<Value>(&line) {
                        sink.lock().expect("logs").push_back(entry);
                    }
                }
            });
        }
        Self {
            child,
            logs,
            deadline,
        }
    }

    /// The JSON log lines seen so far.
    pub fn logs(&self) -> Arc<Mutex<VecDeque<Value>>> {
        self.logs.clone()
    }

    /// `--metrics-addr` and `--health-addr` are the same (`127.0.0.1:0`), so one listener
    /// serves /metrics too.
    pub async fn metrics_addr(&self) -> SocketAddr {
        eventually(self.deadline, "the metrics address in the log", || async {
            self.logs
                .lock()
                .expect("logs")
                .iter()
                .find(|entry| entry["message"] == "serving /healthz and /readyz")
                .and_then(|entry| entry["addr"].as_str().and_then(|a| a.parse().ok()))
        })
        .await
    }

    /// How many reconciles of `name` have finished, from /metrics.
    pub async fn reconciles(&self, name: &str) -> u64 {
        let addr = self.metrics_addr().await;
        let body = http_get(addr, "/metrics").await;
        let series =
            format!("rollout_reconcile_count{{namespace=\"{NAMESPACE}\",name=\"{name}\"}}");
        body.lines()
            .find_map(|line| line.strip_prefix(&series))
            .and_then(|count| count.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Like [`Self::reconciles`] without waiting: `None` until the address is logged, the
    /// endpoint answers and the series exists.
    pub async fn try_reconciles(&self, name: &str) -> Option<u64> {
        let addr = self
            .logs
            .lock()
            .expect("logs")
            .iter()
            .find(|entry| entry["message"] == "serving /healthz and /readyz")
            .and_then(|entry| {
                entry["addr"]
                    .as_str()
                    .and_then(|a| a.parse::<SocketAddr>().ok())
            })?;
        let mut stream = TcpStream::connect(addr).await.ok()?;
        let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut body = String::new();
        stream.read_to_string(&mut body).await.ok()?;
        let series =
            format!("rollout_reconcile_count{{namespace=\"{NAMESPACE}\",name=\"{name}\"}}");
        body.lines()
            .find_map(|line| line.strip_prefix(&series))
            .and_then(|count| count.trim().parse().ok())
    }

    /// SIGKILL: no shutdown, no chance to finish anything.
    pub async fn kill(mut self) {
        self.child.kill().await.expect("kills the controller");
    }
}

/// A GET over a fresh connection; the whole response, headers included.
pub async fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connects");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("writes");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("reads");
    response
}

/// Polls `check` every 50ms until it gives a value, failing after `deadline`.
pub async fn eventually<T, F, Fut>(deadline: Duration, what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_with_log(
        deadline,
        Duration::from_millis(50),
        what,
        String::new,
        check,
    )
    .await
}

/// Polls `check` every `poll` until it gives a value; fails after `deadline` with what `log`
/// gives (say, the controller's log) appended to the message.
pub async fn eventually_with_log<T, F, Fut>(
    deadline: Duration,
    poll: Duration,
    what: &str,
    log: impl Fn() -> String,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let until = tokio::time::Instant::now() + deadline;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "timed out after {deadline:?} waiting for {what}{}",
            log()
        );
        tokio::time::sleep(poll).await;
    }
}

/// Reads a request's head (request line and headers) from a stand-in server's connection;
/// `None` if the client goes away first.
pub async fn read_request_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut chunk = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// A directory removed when the test ends.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// `<name>-<pid>` under the system temp dir.
    pub fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&path).expect("creates temp dir");
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
