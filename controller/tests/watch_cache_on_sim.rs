//! The watch caches of owned objects against kube-sim (in-process, CRDs from crds/yaml): a
//! reconcile right after our own ReplicaSet create, before the watch delivered it, waits for
//! the cache instead of creating the ReplicaSet again; and the real `rollouts-controller` binary,
//! with watch streams that end after every event and slow requests, creates one ReplicaSet per
//! revision, never answered 409, and finishes its canary.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::{reflector, watcher};
use kube::{Client, ResourceExt};
use rollouts_controller::context::{Context, Settings};
use rollouts_controller::health::{Diagnostics, Leadership};
use rollouts_controller::metrics::Metrics;
use rollouts_controller::owned_cache::OwnedCaches;
use rollouts_controller::reconcile::{CACHE_CATCH_UP, reconcile};
use rollouts_crds::rollout::{Rollout, RolloutStatus};
use rollouts_e2e::sim::{Faults, RequestRecord, SimOptions, start};
use serde_json::{Value, json};
use tokio::process::{Child, Command};

const DEADLINE: Duration = Duration::from_secs(60);
const NAMESPACE: &str = "default";
/// The prefix of the controller's `User-Agent`, which tells its requests from the test's.
const CONTROLLER_AGENT: &str = "rollouts-controller/";

#[tokio::test]
async fn a_reconcile_before_the_watch_shows_our_create_does_not_create_again() {
    let crds = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../crds/yaml");
    let sim = start(SimOptions {
        crd_dirs: vec![crds],
        ..SimOptions::default()
    })
    .expect("kube-sim starts on a loopback port");
    let config = kube::Config::new(sim.url().parse().expect("the simulator URL is a URI"));
    let client = Client::try_from(config).expect("a client for a plain-HTTP server");
    let rollouts: Api<Rollout> = Api::namespaced(client.clone(), NAMESPACE);
    let replica_sets: Api<ReplicaSet> = Api::namespaced(client.clone(), NAMESPACE);
    let steps = json!([{"setWeight": 50}, {"pause": {}}]);
    let created = rollouts
        .create(&PostParams::default(), &rollout("web", 2, "app:v1", steps))
        .await
        .expect("creates the Rollout");

    // Caches that listed an empty cluster and are fed by hand instead of by a watch.
    let caches = Arc::new(OwnedCaches::new());
    caches.replica_sets.apply(&watcher::Event::Init);
    caches.replica_sets.apply(&watcher::Event::InitDone);
    caches.analysis_runs.apply(&watcher::Event::Init);
    caches.analysis_runs.apply(&watcher::Event::InitDone);
    let (rollout_store, _writer) = reflector::store::<Rollout>();
    let ctx = Arc::new(Context::new(
        client.clone(),
        Arc::new(Metrics::new(rollout_store)),
        Arc::new(Diagnostics::new(Leadership::Disabled)),
        Settings::default(),
        caches.clone(),
    ));

    reconcile(Arc::new(created), ctx.clone())
        .await
        .expect("the first reconcile creates the ReplicaSet");
    let listed = replica_sets
        .list(&ListParams::default())
        .await
        .expect("lists ReplicaSets")
        .items;
    assert_eq!(listed.len(), 1, "one ReplicaSet for the first revision");

    // The Rollout as the API has it now, the ReplicaSet not yet in the cache.
    let fresh = rollouts.get("web").await.expect("reads the Rollout");
    let action = reconcile(Arc::new(fresh.clone()), ctx.clone())
        .await
        .expect("a reconcile on a lagging cache succeeds");
    assert_eq!(action, Action::requeue(CACHE_CATCH_UP));
    let creates: Vec<RequestRecord> = sim
        .requests()
        .into_iter()
        .filter(|r| r.resource == "replicasets" && r.verb == "create")
        .collect();
    assert_eq!(creates.len(), 1, "created again: {creates:?}");

    // Once the watch delivers it, planning goes on from it.
    for rs in listed {
        caches.replica_sets.apply(&watcher::Event::Apply(rs));
    }
    let action = reconcile(Arc::new(fresh), ctx)
        .await
        .expect("a reconcile on a current cache succeeds");
    assert_ne!(action, Action::requeue(CACHE_CATCH_UP));
    let count = replica_sets
        .list(&ListParams::default())
        .await
        .expect("lists ReplicaSets")
        .items
        .len();
    assert_eq!(count, 1);
}

#[tokio::test]
async fn a_canary_with_lagging_watches_creates_each_replica_set_once() {
    let crds = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../crds/yaml");
    let sim = start(SimOptions {
        crd_dirs: vec![crds],
        pod_ready_after: Duration::from_millis(200),
        faults: Faults {
            // Every watch is re-established after each event, and every request (the new
            // watch included) waits first: the caches trail the writes by that much.
            watch_cut_after: Some(1),
            latency: Duration::from_millis(100),
            ..Faults::default()
        },
        ..SimOptions::default()
    })
    .expect("kube-sim starts on a loopback port");
    let dir = TempDir::new("lagging");
    let kubeconfig = dir.0.join("kubeconfig.yaml");
    sim.write_kubeconfig(&kubeconfig)
        .expect("writes the kubeconfig");
    let config = kube::Config::new(sim.url().parse().expect("the simulator URL is a URI"));
    let client = Client::try_from(config).expect("a client for a plain-HTTP server");
    let _controller = ControllerProcess::start(&kubeconfig);
    let rollouts: Api<Rollout> = Api::namespaced(client.clone(), NAMESPACE);

    let steps = json!([{"setWeight": 50}, {"pause": {"duration": "1s"}}]);
    rollouts
        .create(
            &PostParams::default(),
            &rollout("cache", 2, "app:v1", steps),
        )
        .await
        .expect("creates the Rollout");
    let v1 = healthy(&rollouts, "cache", 2).await;
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "image": "app:v2"}]}}}});
    rollouts
        .patch("cache", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("changes the image");
    let v2 = eventually("v2 Healthy", || async {
        let status = status_of(&rollouts, "cache").await?;
        (status.current_pod_hash != v1 && is_healthy(&status, 2)).then_some(status.current_pod_hash)
    })
    .await;

    let replica_sets: Api<ReplicaSet> = Api::namespaced(client.clone(), NAMESPACE);
    let names: Vec<String> = replica_sets
        .list(&ListParams::default())
        .await
        .expect("lists ReplicaSets")
        .items
        .iter()
        .map(|rs| rs.name_any())
        .collect();
    assert_eq!(names.len(), 2, "one ReplicaSet per revision: {names:?}");
    let requests = sim.requests();
    let writes: Vec<&RequestRecord> = requests
        .iter()
        .filter(|r| r.user_agent.starts_with(CONTROLLER_AGENT))
        .filter(|r| r.resource == "replicasets")
        .filter(|r| matches!(r.verb.as_str(), "create" | "update" | "patch" | "delete"))
        .collect();
    let creates: Vec<&str> = writes
        .iter()
        .filter(|r| r.verb == "create")
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(
        creates.len(),
        2,
        "a ReplicaSet created twice (v1 {v1}, v2 {v2}): {creates:?}"
    );
    let conflicts: Vec<&&RequestRecord> = writes.iter().filter(|r| r.code == 409).collect();
    assert!(
        conflicts.is_empty(),
        "writes planned from a stale cache: {conflicts:?}"
    );
}

/// A canary Rollout of `replicas` pods of `image` with the given steps.
fn rollout(name: &str, replicas: i32, image: &str, steps: Value) -> Rollout {
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

async fn status_of(api: &Api<Rollout>, name: &str) -> Option<RolloutStatus> {
    api.get(name).await.ok()?.status
}

/// Healthy on its current revision with every pod available.
fn is_healthy(status: &RolloutStatus, replicas: i32) -> bool {
    status.phase == "Healthy"
        && !status.current_pod_hash.is_empty()
        && status.stable_rs == status.current_pod_hash
        && status.available_replicas == replicas
        && status.replicas == replicas
}

/// Waits until the Rollout is Healthy; returns its revision's hash.
async fn healthy(api: &Api<Rollout>, name: &str, replicas: i32) -> String {
    eventually(&format!("{name} Healthy"), || async {
        let status = status_of(api, name).await?;
        is_healthy(&status, replicas).then_some(status.current_pod_hash)
    })
    .await
}

/// Polls `check` until it gives a value, failing after [`DEADLINE`].
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {DEADLINE:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The controller binary; killed when dropped.
struct ControllerProcess {
    _child: Child,
}

impl ControllerProcess {
    fn start(kubeconfig: &PathBuf) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_rollouts-controller"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--leader-elect=false", "--log-level", "info"])
            .args([
                "--metrics-addr",
                "127.0.0.1:0",
                "--health-addr",
                "127.0.0.1:0",
            ])
            .env_remove("RUST_LOG")
            .env_remove("ROLLOUTS_NAMESPACE")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("starts the controller");
        Self { _child: child }
    }
}

/// A directory removed when the test ends.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "rollouts-watch-cache-on-sim-{name}-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&path).expect("creates temp dir");
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
