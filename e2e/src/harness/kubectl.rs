//! The real `kubectl` (found on PATH) for one scenario: its kubeconfig, namespace and discovery
//! cache, the `kubectl-rollouts` plugin's directory first on PATH, and every call (arguments,
//! exit status, stdout, stderr) appended to the scenario's `kubectl.log`.

use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// What one call gave.
#[derive(Debug, Clone)]
pub struct Output {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// kubectl bound to one scenario's cluster and namespace.
pub struct Kubectl {
    binary: PathBuf,
    kubeconfig: PathBuf,
    cache_dir: PathBuf,
    namespace: String,
    path: OsString,
    log: Mutex<(File, u64)>,
}

impl Kubectl {
    /// `plugin_dir` goes first on PATH so `kubectl rollouts` runs the plugin just built.
    pub fn new(
        kubeconfig: &Path,
        namespace: &str,
        plugin_dir: &Path,
        dir: &Path,
    ) -> Result<Kubectl, String> {
        let binary = super::binaries::on_path("kubectl").ok_or(
            "kubectl is not on PATH: install kubectl 1.32 (CI does) to run the end-to-end scenarios",
        )?;
        let mut paths = vec![plugin_dir.to_path_buf()];
        paths.extend(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        ));
        let path = std::env::join_paths(paths)
            .map_err(|e| format!("{} cannot go on PATH: {e}", plugin_dir.display()))?;
        let log_path = dir.join("kubectl.log");
        let log = File::create(&log_path)
            .map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
        Ok(Kubectl {
            binary,
            kubeconfig: kubeconfig.to_path_buf(),
            cache_dir: dir.join("kubectl-cache"),
            namespace: namespace.to_string(),
            path,
            log: Mutex::new((log, 0)),
        })
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// `kubectl -n NS ARGS...`, with `stdin` piped in when given.
    pub fn run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut full: Vec<&str> = Vec::new();
        let plugin = args.first() == Some(&"rollouts");
        if plugin {
            // Plugins get no kubectl flags before their name; they read KUBECONFIG and -n.
            full.extend(args);
            full.extend(["-n", &self.namespace]);
        } else {
            let cache = self.cache_dir.to_str().unwrap_or(".kube-cache");
            full.extend(["--cache-dir", cache, "-n", &self.namespace]);
            full.extend(args);
        }
        let mut command = Command::new(&self.binary);
        command
            .args(&full)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("PATH", &self.path)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let output = command.spawn().and_then(|mut child| {
            if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
                pipe.write_all(text.as_bytes())?;
            }
            child.wait_with_output()
        });
        let output = match output {
            Ok(o) => Output {
                success: o.status.success(),
                stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
            },
            Err(e) => Output {
                success: false,
                stdout: String::new(),
                stderr: format!("kubectl did not run ({}): {e}", self.binary.display()),
            },
        };
        self.record(&full, stdin, &output);
        output
    }

    /// Like [`Kubectl::run`], but a failure is an error naming the command and its stderr.
    pub fn ok(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        let output = self.run(args, stdin);
        if output.success {
            Ok(output.stdout)
        } else {
            Err(format!(
                "`kubectl {}` failed: {}{}",
                args.join(" "),
                output.stderr.trim(),
                if output.stdout.trim().is_empty() {
                    String::new()
                } else {
                    format!(" (stdout: {})", output.stdout.trim())
                }
            ))
        }
    }

    /// `kubectl get ARGS -o json`, parsed.
    pub fn get_json(&self, args: &[&str]) -> Result<serde_json::Value, String> {
        let mut full = vec!["get"];
        full.extend(args);
        full.extend(["-o", "json"]);
        let text = self.ok(&full, None)?;
        serde_json::from_str(&text)
            .map_err(|e| format!("`kubectl {}` printed no JSON ({e}): {text}", full.join(" ")))
    }

    fn record(&self, args: &[&str], stdin: Option<&str>, output: &Output) {
        let mut guard = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let (file, count) = &mut *guard;
        *count += 1;
        // The log is for people reading a failure; a failed write must not fail the scenario.
        let _ = writeln!(
            file,
            "#{count} kubectl {}\n{}exit: {}\n--- stdout\n{}\n--- stderr\n{}\n",
            args.join(" "),
            stdin
                .map(|s| format!("--- stdin\n{s}\n"))
                .unwrap_or_default(),
            if output.success { "ok" } else { "failed" },
            output.stdout.trim_end(),
            output.stderr.trim_end(),
        );
    }
}
