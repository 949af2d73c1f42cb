//! The real `rollouts-controller` binary against kube-sim (in-process): two Rollouts naming
//! the same Service. The second is refused with `InvalidSpec` naming the first, as Argo does;
//! the first rolls out undisturbed; nothing flaps (the Service is written once per revision of
//! the first, the second's status is written once); once the first is deleted the second
//! proceeds, and the first's metric series leave `/metrics`. The same for a Rollout that stops
//! naming the Service, and for two Rollouts on one nginx stable Ingress.

mod support;

use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use rollouts_crds::rollout::Rollout;
use serde_json::json;
use support::{Controller, NAMESPACE, Sim, eventually, http_get};

const DEADLINE: Duration = Duration::from_secs(30);
const CONTROLLER_AGENT: &str = "rollouts-controller/";
const MANAGED_BY: &str = "argo-rollouts.argoproj.io/managed-by-rollouts";
const HASH_LABEL: &str = "rollouts-pod-template-hash";

/// A basic canary of 2 pods labelled `app: web` whose stable Service is `web`.
fn rollout(name: &str, image: &str) -> Rollout {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "app", "image": image}]}
            },
            "strategy": {"canary": {
                "stableService": "web",
                "steps": [{"setWeight": 50}, {"pause": {"duration": "1s"}}]
            }}
        }
    }))
    .expect("a valid Rollout")
}

/// The `InvalidSpec` condition's message, when there is one.
async fn invalid_spec(sim: &Sim, name: &str) -> Option<String> {
    sim.status(name)
        .await
        .conditions
        .iter()
        .find(|c| c.type_ == "InvalidSpec")
        .map(|c| c.message.clone())
}

/// Service `web`'s hash selector and managed-by annotation.
async fn service_owner(sim: &Sim) -> (Option<String>, Option<String>) {
    let service = sim.services().get("web").await.expect("reads Service web");
    let hash = service
        .spec
        .as_ref()
        .and_then(|spec| spec.selector.as_ref())
        .and_then(|selector| selector.get(HASH_LABEL).cloned());
    (hash, service.annotations().get(MANAGED_BY).cloned())
}

/// The controller's patches of Service `web`.
fn service_patches(sim: &Sim) -> usize {
    sim.sim
        .requests()
        .iter()
        .filter(|r| r.user_agent.starts_with(CONTROLLER_AGENT))
        .filter(|r| r.verb == "patch" && r.resource == "services" && r.name == "web")
        .count()
}

/// The controller's writes to Rollout `name`'s status.
fn status_writes(sim: &Sim, name: &str) -> usize {
    sim.sim
        .requests()
        .iter()
        .filter(|r| r.user_agent.starts_with(CONTROLLER_AGENT))
        .filter(|r| r.resource == "rollouts" && r.subresource == "status" && r.name == name)
        .filter(|r| matches!(r.verb.as_str(), "patch" | "update"))
        .count()
}

#[tokio::test]
async fn the_second_rollout_on_a_service_is_refused_until_the_first_is_deleted() {
    let sim = Sim::start_named("rollouts-shared-service-on-sim", "two");
    let controller = Controller::start(&sim.kubeconfig, DEADLINE);
    sim.create_service("web", "web").await;
    sim.create_rollout(rollout("first", "app:v1")).await;
    let v1 = sim
        .wait_healthy(DEADLINE, "first", 2)
        .await
        .current_pod_hash;
    assert_eq!(
        service_owner(&sim).await,
        (Some(v1.clone()), Some("first".to_string()))
    );

    // Given a second Rollout naming the same Service,
    sim.create_rollout(rollout("second", "app:other")).await;
    // then it is refused, naming the first, and nothing of it runs.
    let message = eventually(DEADLINE, "second refused", || invalid_spec(&sim, "second")).await;
    assert!(
        message.contains(r#"spec.strategy.canary.stableService: Service "web" is managed by another Rollout, "first""#),
        "{message}"
    );
    assert_eq!(sim.status("second").await.phase, "Degraded");
    let refused = sim
        .rollouts()
        .get("second")
        .await
        .expect("reads second")
        .resource_version();
    let refused_writes = status_writes(&sim, "second");

    // When the first rolls out a new version, it does so undisturbed,
    sim.set_image("first", "app:v2").await;
    let v2 = eventually(DEADLINE, "first on v2", || async {
        let status = sim.status("first").await;
        let done = status.phase == "Healthy"
            && status.current_pod_hash != v1
            && status.stable_rs == status.current_pod_hash
            && status.available_replicas == 2;
        done.then_some(status.current_pod_hash)
    })
    .await;
    assert_eq!(
        service_owner(&sim).await,
        (Some(v2.clone()), Some("first".to_string()))
    );
    // and nothing flaps: the Service was pointed once per revision, the second's status was
    // written once and not again.
    assert_eq!(service_patches(&sim), 2, "{:?}", sim.sim.requests());
    assert_eq!(
        sim.rollouts()
            .get("second")
            .await
            .expect("reads second")
            .resource_version(),
        refused
    );
    assert_eq!(status_writes(&sim, "second"), refused_writes);
    assert!(sim.owned_replica_sets("second").await.is_empty());
    let addr = controller.metrics_addr().await;
    let first_series = r#"rollout_reconcile_count{namespace="default",name="first"}"#;
    assert!(http_get(addr, "/metrics").await.contains(first_series));

    // When the first is deleted,
    sim.rollouts()
        .delete("first", &DeleteParams::default())
        .await
        .expect("deletes first");
    // then the second proceeds and takes the Service over,
    let second = sim.wait_healthy(DEADLINE, "second", 2).await;
    assert_eq!(invalid_spec(&sim, "second").await, None);
    eventually(DEADLINE, "Service web pointed at second", || async {
        let owner = service_owner(&sim).await;
        (owner
            == (
                Some(second.current_pod_hash.clone()),
                Some("second".to_string()),
            ))
            .then_some(())
    })
    .await;
    // and the first's metric series are gone from /metrics.
    eventually(DEADLINE, "the first's series removed", || async {
        let metrics = http_get(addr, "/metrics").await;
        (!metrics.contains(r#"name="first""#) && metrics.contains(r#"name="second""#)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_rollout_that_stops_naming_the_service_frees_it_at_once() {
    let sim = Sim::start_named("rollouts-shared-service-on-sim", "moved");
    let _controller = Controller::start(&sim.kubeconfig, DEADLINE);
    sim.create_service("web", "web").await;
    sim.create_service("web-old", "web").await;
    sim.create_rollout(rollout("first", "app:v1")).await;
    sim.wait_healthy(DEADLINE, "first", 2).await;
    sim.create_rollout(rollout("second", "app:other")).await;
    eventually(DEADLINE, "second refused", || invalid_spec(&sim, "second")).await;

    // When the first names another Service instead,
    let api: Api<Rollout> = sim.rollouts();
    let mut first = api.get("first").await.expect("reads first");
    if let Some(canary) = first.spec.strategy.canary.as_mut() {
        canary.stable_service = Some("web-old".into());
    }
    api.replace("first", &PostParams::default(), &first)
        .await
        .expect("moves first to web-old");
    // then the second proceeds.
    let second = sim.wait_healthy(DEADLINE, "second", 2).await;
    eventually(DEADLINE, "Service web pointed at second", || async {
        let owner = service_owner(&sim).await;
        (owner
            == (
                Some(second.current_pod_hash.clone()),
                Some("second".to_string()),
            ))
            .then_some(())
    })
    .await;
}

/// A canary of 2 pods labelled `app: <name>` behind Services `<name>-stable` and
/// `<name>-canary`, routed through the nginx Ingress `shop`.
fn routed_rollout(name: &str) -> Rollout {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "app:v1"}]}
            },
            "strategy": {"canary": {
                "stableService": format!("{name}-stable"),
                "canaryService": format!("{name}-canary"),
                "trafficRouting": {"nginx": {"stableIngress": "shop"}},
                "steps": [{"setWeight": 50}, {"pause": {"duration": "1s"}}]
            }}
        }
    }))
    .expect("a valid Rollout")
}

#[tokio::test]
async fn the_second_rollout_on_an_ingress_is_refused_until_the_first_is_deleted() {
    let sim = Sim::start_named("rollouts-shared-service-on-sim", "ingress");
    let _controller = Controller::start(&sim.kubeconfig, DEADLINE);
    for name in ["first", "second"] {
        sim.create_service(&format!("{name}-stable"), name).await;
        sim.create_service(&format!("{name}-canary"), name).await;
    }
    let path = |service: &str, prefix: &str| {
        json!({"path": prefix, "pathType": "Prefix",
            "backend": {"service": {"name": service, "port": {"number": 80}}}})
    };
    let ingress: k8s_openapi::api::networking::v1::Ingress = serde_json::from_value(json!({
        "metadata": {"name": "shop", "namespace": NAMESPACE},
        "spec": {"rules": [{"host": "shop.example.com", "http": {"paths": [
            path("first-stable", "/first"), path("second-stable", "/second")
        ]}}]}
    }))
    .expect("an Ingress");
    Api::<k8s_openapi::api::networking::v1::Ingress>::namespaced(sim.client.clone(), NAMESPACE)
        .create(&PostParams::default(), &ingress)
        .await
        .expect("creates Ingress shop");
    sim.create_rollout(routed_rollout("first")).await;
    sim.wait_healthy(DEADLINE, "first", 2).await;

    sim.create_rollout(routed_rollout("second")).await;
    let message = eventually(DEADLINE, "second refused", || invalid_spec(&sim, "second")).await;
    assert!(
        message.contains(r#"spec.strategy.canary.trafficRouting.nginx.stableIngress: Ingress "shop" is managed by another Rollout, "first""#),
        "{message}"
    );
    assert!(sim.owned_replica_sets("second").await.is_empty());

    sim.rollouts()
        .delete("first", &DeleteParams::default())
        .await
        .expect("deletes first");
    sim.wait_healthy(DEADLINE, "second", 2).await;
    assert_eq!(invalid_spec(&sim, "second").await, None);
}
