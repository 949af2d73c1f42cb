//! Istio router transforms on YAML fixtures: weights on host-level and subset-level routes, tls and
//! tcp routes, header and mirror routes added, ordered and removed, DestinationRule subsets, and
//! everything the router does not own left as found.

mod common;

use common::{object, rollout};
use rollouts_crds::rollout::{
    HeaderRoutingMatch, IstioVirtualService, Rollout, SetHeaderRoute, SetMirrorRoute, StringMatch,
    WeightDestination,
};
use rollouts_traffic::Error;
use rollouts_traffic::istio::{
    CanaryDestination, desired_destination_rule, desired_virtual_service, verify_weight,
    with_header_route, with_mirror_route, without_managed_routes,
};
use serde_json::{Value, json};

fn vs_refs(rollout: &Rollout) -> Vec<IstioVirtualService> {
    let istio = rollout
        .canary()
        .unwrap()
        .traffic_routing
        .as_ref()
        .unwrap()
        .istio
        .as_ref()
        .unwrap();
    istio.all_virtual_services().into_iter().cloned().collect()
}

fn step_header(rollout: &Rollout) -> SetHeaderRoute {
    rollout
        .canary()
        .unwrap()
        .steps()
        .iter()
        .find_map(|s| s.set_header_route.clone())
        .unwrap()
}

fn step_mirror(rollout: &Rollout) -> SetMirrorRoute {
    rollout
        .canary()
        .unwrap()
        .steps()
        .iter()
        .find_map(|s| s.set_mirror_route.clone())
        .unwrap()
}

/// (host, weight) of every destination of the http route named `name`.
fn weights(vs: &Value, list: &str, index: usize) -> Vec<(String, i64)> {
    vs["spec"][list][index]["route"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let host = d["destination"]["host"].as_str().unwrap();
            let name = d["destination"]["subset"].as_str().unwrap_or(host);
            (name.to_string(), d["weight"].as_i64().unwrap_or(-1))
        })
        .collect()
}

fn http_index(vs: &Value, name: &str) -> usize {
    vs["spec"]["http"]
        .as_array()
        .unwrap()
        .iter()
        .position(|r| r["name"] == name)
        .unwrap()
}

fn http_names(vs: &Value) -> Vec<&str> {
    vs["spec"]["http"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap_or(""))
        .collect()
}

const STABLE: &str = "reviews-stable.apps.svc.cluster.local";
const CANARY: &str = "reviews-canary.apps.svc.cluster.local";

#[test]
fn host_level_weights_sum_to_100_and_leave_other_routes_alone() {
    let rollout = rollout("istio/rollout-host.yaml");
    let vs_ref = &vs_refs(&rollout)[0];
    let found = object("istio/vs-host.yaml");
    for weight in [0, 5, 33, 100] {
        let desired = desired_virtual_service(&found, &rollout, vs_ref, weight, &[]).unwrap();
        let primary = http_index(&desired, "primary");
        assert_eq!(
            weights(&desired, "http", primary),
            vec![
                (STABLE.to_string(), i64::from(100 - weight)),
                (CANARY.to_string(), i64::from(weight))
            ]
        );
        assert_eq!(
            desired["spec"]["http"][0], found["spec"]["http"][0],
            "the ratings route is untouched"
        );
        assert!(verify_weight(&desired, &rollout, vs_ref, weight, &[]).unwrap());
        assert!(!verify_weight(&desired, &rollout, vs_ref, weight + 1, &[]).unwrap());
    }
}

#[test]
fn fields_the_router_does_not_own_are_kept() {
    let rollout = rollout("istio/rollout-host.yaml");
    let found = object("istio/vs-host.yaml");
    let desired =
        desired_virtual_service(&found, &rollout, &vs_refs(&rollout)[0], 33, &[]).unwrap();
    let primary = &desired["spec"]["http"][1];
    assert_eq!(
        primary["retries"],
        json!({"attempts": 3, "perTryTimeout": "2s"})
    );
    assert_eq!(
        primary["route"][0]["headers"],
        found["spec"]["http"][1]["route"][0]["headers"]
    );
    assert_eq!(
        primary["route"][0]["destination"]["port"],
        json!({"number": 9080})
    );
    for key in ["hosts", "gateways", "exportTo"] {
        assert_eq!(desired["spec"][key], found["spec"][key]);
    }
    assert_eq!(desired["metadata"], found["metadata"]);
    assert_eq!(desired["status"], found["status"]);
}

#[test]
fn max_traffic_weight_is_the_total() {
    let mut rollout = rollout("istio/rollout-host.yaml");
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
    let desired = desired_virtual_service(
        &object("istio/vs-host.yaml"),
        &rollout,
        &vs_refs(&rollout)[0],
        333,
        &[],
    )
    .unwrap();
    let total: i64 = weights(&desired, "http", 1).iter().map(|(_, w)| w).sum();
    assert_eq!(total, 1000);
    assert_eq!(weights(&desired, "http", 1)[1].1, 333);
}

#[test]
fn mirror_and_header_routes_match_the_expected_object() {
    let rollout = rollout("istio/rollout-host.yaml");
    let vs_ref = &vs_refs(&rollout)[0];
    let canary = CanaryDestination::of(&rollout, None).unwrap();
    let weighted =
        desired_virtual_service(&object("istio/vs-host.yaml"), &rollout, vs_ref, 33, &[]).unwrap();
    let mirrored =
        with_mirror_route(&weighted, &rollout, vs_ref, &step_mirror(&rollout), &canary).unwrap();
    let both =
        with_header_route(&mirrored, &rollout, vs_ref, &step_header(&rollout), &canary).unwrap();
    assert_eq!(both, object("istio/vs-host-33-mirror-header.yaml"));

    // Applying the same operations again changes nothing.
    let again =
        with_header_route(&both, &rollout, vs_ref, &step_header(&rollout), &canary).unwrap();
    let again =
        with_mirror_route(&again, &rollout, vs_ref, &step_mirror(&rollout), &canary).unwrap();
    let again = desired_virtual_service(&again, &rollout, vs_ref, 33, &[]).unwrap();
    assert_eq!(again, both);
}

#[test]
fn set_weight_moves_the_mirror_route_with_the_primary_but_not_the_header_route() {
    let rollout = rollout("istio/rollout-host.yaml");
    let vs_ref = &vs_refs(&rollout)[0];
    let with_routes = object("istio/vs-host-33-mirror-header.yaml");
    let desired = desired_virtual_service(&with_routes, &rollout, vs_ref, 50, &[]).unwrap();
    assert_eq!(
        weights(&desired, "http", http_index(&desired, "mirror-all")),
        vec![(STABLE.to_string(), 50), (CANARY.to_string(), 50)]
    );
    assert_eq!(
        weights(&desired, "http", http_index(&desired, "beta-header")),
        vec![("reviews-canary".to_string(), 100)]
    );
    assert_eq!(
        http_names(&desired),
        vec!["beta-header", "mirror-all", "ratings", "primary"]
    );
}

#[test]
fn routes_are_removed_by_name_and_all_at_once() {
    let rollout = rollout("istio/rollout-host.yaml");
    let vs_ref = &vs_refs(&rollout)[0];
    let canary = CanaryDestination::of(&rollout, None).unwrap();
    let with_routes = object("istio/vs-host-33-mirror-header.yaml");

    let mut removal = step_header(&rollout);
    removal.match_ = None;
    let no_header = with_header_route(&with_routes, &rollout, vs_ref, &removal, &canary).unwrap();
    assert_eq!(
        http_names(&no_header),
        vec!["mirror-all", "ratings", "primary"]
    );

    let mut mirror_removal = step_mirror(&rollout);
    mirror_removal.match_ = None;
    let none = with_mirror_route(&no_header, &rollout, vs_ref, &mirror_removal, &canary).unwrap();
    assert_eq!(http_names(&none), vec!["ratings", "primary"]);

    let all_removed = without_managed_routes(&with_routes, &rollout);
    assert_eq!(all_removed, none);
    let original_at_33 =
        desired_virtual_service(&object("istio/vs-host.yaml"), &rollout, vs_ref, 33, &[]).unwrap();
    assert_eq!(
        all_removed, original_at_33,
        "removal gives back the VirtualService as the user wrote it"
    );
    assert_eq!(without_managed_routes(&all_removed, &rollout), all_removed);
}

#[test]
fn a_header_route_not_in_managed_routes_is_refused() {
    let rollout = rollout("istio/rollout-host.yaml");
    let step = SetHeaderRoute {
        name: Some("unlisted".into()),
        match_: Some(vec![HeaderRoutingMatch {
            header_name: "x".into(),
            header_value: StringMatch {
                exact: Some("1".into()),
                ..StringMatch::default()
            },
        }]),
    };
    let canary = CanaryDestination::of(&rollout, None).unwrap();
    let err = with_header_route(
        &object("istio/vs-host.yaml"),
        &rollout,
        &vs_refs(&rollout)[0],
        &step,
        &canary,
    )
    .unwrap_err();
    assert!(matches!(err, Error::InvalidSpec { .. }), "{err}");
    assert!(err.to_string().contains("managedRoutes"), "{err}");
}

#[test]
fn several_virtual_services_each_with_their_own_routes() {
    let rollout = rollout("istio/rollout-host.yaml");
    let refs = vs_refs(&rollout);
    assert_eq!(refs.len(), 2);
    let internal = desired_virtual_service(
        &object("istio/vs-internal.yaml"),
        &rollout,
        &refs[1],
        5,
        &[],
    )
    .unwrap();
    assert_eq!(
        weights(&internal, "http", 0),
        vec![(STABLE.to_string(), 95), (CANARY.to_string(), 5)]
    );
    let err = desired_virtual_service(&object("istio/vs-host.yaml"), &rollout, &refs[1], 5, &[])
        .unwrap_err();
    let message = err.to_string();
    assert!(message.contains("VirtualService apps/reviews"), "{message}");
    assert!(message.contains("\"internal\""), "{message}");
}

#[test]
fn a_weighted_route_without_the_canary_is_an_error() {
    let rollout = rollout("istio/rollout-host.yaml");
    let mut found = object("istio/vs-host.yaml");
    found["spec"]["http"][1]["route"]
        .as_array_mut()
        .unwrap()
        .pop();
    let err = desired_virtual_service(&found, &rollout, &vs_refs(&rollout)[0], 5, &[]).unwrap_err();
    assert!(
        err.to_string()
            .contains("canary Service \"reviews-canary\""),
        "{err}"
    );
}

#[test]
fn subset_level_weights_by_destination_rule_subsets() {
    let rollout = rollout("istio/rollout-subset.yaml");
    let vs_ref = &vs_refs(&rollout)[0];
    let found = object("istio/vs-subset.yaml");
    for weight in [0, 5, 33, 100] {
        let desired = desired_virtual_service(&found, &rollout, vs_ref, weight, &[]).unwrap();
        assert_eq!(
            weights(&desired, "http", 0),
            vec![
                ("stable".to_string(), i64::from(100 - weight)),
                ("canary".to_string(), i64::from(weight))
            ]
        );
        assert_eq!(desired["spec"]["http"][0]["timeout"], "5s");
        assert!(verify_weight(&desired, &rollout, vs_ref, weight, &[]).unwrap());
    }
}

#[test]
fn subset_level_header_route_targets_the_destination_rule_host_and_canary_subset() {
    let rollout = rollout("istio/rollout-subset.yaml");
    let vs_ref = &vs_refs(&rollout)[0];
    let canary = CanaryDestination::of(&rollout, Some(&object("istio/dr.yaml"))).unwrap();
    let step = SetHeaderRoute {
        name: Some("beta-header".into()),
        match_: Some(vec![HeaderRoutingMatch {
            header_name: "x-beta".into(),
            header_value: StringMatch {
                regex: Some("^t.*".into()),
                ..StringMatch::default()
            },
        }]),
    };
    let desired = with_header_route(
        &object("istio/vs-subset.yaml"),
        &rollout,
        vs_ref,
        &step,
        &canary,
    )
    .unwrap();
    assert_eq!(
        desired["spec"]["http"][0],
        json!({
            "name": "beta-header",
            "match": [{"headers": {"x-beta": {"regex": "^t.*"}}}],
            "route": [{"destination": {"host": "reviews.apps.svc.cluster.local", "subset": "canary"}, "weight": 100}],
        })
    );
    // The unnamed weighted route is still found among managed routes.
    let weighted = desired_virtual_service(&desired, &rollout, vs_ref, 20, &[]).unwrap();
    assert_eq!(
        weights(&weighted, "http", 1),
        vec![("stable".to_string(), 80), ("canary".to_string(), 20)]
    );
}

#[test]
fn destination_rule_subsets_take_the_pod_template_hashes() {
    let rollout = rollout("istio/rollout-subset.yaml");
    let found = object("istio/dr.yaml");
    let desired = desired_destination_rule(&found, &rollout, "c4n4ry", "st4bl3", &[]).unwrap();
    let subsets = desired["spec"]["subsets"].as_array().unwrap();
    assert_eq!(
        subsets[0]["labels"],
        json!({"app": "reviews", "rollouts-pod-template-hash": "st4bl3"})
    );
    assert_eq!(
        subsets[0]["trafficPolicy"],
        found["spec"]["subsets"][0]["trafficPolicy"]
    );
    assert_eq!(
        subsets[1]["labels"],
        json!({"app": "reviews", "rollouts-pod-template-hash": "c4n4ry"})
    );
    assert_eq!(
        subsets[2], found["spec"]["subsets"][2],
        "other subsets stay as found"
    );
    assert_eq!(
        desired["spec"]["trafficPolicy"],
        found["spec"]["trafficPolicy"]
    );
    assert_eq!(
        desired["metadata"]["annotations"]["argo-rollouts.argoproj.io/managed-by-rollouts"],
        "reviews"
    );
    assert_eq!(
        desired_destination_rule(&desired, &rollout, "c4n4ry", "st4bl3", &[]).unwrap(),
        desired
    );

    let no_canary = desired_destination_rule(&desired, &rollout, "", "st4bl3", &[]).unwrap();
    assert_eq!(
        no_canary["spec"]["subsets"][1]["labels"],
        json!({"app": "reviews"})
    );
}

#[test]
fn a_destination_rule_without_the_canary_subset_is_an_error() {
    let rollout = rollout("istio/rollout-subset.yaml");
    let mut found = object("istio/dr.yaml");
    found["spec"]["subsets"].as_array_mut().unwrap().remove(1);
    let err = desired_destination_rule(&found, &rollout, "c", "s", &[]).unwrap_err();
    assert!(
        err.to_string().contains("DestinationRule apps/reviews"),
        "{err}"
    );
    assert!(err.to_string().contains("\"canary\""), "{err}");
}

#[test]
fn experiment_destinations_are_added_weighted_and_removed() {
    let rollout = rollout("istio/rollout-host.yaml");
    let vs_ref = &vs_refs(&rollout)[0];
    let experiment = [WeightDestination {
        weight: 10,
        service_name: "reviews-exp".into(),
        pod_template_hash: "e1".into(),
    }];
    let with_experiment = desired_virtual_service(
        &object("istio/vs-host.yaml"),
        &rollout,
        vs_ref,
        20,
        &experiment,
    )
    .unwrap();
    assert_eq!(
        weights(&with_experiment, "http", 1),
        vec![
            (STABLE.to_string(), 70),
            (CANARY.to_string(), 20),
            ("reviews-exp".to_string(), 10)
        ]
    );
    assert!(verify_weight(&with_experiment, &rollout, vs_ref, 20, &experiment).unwrap());
    let after = desired_virtual_service(&with_experiment, &rollout, vs_ref, 20, &[]).unwrap();
    assert_eq!(
        weights(&after, "http", 1),
        vec![(STABLE.to_string(), 80), (CANARY.to_string(), 20)]
    );
}

#[test]
fn an_experiment_destination_without_a_service_is_left_out() {
    let rollout = rollout("istio/rollout-host.yaml");
    let vs_ref = &vs_refs(&rollout)[0];
    let experiment = [
        WeightDestination {
            weight: 10,
            service_name: "reviews-exp".into(),
            pod_template_hash: "e1".into(),
        },
        WeightDestination {
            weight: 10,
            service_name: String::new(),
            pod_template_hash: String::new(),
        },
    ];
    let once = desired_virtual_service(
        &object("istio/vs-host.yaml"),
        &rollout,
        vs_ref,
        20,
        &experiment,
    )
    .unwrap();
    let twice = desired_virtual_service(&once, &rollout, vs_ref, 20, &experiment).unwrap();
    let expected = vec![
        (STABLE.to_string(), 70),
        (CANARY.to_string(), 20),
        ("reviews-exp".to_string(), 10),
    ];
    assert_eq!(weights(&once, "http", 1), expected);
    assert_eq!(twice, once, "a second write changes nothing");
}

#[test]
fn tls_and_tcp_routes_are_selected_by_port_and_sni_hosts() {
    let rollout = rollout("istio/rollout-l4.yaml");
    let vs_ref = &vs_refs(&rollout)[0];
    let found = object("istio/vs-l4.yaml");
    for weight in [0, 5, 33, 100] {
        let desired = desired_virtual_service(&found, &rollout, vs_ref, weight, &[]).unwrap();
        let expected = vec![
            ("db-stable".to_string(), i64::from(100 - weight)),
            ("db-canary".to_string(), i64::from(weight)),
        ];
        assert_eq!(weights(&desired, "tls", 1), expected);
        assert_eq!(weights(&desired, "tcp", 0), expected);
        assert_eq!(desired["spec"]["tls"][0], found["spec"]["tls"][0]);
        assert_eq!(desired["spec"]["tcp"][1], found["spec"]["tcp"][1]);
        assert!(
            desired["spec"].get("http").is_none(),
            "no http list appears"
        );
    }
}

#[test]
fn unlisted_tls_routes_must_be_unambiguous() {
    let mut rollout = rollout("istio/rollout-l4.yaml");
    let istio = rollout
        .spec
        .strategy
        .canary
        .as_mut()
        .unwrap()
        .traffic_routing
        .as_mut()
        .unwrap()
        .istio
        .as_mut()
        .unwrap();
    istio.virtual_service.as_mut().unwrap().tls_routes = None;
    let err = desired_virtual_service(
        &object("istio/vs-l4.yaml"),
        &rollout,
        &vs_refs(&rollout)[0],
        5,
        &[],
    )
    .unwrap_err();
    assert!(err.to_string().contains("tlsRoutes"), "{err}");
}

#[test]
fn other_destinations_stay_only_while_they_take_no_traffic() {
    let rollout = rollout("istio/rollout-host.yaml");
    let vs_ref = &vs_refs(&rollout)[0];
    let mut found = object("istio/vs-host.yaml");
    let extra = json!({"destination": {"host": "reviews-shadow"}, "weight": 0});
    found["spec"]["http"][1]["route"]
        .as_array_mut()
        .unwrap()
        .push(extra.clone());
    let desired = desired_virtual_service(&found, &rollout, vs_ref, 5, &[]).unwrap();
    assert_eq!(desired["spec"]["http"][1]["route"][2], extra);

    found["spec"]["http"][1]["route"][2]["weight"] = json!(10);
    let desired = desired_virtual_service(&found, &rollout, vs_ref, 5, &[]).unwrap();
    assert_eq!(
        weights(&desired, "http", 1),
        vec![(STABLE.to_string(), 95), (CANARY.to_string(), 5)],
        "a leftover experiment destination is removed"
    );
}
