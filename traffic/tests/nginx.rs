//! nginx router transforms on YAML fixtures: the canary Ingress wanted for each weight and header
//! route, read back, compared with what the cluster holds, and refused when someone else owns it.

mod common;

use common::{object, rollout};
use k8s_openapi::api::networking::v1::Ingress;
use rollouts_crds::rollout::{HeaderRoutingMatch, Rollout, SetHeaderRoute, StringMatch};
use rollouts_traffic::nginx::{
    NginxHeaderRoute, NginxHeaderValue, canary_ingress_name, canary_weight, check_controlled_by,
    desired_canary_ingress, needs_write, verify_weight,
};
use rollouts_traffic::{Error, rollout_services};
use serde_json::{Value, json};

const PREFIX: &str = "nginx.ingress.kubernetes.io";

fn shop() -> Rollout {
    rollout("nginx/rollout.yaml")
}

fn header_step(matches: Vec<(&str, StringMatch)>) -> SetHeaderRoute {
    SetHeaderRoute {
        name: Some("beta-users".into()),
        match_: Some(
            matches
                .into_iter()
                .map(|(name, value)| HeaderRoutingMatch {
                    header_name: name.into(),
                    header_value: value,
                })
                .collect(),
        ),
    }
}

fn exact(value: &str) -> StringMatch {
    StringMatch {
        exact: Some(value.into()),
        ..StringMatch::default()
    }
}

fn canary(weight: i32, header: Option<&NginxHeaderRoute>) -> Value {
    let rollout = shop();
    let services = rollout_services(&rollout).unwrap();
    desired_canary_ingress(
        &object("nginx/ingress-stable.yaml"),
        &rollout,
        &services,
        weight,
        header,
    )
    .unwrap()
}

fn annotation<'a>(ingress: &'a Value, key: &str) -> Option<&'a str> {
    ingress["metadata"]["annotations"][format!("{PREFIX}/{key}")].as_str()
}

#[test]
fn canary_ingress_matches_the_expected_object() {
    let rollout = shop();
    let header =
        NginxHeaderRoute::from_step(&rollout, &header_step(vec![("X-Beta", exact("yes"))]))
            .unwrap()
            .unwrap();
    assert_eq!(
        canary(5, Some(&header)),
        object("nginx/canary-5-header.yaml")
    );
}

#[test]
fn canary_ingress_is_a_valid_ingress() {
    let typed: Ingress = serde_json::from_value(canary(33, None)).unwrap();
    let rules = typed.spec.unwrap().rules.unwrap();
    assert_eq!(
        rules.len(),
        1,
        "only the rule on the stable Service is copied"
    );
}

#[test]
fn weights_are_written_and_read_back() {
    let rollout = shop();
    for weight in [0, 5, 33, 100] {
        let ingress = canary(weight, None);
        assert_eq!(annotation(&ingress, "canary"), Some("true"));
        assert_eq!(canary_weight(&ingress, PREFIX), Some(weight));
        assert_eq!(annotation(&ingress, "canary-weight-total"), None);
        assert!(verify_weight(&ingress, &rollout, weight));
        assert!(!verify_weight(&ingress, &rollout, weight + 1));
    }
}

#[test]
fn max_traffic_weight_sets_the_total() {
    let mut rollout = shop();
    let routing = rollout
        .spec
        .strategy
        .canary
        .as_mut()
        .unwrap()
        .traffic_routing
        .as_mut()
        .unwrap();
    routing.max_traffic_weight = Some(1000);
    let services = rollout_services(&rollout).unwrap();
    let ingress = desired_canary_ingress(
        &object("nginx/ingress-stable.yaml"),
        &rollout,
        &services,
        333,
        None,
    )
    .unwrap();
    assert_eq!(annotation(&ingress, "canary-weight"), Some("333"));
    assert_eq!(annotation(&ingress, "canary-weight-total"), Some("1000"));
    assert!(verify_weight(&ingress, &rollout, 333));
    assert!(
        !verify_weight(&canary(333, None), &rollout, 333),
        "a canary without the total is not verified"
    );
}

#[test]
fn backends_on_the_stable_service_switch_to_the_canary_and_others_stay() {
    let ingress = canary(5, None);
    let paths = &ingress["spec"]["rules"][0]["http"]["paths"];
    assert_eq!(paths[0]["backend"]["service"]["name"], "shop-canary");
    assert_eq!(paths[0]["backend"]["service"]["port"]["number"], 80);
    assert_eq!(paths[1]["backend"]["service"]["name"], "cdn");
    assert!(
        ingress["spec"].get("futureField").is_none(),
        "the canary takes only rules, TLS and class"
    );
    assert!(
        ingress["metadata"]["annotations"]
            .get(format!("{PREFIX}/rewrite-target"))
            .is_none(),
        "stable annotations other than the ingress class stay on the stable Ingress"
    );
}

#[test]
fn header_routes_become_canary_by_header_annotations() {
    let rollout = shop();
    let cases = [
        (exact("yes"), Some("yes"), None),
        (
            StringMatch {
                prefix: Some("v1.2".into()),
                ..StringMatch::default()
            },
            None,
            Some("^v1\\.2.*"),
        ),
        (
            StringMatch {
                regex: Some("^(a|b)$".into()),
                ..StringMatch::default()
            },
            None,
            Some("^(a|b)$"),
        ),
    ];
    for (value, header_value, pattern) in cases {
        let header = NginxHeaderRoute::from_step(&rollout, &header_step(vec![("X-Beta", value)]))
            .unwrap()
            .unwrap();
        let ingress = canary(5, Some(&header));
        assert_eq!(annotation(&ingress, "canary-by-header"), Some("X-Beta"));
        assert_eq!(annotation(&ingress, "canary-by-header-value"), header_value);
        assert_eq!(annotation(&ingress, "canary-by-header-pattern"), pattern);
        assert_eq!(
            NginxHeaderRoute::of_canary_ingress(&ingress, PREFIX),
            Some(header.clone())
        );
        // Read back and written again, the header route is the same object.
        assert_eq!(
            canary(
                5,
                NginxHeaderRoute::of_canary_ingress(&ingress, PREFIX).as_ref()
            ),
            ingress
        );
    }
}

#[test]
fn header_route_removal_drops_the_annotations_and_needs_a_write() {
    let rollout = shop();
    let header = NginxHeaderRoute {
        header_name: "X-Beta".into(),
        value: NginxHeaderValue::Exact("yes".into()),
    };
    let with_header = canary(5, Some(&header));
    let removal = SetHeaderRoute {
        name: Some("beta-users".into()),
        match_: None,
    };
    assert_eq!(
        NginxHeaderRoute::from_step(&rollout, &removal).unwrap(),
        None
    );
    let without = canary(5, None);
    assert_eq!(annotation(&without, "canary-by-header"), None);
    assert_eq!(annotation(&without, "canary-by-header-value"), None);
    assert!(needs_write(Some(&with_header), &without, PREFIX));
}

#[test]
fn a_header_route_on_two_headers_is_refused() {
    let step = header_step(vec![("X-Beta", exact("yes")), ("X-Region", exact("eu"))]);
    let err = NginxHeaderRoute::from_step(&shop(), &step).unwrap_err();
    assert!(matches!(err, Error::InvalidSpec { .. }), "{err}");
    assert!(err.to_string().contains("apps/shop"), "{err}");
    assert!(err.to_string().contains("setHeaderRoute.match"), "{err}");
}

#[test]
fn applying_twice_changes_nothing() {
    let first = canary(33, None);
    let rollout = shop();
    let services = rollout_services(&rollout).unwrap();
    let second = desired_canary_ingress(
        &object("nginx/ingress-stable.yaml"),
        &rollout,
        &services,
        33,
        None,
    )
    .unwrap();
    assert_eq!(first, second);
    assert!(!needs_write(Some(&first), &second, PREFIX));
}

#[test]
fn fields_the_server_or_others_add_do_not_cause_a_write() {
    let desired = canary(33, None);
    let mut found = desired.clone();
    found["metadata"]["uid"] = json!("aaaa");
    found["metadata"]["resourceVersion"] = json!("42");
    found["metadata"]["annotations"]["rancher.io/touched"] = json!("yes");
    found["status"] = json!({"loadBalancer": {"ingress": [{"ip": "127.0.0.1"}]}});
    assert!(!needs_write(Some(&found), &desired, PREFIX));
    assert!(needs_write(Some(&found), &canary(34, None), PREFIX));
    assert!(needs_write(None, &desired, PREFIX));
}

#[test]
fn an_annotation_this_router_applied_and_no_longer_wants_causes_a_write() {
    let desired = canary(33, None);
    let mut found = desired.clone();
    found["metadata"]["annotations"]["example.com/old"] = json!("1");
    found["metadata"]["managedFields"] = json!([{
        "manager": "rollouts-controller", "operation": "Apply",
        "fieldsV1": {"f:metadata": {"f:annotations": {"f:example.com/old": {}}}}
    }]);
    assert!(needs_write(Some(&found), &desired, PREFIX));
}

#[test]
fn a_canary_ingress_owned_by_someone_else_is_refused() {
    let rollout = shop();
    let err = check_controlled_by(&object("nginx/canary-foreign.yaml"), &rollout).unwrap_err();
    assert!(matches!(err, Error::NotOwned { .. }), "{err}");
    let message = err.to_string();
    assert!(message.contains("apps/shop-shop-canary"), "{message}");
    assert!(message.contains("Deployment someone-else"), "{message}");
    check_controlled_by(&canary(5, None), &rollout).unwrap();
}

#[test]
fn every_stable_ingress_gets_its_own_canary() {
    let rollout = shop();
    let names = rollout
        .canary()
        .unwrap()
        .traffic_routing
        .as_ref()
        .unwrap()
        .nginx
        .as_ref()
        .unwrap()
        .stable_ingress_names();
    assert_eq!(names, vec!["shop", "shop-admin"]);
    let services = rollout_services(&rollout).unwrap();
    let admin = desired_canary_ingress(
        &object("nginx/ingress-admin.yaml"),
        &rollout,
        &services,
        5,
        None,
    )
    .unwrap();
    assert_eq!(admin["metadata"]["name"], "shop-shop-admin-canary");
    assert_eq!(
        admin["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"],
        json!({"name": "shop-canary", "port": {"number": 8080}})
    );
}

#[test]
fn a_stable_ingress_without_the_stable_service_is_an_error_naming_it() {
    let rollout = shop();
    let services = rollout_services(&rollout).unwrap();
    let err = desired_canary_ingress(
        &object("nginx/ingress-no-stable.yaml"),
        &rollout,
        &services,
        5,
        None,
    )
    .unwrap_err();
    let message = err.to_string();
    assert!(message.contains("Ingress apps/shop"), "{message}");
    assert!(message.contains("shop-stable"), "{message}");
}

#[test]
fn long_names_are_cut_to_a_valid_object_name() {
    let name = canary_ingress_name(&"r".repeat(200), &"i".repeat(100));
    assert_eq!(name.len(), 253);
    assert!(name.ends_with("-canary"));
    assert_eq!(canary_ingress_name("shop", "web"), "shop-web-canary");
}

#[test]
fn a_spec_field_the_stable_dropped_causes_a_write() {
    let desired = canary(33, None);
    let mut found = desired.clone();
    found["spec"]["defaultBackend"] =
        json!({"service": {"name": "shop-canary", "port": {"number": 80}}});
    assert!(needs_write(Some(&found), &desired, PREFIX));
}
