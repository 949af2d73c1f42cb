//! What the patch algorithms know of an object's schema: how each list field merges (whole, by
//! merge key, or as a set), as the built-in types' patch tags say; custom resources have only
//! `ObjectMeta`'s. Strategic merge patch and server-side apply both follow it.

use serde_json::Value;

/// How a list field merges, from the `patchStrategy`/`patchMergeKey` tags of the built-in types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListMerge {
    /// The list is replaced as a whole.
    Atomic,
    /// A list of objects merged item by item, matching items on this field.
    Keyed(&'static str),
    /// A list of scalars merged as a set.
    Set,
}

/// What the patch code needs to know about the object being patched.
#[derive(Debug, Clone)]
pub(super) struct Schema {
    kind: String,
    /// Built-in kinds carry patch tags; custom resources only have those of `ObjectMeta`.
    builtin: bool,
}

impl Schema {
    pub(super) fn of(object: &Value) -> Self {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        Self {
            kind: object["kind"].as_str().unwrap_or_default().to_string(),
            builtin: group.is_empty() || !group.contains('.') || group.ends_with(".k8s.io"),
        }
    }

    /// `path` names the fields from the object root to the map holding `field` (a list's name
    /// stands for its items).
    pub(super) fn list_merge(&self, path: &[String], field: &str) -> ListMerge {
        list_merge(&self.kind, self.builtin, path, field)
    }
}

const CONTAINER_LISTS: [&str; 3] = ["containers", "initContainers", "ephemeralContainers"];
const CONTAINER_STATUS_LISTS: [&str; 3] = [
    "containerStatuses",
    "initContainerStatuses",
    "ephemeralContainerStatuses",
];

/// The merge strategy of list `field` inside the map at `path` of an object of `kind`
/// (`builtin` false for custom resources).
pub fn list_merge(kind: &str, builtin: bool, path: &[String], field: &str) -> ListMerge {
    let parent = path.last().map_or("", String::as_str);
    match (parent, field) {
        ("metadata", "ownerReferences") => return ListMerge::Keyed("uid"),
        ("metadata", "finalizers") => return ListMerge::Set,
        _ if !builtin => return ListMerge::Atomic,
        _ => {}
    }
    match (parent, field) {
        (
            "spec",
            "containers"
            | "initContainers"
            | "ephemeralContainers"
            | "volumes"
            | "imagePullSecrets"
            | "schedulingGates"
            | "resourceClaims",
        ) => ListMerge::Keyed("name"),
        ("spec", "hostAliases") => ListMerge::Keyed("ip"),
        ("spec", "topologySpreadConstraints") => ListMerge::Keyed("topologyKey"),
        ("spec", "podCIDRs") => ListMerge::Set,
        // A Service's ports sit directly under the root `spec`.
        ("spec", "ports") if path.len() == 1 => ListMerge::Keyed("port"),
        (p, "ports") if CONTAINER_LISTS.contains(&p) => ListMerge::Keyed("containerPort"),
        (p, "env") if CONTAINER_LISTS.contains(&p) => ListMerge::Keyed("name"),
        (p, "volumeMounts")
            if CONTAINER_LISTS.contains(&p) || CONTAINER_STATUS_LISTS.contains(&p) =>
        {
            ListMerge::Keyed("mountPath")
        }
        (p, "volumeDevices") if CONTAINER_LISTS.contains(&p) => ListMerge::Keyed("devicePath"),
        (p, "allocatedResourcesStatus") if CONTAINER_STATUS_LISTS.contains(&p) => {
            ListMerge::Keyed("name")
        }
        ("status", "conditions") => ListMerge::Keyed("type"),
        ("status", "podIPs" | "hostIPs") => ListMerge::Keyed("ip"),
        ("status", "addresses") if kind == "Node" => ListMerge::Keyed("type"),
        ("", "secrets") if kind == "ServiceAccount" => ListMerge::Keyed("name"),
        _ => ListMerge::Atomic,
    }
}
