//! The real `kubectl` (found on PATH) against kube-sim: apply (client- and server-side), get
//! (tables, YAML, watch), patch, delete with and without finalizers, api-resources, plugins.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::kubectl::Kubectl;
use common::{eventually_blocking, widget_crd};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(15);

fn deployment(image: &str, with_sidecar: bool) -> Value {
    let mut containers =
        vec![json!({"name": "main", "image": image, "env": [{"name": "MODE", "value": "canary"}]})];
    if with_sidecar {
        containers.push(json!({"name": "side", "image": "busybox:1"}));
    }
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": containers}},
        },
    })
}

#[test]
fn apply_client_side_then_reapply_keeps_the_kept_containers_env() {
    let k = Kubectl::new("apply");
    let first = k.write("v1.json", &deployment("nginx:1", true));
    assert!(
        k.ok(&["apply", "-f", &first])
            .contains("deployment.apps/web created")
    );
    let second = k.write("v2.json", &deployment("nginx:2", false));
    assert!(
        k.ok(&["apply", "-f", &second])
            .contains("deployment.apps/web configured")
    );
    let live = k.json(&["get", "deployment", "web"]);
    let containers = &live["spec"]["template"]["spec"]["containers"];
    assert_eq!(
        containers.as_array().map(Vec::len),
        Some(1),
        "the dropped container is gone: {containers}"
    );
    assert_eq!(containers[0]["image"], "nginx:2");
    assert_eq!(
        containers[0]["env"],
        json!([{"name": "MODE", "value": "canary"}])
    );
    assert_eq!(live["metadata"]["generation"], 2);
    assert!(k.ok(&["apply", "-f", &second]).contains("unchanged"));
}

#[test]
fn apply_server_side_creates_then_merges() {
    let k = Kubectl::new("ssa");
    let manifest = k.write("cm.json", &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": {"a": "1"}}));
    assert!(
        k.ok(&["apply", "--server-side", "-f", &manifest])
            .contains("serverside-applied")
    );
    let changed = k.write("cm2.json", &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "labels": {"team": "blue"}}, "data": {"a": "2"}}));
    k.ok(&["apply", "--server-side", "-f", &changed]);
    let live = k.json(&["get", "configmap", "settings"]);
    assert_eq!(live["data"]["a"], "2");
    assert_eq!(live["metadata"]["labels"]["team"], "blue");
}

#[test]
fn custom_resources_get_patch_and_discovery() {
    let k = Kubectl::new("crd");
    let crd = k.write("crd.json", &widget_crd());
    k.ok(&["apply", "-f", &crd]);
    let resources = k.ok(&["api-resources"]);
    let line = resources
        .lines()
        .find(|l| l.starts_with("widgets "))
        .unwrap_or_else(|| panic!("widgets in api-resources:\n{resources}"));
    assert!(
        line.contains("wd") && line.contains("example.com/v1") && line.contains("Widget"),
        "{line}"
    );
    let widget = k.write("w.json", &json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"}, "spec": {"size": 3}}));
    k.ok(&["apply", "-f", &widget]);

    k.ok(&[
        "patch",
        "widget",
        "w1",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"size":4}}"#,
    ]);
    k.ok(&[
        "patch",
        "widget",
        "w1",
        "--type",
        "merge",
        "--subresource",
        "status",
        "-p",
        r#"{"status":{"phase":"Ready"}}"#,
    ]);
    k.ok(&[
        "patch",
        "wd",
        "w1",
        "--type",
        "json",
        "-p",
        r#"[{"op":"add","path":"/metadata/labels","value":{"tier":"gold"}}]"#,
    ]);
    let table = k.ok(&["get", "widgets"]);
    let header = table.lines().next().unwrap_or_default();
    assert!(
        header.contains("SIZE") && header.contains("PHASE"),
        "printer columns in the table:\n{table}"
    );
    let row = table
        .lines()
        .find(|l| l.starts_with("w1"))
        .unwrap_or_else(|| panic!("w1 row:\n{table}"));
    assert!(row.contains('4') && row.contains("Ready"), "{row}");

    let yaml = k.ok(&["get", "widget", "w1", "-o", "yaml"]);
    assert!(
        yaml.contains("kind: Widget")
            && yaml.contains("size: 4")
            && yaml.contains("phase: Ready")
            && yaml.contains("tier: gold"),
        "{yaml}"
    );
    assert!(
        yaml.contains("generation: 2"),
        "the spec patch bumped generation once:\n{yaml}"
    );
    let all = k.ok(&["get", "widgets", "-A"]);
    assert!(
        all.lines()
            .any(|l| l.starts_with("default") && l.contains("w1")),
        "{all}"
    );
}

#[test]
fn get_watch_streams_changes() {
    let k = Kubectl::new("watch");
    // kubectl's typed generators (`create namespace`) send protobuf, which kube-sim does not speak.
    let namespace = k.write(
        "ns.json",
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}),
    );
    k.ok(&["apply", "-f", &namespace]);
    let manifest = k.write("cm.json", &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "watched", "namespace": "team-a"}, "data": {"v": "1"}}));
    k.ok(&["apply", "-f", &manifest]);
    let mut child = k
        .command(&[
            "get",
            "configmaps",
            "-n",
            "team-a",
            "-w",
            "-o",
            "custom-columns=NAME:.metadata.name,V:.data.v",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl get -w starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut seen = Vec::new();
    let mut wait_for = |want: &str| {
        eventually_blocking(&format!("`{want}` from kubectl get -w"), WAIT, || {
            while let Ok(line) = rx.try_recv() {
                seen.push(line.split_whitespace().collect::<Vec<_>>().join(" "));
            }
            seen.iter().any(|l| l == want).then_some(())
        })
    };
    wait_for("watched 1");
    k.ok(&[
        "patch",
        "configmap",
        "watched",
        "-n",
        "team-a",
        "--type",
        "merge",
        "-p",
        r#"{"data":{"v":"2"}}"#,
    ]);
    wait_for("watched 2");
    // kubectl get -w never ends by itself.
    child.kill().expect("stop kubectl get -w");
    child.wait().expect("reap kubectl");
}

#[test]
fn delete_with_and_without_finalizers() {
    let k = Kubectl::new("delete");
    let plain = k.write(
        "plain.json",
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "plain"}}),
    );
    let held = k.write("held.json", &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "held", "finalizers": ["e2e.rollouts.dev/hold"]}}));
    k.ok(&["apply", "-f", &plain, "-f", &held]);
    assert!(k.ok(&["delete", "configmap", "plain"]).contains("deleted"));
    assert!(!k.run(&["get", "configmap", "plain"]).status.success());

    // kubectl waits for the finalizer: release it while the delete command is waiting.
    let mut deleting = k
        .command(&["delete", "configmap", "held", "--timeout=30s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl delete starts");
    eventually_blocking("a deletionTimestamp on the held ConfigMap", WAIT, || {
        let live = k.json(&["get", "configmap", "held"]);
        live["metadata"]["deletionTimestamp"]
            .is_string()
            .then_some(())
    });
    k.ok(&[
        "patch",
        "configmap",
        "held",
        "--type",
        "merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ]);
    let out = wait_with_deadline(&mut deleting);
    assert!(
        out.status.success(),
        "kubectl delete: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!k.run(&["get", "configmap", "held"]).status.success());
    let deletes = k
        .sim
        .requests()
        .iter()
        .filter(|r| r.verb == "delete" && r.resource == "configmaps")
        .count();
    assert_eq!(deletes, 2);
}

/// Waits for a child with a deadline, killing it when the deadline passes.
fn wait_with_deadline(child: &mut std::process::Child) -> Output {
    let status = eventually_blocking("kubectl to exit", WAIT, || {
        child.try_wait().expect("poll child")
    });
    let mut stderr = Vec::new();
    if let Some(mut e) = child.stderr.take() {
        std::io::Read::read_to_end(&mut e, &mut stderr).expect("read stderr");
    }
    Output {
        status,
        stdout: Vec::new(),
        stderr,
    }
}

#[test]
fn plugins_are_found_on_path() {
    let k = Kubectl::new("plugin");
    let bin = k.path("bin");
    std::fs::create_dir_all(&bin).expect("plugin dir");
    let plugin = bin.join("kubectl-simcheck");
    std::fs::write(&plugin, "#!/bin/sh\necho \"simcheck sees $*\"\n").expect("write plugin");
    make_executable(&plugin);
    let path = std::env::join_paths(std::iter::once(bin.clone()).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .expect("PATH");
    // kubectl refuses flags before a plugin name, so the kubeconfig comes from the environment.
    let out = Command::new(&k.binary)
        .args(["simcheck", "--flag", "arg"])
        .env("PATH", path)
        .env("KUBECONFIG", k.path("kubeconfig"))
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "simcheck sees --flag arg"
    );
}

fn make_executable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod plugin");
}

fn managers(live: &Value) -> Vec<String> {
    live["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            format!(
                "{}/{}",
                e["manager"].as_str().unwrap_or_default(),
                e["operation"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

#[test]
fn client_side_apply_migrates_to_server_side_apply_without_conflicts() {
    let k = Kubectl::new("csa-to-ssa");
    let manifest = k.write("cm.json", &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "labels": {"team": "blue"}}, "data": {"a": "1", "b": "2"}}));
    k.ok(&["apply", "-f", &manifest]);
    let client_side = k.json(&["get", "configmap", "settings", "--show-managed-fields"]);
    assert!(
        managers(&client_side).contains(&"kubectl-client-side-apply/Update".to_string()),
        "the client-side apply's create is recorded under kubectl's field manager: {:?}",
        managers(&client_side)
    );

    assert!(
        k.ok(&["apply", "--server-side", "-f", &manifest])
            .contains("serverside-applied")
    );
    let migrated = k.json(&["get", "configmap", "settings", "--show-managed-fields"]);
    let owners = managers(&migrated);
    assert!(
        owners.contains(&"kubectl/Apply".to_string())
            && !owners.contains(&"kubectl-client-side-apply/Update".to_string()),
        "kubectl moved the client-side fields to its server-side apply entry: {owners:?}"
    );
    let rv = migrated["metadata"]["resourceVersion"].clone();
    k.ok(&["apply", "--server-side", "-f", &manifest]);
    let again = k.json(&["get", "configmap", "settings"]);
    assert_eq!(
        again["metadata"]["resourceVersion"], rv,
        "an unchanged server-side apply writes nothing"
    );
}

#[test]
fn server_side_apply_conflicts_with_kubectl_patch_until_forced() {
    let k = Kubectl::new("ssa-conflict");
    let manifest = |mode: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": {"mode": mode}});
    let first = k.write("cm1.json", &manifest("a"));
    k.ok(&["apply", "--server-side", "-f", &first]);
    k.ok(&[
        "patch",
        "configmap",
        "settings",
        "--type",
        "merge",
        "-p",
        r#"{"data":{"mode":"b"}}"#,
    ]);
    let second = k.write("cm2.json", &manifest("c"));
    let refused = k.run(&["apply", "--server-side", "-f", &second]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "the apply conflicts");
    assert!(
        stderr.contains("Apply failed with 1 conflict: conflict with \"kubectl-patch\" using v1")
            && stderr.contains(".data.mode")
            && !stderr.contains("Operation cannot be fulfilled"),
        "kubectl shows the API server's apply message: {stderr}"
    );
    k.ok(&["apply", "--server-side", "--force-conflicts", "-f", &second]);
    let live = k.json(&["get", "configmap", "settings", "--show-managed-fields"]);
    assert_eq!(live["data"]["mode"], "c");
    assert!(
        !managers(&live).contains(&"kubectl-patch/Update".to_string()),
        "the forced apply took the only field kubectl patch owned: {:?}",
        managers(&live)
    );
}
