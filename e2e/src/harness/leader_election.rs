//! Controller replicas with leader election on, for scenarios that run more than one: each
//! replica is a `rollouts-controller` process with its own name (its lease identity is
//! `<name>_<pid>`), log (`controller-<name>.log` in the scenario's directory) and /readyz; the
//! Lease they compete for is read back with kubectl.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use super::{BaseUrl, Binaries, Process, REAL_KUBECONFIG_ENV, Scenario, poll};

/// The Lease the replicas compete for (the controller's default name).
pub const LEASE_NAME: &str = "rollouts-controller-lock";
/// How long a replica may take to answer /readyz.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// One running controller replica; SIGKILLed when dropped.
pub struct Replica {
    name: String,
    process: Process,
}

impl Replica {
    /// Starts replica `name` with leader election on and a Lease valid for `lease_duration`
    /// (e.g. "3s") without renewal, and waits until it answers /readyz (a follower does too).
    pub fn start(s: &Scenario, name: &str, lease_duration: &str) -> Replica {
        Self::try_start(s, name, lease_duration)
            .unwrap_or_else(|e| panic!("scenario {}: replica {name}: {e}", s.name()))
    }

    fn try_start(s: &Scenario, name: &str, lease_duration: &str) -> Result<Replica, String> {
        let binaries = Binaries::find()?;
        let health = free_loopback_address()?;
        let metrics = free_loopback_address()?;
        let namespace = s.kubectl().namespace();
        let mut command = Command::new(&binaries.controller);
        command
            .arg("--kubeconfig")
            .arg(kubeconfig(s)?)
            .args(["--leader-elect=true", "--lease-name", LEASE_NAME])
            .args(["--lease-duration", lease_duration])
            .args(["--leader-election-namespace", namespace])
            .args(["--log-level", "info"])
            .args(["--health-addr", &health, "--metrics-addr", &metrics])
            // The lease identity is `$POD_NAME_<pid>`: the replica's name makes it readable.
            .env("POD_NAME", name)
            .env_remove("RUST_LOG")
            .env_remove("ROLLOUTS_NAMESPACE");
        if s.is_real_cluster() {
            command.args(["--namespace", namespace]);
        }
        let log = s.dir().join(format!("controller-{name}.log"));
        let mut process = Process::spawn(&format!("rollouts-controller {name}"), command, &log)?;
        let health_url = BaseUrl::parse(&format!("http://{health}"))?;
        let ready = poll(START_TIMEOUT, || {
            if let Some(status) = process.exited() {
                return Some(Err(status));
            }
            matches!(health_url.get("/readyz"), Ok((200, _))).then_some(Ok(()))
        });
        match ready {
            Some(Ok(())) => Ok(Replica {
                name: name.to_string(),
                process,
            }),
            Some(Err(status)) => Err(format!(
                "exited ({status}) before it was ready; {}:\n{}",
                log.display(),
                process.log_tail(40)
            )),
            None => Err(format!(
                "did not answer /readyz on {health} within {START_TIMEOUT:?}; {}:\n{}",
                log.display(),
                process.log_tail(40)
            )),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The identity it holds the Lease under.
    pub fn identity(&self) -> String {
        format!("{}_{}", self.name, self.process.id())
    }

    /// SIGKILL: no shutdown, no release of the Lease, no last write.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Exited already? Returns how.
    pub fn exited(&mut self) -> Option<String> {
        self.process.exited()
    }

    /// The last `lines` lines of its log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }
}

/// The leader Lease as it is now: (holder identity, leaseTransitions); None while there is
/// no Lease or no holder.
pub fn lease_holder(s: &Scenario) -> Option<(String, i64)> {
    let lease: Value = s
        .kubectl()
        .get_json(&["leases.coordination.k8s.io", LEASE_NAME])
        .ok()?;
    let holder = lease["spec"]["holderIdentity"]
        .as_str()
        .filter(|h| !h.is_empty())?;
    Some((
        holder.to_string(),
        lease["spec"]["leaseTransitions"].as_i64().unwrap_or(0),
    ))
}

/// The kubeconfig the scenario's kubectl uses: the real cluster's, or the one kube-sim wrote
/// into the scenario's directory.
fn kubeconfig(s: &Scenario) -> Result<PathBuf, String> {
    let path = if s.is_real_cluster() {
        std::env::var_os(REAL_KUBECONFIG_ENV)
            .map(PathBuf::from)
            .ok_or_else(|| format!("{REAL_KUBECONFIG_ENV} is not set"))?
    } else {
        s.dir().join("kubeconfig.yaml")
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("no kubeconfig at {}", path.display()))
    }
}

/// A loopback address with a port free right now (the controller takes addresses, not port 0
/// plus a report of what it bound, in its flags).
fn free_loopback_address() -> Result<String, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.to_string())
        .map_err(|e| format!("no free loopback port: {e}"))
}
