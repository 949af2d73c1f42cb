//! The AnalysisRun and Experiment tests' harness on kube-sim: the real controller binary and a
//! stand-in Prometheus.

use std::ops::Deref;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kube::api::{Api, PostParams};
use rollouts_crds::analysis::{AnalysisRun, AnalysisRunStatus};
use rollouts_crds::experiment::Experiment;
use rollouts_e2e::fake_prometheus::FakePrometheus;
use rollouts_e2e::sim::SimOptions;
use serde_json::Value;
use tokio::process::{Child, Command};

use super::{NAMESPACE, Sim};

/// How long a run may take to get where a test waits for it.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// kube-sim with our CRDs, the controller binary pointed at it (with `extra_args`), and a
/// stand-in Prometheus it queries by default: what the AnalysisRun tests on kube-sim share.
pub struct RunHarness {
    shared: Sim,
    pub prometheus: FakePrometheus,
    controller: Child,
}

impl Deref for RunHarness {
    type Target = Sim;

    fn deref(&self) -> &Sim {
        &self.shared
    }
}

impl RunHarness {
    /// Starts kube-sim (temp dirs named after `prefix`), the stand-in Prometheus and the
    /// controller with `extra_args` (its log level among them).
    pub async fn start(prefix: &str, extra_args: &[&str]) -> Self {
        // Tests have no names here: a counter keeps their temp dirs apart.
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let sim = Sim::start_with(
            prefix,
            &NEXT.fetch_add(1, Ordering::Relaxed).to_string(),
            SimOptions {
                crd_dirs: vec![super::workspace_root().join("crds/yaml")],
                ..SimOptions::default()
            },
        );
        let prometheus = FakePrometheus::start().await;
        let log = std::fs::File::create(sim.dir.0.join("controller.log")).expect("creates the log");
        let controller = Command::new(env!("CARGO_BIN_EXE_rollouts-controller"))
            .arg("--kubeconfig")
            .arg(&sim.kubeconfig)
            .args([
                "--leader-elect=false",
                "--metrics-addr",
                "127.0.0.1:0",
                "--health-addr",
                "127.0.0.1:0",
                "--prometheus-address",
                &prometheus.address,
            ])
            .args(extra_args)
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("starts rollouts-controller");
        Self {
            shared: sim,
            prometheus,
            controller,
        }
    }

    pub fn runs(&self) -> Api<AnalysisRun> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    /// Creates the Experiment `name` with `spec`.
    pub async fn create_experiment(&self, name: &str, spec: Value) {
        let experiment: Experiment = serde_json::from_value(serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Experiment",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": spec,
        }))
        .expect("an Experiment");
        Api::<Experiment>::namespaced(self.client.clone(), NAMESPACE)
            .create(&PostParams::default(), &experiment)
            .await
            .expect("creates the Experiment");
    }

    pub async fn create(&self, manifest: Value) -> AnalysisRun {
        let run: AnalysisRun = serde_json::from_value(manifest).expect("an AnalysisRun");
        self.runs()
            .create(&PostParams::default(), &run)
            .await
            .expect("creates the AnalysisRun")
    }

    pub async fn status(&self, name: &str) -> AnalysisRunStatus {
        self.runs()
            .get(name)
            .await
            .expect("reads the AnalysisRun")
            .status
            .unwrap_or_default()
    }

    /// Polls the run until `done` holds for its status; fails with the controller's log.
    pub async fn wait_for(
        &self,
        name: &str,
        what: &str,
        done: impl Fn(&AnalysisRunStatus) -> bool,
    ) -> AnalysisRunStatus {
        self.wait_status(name, what, || self.status(name), done)
            .await
    }

    /// Polls `read` (the status of the object `name`) every 50ms until `done` holds for what
    /// it gives; fails after [`DEADLINE`] with the last status read and the controller's log.
    pub async fn wait_status<S, Fut>(
        &self,
        name: &str,
        what: &str,
        read: impl Fn() -> Fut,
        done: impl Fn(&S) -> bool,
    ) -> S
    where
        S: std::fmt::Debug,
        Fut: std::future::Future<Output = S>,
    {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let status = read().await;
            if done(&status) {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {DEADLINE:?} waiting for {name} to be {what}; status: {status:#?}\ncontroller log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn wait_completed(&self, name: &str) -> AnalysisRunStatus {
        self.wait_for(name, "completed", |s| s.phase.is_completed())
            .await
    }

    /// The controller's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("controller.log")).unwrap_or_default()
    }
}

impl Drop for RunHarness {
    fn drop(&mut self) {
        let _ = self.controller.start_kill();
    }
}
