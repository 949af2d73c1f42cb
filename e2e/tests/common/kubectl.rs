//! The real `kubectl` (found on PATH) with its own kubeconfig and discovery cache, pointed at
//! a fresh kube-sim.

use std::path::PathBuf;
use std::process::{Command, Output};

use rollouts_e2e::sim::SimHandle;
use serde_json::Value;

use super::sim;

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(label: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "kube-sim-{label}-{}-{}",
            std::process::id(),
            rollouts_e2e::sim::meta::random_suffix(8)
        ));
        std::fs::create_dir_all(&dir).expect("create a temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // Leftovers in the temp dir are harmless if removal fails.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn find_on_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// kubectl with its own kubeconfig and a fresh discovery cache.
pub struct Kubectl {
    pub sim: SimHandle,
    pub dir: TempDir,
    pub binary: PathBuf,
}

impl Kubectl {
    pub fn new(label: &str) -> Self {
        let binary = find_on_path("kubectl").unwrap_or_else(|| {
            panic!(
                "kubectl is not on PATH: install kubectl 1.32 (CI does) to run the kubectl tests"
            )
        });
        let sim = sim();
        let dir = TempDir::new(label);
        sim.write_kubeconfig(&dir.0.join("kubeconfig"))
            .expect("write kubeconfig");
        Self { sim, dir, binary }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.0.join(name)
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--kubeconfig")
            .arg(self.path("kubeconfig"))
            .arg("--cache-dir")
            .arg(self.path("cache"))
            .args(args);
        cmd.env_remove("KUBECONFIG");
        cmd
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("kubectl runs")
    }

    /// Runs kubectl and returns stdout, failing the test with stderr when it fails.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let mut full = args.to_vec();
        full.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&full)).expect("kubectl prints JSON")
    }

    pub fn write(&self, name: &str, value: &Value) -> String {
        let path = self.path(name);
        std::fs::write(&path, serde_json::to_vec_pretty(value).expect("json"))
            .expect("write manifest");
        path.to_string_lossy().into_owned()
    }
}
