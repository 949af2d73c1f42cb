//! Command-line flags of `rollouts-controller` and what follows from them: the label selector
//! that scopes this instance to its Rollouts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use rollouts_crds::rollout::CONTROLLER_INSTANCE_ID_LABEL_KEY;

/// Default name of the leader-election Lease.
pub const DEFAULT_LEASE_NAME: &str = "rollouts-controller-lock";

/// Default of `--analysis-max-response-bytes`: 10 MiB.
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 10 * 1024 * 1024;
/// Largest `--analysis-max-response-bytes`: 1 GiB.
pub const MAX_RESPONSE_BYTES: u64 = 1024 * 1024 * 1024;
/// Default of `--analysis-measurement-concurrency`.
pub const DEFAULT_MEASUREMENT_CONCURRENCY: u16 =
    crate::analysisrun::bounds::DEFAULT_MEASUREMENT_CONCURRENCY;

/// Defaults of the concurrency flags: Argo's (DefaultRolloutThreads, DefaultExperimentThreads,
/// DefaultAnalysisThreads in controller/controller.go).
pub const DEFAULT_ROLLOUT_THREADS: u16 = 10;
pub const DEFAULT_EXPERIMENT_THREADS: u16 = 10;
pub const DEFAULT_ANALYSIS_THREADS: u16 = 30;
/// Defaults of the client rate limit: ten times Argo's (DefaultQPS 40, DefaultBurst 80). Argo
/// reads Services and router objects from informers; we read them fresh in each reconcile, and
/// measured 10,000 Rollouts releasing 1% a minute need a few hundred requests a second. Below
/// that, every release's first write queues behind the others' (docs/scale.md).
pub const DEFAULT_QPS: f64 = 400.0;
pub const DEFAULT_BURST: u32 = 800;

/// A progressive delivery controller for Argo Rollouts' `Rollout` kind.
#[derive(Clone, Debug, Parser)]
#[command(name = "rollouts-controller", version, about)]
pub struct Flags {
    /// Only watch Rollouts in this namespace (default: all namespaces).
    #[arg(long, env = "ROLLOUTS_NAMESPACE")]
    pub namespace: Option<String>,

    /// Only reconcile Rollouts labelled argo-rollouts.argoproj.io/controller-instance-id=ID;
    /// without it, only Rollouts without that label.
    #[arg(long, value_parser = parse_instance_id)]
    pub instance_id: Option<String>,

    /// How many Rollouts are reconciled at the same time (Argo's --rollout-threads, default 10
    /// there too; --concurrency is the former name).
    #[arg(long, alias = "concurrency", default_value_t = DEFAULT_ROLLOUT_THREADS, value_parser = clap::value_parser!(u16).range(1..))]
    pub rollout_threads: u16,

    /// How many Experiments are reconciled at the same time (Argo's --experiment-threads,
    /// default 10 there too).
    #[arg(long, default_value_t = DEFAULT_EXPERIMENT_THREADS, value_parser = clap::value_parser!(u16).range(1..))]
    pub experiment_threads: u16,

    /// How many AnalysisRuns are reconciled at the same time (Argo's default: 30); never fewer
    /// than --analysis-measurement-concurrency, as a run waiting for a measurement slot holds one.
    #[arg(long, default_value_t = DEFAULT_ANALYSIS_THREADS, value_parser = clap::value_parser!(u16).range(1..))]
    pub analysis_threads: u16,

    /// Requests per second the controller sends the API server at most, on average
    /// (client-side token bucket; Argo's default is 40, see docs/scale.md for ours).
    #[arg(long, default_value_t = DEFAULT_QPS, value_parser = parse_qps)]
    pub qps: f64,

    /// Requests the controller may send at once above --qps after a quiet spell (Argo's
    /// default is 80).
    #[arg(long, default_value_t = DEFAULT_BURST, value_parser = clap::value_parser!(u32).range(1..))]
    pub burst: u32,

    /// Run only while holding the leader Lease, so that one replica acts at a time.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub leader_elect: bool,

    /// Namespace of the leader Lease (default: the kubeconfig's or the pod's namespace).
    #[arg(long)]
    pub leader_election_namespace: Option<String>,

    /// Name of the leader Lease.
    #[arg(long, default_value = DEFAULT_LEASE_NAME)]
    pub lease_name: String,

    /// How long a Lease stays valid without renewal before another replica takes over (e.g.
    /// 15s). The leader renews every 2/15 of it and stops acting when it could not renew for
    /// 2/3 of it (15s: every 2s, within 10s, as client-go); each Lease request times out after
    /// 1/3 of it.
    #[arg(long, default_value = "15s", value_parser = parse_lease_duration)]
    pub lease_duration: Duration,

    /// Address of the Prometheus /metrics endpoint.
    #[arg(long, default_value = "0.0.0.0:8090")]
    pub metrics_addr: SocketAddr,

    /// Address of the /healthz and /readyz endpoints.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub health_addr: SocketAddr,

    /// Log line format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter: a level (info, debug) or tracing directives (info,rollouts_controller=debug).
    #[arg(long, default_value = "info", env = "RUST_LOG")]
    pub log_level: String,

    /// Prometheus address analysis uses when an AnalysisTemplate leaves `address` empty.
    #[arg(long)]
    pub prometheus_address: Option<String>,

    /// Bytes of an answer analysis reads at most from a provider (web, Prometheus, OAuth2
    /// token); a larger answer is an Error measurement naming this limit.
    #[arg(long, default_value_t = DEFAULT_MAX_RESPONSE_BYTES, value_parser = clap::value_parser!(u64).range(1024..=MAX_RESPONSE_BYTES))]
    pub analysis_max_response_bytes: u64,

    /// Measurements in flight at once, all AnalysisRuns together; one run takes at most a
    /// quarter of them. AnalysisRuns are reconciled up to max(--analysis-threads, this) at a time.
    #[arg(long, default_value_t = DEFAULT_MEASUREMENT_CONCURRENCY, value_parser = clap::value_parser!(u16).range(1..))]
    pub analysis_measurement_concurrency: u16,

    /// Path of a kubeconfig file (default: KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,

    /// Send the notifications Rollouts subscribe to (docs/notifications.md); off, the
    /// notification ConfigMap and Secret are not read.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub notifications_enabled: bool,

    /// Namespace of the notification ConfigMap and Secret (default: the kubeconfig's or the
    /// pod's namespace, where the controller runs).
    #[arg(long)]
    pub notifications_namespace: Option<String>,

    /// Name of the notification ConfigMap (Argo's by default).
    #[arg(long, default_value = crate::notify::DEFAULT_CONFIGMAP)]
    pub notifications_configmap: String,

    /// Name of the notification Secret its `$key` references read (Argo's by default).
    #[arg(long, default_value = crate::notify::DEFAULT_SECRET)]
    pub notifications_secret: String,

    /// Also read the notification ConfigMap and Secret (same names) in each Rollout's own
    /// namespace, as Argo's flag of this name does; needs list and watch on them in every
    /// namespace (docs/notifications.md).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub self_service_notification_enabled: bool,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

impl Flags {
    /// The label selector for watched Rollouts: this instance's id, or "no instance id" as Argo does.
    pub fn rollout_label_selector(&self) -> String {
        rollout_label_selector(self.instance_id.as_deref())
    }
}

/// `argo-rollouts.argoproj.io/controller-instance-id=ID`, or `!argo-rollouts.argoproj.io/controller-instance-id`
/// so an unnamed instance never touches Rollouts assigned to a named one.
pub fn rollout_label_selector(instance_id: Option<&str>) -> String {
    match instance_id {
        Some(id) => format!("{CONTROLLER_INSTANCE_ID_LABEL_KEY}={id}"),
        None => format!("!{CONTROLLER_INSTANCE_ID_LABEL_KEY}"),
    }
}

/// Why a flag's value cannot be used; each variant carries the value as given.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    #[error(
        "{value:?} is not a valid label value: use at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
    )]
    InstanceId { value: String },
    #[error("{value:?} is not a duration: write it like 15s, 1m or 15")]
    LeaseNotANumber {
        value: String,
        #[source]
        source: std::num::ParseIntError,
    },
    #[error("{value:?} has an unknown unit: use s, m or h")]
    LeaseUnit { value: String },
    #[error(
        "{value:?} is too short for a lease: use at least 3s (the leader must renew within two thirds of it)"
    )]
    LeaseTooShort { value: String },
    #[error("{value:?} is too long for a lease: use at most 24h")]
    LeaseTooLong { value: String },
    #[error("{value:?} is not a rate: use a number of requests per second above 0, e.g. 40")]
    Qps { value: String },
}

/// An instance id becomes a label value, so it must be one.
fn parse_instance_id(value: &str) -> Result<String, FlagError> {
    let valid_chars = value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let valid_ends = value.starts_with(|c: char| c.is_ascii_alphanumeric())
        && value.ends_with(|c: char| c.is_ascii_alphanumeric());
    if value.len() <= 63 && valid_chars && valid_ends {
        Ok(value.to_string())
    } else {
        Err(FlagError::InstanceId {
            value: value.to_string(),
        })
    }
}

/// A positive, finite number of requests per second.
fn parse_qps(value: &str) -> Result<f64, FlagError> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|qps| qps.is_finite() && *qps > 0.0)
        .ok_or_else(|| FlagError::Qps {
            value: value.to_string(),
        })
}

/// The longest `--lease-duration`: a day.
const MAX_LEASE_SECONDS: u64 = 24 * 3600;

/// Whole seconds with an optional `s`, `m` or `h` unit, as Kubernetes durations are written.
fn parse_lease_duration(value: &str) -> Result<Duration, FlagError> {
    let (digits, unit) = match value.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => value.split_at(at),
        None => (value, "s"),
    };
    let amount: u64 = digits
        .parse()
        .map_err(|source| FlagError::LeaseNotANumber {
            value: value.to_string(),
            source,
        })?;
    let unit_seconds: u64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => {
            return Err(FlagError::LeaseUnit {
                value: value.to_string(),
            });
        }
    };
    // A Lease holds its duration in an int32 of seconds; a day is already far more than a
    // failover should take.
    let seconds = amount.saturating_mul(unit_seconds);
    if seconds > MAX_LEASE_SECONDS {
        return Err(FlagError::LeaseTooLong {
            value: value.to_string(),
        });
    }
    if seconds < 3 {
        return Err(FlagError::LeaseTooShort {
            value: value.to_string(),
        });
    }
    Ok(Duration::from_secs(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Flags, clap::Error> {
        Flags::try_parse_from(std::iter::once("rollouts-controller").chain(args.iter().copied()))
    }

    #[test]
    fn defaults_are_argos_and_the_deployments_but_the_rate_limit() {
        let flags = parse(&[]).expect("no flags is valid");
        assert_eq!(flags.namespace, None);
        assert_eq!(flags.instance_id, None);
        assert_eq!(flags.rollout_threads, 10);
        assert_eq!(flags.experiment_threads, 10);
        assert_eq!(flags.analysis_threads, 30);
        assert_eq!(flags.qps, 400.0);
        assert_eq!(flags.burst, 800);
        assert!(flags.leader_elect);
        assert_eq!(flags.lease_name, "rollouts-controller-lock");
        assert_eq!(flags.lease_duration, Duration::from_secs(15));
        assert_eq!(flags.metrics_addr.to_string(), "0.0.0.0:8090");
        assert_eq!(flags.health_addr.to_string(), "0.0.0.0:8080");
        assert_eq!(flags.log_format, LogFormat::Text);
        assert_eq!(flags.prometheus_address, None);
        assert_eq!(flags.analysis_max_response_bytes, 10 * 1024 * 1024);
        assert_eq!(flags.analysis_measurement_concurrency, 32);
    }

    #[test]
    fn self_service_notifications_are_off_unless_asked_for_as_in_argo() {
        let off = parse(&[]).expect("valid");
        assert!(!off.self_service_notification_enabled);
        let on = parse(&["--self-service-notification-enabled"]).expect("valid");
        assert!(on.self_service_notification_enabled);
    }

    #[test]
    fn every_flag_is_read() {
        let flags = parse(&[
            "--namespace",
            "shop",
            "--instance-id",
            "blue",
            "--rollout-threads",
            "3",
            "--experiment-threads",
            "5",
            "--analysis-threads",
            "7",
            "--qps",
            "12.5",
            "--burst",
            "25",
            "--leader-elect=false",
            "--leader-election-namespace",
            "ops",
            "--lease-name",
            "my-lock",
            "--lease-duration",
            "1m",
            "--metrics-addr",
            "127.0.0.1:9000",
            "--health-addr",
            "127.0.0.1:9001",
            "--log-format",
            "json",
            "--log-level",
            "debug",
            "--prometheus-address",
            "http://prometheus:9090",
            "--kubeconfig",
            "kubeconfig.yaml",
            "--analysis-max-response-bytes",
            "2048",
            "--analysis-measurement-concurrency",
            "4",
        ])
        .expect("all flags are valid");
        assert_eq!(flags.namespace.as_deref(), Some("shop"));
        assert_eq!(flags.instance_id.as_deref(), Some("blue"));
        assert_eq!(flags.rollout_threads, 3);
        assert_eq!(flags.experiment_threads, 5);
        assert_eq!(flags.analysis_threads, 7);
        assert_eq!(flags.qps, 12.5);
        assert_eq!(flags.burst, 25);
        assert!(!flags.leader_elect);
        assert_eq!(flags.leader_election_namespace.as_deref(), Some("ops"));
        assert_eq!(flags.lease_name, "my-lock");
        assert_eq!(flags.lease_duration, Duration::from_secs(60));
        assert_eq!(flags.metrics_addr.port(), 9000);
        assert_eq!(flags.health_addr.port(), 9001);
        assert_eq!(flags.log_format, LogFormat::Json);
        assert_eq!(flags.log_level, "debug");
        assert_eq!(
            flags.prometheus_address.as_deref(),
            Some("http://prometheus:9090")
        );
        assert_eq!(flags.kubeconfig, Some(PathBuf::from("kubeconfig.yaml")));
        assert_eq!(flags.analysis_max_response_bytes, 2048);
        assert_eq!(flags.analysis_measurement_concurrency, 4);
    }

    #[test]
    fn bare_leader_elect_means_true() {
        assert!(parse(&["--leader-elect"]).expect("valid").leader_elect);
    }

    #[test]
    fn bad_values_are_refused_with_the_flag_named() {
        let error = parse(&["--rollout-threads", "0"]).expect_err("zero workers cannot reconcile");
        assert!(error.to_string().contains("--rollout-threads"), "{error}");
        let former = parse(&["--concurrency", "4"]).expect("the former name still works");
        assert_eq!(former.rollout_threads, 4);
        let error = parse(&["--analysis-threads", "0"]).expect_err("zero workers");
        assert!(error.to_string().contains("--analysis-threads"), "{error}");
        let error = parse(&["--experiment-threads", "0"]).expect_err("zero workers");
        assert!(
            error.to_string().contains("--experiment-threads"),
            "{error}"
        );
        for bad in ["0", "-1", "NaN", "inf", "fast"] {
            let error = parse(&[&format!("--qps={bad}")]).expect_err("not a rate");
            assert!(error.to_string().contains("--qps"), "{error}");
        }
        let error = parse(&["--burst", "0"]).expect_err("no request could go");
        assert!(error.to_string().contains("--burst"), "{error}");
        let error =
            parse(&["--instance-id", "not a label"]).expect_err("spaces are not label values");
        assert!(
            error.to_string().contains("not a valid label value"),
            "{error}"
        );
        let error = parse(&["--lease-duration", "1s"]).expect_err("too short");
        assert!(error.to_string().contains("at least 3s"), "{error}");
        for absurd in ["25h", "18446744073709551615h", "99999999999999999999"] {
            let error = parse(&["--lease-duration", absurd]).expect_err("too long or too big");
            assert!(error.to_string().contains("--lease-duration"), "{error}");
        }
        let error = parse(&["--lease-duration", "24h"]).map(|flags| flags.lease_duration);
        assert_eq!(error.ok(), Some(Duration::from_secs(86_400)));
        let error = parse(&["--lease-duration", "15d"]).expect_err("unknown unit");
        assert!(error.to_string().contains("unknown unit"), "{error}");
        let error = parse(&["--log-format", "xml"]).expect_err("unknown format");
        assert!(error.to_string().contains("--log-format"), "{error}");
        let error = parse(&["--analysis-max-response-bytes", "10"]).expect_err("too small");
        assert!(
            error.to_string().contains("--analysis-max-response-bytes"),
            "{error}"
        );
        let error =
            parse(&["--analysis-measurement-concurrency", "0"]).expect_err("no measurements");
        assert!(
            error
                .to_string()
                .contains("--analysis-measurement-concurrency"),
            "{error}"
        );
    }

    #[test]
    fn instance_id_selects_only_its_rollouts() {
        assert_eq!(
            rollout_label_selector(Some("blue")),
            "argo-rollouts.argoproj.io/controller-instance-id=blue"
        );
        let flags = parse(&["--instance-id", "blue"]).expect("valid");
        assert_eq!(
            flags.rollout_label_selector(),
            rollout_label_selector(Some("blue"))
        );
    }

    #[test]
    fn no_instance_id_selects_only_unlabelled_rollouts() {
        assert_eq!(
            rollout_label_selector(None),
            "!argo-rollouts.argoproj.io/controller-instance-id"
        );
    }
}
