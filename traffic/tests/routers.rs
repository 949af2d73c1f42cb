//! Which routers a Rollout gets, which configurations are refused, and which Services a router
//! splits between (ping-pong included).

mod common;

use common::rollout;
use rollouts_crds::rollout::{AlbTrafficRouting, PingPongSpec, Rollout, RolloutStatus};
use rollouts_traffic::{
    Error, RolloutServices, RouterKind, managed_route_names, rollout_services, routers,
};
use serde_json::json;

fn offline_client() -> kube::Client {
    // Nothing is sent: building routers only reads the Rollout.
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    kube::Client::try_from(config).unwrap()
}

fn kinds(rollout: &Rollout) -> Vec<RouterKind> {
    routers(offline_client(), rollout)
        .unwrap()
        .iter()
        .map(|r| r.kind())
        .collect()
}

#[tokio::test]
async fn each_configured_router_is_built() {
    assert_eq!(
        kinds(&rollout("nginx/rollout.yaml")),
        vec![RouterKind::Nginx]
    );
    assert_eq!(
        kinds(&rollout("istio/rollout-host.yaml")),
        vec![RouterKind::Istio]
    );
    assert_eq!(
        kinds(&rollout("istio/rollout-subset.yaml")),
        vec![RouterKind::Istio]
    );
    assert_eq!(
        kinds(&rollout("gatewayapi/rollout.yaml")),
        vec![RouterKind::GatewayApi]
    );
    assert_eq!(RouterKind::GatewayApi.to_string(), "GatewayAPI");
}

#[tokio::test]
async fn routers_this_controller_lacks_are_refused_by_field() {
    let mut alb = rollout("nginx/rollout.yaml");
    alb.spec
        .strategy
        .canary
        .as_mut()
        .unwrap()
        .traffic_routing
        .as_mut()
        .unwrap()
        .alb = Some(AlbTrafficRouting::default());
    let err = routers(offline_client(), &alb).err().unwrap();
    assert!(matches!(err, Error::InvalidSpec { .. }), "{err}");
    assert!(err.to_string().contains("trafficRouting.alb"), "{err}");

    let mut plugin = rollout("gatewayapi/rollout.yaml");
    let routing = plugin
        .spec
        .strategy
        .canary
        .as_mut()
        .unwrap()
        .traffic_routing
        .as_mut()
        .unwrap();
    routing
        .plugins
        .as_mut()
        .unwrap()
        .insert("example.com/other".into(), json!({}));
    let err = routers(offline_client(), &plugin).err().unwrap();
    assert!(
        err.to_string().contains("plugins.example.com/other"),
        "{err}"
    );
}

#[test]
fn host_level_routing_needs_both_services() {
    let mut rollout = rollout("nginx/rollout.yaml");
    rollout
        .spec
        .strategy
        .canary
        .as_mut()
        .unwrap()
        .canary_service = None;
    let err = rollout_services(&rollout).unwrap_err();
    assert!(err.to_string().contains("Rollout apps/shop"), "{err}");
    assert!(err.to_string().contains("canaryService"), "{err}");
}

#[test]
fn ping_pong_services_swap_roles_with_the_status() {
    let mut rollout = rollout("nginx/rollout.yaml");
    let canary = rollout.spec.strategy.canary.as_mut().unwrap();
    canary.stable_service = None;
    canary.canary_service = None;
    canary.ping_pong = Some(PingPongSpec {
        ping_service: "shop-ping".into(),
        pong_service: "shop-pong".into(),
    });
    let services = |stable: &str, canary: &str| RolloutServices {
        stable: stable.into(),
        canary: canary.into(),
    };
    assert_eq!(
        rollout_services(&rollout).unwrap(),
        services("shop-pong", "shop-ping")
    );
    let mut status = RolloutStatus::default();
    status.canary.stable_ping_pong = "ping".into();
    rollout.status = Some(status);
    assert_eq!(
        rollout_services(&rollout).unwrap(),
        services("shop-ping", "shop-pong")
    );
}

#[test]
fn managed_route_names_include_the_steps_routes() {
    let mut rollout = rollout("istio/rollout-host.yaml");
    assert_eq!(
        managed_route_names(&rollout),
        vec!["beta-header", "mirror-all"]
    );
    rollout
        .spec
        .strategy
        .canary
        .as_mut()
        .unwrap()
        .traffic_routing
        .as_mut()
        .unwrap()
        .managed_routes = None;
    assert_eq!(
        managed_route_names(&rollout),
        vec!["mirror-all", "beta-header"]
    );
}
