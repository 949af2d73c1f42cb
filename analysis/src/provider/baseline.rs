//! The baseline judge provider (`provider.judge`, our addition): range-queries Prometheus for
//! the canary and the baseline over the same window, hands both sample sets to
//! [`crate::judge::judge`], and makes its outcome the measurement. The condition reads it as
//! `result.verdict`, `result.meanRatio`...; a NoData verdict takes the `noData` policy's phase
//! without a condition.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use rollouts_crds::analysis::{
    AnalysisPhase, Measurement, Metric, PrometheusMetric, PrometheusRangeQueryArgs,
};
use serde::Deserialize;

use super::prometheus::samples;
use super::{MeasurementFuture, MetricProvider, PrometheusProvider, RunContext, error_measurement};
use crate::condition;
use crate::judge::{self, JudgeConfig, NoDataPhase};

/// Where `{{hash}}` stands in the judge's query for each side's pod-template hash.
pub const HASH_TAG: &str = "{{hash}}";
/// Metadata keys of the two resolved queries.
pub const CANARY_QUERY_KEY: &str = "ResolvedCanaryQuery";
pub const BASELINE_QUERY_KEY: &str = "ResolvedBaselineQuery";

/// The query half of `provider.judge` (the statistics half is [`JudgeConfig`]).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct JudgeQuery {
    /// Where and how to query: address, headers, timeout, insecure, authentication.
    pub prometheus: PrometheusMetric,
    /// The query, with `{{hash}}` where each side's pod-template hash goes.
    pub query: String,
    /// The canary's pod-template hash (usually `{{args.canary-hash}}`).
    pub canary: String,
    /// The baseline's pod-template hash (usually `{{args.stable-hash}}`).
    pub baseline: String,
    /// How far back both sides are queried (Go duration, default 5m).
    pub window: Option<String>,
    /// Resolution of the range queries (Go duration, default 15s).
    pub step: Option<String>,
}

impl JudgeQuery {
    fn side(&self, hash: &str) -> PrometheusMetric {
        PrometheusMetric {
            query: Some(self.query.replace(HASH_TAG, hash)),
            range_query: Some(PrometheusRangeQueryArgs {
                start: Some(format!(
                    "now() - duration(\"{}\")",
                    self.window.as_deref().unwrap_or("5m")
                )),
                end: Some("now()".to_string()),
                step: Some(self.step.clone().unwrap_or_else(|| "15s".to_string())),
            }),
            ..self.prometheus.clone()
        }
    }
}

/// Why a metric's `provider.judge` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum JudgeSettingsError {
    #[error("metric {metric:?} has no provider.judge")]
    NotConfigured { metric: String },
    #[error("provider.judge of metric {metric:?}: {source}")]
    Invalid {
        metric: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("provider.judge.{field} of metric {metric:?} is empty: set it (see the judge example)")]
    Empty {
        /// `query`, `canary` or `baseline`.
        field: &'static str,
        metric: String,
    },
}

/// The judge's query and statistics settings of a metric.
fn settings(metric: &Metric) -> Result<(JudgeQuery, JudgeConfig), JudgeSettingsError> {
    let raw = metric
        .provider
        .judge
        .as_ref()
        .ok_or_else(|| JudgeSettingsError::NotConfigured {
            metric: metric.name.clone(),
        })?;
    let invalid = |source| JudgeSettingsError::Invalid {
        metric: metric.name.clone(),
        source,
    };
    let query: JudgeQuery = serde_json::from_value(raw.clone()).map_err(invalid)?;
    let config: JudgeConfig = serde_json::from_value(raw.clone()).map_err(invalid)?;
    for (field, value) in [
        ("query", &query.query),
        ("canary", &query.canary),
        ("baseline", &query.baseline),
    ] {
        if value.trim().is_empty() {
            return Err(JudgeSettingsError::Empty {
                field,
                metric: metric.name.clone(),
            });
        }
    }
    Ok((query, config))
}

/// Judges canary against baseline with Prometheus range queries.
#[derive(Clone, Debug)]
pub struct BaselineJudgeProvider {
    prometheus: PrometheusProvider,
}

impl BaselineJudgeProvider {
    /// Queries through `prometheus` (sharing its clients and its coalescing of identical queries).
    pub fn new(prometheus: PrometheusProvider) -> Self {
        Self { prometheus }
    }

    async fn measure(&self, run: RunContext<'_>, metric: &Metric) -> Measurement {
        let now = run.now;
        let (query, config) = match settings(metric) {
            Ok(settings) => settings,
            Err(e) => return error_measurement(e.to_string(), now),
        };
        let (canary_side, baseline_side) = (query.side(&query.canary), query.side(&query.baseline));
        let canary = self.prometheus.query(&canary_side, run);
        let baseline = self.prometheus.query(&baseline_side, run);
        let (canary, baseline) = match futures::join!(canary, baseline) {
            (Ok(c), Ok(b)) => (samples(&c), samples(&b)),
            (Err(e), _) => return error_measurement(format!("canary query: {e}"), now),
            (_, Err(e)) => return error_measurement(format!("baseline query: {e}"), now),
        };
        let outcome = match judge::judge(&canary, &baseline, &config) {
            Ok(outcome) => outcome,
            Err(e) => return error_measurement(e.to_string(), now),
        };
        let value = serde_json::to_value(&outcome).unwrap_or_default();
        let finished = |phase, message: String| Measurement {
            phase,
            message,
            value: value.to_string(),
            started_at: Some(Time(now)),
            finished_at: Some(Time(now)),
            ..Default::default()
        };
        if let Some(phase) = outcome.no_data_phase(config.no_data) {
            let phase = match phase {
                NoDataPhase::Successful => AnalysisPhase::Successful,
                NoDataPhase::Inconclusive => AnalysisPhase::Inconclusive,
                NoDataPhase::Failed => AnalysisPhase::Failed,
            };
            return finished(phase, outcome.reason.clone());
        }
        match condition::evaluate_metric(&condition::from_json(&value), metric) {
            Ok(phase) => finished(phase, outcome.reason.clone()),
            Err(e) => error_measurement(e.to_string(), now),
        }
    }
}

impl MetricProvider for BaselineJudgeProvider {
    fn kind(&self) -> &'static str {
        "Judge"
    }

    fn metadata(&self, metric: &Metric) -> BTreeMap<String, String> {
        settings(metric)
            .map(|(query, _)| {
                BTreeMap::from([
                    (
                        CANARY_QUERY_KEY.to_string(),
                        query.query.replace(HASH_TAG, &query.canary),
                    ),
                    (
                        BASELINE_QUERY_KEY.to_string(),
                        query.query.replace(HASH_TAG, &query.baseline),
                    ),
                ])
            })
            .unwrap_or_default()
    }

    fn run<'a>(&'a self, run: RunContext<'a>, metric: &'a Metric) -> MeasurementFuture<'a> {
        Box::pin(self.measure(run, metric))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rollouts_crds::analysis::MetricProvider as Provider;
    use serde_json::json;

    fn metric(judge: serde_json::Value) -> Metric {
        Metric {
            name: "errors-vs-stable".into(),
            provider: Provider {
                judge: Some(judge),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn settings_read_both_halves_of_provider_judge() {
        let m = metric(json!({
            "prometheus": {"address": "http://prom:9090"},
            "query": "rate(x{h=\"{{hash}}\"}[1m])",
            "canary": "abc",
            "baseline": "def",
            "window": "10m",
            "direction": "increase",
            "minSamples": 8
        }));
        let (query, config) = settings(&m).unwrap();
        assert_eq!(config.min_samples, 8);
        let side = query.side(&query.canary);
        assert_eq!(side.query.as_deref(), Some("rate(x{h=\"abc\"}[1m])"));
        assert_eq!(side.address.as_deref(), Some("http://prom:9090"));
        let range = side.range_query.unwrap();
        assert_eq!(range.start.as_deref(), Some("now() - duration(\"10m\")"));
        assert_eq!(range.step.as_deref(), Some("15s"));
    }

    #[test]
    fn missing_sides_are_named() {
        let err = settings(&metric(json!({"query": "x", "canary": "abc"})))
            .unwrap_err()
            .to_string();
        assert!(err.contains("provider.judge.baseline"), "{err}");
        let err = settings(&metric(
            json!({"query": "x", "canary": "a", "baseline": "b", "minSamples": "many"}),
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("provider.judge of metric"), "{err}");
    }
}
