//! The resource registry: every resource the server serves (built-ins and CRD-defined), with
//! what discovery, OpenAPI, storage and the verbs need to know about it.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use super::table::PrinterColumn;

/// Storage identity of a resource: objects live once per (group, plural), whatever version.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceKey {
    pub group: String,
    pub plural: String,
}

/// Where a scale subresource reads and writes replica counts.
#[derive(Debug, Clone, PartialEq)]
pub struct ScalePaths {
    pub spec_replicas: String,
    pub status_replicas: String,
    /// Path to a label-selector string (CRDs) ; built-ins derive it from `.spec.selector`.
    pub label_selector: Option<String>,
}

/// One served resource in one group-version.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceInfo {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Has a `/status` subresource: main writes keep `.status`, status writes keep the rest.
    pub status: bool,
    pub scale: Option<ScalePaths>,
    /// Printer columns of a custom resource (None for built-ins).
    pub printer_columns: Option<Vec<PrinterColumn>>,
    /// Built-in kinds take strategic merge patches; custom resources do not.
    pub builtin: bool,
}

impl ResourceInfo {
    pub fn key(&self) -> ResourceKey {
        ResourceKey {
            group: self.group.clone(),
            plural: self.plural.clone(),
        }
    }

    pub fn api_version(&self) -> String {
        group_version(&self.group, &self.version)
    }
}

/// `v1` for the core group, `group/version` otherwise.
pub fn group_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    }
}

/// All served resources, keyed by (group, version, plural).
#[derive(Debug, Clone, Default)]
pub struct Registry {
    resources: BTreeMap<(String, String, String), Arc<ResourceInfo>>,
    /// Changes whenever a CRD registers or unregisters, so OpenAPI hashes change too.
    pub generation: u64,
}

/// A built-in resource: namespaced, no subresources, until said otherwise.
fn builtin(group: &str, plural: &str, kind: &str, short_names: &[&str]) -> ResourceInfo {
    ResourceInfo {
        group: group.into(),
        version: "v1".into(),
        plural: plural.into(),
        singular: kind.to_lowercase(),
        kind: kind.into(),
        namespaced: true,
        short_names: short_names.iter().map(|s| s.to_string()).collect(),
        categories: vec![],
        status: false,
        scale: None,
        printer_columns: None,
        builtin: true,
    }
}

impl ResourceInfo {
    fn cluster_scoped(mut self) -> Self {
        self.namespaced = false;
        self
    }

    fn with_status(mut self) -> Self {
        self.status = true;
        self
    }

    fn with_scale(mut self) -> Self {
        self.scale = Some(ScalePaths {
            spec_replicas: ".spec.replicas".into(),
            status_replicas: ".status.replicas".into(),
            label_selector: None,
        });
        self
    }

    /// Served at another version than `v1`.
    fn at_version(mut self, version: &str) -> Self {
        self.version = version.into();
        self
    }

    /// Listed by `kubectl get all`.
    fn in_all(mut self) -> Self {
        self.categories = vec!["all".into()];
        self
    }
}

impl Registry {
    /// The built-in resources kube-sim stores.
    pub fn with_builtins() -> Self {
        let mut r = Self::default();
        let rbac = "rbac.authorization.k8s.io";
        for info in [
            builtin("", "namespaces", "Namespace", &["ns"])
                .cluster_scoped()
                .with_status(),
            builtin("", "pods", "Pod", &["po"]).with_status().in_all(),
            builtin("", "services", "Service", &["svc"])
                .with_status()
                .in_all(),
            builtin("", "configmaps", "ConfigMap", &["cm"]),
            builtin("", "secrets", "Secret", &[]),
            builtin("", "serviceaccounts", "ServiceAccount", &["sa"]),
            builtin("", "events", "Event", &["ev"]),
            builtin("", "endpoints", "Endpoints", &["ep"]),
            builtin("discovery.k8s.io", "endpointslices", "EndpointSlice", &[]),
            builtin(
                "policy",
                "poddisruptionbudgets",
                "PodDisruptionBudget",
                &["pdb"],
            )
            .with_status(),
            builtin(
                "autoscaling",
                "horizontalpodautoscalers",
                "HorizontalPodAutoscaler",
                &["hpa"],
            )
            .at_version("v2")
            .with_status()
            .in_all(),
            builtin("events.k8s.io", "events", "Event", &["ev"]),
            builtin("apps", "replicasets", "ReplicaSet", &["rs"])
                .with_status()
                .with_scale()
                .in_all(),
            builtin("apps", "deployments", "Deployment", &["deploy"])
                .with_status()
                .with_scale()
                .in_all(),
            builtin("networking.k8s.io", "ingresses", "Ingress", &["ing"]).with_status(),
            builtin("coordination.k8s.io", "leases", "Lease", &[]),
            builtin("batch", "jobs", "Job", &[]).with_status().in_all(),
            builtin(rbac, "roles", "Role", &[]),
            builtin(rbac, "rolebindings", "RoleBinding", &[]),
            builtin(rbac, "clusterroles", "ClusterRole", &[]).cluster_scoped(),
            builtin(rbac, "clusterrolebindings", "ClusterRoleBinding", &[]).cluster_scoped(),
            builtin(
                "apiextensions.k8s.io",
                "customresourcedefinitions",
                "CustomResourceDefinition",
                &["crd", "crds"],
            )
            .cluster_scoped()
            .with_status(),
        ] {
            r.insert(info);
        }
        r
    }

    fn insert(&mut self, info: ResourceInfo) {
        let key = (
            info.group.clone(),
            info.version.clone(),
            info.plural.clone(),
        );
        self.resources.insert(key, Arc::new(info));
    }

    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceInfo>> {
        self.resources
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
            .cloned()
    }

    /// Any served version of a resource, for storage-level work (GC, controllers).
    pub fn any_version(&self, key: &ResourceKey) -> Option<Arc<ResourceInfo>> {
        self.resources
            .values()
            .find(|i| i.group == key.group && i.plural == key.plural)
            .cloned()
    }

    /// The resource of a kind in an `apiVersion` (as found in ownerReferences).
    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<Arc<ResourceInfo>> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        self.resources
            .values()
            .find(|i| i.group == group && i.version == version && i.kind == kind)
            .cloned()
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<ResourceInfo>> {
        self.resources.values()
    }

    /// Distinct storage keys.
    pub fn keys(&self) -> Vec<ResourceKey> {
        let mut keys: Vec<ResourceKey> = self.all().map(|i| i.key()).collect();
        keys.sort();
        keys.dedup();
        keys
    }

    /// Group-versions in discovery order: core first, then groups by name.
    pub fn group_versions(&self) -> BTreeMap<String, Vec<String>> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for i in self.all() {
            let versions = out.entry(i.group.clone()).or_default();
            if !versions.contains(&i.version) {
                versions.push(i.version.clone());
            }
        }
        out
    }

    /// Registers (or re-registers) every served version of a CRD. Errors say which field is wrong.
    pub fn register_crd(&mut self, crd: &Value) -> Result<ResourceKey, String> {
        let infos = crd_resources(crd)?;
        let key = infos[0].key();
        self.unregister(&key);
        for info in infos {
            self.insert(info);
        }
        self.generation += 1;
        Ok(key)
    }

    pub fn unregister(&mut self, key: &ResourceKey) {
        let before = self.resources.len();
        self.resources
            .retain(|_, i| !(i.group == key.group && i.plural == key.plural && !i.builtin));
        if self.resources.len() != before {
            self.generation += 1;
        }
    }
}

/// The resources a CRD defines, one per served version.
pub fn crd_resources(crd: &Value) -> Result<Vec<ResourceInfo>, String> {
    let spec = &crd["spec"];
    let text = |v: &Value, field: &str| -> Result<String, String> {
        v.as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .ok_or_else(|| format!("spec.{field}: Required value"))
    };
    let group = text(&spec["group"], "group")?;
    let names = &spec["names"];
    let plural = text(&names["plural"], "names.plural")?;
    let kind = text(&names["kind"], "names.kind")?;
    let singular = names["singular"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| kind.to_lowercase());
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let namespaced = match spec["scope"].as_str() {
        Some("Namespaced") => true,
        Some("Cluster") => false,
        _ => return Err("spec.scope: Unsupported value: must be Namespaced or Cluster".into()),
    };
    let expected_name = format!("{plural}.{group}");
    if crd["metadata"]["name"].as_str() != Some(expected_name.as_str()) {
        return Err(format!(
            "metadata.name: Invalid value: must be spec.names.plural+\".\"+spec.group ({expected_name})"
        ));
    }
    let versions = spec["versions"]
        .as_array()
        .filter(|v| !v.is_empty())
        .ok_or("spec.versions: Required value: at least one version")?;
    let mut out = Vec::new();
    for v in versions {
        if v["served"].as_bool() == Some(false) {
            continue;
        }
        let version = text(&v["name"], "versions[].name")?;
        let sub = &v["subresources"];
        let scale = sub
            .get("scale")
            .filter(|s| s.is_object())
            .map(|s| ScalePaths {
                spec_replicas: s["specReplicasPath"]
                    .as_str()
                    .unwrap_or(".spec.replicas")
                    .into(),
                status_replicas: s["statusReplicasPath"]
                    .as_str()
                    .unwrap_or(".status.replicas")
                    .into(),
                label_selector: s["labelSelectorPath"].as_str().map(str::to_string),
            });
        out.push(ResourceInfo {
            group: group.clone(),
            version,
            plural: plural.clone(),
            singular: singular.clone(),
            kind: kind.clone(),
            namespaced,
            short_names: strings(&names["shortNames"]),
            categories: strings(&names["categories"]),
            status: sub.get("status").is_some_and(Value::is_object),
            scale,
            printer_columns: Some(PrinterColumn::from_crd(&v["additionalPrinterColumns"])),
            builtin: false,
        });
    }
    if out.is_empty() {
        return Err("spec.versions: Invalid value: no served version".into());
    }
    Ok(out)
}
