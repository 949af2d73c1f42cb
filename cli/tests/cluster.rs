//! The verbs against a scripted API server on a loopback port: which requests they send (method,
//! path, content type, body), what they print, and how server failures read.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::mpsc;
use std::thread;

use kubectl_rollouts::cluster::Cluster;
use kubectl_rollouts::patch::PatchRequest;
use serde_json::{Value, json};

/// One request as the scripted server received it.
#[derive(Debug)]
struct Recorded {
    method: String,
    path: String,
    content_type: String,
    body: Value,
}

/// Answers each connection's requests with the next scripted `(status, body)`, recording them.
fn scripted_server(responses: Vec<(u16, Value)>) -> (String, mpsc::Receiver<Recorded>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let url = format!("http://{}", listener.local_addr().expect("local address"));
    let (sender, receiver) = mpsc::channel();
    thread::spawn(move || {
        let mut responses = responses.into_iter();
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            if !serve_connection(stream, &mut responses, &sender) {
                return;
            }
        }
    });
    (url, receiver)
}

/// Serves requests on one keep-alive connection; false once the script is used up.
fn serve_connection(
    stream: TcpStream,
    responses: &mut impl Iterator<Item = (u16, Value)>,
    sender: &mpsc::Sender<Recorded>,
) -> bool {
    let mut reader = BufReader::new(stream.try_clone().expect("clone the stream"));
    let mut writer = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return true;
        }
        let mut parts = request_line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_string();
        let path = parts.next().unwrap_or_default().to_string();
        let (mut content_type, mut length) = (String::new(), 0usize);
        loop {
            let mut header = String::new();
            reader.read_line(&mut header).expect("read a header");
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                match name.to_ascii_lowercase().as_str() {
                    "content-type" => content_type = value.trim().to_string(),
                    "content-length" => length = value.trim().parse().unwrap_or(0),
                    _ => {}
                }
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).expect("read the body");
        let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let _ = sender.send(Recorded {
            method,
            path,
            content_type,
            body,
        });
        let Some((status, reply)) = responses.next() else {
            return false;
        };
        let reply = reply.to_string();
        let head = format!(
            "HTTP/1.1 {status} Scripted\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            reply.len()
        );
        if writer
            .write_all(head.as_bytes())
            .and_then(|()| writer.write_all(reply.as_bytes()))
            .is_err()
        {
            return false;
        }
    }
}

fn rollout(extra_spec: Value, status: Value) -> Value {
    let mut spec = json!({"replicas": 2, "strategy": {"canary": {"steps": [{"setWeight": 50}, {"pause": {}}]}}});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
        spec.extend(extra.clone());
    }
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": "web", "namespace": "shop", "uid": "uid-1"},
        "spec": spec,
        "status": status
    })
}

fn not_found() -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": "rollouts.argoproj.io \"web\" not found", "reason": "NotFound", "code": 404
    })
}

async fn cluster(url: &str) -> Cluster {
    let config = kube::Config::new(url.parse().expect("server URL"));
    Cluster {
        client: kube::Client::try_from(config).expect("client"),
        namespace: "shop".into(),
        server: url.to_string(),
    }
}

/// A kubeconfig for `url` in a fresh temporary directory, removed when dropped.
struct TempKubeconfig {
    dir: PathBuf,
    path: PathBuf,
}

impl Drop for TempKubeconfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn kubeconfig(url: &str, test: &str) -> TempKubeconfig {
    let dir = std::env::temp_dir().join(format!("kubectl-rollouts-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: sim\nclusters:\n- name: sim\n  cluster:\n    server: {url}\ncontexts:\n- name: sim\n  context:\n    cluster: sim\n    user: sim\n    namespace: default\nusers:\n- name: sim\n  user: {{}}\n"
    );
    std::fs::write(&path, text).expect("write kubeconfig");
    TempKubeconfig { dir, path }
}

fn plugin(kubeconfig: &TempKubeconfig, args: &[&str]) -> (String, String, bool) {
    let output = Command::new(env!("CARGO_BIN_EXE_kubectl-rollouts"))
        .arg("--kubeconfig")
        .arg(&kubeconfig.path)
        .args(args)
        .output()
        .expect("the kubectl-rollouts binary runs");
    (
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
        output.status.success(),
    )
}

#[tokio::test]
async fn a_status_merge_patch_goes_to_the_status_subresource() {
    let (url, requests) = scripted_server(vec![(200, rollout(json!({}), json!({"abort": true})))]);
    let cluster = cluster(&url).await;
    let patch = PatchRequest::rollout_status("web", json!({"status": {"abort": true}}));
    let object = cluster.apply(&patch).await.expect("patch succeeds");
    assert_eq!(object.metadata.name.as_deref(), Some("web"));
    let request = requests.recv().expect("one request");
    assert_eq!(request.method, "PATCH");
    assert!(
        request
            .path
            .starts_with("/apis/argoproj.io/v1alpha1/namespaces/shop/rollouts/web/status"),
        "{}",
        request.path
    );
    assert_eq!(request.content_type, "application/merge-patch+json");
    assert_eq!(request.body, json!({"status": {"abort": true}}));
}

#[tokio::test]
async fn a_json_patch_is_sent_with_its_own_content_type() {
    let (url, requests) = scripted_server(vec![(200, rollout(json!({}), json!({})))]);
    let cluster = cluster(&url).await;
    let operations = json!([{"op": "replace", "path": "/spec/template", "value": {}}]);
    let patch = PatchRequest {
        patch_type: kubectl_rollouts::patch::PatchType::Json,
        ..PatchRequest::rollout_spec("web", operations.clone())
    };
    cluster.apply(&patch).await.expect("patch succeeds");
    let request = requests.recv().expect("one request");
    assert_eq!(request.content_type, "application/json-patch+json");
    assert!(
        request
            .path
            .starts_with("/apis/argoproj.io/v1alpha1/namespaces/shop/rollouts/web")
    );
    assert!(!request.path.contains("/status"));
    assert_eq!(request.body, operations);
}

#[tokio::test]
async fn a_missing_rollout_reads_like_kubectl() {
    let (url, _requests) = scripted_server(vec![(404, not_found())]);
    let cluster = cluster(&url).await;
    let err = cluster
        .rollout("web")
        .await
        .expect_err("the rollout is missing");
    assert_eq!(
        err.to_string(),
        "Error from server (NotFound): rollouts.argoproj.io \"web\" not found"
    );
}

#[tokio::test]
async fn no_server_at_the_address_says_so() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let cluster = cluster(&url).await;
    let err = cluster
        .rollout("web")
        .await
        .expect_err("nothing listens there")
        .to_string();
    assert!(
        err.starts_with(&format!("Unable to connect to the server {url}")),
        "{err}"
    );
    assert!(err.to_lowercase().contains("refused"), "{err}");
    assert!(err.contains("--context or --kubeconfig"), "{err}");
}

#[test]
fn promote_clears_the_step_pause_then_unpauses_the_spec() {
    let paused = rollout(
        json!({"paused": true}),
        json!({"currentStepIndex": 1, "pauseConditions": [{"reason": "CanaryPauseStep", "startTime": "2026-01-01T00:00:00Z"}]}),
    );
    let (url, requests) = scripted_server(vec![
        (200, paused.clone()),
        (200, paused.clone()),
        (200, paused),
    ]);
    let config = kubeconfig(&url, "promote");
    let (stdout, stderr, success) = plugin(&config, &["-n", "shop", "promote", "web"]);
    assert!(success, "promote failed: {stderr}");
    assert_eq!(stdout, "rollout 'web' promoted\n");
    let get = requests.recv().unwrap();
    assert_eq!(
        (
            get.method.as_str(),
            get.path
                .starts_with("/apis/argoproj.io/v1alpha1/namespaces/shop/rollouts/web")
        ),
        ("GET", true)
    );
    let status = requests.recv().unwrap();
    assert!(
        status.path.contains("/rollouts/web/status"),
        "{}",
        status.path
    );
    assert_eq!(status.body, json!({"status": {"pauseConditions": null}}));
    let spec = requests.recv().unwrap();
    assert!(!spec.path.contains("/status"), "{}", spec.path);
    assert_eq!(spec.body, json!({"spec": {"paused": false}}));
}

#[test]
fn abort_of_a_missing_rollout_fails_with_the_server_error() {
    let (url, _requests) = scripted_server(vec![(404, not_found())]);
    let config = kubeconfig(&url, "abort");
    let (stdout, stderr, success) = plugin(&config, &["abort", "web"]);
    assert!(!success);
    assert_eq!(stdout, "");
    assert_eq!(
        stderr,
        "Error from server (NotFound): rollouts.argoproj.io \"web\" not found\n"
    );
}

#[test]
fn set_image_sends_a_guarded_json_patch() {
    let mut current = rollout(json!({}), json!({}));
    current["spec"]["template"] =
        json!({"spec": {"containers": [{"name": "web", "image": "web:1"}]}});
    let (url, requests) = scripted_server(vec![(200, current.clone()), (200, current)]);
    let config = kubeconfig(&url, "set-image");
    let (stdout, stderr, success) =
        plugin(&config, &["set", "image", "web", "web=web:2", "-n", "shop"]);
    assert!(success, "set image failed: {stderr}");
    assert_eq!(stdout, "rollout \"web\" image updated\n");
    requests.recv().unwrap();
    let patch = requests.recv().unwrap();
    assert_eq!(patch.content_type, "application/json-patch+json");
    assert_eq!(
        patch.body,
        json!([
            {"op": "test", "path": "/spec/template/spec/containers/0/name", "value": "web"},
            {"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "web:2"}
        ])
    );
}

#[test]
fn an_unknown_context_lists_the_known_ones() {
    let config = kubeconfig("http://127.0.0.1:9", "context");
    let (_, stderr, success) = plugin(&config, &["--context", "prod", "pause", "web"]);
    assert!(!success);
    assert_eq!(
        stderr,
        "error: context \"prod\" does not exist in the kubeconfig (fix: pass --context with one of: sim)\n"
    );
}

#[test]
fn output_json_prints_the_stored_object() {
    let (url, _requests) =
        scripted_server(vec![(200, rollout(json!({"paused": true}), json!({})))]);
    let config = kubeconfig(&url, "output");
    let (stdout, stderr, success) = plugin(&config, &["pause", "web", "-o", "json"]);
    assert!(success, "pause failed: {stderr}");
    let printed: Value = serde_json::from_str(&stdout).expect("-o json prints JSON");
    assert_eq!(printed["metadata"]["name"], "web");
    assert_eq!(printed["spec"]["paused"], true);
}

fn replica_set(revision: &str, hash: &str, image: &str) -> Value {
    json!({
        "metadata": {
            "name": format!("web-{hash}"),
            "namespace": "shop",
            "annotations": {"rollout.argoproj.io/revision": revision},
            "ownerReferences": [{"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "name": "web", "uid": "uid-1", "controller": true}]
        },
        "spec": {
            "selector": {"matchLabels": {"app": "web", "rollouts-pod-template-hash": hash}},
            "template": {
                "metadata": {"labels": {"app": "web", "rollouts-pod-template-hash": hash}},
                "spec": {"containers": [{"name": "web", "image": image}]}
            }
        }
    })
}

#[test]
fn undo_lists_owned_replica_sets_and_restores_the_previous_template() {
    let mut current = rollout(
        json!({"selector": {"matchLabels": {"app": "web"}}}),
        json!({}),
    );
    current["spec"]["template"] = json!({
        "metadata": {"labels": {"app": "web"}},
        "spec": {"containers": [{"name": "web", "image": "web:2"}]}
    });
    let history = json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSetList",
        "metadata": {"resourceVersion": "7"},
        "items": [replica_set("1", "aaa", "web:1"), replica_set("2", "bbb", "web:2")]
    });
    let (url, requests) =
        scripted_server(vec![(200, current.clone()), (200, history), (200, current)]);
    let config = kubeconfig(&url, "undo");
    let (stdout, stderr, success) = plugin(&config, &["-n", "shop", "undo", "web"]);
    assert!(success, "undo failed: {stderr}");
    assert_eq!(stdout, "rollout 'web' rolled back to revision 1\n");
    requests.recv().unwrap();
    let list = requests.recv().unwrap();
    assert_eq!(list.method, "GET");
    assert!(
        list.path
            .starts_with("/apis/apps/v1/namespaces/shop/replicasets?")
            && list.path.contains("labelSelector=app%3Dweb"),
        "{}",
        list.path
    );
    let patch = requests.recv().unwrap();
    assert_eq!(patch.content_type, "application/json-patch+json");
    assert_eq!(
        patch.body,
        json!([{"op": "replace", "path": "/spec/template", "value": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": "web:1"}]}
        }}])
    );
}
