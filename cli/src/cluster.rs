//! The connection to the cluster: kubeconfig and namespace from the kubectl flags, reads, lists
//! and watches for the read-only verbs, and the one place patches are sent.
//!
//! Every object is decoded on its own, as the controller decodes them ([`Decoded`]): an object
//! that does not fit our types (an int32 field set to 3000000000, a free-form field nested deeper
//! than 128 levels) is named with its field and fix, in a listing next to the objects that do
//! fit, and as the error of a verb that reads it.

use std::fmt;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::api::{Api, ApiResource, ListParams, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{DynamicObject, GroupVersionKind, Request};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Config, Resource};
use rollouts_controller::decode::{Decoded, Undecodable};
use rollouts_crds::analysis::{
    AnalysisRun, AnalysisTemplate, AnalysisTemplateSpec, ClusterAnalysisTemplate,
};
use rollouts_crds::experiment::Experiment;
use rollouts_crds::rollout::Rollout;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_json::value::RawValue;

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
    Experiment,
}

impl Watched {
    /// The kind, as an error names it.
    pub fn kind(self) -> &'static str {
        match self {
            Watched::Rollout => "Rollout",
            Watched::ReplicaSet => "ReplicaSet",
            Watched::Pod => "Pod",
            Watched::AnalysisRun => "AnalysisRun",
            Watched::Experiment => "Experiment",
        }
    }

    /// Decodes one object of this kind from its JSON text.
    fn check(self, text: &str) -> Result<Checked> {
        match self {
            Watched::Rollout => check::<Rollout>(text),
            Watched::ReplicaSet => check::<ReplicaSet>(text),
            Watched::Pod => check::<Pod>(text),
            Watched::AnalysisRun => check::<AnalysisRun>(text),
            Watched::Experiment => check::<Experiment>(text),
        }
    }

    pub fn resource(self) -> ApiResource {
        let (group, version, kind, plural) = match self {
            Watched::Rollout => ("argoproj.io", "v1alpha1", "Rollout", "rollouts"),
            Watched::ReplicaSet => ("apps", "v1", "ReplicaSet", "replicasets"),
            Watched::Pod => ("", "v1", "Pod", "pods"),
            Watched::AnalysisRun => ("argoproj.io", "v1alpha1", "AnalysisRun", "analysisruns"),
            Watched::Experiment => ("argoproj.io", "v1alpha1", "Experiment", "experiments"),
        };
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
    }
}

/// One object, checked against its type.
enum Checked {
    /// It decodes; its JSON as the server sent it, unknown fields included.
    Fits(Value),
    Undecodable(Box<Undecodable>),
}

/// Decodes `text` into `K` (the same decoding the controller does) and, when that works, keeps
/// its JSON for the views, which read fields this build may not know.
fn check<K: DeserializeOwned + serde::Serialize>(text: &str) -> Result<Checked> {
    match Decoded::<K>::from_json(text) {
        Decoded::Undecodable(undecodable) => Ok(Checked::Undecodable(undecodable)),
        // The JSON fails where the type does not only for deep managedFields, which the typed
        // object went without.
        Decoded::Typed(object) => serde_json::from_str(text)
            .or_else(|_| serde_json::to_value(&object))
            .map(Checked::Fits)
            .map_err(|e| Error::Output(e.to_string())),
    }
}

/// Decodes one object a verb reads or writes; an object that does not fit is the verb's error.
fn check_target(kind: TargetKind, name: &str, text: &str) -> Result<Value> {
    let checked = match kind {
        TargetKind::Rollout => check::<Rollout>(text)?,
        TargetKind::Deployment => check::<Deployment>(text)?,
        TargetKind::AnalysisRun => check::<AnalysisRun>(text)?,
        TargetKind::AnalysisTemplate => check::<AnalysisTemplate>(text)?,
        TargetKind::ClusterAnalysisTemplate => check::<ClusterAnalysisTemplate>(text)?,
        TargetKind::Experiment => check::<Experiment>(text)?,
    };
    match checked {
        Checked::Fits(value) => Ok(value),
        Checked::Undecodable(undecodable) => Err(Error::Undecodable {
            kind,
            name: undecodable
                .metadata
                .name
                .clone()
                .unwrap_or_else(|| name.to_string()),
            error: undecodable.error,
        }),
    }
}

/// An object a listing found but could not decode into its type.
#[derive(Clone, Debug)]
pub struct BadObject {
    pub kind: Watched,
    pub object: Box<Undecodable>,
}

impl BadObject {
    /// Its `metadata` as JSON (`{"metadata": ...}`), for the views' ownership checks.
    pub fn metadata_json(&self) -> Value {
        serde_json::to_value(&self.object.metadata)
            .map(|metadata| serde_json::json!({ "metadata": metadata }))
            .unwrap_or(Value::Null)
    }

    pub fn name(&self) -> &str {
        self.object.metadata.name.as_deref().unwrap_or_default()
    }

    pub fn namespace(&self) -> &str {
        self.object
            .metadata
            .namespace
            .as_deref()
            .unwrap_or_default()
    }
}

impl fmt::Display for BadObject {
    /// `Rollout "web" in namespace "shop" cannot be decoded: spec.replicas: ... (fix: ...)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} \"{}\" in namespace \"{}\" cannot be decoded: {}",
            self.kind.kind(),
            self.name(),
            self.namespace(),
            self.object.error
        )
    }
}

/// What a listing found: the objects that decode, as JSON, and the ones that do not.
#[derive(Debug, Default)]
pub struct Listing {
    pub items: Vec<Value>,
    pub undecodable: Vec<BadObject>,
}

/// A LIST response with each item kept as raw text, so one item cannot fail the others.
#[derive(Deserialize)]
struct RawList {
    items: Option<Vec<Box<RawValue>>>,
}

/// Ticks once per change to an object of `api`'s kind, decodable or not.
fn ticks<K>(api: Api<Decoded<K>>, config: watcher::Config) -> BoxStream<'static, ()>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + fmt::Debug + Send + 'static,
{
    watcher(api, config)
        .default_backoff()
        .filter_map(|event| async move {
            match event {
                Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_))
                | Ok(watcher::Event::InitDone) => Some(()),
                _ => None,
            }
        })
        .boxed()
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

    /// Reads a Rollout, typed; one that does not decode is an error naming the field.
    pub async fn rollout(&self, name: &str) -> Result<Rollout> {
        let decoded = Api::<Decoded<Rollout>>::namespaced(self.client.clone(), &self.namespace)
            .get(name)
            .await
            .map_err(|e| self.error(e, "getting", TargetKind::Rollout, name))?;
        match decoded {
            Decoded::Typed(rollout) => Ok(rollout),
            Decoded::Undecodable(undecodable) => Err(Error::Undecodable {
                kind: TargetKind::Rollout,
                name: name.to_string(),
                error: undecodable.error,
            }),
        }
    }

    /// Decodes the one object of `kind` a request answered with. `done` says what a write did
    /// (`patched`), for the error when the object it answered with does not decode.
    fn decode_object(
        &self,
        answer: kube::Result<String>,
        action: &'static str,
        done: Option<&'static str>,
        kind: TargetKind,
        name: &str,
    ) -> Result<DynamicObject> {
        let text = answer.map_err(|e| self.error(e, action, kind, name))?;
        let value = check_target(kind, name, &text).map_err(|error| match (done, error) {
            (Some(done), Error::Undecodable { kind, name, error }) => Error::Invalid(format!(
                "{} \"{name}\" was {done}, but cannot be decoded, so the controller does not act on it: {error}",
                kind.resource()
            )),
            (_, error) => error,
        })?;
        serde_json::from_value(value).map_err(|e| Error::Client {
            action,
            kind,
            name: name.to_string(),
            source: Box::new(kube::Error::SerdeError(e)),
        })
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
        let answer = self.client.request_text(request).await;
        self.decode_object(answer, "getting", None, kind, name)
    }

    /// Reads an AnalysisTemplate in the namespace, or with `cluster_scope` a
    /// ClusterAnalysisTemplate: its metadata and spec.
    pub async fn analysis_template(
        &self,
        name: &str,
        cluster_scope: bool,
    ) -> Result<(ObjectMeta, AnalysisTemplateSpec)> {
        let undecodable = |kind, undecodable: Box<Undecodable>| Error::Undecodable {
            kind,
            name: name.to_string(),
            error: undecodable.error,
        };
        if cluster_scope {
            let kind = TargetKind::ClusterAnalysisTemplate;
            match Api::<Decoded<ClusterAnalysisTemplate>>::all(self.client.clone())
                .get(name)
                .await
                .map_err(|e| self.error(e, "getting", kind, name))?
            {
                Decoded::Typed(template) => Ok((template.metadata, template.spec.0)),
                Decoded::Undecodable(bad) => Err(undecodable(kind, bad)),
            }
        } else {
            let kind = TargetKind::AnalysisTemplate;
            match Api::<Decoded<AnalysisTemplate>>::namespaced(self.client.clone(), &self.namespace)
                .get(name)
                .await
                .map_err(|e| self.error(e, "getting", kind, name))?
            {
                Decoded::Typed(template) => Ok((template.metadata, template.spec)),
                Decoded::Undecodable(bad) => Err(undecodable(kind, bad)),
            }
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
        let answer = self.client.request_text(request).await;
        self.decode_object(answer, "creating", Some("created"), kind, name)
    }

    /// ReplicaSets in the namespace whose labels match `selector` (`key=value,...`); one that
    /// does not decode is an error naming it.
    pub async fn replica_sets(&self, selector: &str, rollout: &str) -> Result<Vec<ReplicaSet>> {
        Api::<Decoded<ReplicaSet>>::namespaced(self.client.clone(), &self.namespace)
            .list(&ListParams::default().labels(selector))
            .await
            .map_err(|e| self.error(e, "listing ReplicaSets of", TargetKind::Rollout, rollout))?
            .items
            .into_iter()
            .map(|decoded| match decoded {
                Decoded::Typed(replica_set) => Ok(replica_set),
                Decoded::Undecodable(object) => Err(Error::Invalid(format!(
                    "{} (a ReplicaSet of rollout \"{rollout}\")",
                    BadObject {
                        kind: Watched::ReplicaSet,
                        object,
                    }
                ))),
            })
            .collect()
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
        let answer = self.client.request_text(request).await;
        self.decode_object(
            answer,
            "patching",
            Some("patched"),
            patch.target,
            &patch.name,
        )
    }

    /// Objects of kind `K`, each decoded on its own.
    fn api<K>(&self, all_namespaces: bool) -> Api<Decoded<K>>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>,
    {
        if all_namespaces {
            Api::all(self.client.clone())
        } else {
            Api::namespaced(self.client.clone(), &self.namespace)
        }
    }

    /// Objects of `selection.kind`: those that decode as JSON, the others named with their
    /// decode error. `about` names the Rollout the listing is for, for error messages.
    pub async fn list_json(&self, selection: &Selection, about: &str) -> Result<Listing> {
        self.list_json_for(selection, TargetKind::Rollout, about)
            .await
    }

    /// [`Cluster::list_json`] for an object of `kind` called `about` (`*` for none): errors
    /// name it.
    pub async fn list_json_for(
        &self,
        selection: &Selection,
        kind: TargetKind,
        about: &str,
    ) -> Result<Listing> {
        let mut params = ListParams::default();
        if let Some(labels) = &selection.labels {
            params = params.labels(labels);
        }
        if let Some(fields) = &selection.fields {
            params = params.fields(fields);
        }
        let resource = selection.kind.resource();
        let namespace = (!selection.all_namespaces).then_some(self.namespace.as_str());
        let request = Request::new(DynamicObject::url_path(&resource, namespace))
            .list(&params)
            .map_err(|e| {
                Error::Invalid(format!(
                    "cannot build a request listing {}: {e}",
                    resource.plural
                ))
            })?;
        let text = self
            .client
            .request_text(request)
            .await
            .map_err(|e| self.error(e, "listing objects for", kind, about))?;
        let list: RawList = serde_json::from_str(&text).map_err(|e| Error::Client {
            action: "listing objects for",
            kind,
            name: about.to_string(),
            source: Box::new(kube::Error::SerdeError(e)),
        })?;
        let mut listing = Listing::default();
        for item in list.items.unwrap_or_default() {
            match selection.kind.check(item.get())? {
                Checked::Fits(value) => listing.items.push(value),
                Checked::Undecodable(object) => listing.undecodable.push(BadObject {
                    kind: selection.kind,
                    object,
                }),
            }
        }
        Ok(listing)
    }

    /// One Rollout as JSON; one that does not decode is an error naming the field.
    pub async fn rollout_json(&self, name: &str) -> Result<Value> {
        self.object_json(TargetKind::Rollout, name).await
    }

    /// One object of `kind` as JSON; one that does not decode is an error naming the field.
    pub async fn object_json(&self, kind: TargetKind, name: &str) -> Result<Value> {
        let request = Request::new(kind.collection_path(&self.namespace))
            .get(name, &Default::default())
            .map_err(|e| {
                Error::Invalid(format!(
                    "cannot build a request for {} \"{name}\": {e}",
                    kind.resource()
                ))
            })?;
        let text = self
            .client
            .request_text(request)
            .await
            .map_err(|e| self.error(e, "getting", kind, name))?;
        check_target(kind, name, &text)
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
            match selection.kind {
                Watched::Rollout => ticks(self.api::<Rollout>(selection.all_namespaces), config),
                Watched::ReplicaSet => {
                    ticks(self.api::<ReplicaSet>(selection.all_namespaces), config)
                }
                Watched::Pod => ticks(self.api::<Pod>(selection.all_namespaces), config),
                Watched::AnalysisRun => {
                    ticks(self.api::<AnalysisRun>(selection.all_namespaces), config)
                }
                Watched::Experiment => {
                    ticks(self.api::<Experiment>(selection.all_namespaces), config)
                }
            }
        });
        futures::stream::select_all(streams)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn nested(depth: usize) -> Value {
        let mut value = json!(1);
        for _ in 0..depth {
            value = json!({ "a": value });
        }
        value
    }

    fn rollout(replicas: u64) -> Value {
        json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Rollout",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"replicas": replicas, "unknownToUs": {"kept": true}},
        })
    }

    #[test]
    fn a_rollout_that_fits_keeps_the_fields_the_types_do_not_know() {
        let Ok(Checked::Fits(value)) = check::<Rollout>(&rollout(2).to_string()) else {
            panic!("a valid Rollout does not fit");
        };
        assert_eq!(value["spec"]["unknownToUs"]["kept"], true);
    }

    #[test]
    fn deep_managed_fields_do_not_make_an_object_unreadable() {
        let mut object = rollout(2);
        object["metadata"]["managedFields"] = json!([{"fieldsV1": nested(140)}]);
        let Ok(Checked::Fits(value)) = check::<Rollout>(&object.to_string()) else {
            panic!("deep managed fields made the Rollout unreadable");
        };
        assert_eq!(value["spec"]["replicas"], 2);
    }

    #[test]
    fn a_bad_object_is_named_with_its_kind_namespace_field_and_fix() {
        let Ok(Checked::Undecodable(object)) =
            check::<Rollout>(&rollout(3_000_000_000).to_string())
        else {
            panic!("replicas 3000000000 fit an int32");
        };
        let bad = BadObject {
            kind: Watched::Rollout,
            object,
        };
        assert_eq!(
            bad.to_string(),
            "Rollout \"web\" in namespace \"shop\" cannot be decoded: spec.replicas: invalid value: integer `3000000000`, expected i32 (fix: use a whole number from -2147483648 to 2147483647)"
        );
        assert_eq!(bad.metadata_json()["metadata"]["name"], "web");
    }

    #[test]
    fn a_verb_on_a_bad_object_fails_naming_it() {
        let error = check_target(
            TargetKind::Rollout,
            "web",
            &rollout(3_000_000_000).to_string(),
        )
        .expect_err("replicas 3000000000 fit an int32");
        assert_eq!(
            error.to_string(),
            "error: rollouts.argoproj.io \"web\" cannot be decoded: spec.replicas: invalid value: integer `3000000000`, expected i32 (fix: use a whole number from -2147483648 to 2147483647)"
        );
    }
}
