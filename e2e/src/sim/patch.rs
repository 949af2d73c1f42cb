//! Patches as the API server applies them: RFC 6902 JSON patch, RFC 7386 merge patch, strategic
//! merge patch for built-in kinds (merge keys and `$` directives), and server-side apply with
//! field ownership recorded in `metadata.managedFields`.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

/// Why a patch was refused; the server maps each to a Kubernetes `Status`.
#[derive(Debug, Clone, PartialEq)]
pub enum PatchError {
    /// Malformed patch document: 400 BadRequest.
    BadRequest(String),
    /// Server-side apply field conflict without `force`: 409 Conflict.
    Conflict(String),
    /// The patched object is not acceptable (e.g. a JSON patch `test` failed): 422 Invalid.
    Invalid(String),
}

impl std::fmt::Display for PatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PatchError::BadRequest(m) | PatchError::Conflict(m) | PatchError::Invalid(m) => {
                f.write_str(m)
            }
        }
    }
}

impl std::error::Error for PatchError {}

fn bad_request(message: impl Into<String>) -> PatchError {
    PatchError::BadRequest(message.into())
}

/// JSON equality where numbers compare by value (`1` equals `1.0`), as RFC 6902 `test` requires.
fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            x == y || matches!((x.as_f64(), y.as_f64()), (Some(p), Some(q)) if p == q)
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_equal(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_equal(v, w)))
        }
        _ => a == b,
    }
}

// ---------------------------------------------------------------------------------------------
// RFC 6902 JSON patch
// ---------------------------------------------------------------------------------------------

/// RFC 6902 JSON patch (`application/json-patch+json`).
pub fn json_patch(doc: &Value, ops: &Value) -> Result<Value, PatchError> {
    let ops = ops.as_array().ok_or_else(|| {
        bad_request("json patch must be a JSON list of operations like [{\"op\":\"replace\",\"path\":\"/spec/replicas\",\"value\":3}]")
    })?;
    let mut doc = doc.clone();
    for (index, op) in ops.iter().enumerate() {
        apply_json_patch_op(&mut doc, index, op)?;
    }
    Ok(doc)
}

fn apply_json_patch_op(doc: &mut Value, index: usize, op: &Value) -> Result<(), PatchError> {
    let at = format!("json patch operation {index}");
    let op = op
        .as_object()
        .ok_or_else(|| bad_request(format!("{at}: must be an object, got {op}")))?;
    let name = op.get("op").and_then(Value::as_str).ok_or_else(|| {
        bad_request(format!(
            "{at}: \"op\" must be one of add, remove, replace, move, copy, test"
        ))
    })?;
    let path_text = op.get("path").and_then(Value::as_str).ok_or_else(|| {
        bad_request(format!(
            "{at} ({name}): \"path\" must be a JSON pointer string"
        ))
    })?;
    let at = format!("{at} ({name} {path_text})");
    let path = parse_pointer(path_text).map_err(|e| bad_request(format!("{at}: {e}")))?;
    let value = || {
        op.get("value")
            .cloned()
            .ok_or_else(|| bad_request(format!("{at}: \"value\" is required")))
    };
    let from = || -> Result<(String, Vec<String>), PatchError> {
        let text = op
            .get("from")
            .and_then(Value::as_str)
            .ok_or_else(|| bad_request(format!("{at}: \"from\" must be a JSON pointer string")))?;
        let tokens = parse_pointer(text).map_err(|e| bad_request(format!("{at}: from: {e}")))?;
        Ok((text.to_string(), tokens))
    };
    let invalid = |e: String| PatchError::Invalid(format!("{at}: {e}"));
    match name {
        "add" => pointer_add(doc, &path, value()?).map_err(invalid),
        "remove" => pointer_remove(doc, &path).map(drop).map_err(invalid),
        "replace" => {
            let value = value()?;
            let target = pointer_get_mut(doc, &path).ok_or_else(|| {
                invalid("path does not exist; use op \"add\" to create it".to_string())
            })?;
            *target = value;
            Ok(())
        }
        "move" => {
            let (from_text, from) = from()?;
            if from == path {
                return Ok(());
            }
            if path.len() > from.len() && path[..from.len()] == from[..] {
                return Err(invalid(format!(
                    "cannot move {from_text:?} into one of its own children"
                )));
            }
            let moved = pointer_remove(doc, &from).map_err(|e| invalid(format!("from: {e}")))?;
            pointer_add(doc, &path, moved).map_err(invalid)
        }
        "copy" => {
            let (_, from) = from()?;
            let copied = pointer_get(doc, &from)
                .cloned()
                .ok_or_else(|| invalid("from: path does not exist".to_string()))?;
            pointer_add(doc, &path, copied).map_err(invalid)
        }
        "test" => {
            let expected = value()?;
            match pointer_get(doc, &path) {
                Some(actual) if json_equal(actual, &expected) => Ok(()),
                Some(actual) => Err(invalid(format!(
                    "test failed: the value is {actual}, not {expected}"
                ))),
                None => Err(invalid("test failed: path does not exist".to_string())),
            }
        }
        other => Err(bad_request(format!(
            "{at}: unknown op {other:?}; use add, remove, replace, move, copy or test"
        ))),
    }
}

/// Splits a JSON pointer into unescaped reference tokens (`~1` is `/`, `~0` is `~`).
fn parse_pointer(pointer: &str) -> Result<Vec<String>, String> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err(format!("JSON pointer {pointer:?} must start with '/'"));
    };
    rest.split('/')
        .map(|token| {
            let mut out = String::with_capacity(token.len());
            let mut chars = token.chars();
            while let Some(c) = chars.next() {
                if c != '~' {
                    out.push(c);
                    continue;
                }
                match chars.next() {
                    Some('0') => out.push('~'),
                    Some('1') => out.push('/'),
                    _ => {
                        return Err(format!(
                            "JSON pointer {pointer:?}: '~' must be followed by 0 or 1"
                        ));
                    }
                }
            }
            Ok(out)
        })
        .collect()
}

/// An array index token: digits without leading zeros.
fn array_index(token: &str) -> Option<usize> {
    let well_formed = !token.is_empty()
        && token.bytes().all(|b| b.is_ascii_digit())
        && (token == "0" || !token.starts_with('0'));
    if well_formed {
        token.parse().ok()
    } else {
        None
    }
}

fn pointer_get<'a>(doc: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(doc, |cur, token| match cur {
        Value::Object(m) => m.get(token),
        Value::Array(a) => array_index(token).and_then(|i| a.get(i)),
        _ => None,
    })
}

fn pointer_get_mut<'a>(doc: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter().try_fold(doc, |cur, token| match cur {
        Value::Object(m) => m.get_mut(token),
        Value::Array(a) => array_index(token).and_then(|i| a.get_mut(i)),
        _ => None,
    })
}

fn pointer_add(doc: &mut Value, path: &[String], value: Value) -> Result<(), String> {
    let Some((last, parent_path)) = path.split_last() else {
        *doc = value;
        return Ok(());
    };
    let parent = pointer_get_mut(doc, parent_path)
        .ok_or_else(|| "the parent of the path does not exist".to_string())?;
    match parent {
        Value::Object(m) => {
            m.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(a) if last == "-" => {
            a.push(value);
            Ok(())
        }
        Value::Array(a) => match array_index(last) {
            Some(i) if i <= a.len() => {
                a.insert(i, value);
                Ok(())
            }
            _ => Err(format!(
                "index {last:?} is out of range for a list of {} items",
                a.len()
            )),
        },
        _ => Err("the parent of the path is neither an object nor a list".to_string()),
    }
}

fn pointer_remove(doc: &mut Value, path: &[String]) -> Result<Value, String> {
    let Some((last, parent_path)) = path.split_last() else {
        return Err("cannot remove the whole object".to_string());
    };
    let missing = || "path does not exist".to_string();
    match pointer_get_mut(doc, parent_path).ok_or_else(missing)? {
        Value::Object(m) => m.shift_remove(last).ok_or_else(missing),
        Value::Array(a) => match array_index(last) {
            Some(i) if i < a.len() => Ok(a.remove(i)),
            _ => Err(missing()),
        },
        _ => Err(missing()),
    }
}

// ---------------------------------------------------------------------------------------------
// RFC 7386 JSON merge patch
// ---------------------------------------------------------------------------------------------

/// RFC 7386 JSON merge patch (`application/merge-patch+json`).
pub fn merge_patch(doc: &Value, patch: &Value) -> Value {
    let Value::Object(patch) = patch else {
        return patch.clone();
    };
    let mut out = match doc {
        Value::Object(d) => d.clone(),
        _ => Map::new(),
    };
    for (k, v) in patch {
        if v.is_null() {
            out.shift_remove(k);
        } else {
            let merged = merge_patch(out.get(k).unwrap_or(&Value::Null), v);
            out.insert(k.clone(), merged);
        }
    }
    Value::Object(out)
}

// ---------------------------------------------------------------------------------------------
// Merge semantics of list fields, shared by strategic merge patch and server-side apply
// ---------------------------------------------------------------------------------------------

/// How a list field merges, from the `patchStrategy`/`patchMergeKey` tags of the built-in types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListMerge {
    /// The list is replaced as a whole.
    Atomic,
    /// A list of objects merged item by item, matching items on this field.
    Keyed(&'static str),
    /// A list of scalars merged as a set.
    Set,
}

/// What the patch code needs to know about the object being patched.
#[derive(Debug, Clone)]
struct Schema {
    kind: String,
    /// Built-in kinds carry patch tags; custom resources only have those of `ObjectMeta`.
    builtin: bool,
}

impl Schema {
    fn of(object: &Value) -> Self {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        Self {
            kind: object["kind"].as_str().unwrap_or_default().to_string(),
            builtin: group.is_empty() || !group.contains('.') || group.ends_with(".k8s.io"),
        }
    }

    /// `path` names the fields from the object root to the map holding `field` (a list's name
    /// stands for its items).
    fn list_merge(&self, path: &[String], field: &str) -> ListMerge {
        list_merge(&self.kind, self.builtin, path, field)
    }
}

const CONTAINER_LISTS: [&str; 3] = ["containers", "initContainers", "ephemeralContainers"];
const CONTAINER_STATUS_LISTS: [&str; 3] = [
    "containerStatuses",
    "initContainerStatuses",
    "ephemeralContainerStatuses",
];

/// The merge strategy of list `field` inside the map at `path` of an object of `kind`
/// (`builtin` false for custom resources).
pub fn list_merge(kind: &str, builtin: bool, path: &[String], field: &str) -> ListMerge {
    let parent = path.last().map_or("", String::as_str);
    match (parent, field) {
        ("metadata", "ownerReferences") => return ListMerge::Keyed("uid"),
        ("metadata", "finalizers") => return ListMerge::Set,
        _ if !builtin => return ListMerge::Atomic,
        _ => {}
    }
    match (parent, field) {
        (
            "spec",
            "containers"
            | "initContainers"
            | "ephemeralContainers"
            | "volumes"
            | "imagePullSecrets"
            | "schedulingGates"
            | "resourceClaims",
        ) => ListMerge::Keyed("name"),
        ("spec", "hostAliases") => ListMerge::Keyed("ip"),
        ("spec", "topologySpreadConstraints") => ListMerge::Keyed("topologyKey"),
        ("spec", "podCIDRs") => ListMerge::Set,
        // A Service's ports sit directly under the root `spec`.
        ("spec", "ports") if path.len() == 1 => ListMerge::Keyed("port"),
        (p, "ports") if CONTAINER_LISTS.contains(&p) => ListMerge::Keyed("containerPort"),
        (p, "env") if CONTAINER_LISTS.contains(&p) => ListMerge::Keyed("name"),
        (p, "volumeMounts")
            if CONTAINER_LISTS.contains(&p) || CONTAINER_STATUS_LISTS.contains(&p) =>
        {
            ListMerge::Keyed("mountPath")
        }
        (p, "volumeDevices") if CONTAINER_LISTS.contains(&p) => ListMerge::Keyed("devicePath"),
        (p, "allocatedResourcesStatus") if CONTAINER_STATUS_LISTS.contains(&p) => {
            ListMerge::Keyed("name")
        }
        ("status", "conditions") => ListMerge::Keyed("type"),
        ("status", "podIPs" | "hostIPs") => ListMerge::Keyed("ip"),
        ("status", "addresses") if kind == "Node" => ListMerge::Keyed("type"),
        ("", "secrets") if kind == "ServiceAccount" => ListMerge::Keyed("name"),
        _ => ListMerge::Atomic,
    }
}

// ---------------------------------------------------------------------------------------------
// Strategic merge patch
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Field ownership (managedFields) and server-side apply
// ---------------------------------------------------------------------------------------------

/// One step of a managed field's path, as written in `fieldsV1`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum PathElement {
    /// `f:<name>`: a field of a map.
    Field(String),
    /// `k:{"name":"app"}`: the item of a keyed list, as the compact JSON of its key fields.
    Key(String),
    /// `v:"x"`: a member of a set-like list, as compact JSON.
    Value(String),
    /// `i:3`: a list position (only read from managedFields written elsewhere).
    Index(usize),
}

type FieldPath = Vec<PathElement>;
type FieldSet = BTreeSet<FieldPath>;

impl PathElement {
    fn fields_v1_key(&self) -> String {
        match self {
            PathElement::Field(name) => format!("f:{name}"),
            PathElement::Key(key) => format!("k:{key}"),
            PathElement::Value(value) => format!("v:{value}"),
            PathElement::Index(index) => format!("i:{index}"),
        }
    }

    fn parse(text: &str) -> Option<Self> {
        let (prefix, rest) = text.split_once(':')?;
        match prefix {
            "f" => Some(PathElement::Field(rest.to_string())),
            "k" => {
                let key: Map<String, Value> = serde_json::from_str(rest).ok()?;
                Some(PathElement::Key(canonical_key(&key)))
            }
            "v" => {
                let value: Value = serde_json::from_str(rest).ok()?;
                Some(PathElement::Value(value.to_string()))
            }
            "i" => rest.parse().ok().map(PathElement::Index),
            _ => None,
        }
    }

    /// Whether list `item` is the one this element names.
    fn names_item(&self, item: &Value) -> bool {
        match self {
            PathElement::Key(key) => {
                serde_json::from_str::<Map<String, Value>>(key).is_ok_and(|key| {
                    key.iter()
                        .all(|(k, v)| item.get(k).is_some_and(|w| json_equal(v, w)))
                })
            }
            PathElement::Value(value) => {
                serde_json::from_str::<Value>(value).is_ok_and(|v| json_equal(&v, item))
            }
            _ => false,
        }
    }
}

/// The key fields of a keyed list item, compact JSON with sorted keys as Kubernetes writes them.
fn canonical_key(key: &Map<String, Value>) -> String {
    let sorted: BTreeMap<&String, &Value> = key.iter().collect();
    let fields: Vec<String> = sorted
        .into_iter()
        .map(|(k, v)| format!("{}:{v}", Value::String(k.clone())))
        .collect();
    format!("{{{}}}", fields.join(","))
}

/// A path as Kubernetes prints it in conflict messages: `.spec.containers[name="app"].image`.
fn display_path(path: &[PathElement]) -> String {
    path.iter()
        .map(|e| match e {
            PathElement::Field(name) => format!(".{name}"),
            PathElement::Key(key) => {
                let pairs: Vec<String> = serde_json::from_str::<Map<String, Value>>(key)
                    .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect())
                    .unwrap_or_default();
                format!("[{}]", pairs.join(","))
            }
            PathElement::Value(value) => format!("[={value}]"),
            PathElement::Index(index) => format!("[{index}]"),
        })
        .collect()
}

fn value_at<'a>(object: &'a Value, path: &[PathElement]) -> Option<&'a Value> {
    path.iter().try_fold(object, |cur, element| match element {
        PathElement::Field(name) => cur.get(name),
        PathElement::Index(index) => cur.as_array()?.get(*index),
        _ => cur.as_array()?.iter().find(|item| element.names_item(item)),
    })
}

/// Metadata the server owns; no manager ever owns these.
const SERVER_METADATA: [&str; 10] = [
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

fn is_unowned_field(names: &[String], field: &str) -> bool {
    match names {
        [] => field == "apiVersion" || field == "kind",
        [only] if only == "metadata" => SERVER_METADATA.contains(&field),
        _ => false,
    }
}

/// The set of fields `object` sets, in the shape managedFields records them.
fn fields_of(object: &Value, schema: &Schema) -> FieldSet {
    let mut out = FieldSet::new();
    if let Value::Object(map) = object {
        collect_fields(map, schema, &mut Vec::new(), &mut Vec::new(), &mut out);
    }
    out
}

fn collect_fields(
    map: &Map<String, Value>,
    schema: &Schema,
    names: &mut Vec<String>,
    prefix: &mut FieldPath,
    out: &mut FieldSet,
) {
    for (field, value) in map {
        if value.is_null() || is_unowned_field(names, field) {
            continue;
        }
        prefix.push(PathElement::Field(field.clone()));
        match value {
            Value::Object(child) if !child.is_empty() => {
                names.push(field.clone());
                collect_fields(child, schema, names, prefix, out);
                names.pop();
            }
            Value::Array(items) => match schema.list_merge(names, field) {
                ListMerge::Keyed(key) if items.iter().all(|i| i.get(key).is_some()) => {
                    names.push(field.clone());
                    for item in items {
                        let Some(item) = item.as_object() else {
                            continue;
                        };
                        let key_fields =
                            Map::from_iter(item.get(key).map(|id| (key.to_string(), id.clone())));
                        prefix.push(PathElement::Key(canonical_key(&key_fields)));
                        out.insert(prefix.clone());
                        collect_fields(item, schema, names, prefix, out);
                        prefix.pop();
                    }
                    names.pop();
                }
                ListMerge::Set if items.iter().all(|i| !i.is_object() && !i.is_array()) => {
                    for item in items {
                        prefix.push(PathElement::Value(item.to_string()));
                        out.insert(prefix.clone());
                        prefix.pop();
                    }
                }
                _ => {
                    out.insert(prefix.clone());
                }
            },
            _ => {
                out.insert(prefix.clone());
            }
        }
        prefix.pop();
    }
}

#[derive(Default)]
struct FieldTree {
    member: bool,
    children: BTreeMap<String, FieldTree>,
}

fn fields_v1(set: &FieldSet) -> Value {
    let mut root = FieldTree::default();
    for path in set {
        let node = path.iter().fold(&mut root, |node, element| {
            node.children.entry(element.fields_v1_key()).or_default()
        });
        node.member = true;
    }
    fn render(node: &FieldTree) -> Value {
        let mut map = Map::new();
        if node.member && !node.children.is_empty() {
            map.insert(".".to_string(), Value::Object(Map::new()));
        }
        for (key, child) in &node.children {
            map.insert(key.clone(), render(child));
        }
        Value::Object(map)
    }
    render(&root)
}

fn parse_fields_v1(value: &Value) -> FieldSet {
    fn walk(map: &Map<String, Value>, prefix: &mut FieldPath, out: &mut FieldSet) {
        for (key, child) in map {
            if key == "." {
                out.insert(prefix.clone());
                continue;
            }
            let Some(element) = PathElement::parse(key) else {
                continue;
            };
            prefix.push(element);
            match child.as_object() {
                Some(grandchildren) if !grandchildren.is_empty() => {
                    walk(grandchildren, prefix, out)
                }
                _ => {
                    out.insert(prefix.clone());
                }
            }
            prefix.pop();
        }
    }
    let mut out = FieldSet::new();
    if let Some(map) = value.as_object() {
        walk(map, &mut Vec::new(), &mut out);
    }
    out
}

/// One `metadata.managedFields` entry, with its field set decoded.
struct ManagedEntry {
    raw: Map<String, Value>,
    fields: FieldSet,
}

impl ManagedEntry {
    fn new(manager: &str, operation: &str, api_version: &str, subresource: Option<&str>) -> Self {
        let mut raw = Map::new();
        raw.insert("manager".into(), manager.into());
        raw.insert("operation".into(), operation.into());
        raw.insert("apiVersion".into(), api_version.into());
        if let Some(subresource) = subresource {
            raw.insert("subresource".into(), subresource.into());
        }
        Self {
            raw,
            fields: FieldSet::new(),
        }
    }

    fn text(&self, field: &str) -> &str {
        self.raw
            .get(field)
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    fn is(&self, manager: &str, operation: &str, subresource: Option<&str>) -> bool {
        self.text("manager") == manager
            && self.text("operation") == operation
            && self.raw.get("subresource").and_then(Value::as_str) == subresource
    }

    fn owns_within(&self, path: &[PathElement]) -> bool {
        self.fields
            .range(path.to_vec()..)
            .next()
            .is_some_and(|p| p.starts_with(path))
    }

    /// The manager as Kubernetes names it in conflict messages.
    fn describe(&self) -> String {
        let mut out = format!("{:?}", self.text("manager"));
        if let Some(subresource) = self.raw.get("subresource").and_then(Value::as_str) {
            out.push_str(&format!(" with subresource {subresource:?}"));
        }
        if self.text("operation") == "Update" {
            out.push_str(&format!(" using {}", self.text("apiVersion")));
            if let Some(time) = self.raw.get("time").and_then(Value::as_str) {
                out.push_str(&format!(" at {time}"));
            }
        }
        out
    }

    fn to_json(&self) -> Value {
        let mut raw = self.raw.clone();
        raw.insert("fieldsType".into(), "FieldsV1".into());
        raw.insert("fieldsV1".into(), fields_v1(&self.fields));
        Value::Object(raw)
    }
}

fn read_managed_fields(object: &Value) -> Vec<ManagedEntry> {
    object["metadata"]["managedFields"]
        .as_array()
        .map(|entries| {
            entries
                .iter()
                .filter_map(Value::as_object)
                .map(|raw| ManagedEntry {
                    fields: parse_fields_v1(raw.get("fieldsV1").unwrap_or(&Value::Null)),
                    raw: raw.clone(),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn write_managed_fields(object: &mut Value, entries: Vec<ManagedEntry>) {
    let entries: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(ManagedEntry::to_json)
        .collect();
    let Some(root) = object.as_object_mut() else {
        return;
    };
    let metadata = root
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !metadata.is_object() {
        *metadata = Value::Object(Map::new());
    }
    let Some(metadata) = metadata.as_object_mut() else {
        return;
    };
    if entries.is_empty() {
        metadata.shift_remove("managedFields");
    } else {
        metadata.insert("managedFields".into(), Value::Array(entries));
    }
}

/// The object without its managedFields, to tell whether a write changed anything else.
fn without_managed_fields(object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(metadata) = copy.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.shift_remove("managedFields");
    }
    copy
}

fn without_nulls(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_nulls).collect()),
        scalar => scalar.clone(),
    }
}

/// Deep-merges an apply configuration into the live object: maps recursively, keyed lists by
/// key, set lists as sets, everything else replaced.
fn apply_merge(live: &mut Value, applied: &Value, schema: &Schema, names: &mut Vec<String>) {
    let (Value::Object(live_map), Value::Object(applied_map)) = (&mut *live, applied) else {
        *live = without_nulls(applied);
        return;
    };
    for (field, value) in applied_map {
        if value.is_null() || (names.len() == 1 && is_unowned_field(names, field)) {
            continue;
        }
        let Some(existing) = live_map.get_mut(field) else {
            live_map.insert(field.clone(), without_nulls(value));
            continue;
        };
        match (&mut *existing, value) {
            (Value::Object(_), Value::Object(_)) => {
                names.push(field.clone());
                apply_merge(existing, value, schema, names);
                names.pop();
            }
            (Value::Array(live_items), Value::Array(applied_items)) => {
                match schema.list_merge(names, field) {
                    ListMerge::Keyed(key) if applied_items.iter().all(|i| i.get(key).is_some()) => {
                        names.push(field.clone());
                        for item in applied_items {
                            let id = &item[key];
                            let found = live_items
                                .iter_mut()
                                .find(|l| l.get(key).is_some_and(|v| json_equal(v, id)));
                            match found {
                                Some(live_item) => apply_merge(live_item, item, schema, names),
                                None => live_items.push(without_nulls(item)),
                            }
                        }
                        names.pop();
                    }
                    ListMerge::Set => {
                        for item in applied_items {
                            if !live_items.iter().any(|l| json_equal(l, item)) {
                                live_items.push(item.clone());
                            }
                        }
                    }
                    _ => *existing = without_nulls(value),
                }
            }
            _ => *existing = without_nulls(value),
        }
    }
}

/// Removes the field or list item at `path`; maps emptied by the removal go too, except the
/// top-level ones (`metadata`, `spec`) and those somebody owns.
fn remove_at(object: &mut Value, path: &[PathElement], owned: &dyn Fn(&[PathElement]) -> bool) {
    let Some((last, parent_path)) = path.split_last() else {
        return;
    };
    let Some(parent) = value_at_mut(object, parent_path) else {
        return;
    };
    match (parent, last) {
        (Value::Object(map), PathElement::Field(name)) => {
            map.shift_remove(name);
        }
        (Value::Array(items), PathElement::Index(index)) if *index < items.len() => {
            items.remove(*index);
        }
        (Value::Array(items), element) => items.retain(|item| !element.names_item(item)),
        _ => return,
    }
    let emptied = value_at(object, parent_path).is_some_and(|p| {
        p.as_object().is_some_and(Map::is_empty)
            && matches!(parent_path.last(), Some(PathElement::Field(_)))
    });
    if emptied && parent_path.len() > 1 && !owned(parent_path) {
        remove_at(object, parent_path, owned);
    }
}

fn value_at_mut<'a>(object: &'a mut Value, path: &[PathElement]) -> Option<&'a mut Value> {
    path.iter().try_fold(object, |cur, element| match element {
        PathElement::Field(name) => cur.get_mut(name),
        PathElement::Index(index) => cur.as_array_mut()?.get_mut(*index),
        _ => cur
            .as_array_mut()?
            .iter_mut()
            .find(|item| element.names_item(item)),
    })
}

fn conflict_message(conflicts: &[(String, String)]) -> String {
    if let [(manager, path)] = conflicts {
        return format!("Apply failed with 1 conflict: conflict with {manager}: {path}");
    }
    let mut by_manager: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (manager, path) in conflicts {
        by_manager.entry(manager).or_default().push(path);
    }
    let lines: Vec<String> = by_manager
        .into_iter()
        .flat_map(|(manager, paths)| {
            std::iter::once(format!("conflicts with {manager}:"))
                .chain(paths.into_iter().map(|p| format!("- {p}")))
        })
        .collect();
    format!(
        "Apply failed with {} conflicts: {}",
        conflicts.len(),
        lines.join("\n")
    )
}

/// Server-side apply (`application/apply-patch+yaml`): create when `live` is None, else deep
/// merge `applied` into `live`, recording `manager` in `metadata.managedFields` (`now` is the
/// RFC 3339 time for the entry).
pub fn server_side_apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    now: &str,
) -> Result<Value, PatchError> {
    server_side_apply_subresource(live, applied, manager, None, force, now)
}

/// [`server_side_apply`] through a subresource (`Some("status")`): the manager's entry is kept
/// apart from its main-resource apply, as Kubernetes does, so applying status does not drop the
/// manager's spec fields.
pub fn server_side_apply_subresource(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    subresource: Option<&str>,
    force: bool,
    now: &str,
) -> Result<Value, PatchError> {
    if !applied.is_object() {
        return Err(bad_request(
            "apply configuration must be an object with apiVersion, kind and metadata.name",
        ));
    }
    if manager.is_empty() {
        return Err(bad_request(
            "server-side apply needs a field manager: pass ?fieldManager=<name> (kubectl: --field-manager)",
        ));
    }
    let schema = Schema::of(applied);
    let applied_fields = fields_of(applied, &schema);
    let api_version = applied["apiVersion"]
        .as_str()
        .or_else(|| live.and_then(|l| l["apiVersion"].as_str()))
        .unwrap_or_default();

    let Some(live) = live else {
        let mut created = without_nulls(applied);
        let mut entry = ManagedEntry::new(manager, "Apply", api_version, subresource);
        entry.raw.insert("time".into(), now.into());
        entry.fields = applied_fields;
        write_managed_fields(&mut created, vec![entry]);
        return Ok(created);
    };

    let mut entries = read_managed_fields(live);
    let mine = entries
        .iter()
        .position(|e| e.is(manager, "Apply", subresource));

    // Fields this apply changes that other managers own: conflicts unless forced.
    let mut taken: Vec<(usize, FieldPath)> = Vec::new();
    for path in applied_fields
        .iter()
        .filter(|p| matches!(p.last(), Some(PathElement::Field(_))))
    {
        let same = matches!(
            (value_at(live, path), value_at(applied, path)),
            (Some(a), Some(b)) if json_equal(a, b)
        );
        if same {
            continue;
        }
        for (i, entry) in entries.iter().enumerate() {
            if Some(i) != mine && entry.fields.contains(path) {
                taken.push((i, path.clone()));
            }
        }
    }
    let allowed = match manager {
        KUBECTL_MANAGER if !taken.is_empty() => {
            last_applied_fields(live, &schema).unwrap_or_default()
        }
        _ => FieldSet::new(),
    };
    let conflicts: Vec<(String, String)> = taken
        .iter()
        .filter(|(_, path)| !allowed.contains(path))
        .map(|(i, path)| (entries[*i].describe(), display_path(path)))
        .collect();
    if !conflicts.is_empty() && !force {
        return Err(PatchError::Conflict(conflict_message(&conflicts)));
    }
    for (i, path) in taken {
        entries[i].fields.remove(&path);
    }

    let mut merged = live.clone();
    apply_merge(&mut merged, applied, &schema, &mut Vec::new());

    let previous = mine
        .map(|i| std::mem::take(&mut entries[i].fields))
        .unwrap_or_default();
    let others_own = |path: &[PathElement]| {
        entries
            .iter()
            .enumerate()
            .any(|(i, e)| Some(i) != mine && e.owns_within(path))
    };
    let doomed: Vec<&FieldPath> = previous
        .iter()
        .filter(|path| {
            let still_applied = applied_fields
                .range((*path).clone()..)
                .next()
                .is_some_and(|p| p.starts_with(path));
            !still_applied && !others_own(path)
        })
        .collect();
    let owned =
        |p: &[PathElement]| others_own(p) || applied_fields.iter().any(|a| a.starts_with(p));
    for path in &doomed {
        // Removing a list item or map removes what it holds; its fields need no visit.
        let inside_doomed = doomed
            .iter()
            .any(|d| d.len() < path.len() && path.starts_with(d));
        if !inside_doomed {
            remove_at(&mut merged, path, &owned);
        }
    }

    let unchanged = previous == applied_fields
        && without_managed_fields(&merged) == without_managed_fields(live);
    let index = match mine {
        Some(i) => i,
        None => {
            entries.push(ManagedEntry::new(
                manager,
                "Apply",
                api_version,
                subresource,
            ));
            entries.len() - 1
        }
    };
    let entry = &mut entries[index];
    if !unchanged || !entry.raw.contains_key("time") {
        entry.raw.insert("time".into(), now.into());
    }
    entry.raw.insert("apiVersion".into(), api_version.into());
    entry.fields = applied_fields;
    write_managed_fields(&mut merged, entries);
    if manager == KUBECTL_MANAGER {
        sync_last_applied(&mut merged, applied);
    }
    Ok(merged)
}

/// The field manager `kubectl apply --server-side` uses by default.
const KUBECTL_MANAGER: &str = "kubectl";
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The fields the object's client-side-apply annotation names and that still hold the value it
/// gave them. When `kubectl` server-side applies over an object `kubectl apply` managed before,
/// conflicts on these are not conflicts: that is how the API server lets users switch from
/// client-side to server-side apply. Fields somebody changed since still conflict.
fn last_applied_fields(live: &Value, schema: &Schema) -> Option<FieldSet> {
    let annotation = live["metadata"]["annotations"][LAST_APPLIED].as_str()?;
    let last_applied: Value = serde_json::from_str(annotation).ok()?;
    let unchanged = |path: &FieldPath| match (value_at(live, path), value_at(&last_applied, path)) {
        (Some(a), Some(b)) => json_equal(a, b),
        _ => false,
    };
    Some(
        fields_of(&last_applied, schema)
            .into_iter()
            .filter(unchanged)
            .collect(),
    )
}

/// Keeps an existing client-side-apply annotation equal to what `kubectl` server-side applied,
/// so a later client-side `kubectl apply` computes its patch from the current configuration.
fn sync_last_applied(merged: &mut Value, applied: &Value) {
    let Some(annotations) = merged
        .get_mut("metadata")
        .and_then(|m| m.get_mut("annotations"))
        .and_then(Value::as_object_mut)
        .filter(|a| a.contains_key(LAST_APPLIED))
    else {
        return;
    };
    let mut config = applied.clone();
    if let Some(applied_annotations) = config
        .get_mut("metadata")
        .and_then(|m| m.get_mut("annotations"))
        .and_then(Value::as_object_mut)
    {
        applied_annotations.shift_remove(LAST_APPLIED);
    }
    // Go encodes maps with sorted keys and a trailing newline.
    let encoded = format!("{}\n", sorted_json(&config));
    annotations.insert(LAST_APPLIED.into(), Value::String(encoded));
}

/// Compact JSON with every object's keys sorted.
fn sorted_json(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let sorted: BTreeMap<&String, &Value> = map.iter().collect();
            let fields: Vec<String> = sorted
                .into_iter()
                .map(|(k, v)| format!("{}:{}", Value::String(k.clone()), sorted_json(v)))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(sorted_json).collect();
            format!("[{}]", items.join(","))
        }
        scalar => scalar.to_string(),
    }
}

/// Records a non-apply write (create, update, patch) by `manager` in `after`'s managedFields
/// (operation `Update`), so later applies see who set which field. Returns `after` with the
/// new managedFields.
pub fn record_update(
    live_before: Option<&Value>,
    after: &Value,
    manager: &str,
    now: &str,
) -> Value {
    record_subresource_update(live_before, after, manager, None, now)
}

/// [`record_update`] for a write through a subresource (`Some("status")`, `Some("scale")`).
pub fn record_subresource_update(
    live_before: Option<&Value>,
    after: &Value,
    manager: &str,
    subresource: Option<&str>,
    now: &str,
) -> Value {
    let schema = Schema::of(after);
    let after_fields = fields_of(after, &schema);
    let before_fields = live_before
        .map(|b| fields_of(b, &schema))
        .unwrap_or_default();
    // A client that sends managedFields replaces them, one that omits them keeps the live ones.
    let sent = read_managed_fields(after);
    let mut entries = if sent.is_empty() {
        live_before.map(read_managed_fields).unwrap_or_default()
    } else {
        sent
    };

    let changed: FieldSet = after_fields
        .iter()
        .filter(|path| match live_before {
            None => true,
            Some(before) => match (value_at(before, path), path.last()) {
                (None, _) => true,
                (Some(b), Some(PathElement::Field(_))) => {
                    !value_at(after, path).is_some_and(|a| json_equal(a, b))
                }
                (Some(_), _) => false,
            },
        })
        .cloned()
        .collect();
    let removed: Vec<&FieldPath> = before_fields.difference(&after_fields).collect();

    for entry in &mut entries {
        for path in &removed {
            entry.fields.remove(*path);
        }
        if !entry.is(manager, "Update", subresource) {
            entry.fields.retain(|p| !changed.contains(p));
        }
    }
    if !changed.is_empty() {
        let index = match entries
            .iter()
            .position(|e| e.is(manager, "Update", subresource))
        {
            Some(i) => i,
            None => {
                let api_version = after["apiVersion"].as_str().unwrap_or_default();
                entries.push(ManagedEntry::new(
                    manager,
                    "Update",
                    api_version,
                    subresource,
                ));
                entries.len() - 1
            }
        };
        let entry = &mut entries[index];
        entry.raw.insert("time".into(), now.into());
        if let Some(api_version) = after["apiVersion"].as_str() {
            entry.raw.insert("apiVersion".into(), api_version.into());
        }
        entry.fields.extend(changed);
    }
    let mut out = after.clone();
    write_managed_fields(&mut out, entries);
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn bad(r: Result<Value, PatchError>) -> String {
        match r {
            Err(PatchError::BadRequest(m)) => m,
            other => panic!("expected BadRequest, got {other:?}"),
        }
    }

    fn invalid(r: Result<Value, PatchError>) -> String {
        match r {
            Err(PatchError::Invalid(m)) => m,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    // ----- JSON patch -----

    #[test]
    fn json_patch_add_replace_remove() {
        let doc = json!({"spec": {"replicas": 1, "tags": ["a", "b"]}});
        let out = json_patch(
            &doc,
            &json!([
                {"op": "replace", "path": "/spec/replicas", "value": 3},
                {"op": "add", "path": "/spec/paused", "value": true},
                {"op": "add", "path": "/spec/tags/1", "value": "x"},
                {"op": "add", "path": "/spec/tags/-", "value": "z"},
                {"op": "remove", "path": "/spec/tags/0"},
            ]),
        )
        .unwrap();
        assert_eq!(
            out,
            json!({"spec": {"replicas": 3, "tags": ["x", "b", "z"], "paused": true}})
        );
    }

    #[test]
    fn json_patch_add_replaces_an_existing_member_and_the_root() {
        let doc = json!({"a": 1});
        assert_eq!(
            json_patch(&doc, &json!([{"op": "add", "path": "/a", "value": 2}])).unwrap(),
            json!({"a": 2})
        );
        assert_eq!(
            json_patch(&doc, &json!([{"op": "add", "path": "", "value": {"b": 1}}])).unwrap(),
            json!({"b": 1})
        );
        assert_eq!(
            json_patch(&doc, &json!([{"op": "add", "path": "/n", "value": null}])).unwrap(),
            json!({"a": 1, "n": null})
        );
    }

    #[test]
    fn json_patch_pointer_escaping() {
        let doc = json!({"metadata": {"annotations": {"rollouts.dev/step": "1", "a~b": "x"}}});
        let out = json_patch(
            &doc,
            &json!([
                {"op": "replace", "path": "/metadata/annotations/rollouts.dev~1step", "value": "2"},
                {"op": "remove", "path": "/metadata/annotations/a~0b"},
                {"op": "add", "path": "/metadata/annotations/x~1y~0z", "value": "3"},
            ]),
        )
        .unwrap();
        assert_eq!(
            out,
            json!({"metadata": {"annotations": {"rollouts.dev/step": "2", "x/y~z": "3"}}})
        );
    }

    #[test]
    fn json_patch_move_and_copy() {
        let doc = json!({"a": {"b": 1}, "list": [1, 2, 3]});
        let out = json_patch(
            &doc,
            &json!([
                {"op": "copy", "from": "/a/b", "path": "/c"},
                {"op": "move", "from": "/a", "path": "/moved"},
                {"op": "move", "from": "/list/0", "path": "/list/-"},
            ]),
        )
        .unwrap();
        assert_eq!(out, json!({"list": [2, 3, 1], "c": 1, "moved": {"b": 1}}));
        let err = invalid(json_patch(
            &doc,
            &json!([{"op": "move", "from": "/a", "path": "/a/b/c"}]),
        ));
        assert!(err.contains("own children"), "{err}");
        assert_eq!(
            json_patch(&doc, &json!([{"op": "move", "from": "/a", "path": "/a"}])).unwrap(),
            doc
        );
    }

    #[test]
    fn json_patch_test_op() {
        let doc = json!({"metadata": {"resourceVersion": "7"}, "spec": {"replicas": 2}});
        let ok = json_patch(
            &doc,
            &json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "test", "path": "/spec/replicas", "value": 2.0},
                {"op": "replace", "path": "/spec/replicas", "value": 5},
            ]),
        )
        .unwrap();
        assert_eq!(ok["spec"]["replicas"], 5);
        let err = invalid(json_patch(
            &doc,
            &json!([
                {"op": "replace", "path": "/spec/replicas", "value": 5},
                {"op": "test", "path": "/metadata/resourceVersion", "value": "6"},
            ]),
        ));
        assert!(
            err.contains("operation 1") && err.contains("test failed"),
            "{err}"
        );
        let err = invalid(json_patch(
            &doc,
            &json!([{"op": "test", "path": "/nope", "value": 1}]),
        ));
        assert!(err.contains("does not exist"), "{err}");
    }

    #[test]
    fn json_patch_missing_paths_are_invalid() {
        let doc = json!({"spec": {"list": [1]}});
        for ops in [
            json!([{"op": "replace", "path": "/spec/missing", "value": 1}]),
            json!([{"op": "remove", "path": "/spec/missing"}]),
            json!([{"op": "add", "path": "/nope/deeper", "value": 1}]),
            json!([{"op": "add", "path": "/spec/list/5", "value": 1}]),
            json!([{"op": "add", "path": "/spec/list/01", "value": 1}]),
            json!([{"op": "remove", "path": "/spec/list/-"}]),
            json!([{"op": "remove", "path": ""}]),
            json!([{"op": "copy", "from": "/x", "path": "/y"}]),
            json!([{"op": "move", "from": "/x", "path": "/y"}]),
        ] {
            let err = invalid(json_patch(&doc, &ops));
            assert!(err.starts_with("json patch operation 0"), "{err}");
        }
    }

    #[test]
    fn json_patch_malformed_is_bad_request() {
        let doc = json!({"a": 1});
        for (ops, reason) in [
            (json!({"op": "add"}), "list of operations"),
            (json!([1]), "must be an object"),
            (json!([{"path": "/a"}]), "\"op\""),
            (json!([{"op": "frobnicate", "path": "/a"}]), "unknown op"),
            (json!([{"op": "add", "value": 1}]), "\"path\""),
            (
                json!([{"op": "add", "path": "/b"}]),
                "\"value\" is required",
            ),
            (
                json!([{"op": "replace", "path": "/a"}]),
                "\"value\" is required",
            ),
            (json!([{"op": "move", "path": "/b"}]), "\"from\""),
            (
                json!([{"op": "add", "path": "a", "value": 1}]),
                "must start with '/'",
            ),
            (json!([{"op": "add", "path": "/a~2", "value": 1}]), "'~'"),
        ] {
            let err = bad(json_patch(&doc, &ops));
            assert!(err.contains(reason), "{ops}: {err}");
        }
    }

    #[test]
    fn json_patch_leaves_the_input_alone_on_failure() {
        let doc = json!({"a": 1});
        let _ = json_patch(
            &doc,
            &json!([{"op": "replace", "path": "/a", "value": 2}, {"op": "remove", "path": "/x"}]),
        );
        assert_eq!(doc, json!({"a": 1}));
    }

    // ----- merge patch -----

    #[test]
    fn merge_patch_rfc7386() {
        let doc = json!({"a": "b", "c": {"d": "e", "f": "g"}, "list": [1, 2]});
        let out = merge_patch(
            &doc,
            &json!({"a": "z", "c": {"f": null, "h": {"i": null, "j": 1}}, "list": [3]}),
        );
        assert_eq!(
            out,
            json!({"a": "z", "c": {"d": "e", "h": {"j": 1}}, "list": [3]})
        );
        assert_eq!(merge_patch(&json!({"a": 1}), &json!("x")), json!("x"));
        assert_eq!(merge_patch(&json!("x"), &json!({"a": 1})), json!({"a": 1}));
        // Key order is kept, so stored objects do not reshuffle on every patch.
        let keys: Vec<String> = merge_patch(
            &json!({"x": 1, "y": 2, "z": 3}),
            &json!({"x": 5, "y": null}),
        )
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
        assert_eq!(keys, ["x", "z"]);
    }

    // ----- strategic merge patch -----

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

#[cfg(test)]
mod apply_tests {
    use serde_json::json;

    use super::*;

    const T0: &str = "2026-01-01T00:00:00Z";
    const T1: &str = "2026-01-01T00:01:00Z";
    const T2: &str = "2026-01-01T00:02:00Z";

    fn config(image: &str, replicas: i64) -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{
                        "name": "app", "image": image,
                        "env": [{"name": "MODE", "value": "prod"}],
                        "ports": [{"containerPort": 8080}]
                    }]}
                }
            }
        })
    }

    /// What the API server holds after storing `object`: server-set metadata added.
    fn stored(mut object: Value) -> Value {
        object["metadata"]["uid"] = json!("u-1");
        object["metadata"]["resourceVersion"] = json!("10");
        object["metadata"]["generation"] = json!(1);
        object
    }

    fn managers(object: &Value) -> Vec<(String, String)> {
        object["metadata"]["managedFields"]
            .as_array()
            .map(|entries| {
                entries
                    .iter()
                    .map(|e| {
                        (
                            e["manager"].as_str().unwrap().to_string(),
                            e["operation"].as_str().unwrap().to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn entry<'a>(object: &'a Value, manager: &str) -> &'a Value {
        object["metadata"]["managedFields"]
            .as_array()
            .and_then(|entries| entries.iter().find(|e| e["manager"] == manager))
            .unwrap_or_else(|| panic!("no managedFields entry for {manager}: {object}"))
    }

    #[test]
    fn apply_creates_with_managed_fields() {
        let created = server_side_apply(None, &config("web:1", 2), "kubectl", false, T0).unwrap();
        assert_eq!(created["spec"]["replicas"], 2);
        let e = entry(&created, "kubectl");
        assert_eq!(e["operation"], "Apply");
        assert_eq!(e["apiVersion"], "apps/v1");
        assert_eq!(e["time"], T0);
        assert_eq!(e["fieldsType"], "FieldsV1");
        let f = &e["fieldsV1"];
        assert_eq!(f["f:metadata"], json!({"f:labels": {"f:app": {}}}));
        assert_eq!(f["f:spec"]["f:replicas"], json!({}));
        assert_eq!(
            f["f:spec"]["f:template"]["f:spec"]["f:containers"],
            json!({"k:{\"name\":\"app\"}": {
                ".": {},
                "f:env": {"k:{\"name\":\"MODE\"}": {".": {}, "f:name": {}, "f:value": {}}},
                "f:image": {},
                "f:name": {},
                "f:ports": {"k:{\"containerPort\":8080}": {".": {}, "f:containerPort": {}}}
            }})
        );
        assert!(f.get("f:apiVersion").is_none() && f.get("f:kind").is_none());
        assert!(f["f:metadata"].get("f:name").is_none());
    }

    #[test]
    fn fields_v1_round_trips() {
        let schema = Schema::of(&config("x", 1));
        let mut object = config("web:1", 2);
        object["metadata"]["finalizers"] = json!(["a.io/x", "b.io/y"]);
        object["metadata"]["ownerReferences"] =
            json!([{"uid": "o1", "name": "r", "kind": "Rollout"}]);
        object["spec"]["strategy"] = json!({});
        let set = fields_of(&object, &schema);
        let v1 = fields_v1(&set);
        assert_eq!(
            v1["f:metadata"]["f:finalizers"],
            json!({"v:\"a.io/x\"": {}, "v:\"b.io/y\"": {}})
        );
        assert_eq!(
            v1["f:metadata"]["f:ownerReferences"]["k:{\"uid\":\"o1\"}"],
            json!({".": {}, "f:kind": {}, "f:name": {}, "f:uid": {}})
        );
        assert_eq!(v1["f:spec"]["f:strategy"], json!({}));
        assert_eq!(parse_fields_v1(&v1), set);
    }

    #[test]
    fn reapply_deep_merges_and_keeps_other_writers_fields() {
        let live =
            stored(server_side_apply(None, &config("web:1", 2), "kubectl", false, T0).unwrap());
        // A controller adds status and a label through ordinary writes.
        let mut written = live.clone();
        written["metadata"]["labels"]["team"] = json!("a");
        written["status"] = json!({"replicas": 2});
        let live = record_update(Some(&live), &written, "controller", T1);

        let out =
            server_side_apply(Some(&live), &config("web:2", 2), "kubectl", false, T2).unwrap();
        let container = &out["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["image"], "web:2");
        assert_eq!(container["env"], json!([{"name": "MODE", "value": "prod"}]));
        assert_eq!(
            out["metadata"]["labels"],
            json!({"app": "web", "team": "a"})
        );
        assert_eq!(out["status"], json!({"replicas": 2}));
        assert_eq!(out["metadata"]["uid"], "u-1");
        assert_eq!(
            managers(&out),
            [
                ("kubectl".to_string(), "Apply".to_string()),
                ("controller".to_string(), "Update".to_string())
            ]
        );
        assert_eq!(entry(&out, "kubectl")["time"], T2);
    }

    #[test]
    fn annotation_only_apply_by_another_manager_does_not_wipe_the_object() {
        // `kubectl apply --server-side` follows up with an apply holding only the
        // last-applied annotation, under the field manager "kubectl-last-applied".
        let live =
            stored(server_side_apply(None, &config("web:1", 3), "kubectl", false, T0).unwrap());
        let annotation = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default",
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}}
        });
        let out =
            server_side_apply(Some(&live), &annotation, "kubectl-last-applied", true, T1).unwrap();
        assert_eq!(out["spec"]["replicas"], 3);
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][0]["image"],
            "web:1"
        );
        assert_eq!(
            out["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"],
            "{}"
        );
        assert_eq!(
            entry(&out, "kubectl-last-applied")["fieldsV1"],
            json!({"f:metadata": {"f:annotations": {"f:kubectl.kubernetes.io/last-applied-configuration": {}}}})
        );
        assert_eq!(
            entry(&out, "kubectl")["time"],
            T0,
            "the first manager's entry is untouched"
        );
    }

    #[test]
    fn a_manager_drops_a_field_by_omitting_it() {
        let mut first = config("web:1", 2);
        first["metadata"]["labels"]["tier"] = json!("front");
        first["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "sidecar", "image": "proxy:1"}));
        let live = stored(server_side_apply(None, &first, "kubectl", false, T0).unwrap());
        let out =
            server_side_apply(Some(&live), &config("web:1", 2), "kubectl", false, T1).unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"app": "web"}));
        let names: Vec<&str> = out["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["app"]);
        assert!(
            !entry(&out, "kubectl")["fieldsV1"]
                .to_string()
                .contains("sidecar"),
            "ownership of the dropped container is gone"
        );
    }

    #[test]
    fn an_omitted_field_another_manager_owns_stays() {
        let live =
            stored(server_side_apply(None, &config("web:1", 2), "kubectl", false, T0).unwrap());
        // Another applier also sets the label app=web (same value: shared ownership).
        let other = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "labels": {"app": "web"}}});
        let live = server_side_apply(Some(&live), &other, "gitops", false, T1).unwrap();
        let mut without_labels = config("web:1", 2);
        without_labels["metadata"]
            .as_object_mut()
            .unwrap()
            .shift_remove("labels");
        let out = server_side_apply(Some(&live), &without_labels, "kubectl", false, T2).unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"app": "web"}));
    }

    #[test]
    fn conflicting_apply_is_refused_with_kubernetes_wording() {
        let live =
            stored(server_side_apply(None, &config("web:1", 2), "kubectl", false, T0).unwrap());
        let scale = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"}, "spec": {"replicas": 5}});
        let err = server_side_apply(Some(&live), &scale, "hpa", false, T1).unwrap_err();
        assert_eq!(
            err,
            PatchError::Conflict(
                "Apply failed with 1 conflict: conflict with \"kubectl\": .spec.replicas".into()
            )
        );
        // The same value is no conflict.
        let same = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"}, "spec": {"replicas": 2}});
        let shared = server_side_apply(Some(&live), &same, "hpa", false, T1).unwrap();
        assert_eq!(managers(&shared).len(), 2);
    }

    #[test]
    fn several_conflicts_are_listed_per_manager() {
        let live =
            stored(server_side_apply(None, &config("web:1", 2), "kubectl", false, T0).unwrap());
        let mut edited = live.clone();
        edited["metadata"]["labels"]["app"] = json!("api");
        let live = record_update(Some(&live), &edited, "kubectl-edit", T1);
        let mut theirs = config("web:9", 4);
        theirs["metadata"]["labels"]["app"] = json!("other");
        let err = server_side_apply(Some(&live), &theirs, "ci", false, T2).unwrap_err();
        let PatchError::Conflict(message) = err else {
            panic!("expected a conflict, got {err:?}")
        };
        assert_eq!(
            message,
            format!(
                "Apply failed with 3 conflicts: conflicts with \"kubectl\":\n\
                 - .spec.replicas\n\
                 - .spec.template.spec.containers[name=\"app\"].image\n\
                 conflicts with \"kubectl-edit\" using apps/v1 at {T1}:\n\
                 - .metadata.labels.app"
            )
        );
    }

    #[test]
    fn force_moves_ownership() {
        let live =
            stored(server_side_apply(None, &config("web:1", 2), "kubectl", false, T0).unwrap());
        let scale = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"}, "spec": {"replicas": 5}});
        let out = server_side_apply(Some(&live), &scale, "hpa", true, T1).unwrap();
        assert_eq!(out["spec"]["replicas"], 5);
        assert_eq!(
            entry(&out, "hpa")["fieldsV1"],
            json!({"f:spec": {"f:replicas": {}}})
        );
        assert!(
            entry(&out, "kubectl")["fieldsV1"]["f:spec"]
                .get("f:replicas")
                .is_none()
        );
        // kubectl re-applying its config without replicas no longer fights hpa.
        let mut no_replicas = config("web:1", 2);
        no_replicas["spec"]
            .as_object_mut()
            .unwrap()
            .shift_remove("replicas");
        let again = server_side_apply(Some(&out), &no_replicas, "kubectl", false, T2).unwrap();
        assert_eq!(again["spec"]["replicas"], 5);
    }

    #[test]
    fn reapplying_the_same_config_changes_nothing() {
        let live =
            stored(server_side_apply(None, &config("web:1", 2), "kubectl", false, T0).unwrap());
        let out =
            server_side_apply(Some(&live), &config("web:1", 2), "kubectl", false, T1).unwrap();
        assert_eq!(out, live, "a no-op apply keeps even the entry's time");
    }

    #[test]
    fn apply_merges_lists_by_key_and_sets() {
        let mut live =
            stored(server_side_apply(None, &config("web:1", 2), "kubectl", false, T0).unwrap());
        live["metadata"]["finalizers"] = json!(["a.io/x"]);
        live["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = json!("Always");
        let mut mine = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web",
        "finalizers": ["b.io/y"]},
        "spec": {"template": {"spec": {
            "containers": [{"name": "app", "env": [{"name": "EXTRA", "value": "1"}]}],
            "tolerations": [{"key": "k", "operator": "Exists"}]
        }}}});
        let out = server_side_apply(Some(&live), &mine, "other", false, T1).unwrap();
        let app = &out["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(app["image"], "web:1");
        assert_eq!(app["imagePullPolicy"], "Always");
        assert_eq!(
            app["env"],
            json!([{"name": "MODE", "value": "prod"}, {"name": "EXTRA", "value": "1"}])
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["a.io/x", "b.io/y"]));
        // Atomic lists are replaced.
        mine["spec"]["template"]["spec"]["tolerations"] =
            json!([{"key": "z", "operator": "Exists"}]);
        let out = server_side_apply(Some(&out), &mine, "other", false, T2).unwrap();
        assert_eq!(
            out["spec"]["template"]["spec"]["tolerations"],
            json!([{"key": "z", "operator": "Exists"}])
        );
    }

    #[test]
    fn apply_refuses_what_is_not_an_object_or_has_no_manager() {
        assert!(matches!(
            server_side_apply(None, &json!([1]), "m", false, T0),
            Err(PatchError::BadRequest(_))
        ));
        let err = server_side_apply(None, &config("x", 1), "", false, T0).unwrap_err();
        assert!(
            matches!(&err, PatchError::BadRequest(m) if m.contains("fieldManager")),
            "{err:?}"
        );
    }

    #[test]
    fn update_records_only_what_changed() {
        let created = record_update(None, &stored(config("web:1", 2)), "kubectl-create", T0);
        let e = entry(&created, "kubectl-create");
        assert_eq!(e["operation"], "Update");
        assert_eq!(e["time"], T0);
        assert_eq!(e["fieldsV1"]["f:spec"]["f:replicas"], json!({}));

        let mut scaled = created.clone();
        scaled["spec"]["replicas"] = json!(4);
        let out = record_update(Some(&created), &scaled, "kubectl-scale", T1);
        assert_eq!(
            entry(&out, "kubectl-scale")["fieldsV1"],
            json!({"f:spec": {"f:replicas": {}}})
        );
        assert!(
            entry(&out, "kubectl-create")["fieldsV1"]["f:spec"]
                .get("f:replicas")
                .is_none(),
            "an update takes ownership of what it changed"
        );
        // A write that changes nothing records nothing.
        let same = record_update(Some(&out), &out, "kubectl-scale", T2);
        assert_eq!(same, out);
    }

    #[test]
    fn update_forgets_removed_fields_and_honours_sent_managed_fields() {
        let created = record_update(None, &stored(config("web:1", 2)), "kubectl-create", T0);
        let mut unlabelled = created.clone();
        unlabelled["metadata"]
            .as_object_mut()
            .unwrap()
            .shift_remove("labels");
        let out = record_update(Some(&created), &unlabelled, "editor", T1);
        assert!(entry(&out, "kubectl-create")["fieldsV1"]["f:metadata"].is_null());
        assert!(
            managers(&out).iter().all(|(m, _)| m != "editor"),
            "removing is not owning"
        );

        // A client that sends managedFields: [{}] clears them, as with Kubernetes.
        let mut reset = out.clone();
        reset["metadata"]["managedFields"] = json!([{}]);
        let cleared = record_update(Some(&out), &reset, "editor", T2);
        assert!(cleared["metadata"].get("managedFields").is_none());
    }

    #[test]
    fn apply_conflicts_with_fields_written_by_update() {
        let created = record_update(
            None,
            &stored(config("web:1", 2)),
            "kubectl-client-side-apply",
            T0,
        );
        let err = server_side_apply(Some(&created), &config("web:2", 2), "kubectl", false, T1)
            .unwrap_err();
        assert_eq!(
            err,
            PatchError::Conflict(format!(
                "Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using apps/v1 at {T0}: .spec.template.spec.containers[name=\"app\"].image"
            ))
        );
        let moved =
            server_side_apply(Some(&created), &config("web:2", 2), "kubectl", true, T1).unwrap();
        assert_eq!(
            moved["spec"]["template"]["spec"]["containers"][0]["image"],
            "web:2"
        );
    }

    #[test]
    fn subresource_updates_are_separate_entries() {
        let created = record_update(None, &stored(config("web:1", 2)), "ctl", T0);
        let mut with_status = created.clone();
        with_status["status"] = json!({"replicas": 2});
        let out =
            record_subresource_update(Some(&created), &with_status, "ctl", Some("status"), T1);
        let entries = out["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[1]["subresource"], "status");
        assert_eq!(
            entries[1]["fieldsV1"],
            json!({"f:status": {"f:replicas": {}}})
        );
    }
}

/// Replays request bodies the real kubectl sent (see the fixture's `source`).
#[cfg(test)]
mod kubectl_fixture_tests {
    use serde_json::json;

    use super::*;

    const KUBECTL_APPLY: &str =
        include_str!("../../tests/fixtures/patch/kubectl-1.32-apply-deployment.json");

    fn fixture() -> Value {
        serde_json::from_str(KUBECTL_APPLY).expect("the fixture is JSON")
    }

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

    #[test]
    fn server_side_apply_after_client_side_apply() {
        let fixture = fixture();
        let ssa = &fixture["serverSideApply"];
        let requests = ssa["requests"].as_array().expect("requests");
        assert!(
            requests[0]["query"]
                .as_str()
                .unwrap()
                .contains("fieldManager=kubectl&")
        );
        assert!(
            requests[1]["query"]
                .as_str()
                .unwrap()
                .contains("fieldManager=kubectl-last-applied")
        );
        // The client-side applies before recorded their ownership, as the API server does.
        let live = record_update(
            None,
            &ssa["live"],
            "kubectl-client-side-apply",
            "2026-01-01T00:00:00Z",
        );

        // The image changed, a field kubectl-client-side-apply owns: without the upgrade rule
        // another manager gets the conflict.
        let other = server_side_apply(
            Some(&live),
            &requests[0]["body"],
            "ci",
            false,
            "2026-01-01T00:01:00Z",
        );
        assert!(
            matches!(&other, Err(PatchError::Conflict(m)) if m.contains("kubectl-client-side-apply")),
            "{other:?}"
        );

        let applied = server_side_apply(
            Some(&live),
            &requests[0]["body"],
            "kubectl",
            false,
            "2026-01-01T00:01:00Z",
        )
        .expect("kubectl takes over what its client-side apply wrote");
        assert_eq!(applied["spec"], ssa["desiredSpec"]);
        let annotation = applied["metadata"]["annotations"][LAST_APPLIED]
            .as_str()
            .unwrap();
        assert!(annotation.ends_with('\n'));
        let recorded: Value = serde_json::from_str(annotation).unwrap();
        assert_eq!(
            recorded, requests[0]["body"],
            "the annotation follows the server-side apply"
        );

        // kubectl then re-applies the annotation it read back under its own manager.
        let mut second = requests[1]["body"].clone();
        second["metadata"]["annotations"][LAST_APPLIED] = json!(annotation);
        let out = server_side_apply(
            Some(&applied),
            &second,
            "kubectl-last-applied",
            false,
            "2026-01-01T00:02:00Z",
        )
        .unwrap();
        assert_eq!(out["spec"], ssa["desiredSpec"]);
        let managers: Vec<(&str, &str)> = out["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["manager"].as_str().unwrap(),
                    e["operation"].as_str().unwrap(),
                )
            })
            .collect();
        assert!(managers.contains(&("kubectl", "Apply")), "{managers:?}");
        assert!(
            managers.contains(&("kubectl-last-applied", "Apply")),
            "{managers:?}"
        );
        let image_owners = out["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["fieldsV1"].to_string().contains("f:image"))
            .count();
        assert_eq!(image_owners, 1, "the image moved to kubectl alone");
    }

    #[test]
    fn the_upgrade_rule_covers_only_last_applied_fields() {
        let fixture = fixture();
        let ssa = &fixture["serverSideApply"];
        let mut live = record_update(
            None,
            &ssa["live"],
            "kubectl-client-side-apply",
            "2026-01-01T00:00:00Z",
        );
        // A controller scaled the Deployment: not in the annotation, so still a conflict.
        let mut scaled = live.clone();
        scaled["spec"]["replicas"] = json!(7);
        live = record_update(Some(&live), &scaled, "autoscaler", "2026-01-01T00:00:30Z");
        let err = server_side_apply(
            Some(&live),
            &ssa["requests"][0]["body"],
            "kubectl",
            false,
            "2026-01-01T00:01:00Z",
        )
        .unwrap_err();
        let PatchError::Conflict(message) = err else {
            panic!("expected a conflict, got {err:?}")
        };
        assert!(
            message.contains("\"autoscaler\" using apps/v1") && message.contains(".spec.replicas"),
            "{message}"
        );
        assert!(!message.contains("image"), "{message}");
    }
}

#[cfg(test)]
mod subresource_apply_tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn status_apply_keeps_its_own_entry() {
        let spec = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": "r"}, "spec": {"replicas": 3}});
        let live = server_side_apply(None, &spec, "rollouts-controller", false, "t0").unwrap();
        let status = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": "r"}, "status": {"phase": "Progressing"}});
        let out = server_side_apply_subresource(
            Some(&live),
            &status,
            "rollouts-controller",
            Some("status"),
            false,
            "t1",
        )
        .unwrap();
        assert_eq!(
            out["spec"]["replicas"], 3,
            "the main-resource apply's fields stay"
        );
        assert_eq!(out["status"]["phase"], "Progressing");
        let entries = out["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(
            entries[0]["fieldsV1"],
            json!({"f:spec": {"f:replicas": {}}})
        );
        assert_eq!(entries[1]["subresource"], "status");
        assert_eq!(entries[1]["fieldsV1"], json!({"f:status": {"f:phase": {}}}));
        // Re-applying status without the phase drops only what the status entry owned.
        let again = server_side_apply_subresource(
            Some(&out),
            &json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "metadata": {"name": "r"}, "status": {"message": "x"}}),
            "rollouts-controller",
            Some("status"),
            false,
            "t2",
        )
        .unwrap();
        assert_eq!(again["status"], json!({"message": "x"}));
        assert_eq!(again["spec"]["replicas"], 3);
    }
}
