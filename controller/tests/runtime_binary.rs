//! The `rollouts-controller` binary against a small fake API server on loopback: the CRD
//! check, leader election, /readyz, the first writes for invalid and valid Rollouts, and the
//! lease released on SIGTERM. (Full scenarios run against kube-sim in canary_on_sim.rs.)

mod support;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rollouts_crds::rollout::{CanaryStep, Rollout};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};

use support::TempDir;

const DEADLINE: Duration = Duration::from_secs(60);
const LEASE_PATH: &str =
    "/apis/coordination.k8s.io/v1/namespaces/default/leases/rollouts-controller-lock";

type Body = BoxBody<Bytes, Infallible>;

/// What the fake API server holds and saw.
#[derive(Default)]
struct ApiState {
    /// When false, every request is answered 404, as when the Rollout CRD is not installed.
    crd_installed: bool,
    rollouts: Vec<Value>,
    lease: Option<Value>,
    /// `METHOD path` and the body of every write.
    writes: Vec<(String, Value)>,
}

struct FakeApi {
    addr: SocketAddr,
    state: Arc<Mutex<ApiState>>,
}

impl FakeApi {
    async fn start(state: ApiState) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds loopback");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(Mutex::new(state));
        let shared = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = shared.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(answer(request, &state).await) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, state }
    }

    fn writes(&self) -> Vec<(String, Value)> {
        self.state.lock().expect("state").writes.clone()
    }

    fn lease(&self) -> Option<Value> {
        self.state.lock().expect("state").lease.clone()
    }

    /// Another replica takes the lease, as if this one had stalled past its expiry.
    fn steal_lease(&self, holder: &str) {
        let mut state = self.state.lock().expect("state");
        let lease = state.lease.as_mut().expect("a lease to steal");
        lease["spec"]["holderIdentity"] = json!(holder);
        lease["spec"]["renewTime"] = json!(k8s_openapi::jiff::Timestamp::now().to_string());
        lease["spec"]["leaseDurationSeconds"] = json!(3600);
        lease["metadata"]["resourceVersion"] = json!("1000");
    }

    /// A kubeconfig for this server, written into a fresh temp dir.
    fn kubeconfig(&self, dir: &TempDir) -> PathBuf {
        let path = dir.0.join("kubeconfig.yaml");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\ncurrent-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
            self.addr
        );
        std::fs::write(&path, text).expect("writes kubeconfig");
        path
    }
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(value.to_string())).boxed());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().expect("header"));
    response
}

fn not_found(what: &str) -> Response<Body> {
    json_response(
        StatusCode::NOT_FOUND,
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": format!("{what} not found")}),
    )
}

fn list(kind: &str, api_version: &str, items: Vec<Value>) -> Response<Body> {
    json_response(
        StatusCode::OK,
        &json!({"apiVersion": api_version, "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items}),
    )
}

/// A watch that stays open and never reports a change.
fn quiet_watch() -> Response<Body> {
    let stream = futures::stream::pending::<Result<Frame<Bytes>, Infallible>>();
    let mut response = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().expect("header"));
    response
}

async fn answer(request: Request<Incoming>, state: &Mutex<ApiState>) -> Response<Body> {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let watching = request
        .uri()
        .query()
        .is_some_and(|q| q.contains("watch=true"));
    let body = request
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut state = state.lock().expect("state");
    if !state.crd_installed {
        return not_found("the server could not find the requested resource");
    }
    if method != Method::GET {
        state
            .writes
            .push((format!("{method} {path}"), body.clone()));
    }
    if watching {
        return quiet_watch();
    }
    match (method, path.as_str()) {
        (Method::GET, "/apis/argoproj.io/v1alpha1/rollouts") => list(
            "RolloutList",
            "argoproj.io/v1alpha1",
            state.rollouts.clone(),
        ),
        (Method::GET, "/apis/apps/v1/replicasets") => {
            list("PartialObjectMetadataList", "meta.k8s.io/v1", Vec::new())
        }
        (Method::GET, p) if p.starts_with("/apis/apps/v1/namespaces/") => {
            list("ReplicaSetList", "apps/v1", Vec::new())
        }
        (Method::GET, LEASE_PATH) => match &state.lease {
            Some(lease) => json_response(StatusCode::OK, lease),
            None => not_found("lease"),
        },
        (Method::POST, "/apis/coordination.k8s.io/v1/namespaces/default/leases") => {
            let mut lease = body;
            lease["metadata"]["resourceVersion"] = json!("1");
            state.lease = Some(lease.clone());
            json_response(StatusCode::CREATED, &lease)
        }
        (Method::PUT, LEASE_PATH) => {
            let current = state
                .lease
                .as_ref()
                .map(|l| l["metadata"]["resourceVersion"].clone());
            if current != Some(body["metadata"]["resourceVersion"].clone()) {
                return json_response(
                    StatusCode::CONFLICT,
                    &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409, "message": "conflict"}),
                );
            }
            let next: u64 = current
                .and_then(|v| v.as_str().and_then(|s| s.parse().ok()))
                .unwrap_or(0)
                + 1;
            let mut lease = body;
            lease["metadata"]["resourceVersion"] = json!(next.to_string());
            state.lease = Some(lease.clone());
            json_response(StatusCode::OK, &lease)
        }
        (Method::PATCH, p) if p.ends_with("/status") => {
            let rollout = state.rollouts.first().cloned().unwrap_or(Value::Null);
            json_response(StatusCode::OK, &rollout)
        }
        // The Rollout's metadata (its revision annotation): answered with the Rollout, the
        // patch's annotations merged in.
        (Method::PATCH, p) if p.starts_with("/apis/argoproj.io/v1alpha1/namespaces/") => {
            let mut rollout = state.rollouts.first().cloned().unwrap_or(Value::Null);
            for (key, value) in body["metadata"]["annotations"]
                .as_object()
                .into_iter()
                .flatten()
            {
                rollout["metadata"]["annotations"][key] = value.clone();
            }
            json_response(StatusCode::OK, &rollout)
        }
        (Method::POST, p) if p.starts_with("/apis/events.k8s.io/v1/namespaces/") => {
            json_response(StatusCode::CREATED, &body)
        }
        (Method::GET, p) if p.ends_with("/analysisruns") => {
            list("AnalysisRunList", "argoproj.io/v1alpha1", Vec::new())
        }
        (Method::GET, p) if p.ends_with("/experiments") => {
            list("ExperimentList", "argoproj.io/v1alpha1", Vec::new())
        }
        (Method::POST, p) if p.ends_with("/replicasets") => {
            json_response(StatusCode::CREATED, &body)
        }
        (_, p) => not_found(p),
    }
}

/// The binary, its JSON log lines as they arrive.
struct Controller {
    child: Child,
    logs: Arc<Mutex<VecDeque<Value>>>,
}

impl Controller {
    fn start(kubeconfig: &PathBuf, extra: &[&str]) -> Self {
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
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("starts the binary");
        let logs = Arc::new(Mutex::new(VecDeque::new()));
        let stdout = child.stdout.take().expect("stdout");
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
        Self { child, logs }
    }

    /// The first log entry whose message is `message`, waiting for it up to the deadline.
    async fn log(&self, message: &str) -> Value {
        eventually(&format!("log line {message:?}"), || {
            self.logs
                .lock()
                .expect("logs")
                .iter()
                .find(|entry| entry["message"] == message)
                .cloned()
        })
        .await
    }

    async fn health_addr(&self) -> SocketAddr {
        let entry = self.log("serving /healthz and /readyz").await;
        entry["addr"]
            .as_str()
            .and_then(|a| a.parse().ok())
            .expect("addr field")
    }

    fn terminate(&self) {
        let pid = self.child.id().expect("running");
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("runs kill");
        assert!(status.success());
    }

    async fn exit_code(&mut self) -> i32 {
        let status = tokio::time::timeout(DEADLINE, self.child.wait())
            .await
            .expect("the controller exits before the deadline")
            .expect("waits");
        status.code().expect("exited with a code")
    }
}

/// Polls `probe` until it gives a value or the deadline passes.
async fn eventually<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The status code of a GET.
async fn http_get(addr: SocketAddr, path: &str) -> u16 {
    support::http_get(addr, path)
        .await
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status line")
}

fn rollout_json(rollout: Rollout) -> Value {
    let mut value = serde_json::to_value(rollout).expect("encodes");
    value["metadata"]["namespace"] = json!("shop");
    value["metadata"]["uid"] = json!("0f7a7c1e-0000-4000-8000-000000000001");
    value["metadata"]["generation"] = json!(2);
    value["metadata"]["resourceVersion"] = json!("7");
    value
}

#[tokio::test]
async fn exits_with_the_fix_when_the_rollout_crd_is_missing() {
    let api = FakeApi::start(ApiState::default()).await;
    let dir = TempDir::new("rollouts-controller-no-crd");
    let mut controller = Controller::start(&api.kubeconfig(&dir), &[]);
    assert_eq!(controller.exit_code().await, 1);
    let mut stderr = String::new();
    controller
        .child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .await
        .expect("reads stderr");
    assert!(
        stderr.contains(
            "the Rollout CRD is not installed: kubectl apply --server-side -f crds/yaml/"
        ),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_missing_kubeconfig_is_named() {
    let dir = TempDir::new("rollouts-controller-no-kubeconfig");
    let mut controller = Controller::start(&dir.0.join("absent.yaml"), &[]);
    assert_eq!(controller.exit_code().await, 1);
    let mut stderr = String::new();
    controller
        .child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .await
        .expect("reads");
    assert!(stderr.contains("--kubeconfig"), "{stderr}");
}

#[tokio::test]
async fn leads_then_releases_the_lease_on_sigterm() {
    let api = FakeApi::start(ApiState {
        crd_installed: true,
        ..ApiState::default()
    })
    .await;
    let dir = TempDir::new("rollouts-controller-lease");
    let mut controller = Controller::start(&api.kubeconfig(&dir), &[]);
    let health = controller.health_addr().await;
    controller.log("became leader").await;
    assert_eq!(http_get(health, "/healthz").await, 200);
    assert_eq!(http_get(health, "/readyz").await, 200);
    let lease = api.lease().expect("lease created");
    let holder = lease["spec"]["holderIdentity"]
        .as_str()
        .expect("holder")
        .to_string();
    assert!(!holder.is_empty());
    assert_eq!(lease["spec"]["leaseDurationSeconds"], json!(15));

    controller.terminate();
    assert_eq!(controller.exit_code().await, 0);
    let released = api.lease().expect("lease kept");
    assert!(
        released["spec"].get("holderIdentity").is_none(),
        "{released}"
    );
}

#[tokio::test]
async fn a_follower_stands_by_ready_while_another_replica_holds_the_lease() {
    let renewed = k8s_openapi::jiff::Timestamp::now().to_string();
    let api = FakeApi::start(ApiState {
        crd_installed: true,
        lease: Some(json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "rollouts-controller-lock", "namespace": "default", "resourceVersion": "3"},
            "spec": {"holderIdentity": "other-replica", "leaseDurationSeconds": 3600, "renewTime": renewed}
        })),
        ..ApiState::default()
    })
    .await;
    let dir = TempDir::new("rollouts-controller-follower");
    let mut controller = Controller::start(&api.kubeconfig(&dir), &[]);
    let health = controller.health_addr().await;
    controller.log("waiting for the leader lease").await;
    assert_eq!(http_get(health, "/healthz").await, 200);
    assert_eq!(http_get(health, "/readyz").await, 200);
    assert_eq!(
        api.lease().expect("lease")["spec"]["holderIdentity"],
        json!("other-replica")
    );
    controller.terminate();
    assert_eq!(controller.exit_code().await, 0);
}

#[tokio::test]
async fn an_invalid_rollout_gets_the_invalid_spec_condition_and_a_warning_event() {
    let mut invalid = Rollout::test_canary("web", vec![CanaryStep::weight(20)]);
    invalid.spec.strategy = Default::default();
    let api = FakeApi::start(ApiState {
        crd_installed: true,
        rollouts: vec![rollout_json(invalid)],
        ..ApiState::default()
    })
    .await;
    let dir = TempDir::new("rollouts-controller-invalid");
    let mut controller = Controller::start(&api.kubeconfig(&dir), &["--leader-elect=false"]);
    let writes = eventually("status patch and event", || {
        let writes = api.writes();
        let patched = writes
            .iter()
            .any(|(w, _)| w.starts_with("PATCH ") && w.ends_with("/status"));
        let evented = writes
            .iter()
            .any(|(w, _)| w.starts_with("POST /apis/events.k8s.io/v1/namespaces/shop/events"));
        (patched && evented).then_some(writes)
    })
    .await;
    let (_, patch) = writes
        .iter()
        .find(|(w, _)| w == "PATCH /apis/argoproj.io/v1alpha1/namespaces/shop/rollouts/web/status")
        .expect("status patch of shop/web");
    let condition = &patch["status"]["conditions"][0];
    assert_eq!(condition["type"], json!("InvalidSpec"));
    assert_eq!(condition["status"], json!("True"));
    assert!(
        condition["message"]
            .as_str()
            .expect("message")
            .contains("spec.strategy"),
        "{patch}"
    );
    assert_eq!(patch["status"]["observedGeneration"], json!("2"));
    let (_, event) = writes
        .iter()
        .find(|(w, _)| w.starts_with("POST /apis/events.k8s.io/"))
        .expect("event");
    assert_eq!(event["type"], json!("Warning"));
    assert_eq!(event["reason"], json!("InvalidSpec"));
    assert!(
        event["note"]
            .as_str()
            .expect("note")
            .contains("spec.strategy"),
        "{event}"
    );
    controller.terminate();
    assert_eq!(controller.exit_code().await, 0);
}

#[tokio::test]
async fn a_valid_rollout_gets_its_first_replica_set_and_a_status() {
    let valid = Rollout::test_canary("web", vec![CanaryStep::weight(20)]);
    assert!(
        rollouts_crds::validation::validate(&valid).is_empty(),
        "fixture must be valid"
    );
    let api = FakeApi::start(ApiState {
        crd_installed: true,
        rollouts: vec![rollout_json(valid)],
        ..ApiState::default()
    })
    .await;
    let dir = TempDir::new("rollouts-controller-valid");
    let mut controller = Controller::start(&api.kubeconfig(&dir), &["--leader-elect=false"]);
    let (created, patch) = eventually("ReplicaSet creation and status patch", || {
        let writes = api.writes();
        let created = writes
            .iter()
            .find(|(w, _)| w == "POST /apis/apps/v1/namespaces/shop/replicasets")
            .map(|(_, body)| body.clone())?;
        let patch = writes
            .iter()
            .find(|(w, _)| {
                w == "PATCH /apis/argoproj.io/v1alpha1/namespaces/shop/rollouts/web/status"
            })
            .map(|(_, body)| body.clone())?;
        Some((created, patch))
    })
    .await;
    let annotated = api
        .writes()
        .into_iter()
        .find(|(w, _)| w == "PATCH /apis/argoproj.io/v1alpha1/namespaces/shop/rollouts/web");
    assert_eq!(
        annotated.map(
            |(_, body)| body["metadata"]["annotations"]["rollout.argoproj.io/revision"].clone()
        ),
        Some(json!("1")),
        "the Rollout carries its first revision"
    );
    let hash = patch["status"]["currentPodHash"]
        .as_str()
        .expect("currentPodHash")
        .to_string();
    assert_eq!(created["metadata"]["name"], json!(format!("web-{hash}")));
    assert_eq!(
        created["metadata"]["ownerReferences"][0]["uid"],
        json!("0f7a7c1e-0000-4000-8000-000000000001")
    );
    assert_eq!(
        created["spec"]["selector"]["matchLabels"]["rollouts-pod-template-hash"],
        json!(hash)
    );
    assert_eq!(patch["status"]["observedGeneration"], json!("2"));
    assert!(
        patch["status"]["conditions"].as_array().is_some(),
        "{patch}"
    );
    controller.terminate();
    assert_eq!(controller.exit_code().await, 0);
}

#[tokio::test]
async fn a_follower_takes_over_when_the_leader_dies() {
    let api = FakeApi::start(ApiState {
        crd_installed: true,
        ..ApiState::default()
    })
    .await;
    let dir = TempDir::new("rollouts-controller-takeover");
    let kubeconfig = api.kubeconfig(&dir);
    let mut leader = Controller::start(&kubeconfig, &["--lease-duration", "3s"]);
    leader.log("became leader").await;
    let first = api.lease().expect("lease")["spec"]["holderIdentity"].clone();

    let follower = Controller::start(&kubeconfig, &["--lease-duration", "3s"]);
    let follower_health = follower.health_addr().await;
    follower.log("waiting for the leader lease").await;
    assert_eq!(http_get(follower_health, "/readyz").await, 200);

    leader.child.kill().await.expect("kills the leader");
    follower.log("became leader").await;
    assert_eq!(http_get(follower_health, "/readyz").await, 200);
    let lease = api.lease().expect("lease");
    assert_ne!(lease["spec"]["holderIdentity"], first);
    assert_eq!(lease["spec"]["leaseTransitions"], json!(1));
}

#[tokio::test]
async fn losing_the_lease_stops_the_controller_with_an_error() {
    let api = FakeApi::start(ApiState {
        crd_installed: true,
        ..ApiState::default()
    })
    .await;
    let dir = TempDir::new("rollouts-controller-lost");
    let mut controller = Controller::start(&api.kubeconfig(&dir), &["--lease-duration", "3s"]);
    controller.log("became leader").await;
    api.steal_lease("intruder");
    assert_eq!(controller.exit_code().await, 1);
    let mut stderr = String::new();
    controller
        .child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .await
        .expect("reads");
    assert!(stderr.contains("lost the leader lease"), "{stderr}");
    assert_eq!(
        api.lease().expect("lease")["spec"]["holderIdentity"],
        json!("intruder")
    );
}
