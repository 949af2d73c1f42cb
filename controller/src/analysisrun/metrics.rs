//! Metrics of the AnalysisRun controller: measurements by provider and phase, failed
//! reconciles by error kind, and Argo's gauges over the runs in the watch cache
//! (`analysis_run_info`, `analysis_run_phase`, `analysis_run_metric_type`,
//! `analysis_run_metric_phase`), which dashboards built for Argo Rollouts read.

use std::sync::{Arc, Mutex, PoisonError};

use kube::ResourceExt;
use kube::runtime::reflector::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use rollouts_crds::analysis::{AnalysisPhase, AnalysisRun, Metric};

use super::Error;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MeasurementLabels {
    provider: String,
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileErrorLabels {
    error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunPhaseLabels {
    namespace: String,
    name: String,
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MetricTypeLabels {
    namespace: String,
    name: String,
    metric: String,
    r#type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MetricPhaseLabels {
    namespace: String,
    name: String,
    metric: String,
    r#type: String,
    dry_run: String,
    phase: String,
}

/// The phases Argo's deprecated per-phase gauges list, in its order.
const PHASES: [AnalysisPhase; 6] = [
    AnalysisPhase::Pending,
    AnalysisPhase::Error,
    AnalysisPhase::Failed,
    AnalysisPhase::Successful,
    AnalysisPhase::Running,
    AnalysisPhase::Inconclusive,
];

/// Counters of the AnalysisRun controller. Clones share their values, so one clone can be
/// registered with the process registry while the controller counts through another.
#[derive(Clone, Debug, Default)]
pub struct AnalysisRunMetrics {
    measurements: Family<MeasurementLabels, Counter>,
    reconcile_errors: Family<ReconcileErrorLabels, Counter>,
    /// The AnalysisRun controller's watch cache, once it runs.
    runs: RunsCache,
}

type RunsCache = Arc<Mutex<Option<Store<AnalysisRun>>>>;

impl AnalysisRunMetrics {
    /// Registers `analysis_run_measurements` (by provider and phase) and
    /// `analysis_run_reconcile_error` (by error kind); both are scraped with a `_total` suffix.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "analysis_run_measurements",
            "Measurements taken for AnalysisRuns, by provider and phase",
            self.measurements.clone(),
        );
        registry.register(
            "analysis_run_reconcile_error",
            "Failed AnalysisRun reconciles, by error kind",
            self.reconcile_errors.clone(),
        );
        registry.register_collector(Box::new(RunCollector {
            runs: self.runs.clone(),
        }));
    }

    /// Serves Argo's AnalysisRun gauges from `store`, the AnalysisRun controller's cache.
    pub fn watch(&self, store: Store<AnalysisRun>) {
        *self.runs.lock().unwrap_or_else(PoisonError::into_inner) = Some(store);
    }

    /// Counts one measurement a provider returned.
    pub fn measured(&self, provider: &str, phase: &str) {
        self.measurements
            .get_or_create(&MeasurementLabels {
                provider: provider.to_string(),
                phase: phase.to_string(),
            })
            .inc();
    }

    pub(super) fn reconcile_failed(&self, error: &Error) {
        self.reconcile_errors
            .get_or_create(&ReconcileErrorLabels {
                error: error.metric_label().to_string(),
            })
            .inc();
    }
}

/// Argo's AnalysisRun gauges, computed from the watch cache on each scrape.
#[derive(Debug)]
struct RunCollector {
    runs: RunsCache,
}

impl Collector for RunCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let store = self
            .runs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut runs = store.map(|store| store.state()).unwrap_or_default();
        runs.sort_by_key(|r| (r.namespace(), r.name_any()));
        let key = |run: &AnalysisRun| (run.namespace().unwrap_or_default(), run.name_any());
        {
            let mut family = encoder.encode_descriptor(
                "analysis_run_info",
                "Information about analysis run.",
                None,
                MetricType::Gauge,
            )?;
            for run in &runs {
                let (namespace, name) = key(run);
                let phase = run_phase(run).to_string();
                family
                    .encode_family(&RunPhaseLabels {
                        namespace,
                        name,
                        phase,
                    })?
                    .encode_gauge(&1i64)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "analysis_run_phase",
                "Information on the state of the Analysis Run (DEPRECATED - use analysis_run_info)",
                None,
                MetricType::Gauge,
            )?;
            for run in &runs {
                let current = run_phase(run);
                for phase in PHASES {
                    let (namespace, name) = key(run);
                    family
                        .encode_family(&RunPhaseLabels {
                            namespace,
                            name,
                            phase: phase.to_string(),
                        })?
                        .encode_gauge(&i64::from(current == phase))?;
                }
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "analysis_run_metric_type",
                "Information on the type of a specific metric in the Analysis Runs",
                None,
                MetricType::Gauge,
            )?;
            for run in &runs {
                for metric in &run.spec.metrics {
                    let (namespace, name) = key(run);
                    family
                        .encode_family(&MetricTypeLabels {
                            namespace,
                            name,
                            metric: metric.name.clone(),
                            r#type: metric_type(metric).to_string(),
                        })?
                        .encode_gauge(&1i64)?;
                }
            }
        }
        let mut family = encoder.encode_descriptor(
            "analysis_run_metric_phase",
            "Information on the duration of a specific metric in the Analysis Run",
            None,
            MetricType::Gauge,
        )?;
        for run in &runs {
            // Rules that match no metric are the run's Error to report, not the scrape's.
            let dry_run =
                rollouts_analysis::engine::dry_run_metrics(&run.spec.dry_run, &run.spec.metrics)
                    .unwrap_or_default();
            for metric in &run.spec.metrics {
                let current = metric_phase(run, &metric.name);
                for phase in PHASES {
                    let (namespace, name) = key(run);
                    family
                        .encode_family(&MetricPhaseLabels {
                            namespace,
                            name,
                            metric: metric.name.clone(),
                            r#type: metric_type(metric).to_string(),
                            dry_run: dry_run.contains(&metric.name).to_string(),
                            phase: phase.to_string(),
                        })?
                        .encode_gauge(&i64::from(current == phase))?;
                }
            }
        }
        Ok(())
    }
}

/// The run's phase; a run not yet measured is Pending, as Argo counts it.
fn run_phase(run: &AnalysisRun) -> AnalysisPhase {
    run.status
        .as_ref()
        .map_or(AnalysisPhase::Pending, |s| s.phase)
}

/// A metric's phase in the run's status; Pending until it has a result.
fn metric_phase(run: &AnalysisRun, metric: &str) -> AnalysisPhase {
    run.status
        .as_ref()
        .and_then(|s| s.metric_results.iter().find(|r| r.name == metric))
        .map_or(AnalysisPhase::Pending, |r| r.phase)
}

/// The `type` label: Argo's name for the metric's provider (its `metricproviders.Type`).
fn metric_type(metric: &Metric) -> &'static str {
    let p = &metric.provider;
    [
        ("Prometheus", p.prometheus.is_some()),
        ("Job", p.job.is_some()),
        ("Kayenta", p.kayenta.is_some()),
        ("Web", p.web.is_some()),
        ("Datadog", p.datadog.is_some()),
        ("Wavefront", p.wavefront.is_some()),
        ("NewRelic", p.new_relic.is_some()),
        ("CloudWatch", p.cloud_watch.is_some()),
        ("Graphite", p.graphite.is_some()),
        ("Influxdb", p.influxdb.is_some()),
        ("skywalking", p.skywalking.is_some()),
        ("RPCPlugin", p.plugin.is_some()),
        // Ours, not Argo's.
        ("Judge", p.judge.is_some()),
    ]
    .into_iter()
    .find_map(|(name, set)| set.then_some(name))
    .unwrap_or("Unknown Provider")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measurements_are_counted_by_provider_and_phase() {
        let metrics = AnalysisRunMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        metrics.measured("Prometheus", "Successful");
        metrics.measured("Prometheus", "Successful");
        metrics.measured("Web", "Error");
        metrics.reconcile_failed(&Error::MissingNamespace("r".into()));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        assert!(
            text.contains(
                r#"analysis_run_measurements_total{provider="Prometheus",phase="Successful"} 2"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"analysis_run_measurements_total{provider="Web",phase="Error"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"analysis_run_reconcile_error_total{error="missing_namespace"} 1"#),
            "{text}"
        );
    }

    fn run(name: &str, status: Option<serde_json::Value>) -> AnalysisRun {
        let mut value = serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "AnalysisRun",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {
                "metrics": [
                    {"name": "errors", "provider": {"prometheus": {"query": "q"}}},
                    {"name": "smoke", "provider": {"web": {"url": "http://x"}}},
                ],
                "dryRun": [{"metricName": "smo.*"}],
            },
        });
        if let Some(status) = status {
            value["status"] = status;
        }
        serde_json::from_value(value).expect("a valid run")
    }

    #[test]
    fn argo_gauges_are_served_from_the_watch_cache() {
        use kube::runtime::reflector::store;
        use kube::runtime::watcher;

        let metrics = AnalysisRunMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let (reader, mut writer) = store::<AnalysisRun>();
        writer.apply_watcher_event(&watcher::Event::Apply(run(
            "web-1",
            Some(serde_json::json!({
                "phase": "Running",
                "metricResults": [{"name": "errors", "phase": "Failed"}],
            })),
        )));
        writer.apply_watcher_event(&watcher::Event::Apply(run("web-2", None)));
        metrics.watch(reader);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        for line in [
            r#"analysis_run_info{namespace="shop",name="web-1",phase="Running"} 1"#,
            r#"analysis_run_info{namespace="shop",name="web-2",phase="Pending"} 1"#,
            r#"analysis_run_phase{namespace="shop",name="web-1",phase="Running"} 1"#,
            r#"analysis_run_phase{namespace="shop",name="web-1",phase="Successful"} 0"#,
            r#"analysis_run_phase{namespace="shop",name="web-2",phase="Pending"} 1"#,
            r#"analysis_run_metric_type{namespace="shop",name="web-1",metric="errors",type="Prometheus"} 1"#,
            r#"analysis_run_metric_type{namespace="shop",name="web-1",metric="smoke",type="Web"} 1"#,
            r#"analysis_run_metric_phase{namespace="shop",name="web-1",metric="errors",type="Prometheus",dry_run="false",phase="Failed"} 1"#,
            r#"analysis_run_metric_phase{namespace="shop",name="web-1",metric="errors",type="Prometheus",dry_run="false",phase="Running"} 0"#,
            r#"analysis_run_metric_phase{namespace="shop",name="web-1",metric="smoke",type="Web",dry_run="true",phase="Pending"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }

    #[test]
    fn without_a_cache_the_gauges_are_empty() {
        let metrics = AnalysisRunMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        assert!(text.contains("# TYPE analysis_run_info gauge"), "{text}");
        assert!(!text.contains("analysis_run_info{"), "{text}");
    }
}
