//! Discovery and OpenAPI documents, built from the resource registry: `/version`, `/api`,
//! `/apis`, `/api/v1`, `/apis/G/V`, `/openapi/v3` and its per group-version documents.

use serde_json::{Value, json};

use super::meta::safe_hash;
use super::registry::{Registry, ResourceInfo, group_version};

const ALL_VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "32",
        "gitVersion": "v1.32.0",
        "gitCommit": "kube-sim",
        "gitTreeState": "clean",
        "buildDate": "2024-12-11T00:00:00Z",
        "goVersion": "go1.23.3",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `GET /api`.
pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn api_group(name: &str, versions: &[String]) -> Value {
    let entries: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": group_version(name, v), "version": v}))
        .collect();
    json!({
        "name": name,
        "versions": entries,
        "preferredVersion": entries.first().cloned().unwrap_or(Value::Null),
    })
}

/// `GET /apis`.
pub fn api_group_list(registry: &Registry) -> Value {
    let groups: Vec<Value> = registry
        .group_versions()
        .iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| api_group(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /apis/G`.
pub fn api_group_doc(registry: &Registry, group: &str) -> Option<Value> {
    let gvs = registry.group_versions();
    let versions = gvs.get(group).filter(|_| !group.is_empty())?;
    let mut doc = api_group(group, versions);
    doc["kind"] = "APIGroup".into();
    doc["apiVersion"] = "v1".into();
    Some(doc)
}

/// `GET /api/v1` or `/apis/G/V`: the `APIResourceList`, None when nothing is served there.
pub fn resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for info in registry
        .all()
        .filter(|i| i.group == group && i.version == version)
    {
        let mut entry = json!({
            "name": info.plural,
            "singularName": info.singular,
            "namespaced": info.namespaced,
            "kind": info.kind,
            "verbs": ALL_VERBS,
        });
        if !info.short_names.is_empty() {
            entry["shortNames"] = json!(info.short_names);
        }
        if !info.categories.is_empty() {
            entry["categories"] = json!(info.categories);
        }
        resources.push(entry);
        if info.status {
            resources.push(json!({
                "name": format!("{}/status", info.plural),
                "singularName": "",
                "namespaced": info.namespaced,
                "kind": info.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        if info.builtin && info.group.is_empty() && info.plural == "pods" {
            resources.push(json!({
                "name": "pods/eviction",
                "singularName": "",
                "namespaced": true,
                "group": "policy",
                "version": "v1",
                "kind": "Eviction",
                "verbs": ["create"],
            }));
        }
        if info.scale.is_some() {
            resources.push(json!({
                "name": format!("{}/scale", info.plural),
                "singularName": "",
                "namespaced": info.namespaced,
                "group": "autoscaling",
                "version": "v1",
                "kind": "Scale",
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    if resources.is_empty() {
        return None;
    }
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version(group, version),
        "resources": resources,
    }))
}

/// `api/v1` or `apis/G/V`, the OpenAPI v3 path key of a group-version.
fn openapi_key(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `GET /openapi/v3`: one entry per group-version; the hash changes when CRDs change.
pub fn openapi_root(registry: &Registry) -> Value {
    let mut paths = serde_json::Map::new();
    for (group, versions) in registry.group_versions() {
        for version in versions {
            let key = openapi_key(&group, &version);
            let hash = safe_hash(format!("{key}/{}", registry.generation).as_bytes());
            paths.insert(
                key.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={hash}")}),
            );
        }
    }
    json!({"paths": paths})
}

/// `GET /openapi/v3/api/v1` or `/openapi/v3/apis/G/V`: per kind, the PATCH operation on the
/// item path carrying `x-kubernetes-group-version-kind` and the `fieldValidation` parameter.
pub fn openapi_group_version(registry: &Registry, key: &str) -> Option<Value> {
    let (group, version) = match key.split('/').collect::<Vec<_>>().as_slice() {
        ["api", v] => (String::new(), v.to_string()),
        ["apis", g, v] => (g.to_string(), v.to_string()),
        _ => return None,
    };
    let infos: Vec<&std::sync::Arc<ResourceInfo>> = registry
        .all()
        .filter(|i| i.group == group && i.version == version)
        .collect();
    if infos.is_empty() {
        return None;
    }
    let mut paths = serde_json::Map::new();
    for info in infos {
        let prefix = format!("/{key}");
        let item = if info.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", info.plural)
        } else {
            format!("{prefix}/{}/{{name}}", info.plural)
        };
        let query = |name: &str| json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}});
        let path_param = |name: &str| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string", "uniqueItems": true}});
        let mut params = vec![path_param("name")];
        if info.namespaced {
            params.push(path_param("namespace"));
        }
        paths.insert(
            item,
            json!({
                "parameters": params,
                "patch": {
                    "operationId": format!("patch{}{}", if info.namespaced { "Namespaced" } else { "" }, info.kind),
                    "parameters": [query("dryRun"), query("fieldManager"), query("fieldValidation"), query("force")],
                    "responses": {"200": {"description": "OK"}},
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": {"group": info.group, "version": info.version, "kind": info.kind},
                },
            }),
        );
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_lists_name_subresources_and_short_names() {
        let registry = Registry::with_builtins();
        let apps = resource_list(&registry, "apps", "v1").expect("apps/v1 is served");
        let names: Vec<&str> = apps["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .filter_map(|r| r["name"].as_str())
            .collect();
        assert!(
            [
                "deployments",
                "deployments/status",
                "deployments/scale",
                "replicasets/scale"
            ]
            .iter()
            .all(|n| names.contains(n)),
            "{names:?}"
        );
        let deployments = &apps["resources"][names
            .iter()
            .position(|n| *n == "deployments")
            .expect("deployments")];
        assert_eq!(deployments["shortNames"], json!(["deploy"]));
        assert_eq!(deployments["categories"], json!(["all"]));
        assert!(resource_list(&registry, "example.com", "v1").is_none());
        let core = resource_list(&registry, "", "v1").expect("v1 is served");
        let eviction = core["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .find(|r| r["name"] == "pods/eviction")
            .expect("pods/eviction is listed");
        assert_eq!(
            (&eviction["group"], &eviction["kind"], &eviction["verbs"]),
            (&json!("policy"), &json!("Eviction"), &json!(["create"]))
        );
    }

    #[test]
    fn openapi_documents_carry_patch_operations_with_group_version_kind() {
        let registry = Registry::with_builtins();
        let root = openapi_root(&registry);
        let url = root["paths"]["apis/apps/v1"]["serverRelativeURL"]
            .as_str()
            .expect("apps/v1 listed");
        assert!(url.starts_with("/openapi/v3/apis/apps/v1?hash="));
        let doc = openapi_group_version(&registry, "apis/apps/v1").expect("document");
        let patch =
            &doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
        assert_eq!(
            patch["x-kubernetes-group-version-kind"],
            json!({"group": "apps", "version": "v1", "kind": "Deployment"})
        );
        assert!(
            patch["parameters"]
                .as_array()
                .expect("parameters")
                .iter()
                .any(|p| p["name"] == "fieldValidation")
        );
        let core = openapi_group_version(&registry, "api/v1").expect("core document");
        assert!(
            core["paths"].get("/api/v1/namespaces/{name}").is_some(),
            "cluster-scoped item path"
        );
    }
}
