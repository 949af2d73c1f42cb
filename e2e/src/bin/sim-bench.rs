//! `sim-bench`: kube-sim throughput and footprint, printed as figures (not asserted):
//! objects stored per second, watch events fanned out per second, and resident memory per
//! 1,000 stored ReplicaSets.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use rollouts_e2e::sim::{SimOptions, start};
use serde_json::json;

const REPLICA_SETS: usize = 5_000;
const WATCHERS: usize = 20;
const WATCHED_OBJECTS: usize = 2_000;

/// Resident set size of this process in KiB, from /proc/self/status.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn replica_set(i: usize) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": format!("rs-{i}"), "labels": {"app": format!("app-{i}"), "rollouts-pod-template-hash": "abc123"}},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": format!("app-{i}")}},
            "template": {
                "metadata": {"labels": {"app": format!("app-{i}")}},
                "spec": {"containers": [{"name": "main", "image": "registry.example/app:1.2.3", "env": [{"name": "SIM_ERROR_RATE", "value": "0"}]}]},
            },
        },
    })
}

/// Opens a watch on ConfigMaps in `default` and counts ADDED events until `want` arrive.
fn watch_until(address: std::net::SocketAddr, want: usize) -> std::thread::JoinHandle<()> {
    let mut stream = TcpStream::connect(address).expect("connect to kube-sim");
    let request = format!(
        "GET /api/v1/namespaces/default/configmaps?watch=true&resourceVersion=0 HTTP/1.1\r\nHost: {address}\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .expect("send the watch request");
    std::thread::spawn(move || {
        let needle = br#""type":"ADDED""#;
        let mut buf = vec![0u8; 64 * 1024];
        let mut carry: Vec<u8> = Vec::new();
        let mut seen = 0;
        while seen < want {
            let n = stream.read(&mut buf).expect("read the watch stream");
            assert!(n > 0, "the watch stream ended early");
            carry.extend_from_slice(&buf[..n]);
            seen += carry.windows(needle.len()).filter(|w| w == needle).count();
            let keep = carry.len().saturating_sub(needle.len() - 1);
            carry.drain(..keep);
        }
    })
}

fn main() {
    let sim = start(SimOptions {
        event_log_capacity: 1_000,
        ..SimOptions::default()
    })
    .expect("kube-sim starts");

    let rss_before = rss_kib();
    let started = Instant::now();
    for i in 0..REPLICA_SETS {
        sim.create("default", replica_set(i))
            .expect("store a ReplicaSet");
    }
    let store_secs = started.elapsed().as_secs_f64();
    // Let the ReplicaSet controller write every status before measuring memory.
    std::thread::sleep(Duration::from_millis(500));
    let rss_after = rss_kib();
    let per_thousand_mib =
        (rss_after.saturating_sub(rss_before)) as f64 / 1024.0 / (REPLICA_SETS as f64 / 1000.0);

    let watchers: Vec<_> = (0..WATCHERS)
        .map(|_| watch_until(sim.address(), WATCHED_OBJECTS))
        .collect();
    // Each watcher's request must be registered before the writes, or it would miss some.
    let deadline = Instant::now() + Duration::from_secs(10);
    while sim.requests().iter().filter(|r| r.verb == "watch").count() < WATCHERS {
        assert!(Instant::now() < deadline, "watchers did not connect");
        std::thread::sleep(Duration::from_millis(5));
    }
    let fan_start = Instant::now();
    for i in 0..WATCHED_OBJECTS {
        sim.create("default", json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("cm-{i}")}, "data": {"i": i.to_string()}}))
            .expect("store a ConfigMap");
    }
    for w in watchers {
        w.join().expect("watcher thread");
    }
    let fan_secs = fan_start.elapsed().as_secs_f64();

    println!(
        "objects stored per second:            {:.0} ({REPLICA_SETS} ReplicaSets in {store_secs:.2} s)",
        REPLICA_SETS as f64 / store_secs
    );
    println!(
        "watch events fanned out per second:   {:.0} ({WATCHERS} watchers x {WATCHED_OBJECTS} events in {fan_secs:.2} s)",
        (WATCHERS * WATCHED_OBJECTS) as f64 / fan_secs
    );
    println!(
        "resident memory per 1,000 ReplicaSets: {per_thousand_mib:.1} MiB (VmRSS {rss_before} -> {rss_after} KiB)"
    );
}
