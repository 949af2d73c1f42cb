//! The watch caches of owned objects against kube-sim (in-process, CRDs from crds/yaml): a
//! reconcile right after our own ReplicaSet create, before the watch delivered it, waits for
//! the cache instead of creating the ReplicaSet again; and the real `rollouts-controller` binary,
//! with watch streams that end after every event and slow requests, creates one ReplicaSet per
//! revision, never answered 409, and finishes its canary.

mod support;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::{reflector, watcher};
use rollouts_controller::context::{Context, Settings};
use rollouts_controller::health::{Diagnostics, Leadership};
use rollouts_controller::metrics::Metrics;
use rollouts_controller::owned_cache::OwnedCaches;
use rollouts_controller::reconcile::{CACHE_CATCH_UP, reconcile};
use rollouts_crds::rollout::{Rollout, RolloutStatus};
use rollouts_e2e::sim::{Faults, RequestRecord, SimOptions};
use serde_json::json;
use support::{Controller, ControllerLog, NAMESPACE, Sim, canary_rollout as rollout, eventually};

const DEADLINE: Duration = Duration::from_secs(60);
/// The prefix of the controller's `User-Agent`, which tells its requests from the test's.
const CONTROLLER_AGENT: &str = "rollouts-controller/";
/// The prefix of this file's temp dirs.
const TEMP_PREFIX: &str = "rollouts-watch-cache-on-sim";

#[tokio::test]
async fn a_reconcile_before_the_watch_shows_our_create_does_not_create_again() {
    let cluster = Sim::start_with(
        TEMP_PREFIX,
        "reconcile-before-watch",
        SimOptions {
            crd_dirs: vec![support::workspace_root().join("crds/yaml")],
            ..SimOptions::default()
        },
    );
    let (sim, client) = (&cluster.sim, &cluster.client);
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
    caches.experiments.apply(&watcher::Event::Init);
    caches.experiments.apply(&watcher::Event::InitDone);
    let (rollout_store, _writer) = reflector::store::<rollouts_controller::packed::PackedRollout>();
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
    let cluster = Sim::start_with(
        TEMP_PREFIX,
        "lagging",
        SimOptions {
            crd_dirs: vec![support::workspace_root().join("crds/yaml")],
            pod_ready_after: Duration::from_millis(200),
            faults: Faults {
                // Every watch is re-established after each event, and every request (the new
                // watch included) waits first: the caches trail the writes by that much.
                watch_cut_after: Some(1),
                latency: Duration::from_millis(100),
                ..Faults::default()
            },
            ..SimOptions::default()
        },
    );
    let (sim, client) = (&cluster.sim, &cluster.client);
    let _controller =
        Controller::start_with(&cluster.kubeconfig, DEADLINE, ControllerLog::Discarded);
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
    cluster.set_image("cache", "app:v2").await;
    let v2 = eventually(DEADLINE, "v2 Healthy", || async {
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
    eventually(DEADLINE, &format!("{name} Healthy"), || async {
        let status = status_of(api, name).await?;
        is_healthy(&status, replicas).then_some(status.current_pod_hash)
    })
    .await
}
