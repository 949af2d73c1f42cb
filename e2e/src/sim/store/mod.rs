//! Object storage: every object of every resource, the global resourceVersion, the retained
//! event log watches resume from, and the write semantics of the API server (metadata,
//! generation, status subresource, no-op writes); deletion and garbage collection live in
//! `deletion`.

mod deletion;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use serde_json::{Map, Value, json};
use tokio::sync::{broadcast, watch};

use super::meta::{meta_str, metadata_mut, new_uid, owner_refs, random_suffix, rfc3339};
use super::patch;
use super::registry::{Registry, ResourceInfo, ResourceKey};
use super::status::{ApiError, ApiResult};

/// (namespace, name); the namespace is "" for cluster-scoped objects.
pub type ObjectKey = (String, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change to one object, as retained in the log and fanned out to watches.
#[derive(Debug)]
pub struct WatchEvent {
    pub rv: u64,
    pub resource: ResourceKey,
    pub event_type: EventType,
    pub object: Arc<Value>,
    /// The object before a modification (watches with selectors turn it into ADDED/DELETED).
    pub previous: Option<Arc<Value>>,
}

/// Which part of an object a write may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The main resource: everything but `.status` when the resource has a status subresource.
    Main,
    /// The `/status` subresource: only `.status`.
    Status,
}

/// Who makes a non-apply write, recorded as an `Update` entry in `metadata.managedFields` so
/// later server-side applies conflict with the fields it set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldManager<'a> {
    pub name: &'a str,
    /// `Some("status")` or `Some("scale")` for a write through a subresource.
    pub subresource: Option<&'a str>,
}

impl FieldManager<'_> {
    fn record(&self, before: Option<&Value>, after: &Value) -> Value {
        let now = rfc3339(SystemTime::now());
        patch::record_subresource_update(before, after, self.name, self.subresource, &now)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Propagation {
    #[default]
    Background,
    Foreground,
    Orphan,
}

/// `DeleteOptions` the store acts on.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub propagation: Propagation,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
}

/// Events buffered for watchers and controllers; one that falls further behind relists (410).
const FANOUT_BUFFER: usize = 4096;
/// Metadata only the server sets: writes keep the stored values.
const IMMUTABLE_METADATA: [&str; 7] = [
    "name",
    "namespace",
    "uid",
    "creationTimestamp",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
];
const FOREGROUND_FINALIZER: &str = "foregroundDeletion";
const CRD_GROUP: &str = "apiextensions.k8s.io";

/// The store shared by the HTTP server and the simulated controllers.
pub struct Store {
    state: Mutex<State>,
    events: broadcast::Sender<Arc<WatchEvent>>,
    /// Bumped by [`Store::expire_watches`]; open watch streams end when it changes.
    expiry: watch::Sender<u64>,
}

impl Store {
    pub fn new(log_capacity: usize) -> Self {
        let (events, _) = broadcast::channel(FANOUT_BUFFER);
        let state = State {
            dry_run: false,
            registry: Registry::with_builtins(),
            rv: 0,
            objects: HashMap::new(),
            by_uid: HashMap::new(),
            dependents: HashMap::new(),
            log: VecDeque::new(),
            log_capacity: log_capacity.max(1),
            log_start: 0,
            events: events.clone(),
        };
        Self {
            state: Mutex::new(state),
            events,
            expiry: watch::channel(0).0,
        }
    }

    /// Locks the store; every read-modify-write happens under one lock, so it is atomic.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Locks the store for one request's writes; with `dry_run` they are computed and returned
    /// but neither stored nor announced (`dryRun=All`).
    pub fn lock_for_writes(&self, dry_run: bool) -> WriteGuard<'_> {
        let mut state = self.lock();
        state.dry_run = dry_run;
        WriteGuard(state)
    }

    /// Subscribes to new events; call with the lock held to get no gap after a snapshot.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<WatchEvent>> {
        self.events.subscribe()
    }

    pub fn expiry(&self) -> watch::Receiver<u64> {
        self.expiry.subscribe()
    }

    /// Compacts the event log past every resourceVersion handed out so far and ends every open
    /// watch, as an API server restart would: watchers that resume get 410 Expired and relist.
    pub fn expire_watches(&self) {
        let mut state = self.lock();
        state.rv += 1;
        state.log.clear();
        state.log_start = state.rv;
        self.expiry.send_modify(|g| *g += 1);
    }
}

/// The store's lock for one request; dry-run mode ends when it is released.
pub struct WriteGuard<'a>(MutexGuard<'a, State>);

impl std::ops::Deref for WriteGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.0
    }
}

impl std::ops::DerefMut for WriteGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.0
    }
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        self.0.dry_run = false;
    }
}

/// Everything stored, behind the store's lock.
pub struct State {
    /// Writes are computed but not stored (a `dryRun=All` request holds the lock).
    dry_run: bool,
    pub registry: Registry,
    rv: u64,
    objects: HashMap<ResourceKey, BTreeMap<ObjectKey, Arc<Value>>>,
    by_uid: HashMap<String, (ResourceKey, ObjectKey)>,
    /// owner uid -> objects whose ownerReferences name it.
    dependents: HashMap<String, BTreeSet<(ResourceKey, ObjectKey)>>,
    log: VecDeque<Arc<WatchEvent>>,
    log_capacity: usize,
    /// Watches may resume from this resourceVersion or later; older ones are Expired.
    log_start: u64,
    events: broadcast::Sender<Arc<WatchEvent>>,
}

impl State {
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    pub fn log_start(&self) -> u64 {
        self.log_start
    }

    /// Retained events newer than `rv`, oldest first.
    pub fn events_after(&self, rv: u64) -> impl Iterator<Item = &Arc<WatchEvent>> {
        let start = self.log.partition_point(|e| e.rv <= rv);
        self.log.range(start..)
    }

    pub fn get(&self, key: &ResourceKey, namespace: &str, name: &str) -> Option<&Arc<Value>> {
        self.objects
            .get(key)?
            .get(&(namespace.to_string(), name.to_string()))
    }

    /// Objects of a resource in key order, in one namespace or all, starting after `after`.
    pub fn list<'a>(
        &'a self,
        key: &ResourceKey,
        namespace: Option<&'a str>,
        after: Option<&ObjectKey>,
    ) -> impl Iterator<Item = (&'a ObjectKey, &'a Arc<Value>)> + 'a {
        use std::ops::Bound;
        let lower = match after {
            Some(k) => Bound::Excluded(k.clone()),
            None => match namespace {
                Some(ns) => Bound::Included((ns.to_string(), String::new())),
                None => Bound::Unbounded,
            },
        };
        self.objects
            .get(key)
            .into_iter()
            .flat_map(move |m| m.range((lower.clone(), Bound::Unbounded)))
            .take_while(move |((ns, _), _)| namespace.is_none_or(|want| want == ns))
    }

    /// Number of stored objects of every resource.
    pub fn object_count(&self) -> usize {
        self.objects.values().map(BTreeMap::len).sum()
    }

    pub fn by_uid(&self, uid: &str) -> Option<(&ResourceKey, &Arc<Value>)> {
        let (key, okey) = self.by_uid.get(uid)?;
        Some((key, self.objects.get(key)?.get(okey)?))
    }

    /// Objects whose ownerReferences name `uid`.
    pub fn dependents_of(&self, uid: &str) -> Vec<(ResourceKey, Arc<Value>)> {
        self.dependents
            .get(uid)
            .into_iter()
            .flatten()
            .filter_map(|(key, okey)| {
                Some((key.clone(), self.objects.get(key)?.get(okey)?.clone()))
            })
            .collect()
    }

    fn info_for(&self, key: &ResourceKey) -> Option<Arc<ResourceInfo>> {
        self.registry.any_version(key)
    }

    /// Creates an object (POST): fills in metadata, defaults, and rejects duplicates.
    pub fn create(
        &mut self,
        info: &ResourceInfo,
        namespace: &str,
        obj: Value,
    ) -> ApiResult<Arc<Value>> {
        self.create_by(info, namespace, obj, None)
    }

    /// [`State::create`] recording `manager` as the owner of every field it sets.
    pub fn create_by(
        &mut self,
        info: &ResourceInfo,
        namespace: &str,
        mut obj: Value,
        manager: Option<FieldManager<'_>>,
    ) -> ApiResult<Arc<Value>> {
        let (group, plural) = (info.group.as_str(), info.plural.as_str());
        if !obj.is_object() {
            return Err(ApiError::bad_request(format!(
                "creating {plural}: the body must be a JSON object"
            )));
        }
        if let Some(kind) = obj["kind"].as_str().filter(|k| *k != info.kind) {
            return Err(ApiError::bad_request(format!(
                "creating {plural}: kind {kind} does not match the resource's kind {}",
                info.kind
            )));
        }
        obj["apiVersion"] = info.api_version().into();
        obj["kind"] = info.kind.clone().into();
        let namespace = if info.namespaced { namespace } else { "" };
        let now = rfc3339(SystemTime::now());
        let meta = metadata_mut(&mut obj);
        if let Some(body_ns) = meta.get("namespace").and_then(Value::as_str)
            && info.namespaced
            && !body_ns.is_empty()
            && body_ns != namespace
        {
            return Err(ApiError::bad_request(format!(
                "the namespace of the provided object ({body_ns}) does not match the namespace sent on the request ({namespace})"
            )));
        }
        let mut name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if name.is_empty() {
            let prefix = meta
                .get("generateName")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if prefix.is_empty() {
                return Err(ApiError::invalid(
                    group,
                    plural,
                    "",
                    "metadata.name: Required value: name or generateName is required",
                ));
            }
            let key = info.key();
            name = loop {
                let candidate = format!("{prefix}{}", random_suffix(5));
                if self.get(&key, namespace, &candidate).is_none() {
                    break candidate;
                }
            };
        }
        validate_name(&name).map_err(|why| ApiError::invalid(group, plural, &name, why))?;
        if info.namespaced {
            meta.insert("namespace".into(), namespace.into());
        } else {
            meta.remove("namespace");
        }
        meta.insert("name".into(), name.clone().into());
        meta.insert("uid".into(), new_uid().into());
        meta.insert("creationTimestamp".into(), now.into());
        meta.insert("generation".into(), 1.into());
        for field in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            meta.remove(field);
        }
        if info.namespaced && self.get(&namespaces_key(), "", namespace).is_none() {
            return Err(ApiError::not_found("", "namespaces", namespace));
        }
        let key = info.key();
        if self.get(&key, namespace, &name).is_some() {
            return Err(ApiError::already_exists(group, plural, &name));
        }
        if info.status
            && let Some(root) = obj.as_object_mut()
        {
            root.remove("status");
        }
        apply_defaults(info, &mut obj, true);
        if let Some(manager) = manager {
            obj = manager.record(None, &obj);
        }
        if is_crd(&key) {
            self.prepare_crd(&mut obj)?;
        }
        let stored = self.commit(&key, (namespace.to_string(), name), EventType::Added, obj);
        if is_crd(&key) && !self.dry_run {
            self.registry.register_crd(&stored).map_err(|why| {
                ApiError::invalid(
                    CRD_GROUP,
                    "customresourcedefinitions",
                    meta_str(&stored, "name"),
                    why,
                )
            })?;
        }
        Ok(stored)
    }

    /// Replaces an object (PUT, and the result of every patch) with the API server's rules:
    /// resourceVersion precondition, immutable metadata, status subresource separation,
    /// generation bumped on spec changes, no-op writes bump nothing.
    pub fn update(
        &mut self,
        info: &ResourceInfo,
        namespace: &str,
        name: &str,
        new: Value,
        target: Target,
    ) -> ApiResult<Arc<Value>> {
        self.update_by(info, namespace, name, new, target, None)
    }

    /// [`State::update`] recording `manager` as the owner of the fields the write changes.
    pub fn update_by(
        &mut self,
        info: &ResourceInfo,
        namespace: &str,
        name: &str,
        new: Value,
        target: Target,
        manager: Option<FieldManager<'_>>,
    ) -> ApiResult<Arc<Value>> {
        let (group, plural) = (info.group.as_str(), info.plural.as_str());
        let key = info.key();
        let namespace = if info.namespaced { namespace } else { "" };
        let old = self
            .get(&key, namespace, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(group, plural, name))?;
        if !new.is_object() {
            return Err(ApiError::bad_request(format!(
                "updating {plural} {name:?}: the body must be a JSON object"
            )));
        }
        let body_name = meta_str(&new, "name");
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let wanted_rv = meta_str(&new, "resourceVersion");
        if !wanted_rv.is_empty() && wanted_rv != meta_str(&old, "resourceVersion") {
            return Err(ApiError::stale(group, plural, name));
        }
        let wanted_uid = meta_str(&new, "uid");
        if !wanted_uid.is_empty() && wanted_uid != meta_str(&old, "uid") {
            return Err(ApiError::conflict(
                group,
                plural,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {wanted_uid}, UID in object meta: {}",
                    meta_str(&old, "uid")
                ),
            ));
        }
        let mut next = match target {
            Target::Main => {
                let mut next = new;
                next["apiVersion"] = info.api_version().into();
                next["kind"] = info.kind.clone().into();
                let meta = metadata_mut(&mut next);
                for field in IMMUTABLE_METADATA {
                    match old["metadata"].get(field) {
                        Some(v) => meta.insert(field.into(), v.clone()),
                        None => meta.remove(field),
                    };
                }
                // A replace that leaves managedFields out keeps the recorded owners.
                if !meta.contains_key("managedFields")
                    && let Some(fields) = old["metadata"].get("managedFields")
                {
                    meta.insert("managedFields".into(), fields.clone());
                }
                if info.status {
                    set_or_remove(&mut next, "status", old.get("status").cloned());
                }
                apply_defaults(info, &mut next, false);
                next
            }
            Target::Status => {
                let mut next = (*old).clone();
                set_or_remove(&mut next, "status", new.get("status").cloned());
                // Ownership changes with status writes (an apply to /status records itself).
                if let Some(fields) = new["metadata"]
                    .get("managedFields")
                    .filter(|f| f.is_array())
                {
                    metadata_mut(&mut next).insert("managedFields".into(), fields.clone());
                }
                next
            }
        };
        if spec_of(&next) != spec_of(&old) {
            let generation = old["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
            metadata_mut(&mut next).insert("generation".into(), generation.into());
        }
        if let Some(manager) = manager {
            next = manager.record(Some(&old), &next);
        }
        if is_crd(&key) {
            self.prepare_crd(&mut next)?;
        }
        if same_content(&next, &old) {
            return Ok(old);
        }
        let okey = (namespace.to_string(), name.to_string());
        let deleting = next["metadata"]
            .get("deletionTimestamp")
            .is_some_and(|t| !t.is_null());
        let finalizers_left = next["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if deleting && !finalizers_left {
            return Ok(self.remove(&key, okey, next));
        }
        let stored = self.commit(&key, okey, EventType::Modified, next);
        if is_crd(&key) && !self.dry_run {
            self.registry.register_crd(&stored).map_err(|why| {
                ApiError::invalid(CRD_GROUP, "customresourcedefinitions", name, why)
            })?;
        }
        Ok(stored)
    }

    /// Validates a CRD and writes the status the apiextensions server would (names accepted,
    /// established), so clients waiting for `Established` proceed.
    fn prepare_crd(&self, crd: &mut Value) -> ApiResult<()> {
        let name = meta_str(crd, "name").to_string();
        super::registry::crd_resources(crd)
            .map_err(|why| ApiError::invalid(CRD_GROUP, "customresourcedefinitions", &name, why))?;
        let since = crd["metadata"]["creationTimestamp"].clone();
        let stored: Vec<Value> = crd["spec"]["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| v["storage"].as_bool() == Some(true))
            .map(|v| v["name"].clone())
            .collect();
        let condition = |t: &str, reason: &str, message: &str| json!({"type": t, "status": "True", "lastTransitionTime": since, "reason": reason, "message": message});
        crd["status"] = json!({
            "conditions": [
                condition("NamesAccepted", "NoConflicts", "no conflicts found"),
                condition("Established", "InitialNamesAccepted", "the initial names have been accepted"),
            ],
            "acceptedNames": crd["spec"]["names"].clone(),
            "storedVersions": stored,
        });
        Ok(())
    }

    /// Stores (or removes) an object under a new resourceVersion and records the event.
    fn commit(
        &mut self,
        key: &ResourceKey,
        okey: ObjectKey,
        event_type: EventType,
        mut obj: Value,
    ) -> Arc<Value> {
        if self.dry_run {
            return Arc::new(obj);
        }
        self.rv += 1;
        metadata_mut(&mut obj).insert("resourceVersion".into(), self.rv.to_string().into());
        let obj = Arc::new(obj);
        let objects = self.objects.entry(key.clone()).or_default();
        let previous = if event_type == EventType::Deleted {
            objects.remove(&okey)
        } else {
            objects.insert(okey.clone(), obj.clone())
        };
        if let Some(prev) = &previous {
            for r in owner_refs(prev) {
                if let Some(set) = r["uid"].as_str().and_then(|u| self.dependents.get_mut(u)) {
                    set.remove(&(key.clone(), okey.clone()));
                }
            }
            self.dependents.retain(|_, set| !set.is_empty());
        }
        let uid = meta_str(&obj, "uid").to_string();
        if event_type == EventType::Deleted {
            self.by_uid.remove(&uid);
        } else {
            self.by_uid.insert(uid, (key.clone(), okey.clone()));
            for r in owner_refs(&obj) {
                if let Some(u) = r["uid"].as_str() {
                    self.dependents
                        .entry(u.to_string())
                        .or_default()
                        .insert((key.clone(), okey.clone()));
                }
            }
        }
        let event = Arc::new(WatchEvent {
            rv: self.rv,
            resource: key.clone(),
            event_type,
            object: obj.clone(),
            previous: if event_type == EventType::Modified {
                previous
            } else {
                None
            },
        });
        self.log.push_back(event.clone());
        while self.log.len() > self.log_capacity {
            if let Some(evicted) = self.log.pop_front() {
                self.log_start = evicted.rv;
            }
        }
        // No receiver is fine: nobody is watching yet.
        let _ = self.events.send(event);
        obj
    }
}

pub fn namespaces_key() -> ResourceKey {
    ResourceKey {
        group: String::new(),
        plural: "namespaces".into(),
    }
}

fn is_crd(key: &ResourceKey) -> bool {
    key.group == CRD_GROUP && key.plural == "customresourcedefinitions"
}

fn set_or_remove(obj: &mut Value, field: &str, value: Option<Value>) {
    if let Some(root) = obj.as_object_mut() {
        match value {
            Some(v) => {
                root.insert(field.into(), v);
            }
            None => {
                root.remove(field);
            }
        }
    }
}

/// Everything but metadata and status: a change here bumps `metadata.generation`.
fn spec_of(obj: &Value) -> Map<String, Value> {
    let mut m = obj.as_object().cloned().unwrap_or_default();
    m.remove("metadata");
    m.remove("status");
    m
}

/// Equal apart from resourceVersion. managedFields count: a write that only changes ownership
/// (kubectl's `kubectl-last-applied` apply) is a write; the patch functions leave them as they
/// were when nothing changed, so a no-op write still bumps nothing.
fn same_content(a: &Value, b: &Value) -> bool {
    let (Some(a_map), Some(b_map)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    let meta_equal = |x: &Value, y: &Value| {
        let (Some(x), Some(y)) = (x.as_object(), y.as_object()) else {
            return x == y;
        };
        let rest = |m: &Map<String, Value>| m.keys().filter(|k| *k != "resourceVersion").count();
        rest(x) == rest(y)
            && x.iter()
                .filter(|(k, _)| *k != "resourceVersion")
                .all(|(k, v)| y.get(k) == Some(v))
    };
    a_map.len() == b_map.len()
        && a_map.iter().all(|(k, v)| match (k.as_str(), b_map.get(k)) {
            ("metadata", Some(w)) => meta_equal(v, w),
            (_, Some(w)) => v == w,
            (_, None) => false,
        })
}

/// DNS-1123 subdomain, as the API server requires of most names.
fn validate_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
        ))
    }
}

/// The few defaults the simulated controllers rely on.
fn apply_defaults(info: &ResourceInfo, obj: &mut Value, creating: bool) {
    if !info.builtin {
        return;
    }
    match (info.group.as_str(), info.plural.as_str()) {
        ("apps", "deployments" | "replicasets")
            if obj["spec"].is_object()
                && obj["spec"].get("replicas").is_none_or(Value::is_null) =>
        {
            obj["spec"]["replicas"] = 1.into();
        }
        ("", "pods") if creating => {
            obj["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
        }
        ("", "namespaces") if obj.get("status").is_none_or(|s| s.get("phase").is_none()) => {
            obj["status"] = json!({"phase": "Active"});
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests;
