//! Weighted experiment templates through a traffic router, with the real `rollouts-controller`
//! binary on kube-sim (CRDs from crds/yaml and e2e/crds): while the experiment step's Experiment
//! runs, each template with a `weight` gets that share at its own Service (an extra
//! VirtualService destination, an extra HTTPRoute backendRef), the canary keeps its `setWeight`
//! and the stable the rest; once the Experiment ends and the Rollout is promoted, the extra
//! destinations are gone.

mod support;

use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use rollouts_crds::experiment::Experiment;
use rollouts_crds::rollout::Rollout;
use rollouts_e2e::sim::SimOptions;
use serde_json::{Value, json};
use support::{Controller, NAMESPACE, Sim, eventually};

const DEADLINE: Duration = Duration::from_secs(40);

#[derive(Clone, Copy, Debug)]
enum Router {
    Istio,
    GatewayApi,
}

impl Router {
    fn resource(self) -> ApiResource {
        let (group, version, kind, plural) = match self {
            Router::Istio => (
                "networking.istio.io",
                "v1alpha3",
                "VirtualService",
                "virtualservices",
            ),
            Router::GatewayApi => ("gateway.networking.k8s.io", "v1", "HTTPRoute", "httproutes"),
        };
        let gvk = kube::core::GroupVersionKind::gvk(group, version, kind);
        ApiResource::from_gvk_with_plural(&gvk, plural)
    }

    /// The router object, splitting all traffic to the stable Service.
    fn object(self) -> Value {
        match self {
            Router::Istio => json!({
                "apiVersion": "networking.istio.io/v1alpha3", "kind": "VirtualService",
                "metadata": {"name": "shop", "namespace": NAMESPACE},
                "spec": {"hosts": ["shop.example.com"], "http": [{"name": "primary", "route": [
                    {"destination": {"host": "shop-stable"}, "weight": 100},
                    {"destination": {"host": "shop-canary"}, "weight": 0}
                ]}]}
            }),
            Router::GatewayApi => json!({
                "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                "metadata": {"name": "shop", "namespace": NAMESPACE},
                "spec": {"parentRefs": [{"name": "public"}], "rules": [{
                    "name": "main",
                    "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                    "backendRefs": [
                        {"name": "shop-stable", "port": 80, "weight": 100},
                        {"name": "shop-canary", "port": 80, "weight": 0}
                    ]
                }]}
            }),
        }
    }

    fn traffic_routing(self) -> Value {
        match self {
            Router::Istio => {
                json!({"istio": {"virtualService": {"name": "shop", "routes": ["primary"]}}})
            }
            Router::GatewayApi => {
                json!({"plugins": {"argoproj-labs/gatewayAPI": {"httpRoute": "shop"}}})
            }
        }
    }

    /// Each destination's Service and weight, as the router object holds them, sorted.
    fn split(self, object: &Value) -> Vec<(String, i64)> {
        let entries: Vec<&Value> = match self {
            Router::Istio => object["spec"]["http"][0]["route"]
                .as_array()
                .map(|route| route.iter().collect())
                .unwrap_or_default(),
            Router::GatewayApi => object["spec"]["rules"][0]["backendRefs"]
                .as_array()
                .map(|refs| refs.iter().collect())
                .unwrap_or_default(),
        };
        let mut split: Vec<(String, i64)> = entries
            .into_iter()
            .map(|entry| {
                let service = match self {
                    Router::Istio => &entry["destination"]["host"],
                    Router::GatewayApi => &entry["name"],
                };
                (
                    service.as_str().unwrap_or_default().to_string(),
                    entry["weight"].as_i64().unwrap_or(0),
                )
            })
            .collect();
        split.sort();
        split
    }
}

async fn create(sim: &Sim, resource: &ApiResource, object: Value) {
    let object: DynamicObject = serde_json::from_value(object).expect("an object");
    Api::<DynamicObject>::namespaced_with(sim.client.clone(), NAMESPACE, resource)
        .create(&PostParams::default(), &object)
        .await
        .expect("creates the object");
}

async fn weighted_templates_through(router: Router, name: &str) {
    let root = support::workspace_root();
    let sim = Sim::start_with(
        "rollouts-experiment-weights",
        name,
        SimOptions {
            crd_dirs: vec![root.join("crds/yaml"), root.join("e2e/crds")],
            pod_ready_after: Duration::from_millis(200),
            metrics_listen: None,
            ..SimOptions::default()
        },
    );
    let services = ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&());
    for service in ["shop-stable", "shop-canary"] {
        create(
            &sim,
            &services,
            json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": service, "namespace": NAMESPACE},
                "spec": {"selector": {"app": "shop"}, "ports": [{"port": 80, "targetPort": 8080}]}}),
        )
        .await;
    }
    let resource = router.resource();
    create(&sim, &resource, router.object()).await;
    let template = |name: &str| {
        json!({"name": name, "specRef": if name == "baseline" { "stable" } else { "canary" },
            "replicas": 1, "weight": 10, "metadata": {"labels": {"role": name}}})
    };
    let rollout: Rollout = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": "shop", "namespace": NAMESPACE},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "shop"}},
            "template": {
                "metadata": {"labels": {"app": "shop"}},
                "spec": {"containers": [{"name": "app", "image": "app:v1",
                    "ports": [{"name": "http", "containerPort": 8080}]}]}
            },
            "strategy": {"canary": {
                "stableService": "shop-stable",
                "canaryService": "shop-canary",
                "scaleDownDelaySeconds": 1,
                "trafficRouting": router.traffic_routing(),
                "steps": [
                    {"setWeight": 20},
                    {"experiment": {"duration": "1h",
                        "templates": [template("baseline"), template("canary")]}}
                ]
            }}
        }
    }))
    .expect("a valid Rollout");
    let controller = Controller::start(&sim.kubeconfig, DEADLINE);
    sim.create_rollout(rollout).await;
    sim.wait_healthy(DEADLINE, "shop", 2).await;
    // The whole container: a merge patch replaces the list, ports and all.
    let v2 = json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "image": "app:v2",
        "ports": [{"name": "http", "containerPort": 8080}]}]}}}});
    sim.rollouts()
        .patch("shop", &PatchParams::default(), &Patch::Merge(&v2))
        .await
        .expect("a new image");

    let objects = Api::<DynamicObject>::namespaced_with(sim.client.clone(), NAMESPACE, &resource);
    let read_split = || async {
        let object = objects.get("shop").await.expect("reads the router object");
        router.split(&serde_json::to_value(object).expect("JSON"))
    };
    let experiment = eventually(DEADLINE, "the experiment step's Experiment", || async {
        let current = sim.status("shop").await.canary.current_experiment;
        (!current.is_empty()).then_some(current)
    })
    .await;
    let want = vec![
        (format!("{experiment}-baseline"), 10),
        (format!("{experiment}-canary"), 10),
        ("shop-canary".to_string(), 20),
        ("shop-stable".to_string(), 60),
    ];
    let mut want_sorted = want.clone();
    want_sorted.sort();
    let recorded_want = vec![
        (format!("{experiment}-baseline"), 10),
        (format!("{experiment}-canary"), 10),
    ];
    let seen = std::sync::Mutex::new(String::new());
    support::eventually_with_log(
        DEADLINE,
        Duration::from_millis(50),
        &format!(
            "{router:?}: 10% to each experiment template's Service, recorded in \
             status.canary.weights.additional"
        ),
        || seen.lock().map(|seen| seen.clone()).unwrap_or_default(),
        || async {
            let split = read_split().await;
            let status = sim.status("shop").await;
            let recorded: Vec<(String, i32)> = status
                .canary
                .weights
                .iter()
                .flat_map(|weights| &weights.additional)
                .map(|d| (d.service_name.clone(), d.weight))
                .collect();
            let experiment = Api::<Experiment>::namespaced(sim.client.clone(), NAMESPACE)
                .get(&experiment)
                .await
                .ok()
                .map(|ex| (ex.spec.templates, ex.status));
            if let Ok(mut seen) = seen.lock() {
                *seen = format!(
                    "\nsplit: {split:?}\nweights: {:?}\nexperiment: {experiment:?}",
                    status.canary.weights
                );
            }
            (split == want_sorted && recorded == recorded_want).then_some(())
        },
    )
    .await;

    // `kubectl rollouts terminate experiment`: the Experiment ends Successful, the step
    // completes, the Rollout is promoted and the experiment Services lose their share.
    Api::<Experiment>::namespaced(sim.client.clone(), NAMESPACE)
        .patch(
            &experiment,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"terminate": true}})),
        )
        .await
        .expect("terminates the Experiment");
    sim.wait_healthy(DEADLINE, "shop", 2).await;
    eventually(
        DEADLINE,
        &format!("{router:?}: all traffic to the stable, the experiment destinations gone"),
        || async {
            let split = read_split().await;
            (split
                == vec![
                    ("shop-canary".to_string(), 0),
                    ("shop-stable".to_string(), 100),
                ])
            .then_some(())
        },
    )
    .await;
    eventually(DEADLINE, "no experiment weight recorded", || async {
        let status = sim.status("shop").await;
        status
            .canary
            .weights
            .is_none_or(|weights| weights.additional.is_empty())
            .then_some(())
    })
    .await;
    drop(controller);
}

#[tokio::test]
async fn istio_sends_each_weighted_experiment_template_its_share() {
    weighted_templates_through(Router::Istio, "istio").await;
}

#[tokio::test]
async fn gateway_api_sends_each_weighted_experiment_template_its_share() {
    weighted_templates_through(Router::GatewayApi, "gateway-api").await;
}
