//! What the plugin's kube-sim test files share: an in-process kube-sim with the project's CRDs, a
//! kubeconfig and kubectl cache for it in a temp dir, a client, the plugin run through the real
//! `kubectl` (this build's directory first on PATH) or on its own, the real controller binary as a
//! child process, and polling with a deadline.

// Each test file is its own crate and uses a different subset of these helpers.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{GroupVersionKind, Request};
use rollouts_e2e::sim::{SimHandle, SimOptions, start};
use serde_json::{Value, json};

/// A deadline, not a timing: the suite shares 2 cores with parallel builds in CI.
pub const DEADLINE: Duration = Duration::from_secs(45);
pub const NAMESPACE: &str = "default";

pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// Whether a test file drives the real `kubectl`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kubectl {
    /// The world panics, saying what to install, when kubectl is not on PATH: these tests are
    /// the proof that the plugin works through kubectl, so they must not pass without it.
    Required,
    /// The tests run the plugin binary on its own.
    Unused,
}

/// How a world is set up: whether kubectl must be there and how soon pods become ready.
#[derive(Clone, Copy)]
pub struct Setup {
    pub kubectl: Kubectl,
    pub pod_ready_after: Duration,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            kubectl: Kubectl::Required,
            pod_ready_after: Duration::from_millis(100),
        }
    }
}

/// A kube-sim with the Rollout CRDs, a kubeconfig for it, a fresh kubectl cache and a client.
pub struct World {
    pub sim: SimHandle,
    pub dir: PathBuf,
    pub client: kube::Client,
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl World {
    /// A world with the default [`Setup`]; its files live in `kubectl-rollouts-<prefix>-<label>-<pid>`.
    pub fn start(prefix: &str, label: &str) -> Self {
        Self::start_with(prefix, label, Setup::default())
    }

    pub fn start_with(prefix: &str, label: &str, setup: Setup) -> Self {
        if setup.kubectl == Kubectl::Required {
            assert!(
                on_path("kubectl"),
                "kubectl is not on PATH: these tests drive the real kubectl 1.32 (CI has it)"
            );
        }
        let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds/yaml");
        let sim = start(SimOptions {
            crd_dirs: vec![crds],
            pod_ready_after: setup.pod_ready_after,
            metrics_listen: None,
            ..SimOptions::default()
        })
        .expect("kube-sim starts");
        let dir = std::env::temp_dir().join(format!(
            "kubectl-rollouts-{prefix}-{label}-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(dir.join("cache")).expect("temp dir");
        sim.write_kubeconfig(&dir.join("kubeconfig"))
            .expect("write kubeconfig");
        let config = kube::Config::new(sim.url().parse().expect("sim URL"));
        let client = kube::Client::try_from(config).expect("client");
        Self { sim, dir, client }
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// PATH with the plugin's directory first, so kubectl finds this build of it.
    pub fn path_var(&self) -> std::ffi::OsString {
        let plugin_dir = Path::new(env!("CARGO_BIN_EXE_kubectl-rollouts"))
            .parent()
            .expect("the binary has a directory")
            .to_path_buf();
        let rest = std::env::var_os("PATH").unwrap_or_default();
        std::env::join_paths(std::iter::once(plugin_dir).chain(std::env::split_paths(&rest)))
            .expect("PATH joins")
    }

    /// `kubectl ARGS` with `kubeconfig` and this world's cache.
    pub fn kubectl(&self, kubeconfig: &Path, args: &[&str]) -> Command {
        let mut command = Command::new("kubectl");
        command
            .args(args)
            .env("PATH", self.path_var())
            .env("KUBECONFIG", kubeconfig)
            .env("KUBECACHEDIR", self.dir.join("cache"))
            .env("HOME", &self.dir);
        command
    }

    /// `kubectl rollouts ARGS`, with this world's kubeconfig and cache.
    pub fn kubectl_rollouts(&self, args: &[&str]) -> Command {
        let mut command = self.kubectl(&self.kubeconfig(), &["rollouts"]);
        command.args(args);
        command
    }

    /// Runs `kubectl rollouts ARGS`.
    pub fn run(&self, args: &[&str]) -> Output {
        self.kubectl_rollouts(args).output().expect("kubectl runs")
    }

    /// Runs `kubectl rollouts ARGS`, which must succeed; returns its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "kubectl rollouts {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl-rollouts ARGS` run on its own, in namespace default of this world's kube-sim.
    pub fn plugin_command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_kubectl-rollouts"));
        command
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(["-n", NAMESPACE])
            .args(args);
        command
    }

    pub fn plugin(&self, args: &[&str]) -> Output {
        self.plugin_command(args).output().expect("the plugin runs")
    }

    /// Creates `object` in `collection` (an API path) as raw JSON, which a typed client could
    /// not send or read back; returns its metadata.
    pub async fn create_raw(&self, collection: &str, object: &Value) -> Value {
        let body = serde_json::to_vec(object).expect("encodes");
        let request = Request::new(collection)
            .create(&PostParams::default(), body)
            .expect("a create request");
        let text = self
            .client
            .request_text(request)
            .await
            .expect("kube-sim stores the object");
        // Only the metadata: the object may be deeper than serde_json reads into a Value.
        let created: Created = serde_json::from_str(&text).expect("a stored object");
        created.metadata
    }

    /// The `argoproj.io/v1alpha1` objects of `kind` (plural `plural`) in namespace default.
    pub fn argo(&self, kind: &str, plural: &str) -> Api<DynamicObject> {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("argoproj.io", "v1alpha1", kind),
            plural,
        );
        Api::namespaced_with(self.client.clone(), NAMESPACE, &resource)
    }

    pub fn rollouts(&self) -> Api<DynamicObject> {
        self.argo("Rollout", "rollouts")
    }

    pub async fn rollout(&self, name: &str) -> Value {
        serde_json::to_value(self.rollouts().get(name).await.expect("rollout exists"))
            .expect("JSON")
    }

    /// Writes `status` on the Rollout through its /status subresource, where a controller would.
    pub async fn patch_status(&self, name: &str, status: Value) {
        self.rollouts()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .expect("status patch");
    }
}

/// The canary Rollout `web` of one pod labelled `app: web`, whose one container is `container`
/// running `image`, with the canary `steps`.
pub fn web_rollout(container: &str, image: &str, steps: Value) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": "web", "namespace": NAMESPACE},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": container, "image": image}]}
            },
            "strategy": {"canary": {"steps": steps}}
        }
    })
}

#[derive(serde::Deserialize)]
struct Created {
    metadata: Value,
}

/// Polls `check` every 20 ms until it gives Some, failing after [`DEADLINE`].
pub async fn eventually<T>(what: &str, check: impl AsyncFnMut() -> Option<T>) -> T {
    eventually_within(DEADLINE, what, check).await
}

/// Polls `check` every 20 ms until it gives Some, failing after `deadline`.
pub async fn eventually_within<T>(
    deadline: Duration,
    what: &str,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let end = Instant::now() + deadline;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < end,
            "timed out after {deadline:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `target/<profile>/rollouts-controller`, next to this test's `deps/` directory. The controller
/// is not a binary of this package: `cargo build -p rollouts-controller` builds it.
pub fn controller_binary() -> PathBuf {
    let test_executable = std::env::current_exe().expect("the test executable's path");
    let profile_dir = test_executable
        .parent()
        .and_then(Path::parent)
        .expect("the test executable lives in target/<profile>/deps");
    let binary = profile_dir.join(format!(
        "rollouts-controller{}",
        std::env::consts::EXE_SUFFIX
    ));
    assert!(
        binary.is_file(),
        "the controller binary {} is missing: run `cargo build -p rollouts-controller` first (`cargo test --workspace` builds it too)",
        binary.display()
    );
    binary
}

/// The controller process, its log lines echoed to the test's stderr (shown when a test fails);
/// killed when dropped.
pub struct Controller(Child);

impl Controller {
    pub fn start(kubeconfig: &Path) -> Self {
        let mut child = Command::new(controller_binary())
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--leader-elect=false", "--log-format", "json"])
            .args([
                "--metrics-addr",
                "127.0.0.1:0",
                "--health-addr",
                "127.0.0.1:0",
            ])
            .env_remove("RUST_LOG")
            .env_remove("ROLLOUTS_NAMESPACE")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the controller starts");
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    eprintln!("controller: {line}");
                }
            });
        }
        Self(child)
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Lines of a child's stdout, as they come.
pub fn lines_of(child: &mut Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().expect("piped stdout");
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    receiver
}

pub fn next_line(lines: &mpsc::Receiver<String>) -> String {
    lines
        .recv_timeout(DEADLINE)
        .expect("the plugin printed a line in time")
}

/// Waits for a child to exit, failing after `DEADLINE`.
pub fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(status) = child.try_wait().expect("child status") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the plugin did not exit in time");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// tmux on its own socket in the test's directory, so it never touches a user's sessions.
pub struct Tmux {
    pub socket: PathBuf,
}

impl Tmux {
    pub fn command(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux runs")
    }

    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&self.command(&["capture-pane", "-p", "-t", "watch"]).stdout)
            .into_owned()
    }

    /// Polls the screen until `ready` holds, failing with the last screen after `DEADLINE`.
    pub async fn wait_for(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let screen = self.screen();
            if ready(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; the screen:\n{screen}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.command(&["kill-server"]);
    }
}

/// A loopback HTTP server a web metric can measure: each GET is answered with the next of
/// `bodies` (the last one again once they are used up). Returns its URL and the paths asked.
pub fn metric_stub(bodies: Vec<Value>) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let paths = Arc::new(Mutex::new(Vec::new()));
    let seen = paths.clone();
    std::thread::spawn(move || {
        for (served, stream) in listener.incoming().enumerate() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().expect("clone the stream"));
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            // The headers end at a blank line; a GET has no body to read.
            let mut header = String::new();
            while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
                header.clear();
            }
            if let Some(path) = request_line.split_whitespace().nth(1) {
                seen.lock().expect("paths").push(path.to_string());
            }
            let text = bodies
                .get(served)
                .or(bodies.last())
                .map(Value::to_string)
                .unwrap_or_default();
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                text.len()
            );
        }
    });
    (url, paths)
}
