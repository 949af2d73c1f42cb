//! The connection to the cluster: kubeconfig and namespace from the kubectl flags, reads, lists
//! and watches for the read-only verbs, and the one place patches are sent.

use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::api::{Api, ApiResource, ListParams, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{DynamicObject, GroupVersionKind, Request};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Config};
use rollouts_crds::analysis::{AnalysisTemplate, AnalysisTemplateSpec, ClusterAnalysisTemplate};
use rollouts_crds::rollout::Rollout;
use serde_json::Value;

use crate::args::KubeFlags;
use crate::error::{Error, Result};
use crate::patch::{PatchRequest, PatchType, TargetKind};

/// Refuses a `--context` the kubeconfig does not define, listing the ones it does.
fn check_context(kubeconfig: &Kubeconfig, context: &str) -> Result<()> {
    let names: Vec<&str> = kubeconfig
        .contexts
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    if names.contains(&context) {
        return Ok(());
    }
    Err(Error::Invalid(format!(
        "context \"{context}\" does not exist in the kubeconfig (fix: pass --context with one of: {})",
        if names.is_empty() {
            "none defined".to_string()
        } else {
            names.join(", ")
        }
    )))
}

/// The kinds the read-only verbs list and watch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watched {
    Rollout,
    ReplicaSet,
    Pod,
    AnalysisRun,
}

impl Watched {
    fn resource(self) -> ApiResource {
        let (group, version, kind, plural) = match self {
            Watched::Rollout => ("argoproj.io", "v1alpha1", "Rollout", "rollouts"),
            Watched::ReplicaSet => ("apps", "v1", "ReplicaSet", "replicasets"),
            Watched::Pod => ("", "v1", "Pod", "pods"),
            Watched::AnalysisRun => ("argoproj.io", "v1alpha1", "AnalysisRun", "analysisruns"),
        };
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
    }
}

/// Which objects of one kind a read-only verb lists and watches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection {
    pub kind: Watched,
    pub all_namespaces: bool,
    /// A label selector (`app=web,track in (canary)`).
    pub labels: Option<String>,
    /// A field selector (`metadata.name=web`).
    pub fields: Option<String>,
}

impl Selection {
    /// Every object of `kind` in the verb's namespace.
    pub fn all(kind: Watched) -> Self {
        Self {
            kind,
            all_namespaces: false,
            labels: None,
            fields: None,
        }
    }

    /// The one object of `kind` called `name`.
    pub fn named(kind: Watched, name: &str) -> Self {
        Self {
            fields: Some(format!("metadata.name={name}")),
            ..Self::all(kind)
        }
    }
}

/// A client bound to the namespace the verb works in.
pub struct Cluster {
    pub client: Client,
    pub namespace: String,
    /// The API server URL, for "unable to connect" messages.
    pub server: String,
}

impl Cluster {
    /// Connects as kubectl would: `--kubeconfig`, else `KUBECONFIG`, else `~/.kube/config`, else
    /// in-cluster; `--context` picks the context; `-n` overrides the context's namespace.
    pub async fn connect(flags: &KubeFlags) -> Result<Self> {
        let options = KubeConfigOptions {
            context: flags.context.clone(),
            cluster: None,
            user: None,
        };
        let kubeconfig = match &flags.kubeconfig {
            Some(path) => Some(
                Kubeconfig::read_from(path)
                    .map_err(|e| Error::Kubeconfig(format!("{}: {e}", path.display())))?,
            ),
            None if flags.context.is_some() => {
                Some(Kubeconfig::read().map_err(|e| Error::Kubeconfig(e.to_string()))?)
            }
            None => None,
        };
        let config = match kubeconfig {
            Some(kubeconfig) => {
                if let Some(context) = &flags.context {
                    check_context(&kubeconfig, context)?;
                }
                Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .map_err(|e| Error::Kubeconfig(e.to_string()))?
            }
            None => Config::infer()
                .await
                .map_err(|e| Error::Kubeconfig(e.to_string()))?,
        };
        let namespace = flags
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let server = config.cluster_url.to_string();
        let client = Client::try_from(config).map_err(|e| Error::Kubeconfig(e.to_string()))?;
        Ok(Self {
            client,
            namespace,
            server,
        })
    }

    fn error(&self, err: kube::Error, action: &'static str, kind: TargetKind, name: &str) -> Error {
        Error::from_kube(err, action, kind, name, &self.server)
    }

    /// Reads a Rollout, typed.
    pub async fn rollout(&self, name: &str) -> Result<Rollout> {
        Api::<Rollout>::namespaced(self.client.clone(), &self.namespace)
            .get(name)
            .await
            .map_err(|e| self.error(e, "getting", TargetKind::Rollout, name))
    }

    /// Reads any target as raw JSON, so fields this build does not know survive a rewrite.
    pub async fn object(&self, kind: TargetKind, name: &str) -> Result<DynamicObject> {
        let request = Request::new(kind.collection_path(&self.namespace))
            .get(name, &Default::default())
            .map_err(|e| {
                Error::Invalid(format!(
                    "cannot build a request for {} \"{name}\": {e}",
                    kind.resource()
                ))
            })?;
        self.client
            .request(request)
            .await
            .map_err(|e| self.error(e, "getting", kind, name))
    }

    /// Reads an AnalysisTemplate in the namespace, or with `cluster_scope` a
    /// ClusterAnalysisTemplate: its metadata and spec.
    pub async fn analysis_template(
        &self,
        name: &str,
        cluster_scope: bool,
    ) -> Result<(ObjectMeta, AnalysisTemplateSpec)> {
        if cluster_scope {
            Api::<ClusterAnalysisTemplate>::all(self.client.clone())
                .get(name)
                .await
                .map(|template| (template.metadata, template.spec.0))
                .map_err(|e| self.error(e, "getting", TargetKind::ClusterAnalysisTemplate, name))
        } else {
            Api::<AnalysisTemplate>::namespaced(self.client.clone(), &self.namespace)
                .get(name)
                .await
                .map(|template| (template.metadata, template.spec))
                .map_err(|e| self.error(e, "getting", TargetKind::AnalysisTemplate, name))
        }
    }

    /// Creates `object` of `kind` in the namespace; returns it as the server stored it. `name`
    /// (or the generateName prefix) names it in errors.
    pub async fn create(
        &self,
        kind: TargetKind,
        name: &str,
        object: &Value,
    ) -> Result<DynamicObject> {
        let body = serde_json::to_vec(object).map_err(|e| Error::Output(e.to_string()))?;
        let request = Request::new(kind.collection_path(&self.namespace))
            .create(&PostParams::default(), body)
            .map_err(|e| {
                Error::Invalid(format!(
                    "cannot build a request for {} \"{name}\": {e}",
                    kind.resource()
                ))
            })?;
        self.client
            .request(request)
            .await
            .map_err(|e| self.error(e, "creating", kind, name))
    }

    /// ReplicaSets in the namespace whose labels match `selector` (`key=value,...`).
    pub async fn replica_sets(&self, selector: &str, rollout: &str) -> Result<Vec<ReplicaSet>> {
        Api::<ReplicaSet>::namespaced(self.client.clone(), &self.namespace)
            .list(&ListParams::default().labels(selector))
            .await
            .map(|list| list.items)
            .map_err(|e| self.error(e, "listing ReplicaSets of", TargetKind::Rollout, rollout))
    }

    /// Sends one patch; returns the object as the server stored it.
    pub async fn apply(&self, patch: &PatchRequest) -> Result<DynamicObject> {
        let collection = Request::new(patch.target.collection_path(&self.namespace));
        let body = kube::api::Patch::Merge(&patch.body);
        let params = PatchParams::default();
        let built = match patch.subresource {
            Some(sub) => collection.patch_subresource(sub, &patch.name, &params, &body),
            None => collection.patch(&patch.name, &params, &body),
        };
        let mut request = built.map_err(|e| {
            Error::Invalid(format!(
                "cannot build a patch for {} \"{}\": {e}",
                patch.target.resource(),
                patch.name
            ))
        })?;
        if patch.patch_type != PatchType::Merge {
            // kube only builds JSON patches with its `jsonpatch` feature; the body is already
            // the operation list, so only the content type differs.
            let content_type = patch
                .patch_type
                .content_type()
                .parse()
                .map_err(|e| Error::Invalid(format!("bad content type: {e}")))?;
            request.headers_mut().insert("content-type", content_type);
        }
        self.client
            .request(request)
            .await
            .map_err(|e| self.error(e, "patching", patch.target, &patch.name))
    }

    fn api(&self, kind: Watched, all_namespaces: bool) -> Api<DynamicObject> {
        let resource = kind.resource();
        if all_namespaces {
            Api::all_with(self.client.clone(), &resource)
        } else {
            Api::namespaced_with(self.client.clone(), &self.namespace, &resource)
        }
    }

    /// Objects of `selection.kind`, as JSON. `about` names the Rollout the listing is for, for
    /// error messages.
    pub async fn list_json(&self, selection: &Selection, about: &str) -> Result<Vec<Value>> {
        let mut params = ListParams::default();
        if let Some(labels) = &selection.labels {
            params = params.labels(labels);
        }
        if let Some(fields) = &selection.fields {
            params = params.fields(fields);
        }
        let list = self
            .api(selection.kind, selection.all_namespaces)
            .list(&params)
            .await
            .map_err(|e| self.error(e, "listing objects for", TargetKind::Rollout, about))?;
        list.items
            .into_iter()
            .map(|item| serde_json::to_value(item).map_err(|e| Error::Output(e.to_string())))
            .collect()
    }

    /// One Rollout as JSON.
    pub async fn rollout_json(&self, name: &str) -> Result<Value> {
        let object = self
            .api(Watched::Rollout, false)
            .get(name)
            .await
            .map_err(|e| self.error(e, "getting", TargetKind::Rollout, name))?;
        serde_json::to_value(object).map_err(|e| Error::Output(e.to_string()))
    }

    /// Ticks once per change to an object of any of `selections` (after each watch's initial
    /// listing too); watches that fail are retried with backoff.
    pub fn changes(
        &self,
        selections: &[Selection],
    ) -> impl Stream<Item = ()> + Send + Unpin + use<> {
        let streams = selections.iter().map(|selection| {
            let mut config = watcher::Config::default();
            if let Some(labels) = &selection.labels {
                config = config.labels(labels);
            }
            if let Some(fields) = &selection.fields {
                config = config.fields(fields);
            }
            watcher(self.api(selection.kind, selection.all_namespaces), config)
                .default_backoff()
                .filter_map(|event| async move {
                    match event {
                        Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_))
                        | Ok(watcher::Event::InitDone) => Some(()),
                        _ => None,
                    }
                })
                .boxed()
        });
        futures::stream::select_all(streams)
    }
}
