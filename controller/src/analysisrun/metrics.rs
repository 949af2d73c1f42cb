//! Counters of the AnalysisRun controller: measurements by provider and phase, failed
//! reconciles by error kind.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

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

/// Counters of the AnalysisRun controller. Clones share their values, so one clone can be
/// registered with the process registry while the controller counts through another.
#[derive(Clone, Debug, Default)]
pub struct AnalysisRunMetrics {
    measurements: Family<MeasurementLabels, Counter>,
    reconcile_errors: Family<ReconcileErrorLabels, Counter>,
}

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
}
