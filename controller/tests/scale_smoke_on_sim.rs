//! Smoke run of the scale benchmark's realistic profile (`rollouts_e2e::scale_profile`) on
//! kube-sim: 100 Rollouts of 3 to 10 replicas with Services, routers and analysis, pods Ready
//! after 2 to 10 s (some failing their first start). It fails if the controller writes anything
//! at rest or after a restart, or if any Rollout ever owns more ReplicaSets than it has
//! revisions. The figures it prints are for reading; `cargo bench --bench scale` measures.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::ReplicaSet;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use rollouts_crds::rollout::Rollout;
use rollouts_e2e::fake_prometheus::FakePrometheus;
use rollouts_e2e::scale_profile;
use rollouts_e2e::sim::{RequestRecord, SimOptions};
use support::{Controller, ControllerLog, Sim, eventually, eventually_with_log, workspace_root};

const ROLLOUTS: usize = 100;
/// Bounds each wait; the whole run takes well under a minute on an idle 2-core machine.
const DEADLINE: Duration = Duration::from_secs(150);
/// How long the controller is watched at rest, and after its restart.
const WINDOW: Duration = Duration::from_secs(5);
const RELEASED: usize = 5;
const CONTROLLER_AGENT: &str = "rollouts-controller/";

#[tokio::test]
async fn a_realistic_cluster_rests_without_writes_and_never_gets_a_duplicate_replica_set() {
    let cluster = Sim::start_with(
        "scale-smoke",
        "realistic",
        SimOptions {
            crd_dirs: vec![
                workspace_root().join("crds/yaml"),
                workspace_root().join("e2e/crds"),
            ],
            pod_readiness: Some(scale_profile::pod_readiness(7)),
            event_log_capacity: 100_000,
            metrics_listen: None,
            ..SimOptions::default()
        },
    );
    let prometheus = FakePrometheus::start().await;
    prometheus.answer_every_query("0.99");
    let create = |namespace: &str, object| {
        cluster
            .sim
            .create(namespace, object)
            .unwrap_or_else(|e| panic!("creates an object in the store: {e:?}"))
    };
    create("", scale_profile::analysis_template(&prometheus.address));
    for namespace in scale_profile::namespaces(ROLLOUTS) {
        create("", namespace);
    }
    for i in 0..ROLLOUTS {
        for (namespace, object) in scale_profile::objects(i, "app:v1") {
            create(&namespace, object);
        }
    }

    let started = Instant::now();
    let controller =
        Controller::start_with(&cluster.kubeconfig, DEADLINE, ControllerLog::Discarded);
    let rollouts: Api<Rollout> = Api::all(cluster.client.clone());
    let mut last_report = Instant::now();
    // Listing 100 full Rollouts is work for the (unoptimised) simulator: twice a second is enough.
    eventually_with_log(
        DEADLINE,
        Duration::from_millis(500),
        "all 100 Rollouts Healthy",
        String::new,
        || {
            let report = last_report.elapsed() >= Duration::from_secs(10);
            if report {
                last_report = Instant::now();
            }
            let (rollouts, cluster) = (&rollouts, &cluster);
            async move {
                let list = rollouts.list(&ListParams::default()).await.ok()?;
                let healthy = list.items.iter().filter(|r| healthy(r)).count();
                if report {
                    let requests = cluster.sim.requests();
                    eprintln!(
                        "scale smoke: {healthy}/{ROLLOUTS} Healthy after {:.0} s; controller \
                     requests {}, of which writes {}",
                        started.elapsed().as_secs_f64(),
                        requests
                            .iter()
                            .filter(|r| r.user_agent.starts_with(CONTROLLER_AGENT))
                            .count(),
                        controller_writes(&requests).count()
                    );
                }
                (healthy == ROLLOUTS).then_some(())
            }
        },
    )
    .await;
    let healthy_after = started.elapsed();
    let cold_writes = controller_writes(&cluster.sim.requests()).count();
    quiet(&cluster, Duration::from_secs(3)).await;
    let owned = owned_replica_sets(&cluster).await;
    assert_eq!(owned.len(), ROLLOUTS, "every Rollout owns ReplicaSets");
    assert!(
        owned.values().all(|hashes| hashes.len() == 1),
        "a Rollout on its first revision owns one ReplicaSet: {owned:?}"
    );

    cluster.sim.clear_requests();
    tokio::time::sleep(WINDOW).await;
    let at_rest: Vec<RequestRecord> = controller_writes(&cluster.sim.requests())
        .cloned()
        .collect();
    assert!(
        at_rest.is_empty(),
        "the controller wrote at rest: {at_rest:?}"
    );

    controller.kill().await;
    cluster.sim.clear_requests();
    let restarted = Instant::now();
    let controller =
        Controller::start_with(&cluster.kubeconfig, DEADLINE, ControllerLog::Discarded);
    eventually(
        DEADLINE,
        "the restarted controller's Rollout watch",
        || async {
            cluster
                .sim
                .requests()
                .iter()
                .any(|r| {
                    r.user_agent.starts_with(CONTROLLER_AGENT)
                        && r.resource == "rollouts"
                        && r.verb == "watch"
                })
                .then_some(())
        },
    )
    .await;
    let watching_after = restarted.elapsed();
    tokio::time::sleep(WINDOW).await;
    let after_restart: Vec<RequestRecord> = controller_writes(&cluster.sim.requests())
        .cloned()
        .collect();
    assert!(
        after_restart.is_empty(),
        "the restarted controller wrote to Rollouts at rest: {after_restart:?}"
    );

    // A release in each of the first namespaces: one new ReplicaSet each, never two.
    let released: Vec<usize> = (0..RELEASED)
        .map(|k| k * scale_profile::PER_NAMESPACE)
        .collect();
    let sent = Instant::now();
    for &i in &released {
        let api: Api<Rollout> =
            Api::namespaced(cluster.client.clone(), &scale_profile::namespace(i));
        api.patch(
            &scale_profile::name(i),
            &PatchParams::default(),
            &Patch::Merge(scale_profile::release("app:v2")),
        )
        .await
        .unwrap_or_else(|e| panic!("releases app:v2 to Rollout {i}: {e}"));
    }
    eventually(DEADLINE, "a canary ReplicaSet for each release", || async {
        let owned = owned_replica_sets(&cluster).await;
        let canaries = owned.values().filter(|hashes| hashes.len() == 2).count();
        (canaries == RELEASED).then_some(())
    })
    .await;
    let canaries_after = sent.elapsed();
    quiet(&cluster, Duration::from_secs(2)).await;
    let owned = owned_replica_sets(&cluster).await;
    let counts: BTreeMap<usize, usize> = owned.values().fold(BTreeMap::new(), |mut by, hashes| {
        *by.entry(hashes.len()).or_default() += 1;
        by
    });
    assert_eq!(
        counts,
        BTreeMap::from([(1, ROLLOUTS - RELEASED), (2, RELEASED)]),
        "each released Rollout owns two ReplicaSets, the others one: {owned:?}"
    );
    let creates: Vec<RequestRecord> = controller_writes(&cluster.sim.requests())
        .filter(|r| r.resource == "replicasets" && r.verb == "create")
        .cloned()
        .collect();
    assert_eq!(
        creates.len(),
        RELEASED,
        "one ReplicaSet create per release, none refused as existing: {creates:?}"
    );
    drop(controller);
    println!(
        "scale smoke ({ROLLOUTS} realistic Rollouts): all Healthy {:.1} s after the start with \
         {cold_writes} controller writes; 0 writes in {} s at rest and in {} s after a restart \
         (watching again after {:.2} s); {RELEASED} releases had their canary ReplicaSet after \
         {:.2} s",
        healthy_after.as_secs_f64(),
        WINDOW.as_secs(),
        WINDOW.as_secs(),
        watching_after.as_secs_f64(),
        canaries_after.as_secs_f64()
    );
}

/// Healthy on its current revision with every pod of the spec available.
fn healthy(rollout: &Rollout) -> bool {
    rollout.status.as_ref().is_some_and(|status| {
        status.phase == "Healthy"
            && !status.current_pod_hash.is_empty()
            && status.stable_rs == status.current_pod_hash
            && status.available_replicas == rollout.spec.replicas.unwrap_or(1)
    })
}

/// The controller's writes, leases aside.
fn controller_writes(requests: &[RequestRecord]) -> impl Iterator<Item = &RequestRecord> {
    requests.iter().filter(|r| {
        r.user_agent.starts_with(CONTROLLER_AGENT)
            && matches!(
                r.verb.as_str(),
                "create" | "update" | "patch" | "delete" | "deletecollection"
            )
            && r.resource != "leases"
    })
}

/// Waits until the controller has made no write for `quiet`.
async fn quiet(cluster: &Sim, quiet: Duration) {
    let mut seen = cluster.sim.request_count();
    let mut since = Instant::now();
    eventually(DEADLINE, "the controller to stop writing", || {
        let new = cluster.sim.requests_since(seen);
        seen += new.len();
        if controller_writes(&new).next().is_some() {
            since = Instant::now();
        }
        std::future::ready((since.elapsed() >= quiet).then_some(()))
    })
    .await;
}

/// The pod-template hashes of the ReplicaSets each Rollout owns, by Rollout uid.
async fn owned_replica_sets(cluster: &Sim) -> BTreeMap<String, Vec<String>> {
    let replica_sets: Api<ReplicaSet> = Api::all(cluster.client.clone());
    let list = replica_sets
        .list(&ListParams::default())
        .await
        .expect("lists ReplicaSets");
    let mut owned: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for rs in &list.items {
        let Some(owner) = rs
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true) && o.kind == Rollout::kind(&()))
        else {
            continue;
        };
        let hash = rs
            .labels()
            .get("rollouts-pod-template-hash")
            .cloned()
            .unwrap_or_else(|| rs.name_any());
        owned.entry(owner.uid.clone()).or_default().push(hash);
    }
    owned
}
