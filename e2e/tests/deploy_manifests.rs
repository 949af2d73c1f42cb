//! The install manifests (deploy/), the container image recipe (Dockerfile) and the krew
//! template (krew/): deploy/ is rendered with the real `kubectl kustomize` (found on PATH) and
//! every object is checked as parsed YAML. Applying them to kube-sim comes with the e2e suite.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

const NAMESPACE: &str = "rollouts";
const CONTROLLER: &str = "rollouts-controller";
const IMAGE: &str = "ghcr.io/rollouts-rs/rollouts-controller";
/// The controller's default `--lease-name`; the leader-election Role is limited to it.
const LEASE_NAME: &str = "rollouts-controller-lock";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ sits in the workspace root")
        .to_path_buf()
}

/// `kubectl kustomize <dir>` (a path relative to the workspace root), parsed into documents.
fn kustomize(dir: &str) -> Vec<Value> {
    let path = repo_root().join(dir);
    let output = match Command::new("kubectl").arg("kustomize").arg(&path).output() {
        Ok(output) => output,
        Err(error) => panic!(
            "cannot run `kubectl kustomize {dir}`: {error}. These tests need kubectl (1.32, with \
             kustomize v5) on PATH; install it or add its directory to PATH."
        ),
    };
    assert!(
        output.status.success(),
        "`kubectl kustomize {dir}` failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("kustomize prints UTF-8");
    let documents: Vec<Value> = serde_saphyr::from_multiple(&text)
        .unwrap_or_else(|error| panic!("`kubectl kustomize {dir}` printed invalid YAML: {error}"));
    assert!(
        !documents.is_empty(),
        "`kubectl kustomize {dir}` printed nothing"
    );
    for document in &documents {
        assert!(
            document["apiVersion"].is_string()
                && document["kind"].is_string()
                && document["metadata"]["name"].is_string(),
            "every object of {dir} has apiVersion, kind and metadata.name: {document}"
        );
    }
    documents
}

fn cluster_install() -> &'static [Value] {
    static RENDERED: OnceLock<Vec<Value>> = OnceLock::new();
    RENDERED.get_or_init(|| kustomize("deploy"))
}

fn namespaced_install() -> &'static [Value] {
    static RENDERED: OnceLock<Vec<Value>> = OnceLock::new();
    RENDERED.get_or_init(|| kustomize("deploy/overlays/namespaced"))
}

fn kind_and_name(object: &Value) -> (String, String) {
    (
        object["kind"].as_str().unwrap_or_default().to_string(),
        object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the rendered install"))
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|items| items.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// Whether some rule grants `verb` on `group`/`resource` (subresources written `pods/eviction`).
fn allows(role: &Value, group: &str, resource: &str, verb: &str) -> bool {
    role["rules"].as_array().into_iter().flatten().any(|rule| {
        strings(&rule["apiGroups"]).contains(&group)
            && strings(&rule["resources"]).contains(&resource)
            && strings(&rule["verbs"]).contains(&verb)
    })
}

/// The one container of the controller Deployment.
fn controller_container(deployment: &Value) -> &Value {
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("the Deployment has containers");
    assert_eq!(containers.len(), 1, "one container in {CONTROLLER}");
    &containers[0]
}

/// `field = "..."` under `[workspace.package]` in the root Cargo.toml.
fn workspace_field(field: &str) -> String {
    let manifest = std::fs::read_to_string(repo_root().join("Cargo.toml")).expect("Cargo.toml");
    let mut in_package = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[workspace.package]";
        } else if in_package
            && let Some((key, value)) = line.split_once('=')
            && key.trim() == field
        {
            return value.trim().trim_matches('"').to_string();
        }
    }
    panic!("Cargo.toml has no [workspace.package] {field}")
}

fn yaml_files(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .filter(|path| {
            path.file_name()
                .is_some_and(|name| name != "kustomization.yaml")
        })
        .map(|path| {
            let name = path
                .file_name()
                .and_then(|name| name.to_str())
                .expect("a UTF-8 file name")
                .to_string();
            let text = std::fs::read_to_string(&path).expect("a readable YAML file");
            (name, text)
        })
        .collect()
}

#[test]
fn cluster_install_has_every_object_in_the_rollouts_namespace() {
    let objects = cluster_install();
    let rendered: BTreeSet<(String, String)> = objects.iter().map(kind_and_name).collect();
    let expected: BTreeSet<(String, String)> = [
        ("Namespace", NAMESPACE),
        ("CustomResourceDefinition", "analysisruns.argoproj.io"),
        ("CustomResourceDefinition", "analysistemplates.argoproj.io"),
        (
            "CustomResourceDefinition",
            "clusteranalysistemplates.argoproj.io",
        ),
        ("CustomResourceDefinition", "experiments.argoproj.io"),
        ("CustomResourceDefinition", "rollouts.argoproj.io"),
        ("ServiceAccount", CONTROLLER),
        ("ClusterRole", CONTROLLER),
        ("ClusterRoleBinding", CONTROLLER),
        ("ClusterRole", "rollouts-controller-cluster-templates"),
        (
            "ClusterRoleBinding",
            "rollouts-controller-cluster-templates",
        ),
        ("Role", "rollouts-controller-leader-election"),
        ("RoleBinding", "rollouts-controller-leader-election"),
        ("Role", "rollouts-controller-notifications"),
        ("RoleBinding", "rollouts-controller-notifications"),
        ("Deployment", CONTROLLER),
        ("Service", "rollouts-controller-metrics"),
        ("PodDisruptionBudget", CONTROLLER),
    ]
    .into_iter()
    .map(|(kind, name)| (kind.to_string(), name.to_string()))
    .collect();
    assert_eq!(
        rendered, expected,
        "the objects `kubectl apply -k deploy/` installs"
    );

    let cluster_scoped = [
        "Namespace",
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
    ];
    for object in objects {
        let (kind, name) = kind_and_name(object);
        let namespace = &object["metadata"]["namespace"];
        if cluster_scoped.contains(&kind.as_str()) {
            assert!(namespace.is_null(), "{kind} {name} is cluster-scoped");
        } else {
            assert_eq!(
                namespace, NAMESPACE,
                "{kind} {name} is installed in {NAMESPACE}"
            );
        }
    }
}

#[test]
fn crd_copies_in_deploy_match_crds_yaml() {
    let generated = yaml_files(&repo_root().join("crds/yaml"));
    let copied = yaml_files(&repo_root().join("deploy/crds"));
    assert_eq!(
        generated.keys().collect::<Vec<_>>(),
        copied.keys().collect::<Vec<_>>(),
        "deploy/crds/ holds a copy of each file of crds/yaml/: run `make crds`, or \
         `cp crds/yaml/*.yaml deploy/crds/` and list new files in deploy/crds/kustomization.yaml"
    );
    for (file, text) in &generated {
        assert!(
            copied[file] == *text,
            "deploy/crds/{file} differs from crds/yaml/{file}: run `make crds`, or \
             `cp crds/yaml/*.yaml deploy/crds/`"
        );
    }

    let rendered: BTreeSet<&str> = of_kind(cluster_install(), "CustomResourceDefinition")
        .into_iter()
        .filter_map(|crd| crd["metadata"]["name"].as_str())
        .collect();
    let files: BTreeSet<&str> = generated
        .keys()
        .filter_map(|file| file.strip_suffix(".yaml"))
        .collect();
    assert_eq!(
        rendered, files,
        "every CRD file is listed in deploy/crds/kustomization.yaml"
    );
}

#[test]
fn no_role_uses_wildcards_or_non_resource_urls() {
    for (install, objects) in [
        ("deploy", cluster_install()),
        ("deploy/overlays/namespaced", namespaced_install()),
    ] {
        let roles = objects
            .iter()
            .filter(|o| o["kind"] == "Role" || o["kind"] == "ClusterRole");
        for role in roles {
            let (kind, name) = kind_and_name(role);
            let rules = role["rules"].as_array().expect("a role has rules");
            assert!(!rules.is_empty(), "{install}: {kind} {name} grants nothing");
            for rule in rules {
                assert!(
                    rule.get("nonResourceURLs").is_none() && rule.get("aggregationRule").is_none(),
                    "{install}: {kind} {name} grants only API resources: {rule}"
                );
                for field in ["apiGroups", "resources", "verbs"] {
                    let values = strings(&rule[field]);
                    assert!(
                        !values.is_empty(),
                        "{install}: {kind} {name} names its {field}: {rule}"
                    );
                    assert!(
                        values.iter().all(|value| !value.contains('*')),
                        "{install}: {kind} {name} has a wildcard in {field}: {rule}"
                    );
                }
            }
        }
    }
}

#[test]
fn cluster_role_grants_what_the_controller_does_and_no_more() {
    let role = find(cluster_install(), "ClusterRole", CONTROLLER);
    let needed = [
        ("argoproj.io", "rollouts", "watch"),
        ("argoproj.io", "rollouts/status", "patch"),
        // Merge patches of metadata, never the spec: the revision annotation, and what
        // notifications sent (notified.notifications.argoproj.io).
        ("argoproj.io", "rollouts", "patch"),
        ("argoproj.io", "rollouts/finalizers", "update"),
        ("argoproj.io", "analysisruns", "create"),
        ("argoproj.io", "analysisruns", "delete"),
        ("argoproj.io", "analysisruns", "patch"),
        ("argoproj.io", "analysisruns/status", "patch"),
        ("argoproj.io", "analysistemplates", "get"),
        // The Experiment controller: its watch and its status.
        ("argoproj.io", "experiments", "watch"),
        ("argoproj.io", "experiments/status", "patch"),
        ("apps", "replicasets", "create"),
        ("apps", "replicasets", "patch"),
        ("apps", "replicasets", "delete"),
        ("apps", "deployments", "get"),
        ("apps", "deployments", "patch"),
        ("", "pods", "list"),
        ("", "pods/eviction", "create"),
        ("", "services", "patch"),
        // An experiment template's own Service, made while it runs and deleted after (Argo's).
        ("", "services", "create"),
        ("", "services", "delete"),
        ("", "secrets", "get"),
        ("events.k8s.io", "events", "create"),
        ("batch", "jobs", "create"),
        ("batch", "jobs", "delete"),
        ("networking.k8s.io", "ingresses", "create"),
        ("networking.istio.io", "virtualservices", "patch"),
        ("networking.istio.io", "destinationrules", "patch"),
        ("gateway.networking.k8s.io", "httproutes", "patch"),
    ];
    for (group, resource, verb) in needed {
        assert!(
            allows(role, group, resource, verb),
            "ClusterRole {CONTROLLER} must allow {verb} on {group}/{resource}"
        );
    }
    let refused = [
        // Each event is created once under a name that makes a repeat an AlreadyExists.
        ("events.k8s.io", "events", "patch"),
        ("argoproj.io", "rollouts", "update"),
        ("argoproj.io", "rollouts", "delete"),
        ("argoproj.io", "analysistemplates", "patch"),
        ("apps", "replicasets", "deletecollection"),
        ("apps", "deployments", "delete"),
        ("", "pods", "delete"),
        ("", "secrets", "list"),
        ("", "secrets", "watch"),
        ("", "services", "deletecollection"),
        ("coordination.k8s.io", "leases", "update"),
    ];
    for (group, resource, verb) in refused {
        assert!(
            !allows(role, group, resource, verb),
            "ClusterRole {CONTROLLER} must not allow {verb} on {group}/{resource}"
        );
    }

    let templates = find(
        cluster_install(),
        "ClusterRole",
        "rollouts-controller-cluster-templates",
    );
    assert!(allows(
        templates,
        "argoproj.io",
        "clusteranalysistemplates",
        "get"
    ));
    assert!(!allows(
        templates,
        "argoproj.io",
        "clusteranalysistemplates",
        "update"
    ));
}

#[test]
fn notifications_read_only_argos_configmap_and_secret_by_name_in_the_controller_namespace() {
    let role = find(
        cluster_install(),
        "Role",
        "rollouts-controller-notifications",
    );
    assert_eq!(role["metadata"]["namespace"], NAMESPACE);
    let rules = role["rules"].as_array().expect("rules");
    let granted: Vec<(Vec<&str>, Vec<&str>, Vec<&str>)> = rules
        .iter()
        .map(|rule| {
            assert_eq!(strings(&rule["apiGroups"]), [""]);
            (
                strings(&rule["resources"]),
                strings(&rule["resourceNames"]),
                strings(&rule["verbs"]),
            )
        })
        .collect();
    assert_eq!(
        granted,
        [
            (
                vec!["configmaps"],
                vec!["argo-rollouts-notification-configmap"],
                vec!["list", "watch"]
            ),
            (
                vec!["secrets"],
                vec!["argo-rollouts-notification-secret"],
                vec!["list", "watch"]
            ),
        ]
    );
}

#[test]
fn leases_are_granted_only_in_the_controller_namespace_and_only_the_controller_lease() {
    let role = find(
        cluster_install(),
        "Role",
        "rollouts-controller-leader-election",
    );
    for rule in role["rules"].as_array().expect("rules") {
        assert_eq!(strings(&rule["apiGroups"]), ["coordination.k8s.io"]);
        assert_eq!(strings(&rule["resources"]), ["leases"]);
        let verbs = strings(&rule["verbs"]);
        if verbs != ["create"] {
            assert_eq!(
                strings(&rule["resourceNames"]),
                [LEASE_NAME],
                "reading and renewing the lease is limited to {LEASE_NAME}: {rule}"
            );
        }
    }
    assert!(allows(role, "coordination.k8s.io", "leases", "create"));
    assert!(allows(role, "coordination.k8s.io", "leases", "get"));
    assert!(allows(role, "coordination.k8s.io", "leases", "update"));
    for objects in [cluster_install(), namespaced_install()] {
        for role in objects.iter().filter(|o| o["kind"] == "ClusterRole") {
            assert!(
                !allows(role, "coordination.k8s.io", "leases", "get"),
                "no ClusterRole grants Leases: {}",
                role["metadata"]["name"]
            );
        }
    }
}

#[test]
fn bindings_give_their_role_to_the_controller_service_account() {
    for (install, objects) in [
        ("deploy", cluster_install()),
        ("deploy/overlays/namespaced", namespaced_install()),
    ] {
        let deployment = find(objects, "Deployment", CONTROLLER);
        assert_eq!(
            deployment["spec"]["template"]["spec"]["serviceAccountName"],
            CONTROLLER
        );
        find(objects, "ServiceAccount", CONTROLLER);
        let bindings = objects
            .iter()
            .filter(|o| o["kind"] == "RoleBinding" || o["kind"] == "ClusterRoleBinding");
        for binding in bindings {
            let (kind, name) = kind_and_name(binding);
            let role_kind = binding["roleRef"]["kind"].as_str().expect("roleRef.kind");
            let role_name = binding["roleRef"]["name"].as_str().expect("roleRef.name");
            find(objects, role_kind, role_name);
            if kind == "RoleBinding" {
                assert_eq!(role_kind, "Role", "{install}: {kind} {name} binds a Role");
            }
            let subjects = binding["subjects"].as_array().expect("subjects");
            assert_eq!(subjects.len(), 1, "{install}: {kind} {name}: one subject");
            assert_eq!(subjects[0]["kind"], "ServiceAccount");
            assert_eq!(subjects[0]["name"], CONTROLLER);
            assert_eq!(
                subjects[0]["namespace"], deployment["metadata"]["namespace"],
                "{install}: {kind} {name} names the controller's namespace"
            );
        }
    }
}

/// The checks both installs share: replicas, leader election, probes, ports, resources and
/// the pod and container security settings.
fn assert_controller_deployment(install: &str, deployment: &Value) {
    let spec = &deployment["spec"];
    assert_eq!(spec["replicas"], 2, "{install}: two replicas");
    let pod_labels = &spec["template"]["metadata"]["labels"];
    for (key, value) in spec["selector"]["matchLabels"]
        .as_object()
        .expect("a selector")
    {
        assert_eq!(
            &pod_labels[key], value,
            "{install}: the selector matches the pods"
        );
    }

    let pod = &spec["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{install}");
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let container = controller_container(deployment);
    let security = &container["securityContext"];
    assert_eq!(security["runAsNonRoot"], true, "{install}");
    assert_eq!(security["readOnlyRootFilesystem"], true, "{install}");
    assert_eq!(security["allowPrivilegeEscalation"], false, "{install}");
    assert_eq!(strings(&security["capabilities"]["drop"]), ["ALL"]);
    assert!(security["capabilities"]["add"].is_null(), "{install}");
    assert!(security["privileged"] != true, "{install}");
    assert_eq!(security["seccompProfile"]["type"], "RuntimeDefault");

    let args = strings(&container["args"]);
    assert!(args.contains(&"--leader-elect"), "{install}: {args:?}");

    let ports: BTreeMap<&str, i64> = container["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .map(|port| {
            (
                port["name"].as_str().expect("named ports"),
                port["containerPort"].as_i64().expect("a port number"),
            )
        })
        .collect();
    assert_eq!(ports.get("healthz"), Some(&8080), "{install}");
    assert_eq!(ports.get("metrics"), Some(&8090), "{install}");
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"], path, "{install}: {probe}");
        let port = match &get["port"] {
            Value::String(name) => ports.get(name.as_str()).copied(),
            other => other.as_i64(),
        };
        assert_eq!(port, Some(8080), "{install}: {probe} on port 8080");
    }

    for bound in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            assert!(
                container["resources"][bound][resource].is_string(),
                "{install}: the container sets {bound}.{resource}"
            );
        }
    }

    let env = container["env"].as_array().expect("env");
    assert!(
        env.iter().any(|var| var["name"] == "POD_NAME"
            && var["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"),
        "{install}: POD_NAME names the leader-election candidate"
    );
}

#[test]
fn cluster_install_deployment_is_locked_down_and_leader_elected() {
    let deployment = find(cluster_install(), "Deployment", CONTROLLER);
    assert_controller_deployment("deploy", deployment);
    let args = strings(&controller_container(deployment)["args"]);
    assert!(
        !args.iter().any(|arg| arg.starts_with("--namespace")),
        "the cluster-wide controller watches every namespace: {args:?}"
    );
}

#[test]
fn image_tag_is_the_workspace_version() {
    let version = workspace_field("version");
    for objects in [cluster_install(), namespaced_install()] {
        let deployment = find(objects, "Deployment", CONTROLLER);
        assert_eq!(
            controller_container(deployment)["image"],
            format!("{IMAGE}:v{version}"),
            "the image tag in deploy/base/kustomization.yaml follows [workspace.package] version"
        );
    }
}

#[test]
fn metrics_service_and_disruption_budget_select_the_controller_pods() {
    let objects = cluster_install();
    let deployment = find(objects, "Deployment", CONTROLLER);
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let matches_pods = |selector: &Value| {
        let selector = selector.as_object().expect("a label selector");
        !selector.is_empty()
            && selector
                .iter()
                .all(|(key, value)| &pod_labels[key] == value)
    };

    let service = find(objects, "Service", "rollouts-controller-metrics");
    assert!(matches_pods(&service["spec"]["selector"]));
    let ports = service["spec"]["ports"].as_array().expect("ports");
    assert!(
        ports
            .iter()
            .any(|port| port["port"] == 8090 && port["targetPort"] == "metrics"),
        "the Service exposes the metrics port: {ports:?}"
    );

    let budget = find(objects, "PodDisruptionBudget", CONTROLLER);
    assert_eq!(budget["spec"]["minAvailable"], 1);
    assert!(matches_pods(&budget["spec"]["selector"]["matchLabels"]));
}

#[test]
fn namespaced_overlay_uses_roles_and_watches_its_own_namespace() {
    let objects = namespaced_install();
    for kind in [
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "Namespace",
    ] {
        assert!(
            of_kind(objects, kind).is_empty(),
            "the namespaced install has no {kind} (cluster-scoped)"
        );
    }
    for object in objects {
        let (kind, name) = kind_and_name(object);
        assert_eq!(
            object["metadata"]["namespace"], NAMESPACE,
            "{kind} {name} is in the overlay's namespace"
        );
    }

    let role = find(objects, "Role", CONTROLLER);
    let cluster_role = find(cluster_install(), "ClusterRole", CONTROLLER);
    assert_eq!(
        role["rules"], cluster_role["rules"],
        "the Role grants in one namespace what the ClusterRole grants everywhere"
    );
    find(objects, "Role", "rollouts-controller-leader-election");
    find(objects, "Role", "rollouts-controller-notifications");
    let binding = find(objects, "RoleBinding", CONTROLLER);
    assert_eq!(binding["roleRef"]["kind"], "Role");
    assert_eq!(binding["roleRef"]["name"], CONTROLLER);

    let deployment = find(objects, "Deployment", CONTROLLER);
    assert_controller_deployment("deploy/overlays/namespaced", deployment);
    let container = controller_container(deployment);
    assert!(
        strings(&container["args"]).contains(&"--namespace=$(POD_NAMESPACE)"),
        "the controller watches the namespace it runs in: {}",
        container["args"]
    );
    let env = container["env"].as_array().expect("env");
    assert!(
        env.iter().any(|var| var["name"] == "POD_NAMESPACE"
            && var["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"),
        "POD_NAMESPACE comes from the downward API: {env:?}"
    );
}

#[test]
fn dockerfile_runs_the_controller_as_the_deployment_user_without_a_shell() {
    let dockerfile =
        std::fs::read_to_string(repo_root().join("Dockerfile")).expect("a Dockerfile at the root");
    let instructions: Vec<&str> = dockerfile
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect();
    let stages: Vec<usize> = instructions
        .iter()
        .enumerate()
        .filter(|(_, line)| line.starts_with("FROM "))
        .map(|(at, _)| at)
        .collect();
    assert!(stages.len() >= 2, "a multi-stage build: {stages:?}");
    let builder = &instructions[..stages[stages.len() - 1]];
    assert!(
        builder
            .iter()
            .any(|line| line.starts_with("RUN cargo build")
                && line.contains("--release")
                && line.contains("rollouts-controller")),
        "the builder stage builds rollouts-controller in release mode"
    );

    let runtime = &instructions[stages[stages.len() - 1]..];
    assert!(
        runtime[0].contains("distroless"),
        "the runtime image has no shell: {}",
        runtime[0]
    );
    assert!(
        runtime.iter().all(|line| !line.starts_with("RUN ")),
        "nothing runs in the shell-less runtime stage"
    );
    let user = runtime
        .iter()
        .find_map(|line| line.strip_prefix("USER "))
        .expect("the runtime stage sets USER");
    let uid: i64 = user
        .split(':')
        .next()
        .and_then(|uid| uid.parse().ok())
        .expect("a numeric USER, so the kubelet can check runAsNonRoot");
    assert_ne!(uid, 0, "the image runs as a non-root user");
    let entrypoint = runtime
        .iter()
        .find_map(|line| line.strip_prefix("ENTRYPOINT "))
        .expect("an ENTRYPOINT");
    assert!(
        entrypoint.starts_with('[') && entrypoint.contains("rollouts-controller"),
        "exec-form ENTRYPOINT (there is no shell to run the shell form): {entrypoint}"
    );

    let deployment = find(cluster_install(), "Deployment", CONTROLLER);
    assert_eq!(
        deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"], uid,
        "the Deployment runs as the image's USER"
    );
}

/// Fills the template as krew-release-bot does: `{{ .TagName }}` becomes the tag and
/// `{{addURIAndSha "URL" .TagName }}` becomes `uri: URL` plus a `sha256:` line at four spaces.
fn render_krew_template(template: &str, tag: &str, sha256: &str) -> String {
    const CALL: &str = "{{addURIAndSha \"";
    const CALL_END: &str = "\" .TagName }}";
    let mut rendered = String::new();
    for line in template.lines() {
        match line.trim_start().strip_prefix(CALL) {
            Some(rest) => {
                let uri = rest
                    .strip_suffix(CALL_END)
                    .unwrap_or_else(|| panic!("addURIAndSha call is malformed: {line}"));
                let indent = &line[..line.len() - line.trim_start().len()];
                assert_eq!(
                    indent, "    ",
                    "krew-release-bot writes sha256 at four spaces, so each call sits there: {line}"
                );
                rendered.push_str(&format!("{indent}uri: {uri}\n{indent}sha256: {sha256}\n"));
            }
            None => {
                rendered.push_str(line);
                rendered.push('\n');
            }
        }
    }
    rendered.replace("{{ .TagName }}", tag)
}

#[test]
fn krew_template_renders_a_manifest_for_linux_and_darwin_on_amd64_and_arm64() {
    let template = std::fs::read_to_string(repo_root().join("krew/rollouts.yaml.tmpl"))
        .expect("krew/rollouts.yaml.tmpl");
    let tag = format!("v{}", workspace_field("version"));
    let sha256 = "0123456789abcdef".repeat(4);
    let rendered = render_krew_template(&template, &tag, &sha256);
    assert!(
        !rendered.contains("{{"),
        "only {{{{ .TagName }}}} and addURIAndSha are template fields:\n{rendered}"
    );
    let manifest: Value = serde_saphyr::from_str(&rendered)
        .unwrap_or_else(|error| panic!("the rendered manifest is YAML: {error}\n{rendered}"));

    assert_eq!(
        manifest["apiVersion"],
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(manifest["kind"], "Plugin");
    assert_eq!(
        manifest["metadata"]["name"], "rollouts",
        "krew installs plugin N as kubectl-N: the name gives `kubectl rollouts`"
    );
    let spec = &manifest["spec"];
    assert_eq!(spec["version"], tag.as_str());
    let repository = workspace_field("repository");
    assert_eq!(spec["homepage"], repository.as_str());
    for field in ["shortDescription", "description"] {
        assert!(
            spec[field]
                .as_str()
                .is_some_and(|text| !text.trim().is_empty()),
            "the manifest has a {field}"
        );
    }

    let platforms = spec["platforms"].as_array().expect("platforms");
    let mut covered = BTreeSet::new();
    for platform in platforms {
        let labels = &platform["selector"]["matchLabels"];
        let os = labels["os"].as_str().expect("an os label");
        let arch = labels["arch"].as_str().expect("an arch label");
        assert!(covered.insert((os, arch)), "{os}/{arch} appears once");
        assert_eq!(
            platform["uri"],
            format!(
                "{repository}/releases/download/{tag}/kubectl-rollouts_{tag}_{os}_{arch}.tar.gz"
            ),
            "release archives are named as krew/README.md says"
        );
        assert_eq!(platform["sha256"], sha256.as_str());
        assert_eq!(platform["bin"], "kubectl-rollouts");
        let files: Vec<&str> = platform["files"]
            .as_array()
            .expect("files")
            .iter()
            .filter_map(|file| file["from"].as_str())
            .collect();
        assert_eq!(
            files,
            ["kubectl-rollouts", "LICENSE"],
            "{os}/{arch}: the binary and its license"
        );
    }
    let expected: BTreeSet<(&str, &str)> = [
        ("linux", "amd64"),
        ("linux", "arm64"),
        ("darwin", "amd64"),
        ("darwin", "arm64"),
    ]
    .into_iter()
    .collect();
    assert_eq!(covered, expected);
}
