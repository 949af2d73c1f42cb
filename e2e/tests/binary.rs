//! The `kube-sim` binary: prints its address, writes a kubeconfig, loads CRDs from a
//! directory, logs requests to a file, and serves until killed.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

use common::widget_crd;

/// A plain HTTP/1.1 GET; returns the status line and the body.
fn http_get(address: &str, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(address).expect("connect");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {address}\r\nUser-Agent: binary-test\r\nConnection: close\r\n\r\n").expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    let (head, body) = response.split_once("\r\n\r\n").expect("headers end");
    (
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    )
}

#[test]
fn kube_sim_binary_serves_crds_from_a_directory() {
    let dir = std::env::temp_dir().join(format!("kube-sim-binary-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("crds")).expect("temp dir");
    let yaml = format!(
        "# widgets\n---\n{}\n",
        serde_json::to_string(&widget_crd()).expect("json")
    );
    std::fs::write(dir.join("crds").join("widgets.yaml"), yaml).expect("write CRD");
    let kubeconfig = dir.join("kubeconfig");
    let log = dir.join("requests.jsonl");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kube-sim"))
        .args(["--listen", "127.0.0.1:0", "--crds"])
        .arg(dir.join("crds"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--request-log")
        .arg(&log)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kube-sim starts");
    let mut address = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut address)
        .expect("the address line");
    let address = address.trim().to_string();
    assert!(address.starts_with("127.0.0.1:"), "{address}");
    let config = std::fs::read_to_string(&kubeconfig)
        .expect("kubeconfig written before the address is printed");
    assert!(
        config.contains(&format!("server: http://{address}"))
            && config.contains("namespace: default")
    );

    let (status, body) = http_get(&address, "/apis/example.com/v1");
    assert!(status.contains("200"), "{status}");
    assert!(
        body.contains("\"widgets/status\"") && body.contains("\"widgets/scale\""),
        "{body}"
    );
    let (status, body) = http_get(&address, "/api/v1/namespaces/default");
    assert!(
        status.contains("200") && body.contains("\"Active\""),
        "{status} {body}"
    );

    child.kill().expect("stop kube-sim");
    child.wait().expect("reap kube-sim");
    let lines = std::fs::read_to_string(&log).expect("request log");
    let records: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(records.len(), 2);
    assert_eq!(records[1]["verb"], "get");
    assert_eq!(records[1]["resource"], "namespaces");
    assert_eq!(records[1]["name"], "default");
    assert_eq!(records[1]["user_agent"], "binary-test");
    // Leftovers in the temp dir are harmless if removal fails.
    let _ = std::fs::remove_dir_all(&dir);
}
