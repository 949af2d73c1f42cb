//! Helpers shared by the kube-sim tests: starting the simulator, kube-rs clients, polling.

#![allow(dead_code)]

pub mod kubectl;

use std::time::{Duration, Instant};

use rollouts_e2e::sim::{SimHandle, SimOptions, start};
use serde_json::{Value, json};

/// A simulator with fast pods, so tests wait little.
pub fn sim() -> SimHandle {
    sim_with(SimOptions::default())
}

pub fn sim_with(options: SimOptions) -> SimHandle {
    start(SimOptions {
        pod_ready_after: Duration::from_millis(100),
        ..options
    })
    .expect("kube-sim starts on a loopback port")
}

/// A kube-rs client for the simulator (default namespace `default`).
pub fn client(sim: &SimHandle) -> kube::Client {
    let config = kube::Config::new(sim.url().parse().expect("the simulator URL is a valid URI"));
    kube::Client::try_from(config).expect("a client for a plain-HTTP server")
}

/// Polls `check` until it returns Some, failing with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Blocking form of [`eventually`] for tests that drive processes.
pub fn eventually_blocking<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A small namespaced CRD with status and scale subresources and printer columns.
pub fn widget_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                "subresources": {
                    "status": {},
                    "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"},
                },
                "additionalPrinterColumns": [
                    {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                ],
            }],
        },
    })
}

/// A ReplicaSet with `replicas` pods labelled `app: <name>`.
pub fn replica_set(name: &str, replicas: i64) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "nginx:1"}]},
            },
        },
    })
}
