//! Least privilege, proven from kube-sim's request log: the real `rollouts-controller` binary,
//! started with the arguments of the Deployment that `kubectl kustomize deploy/` (and the
//! namespaced overlay) renders, goes through a tour of every code path that talks to the API
//! (canary steps with promote, abort and retry, anti-affinity, history trimming and restartAt;
//! step and background analysis with web and Job metrics and a Secret argument; blue-green with
//! preview, pre-promotion analysis and ephemeral pod metadata; nginx, Istio and Gateway API
//! routing; a standalone Experiment and a Rollout's experiment step; the leader Lease, released on SIGTERM; events). Then every request it made must be allowed by the rendered RBAC (RoleBindings and
//! ClusterRoleBindings of its ServiceAccount, with RBAC's matching rules), every granted
//! (group, resource, verb) of the cluster-wide install must have been used (or be a listed
//! exception whose rule says why in a comment), and no rule may use a wildcard. Nothing here
//! names a request: all of it is derived from the log, so a controller that reads differently
//! (watch caches instead of lists) is judged the same way.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Deref;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Discovery, Scope};
use kube::{Client, ResourceExt};
use rollouts_crds::analysis::AnalysisRun;
use rollouts_crds::rollout::{Rollout, RolloutStatus};
use rollouts_e2e::sim::{RequestRecord, SimHandle, SimOptions};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

use support::{Sim, workspace_root};

const DEADLINE: Duration = Duration::from_secs(90);
/// The prefix of the controller's `User-Agent`, which tells its requests from the test's.
const CONTROLLER_AGENT: &str = "rollouts-controller/";
/// The ServiceAccount the install binds its roles to.
const SERVICE_ACCOUNT: &str = "rollouts-controller";
/// The Secret key the analysis reads, and what the web metric must receive.
const TOKEN: &str = "s3cret";
/// Marks, in a role file's comment above a rule, a grant the tour cannot exercise.
const EXCEPTION_MARKER: &str = "Not exercised on kube-sim";
/// The files that hold the controller's roles (relative to the workspace root).
const ROLE_FILES: &[&str] = &[
    "deploy/rbac/namespaced-resources/role.yaml",
    "deploy/rbac/cluster-resources/role.yaml",
    "deploy/base/leader-election-rbac.yaml",
    "deploy/base/notifications-rbac.yaml",
];

/// Grants of the cluster-wide install the tour may not use, as (group, resource, verb). Each
/// must be granted by a rule of its own whose comment contains [`EXCEPTION_MARKER`], names the
/// resource and says why it is kept.
const EXCEPTIONS: &[(&str, &str, &str)] = &[
    // Read back only when a watch lags the controller's own write: a race.
    ("argoproj.io", "rollouts", "get"),
    ("argoproj.io", "analysisruns", "get"),
    ("argoproj.io", "experiments", "get"),
    // Checked by the OwnerReferencesPermissionEnforcement admission plugin, not a request.
    ("argoproj.io", "rollouts/finalizers", "update"),
    ("argoproj.io", "analysisruns/finalizers", "update"),
    ("argoproj.io", "experiments/finalizers", "update"),
];

// ---------------------------------------------------------------------------------------------
// The install: roles bound to the controller's ServiceAccount, and how its Deployment runs it.
// ---------------------------------------------------------------------------------------------

/// One RBAC policy rule.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Rule {
    api_groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
    resource_names: Vec<String>,
}

impl Rule {
    fn of(value: &Value) -> Self {
        let strings = |key: &str| -> Vec<String> {
            value[key]
                .as_array()
                .map(|items| {
                    items
                        .iter()
                        .filter_map(|item| item.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        Self {
            api_groups: strings("apiGroups"),
            resources: strings("resources"),
            verbs: strings("verbs"),
            resource_names: strings("resourceNames"),
        }
    }

    /// RBAC's match of one request (no wildcards: they are refused elsewhere).
    fn allows(&self, access: &Access, verb: &str) -> bool {
        self.api_groups.contains(&access.group)
            && self.resources.contains(&access.resource)
            && self.verbs.iter().any(|v| v == verb)
            && (self.resource_names.is_empty()
                || (!access.name.is_empty() && self.resource_names.contains(&access.name)))
    }
}

/// A rule as bound to the ServiceAccount: cluster-wide (ClusterRoleBinding) or in one namespace.
#[derive(Clone, Debug)]
struct Grant {
    /// `ClusterRole rollouts-controller`, `Role rollouts/rollouts-controller-leader-election`.
    role: String,
    role_name: String,
    namespace: Option<String>,
    rule: Rule,
}

impl Grant {
    fn allows(&self, access: &Access, verb: &str) -> bool {
        let in_scope = match &self.namespace {
            None => true,
            Some(namespace) => access.namespace == *namespace,
        };
        in_scope && self.rule.allows(access, verb)
    }
}

/// One rendered install (`kubectl kustomize DIR`).
struct Install {
    dir: &'static str,
    namespace: String,
    grants: Vec<Grant>,
    roles: Vec<Value>,
    /// The controller container's args and env, `$(VAR)` not yet expanded.
    args: Vec<String>,
    env: BTreeMap<String, String>,
}

fn kustomize(dir: &str) -> Vec<Value> {
    let path = workspace_root().join(dir);
    let output = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(&path)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run `kubectl kustomize {dir}`: {e}. This test renders the install as a \
                 user would: put kubectl (1.32, kustomize v5) on PATH"
            )
        });
    assert!(
        output.status.success(),
        "`kubectl kustomize {dir}` failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("kustomize prints UTF-8");
    serde_saphyr::from_multiple(&text)
        .unwrap_or_else(|e| panic!("`kubectl kustomize {dir}` printed invalid YAML: {e}"))
}

impl Install {
    fn render(dir: &'static str) -> Self {
        let objects = kustomize(dir);
        let of_kind = |kind: &'static str| objects.iter().filter(move |o| o["kind"] == kind);
        let account = of_kind("ServiceAccount")
            .find(|o| o["metadata"]["name"] == SERVICE_ACCOUNT)
            .unwrap_or_else(|| panic!("{dir} renders no ServiceAccount {SERVICE_ACCOUNT}"));
        let namespace = account["metadata"]["namespace"]
            .as_str()
            .unwrap_or_else(|| panic!("{dir}: ServiceAccount {SERVICE_ACCOUNT} has no namespace"))
            .to_string();
        let mut grants = Vec::new();
        for binding in objects
            .iter()
            .filter(|o| o["kind"] == "RoleBinding" || o["kind"] == "ClusterRoleBinding")
        {
            let binding_namespace = binding["metadata"]["namespace"].as_str();
            let to_us = binding["subjects"].as_array().is_some_and(|subjects| {
                subjects.iter().any(|s| {
                    s["kind"] == "ServiceAccount"
                        && s["name"] == SERVICE_ACCOUNT
                        && s["namespace"].as_str().or(binding_namespace) == Some(namespace.as_str())
                })
            });
            if !to_us {
                continue;
            }
            let role_kind = binding["roleRef"]["kind"].as_str().unwrap_or_default();
            let role_name = binding["roleRef"]["name"].as_str().unwrap_or_default();
            let role = objects
                .iter()
                .find(|o| {
                    o["kind"] == role_kind
                        && o["metadata"]["name"] == role_name
                        && (role_kind == "ClusterRole"
                            || o["metadata"]["namespace"].as_str() == binding_namespace)
                })
                .unwrap_or_else(|| {
                    panic!(
                        "{dir}: {} {} binds {role_kind} {role_name}, which it does not render",
                        binding["kind"], binding["metadata"]["name"]
                    )
                });
            // A RoleBinding grants its role (even a ClusterRole) in its own namespace only.
            let scope = match binding["kind"].as_str() {
                Some("RoleBinding") => binding_namespace.map(str::to_string),
                _ => None,
            };
            let label = match role_kind {
                "Role" => format!("Role {}/{role_name}", binding_namespace.unwrap_or_default()),
                _ => format!("ClusterRole {role_name}"),
            };
            for rule in role["rules"].as_array().into_iter().flatten() {
                grants.push(Grant {
                    role: label.clone(),
                    role_name: role_name.to_string(),
                    namespace: scope.clone(),
                    rule: Rule::of(rule),
                });
            }
        }
        let roles = objects
            .iter()
            .filter(|o| o["kind"] == "Role" || o["kind"] == "ClusterRole")
            .cloned()
            .collect();
        let deployment = of_kind("Deployment")
            .find(|o| o["metadata"]["name"] == "rollouts-controller")
            .unwrap_or_else(|| panic!("{dir} renders no Deployment rollouts-controller"));
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        let args = container["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str().map(str::to_string))
            .collect();
        // The downward API, as the kubelet fills it for a pod of this Deployment.
        let env = container["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|var| {
                let name = var["name"].as_str()?.to_string();
                let value = match var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                    Some("metadata.name") => "rollouts-controller-tour".to_string(),
                    Some("metadata.namespace") => namespace.clone(),
                    Some(other) => panic!("{dir}: env {name} reads {other}, unknown to this test"),
                    None => var["value"].as_str()?.to_string(),
                };
                Some((name, value))
            })
            .collect();
        Self {
            dir,
            namespace,
            grants,
            roles,
            args,
            env,
        }
    }

    /// The Deployment's args with `$(VAR)` expanded from its env, as the kubelet does.
    fn controller_args(&self) -> Vec<String> {
        self.args
            .iter()
            .map(|arg| {
                self.env.iter().fold(arg.clone(), |arg, (name, value)| {
                    arg.replace(&format!("$({name})"), value)
                })
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Requests, in RBAC's terms.
// ---------------------------------------------------------------------------------------------

/// What a request touches: `resource` is `plural` or `plural/subresource`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Access {
    group: String,
    resource: String,
    namespace: String,
    name: String,
}

impl Access {
    fn of(record: &RequestRecord) -> Self {
        let resource = if record.subresource.is_empty() {
            record.resource.clone()
        } else {
            format!("{}/{}", record.resource, record.subresource)
        };
        Self {
            group: record.group.clone(),
            resource,
            namespace: record.namespace.clone(),
            name: record.name.clone(),
        }
    }
}

/// The verbs RBAC checks for a request: a write that created its object (server-side apply of
/// a new object, a PUT that creates) is also authorized as `create`.
fn verbs_of(record: &RequestRecord) -> Vec<String> {
    let mut verbs = vec![record.verb.clone()];
    if matches!(record.verb.as_str(), "patch" | "update") && record.code == 201 {
        verbs.push("create".to_string());
    }
    verbs
}

/// Paths every authenticated client may read (the built-in `system:discovery` and
/// `system:public-info-viewer` ClusterRoles).
fn is_discovery(path: &str) -> bool {
    [
        "/api", "/apis", "/version", "/openapi", "/healthz", "/livez", "/readyz",
    ]
    .iter()
    .any(|prefix| path == *prefix || path.starts_with(&format!("{prefix}/")))
}

fn controller_requests(sim: &SimHandle) -> Vec<RequestRecord> {
    sim.requests()
        .into_iter()
        .filter(|r| r.user_agent.starts_with(CONTROLLER_AGENT))
        .collect()
}

/// A rule a user could paste under `rules:`.
fn rule_yaml(group: &str, resource: &str, verbs: &BTreeSet<String>) -> String {
    let verbs: Vec<String> = verbs.iter().map(|v| format!("{v:?}")).collect();
    format!(
        "  - apiGroups: [{group:?}]\n    resources: [{resource:?}]\n    verbs: [{}]\n",
        verbs.join(", ")
    )
}

/// (a): every request allowed by the install's grants; on failure, the rules to add.
fn assert_every_request_allowed(
    install: &Install,
    requests: &[RequestRecord],
    cluster_scoped: &BTreeSet<(String, String)>,
) {
    // (file to add to, group, resource) -> verbs, with one example request each.
    let mut missing: BTreeMap<(String, String, String), BTreeSet<String>> = BTreeMap::new();
    let mut examples = Vec::new();
    let mut refused_paths = BTreeSet::new();
    // A namespaced install binds Roles only: nothing outside its namespace can be allowed.
    let namespaced_only = install.grants.iter().all(|g| g.namespace.is_some());
    let mut outside = BTreeSet::new();
    for record in requests {
        if !record.path.is_empty() {
            if !is_discovery(&record.path) {
                refused_paths.insert(format!("{} {}", record.verb, record.path));
            }
            continue;
        }
        let access = Access::of(record);
        for verb in verbs_of(record) {
            if install.grants.iter().any(|g| g.allows(&access, &verb)) {
                continue;
            }
            if namespaced_only && access.namespace != install.namespace {
                outside.insert(format!(
                    "{verb} {}/{} {:?} in namespace {:?}",
                    access.group, access.resource, access.name, access.namespace
                ));
                continue;
            }
            let plural = record.resource.clone();
            let file = if record.group == "coordination.k8s.io" {
                "deploy/base/leader-election-rbac.yaml"
            } else if cluster_scoped.contains(&(record.group.clone(), plural)) {
                "deploy/rbac/cluster-resources/role.yaml"
            } else {
                "deploy/rbac/namespaced-resources/role.yaml"
            };
            let key = (
                file.to_string(),
                access.group.clone(),
                access.resource.clone(),
            );
            if missing.entry(key).or_default().insert(verb.clone()) {
                let place = if access.namespace.is_empty() {
                    "cluster-wide".to_string()
                } else {
                    format!("in namespace {}", access.namespace)
                };
                examples.push(format!(
                    "{verb} {}/{} {:?} {place} (HTTP {})",
                    access.group, access.resource, access.name, record.code
                ));
            }
        }
    }
    let mut report = String::new();
    for ((file, group, resource), verbs) in &missing {
        report.push_str(&format!(
            "add to {file}:\n{}",
            rule_yaml(group, resource, verbs)
        ));
    }
    assert!(
        missing.is_empty() && refused_paths.is_empty() && outside.is_empty(),
        "{}: the controller made requests its RBAC does not allow:\n{report}\
         requests: {examples:#?}\nnon-resource paths: {refused_paths:?}\n\
         outside namespace {} (no Role can allow these: with --namespace the controller must \
         stay in its namespace; an empty namespace is a cluster-wide request): {outside:#?}",
        install.dir,
        install.namespace
    );
}

/// (c): no `*` anywhere a wildcard would grant more than is written.
fn assert_no_wildcards(install: &Install) {
    for role in &install.roles {
        for rule in role["rules"].as_array().into_iter().flatten() {
            for key in ["verbs", "resources", "apiGroups", "resourceNames"] {
                let wild = rule[key]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .any(|item| item.contains('*'));
                assert!(
                    !wild,
                    "{}: {} {} has a wildcard in {key}: {rule}; name each one",
                    install.dir, role["kind"], role["metadata"]["name"]
                );
            }
            assert!(
                rule.get("nonResourceURLs").is_none(),
                "{}: {} {} grants nonResourceURLs: {rule}; the controller reads none",
                install.dir,
                role["kind"],
                role["metadata"]["name"]
            );
        }
    }
}

/// One commented rule of a role file: the comment lines just above it, and the rule.
struct CommentedRule {
    file: &'static str,
    comment: String,
    rule: Rule,
}

/// Reads the rules of [`ROLE_FILES`] with their comments (which the YAML parser drops).
fn commented_rules() -> Vec<CommentedRule> {
    let mut rules = Vec::new();
    for file in ROLE_FILES {
        let text = std::fs::read_to_string(workspace_root().join(file))
            .unwrap_or_else(|e| panic!("reads {file}: {e}"));
        let mut comment: Vec<&str> = Vec::new();
        let mut item: Option<(usize, Vec<&str>, String)> = None;
        let flush = |item: &mut Option<(usize, Vec<&str>, String)>,
                     rules: &mut Vec<CommentedRule>| {
            if let Some((indent, lines, comment)) = item.take() {
                let yaml: Vec<&str> = lines
                    .iter()
                    .map(|line| line.get(indent..).unwrap_or_default())
                    .collect();
                let parsed: Vec<Value> = serde_saphyr::from_str(&yaml.join("\n"))
                    .unwrap_or_else(|e| panic!("{file}: a rule that is not YAML: {e}"));
                for rule in &parsed {
                    rules.push(CommentedRule {
                        file,
                        comment: comment.clone(),
                        rule: Rule::of(rule),
                    });
                }
            }
        };
        for line in text.lines() {
            let trimmed = line.trim_start();
            let indent = line.len() - trimmed.len();
            let continues = item
                .as_ref()
                .is_some_and(|(start, _, _)| indent > *start && !trimmed.starts_with('#'));
            if continues {
                if let Some((_, lines, _)) = item.as_mut() {
                    lines.push(line);
                }
                continue;
            }
            flush(&mut item, &mut rules);
            if trimmed.starts_with('#') {
                comment.push(trimmed.trim_start_matches('#').trim());
            } else if trimmed.starts_with("- apiGroups:") {
                item = Some((indent, vec![line], comment.join(" ")));
                comment.clear();
            } else {
                comment.clear();
            }
        }
        flush(&mut item, &mut rules);
    }
    rules
}

/// (b): every (group, resource, verb) the cluster-wide install grants was used, or is an
/// exception documented above its rule.
fn assert_every_grant_used(install: &Install, requests: &[RequestRecord]) {
    let accesses: Vec<(Access, Vec<String>)> = requests
        .iter()
        .filter(|r| r.path.is_empty())
        .map(|r| (Access::of(r), verbs_of(r)))
        .collect();
    let documented = commented_rules();
    let mut unused = Vec::new();
    let mut granted = BTreeSet::new();
    for grant in &install.grants {
        for group in &grant.rule.api_groups {
            for resource in &grant.rule.resources {
                for verb in &grant.rule.verbs {
                    granted.insert((group.clone(), resource.clone(), verb.clone()));
                    let used = accesses.iter().any(|(access, verbs)| {
                        access.group == *group
                            && access.resource == *resource
                            && verbs.contains(verb)
                            && grant.allows(access, verb)
                    });
                    if used {
                        continue;
                    }
                    let exception = EXCEPTIONS.contains(&(group, resource, verb));
                    if !exception {
                        let file = documented
                            .iter()
                            .find(|d| d.rule == grant.rule)
                            .map_or("its role file", |d| d.file);
                        unused.push(format!(
                            "{} (in {file}) grants {verb} on {group:?}/{resource}{}, which the \
                             controller never used: remove it, or if only a path the tour cannot \
                             reach needs it, add it to EXCEPTIONS and say why above the rule \
                             (a comment line starting with {EXCEPTION_MARKER:?})",
                            grant.role,
                            if grant.rule.resource_names.is_empty() {
                                String::new()
                            } else {
                                format!(" named {:?}", grant.rule.resource_names)
                            }
                        ));
                        continue;
                    }
                    let explained = documented.iter().any(|d| {
                        d.rule == grant.rule
                            && d.comment.contains(EXCEPTION_MARKER)
                            && d.comment.contains(resource.as_str())
                    });
                    if !explained {
                        unused.push(format!(
                            "{} grants {verb} on {group:?}/{resource} as an exception, but the \
                             comment above its rule does not say why: add a line starting with \
                             {EXCEPTION_MARKER:?} that names {resource}",
                            grant.role
                        ));
                    }
                }
            }
        }
    }
    for (group, resource, verb) in EXCEPTIONS {
        assert!(
            granted.contains(&(group.to_string(), resource.to_string(), verb.to_string())),
            "the exception {verb} on {group:?}/{resource} is granted by no rule: remove it \
             from EXCEPTIONS"
        );
    }
    assert!(
        unused.is_empty(),
        "{}: grants the tour did not use:\n{}",
        install.dir,
        unused.join("\n")
    );
}

/// The (group, plural) of every cluster-scoped resource the simulator serves.
async fn cluster_scoped_resources(client: &Client) -> BTreeSet<(String, String)> {
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .expect("discovers the simulator's resources");
    let mut scoped = BTreeSet::new();
    for group in discovery.groups() {
        for (resource, capabilities) in group.recommended_resources() {
            if capabilities.scope == Scope::Cluster {
                scoped.insert((resource.group.clone(), resource.plural.clone()));
            }
        }
    }
    scoped
}

// ---------------------------------------------------------------------------------------------
// The simulator, the controller process and a web metric stub.
// ---------------------------------------------------------------------------------------------

/// A web metric endpoint on loopback: answers `{"errors": 0}` and keeps the Authorization
/// headers it was sent.
struct WebStub {
    url: String,
    authorizations: Arc<Mutex<Vec<String>>>,
    server: JoinHandle<()>,
}

impl WebStub {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds loopback");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let authorizations = Arc::new(Mutex::new(Vec::new()));
        let seen = authorizations.clone();
        let server = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let Some(head) = support::read_request_head(&mut stream).await else {
                        return;
                    };
                    if let Some(value) = head.lines().find_map(|line| {
                        let (name, value) = line.split_once(':')?;
                        name.eq_ignore_ascii_case("authorization")
                            .then(|| value.trim().to_string())
                    }) {
                        seen.lock().expect("authorizations").push(value);
                    }
                    let body = r#"{"errors": 0}"#;
                    let response = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(response.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        Self {
            url,
            authorizations,
            server,
        }
    }
}

impl Drop for WebStub {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// The shared simulator, with our CRDs and the routers', plus this file's namespaced helpers.
struct Cluster(Sim);

impl Deref for Cluster {
    type Target = Sim;

    fn deref(&self) -> &Sim {
        &self.0
    }
}

impl Cluster {
    fn start(name: &str) -> Self {
        let root = workspace_root();
        Self(Sim::start_with(
            "rollouts-least-privilege",
            name,
            SimOptions {
                crd_dirs: vec![root.join("crds/yaml"), root.join("e2e/crds")],
                pod_ready_after: Duration::from_millis(200),
                metrics_listen: None,
                ..SimOptions::default()
            },
        ))
    }

    /// Creates `object` (its apiVersion, kind and metadata.namespace say where).
    async fn create(&self, plural: &str, object: Value) {
        let api_version = object["apiVersion"]
            .as_str()
            .expect("apiVersion")
            .to_string();
        let kind = object["kind"].as_str().expect("kind").to_string();
        let (group, version) = api_version
            .split_once('/')
            .unwrap_or(("", api_version.as_str()));
        let gvk = GroupVersionKind::gvk(group, version, &kind);
        let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
        let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
            Some(namespace) => Api::namespaced_with(self.client.clone(), namespace, &resource),
            None => Api::all_with(self.client.clone(), &resource),
        };
        let name = object["metadata"]["name"].clone();
        let object: DynamicObject = serde_json::from_value(object).expect("an object");
        api.create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("creates {kind} {name}: {e}"));
    }

    async fn namespace(&self, name: &str) {
        self.create(
            "namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
        )
        .await;
    }

    async fn service(&self, namespace: &str, name: &str, app: &str) {
        self.create(
            "services",
            json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"selector": {"app": app}, "ports": [{"port": 80}]}}),
        )
        .await;
    }

    fn rollouts(&self, namespace: &str) -> Api<Rollout> {
        Api::namespaced(self.client.clone(), namespace)
    }

    async fn status(&self, namespace: &str, name: &str) -> RolloutStatus {
        self.rollouts(namespace)
            .get(name)
            .await
            .expect("reads the Rollout")
            .status
            .unwrap_or_default()
    }

    async fn patch_status(&self, namespace: &str, name: &str, status: Value) {
        self.rollouts(namespace)
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .expect("patches the Rollout's status");
    }

    /// `kubectl rollouts promote`: clears the pause conditions.
    async fn promote(&self, namespace: &str, name: &str) {
        self.patch_status(namespace, name, json!({"pauseConditions": null}))
            .await;
    }

    /// Polls `check` until it gives a value; fails after [`DEADLINE`] with the controller's log.
    async fn eventually<T, F, Fut>(&self, what: &str, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let log = || {
            let log =
                std::fs::read_to_string(self.dir.0.join("controller.log")).unwrap_or_default();
            format!("; controller log:\n{log}")
        };
        support::eventually_with_log(DEADLINE, Duration::from_millis(100), what, log, check).await
    }

    /// Waits until the Rollout is Healthy on its current revision with `replicas` available;
    /// returns that revision's hash.
    async fn healthy(&self, namespace: &str, name: &str, replicas: i32) -> String {
        self.eventually(&format!("{namespace}/{name} Healthy"), || async {
            let status = self.status(namespace, name).await;
            let done = status.phase == "Healthy"
                && !status.current_pod_hash.is_empty()
                && status.stable_rs == status.current_pod_hash
                && status.available_replicas == replicas;
            done.then_some(status.current_pod_hash)
        })
        .await
    }

    /// Sets a new image and waits for the new revision's hash.
    async fn update(&self, namespace: &str, name: &str, image: &str, from: &str) -> String {
        let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "image": image}]}}}});
        self.rollouts(namespace)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("changes the image");
        self.eventually(&format!("{namespace}/{name} on {image}"), || async {
            let hash = self.status(namespace, name).await.current_pod_hash;
            (hash != from && !hash.is_empty()).then_some(hash)
        })
        .await
    }

    async fn paused_at(&self, namespace: &str, name: &str, index: i32) {
        self.eventually(
            &format!("{namespace}/{name} paused at step {index}"),
            || async {
                let status = self.status(namespace, name).await;
                (status.current_step_index == Some(index) && !status.pause_conditions.is_empty())
                    .then_some(())
            },
        )
        .await;
    }

    /// The Rollout's ReplicaSets by pod-template hash: spec.replicas.
    async fn replica_sets(&self, namespace: &str, name: &str) -> BTreeMap<String, i32> {
        let api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), namespace);
        api.list(&ListParams::default())
            .await
            .expect("lists ReplicaSets")
            .items
            .iter()
            .filter(|rs| rs.owner_references().iter().any(|o| o.name == name))
            .map(|rs| {
                let hash = rs
                    .labels()
                    .get("rollouts-pod-template-hash")
                    .cloned()
                    .unwrap_or_default();
                (hash, rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1))
            })
            .collect()
    }

    /// The Rollout's AnalysisRuns with `rollout-type` `kind`.
    async fn runs(&self, namespace: &str, rollout: &str, kind: &str) -> Vec<AnalysisRun> {
        Api::<AnalysisRun>::namespaced(self.client.clone(), namespace)
            .list(&ListParams::default().labels(&format!("rollout-type={kind}")))
            .await
            .expect("lists AnalysisRuns")
            .items
            .into_iter()
            .filter(|run| run.owner_references().iter().any(|o| o.name == rollout))
            .collect()
    }
}

/// The controller binary, run as `install`'s Deployment runs it; its log goes to a file.
struct Controller {
    child: Child,
}

impl Controller {
    fn start(cluster: &Cluster, install: &Install) -> Self {
        let log = std::fs::File::create(cluster.dir.0.join("controller.log"))
            .expect("creates the log file");
        let child = Command::new(env!("CARGO_BIN_EXE_rollouts-controller"))
            .args(install.controller_args())
            .arg("--kubeconfig")
            .arg(&cluster.kubeconfig)
            // In a pod the Lease's namespace is the pod's; the kubeconfig here says `default`.
            .args(["--leader-election-namespace", &install.namespace])
            .args(["--notifications-namespace", &install.namespace])
            .args([
                "--metrics-addr",
                "127.0.0.1:0",
                "--health-addr",
                "127.0.0.1:0",
            ])
            .envs(&install.env)
            .env_remove("RUST_LOG")
            .env_remove("ROLLOUTS_NAMESPACE")
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("starts rollouts-controller");
        Self { child }
    }

    /// SIGTERM, as the kubelet stops a pod, so the Lease release is part of the tour.
    async fn stop(mut self, cluster: &Cluster) {
        let pid = self.child.id().expect("the controller is running");
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("runs kill");
        assert!(sent.success(), "kill -TERM {pid} failed");
        let exited = tokio::time::timeout(DEADLINE, self.child.wait()).await;
        assert!(
            matches!(exited, Ok(Ok(status)) if status.success()),
            "the controller did not stop cleanly on SIGTERM ({exited:?}); log:\n{}",
            std::fs::read_to_string(cluster.dir.0.join("controller.log")).unwrap_or_default()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The tour.
// ---------------------------------------------------------------------------------------------

fn rollout(namespace: &str, name: &str, replicas: i32, spec: Value) -> Value {
    let mut rollout = json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "app:v1"}]}
            }
        }
    });
    if let (Some(fields), Value::Object(extra)) = (rollout["spec"].as_object_mut(), spec) {
        fields.extend(extra);
    }
    rollout
}

/// Argo's notification ConfigMap and Secret in the controller's namespace: a webhook service
/// (the stub) that [`canary_steps`] subscribes its Rollout to, so its abort is notified and
/// recorded on the Rollout.
async fn notifications(cluster: &Cluster, install: &Install, stub: &WebStub) {
    cluster
        .create(
            "secrets",
            json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "argo-rollouts-notification-secret", "namespace": install.namespace},
                "stringData": {"hook-token": TOKEN}
            }),
        )
        .await;
    cluster
        .create(
            "configmaps",
            json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "argo-rollouts-notification-configmap", "namespace": install.namespace},
                "data": {
                    "service.webhook.tour": format!(
                        "url: {}\nheaders:\n- name: Authorization\n  value: Bearer $hook-token\n",
                        stub.url
                    )
                }
            }),
        )
        .await;
}

/// Canary steps with Services, promote, abort (notified), retry and a history of one old
/// ReplicaSet.
async fn canary_steps(cluster: &Cluster, namespace: &str) {
    let name = "web";
    cluster.service(namespace, "web-stable", name).await;
    cluster.service(namespace, "web-canary", name).await;
    let spec = json!({
        "revisionHistoryLimit": 1,
        "strategy": {"canary": {
            "stableService": "web-stable",
            "canaryService": "web-canary",
            // The new revision's pods prefer nodes without the stable's: its ReplicaSet is
            // read and patched when the stable changes during an update.
            "antiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": {"weight": 1}},
            "steps": [{"setWeight": 25}, {"pause": {}}, {"setWeight": 50}, {"pause": {"duration": "1s"}}]
        }}
    });
    let mut web = rollout(namespace, name, 4, spec);
    web["metadata"]["annotations"] =
        json!({"notifications.argoproj.io/subscribe.on-rollout-aborted.tour": ""});
    cluster.create("rollouts", web).await;
    let v1 = cluster.healthy(namespace, name, 4).await;
    let v2 = cluster.update(namespace, name, "app:v2", &v1).await;
    cluster.paused_at(namespace, name, 1).await;
    cluster.promote(namespace, name).await;
    assert_eq!(cluster.healthy(namespace, name, 4).await, v2);

    let v3 = cluster.update(namespace, name, "app:v3", &v2).await;
    cluster.paused_at(namespace, name, 1).await;
    cluster
        .patch_status(namespace, name, json!({"abort": true}))
        .await;
    cluster
        .eventually("the canary aborted back to stable", || async {
            let status = cluster.status(namespace, name).await;
            let sets = cluster.replica_sets(namespace, name).await;
            (status.abort && status.phase == "Degraded" && sets.get(&v3) == Some(&0)).then_some(())
        })
        .await;
    cluster
        .eventually("the abort notified and recorded on the Rollout", || async {
            let web = cluster.rollouts(namespace).get(name).await.ok()?;
            web.annotations()
                .contains_key("notified.notifications.argoproj.io")
                .then_some(())
        })
        .await;
    cluster
        .patch_status(namespace, name, json!({"abort": false}))
        .await;
    cluster.paused_at(namespace, name, 1).await;
    cluster.promote(namespace, name).await;
    assert_eq!(cluster.healthy(namespace, name, 4).await, v3);
    cluster
        .eventually("the history trimmed to one old ReplicaSet", || async {
            let sets = cluster.replica_sets(namespace, name).await;
            (!sets.contains_key(&v1) && sets.len() == 2).then_some(())
        })
        .await;

    // `kubectl rollouts restart`: every pod older than restartAt is evicted and replaced.
    let restart_at = Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    cluster
        .rollouts(namespace)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"restartAt": restart_at}})),
        )
        .await
        .expect("sets restartAt");
    cluster
        .eventually("the restart recorded in status", || async {
            let status = cluster.status(namespace, name).await;
            status.restarted_at.is_some().then_some(())
        })
        .await;
}

/// A canary with a step analysis (web and Job metrics, a Secret argument) and a background
/// analysis (a web metric and a Job still running when the update completes, so it is
/// stopped), over two updates so the run history is trimmed.
async fn canary_analysis(
    cluster: &Cluster,
    namespace: &str,
    stub: &WebStub,
    cluster_templates: bool,
) {
    let name = "search";
    cluster
        .create(
            "secrets",
            json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "metrics-token", "namespace": namespace},
                "type": "Opaque",
                "data": {"token": "czNjcmV0"}}),
        )
        .await;
    let job = |run_for: &str| {
        json!({"spec": {"backoffLimit": 0, "template": {
            "metadata": {"annotations": {"sim.rollouts.dev/run-for": run_for}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "check", "image": "busybox"}]}
        }}})
    };
    cluster
        .create(
            "analysistemplates",
            json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisTemplate",
                "metadata": {"name": "checks", "namespace": namespace},
                "spec": {
                    "args": [
                        {"name": "canary-hash"},
                        {"name": "api-token", "valueFrom": {"secretKeyRef": {"name": "metrics-token", "key": "token"}}}
                    ],
                    "metrics": [
                        {"name": "errors", "count": 1, "successCondition": "result == 0",
                         "provider": {"web": {
                            "url": format!("{}/errors?hash={{{{args.canary-hash}}}}", stub.url),
                            "jsonPath": "{$.errors}",
                            "headers": [{"key": "Authorization", "value": "Bearer {{args.api-token}}"}]
                         }}},
                        {"name": "smoke-job", "count": 1, "provider": {"job": job("200ms")}}
                    ]
                }}),
        )
        .await;
    let background = json!({
        "metrics": [
            {"name": "errors", "interval": "1s", "successCondition": "result == 0",
             "provider": {"web": {"url": format!("{}/errors", stub.url), "jsonPath": "{$.errors}"}}},
            {"name": "soak-job", "provider": {"job": job("3600s")}}
        ]
    });
    if cluster_templates {
        cluster
            .create(
                "clusteranalysistemplates",
                json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "ClusterAnalysisTemplate",
                    "metadata": {"name": "background"}, "spec": background}),
            )
            .await;
    } else {
        cluster
            .create(
                "analysistemplates",
                json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisTemplate",
                    "metadata": {"name": "background", "namespace": namespace}, "spec": background}),
            )
            .await;
    }
    let spec = json!({
        "analysis": {"successfulRunHistoryLimit": 1},
        "strategy": {"canary": {
            "analysis": {"templates": [{"templateName": "background", "clusterScope": cluster_templates}]},
            "steps": [
                {"setWeight": 50},
                {"analysis": {
                    "templates": [{"templateName": "checks"}],
                    "args": [{"name": "canary-hash", "valueFrom": {"podTemplateHashValue": "Latest"}}]
                }}
            ]
        }}
    });
    cluster
        .create("rollouts", rollout(namespace, name, 2, spec))
        .await;
    let mut stable = cluster.healthy(namespace, name, 2).await;
    for image in ["app:v2", "app:v3"] {
        let next = cluster.update(namespace, name, image, &stable).await;
        assert_eq!(cluster.healthy(namespace, name, 2).await, next);
        stable = next;
    }
    cluster
        .eventually("the older step run deleted (history limit 1)", || async {
            (cluster.runs(namespace, name, "Step").await.len() == 1).then_some(())
        })
        .await;
    cluster
        .eventually("the background runs stopped", || async {
            let runs = cluster.runs(namespace, name, "Background").await;
            let stopped = !runs.is_empty()
                && runs.iter().all(|run| {
                    run.spec.terminate
                        && run
                            .status
                            .as_ref()
                            .is_some_and(|status| status.phase.is_completed())
                });
            stopped.then_some(())
        })
        .await;
    let authorizations = stub.authorizations.lock().expect("authorizations").clone();
    assert!(
        authorizations.contains(&format!("Bearer {TOKEN}")),
        "the web metric got the Secret's token: {authorizations:?}"
    );
}

/// Blue-green with a preview Service, a pre-promotion analysis and ephemeral pod metadata (moved
/// from preview to active pods on promotion).
async fn blue_green(cluster: &Cluster, namespace: &str, stub: &WebStub) {
    let name = "api";
    cluster.service(namespace, "api-active", name).await;
    cluster.service(namespace, "api-preview", name).await;
    cluster
        .create(
            "analysistemplates",
            json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisTemplate",
                "metadata": {"name": "smoke", "namespace": namespace},
                "spec": {"metrics": [{"name": "errors", "count": 1, "successCondition": "result == 0",
                    "provider": {"web": {"url": format!("{}/smoke", stub.url), "jsonPath": "{$.errors}"}}}]}}),
        )
        .await;
    let spec = json!({"strategy": {"blueGreen": {
        "activeService": "api-active",
        "previewService": "api-preview",
        "scaleDownDelaySeconds": 1,
        "previewMetadata": {"labels": {"role": "preview"}},
        "activeMetadata": {"labels": {"role": "active"}},
        "prePromotionAnalysis": {"templates": [{"templateName": "smoke"}]}
    }}});
    cluster
        .create("rollouts", rollout(namespace, name, 2, spec))
        .await;
    let v1 = cluster.healthy(namespace, name, 2).await;
    let v2 = cluster.update(namespace, name, "app:v2", &v1).await;
    assert_eq!(cluster.healthy(namespace, name, 2).await, v2);
    cluster
        .eventually("the old revision scaled down after the delay", || async {
            let sets = cluster.replica_sets(namespace, name).await;
            (sets.get(&v1) == Some(&0)).then_some(())
        })
        .await;
    let status = cluster.status(namespace, name).await;
    assert_eq!(status.blue_green.active_selector, v2);
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), namespace);
    let selector = format!("rollouts-pod-template-hash={v2},role=active");
    cluster
        .eventually("the active pods relabelled role=active", || async {
            let listed = pods
                .list(&ListParams::default().labels(&selector))
                .await
                .ok()?;
            (listed.items.len() == 2).then_some(())
        })
        .await;
}

/// Which traffic router a routed canary uses.
#[derive(Clone, Copy, Debug)]
enum Router {
    Nginx,
    IstioSubsets,
    GatewayApi,
}

/// A routed canary: its router objects, a step with a weight (and a header route on Istio),
/// a promotion.
async fn routed_canary(cluster: &Cluster, namespace: &str, router: Router) {
    let name = match router {
        Router::Nginx => "shop-nginx",
        Router::IstioSubsets => "shop-istio",
        Router::GatewayApi => "shop-gateway",
    };
    let stable = format!("{name}-stable");
    let canary = format!("{name}-canary");
    cluster.service(namespace, &stable, name).await;
    cluster.service(namespace, &canary, name).await;
    let (routing, steps) = match router {
        Router::Nginx => {
            cluster
                .create(
                    "ingresses",
                    json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {"rules": [{"host": format!("{name}.example.com"), "http": {"paths": [{
                        "path": "/", "pathType": "Prefix",
                        "backend": {"service": {"name": stable, "port": {"number": 80}}}
                    }]}}]}}),
                )
                .await;
            (
                json!({"nginx": {"stableIngress": name}}),
                json!([{"setWeight": 20}, {"pause": {}}]),
            )
        }
        Router::IstioSubsets => {
            cluster
                .create(
                    "virtualservices",
                    json!({"apiVersion": "networking.istio.io/v1alpha3", "kind": "VirtualService",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {"hosts": [name], "http": [{"name": "primary", "route": [
                        {"destination": {"host": name, "subset": "stable"}, "weight": 100},
                        {"destination": {"host": name, "subset": "canary"}, "weight": 0}
                    ]}]}}),
                )
                .await;
            cluster
                .create(
                    "destinationrules",
                    json!({"apiVersion": "networking.istio.io/v1alpha3", "kind": "DestinationRule",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {"host": name, "subsets": [
                        {"name": "stable", "labels": {"app": name}},
                        {"name": "canary", "labels": {"app": name}}
                    ]}}),
                )
                .await;
            (
                json!({
                    "managedRoutes": [{"name": "canary-header"}],
                    "istio": {
                        "virtualService": {"name": name, "routes": ["primary"]},
                        "destinationRule": {"name": name, "canarySubsetName": "canary", "stableSubsetName": "stable"}
                    }
                }),
                json!([
                    {"setWeight": 20},
                    {"setHeaderRoute": {"name": "canary-header", "match": [
                        {"headerName": "x-canary", "headerValue": {"exact": "yes"}}
                    ]}},
                    {"pause": {}}
                ]),
            )
        }
        Router::GatewayApi => {
            cluster
                .create(
                    "httproutes",
                    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {"parentRefs": [{"name": "public"}], "rules": [{"name": "main",
                        "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                        "backendRefs": [
                            {"name": stable, "port": 80, "weight": 100},
                            {"name": canary, "port": 80, "weight": 0}
                        ]}]}}),
                )
                .await;
            (
                json!({"plugins": {"argoproj-labs/gatewayAPI": {"httpRoute": name}}}),
                json!([{"setWeight": 20}, {"pause": {}}]),
            )
        }
    };
    let pause_at = i32::try_from(steps.as_array().map_or(1, Vec::len)).unwrap_or(1) - 1;
    let spec = json!({"strategy": {"canary": {
        "stableService": stable,
        "canaryService": canary,
        "trafficRouting": routing,
        "scaleDownDelaySeconds": 1,
        "steps": steps
    }}});
    cluster
        .create("rollouts", rollout(namespace, name, 5, spec))
        .await;
    let v1 = cluster.healthy(namespace, name, 5).await;
    let v2 = cluster.update(namespace, name, "app:v2", &v1).await;
    cluster.paused_at(namespace, name, pause_at).await;
    cluster
        .eventually(&format!("{router:?} weight verified"), || async {
            let weights = cluster.status(namespace, name).await.canary.weights?;
            (weights.canary.weight == 20 && weights.verified == Some(true)).then_some(())
        })
        .await;
    cluster.promote(namespace, name).await;
    assert_eq!(cluster.healthy(namespace, name, 5).await, v2);
}

/// A Rollout taking its pod template from a Deployment (`workloadRef`), scaled down
/// progressively, with canary and stable metadata on its pods.
async fn workload_ref(cluster: &Cluster, namespace: &str) {
    let name = "referenced";
    let template = |image: &str| {
        json!({
            "metadata": {"labels": {"app": name}},
            "spec": {"containers": [{"name": "app", "image": image}]}
        })
    };
    cluster
        .create(
            "deployments",
            json!({
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": {"app": name}},
                    "template": template("app:v1")
                }
            }),
        )
        .await;
    let mut rollout = rollout(
        namespace,
        name,
        2,
        json!({
            "workloadRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name, "scaleDown": "progressively"},
            "strategy": {"canary": {
                "canaryMetadata": {"labels": {"role": "canary"}},
                "stableMetadata": {"labels": {"role": "stable"}},
                "steps": []
            }}
        }),
    );
    if let Some(spec) = rollout["spec"].as_object_mut() {
        spec.remove("template");
    }
    cluster.create("rollouts", rollout).await;
    cluster.healthy(namespace, name, 2).await;
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(cluster.client.clone(), namespace);
    cluster
        .eventually("the referenced Deployment scaled down to 0", || async {
            let deployment = deployments.get(name).await.expect("reads the Deployment");
            (deployment.spec.and_then(|spec| spec.replicas) == Some(0)).then_some(())
        })
        .await;
}

/// A standalone Experiment with a template Service: it runs for its duration, then its
/// ReplicaSet waits out its scale-down delay (an annotation) and is scaled to zero, and its
/// Service is deleted.
async fn experiment(cluster: &Cluster, namespace: &str) {
    let name = "trial";
    cluster
        .create(
            "experiments",
            json!({
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "Experiment",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "duration": "1s",
                    "scaleDownDelaySeconds": 1,
                    "templates": [{
                        "name": "baseline",
                        "replicas": 1,
                        "selector": {"matchLabels": {"app": name}},
                        "service": {},
                        "template": {
                            "metadata": {"labels": {"app": name}},
                            "spec": {"containers": [{"name": "app", "image": "app:v1", "ports": [{"containerPort": 8080}]}]}
                        }
                    }]
                }
            }),
        )
        .await;
    let experiments =
        Api::<rollouts_crds::experiment::Experiment>::namespaced(cluster.client.clone(), namespace);
    let replica_sets: Api<ReplicaSet> = Api::namespaced(cluster.client.clone(), namespace);
    let services =
        Api::<k8s_openapi::api::core::v1::Service>::namespaced(cluster.client.clone(), namespace);
    cluster
        .eventually(
            "the Experiment ran, scaled down and deleted its Service",
            || async {
                let experiment = experiments.get(name).await.expect("reads the Experiment");
                let successful = experiment
                    .status
                    .as_ref()
                    .and_then(|status| status.phase)
                    .is_some_and(|phase| phase.as_str() == "Successful");
                let scaled_down = replica_sets
                    .get_opt(&format!("{name}-baseline"))
                    .await
                    .expect("reads the ReplicaSet")
                    .and_then(|rs| rs.spec.and_then(|spec| spec.replicas))
                    == Some(0);
                let service_gone = services
                    .get_opt(&format!("{name}-baseline"))
                    .await
                    .expect("reads the Service")
                    .is_none();
                (successful && scaled_down && service_gone).then_some(())
            },
        )
        .await;
}

/// A canary whose only step is an experiment: the step creates its Experiment, a new revision
/// terminates the running one, and with `successfulRunHistoryLimit: 0` both are deleted once
/// the update completes. The first Experiment runs for an hour, so it is still running when the
/// next revision comes however slow the machine; that revision's step lasts 2 s.
async fn experiment_step(cluster: &Cluster, namespace: &str) {
    let name = "lab";
    let steps = |duration: &str| {
        json!([{"experiment": {
            "duration": duration,
            "templates": [
                {"name": "baseline", "specRef": "stable", "replicas": 1},
                {"name": "canary", "specRef": "canary", "replicas": 1}
            ]
        }}])
    };
    let spec = json!({
        "analysis": {"successfulRunHistoryLimit": 0},
        "strategy": {"canary": {"steps": steps("1h")}}
    });
    cluster
        .create("rollouts", rollout(namespace, name, 1, spec))
        .await;
    let v1 = cluster.healthy(namespace, name, 1).await;
    let experiments =
        Api::<rollouts_crds::experiment::Experiment>::namespaced(cluster.client.clone(), namespace);
    let v2 = cluster.update(namespace, name, "app:v2", &v1).await;
    let first = cluster
        .eventually("the experiment step's Experiment", || async {
            let current = cluster
                .status(namespace, name)
                .await
                .canary
                .current_experiment;
            (!current.is_empty()).then_some(current)
        })
        .await;
    let next = json!({"spec": {
        "template": {"spec": {"containers": [{"name": "app", "image": "app:v3"}]}},
        "strategy": {"canary": {"steps": steps("2s")}}
    }});
    cluster
        .rollouts(namespace)
        .patch(name, &PatchParams::default(), &Patch::Merge(&next))
        .await
        .expect("changes the image and the step's duration");
    let v3 = cluster
        .eventually(&format!("{namespace}/{name} on app:v3"), || async {
            let hash = cluster.status(namespace, name).await.current_pod_hash;
            (hash != v2 && !hash.is_empty()).then_some(hash)
        })
        .await;
    cluster
        .eventually("the old revision's Experiment terminated", || async {
            let experiment = experiments.get_opt(&first).await.expect("reads")?;
            experiment.spec.terminate.then_some(())
        })
        .await;
    assert_eq!(cluster.healthy(namespace, name, 1).await, v3);
    cluster
        .eventually(
            "the finished Experiments deleted past the history limit",
            || async {
                let left = experiments
                    .list(&ListParams::default())
                    .await
                    .expect("lists Experiments")
                    .items
                    .into_iter()
                    .filter(|ex| ex.owner_references().iter().any(|o| o.name == name))
                    .count();
                (left == 0).then_some(())
            },
        )
        .await;
}

/// Every scenario at once, each its own Rollout in `namespace`.
async fn tour(cluster: &Cluster, namespace: &str, install: &Install, cluster_templates: bool) {
    let stub = WebStub::start().await;
    notifications(cluster, install, &stub).await;
    tokio::join!(
        canary_steps(cluster, namespace),
        canary_analysis(cluster, namespace, &stub, cluster_templates),
        blue_green(cluster, namespace, &stub),
        routed_canary(cluster, namespace, Router::Nginx),
        routed_canary(cluster, namespace, Router::IstioSubsets),
        routed_canary(cluster, namespace, Router::GatewayApi),
        workload_ref(cluster, namespace),
        experiment(cluster, namespace),
        experiment_step(cluster, namespace),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_wide_install_allows_every_request_and_grants_nothing_unused() {
    let install = Install::render("deploy");
    assert_no_wildcards(&install);
    let cluster = Cluster::start("cluster");
    cluster.namespace(&install.namespace).await;
    // Workloads in a namespace of their own: the controller works across namespaces.
    let workloads = "shop";
    cluster.namespace(workloads).await;
    let controller = Controller::start(&cluster, &install);
    tour(&cluster, workloads, &install, true).await;
    controller.stop(&cluster).await;

    let requests = controller_requests(&cluster.sim);
    let leased = requests
        .iter()
        .any(|r| r.resource == "leases" && r.namespace == install.namespace);
    assert!(
        leased,
        "the controller held the leader Lease during the tour"
    );
    let scoped = cluster_scoped_resources(&cluster.client).await;
    assert_every_request_allowed(&install, &requests, &scoped);
    assert_every_grant_used(&install, &requests);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_namespaced_install_allows_every_request_in_its_own_namespace() {
    let install = Install::render("deploy/overlays/namespaced");
    assert_no_wildcards(&install);
    assert!(
        install.grants.iter().all(|g| g.namespace.is_some()),
        "the namespaced install grants nothing cluster-wide: {:?}",
        install
            .grants
            .iter()
            .filter(|g| g.namespace.is_none())
            .map(|g| &g.role)
            .collect::<BTreeSet<_>>()
    );
    let cluster = Cluster::start("namespaced");
    cluster.namespace(&install.namespace).await;
    let controller = Controller::start(&cluster, &install);
    // A namespaced install cannot read ClusterAnalysisTemplates (cluster-scoped).
    tour(&cluster, &install.namespace, &install, false).await;
    controller.stop(&cluster).await;

    let requests = controller_requests(&cluster.sim);
    let scoped = cluster_scoped_resources(&cluster.client).await;
    assert_every_request_allowed(&install, &requests, &scoped);
    let used_roles: BTreeSet<&str> = install
        .grants
        .iter()
        .filter(|g| {
            requests.iter().any(|r| {
                r.path.is_empty() && verbs_of(r).iter().any(|v| g.allows(&Access::of(r), v))
            })
        })
        .map(|g| g.role_name.as_str())
        .collect();
    assert!(
        used_roles.contains("rollouts-controller")
            && used_roles.contains("rollouts-controller-leader-election"),
        "both Roles were used: {used_roles:?}"
    );
}
