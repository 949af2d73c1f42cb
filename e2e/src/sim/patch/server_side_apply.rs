//! Server-side apply (`application/apply-patch+yaml`) and the field ownership it rests on: which
//! manager set which field, recorded in `metadata.managedFields` by applies and by ordinary
//! writes alike, the conflicts that follow, and kubectl's switch from client-side apply.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::schema::{ListMerge, Schema};
use super::{PatchError, bad_request, json_equal};

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
pub(super) const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

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

/// Replays the server-side apply bodies the real kubectl sent (see the fixture's `source`).
#[cfg(test)]
mod kubectl_fixture_tests {
    use serde_json::json;

    use super::*;
    use crate::sim::patch::test_support::kubectl_apply_fixture as fixture;

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
