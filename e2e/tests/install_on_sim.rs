//! The install manifests (deploy/) applied to kube-sim with the real `kubectl apply -k`, as
//! deploy/README.md tells users to: every rendered object is then live with the fields the
//! manifests set, a second apply changes nothing, and the controller Deployment rolls out.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::eventually_blocking;
use common::kubectl::Kubectl;
use serde_json::Value;

const NAMESPACE: &str = "rollouts";
const WAIT: Duration = Duration::from_secs(20);

fn deploy_dir(dir: &str) -> String {
    let root: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ sits in the workspace root")
        .join(dir);
    root.to_string_lossy().into_owned()
}

/// `kubectl kustomize <dir>` parsed into its objects.
fn rendered(k: &Kubectl, dir: &str) -> Vec<Value> {
    let text = k.ok(&["kustomize", &deploy_dir(dir)]);
    serde_saphyr::from_multiple(&text)
        .unwrap_or_else(|e| panic!("`kubectl kustomize {dir}` printed invalid YAML: {e}"))
}

/// `(apiVersion, kind, namespace, name)`: what identifies an object in the cluster.
type Identity = (String, String, String, String);

fn identity(object: &Value) -> Identity {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (
        text(&object["apiVersion"]),
        text(&object["kind"]),
        text(&object["metadata"]["namespace"]),
        text(&object["metadata"]["name"]),
    )
}

/// Every object of the kinds in `wanted`, fetched with one `kubectl get KIND.VERSION.GROUP,...`.
fn live_objects(k: &Kubectl, wanted: &[Value]) -> BTreeMap<Identity, Value> {
    let kinds: BTreeSet<String> = wanted
        .iter()
        .map(|o| {
            let (api_version, kind, ..) = identity(o);
            match api_version.split_once('/') {
                Some((group, version)) => format!("{kind}.{version}.{group}"),
                None => kind,
            }
        })
        .collect();
    let kinds = kinds.into_iter().collect::<Vec<_>>().join(",");
    let list = k.json(&["get", &kinds, "--all-namespaces", "--show-managed-fields"]);
    list["items"]
        .as_array()
        .expect("kubectl get prints a List")
        .iter()
        .map(|o| (identity(o), o.clone()))
        .collect()
}

/// Why `live` does not hold every field `manifest` sets, with that value; None when it does.
fn missing_field(manifest: &Value, live: &Value, path: &str) -> Option<String> {
    match (manifest, live) {
        (Value::Object(want), Value::Object(have)) => want.iter().find_map(|(key, value)| {
            let at = format!("{path}.{key}");
            match have.get(key) {
                Some(live_value) => missing_field(value, live_value, &at),
                None => Some(format!("{at} is missing")),
            }
        }),
        (Value::Array(want), Value::Array(have)) if want.len() == have.len() => want
            .iter()
            .zip(have)
            .enumerate()
            .find_map(|(i, (w, h))| missing_field(w, h, &format!("{path}[{i}]"))),
        _ if manifest == live => None,
        _ => Some(format!("{path} is {live}, the manifest says {manifest}")),
    }
}

/// The object without what the simulated controllers keep writing (status, resourceVersion).
fn without_server_writes(object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(root) = copy.as_object_mut() {
        root.shift_remove("status");
    }
    if let Some(meta) = copy["metadata"].as_object_mut() {
        meta.shift_remove("resourceVersion");
    }
    copy
}

/// Applies `dir` with `kubectl apply -k`, then checks every rendered object is live as rendered
/// and that applying again writes nothing. Returns the live objects.
fn apply_and_check(k: &Kubectl, dir: &str) -> BTreeMap<Identity, Value> {
    let wanted = rendered(k, dir);
    assert!(!wanted.is_empty(), "{dir} renders objects");
    let printed = k.ok(&["apply", "-k", &deploy_dir(dir)]);
    // Objects an earlier install created (the CRDs in deploy/) are unchanged.
    assert!(
        printed.lines().count() == wanted.len()
            && printed
                .lines()
                .all(|l| l.ends_with(" created") || l.ends_with(" unchanged")),
        "`kubectl apply -k {dir}` creates every object:\n{printed}"
    );
    let live = live_objects(k, &wanted);
    for object in &wanted {
        let id = identity(object);
        let Some(found) = live.get(&id) else {
            panic!("{id:?} from {dir} is not in the cluster after `kubectl apply -k {dir}`");
        };
        let mut manifest = object.clone();
        // kubectl records the applied manifest here: the live annotations hold one more.
        if let Some(meta) = manifest["metadata"].as_object_mut() {
            meta.shift_remove("annotations");
        }
        if let Some(why) = missing_field(&manifest, found, "") {
            panic!("{id:?} from {dir} is not live as rendered: {why}");
        }
    }

    k.ok(&["apply", "-k", &deploy_dir(dir)]);
    let again = live_objects(k, &wanted);
    for object in &wanted {
        let id = identity(object);
        assert_eq!(
            without_server_writes(&again[&id]),
            without_server_writes(&live[&id]),
            "applying {dir} again leaves {id:?} unchanged"
        );
    }
    live
}

fn rolls_out(k: &Kubectl) {
    let deployment = format!("deployment/{}", "rollouts-controller");
    eventually_blocking(
        "the controller Deployment to roll out on kube-sim",
        WAIT,
        || {
            let status = k.run(&[
                "rollout",
                "status",
                &deployment,
                "-n",
                NAMESPACE,
                "--timeout=2s",
            ]);
            status.status.success().then_some(())
        },
    );
}

#[test]
fn cluster_wide_install_applies_with_kubectl_apply_k() {
    let k = Kubectl::new("install-cluster");
    let crds = apply_and_check(&k, "deploy/crds");
    assert!(
        crds.keys()
            .any(|(_, _, _, name)| name == "rollouts.argoproj.io"),
        "the Rollout CRD is installed: {:?}",
        crds.keys()
    );
    let installed = apply_and_check(&k, "deploy");
    let kinds: BTreeSet<&str> = installed
        .keys()
        .map(|(_, kind, ..)| kind.as_str())
        .collect();
    for kind in [
        "Namespace",
        "CustomResourceDefinition",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
        "Service",
        "Deployment",
        "PodDisruptionBudget",
    ] {
        assert!(kinds.contains(kind), "the install has a {kind}: {kinds:?}");
    }
    // The CRDs it installed are served.
    k.ok(&["get", "rollouts.argoproj.io", "--all-namespaces"]);
    rolls_out(&k);
}

#[test]
fn namespaced_install_applies_with_kubectl_apply_k() {
    let k = Kubectl::new("install-namespaced");
    apply_and_check(&k, "deploy/crds");
    // The overlay holds no Namespace (cluster-scoped): the user creates it first.
    k.ok(&["apply", "-f", &deploy_dir("deploy/namespace.yaml")]);
    let installed = apply_and_check(&k, "deploy/overlays/namespaced");
    assert!(
        installed
            .keys()
            .all(|(_, kind, namespace, _)| namespace == NAMESPACE && !kind.starts_with("Cluster")),
        "everything the namespaced overlay installs is in {NAMESPACE}: {:?}",
        installed.keys()
    );
    let cluster_roles = k.json(&["get", "clusterroles,clusterrolebindings"]);
    assert_eq!(
        cluster_roles["items"].as_array().map(Vec::len),
        Some(0),
        "the namespaced install grants nothing cluster-wide"
    );
    rolls_out(&k);
}
