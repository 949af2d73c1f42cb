//! What one AnalysisRun may cost the controller, checked before it is planned: a value out of
//! bounds ends the run in `Error` with a message naming the metric, the field, the value and
//! the fix, never a panic, a spinning requeue loop or an unbounded status. Also the bounds of
//! every requeue.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use rollouts_analysis::provider::MAX_TIMEOUT;
use rollouts_analysis::{args, condition};
use rollouts_crds::FieldError;
use rollouts_crds::analysis::{AnalysisRunSpec, AnalysisRunStatus, Metric, int_or_string_value};
use rollouts_crds::duration;

/// The shortest `interval`: a metric is measured at most once a second.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// The most metrics one run may have (each keeps a result in the run's status).
pub const MAX_METRICS: usize = 100;
/// The largest `measurementRetention[].limit`.
pub const MAX_MEASUREMENT_RETENTION: i32 = 100;
/// A run is looked at again no sooner than this, whatever its schedule says.
pub const MIN_REQUEUE: Duration = Duration::from_secs(1);
/// A run is looked at again no later than this (its due times are then computed afresh).
pub const MAX_REQUEUE: Duration = Duration::from_secs(3600);

/// Measurements in flight at once, across all runs, when the controller is not told otherwise
/// (`--analysis-measurement-concurrency`).
pub const DEFAULT_MEASUREMENT_CONCURRENCY: u16 = 32;
/// Time a measurement may take beyond its provider's [`MAX_TIMEOUT`] (an OAuth2 token and the
/// query each have that timeout; the whole measurement is cut at the sum).
pub const MEASUREMENT_GRACE: Duration = MAX_TIMEOUT;

/// What the controller's flags allow every run together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// `--analysis-max-response-bytes`: bytes of a provider's answer read at most.
    pub max_response_bytes: usize,
    /// `--analysis-measurement-concurrency`: measurements in flight at once, all runs together.
    pub measurement_concurrency: u16,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_response_bytes: rollouts_analysis::provider::DEFAULT_MAX_RESPONSE_BYTES,
            measurement_concurrency: DEFAULT_MEASUREMENT_CONCURRENCY,
        }
    }
}

impl Limits {
    /// Measurements one run may have in flight at once: a quarter of the budget (at least
    /// one), so that a run with many slow metrics leaves room for the others.
    pub fn per_run(&self) -> usize {
        usize::from(self.measurement_concurrency / 4).max(1)
    }
}

/// Checks the run's metrics (with their arguments substituted, secrets left as a placeholder)
/// against the controller's bounds; the first value out of bounds, if any.
pub fn check(spec: &AnalysisRunSpec) -> Result<(), FieldError> {
    if spec.metrics.len() > MAX_METRICS {
        return Err(FieldError::new(
            "spec.metrics",
            format!(
                "{} metrics are more than the {MAX_METRICS} one run may have",
                spec.metrics.len()
            ),
            "split the analysis into several templates or runs",
        ));
    }
    for (index, rule) in spec.measurement_retention.iter().enumerate() {
        if !(0..=MAX_MEASUREMENT_RETENTION).contains(&rule.limit) {
            return Err(FieldError::new(
                format!("spec.measurementRetention[{index}].limit"),
                format!(
                    "{} is outside 0..={MAX_MEASUREMENT_RETENTION} (metricName {:?})",
                    rule.limit, rule.metric_name
                ),
                format!("keep at most {MAX_MEASUREMENT_RETENTION} measurements per metric"),
            ));
        }
    }
    // Arguments that do not resolve are reported, with their own message, by the planner.
    let Ok(metrics) = args::values_without_secrets(&spec.args)
        .and_then(|values| args::resolve_metrics(&spec.metrics, &values))
    else {
        return Ok(());
    };
    for (index, metric) in metrics.iter().enumerate() {
        check_metric(metric, &format!("spec.metrics[{index}]"))?;
    }
    Ok(())
}

fn check_metric(metric: &Metric, at: &str) -> Result<(), FieldError> {
    let field = |name: &str| format!("{at}.{name} (metric {:?})", metric.name);
    if let Some(text) = metric.interval.as_deref().filter(|t| !t.is_empty()) {
        let interval = duration::parse(text).map_err(|e| {
            FieldError::new(
                field("interval"),
                e.to_string(),
                "write the interval as a Go duration between 1s and 8760h, such as 30s or 5m",
            )
        })?;
        if interval < MIN_INTERVAL {
            return Err(FieldError::new(
                field("interval"),
                format!("{text:?} is below the minimum of 1s"),
                "measure at most once a second: set interval to 1s or more",
            ));
        }
    }
    if let Some(text) = metric.initial_delay.as_deref().filter(|t| !t.is_empty()) {
        duration::parse(text).map_err(|e| {
            FieldError::new(
                field("initialDelay"),
                e.to_string(),
                "write the delay as a Go duration of at most 8760h, such as 30s or 5m",
            )
        })?;
    }
    for (name, condition) in [
        ("successCondition", &metric.success_condition),
        ("failureCondition", &metric.failure_condition),
    ] {
        if let Some(condition) = condition.as_deref().filter(|c| !c.is_empty()) {
            condition::check_parses(condition).map_err(|e| {
                FieldError::new(
                    field(name),
                    format!("does not parse: {e}"),
                    format!(
                        "write {name} as an expression over result, such as \"result[0] >= 0.95\""
                    ),
                )
            })?;
        }
    }
    let limits = [
        ("count", metric.count.as_ref(), 0),
        ("failureLimit", metric.failure_limit.as_ref(), -1),
        ("inconclusiveLimit", metric.inconclusive_limit.as_ref(), 0),
        (
            "consecutiveErrorLimit",
            metric.consecutive_error_limit.as_ref(),
            0,
        ),
        (
            "consecutiveSuccessLimit",
            metric.consecutive_success_limit.as_ref(),
            0,
        ),
        (
            "consecutiveFailureLimit",
            metric.consecutive_failure_limit.as_ref(),
            0,
        ),
    ];
    for (name, value, min) in limits {
        check_limit(value, min).map_err(|(value, reason)| {
            FieldError::new(
                field(name),
                format!("{value:?} {reason}"),
                format!("set {name} to an integer from {min} to {}", i32::MAX),
            )
        })?;
    }
    let max = MAX_TIMEOUT.as_secs();
    if let Some(web) = &metric.provider.web
        && let Some(seconds) = web.timeout_seconds
        && u64::try_from(seconds).is_ok_and(|s| s > max)
    {
        return Err(FieldError::new(
            field("provider.web.timeoutSeconds"),
            format!("{seconds} is above the controller's maximum of {max}"),
            format!("set timeoutSeconds to {max} or less (0 or unset means 10)"),
        ));
    }
    if let Some(prometheus) = &metric.provider.prometheus
        && let Some(seconds) = prometheus.timeout
        && (seconds < 0 || u64::try_from(seconds).is_ok_and(|s| s > max))
    {
        return Err(FieldError::new(
            field("provider.prometheus.timeout"),
            format!("{seconds} is outside 0..={max} seconds"),
            format!("set timeout to a number of seconds from 0 to {max} (unset means 30)"),
        ));
    }
    Ok(())
}

/// The largest counter a metric result may hold (`count`, `failed`, ...): well below
/// `i32::MAX`, so that counting on can never overflow.
pub const MAX_COUNTER: i32 = 1_000_000_000;

/// Checks the counters of the run's status, which the engine counts on from: a status edited
/// by hand to a number near `i32::MAX` ends the run in Error rather than overflowing.
pub fn check_status(status: &AnalysisRunStatus) -> Result<(), FieldError> {
    for (index, result) in status.metric_results.iter().enumerate() {
        let counters = [
            ("count", result.count),
            ("successful", result.successful),
            ("failed", result.failed),
            ("inconclusive", result.inconclusive),
            ("error", result.error),
            ("consecutiveError", result.consecutive_error),
            ("consecutiveSuccess", result.consecutive_success),
            ("consecutiveFailure", result.consecutive_failure),
        ];
        for (name, value) in counters {
            if !(0..=MAX_COUNTER).contains(&value) {
                return Err(FieldError::new(
                    format!(
                        "status.metricResults[{index}].{name} (metric {:?})",
                        result.name
                    ),
                    format!("{value} is outside 0..={MAX_COUNTER}"),
                    "the status was edited by hand: recreate the AnalysisRun",
                ));
            }
        }
    }
    Ok(())
}

/// A limit within `min..=i32::MAX`; otherwise the value as written and why not.
fn check_limit(value: Option<&IntOrString>, min: i64) -> Result<(), (String, String)> {
    let Some(value) = value else { return Ok(()) };
    let written = match value {
        IntOrString::Int(i) => i.to_string(),
        IntOrString::String(s) => s.clone(),
    };
    match int_or_string_value(value) {
        Err(e) => Err((written, format!("is not an integer: {e}"))),
        Ok(v) if v < min || v > i64::from(i32::MAX) => {
            Err((written, format!("is outside {min}..={}", i32::MAX)))
        }
        Ok(_) => Ok(()),
    }
}

/// The wait before the next look at a run, kept within [`MIN_REQUEUE`]..=[`MAX_REQUEUE`]: no
/// schedule can make the controller spin on a run, or ask for a timer it cannot set.
pub fn bounded_requeue(wait: Duration) -> Duration {
    wait.clamp(MIN_REQUEUE, MAX_REQUEUE)
}

#[cfg(test)]
mod tests {
    use rollouts_crds::analysis::{MetricProvider, PrometheusMetric, WebMetric};
    use rollouts_crds::rollout::{AnalysisRunArgument, MeasurementRetention};

    use super::*;

    fn spec(metric: Metric) -> AnalysisRunSpec {
        AnalysisRunSpec {
            metrics: vec![Metric {
                name: "rate".into(),
                ..metric
            }],
            ..AnalysisRunSpec::default()
        }
    }

    fn refused(spec: &AnalysisRunSpec) -> String {
        check(spec).expect_err("out of bounds").to_string()
    }

    #[test]
    fn intervals_below_a_second_or_unparsable_are_refused_naming_metric_field_and_fix() {
        let message = refused(&spec(Metric {
            interval: Some("0s".into()),
            ..Metric::default()
        }));
        assert!(
            message.contains("spec.metrics[0].interval (metric \"rate\")")
                && message.contains("\"0s\" is below the minimum of 1s")
                && message.contains("set interval to 1s or more"),
            "{message}"
        );
        for absurd in ["100000000000000000000s", "9000h", "-5s", "NaNs"] {
            let message = refused(&spec(Metric {
                interval: Some(absurd.into()),
                ..Metric::default()
            }));
            assert!(
                message.contains("interval (metric \"rate\")") && message.contains("8760h"),
                "{absurd}: {message}"
            );
        }
        assert_eq!(
            check(&spec(Metric {
                interval: Some("1s".into()),
                ..Metric::default()
            })),
            Ok(())
        );
        let message = refused(&spec(Metric {
            initial_delay: Some("100000000000000000000s".into()),
            ..Metric::default()
        }));
        assert!(message.contains("initialDelay"), "{message}");
    }

    #[test]
    fn intervals_from_arguments_are_checked_once_substituted() {
        let mut spec = spec(Metric {
            interval: Some("{{args.every}}".into()),
            ..Metric::default()
        });
        spec.args = vec![AnalysisRunArgument {
            name: "every".into(),
            value: Some("500ms".into()),
            value_from: None,
        }];
        assert!(refused(&spec).contains("\"500ms\" is below the minimum of 1s"));
    }

    #[test]
    fn a_condition_that_does_not_parse_is_refused_before_any_measurement() {
        let message = refused(&spec(Metric {
            success_condition: Some("result >>> ]] (".into()),
            ..Metric::default()
        }));
        assert!(
            message.contains("spec.metrics[0].successCondition (metric \"rate\")")
                && message.contains("does not parse")
                && message.contains("result[0] >= 0.95"),
            "{message}"
        );
        assert!(
            check(&spec(Metric {
                success_condition: Some("result[0] >= 0.95".into()),
                failure_condition: Some("isNaN(result[0])".into()),
                ..Metric::default()
            }))
            .is_ok()
        );
    }

    #[test]
    fn counts_and_limits_must_be_integers_in_range() {
        let message = refused(&spec(Metric {
            count: Some(IntOrString::String("9223372036854775807".into())),
            ..Metric::default()
        }));
        assert!(
            message.contains("count (metric \"rate\")")
                && message.contains("\"9223372036854775807\" is outside"),
            "{message}"
        );
        let message = refused(&spec(Metric {
            consecutive_error_limit: Some(IntOrString::Int(-3)),
            ..Metric::default()
        }));
        assert!(message.contains("consecutiveErrorLimit"), "{message}");
        let message = refused(&spec(Metric {
            failure_limit: Some(IntOrString::String("many".into())),
            ..Metric::default()
        }));
        assert!(message.contains("not an integer"), "{message}");
        // -1 is Argo's "no failure limit".
        assert_eq!(
            check(&spec(Metric {
                failure_limit: Some(IntOrString::Int(-1)),
                ..Metric::default()
            })),
            Ok(())
        );
    }

    #[test]
    fn timeouts_above_the_maximum_are_refused() {
        let message = refused(&spec(Metric {
            provider: MetricProvider {
                web: Some(WebMetric {
                    timeout_seconds: Some(3600),
                    ..WebMetric::default()
                }),
                ..MetricProvider::default()
            },
            ..Metric::default()
        }));
        assert!(
            message.contains("provider.web.timeoutSeconds") && message.contains("maximum of 60"),
            "{message}"
        );
        let message = refused(&spec(Metric {
            provider: MetricProvider {
                prometheus: Some(PrometheusMetric {
                    timeout: Some(i64::MAX),
                    ..PrometheusMetric::default()
                }),
                ..MetricProvider::default()
            },
            ..Metric::default()
        }));
        assert!(message.contains("provider.prometheus.timeout"), "{message}");
    }

    #[test]
    fn metric_counts_and_retention_are_bounded() {
        let many = AnalysisRunSpec {
            metrics: (0..=MAX_METRICS)
                .map(|i| Metric {
                    name: format!("m{i}"),
                    ..Metric::default()
                })
                .collect(),
            ..AnalysisRunSpec::default()
        };
        assert!(refused(&many).contains("more than the 100"));
        let mut retained = spec(Metric::default());
        retained.measurement_retention = vec![MeasurementRetention {
            metric_name: "rate".into(),
            limit: 1_000_000,
        }];
        let message = refused(&retained);
        assert!(
            message.contains("spec.measurementRetention[0].limit")
                && message.contains("at most 100"),
            "{message}"
        );
    }

    #[test]
    fn one_run_takes_at_most_a_quarter_of_the_measurement_budget() {
        let limits = |measurement_concurrency| Limits {
            measurement_concurrency,
            ..Limits::default()
        };
        assert_eq!(limits(32).per_run(), 8);
        assert_eq!(limits(2).per_run(), 1);
        assert_eq!(limits(1).per_run(), 1);
    }

    #[test]
    fn counters_near_overflow_in_a_status_are_refused() {
        let mut status = AnalysisRunStatus {
            metric_results: vec![rollouts_crds::analysis::MetricResult {
                name: "rate".into(),
                count: 3,
                ..Default::default()
            }],
            ..AnalysisRunStatus::default()
        };
        assert_eq!(check_status(&status), Ok(()));
        status.metric_results[0].error = i32::MAX;
        let message = check_status(&status).expect_err("overflows").to_string();
        assert!(
            message.contains("status.metricResults[0].error (metric \"rate\")")
                && message.contains("2147483647"),
            "{message}"
        );
    }

    #[test]
    fn requeues_never_spin_nor_overflow_a_timer() {
        assert_eq!(bounded_requeue(Duration::ZERO), MIN_REQUEUE);
        assert_eq!(
            bounded_requeue(Duration::from_secs(30)),
            Duration::from_secs(30)
        );
        assert_eq!(bounded_requeue(Duration::MAX), MAX_REQUEUE);
    }
}
