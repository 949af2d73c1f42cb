//! The Rollout watch cache's form of a Rollout: its metadata as a typed `ObjectMeta`, and its
//! spec, status and annotations as compact JSON, decoded again only when the Rollout is
//! reconciled.
//!
//! A typed Rollout with a pod template of the size real services have takes about ten times the
//! memory of its JSON (35 KB against 3.3 KB for the realistic scale profile's Rollout: every
//! `Container`, `EnvVar` and `Probe` carries all its optional fields inline). The cache holds
//! every Rollout all the time while a reconcile needs one for a moment, so the cache keeps the
//! JSON; the few figures `/metrics` reads at each scrape are kept decoded in a
//! [`RolloutSummary`].
//!
//! `kubectl.kubernetes.io/last-applied-configuration` (a second copy of the whole spec that
//! client-side `kubectl apply` and Argo CD write) is not kept: nothing here reads it.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use rollouts_crds::rollout::{Rollout, RolloutSpec, RolloutStatus};
use serde::{Deserialize, Deserializer, Serialize};

use crate::metrics;

/// The annotation dropped from the cache.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A Rollout as the watch cache keeps it; [`PackedRollout::unpack`] gives the Rollout back.
#[derive(Clone)]
pub struct PackedRollout {
    /// Name, namespace, uid, resourceVersion, labels and the rest, without annotations.
    metadata: ObjectMeta,
    /// `{"annotations": ..., "spec": ..., "status": ...}` as compact JSON, or why it could not
    /// be encoded (the reconcile reports it).
    body: Result<Arc<[u8]>, Arc<str>>,
    summary: RolloutSummary,
}

/// What `/metrics` reads of a Rollout at each scrape (`rollout_info` and the replica gauges).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutSummary {
    pub strategy: &'static str,
    pub traffic_router: &'static str,
    pub phase: &'static str,
    pub available: i64,
    pub unavailable: i64,
    pub desired: i64,
    pub updated: i64,
}

impl RolloutSummary {
    fn of(rollout: &Rollout) -> Self {
        let (strategy, traffic_router) = metrics::strategy_and_traffic_router(rollout);
        let status = rollout.status.as_ref();
        Self {
            strategy,
            traffic_router,
            phase: metrics::rollout_phase(rollout),
            available: status.map_or(0, |s| s.available_replicas.into()),
            unavailable: status.map_or(0, |s| {
                i64::from(s.replicas) - i64::from(s.available_replicas)
            }),
            desired: rollout.spec.replicas.unwrap_or(1).into(),
            updated: status.map_or(0, |s| s.updated_replicas.into()),
        }
    }
}

#[derive(Serialize)]
struct BodyRef<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    annotations: Option<&'a std::collections::BTreeMap<String, String>>,
    spec: &'a RolloutSpec,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<&'a RolloutStatus>,
}

#[derive(Deserialize)]
struct Body {
    #[serde(default)]
    annotations: Option<std::collections::BTreeMap<String, String>>,
    spec: RolloutSpec,
    #[serde(default)]
    status: Option<RolloutStatus>,
}

impl PackedRollout {
    /// Packs `rollout` (its managedFields and last-applied annotation are not kept).
    pub fn pack(rollout: Rollout) -> Self {
        let summary = RolloutSummary::of(&rollout);
        let Rollout {
            mut metadata,
            spec,
            status,
        } = rollout;
        metadata.managed_fields = None;
        let mut annotations = metadata.annotations.take();
        if let Some(kept) = annotations.as_mut() {
            kept.remove(LAST_APPLIED);
        }
        let body = BodyRef {
            annotations: annotations.as_ref().filter(|a| !a.is_empty()),
            spec: &spec,
            status: status.as_ref(),
        };
        let body = serde_json::to_vec(&body)
            .map(Arc::from)
            .map_err(|error| Arc::from(error.to_string()));
        Self {
            metadata,
            body,
            summary,
        }
    }

    /// The Rollout as it was packed (less the last-applied annotation).
    pub fn unpack(&self) -> Result<Rollout, String> {
        let bytes = self.body.as_ref().map_err(|error| error.to_string())?;
        let body: Body = serde_json::from_slice(bytes).map_err(|error| error.to_string())?;
        let mut metadata = self.metadata.clone();
        metadata.annotations = body.annotations;
        Ok(Rollout {
            metadata,
            spec: body.spec,
            status: body.status,
        })
    }

    /// The figures `/metrics` serves.
    pub fn summary(&self) -> &RolloutSummary {
        &self.summary
    }

    /// Bytes of packed JSON, for tests and measurements.
    pub fn packed_len(&self) -> usize {
        self.body.as_ref().map_or(0, |bytes| bytes.len())
    }
}

/// A watch event of Rollouts as one of packed Rollouts.
pub fn pack_event(event: watcher::Event<Rollout>) -> watcher::Event<PackedRollout> {
    match event {
        watcher::Event::Apply(rollout) => watcher::Event::Apply(PackedRollout::pack(rollout)),
        watcher::Event::Delete(rollout) => watcher::Event::Delete(PackedRollout::pack(rollout)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(rollout) => {
            watcher::Event::InitApply(PackedRollout::pack(rollout))
        }
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// The reference the Rollout controller's queue takes for a Rollout.
pub fn packed_ref(rollout: &ObjectRef<Rollout>) -> ObjectRef<PackedRollout> {
    let reference = ObjectRef::new(&rollout.name);
    match &rollout.namespace {
        Some(namespace) => reference.within(namespace),
        None => reference,
    }
}

impl fmt::Debug for PackedRollout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PackedRollout")
            .field("namespace", &self.metadata.namespace)
            .field("name", &self.metadata.name)
            .field("resource_version", &self.metadata.resource_version)
            .field("packed_bytes", &self.packed_len())
            .field("summary", &self.summary)
            .finish()
    }
}

impl Resource for PackedRollout {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        Rollout::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        Rollout::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        Rollout::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        Rollout::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Decodes a Rollout and packs it (the controller's type bound asks for it; the watch packs
/// typed Rollouts itself).
impl<'de> Deserialize<'de> for PackedRollout {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Rollout::deserialize(deserializer).map(Self::pack)
    }
}

#[cfg(test)]
mod tests {
    use kube::ResourceExt;
    use rollouts_crds::rollout::CanaryStep;

    use super::*;

    #[test]
    fn a_rollout_unpacks_as_it_was_packed_less_the_last_applied_annotation() {
        let mut rollout = Rollout::test_canary("web", vec![CanaryStep::weight(20)]);
        rollout.metadata.namespace = Some("shop".into());
        rollout.metadata.resource_version = Some("7".into());
        rollout.metadata.annotations = Some(
            [
                ("rollout.argoproj.io/revision", "3"),
                (LAST_APPLIED, "{\"a\":1}"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        );
        rollout.status = Some(RolloutStatus {
            available_replicas: 2,
            replicas: 3,
            updated_replicas: 1,
            ..RolloutStatus::default()
        });
        let packed = PackedRollout::pack(rollout.clone());
        assert_eq!(packed.meta().annotations, None);
        assert_eq!(packed.resource_version().as_deref(), Some("7"));
        let summary = packed.summary();
        assert_eq!(
            (summary.strategy, summary.available, summary.unavailable),
            ("canary", 2, 1)
        );
        let mut expected = rollout;
        if let Some(annotations) = expected.metadata.annotations.as_mut() {
            annotations.remove(LAST_APPLIED);
        }
        assert_eq!(packed.unpack(), Ok(expected));
    }

    #[test]
    fn a_rollout_without_annotations_or_status_round_trips() {
        let rollout = Rollout::test_canary("web", vec![CanaryStep::weight(20)]);
        let packed = PackedRollout::pack(rollout.clone());
        assert_eq!(packed.unpack(), Ok(rollout));
    }

    /// Every `kind: Rollout` in examples/ and the e2e scenarios comes back equal, status and
    /// all (a status written as the controller writes it is added to each).
    #[test]
    fn every_example_rollout_round_trips() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        let mut checked = 0;
        for dir in ["examples", "e2e/tests/scenarios"] {
            let mut paths: Vec<_> = std::fs::read_dir(format!("{root}/{dir}"))
                .expect("the directory exists")
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
                .collect();
            paths.sort();
            for path in paths {
                let text = std::fs::read_to_string(&path).expect("readable");
                let documents: Vec<serde_json::Value> =
                    serde_saphyr::from_multiple(&text).unwrap_or_default();
                for document in documents {
                    if document["kind"] != "Rollout" {
                        continue;
                    }
                    let Ok(mut rollout) = serde_json::from_value::<Rollout>(document) else {
                        continue;
                    };
                    rollout.status = Some(RolloutStatus {
                        replicas: 3,
                        available_replicas: 3,
                        current_pod_hash: "5d8f7c9b6".into(),
                        ..RolloutStatus::default()
                    });
                    let packed = PackedRollout::pack(rollout.clone());
                    assert_eq!(packed.unpack(), Ok(rollout), "{}", path.display());
                    checked += 1;
                }
            }
        }
        assert!(checked >= 20, "only {checked} Rollouts found");
    }
}
