//! Reading and writing router objects held as JSON: names, references, the server-side apply body
//! that carries only the fields a router owns, and the regular-expression escaping header matches
//! need.

use serde_json::{Map, Value, json};

/// `metadata.name`, empty when absent.
pub fn name(object: &Value) -> &str {
    object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// `metadata.namespace`, empty when absent.
pub fn namespace(object: &Value) -> &str {
    object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// `namespace/name` of an object, for messages.
pub fn reference(object: &Value) -> String {
    format!("{}/{}", namespace(object), name(object))
}

/// A mutable JSON object at `key` of `parent`, created (or replaced when not an object) on demand.
pub fn object_entry<'a>(
    parent: &'a mut Map<String, Value>,
    key: &str,
) -> &'a mut Map<String, Value> {
    let entry = parent
        .entry(key.to_string())
        .or_insert_with(|| Value::Object(Map::new()));
    if !entry.is_object() {
        *entry = Value::Object(Map::new());
    }
    match entry {
        Value::Object(map) => map,
        _ => unreachable!("entry was just made an object"),
    }
}

/// The body of a server-side apply of `desired`: its identity, plus `spec` fields and metadata
/// annotations/labels named by the caller, copied only where `desired` has them. Fields left out
/// are not claimed, and fields this manager stops sending are released (and removed if nobody else
/// owns them), so a router must send every field it owns on every apply.
pub fn apply_body(
    desired: &Value,
    spec_fields: &[&str],
    annotations: &[&str],
    labels: &[&str],
) -> Value {
    let mut metadata = Map::new();
    metadata.insert("name".into(), json!(name(desired)));
    if !namespace(desired).is_empty() {
        metadata.insert("namespace".into(), json!(namespace(desired)));
    }
    for (field, keys) in [("annotations", annotations), ("labels", labels)] {
        let Some(found) = desired.pointer(&format!("/metadata/{field}")) else {
            continue;
        };
        let picked: Map<String, Value> = keys
            .iter()
            .filter_map(|key| found.get(*key).map(|v| ((*key).to_string(), v.clone())))
            .collect();
        if !picked.is_empty() {
            metadata.insert(field.into(), Value::Object(picked));
        }
    }
    let mut body = Map::new();
    body.insert("apiVersion".into(), desired["apiVersion"].clone());
    body.insert("kind".into(), desired["kind"].clone());
    body.insert("metadata".into(), Value::Object(metadata));
    let spec: Map<String, Value> = spec_fields
        .iter()
        .filter_map(|field| {
            desired
                .pointer(&format!("/spec/{field}"))
                .map(|v| ((*field).to_string(), v.clone()))
        })
        .collect();
    if !spec.is_empty() {
        body.insert("spec".into(), Value::Object(spec));
    }
    Value::Object(body)
}

/// Whether `found` holds everything `wanted` says: every key of a wanted map is in the found map
/// with a value that holds, lists have the same length and hold item by item, and scalars are
/// equal. Fields only `found` has (server defaults, other managers' fields) do not matter.
pub fn holds(found: &Value, wanted: &Value) -> bool {
    match (found, wanted) {
        (Value::Object(found), Value::Object(wanted)) => wanted
            .iter()
            .all(|(key, value)| found.get(key).is_some_and(|f| holds(f, value))),
        (Value::Array(found), Value::Array(wanted)) => {
            found.len() == wanted.len() && found.iter().zip(wanted).all(|(f, w)| holds(f, w))
        }
        (Value::Number(found), Value::Number(wanted)) => found.as_f64() == wanted.as_f64(),
        _ => found == wanted,
    }
}

/// `body` with the `metadata.resourceVersion` of `found`, so that its apply fails with a conflict
/// instead of overwriting a change made after `found` was read (routers send whole route lists,
/// computed from `found`).
pub fn with_resource_version(mut body: Value, found: &Value) -> Value {
    if let Some(version) = found.pointer("/metadata/resourceVersion") {
        body["metadata"]["resourceVersion"] = version.clone();
    }
    body
}

/// Annotation keys that the field manager `manager` owns through server-side apply, read from
/// `metadata.managedFields`.
pub fn applied_annotation_keys(object: &Value, manager: &str) -> Vec<String> {
    let Some(entries) = object
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    entries
        .iter()
        .filter(|entry| {
            entry["manager"].as_str() == Some(manager)
                && entry["operation"].as_str() == Some("Apply")
        })
        .filter_map(|entry| entry.pointer("/fieldsV1/f:metadata/f:annotations"))
        .filter_map(Value::as_object)
        .flat_map(|keys| keys.keys())
        .filter_map(|key| key.strip_prefix("f:"))
        .map(str::to_string)
        .collect()
}

/// `text` with every regular-expression metacharacter escaped (RE2 / PCRE syntax), so that it
/// matches itself literally.
pub fn regex_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// `text` as a `(namespace, name)` reference: `ns/name`, Istio's `name.ns` shorthand (optionally
/// followed by `.svc.cluster.local`), or a bare name in `default_namespace`.
pub fn split_reference(text: &str, default_namespace: &str) -> (String, String) {
    if let Some((namespace, name)) = text.split_once('/') {
        return (namespace.to_string(), name.to_string());
    }
    let short = text.trim_end_matches(".cluster.local");
    let short = short.strip_suffix(".svc").unwrap_or(short);
    // A namespace cannot contain a dot, so the last segment is the namespace (as in Argo Rollouts).
    match short.rsplit_once('.') {
        Some((name, namespace)) if !name.is_empty() && !namespace.is_empty() => {
            (namespace.to_string(), name.to_string())
        }
        _ => (default_namespace.to_string(), text.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_in_every_spelling() {
        assert_eq!(split_reference("vs", "apps"), ("apps".into(), "vs".into()));
        assert_eq!(
            split_reference("mesh/vs", "apps"),
            ("mesh".into(), "vs".into())
        );
        assert_eq!(
            split_reference("vs.mesh", "apps"),
            ("mesh".into(), "vs".into())
        );
        assert_eq!(
            split_reference("my.vs.mesh.svc.cluster.local", "apps"),
            ("mesh".into(), "my.vs".into())
        );
    }

    #[test]
    fn holds_ignores_fields_only_the_server_has() {
        let found = json!({"a": [{"x": 1, "default": true}], "b": 2.0, "c": "extra"});
        assert!(holds(&found, &json!({"a": [{"x": 1}], "b": 2})));
        assert!(!holds(&found, &json!({"a": [{"x": 2}]})));
        assert!(!holds(&found, &json!({"a": []})));
        assert!(!holds(&found, &json!({"d": 1})));
    }

    #[test]
    fn regex_escape_matches_literally() {
        assert_eq!(regex_escape("v1.2+beta"), "v1\\.2\\+beta");
        assert_eq!(regex_escape("plain"), "plain");
    }

    #[test]
    fn apply_body_carries_only_named_fields() {
        let desired = json!({
            "apiVersion": "v1", "kind": "Thing",
            "metadata": {"name": "a", "namespace": "ns", "uid": "u",
                          "labels": {"mine": "1", "theirs": "2"}},
            "spec": {"http": [], "hosts": ["h"]}
        });
        let body = apply_body(&desired, &["http", "tls"], &[], &["mine"]);
        assert_eq!(
            body,
            json!({"apiVersion": "v1", "kind": "Thing",
                   "metadata": {"name": "a", "namespace": "ns", "labels": {"mine": "1"}},
                   "spec": {"http": []}})
        );
    }

    #[test]
    fn applied_annotation_keys_reads_only_our_apply_entries() {
        let object = json!({"metadata": {"managedFields": [
            {"manager": "rollouts-controller", "operation": "Apply",
             "fieldsV1": {"f:metadata": {"f:annotations": {"f:a/x": {}, "f:b": {}}}}},
            {"manager": "kubectl", "operation": "Apply",
             "fieldsV1": {"f:metadata": {"f:annotations": {"f:c": {}}}}}
        ]}});
        assert_eq!(
            applied_annotation_keys(&object, "rollouts-controller"),
            vec!["a/x".to_string(), "b".to_string()]
        );
    }
}
