//! The routers' only I/O: read a router object as JSON, and write one with server-side apply.

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde_json::Value;

use crate::{Error, FIELD_MANAGER, Result};

/// One kind of router object, addressed through the dynamic API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouterObjectKind {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
}

pub const INGRESS: RouterObjectKind = RouterObjectKind {
    group: "networking.k8s.io",
    version: "v1",
    kind: "Ingress",
    plural: "ingresses",
};

pub(crate) const SERVICE: RouterObjectKind = RouterObjectKind {
    group: "",
    version: "v1",
    kind: "Service",
    plural: "services",
};

// Istio serves v1alpha3 in every release; Argo Rollouts reads it by default too.
pub const VIRTUAL_SERVICE: RouterObjectKind = RouterObjectKind {
    group: "networking.istio.io",
    version: "v1alpha3",
    kind: "VirtualService",
    plural: "virtualservices",
};

pub const DESTINATION_RULE: RouterObjectKind = RouterObjectKind {
    group: "networking.istio.io",
    version: "v1alpha3",
    kind: "DestinationRule",
    plural: "destinationrules",
};

pub const HTTP_ROUTE: RouterObjectKind = RouterObjectKind {
    group: "gateway.networking.k8s.io",
    version: "v1",
    kind: "HTTPRoute",
    plural: "httproutes",
};

impl RouterObjectKind {
    /// The dynamic API type of this kind, for reads, writes and watches.
    pub fn api_resource(&self) -> ApiResource {
        let gvk = GroupVersionKind::gvk(self.group, self.version, self.kind);
        ApiResource::from_gvk_with_plural(&gvk, self.plural)
    }

    fn api(&self, client: &kube::Client, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(client.clone(), namespace, &self.api_resource())
    }

    /// `apiVersion` of this kind (`v1` alone for the core group).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            return self.version.to_string();
        }
        format!("{}/{}", self.group, self.version)
    }
}

/// The object `namespace/name` as JSON, `None` when it does not exist.
pub(crate) async fn get(
    client: &kube::Client,
    kind: RouterObjectKind,
    namespace: &str,
    name: &str,
) -> Result<Option<Value>> {
    let found = kind
        .api(client, namespace)
        .get_opt(name)
        .await
        .map_err(|source| Error::Kube {
            action: "reading",
            kind: kind.kind,
            object: format!("{namespace}/{name}"),
            source: Box::new(source),
        })?;
    found
        .map(|object| {
            let mut value = serde_json::to_value(object).map_err(|source| Error::Json {
                kind: kind.kind,
                object: format!("{namespace}/{name}"),
                source,
            })?;
            // Dynamic objects may come back without their type when the server omits it.
            value["apiVersion"] = Value::String(kind.api_version());
            value["kind"] = Value::String(kind.kind.to_string());
            Ok(value)
        })
        .transpose()
}

/// Server-side apply `body` (built by [`crate::object::apply_body`]) under [`FIELD_MANAGER`],
/// taking over fields another manager holds: the router is the authority for the fields it sends.
pub(crate) async fn apply(
    client: &kube::Client,
    kind: RouterObjectKind,
    namespace: &str,
    name: &str,
    body: &Value,
) -> Result<String> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    kind.api(client, namespace)
        .patch(name, &params, &Patch::Apply(body))
        .await
        .map_err(|source| Error::Kube {
            action: "applying",
            kind: kind.kind,
            object: format!("{namespace}/{name}"),
            source: Box::new(source),
        })?;
    tracing::info!(kind = kind.kind, %namespace, %name, "applied router object");
    Ok(format!("{} {namespace}/{name}", kind.kind))
}

/// How often [`update`] re-reads an object another writer changed under it.
const CONFLICT_ATTEMPTS: usize = 3;

/// Reads `namespace/name`, asks `plan` for the apply body it wants (`None`: nothing to write) and
/// applies it. A body carrying the found `metadata.resourceVersion` fails with 409 Conflict when
/// someone wrote the object in between; the object is then read and planned again.
pub(crate) async fn update(
    client: &kube::Client,
    kind: RouterObjectKind,
    namespace: &str,
    name: &str,
    mut plan: impl FnMut(Option<&Value>) -> Result<Option<Value>>,
) -> Result<Option<String>> {
    let mut attempt = 1;
    loop {
        let found = get(client, kind, namespace, name).await?;
        let Some(body) = plan(found.as_ref())? else {
            return Ok(None);
        };
        match apply(client, kind, namespace, name, &body).await {
            Err(err) if err.is_conflict() && attempt < CONFLICT_ATTEMPTS => attempt += 1,
            result => return result.map(Some),
        }
    }
}
