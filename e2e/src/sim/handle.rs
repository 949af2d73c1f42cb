//! Starting the simulator: options, start-up (default namespaces, CRDs from directories), and
//! the handle a test or the `kube-sim` binary holds (address, kubeconfig, request log, faults).

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;

use super::controllers::{self, ClusterConfig, PodReadiness};
use super::faults::{FaultCounts, Faults};
use super::request_log::{RequestLog, RequestRecord};
use super::server::{self, Sim};
use super::status::ApiError;
use super::store::{Store, Target};
use super::traffic::{self, TrafficNoise, TrafficOptions};

/// How to run the simulator. `SimOptions::default()` listens on an ephemeral loopback port.
#[derive(Debug, Clone)]
pub struct SimOptions {
    pub listen: SocketAddr,
    /// Directories whose `*.yaml`, `*.yml` and `*.json` CRDs are created at start.
    pub crd_dirs: Vec<PathBuf>,
    pub faults: Faults,
    /// Also append every request as a JSON line to this file.
    pub request_log_file: Option<PathBuf>,
    /// Events retained for watches to resume from; older resourceVersions get 410 Expired.
    pub event_log_capacity: usize,
    /// How often watches that allow bookmarks get one.
    pub bookmark_interval: Duration,
    /// How long a pod takes to become Ready unless its template annotation says otherwise.
    pub pod_ready_after: Duration,
    /// Per-pod random readiness (seeded), some pods failing their first start; replaces
    /// `pod_ready_after` when set.
    pub pod_readiness: Option<PodReadiness>,
    /// Where the simulated pods' Prometheus metrics are served (port 0 picks one); None turns
    /// the traffic and metrics simulation off.
    pub metrics_listen: Option<SocketAddr>,
    /// Requests per second sent to every Service (through its router) that has no
    /// `sim.rollouts.dev/rps` annotation; 0 sends load only where annotated.
    pub load_rps: f64,
    /// How often the load generator sends requests.
    pub traffic_tick: Duration,
    /// Write a Prometheus file_sd target file (one target per pod) here as pods come and go.
    pub prometheus_sd_file: Option<PathBuf>,
    /// Noisy traffic: draw arrivals, errors and latencies from this seed; None (the default)
    /// counts them exactly.
    pub traffic_noise: Option<TrafficNoise>,
}

impl Default for SimOptions {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            crd_dirs: Vec::new(),
            faults: Faults::default(),
            request_log_file: None,
            event_log_capacity: 10_000,
            bookmark_interval: Duration::from_secs(10),
            pod_ready_after: Duration::from_secs(1),
            pod_readiness: None,
            metrics_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            load_rps: 0.0,
            traffic_tick: Duration::from_millis(100),
            prometheus_sd_file: None,
            traffic_noise: None,
        }
    }
}

/// A running simulator; dropping it shuts the server down.
pub struct SimHandle {
    sim: Arc<Sim>,
    shutdown: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
    metrics_address: Option<SocketAddr>,
}

/// Starts the simulator on its own thread and runtime, so sync and async tests alike can use it.
pub fn start(options: SimOptions) -> io::Result<SimHandle> {
    let listener = std::net::TcpListener::bind(options.listen)?;
    listener.set_nonblocking(true)?;
    let address = listener.local_addr()?;
    let metrics_listener = match options.metrics_listen {
        Some(listen) => {
            let l = std::net::TcpListener::bind(listen).map_err(|e| {
                io::Error::new(e.kind(), format!("metrics listener on {listen}: {e}"))
            })?;
            l.set_nonblocking(true)?;
            Some(l)
        }
        None => None,
    };
    let metrics_address = match &metrics_listener {
        Some(l) => Some(l.local_addr()?),
        None => None,
    };
    let traffic_options = TrafficOptions {
        load_rps: options.load_rps,
        tick: options.traffic_tick,
        prometheus_sd_file: options.prometheus_sd_file.clone(),
        noise: options.traffic_noise.clone(),
    };
    if let Some(readiness) = &options.pod_readiness {
        readiness.validate().map_err(io::Error::other)?;
    }
    let store = Store::new(options.event_log_capacity);
    {
        let mut state = store.lock();
        let namespaces = state
            .registry
            .get("", "v1", "namespaces")
            .expect("namespaces are built in");
        for ns in ["default", "kube-system", "kube-public"] {
            state
                .create(&namespaces, "", json!({"metadata": {"name": ns}}))
                .map_err(|e| io::Error::other(e.message))?;
        }
    }
    for dir in &options.crd_dirs {
        load_crds(&store, dir)?;
    }
    let requests = RequestLog::new(options.request_log_file.as_deref())?;
    let (shutdown, shutdown_rx) = watch::channel(false);
    let sim = Arc::new(Sim::new(
        store,
        options.faults.clone(),
        requests,
        options.bookmark_interval,
        shutdown_rx,
        address,
    ));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("kube-sim")
        .thread_stack_size(super::body::THREAD_STACK)
        .enable_all()
        .build()?;
    let served = sim.clone();
    let cluster = ClusterConfig {
        pod_ready_after: options.pod_ready_after,
        pod_readiness: options.pod_readiness.clone(),
    };
    let thread = std::thread::Builder::new()
        .name("kube-sim".into())
        .stack_size(super::body::THREAD_STACK)
        .spawn(move || {
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        eprintln!("kube-sim: cannot serve on {address}: {e}");
                        return;
                    }
                };
                tokio::spawn(controllers::run(served.clone(), cluster));
                if let Some(l) = metrics_listener {
                    match tokio::net::TcpListener::from_std(l) {
                        Ok(l) => {
                            tokio::spawn(traffic::run(served.clone(), l, traffic_options));
                        }
                        Err(e) => eprintln!("kube-sim: cannot serve metrics: {e}"),
                    }
                }
                server::serve(listener, served).await;
            });
            runtime.shutdown_background();
        })?;
    Ok(SimHandle {
        sim,
        shutdown,
        thread: Some(thread),
        metrics_address,
    })
}

/// Creates every CRD found in `dir` (multi-document YAML allowed).
fn load_crds(store: &Store, dir: &Path) -> io::Result<()> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("--crds {}: {e}", dir.display())))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .is_some_and(|x| x == "yaml" || x == "yml" || x == "json")
        })
        .collect();
    files.sort();
    for file in files {
        let bad = |why: String| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("--crds: {}: {why}", file.display()),
            )
        };
        let text = std::fs::read_to_string(&file).map_err(|e| bad(e.to_string()))?;
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(&text).map_err(|e| bad(e.to_string()))?;
        let mut state = store.lock();
        let info = state
            .registry
            .get("apiextensions.k8s.io", "v1", "customresourcedefinitions")
            .expect("CRDs are built in");
        for doc in docs.into_iter().filter(|d| d.is_object()) {
            if doc["kind"] != "CustomResourceDefinition" {
                continue;
            }
            state
                .create(&info, "", doc)
                .map_err(|e: ApiError| bad(e.message))?;
        }
    }
    Ok(())
}

impl SimHandle {
    pub fn address(&self) -> SocketAddr {
        self.sim.address
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.sim.address)
    }

    /// Where the simulated pods' metrics are served (`/metrics`), unless turned off.
    pub fn metrics_address(&self) -> Option<SocketAddr> {
        self.metrics_address
    }

    /// A kubeconfig for this server: context `kube-sim`, namespace `default`, no auth.
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: kube-sim\n  cluster:\n    server: {}\nusers:\n- name: kube-sim\n  user: {{}}\ncontexts:\n- name: kube-sim\n  context:\n    cluster: kube-sim\n    user: kube-sim\n    namespace: default\ncurrent-context: kube-sim\npreferences: {{}}\n",
            self.url()
        )
    }

    pub fn write_kubeconfig(&self, path: &Path) -> io::Result<()> {
        std::fs::write(path, self.kubeconfig())
    }

    /// Every request served so far, oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.sim.requests.snapshot()
    }

    /// The requests served after the first `from` (see [`RequestLog::since`]).
    pub fn requests_since(&self, from: usize) -> Vec<RequestRecord> {
        self.sim.requests.since(from)
    }

    /// How many requests the log holds.
    pub fn request_count(&self) -> usize {
        self.sim.requests.len()
    }

    pub fn clear_requests(&self) {
        self.sim.requests.clear();
    }

    pub fn faults(&self) -> Faults {
        self.sim.faults()
    }

    /// Writes the write-cut rule let through, and requests it refused, since the faults were
    /// last set.
    pub fn write_cut_counts(&self) -> (u64, u64) {
        (self.sim.write_cut.writes(), self.sim.write_cut.refused())
    }

    /// Changes the injected faults while the server runs.
    pub fn set_faults(&self, faults: Faults) {
        self.sim.set_faults(faults);
    }

    /// Faults injected so far, by kind.
    pub fn fault_counts(&self) -> FaultCounts {
        self.sim.fault_log.counts()
    }

    /// The seed random faults are drawn from (the one given, or the one the OS gave).
    pub fn fault_seed(&self) -> u64 {
        self.sim.fault_log.seed()
    }

    /// Ends every open watch and compacts the event log: resuming watchers get 410 Expired.
    pub fn expire_watches(&self) {
        self.sim.store.expire_watches();
    }

    /// Number of objects stored, of every resource.
    pub fn object_count(&self) -> usize {
        self.sim.store.lock().object_count()
    }

    /// Creates an object directly in the store (no HTTP), resolving its resource from
    /// `apiVersion` and `kind`: for seeding and benchmarks.
    pub fn create(&self, namespace: &str, obj: Value) -> Result<Value, ApiError> {
        let mut state = self.sim.store.lock();
        let api_version = obj["apiVersion"].as_str().unwrap_or_default();
        let kind = obj["kind"].as_str().unwrap_or_default();
        let info = state.registry.by_kind(api_version, kind).ok_or_else(|| {
            ApiError::bad_request(format!(
                "no resource serves apiVersion {api_version:?} kind {kind:?}: create its CRD first"
            ))
        })?;
        state.create(&info, namespace, obj).map(|o| (*o).clone())
    }

    /// Every object of `kind` (of `api_version`) in `namespace`, read directly from the store
    /// (no HTTP, so no injected fault): for checks in soaks and benchmarks.
    pub fn list(&self, namespace: &str, api_version: &str, kind: &str) -> Vec<Value> {
        let state = self.sim.store.lock();
        let Some(info) = state.registry.by_kind(api_version, kind) else {
            return Vec::new();
        };
        state
            .list(&info.key(), Some(namespace), None)
            .map(|(_, object)| (**object).clone())
            .collect()
    }

    /// Replaces an object's spec and metadata directly in the store (no HTTP), with the API
    /// server's rules (resourceVersion precondition when set, generation bumped on a change).
    pub fn replace(&self, namespace: &str, obj: Value) -> Result<Value, ApiError> {
        let mut state = self.sim.store.lock();
        let api_version = obj["apiVersion"].as_str().unwrap_or_default();
        let kind = obj["kind"].as_str().unwrap_or_default();
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let info = state.registry.by_kind(api_version, kind).ok_or_else(|| {
            ApiError::bad_request(format!(
                "no resource serves apiVersion {api_version:?} kind {kind:?}: create its CRD first"
            ))
        })?;
        state
            .update(&info, namespace, &name, obj, Target::Main)
            .map(|o| (*o).clone())
    }

    /// Blocks until the process gets SIGINT or SIGTERM (for the `kube-sim` binary).
    pub fn wait_for_signal(&self) -> io::Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            tokio::select! {
                r = tokio::signal::ctrl_c() => r,
                _ = term.recv() => Ok(()),
            }
        })
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.shutdown.send_replace(true);
        if let Some(thread) = self.thread.take() {
            // A panicked server thread has already reported its panic.
            let _ = thread.join();
        }
    }
}
