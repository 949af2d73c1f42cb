//! Every verb that talks to a cluster, failing the three ways a user meets most: the object is
//! not there (kube-sim), the server forbids the request (a loopback stub answering 403), and no
//! server answers at all (a closed loopback port). Each error must read like kubectl's and name
//! the object.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rollouts_e2e::sim::{SimOptions, start};
use serde_json::json;

/// Each verb run against an object called `nope`, and the object its error must name.
const VERBS: &[(&[&str], &str)] = &[
    (&["get", "rollout", "nope"], "rollouts.argoproj.io \"nope\""),
    (
        &["get", "rollout", "nope", "--watch"],
        "rollouts.argoproj.io \"nope\"",
    ),
    (
        &["status", "nope", "--watch=false"],
        "rollouts.argoproj.io \"nope\"",
    ),
    (
        &["status", "nope", "--timeout", "30s"],
        "rollouts.argoproj.io \"nope\"",
    ),
    (&["promote", "nope"], "rollouts.argoproj.io \"nope\""),
    (
        &["promote", "nope", "--full"],
        "rollouts.argoproj.io \"nope\"",
    ),
    (&["abort", "nope"], "rollouts.argoproj.io \"nope\""),
    (
        &["retry", "rollout", "nope"],
        "rollouts.argoproj.io \"nope\"",
    ),
    (&["pause", "nope"], "rollouts.argoproj.io \"nope\""),
    (&["resume", "nope"], "rollouts.argoproj.io \"nope\""),
    (&["restart", "nope"], "rollouts.argoproj.io \"nope\""),
    (
        &["set", "image", "nope", "app=app:v2"],
        "rollouts.argoproj.io \"nope\"",
    ),
    (&["undo", "nope"], "rollouts.argoproj.io \"nope\""),
    (&["plan", "nope"], "rollouts.argoproj.io \"nope\""),
    (
        &["terminate", "analysisrun", "nope"],
        "analysisruns.argoproj.io \"nope\"",
    ),
    (
        &["get", "experiment", "nope"],
        "experiments.argoproj.io \"nope\"",
    ),
    (
        &["get", "experiment", "nope", "--watch"],
        "experiments.argoproj.io \"nope\"",
    ),
    (
        &["terminate", "experiment", "nope"],
        "experiments.argoproj.io \"nope\"",
    ),
    (
        &["create", "analysisrun", "--from", "nope"],
        "analysistemplates.argoproj.io \"nope\"",
    ),
    (
        &["create", "analysisrun", "--from-cluster-template", "nope"],
        "clusteranalysistemplates.argoproj.io \"nope\"",
    ),
];

/// The verbs that list rather than name one object, and the resource their errors name.
const LISTINGS: &[(&[&str], &str)] = &[
    (&["list", "rollouts"], "rollouts.argoproj.io"),
    (&["list", "rollouts", "--watch"], "rollouts.argoproj.io"),
    (&["list", "experiments"], "experiments.argoproj.io"),
];

/// A kubeconfig for `server` in its own temporary directory, removed when dropped.
struct Kubeconfig {
    dir: PathBuf,
}

impl Kubeconfig {
    fn new(label: &str, server: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "kubectl-rollouts-errors-{label}-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let text = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: test\nclusters:\n- name: test\n  cluster:\n    server: {server}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n    namespace: default\nusers:\n- name: test\n  user: {{}}\n"
        );
        std::fs::write(dir.join("kubeconfig"), text).expect("write kubeconfig");
        Self { dir }
    }

    fn path(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }
}

impl Drop for Kubeconfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs the plugin with `kubeconfig`; returns (stderr, success).
fn plugin(kubeconfig: &Path, args: &[&str]) -> (String, bool) {
    let output = Command::new(env!("CARGO_BIN_EXE_kubectl-rollouts"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("the plugin runs");
    (
        String::from_utf8_lossy(&output.stderr).into_owned(),
        output.status.success(),
    )
}

#[test]
fn a_missing_object_is_named_as_kubectl_names_it() {
    let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds/yaml");
    let sim = start(SimOptions {
        crd_dirs: vec![crds],
        pod_ready_after: Duration::from_millis(100),
        metrics_listen: None,
        ..SimOptions::default()
    })
    .expect("kube-sim starts");
    let config = Kubeconfig::new("not-found", &sim.url());
    for (args, object) in VERBS {
        let (stderr, success) = plugin(&config.path(), args);
        assert!(!success, "{args:?} succeeded on a missing object");
        assert_eq!(
            stderr,
            format!("Error from server (NotFound): {object} not found\n"),
            "{args:?}"
        );
    }
}

/// Answers every request with 403 and a Forbidden `Status` without a message, so the plugin
/// must name the object itself.
fn forbidding_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            std::thread::spawn(move || forbid_connection(stream));
        }
    });
    url
}

fn forbid_connection(stream: TcpStream) {
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut writer = stream;
    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                      "reason": "Forbidden", "code": 403})
    .to_string();
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut request_body = vec![0; length];
        if reader.read_exact(&mut request_body).is_err() {
            return;
        }
        let reply = format!(
            "HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

#[test]
fn a_forbidden_request_names_the_object() {
    let config = Kubeconfig::new("forbidden", &forbidding_server());
    for (args, object) in VERBS {
        let (stderr, success) = plugin(&config.path(), args);
        assert!(!success, "{args:?} succeeded when forbidden");
        assert_eq!(
            stderr,
            format!("Error from server (Forbidden): {object} is forbidden\n"),
            "{args:?}"
        );
    }
    for (args, resource) in LISTINGS {
        let (stderr, success) = plugin(&config.path(), args);
        assert!(!success, "{args:?} succeeded when forbidden");
        assert_eq!(
            stderr,
            format!("Error from server (Forbidden): {resource} is forbidden\n"),
            "{args:?}"
        );
    }
}

#[test]
fn no_server_reachable_says_where_and_for_what() {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
        .port();
    let config = Kubeconfig::new("unreachable", &format!("http://127.0.0.1:{port}"));
    for (args, object) in VERBS.iter().chain(LISTINGS).copied() {
        let (stderr, success) = plugin(&config.path(), args);
        assert!(!success, "{args:?} succeeded with no server");
        let expected = format!("Unable to connect to the server http://127.0.0.1:{port}/ (");
        assert!(stderr.starts_with(&expected), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!(" {object}): ")),
            "{args:?}: {stderr}"
        );
        assert!(
            stderr.to_lowercase().contains("refused"),
            "{args:?}: {stderr}"
        );
        assert!(
            stderr.contains("(fix: point --context or --kubeconfig at a reachable cluster)"),
            "{args:?}: {stderr}"
        );
    }
}
