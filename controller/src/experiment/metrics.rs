//! Metrics of the Experiment controller under Argo Rollouts' names: `experiment_reconcile`
//! (histogram, Argo's buckets), `experiment_reconcile_error` (scraped as
//! `experiment_reconcile_error_total`; its `error` label is ours, as for Rollouts), and Argo's
//! gauges over the experiments in the watch cache: `experiment_info` and the deprecated
//! `experiment_phase`. An experiment's series go when it is deleted: the gauges with the cache,
//! the histogram and counters through [`ExperimentMetrics::forget`].

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::reflector::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use rollouts_crds::analysis::AnalysisPhase;
use rollouts_crds::experiment::Experiment;

use super::Error;
use crate::metrics::reconcile_histogram;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ExperimentLabels {
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
struct PhaseLabels {
    namespace: String,
    name: String,
    phase: String,
}

/// The phases Argo's deprecated `experiment_phase` lists, in its order (Failed is not among
/// them in Argo, so a Failed experiment has all five at 0 there and here).
const DEPRECATED_PHASES: [AnalysisPhase; 5] = [
    AnalysisPhase::Pending,
    AnalysisPhase::Error,
    AnalysisPhase::Successful,
    AnalysisPhase::Running,
    AnalysisPhase::Inconclusive,
];

type ExperimentsCache = Arc<Mutex<Option<Store<Experiment>>>>;

/// Series of the Experiment controller. Clones share their values, so one clone is registered
/// with the process registry while the controller records through another.
#[derive(Clone, Debug)]
pub struct ExperimentMetrics {
    reconcile: Family<ExperimentLabels, Histogram, fn() -> Histogram>,
    reconcile_errors: Family<ReconcileErrorLabels, Counter>,
    /// The `error` labels each experiment's counters were created with, so that
    /// [`ExperimentMetrics::forget`] can remove them (a `Family` cannot be iterated).
    recorded_errors: Arc<Mutex<HashMap<ExperimentLabels, HashSet<String>>>>,
    /// The Experiment controller's watch cache, once it runs.
    experiments: ExperimentsCache,
}

impl Default for ExperimentMetrics {
    fn default() -> Self {
        Self {
            reconcile: Family::new_with_constructor(reconcile_histogram as fn() -> Histogram),
            reconcile_errors: Family::default(),
            recorded_errors: Arc::default(),
            experiments: Arc::default(),
        }
    }
}

impl ExperimentMetrics {
    /// Registers `experiment_reconcile`, `experiment_reconcile_error` and the gauges read
    /// from the watch cache.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "experiment_reconcile",
            "Experiments reconciliation performance",
            self.reconcile.clone(),
        );
        registry.register(
            "experiment_reconcile_error",
            "Error occurring during the experiment",
            self.reconcile_errors.clone(),
        );
        registry.register_collector(Box::new(ExperimentCollector {
            experiments: self.experiments.clone(),
        }));
    }

    /// Serves Argo's Experiment gauges from `store`, the Experiment controller's cache.
    pub fn watch(&self, store: Store<Experiment>) {
        *self
            .experiments
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(store);
    }

    /// Records how long one reconcile of `namespace/name` took.
    pub fn observe_reconcile(&self, namespace: &str, name: &str, took: Duration) {
        self.reconcile
            .get_or_create(&labels(namespace, name))
            .observe(took.as_secs_f64());
    }

    /// Counts a failed reconcile of `namespace/name`, labelled with the error's kind.
    pub fn reconcile_failed(&self, namespace: &str, name: &str, error: &Error) {
        let error = error.metric_label().to_string();
        self.recorded_errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(labels(namespace, name))
            .or_default()
            .insert(error.clone());
        self.reconcile_errors
            .get_or_create(&ReconcileErrorLabels {
                namespace: namespace.to_string(),
                name: name.to_string(),
                error,
            })
            .inc();
    }

    /// Removes the reconcile histogram and error counters of Experiment `namespace/name` (it
    /// was deleted); its gauges went with the watch cache.
    pub fn forget(&self, namespace: &str, name: &str) {
        let experiment = labels(namespace, name);
        self.reconcile.remove(&experiment);
        let errors = self
            .recorded_errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&experiment);
        for error in errors.into_iter().flatten() {
            self.reconcile_errors.remove(&ReconcileErrorLabels {
                namespace: namespace.to_string(),
                name: name.to_string(),
                error,
            });
        }
    }
}

fn labels(namespace: &str, name: &str) -> ExperimentLabels {
    ExperimentLabels {
        namespace: namespace.to_string(),
        name: name.to_string(),
    }
}

/// The experiment's phase; one the controller has not written yet is Pending, as Argo's
/// deprecated gauge counts it.
fn experiment_phase(experiment: &Experiment) -> AnalysisPhase {
    experiment
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .unwrap_or(AnalysisPhase::Pending)
}

/// `experiment_info` and `experiment_phase`, computed from the watch cache on each scrape.
#[derive(Debug)]
struct ExperimentCollector {
    experiments: ExperimentsCache,
}

impl Collector for ExperimentCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let store = self
            .experiments
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut experiments: Vec<(String, String, AnalysisPhase)> = store
            .map(|store| store.state())
            .unwrap_or_default()
            .iter()
            .map(|e| {
                (
                    e.namespace().unwrap_or_default(),
                    e.name_any(),
                    experiment_phase(e),
                )
            })
            .collect();
        experiments.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        {
            let mut family = encoder.encode_descriptor(
                "experiment_info",
                "Information about Experiment.",
                None,
                MetricType::Gauge,
            )?;
            for (namespace, name, phase) in &experiments {
                family
                    .encode_family(&PhaseLabels {
                        namespace: namespace.clone(),
                        name: name.clone(),
                        phase: phase.to_string(),
                    })?
                    .encode_gauge(&1i64)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "experiment_phase",
            "Information on the state of the experiment (DEPRECATED - use experiment_info)",
            None,
            MetricType::Gauge,
        )?;
        for (namespace, name, current) in &experiments {
            for phase in DEPRECATED_PHASES {
                family
                    .encode_family(&PhaseLabels {
                        namespace: namespace.clone(),
                        name: name.clone(),
                        phase: phase.to_string(),
                    })?
                    .encode_gauge(&i64::from(*current == phase))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector::store;
    use kube::runtime::watcher;

    use super::*;

    fn registered() -> (ExperimentMetrics, Registry) {
        let metrics = ExperimentMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        (metrics, registry)
    }

    fn render(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).expect("encodes");
        text
    }

    fn experiment(name: &str, phase: Option<&str>) -> Experiment {
        let mut value = serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Experiment",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"templates": []},
        });
        if let Some(phase) = phase {
            value["status"] = serde_json::json!({"phase": phase});
        }
        serde_json::from_value(value).expect("a valid experiment")
    }

    fn read_error(name: &str) -> Error {
        Error::Read {
            kind: "ReplicaSet",
            namespace: "shop".into(),
            name: format!("{name}-baseline"),
            experiment: name.into(),
            source: Box::new(kube::Error::LinesCodecMaxLineLengthExceeded),
        }
    }

    #[test]
    fn reconciles_and_errors_render_under_argo_names() {
        let (metrics, registry) = registered();
        metrics.observe_reconcile("shop", "fresh", Duration::from_millis(200));
        metrics.observe_reconcile("shop", "fresh", Duration::from_millis(5));
        metrics.reconcile_failed("shop", "fresh", &read_error("fresh"));
        metrics.reconcile_failed("shop", "fresh", &read_error("fresh"));
        metrics.reconcile_failed("shop", "fresh", &Error::MissingNamespace("fresh".into()));
        let text = render(&registry);
        for line in [
            "# HELP experiment_reconcile Experiments reconciliation performance.\n",
            "# TYPE experiment_reconcile histogram\n",
            r#"experiment_reconcile_bucket{le="0.01",namespace="shop",name="fresh"} 1"#,
            r#"experiment_reconcile_bucket{le="0.15",namespace="shop",name="fresh"} 1"#,
            r#"experiment_reconcile_bucket{le="0.25",namespace="shop",name="fresh"} 2"#,
            r#"experiment_reconcile_bucket{le="+Inf",namespace="shop",name="fresh"} 2"#,
            r#"experiment_reconcile_count{namespace="shop",name="fresh"} 2"#,
            "# TYPE experiment_reconcile_error counter\n",
            r#"experiment_reconcile_error_total{namespace="shop",name="fresh",error="read"} 2"#,
            r#"experiment_reconcile_error_total{namespace="shop",name="fresh",error="missing_namespace"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }

    #[test]
    fn info_and_deprecated_phase_gauges_are_read_from_the_watch_cache() {
        let (metrics, registry) = registered();
        let (reader, mut writer) = store::<Experiment>();
        for (name, phase) in [
            ("running", Some("Running")),
            ("new", None),
            ("failed", Some("Failed")),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(experiment(name, phase)));
        }
        metrics.watch(reader);
        let text = render(&registry);
        for line in [
            "# HELP experiment_info Information about Experiment.\n",
            "# TYPE experiment_info gauge\n",
            r#"experiment_info{namespace="shop",name="running",phase="Running"} 1"#,
            r#"experiment_info{namespace="shop",name="new",phase="Pending"} 1"#,
            r#"experiment_info{namespace="shop",name="failed",phase="Failed"} 1"#,
            "# TYPE experiment_phase gauge\n",
            r#"experiment_phase{namespace="shop",name="running",phase="Running"} 1"#,
            r#"experiment_phase{namespace="shop",name="running",phase="Pending"} 0"#,
            r#"experiment_phase{namespace="shop",name="running",phase="Successful"} 0"#,
            r#"experiment_phase{namespace="shop",name="new",phase="Pending"} 1"#,
            r#"experiment_phase{namespace="shop",name="failed",phase="Inconclusive"} 0"#,
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        // Argo's deprecated gauge has no Failed series, and five per experiment.
        assert!(
            !text.contains(r#"experiment_phase{namespace="shop",name="failed",phase="Failed"}"#),
            "{text}"
        );
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("experiment_phase{"))
                .count(),
            15,
            "{text}"
        );
        // Sorted by namespace and name, so scrapes are stable.
        let failed = text.find(r#"experiment_info{namespace="shop",name="failed""#);
        let running = text.find(r#"experiment_info{namespace="shop",name="running""#);
        assert!(failed < running, "{text}");
    }

    #[test]
    fn a_deleted_experiment_leaves_no_series_and_the_others_stay() {
        let (metrics, registry) = registered();
        let (reader, mut writer) = store::<Experiment>();
        for name in ["gone", "kept"] {
            writer.apply_watcher_event(&watcher::Event::Apply(experiment(name, Some("Running"))));
            metrics.observe_reconcile("shop", name, Duration::from_millis(20));
            metrics.reconcile_failed("shop", name, &read_error(name));
            metrics.reconcile_failed("shop", name, &Error::MissingNamespace(name.into()));
        }
        metrics.watch(reader);
        writer.apply_watcher_event(&watcher::Event::Delete(experiment("gone", Some("Running"))));
        metrics.forget("shop", "gone");
        let text = render(&registry);
        assert!(!text.contains(r#"name="gone""#), "{text}");
        for line in [
            r#"experiment_info{namespace="shop",name="kept",phase="Running"} 1"#,
            r#"experiment_reconcile_count{namespace="shop",name="kept"} 1"#,
            r#"experiment_reconcile_error_total{namespace="shop",name="kept",error="read"} 1"#,
            r#"experiment_reconcile_error_total{namespace="shop",name="kept",error="missing_namespace"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert_eq!(
            metrics
                .recorded_errors
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len(),
            1,
            "the index forgets it too"
        );
        // Forgetting twice, or an experiment never seen, is harmless.
        metrics.forget("shop", "gone");
        metrics.forget("shop", "never");
    }

    #[test]
    fn before_the_controller_runs_the_gauges_are_empty() {
        let (_metrics, registry) = registered();
        let text = render(&registry);
        assert!(text.contains("# TYPE experiment_info gauge"), "{text}");
        assert!(!text.contains("experiment_info{"), "{text}");
        assert!(!text.contains("experiment_phase{"), "{text}");
    }
}
