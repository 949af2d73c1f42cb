//! Gateway API router transforms on YAML fixtures: backendRef weights, header and mirror rules
//! added and removed, the in-progress label, verification against the route's status, and fields
//! newer than the typed Gateway API model kept.

mod common;

use common::{object, rollout};
use gateway_api::apis::standard::httproutes::HttpRoute;
use rollouts_crds::rollout::{
    Rollout, RolloutStatus, RouteMatch, SetHeaderRoute, SetMirrorRoute, StringMatch,
    TrafficWeights, WeightDestination,
};
use rollouts_traffic::Error;
use rollouts_traffic::gatewayapi::{
    ExperimentBackend, GatewayApiConfig, HttpRouteRef, desired_http_route, verify_weight,
    with_header_route, with_mirror_route, without_managed_routes,
};
use serde_json::{Value, json};

const LABEL: &str = "rollouts.argoproj.io/gatewayapi-canary";

fn web() -> Rollout {
    rollout("gatewayapi/rollout.yaml")
}

fn config(rollout: &Rollout) -> GatewayApiConfig {
    GatewayApiConfig::of(rollout).unwrap()
}

fn route_ref(rollout: &Rollout) -> HttpRouteRef {
    config(rollout).routes().remove(0)
}

fn set_config(rollout: &mut Rollout, config: Value) {
    let routing = rollout
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
        .insert("argoproj-labs/gatewayAPI".into(), config);
}

fn header_step(rollout: &Rollout) -> SetHeaderRoute {
    rollout
        .canary()
        .unwrap()
        .steps()
        .iter()
        .find_map(|s| s.set_header_route.clone())
        .unwrap()
}

fn mirror_step(rollout: &Rollout) -> SetMirrorRoute {
    rollout
        .canary()
        .unwrap()
        .steps()
        .iter()
        .find_map(|s| s.set_mirror_route.clone())
        .unwrap()
}

fn weighted(weight: i32) -> Value {
    let rollout = web();
    desired_http_route(
        &object("gatewayapi/httproute.yaml"),
        &rollout,
        &config(&rollout),
        &route_ref(&rollout),
        weight,
        &[],
    )
    .unwrap()
}

/// (service, weight) of the backendRefs of the rule named `name`.
fn backend_weights(route: &Value, name: &str) -> Vec<(String, i64)> {
    let rule = route["spec"]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap();
    rule["backendRefs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["name"].as_str().unwrap().to_string(),
                b["weight"].as_i64().unwrap_or(-1),
            )
        })
        .collect()
}

fn rule_names(route: &Value) -> Vec<&str> {
    route["spec"]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect()
}

#[test]
fn weights_are_set_on_every_rule_with_the_services() {
    let rollout = web();
    let found = object("gatewayapi/httproute.yaml");
    for weight in [0, 5, 33, 100] {
        let desired = weighted(weight);
        let expected = |stable: &str, canary: &str| {
            vec![
                (stable.to_string(), i64::from(100 - weight)),
                (canary.to_string(), i64::from(weight)),
            ]
        };
        assert_eq!(
            backend_weights(&desired, "main"),
            expected("web-stable", "web-canary")
        );
        assert_eq!(
            backend_weights(&desired, "api"),
            expected("web-stable", "web-canary")
        );
        assert_eq!(
            desired["spec"]["rules"][2], found["spec"]["rules"][2],
            "the docs rule is untouched"
        );
        assert!(verify_weight(&desired, &rollout, &route_ref(&rollout), weight, &[]).unwrap());
        assert!(!verify_weight(&desired, &rollout, &route_ref(&rollout), weight + 1, &[]).unwrap());
        assert_eq!(desired["spec"]["parentRefs"], found["spec"]["parentRefs"]);
        assert_eq!(desired["status"], found["status"]);
    }
}

#[test]
fn fields_newer_than_the_typed_model_survive() {
    let desired = weighted(33);
    assert_eq!(
        desired["spec"]["rules"][0]["sessionPersistence"],
        json!({"sessionName": "web", "type": "Cookie"})
    );
    assert_eq!(desired["spec"]["rules"][0]["retry"], json!({"attempts": 2}));
    // The typed model reads the route, but a round trip through it would drop those fields.
    let typed: HttpRoute = serde_json::from_value(desired.clone()).unwrap();
    let round_trip = serde_json::to_value(&typed).unwrap();
    assert!(
        round_trip["spec"]["rules"][0]
            .get("sessionPersistence")
            .is_none()
    );
}

#[test]
fn the_in_progress_label_follows_the_weight() {
    assert_eq!(weighted(5)["metadata"]["labels"][LABEL], "in-progress");
    assert_eq!(weighted(5)["metadata"]["labels"]["team"], "web");
    let back_to_zero = {
        let rollout = web();
        desired_http_route(
            &weighted(5),
            &rollout,
            &config(&rollout),
            &route_ref(&rollout),
            0,
            &[],
        )
        .unwrap()
    };
    assert!(back_to_zero["metadata"]["labels"].get(LABEL).is_none());
    assert_eq!(back_to_zero["metadata"]["labels"]["team"], "web");

    let mut rollout = web();
    set_config(
        &mut rollout,
        json!({"httpRoute": "web", "disableInProgressLabel": true}),
    );
    let desired = desired_http_route(
        &object("gatewayapi/httproute.yaml"),
        &rollout,
        &config(&rollout),
        &route_ref(&rollout),
        5,
        &[],
    )
    .unwrap();
    assert!(desired["metadata"]["labels"].get(LABEL).is_none());
}

#[test]
fn named_rules_limit_the_weighting() {
    let mut rollout = web();
    set_config(
        &mut rollout,
        json!({"httpRoutes": [{"name": "web", "rules": ["main"]}], "namespace": "gw"}),
    );
    let desired = desired_http_route(
        &object("gatewayapi/httproute.yaml"),
        &rollout,
        &config(&rollout),
        &route_ref(&rollout),
        5,
        &[],
    )
    .unwrap();
    assert_eq!(
        backend_weights(&desired, "main"),
        vec![("web-stable".into(), 95), ("web-canary".into(), 5)]
    );
    assert_eq!(
        backend_weights(&desired, "api"),
        vec![("web-stable".into(), 100), ("web-canary".into(), 0)]
    );
}

#[test]
fn header_route_matches_the_expected_object_and_is_idempotent() {
    let rollout = web();
    let reference = route_ref(&rollout);
    let with_header =
        with_header_route(&weighted(33), &rollout, &reference, &header_step(&rollout)).unwrap();
    assert_eq!(with_header, object("gatewayapi/httproute-33-header.yaml"));
    assert_eq!(
        with_header_route(&with_header, &rollout, &reference, &header_step(&rollout)).unwrap(),
        with_header
    );
    // Weighting again leaves the header rules (canary only) alone, and verification ignores them.
    let again = desired_http_route(
        &with_header,
        &rollout,
        &config(&rollout),
        &reference,
        33,
        &[],
    )
    .unwrap();
    assert_eq!(again, with_header);
    assert!(verify_weight(&with_header, &rollout, &reference, 33, &[]).unwrap());
    let _typed: HttpRoute = serde_json::from_value(with_header).unwrap();
}

#[test]
fn header_routes_skip_routes_that_do_not_take_them() {
    let mut rollout = web();
    set_config(&mut rollout, json!({"httpRoutes": [{"name": "web"}]}));
    let reference = route_ref(&rollout);
    let found = weighted(33);
    assert_eq!(
        with_header_route(&found, &rollout, &reference, &header_step(&rollout)).unwrap(),
        found
    );
}

#[test]
fn mirror_route_adds_a_request_mirror_within_each_rule() {
    let rollout = web();
    let reference = route_ref(&rollout);
    let desired =
        with_mirror_route(&weighted(33), &rollout, &reference, &mirror_step(&rollout)).unwrap();
    assert_eq!(
        rule_names(&desired),
        vec!["shadow", "shadow-1", "main", "api", "docs"]
    );
    let shadow = &desired["spec"]["rules"][0];
    assert_eq!(
        shadow["matches"],
        json!([{"path": {"type": "PathPrefix", "value": "/api/v2"}, "method": "GET"}])
    );
    assert_eq!(
        shadow["backendRefs"],
        weighted(33)["spec"]["rules"][0]["backendRefs"]
    );
    assert_eq!(
        shadow["filters"][1],
        json!({"type": "RequestMirror", "requestMirror": {
            "backendRef": {"group": "", "kind": "Service", "name": "web-canary", "port": 80},
            "percent": 35}})
    );
    let shadow_api = &desired["spec"]["rules"][1];
    assert_eq!(
        shadow_api["matches"],
        json!([{"path": {"type": "PathPrefix", "value": "/api/v2"}, "headers": [{"name": "x-api", "value": "v2"}], "method": "GET"}])
    );
    // Mirror rules keep following the weights.
    let moved =
        desired_http_route(&desired, &rollout, &config(&rollout), &reference, 50, &[]).unwrap();
    assert_eq!(
        backend_weights(&moved, "shadow"),
        vec![("web-stable".into(), 50), ("web-canary".into(), 50)]
    );
    assert_eq!(
        with_mirror_route(&desired, &rollout, &reference, &mirror_step(&rollout)).unwrap(),
        desired
    );
    let typed: HttpRoute = serde_json::from_value(desired).unwrap();
    assert_eq!(typed.spec.rules.unwrap().len(), 5);
}

#[test]
fn a_mirror_outside_the_rule_path_is_refused() {
    let rollout = web();
    let step = SetMirrorRoute {
        name: "shadow".into(),
        match_: Some(vec![RouteMatch {
            path: Some(StringMatch {
                exact: Some("/other".into()),
                ..StringMatch::default()
            }),
            ..RouteMatch::default()
        }]),
        percentage: None,
    };
    let err = with_mirror_route(&weighted(5), &rollout, &route_ref(&rollout), &step).unwrap_err();
    assert!(matches!(err, Error::InvalidSpec { .. }), "{err}");
    assert!(
        err.to_string().contains("setMirrorRoute.match[0].path"),
        "{err}"
    );
}

#[test]
fn managed_rules_are_removed_by_name_and_all_at_once() {
    let rollout = web();
    let reference = route_ref(&rollout);
    let with_header = object("gatewayapi/httproute-33-header.yaml");
    let both =
        with_mirror_route(&with_header, &rollout, &reference, &mirror_step(&rollout)).unwrap();
    assert_eq!(
        rule_names(&both),
        vec![
            "beta", "beta-1", "shadow", "shadow-1", "main", "api", "docs"
        ]
    );

    let mut removal = header_step(&rollout);
    removal.match_ = None;
    let no_header = with_header_route(&both, &rollout, &reference, &removal).unwrap();
    assert_eq!(
        rule_names(&no_header),
        vec!["shadow", "shadow-1", "main", "api", "docs"]
    );

    let none = without_managed_routes(&both, &rollout);
    assert_eq!(rule_names(&none), vec!["main", "api", "docs"]);
    assert_eq!(none["spec"], weighted(33)["spec"]);
    assert_eq!(without_managed_routes(&none, &rollout), none);
}

#[test]
fn verification_waits_for_the_gateway_to_accept_the_generation() {
    let rollout = web();
    let reference = route_ref(&rollout);
    let mut route = weighted(5);
    route["metadata"]["generation"] = json!(3);
    assert!(
        !verify_weight(&route, &rollout, &reference, 5, &[]).unwrap(),
        "status is for generation 2"
    );
    route["status"]["parents"][0]["conditions"][0]["observedGeneration"] = json!(3);
    assert!(verify_weight(&route, &rollout, &reference, 5, &[]).unwrap());
    route["status"]["parents"][0]["conditions"][0]["status"] = json!("False");
    assert!(!verify_weight(&route, &rollout, &reference, 5, &[]).unwrap());
}

#[test]
fn a_route_without_the_canary_backend_is_an_error_naming_it() {
    let rollout = web();
    let mut found = object("gatewayapi/httproute.yaml");
    for rule in found["spec"]["rules"].as_array_mut().unwrap() {
        rule["backendRefs"]
            .as_array_mut()
            .unwrap()
            .retain(|b| b["name"] != "web-canary");
    }
    let err = desired_http_route(
        &found,
        &rollout,
        &config(&rollout),
        &route_ref(&rollout),
        5,
        &[],
    )
    .unwrap_err();
    assert!(err.to_string().contains("HTTPRoute gw/web"), "{err}");
    assert!(err.to_string().contains("web-canary"), "{err}");
}

#[test]
fn configuration_this_router_does_not_implement_is_refused() {
    let mut rollout = web();
    set_config(&mut rollout, json!({"grpcRoute": "web"}));
    let err = GatewayApiConfig::of(&rollout).unwrap_err();
    assert!(
        err.to_string()
            .contains("plugins.argoproj-labs/gatewayAPI.grpcRoute"),
        "{err}"
    );
}

#[test]
fn experiment_backends_are_added_weighted_and_removed_when_finished() {
    let mut rollout = web();
    let reference = route_ref(&rollout);
    let experiment = [ExperimentBackend {
        service_name: "web-exp".into(),
        weight: 10,
        port: 8080,
    }];
    let found = object("gatewayapi/httproute.yaml");
    let desired = desired_http_route(
        &found,
        &rollout,
        &config(&rollout),
        &reference,
        20,
        &experiment,
    )
    .unwrap();
    assert_eq!(
        backend_weights(&desired, "main"),
        vec![
            ("web-stable".into(), 70),
            ("web-canary".into(), 20),
            ("web-exp".into(), 10)
        ]
    );
    let added = desired["spec"]["rules"][0]["backendRefs"][2].clone();
    assert_eq!(
        added,
        json!({"group": "", "kind": "Service", "name": "web-exp", "port": 8080, "weight": 10, "namespace": "apps"}),
        "the experiment Service lives in the Rollout's namespace, not the route's"
    );
    assert_eq!(backend_weights(&desired, "docs"), vec![("docs".into(), -1)]);
    assert!(verify_weight(&desired, &rollout, &reference, 20, &experiment).unwrap());
    assert_eq!(
        desired_http_route(
            &desired,
            &rollout,
            &config(&rollout),
            &reference,
            20,
            &experiment
        )
        .unwrap(),
        desired
    );

    // Once the experiment is over, only the Services it added last time are removed.
    let mut status = RolloutStatus::default();
    status.canary.weights = Some(TrafficWeights {
        additional: vec![WeightDestination {
            weight: 10,
            service_name: "web-exp".into(),
            pod_template_hash: "e1".into(),
        }],
        ..TrafficWeights::default()
    });
    rollout.status = Some(status);
    let finished =
        desired_http_route(&desired, &rollout, &config(&rollout), &reference, 20, &[]).unwrap();
    assert_eq!(
        backend_weights(&finished, "main"),
        vec![("web-stable".into(), 80), ("web-canary".into(), 20)]
    );
    assert_eq!(finished["spec"], weighted(20)["spec"]);
}

#[test]
fn a_rule_that_already_tests_the_header_gets_no_header_rule() {
    let rollout = web();
    let mut found = weighted(33);
    // The api rule matches on x-beta already: our condition would be ignored there.
    found["spec"]["rules"][1]["matches"][0]["headers"] = json!([{"name": "X-Beta", "value": "no"}]);
    let desired = with_header_route(
        &found,
        &rollout,
        &route_ref(&rollout),
        &header_step(&rollout),
    )
    .unwrap();
    assert_eq!(rule_names(&desired), vec!["beta", "main", "api", "docs"]);
}
