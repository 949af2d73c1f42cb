//! Prometheus metrics under Argo Rollouts' names: `rollout_reconcile` (histogram),
//! `rollout_reconcile_error`, `rollout_events_total`, `rollout_info`, its replica gauges and
//! the deprecated `rollout_phase` (read from the watch cache at scrape time), the AnalysisRun
//! controller's (`analysis_run_info`, `analysis_run_phase`, `analysis_run_metric_type`,
//! `analysis_run_metric_phase`), the Experiment controller's (`experiment_info`,
//! `experiment_phase`, `experiment_reconcile`, `experiment_reconcile_error`), and
//! `argo_rollouts_controller_info`; ours:
//! `rollouts_controller_reconcile_panics_total` (by controller, never per object) and
//! `notification_send_total{service,result}`.
//!
//! prometheus-client writes OpenMetrics, where every counter sample ends in `_total`: Argo's
//! `rollout_reconcile_error` is therefore scraped as `rollout_reconcile_error_total`.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::reflector::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::analysisrun::AnalysisRunMetrics;
use crate::experiment::ExperimentMetrics;
use rollouts_crds::conditions;
use rollouts_crds::rollout::Rollout;

use crate::error::Error;
use crate::packed::{PackedRollout, RolloutSummary};

/// Argo's buckets for `rollout_reconcile` and `experiment_reconcile`, in seconds.
const RECONCILE_BUCKETS: [f64; 5] = [0.01, 0.15, 0.25, 0.5, 1.0];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RolloutLabels {
    namespace: String,
    name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileErrorLabels {
    namespace: String,
    name: String,
    error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    namespace: String,
    name: String,
    #[prometheus(flatten)]
    kind: EventKind,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventKind {
    r#type: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RolloutInfoLabels {
    namespace: String,
    name: String,
    strategy: String,
    traffic_router: String,
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: String,
}

/// `rollouts_controller_reconcile_panics_total{controller}`: reconciles that panicked, by
/// controller (`rollout`, `analysisrun`, `experiment`). Clones share their values, so the
/// AnalysisRun and Experiment controllers count through their own clones.
#[derive(Clone, Debug, Default)]
pub struct ReconcilePanics(Family<ControllerLabels, Counter>);

impl ReconcilePanics {
    /// Counts one panicked reconcile of `controller`.
    pub fn count(&self, controller: &str) {
        self.0
            .get_or_create(&ControllerLabels {
                controller: controller.to_string(),
            })
            .inc();
    }
}

/// The label sets one Rollout's error and event counters were created with.
#[derive(Debug, Default)]
struct RecordedSeries {
    errors: HashSet<String>,
    events: HashSet<EventKind>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabels {
    version: String,
}

pub(crate) fn reconcile_histogram() -> Histogram {
    Histogram::new(RECONCILE_BUCKETS)
}

/// Every metric the controller exposes, and the registry that renders them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconcile: Family<RolloutLabels, Histogram, fn() -> Histogram>,
    reconcile_errors: Family<ReconcileErrorLabels, Counter>,
    events: Family<EventLabels, Counter>,
    /// The error and event label sets each Rollout's series were created with, so that
    /// [`Metrics::forget_rollout`] can remove them (a `Family` cannot be iterated).
    recorded: Mutex<HashMap<RolloutLabels, RecordedSeries>>,
    /// The AnalysisRun controller's counters, registered here so `/metrics` serves them.
    pub analysis_runs: AnalysisRunMetrics,
    /// The Experiment controller's series, registered here so `/metrics` serves them.
    pub experiments: ExperimentMetrics,
    /// Panicked reconciles of both controllers.
    pub reconcile_panics: ReconcilePanics,
    /// Notifications sent, failed and dropped, by service.
    pub notifications: crate::notify::NotificationSends,
}

impl Metrics {
    /// Registers all metrics; `rollouts` is the controller's watch cache, read at scrape time.
    pub fn new(rollouts: Store<PackedRollout>) -> Self {
        let mut registry = Registry::default();
        let reconcile = Family::<RolloutLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            reconcile_histogram as fn() -> Histogram,
        );
        registry.register(
            "rollout_reconcile",
            "Rollout reconciliation performance",
            reconcile.clone(),
        );
        let reconcile_errors = Family::<ReconcileErrorLabels, Counter>::default();
        registry.register(
            "rollout_reconcile_error",
            "Error occurring during the rollout",
            reconcile_errors.clone(),
        );
        let events = Family::<EventLabels, Counter>::default();
        registry.register("rollout_events", "Count of rollout events", events.clone());
        registry.register(
            "argo_rollouts_controller",
            "Running rollouts-controller version",
            Info::new(VersionLabels {
                version: env!("CARGO_PKG_VERSION").to_string(),
            }),
        );
        registry.register_collector(Box::new(RolloutCollector { rollouts }));
        let analysis_runs = AnalysisRunMetrics::default();
        analysis_runs.register(&mut registry);
        let experiments = ExperimentMetrics::default();
        experiments.register(&mut registry);
        let reconcile_panics = ReconcilePanics::default();
        registry.register(
            "rollouts_controller_reconcile_panics",
            "Reconciles that panicked, by controller; the object backs off and the others are still served",
            reconcile_panics.0.clone(),
        );
        let notifications = crate::notify::NotificationSends::default();
        notifications.register(&mut registry);
        Self {
            registry,
            reconcile,
            reconcile_errors,
            events,
            recorded: Mutex::default(),
            analysis_runs,
            experiments,
            reconcile_panics,
            notifications,
        }
    }

    fn recorded(&self) -> std::sync::MutexGuard<'_, HashMap<RolloutLabels, RecordedSeries>> {
        self.recorded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Removes every series of Rollout `namespace/name` (it was deleted): its reconcile
    /// histogram, error counters and event counters. `rollout_info` and the replica gauges are
    /// read from the watch cache, so they go with it.
    pub fn forget_rollout(&self, namespace: &str, name: &str) {
        let rollout = RolloutLabels {
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        self.reconcile.remove(&rollout);
        let Some(recorded) = self.recorded().remove(&rollout) else {
            return;
        };
        for error in recorded.errors {
            self.reconcile_errors.remove(&ReconcileErrorLabels {
                namespace: namespace.to_string(),
                name: name.to_string(),
                error,
            });
        }
        for kind in recorded.events {
            self.events.remove(&EventLabels {
                namespace: namespace.to_string(),
                name: name.to_string(),
                kind,
            });
        }
    }

    /// Records how long one reconcile of `namespace/name` took.
    pub fn observe_reconcile(&self, namespace: &str, name: &str, took: Duration) {
        self.reconcile
            .get_or_create(&RolloutLabels {
                namespace: namespace.to_string(),
                name: name.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    /// Counts a failed reconcile of `namespace/name`, labelled with the error's kind.
    pub fn reconcile_failed(&self, namespace: &str, name: &str, error: &Error) {
        self.recorded()
            .entry(RolloutLabels {
                namespace: namespace.to_string(),
                name: name.to_string(),
            })
            .or_default()
            .errors
            .insert(error.metric_label().to_string());
        self.reconcile_errors
            .get_or_create(&ReconcileErrorLabels {
                namespace: namespace.to_string(),
                name: name.to_string(),
                error: error.metric_label().to_string(),
            })
            .inc();
    }

    /// Counts an event published for `namespace/name` (`event_type` is Normal or Warning).
    pub fn event_published(&self, namespace: &str, name: &str, event_type: &str, reason: &str) {
        let kind = EventKind {
            r#type: event_type.to_string(),
            reason: reason.to_string(),
        };
        self.recorded()
            .entry(RolloutLabels {
                namespace: namespace.to_string(),
                name: name.to_string(),
            })
            .or_default()
            .events
            .insert(kind.clone());
        self.events
            .get_or_create(&EventLabels {
                namespace: namespace.to_string(),
                name: name.to_string(),
                kind,
            })
            .inc();
    }

    /// The OpenMetrics text of every metric, as served on `/metrics`.
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail; an error here would be a bug in a label encoder.
        if let Err(error) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::error!(%error, "cannot encode metrics");
        }
        text
    }
}

/// The phases of Argo's deprecated `rollout_phase` gauge, in its order.
const DEPRECATED_PHASES: [&str; 6] = [
    "Completed",
    "Progressing",
    "Paused",
    "Timeout",
    "Error",
    "Abort",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RolloutPhaseLabels {
    namespace: String,
    name: String,
    strategy: String,
    phase: String,
}

/// `rollout_info`, `rollout_phase` and the replica gauges, computed from the watch cache on
/// each scrape.
/// Reads one replica count of a Rollout.
type ReplicaCount = fn(&RolloutSummary) -> i64;

#[derive(Debug)]
struct RolloutCollector {
    rollouts: Store<PackedRollout>,
}

impl Collector for RolloutCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut rollouts = self.rollouts.state();
        rollouts.sort_by_key(|r| (r.namespace(), r.name_any()));
        let info: Vec<RolloutInfoLabels> = rollouts.iter().map(|r| info_labels(r)).collect();
        {
            let mut family = encoder.encode_descriptor(
                "rollout_info",
                "Information about rollout",
                None,
                MetricType::Gauge,
            )?;
            for labels in &info {
                family.encode_family(labels)?.encode_gauge(&1i64)?;
            }
        }
        {
            // Argo's deprecated per-phase gauge: one series per phase it lists (InvalidSpec
            // is not among them), 1 on the Rollout's phase.
            let mut family = encoder.encode_descriptor(
                "rollout_phase",
                "Information on the state of the rollout (DEPRECATED - use rollout_info)",
                None,
                MetricType::Gauge,
            )?;
            for labels in &info {
                for phase in DEPRECATED_PHASES {
                    let series = RolloutPhaseLabels {
                        namespace: labels.namespace.clone(),
                        name: labels.name.clone(),
                        strategy: labels.strategy.clone(),
                        phase: phase.to_string(),
                    };
                    family
                        .encode_family(&series)?
                        .encode_gauge(&i64::from(labels.phase == phase))?;
                }
            }
        }
        let gauges: [(&str, &str, ReplicaCount); 4] = [
            (
                "rollout_info_replicas_available",
                "The number of available replicas per rollout",
                |r| r.available,
            ),
            (
                "rollout_info_replicas_unavailable",
                "The number of unavailable replicas per rollout",
                |r| r.unavailable,
            ),
            (
                "rollout_info_replicas_desired",
                "The number of desired replicas per rollout",
                |r| r.desired,
            ),
            (
                "rollout_info_replicas_updated",
                "The number of updated replicas per rollout",
                |r| r.updated,
            ),
        ];
        for (name, help, value) in gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for rollout in &rollouts {
                let labels = RolloutLabels {
                    namespace: rollout.namespace().unwrap_or_default(),
                    name: rollout.name_any(),
                };
                family
                    .encode_family(&labels)?
                    .encode_gauge(&value(rollout.summary()))?;
            }
        }
        Ok(())
    }
}

fn info_labels(rollout: &PackedRollout) -> RolloutInfoLabels {
    let summary = rollout.summary();
    RolloutInfoLabels {
        namespace: rollout.namespace().unwrap_or_default(),
        name: rollout.name_any(),
        strategy: summary.strategy.to_string(),
        traffic_router: summary.traffic_router.to_string(),
        phase: summary.phase.to_string(),
    }
}

/// The `strategy` and `traffic_router` labels, named as Argo names them.
pub fn strategy_and_traffic_router(rollout: &Rollout) -> (&'static str, &'static str) {
    let strategy = &rollout.spec.strategy;
    if strategy.blue_green.is_some() {
        return ("blueGreen", "");
    }
    let Some(canary) = &strategy.canary else {
        return ("none", "");
    };
    let Some(routing) = &canary.traffic_routing else {
        return ("canary", "");
    };
    // Argo checks routers in this order and keeps the last one set.
    let router = [
        ("AppMesh", routing.app_mesh.is_some()),
        ("SMI", routing.smi.is_some()),
        ("Nginx", routing.nginx.is_some()),
        ("Istio", routing.istio.is_some()),
        ("Ambassador", routing.ambassador.is_some()),
        ("ALB", routing.alb.is_some()),
    ]
    .into_iter()
    .find_map(|(name, set)| set.then_some(name))
    .unwrap_or("");
    ("canary", router)
}

/// The `phase` label, computed from the conditions as Argo's metrics do.
pub fn rollout_phase(rollout: &Rollout) -> &'static str {
    let Some(status) = &rollout.status else {
        return "Progressing";
    };
    if status
        .conditions
        .iter()
        .any(|c| c.type_ == conditions::INVALID_SPEC)
    {
        return "InvalidSpec";
    }
    let progressing = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::PROGRESSING);
    match progressing.map(|c| c.reason.as_str()) {
        Some(conditions::NEW_RS_AVAILABLE_REASON) => "Completed",
        Some(conditions::ROLLOUT_PAUSED_REASON) => "Paused",
        Some(conditions::FAILED_RS_CREATE_REASON) => "Error",
        Some(conditions::TIMED_OUT_REASON) => "Timeout",
        Some(conditions::ROLLOUT_ABORTED_REASON) => "Abort",
        _ => "Progressing",
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use kube::runtime::reflector::store;
    use kube::runtime::watcher;
    use rollouts_crds::rollout::{CanaryStep, RolloutCondition, RolloutStatus};

    use super::*;

    fn rollout(name: &str, status: Option<RolloutStatus>) -> Rollout {
        let mut rollout = Rollout::test_canary(name, vec![CanaryStep::weight(20)]).with_replicas(4);
        rollout.metadata.namespace = Some("shop".into());
        rollout.status = status;
        rollout
    }

    fn condition(type_: &str, reason: &str) -> RolloutCondition {
        RolloutCondition {
            type_: type_.into(),
            status: conditions::STATUS_TRUE.into(),
            last_update_time: Time(Timestamp::UNIX_EPOCH),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
            reason: reason.into(),
            message: String::new(),
        }
    }

    #[test]
    fn analysis_run_counters_are_served_with_the_rest() {
        let metrics = metrics_with(Vec::new());
        metrics
            .analysis_runs
            .clone()
            .measured("prometheus", "Failed");
        let text = metrics.render();
        assert!(
            text.contains(
                r#"analysis_run_measurements_total{provider="prometheus",phase="Failed"} 1"#
            ),
            "{text}"
        );
    }

    #[test]
    fn experiment_series_are_served_with_the_rest() {
        let metrics = metrics_with(Vec::new());
        metrics
            .experiments
            .clone()
            .observe_reconcile("shop", "fresh", Duration::from_millis(20));
        let text = metrics.render();
        assert!(
            text.contains(r#"experiment_reconcile_count{namespace="shop",name="fresh"} 1"#),
            "{text}"
        );
        assert!(text.contains("# TYPE experiment_info gauge"), "{text}");
    }

    #[test]
    fn panicked_reconciles_are_counted_by_controller() {
        let metrics = metrics_with(Vec::new());
        metrics.reconcile_panics.count("rollout");
        metrics.reconcile_panics.clone().count("analysisrun");
        metrics.reconcile_panics.count("analysisrun");
        let text = metrics.render();
        assert!(
            text.contains(r#"rollouts_controller_reconcile_panics_total{controller="rollout"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"rollouts_controller_reconcile_panics_total{controller="analysisrun"} 2"#
            ),
            "{text}"
        );
    }

    fn metrics_with(rollouts: Vec<Rollout>) -> Metrics {
        let (reader, mut writer) = store::<PackedRollout>();
        for rollout in rollouts {
            writer.apply_watcher_event(&watcher::Event::Apply(PackedRollout::pack(rollout)));
        }
        Metrics::new(reader)
    }

    #[test]
    fn reconcile_errors_and_events_render_under_argo_names() {
        let metrics = metrics_with(Vec::new());
        metrics.observe_reconcile("shop", "web", Duration::from_millis(200));
        metrics.reconcile_failed("shop", "web", &Error::MissingObjectKey("web".into()));
        metrics.event_published("shop", "web", "Warning", "InvalidSpec");
        let text = metrics.render();
        assert!(
            text.contains("# TYPE rollout_reconcile histogram"),
            "{text}"
        );
        assert!(
            text.contains("# HELP rollout_reconcile Rollout reconciliation performance.\n"),
            "{text}"
        );
        assert!(
            text.contains(r#"rollout_reconcile_bucket{le="0.15",namespace="shop",name="web"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"rollout_reconcile_bucket{le="0.25",namespace="shop",name="web"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"rollout_reconcile_count{namespace="shop",name="web"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"rollout_reconcile_error_total{namespace="shop",name="web",error="missing_object_key"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"rollout_events_total{namespace="shop",name="web",type="Warning",reason="InvalidSpec"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                r#"argo_rollouts_controller_info{{version="{}"}} 1"#,
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
    }

    #[test]
    fn forgetting_a_rollout_removes_all_its_series_and_no_other() {
        let metrics = metrics_with(Vec::new());
        for name in ["gone", "kept"] {
            metrics.observe_reconcile("shop", name, Duration::from_millis(20));
            metrics.reconcile_failed("shop", name, &Error::MissingObjectKey(name.into()));
            metrics.event_published("shop", name, "Warning", "InvalidSpec");
            metrics.event_published("shop", name, "Normal", "RolloutCompleted");
        }
        metrics.forget_rollout("shop", "gone");
        let text = metrics.render();
        assert!(!text.contains(r#"name="gone""#), "{text}");
        for series in [
            r#"rollout_reconcile_count{namespace="shop",name="kept"} 1"#,
            r#"rollout_reconcile_error_total{namespace="shop",name="kept",error="missing_object_key"} 1"#,
            r#"rollout_events_total{namespace="shop",name="kept",type="Warning",reason="InvalidSpec"} 1"#,
            r#"rollout_events_total{namespace="shop",name="kept",type="Normal",reason="RolloutCompleted"} 1"#,
        ] {
            assert!(text.contains(series), "{series} in {text}");
        }
        assert_eq!(metrics.recorded().len(), 1, "the index forgets it too");
        // Forgetting twice, or a Rollout never seen, is harmless.
        metrics.forget_rollout("shop", "gone");
        metrics.forget_rollout("shop", "never");
    }

    #[test]
    fn rollout_info_reads_phase_and_strategy_from_the_cache() {
        let invalid = rollout(
            "broken",
            Some(RolloutStatus {
                conditions: vec![condition(
                    conditions::INVALID_SPEC,
                    conditions::INVALID_SPEC_REASON,
                )],
                ..RolloutStatus::default()
            }),
        );
        let done = rollout(
            "web",
            Some(RolloutStatus {
                replicas: 4,
                available_replicas: 3,
                updated_replicas: 4,
                conditions: vec![condition(
                    conditions::PROGRESSING,
                    conditions::NEW_RS_AVAILABLE_REASON,
                )],
                ..RolloutStatus::default()
            }),
        );
        let text = metrics_with(vec![invalid, done]).render();
        assert!(
            text.contains(r#"rollout_info{namespace="shop",name="broken",strategy="canary",traffic_router="",phase="InvalidSpec"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"rollout_info{namespace="shop",name="web",strategy="canary",traffic_router="",phase="Completed"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"rollout_info_replicas_available{namespace="shop",name="web"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"rollout_phase{namespace="shop",name="web",strategy="canary",phase="Completed"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"rollout_phase{namespace="shop",name="web",strategy="canary",phase="Paused"} 0"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"rollout_phase{namespace="shop",name="broken",strategy="canary",phase="Progressing"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"rollout_info_replicas_unavailable{namespace="shop",name="web"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"rollout_info_replicas_desired{namespace="shop",name="web"} 4"#),
            "{text}"
        );
        assert!(
            text.contains(r#"rollout_info_replicas_updated{namespace="shop",name="web"} 4"#),
            "{text}"
        );
    }

    #[test]
    fn phase_follows_the_progressing_reason() {
        let cases = [
            (conditions::ROLLOUT_PAUSED_REASON, "Paused"),
            (conditions::TIMED_OUT_REASON, "Timeout"),
            (conditions::ROLLOUT_ABORTED_REASON, "Abort"),
            (conditions::FAILED_RS_CREATE_REASON, "Error"),
            (conditions::REPLICA_SET_UPDATED_REASON, "Progressing"),
        ];
        for (reason, phase) in cases {
            let status = RolloutStatus {
                conditions: vec![condition(conditions::PROGRESSING, reason)],
                ..RolloutStatus::default()
            };
            assert_eq!(
                rollout_phase(&rollout("web", Some(status))),
                phase,
                "{reason}"
            );
        }
        assert_eq!(rollout_phase(&rollout("web", None)), "Progressing");
    }

    #[test]
    fn blue_green_is_named_as_argo_names_it() {
        let rollout = Rollout::test_blue_green("web");
        assert_eq!(strategy_and_traffic_router(&rollout), ("blueGreen", ""));
    }
}
