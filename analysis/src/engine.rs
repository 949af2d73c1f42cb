//! The AnalysisRun engine, as pure functions over a run's spec, its status and `now`: which
//! metrics are due for a measurement, how a finished measurement changes a metric's counters
//! and phase, the run's phase (its worst metric, dry-run metrics aside), summaries, measurement
//! retention, termination, and the exact time anything is next due. Argo Rollouts' semantics,
//! plus `consecutiveFailureLimit`.
//!
//! A reconcile is: [`plan`] -> take the measurements of [`Schedule::tasks`] (I/O, elsewhere) ->
//! [`conclude`] with them, which returns the new status, events and when to look again.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use regex::Regex;
use rollouts_crds::analysis::{
    AnalysisPhase, AnalysisRunSpec, AnalysisRunStatus, DryRun, Measurement, MeasurementRetention,
    Metric, MetricResult, RunSummary, int_or_string_value, validate_metrics,
};
use rollouts_crds::duration;

use crate::args;

/// Measurements kept per metric when no retention rule says otherwise.
pub const DEFAULT_MEASUREMENT_HISTORY_LIMIT: usize = 10;
/// Wait before measuring again after an Error, or when a metric has no interval.
pub const DEFAULT_ERROR_RETRY_INTERVAL: Duration = Duration::from_secs(10);
/// Errors in a row tolerated when `consecutiveErrorLimit` is not set.
pub const DEFAULT_CONSECUTIVE_ERROR_LIMIT: i64 = 4;
/// Message of a measurement cut short by termination that had not failed.
pub const METRIC_TERMINATED_MESSAGE: &str = "Metric Terminated";
/// Message of a run stopped through `spec.terminate`.
pub const RUN_TERMINATED_MESSAGE: &str = "Run Terminated";

/// What a reconcile has to do for a run.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// The run has finished; nothing to do.
    Completed,
    /// The spec cannot be run; the run ends in Error with this message (see [`invalid`]).
    Invalid { message: String },
    /// Measurements to take now (possibly none).
    Measure(Schedule),
}

/// The measurements due now, and what [`conclude`] needs to fold them in.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    /// The run's metrics with arguments substituted (secrets replaced by a placeholder).
    pub metrics: Vec<Metric>,
    /// Measurements to start, resume or terminate now.
    pub tasks: Vec<MeasurementTask>,
    /// Names of the metrics run in dry-run mode.
    pub dry_run: BTreeSet<String>,
    /// Measurements to keep per metric, when a retention rule matches it.
    pub retention: BTreeMap<String, usize>,
    /// The run is stopping: through `spec.terminate`, or because a metric already failed,
    /// errored or was inconclusive.
    pub terminating: bool,
}

/// One measurement to take for a metric.
#[derive(Clone, Debug, PartialEq)]
pub struct MeasurementTask {
    /// The metric as written in the spec (arguments not substituted: secrets are resolved by
    /// the caller, see [`crate::args`]).
    pub metric: Metric,
    pub action: MeasurementAction,
    /// This measurement's number for the metric: measurements finished so far (errors
    /// included) + 1. Names the Job of a Job metric.
    pub number: i32,
}

/// What to do with a metric's provider.
#[derive(Clone, Debug, PartialEq)]
pub enum MeasurementAction {
    /// Take a new measurement.
    Start,
    /// Continue the in-flight measurement (e.g. a Job still running).
    Resume(Measurement),
    /// Stop the in-flight measurement: the run is terminating.
    Terminate(Measurement),
}

/// A measurement a provider returned for a task.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TakenMeasurement {
    pub metric_name: String,
    pub measurement: Measurement,
    /// It continues the metric's last (in-flight) measurement rather than adding one.
    pub resumed: bool,
    /// Provider metadata stored in a new metric result (e.g. the resolved Prometheus query).
    pub metadata: BTreeMap<String, String>,
}

/// An event to record on the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunEvent {
    /// `AnalysisRun<Phase>` or `Metric<Phase>`, as Argo names them.
    pub reason: String,
    pub message: String,
    /// Failed and Error are warnings.
    pub warning: bool,
}

/// The result of a reconcile.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub status: AnalysisRunStatus,
    pub events: Vec<RunEvent>,
    /// When the run must be looked at again (`None`: only when something changes).
    pub requeue_at: Option<Timestamp>,
}

fn time(ts: Timestamp) -> Time {
    Time(ts)
}

fn add(ts: Timestamp, d: Duration) -> Timestamp {
    ts.checked_add(d).unwrap_or(Timestamp::MAX)
}

fn limit_value(
    value: Option<&k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>,
) -> Option<i64> {
    // A limit that is not a number counts as 0, as Argo's IntValue does; validation reports it.
    value.map(|v| int_or_string_value(v).unwrap_or(0))
}

/// `None` when unset; `Some(None)` when it is not a duration (validation reports it).
fn parse_duration(text: Option<&str>) -> Option<Option<Duration>> {
    text.filter(|t| !t.is_empty())
        .map(|t| duration::parse(t).ok())
}

/// The failure limit in force: as written; unset means 0, as in Argo, except that a metric
/// with a `consecutiveFailureLimit` and no `failureLimit` counts failures only in a row.
pub fn failure_limit(metric: &Metric) -> i64 {
    match limit_value(metric.failure_limit.as_ref()) {
        Some(limit) => limit,
        None if consecutive_failure_limit(metric) > 0 => -1,
        None => 0,
    }
}

/// `inconclusiveLimit` (default 0).
pub fn inconclusive_limit(metric: &Metric) -> i64 {
    limit_value(metric.inconclusive_limit.as_ref()).unwrap_or(0)
}

/// `consecutiveErrorLimit` (default 4).
pub fn consecutive_error_limit(metric: &Metric) -> i64 {
    limit_value(metric.consecutive_error_limit.as_ref()).unwrap_or(DEFAULT_CONSECUTIVE_ERROR_LIMIT)
}

/// `consecutiveSuccessLimit` (default 0: disabled).
pub fn consecutive_success_limit(metric: &Metric) -> i64 {
    limit_value(metric.consecutive_success_limit.as_ref()).unwrap_or(0)
}

/// `consecutiveFailureLimit` (default 0: disabled).
pub fn consecutive_failure_limit(metric: &Metric) -> i64 {
    limit_value(metric.consecutive_failure_limit.as_ref()).unwrap_or(0)
}

/// Why a `dryRun` or `measurementRetention` rule cannot be applied. Each names the rule
/// (`field[index]`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RuleError {
    #[error("{field}[{index}]: metricName {pattern:?} is not a regular expression: {source}")]
    NotARegex {
        /// `dryRun` or `measurementRetention`.
        field: &'static str,
        index: usize,
        pattern: String,
        #[source]
        source: regex::Error,
    },
    #[error("{field}[{index}]: Rule didn't match any metric name(s)")]
    NoMatch { field: &'static str, index: usize },
}

/// Metric names matched (anywhere in the name, as Go's `regexp.MatchString`) by the rule
/// patterns; every rule must match at least one metric.
fn match_rules<'a>(
    patterns: impl Iterator<Item = &'a str>,
    metrics: &[Metric],
    field: &'static str,
) -> Result<Vec<(usize, Vec<String>)>, RuleError> {
    let mut matches = Vec::new();
    for (i, pattern) in patterns.enumerate() {
        let regex = bounded_regex(pattern).map_err(|source| RuleError::NotARegex {
            field,
            index: i,
            pattern: pattern.to_string(),
            source,
        })?;
        let names: Vec<String> = metrics
            .iter()
            .filter(|m| regex.is_match(&m.name))
            .map(|m| m.name.clone())
            .collect();
        if names.is_empty() {
            return Err(RuleError::NoMatch { field, index: i });
        }
        matches.push((i, names));
    }
    Ok(matches)
}

/// The largest compiled program a `metricName` pattern may become (the regex crate's own
/// default is 10 MiB); a pattern over it is an error naming the rule, not a memory cost.
pub const MAX_RULE_REGEX_SIZE: usize = 1 << 20;

/// A `metricName` pattern compiled within [`MAX_RULE_REGEX_SIZE`], its lazy DFA within the
/// same budget.
fn bounded_regex(pattern: &str) -> Result<Regex, regex::Error> {
    regex::RegexBuilder::new(pattern)
        .size_limit(MAX_RULE_REGEX_SIZE)
        .dfa_size_limit(MAX_RULE_REGEX_SIZE)
        .build()
}

/// Names of the metrics that run in dry-run mode.
pub fn dry_run_metrics(
    rules: &[DryRun],
    metrics: &[Metric],
) -> Result<BTreeSet<String>, RuleError> {
    let matches = match_rules(
        rules.iter().map(|r| r.metric_name.as_str()),
        metrics,
        "dryRun",
    )?;
    Ok(matches.into_iter().flat_map(|(_, names)| names).collect())
}

/// Measurements to keep per metric; when several rules match a metric the last one wins.
pub fn retention_limits(
    rules: &[MeasurementRetention],
    metrics: &[Metric],
) -> Result<BTreeMap<String, usize>, RuleError> {
    let matches = match_rules(
        rules.iter().map(|r| r.metric_name.as_str()),
        metrics,
        "measurementRetention",
    )?;
    let mut limits = BTreeMap::new();
    for (i, names) in matches {
        let limit = usize::try_from(rules[i].limit).unwrap_or(0);
        for name in names {
            limits.insert(name, limit);
        }
    }
    Ok(limits)
}

/// The result of a metric, by name.
pub fn metric_result<'a>(status: &'a AnalysisRunStatus, name: &str) -> Option<&'a MetricResult> {
    status.metric_results.iter().find(|r| r.name == name)
}

fn last_measurement<'a>(status: &'a AnalysisRunStatus, name: &str) -> Option<&'a Measurement> {
    metric_result(status, name).and_then(|r| r.measurements.last())
}

fn metric_completed(status: &AnalysisRunStatus, name: &str) -> bool {
    metric_result(status, name).is_some_and(|r| r.phase.is_completed())
}

/// Whether the run is stopping: `spec.terminate`, or a metric (not in dry-run) has already
/// ended Failed, Error or Inconclusive.
pub fn is_terminating(spec: &AnalysisRunSpec, status: &AnalysisRunStatus) -> bool {
    spec.terminate
        || status.metric_results.iter().any(|r| {
            !r.dry_run
                && matches!(
                    r.phase,
                    AnalysisPhase::Failed | AnalysisPhase::Error | AnalysisPhase::Inconclusive
                )
        })
}

/// Decides what this reconcile does: nothing for a finished run, Error for a spec that cannot
/// run (unresolvable arguments, invalid metrics, dry-run or retention rules that match no
/// metric), otherwise the measurements due at `now`.
pub fn plan(spec: &AnalysisRunSpec, status: &AnalysisRunStatus, now: Timestamp) -> Plan {
    if status.phase.is_completed() {
        return Plan::Completed;
    }
    let invalid = |message: String| Plan::Invalid { message };
    let metrics = match args::values_without_secrets(&spec.args)
        .and_then(|values| args::resolve_metrics(&spec.metrics, &values))
    {
        Ok(metrics) => metrics,
        Err(e) => return invalid(format!("Unable to resolve metric arguments: {e}")),
    };
    if metrics.is_empty() {
        return invalid("Analysis spec invalid: no metrics specified".to_string());
    }
    if let Some(finding) = validate_metrics(&metrics, &spec.args, "spec").first() {
        return invalid(format!("Analysis spec invalid: {finding}"));
    }
    let dry_run = match dry_run_metrics(&spec.dry_run, &metrics) {
        Ok(names) => names,
        Err(e) => return invalid(format!("Analysis spec invalid: {e}")),
    };
    let retention = match retention_limits(&spec.measurement_retention, &metrics) {
        Ok(limits) => limits,
        Err(e) => return invalid(format!("Analysis spec invalid: {e}")),
    };
    let terminating = is_terminating(spec, status);
    let tasks = due_measurements(&spec.metrics, &metrics, status, terminating, now);
    Plan::Measure(Schedule {
        metrics,
        tasks,
        dry_run,
        retention,
        terminating,
    })
}

/// The measurements to take at `now`. `written` are the spec's metrics, `resolved` the same
/// with arguments substituted (used for intervals and counts). A measurement is due when its
/// time has come (`now` at or after it), so [`next_reconcile_time`] gives exactly that instant.
pub fn due_measurements(
    written: &[Metric],
    resolved: &[Metric],
    status: &AnalysisRunStatus,
    terminating: bool,
    now: Timestamp,
) -> Vec<MeasurementTask> {
    let mut tasks = Vec::new();
    for (written, metric) in written.iter().zip(resolved) {
        if metric_completed(status, &metric.name) {
            continue;
        }
        let number = metric_result(status, &metric.name)
            .map_or(1, |r| r.count.saturating_add(r.error).saturating_add(1));
        let task = |action| MeasurementTask {
            metric: written.clone(),
            action,
            number,
        };
        let last = last_measurement(status, &metric.name);
        if let Some(in_flight) = last.filter(|m| m.finished_at.is_none()) {
            let resume_later = in_flight.resume_at.as_ref().is_some_and(|at| at.0 > now);
            if terminating {
                tasks.push(task(MeasurementAction::Terminate(in_flight.clone())));
            } else if !resume_later {
                tasks.push(task(MeasurementAction::Resume(in_flight.clone())));
            }
            continue;
        }
        if terminating {
            continue;
        }
        let Some(last) = last else {
            match parse_duration(metric.initial_delay.as_deref()) {
                None => tasks.push(task(MeasurementAction::Start)),
                Some(Some(delay)) => {
                    // The delay counts from the run's start, which the first reconcile records.
                    if let Some(started) = &status.started_at
                        && add(started.0, delay) <= now
                    {
                        tasks.push(task(MeasurementAction::Start));
                    }
                }
                Some(None) => {}
            }
            continue;
        };
        if count_reached(metric, status) {
            continue;
        }
        let Some(interval) = retry_interval(metric, last) else {
            continue;
        };
        if let Some(finished) = &last.finished_at
            && add(finished.0, interval) <= now
        {
            tasks.push(task(MeasurementAction::Start));
        }
    }
    tasks
}

fn count_reached(metric: &Metric, status: &AnalysisRunStatus) -> bool {
    let count = metric_result(status, &metric.name).map_or(0, |r| i64::from(r.count));
    metric
        .effective_count()
        .is_some_and(|wanted| count >= wanted)
}

/// Time between the last measurement and the next: 10s after an Error, else the interval (10s
/// when the metric has none). `None` when the interval does not parse.
fn retry_interval(metric: &Metric, last: &Measurement) -> Option<Duration> {
    if last.phase == AnalysisPhase::Error {
        return Some(DEFAULT_ERROR_RETRY_INTERVAL);
    }
    match parse_duration(metric.interval.as_deref()) {
        None => Some(DEFAULT_ERROR_RETRY_INTERVAL),
        Some(Some(interval)) => Some(interval),
        Some(None) => None,
    }
}

/// Folds a measurement into a metric result: a finished one gets `finishedAt` (if the provider
/// did not set it) and moves the counters; it is appended, or replaces the last (in-flight)
/// measurement when `resumed`.
pub fn fold_measurement(
    result: &mut MetricResult,
    mut measurement: Measurement,
    resumed: bool,
    now: Timestamp,
) {
    if measurement.phase.is_completed() {
        if measurement.finished_at.is_none() {
            measurement.finished_at = Some(time(now));
        }
        match measurement.phase {
            AnalysisPhase::Successful => {
                result.successful = result.successful.saturating_add(1);
                result.count = result.count.saturating_add(1);
                result.consecutive_error = 0;
                result.consecutive_success = result.consecutive_success.saturating_add(1);
                result.consecutive_failure = 0;
            }
            AnalysisPhase::Failed => {
                result.failed = result.failed.saturating_add(1);
                result.count = result.count.saturating_add(1);
                result.consecutive_error = 0;
                result.consecutive_success = 0;
                result.consecutive_failure = result.consecutive_failure.saturating_add(1);
            }
            AnalysisPhase::Inconclusive => {
                result.inconclusive = result.inconclusive.saturating_add(1);
                result.count = result.count.saturating_add(1);
                result.consecutive_error = 0;
                result.consecutive_success = 0;
                result.consecutive_failure = 0;
            }
            // An error measured nothing: it neither extends nor breaks a run of failures.
            _ => {
                result.error = result.error.saturating_add(1);
                result.consecutive_error = result.consecutive_error.saturating_add(1);
                result.consecutive_success = 0;
            }
        }
    }
    match result.measurements.last_mut() {
        Some(last) if resumed => *last = measurement,
        _ => result.measurements.push(measurement),
    }
}

/// Whether the metric's counters have crossed a limit, and which phase and reason that gives.
/// Checked in Argo's order (failures, inconclusive, errors), the last crossed winning; our
/// consecutive failures count as failures.
pub fn limit_crossed(metric: &Metric, result: &MetricResult) -> Option<(AnalysisPhase, String)> {
    let mut crossed = None;
    let failure_limit = failure_limit(metric);
    if failure_limit >= 0 && i64::from(result.failed) > failure_limit {
        crossed = Some((
            AnalysisPhase::Failed,
            format!(
                "failed ({}) > failureLimit ({failure_limit})",
                result.failed
            ),
        ));
    }
    let consecutive_failure_limit = consecutive_failure_limit(metric);
    if consecutive_failure_limit > 0
        && i64::from(result.consecutive_failure) >= consecutive_failure_limit
    {
        crossed = Some((
            AnalysisPhase::Failed,
            format!(
                "consecutiveFailures ({}) >= consecutiveFailureLimit ({consecutive_failure_limit})",
                result.consecutive_failure
            ),
        ));
    }
    let inconclusive_limit = inconclusive_limit(metric);
    if i64::from(result.inconclusive) > inconclusive_limit {
        crossed = Some((
            AnalysisPhase::Inconclusive,
            format!(
                "inconclusive ({}) > inconclusiveLimit ({inconclusive_limit})",
                result.inconclusive
            ),
        ));
    }
    let consecutive_error_limit = consecutive_error_limit(metric);
    if i64::from(result.consecutive_error) > consecutive_error_limit {
        crossed = Some((
            AnalysisPhase::Error,
            format!(
                "consecutiveErrors ({}) > consecutiveErrorLimit ({consecutive_error_limit})",
                result.consecutive_error
            ),
        ));
    }
    crossed
}

/// The phase of one metric from its measurements and limits.
pub fn metric_phase(metric: &Metric, result: &MetricResult, terminating: bool) -> AnalysisPhase {
    if result.phase.is_completed() {
        return result.phase;
    }
    let Some(last) = result.measurements.last() else {
        // Stopped before a single measurement: nothing went wrong.
        return if terminating {
            AnalysisPhase::Successful
        } else {
            AnalysisPhase::Pending
        };
    };
    if !last.phase.is_completed() {
        return AnalysisPhase::Running;
    }
    if let Some((phase, _)) = limit_crossed(metric, result) {
        return phase;
    }
    let success_limit = consecutive_success_limit(metric);
    if success_limit > 0 && i64::from(result.consecutive_success) >= success_limit {
        return AnalysisPhase::Successful;
    }
    if let Some(wanted) = metric.effective_count()
        && i64::from(result.count) >= wanted
    {
        let failure_applies = failure_limit(metric) >= 0;
        let success_applies = success_limit > 0;
        return match (failure_applies, success_applies) {
            // Neither limit decided within the count.
            (true, true) => AnalysisPhase::Inconclusive,
            // The successes in a row never came.
            (false, true) => AnalysisPhase::Failed,
            _ => AnalysisPhase::Successful,
        };
    }
    if terminating {
        return AnalysisPhase::Successful;
    }
    AnalysisPhase::Running
}

fn count_in(summary: &mut RunSummary, phase: Option<AnalysisPhase>) {
    match phase {
        Some(AnalysisPhase::Error) => summary.error = summary.error.saturating_add(1),
        Some(AnalysisPhase::Failed) => summary.failed = summary.failed.saturating_add(1),
        Some(AnalysisPhase::Inconclusive) => {
            summary.inconclusive = summary.inconclusive.saturating_add(1)
        }
        // Argo counts a completed metric that crossed no limit as successful.
        _ => summary.successful = summary.successful.saturating_add(1),
    }
}

fn event(reason: String, message: String, phase: AnalysisPhase) -> RunEvent {
    RunEvent {
        reason,
        message,
        warning: matches!(phase, AnalysisPhase::Failed | AnalysisPhase::Error),
    }
}

/// Updates each metric's phase and message, the summaries and `startedAt`, and returns the
/// run's phase and message: Running while any metric runs; once all are done (or the run is
/// terminating), the worst metric's phase in Argo's order, dry-run metrics left out.
pub fn assess_run(
    spec: &AnalysisRunSpec,
    status: &mut AnalysisRunStatus,
    schedule: &Schedule,
    now: Timestamp,
    events: &mut Vec<RunEvent>,
) -> (AnalysisPhase, String) {
    let terminating = is_terminating(spec, status);
    if status.started_at.is_none() {
        status.started_at = Some(time(now));
    }
    let mut worst: Option<AnalysisPhase> = None;
    let mut worst_message = if spec.terminate {
        RUN_TERMINATED_MESSAGE.to_string()
    } else {
        String::new()
    };
    let mut everything_completed = true;
    let mut run_summary = RunSummary::default();
    let mut dry_run_summary = RunSummary::default();

    for metric in &schedule.metrics {
        let dry_run = schedule.dry_run.contains(&metric.name);
        if dry_run {
            dry_run_summary.count += 1;
        } else {
            run_summary.count += 1;
        }
        let Some(result) = status
            .metric_results
            .iter_mut()
            .find(|r| r.name == metric.name)
        else {
            // Not started yet (e.g. waiting for its initial delay).
            everything_completed = false;
            continue;
        };
        let phase = metric_phase(metric, result, terminating);
        if result.phase != phase {
            if phase.is_completed() {
                let mut message = format!("Metric '{}' Completed. Result: {phase}", metric.name);
                // A judge's last reason says by how much, in the metric's unit (Argo's text first).
                if metric.provider.judge.is_some()
                    && let Some(last) = result.measurements.last()
                    && !last.message.is_empty()
                {
                    message.push_str(": ");
                    message.push_str(&last.message);
                }
                events.push(event(format!("Metric{phase}"), message, phase));
            }
            if let Some(last) = result.measurements.last() {
                result.message = last.message.clone();
            }
            result.phase = phase;
        }
        if !phase.is_completed() {
            everything_completed = false;
            continue;
        }
        let crossed = limit_crossed(metric, result);
        let (crossed_phase, reason) = match crossed {
            Some((phase, reason)) => (Some(phase), reason),
            None => (None, String::new()),
        };
        if dry_run {
            worst.get_or_insert(AnalysisPhase::Successful);
            if !reason.is_empty() {
                result.message = format!("Metric assessed {phase} due to {reason}");
            }
            count_in(&mut dry_run_summary, crossed_phase);
            continue;
        }
        if worst.is_none_or(|w| phase.is_worse_than(w)) {
            worst = Some(phase);
            if !reason.is_empty() {
                worst_message = format!(
                    "Metric \"{}\" assessed {phase} due to {reason}",
                    metric.name
                );
                if !result.message.is_empty() {
                    worst_message.push_str(&format!(": \"Error Message: {}\"", result.message));
                }
            }
        }
        count_in(&mut run_summary, crossed_phase);
    }
    status.run_summary = run_summary;
    status.dry_run_summary = Some(dry_run_summary);
    let worst_message = worst_message.trim().to_string();
    if terminating {
        return (worst.unwrap_or(AnalysisPhase::Successful), worst_message);
    }
    match worst {
        Some(worst) if everything_completed => (worst, worst_message),
        _ => (AnalysisPhase::Running, String::new()),
    }
}

/// Keeps the most recent measurements of each metric: the retention rule's limit when it is
/// above 0, else [`DEFAULT_MEASUREMENT_HISTORY_LIMIT`].
pub fn trim_measurements(status: &mut AnalysisRunStatus, retention: &BTreeMap<String, usize>) {
    for result in &mut status.metric_results {
        let limit = retention
            .get(&result.name)
            .copied()
            .filter(|l| *l > 0)
            .unwrap_or(DEFAULT_MEASUREMENT_HISTORY_LIMIT);
        let excess = result.measurements.len().saturating_sub(limit);
        result.measurements.drain(..excess);
    }
}

/// The earliest time a metric of the run is next due: the end of an initial delay, an
/// in-flight measurement's `resumeAt`, or the last measurement's finish plus its interval
/// (10s after an Error). `None` when nothing is scheduled.
pub fn next_reconcile_time(
    metrics: &[Metric],
    status: &AnalysisRunStatus,
    now: Timestamp,
) -> Option<Timestamp> {
    let mut earliest: Option<Timestamp> = None;
    let mut consider = |at: Timestamp| {
        if earliest.is_none_or(|e| at < e) {
            earliest = Some(at);
        }
    };
    for metric in metrics {
        if metric_completed(status, &metric.name) {
            continue;
        }
        let Some(last) = last_measurement(status, &metric.name) else {
            if let Some(Some(delay)) = parse_duration(metric.initial_delay.as_deref()) {
                let started = status.started_at.as_ref().map_or(now, |t| t.0);
                consider(add(started, delay));
            }
            continue;
        };
        let Some(finished) = &last.finished_at else {
            if let Some(resume_at) = &last.resume_at {
                consider(resume_at.0);
            }
            continue;
        };
        if count_reached(metric, status) {
            continue;
        }
        let interval = if last.phase == AnalysisPhase::Error {
            DEFAULT_ERROR_RETRY_INTERVAL
        } else {
            match parse_duration(metric.interval.as_deref()) {
                Some(Some(interval)) => interval,
                _ => continue,
            }
        };
        consider(add(finished.0, interval));
    }
    earliest
}

/// The status of a run that cannot be run: Error with `message`.
pub fn invalid(status: &AnalysisRunStatus, message: &str, now: Timestamp) -> Outcome {
    let mut status = status.clone();
    status.phase = AnalysisPhase::Error;
    status.message = message.to_string();
    status.started_at.get_or_insert_with(|| time(now));
    status.completed_at.get_or_insert_with(|| time(now));
    Outcome {
        status,
        events: vec![event(
            "AnalysisRunError".to_string(),
            "Analysis Completed. Result: Error".to_string(),
            AnalysisPhase::Error,
        )],
        requeue_at: None,
    }
}

/// Folds the measurements taken for `schedule` into the status, assesses metrics and run,
/// trims measurement history, and says when to look again. A run that starts terminating in
/// this pass (a metric just failed) is looked at again at once, to stop its other metrics.
pub fn conclude(
    spec: &AnalysisRunSpec,
    status: &AnalysisRunStatus,
    schedule: &Schedule,
    taken: Vec<TakenMeasurement>,
    now: Timestamp,
) -> Outcome {
    let mut status = status.clone();
    let mut events = Vec::new();
    for taken in taken {
        let index = match status
            .metric_results
            .iter()
            .position(|r| r.name == taken.metric_name)
        {
            Some(index) => index,
            None => {
                status.metric_results.push(MetricResult {
                    name: taken.metric_name.clone(),
                    phase: AnalysisPhase::Running,
                    dry_run: schedule.dry_run.contains(&taken.metric_name),
                    metadata: taken.metadata.clone(),
                    ..Default::default()
                });
                status.metric_results.len() - 1
            }
        };
        let mut measurement = taken.measurement;
        if matches!(
            measurement.phase,
            AnalysisPhase::Successful | AnalysisPhase::Inconclusive
        ) && schedule.terminating
            && taken.resumed
        {
            measurement.message = METRIC_TERMINATED_MESSAGE.to_string();
        }
        fold_measurement(
            &mut status.metric_results[index],
            measurement,
            taken.resumed,
            now,
        );
    }

    let (phase, message) = assess_run(spec, &mut status, schedule, now, &mut events);
    if phase != status.phase {
        status.phase = phase;
        status.message = message;
        if phase.is_completed() {
            events.push(event(
                format!("AnalysisRun{phase}"),
                format!("Analysis Completed. Result: {phase}"),
                phase,
            ));
            status.completed_at.get_or_insert_with(|| time(now));
        }
    }
    trim_measurements(&mut status, &schedule.retention);

    let requeue_at = if status.phase.is_completed() {
        None
    } else if is_terminating(spec, &status) && !schedule.terminating {
        Some(now)
    } else {
        next_reconcile_time(&schedule.metrics, &status, now)
    };
    Outcome {
        status,
        events,
        requeue_at,
    }
}

#[cfg(test)]
mod tests;
