//! Which Rollouts name which Services and router objects, kept up to date from the Rollout
//! watch, so that "one object, one Rollout" costs a map lookup per reconcile rather than a list
//! of every Rollout. The rule itself (who of several is the first) is the planner's
//! ([`crate::planner`]); this index only answers "who else names it".
//!
//! Every Rollout in the watch has an entry (with or without objects), so a re-list that no
//! longer returns one tells the controller it is gone even when the delete event was missed.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use futures::Stream;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::Event;
use rollouts_crds::rollout::Rollout;

use crate::observe::named_services;
use crate::planner::Claimant;

/// Kind of a Service claim (router objects carry their own kind).
pub const SERVICE: &str = "Service";

/// One object a Rollout's spec names that only one Rollout may drive, and the field naming it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub field: &'static str,
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
}

/// The field reported for an object a router makes from the spec rather than names (the nginx
/// canary Ingress, `<rollout>-<stable ingress>-canary`).
const MADE_BY_ROUTER: &str = "spec.strategy.canary.trafficRouting";

/// The Services (stable, canary, active, preview) and the router objects (nginx stable
/// Ingresses and the canary Ingresses made from them, Istio VirtualServices and
/// DestinationRule, Gateway API HTTPRoutes) `rollout` names, each once, in spec order. A canary
/// Ingress is named after its Rollout, but two names can still meet (`a-b` with stable Ingress
/// `c`, `a` with `b-c`): then it is shared like any other object.
pub fn claims_of(rollout: &Rollout) -> Vec<Claim> {
    let namespace = rollout.namespace().unwrap_or_default();
    let services = named_services(rollout)
        .into_iter()
        .map(|(field, name)| Claim {
            field,
            kind: SERVICE,
            namespace: namespace.clone(),
            name,
        });
    let routers = rollouts_traffic::router_objects(rollout)
        .into_iter()
        .map(|object| Claim {
            field: object.field.unwrap_or(MADE_BY_ROUTER),
            kind: object.kind.kind,
            namespace: object.namespace,
            name: object.name,
        });
    let mut claims: Vec<Claim> = Vec::new();
    for claim in services.chain(routers) {
        let seen = claims.iter().any(|c| {
            c.kind == claim.kind && c.namespace == claim.namespace && c.name == claim.name
        });
        if !seen {
            claims.push(claim);
        }
    }
    claims
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct ObjectKey {
    kind: &'static str,
    namespace: String,
    name: String,
}

impl From<&Claim> for ObjectKey {
    fn from(claim: &Claim) -> Self {
        Self {
            kind: claim.kind,
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct RolloutKey {
    namespace: String,
    name: String,
}

impl RolloutKey {
    fn of(rollout: &Rollout) -> Self {
        Self {
            namespace: rollout.namespace().unwrap_or_default(),
            name: rollout.name_any(),
        }
    }

    fn object_ref(&self) -> ObjectRef<Rollout> {
        ObjectRef::new(&self.name).within(&self.namespace)
    }
}

#[derive(Clone, Debug)]
struct Entry {
    created: Timestamp,
    objects: Vec<ObjectKey>,
}

/// Rollouts and the objects they claim, both ways.
#[derive(Debug, Default)]
struct Index {
    rollouts: HashMap<RolloutKey, Entry>,
    /// Sorted; almost always one Rollout, so a `Vec` of exactly that (a set would allocate a
    /// whole tree node per object).
    by_object: HashMap<ObjectKey, Vec<RolloutKey>>,
}

impl Index {
    /// Records `rollout`'s claims; returns the other Rollouts sharing an object it claimed
    /// before or claims now, when its claims changed (their owner may have changed).
    fn insert(&mut self, rollout: &Rollout) -> BTreeSet<RolloutKey> {
        let key = RolloutKey::of(rollout);
        let objects: Vec<ObjectKey> = claims_of(rollout).iter().map(ObjectKey::from).collect();
        let created = rollout
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(Timestamp::UNIX_EPOCH, |time| time.0);
        let unchanged = self
            .rollouts
            .get(&key)
            .is_some_and(|entry| entry.objects == objects && entry.created == created);
        if unchanged {
            return BTreeSet::new();
        }
        let mut affected = self.remove(&key);
        for object in &objects {
            let sharing = self
                .by_object
                .entry(object.clone())
                .or_insert_with(|| Vec::with_capacity(1));
            affected.extend(sharing.iter().cloned());
            if let Err(at) = sharing.binary_search(&key) {
                sharing.insert(at, key.clone());
            }
        }
        self.rollouts
            .insert(key.clone(), Entry { created, objects });
        affected.remove(&key);
        affected
    }

    /// Forgets `key`; returns the other Rollouts that shared an object with it.
    fn remove(&mut self, key: &RolloutKey) -> BTreeSet<RolloutKey> {
        let mut affected = BTreeSet::new();
        let Some(entry) = self.rollouts.remove(key) else {
            return affected;
        };
        for object in &entry.objects {
            if let Some(sharing) = self.by_object.get_mut(object) {
                sharing.retain(|other| other != key);
                affected.extend(sharing.iter().cloned());
                if sharing.is_empty() {
                    self.by_object.remove(object);
                }
            }
        }
        affected
    }

    /// Every Rollout that shares an object with another.
    fn sharing(&self) -> impl Iterator<Item = &RolloutKey> {
        self.by_object
            .values()
            .filter(|sharing| sharing.len() > 1)
            .flatten()
    }
}

#[derive(Debug, Default)]
struct State {
    live: Index,
    /// Built from a re-list's objects; replaces `live` when the list is complete.
    relisting: Option<Index>,
}

/// The claims of every watched Rollout. Fed by the Rollout watch ([`Self::apply`]) after its
/// store, read by observe ([`Self::others`]).
#[derive(Debug, Default)]
pub struct Claims {
    state: Mutex<State>,
}

impl Claims {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes one Rollout watch event in; returns the Rollouts to reconcile because of it:
    /// those sharing an object with a Rollout that was deleted or changed what it names (one of
    /// them may now be first), and, after a re-list, those that are gone (so their bookkeeping
    /// is dropped) and those sharing an object.
    pub fn apply(&self, event: &Event<Rollout>) -> Vec<ObjectRef<Rollout>> {
        let mut state = self.state();
        let wake: Vec<RolloutKey> = match event {
            Event::Apply(rollout) => state.live.insert(rollout).into_iter().collect(),
            Event::Delete(rollout) => {
                let key = RolloutKey::of(rollout);
                let mut wake: Vec<RolloutKey> = state.live.remove(&key).into_iter().collect();
                wake.push(key);
                wake
            }
            Event::Init => {
                state.relisting = Some(Index::default());
                Vec::new()
            }
            Event::InitApply(rollout) => {
                state
                    .relisting
                    .get_or_insert_with(Index::default)
                    .insert(rollout);
                Vec::new()
            }
            Event::InitDone => {
                let fresh = state.relisting.take().unwrap_or_default();
                let old = std::mem::replace(&mut state.live, fresh);
                let mut wake: HashSet<RolloutKey> = old
                    .rollouts
                    .keys()
                    .filter(|key| !state.live.rollouts.contains_key(*key))
                    .cloned()
                    .collect();
                wake.extend(old.sharing().cloned());
                wake.extend(state.live.sharing().cloned());
                wake.into_iter().collect()
            }
        };
        wake.iter().map(RolloutKey::object_ref).collect()
    }

    /// The Rollouts other than `namespace/name` that name the object `claim` names.
    pub fn others(&self, (namespace, name): (&str, &str), claim: &Claim) -> Vec<Claimant> {
        let state = self.state();
        let Some(sharing) = state.live.by_object.get(&ObjectKey::from(claim)) else {
            return Vec::new();
        };
        sharing
            .iter()
            .filter(|key| !(key.namespace == namespace && key.name == name))
            .filter_map(|key| {
                let entry = state.live.rollouts.get(key)?;
                Some(Claimant {
                    namespace: key.namespace.clone(),
                    name: key.name.clone(),
                    created: entry.created,
                })
            })
            .collect()
    }

    /// The Rollouts naming the `kind` object `namespace/name`: whom a watch event about it
    /// concerns.
    pub fn naming(
        &self,
        kind: &'static str,
        namespace: &str,
        name: &str,
    ) -> Vec<ObjectRef<Rollout>> {
        let key = ObjectKey {
            kind,
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        self.state()
            .live
            .by_object
            .get(&key)
            .map(|sharing| sharing.iter().map(RolloutKey::object_ref).collect())
            .unwrap_or_default()
    }

    /// How many Rollouts are indexed.
    pub fn len(&self) -> usize {
        self.state().live.rollouts.len()
    }

    /// Whether no Rollout is indexed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Feeds `claims` from the Rollout watch: `feed` takes each event (after the store applied
/// it) and the stream yields the Rollouts [`Claims::apply`] says to reconcile, for
/// `Controller::reconcile_on`. A Rollout that is gone then ends as `ObjectNotFound`, which is
/// where its bookkeeping is dropped ([`crate::context::Context::forget`]).
pub fn feeder(
    claims: Arc<Claims>,
) -> (
    impl FnMut(&Event<Rollout>) + Send + 'static,
    impl Stream<Item = ObjectRef<Rollout>> + Send + 'static,
) {
    // Unbounded, but each event adds at most the Rollouts sharing an object with one Rollout
    // (or, after a re-list, those sharing and those gone), and the controller drains it.
    let (wake, woken) = futures::channel::mpsc::unbounded();
    let feed = move |event: &Event<Rollout>| {
        for rollout in claims.apply(event) {
            // The receiver is gone only when the controller stopped.
            let _ = wake.unbounded_send(rollout);
        }
    };
    (feed, woken)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use rollouts_crds::rollout::CanaryStep;

    use super::*;

    fn rollout(name: &str, created: i64, stable: &str) -> Rollout {
        let mut rollout = Rollout::test_canary(name, vec![CanaryStep::weight(20)]);
        rollout.metadata.namespace = Some("shop".into());
        rollout.metadata.creation_timestamp =
            Some(Time(Timestamp::from_second(created).expect("in range")));
        if let Some(canary) = rollout.spec.strategy.canary.as_mut() {
            canary.stable_service = Some(stable.into());
        }
        rollout
    }

    fn names(refs: &[ObjectRef<Rollout>]) -> Vec<String> {
        let mut names: Vec<String> = refs.iter().map(|r| r.name.clone()).collect();
        names.sort();
        names
    }

    fn stable(name: &str) -> Claim {
        Claim {
            field: "spec.strategy.canary.stableService",
            kind: SERVICE,
            namespace: "shop".into(),
            name: name.into(),
        }
    }

    #[test]
    fn others_naming_a_service_are_found_without_the_asker() {
        let claims = Claims::default();
        claims.apply(&Event::Apply(rollout("a", 10, "web")));
        let wake = claims.apply(&Event::Apply(rollout("b", 20, "web")));
        assert_eq!(names(&wake), vec!["a"], "a's owner may have changed");
        let others = claims.others(("shop", "b"), &stable("web"));
        assert_eq!(
            others,
            vec![Claimant {
                namespace: "shop".into(),
                name: "a".into(),
                created: Timestamp::from_second(10).expect("in range"),
            }]
        );
        assert!(claims.others(("shop", "a"), &stable("other")).is_empty());
    }

    #[test]
    fn an_unchanged_rollout_wakes_nobody() {
        let claims = Claims::default();
        claims.apply(&Event::Apply(rollout("a", 10, "web")));
        claims.apply(&Event::Apply(rollout("b", 20, "web")));
        assert!(
            claims
                .apply(&Event::Apply(rollout("a", 10, "web")))
                .is_empty()
        );
    }

    #[test]
    fn deleting_or_moving_away_wakes_those_that_shared_and_prunes_the_entry() {
        let claims = Claims::default();
        claims.apply(&Event::Apply(rollout("a", 10, "web")));
        claims.apply(&Event::Apply(rollout("b", 20, "web")));
        let wake = claims.apply(&Event::Apply(rollout("a", 10, "elsewhere")));
        assert_eq!(names(&wake), vec!["b"]);
        assert!(claims.others(("shop", "b"), &stable("web")).is_empty());
        let wake = claims.apply(&Event::Delete(rollout("b", 20, "web")));
        assert_eq!(
            names(&wake),
            vec!["b"],
            "the deleted one itself, to forget it"
        );
        assert_eq!(claims.len(), 1);
        let state = claims.state();
        assert_eq!(
            state.live.by_object.len(),
            1,
            "no empty object entries kept"
        );
    }

    #[test]
    fn a_relist_replaces_the_index_and_wakes_the_vanished_and_the_sharing() {
        let claims = Claims::default();
        claims.apply(&Event::Apply(rollout("gone", 5, "old")));
        claims.apply(&Event::Apply(rollout("a", 10, "web")));
        claims.apply(&Event::Init);
        claims.apply(&Event::InitApply(rollout("a", 10, "web")));
        claims.apply(&Event::InitApply(rollout("b", 20, "web")));
        assert_eq!(
            claims.others(("shop", "x"), &stable("old")).len(),
            1,
            "the old index serves until the list is done"
        );
        let wake = claims.apply(&Event::InitDone);
        assert_eq!(names(&wake), vec!["a", "b", "gone"]);
        assert_eq!(claims.len(), 2);
        assert!(claims.others(("shop", "x"), &stable("old")).is_empty());
    }

    #[test]
    fn a_router_object_event_finds_the_rollouts_naming_it_including_the_made_canary_ingress() {
        let mut routed = rollout("a", 10, "web");
        let canary = routed.spec.strategy.canary.as_mut().expect("a canary");
        canary.canary_service = Some("web-canary".into());
        canary.traffic_routing = Some(
            serde_json::from_value(serde_json::json!({"nginx": {"stableIngress": "shop"}}))
                .expect("a trafficRouting"),
        );
        let claims = Claims::default();
        claims.apply(&Event::Apply(routed.clone()));
        claims.apply(&Event::Apply(rollout("b", 20, "web")));
        let ingress = rollouts_traffic::INGRESS.kind;
        assert_eq!(names(&claims.naming(ingress, "shop", "shop")), vec!["a"]);
        let made = claims_of(&routed)
            .into_iter()
            .find(|claim| claim.field == MADE_BY_ROUTER)
            .expect("the canary Ingress");
        assert_eq!(
            names(&claims.naming(ingress, "shop", &made.name)),
            vec!["a"]
        );
        assert_eq!(
            names(&claims.naming(SERVICE, "shop", "web")),
            vec!["a", "b"]
        );
        assert!(
            claims.naming(ingress, "shop", "web").is_empty(),
            "kinds apart"
        );
        assert!(claims.naming(ingress, "other", "shop").is_empty());
    }

    #[test]
    fn a_blue_green_active_service_and_a_canary_stable_service_are_one_object() {
        let mut blue_green = Rollout::test_blue_green("bg");
        blue_green.metadata.namespace = Some("shop".into());
        let fields: Vec<&str> = claims_of(&blue_green).iter().map(|c| c.field).collect();
        assert_eq!(
            fields,
            vec![
                "spec.strategy.blueGreen.activeService",
                "spec.strategy.blueGreen.previewService"
            ]
        );
        let claims = Claims::default();
        claims.apply(&Event::Apply(blue_green));
        claims.apply(&Event::Apply(rollout("canary", 20, "bg-active")));
        assert_eq!(
            names(&claims.naming(SERVICE, "shop", "bg-active")),
            vec!["bg", "canary"]
        );
    }

    #[test]
    fn claims_name_each_object_once_with_the_first_field() {
        let mut rollout = rollout("a", 10, "web");
        if let Some(canary) = rollout.spec.strategy.canary.as_mut() {
            canary.canary_service = Some("web".into());
        }
        let claims = claims_of(&rollout);
        assert_eq!(claims, vec![stable("web")]);
    }
}
