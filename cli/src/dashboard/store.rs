//! What the dashboard knows of the cluster: the Rollouts, ReplicaSets, pods, AnalysisRuns and
//! Experiments in its scope, kept current by one watch per kind, and a broadcast of every change for the pages'
//! live streams.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;
use tokio::sync::broadcast;

use rollouts_controller::decode::Decoded;

use crate::cluster::{BadObject, Watched};
use crate::view::tree::owned_by;

/// The kinds the dashboard watches.
pub const KINDS: [Watched; 5] = [
    Watched::Rollout,
    Watched::ReplicaSet,
    Watched::Pod,
    Watched::AnalysisRun,
    Watched::Experiment,
];

/// Which namespaces the dashboard shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    All,
    Namespace(String),
}

/// One object that changed (or was listed again).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub kind: Watched,
    pub namespace: String,
}

type Key = (String, String);

#[derive(Default)]
struct Objects {
    rollouts: BTreeMap<Key, Value>,
    replica_sets: BTreeMap<Key, Value>,
    pods: BTreeMap<Key, Value>,
    analysis_runs: BTreeMap<Key, Value>,
    experiments: BTreeMap<Key, Value>,
    /// The last watch failure of each kind, cleared when its watch works again.
    watch_errors: BTreeMap<&'static str, String>,
    /// Objects that do not decode, by kind and key: what is wrong with each.
    undecodable: BTreeMap<(&'static str, Key), String>,
}

impl Objects {
    fn of(&mut self, kind: Watched) -> &mut BTreeMap<Key, Value> {
        match kind {
            Watched::Rollout => &mut self.rollouts,
            Watched::ReplicaSet => &mut self.replica_sets,
            Watched::Pod => &mut self.pods,
            Watched::AnalysisRun => &mut self.analysis_runs,
            Watched::Experiment => &mut self.experiments,
        }
    }
}

/// A Rollout and the objects it owns, as the pages draw them: its ReplicaSets and AnalysisRuns
/// and its Experiments', the pods of all those ReplicaSets, and its Experiments.
#[derive(Clone, Debug, Default)]
pub struct RolloutObjects {
    pub rollout: Value,
    pub replica_sets: Vec<Value>,
    pub pods: Vec<Value>,
    pub analysis_runs: Vec<Value>,
    pub experiments: Vec<Value>,
}

impl RolloutObjects {
    /// The resourceVersions of every object drawn, in order: equal versions, equal drawing.
    pub fn versions(&self) -> Vec<String> {
        std::iter::once(&self.rollout)
            .chain(&self.replica_sets)
            .chain(&self.pods)
            .chain(&self.analysis_runs)
            .chain(&self.experiments)
            .map(|object| {
                let text = |p: &str| {
                    object
                        .pointer(p)
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                };
                format!(
                    "{}/{}@{}",
                    text("/kind"),
                    text("/metadata/name"),
                    text("/metadata/resourceVersion")
                )
            })
            .collect()
    }
}

/// The watched objects, shared by the watches and the HTTP handlers.
pub struct Store {
    objects: RwLock<Objects>,
    /// Counts changes; a page rendered at version V knows whether it missed one.
    version: AtomicU64,
    changes: broadcast::Sender<Change>,
}

fn key_of(object: &Value) -> Key {
    let text = |pointer| {
        object
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    (text("/metadata/namespace"), text("/metadata/name"))
}

/// The object as JSON without its managedFields (large, and never drawn).
fn to_value(mut object: DynamicObject) -> Option<Value> {
    object.metadata.managed_fields = None;
    serde_json::to_value(object).ok()
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

impl Store {
    pub fn new() -> Self {
        // A page that falls this far behind resynchronises from the store (Lagged).
        let (changes, _) = broadcast::channel(1024);
        Self {
            objects: RwLock::new(Objects::default()),
            version: AtomicU64::new(0),
            changes,
        }
    }

    pub fn version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Objects> {
        self.objects
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Objects> {
        self.objects
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn changed(&self, kind: Watched, namespace: String) {
        self.version.fetch_add(1, Ordering::SeqCst);
        // No page listening is not an error.
        let _ = self.changes.send(Change { kind, namespace });
    }

    /// Stores `object` (added or modified).
    pub fn apply(&self, kind: Watched, object: Value) {
        let key = key_of(&object);
        let namespace = key.0.clone();
        {
            let mut all = self.write();
            all.undecodable.remove(&(kind.kind(), key.clone()));
            all.of(kind).insert(key, object);
        }
        self.changed(kind, namespace);
    }

    /// Forgets `object` (deleted).
    pub fn delete(&self, kind: Watched, object: &Value) {
        let key = key_of(object);
        let namespace = key.0.clone();
        {
            let mut all = self.write();
            all.undecodable.remove(&(kind.kind(), key.clone()));
            all.of(kind).remove(&key);
        }
        self.changed(kind, namespace);
    }

    /// Records an object that does not decode (and drops what was known of it before).
    pub fn undecodable(&self, bad: BadObject) {
        let key = (bad.namespace().to_string(), bad.name().to_string());
        let namespace = key.0.clone();
        {
            let mut all = self.write();
            all.of(bad.kind).remove(&key);
            all.undecodable
                .insert((bad.kind.kind(), key), bad.to_string());
        }
        self.changed(bad.kind, namespace);
    }

    /// Replaces every object of `kind` with a fresh listing.
    pub fn replace(&self, kind: Watched, objects: Vec<Value>) {
        let fresh: BTreeMap<Key, Value> = objects.into_iter().map(|o| (key_of(&o), o)).collect();
        {
            let mut all = self.write();
            *all.of(kind) = fresh;
            all.watch_errors.remove(kind.kind());
            all.undecodable.retain(|(k, _), _| *k != kind.kind());
        }
        self.changed(kind, String::new());
    }

    fn watch_failed(&self, kind: Watched, error: String) {
        let mut all = self.write();
        if all.watch_errors.get(kind.kind()) != Some(&error) {
            all.watch_errors.insert(kind.kind(), error);
        }
    }

    /// The watch failures and undecodable objects the pages show above everything else.
    pub fn watch_errors(&self) -> Vec<String> {
        let all = self.read();
        all.watch_errors
            .iter()
            .map(|(kind, error)| format!("watching {kind}s: {error}"))
            .chain(all.undecodable.values().cloned())
            .collect()
    }

    /// Every Rollout, ordered by namespace and name.
    pub fn rollouts(&self) -> Vec<Value> {
        self.read().rollouts.values().cloned().collect()
    }

    /// The namespaces that hold Rollouts.
    pub fn namespaces(&self) -> Vec<String> {
        let mut namespaces: Vec<String> = self
            .read()
            .rollouts
            .keys()
            .map(|(ns, _)| ns.clone())
            .collect();
        namespaces.dedup();
        namespaces
    }

    /// Calls `visit` with each Rollout and the ReplicaSets it owns (for the weight its pods
    /// really get), under the read lock, without copying them.
    pub fn each_rollout_with_sets(&self, mut visit: impl FnMut(&Value, &[&Value])) {
        let all = self.read();
        for ((namespace, _), rollout) in &all.rollouts {
            let sets: Vec<&Value> = all
                .replica_sets
                .range((namespace.clone(), String::new())..)
                .take_while(|((ns, _), _)| ns == namespace)
                .map(|(_, rs)| rs)
                .filter(|rs| owned_by(rs, rollout))
                .collect();
            visit(rollout, &sets);
        }
    }

    /// One Rollout and what it owns: its ReplicaSets, AnalysisRuns and Experiments, and what
    /// its Experiments own; the pods of all those ReplicaSets.
    pub fn rollout_objects(&self, namespace: &str, name: &str) -> Option<RolloutObjects> {
        let all = self.read();
        let rollout = all
            .rollouts
            .get(&(namespace.to_string(), name.to_string()))?
            .clone();
        let in_namespace = |map: &BTreeMap<Key, Value>| -> Vec<Value> {
            map.range((namespace.to_string(), String::new())..)
                .take_while(|((ns, _), _)| ns == namespace)
                .map(|(_, object)| object.clone())
                .collect()
        };
        let experiments: Vec<Value> = in_namespace(&all.experiments)
            .into_iter()
            .filter(|experiment| owned_by(experiment, &rollout))
            .collect();
        let mine = |object: &Value| {
            owned_by(object, &rollout) || experiments.iter().any(|e| owned_by(object, e))
        };
        let replica_sets: Vec<Value> = in_namespace(&all.replica_sets)
            .into_iter()
            .filter(|rs| mine(rs))
            .collect();
        let pods = in_namespace(&all.pods)
            .into_iter()
            .filter(|pod| replica_sets.iter().any(|rs| owned_by(pod, rs)))
            .collect();
        let analysis_runs = in_namespace(&all.analysis_runs)
            .into_iter()
            .filter(|run| mine(run))
            .collect();
        Some(RolloutObjects {
            rollout,
            replica_sets,
            pods,
            analysis_runs,
            experiments,
        })
    }

    /// Runs one watch per kind until the process ends; a failing watch is retried with
    /// backoff and its error shown on the pages meanwhile.
    pub async fn watch(self: Arc<Self>, client: kube::Client, scope: Scope) {
        let watches = KINDS.map(|kind| {
            let store = Arc::clone(&self);
            let api: Api<Decoded<DynamicObject>> = match &scope {
                Scope::All => Api::all_with(client.clone(), &kind.resource()),
                Scope::Namespace(ns) => Api::namespaced_with(client.clone(), ns, &kind.resource()),
            };
            async move { store.watch_kind(kind, api).await }
        });
        futures::future::join_all(watches).await;
    }

    async fn watch_kind(&self, kind: Watched, api: Api<Decoded<DynamicObject>>) {
        let mut listing: Vec<Value> = Vec::new();
        let mut bad: Vec<BadObject> = Vec::new();
        let mut events = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Init) => {
                    listing.clear();
                    bad.clear();
                }
                Ok(watcher::Event::InitApply(Decoded::Typed(object))) => {
                    listing.extend(to_value(object));
                }
                Ok(watcher::Event::InitApply(Decoded::Undecodable(object))) => {
                    bad.push(BadObject { kind, object });
                }
                Ok(watcher::Event::InitDone) => {
                    self.replace(kind, std::mem::take(&mut listing));
                    for object in bad.drain(..) {
                        self.undecodable(object);
                    }
                }
                Ok(watcher::Event::Apply(Decoded::Typed(object))) => {
                    if let Some(object) = to_value(object) {
                        self.apply(kind, object);
                    }
                }
                Ok(watcher::Event::Apply(Decoded::Undecodable(object))) => {
                    self.undecodable(BadObject { kind, object });
                }
                Ok(watcher::Event::Delete(Decoded::Typed(object))) => {
                    if let Some(object) = to_value(object) {
                        self.delete(kind, &object);
                    }
                }
                Ok(watcher::Event::Delete(Decoded::Undecodable(object))) => {
                    let gone = BadObject { kind, object }.metadata_json();
                    self.delete(kind, &gone);
                }
                Err(error) => self.watch_failed(kind, error.to_string()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(namespace: &str, name: &str, uid: &str, owner_uid: Option<&str>) -> Value {
        let mut object = json!({"metadata": {"namespace": namespace, "name": name, "uid": uid}});
        if let Some(owner) = owner_uid {
            object["metadata"]["ownerReferences"] = json!([{"uid": owner, "name": "x"}]);
        }
        object
    }

    #[test]
    fn a_rollout_gets_only_what_it_owns_in_its_namespace() {
        let store = Store::new();
        store.replace(
            Watched::Rollout,
            vec![
                object("a", "web", "r1", None),
                object("b", "web", "r2", None),
            ],
        );
        store.replace(
            Watched::ReplicaSet,
            vec![
                object("a", "web-1", "s1", Some("r1")),
                object("a", "other-1", "s2", Some("zz")),
                object("b", "web-1", "s3", Some("r2")),
            ],
        );
        store.replace(Watched::Pod, vec![object("a", "web-1-x", "p1", Some("s1"))]);
        store.replace(
            Watched::AnalysisRun,
            vec![object("a", "web-run", "a1", Some("r1"))],
        );
        let web = store.rollout_objects("a", "web").expect("web in a");
        assert_eq!(web.replica_sets.len(), 1);
        assert_eq!(web.replica_sets[0]["metadata"]["uid"], "s1");
        assert_eq!(web.pods.len(), 1);
        assert_eq!(web.analysis_runs.len(), 1);
        assert!(web.experiments.is_empty());
        assert!(store.rollout_objects("a", "nope").is_none());
        assert_eq!(store.namespaces(), vec!["a", "b"]);
    }

    #[test]
    fn a_rollout_gets_its_experiments_and_what_they_own() {
        let store = Store::new();
        store.apply(Watched::Rollout, object("a", "web", "r1", None));
        store.replace(
            Watched::Experiment,
            vec![
                object("a", "web-2-0", "e1", Some("r1")),
                object("a", "api-1-0", "e2", Some("r2")),
            ],
        );
        store.replace(
            Watched::ReplicaSet,
            vec![
                object("a", "web-2-0-canary", "s1", Some("e1")),
                object("a", "api-1-0-canary", "s2", Some("e2")),
            ],
        );
        store.replace(
            Watched::Pod,
            vec![
                object("a", "web-2-0-canary-x", "p1", Some("s1")),
                object("a", "api-1-0-canary-x", "p2", Some("s2")),
            ],
        );
        store.replace(
            Watched::AnalysisRun,
            vec![
                object("a", "web-2-0-judge", "a1", Some("e1")),
                object("a", "api-1-0-judge", "a2", Some("e2")),
            ],
        );
        let web = store.rollout_objects("a", "web").expect("web in a");
        let names = |objects: &[Value]| -> Vec<String> {
            objects
                .iter()
                .map(|o| {
                    o["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string()
                })
                .collect()
        };
        assert_eq!(names(&web.experiments), ["web-2-0"]);
        assert_eq!(names(&web.replica_sets), ["web-2-0-canary"]);
        assert_eq!(names(&web.pods), ["web-2-0-canary-x"]);
        assert_eq!(names(&web.analysis_runs), ["web-2-0-judge"]);
        assert_eq!(web.versions().len(), 5, "every object drawn counts");
    }

    #[test]
    fn an_undecodable_object_is_named_until_it_decodes_again() {
        let store = Store::new();
        store.apply(Watched::Rollout, object("a", "web", "r1", None));
        let text =
            json!({"metadata": {"namespace": "a", "name": "web"}, "spec": {"replicas": "x"}})
                .to_string();
        let Decoded::Undecodable(bad) =
            Decoded::<rollouts_crds::rollout::Rollout>::from_json(&text)
        else {
            panic!("replicas \"x\" decoded");
        };
        store.undecodable(BadObject {
            kind: Watched::Rollout,
            object: bad,
        });
        assert!(store.rollouts().is_empty(), "the stale copy is dropped");
        let errors = store.watch_errors();
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0]
                .starts_with("Rollout \"web\" in namespace \"a\" cannot be decoded: spec.replicas"),
            "{errors:?}"
        );
        store.apply(Watched::Rollout, object("a", "web", "r1", None));
        assert!(store.watch_errors().is_empty());
        assert_eq!(store.rollouts().len(), 1);
    }

    #[test]
    fn a_new_resource_version_of_anything_drawn_changes_the_versions() {
        let mut objects = RolloutObjects {
            rollout: object("a", "web", "r1", None),
            replica_sets: vec![object("a", "web-1", "s1", Some("r1"))],
            ..Default::default()
        };
        objects.replica_sets[0]["metadata"]["resourceVersion"] = json!("7");
        let before = objects.versions();
        assert_eq!(before.len(), 2);
        objects.replica_sets[0]["metadata"]["resourceVersion"] = json!("8");
        assert_ne!(objects.versions(), before);
    }

    #[test]
    fn every_change_is_counted_and_broadcast() {
        let store = Store::new();
        let mut changes = store.subscribe();
        let before = store.version();
        store.apply(Watched::Rollout, object("a", "web", "r1", None));
        store.delete(Watched::Rollout, &object("a", "web", "r1", None));
        assert_eq!(store.version(), before + 2);
        assert_eq!(
            changes.try_recv().ok(),
            Some(Change {
                kind: Watched::Rollout,
                namespace: "a".into()
            })
        );
        assert!(store.rollouts().is_empty());
    }
}
