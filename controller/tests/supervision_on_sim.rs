//! The real binary against kube-sim when the API server misbehaves: a leader whose Lease
//! renewals hang stops acting before its lease can expire, and its standby takes over only
//! after that; start-up retries through server errors (alive for /healthz, not Ready,
//! meanwhile) until the controller is Ready and rolls out.
//!
//! Timing is never asserted: the lease test compares the order of events on one clock (the
//! last write of the leader the test saw, which is no earlier than the write itself, against
//! the expiry its last renewal wrote into the Lease, and that against the time the standby
//! wrote when it took the Lease).

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams};
use rollouts_e2e::sim::Faults;
use rollouts_e2e::sim::faults::Hold;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use support::{NAMESPACE, Sim, canary_rollout, eventually, http_get};

const DEADLINE: Duration = Duration::from_secs(90);
const PREFIX: &str = "rollouts-supervision";
const USER_AGENT_PREFIX: &str = "rollouts-controller/";

/// The controller binary with `extra` flags, JSON logs collected as they arrive.
struct Controller {
    child: Child,
    logs: Arc<Mutex<Vec<Value>>>,
}

impl Controller {
    fn start(kubeconfig: &Path, extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rollouts-controller"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--log-format", "json", "--log-level", "info"])
            .args([
                "--health-addr",
                "127.0.0.1:0",
                "--metrics-addr",
                "127.0.0.1:0",
            ])
            .args(extra)
            .env_remove("RUST_LOG")
            .env_remove("ROLLOUTS_NAMESPACE")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("starts the controller");
        let logs = Arc::new(Mutex::new(Vec::new()));
        if let Some(stdout) = child.stdout.take() {
            let sink = logs.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    // Shown only when a test fails.
                    eprintln!("controller: {line}");
                    if let Ok(entry) = serde_json::from_str::<Value>(&line) {
                        sink.lock().expect("logs").push(entry);
                    }
                }
            });
        }
        Self { child, logs }
    }

    /// The log entries whose message is `message`.
    fn entries(&self, message: &str) -> Vec<Value> {
        self.logs
            .lock()
            .expect("logs")
            .iter()
            .filter(|entry| entry["message"] == message)
            .cloned()
            .collect()
    }

    async fn log(&self, message: &str) -> Value {
        eventually(DEADLINE, &format!("log line {message:?}"), || async {
            self.entries(message).into_iter().next()
        })
        .await
    }

    async fn health_addr(&self) -> SocketAddr {
        let entry = self.log("serving /healthz and /readyz").await;
        entry["addr"]
            .as_str()
            .and_then(|addr| addr.parse().ok())
            .expect("an addr field")
    }
}

/// The controller's requests (by its user agent) other than those on Leases.
fn controller_requests(sim: &Sim) -> usize {
    sim.sim
        .requests()
        .iter()
        .filter(|r| r.user_agent.starts_with(USER_AGENT_PREFIX) && r.resource != "leases")
        .count()
}

/// The controller's writes (create, update, patch, delete) other than those on Leases.
fn controller_writes(sim: &Sim) -> usize {
    sim.sim
        .requests()
        .iter()
        .filter(|r| {
            r.user_agent.starts_with(USER_AGENT_PREFIX)
                && r.resource != "leases"
                && matches!(r.verb.as_str(), "create" | "update" | "patch" | "delete")
        })
        .count()
}

#[tokio::test]
async fn a_leader_whose_lease_renewals_hang_stops_acting_before_its_lease_expires() {
    let cluster = Sim::start_named(PREFIX, "lease-hang");
    cluster
        .create_rollout(canary_rollout(
            "web",
            2,
            "app:v1",
            json!([{"setWeight": 50}, {"pause": {}}]),
        ))
        .await;
    // 6s lease: a 4s renew deadline, renewals every 800ms.
    let mut controller = Controller::start(
        &cluster.kubeconfig,
        &[
            "--leader-elect=true",
            "--leader-election-namespace",
            NAMESPACE,
            "--lease-duration",
            "6s",
        ],
    );
    controller.log("became leader").await;
    cluster.wait_healthy(DEADLINE, "web", 2).await;
    let leader = controller.log("waiting for the leader lease").await["identity"].clone();
    // A standby, which must not act before the leader's lease has expired.
    let standby = Controller::start(
        &cluster.kubeconfig,
        &[
            "--leader-elect=true",
            "--leader-election-namespace",
            NAMESPACE,
            "--lease-duration",
            "6s",
        ],
    );
    let standby_identity = standby.log("waiting for the leader lease").await["identity"].clone();
    assert_ne!(leader, standby_identity);

    // From now on no Lease request is answered.
    cluster.sim.set_faults(Faults {
        holds: vec![Hold::leases()],
        ..Faults::default()
    });
    let held_at = Timestamp::now();
    let writes_before_hold = controller_writes(&cluster);

    // Keep the leader busy: each change of spec.replicas makes it scale and write status.
    // Note when each of its writes is first seen: no earlier than the write itself.
    let mut seen_writes = writes_before_hold;
    let mut last_write_seen: Option<Timestamp> = None;
    let mut replicas = 2;
    let exit = loop {
        if let Some(status) = controller.child.try_wait().expect("polls the controller") {
            break status;
        }
        assert!(
            Timestamp::now().duration_since(held_at)
                < SignedDuration::try_from(DEADLINE).expect("fits"),
            "the leader kept running for {DEADLINE:?} without renewing its lease"
        );
        replicas = if replicas == 2 { 3 } else { 2 };
        // The test's own request may fail while the controller writes too; the next one will do.
        let _ = cluster
            .rollouts()
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": replicas}})),
            )
            .await;
        let writes = controller_writes(&cluster);
        if writes > seen_writes {
            seen_writes = writes;
            last_write_seen = Some(Timestamp::now());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let exited_seen = Timestamp::now();
    let requests_at_exit = controller_requests(&cluster);
    assert_eq!(exit.code(), Some(1), "a lost lease is a failure exit");
    let lost = controller
        .entries("stopping at once: this replica may no longer act")
        .into_iter()
        .next()
        .expect("the leader logged why it stopped");
    assert!(
        lost["error"]
            .as_str()
            .is_some_and(|e| e.contains("not renewed within the renew deadline")),
        "{lost}"
    );

    // Nothing of the dead leader's arrives later (its held Lease reads aside), and the standby
    // has not acted either.
    assert_eq!(controller_requests(&cluster), requests_at_exit);

    // Release the held requests and read the lease the leader's last renewal left: the
    // standby cannot have written it before it expires.
    cluster.sim.set_faults(Faults::default());
    let leases = Api::<Lease>::namespaced(cluster.client.clone(), NAMESPACE);
    let lease = leases
        .get("rollouts-controller-lock")
        .await
        .expect("reads the Lease");
    let spec = lease.spec.expect("a Lease spec");
    assert_eq!(spec.holder_identity.as_deref(), leader.as_str());
    let renewed = spec.renew_time.expect("renewed at least once").0;
    let duration = spec.lease_duration_seconds.expect("a lease duration");
    assert_eq!(duration, 6);
    let expires = renewed
        .checked_add(SignedDuration::from_secs(i64::from(duration)))
        .expect("a representable expiry");

    assert!(
        seen_writes > writes_before_hold,
        "the leader acted while its renewals hung"
    );
    let last_write_seen = last_write_seen.expect("a write was seen");
    assert!(
        last_write_seen < expires,
        "the leader's last write (seen at {last_write_seen}) came after its lease expired at {expires}"
    );
    assert!(
        exited_seen < expires,
        "the leader still ran (exit seen at {exited_seen}) when its lease expired at {expires}"
    );
    // Shown with --nocapture: how much of the lease was left.
    eprintln!(
        "last write seen {:?} and exit seen {:?} before the lease expired",
        expires.duration_since(last_write_seen),
        expires.duration_since(exited_seen)
    );

    // The standby takes over, and only once the old lease has expired.
    standby.log("became leader").await;
    let taken = leases
        .get("rollouts-controller-lock")
        .await
        .expect("reads the Lease")
        .spec
        .expect("a Lease spec");
    assert_eq!(taken.holder_identity.as_deref(), standby_identity.as_str());
    let acquired = taken.acquire_time.expect("an acquire time").0;
    assert!(
        acquired >= expires,
        "the standby took the lease at {acquired}, before it expired at {expires}"
    );
    assert_eq!(taken.lease_transitions, Some(1));
}

#[tokio::test]
async fn startup_retries_through_server_errors_until_ready() {
    let cluster = Sim::start_named(PREFIX, "startup-errors");
    cluster
        .create_rollout(canary_rollout(
            "web",
            2,
            "app:v1",
            json!([{"setWeight": 50}]),
        ))
        .await;
    // Every resource request fails until the controller has retried its first list twice.
    cluster.sim.set_faults(Faults {
        error_rate: 1.0,
        ..Faults::default()
    });
    let controller = Controller::start(&cluster.kubeconfig, &["--leader-elect=false"]);
    let message = "cannot list Rollouts in all namespaces at startup; retrying";
    let retries = eventually(DEADLINE, "two start-up retries", || async {
        let retries = controller.entries(message);
        (retries.len() >= 2).then_some(retries)
    })
    .await;
    assert_eq!(retries[0]["attempt"], json!(1), "{:?}", retries[0]);
    assert_eq!(retries[1]["attempt"], json!(2), "{:?}", retries[1]);
    assert!(
        retries[0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("injected fault")),
        "{:?}",
        retries[0]
    );

    // Meanwhile it is alive for a liveness probe, and not Ready, saying why.
    let health = controller.health_addr().await;
    assert!(
        http_get(health, "/healthz")
            .await
            .starts_with("HTTP/1.1 200"),
        "/healthz answers while the start-up check retries"
    );
    let readyz = http_get(health, "/readyz").await;
    assert!(
        readyz.starts_with("HTTP/1.1 503")
            && readyz
                .contains("the start-up check is down: cannot list Rollouts in all namespaces yet")
            && readyz.contains("injected fault"),
        "/readyz while the start-up check retries: {readyz}"
    );

    // Then one request in twenty fails, as on a struggling API server.
    cluster.sim.set_faults(Faults {
        error_rate: 0.05,
        ..Faults::default()
    });
    eventually(DEADLINE, "/readyz 200", || async {
        http_get(health, "/readyz")
            .await
            .starts_with("HTTP/1.1 200")
            .then_some(())
    })
    .await;
    // Its reconciles retry too: the Rollout gets its ReplicaSet and becomes Healthy.
    eventually(DEADLINE, "web Healthy despite 5% errors", || async {
        let rollout = cluster.rollouts().get("web").await.ok()?;
        let status = rollout.status?;
        (status.phase == "Healthy" && status.available_replicas == 2).then_some(())
    })
    .await;
    assert!(
        controller
            .entries("the Rollout CRD is not installed")
            .is_empty()
    );
}
