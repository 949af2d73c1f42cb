//! Traffic and metrics simulation: a load generator sends requests to Services through the
//! router objects in the store (nginx canary Ingresses, Istio VirtualServices, Gateway API
//! HTTPRoutes, or a Service's ready pods when no router points at it); each pod answers by its
//! `SIM_ERROR_RATE` (or `SIM_WARMUP_ERROR_RATE` in its first `SIM_WARMUP_SECONDS`) and
//! `SIM_LATENCY_MS` and "serves" Prometheus metrics for what it received, on one loopback
//! listener, with an optional file_sd target file for a real Prometheus. Requests are counted,
//! not drawn, unless noisy traffic is asked for (`noise`).
//!
//! It follows store events (no polling of lists) and makes requests on a tick. `prometheus`
//! runs a real Prometheus against it for tests.

mod cluster;
mod gateway;
mod istio;
mod load;
mod metrics;
mod nginx;
mod noise;
pub mod prometheus;
mod routes;
mod sd;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::broadcast;
use tokio::time::MissedTickBehavior;

use super::server::Sim;
use cluster::Cluster;
pub use cluster::POD_TEMPLATE_HASH_LABEL;
use load::Generator;
pub use metrics::{BUCKETS, SharedMetrics};
use noise::Noise;
pub use noise::TrafficNoise;

/// Service annotation: requests per second sent to the Service (through its router, if any).
pub const RPS_ANNOTATION: &str = "sim.rollouts.dev/rps";
/// Service annotation `"Name: value"`: a header some generated requests carry.
pub const HEADER_ANNOTATION: &str = "sim.rollouts.dev/header";
/// Service annotation: noisy traffic (default settings) drawn from this seed for the fronts
/// the Service is part of, when the simulator itself counts.
pub const TRAFFIC_SEED_ANNOTATION: &str = "sim.rollouts.dev/traffic-seed";
/// Service annotation, with the seed: sigma of each pod's log-normal factor (default 0.1).
pub const TRAFFIC_POD_SPREAD_ANNOTATION: &str = "sim.rollouts.dev/traffic-pod-spread";
/// Service annotation: the share (0..1) of requests carrying the header; 1 when absent.
pub const HEADER_SHARE_ANNOTATION: &str = "sim.rollouts.dev/header-share";
/// First-container env var: share (0..1) of requests a pod answers 500.
pub const SIM_ERROR_RATE: &str = "SIM_ERROR_RATE";
/// First-container env var: latency in milliseconds a pod's requests observe.
pub const SIM_LATENCY_MS: &str = "SIM_LATENCY_MS";
/// First-container env var: for this many seconds after the pod became Ready it answers by
/// `SIM_WARMUP_ERROR_RATE` instead of `SIM_ERROR_RATE` (a version that errs while warming up).
pub const SIM_WARMUP_SECONDS: &str = "SIM_WARMUP_SECONDS";
/// First-container env var: share (0..1) of requests answered 500 during the warm-up.
pub const SIM_WARMUP_ERROR_RATE: &str = "SIM_WARMUP_ERROR_RATE";
/// First-container env var, noisy traffic only: sigma of ln(latency) around `SIM_LATENCY_MS`.
pub const SIM_LATENCY_SPREAD: &str = "SIM_LATENCY_SPREAD";
/// First-container env var, noisy traffic only: share (0..1) of requests in the slow tail.
pub const SIM_SLOW_SHARE: &str = "SIM_SLOW_SHARE";
/// First-container env var, noisy traffic only: how many times slower a slow request is.
pub const SIM_SLOW_FACTOR: &str = "SIM_SLOW_FACTOR";

/// How the traffic simulation runs.
#[derive(Debug, Clone)]
pub struct TrafficOptions {
    /// Requests per second for every front whose Services carry no rps annotation; 0 is off.
    pub load_rps: f64,
    /// How often requests are made.
    pub tick: Duration,
    /// Write a Prometheus file_sd target file here as pods come and go.
    pub prometheus_sd_file: Option<PathBuf>,
    /// Draw arrivals, errors and latencies at random from this seed; None counts them.
    pub noise: Option<TrafficNoise>,
}

/// Runs the metrics listener and the load generator until the simulator shuts down.
pub async fn run(sim: Arc<Sim>, listener: tokio::net::TcpListener, options: TrafficOptions) {
    let metrics = SharedMetrics::default();
    let address = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("kube-sim: the metrics listener has no address: {e}");
            return;
        }
    };
    tokio::spawn(metrics::serve(
        listener,
        metrics.clone(),
        sim.shutdown.clone(),
    ));
    let (mut cluster, mut events) = {
        let state = sim.store.lock();
        (Cluster::from_state(&state), sim.store.subscribe())
    };
    let mut generator = Generator::new(options.noise.clone().map(Noise::new));
    let (mut topology_changed, mut pods_changed) = (true, true);
    let mut ticks = tokio::time::interval(options.tick);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last_tick = Instant::now();
    let mut shutdown = sim.shutdown.clone();
    loop {
        tokio::select! {
            received = events.recv() => match received {
                Ok(event) => {
                    let changed = cluster.apply_event(&event);
                    topology_changed |= changed.topology;
                    pods_changed |= changed.pod_set;
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    cluster = Cluster::from_state(&sim.store.lock());
                    (topology_changed, pods_changed) = (true, true);
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = ticks.tick() => {
                if pods_changed {
                    pods_changed = false;
                    sync_pods(&cluster, &metrics, address, options.prometheus_sd_file.as_deref());
                    generator.retain_pods(&cluster);
                }
                if topology_changed {
                    topology_changed = false;
                    generator.set_fronts(routes::fronts(&cluster));
                }
                let now = Instant::now();
                generator.tick(&mut cluster, &mut metrics.lock(), options.load_rps, now - last_tick);
                last_tick = now;
            }
            _ = shutdown.changed() => return,
        }
    }
}

/// Brings the metrics series and the file_sd file in line with the pods.
fn sync_pods(
    cluster: &Cluster,
    metrics: &SharedMetrics,
    address: SocketAddr,
    sd_file: Option<&std::path::Path>,
) {
    let pods = || {
        cluster
            .pods
            .iter()
            .map(|(key, pod)| (key, pod.template_hash.as_str()))
    };
    metrics.lock().sync_pods(pods());
    if let Some(path) = sd_file
        && let Err(e) = sd::write(path, &sd::targets(address, pods()))
    {
        eprintln!(
            "kube-sim: writing the Prometheus file_sd targets to {}: {e} (check that its directory exists and is writable)",
            path.display()
        );
    }
}
