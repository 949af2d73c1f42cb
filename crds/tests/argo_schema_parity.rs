//! Field-for-field parity with Argo Rollouts: when ARGO_ROLLOUTS_SRC points at an Argo Rollouts
//! checkout, every field of its Rollout CRD schema exists in ours (or sits under a node of ours
//! that keeps unknown fields, like `spec.template`).

use std::path::PathBuf;

use serde_json::Value;

/// Fields of Argo's schema missing from ours, as dotted paths (`[]` for array items).
fn missing_fields(argo: &Value, ours: &Value, path: &str, out: &mut Vec<String>) {
    if ours
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true)
    {
        return;
    }
    if let Some(properties) = argo.get("properties").and_then(Value::as_object) {
        for (name, argo_child) in properties {
            let child_path = format!("{path}.{name}");
            match ours.pointer(&format!(
                "/properties/{}",
                name.replace('~', "~0").replace('/', "~1")
            )) {
                Some(our_child) => missing_fields(argo_child, our_child, &child_path, out),
                None => out.push(child_path),
            }
        }
    }
    if let Some(argo_items) = argo.get("items") {
        match ours.get("items") {
            Some(our_items) => missing_fields(argo_items, our_items, &format!("{path}[]"), out),
            None => out.push(format!("{path}[]")),
        }
    }
}

fn schema_of(crd: &Value) -> &Value {
    crd.pointer("/spec/versions/0/schema/openAPIV3Schema")
        .expect("CRD has an openAPIV3Schema")
}

#[test]
fn every_argo_rollout_field_is_in_our_schema() {
    let Some(root) = std::env::var_os("ARGO_ROLLOUTS_SRC") else {
        eprintln!("skipped: set ARGO_ROLLOUTS_SRC to an Argo Rollouts checkout to run this test");
        return;
    };
    let path = PathBuf::from(root).join("manifests/crds/rollout-crd.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let argo: Value =
        serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let ours =
        serde_json::to_value(rollouts_crds::rollout::crds().remove(0)).expect("CRD serialises");

    let mut missing = Vec::new();
    // `metadata` is the object's own metadata, which kube leaves to the API server.
    for top in ["spec", "status"] {
        let argo_part = schema_of(&argo)
            .pointer(&format!("/properties/{top}"))
            .expect("Argo part");
        let our_part = schema_of(&ours)
            .pointer(&format!("/properties/{top}"))
            .unwrap_or_else(|| panic!("our schema has no {top}"));
        missing_fields(argo_part, our_part, top, &mut missing);
    }
    assert!(
        missing.is_empty(),
        "fields in Argo's Rollout CRD but not in ours:\n{}",
        missing.join("\n")
    );
}
