//! The real `rollouts-controller` binary against kube-sim (in-process, CRDs from crds/yaml) for
//! the features Argo users expect beyond steps: `spec.restartAt` restarts every pod once, by
//! eviction and never more than maxUnavailable at a time; `spec.workloadRef` rolls out a
//! Deployment's template and scales that Deployment down per `scaleDown`; `antiAffinity` puts a
//! pod anti-affinity term against the stable revision into the canary's ReplicaSet. Each test
//! has its own simulator and controller, so they run in parallel.

mod support;

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Deref;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use rollouts_crds::rollout::{Rollout, RolloutStatus};
use serde_json::{Value, json};
use support::{Controller, NAMESPACE, Sim, eventually};

const DEADLINE: Duration = Duration::from_secs(30);
/// For what the controller may only see on its 30 s re-check (a Deployment's new template; a
/// restart whose ReplicaSets stopped changing).
const RECHECK_DEADLINE: Duration = Duration::from_secs(75);
const CONTROLLER_AGENT: &str = "rollouts-controller/";

/// The shared simulator with the controller binary running against it.
struct Cluster {
    shared: Sim,
    _controller: Controller,
}

impl Deref for Cluster {
    type Target = Sim;

    fn deref(&self) -> &Sim {
        &self.shared
    }
}

impl Cluster {
    fn start(name: &str) -> Self {
        let shared = Sim::start_named("rollouts-restart-workload-on-sim", name);
        let controller = Controller::start(&shared.kubeconfig, DEADLINE);
        Self {
            shared,
            _controller: controller,
        }
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    async fn create<K>(&self, object: Value)
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + std::fmt::Debug
            + serde::Serialize
            + serde::de::DeserializeOwned,
        <K as kube::Resource>::DynamicType: Default,
    {
        let object: K = serde_json::from_value(object).expect("a valid object");
        self.api::<K>()
            .create(&PostParams::default(), &object)
            .await
            .expect("creates the object");
    }

    /// Waits until the Rollout is Healthy with `replicas` pods available; returns its status.
    async fn healthy(&self, name: &str, replicas: i32) -> RolloutStatus {
        self.wait_healthy(DEADLINE, name, replicas).await
    }

    /// The pods of Rollout `app` that are not on their way out: name -> (created, ready).
    async fn pods(&self, app: &str) -> BTreeMap<String, (String, bool)> {
        let params = ListParams::default().labels(&format!("app={app}"));
        let pods = self.api::<Pod>().list(&params).await.expect("lists pods");
        pods.items
            .iter()
            .filter(|pod| pod.metadata.deletion_timestamp.is_none())
            .filter(|pod| {
                pod.owner_references()
                    .iter()
                    .any(|owner| owner.name.starts_with(&format!("{app}-")))
            })
            .map(|pod| {
                let created = pod
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|time| time.0.to_string())
                    .unwrap_or_default();
                let ready = pod
                    .status
                    .as_ref()
                    .and_then(|status| status.conditions.as_ref())
                    .is_some_and(|conditions| {
                        conditions
                            .iter()
                            .any(|c| c.type_ == "Ready" && c.status == "True")
                    });
                (pod.name_any(), (created, ready))
            })
            .collect()
    }

    async fn replica_set(&self, name: &str) -> ReplicaSet {
        self.api::<ReplicaSet>()
            .get(name)
            .await
            .expect("reads the ReplicaSet")
    }

    async fn deployment_replicas(&self, name: &str) -> i32 {
        let deployment = self
            .api::<Deployment>()
            .get(name)
            .await
            .expect("reads the Deployment");
        deployment.spec.and_then(|spec| spec.replicas).unwrap_or(1)
    }

    /// Waits for a canary other than `previous` paused at its pause step; returns its hash.
    async fn paused_canary(&self, name: &str, previous: &str) -> String {
        eventually(
            DEADLINE,
            &format!("{name} paused on a new canary"),
            || async {
                let status = self.status(name).await;
                (status.current_pod_hash != previous && !status.pause_conditions.is_empty())
                    .then_some(status.current_pod_hash)
            },
        )
        .await
    }

    /// Names of the pods the controller evicted (each eviction request it made).
    fn evicted(&self) -> Vec<String> {
        self.sim
            .requests()
            .into_iter()
            .filter(|r| r.user_agent.starts_with(CONTROLLER_AGENT))
            .filter(|r| r.resource == "pods" && r.subresource == "eviction")
            .map(|r| r.name)
            .collect()
    }
}

/// A canary Rollout of `replicas` pods labelled `app: <name>`.
fn canary(name: &str, replicas: i32, image: &str, canary: Value) -> Value {
    json!({
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
            "strategy": {"canary": canary}
        }
    })
}

/// A Deployment of `replicas` pods labelled `app: <name>`.
fn deployment(name: &str, replicas: i32, image: &str) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": name, "image": image}]}
            }
        }
    })
}

/// A Rollout taking its template from Deployment `name`.
fn referencing(name: &str, replicas: i32, scale_down: &str) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "workloadRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name, "scaleDown": scale_down},
            "strategy": {"canary": {"steps": []}}
        }
    })
}

/// The image of a ReplicaSet's first container.
fn image_of(rs: &ReplicaSet) -> String {
    rs.spec
        .as_ref()
        .and_then(|spec| spec.template.as_ref())
        .and_then(|template| template.spec.as_ref())
        .and_then(|spec| spec.containers.first())
        .and_then(|container| container.image.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn restart_at_restarts_every_pod_once_within_max_unavailable() {
    let cluster = Cluster::start("restart");
    cluster
        .create::<Rollout>(canary(
            "web",
            3,
            "app:v1",
            json!({"maxSurge": 1, "maxUnavailable": 1, "steps": []}),
        ))
        .await;
    cluster.healthy("web", 3).await;
    let before = cluster.pods("web").await;
    assert_eq!(before.len(), 3);

    // The next whole second: every running pod was created before it.
    let next_second = Timestamp::now()
        .checked_add(SignedDuration::from_secs(1))
        .expect("a time")
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    cluster
        .api::<Rollout>()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"restartAt": next_second}})),
        )
        .await
        .expect("sets restartAt");

    let fewest_ready = Cell::new(3);
    let (cluster_ref, before_ref, wanted) = (&cluster, &before, &next_second);
    let after = eventually(RECHECK_DEADLINE, "every pod restarted", || {
        let (cluster, before, next_second, fewest) =
            (cluster_ref, before_ref, wanted, &fewest_ready);
        async move {
            let pods = cluster.pods("web").await;
            let ready = pods.values().filter(|(_, ready)| *ready).count();
            fewest.set(fewest.get().min(ready));
            let status = cluster.status("web").await;
            let restarted = status
                .restarted_at
                .as_ref()
                .is_some_and(|at| at.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string() == *next_second);
            let replaced = pods.len() == 3 && pods.keys().all(|name| !before.contains_key(name));
            (restarted && replaced && ready == 3 && status.phase == "Healthy").then_some(pods)
        }
    })
    .await;
    // maxUnavailable 1 of 3: at least two pods were ready whenever we looked.
    let fewest_ready = fewest_ready.get();
    assert!(
        fewest_ready >= 2,
        "only {fewest_ready} pods were ready at one point"
    );
    assert!(after.keys().all(|name| !before.contains_key(name)));
    let mut evicted = cluster.evicted();
    evicted.sort();
    let expected: Vec<String> = before.keys().cloned().collect();
    assert_eq!(evicted, expected, "each old pod is evicted exactly once");
}

#[tokio::test]
async fn workload_ref_rolls_out_the_deployments_template_and_scales_it_down_progressively() {
    let cluster = Cluster::start("workload-ref");
    cluster
        .create::<Deployment>(deployment("catalog", 3, "catalog:v1"))
        .await;
    cluster
        .create::<Rollout>(referencing("catalog", 3, "progressively"))
        .await;
    let status = cluster.healthy("catalog", 3).await;
    let rs = cluster
        .replica_set(&format!("catalog-{}", status.current_pod_hash))
        .await;
    assert_eq!(image_of(&rs), "catalog:v1");
    eventually(DEADLINE, "the Deployment scaled to 0", || async {
        (cluster.deployment_replicas("catalog").await == 0).then_some(())
    })
    .await;

    // A new template in the Deployment is a new revision of the Rollout.
    cluster
        .api::<Deployment>()
        .patch(
            "catalog",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"spec": {"containers": [{"name": "catalog", "image": "catalog:v2"}]}}}})),
        )
        .await
        .expect("changes the Deployment's image");
    let v1 = status.current_pod_hash;
    let v2 = eventually(
        RECHECK_DEADLINE,
        "the Deployment's v2 rolled out",
        || async {
            let status = cluster.status("catalog").await;
            let done = status.current_pod_hash != v1
                && status.stable_rs == status.current_pod_hash
                && status.phase == "Healthy"
                && status.available_replicas == 3;
            done.then_some(status.current_pod_hash)
        },
    )
    .await;
    let rs = cluster.replica_set(&format!("catalog-{v2}")).await;
    assert_eq!(image_of(&rs), "catalog:v2");
    assert_eq!(cluster.deployment_replicas("catalog").await, 0);
}

#[tokio::test]
async fn workload_ref_onsuccess_scales_down_once_healthy_and_never_leaves_it_alone() {
    let cluster = Cluster::start("workload-ref-modes");
    for name in ["orders", "billing"] {
        cluster
            .create::<Deployment>(deployment(name, 2, &format!("{name}:v1")))
            .await;
    }
    cluster
        .create::<Rollout>(referencing("orders", 2, "onsuccess"))
        .await;
    cluster
        .create::<Rollout>(referencing("billing", 2, "never"))
        .await;
    cluster.healthy("orders", 2).await;
    cluster.healthy("billing", 2).await;
    eventually(DEADLINE, "orders' Deployment scaled to 0", || async {
        (cluster.deployment_replicas("orders").await == 0).then_some(())
    })
    .await;
    assert_eq!(cluster.deployment_replicas("billing").await, 2);
}

#[tokio::test]
async fn a_missing_deployment_is_an_invalid_spec_and_nothing_is_created() {
    let cluster = Cluster::start("workload-ref-missing");
    cluster
        .create::<Rollout>(referencing("ghost", 2, "onsuccess"))
        .await;
    let status = eventually(DEADLINE, "the InvalidSpec condition", || async {
        let status = cluster.status("ghost").await;
        status.condition("InvalidSpec").is_some().then_some(status)
    })
    .await;
    let message = &status
        .condition("InvalidSpec")
        .expect("InvalidSpec")
        .message;
    assert!(
        message.contains("Deployment \"ghost\" not found"),
        "{message}"
    );
    assert_eq!(status.phase, "Degraded");
    let replica_sets = cluster
        .api::<ReplicaSet>()
        .list(&ListParams::default())
        .await
        .expect("lists ReplicaSets");
    assert!(replica_sets.items.is_empty());
}

#[tokio::test]
async fn anti_affinity_against_the_stable_revision_is_in_the_canary_replica_set() {
    let cluster = Cluster::start("anti-affinity");
    let strategy = json!({
        "antiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": {"weight": 50}},
        "steps": [{"setWeight": 50}, {"pause": {}}]
    });
    cluster
        .create::<Rollout>(canary("shop", 2, "shop:v1", strategy))
        .await;
    let v1 = cluster.healthy("shop", 2).await.current_pod_hash;
    let stable = cluster.replica_set(&format!("shop-{v1}")).await;
    let affinity = |rs: &ReplicaSet| {
        serde_json::to_value(rs)
            .expect("a ReplicaSet is JSON")
            .pointer("/spec/template/spec/affinity")
            .cloned()
    };
    assert_eq!(
        affinity(&stable),
        None,
        "the first revision has no stable to avoid"
    );

    cluster.set_image("shop", "shop:v2").await;
    let v2 = cluster.paused_canary("shop", &v1).await;
    let canary_rs = cluster.replica_set(&format!("shop-{v2}")).await;
    assert_eq!(
        affinity(&canary_rs),
        Some(
            json!({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 50,
                "podAffinityTerm": {
                    "labelSelector": {"matchExpressions": [{
                        "key": "rollouts-pod-template-hash", "operator": "In", "values": [v1]
                    }]},
                    "namespaces": [NAMESPACE],
                    "topologyKey": "kubernetes.io/hostname"
                }
            }]}})
        )
    );
    // The canary's pods carry it too.
    let pods = cluster
        .api::<Pod>()
        .list(&ListParams::default().labels(&format!("rollouts-pod-template-hash={v2}")))
        .await
        .expect("lists the canary's pods");
    assert!(!pods.items.is_empty());
    let hashes: BTreeSet<Option<String>> = pods
        .items
        .iter()
        .map(|pod| {
            serde_json::to_value(pod)
                .expect("a Pod is JSON")
                .pointer("/spec/affinity/podAntiAffinity/preferredDuringSchedulingIgnoredDuringExecution/0/podAffinityTerm/labelSelector/matchExpressions/0/values/0")
                .and_then(|hash| hash.as_str().map(str::to_string))
        })
        .collect();
    assert_eq!(hashes, BTreeSet::from([Some(v1)]));
}

/// The revision the injected anti-affinity term of ReplicaSet `name` keeps its pods away from.
async fn avoided(cluster: &Cluster, name: &str) -> Option<String> {
    let rs = cluster.replica_set(name).await;
    serde_json::to_value(&rs)
        .expect("a ReplicaSet is JSON")
        .pointer("/spec/template/spec/affinity/podAntiAffinity/preferredDuringSchedulingIgnoredDuringExecution/0/podAffinityTerm/labelSelector/matchExpressions/0/values/0")
        .and_then(|hash| hash.as_str().map(str::to_string))
}

#[tokio::test]
async fn a_reused_canary_replica_set_avoids_the_current_stable() {
    let cluster = Cluster::start("anti-affinity-refresh");
    let strategy = json!({
        "antiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": {"weight": 10}},
        "steps": [{"setWeight": 50}, {"pause": {}}]
    });
    cluster
        .create::<Rollout>(canary("cart", 2, "cart:v1", strategy))
        .await;
    let v1 = cluster.healthy("cart", 2).await.current_pod_hash;
    cluster.set_image("cart", "cart:v2").await;
    let v2 = cluster.paused_canary("cart", &v1).await;
    let name = format!("cart-{v2}");
    assert_eq!(avoided(&cluster, &name).await, Some(v1.clone()));
    let uid = cluster.replica_set(&name).await.uid();

    // v3 replaces v2 and is promoted fully: v3 is the stable now.
    cluster.set_image("cart", "cart:v3").await;
    let v3 = cluster.paused_canary("cart", &v2).await;
    cluster
        .api::<Rollout>()
        .patch_status(
            "cart",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"promoteFull": true}})),
        )
        .await
        .expect("promotes fully");
    let stable = cluster.healthy("cart", 2).await.stable_rs;
    assert_eq!(stable, v3);

    // Back to v2: its ReplicaSet is reused and now keeps away from v3's pods.
    cluster.set_image("cart", "cart:v2").await;
    eventually(DEADLINE, "v2's ReplicaSet avoiding v3", || async {
        (avoided(&cluster, &name).await.as_deref() == Some(v3.as_str())).then_some(())
    })
    .await;
    assert_eq!(
        cluster.replica_set(&name).await.uid(),
        uid,
        "the same ReplicaSet"
    );
}
