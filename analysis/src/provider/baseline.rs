//! The baseline judge provider (`provider.judge`, our addition): range-queries Prometheus for
//! the canary and the baseline over the same window, hands both sample sets to
//! [`crate::judge::judge`], and makes its outcome the measurement. The condition reads it as
//! `result.verdict`, `result.meanRatio`...; a NoData verdict takes the `noData` policy's phase
//! without a condition. `kind: ratio` instead instant-queries an `errors` and a `total` count
//! per side over the window and hands them to [`crate::judge::judge_rates`].

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use rollouts_crds::analysis::{
    AnalysisPhase, Measurement, Metric, PrometheusMetric, PrometheusRangeQueryArgs,
};
use serde::Deserialize;

use super::prometheus::samples;
use super::{MeasurementFuture, MetricProvider, PrometheusProvider, RunContext, error_measurement};
use crate::condition;
use crate::judge::{self, Counts, JudgeConfig, JudgeKind, NoDataPhase, Verdict};

/// Where `{{hash}}` stands in the judge's query for each side's pod-template hash.
pub const HASH_TAG: &str = "{{hash}}";
/// Where `{{window}}` stands in the judge's queries for its window (`5m`).
pub const WINDOW_TAG: &str = "{{window}}";
/// Metadata keys of the two resolved queries.
pub const CANARY_QUERY_KEY: &str = "ResolvedCanaryQuery";
pub const BASELINE_QUERY_KEY: &str = "ResolvedBaselineQuery";

/// The query half of `provider.judge` (the statistics half is [`JudgeConfig`]).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct JudgeQuery {
    /// Where and how to query: address, headers, timeout, insecure, authentication.
    pub prometheus: PrometheusMetric,
    /// The query, with `{{hash}}` where each side's pod-template hash goes (`kind: continuous`).
    pub query: String,
    /// `kind: ratio`: the count of bad requests over the window, e.g.
    /// `sum(increase(http_requests_total{code=~"5..",h="{{hash}}"}[{{window}}]))`.
    pub errors: String,
    /// `kind: ratio`: the count of all requests over the same window.
    pub total: String,
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
    fn window(&self) -> &str {
        self.window.as_deref().unwrap_or("5m")
    }

    /// A query with its `{{hash}}` and `{{window}}` filled in.
    fn resolve(&self, query: &str, hash: &str) -> String {
        query
            .replace(HASH_TAG, hash)
            .replace(WINDOW_TAG, self.window())
    }

    /// An instant query of a count (`kind: ratio`).
    fn count(&self, query: &str, hash: &str) -> PrometheusMetric {
        PrometheusMetric {
            query: Some(self.resolve(query, hash)),
            range_query: None,
            ..self.prometheus.clone()
        }
    }

    fn side(&self, hash: &str) -> PrometheusMetric {
        PrometheusMetric {
            query: Some(self.resolve(&self.query, hash)),
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
        /// `query`, `canary`, `baseline`, `errors` or `total`.
        field: &'static str,
        metric: String,
    },
    #[error(
        "provider.judge.query of metric {metric:?} is set with kind: ratio, which reads errors and \
         total instead: move the counts to errors and total, or use kind: continuous"
    )]
    QueryWithRatio { metric: String },
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
    let fields: [(&'static str, &String); 3] = match config.kind {
        JudgeKind::Continuous => [
            ("query", &query.query),
            ("canary", &query.canary),
            ("baseline", &query.baseline),
        ],
        JudgeKind::Ratio => {
            if !query.query.trim().is_empty() {
                return Err(JudgeSettingsError::QueryWithRatio {
                    metric: metric.name.clone(),
                });
            }
            [
                ("errors", &query.errors),
                ("canary", &query.canary),
                ("baseline", &query.baseline),
            ]
        }
    };
    if config.kind == JudgeKind::Ratio && query.total.trim().is_empty() {
        return Err(JudgeSettingsError::Empty {
            field: "total",
            metric: metric.name.clone(),
        });
    }
    for (field, value) in fields {
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
        let judged = match config.kind {
            JudgeKind::Continuous => self.continuous(run, &query, &config).await,
            JudgeKind::Ratio => self.ratio(run, &query, &config).await,
        };
        let (verdict, value, reason) = match judged {
            Ok(judged) => judged,
            Err(message) => return error_measurement(message, now),
        };
        let finished = |phase, message: String| Measurement {
            phase,
            message,
            value: value.to_string(),
            started_at: Some(Time(now)),
            finished_at: Some(Time(now)),
            ..Default::default()
        };
        if verdict == Verdict::NoData {
            let phase = match judge::no_data_outcome(config.no_data) {
                NoDataPhase::Successful => AnalysisPhase::Successful,
                NoDataPhase::Inconclusive => AnalysisPhase::Inconclusive,
                NoDataPhase::Failed => AnalysisPhase::Failed,
            };
            return finished(phase, reason);
        }
        match condition::evaluate_metric(&condition::from_json(&value), metric) {
            Ok(phase) => finished(phase, reason),
            Err(e) => error_measurement(e.to_string(), now),
        }
    }

    /// Range-queries both sides and compares their samples: (verdict, value, reason).
    async fn continuous(
        &self,
        run: RunContext<'_>,
        query: &JudgeQuery,
        config: &JudgeConfig,
    ) -> Result<(Verdict, serde_json::Value, String), String> {
        let (canary_side, baseline_side) = (query.side(&query.canary), query.side(&query.baseline));
        let canary = self.prometheus.query(&canary_side, run);
        let baseline = self.prometheus.query(&baseline_side, run);
        let (canary, baseline) = match futures::join!(canary, baseline) {
            (Ok(c), Ok(b)) => (samples(&c), samples(&b)),
            (Err(e), _) => return Err(format!("canary query: {e}")),
            (_, Err(e)) => return Err(format!("baseline query: {e}")),
        };
        let outcome = judge::judge(&canary, &baseline, config).map_err(|e| e.to_string())?;
        let value = serde_json::to_value(&outcome).unwrap_or_default();
        Ok((outcome.verdict, value, outcome.reason))
    }

    /// Instant-queries each side's error and request counts and compares the rates.
    async fn ratio(
        &self,
        run: RunContext<'_>,
        query: &JudgeQuery,
        config: &JudgeConfig,
    ) -> Result<(Verdict, serde_json::Value, String), String> {
        let count = |what: &'static str, text: &str, hash: &str| {
            let side = query.count(text, hash);
            async move {
                let data = self
                    .prometheus
                    .query(&side, run)
                    .await
                    .map_err(|e| format!("{what} query: {e}"))?;
                single_count(&samples(&data)).map_err(|e| format!("{what} query: {e}"))
            }
        };
        let (canary_errors, canary_total, baseline_errors, baseline_total) = futures::join!(
            count("canary errors", &query.errors, &query.canary),
            count("canary total", &query.total, &query.canary),
            count("baseline errors", &query.errors, &query.baseline),
            count("baseline total", &query.total, &query.baseline),
        );
        let canary = Counts {
            errors: canary_errors?,
            total: canary_total?,
        };
        let baseline = Counts {
            errors: baseline_errors?,
            total: baseline_total?,
        };
        let outcome = judge::judge_rates(canary, baseline, config).map_err(|e| e.to_string())?;
        let value = serde_json::to_value(&outcome).unwrap_or_default();
        Ok((outcome.verdict, value, outcome.reason))
    }
}

/// The one number a count query gives: nothing (no series yet) is 0, several series are an
/// error (the query must `sum` them).
fn single_count(values: &[f64]) -> Result<f64, String> {
    match values {
        [] => Ok(0.0),
        [one] => Ok(*one),
        many => Err(format!(
            "it returned {} series, and a count must be one number: wrap it in sum(...)",
            many.len()
        )),
    }
}

impl MetricProvider for BaselineJudgeProvider {
    fn kind(&self) -> &'static str {
        "Judge"
    }

    fn metadata(&self, metric: &Metric) -> BTreeMap<String, String> {
        let Ok((query, config)) = settings(metric) else {
            return BTreeMap::new();
        };
        let resolved = |text: &str| {
            [
                (CANARY_QUERY_KEY, query.resolve(text, &query.canary)),
                (BASELINE_QUERY_KEY, query.resolve(text, &query.baseline)),
            ]
        };
        match config.kind {
            JudgeKind::Continuous => resolved(&query.query)
                .into_iter()
                .map(|(key, text)| (key.to_string(), text))
                .collect(),
            JudgeKind::Ratio => {
                let errors = resolved(&query.errors)
                    .into_iter()
                    .map(|(key, text)| (format!("{key}Errors"), text));
                let total = resolved(&query.total)
                    .into_iter()
                    .map(|(key, text)| (format!("{key}Total"), text));
                errors.chain(total).collect()
            }
        }
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
