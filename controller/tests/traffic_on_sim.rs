//! The real `rollouts-controller` binary routing a canary through nginx, Istio (host- and
//! subset-level) and the Gateway API on kube-sim (CRDs from crds/yaml and e2e/crds): weights read
//! back from the router object at each step and verified in status, an out-of-band edit put back
//! through the router watches, abort sending everything to the stable before the canary scales
//! down, a header route added then removed, and a missing router object or CRD named in
//! `InvalidSpec` with nothing running until it exists.

mod support;

use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use rollouts_crds::rollout::{Rollout, RolloutStatus};
use rollouts_e2e::sim::{RequestRecord, SimOptions};
use serde_json::{Value, json};
use support::{Controller, NAMESPACE, Sim, eventually};

const DEADLINE: Duration = Duration::from_secs(40);
/// How soon an out-of-band edit must be put back.
const CORRECTION_DEADLINE: Duration = Duration::from_secs(8);
const CONTROLLER_AGENT: &str = "rollouts-controller/";
const REPLICAS: i32 = 5;

/// Which router a test drives, and how to read and break its weight.
#[derive(Clone, Copy, Debug)]
enum Router {
    Nginx,
    /// Host-level: the VirtualService routes between the stable and canary Services.
    Istio,
    /// Subset-level: the VirtualService routes between DestinationRule subsets.
    IstioSubset,
    GatewayApi,
}

impl Router {
    /// The router object whose weight the test reads back.
    fn object(self) -> (ApiResource, &'static str) {
        let (group, version, kind, plural, name) = match self {
            Router::Nginx => (
                "networking.k8s.io",
                "v1",
                "Ingress",
                "ingresses",
                "shop-shop-canary",
            ),
            Router::Istio | Router::IstioSubset => (
                "networking.istio.io",
                "v1alpha3",
                "VirtualService",
                "virtualservices",
                "shop",
            ),
            Router::GatewayApi => (
                "gateway.networking.k8s.io",
                "v1",
                "HTTPRoute",
                "httproutes",
                "shop",
            ),
        };
        let gvk = kube::core::GroupVersionKind::gvk(group, version, kind);
        (ApiResource::from_gvk_with_plural(&gvk, plural), name)
    }

    /// The resource name the request log records for writes to the router object.
    fn resource(self) -> &'static str {
        match self {
            Router::Nginx => "ingresses",
            Router::Istio | Router::IstioSubset => "virtualservices",
            Router::GatewayApi => "httproutes",
        }
    }

    fn traffic_routing(self) -> Value {
        match self {
            Router::Nginx => json!({"nginx": {"stableIngress": "shop"}}),
            Router::Istio => json!({
                "managedRoutes": [{"name": "canary-header"}],
                "istio": {"virtualService": {"name": "shop", "routes": ["primary"]}}
            }),
            Router::IstioSubset => json!({"istio": {
                "virtualService": {"name": "shop", "routes": ["primary"]},
                "destinationRule": {
                    "name": "shop", "canarySubsetName": "canary", "stableSubsetName": "stable"
                }
            }}),
            Router::GatewayApi => json!({
                "plugins": {"argoproj-labs/gatewayAPI": {"httpRoute": "shop"}}
            }),
        }
    }

    /// The canary's weight as the router object holds it; `None` while it has none.
    fn canary_weight(self, object: &Value) -> Option<i64> {
        match self {
            Router::Nginx => object
                .pointer("/metadata/annotations/nginx.ingress.kubernetes.io~1canary-weight")
                .and_then(Value::as_str)
                .and_then(|w| w.parse().ok()),
            Router::Istio => primary_route(object)?["route"]
                .as_array()?
                .iter()
                .find(|d| d["destination"]["host"] == "shop-canary")
                .and_then(|d| d["weight"].as_i64().or(Some(0))),
            Router::IstioSubset => primary_route(object)?["route"]
                .as_array()?
                .iter()
                .find(|d| d["destination"]["subset"] == "canary")
                .and_then(|d| d["weight"].as_i64().or(Some(0))),
            Router::GatewayApi => object["spec"]["rules"]
                .as_array()?
                .iter()
                .find(|rule| rule["name"] == "main")?["backendRefs"]
                .as_array()?
                .iter()
                .find(|b| b["name"] == "shop-canary")
                .and_then(|b| b["weight"].as_i64()),
        }
    }

    /// A merge patch an operator might make by hand: the canary at `weight`.
    fn edit_weight(self, weight: i64) -> Value {
        match self {
            Router::Nginx => json!({"metadata": {"annotations": {
                "nginx.ingress.kubernetes.io/canary-weight": weight.to_string()
            }}}),
            Router::Istio => json!({"spec": {"http": [primary(100 - weight, weight)]}}),
            Router::IstioSubset => {
                json!({"spec": {"http": [primary_subsets(100 - weight, weight)]}})
            }
            Router::GatewayApi => json!({"spec": {"rules": [main_rule(100 - weight, weight)]}}),
        }
    }
}

fn primary_route(vs: &Value) -> Option<&Value> {
    vs["spec"]["http"]
        .as_array()?
        .iter()
        .find(|route| route["name"] == "primary")
}

fn primary(stable: i64, canary: i64) -> Value {
    json!({"name": "primary", "route": [
        {"destination": {"host": "shop-stable"}, "weight": stable},
        {"destination": {"host": "shop-canary"}, "weight": canary}
    ]})
}

fn primary_subsets(stable: i64, canary: i64) -> Value {
    json!({"name": "primary", "route": [
        {"destination": {"host": "shop", "subset": "stable"}, "weight": stable},
        {"destination": {"host": "shop", "subset": "canary"}, "weight": canary}
    ]})
}

/// The `rollouts-pod-template-hash` label of a DestinationRule subset.
fn subset_hash(rule: &Value, subset: &str) -> Option<String> {
    rule["spec"]["subsets"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == subset)?["labels"]["rollouts-pod-template-hash"]
        .as_str()
        .map(str::to_string)
}

fn main_rule(stable: i64, canary: i64) -> Value {
    json!({"name": "main", "matches": [{"path": {"type": "PathPrefix", "value": "/"}}], "backendRefs": [
        {"name": "shop-stable", "port": 80, "weight": stable},
        {"name": "shop-canary", "port": 80, "weight": canary}
    ]})
}

fn destination_rules() -> ApiResource {
    let gvk =
        kube::core::GroupVersionKind::gvk("networking.istio.io", "v1alpha3", "DestinationRule");
    ApiResource::from_gvk_with_plural(&gvk, "destinationrules")
}

/// The shared simulator, with the project's and the routers' CRDs, plus this file's router
/// reads and waits.
struct Cluster(Sim);

impl Deref for Cluster {
    type Target = Sim;

    fn deref(&self) -> &Sim {
        &self.0
    }
}

impl Cluster {
    fn start(name: &str) -> Self {
        Self::with_crds(name, &["crds/yaml", "e2e/crds"])
    }

    /// A simulator with the CRDs of these directories (relative to the workspace root) only.
    fn with_crds(name: &str, dirs: &[&str]) -> Self {
        let root = support::workspace_root();
        Self(Sim::start_with(
            "rollouts-traffic-on-sim",
            name,
            SimOptions {
                crd_dirs: dirs.iter().map(|dir| root.join(dir)).collect(),
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

    async fn status(&self) -> RolloutStatus {
        self.rollouts()
            .get("shop")
            .await
            .expect("reads the Rollout")
            .status
            .unwrap_or_default()
    }

    async fn apply_json(&self, resource: &ApiResource, object: Value) {
        let object: DynamicObject = serde_json::from_value(object).expect("an object");
        self.dynamic(resource)
            .create(&PostParams::default(), &object)
            .await
            .expect("creates the object");
    }

    /// The stable and canary Services, and the router object `router` splits traffic with.
    async fn create_router_objects(&self, router: Router) {
        let services = ApiResource::erase::<Service>(&());
        for name in ["shop-stable", "shop-canary"] {
            self.apply_json(
                &services,
                json!({"apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": name, "namespace": NAMESPACE},
                    "spec": {"selector": {"app": "shop"}, "ports": [{"port": 80}]}}),
            )
            .await;
        }
        match router {
            Router::Nginx => self.create_stable_ingress().await,
            Router::Istio => {
                let (resource, _) = router.object();
                self.apply_json(
                    &resource,
                    json!({"apiVersion": "networking.istio.io/v1alpha3", "kind": "VirtualService",
                        "metadata": {"name": "shop", "namespace": NAMESPACE},
                        "spec": {"hosts": ["shop.example.com"], "http": [primary(100, 0)]}}),
                )
                .await;
            }
            Router::IstioSubset => {
                let (resource, _) = router.object();
                self.apply_json(
                    &resource,
                    json!({"apiVersion": "networking.istio.io/v1alpha3", "kind": "VirtualService",
                        "metadata": {"name": "shop", "namespace": NAMESPACE},
                        "spec": {"hosts": ["shop"], "http": [primary_subsets(100, 0)]}}),
                )
                .await;
                self.apply_json(
                    &destination_rules(),
                    json!({"apiVersion": "networking.istio.io/v1alpha3", "kind": "DestinationRule",
                    "metadata": {"name": "shop", "namespace": NAMESPACE},
                    "spec": {"host": "shop", "subsets": [
                        {"name": "stable", "labels": {"app": "shop"}},
                        {"name": "canary", "labels": {"app": "shop"}}
                    ]}}),
                )
                .await;
            }
            Router::GatewayApi => {
                let (resource, _) = router.object();
                self.apply_json(
                    &resource,
                    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                        "metadata": {"name": "shop", "namespace": NAMESPACE},
                        "spec": {"parentRefs": [{"name": "public"}], "rules": [main_rule(100, 0)]}}),
                )
                .await;
            }
        }
    }

    async fn create_stable_ingress(&self) {
        let (ingresses, _) = Router::Nginx.object();
        self.apply_json(
            &ingresses,
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "shop", "namespace": NAMESPACE},
            "spec": {"rules": [{"host": "shop.example.com", "http": {"paths": [{
                "path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": "shop-stable", "port": {"number": 80}}}
            }]}}]}}),
        )
        .await;
    }

    async fn create_rollout(&self, router: Router, steps: Value) {
        let rollout: Rollout = serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Rollout",
            "metadata": {"name": "shop", "namespace": NAMESPACE},
            "spec": {
                "replicas": REPLICAS,
                "selector": {"matchLabels": {"app": "shop"}},
                "template": {
                    "metadata": {"labels": {"app": "shop"}},
                    "spec": {"containers": [{"name": "app", "image": "app:v1"}]}
                },
                "strategy": {"canary": {
                    "stableService": "shop-stable",
                    "canaryService": "shop-canary",
                    "trafficRouting": router.traffic_routing(),
                    // The previous stable keeps its pods this long after a promotion (30 s
                    // unless set): short, so each promotion is Healthy soon.
                    "scaleDownDelaySeconds": 2,
                    // An aborted canary keeps its pods this long once the stable is whole
                    // (30 s unless set).
                    "abortScaleDownDelaySeconds": 1,
                    "steps": steps
                }}
            }
        }))
        .expect("a valid Rollout");
        self.rollouts()
            .create(&PostParams::default(), &rollout)
            .await
            .expect("creates the Rollout");
    }

    async fn router_object(&self, router: Router) -> Option<Value> {
        let (resource, name) = router.object();
        let object = self.dynamic(&resource).get_opt(name).await.ok()??;
        serde_json::to_value(object).ok()
    }

    async fn router_weight(&self, router: Router) -> Option<i64> {
        router.canary_weight(&self.router_object(router).await?)
    }

    /// Waits until the router holds `weight` and status records it, verified.
    async fn weight_verified(&self, router: Router, weight: i64) {
        eventually(
            DEADLINE,
            &format!("{router:?} holding canary weight {weight}, verified"),
            || async {
                let status = self.status().await;
                let recorded = status.canary.weights?;
                let held = self.router_weight(router).await == Some(weight);
                (held
                    && i64::from(recorded.canary.weight) == weight
                    && recorded.verified == Some(true))
                .then_some(())
            },
        )
        .await;
    }

    async fn set_image(&self, image: &str) -> String {
        let before = self.status().await.current_pod_hash;
        self.0.set_image("shop", image).await;
        eventually(DEADLINE, "the new revision's hash", || async {
            let hash = self.status().await.current_pod_hash;
            (hash != before && !hash.is_empty()).then_some(hash)
        })
        .await
    }

    async fn patch_status(&self, status: Value) {
        self.0.patch_status("shop", status).await;
    }

    async fn promote(&self) {
        self.patch_status(json!({"pauseConditions": null})).await;
    }

    async fn paused_at(&self, index: i32) {
        eventually(DEADLINE, &format!("paused at step {index}"), || async {
            let status = self.status().await;
            (status.current_step_index == Some(index) && !status.pause_conditions.is_empty())
                .then_some(())
        })
        .await;
    }

    async fn healthy_on(&self, hash: &str) {
        eventually(DEADLINE, &format!("Healthy on {hash}"), || async {
            let status = self.status().await;
            (status.phase == "Healthy"
                && status.stable_rs == hash
                && status.current_pod_hash == hash
                && status.available_replicas == REPLICAS)
                .then_some(())
        })
        .await;
    }

    /// spec.replicas of `shop-<hash>`.
    async fn replicas_of(&self, hash: &str) -> Option<i32> {
        let api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), NAMESPACE);
        let rs = api.get_opt(&format!("shop-{hash}")).await.ok()??;
        rs.spec?.replicas
    }

    async fn assert_nothing_runs(&self) {
        let replica_sets: Api<ReplicaSet> = Api::namespaced(self.client.clone(), NAMESPACE);
        let listed = replica_sets
            .list(&ListParams::default())
            .await
            .expect("lists ReplicaSets");
        assert!(
            listed.items.is_empty(),
            "nothing runs: {:?}",
            listed
                .items
                .iter()
                .map(|rs| rs.name_any())
                .collect::<Vec<_>>()
        );
    }

    /// The message of the Rollout's `InvalidSpec` condition, once it has one.
    async fn invalid_spec(&self) -> String {
        eventually(DEADLINE, "the InvalidSpec condition", || async {
            let status = self.status().await;
            status
                .conditions
                .iter()
                .find(|c| c.type_ == "InvalidSpec")
                .map(|c| c.message.clone())
        })
        .await
    }

    /// Writes (create, update, patch, delete) the controller made, leases and events aside.
    fn controller_writes(&self) -> Vec<RequestRecord> {
        self.sim
            .requests()
            .into_iter()
            .filter(|r| r.user_agent.starts_with(CONTROLLER_AGENT))
            .filter(|r| matches!(r.verb.as_str(), "create" | "update" | "patch" | "delete"))
            .filter(|r| r.resource != "events" && r.resource != "leases")
            .collect()
    }

    /// Every canary weight the router object takes from now on, in order, from a watch.
    fn record_weights(&self, router: Router) -> Arc<Mutex<Vec<i64>>> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (resource, name) = router.object();
        let api = self.dynamic(&resource);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let sink = seen.clone();
        tokio::spawn(async move {
            let mut objects = watcher(api, config).applied_objects().boxed();
            while let Ok(Some(object)) = objects.try_next().await {
                let Some(weight) = serde_json::to_value(object)
                    .ok()
                    .and_then(|object| router.canary_weight(&object))
                else {
                    continue;
                };
                let mut seen = sink.lock().expect("weights");
                if seen.last() != Some(&weight) {
                    seen.push(weight);
                }
            }
        });
        seen
    }
}

/// setWeight 20, pause, setWeight 50, pause to a full promotion with the weights read back;
/// an out-of-band edit put back; then a third revision aborted at 20, whose canary scales down
/// only after the router sends it nothing, `abortScaleDownDelaySeconds` later.
async fn canary_through(router: Router, name: &str) {
    let cluster = Cluster::start(name);
    let _controller = cluster.controller();
    cluster.create_router_objects(router).await;
    let steps = json!([{"setWeight": 20}, {"pause": {}}, {"setWeight": 50}, {"pause": {}}]);
    cluster.create_rollout(router, steps).await;
    let v1 = eventually(DEADLINE, "the first revision", || async {
        let hash = cluster.status().await.current_pod_hash;
        (!hash.is_empty()).then_some(hash)
    })
    .await;
    cluster.healthy_on(&v1).await;
    cluster.weight_verified(router, 0).await;

    let weights = cluster.record_weights(router);
    let v2 = cluster.set_image("app:v2").await;
    cluster.paused_at(1).await;
    cluster.weight_verified(router, 20).await;
    assert_eq!(cluster.replicas_of(&v2).await, Some(1), "20% of 5 pods");
    if let Router::IstioSubset = router {
        let rule = cluster
            .dynamic(&destination_rules())
            .get("shop")
            .await
            .expect("reads the DestinationRule");
        let rule = serde_json::to_value(rule).expect("JSON");
        assert_eq!(subset_hash(&rule, "canary"), Some(v2.clone()), "{rule}");
        assert_eq!(subset_hash(&rule, "stable"), Some(v1.clone()), "{rule}");
    }

    let (resource, object) = router.object();
    cluster
        .dynamic(&resource)
        .patch(
            object,
            &PatchParams::default(),
            &Patch::Merge(router.edit_weight(70)),
        )
        .await
        .expect("edits the weight out of band");
    eventually(
        CORRECTION_DEADLINE,
        "the out-of-band weight put back to 20",
        || async { (cluster.router_weight(router).await == Some(20)).then_some(()) },
    )
    .await;
    cluster.weight_verified(router, 20).await;

    cluster.promote().await;
    cluster.paused_at(3).await;
    cluster.weight_verified(router, 50).await;
    cluster.promote().await;
    cluster.healthy_on(&v2).await;
    // Promoted: the stable Service selects v2, so the canary's share goes back to 0.
    cluster.weight_verified(router, 0).await;
    let seen = weights.lock().expect("weights").clone();
    let full = seen.windows(2).any(|pair| pair == [50, 100]).then_some(());
    assert!(
        full.is_some(),
        "the canary got the whole traffic after the last step before the promotion: {seen:?}"
    );
    assert!(
        seen.ends_with(&[100, 0]),
        "weights the router took: {seen:?}"
    );

    let v3 = cluster.set_image("app:v3").await;
    cluster.paused_at(1).await;
    cluster.weight_verified(router, 20).await;
    let before_abort = cluster.controller_writes().len();
    cluster.patch_status(json!({"abort": true})).await;
    eventually(DEADLINE, "the aborted canary scaled to 0", || async {
        (cluster.replicas_of(&v3).await == Some(0)).then_some(())
    })
    .await;
    cluster.weight_verified(router, 0).await;
    let writes = &cluster.controller_writes()[before_abort..];
    let routed_back = writes
        .iter()
        .position(|w| w.resource == router.resource() && w.verb == "patch")
        .expect("the router was set back to the stable");
    let scaled_down = writes
        .iter()
        .position(|w| w.resource == "replicasets" && w.name == format!("shop-{v3}"))
        .expect("the canary was scaled down");
    assert!(
        routed_back < scaled_down,
        "weight 0 before the canary scales down: {writes:?}"
    );
}

#[tokio::test]
async fn nginx_canary_weights_are_set_verified_kept_and_rolled_back() {
    canary_through(Router::Nginx, "nginx").await;
}

#[tokio::test]
async fn istio_canary_weights_are_set_verified_kept_and_rolled_back() {
    canary_through(Router::Istio, "istio").await;
}

#[tokio::test]
async fn istio_subset_canary_weights_are_set_verified_kept_and_rolled_back() {
    canary_through(Router::IstioSubset, "istio-subset").await;
}

#[tokio::test]
async fn gateway_api_canary_weights_are_set_verified_kept_and_rolled_back() {
    canary_through(Router::GatewayApi, "gatewayapi").await;
}

#[tokio::test]
async fn an_istio_header_route_is_added_for_the_step_and_removed_after_promotion() {
    let router = Router::Istio;
    let cluster = Cluster::start("header");
    let _controller = cluster.controller();
    cluster.create_router_objects(router).await;
    let steps = json!([
        {"setWeight": 20},
        {"setHeaderRoute": {"name": "canary-header", "match": [
            {"headerName": "x-canary", "headerValue": {"exact": "yes"}}
        ]}},
        {"pause": {}}
    ]);
    cluster.create_rollout(router, steps).await;
    let v1 = eventually(DEADLINE, "the first revision", || async {
        let hash = cluster.status().await.current_pod_hash;
        (!hash.is_empty()).then_some(hash)
    })
    .await;
    cluster.healthy_on(&v1).await;
    let header_route = |vs: Value| {
        vs["spec"]["http"].as_array().and_then(|routes| {
            routes
                .iter()
                .find(|r| r["name"] == "canary-header")
                .cloned()
        })
    };
    let v2 = cluster.set_image("app:v2").await;
    cluster.paused_at(2).await;
    let added = eventually(DEADLINE, "the header route", || async {
        header_route(cluster.router_object(router).await?)
    })
    .await;
    assert_eq!(
        added["match"][0]["headers"]["x-canary"]["exact"], "yes",
        "{added}"
    );
    assert_eq!(added["route"][0]["destination"]["host"], "shop-canary");
    cluster.weight_verified(router, 20).await;

    cluster.promote().await;
    cluster.healthy_on(&v2).await;
    eventually(DEADLINE, "the header route removed", || async {
        let vs = cluster.router_object(router).await?;
        (header_route(vs.clone()).is_none() && primary_route(&vs).is_some()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_missing_stable_ingress_is_named_and_nothing_runs_until_it_exists() {
    let cluster = Cluster::start("missing");
    let _controller = cluster.controller();
    let services = ApiResource::erase::<Service>(&());
    for name in ["shop-stable", "shop-canary"] {
        cluster
            .apply_json(
                &services,
                json!({"apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": name, "namespace": NAMESPACE},
                    "spec": {"selector": {"app": "shop"}, "ports": [{"port": 80}]}}),
            )
            .await;
    }
    cluster
        .create_rollout(Router::Nginx, json!([{"setWeight": 20}, {"pause": {}}]))
        .await;
    let message = cluster.invalid_spec().await;
    assert!(
        message.contains("Ingress default/shop not found")
            && message.contains("spec.strategy.canary.trafficRouting.nginx.stableIngress"),
        "{message}"
    );
    cluster.assert_nothing_runs().await;

    cluster.create_stable_ingress().await;
    let hash = eventually(DEADLINE, "a revision once the Ingress exists", || async {
        let hash = cluster.status().await.current_pod_hash;
        (!hash.is_empty()).then_some(hash)
    })
    .await;
    cluster.healthy_on(&hash).await;
    let status = cluster.status().await;
    assert!(
        status.conditions.iter().all(|c| c.type_ != "InvalidSpec"),
        "{:?}",
        status.conditions
    );
}

#[tokio::test]
async fn a_virtual_service_without_its_crd_is_named_and_nothing_runs() {
    let cluster = Cluster::with_crds("no-istio", &["crds/yaml"]);
    let _controller = cluster.controller();
    cluster
        .create_rollout(Router::Istio, json!([{"setWeight": 20}, {"pause": {}}]))
        .await;
    let message = cluster.invalid_spec().await;
    assert!(
        message.contains("VirtualService default/shop not found")
            && message.contains("CRD must be installed"),
        "{message}"
    );
    cluster.assert_nothing_runs().await;
}

/// A healthy routed Rollout, reconciled by a new controller (every watch lists it), makes no
/// write: the routers find their objects as wanted.
async fn at_rest(router: Router, name: &str) {
    let cluster = Cluster::start(name);
    let controller = cluster.controller();
    cluster.create_router_objects(router).await;
    cluster
        .create_rollout(router, json!([{"setWeight": 20}, {"pause": {}}]))
        .await;
    let hash = eventually(DEADLINE, "the first revision", || async {
        let hash = cluster.status().await.current_pod_hash;
        (!hash.is_empty()).then_some(hash)
    })
    .await;
    cluster.healthy_on(&hash).await;
    cluster.weight_verified(router, 0).await;
    controller.kill().await;

    cluster.sim.clear_requests();
    let restarted = cluster.controller();
    eventually(DEADLINE, "a reconcile of the healthy Rollout", || async {
        (restarted.try_reconciles("shop").await? >= 1).then_some(())
    })
    .await;
    let read_router = cluster.sim.requests().iter().any(|r| {
        r.user_agent.starts_with(CONTROLLER_AGENT)
            && r.resource == router.resource()
            && r.verb == "get"
    });
    assert!(read_router, "the controller read the router object back");
    let writes = cluster.controller_writes();
    assert!(writes.is_empty(), "writes at rest: {writes:?}");
}

#[tokio::test]
async fn a_healthy_nginx_rollout_is_reconciled_without_a_write() {
    at_rest(Router::Nginx, "nginx-rest").await;
}

#[tokio::test]
async fn a_healthy_istio_subset_rollout_is_reconciled_without_a_write() {
    at_rest(Router::IstioSubset, "istio-rest").await;
}

#[tokio::test]
async fn a_healthy_gateway_api_rollout_is_reconciled_without_a_write() {
    at_rest(Router::GatewayApi, "gatewayapi-rest").await;
}

#[tokio::test]
async fn a_gateway_api_plugin_naming_no_route_is_refused_and_nothing_runs() {
    let cluster = Cluster::start("no-route");
    let _controller = cluster.controller();
    let rollout: Rollout = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": "shop", "namespace": NAMESPACE},
        "spec": {
            "replicas": REPLICAS,
            "selector": {"matchLabels": {"app": "shop"}},
            "template": {
                "metadata": {"labels": {"app": "shop"}},
                "spec": {"containers": [{"name": "app", "image": "app:v1"}]}
            },
            "strategy": {"canary": {
                "stableService": "shop-stable",
                "canaryService": "shop-canary",
                "trafficRouting": {"plugins": {"argoproj-labs/gatewayAPI": {"namespace": "default"}}},
                "steps": [{"setWeight": 20}]
            }}
        }
    }))
    .expect("a valid Rollout");
    cluster
        .rollouts()
        .create(&PostParams::default(), &rollout)
        .await
        .expect("creates the Rollout");
    let message = cluster.invalid_spec().await;
    assert!(
        message.contains("spec.strategy.canary.trafficRouting.plugins.argoproj-labs/gatewayAPI")
            && message.contains("name at least one HTTPRoute"),
        "{message}"
    );
    cluster.assert_nothing_runs().await;
}
