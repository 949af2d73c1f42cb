//! Specs Argo Rollouts accepts, run with the real `rollouts-controller` binary on kube-sim as
//! Argo runs them: Istio subset-level routing with no canaryService or stableService (the
//! DestinationRule's subsets are the destinations); background analysis that starts without
//! waiting for canary pods, so a crash-looping canary is analysed and aborted; an aborted
//! routed canary kept for `abortScaleDownDelaySeconds`; a `dynamicStableScale` abort stepping
//! back through the weights; a rollback within `rollbackWindow` skipping the steps.

mod support;

use std::ops::Deref;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use rollouts_crds::analysis::{AnalysisPhase, AnalysisRun};
use rollouts_crds::rollout::{Rollout, RolloutStatus};
use rollouts_e2e::fake_prometheus::FakePrometheus;
use rollouts_e2e::sim::SimOptions;
use serde_json::{Value, json};
use support::{Controller, NAMESPACE, Sim, eventually};

const DEADLINE: Duration = Duration::from_secs(40);

fn istio(kind: &str, plural: &str) -> ApiResource {
    let gvk = GroupVersionKind::gvk("networking.istio.io", "v1alpha3", kind);
    ApiResource::from_gvk_with_plural(&gvk, plural)
}

/// The simulator with the project's and Istio's CRDs.
struct Cluster(Sim);

impl Deref for Cluster {
    type Target = Sim;

    fn deref(&self) -> &Sim {
        &self.0
    }
}

impl Cluster {
    fn start(name: &str) -> Self {
        let root = support::workspace_root();
        Self(Sim::start_with(
            "rollouts-argo-valid-specs-on-sim",
            name,
            SimOptions {
                crd_dirs: vec![root.join("crds/yaml"), root.join("e2e/crds")],
                pod_ready_after: Duration::from_millis(200),
                metrics_listen: None,
                ..SimOptions::default()
            },
        ))
    }

    fn controller(&self) -> Controller {
        Controller::start(&self.kubeconfig, DEADLINE)
    }

    fn dynamic(&self, resource: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), NAMESPACE, resource)
    }

    async fn create(&self, resource: &ApiResource, object: Value) {
        let object: DynamicObject = serde_json::from_value(object).expect("an object");
        self.dynamic(resource)
            .create(&PostParams::default(), &object)
            .await
            .expect("creates the object");
    }

    async fn read(&self, resource: &ApiResource, name: &str) -> Value {
        let object = self
            .dynamic(resource)
            .get(name)
            .await
            .expect("reads the object");
        serde_json::to_value(object).expect("JSON")
    }

    async fn rollout_status(&self, name: &str) -> RolloutStatus {
        self.0.status(name).await
    }

    /// Waits until `check` holds of the Rollout's status; returns that status.
    async fn status_where(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&RolloutStatus) -> bool,
    ) -> RolloutStatus {
        eventually(DEADLINE, what, || async {
            let status = self.rollout_status(name).await;
            check(&status).then_some(status)
        })
        .await
    }
}

impl Cluster {
    /// Argo's subset-split objects for `app`, in our own words: a Service, a VirtualService
    /// `<app>-routes` whose route `primary` splits between the subsets of DestinationRule
    /// `<app>-subsets`. Returns the two resources.
    async fn istio_subset_objects(&self, app: &str) -> (ApiResource, ApiResource) {
        self.create_service(app, app).await;
        let (virtual_services, rules) = (
            istio("VirtualService", "virtualservices"),
            istio("DestinationRule", "destinationrules"),
        );
        self.create(
            &virtual_services,
            json!({"apiVersion": "networking.istio.io/v1alpha3", "kind": "VirtualService",
            "metadata": {"name": format!("{app}-routes"), "namespace": NAMESPACE},
            "spec": {"hosts": [app], "http": [{"name": "primary", "route": [
                {"destination": {"host": app, "subset": "stable"}, "weight": 100},
                {"destination": {"host": app, "subset": "canary"}, "weight": 0}
            ]}]}}),
        )
        .await;
        self.create(
            &rules,
            json!({"apiVersion": "networking.istio.io/v1alpha3", "kind": "DestinationRule",
            "metadata": {"name": format!("{app}-subsets"), "namespace": NAMESPACE},
            "spec": {"host": app, "subsets": [
                {"name": "stable", "labels": {"app": app}},
                {"name": "canary", "labels": {"app": app}}
            ]}}),
        )
        .await;
        (virtual_services, rules)
    }
}

/// A Rollout `app` routed by [`Cluster::istio_subset_objects`]' subsets, with no Services
/// named; `canary` adds to its canary strategy.
fn subset_rollout(app: &str, replicas: Option<i32>, canary: Value) -> Rollout {
    let mut strategy = json!({
        "scaleDownDelaySeconds": 2,
        "trafficRouting": {"istio": {
            "virtualService": {"name": format!("{app}-routes"), "routes": ["primary"]},
            "destinationRule": {"name": format!("{app}-subsets"),
                "canarySubsetName": "canary", "stableSubsetName": "stable"}
        }}
    });
    for (key, value) in canary.as_object().cloned().unwrap_or_default() {
        strategy[key] = value;
    }
    let mut rollout = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
        "metadata": {"name": app, "namespace": NAMESPACE},
        "spec": {
            "selector": {"matchLabels": {"app": app}},
            "template": {
                "metadata": {"labels": {"app": app}},
                "spec": {"containers": [{"name": "app", "image": format!("{app}:1"),
                    "ports": [{"name": "http", "containerPort": 80}]}]}
            },
            "strategy": {"canary": strategy}
        }
    });
    if let Some(replicas) = replicas {
        rollout["spec"]["replicas"] = json!(replicas);
    }
    serde_json::from_value(rollout).expect("a valid Rollout")
}

/// The canary and stable weights of the VirtualService route `primary`, by subset.
fn subset_weights(vs: &Value) -> Option<(i64, i64)> {
    let route = vs["spec"]["http"]
        .as_array()?
        .iter()
        .find(|route| route["name"] == "primary")?["route"]
        .as_array()?;
    let weight = |subset: &str| {
        route
            .iter()
            .find(|d| d["destination"]["subset"] == subset)
            .map(|d| d["weight"].as_i64().unwrap_or(0))
    };
    Some((weight("canary")?, weight("stable")?))
}

/// The `rollouts-pod-template-hash` labels of the DestinationRule's canary and stable subsets.
fn subset_hashes(rule: &Value) -> (String, String) {
    let hash = |subset: &str| {
        rule["spec"]["subsets"]
            .as_array()
            .and_then(|subsets| subsets.iter().find(|s| s["name"] == subset))
            .and_then(|s| s["labels"]["rollouts-pod-template-hash"].as_str())
            .unwrap_or_default()
            .to_string()
    };
    (hash("canary"), hash("stable"))
}

/// Argo's subset-split example, in our own words: one Service, a VirtualService whose route
/// `primary` splits between DestinationRule subsets, and a Rollout that names neither
/// canaryService nor stableService. It runs to a pause at 10%, the subsets carrying the two
/// revisions' hashes, and a promotion moves everything to the new revision.
#[tokio::test]
async fn istio_subset_split_without_services_runs_as_in_argo() {
    let cluster = Cluster::start("istio-subset-split");
    let _controller = cluster.controller();
    let (virtual_services, rules) = cluster.istio_subset_objects("orders").await;
    // No spec.replicas (one pod), no Services named: as Argo's example has it.
    let rollout = subset_rollout(
        "orders",
        None,
        json!({"steps": [{"setWeight": 10}, {"pause": {}}]}),
    );
    cluster.create_rollout(rollout).await;

    let v1 = cluster.wait_healthy(DEADLINE, "orders", 1).await.stable_rs;
    assert!(
        cluster
            .rollout_status("orders")
            .await
            .conditions
            .iter()
            .all(|c| c.type_ != "InvalidSpec"),
        "no InvalidSpec"
    );

    cluster.set_image("orders", "orders:2").await;
    let paused = cluster
        .status_where("orders", "paused at step 1, weight 10 verified", |status| {
            status.current_step_index == Some(1)
                && !status.pause_conditions.is_empty()
                && status
                    .canary
                    .weights
                    .as_ref()
                    .is_some_and(|w| w.canary.weight == 10 && w.verified == Some(true))
        })
        .await;
    let v2 = paused.current_pod_hash.clone();
    assert_ne!(v2, v1);
    let vs = cluster.read(&virtual_services, "orders-routes").await;
    assert_eq!(subset_weights(&vs), Some((10, 90)), "{vs}");
    let rule = cluster.read(&rules, "orders-subsets").await;
    assert_eq!(subset_hashes(&rule), (v2.clone(), v1.clone()), "{rule}");
    let weights = paused.canary.weights.expect("weights");
    assert_eq!(
        (
            weights.canary.pod_template_hash.as_str(),
            weights.stable.pod_template_hash.as_str()
        ),
        (v2.as_str(), v1.as_str())
    );
    assert_eq!(
        cluster.replica_sets("orders").await,
        [
            (format!("orders-{v1}"), (1, 1)),
            (format!("orders-{v2}"), (1, 1))
        ]
        .into_iter()
        .collect(),
        "the canary has its pod beside the stable's"
    );

    cluster
        .patch_status("orders", json!({"pauseConditions": null}))
        .await;
    cluster
        .status_where("orders", "Healthy on the new revision", |status| {
            status.phase == "Healthy" && status.stable_rs == v2
        })
        .await;
    let vs = eventually(DEADLINE, "all traffic on the stable subset", || async {
        let vs = cluster.read(&virtual_services, "orders-routes").await;
        (subset_weights(&vs) == Some((0, 100))).then_some(vs)
    })
    .await;
    let rule = cluster.read(&rules, "orders-subsets").await;
    assert_eq!(
        subset_hashes(&rule),
        (v2.clone(), v2.clone()),
        "{rule} {vs}"
    );
}

/// A background analysis with no `startingStep`, whose canary's pods crash-loop: Argo's
/// `reconcileBackgroundAnalysisRun` starts the run without looking at the canary's pods, so the
/// bad metric aborts the update and the stable keeps every pod, instead of the update waiting
/// for pods that never come.
#[tokio::test]
async fn a_crash_looping_canary_is_analysed_in_the_background_and_aborted() {
    const ERRORS: &str = "sum(rate(http_requests_total{code=\"500\"}[1m]))";
    let cluster = Cluster::start("crash-loop-background");
    let prometheus = FakePrometheus::start().await;
    prometheus.values(ERRORS, &["0.5"]);
    let _controller = cluster.controller();
    cluster
        .create_template(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisTemplate",
            "metadata": {"name": "errors", "namespace": NAMESPACE},
            "spec": {"metrics": [{
                "name": "errors", "interval": "1s", "successCondition": "result[0] < 0.05",
                "provider": {"prometheus": {"address": prometheus.address, "query": ERRORS}}
            }]}
        }))
        .await;
    let mut rollout =
        support::canary_rollout("web", 2, "web:1", json!([{"setWeight": 50}, {"pause": {}}]));
    if let Some(canary) = rollout.spec.strategy.canary.as_mut() {
        canary.analysis =
            serde_json::from_value(json!({"templates": [{"templateName": "errors"}]}))
                .expect("a background analysis");
    }
    cluster.create_rollout(rollout).await;
    let v1 = cluster.wait_healthy(DEADLINE, "web", 2).await.stable_rs;
    let runs: Api<AnalysisRun> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let background = ListParams::default().labels("rollout-type=Background");
    assert!(
        runs.list(&background)
            .await
            .expect("lists runs")
            .items
            .is_empty(),
        "no run on the first deploy"
    );

    cluster
        .rollouts()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {
                "metadata": {"annotations": {"sim.rollouts.dev/crash-loop": "true"}},
                "spec": {"containers": [{"name": "app", "image": "web:2"}]}
            }}})),
        )
        .await
        .expect("a crash-looping revision");
    let aborted = cluster
        .status_where("web", "aborted by the background run", |status| {
            status.abort && status.phase == "Degraded"
        })
        .await;
    let v2 = aborted.current_pod_hash.clone();
    assert_ne!(v2, v1);
    assert_eq!(aborted.stable_rs, v1);
    let progressing = aborted
        .conditions
        .iter()
        .find(|c| c.type_ == "Progressing")
        .expect("a Progressing condition");
    assert!(
        progressing
            .message
            .contains("Background analysis phase error/failed"),
        "{progressing:?}"
    );
    let listed = runs.list(&background).await.expect("lists runs").items;
    assert_eq!(listed.len(), 1, "one background run");
    assert_eq!(
        listed[0].labels().get("rollouts-pod-template-hash"),
        Some(&v2)
    );
    assert_eq!(
        listed[0].status.as_ref().map(|s| s.phase),
        Some(AnalysisPhase::Failed)
    );
    eventually(
        DEADLINE,
        "the canary scaled down, the stable whole",
        || async {
            let replica_sets = cluster.replica_sets("web").await;
            let v1_pods = replica_sets.get(&format!("web-{v1}")).copied();
            let v2_pods = replica_sets
                .get(&format!("web-{v2}"))
                .map(|(replicas, _)| *replicas);
            (v1_pods == Some((2, 2)) && v2_pods == Some(0)).then_some(())
        },
    )
    .await;
}

/// `abortScaleDownDelaySeconds` with a router, as Argo's `reconcileNewReplicaSet` does it: the
/// aborted canary keeps its pods once the weight is back on the stable, its ReplicaSet marked
/// with a `scale-down-deadline` that far ahead, and is scaled down when it passes.
#[tokio::test]
async fn an_aborted_routed_canary_keeps_its_pods_for_abort_scale_down_delay_seconds() {
    let cluster = Cluster::start("abort-scale-down-delay");
    let _controller = cluster.controller();
    let (virtual_services, _) = cluster.istio_subset_objects("ledger").await;
    let rollout = subset_rollout(
        "ledger",
        Some(2),
        json!({"abortScaleDownDelaySeconds": 3, "steps": [{"setWeight": 50}, {"pause": {}}]}),
    );
    cluster.create_rollout(rollout).await;
    let v1 = cluster.wait_healthy(DEADLINE, "ledger", 2).await.stable_rs;
    cluster.set_image("ledger", "ledger:2").await;
    let paused = cluster
        .status_where("ledger", "paused at 50%", |status| {
            status.current_step_index == Some(1)
                && status
                    .canary
                    .weights
                    .as_ref()
                    .is_some_and(|w| w.canary.weight == 50 && w.verified == Some(true))
        })
        .await;
    let canary = format!("ledger-{}", paused.current_pod_hash);
    cluster.patch_status("ledger", json!({"abort": true})).await;

    let replica_sets: Api<k8s_openapi::api::apps::v1::ReplicaSet> =
        Api::namespaced(cluster.client.clone(), NAMESPACE);
    let deadline = eventually(DEADLINE, "the canary's scale-down deadline", || async {
        let rs = replica_sets.get(&canary).await.ok()?;
        rs.annotations().get("scale-down-deadline").cloned()
    })
    .await;
    let vs = cluster.read(&virtual_services, "ledger-routes").await;
    assert_eq!(
        subset_weights(&vs),
        Some((0, 100)),
        "weight back first: {vs}"
    );
    assert_eq!(
        cluster
            .replica_sets("ledger")
            .await
            .get(&canary)
            .map(|(replicas, _)| *replicas),
        Some(1),
        "the canary keeps its pod until {deadline}"
    );
    eventually(
        DEADLINE,
        "the canary scaled down after its deadline",
        || async {
            let replica_sets = cluster.replica_sets("ledger").await;
            let canary_pods = replica_sets.get(&canary).map(|(replicas, _)| *replicas);
            let stable_pods = replica_sets.get(&format!("ledger-{v1}")).copied();
            (canary_pods == Some(0) && stable_pods == Some((2, 2))).then_some(())
        },
    )
    .await;
    let status = cluster.rollout_status("ledger").await;
    assert!(status.abort && status.phase == "Degraded", "{status:?}");
}

/// The `from A to B` of each `ScalingReplicaSet` event of `rollout` about `replica_set`, oldest
/// first.
async fn scalings(cluster: &Cluster, rollout: &str, replica_set: &str) -> Vec<(i32, i32)> {
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(cluster.client.clone(), NAMESPACE);
    let mut found: Vec<_> = events
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|event| {
            event.reason.as_deref() == Some("ScalingReplicaSet")
                && event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(rollout)
        })
        .filter_map(|event| {
            let note = event.note.clone().unwrap_or_default();
            let rest = note.strip_prefix("Scaled ")?;
            if !rest.contains(&format!("ReplicaSet {replica_set} ")) {
                return None;
            }
            let (_, counts) = rest.rsplit_once(" from ")?;
            let (from, to) = counts.split_once(" to ")?;
            let at = event.event_time.as_ref().map(|t| t.0);
            Some((at, (from.parse().ok()?, to.parse().ok()?)))
        })
        .collect();
    found.sort_by_key(|(at, _)| *at);
    found.into_iter().map(|(_, counts)| counts).collect()
}

#[tokio::test]
async fn a_dynamic_stable_scale_abort_steps_back_and_honours_its_abort_delay() {
    let cluster = Cluster::start("dynamic-abort");
    let _controller = cluster.controller();
    let (virtual_services, _) = cluster.istio_subset_objects("till").await;
    let rollout = subset_rollout(
        "till",
        Some(4),
        json!({
            "dynamicStableScale": true,
            "scaleDownDelaySeconds": null,
            "abortScaleDownDelaySeconds": 3,
            "steps": [{"setWeight": 25}, {"pause": {}}, {"setWeight": 50}, {"pause": {}},
                      {"setWeight": 75}, {"pause": {}}],
        }),
    );
    cluster.create_rollout(rollout).await;
    let v1 = cluster.wait_healthy(DEADLINE, "till", 4).await.stable_rs;
    cluster.set_image("till", "till:2").await;
    for step in [1, 3, 5] {
        cluster
            .status_where("till", &format!("paused at step {step}"), |status| {
                status.current_step_index == Some(step) && !status.pause_conditions.is_empty()
            })
            .await;
        if step < 5 {
            cluster
                .patch_status("till", json!({"pauseConditions": null}))
                .await;
        }
    }
    let paused = cluster
        .status_where("till", "75% in effect", |status| {
            status
                .canary
                .weights
                .as_ref()
                .is_some_and(|w| w.canary.weight == 75 && w.verified == Some(true))
        })
        .await;
    let canary = format!("till-{}", paused.current_pod_hash);
    let stable = format!("till-{v1}");
    assert_eq!(
        cluster.replica_sets("till").await.get(&stable).copied(),
        Some((1, 1)),
        "the stable keeps 25%"
    );
    cluster.patch_status("till", json!({"abort": true})).await;

    eventually(
        DEADLINE,
        "the canary scaled down after its deadline",
        || async {
            let replica_sets = cluster.replica_sets("till").await;
            let canary_pods = replica_sets.get(&canary).map(|(replicas, _)| *replicas);
            let stable_pods = replica_sets.get(&stable).copied();
            (canary_pods == Some(0) && stable_pods == Some((4, 4))).then_some(())
        },
    )
    .await;
    let vs = cluster.read(&virtual_services, "till-routes").await;
    assert_eq!(subset_weights(&vs), Some((0, 100)), "{vs}");
    // The stable came back one step at a time (75 -> 50 -> 25 -> 0), never straight to 4.
    let stable_scalings = scalings(&cluster, "till", &stable).await;
    let after_abort: Vec<_> = stable_scalings
        .iter()
        .skip_while(|(from, _)| *from != 1)
        .copied()
        .collect();
    assert_eq!(after_abort, [(1, 2), (2, 3), (3, 4)], "{stable_scalings:?}");
    // With the explicit delay the canary kept its 3 pods until then, as Argo's does.
    let canary_scalings = scalings(&cluster, "till", &canary).await;
    assert_eq!(
        canary_scalings.last(),
        Some(&(3, 0)),
        "one scale-down at the deadline: {canary_scalings:?}"
    );
    let status = cluster.rollout_status("till").await;
    assert!(status.abort && status.phase == "Degraded", "{status:?}");
}

#[tokio::test]
async fn a_rollback_within_the_rollback_window_skips_the_steps() {
    let cluster = Cluster::start("rollback-window");
    let _controller = cluster.controller();
    cluster.istio_subset_objects("quay").await;
    let mut rollout = subset_rollout(
        "quay",
        Some(2),
        json!({"steps": [{"setWeight": 50}, {"pause": {}}]}),
    );
    rollout.spec.rollback_window =
        Some(rollouts_crds::rollout::RollbackWindowSpec { revisions: Some(2) });
    cluster.create_rollout(rollout).await;
    let v1 = cluster.wait_healthy(DEADLINE, "quay", 2).await.stable_rs;
    // Revisions are ordered by creation time, which the API server keeps to the second (as
    // Argo's isRollbackWithinWindow does): v2 must be born in a later second than v1.
    let replica_sets: Api<k8s_openapi::api::apps::v1::ReplicaSet> =
        Api::namespaced(cluster.client.clone(), NAMESPACE);
    let born = replica_sets
        .get(&format!("quay-{v1}"))
        .await
        .expect("v1's ReplicaSet")
        .metadata
        .creation_timestamp
        .expect("created")
        .0;
    eventually(DEADLINE, "a second after v1 was created", || async {
        (k8s_openapi::jiff::Timestamp::now().as_second() > born.as_second()).then_some(())
    })
    .await;
    cluster.set_image("quay", "quay:2").await;
    cluster
        .status_where("quay", "paused at 50%", |status| {
            status.current_step_index == Some(1) && !status.pause_conditions.is_empty()
        })
        .await;
    cluster
        .patch_status("quay", json!({"pauseConditions": null}))
        .await;
    let v2 = cluster.wait_healthy(DEADLINE, "quay", 2).await.stable_rs;
    assert_ne!(v1, v2);
    // Back to the first template: within the window, so no pause and no canary step.
    // (The whole container as v1 had it: `set_image` drops its ports, a template of its own.)
    let first_template = json!({"spec": {"template": {"spec": {"containers": [{"name": "app",
        "image": "quay:1", "ports": [{"name": "http", "containerPort": 80}]}]}}}});
    cluster
        .rollouts()
        .patch(
            "quay",
            &PatchParams::default(),
            &Patch::Merge(&first_template),
        )
        .await
        .expect("back to the first template");
    let back = cluster
        .status_where("quay", "back on the first revision", |status| {
            status.current_pod_hash == v1
                && (status.stable_rs == v1 || !status.pause_conditions.is_empty())
        })
        .await;
    assert_eq!(back.stable_rs, v1, "{back:?}");
    assert!(back.pause_conditions.is_empty(), "{back:?}");
    let replica_sets = cluster.replica_sets("quay").await;
    assert_eq!(
        replica_sets.get(&format!("quay-{v1}")).copied(),
        Some((2, 2))
    );
}
