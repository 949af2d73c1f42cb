//! The hold fault: requests on one resource get no answer while the rule is set (others are
//! served meanwhile), and clearing the rule at runtime releases them.

mod common;

use std::time::Duration;

use common::{client, sim};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use rollouts_e2e::sim::Faults;
use rollouts_e2e::sim::faults::Hold;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn held_lease_requests_wait_until_the_rule_is_cleared_while_others_are_served() {
    let sim = sim();
    let client = client(&sim);
    let leases: Api<Lease> = Api::default_namespaced(client.clone());
    let lease: Lease =
        serde_json::from_value(json!({"metadata": {"name": "lock"}})).expect("valid Lease");
    leases
        .create(&PostParams::default(), &lease)
        .await
        .expect("creates the Lease");

    sim.set_faults(Faults {
        holds: vec![Hold::leases()],
        ..Faults::default()
    });
    let held = tokio::spawn({
        let leases = leases.clone();
        async move { leases.get("lock").await }
    });
    // Sent after the held request, and answered while it is still held.
    let config_maps: Api<ConfigMap> = Api::default_namespaced(client);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "other"}})).expect("valid ConfigMap");
    config_maps
        .create(&PostParams::default(), &cm)
        .await
        .expect("other resources are served");
    config_maps.get("other").await.expect("and read");
    assert!(
        !held.is_finished(),
        "the Lease read was answered while held"
    );

    sim.set_faults(Faults::default());
    let answered = tokio::time::timeout(WAIT, held)
        .await
        .expect("released when the rule is cleared")
        .expect("the task ran")
        .expect("the Lease is read");
    assert_eq!(answered.metadata.name.as_deref(), Some("lock"));
}

#[tokio::test]
async fn a_delayed_hold_answers_on_its_own() {
    let sim = sim();
    let leases: Api<Lease> = Api::default_namespaced(client(&sim));
    sim.set_faults(Faults {
        holds: vec![Hold::leases().after(Duration::from_millis(50))],
        ..Faults::default()
    });
    let missing = tokio::time::timeout(WAIT, leases.get_opt("absent"))
        .await
        .expect("answered after the delay")
        .expect("a plain answer");
    assert!(missing.is_none());
}
