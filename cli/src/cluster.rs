//! The connection to the cluster: kubeconfig and namespace from the kubectl flags, reads, and the
//! one place patches are sent.

use k8s_openapi::api::apps::v1::ReplicaSet;
use kube::api::{Api, ListParams, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{DynamicObject, Request};
use kube::{Client, Config};
use rollouts_crds::rollout::Rollout;

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
}
