//! Traffic and metrics simulation: load sent through each router lands on the pods in the
//! router's proportions, pods answer by their SIM_ERROR_RATE, and a real Prometheus scrapes
//! the per-pod targets kube-sim writes to its file_sd file.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{eventually_blocking, sim_with};
use rollouts_e2e::sim::traffic::TrafficNoise;
use rollouts_e2e::sim::traffic::prometheus::Prometheus;
use rollouts_e2e::sim::{SimHandle, SimOptions};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(10);
/// Requests per second the tests send: a split is measured over a few hundred requests.
const RPS: &str = "1000";
/// Requests in a measurement window.
const WINDOW: u64 = 1000;

fn traffic_sim() -> SimHandle {
    sim_with(SimOptions {
        crd_dirs: vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("crds")],
        ..SimOptions::default()
    })
}

/// GET over plain HTTP/1.0 (the server closes the connection): (status, body).
fn http_get(address: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    let (head, body) = reply.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// A request with a JSON body over plain HTTP/1.0: (status, body).
fn http_send(
    address: SocketAddr,
    method: &str,
    path: &str,
    content_type: &str,
    body: &Value,
) -> (u16, String) {
    let body = body.to_string();
    let mut stream = TcpStream::connect(address).expect("the server accepts");
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: {address}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("request sent");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).expect("reply read");
    let (head, body) = reply.split_once("\r\n\r\n").expect("a reply with a body");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status code");
    (status, body.to_string())
}

/// `http_requests_total` per (namespace, pod, template hash, code), from kube-sim's `/metrics`.
#[derive(Debug, Clone, Default)]
struct Requests(BTreeMap<(String, String, String, String), u64>);

impl Requests {
    /// The counters of one namespace's pods.
    fn scrape(sim: &SimHandle, namespace: &str) -> Requests {
        let address = sim.metrics_address().expect("the metrics listener is on");
        let (status, body) = http_get(address, "/metrics").expect("GET /metrics answers");
        assert_eq!(status, 200, "GET /metrics: {body}");
        let mut counts = BTreeMap::new();
        for line in body
            .lines()
            .filter(|l| l.starts_with("http_requests_total{"))
        {
            let (labels, value) = line
                .strip_prefix("http_requests_total{")
                .and_then(|rest| rest.rsplit_once("} "))
                .unwrap_or_else(|| panic!("malformed sample {line:?}"));
            let label = |name: &str| {
                labels
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                    .map(|v| v.trim_end_matches('"').to_string())
                    .unwrap_or_default()
            };
            if label("namespace") != namespace {
                continue;
            }
            counts.insert(
                (
                    label("namespace"),
                    label("pod"),
                    label("rollouts_pod_template_hash"),
                    label("code"),
                ),
                value.parse().expect("a counter value"),
            );
        }
        Requests(counts)
    }

    fn since(&self, earlier: &Requests) -> Requests {
        Requests(
            self.0
                .iter()
                .map(|(k, v)| (k.clone(), v - earlier.0.get(k).copied().unwrap_or(0)))
                .collect(),
        )
    }

    fn total(&self) -> u64 {
        self.0.values().sum()
    }

    fn of_hash(&self, hash: &str) -> u64 {
        self.0
            .iter()
            .filter(|((_, _, h, _), _)| h == hash)
            .map(|(_, v)| v)
            .sum()
    }

    fn errors_of_hash(&self, hash: &str) -> u64 {
        self.0
            .iter()
            .filter(|((_, _, h, code), _)| h == hash && code == "500")
            .map(|(_, v)| v)
            .sum()
    }

    /// Pods of a hash that have taken requests.
    fn pods_served(&self, hash: &str) -> usize {
        let mut pods: Vec<&String> = self
            .0
            .iter()
            .filter(|((_, _, h, _), v)| h == hash && **v > 0)
            .map(|((_, pod, _, _), _)| pod)
            .collect();
        pods.dedup();
        pods.len()
    }
}

/// Waits until the given number of pods of each hash in `namespace` have taken requests
/// (so every pod is ready and routed to), then measures a window of `WINDOW` requests.
fn measure(sim: &SimHandle, namespace: &str, pods: &[(&str, usize)]) -> Requests {
    let start = eventually_blocking("every pod taking requests", WAIT, || {
        let now = Requests::scrape(sim, namespace);
        pods.iter()
            .all(|(hash, n)| now.pods_served(hash) == *n)
            .then_some(now)
    });
    eventually_blocking("a window of requests", WAIT, || {
        let delta = Requests::scrape(sim, namespace).since(&start);
        (delta.total() >= WINDOW).then_some(delta)
    })
}

fn assert_share(window: &Requests, hash: &str, expected: f64) {
    let share = window.of_hash(hash) as f64 / window.total() as f64;
    assert!(
        (share - expected).abs() < 0.02,
        "hash {hash} took {share:.3} of the requests, expected {expected}: {window:?}"
    );
}

fn namespace(sim: &SimHandle, name: &str) {
    sim.create(
        "",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
    )
    .expect("namespace created");
}

/// A ReplicaSet of `app: web` pods with the given template hash and container env.
fn version(sim: &SimHandle, ns: &str, hash: &str, replicas: u32, env: Value) {
    let labels = json!({"app": "web", "rollouts-pod-template-hash": hash});
    sim.create(
        ns,
        json!({
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": format!("web-{hash}"), "labels": labels},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "web", "image": "web:1", "env": env}]},
                },
            },
        }),
    )
    .expect("ReplicaSet created");
}

fn service(sim: &SimHandle, ns: &str, name: &str, selector: Value, annotations: Value) {
    sim.create(
        ns,
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"selector": selector, "ports": [{"port": 80}]},
        }),
    )
    .expect("Service created");
}

/// Stable (2 pods) and canary (1 pod) versions with a Service for each.
fn stable_and_canary(sim: &SimHandle, ns: &str, stable_annotations: Value) {
    version(sim, ns, "stable", 2, json!([]));
    version(sim, ns, "canary", 1, json!([]));
    let selector = |hash: &str| json!({"app": "web", "rollouts-pod-template-hash": hash});
    service(
        sim,
        ns,
        "web-stable",
        selector("stable"),
        stable_annotations,
    );
    service(sim, ns, "web-canary", selector("canary"), json!({}));
}

#[test]
fn without_a_router_requests_spread_over_the_services_ready_pods() {
    let sim = traffic_sim();
    version(&sim, "default", "stable", 2, json!([]));
    version(
        &sim,
        "default",
        "canary",
        1,
        json!([{"name": "SIM_ERROR_RATE", "value": "0.5"}, {"name": "SIM_LATENCY_MS", "value": "30"}]),
    );
    // Selected by the Service, but never ready: it must get nothing.
    let labels = json!({"app": "web", "rollouts-pod-template-hash": "unready"});
    sim.create(
        "default",
        json!({
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": "web-unready"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels, "annotations": {"sim.rollouts.dev/never-ready": "true"}},
                    "spec": {"containers": [{"name": "web", "image": "web:2"}]},
                },
            },
        }),
    )
    .expect("ReplicaSet created");
    service(
        &sim,
        "default",
        "web",
        json!({"app": "web"}),
        json!({"sim.rollouts.dev/rps": RPS}),
    );
    let window = measure(&sim, "default", &[("stable", 2), ("canary", 1)]);
    assert_share(&window, "canary", 1.0 / 3.0);
    assert_eq!(window.of_hash("unready"), 0, "unready pods get no traffic");
    assert!(
        window.0.keys().any(|(_, _, hash, _)| hash == "unready"),
        "the unready pod still serves its (zero) counters: {window:?}"
    );
    assert_eq!(window.errors_of_hash("stable"), 0, "{window:?}");
    let (canary, errors) = (window.of_hash("canary"), window.errors_of_hash("canary"));
    assert!(
        errors.abs_diff(canary / 2) <= 1,
        "the canary answered {errors} of {canary} requests with 500, expected half"
    );
    let address = sim.metrics_address().expect("metrics are on");
    let (_, text) = http_get(address, "/metrics").expect("GET /metrics answers");
    let bucket = |hash: &str, le: &str| -> u64 {
        text.lines()
            .filter(|l| {
                l.starts_with("http_request_duration_seconds_bucket{")
                    && l.contains(&format!("rollouts_pod_template_hash=\"{hash}\""))
                    && l.contains(&format!("le=\"{le}\""))
            })
            .map(|l| {
                l.rsplit_once(' ')
                    .and_then(|(_, v)| v.parse::<u64>().ok())
                    .unwrap_or(0)
            })
            .sum()
    };
    assert_eq!(
        bucket("canary", "0.025"),
        0,
        "30 ms is above the 25 ms bucket"
    );
    let canary_all = bucket("canary", "+Inf");
    assert!(canary_all > 0, "the canary's histogram counts its requests");
    assert_eq!(
        bucket("canary", "0.05"),
        canary_all,
        "30 ms is within the 50 ms bucket"
    );
    assert!(bucket("stable", "0.005") > 0, "0 ms is within every bucket");
}

#[test]
fn nginx_canary_ingress_takes_its_weight_and_header_requests() {
    let sim = traffic_sim();
    let ingress = |name: &str, backend: &str, annotations: Value| {
        json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "Ingress",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"ingressClassName": "nginx", "rules": [{"host": "web.example", "http": {"paths": [
                {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": backend, "port": {"number": 80}}}}
            ]}}]},
        })
    };
    // Weight 20: a fifth of the requests go to the canary.
    stable_and_canary(&sim, "default", json!({"sim.rollouts.dev/rps": RPS}));
    sim.create("default", ingress("web", "web-stable", json!({})))
        .expect("Ingress created");
    sim.create(
        "default",
        ingress(
            "web-web-canary",
            "web-canary",
            json!({"nginx.ingress.kubernetes.io/canary": "true", "nginx.ingress.kubernetes.io/canary-weight": "20"}),
        ),
    )
    .expect("canary Ingress created");
    let window = measure(&sim, "default", &[("stable", 2), ("canary", 1)]);
    assert_share(&window, "canary", 0.2);

    // The controller moves the weight: the split follows.
    let (status, reply) = http_send(
        sim.address(),
        "PATCH",
        "/apis/networking.k8s.io/v1/namespaces/default/ingresses/web-web-canary",
        "application/merge-patch+json",
        &json!({"metadata": {"annotations": {"nginx.ingress.kubernetes.io/canary-weight": "50"}}}),
    );
    assert_eq!(status, 200, "{reply}");
    eventually_blocking("the split to follow the new weight", WAIT, || {
        let start = Requests::scrape(&sim, "default");
        let window = eventually_blocking("a window of requests", WAIT, || {
            let delta = Requests::scrape(&sim, "default").since(&start);
            (delta.total() >= WINDOW / 2).then_some(delta)
        });
        let share = window.of_hash("canary") as f64 / window.total() as f64;
        ((share - 0.5).abs() < 0.02).then_some(())
    });

    // Weight 0 and a header rule (another annotation prefix): only header-bearing requests.
    namespace(&sim, "by-header");
    stable_and_canary(
        &sim,
        "by-header",
        json!({"sim.rollouts.dev/rps": RPS, "sim.rollouts.dev/header": "X-Canary: always", "sim.rollouts.dev/header-share": "0.1"}),
    );
    sim.create("by-header", ingress("web", "web-stable", json!({})))
        .expect("Ingress created");
    sim.create(
        "by-header",
        ingress(
            "web-canary",
            "web-canary",
            json!({"custom.nginx/canary": "true", "custom.nginx/canary-weight": "0", "custom.nginx/canary-by-header": "X-Canary"}),
        ),
    )
    .expect("canary Ingress created");
    let window = measure(&sim, "by-header", &[("stable", 2), ("canary", 1)]);
    assert_share(&window, "canary", 0.1);
}

#[test]
fn istio_virtual_service_splits_by_destination_weight_and_subset() {
    let sim = traffic_sim();
    // By host: the stable and canary Services at 70/30.
    stable_and_canary(&sim, "default", json!({"sim.rollouts.dev/rps": RPS}));
    sim.create(
        "default",
        json!({
            "apiVersion": "networking.istio.io/v1beta1",
            "kind": "VirtualService",
            "metadata": {"name": "web"},
            "spec": {"hosts": ["web.example"], "http": [{"name": "primary", "route": [
                {"destination": {"host": "web-stable"}, "weight": 70},
                {"destination": {"host": "web-canary"}, "weight": 30},
            ]}]},
        }),
    )
    .expect("VirtualService created");
    let window = measure(&sim, "default", &[("stable", 2), ("canary", 1)]);
    assert_share(&window, "canary", 0.3);

    // By subset of one Service, with a header route first that sends every request carrying
    // the header to the canary: 50% with the header + 30% of the other half.
    namespace(&sim, "subsets");
    version(&sim, "subsets", "stable", 2, json!([]));
    version(&sim, "subsets", "canary", 1, json!([]));
    service(
        &sim,
        "subsets",
        "web",
        json!({"app": "web"}),
        json!({"sim.rollouts.dev/rps": RPS, "sim.rollouts.dev/header": "X-Canary: yes", "sim.rollouts.dev/header-share": "0.5"}),
    );
    sim.create(
        "subsets",
        json!({
            "apiVersion": "networking.istio.io/v1",
            "kind": "DestinationRule",
            "metadata": {"name": "web"},
            "spec": {"host": "web.subsets.svc.cluster.local", "subsets": [
                {"name": "stable", "labels": {"rollouts-pod-template-hash": "stable"}},
                {"name": "canary", "labels": {"rollouts-pod-template-hash": "canary"}},
            ]},
        }),
    )
    .expect("DestinationRule created");
    sim.create(
        "subsets",
        json!({
            "apiVersion": "networking.istio.io/v1",
            "kind": "VirtualService",
            "metadata": {"name": "web"},
            "spec": {"hosts": ["web"], "http": [
                {"name": "header", "match": [{"headers": {"x-canary": {"exact": "yes"}}}],
                 "route": [{"destination": {"host": "web", "subset": "canary"}}]},
                {"name": "primary", "route": [
                    {"destination": {"host": "web", "subset": "stable"}, "weight": 70},
                    {"destination": {"host": "web", "subset": "canary"}, "weight": 30},
                ]},
            ]},
        }),
    )
    .expect("VirtualService created");
    let window = measure(&sim, "subsets", &[("stable", 2), ("canary", 1)]);
    assert_share(&window, "canary", 0.5 + 0.5 * 0.3);

    // Mirroring: every request to stable, a copy of half of them to the canary.
    namespace(&sim, "mirror");
    stable_and_canary(&sim, "mirror", json!({"sim.rollouts.dev/rps": RPS}));
    sim.create(
        "mirror",
        json!({
            "apiVersion": "networking.istio.io/v1beta1",
            "kind": "VirtualService",
            "metadata": {"name": "web"},
            "spec": {"hosts": ["web.example"], "http": [{"name": "primary",
                "route": [{"destination": {"host": "web-stable"}, "weight": 100}],
                "mirror": {"host": "web-canary"}, "mirrorPercentage": {"value": 50.0},
            }]},
        }),
    )
    .expect("VirtualService created");
    let window = measure(&sim, "mirror", &[("stable", 2), ("canary", 1)]);
    assert_share(&window, "canary", 0.5 / 1.5);
}

#[test]
fn gateway_api_http_route_splits_by_backend_ref_weight() {
    let sim = traffic_sim();
    stable_and_canary(&sim, "default", json!({"sim.rollouts.dev/rps": RPS}));
    sim.create(
        "default",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": {"name": "web"},
            "spec": {"parentRefs": [{"name": "gateway"}], "rules": [{"backendRefs": [
                {"name": "web-stable", "port": 80, "weight": 90},
                {"name": "web-canary", "port": 80, "weight": 10},
            ]}]},
        }),
    )
    .expect("HTTPRoute created");
    let window = measure(&sim, "default", &[("stable", 2), ("canary", 1)]);
    assert_share(&window, "canary", 0.1);
}

#[test]
fn the_load_rps_option_feeds_every_service_without_an_rps_annotation() {
    let sim = sim_with(SimOptions {
        load_rps: 500.0,
        ..SimOptions::default()
    });
    version(&sim, "default", "stable", 2, json!([]));
    version(&sim, "default", "canary", 1, json!([]));
    let selector = |hash: &str| json!({"app": "web", "rollouts-pod-template-hash": hash});
    service(&sim, "default", "web-stable", selector("stable"), json!({}));
    // An annotation overrides the option, here to send nothing.
    service(
        &sim,
        "default",
        "web-canary",
        selector("canary"),
        json!({"sim.rollouts.dev/rps": "0"}),
    );
    let window = measure(&sim, "default", &[("stable", 2)]);
    assert_eq!(window.of_hash("canary"), 0, "{window:?}");
}

/// Cumulative `http_request_duration_seconds_bucket` counts of a hash, by `le` bound as text.
fn latency_buckets(sim: &SimHandle, hash: &str) -> BTreeMap<String, u64> {
    let address = sim.metrics_address().expect("the metrics listener is on");
    let (_, body) = http_get(address, "/metrics").expect("GET /metrics answers");
    let mut buckets = BTreeMap::new();
    for line in body.lines().filter(|l| {
        l.starts_with("http_request_duration_seconds_bucket{")
            && l.contains(&format!("rollouts_pod_template_hash=\"{hash}\""))
    }) {
        let (labels, value) = line.rsplit_once("} ").expect("a sample");
        let le = labels
            .rsplit_once("le=\"")
            .map(|(_, v)| v.trim_end_matches('"').to_string())
            .expect("an le label");
        let count: u64 = value.parse().expect("a bucket count");
        *buckets.entry(le).or_default() += count;
    }
    buckets
}

/// A release erring 10% with latencies around 100 ms (sigma 0.5) behind one Service with
/// `annotations`; checks the errors and latencies were drawn, not counted.
fn assert_noisy(sim: &SimHandle, annotations: Value) {
    version(
        sim,
        "default",
        "noisy",
        2,
        json!([
            {"name": "SIM_ERROR_RATE", "value": "0.1"},
            {"name": "SIM_LATENCY_MS", "value": "100"},
            {"name": "SIM_LATENCY_SPREAD", "value": "0.5"},
        ]),
    );
    let selector = json!({"app": "web", "rollouts-pod-template-hash": "noisy"});
    service(sim, "default", "web", selector, annotations);
    let window = measure(sim, "default", &[("noisy", 2)]);
    let share = window.errors_of_hash("noisy") as f64 / window.of_hash("noisy") as f64;
    // 10% of about 1,000 requests: a standard deviation of 1%, pods' factors add about as much.
    assert!(
        (0.05..0.15).contains(&share),
        "error share {share}: {window:?}"
    );
    // ln(latency) ~ N(ln 0.1, 0.5): about 8% under 50 ms, half under 100 ms, 97% under 250 ms.
    let buckets = latency_buckets(sim, "noisy");
    let total = buckets["+Inf"] as f64;
    let under = |le: &str| buckets[le] as f64 / total;
    assert!(under("0.05") > 0.02 && under("0.05") < 0.2, "{buckets:?}");
    assert!(under("0.1") > 0.35 && under("0.1") < 0.65, "{buckets:?}");
    assert!(under("0.25") > 0.9 && under("0.25") < 1.0, "{buckets:?}");
}

#[test]
fn noisy_traffic_draws_errors_and_log_normal_latencies_from_its_seed() {
    let sim = sim_with(SimOptions {
        load_rps: 2000.0,
        traffic_noise: Some(TrafficNoise {
            seed: 7,
            ..TrafficNoise::default()
        }),
        ..SimOptions::default()
    });
    assert_noisy(&sim, json!({}));
}

#[test]
fn a_service_annotation_asks_for_noisy_traffic_on_its_front() {
    let sim = traffic_sim();
    assert_noisy(
        &sim,
        json!({"sim.rollouts.dev/rps": "2000", "sim.rollouts.dev/traffic-seed": "3"}),
    );
}

#[test]
fn the_kube_sim_binary_serves_metrics_and_writes_file_sd_targets() {
    let dir = TempDir::new("binary");
    let sd_file = dir.0.join("targets.json");
    let child = Command::new(env!("CARGO_BIN_EXE_kube-sim"))
        .args(["--listen", "127.0.0.1:0", "--load-rps", "100"])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .arg(format!("--prometheus-sd-file={}", sd_file.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kube-sim starts");
    let mut sim = KillOnDrop(child);
    let api: SocketAddr = first_line(sim.0.stdout.as_mut().expect("piped stdout"), "")
        .parse()
        .expect("the bound address first on stdout");
    let metrics: SocketAddr = first_line(
        sim.0.stderr.as_mut().expect("piped stderr"),
        "kube-sim: pod metrics at ",
    )
    .trim_start_matches("http://")
    .trim_end_matches("/metrics")
    .parse()
    .expect("the metrics address on stderr");
    let labels = json!({"app": "web"});
    let rs = json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "web"},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "web", "image": "web:1"}]}}},
    });
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {"selector": labels}});
    for (path, body) in [
        ("/apis/apps/v1/namespaces/default/replicasets", rs),
        ("/api/v1/namespaces/default/services", svc),
    ] {
        let (status, reply) = http_send(api, "POST", path, "application/json", &body);
        assert_eq!(status, 201, "{reply}");
    }
    eventually_blocking("the pod's requests on --metrics-listen", WAIT, || {
        let (_, text) = http_get(metrics, "/metrics")?;
        text.lines()
            .any(|l| {
                l.starts_with("http_requests_total{namespace=\"default\",pod=\"web-")
                    && l.contains("code=\"200\"")
                    && !l.ends_with(" 0")
            })
            .then_some(())
    });
    let targets: Value =
        serde_json::from_str(&std::fs::read_to_string(&sd_file).expect("the file_sd file"))
            .expect("JSON targets");
    let path = targets[0]["labels"]["__metrics_path__"]
        .as_str()
        .expect("a per-pod path");
    let (status, own) = http_get(metrics, path).expect("the pod's own page answers");
    assert_eq!(status, 200);
    assert!(own.contains("http_requests_total{code=\"200\"}"), "{own}");
}

/// The rest of the first line read from `from` that starts with `prefix`.
fn first_line(from: &mut impl Read, prefix: &str) -> String {
    loop {
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while from.read(&mut byte).expect("reading the child's output") == 1 && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        assert!(
            !line.is_empty(),
            "the child's output ended before a line starting {prefix:?}"
        );
        let line = String::from_utf8_lossy(&line).into_owned();
        if let Some(rest) = line.strip_prefix(prefix) {
            return rest.trim().to_string();
        }
    }
}

/// A process killed when the test ends, pass or fail.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // Already exited is fine: there is nothing left to stop.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A directory removed when the test ends.
struct TempDir(PathBuf);

impl TempDir {
    fn new(label: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let path =
            std::env::temp_dir().join(format!("kube-sim-{label}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&path).expect("a temp dir");
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // Best effort: a leftover temp dir harms nothing.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An instant query's vector as (value of label `by`, sample value).
fn query(prometheus: &Prometheus, promql: &str, by: &str) -> Option<BTreeMap<String, f64>> {
    prometheus
        .query(promql)?
        .as_array()?
        .iter()
        .map(|sample| {
            let key = sample["metric"][by]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let value = sample["value"][1].as_str()?.parse().ok()?;
            Some((key, value))
        })
        .collect()
}

#[test]
fn a_real_prometheus_scrapes_the_pods_through_file_sd() {
    let dir = TempDir::new("prometheus");
    let sd_file = dir.0.join("targets.json");
    let sim = sim_with(SimOptions {
        prometheus_sd_file: Some(sd_file.clone()),
        ..SimOptions::default()
    });
    version(&sim, "default", "stable", 2, json!([]));
    version(
        &sim,
        "default",
        "canary",
        1,
        json!([{"name": "SIM_ERROR_RATE", "value": "0.5"}]),
    );
    service(
        &sim,
        "default",
        "web",
        json!({"app": "web"}),
        json!({"sim.rollouts.dev/rps": "300"}),
    );
    eventually_blocking("three pod targets in the file_sd file", WAIT, || {
        let text = std::fs::read_to_string(&sd_file).ok()?;
        let targets: Value = serde_json::from_str(&text).ok()?;
        (targets.as_array()?.len() == 3).then_some(())
    });

    let prometheus = Prometheus::start(&sd_file).unwrap_or_else(|e| panic!("{e}"));
    let deadline = Duration::from_secs(30);
    eventually_blocking("http_requests_total in Prometheus", deadline, || {
        let series = query(&prometheus, "count(http_requests_total)", "")?;
        (series.values().next().copied()? >= 6.0).then_some(())
    });
    // Rates are exact once every pod's series is older than the rate's window.
    eventually_blocking("every pod scraped several times", deadline, || {
        let samples = query(
            &prometheus,
            "min(count_over_time(http_requests_total[8s])) and on() count(http_requests_total) == 6",
            "",
        )?;
        (samples.values().next().copied()? >= 7.0).then_some(())
    });
    let rates = query(
        &prometheus,
        "sum by (rollouts_pod_template_hash) (rate(http_requests_total[5s]))",
        "rollouts_pod_template_hash",
    )
    .expect("the rate query answers");
    let (stable, canary) = (rates["stable"], rates["canary"]);
    let share = canary / (stable + canary);
    assert!(
        (0.29..0.38).contains(&share),
        "the canary's 1 of 3 pods took {share:.2} of the request rate: {rates:?}\n{}",
        prometheus.log()
    );
    let errors = eventually_blocking("a 500 rate for the canary", deadline, || {
        let errors = query(
            &prometheus,
            "sum by (rollouts_pod_template_hash) (rate(http_requests_total{code=\"500\"}[5s]))",
            "rollouts_pod_template_hash",
        )?;
        errors
            .get("canary")
            .copied()
            .filter(|r| *r > 0.0)
            .map(|r| (r, errors))
    });
    assert_eq!(
        errors.1.get("stable").copied().unwrap_or(0.0),
        0.0,
        "stable pods answer no 500s"
    );
    let error_share = errors.0 / canary;
    assert!(
        (0.45..0.55).contains(&error_share),
        "the canary answers half its requests with 500, Prometheus says {error_share:.2}"
    );
}
