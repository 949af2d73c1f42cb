//! Scenario 2: the basic good canary of scenario 1, routed through nginx Ingress, an Istio
//! VirtualService and a Gateway API HTTPRoute. At each setWeight step the router object
//! carries the weight, the Rollout's status records it verified, and the pods of each revision
//! really receive that share of the requests (Prometheus: the rate of http_requests_total by
//! pod template hash over a window that starts once the weight is in place). After the
//! promotion the new revision gets all the traffic.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use rollouts_e2e::harness::Scenario;
use rollouts_e2e::harness::routers::{
    Router, recorded_weight, router_weight, traffic_shares_since,
};

/// Requests per second into the router.
const RPS: &str = "200";
/// The weight steps of s2-rollout-routed.yaml: (index of the pause that holds it, weight).
const WEIGHT_STEPS: [(u64, i64); 2] = [(1, 20), (3, 50)];
/// The window the traffic split is measured over.
const WINDOW: Duration = Duration::from_secs(3);
/// How far (as a share of all requests) the measured split may be from the weight: the
/// split is counted exactly, but each pod is scraped at its own moments within a 100 ms tick.
const TOLERANCE: f64 = 0.03;

/// The router object's fixture and the Rollout's `trafficRouting`, in YAML flow style.
fn router_setup(router: Router) -> (&'static str, &'static str) {
    match router {
        Router::Nginx => ("s2-nginx-ingress.yaml", "{nginx: {stableIngress: web}}"),
        Router::Istio => (
            "s2-istio-virtualservice.yaml",
            "{istio: {virtualService: {name: web, routes: [primary]}}}",
        ),
        Router::GatewayApi => (
            "s2-gateway-api-httproute.yaml",
            "{plugins: {argoproj-labs/gatewayAPI: {httpRoute: web}}}",
        ),
    }
}

fn share_of(shares: &BTreeMap<String, f64>, hash: &str) -> f64 {
    shares.get(hash).copied().unwrap_or(0.0)
}

fn a_routed_canary_gets_the_weights_it_asks_for(s: &Scenario, router: Router) {
    let (router_fixture, traffic_routing) = router_setup(router);
    let rollout =
        |version: &'static str| [("VERSION", version), ("TRAFFIC_ROUTING", traffic_routing)];
    let given = s.given();
    given
        .controller_is_running()
        .manifest("s2-services.yaml", &[("RPS", RPS)])
        .manifest(router_fixture, &[])
        .manifest("s2-rollout-routed.yaml", &rollout("1"));
    let stable = given.rollout_is_healthy(Duration::from_secs(20));

    s.when().manifest("s2-rollout-routed.yaml", &rollout("2"));
    let then = s.then();
    let canary = then.new_revision(&stable, Duration::from_secs(10));

    for (pause_step, weight) in WEIGHT_STEPS {
        let since = then.eventually(
            &format!(
                "the canary paused at step {pause_step} with weight {weight} in the {router:?} \
                 router object and verified in status"
            ),
            Duration::from_secs(20),
            |t| {
                let rollout = t.rollout();
                let paused = rollout.current_step_index() == Some(pause_step)
                    && !rollout.pause_reasons().is_empty();
                let recorded = recorded_weight(&rollout.0) == Some((weight, true));
                let held = router_weight(s, router) == Some(weight);
                (paused && recorded && held).then(SystemTime::now)
            },
        );
        let shares = traffic_shares_since(s, since, WINDOW, Duration::from_secs(20));
        let to_canary = share_of(&shares, &canary);
        let to_stable = share_of(&shares, &stable);
        let wanted = weight as f64 / 100.0;
        then.holds(
            (to_canary - wanted).abs() <= TOLERANCE && (to_canary + to_stable - 1.0).abs() < 1e-9,
            || {
                format!(
                    "at weight {weight} through {router:?} the canary ({canary}) received {:.1}% \
                     and stable ({stable}) {:.1}% of the requests; want {weight}% ± {}% to the \
                     canary and the rest to stable: {shares:?}",
                    to_canary * 100.0,
                    to_stable * 100.0,
                    TOLERANCE * 100.0
                )
            },
        );
        s.when().plugin(["promote", "web"]);
    }

    then.eventually(
        "the canary to be promoted: stable at the new revision with all 4 pods",
        Duration::from_secs(20),
        |t| {
            let rollout = t.rollout();
            (rollout.is_healthy() && rollout.stable_hash() == canary).then_some(())
        },
    );
    then.eventually(
        &format!(
            "the {router:?} router to give the canary Service weight 0 after the promotion \
             (both Services select the new revision)"
        ),
        Duration::from_secs(10),
        |_| (router_weight(s, router) == Some(0)).then_some(()),
    );
    let shares = traffic_shares_since(s, SystemTime::now(), WINDOW, Duration::from_secs(20));
    then.holds((share_of(&shares, &canary) - 1.0).abs() < 1e-9, || {
        format!(
            "after the promotion the new revision ({canary}) should get every request: {shares:?}"
        )
    });
    then.holds(!then.rollout().aborted(), || {
        "the rollout was aborted".into()
    });
}

#[test]
fn scenario_2_through_nginx() {
    let s = Scenario::on_sim("scenario_2_through_nginx", "web");
    a_routed_canary_gets_the_weights_it_asks_for(&s, Router::Nginx);
}

#[test]
fn scenario_2_through_istio() {
    let s = Scenario::on_sim("scenario_2_through_istio", "web");
    a_routed_canary_gets_the_weights_it_asks_for(&s, Router::Istio);
}

#[test]
fn scenario_2_through_gateway_api() {
    let s = Scenario::on_sim("scenario_2_through_gateway_api", "web");
    a_routed_canary_gets_the_weights_it_asks_for(&s, Router::GatewayApi);
}
