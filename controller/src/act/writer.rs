//! The one writer every act module goes through: create, merge-patch, scale and delete of a
//! namespaced object owned by the Rollout, each with its error naming the verb, the kind, the
//! object and the Rollout, and each recorded in the watch cache that must show it before the
//! next plan (so a reconcile never plans from a cache older than its own writes).

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use rollouts_crds::analysis::AnalysisRun;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::Target;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::owned_cache::{OwnedCache, OwnedCaches};

/// A kind the act phase writes, and the watch cache (if any) the next plan reads it from.
pub(super) trait Written:
    Resource<Scope = NamespaceResourceScope, DynamicType = ()>
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// The kind, as errors and logs name it.
    const KIND: &'static str;

    /// The watch cache the planner reads this kind from; `None` when it is read fresh.
    fn cache(_caches: &OwnedCaches) -> Option<&OwnedCache<Self>> {
        None
    }
}

impl Written for ReplicaSet {
    const KIND: &'static str = "ReplicaSet";

    fn cache(caches: &OwnedCaches) -> Option<&OwnedCache<Self>> {
        Some(&caches.replica_sets)
    }
}

impl Written for AnalysisRun {
    const KIND: &'static str = "AnalysisRun";

    fn cache(caches: &OwnedCaches) -> Option<&OwnedCache<Self>> {
        Some(&caches.analysis_runs)
    }
}

impl Written for rollouts_crds::experiment::Experiment {
    const KIND: &'static str = "Experiment";

    fn cache(caches: &OwnedCaches) -> Option<&OwnedCache<Self>> {
        Some(&caches.experiments)
    }
}

impl Written for Service {
    const KIND: &'static str = "Service";
}

impl Written for rollouts_crds::rollout::Rollout {
    const KIND: &'static str = "Rollout";
}

impl Written for Pod {
    const KIND: &'static str = "Pod";
}

impl Written for k8s_openapi::api::apps::v1::Deployment {
    const KIND: &'static str = "Deployment";
}

/// What a create found.
pub(super) enum Created<K> {
    Created(K),
    /// An object of that name exists already (409).
    AlreadyExists,
}

/// Writes on behalf of one Rollout.
pub(super) struct Writer<'a> {
    pub target: &'a Target,
    pub ctx: &'a Context,
}

impl Writer<'_> {
    /// The API of a kind, also for the reads and verbs the writer does not cover (lists,
    /// eviction).
    pub fn api<K: Written>(&self) -> Api<K> {
        Api::namespaced(self.ctx.client.clone(), &self.target.namespace)
    }

    fn failed(
        &self,
        verb: &'static str,
        kind: &'static str,
        object: &str,
    ) -> impl FnOnce(kube::Error) -> Error {
        self.target.write_error(verb, kind, object)
    }

    fn expect_written<K: Written>(&self, name: &str, resource_version: Option<String>) {
        if let Some(cache) = K::cache(&self.ctx.caches) {
            cache.expect_written(&self.target.owner.uid, name, resource_version);
        }
    }

    fn expect_deleted<K: Written>(&self, name: &str) {
        if let Some(cache) = K::cache(&self.ctx.caches) {
            cache.expect_deleted(&self.target.owner.uid, name);
        }
    }

    /// Creates `object`; an existing object of its name is [`Created::AlreadyExists`], and the
    /// cache is then expected to show that one before the next plan.
    pub async fn create<K: Written>(&self, object: &K) -> Result<Created<K>> {
        let name = object.name_any();
        match self.api::<K>().create(&PostParams::default(), object).await {
            Ok(created) => {
                self.expect_written::<K>(&name, created.resource_version());
                Ok(Created::Created(created))
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                self.expect_written::<K>(&name, None);
                Ok(Created::AlreadyExists)
            }
            Err(source) => Err(self.failed("create", K::KIND, &name)(source)),
        }
    }

    /// Merge-patches `name`; `verb` says what the patch does, for the error.
    pub async fn patch<K: Written>(
        &self,
        verb: &'static str,
        name: &str,
        patch: &Value,
    ) -> Result<K> {
        let patched = self
            .api::<K>()
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(self.failed(verb, K::KIND, name))?;
        self.expect_written::<K>(name, patched.resource_version());
        Ok(patched)
    }

    /// Merge-patches `name`; `None` when it no longer exists.
    pub async fn patch_if_present<K: Written>(
        &self,
        verb: &'static str,
        name: &str,
        patch: &Value,
    ) -> Result<Option<K>> {
        match self
            .api::<K>()
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(patched) => {
                self.expect_written::<K>(name, patched.resource_version());
                Ok(Some(patched))
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {
                self.expect_deleted::<K>(name);
                Ok(None)
            }
            Err(source) => Err(self.failed(verb, K::KIND, name)(source)),
        }
    }

    /// Sets `spec.replicas` through the scale subresource.
    pub async fn scale<K: Written>(&self, name: &str, replicas: i32) -> Result<()> {
        let patch = json!({ "spec": { "replicas": replicas } });
        let scale = self
            .api::<K>()
            .patch_scale(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(self.failed("scale", K::KIND, name))?;
        // The Scale carries the object's resourceVersion after the write.
        self.expect_written::<K>(name, scale.metadata.resource_version);
        Ok(())
    }

    /// Deletes `name` in the background; one already gone is fine.
    pub async fn delete<K: Written>(&self, name: &str) -> Result<()> {
        match self
            .api::<K>()
            .delete(name, &DeleteParams::background())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(source) => return Err(self.failed("delete", K::KIND, name)(source)),
        }
        self.expect_deleted::<K>(name);
        Ok(())
    }
}
