//! Argo Rollouts' own example and end-to-end manifests, run through our transforms: every weight a
//! step asks for holds when read back, header and mirror routes come and go, and a second pass
//! changes nothing. Runs only when `ARGO_ROLLOUTS_SOURCE` points at an Argo Rollouts checkout.

use std::path::{Path, PathBuf};

use rollouts_crds::rollout::Rollout;
use rollouts_traffic::istio::{self, CanaryDestination};
use rollouts_traffic::{max_traffic_weight, nginx, object, rollout_services};
use serde_json::Value;

const ISTIO_MANIFESTS: [&str; 4] = [
    "examples/istio",
    "test/e2e/istio",
    "test/e2e/header-routing",
    "examples/traffic-routing-experiment-step",
];
const NGINX_MANIFESTS: [&str; 1] = ["test/e2e/functional/nginx-template.yaml"];

fn argo_source() -> Option<PathBuf> {
    let root = std::env::var_os("ARGO_ROLLOUTS_SOURCE")?;
    Some(PathBuf::from(root))
}

fn yaml_files(root: &Path, relative: &str) -> Vec<PathBuf> {
    let path = root.join(relative);
    if path.is_file() {
        return vec![path];
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(&path)
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|f| f.extension().is_some_and(|e| e == "yaml"));
    files.sort();
    files
}

/// The documents of a manifest, each in namespace `default` unless it names one.
fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .unwrap_or_else(|err| panic!("parsing {}: {err}", path.display()));
    docs.retain(Value::is_object);
    for doc in &mut docs {
        if doc.pointer("/metadata/namespace").is_none() && doc["metadata"].is_object() {
            doc["metadata"]["namespace"] = "default".into();
        }
    }
    docs
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> impl Iterator<Item = &'a Value> {
    docs.iter().filter(move |d| d["kind"] == kind)
}

fn named<'a>(docs: &'a [Value], kind: &str, reference: &str) -> Option<&'a Value> {
    let (namespace, name) = object::split_reference(reference, "default");
    of_kind(docs, kind).find(|d| object::name(d) == name && object::namespace(d) == namespace)
}

fn step_weights(rollout: &Rollout) -> Vec<i32> {
    let mut weights: Vec<i32> = rollout
        .canary()
        .unwrap()
        .steps()
        .iter()
        .filter_map(|s| s.set_weight)
        .collect();
    weights.extend([0, max_traffic_weight(rollout)]);
    weights
}

#[test]
fn argo_istio_manifests_hold_every_step_weight() {
    let Some(root) = argo_source() else {
        eprintln!("ARGO_ROLLOUTS_SOURCE is not set: skipping");
        return;
    };
    let mut checked = 0;
    for path in ISTIO_MANIFESTS
        .iter()
        .flat_map(|dir| yaml_files(&root, dir))
    {
        let docs = documents(&path);
        for rollout in of_kind(&docs, "Rollout") {
            let rollout: Rollout = serde_json::from_value(rollout.clone())
                .unwrap_or_else(|err| panic!("{}: {err}", path.display()));
            let Some(istio_config) = rollout
                .canary()
                .and_then(|c| c.traffic_routing.as_ref())
                .and_then(|r| r.istio.clone())
            else {
                continue;
            };
            let dr = istio_config
                .destination_rule
                .as_ref()
                .and_then(|d| named(&docs, "DestinationRule", &d.name));
            let canary = CanaryDestination::of(&rollout, dr).unwrap();
            for vs_ref in istio_config.all_virtual_services() {
                let Some(found) = named(&docs, "VirtualService", &vs_ref.name) else {
                    continue;
                };
                let context = format!("{} ({})", path.display(), vs_ref.name);
                for weight in step_weights(&rollout) {
                    let desired =
                        istio::desired_virtual_service(found, &rollout, vs_ref, weight, &[])
                            .unwrap_or_else(|err| panic!("{context}: {err}"));
                    assert!(
                        istio::verify_weight(&desired, &rollout, vs_ref, weight, &[]).unwrap(),
                        "{context}"
                    );
                    assert_eq!(
                        istio::desired_virtual_service(&desired, &rollout, vs_ref, weight, &[])
                            .unwrap(),
                        desired
                    );
                    let mut routed = desired.clone();
                    for step in rollout.canary().unwrap().steps() {
                        if let Some(header) = &step.set_header_route {
                            routed = istio::with_header_route(
                                &routed, &rollout, vs_ref, header, &canary,
                            )
                            .unwrap_or_else(|err| panic!("{context}: {err}"));
                        }
                        if let Some(mirror) = &step.set_mirror_route {
                            routed = istio::with_mirror_route(
                                &routed, &rollout, vs_ref, mirror, &canary,
                            )
                            .unwrap_or_else(|err| panic!("{context}: {err}"));
                        }
                    }
                    assert!(
                        istio::verify_weight(&routed, &rollout, vs_ref, weight, &[]).unwrap(),
                        "{context}"
                    );
                    assert_eq!(
                        istio::without_managed_routes(&routed, &rollout),
                        desired,
                        "{context}"
                    );
                    checked += 1;
                }
            }
            if let Some(dr) = dr {
                let desired =
                    istio::desired_destination_rule(dr, &rollout, "canaryhash", "stablehash", &[])
                        .unwrap();
                assert_eq!(
                    istio::desired_destination_rule(
                        &desired,
                        &rollout,
                        "canaryhash",
                        "stablehash",
                        &[]
                    )
                    .unwrap(),
                    desired
                );
            }
        }
    }
    assert!(
        checked > 0,
        "no Istio manifest was found under {}",
        root.display()
    );
}

#[test]
fn argo_nginx_manifests_give_a_canary_ingress() {
    let Some(root) = argo_source() else {
        eprintln!("ARGO_ROLLOUTS_SOURCE is not set: skipping");
        return;
    };
    let mut checked = 0;
    for path in NGINX_MANIFESTS
        .iter()
        .flat_map(|file| yaml_files(&root, file))
    {
        let docs = documents(&path);
        for rollout in of_kind(&docs, "Rollout") {
            let rollout: Rollout = serde_json::from_value(rollout.clone()).unwrap();
            let Some(nginx_config) = rollout
                .canary()
                .and_then(|c| c.traffic_routing.as_ref())
                .and_then(|r| r.nginx.clone())
            else {
                continue;
            };
            let services = rollout_services(&rollout).unwrap();
            for stable_name in nginx_config.stable_ingress_names() {
                let stable = named(&docs, "Ingress", stable_name).unwrap();
                for weight in step_weights(&rollout) {
                    let canary =
                        nginx::desired_canary_ingress(stable, &rollout, &services, weight, None)
                            .unwrap();
                    assert!(nginx::verify_weight(&canary, &rollout, weight));
                    checked += 1;
                }
            }
        }
    }
    assert!(
        checked > 0,
        "no nginx manifest was found under {}",
        root.display()
    );
}
