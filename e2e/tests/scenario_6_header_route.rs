//! Scenario 6: a canary step with setHeaderRoute sends only the matching requests to the
//! canary. The canary has one pod (setCanaryScale) and weight 0; the load generator puts the
//! header `X-Canary: always` on a quarter of the requests; so the canary's pods receive exactly
//! that quarter and stable the rest (Prometheus, by pod template hash). After the promotion the
//! route is gone from the router object and the new revision gets every request. Through Istio
//! and through the Gateway API.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use rollouts_e2e::harness::Scenario;
use rollouts_e2e::harness::routers::{
    CANARY_SERVICE, Router, router_object, router_weight, traffic_shares_since,
};

const RPS: &str = "200";
/// The share of requests carrying the header (s6-services.yaml).
const HEADER_SHARE: f64 = 0.25;
/// The managed route of s6-rollout-header-route.yaml and the header it matches.
const ROUTE: &str = "canary-header";
const HEADER: &str = "x-canary";
/// The index of the step that pauses with the header route in place.
const PAUSE_STEP: u64 = 3;
const WINDOW: Duration = Duration::from_secs(3);
/// How far the measured split may be from the header share (each pod is scraped at its own
/// moments within a 100 ms tick of the load generator).
const TOLERANCE: f64 = 0.03;

/// The router object's fixture and the router's entry under `trafficRouting`.
fn router_setup(router: Router) -> (&'static str, &'static str) {
    match router {
        Router::Istio => (
            "s2-istio-virtualservice.yaml",
            "istio: {virtualService: {name: web, routes: [primary]}}",
        ),
        Router::GatewayApi => (
            "s2-gateway-api-httproute.yaml",
            "plugins: {argoproj-labs/gatewayAPI: {httpRoute: web}}",
        ),
        Router::Nginx => panic!("scenario 6 routes by header through Istio or the Gateway API"),
    }
}

fn share_of(shares: &BTreeMap<String, f64>, hash: &str) -> f64 {
    shares.get(hash).copied().unwrap_or(0.0)
}

fn only_matching_requests_reach_the_canary(s: &Scenario, router: Router) {
    let (router_fixture, traffic_routing) = router_setup(router);
    let header_share = HEADER_SHARE.to_string();
    let rollout =
        |version: &'static str| [("VERSION", version), ("TRAFFIC_ROUTING", traffic_routing)];
    let given = s.given();
    given
        .controller_is_running()
        .manifest(
            "s6-services.yaml",
            &[("RPS", RPS), ("HEADER_SHARE", &header_share)],
        )
        .manifest(router_fixture, &[])
        .manifest("s6-rollout-header-route.yaml", &rollout("1"));
    let stable = given.rollout_is_healthy(Duration::from_secs(20));

    s.when()
        .manifest("s6-rollout-header-route.yaml", &rollout("2"));
    let then = s.then();
    let canary = then.new_revision(&stable, Duration::from_secs(10));
    let since = then.eventually(
        &format!(
            "the canary paused at step {PAUSE_STEP} with weight 0 and the {router:?} header \
             route {ROUTE} to {CANARY_SERVICE}"
        ),
        Duration::from_secs(20),
        |t| {
            let rollout = t.rollout();
            let paused = rollout.current_step_index() == Some(PAUSE_STEP)
                && !rollout.pause_reasons().is_empty();
            let object = router_object(s, router).ok()?;
            let routed = router.header_route(&object, ROUTE)
                == Some((HEADER.to_string(), CANARY_SERVICE.to_string()));
            let unweighted = router.canary_weight(&object) == Some(0);
            (paused && routed && unweighted).then(SystemTime::now)
        },
    );
    let shares = traffic_shares_since(s, since, WINDOW, Duration::from_secs(20));
    let to_canary = share_of(&shares, &canary);
    let to_stable = share_of(&shares, &stable);
    then.holds(
        (to_canary - HEADER_SHARE).abs() <= TOLERANCE && (to_canary + to_stable - 1.0).abs() < 1e-9,
        || {
            format!(
                "with only the header route to it, the canary ({canary}) received {:.1}% and \
                 stable ({stable}) {:.1}% of the requests; want the header's share, {}% ± {}%, \
                 to the canary and the rest to stable: {shares:?}",
                to_canary * 100.0,
                to_stable * 100.0,
                HEADER_SHARE * 100.0,
                TOLERANCE * 100.0
            )
        },
    );

    s.when().plugin(["promote", "web"]);
    then.eventually(
        &format!("the promotion: Healthy on the new revision and the header route {ROUTE} removed"),
        Duration::from_secs(20),
        |t| {
            let rollout = t.rollout();
            let promoted = rollout.is_healthy() && rollout.stable_hash() == canary;
            let object = router_object(s, router).ok()?;
            let removed = router.header_route(&object, ROUTE).is_none();
            (promoted && removed).then_some(())
        },
    );
    then.holds(router_weight(s, router) == Some(0), || {
        format!("after the promotion the {router:?} router should give the canary Service weight 0")
    });
    let shares = traffic_shares_since(s, SystemTime::now(), WINDOW, Duration::from_secs(20));
    then.holds((share_of(&shares, &canary) - 1.0).abs() < 1e-9, || {
        format!(
            "after the promotion the new revision ({canary}) should get every request: {shares:?}"
        )
    });
}

#[test]
fn scenario_6_header_route_through_istio() {
    let s = Scenario::on_sim("scenario_6_header_route_through_istio", "web");
    only_matching_requests_reach_the_canary(&s, Router::Istio);
}

#[test]
fn scenario_6_header_route_through_gateway_api() {
    let s = Scenario::on_sim("scenario_6_header_route_through_gateway_api", "web");
    only_matching_requests_reach_the_canary(&s, Router::GatewayApi);
}
