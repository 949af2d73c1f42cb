//! `kube-sim`: serves the Kubernetes API simulator until killed.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use rollouts_e2e::sim::faults::{Hold, RandomFaults, WriteCut};
use rollouts_e2e::sim::traffic::TrafficNoise;
use rollouts_e2e::sim::{Faults, PodReadiness, SimOptions, start};

/// A Kubernetes API server and workload simulator on a loopback port.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Address to listen on; port 0 picks a free one. The bound address is printed on stdout.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: std::net::SocketAddr,
    /// Write a kubeconfig for this server here (context kube-sim, namespace default, no auth).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Create every CRD in this directory at start (repeatable).
    #[arg(long = "crds")]
    crds: Vec<PathBuf>,
    /// Append every request served to this file as JSON lines.
    #[arg(long)]
    request_log: Option<PathBuf>,
    /// Share of requests (0..1) answered 500 InternalError.
    #[arg(long, default_value_t = 0.0)]
    error_rate: f64,
    /// Share of writes (0..1) answered 409 Conflict.
    #[arg(long, default_value_t = 0.0)]
    conflict_rate: f64,
    /// End every watch stream after this many events.
    #[arg(long)]
    watch_cut_after: Option<u64>,
    /// Milliseconds added to every resource request.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Hold every request on this resource, written RESOURCE[.GROUP] (leases.coordination.k8s.io):
    /// never answered, or answered after --hold-for-ms (repeatable).
    #[arg(long = "hold", value_parser = Hold::parse)]
    holds: Vec<Hold>,
    /// Answer held requests after this many milliseconds instead of never.
    #[arg(long)]
    hold_for_ms: Option<u64>,
    /// Stop serving the controller after this many of its writes: every further request from
    /// a client whose User-Agent starts with --cut-user-agent is answered 500.
    #[arg(long)]
    cut_after_writes: Option<u64>,
    /// The User-Agent prefix --cut-after-writes applies to.
    #[arg(long, default_value = "rollouts-controller/")]
    cut_user_agent: String,
    /// Seed of the generator random faults are drawn from (printed at start; random when absent).
    #[arg(long)]
    fault_seed: Option<u64>,
    /// Share of requests (0..1) answered 429 TooManyRequests with a Retry-After header.
    #[arg(long, default_value_t = 0.0)]
    too_many_rate: f64,
    /// The Retry-After of those 429s, in seconds.
    #[arg(long, default_value_t = 1)]
    retry_after_seconds: u64,
    /// Cut every watch stream at a random moment between half this many milliseconds and all.
    #[arg(long)]
    watch_cut_within_ms: Option<u64>,
    /// Share of watches resuming from a resourceVersion (0..1) answered 410 Expired (a relist).
    #[arg(long, default_value_t = 0.0)]
    gone_rate: f64,
    /// Share of requests (0..1) delayed by --spike-ms more.
    #[arg(long, default_value_t = 0.0)]
    spike_rate: f64,
    /// The latency spike, in milliseconds.
    #[arg(long, default_value_t = 200)]
    spike_ms: u64,
    /// Milliseconds a pod takes to become Ready (template annotation sim.rollouts.dev/ready-after overrides).
    #[arg(long, default_value_t = 1000)]
    pod_ready_after_ms: u64,
    /// Per-pod random readiness: each pod becomes Ready after its own delay between
    /// --pod-ready-min-ms and --pod-ready-max-ms, drawn from this seed (replaces
    /// --pod-ready-after-ms; template annotations still win).
    #[arg(long)]
    pod_ready_seed: Option<u64>,
    /// Per-pod random readiness: the shortest delay, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pod_ready_min_ms: u64,
    /// Per-pod random readiness: the longest delay, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pod_ready_max_ms: u64,
    /// Per-pod random readiness: share of pods (0..1) whose first start fails (Running, not
    /// Ready, one restart), Ready after a second draw.
    #[arg(long, default_value_t = 0.0)]
    pod_fail_share: f64,
    /// Events retained for watches to resume from.
    #[arg(long, default_value_t = 10_000)]
    event_log_capacity: usize,
    /// Where the simulated pods' Prometheus metrics are served (GET /metrics); port 0 picks one.
    #[arg(long, default_value = "127.0.0.1:0")]
    metrics_listen: std::net::SocketAddr,
    /// Requests per second sent to every Service without a sim.rollouts.dev/rps annotation, through its router.
    #[arg(long, default_value_t = 0.0)]
    load_rps: f64,
    /// Write a Prometheus file_sd target file here (one target per pod) as pods come and go.
    #[arg(long)]
    prometheus_sd_file: Option<PathBuf>,
    /// Noisy traffic: draw request arrivals (Poisson), errors (each with its pod's error rate)
    /// and latencies (log-normal) from this seed instead of counting them.
    #[arg(long)]
    traffic_seed: Option<u64>,
    /// Noisy traffic: sigma of each pod's log-normal factor on its error rate and latency.
    #[arg(long, default_value_t = 0.1)]
    traffic_pod_spread: f64,
    /// Noisy traffic: relative amplitude (0..1) of the load's sine swing.
    #[arg(long, default_value_t = 0.2)]
    traffic_load_swing: f64,
    /// Noisy traffic: period of the load's swing, in seconds.
    #[arg(long, default_value_t = 120)]
    traffic_load_period_seconds: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    for (flag, rate) in [
        ("--error-rate", args.error_rate),
        ("--conflict-rate", args.conflict_rate),
        ("--too-many-rate", args.too_many_rate),
        ("--gone-rate", args.gone_rate),
        ("--spike-rate", args.spike_rate),
        ("--pod-fail-share", args.pod_fail_share),
    ] {
        if !(0.0..=1.0).contains(&rate) {
            eprintln!("kube-sim: {flag} {rate}: must be between 0 and 1");
            return ExitCode::from(2);
        }
    }
    if !(args.load_rps >= 0.0 && args.load_rps.is_finite()) {
        eprintln!(
            "kube-sim: --load-rps {}: must be a non-negative number of requests per second",
            args.load_rps
        );
        return ExitCode::from(2);
    }
    let traffic_noise = args.traffic_seed.map(|seed| TrafficNoise {
        seed,
        pod_spread: args.traffic_pod_spread,
        load_swing: args.traffic_load_swing,
        load_period: Duration::from_secs(args.traffic_load_period_seconds),
    });
    if let Some(Err(e)) = traffic_noise.as_ref().map(TrafficNoise::validate) {
        eprintln!("kube-sim: {e}");
        return ExitCode::from(2);
    }
    let pod_readiness = args.pod_ready_seed.map(|seed| PodReadiness {
        seed,
        min: Duration::from_millis(args.pod_ready_min_ms),
        max: Duration::from_millis(args.pod_ready_max_ms),
        fail_share: args.pod_fail_share,
    });
    if let Some(Err(e)) = pod_readiness.as_ref().map(PodReadiness::validate) {
        eprintln!("kube-sim: {e} (--pod-ready-min-ms, --pod-ready-max-ms, --pod-fail-share)");
        return ExitCode::from(2);
    }
    let options = SimOptions {
        listen: args.listen,
        crd_dirs: args.crds,
        faults: Faults {
            error_rate: args.error_rate,
            conflict_rate: args.conflict_rate,
            watch_cut_after: args.watch_cut_after,
            latency: Duration::from_millis(args.latency_ms),
            holds: args
                .holds
                .into_iter()
                .map(|hold| match args.hold_for_ms {
                    Some(ms) => hold.after(Duration::from_millis(ms)),
                    None => hold,
                })
                .collect(),
            random: RandomFaults {
                seed: args.fault_seed,
                too_many_rate: args.too_many_rate,
                retry_after_seconds: args.retry_after_seconds,
                watch_cut_within: args.watch_cut_within_ms.map(Duration::from_millis),
                gone_rate: args.gone_rate,
                spike_rate: args.spike_rate,
                spike: Duration::from_millis(args.spike_ms),
            },
            write_cut: args.cut_after_writes.map(|after_writes| WriteCut {
                user_agent_prefix: args.cut_user_agent.clone(),
                after_writes,
            }),
            forbidden: Vec::new(),
        },
        request_log_file: args.request_log,
        event_log_capacity: args.event_log_capacity,
        pod_ready_after: Duration::from_millis(args.pod_ready_after_ms),
        pod_readiness,
        metrics_listen: Some(args.metrics_listen),
        load_rps: args.load_rps,
        prometheus_sd_file: args.prometheus_sd_file,
        traffic_noise,
        ..SimOptions::default()
    };
    let sim = match start(options) {
        Ok(sim) => sim,
        Err(e) => {
            eprintln!("kube-sim: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(path) = &args.kubeconfig
        && let Err(e) = sim.write_kubeconfig(path)
    {
        eprintln!("kube-sim: --kubeconfig {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    println!("{}", sim.address());
    eprintln!("kube-sim: serving {}", sim.url());
    if let Some(metrics) = sim.metrics_address() {
        eprintln!("kube-sim: pod metrics at http://{metrics}/metrics");
    }
    eprintln!("kube-sim: fault seed {}", sim.fault_seed());
    if let Err(e) = sim.wait_for_signal() {
        eprintln!("kube-sim: waiting for a signal: {e}");
        return ExitCode::FAILURE;
    }
    eprintln!(
        "kube-sim: faults injected (seed {}): {}",
        sim.fault_seed(),
        sim.fault_counts()
    );
    ExitCode::SUCCESS
}
