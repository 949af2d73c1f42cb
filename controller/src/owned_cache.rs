//! Watch caches of the objects Rollouts own (ReplicaSets, AnalysisRuns, Experiments), indexed by the owning
//! Rollout's uid so a reconcile reads only its own objects, and the write expectations that keep
//! a reconcile from planning on a cache older than the writes it made itself.
//!
//! The watch streams that trigger reconciles feed [`OwnedCache::apply`] before the trigger, so
//! when a reconcile runs because an owned object changed, the cache already holds that change.
//! Objects are stripped of what observe does not read before they are stored
//! ([`strip_replica_set`], [`strip_analysis_run`], [`strip_experiment`]), so 10,000 Rollouts
//! stay small.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::runtime::watcher;
use rollouts_crds::analysis::AnalysisRun;
use rollouts_crds::experiment::Experiment;
use tokio::sync::watch;

use crate::context::caught_up;
use crate::decode::{Decoded, Undecodable};
use crate::planner::template_match;

/// How long a write may stay unseen by the watch before the cache is trusted anyway: a watch
/// that lost the event relists, and a reconcile must not wait on it forever.
pub const EXPECTATION_TIMEOUT: Duration = Duration::from_secs(30);

/// The kinds a Rollout owns that the controller caches.
pub struct OwnedCaches {
    pub replica_sets: OwnedCache<ReplicaSet>,
    pub analysis_runs: OwnedCache<AnalysisRun>,
    pub experiments: OwnedCache<Experiment>,
}

impl OwnedCaches {
    pub fn new() -> Self {
        Self {
            replica_sets: OwnedCache::new("ReplicaSet"),
            analysis_runs: OwnedCache::new("AnalysisRun"),
            experiments: OwnedCache::new("Experiment"),
        }
    }

    /// Waits until every watch has listed once; false if `limit` passed first.
    pub async fn wait_ready(&self, limit: Duration) -> bool {
        let all = async {
            self.replica_sets.wait_ready().await;
            self.analysis_runs.wait_ready().await;
            self.experiments.wait_ready().await;
        };
        tokio::time::timeout(limit, all).await.is_ok()
    }

    /// The first write to an object owned by `owner_uid` that no cache shows yet, as
    /// `Kind name`; `None` when the caches include every write made for that owner.
    pub fn lagging(&self, owner_uid: &str) -> Option<String> {
        self.replica_sets
            .lagging(owner_uid)
            .or_else(|| self.analysis_runs.lagging(owner_uid))
            .or_else(|| self.experiments.lagging(owner_uid))
    }

    /// An object owned by `owner_uid` that the watch could not decode, as `Kind name: error`;
    /// its owner is not acted on until it decodes or is deleted.
    pub fn undecodable(&self, owner_uid: &str) -> Option<String> {
        self.replica_sets
            .undecodable(owner_uid)
            .or_else(|| self.analysis_runs.undecodable(owner_uid))
            .or_else(|| self.experiments.undecodable(owner_uid))
    }
}

impl Default for OwnedCaches {
    fn default() -> Self {
        Self::new()
    }
}

/// What a write made an object look like, until the cache shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Expected {
    /// Present at this resourceVersion or newer; `None`: present at any version.
    Present(Option<String>),
    Gone,
}

#[derive(Clone, Debug)]
struct Expectation {
    name: String,
    expected: Expected,
    since: Instant,
}

/// The objects of one owner, by name.
type Owned<K> = BTreeMap<String, Arc<K>>;

struct Index<K> {
    by_owner: HashMap<String, Owned<K>>,
    /// `namespace/name` -> owner uid, to move or drop an object whose owner changed.
    owner_of: HashMap<String, String>,
}

impl<K> Default for Index<K> {
    fn default() -> Self {
        Self {
            by_owner: HashMap::new(),
            owner_of: HashMap::new(),
        }
    }
}

impl<K: Resource> Index<K> {
    fn upsert(&mut self, object: Arc<K>) {
        let key = object_key(object.as_ref());
        let name = object.meta().name.clone().unwrap_or_default();
        let owner = controller_uid(object.as_ref());
        if let Some(previous) = self.owner_of.get(&key)
            && Some(previous) != owner.as_ref()
        {
            let previous = previous.clone();
            self.remove_from(&previous, &name);
            self.owner_of.remove(&key);
        }
        let Some(owner) = owner else {
            return;
        };
        self.owner_of.insert(key, owner.clone());
        self.by_owner.entry(owner).or_default().insert(name, object);
    }

    fn remove(&mut self, object: &K) {
        self.remove_named(object.meta());
    }

    fn remove_named(&mut self, metadata: &ObjectMeta) {
        let key = key_of(metadata);
        let name = metadata.name.as_deref().unwrap_or_default();
        if let Some(owner) = self.owner_of.remove(&key) {
            self.remove_from(&owner, name);
        }
    }

    fn remove_from(&mut self, owner: &str, name: &str) {
        if let Some(owned) = self.by_owner.get_mut(owner) {
            owned.remove(name);
            if owned.is_empty() {
                self.by_owner.remove(owner);
            }
        }
    }

    fn len(&self) -> usize {
        self.owner_of.len()
    }
}

/// An owned object the watch could not decode: its owner, and what is wrong.
struct Blocking {
    owner: String,
    name: String,
    error: String,
}

/// Undecodable owned objects by `namespace/name`.
type Undecodables = HashMap<String, Blocking>;

struct State<K> {
    live: Index<K>,
    /// The index being rebuilt between a watch's `Init` and `InitDone`; `live` serves reads.
    relisting: Option<Index<K>>,
    undecodable: Undecodables,
    /// `undecodable` being rebuilt by a relist.
    relisting_undecodable: Option<Undecodables>,
    expectations: HashMap<String, Vec<Expectation>>,
    /// When expectations of every owner were last checked for expiry.
    pruned: Instant,
}

impl<K: Resource> State<K> {
    fn init_apply(&mut self, object: &K)
    where
        K: Clone,
    {
        match self.relisting.as_mut() {
            Some(relisting) => relisting.upsert(Arc::new(object.clone())),
            None => self.live.upsert(Arc::new(object.clone())),
        }
    }

    fn delete(&mut self, object: &K) {
        self.live.remove(object);
        self.deleted_after_our_writes(object);
    }

    /// Someone deleted an object after we wrote it: its cache entry is newer than our write,
    /// so that write is not waited for.
    fn deleted_after_our_writes(&mut self, object: &K) {
        let Some(owner) = controller_uid(object) else {
            return;
        };
        let Some(pending) = self.expectations.get_mut(&owner) else {
            return;
        };
        let name = object.meta().name.as_deref().unwrap_or_default();
        let deleted_at = object.meta().resource_version.as_deref();
        pending.retain(|expectation| {
            let outdated = expectation.name == name
                && match &expectation.expected {
                    Expected::Present(Some(ours)) => caught_up(deleted_at, ours),
                    Expected::Present(None) => true,
                    Expected::Gone => false,
                };
            !outdated
        });
    }
}

/// Objects of one kind with a controller owner, by owner uid, fed by a watch.
pub struct OwnedCache<K> {
    kind: &'static str,
    state: Mutex<State<K>>,
    ready: watch::Sender<bool>,
}

impl<K: Resource> OwnedCache<K> {
    pub fn new(kind: &'static str) -> Self {
        Self {
            kind,
            state: Mutex::new(State {
                live: Index::default(),
                relisting: None,
                undecodable: HashMap::new(),
                relisting_undecodable: None,
                expectations: HashMap::new(),
                pruned: Instant::now(),
            }),
            ready: watch::Sender::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<K>> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Applies one watch event, as kube's reflector does: a relist replaces the whole index
    /// once it is complete.
    pub fn apply(&self, event: &watcher::Event<K>)
    where
        K: Clone,
    {
        let mut state = self.lock();
        match event {
            watcher::Event::Init => state.relisting = Some(Index::default()),
            watcher::Event::InitApply(object) => state.init_apply(object),
            watcher::Event::InitDone => self.init_done(state),
            watcher::Event::Apply(object) => state.live.upsert(Arc::new(object.clone())),
            watcher::Event::Delete(object) => state.delete(object),
        }
    }

    /// Applies one event of a watch that decodes objects one by one: an undecodable object
    /// leaves the cache (nothing plans from its last decodable version) and blocks its owner
    /// (see [`OwnedCache::undecodable`]) until it decodes or is deleted.
    pub fn apply_decoded(&self, event: &watcher::Event<Decoded<K>>)
    where
        K: Clone,
    {
        let mut state = self.lock();
        match event {
            watcher::Event::Init => {
                state.relisting = Some(Index::default());
                state.relisting_undecodable = Some(HashMap::new());
            }
            watcher::Event::InitApply(Decoded::Typed(object)) => state.init_apply(object),
            watcher::Event::InitApply(Decoded::Undecodable(undecodable)) => {
                if let Some(blocking) = blocking(undecodable) {
                    let key = key_of(&undecodable.metadata);
                    match state.relisting_undecodable.as_mut() {
                        Some(relisting) => relisting.insert(key, blocking),
                        None => state.undecodable.insert(key, blocking),
                    };
                }
            }
            watcher::Event::InitDone => {
                if let Some(relisted) = state.relisting_undecodable.take() {
                    state.undecodable = relisted;
                }
                self.init_done(state);
            }
            watcher::Event::Apply(Decoded::Typed(object)) => {
                state.undecodable.remove(&object_key(object));
                state.live.upsert(Arc::new(object.clone()));
            }
            watcher::Event::Apply(Decoded::Undecodable(undecodable)) => {
                let key = key_of(&undecodable.metadata);
                state.live.remove_named(&undecodable.metadata);
                match blocking(undecodable) {
                    Some(blocking) => state.undecodable.insert(key, blocking),
                    None => state.undecodable.remove(&key),
                };
            }
            watcher::Event::Delete(Decoded::Typed(object)) => {
                state.undecodable.remove(&object_key(object));
                state.delete(object);
            }
            watcher::Event::Delete(Decoded::Undecodable(undecodable)) => {
                state.undecodable.remove(&key_of(&undecodable.metadata));
                state.live.remove_named(&undecodable.metadata);
            }
        }
    }

    fn init_done(&self, mut state: MutexGuard<'_, State<K>>) {
        if let Some(relisted) = state.relisting.take() {
            state.live = relisted;
        }
        drop(state);
        self.ready.send_replace(true);
    }

    /// The first object owned by `owner_uid` that the watch could not decode, as
    /// `Kind name: error`.
    pub fn undecodable(&self, owner_uid: &str) -> Option<String> {
        let state = self.lock();
        let mut blocking: Vec<&Blocking> = state
            .undecodable
            .values()
            .filter(|blocking| blocking.owner == owner_uid)
            .collect();
        blocking.sort_by(|a, b| a.name.cmp(&b.name));
        blocking
            .first()
            .map(|blocking| format!("{} {}: {}", self.kind, blocking.name, blocking.error))
    }

    /// Waits until the watch has listed once.
    pub async fn wait_ready(&self) {
        let mut ready = self.ready.subscribe();
        // The sender lives as long as `self`, so this only returns once ready.
        let _ = ready.wait_for(|ready| *ready).await;
    }

    /// The objects `owner_uid` controls.
    pub fn owned_by(&self, owner_uid: &str) -> Vec<Arc<K>> {
        self.lock()
            .live
            .by_owner
            .get(owner_uid)
            .map(|owned| owned.values().cloned().collect())
            .unwrap_or_default()
    }

    /// How many objects the cache holds.
    pub fn len(&self) -> usize {
        self.lock().live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Remembers that our write left `name` (owned by `owner_uid`) at `resource_version`
    /// (`None`: it exists, at a version we do not know).
    pub fn expect_written(&self, owner_uid: &str, name: &str, resource_version: Option<String>) {
        self.expect(owner_uid, name, Expected::Present(resource_version));
    }

    /// Remembers that we deleted `name` (owned by `owner_uid`).
    pub fn expect_deleted(&self, owner_uid: &str, name: &str) {
        self.expect(owner_uid, name, Expected::Gone);
    }

    fn expect(&self, owner_uid: &str, name: &str, expected: Expected) {
        let mut state = self.lock();
        // Owners deleted before their writes were seen are checked no more: forget them here,
        // once per timeout.
        if state.pruned.elapsed() > EXPECTATION_TIMEOUT {
            state.expectations.retain(|_, pending| {
                pending
                    .iter()
                    .any(|expectation| expectation.since.elapsed() <= EXPECTATION_TIMEOUT)
            });
            state.pruned = Instant::now();
        }
        let pending = state.expectations.entry(owner_uid.to_string()).or_default();
        // The latest write to an object is the one to wait for.
        pending.retain(|expectation| expectation.name != name);
        pending.push(Expectation {
            name: name.to_string(),
            expected,
            since: Instant::now(),
        });
    }

    /// The first object owned by `owner_uid` whose cached copy is older than our last write to
    /// it, as `Kind name`. Expectations the cache has met, or that are older than
    /// [`EXPECTATION_TIMEOUT`], are forgotten.
    pub fn lagging(&self, owner_uid: &str) -> Option<String> {
        let mut guard = self.lock();
        let state = &mut *guard;
        let pending = state.expectations.get_mut(owner_uid)?;
        let owned = state.live.by_owner.get(owner_uid);
        let kind = self.kind;
        pending.retain(|expectation| {
            let cached = owned.and_then(|owned| owned.get(&expectation.name));
            let met = match (&expectation.expected, cached) {
                (Expected::Gone, cached) => cached.is_none(),
                (Expected::Present(_), None) => false,
                (Expected::Present(None), Some(_)) => true,
                (Expected::Present(Some(ours)), Some(cached)) => {
                    caught_up(cached.meta().resource_version.as_deref(), ours)
                }
            };
            let expired = expectation.since.elapsed() > EXPECTATION_TIMEOUT;
            if expired && !met {
                tracing::warn!(
                    kind,
                    name = %expectation.name,
                    expected = ?expectation.expected,
                    "the watch did not show our write in time; planning from the cache as it is"
                );
            }
            !met && !expired
        });
        let first = pending
            .first()
            .map(|expectation| format!("{kind} {}", expectation.name));
        if pending.is_empty() {
            state.expectations.remove(owner_uid);
        }
        first
    }
}

fn object_key<K: Resource>(object: &K) -> String {
    key_of(object.meta())
}

fn key_of(meta: &ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

/// The uid of the object's controller owner.
fn controller_uid<K: Resource>(object: &K) -> Option<String> {
    controller_uid_of(object.meta())
}

fn controller_uid_of(meta: &ObjectMeta) -> Option<String> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|owner| owner.controller == Some(true))
        .map(|owner| owner.uid.clone())
}

/// What an undecodable object blocks: its controller owner, if it has one.
fn blocking(undecodable: &Undecodable) -> Option<Blocking> {
    Some(Blocking {
        owner: controller_uid_of(&undecodable.metadata)?,
        name: undecodable.metadata.name.clone().unwrap_or_default(),
        error: undecodable.error.to_string(),
    })
}

/// Drops what observe never reads from a ReplicaSet: the pod template (the bulk of it; a
/// template that holds only its digest takes its place, see `planner::template_match`), the
/// selector, status conditions other than `ReplicaFailure`, and managedFields.
pub fn strip_replica_set(rs: &mut ReplicaSet) {
    rs.metadata.managed_fields = None;
    let digest = template_match::live_digest(rs);
    if let Some(spec) = rs.spec.as_mut() {
        spec.template = digest.map(template_match::digest_holder);
        spec.selector = Default::default();
    }
    if let Some(status) = rs.status.as_mut() {
        status.conditions = status
            .conditions
            .take()
            .map(|all| {
                all.into_iter()
                    .filter(|c| c.type_ == rollouts_crds::conditions::REPLICA_FAILURE)
                    .collect::<Vec<_>>()
            })
            .filter(|kept| !kept.is_empty());
    }
}

/// Drops what observe never reads from an AnalysisRun: metrics, arguments and measurements
/// (only the phase, message, `terminate` and labels are read), and managedFields.
pub fn strip_analysis_run(run: &mut AnalysisRun) {
    run.metadata.managed_fields = None;
    run.spec.metrics = Vec::new();
    run.spec.args = Vec::new();
    run.spec.dry_run = Vec::new();
    run.spec.measurement_retention = Vec::new();
    run.spec.ttl_strategy = None;
    if let Some(status) = run.status.as_mut() {
        status.metric_results = Vec::new();
        status.dry_run_summary = None;
    }
}

/// Drops what observe never reads from an Experiment: its pod templates, analyses and
/// conditions (only the phase, message, template statuses, `terminate` and labels are read), and
/// managedFields.
pub fn strip_experiment(experiment: &mut Experiment) {
    experiment.metadata.managed_fields = None;
    experiment.spec.templates = Vec::new();
    experiment.spec.analyses = Vec::new();
    experiment.spec.dry_run = Vec::new();
    experiment.spec.measurement_retention = Vec::new();
    experiment.spec.analysis_run_metadata = None;
    if let Some(status) = experiment.status.as_mut() {
        status.conditions = Vec::new();
        status.analysis_runs = Vec::new();
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::{ReplicaSetSpec, ReplicaSetStatus};
    use k8s_openapi::api::core::v1::{Affinity, PodSpec, PodTemplateSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        ManagedFieldsEntry, ObjectMeta, OwnerReference,
    };

    use super::*;

    fn replica_set(name: &str, owner: Option<&str>, resource_version: &str) -> ReplicaSet {
        ReplicaSet {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                resource_version: Some(resource_version.into()),
                owner_references: owner.map(|uid| {
                    vec![OwnerReference {
                        api_version: "argoproj.io/v1alpha1".into(),
                        kind: "Rollout".into(),
                        name: "web".into(),
                        uid: uid.into(),
                        controller: Some(true),
                        block_owner_deletion: Some(true),
                    }]
                }),
                ..ObjectMeta::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(1),
                ..ReplicaSetSpec::default()
            }),
            status: None,
        }
    }

    fn names(cache: &OwnedCache<ReplicaSet>, owner: &str) -> Vec<String> {
        cache
            .owned_by(owner)
            .iter()
            .map(|rs| rs.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    fn listed(cache: &OwnedCache<ReplicaSet>, objects: &[ReplicaSet]) {
        cache.apply(&watcher::Event::Init);
        for object in objects {
            cache.apply(&watcher::Event::InitApply(object.clone()));
        }
        cache.apply(&watcher::Event::InitDone);
    }

    #[test]
    fn objects_are_found_by_their_controller_owner_only() {
        let cache = OwnedCache::new("ReplicaSet");
        listed(
            &cache,
            &[
                replica_set("web-a", Some("uid-web"), "1"),
                replica_set("web-b", Some("uid-web"), "2"),
                replica_set("api-a", Some("uid-api"), "3"),
                replica_set("orphan", None, "4"),
            ],
        );
        assert_eq!(names(&cache, "uid-web"), vec!["web-a", "web-b"]);
        assert_eq!(names(&cache, "uid-api"), vec!["api-a"]);
        assert_eq!(cache.len(), 3, "an object without a controller is not kept");
    }

    #[test]
    fn deletes_and_owner_changes_move_objects_out_of_the_old_owner() {
        let cache = OwnedCache::new("ReplicaSet");
        listed(&cache, &[replica_set("web-a", Some("uid-web"), "1")]);
        cache.apply(&watcher::Event::Apply(replica_set(
            "web-a",
            Some("uid-other"),
            "2",
        )));
        assert!(names(&cache, "uid-web").is_empty());
        assert_eq!(names(&cache, "uid-other"), vec!["web-a"]);
        cache.apply(&watcher::Event::Apply(replica_set("web-a", None, "3")));
        assert!(cache.is_empty(), "an orphaned object is dropped");
        cache.apply(&watcher::Event::Apply(replica_set(
            "web-b",
            Some("uid-web"),
            "4",
        )));
        cache.apply(&watcher::Event::Delete(replica_set(
            "web-b",
            Some("uid-web"),
            "5",
        )));
        assert!(cache.is_empty());
    }

    #[test]
    fn a_relist_replaces_the_index_once_complete() {
        let cache = OwnedCache::new("ReplicaSet");
        listed(&cache, &[replica_set("web-a", Some("uid-web"), "1")]);
        cache.apply(&watcher::Event::Init);
        cache.apply(&watcher::Event::InitApply(replica_set(
            "web-b",
            Some("uid-web"),
            "7",
        )));
        assert_eq!(
            names(&cache, "uid-web"),
            vec!["web-a"],
            "reads see the old list until the new one is complete"
        );
        cache.apply(&watcher::Event::InitDone);
        assert_eq!(names(&cache, "uid-web"), vec!["web-b"]);
    }

    #[tokio::test]
    async fn readiness_waits_for_the_first_list() {
        let caches = OwnedCaches::new();
        assert!(!caches.wait_ready(Duration::from_millis(10)).await);
        caches.replica_sets.apply(&watcher::Event::Init);
        caches.replica_sets.apply(&watcher::Event::InitDone);
        caches.analysis_runs.apply(&watcher::Event::Init);
        caches.analysis_runs.apply(&watcher::Event::InitDone);
        assert!(!caches.wait_ready(Duration::from_millis(10)).await);
        caches.experiments.apply(&watcher::Event::Init);
        caches.experiments.apply(&watcher::Event::InitDone);
        assert!(caches.wait_ready(Duration::from_secs(5)).await);
    }

    #[test]
    fn a_created_object_lags_until_the_watch_delivers_it() {
        let cache = OwnedCache::new("ReplicaSet");
        listed(&cache, &[]);
        cache.expect_written("uid-web", "web-a", Some("5".into()));
        assert_eq!(
            cache.lagging("uid-web").as_deref(),
            Some("ReplicaSet web-a")
        );
        assert_eq!(
            cache.lagging("uid-api"),
            None,
            "other owners are not held up"
        );
        cache.apply(&watcher::Event::Apply(replica_set(
            "web-a",
            Some("uid-web"),
            "5",
        )));
        assert_eq!(cache.lagging("uid-web"), None);
    }

    #[test]
    fn a_scaled_object_lags_until_the_cache_holds_our_version_or_newer() {
        let cache = OwnedCache::new("ReplicaSet");
        listed(&cache, &[replica_set("web-a", Some("uid-web"), "5")]);
        cache.expect_written("uid-web", "web-a", Some("9".into()));
        assert!(cache.lagging("uid-web").is_some());
        cache.apply(&watcher::Event::Apply(replica_set(
            "web-a",
            Some("uid-web"),
            "8",
        )));
        assert!(cache.lagging("uid-web").is_some());
        cache.apply(&watcher::Event::Apply(replica_set(
            "web-a",
            Some("uid-web"),
            "12",
        )));
        assert_eq!(
            cache.lagging("uid-web"),
            None,
            "newer than our write is fine"
        );
    }

    #[test]
    fn a_conflicting_create_waits_for_the_object_at_any_version() {
        let cache = OwnedCache::new("ReplicaSet");
        listed(&cache, &[]);
        cache.expect_written("uid-web", "web-a", None);
        assert!(cache.lagging("uid-web").is_some());
        cache.apply(&watcher::Event::Apply(replica_set(
            "web-a",
            Some("uid-web"),
            "3",
        )));
        assert_eq!(cache.lagging("uid-web"), None);
    }

    #[test]
    fn an_object_deleted_after_our_write_is_not_waited_for() {
        let cache = OwnedCache::new("ReplicaSet");
        listed(&cache, &[replica_set("web-a", Some("uid-web"), "5")]);
        cache.expect_written("uid-web", "web-a", Some("9".into()));
        cache.apply(&watcher::Event::Delete(replica_set(
            "web-a",
            Some("uid-web"),
            "4",
        )));
        assert!(
            cache.lagging("uid-web").is_some(),
            "the deletion of an older copy says nothing about our write"
        );
        cache.apply(&watcher::Event::Delete(replica_set(
            "web-a",
            Some("uid-web"),
            "11",
        )));
        assert_eq!(cache.lagging("uid-web"), None);
    }

    #[test]
    fn a_deleted_object_lags_until_it_leaves_the_cache() {
        let cache = OwnedCache::new("ReplicaSet");
        listed(&cache, &[replica_set("web-a", Some("uid-web"), "5")]);
        cache.expect_deleted("uid-web", "web-a");
        assert!(cache.lagging("uid-web").is_some());
        cache.apply(&watcher::Event::Delete(replica_set(
            "web-a",
            Some("uid-web"),
            "6",
        )));
        assert_eq!(cache.lagging("uid-web"), None);
    }

    #[test]
    fn stripping_keeps_what_observe_reads() {
        let mut rs = replica_set("web-a", Some("uid-web"), "5");
        rs.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        rs.metadata.labels = Some(BTreeMap::from([(
            "rollouts-pod-template-hash".to_string(),
            "abc".to_string(),
        )]));
        let spec = rs.spec.as_mut().expect("spec");
        spec.template = Some(PodTemplateSpec {
            metadata: Some(ObjectMeta::default()),
            spec: Some(PodSpec {
                affinity: Some(Affinity::default()),
                hostname: Some("web".into()),
                ..PodSpec::default()
            }),
        });
        rs.status = Some(ReplicaSetStatus {
            replicas: 1,
            available_replicas: Some(1),
            conditions: Some(Vec::new()),
            ..ReplicaSetStatus::default()
        });
        let digest = template_match::live_digest(&rs).expect("a digest");
        strip_replica_set(&mut rs);
        assert_eq!(rs.metadata.managed_fields, None);
        let spec = rs.spec.as_ref().expect("spec");
        assert_eq!(spec.template, Some(template_match::digest_holder(digest)));
        assert_eq!(spec.replicas, Some(1));
        let status = rs.status.as_ref().expect("status");
        assert_eq!(status.available_replicas, Some(1));
        assert_eq!(status.conditions, None);
        assert_eq!(rs.metadata.labels.as_ref().map(BTreeMap::len), Some(1));

        // Of the conditions, only ReplicaFailure is kept: the Rollout's status carries it.
        let condition = |type_: &str| k8s_openapi::api::apps::v1::ReplicaSetCondition {
            type_: type_.to_string(),
            status: "True".to_string(),
            ..Default::default()
        };
        let mut failing = replica_set("web-b", Some("uid-web"), "6");
        failing.status = Some(ReplicaSetStatus {
            conditions: Some(vec![condition("Other"), condition("ReplicaFailure")]),
            ..ReplicaSetStatus::default()
        });
        strip_replica_set(&mut failing);
        let kept = failing
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default();
        assert_eq!(
            kept.iter().map(|c| c.type_.as_str()).collect::<Vec<_>>(),
            ["ReplicaFailure"]
        );
    }

    #[test]
    fn stripping_a_run_keeps_its_phase_message_and_terminate() {
        let mut run: AnalysisRun = serde_json::from_value(serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "AnalysisRun",
            "metadata": {"name": "web-abc-2-1", "labels": {"rollout-type": "Step"}},
            "spec": {"metrics": [{"name": "errors", "provider": {"web": {"url": "http://127.0.0.1:9/"}}}],
                     "args": [{"name": "hash", "value": "abc"}], "terminate": true},
            "status": {"phase": "Failed", "message": "error rate too high",
                       "metricResults": [{"name": "errors", "phase": "Failed", "count": 3}]}
        }))
        .expect("an AnalysisRun");
        strip_analysis_run(&mut run);
        assert!(run.spec.metrics.is_empty() && run.spec.args.is_empty());
        assert!(run.spec.terminate);
        let status = run.status.as_ref().expect("status");
        assert!(status.metric_results.is_empty());
        assert_eq!(status.phase, rollouts_crds::analysis::AnalysisPhase::Failed);
        assert_eq!(status.message, "error rate too high");
        assert_eq!(run.metadata.labels.as_ref().map(BTreeMap::len), Some(1));
    }

    /// The JSON of `replica_set(name, owner, version)`, with `spec.replicas` set to `replicas`.
    fn decoded(name: &str, owner: &str, version: &str, replicas: u64) -> Decoded<ReplicaSet> {
        let mut json =
            serde_json::to_value(replica_set(name, Some(owner), version)).expect("encodes");
        json["spec"]["replicas"] = replicas.into();
        Decoded::from_json(&json.to_string())
    }

    #[test]
    fn an_undecodable_object_leaves_the_cache_and_blocks_its_owner_until_fixed() {
        let cache = OwnedCache::new("ReplicaSet");
        cache.apply_decoded(&watcher::Event::Init);
        cache.apply_decoded(&watcher::Event::InitApply(decoded(
            "web-a", "uid-web", "1", 1,
        )));
        cache.apply_decoded(&watcher::Event::InitApply(decoded(
            "api-a", "uid-api", "2", 1,
        )));
        cache.apply_decoded(&watcher::Event::InitDone);
        assert_eq!(cache.undecodable("uid-web"), None);

        cache.apply_decoded(&watcher::Event::Apply(decoded(
            "web-a",
            "uid-web",
            "3",
            3_000_000_000,
        )));
        assert!(
            names(&cache, "uid-web").is_empty(),
            "its last version is gone"
        );
        let blocking = cache.undecodable("uid-web").expect("the owner is blocked");
        assert!(
            blocking.starts_with("ReplicaSet web-a: spec.replicas:"),
            "{blocking}"
        );
        assert_eq!(cache.undecodable("uid-api"), None, "other owners are not");
        assert_eq!(names(&cache, "uid-api"), vec!["api-a"]);

        // A relist that finds it still undecodable keeps the owner blocked.
        cache.apply_decoded(&watcher::Event::Init);
        cache.apply_decoded(&watcher::Event::InitApply(decoded(
            "web-a",
            "uid-web",
            "3",
            3_000_000_000,
        )));
        cache.apply_decoded(&watcher::Event::InitDone);
        assert!(cache.undecodable("uid-web").is_some());

        cache.apply_decoded(&watcher::Event::Apply(decoded("web-a", "uid-web", "4", 2)));
        assert_eq!(cache.undecodable("uid-web"), None, "fixed");
        assert_eq!(names(&cache, "uid-web"), vec!["web-a"]);

        cache.apply_decoded(&watcher::Event::Apply(decoded(
            "web-a",
            "uid-web",
            "5",
            3_000_000_000,
        )));
        cache.apply_decoded(&watcher::Event::Delete(decoded(
            "web-a",
            "uid-web",
            "6",
            3_000_000_000,
        )));
        assert_eq!(cache.undecodable("uid-web"), None, "deleted");
        assert!(cache.is_empty() || names(&cache, "uid-web").is_empty());
    }
}
