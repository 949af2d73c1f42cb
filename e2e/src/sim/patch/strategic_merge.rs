//! Strategic merge patch (`application/strategic-merge-patch+json`) for built-in kinds: lists
//! merge by their merge keys, and the `$patch`, `$retainKeys`, `$setElementOrder` and
//! `$deleteFromPrimitiveList` directives kubectl sends are applied, never stored.

use serde_json::{Map, Value};

use super::schema::{ListMerge, Schema};
use super::{PatchError, bad_request, json_equal};

const PATCH_DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";

/// Strategic merge patch (`application/strategic-merge-patch+json`) for built-in kinds.
pub fn strategic_merge_patch(doc: &Value, patch: &Value) -> Result<Value, PatchError> {
    let Value::Object(patch) = patch else {
        return Err(bad_request(
            "strategic merge patch must be a JSON object, e.g. {\"spec\":{\"replicas\":3}}",
        ));
    };
    let schema = Schema::of(doc);
    let original = doc.as_object().cloned().unwrap_or_default();
    let merged = smp_map(original, patch.clone(), &schema, &mut Vec::new())?;
    Ok(Value::Object(merged))
}

/// Where in the object a strategic merge patch failed, for error messages.
fn at_path(path: &[String]) -> String {
    if path.is_empty() {
        "the object root".to_string()
    } else {
        format!(".{}", path.join("."))
    }
}

/// Merges `patch` into `original`, processing the directives a map may carry.
fn smp_map(
    mut original: Map<String, Value>,
    mut patch: Map<String, Value>,
    schema: &Schema,
    path: &mut Vec<String>,
) -> Result<Map<String, Value>, PatchError> {
    if let Some(directive) = patch.shift_remove(PATCH_DIRECTIVE) {
        match directive.as_str() {
            Some("replace") => return smp_map(Map::new(), patch, schema, path),
            Some("delete") => return Ok(Map::new()),
            // `merge` is what a map does anyway.
            Some("merge") => {}
            _ => {
                return Err(bad_request(format!(
                    "strategic merge patch at {}: $patch must be replace, delete or merge, got {directive}",
                    at_path(path)
                )));
            }
        }
    }

    if let Some(retain) = patch.shift_remove(RETAIN_KEYS) {
        let keys: Vec<&str> = retain
            .as_array()
            .and_then(|keys| keys.iter().map(Value::as_str).collect())
            .ok_or_else(|| {
                bad_request(format!(
                    "strategic merge patch at {}: $retainKeys must be a list of field names",
                    at_path(path)
                ))
            })?;
        for (k, v) in &patch {
            let directive =
                k.starts_with(SET_ELEMENT_ORDER) || k.starts_with(DELETE_FROM_PRIMITIVE_LIST);
            if !v.is_null() && !directive && !keys.contains(&k.as_str()) {
                return Err(bad_request(format!(
                    "strategic merge patch at {}: field {k:?} is set but missing from $retainKeys {keys:?}",
                    at_path(path)
                )));
            }
        }
        original.retain(|k, _| keys.contains(&k.as_str()));
    }

    let orders: Vec<String> = patch
        .keys()
        .filter(|k| k.starts_with(SET_ELEMENT_ORDER))
        .cloned()
        .collect();
    for order_key in orders {
        let order = patch.shift_remove(&order_key).unwrap_or_default();
        let field = &order_key[SET_ELEMENT_ORDER.len()..];
        let patch_list = patch.shift_remove(field);
        apply_element_order(&mut original, field, &order, patch_list, schema, path)?;
    }

    for (key, value) in patch {
        if let Some(field) = key.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) {
            let doomed = value.as_array().ok_or_else(|| {
                bad_request(format!(
                    "strategic merge patch at {}: {key} must be a list of values to remove",
                    at_path(path)
                ))
            })?;
            if let Some(Value::Array(list)) = original.get_mut(field) {
                list.retain(|v| !doomed.iter().any(|d| json_equal(v, d)));
            }
            continue;
        }
        if key.starts_with('$') {
            return Err(bad_request(format!(
                "strategic merge patch at {}: unknown directive {key:?}; known are $patch, $retainKeys, $setElementOrder/<list>, $deleteFromPrimitiveList/<list>",
                at_path(path)
            )));
        }
        if value.is_null() {
            original.shift_remove(&key);
            continue;
        }
        let merged = match (original.get_mut(&key).map(Value::take), value) {
            (Some(Value::Object(o)), Value::Object(p)) => {
                path.push(key.clone());
                let merged = smp_map(o, p, schema, path);
                path.pop();
                Some(Value::Object(merged?))
            }
            (Some(Value::Array(o)), Value::Array(p)) => {
                let merge = schema.list_merge(path, &key);
                path.push(key.clone());
                let merged = smp_list(o, p, merge, schema, path);
                path.pop();
                Some(Value::Array(merged?))
            }
            (_, value) => {
                path.push(key.clone());
                let fresh = smp_fresh(value, schema, path);
                path.pop();
                fresh?
            }
        };
        match merged {
            Some(merged) => {
                // An existing key keeps its place in the object's key order.
                original.insert(key, merged);
            }
            None => {
                original.shift_remove(&key);
            }
        }
    }
    Ok(original)
}

/// A patch value that has nothing to merge with: its directives are applied to nothing and
/// dropped, nulls vanish. `None` when the value is a `$patch: delete` map.
fn smp_fresh(
    value: Value,
    schema: &Schema,
    path: &mut Vec<String>,
) -> Result<Option<Value>, PatchError> {
    match value {
        Value::Object(m) => {
            if m.get(PATCH_DIRECTIVE).and_then(Value::as_str) == Some("delete") {
                return Ok(None);
            }
            smp_map(Map::new(), m, schema, path).map(|m| Some(Value::Object(m)))
        }
        Value::Array(items) => smp_fresh_list(items, schema, path).map(|l| Some(Value::Array(l))),
        scalar => Ok(Some(scalar)),
    }
}

fn smp_fresh_list(
    items: Vec<Value>,
    schema: &Schema,
    path: &mut Vec<String>,
) -> Result<Vec<Value>, PatchError> {
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        if item.get(PATCH_DIRECTIVE).is_some() {
            continue;
        }
        if let Some(item) = smp_fresh(item, schema, path)? {
            out.push(item);
        }
    }
    Ok(out)
}

/// The identity of a list item: its merge key's value, or the scalar itself.
fn item_identity(item: &Value, merge: ListMerge) -> Option<&Value> {
    match merge {
        ListMerge::Keyed(key) => item.get(key),
        _ => Some(item),
    }
}

fn position(list: &[Value], item: &Value, merge: ListMerge) -> Option<usize> {
    let id = item_identity(item, merge)?;
    list.iter()
        .position(|x| item_identity(x, merge).is_some_and(|y| json_equal(id, y)))
}

/// Orders a merged list: items named by `patch_order` follow it, the others keep their order in
/// `server_order` and are interleaved where the live list had them (as the API server does).
fn order_merged(
    merged: Vec<Value>,
    patch_order: &[Value],
    server_order: &[Value],
    merge: ListMerge,
) -> Vec<Value> {
    let (mut from_patch, mut server_only): (Vec<Value>, Vec<Value>) = merged
        .into_iter()
        .partition(|item| position(patch_order, item, merge).is_some());
    let rank = |list: &[Value], item: &Value| position(list, item, merge).unwrap_or(usize::MAX);
    from_patch.sort_by_key(|item| rank(patch_order, item));
    server_only.sort_by_key(|item| rank(server_order, item));

    let mut out = Vec::with_capacity(from_patch.len() + server_only.len());
    let mut left = server_only.into_iter().peekable();
    let mut right = from_patch.into_iter().peekable();
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => {
                match (
                    position(server_order, l, merge),
                    position(server_order, r, merge),
                ) {
                    (Some(li), Some(ri)) => li < ri,
                    _ => false,
                }
            }
        };
        let next = if take_left { left.next() } else { right.next() };
        out.extend(next);
    }
    out
}

#[derive(Clone, Copy, PartialEq)]
enum ElementKind {
    Object,
    Scalar,
}

fn element_kind(lists: &[&[Value]], path: &[String]) -> Result<Option<ElementKind>, PatchError> {
    let mut kind = None;
    for item in lists.iter().flat_map(|l| l.iter()) {
        let this = match item {
            Value::Object(_) => ElementKind::Object,
            Value::Array(_) => {
                return Err(bad_request(format!(
                    "strategic merge patch at {}: lists of lists cannot be merged",
                    at_path(path)
                )));
            }
            _ => ElementKind::Scalar,
        };
        if kind.is_some_and(|k| k != this) {
            return Err(bad_request(format!(
                "strategic merge patch at {}: list mixes objects and plain values",
                at_path(path)
            )));
        }
        kind = Some(this);
    }
    Ok(kind)
}

/// Merges a patch list into a live list; `path` ends with the list's field name.
fn smp_list(
    original: Vec<Value>,
    patch: Vec<Value>,
    merge: ListMerge,
    schema: &Schema,
    path: &mut Vec<String>,
) -> Result<Vec<Value>, PatchError> {
    if merge == ListMerge::Atomic {
        return smp_fresh_list(patch, schema, path);
    }
    let Some(kind) = element_kind(&[&original, &patch], path)? else {
        return Ok(original);
    };
    if kind == ElementKind::Scalar {
        let mut merged = original.clone();
        for item in &patch {
            if !merged.iter().any(|m| json_equal(m, item)) {
                merged.push(item.clone());
            }
        }
        return Ok(order_merged(merged, &patch, &original, ListMerge::Set));
    }
    let ListMerge::Keyed(key) = merge else {
        return Err(bad_request(format!(
            "strategic merge patch at {}: this list holds plain values, not objects",
            at_path(path)
        )));
    };

    let mut live = original;
    let mut items = Vec::with_capacity(patch.len());
    let mut replace = false;
    for item in patch {
        match item.get(PATCH_DIRECTIVE).map(|d| d.as_str()) {
            None => items.push(item),
            Some(Some("delete")) => {
                let id = item
                    .get(key)
                    .ok_or_else(|| missing_merge_key(path, key, &item))?;
                live.retain(|x| !x.get(key).is_some_and(|v| json_equal(v, id)));
            }
            Some(Some("replace")) => replace = true,
            Some(Some("merge")) => {}
            Some(_) => {
                return Err(bad_request(format!(
                    "strategic merge patch at {}: $patch in a list item must be delete, replace or merge, got {item}",
                    at_path(path)
                )));
            }
        }
    }
    if replace {
        return smp_fresh_list(items, schema, path);
    }

    let server_order = live.clone();
    let mut patch_order = Vec::with_capacity(items.len());
    for item in items {
        let id = item
            .get(key)
            .cloned()
            .ok_or_else(|| missing_merge_key(path, key, &item))?;
        let Value::Object(item) = item else {
            return unreachable_kind();
        };
        patch_order.push(Value::Object(Map::from_iter([(
            key.to_string(),
            id.clone(),
        )])));
        let found = live
            .iter()
            .position(|x| x.get(key).is_some_and(|v| json_equal(v, &id)));
        match found {
            Some(i) => {
                let Value::Object(existing) = std::mem::take(&mut live[i]) else {
                    return unreachable_kind();
                };
                live[i] = Value::Object(smp_map(existing, item, schema, path)?);
            }
            None => live.push(Value::Object(smp_map(Map::new(), item, schema, path)?)),
        }
    }
    Ok(order_merged(live, &patch_order, &server_order, merge))
}

/// Element kinds were checked by `element_kind`; this keeps the match total without panicking.
fn unreachable_kind<T>() -> Result<T, PatchError> {
    Err(bad_request(
        "strategic merge patch: list items changed kind while merging",
    ))
}

fn missing_merge_key(path: &[String], key: &str, item: &Value) -> PatchError {
    bad_request(format!(
        "strategic merge patch at {}: item {item} has no merge key {key:?}; every item of this list must name its {key:?}",
        at_path(path)
    ))
}

/// Applies `$setElementOrder/<field>` together with the patch's `<field>` list, if any.
fn apply_element_order(
    original: &mut Map<String, Value>,
    field: &str,
    order: &Value,
    patch_list: Option<Value>,
    schema: &Schema,
    path: &mut Vec<String>,
) -> Result<(), PatchError> {
    let here = format!(
        "{}{}{field}",
        at_path(path),
        if path.is_empty() { " " } else { "." }
    );
    let order = order.as_array().ok_or_else(|| {
        bad_request(format!(
            "strategic merge patch at {here}: $setElementOrder/{field} must be a list"
        ))
    })?;
    if field.is_empty() {
        return Err(bad_request(format!(
            "strategic merge patch at {}: $setElementOrder/ needs a list name after the slash",
            at_path(path)
        )));
    }
    let merge = schema.list_merge(path, field);
    let patch_items = match patch_list {
        None => None,
        Some(Value::Array(items)) => Some(items),
        Some(other) => {
            return Err(bad_request(format!(
                "strategic merge patch at {here}: expected a list, got {other}"
            )));
        }
    };
    if let Some(items) = &patch_items {
        check_order_consistent(items, order, merge, &here)?;
    }
    let live = match original.get(field) {
        None => None,
        Some(Value::Array(items)) => Some(items.clone()),
        Some(_) => None,
    };
    path.push(field.to_string());
    let merged = match (live.clone(), patch_items) {
        (Some(live), None) => Ok(live),
        (None, Some(items)) => smp_list(Vec::new(), items, merge, schema, path),
        (Some(live), Some(items)) => smp_list(live, items, merge, schema, path),
        (None, None) => {
            path.pop();
            return Ok(());
        }
    };
    path.pop();
    let merged = merged?;
    let ordered = if merge == ListMerge::Atomic {
        merged
    } else {
        order_merged(merged, order, live.as_deref().unwrap_or_default(), merge)
    };
    original.insert(field.to_string(), Value::Array(ordered));
    Ok(())
}

/// The patch list's items (deletions aside) must appear in `$setElementOrder` in the same order.
fn check_order_consistent(
    items: &[Value],
    order: &[Value],
    merge: ListMerge,
    here: &str,
) -> Result<(), PatchError> {
    let mut next = 0;
    for item in items.iter().filter(|i| i.get(PATCH_DIRECTIVE).is_none()) {
        let id = item_identity(item, merge);
        let found = order[next..].iter().position(
            |o| matches!((item_identity(o, merge), id), (Some(a), Some(b)) if json_equal(a, b)),
        );
        match found {
            Some(offset) => next += offset + 1,
            None => {
                return Err(bad_request(format!(
                    "strategic merge patch at {here}: item {item} is missing from $setElementOrder or out of its order"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::sim::patch::merge_patch;
    use crate::sim::patch::test_support::bad;

    fn live_deployment() -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "web", "namespace": "default", "generation": 3,
                "labels": {"app": "web"},
                "finalizers": ["a.example.com/f", "b.example.com/f"],
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}\n"}
            },
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "app", "image": "web:1", "imagePullPolicy": "IfNotPresent",
                                "env": [{"name": "MODE", "value": "prod"}, {"name": "LOG", "value": "debug"}],
                                "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                                "volumeMounts": [{"name": "data", "mountPath": "/data"}]
                            },
                            {"name": "sidecar", "image": "proxy:1"}
                        ],
                        "volumes": [{"name": "data", "emptyDir": {}}],
                        "tolerations": [{"key": "a", "operator": "Exists"}]
                    }
                }
            },
            "status": {"replicas": 2}
        })
    }

    #[test]
    fn kubectl_apply_drops_a_container_and_changes_an_image() {
        // What kubectl 1.32 sends for `apply` after the sidecar was removed from the file and
        // the app image changed: the 3-way patch with $setElementOrder and a delete directive.
        let patch = json!({
            "metadata": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"kind\":\"Deployment\"}\n"}},
            "spec": {"template": {"spec": {
                "$setElementOrder/containers": [{"name": "app"}],
                "containers": [
                    {"image": "web:2", "name": "app"},
                    {"$patch": "delete", "name": "sidecar"}
                ]
            }}}
        });
        let out = strategic_merge_patch(&live_deployment(), &patch).unwrap();
        let containers = out["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap();
        assert_eq!(containers.len(), 1);
        let app = &containers[0];
        assert_eq!(app["name"], "app");
        assert_eq!(app["image"], "web:2");
        assert_eq!(app["imagePullPolicy"], "IfNotPresent");
        assert_eq!(
            app["env"],
            json!([{"name": "MODE", "value": "prod"}, {"name": "LOG", "value": "debug"}]),
            "the kept container's env survives"
        );
        assert_eq!(
            out["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"],
            "{\"kind\":\"Deployment\"}\n"
        );
        assert_eq!(out["spec"]["replicas"], 2);
        assert_eq!(out["status"], json!({"replicas": 2}));
        assert!(
            !out.to_string().contains('$'),
            "no directive is stored: {out}"
        );
    }

    #[test]
    fn kubectl_apply_edits_env_in_place() {
        // MODE removed, LOG changed, NEW added after LOG, a port added, sidecar untouched.
        let patch = json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "app"}, {"name": "sidecar"}],
            "containers": [{
                "$setElementOrder/env": [{"name": "LOG"}, {"name": "NEW"}],
                "$setElementOrder/ports": [{"containerPort": 8080}, {"containerPort": 9090}],
                "env": [
                    {"name": "LOG", "value": "info"},
                    {"name": "NEW", "value": "x"},
                    {"$patch": "delete", "name": "MODE"}
                ],
                "name": "app",
                "ports": [{"containerPort": 9090, "name": "metrics"}]
            }]
        }}}});
        let out = strategic_merge_patch(&live_deployment(), &patch).unwrap();
        let containers = &out["spec"]["template"]["spec"]["containers"];
        assert_eq!(
            containers[0]["env"],
            json!([{"name": "LOG", "value": "info"}, {"name": "NEW", "value": "x"}])
        );
        assert_eq!(
            containers[0]["ports"],
            json!([{"containerPort": 8080, "protocol": "TCP"}, {"containerPort": 9090, "name": "metrics"}])
        );
        assert_eq!(
            containers[0]["volumeMounts"],
            json!([{"name": "data", "mountPath": "/data"}])
        );
        assert_eq!(
            containers[1],
            json!({"name": "sidecar", "image": "proxy:1"})
        );
    }

    #[test]
    fn set_element_order_reorders_without_content() {
        let patch = json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "sidecar"}, {"name": "app"}]
        }}}});
        let out = strategic_merge_patch(&live_deployment(), &patch).unwrap();
        let names: Vec<&str> = out["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["sidecar", "app"]);
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][1]["env"][0]["name"],
            "MODE"
        );
    }

    #[test]
    fn set_element_order_must_agree_with_the_patch_list() {
        let patch = json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "app"}],
            "containers": [{"name": "other", "image": "x"}]
        }}}});
        let err = bad(strategic_merge_patch(&live_deployment(), &patch));
        assert!(
            err.contains("$setElementOrder") && err.contains("containers"),
            "{err}"
        );
    }

    #[test]
    fn new_items_land_after_the_patch_items_they_follow() {
        // Live [a, b, c]; the patch touches b and adds d: d goes right after b, as upstream.
        let live = json!({"apiVersion": "v1", "kind": "Pod", "spec": {"containers": [
            {"name": "a"}, {"name": "b"}, {"name": "c"}
        ]}});
        let out = strategic_merge_patch(
            &live,
            &json!({"spec": {"containers": [{"name": "b", "image": "x"}, {"name": "d"}]}}),
        )
        .unwrap();
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "a"}, {"name": "b", "image": "x"}, {"name": "d"}, {"name": "c"}])
        );
    }

    #[test]
    fn lists_without_a_merge_key_are_replaced() {
        let patch = json!({"spec": {"template": {"spec": {
            "tolerations": [{"key": "b", "operator": "Exists"}],
            "containers": [{"name": "app", "args": ["--x"]}]
        }}}});
        let out = strategic_merge_patch(&live_deployment(), &patch).unwrap();
        assert_eq!(
            out["spec"]["template"]["spec"]["tolerations"],
            json!([{"key": "b", "operator": "Exists"}])
        );
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][0]["args"],
            json!(["--x"])
        );
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][0]["image"],
            "web:1"
        );
    }

    #[test]
    fn null_deletes_a_key() {
        let patch = json!({"metadata": {"labels": {"app": null, "tier": "front"}}, "spec": {"replicas": null, "missing": null}});
        let out = strategic_merge_patch(&live_deployment(), &patch).unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"tier": "front"}));
        assert!(out["spec"].get("replicas").is_none());
        assert!(out["spec"].get("missing").is_none());
    }

    #[test]
    fn retain_keys_clears_the_other_strategy() {
        let patch = json!({"spec": {"strategy": {"$retainKeys": ["type"], "rollingUpdate": null, "type": "Recreate"}}});
        let out = strategic_merge_patch(&live_deployment(), &patch).unwrap();
        assert_eq!(out["spec"]["strategy"], json!({"type": "Recreate"}));

        let volume = json!({"spec": {"template": {"spec": {
            "$setElementOrder/volumes": [{"name": "data"}],
            "volumes": [{"$retainKeys": ["configMap", "name"], "configMap": {"name": "cfg"}, "name": "data"}]
        }}}});
        let out = strategic_merge_patch(&live_deployment(), &volume).unwrap();
        assert_eq!(
            out["spec"]["template"]["spec"]["volumes"],
            json!([{"name": "data", "configMap": {"name": "cfg"}}])
        );

        let wrong = json!({"spec": {"strategy": {"$retainKeys": ["type"], "rollingUpdate": {"maxSurge": 1}}}});
        let err = bad(strategic_merge_patch(&live_deployment(), &wrong));
        assert!(
            err.contains("rollingUpdate") && err.contains(".spec.strategy"),
            "{err}"
        );
    }

    #[test]
    fn delete_from_primitive_list_and_set_merge() {
        let patch = json!({"metadata": {
            "$deleteFromPrimitiveList/finalizers": ["a.example.com/f"],
            "$setElementOrder/finalizers": ["c.example.com/f", "b.example.com/f"],
            "finalizers": ["c.example.com/f"]
        }});
        let out = strategic_merge_patch(&live_deployment(), &patch).unwrap();
        assert_eq!(
            out["metadata"]["finalizers"],
            json!(["c.example.com/f", "b.example.com/f"])
        );
        // Finalizers merge as a set: adding one that is there already changes nothing.
        let out = strategic_merge_patch(
            &live_deployment(),
            &json!({"metadata": {"finalizers": ["b.example.com/f", "z.example.com/f"]}}),
        )
        .unwrap();
        assert_eq!(
            out["metadata"]["finalizers"],
            json!(["a.example.com/f", "b.example.com/f", "z.example.com/f"])
        );
    }

    #[test]
    fn patch_directive_on_maps() {
        let replace = json!({"metadata": {"labels": {"$patch": "replace", "only": "this"}}});
        let out = strategic_merge_patch(&live_deployment(), &replace).unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"only": "this"}));

        let delete = json!({"spec": {"selector": {"$patch": "delete"}}});
        let out = strategic_merge_patch(&live_deployment(), &delete).unwrap();
        assert_eq!(out["spec"]["selector"], json!({}));

        let merge = json!({"metadata": {"labels": {"$patch": "merge", "tier": "x"}}});
        let out = strategic_merge_patch(&live_deployment(), &merge).unwrap();
        assert_eq!(
            out["metadata"]["labels"],
            json!({"app": "web", "tier": "x"})
        );

        let unknown = json!({"metadata": {"labels": {"$patch": "squash"}}});
        let err = bad(strategic_merge_patch(&live_deployment(), &unknown));
        assert!(
            err.contains("$patch") && err.contains(".metadata.labels"),
            "{err}"
        );
    }

    #[test]
    fn patch_directive_in_lists() {
        let replace = json!({"spec": {"template": {"spec": {"containers": [
            {"$patch": "replace"},
            {"name": "only", "image": "x:1"}
        ]}}}});
        let out = strategic_merge_patch(&live_deployment(), &replace).unwrap();
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"],
            json!([{"name": "only", "image": "x:1"}])
        );
        let clear = json!({"spec": {"template": {"spec": {"volumes": [{"$patch": "replace"}]}}}});
        let out = strategic_merge_patch(&live_deployment(), &clear).unwrap();
        assert_eq!(out["spec"]["template"]["spec"]["volumes"], json!([]));

        let merge = json!({"spec": {"template": {"spec": {"containers": [
            {"$patch": "merge"},
            {"name": "sidecar", "image": "proxy:2"}
        ]}}}});
        let out = strategic_merge_patch(&live_deployment(), &merge).unwrap();
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][1]["image"],
            "proxy:2"
        );
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][0]["image"],
            "web:1"
        );
    }

    #[test]
    fn directives_in_new_fields_are_not_stored() {
        let live =
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}});
        let patch = json!({"spec": {
            "$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
            "containers": [
                {"name": "b", "env": [{"name": "X", "value": "1"}, {"$patch": "delete", "name": "Y"}], "$setElementOrder/env": [{"name": "X"}]},
                {"name": "a", "resources": {"$patch": "replace", "limits": {"cpu": "1"}}, "securityContext": {"$patch": "delete"}}
            ],
            "nodeSelector": {"zone": "a", "gone": null}
        }});
        let out = strategic_merge_patch(&live, &patch).unwrap();
        assert_eq!(
            out["spec"],
            json!({
                "containers": [
                    {"name": "b", "env": [{"name": "X", "value": "1"}]},
                    {"name": "a", "resources": {"limits": {"cpu": "1"}}}
                ],
                "nodeSelector": {"zone": "a"}
            })
        );
    }

    #[test]
    fn service_ports_merge_by_port() {
        let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
        "spec": {"clusterIP": "10.0.0.1", "ports": [
            {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
            {"name": "grpc", "port": 9000, "protocol": "TCP"}
        ]}});
        let out = strategic_merge_patch(
            &svc,
            &json!({"spec": {"ports": [{"port": 80, "targetPort": 8081}]}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["ports"][0]["targetPort"], 8081);
        assert_eq!(out["spec"]["ports"][0]["name"], "http");
        assert_eq!(out["spec"]["ports"][1]["name"], "grpc");
        assert_eq!(out["spec"]["clusterIP"], "10.0.0.1");
    }

    #[test]
    fn owner_references_and_conditions_merge_by_key() {
        let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "r", "ownerReferences": [{"uid": "u1", "name": "a", "kind": "Rollout"}]},
            "status": {"conditions": [{"type": "ReplicaFailure", "status": "True"}]}});
        let out = strategic_merge_patch(
            &rs,
            &json!({
                "metadata": {"ownerReferences": [{"uid": "u1", "controller": true}, {"uid": "u2", "name": "b"}]},
                "status": {"conditions": [{"type": "Other", "status": "False"}]}
            }),
        )
        .unwrap();
        assert_eq!(
            out["metadata"]["ownerReferences"],
            json!([{"uid": "u1", "name": "a", "kind": "Rollout", "controller": true}, {"uid": "u2", "name": "b"}])
        );
        assert_eq!(out["status"]["conditions"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn custom_resource_lists_are_atomic_except_metadata() {
        let ro = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "metadata": {"finalizers": ["a"]},
            "spec": {"template": {"spec": {"containers": [{"name": "app", "image": "1", "env": [{"name": "A"}]}]}}}});
        let out = strategic_merge_patch(
            &ro,
            &json!({"metadata": {"finalizers": ["b"]}, "spec": {"template": {"spec": {"containers": [{"name": "app", "image": "2"}]}}}}),
        )
        .unwrap();
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"],
            json!([{"name": "app", "image": "2"}])
        );
        // Upstream puts items new to the live list before the ones only the server had.
        assert_eq!(out["metadata"]["finalizers"], json!(["b", "a"]));
    }

    #[test]
    fn malformed_strategic_patches_are_bad_requests() {
        let live = live_deployment();
        for (patch, reason) in [
            (json!([1]), "JSON object"),
            (
                json!({"spec": {"template": {"spec": {"containers": [{"image": "x"}]}}}}),
                "merge key \"name\"",
            ),
            (
                json!({"spec": {"template": {"spec": {"containers": [{"$patch": "delete"}]}}}}),
                "merge key",
            ),
            (
                json!({"spec": {"template": {"spec": {"containers": [{"$patch": "explode", "name": "app"}]}}}}),
                "$patch in a list item",
            ),
            (json!({"spec": {"$bogus": 1}}), "unknown directive"),
            (json!({"spec": {"$retainKeys": "type"}}), "$retainKeys"),
            (
                json!({"metadata": {"$deleteFromPrimitiveList/finalizers": "a"}}),
                "list of values",
            ),
            (
                json!({"spec": {"template": {"spec": {"$setElementOrder/containers": {"name": "app"}}}}}),
                "must be a list",
            ),
            (
                json!({"metadata": {"finalizers": [{"a": 1}]}}),
                "mixes objects",
            ),
        ] {
            let err = bad(strategic_merge_patch(&live, &patch));
            assert!(err.contains(reason), "{patch}: {err}");
        }
    }

    #[test]
    fn plain_merge_would_lose_env_but_strategic_does_not() {
        let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "image": "web:3"}]}}}});
        let plain = merge_patch(&live_deployment(), &patch);
        assert!(
            plain["spec"]["template"]["spec"]["containers"][0]
                .get("env")
                .is_none()
        );
        let strategic = strategic_merge_patch(&live_deployment(), &patch).unwrap();
        let containers = &strategic["spec"]["template"]["spec"]["containers"];
        assert_eq!(containers[0]["env"][0]["name"], "MODE");
        assert_eq!(containers[1]["name"], "sidecar");
    }
}

/// Replays the client-side apply bodies the real kubectl sent (see the fixture's `source`).
#[cfg(test)]
mod kubectl_fixture_tests {
    use serde_json::json;

    use super::*;
    use crate::sim::patch::server_side_apply::LAST_APPLIED;
    use crate::sim::patch::test_support::kubectl_apply_fixture as fixture;

    /// Fields a real API server defaults in every container and pod spec; patches must keep them.
    fn with_server_defaults(mut object: Value) -> Value {
        let pod_spec = &mut object["spec"]["template"]["spec"];
        pod_spec["dnsPolicy"] = json!("ClusterFirst");
        for container in pod_spec["containers"].as_array_mut().expect("containers") {
            container["imagePullPolicy"] = json!("IfNotPresent");
            container["terminationMessagePath"] = json!("/dev/termination-log");
        }
        object
    }

    #[test]
    fn client_side_apply_bodies_produce_the_manifest() {
        let fixture = fixture();
        for case in fixture["clientSideApply"].as_array().expect("cases") {
            let what = case["description"].as_str().unwrap();
            assert_eq!(
                case["contentType"],
                "application/strategic-merge-patch+json"
            );
            let live = with_server_defaults(case["live"].clone());
            let out = strategic_merge_patch(&live, &case["patch"])
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let want = with_server_defaults(json!({"spec": case["desiredSpec"]}));
            assert_eq!(out["spec"], want["spec"], "{what}");
            assert_eq!(out["status"], live["status"], "{what}");
            assert_eq!(
                out["metadata"]["annotations"][LAST_APPLIED],
                case["patch"]["metadata"]["annotations"][LAST_APPLIED],
                "{what}"
            );
            assert!(
                !out.to_string().contains("\"$"),
                "{what}: a directive was stored: {out}"
            );
        }
    }

    #[test]
    fn client_side_apply_adds_the_finalizer_and_keeps_metadata() {
        let fixture = fixture();
        let case = &fixture["clientSideApply"][1];
        let out = strategic_merge_patch(&case["live"], &case["patch"]).unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["example.com/keep"]));
        assert_eq!(out["metadata"]["uid"], case["live"]["metadata"]["uid"]);
        assert_eq!(
            out["metadata"]["labels"],
            case["live"]["metadata"]["labels"]
        );
    }
}
