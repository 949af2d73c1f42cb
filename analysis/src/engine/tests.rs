//! Engine behaviour, one limit or edge per test, driven through plan -> measure -> conclude
//! with a scripted provider and an injected clock.

use std::collections::VecDeque;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use rollouts_crds::analysis::{
    AnalysisRunArgument, ArgumentValueFrom, MetricProvider, PrometheusMetric, SecretKeyRef,
};

use super::*;
use AnalysisPhase::*;

const T0: i64 = 1_714_557_600; // 2024-05-01T10:00:00Z

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(T0 + secs).unwrap()
}

fn metric(name: &str) -> Metric {
    Metric {
        name: name.into(),
        success_condition: Some("result[0] > 0".into()),
        provider: MetricProvider {
            prometheus: Some(PrometheusMetric {
                address: Some("http://prometheus:9090".into()),
                query: Some("up".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn every(mut m: Metric, interval: &str, count: Option<i32>) -> Metric {
    m.interval = Some(interval.into());
    m.count = count.map(IntOrString::Int);
    m
}

fn int(v: i32) -> Option<IntOrString> {
    Some(IntOrString::Int(v))
}

fn spec(metrics: Vec<Metric>) -> AnalysisRunSpec {
    AnalysisRunSpec {
        metrics,
        ..Default::default()
    }
}

fn measured(phase: AnalysisPhase, message: &str) -> Measurement {
    Measurement {
        phase,
        message: message.into(),
        value: "[1]".into(),
        ..Default::default()
    }
}

/// Phases each metric's provider answers, in order.
struct Script(BTreeMap<String, VecDeque<Measurement>>);

impl Script {
    fn new(entries: &[(&str, &[AnalysisPhase])]) -> Self {
        Script(
            entries
                .iter()
                .map(|(name, phases)| {
                    let measurements = phases.iter().map(|p| measured(*p, "")).collect();
                    (name.to_string(), measurements)
                })
                .collect(),
        )
    }

    fn next(&mut self, task: &MeasurementTask) -> TakenMeasurement {
        let (measurement, resumed) = match &task.action {
            MeasurementAction::Start => {
                let queue = self.0.get_mut(&task.metric.name).expect("scripted metric");
                (
                    queue.pop_front().expect("a scripted measurement left"),
                    false,
                )
            }
            MeasurementAction::Resume(m) | MeasurementAction::Terminate(m) => {
                let queue = self.0.get_mut(&task.metric.name).expect("scripted metric");
                let mut next = queue.pop_front().unwrap_or_else(|| m.clone());
                next.started_at = m.started_at.clone();
                (next, true)
            }
        };
        TakenMeasurement {
            metric_name: task.metric.name.clone(),
            measurement,
            resumed,
            metadata: BTreeMap::new(),
        }
    }
}

/// One reconcile at `now`: plan, take the due measurements from the script, conclude.
fn reconcile(
    spec: &AnalysisRunSpec,
    status: &AnalysisRunStatus,
    now: Timestamp,
    script: &mut Script,
) -> (Outcome, Vec<MeasurementTask>) {
    match plan(spec, status, now) {
        Plan::Completed => (
            Outcome {
                status: status.clone(),
                events: vec![],
                requeue_at: None,
            },
            vec![],
        ),
        Plan::Invalid { message } => (invalid(status, &message, now), vec![]),
        Plan::Measure(schedule) => {
            let taken = schedule.tasks.iter().map(|t| script.next(t)).collect();
            let outcome = conclude(spec, status, &schedule, taken, now);
            (outcome, schedule.tasks)
        }
    }
}

/// Reconciles at each requeue time until the run completes (at most `limit` passes).
fn run_to_completion(
    spec: &AnalysisRunSpec,
    script: &mut Script,
    limit: usize,
) -> Vec<(Timestamp, Outcome)> {
    let mut status = AnalysisRunStatus::default();
    let mut now = at(0);
    let mut passes = Vec::new();
    for _ in 0..limit {
        let (outcome, _) = reconcile(spec, &status, now, script);
        status = outcome.status.clone();
        let next = outcome.requeue_at;
        passes.push((now, outcome));
        match next {
            Some(next) => now = next,
            None => break,
        }
    }
    passes
}

fn last(passes: &[(Timestamp, Outcome)]) -> &AnalysisRunStatus {
    &passes.last().expect("at least one pass").1.status
}

fn result<'a>(status: &'a AnalysisRunStatus, name: &str) -> &'a MetricResult {
    metric_result(status, name).expect("metric result")
}

fn times(passes: &[(Timestamp, Outcome)]) -> Vec<i64> {
    passes.iter().map(|(t, _)| t.as_second() - T0).collect()
}

#[test]
fn a_single_measurement_decides_a_metric_without_interval() {
    let spec = spec(vec![metric("m")]);
    let passes = run_to_completion(&spec, &mut Script::new(&[("m", &[Successful])]), 5);
    assert_eq!(passes.len(), 1);
    let status = last(&passes);
    assert_eq!(status.phase, Successful);
    assert_eq!(status.started_at, Some(Time(at(0))));
    assert_eq!(status.completed_at, Some(Time(at(0))));
    assert_eq!(
        status.run_summary,
        RunSummary {
            count: 1,
            successful: 1,
            ..Default::default()
        }
    );
    let r = result(status, "m");
    assert_eq!(
        (r.phase, r.count, r.successful, r.consecutive_success),
        (Successful, 1, 1, 1)
    );
    assert_eq!(r.measurements[0].finished_at, Some(Time(at(0))));
    let events = &passes[0].1.events;
    assert_eq!(events.len(), 2);
    assert_eq!(events[0].reason, "MetricSuccessful");
    assert_eq!(events[1].reason, "AnalysisRunSuccessful");
    assert!(!events[1].warning);
}

#[test]
fn measurements_follow_the_interval_until_the_count() {
    let spec = spec(vec![every(metric("m"), "30s", Some(3))]);
    let mut script = Script::new(&[("m", &[Successful, Successful, Successful])]);
    let passes = run_to_completion(&spec, &mut script, 10);
    assert_eq!(times(&passes), [0, 30, 60]);
    assert_eq!(passes[0].1.requeue_at, Some(at(30)));
    assert_eq!(passes[1].1.status.phase, Running);
    assert_eq!(last(&passes).phase, Successful);
    assert_eq!(result(last(&passes), "m").count, 3);
}

#[test]
fn nothing_is_due_before_the_interval_has_passed() {
    let spec = spec(vec![every(metric("m"), "30s", Some(3))]);
    let mut script = Script::new(&[("m", &[Successful, Successful])]);
    let (first, _) = reconcile(&spec, &AnalysisRunStatus::default(), at(0), &mut script);
    let (early, tasks) = reconcile(&spec, &first.status, at(29), &mut script);
    assert!(tasks.is_empty());
    assert_eq!(
        early.status, first.status,
        "an early reconcile changes nothing"
    );
    assert_eq!(early.requeue_at, Some(at(30)));
    let (_, tasks) = reconcile(&spec, &first.status, at(30), &mut script);
    assert_eq!(tasks.len(), 1);
}

#[test]
fn initial_delay_counts_from_the_run_start() {
    let mut m = every(metric("m"), "1m", Some(1));
    m.initial_delay = Some("45s".into());
    let spec = spec(vec![m]);
    let mut script = Script::new(&[("m", &[Successful])]);
    let (first, tasks) = reconcile(&spec, &AnalysisRunStatus::default(), at(0), &mut script);
    assert!(tasks.is_empty());
    assert_eq!(first.status.phase, Running);
    assert_eq!(first.status.started_at, Some(Time(at(0))));
    assert_eq!(first.requeue_at, Some(at(45)));
    let (_, tasks) = reconcile(&spec, &first.status, at(44), &mut script);
    assert!(tasks.is_empty());
    let (done, tasks) = reconcile(&spec, &first.status, at(45), &mut script);
    assert_eq!(tasks.len(), 1);
    assert_eq!(done.status.phase, Successful);
}

#[test]
fn one_failure_fails_a_metric_by_default() {
    let spec = spec(vec![every(metric("m"), "30s", Some(5))]);
    let passes = run_to_completion(&spec, &mut Script::new(&[("m", &[Failed])]), 5);
    let status = last(&passes);
    assert_eq!(status.phase, Failed);
    assert_eq!(
        status.message,
        "Metric \"m\" assessed Failed due to failed (1) > failureLimit (0)"
    );
    assert_eq!(status.run_summary.failed, 1);
    assert!(
        passes[0]
            .1
            .events
            .iter()
            .any(|e| e.reason == "AnalysisRunFailed" && e.warning)
    );
}

#[test]
fn failure_limit_allows_that_many_failures() {
    let mut m = every(metric("m"), "10s", Some(6));
    m.failure_limit = int(2);
    let spec = spec(vec![m]);
    let mut script = Script::new(&[("m", &[Failed, Successful, Failed, Failed])]);
    let passes = run_to_completion(&spec, &mut script, 10);
    assert_eq!(times(&passes), [0, 10, 20, 30]);
    assert_eq!(passes[2].1.status.phase, Running);
    let status = last(&passes);
    assert_eq!(status.phase, Failed);
    assert!(status.message.contains("failed (3) > failureLimit (2)"));
}

#[test]
fn failure_limit_as_a_templated_string_is_resolved() {
    let mut m = every(metric("m"), "10s", Some(3));
    m.failure_limit = Some(IntOrString::String("{{args.limit}}".into()));
    let mut spec = spec(vec![m]);
    spec.args = vec![AnalysisRunArgument {
        name: "limit".into(),
        value: Some("1".into()),
        value_from: None,
    }];
    let mut script = Script::new(&[("m", &[Failed, Successful, Successful])]);
    let passes = run_to_completion(&spec, &mut script, 10);
    assert_eq!(last(&passes).phase, Successful);
    assert_eq!(result(last(&passes), "m").failed, 1);
}

#[test]
fn consecutive_success_limit_succeeds_early() {
    let mut m = every(metric("m"), "10s", Some(10));
    m.failure_limit = int(-1);
    m.consecutive_success_limit = int(2);
    let spec = spec(vec![m]);
    let mut script = Script::new(&[("m", &[Failed, Successful, Failed, Successful, Successful])]);
    let passes = run_to_completion(&spec, &mut script, 10);
    assert_eq!(times(&passes), [0, 10, 20, 30, 40]);
    assert_eq!(last(&passes).phase, Successful);
}

#[test]
fn count_reached_without_enough_successes_in_a_row() {
    // Both limits apply: neither decided within the count -> Inconclusive.
    let mut m = every(metric("m"), "10s", Some(3));
    m.failure_limit = int(1);
    m.consecutive_success_limit = int(2);
    let passes = run_to_completion(
        &spec(vec![m.clone()]),
        &mut Script::new(&[("m", &[Successful, Failed, Successful])]),
        10,
    );
    assert_eq!(last(&passes).phase, Inconclusive);
    // Only the success limit applies -> Failed.
    m.failure_limit = int(-1);
    let passes = run_to_completion(
        &spec(vec![m]),
        &mut Script::new(&[("m", &[Successful, Failed, Successful])]),
        10,
    );
    assert_eq!(last(&passes).phase, Failed);
    // Argo counts it in the summary as successful: no limit was crossed.
    assert_eq!(last(&passes).run_summary.successful, 1);
}

#[test]
fn inconclusive_limit() {
    let mut m = every(metric("m"), "10s", Some(5));
    m.inconclusive_limit = int(1);
    let spec = spec(vec![m]);
    let mut script = Script::new(&[("m", &[Inconclusive, Successful, Inconclusive])]);
    let passes = run_to_completion(&spec, &mut script, 10);
    let status = last(&passes);
    assert_eq!(status.phase, Inconclusive);
    assert!(
        status
            .message
            .contains("inconclusive (2) > inconclusiveLimit (1)")
    );
    assert_eq!(status.run_summary.inconclusive, 1);
}

#[test]
fn errors_retry_after_ten_seconds_and_the_fifth_in_a_row_errors_the_metric() {
    let spec = spec(vec![every(metric("m"), "1m", Some(3))]);
    let mut script = Script::new(&[("m", &[Error, Error, Error, Error, Error])]);
    let passes = run_to_completion(&spec, &mut script, 10);
    assert_eq!(times(&passes), [0, 10, 20, 30, 40]);
    let status = last(&passes);
    assert_eq!(status.phase, Error);
    assert!(
        status
            .message
            .contains("consecutiveErrors (5) > consecutiveErrorLimit (4)"),
        "{}",
        status.message
    );
    let r = result(status, "m");
    assert_eq!((r.error, r.consecutive_error, r.count), (5, 5, 0));
}

#[test]
fn an_error_message_is_carried_into_the_run_message() {
    let mut m = metric("m");
    m.consecutive_error_limit = int(0);
    let spec = spec(vec![m]);
    let mut script = Script(BTreeMap::from([(
        "m".to_string(),
        VecDeque::from([measured(Error, "connection refused")]),
    )]));
    let passes = run_to_completion(&spec, &mut script, 3);
    let status = last(&passes);
    assert_eq!(status.phase, Error);
    assert_eq!(
        status.message,
        "Metric \"m\" assessed Error due to consecutiveErrors (1) > consecutiveErrorLimit (0): \"Error Message: connection refused\""
    );
    assert_eq!(result(status, "m").message, "connection refused");
}

#[test]
fn a_success_resets_consecutive_errors() {
    let spec = spec(vec![every(metric("m"), "10s", Some(3))]);
    let mut script = Script::new(&[(
        "m",
        &[
            Error, Error, Error, Error, Successful, Error, Successful, Successful,
        ],
    )]);
    let passes = run_to_completion(&spec, &mut script, 20);
    let status = last(&passes);
    assert_eq!(status.phase, Successful);
    assert_eq!(result(status, "m").error, 5);
}

#[test]
fn consecutive_failure_limit_fails_on_failures_in_a_row_only() {
    let mut m = every(metric("m"), "10s", None);
    m.consecutive_failure_limit = int(2);
    let spec = spec(vec![m]);
    // F S F E F: the success resets the run, the error does not break it.
    let mut script = Script::new(&[("m", &[Failed, Successful, Failed, Error, Failed])]);
    let passes = run_to_completion(&spec, &mut script, 10);
    assert_eq!(times(&passes), [0, 10, 20, 30, 40]);
    for (_, outcome) in &passes[..4] {
        assert_eq!(outcome.status.phase, Running);
    }
    let status = last(&passes);
    assert_eq!(status.phase, Failed);
    assert_eq!(
        status.message,
        "Metric \"m\" assessed Failed due to consecutiveFailures (2) >= consecutiveFailureLimit (2)"
    );
    let r = result(status, "m");
    assert_eq!((r.failed, r.consecutive_failure), (3, 2));
}

#[test]
fn consecutive_failure_limit_with_an_explicit_failure_limit() {
    let mut m = every(metric("m"), "10s", None);
    m.consecutive_failure_limit = int(3);
    m.failure_limit = int(1);
    let passes = run_to_completion(
        &spec(vec![m]),
        &mut Script::new(&[("m", &[Failed, Successful, Failed])]),
        10,
    );
    assert!(
        last(&passes)
            .message
            .contains("failed (2) > failureLimit (1)")
    );
}

#[test]
fn an_inconclusive_measurement_resets_consecutive_failures() {
    let mut r = MetricResult::default();
    for phase in [Failed, Inconclusive, Failed] {
        fold_measurement(&mut r, measured(phase, ""), false, at(0));
    }
    assert_eq!(r.consecutive_failure, 1);
}

#[test]
fn dry_run_metrics_are_reported_but_do_not_decide_the_run() {
    let mut spec = spec(vec![metric("real"), metric("trial")]);
    spec.dry_run = vec![DryRun {
        metric_name: "tri.*".into(),
    }];
    let mut script = Script::new(&[("real", &[Successful]), ("trial", &[Failed])]);
    let passes = run_to_completion(&spec, &mut script, 5);
    let status = last(&passes);
    assert_eq!(status.phase, Successful);
    assert_eq!(
        status.run_summary,
        RunSummary {
            count: 1,
            successful: 1,
            ..Default::default()
        }
    );
    assert_eq!(
        status.dry_run_summary,
        Some(RunSummary {
            count: 1,
            failed: 1,
            ..Default::default()
        })
    );
    let trial = result(status, "trial");
    assert!(trial.dry_run);
    assert_eq!(trial.phase, Failed);
    assert_eq!(
        trial.message,
        "Metric assessed Failed due to failed (1) > failureLimit (0)"
    );
}

#[test]
fn a_run_of_only_dry_run_metrics_succeeds() {
    let mut spec = spec(vec![metric("trial")]);
    spec.dry_run = vec![DryRun {
        metric_name: ".*".into(),
    }];
    let passes = run_to_completion(&spec, &mut Script::new(&[("trial", &[Failed])]), 5);
    assert_eq!(last(&passes).phase, Successful);
}

#[test]
fn the_run_takes_its_worst_metric_in_argo_order() {
    let metrics = vec![metric("a"), metric("b"), metric("c")];
    let spec = spec(metrics.clone());
    let schedule = Schedule {
        metrics,
        tasks: vec![],
        dry_run: BTreeSet::new(),
        retention: BTreeMap::new(),
        terminating: false,
    };
    for (phases, worst) in [
        ([Successful, Inconclusive, Error], Error),
        ([Failed, Error, Inconclusive], Failed),
        ([Inconclusive, Successful, Successful], Inconclusive),
        ([Successful, Successful, Successful], Successful),
    ] {
        let mut status = AnalysisRunStatus {
            phase: Running,
            ..Default::default()
        };
        for (name, phase) in ["a", "b", "c"].into_iter().zip(phases) {
            status.metric_results.push(MetricResult {
                name: name.into(),
                phase,
                measurements: vec![measured(phase, "")],
                ..Default::default()
            });
        }
        let (phase, _) = assess_run(&spec, &mut status, &schedule, at(0), &mut vec![]);
        assert_eq!(phase, worst, "{phases:?}");
    }
}

#[test]
fn a_failed_metric_stops_the_others_at_once() {
    let spec = spec(vec![metric("quick"), every(metric("slow"), "1m", None)]);
    let mut script = Script::new(&[("quick", &[Failed]), ("slow", &[Successful])]);
    let (first, _) = reconcile(&spec, &AnalysisRunStatus::default(), at(0), &mut script);
    // The run is not decided yet (slow is running) but is now terminating: look again now.
    assert_eq!(first.status.phase, Running);
    assert_eq!(first.requeue_at, Some(at(0)));
    let (second, tasks) = reconcile(&spec, &first.status, at(0), &mut script);
    assert!(tasks.is_empty(), "no new measurement once terminating");
    assert_eq!(second.status.phase, Failed);
    assert_eq!(result(&second.status, "slow").phase, Successful);
    assert_eq!(second.requeue_at, None);
}

#[test]
fn terminate_before_any_measurement_succeeds() {
    let mut m = metric("m");
    m.initial_delay = Some("5m".into());
    let mut spec = spec(vec![m]);
    let mut script = Script::new(&[("m", &[])]);
    let (first, _) = reconcile(&spec, &AnalysisRunStatus::default(), at(0), &mut script);
    spec.terminate = true;
    let (stopped, tasks) = reconcile(&spec, &first.status, at(10), &mut script);
    assert!(tasks.is_empty());
    assert_eq!(stopped.status.phase, Successful);
    assert_eq!(stopped.status.message, RUN_TERMINATED_MESSAGE);
    assert_eq!(stopped.status.completed_at, Some(Time(at(10))));
}

#[test]
fn terminate_stops_an_indefinite_metric_successfully() {
    let mut spec = spec(vec![every(metric("m"), "1m", None)]);
    let mut script = Script::new(&[("m", &[Successful])]);
    let (first, _) = reconcile(&spec, &AnalysisRunStatus::default(), at(0), &mut script);
    assert_eq!(first.status.phase, Running);
    spec.terminate = true;
    let (stopped, _) = reconcile(&spec, &first.status, at(5), &mut script);
    assert_eq!(stopped.status.phase, Successful);
    assert_eq!(stopped.status.message, RUN_TERMINATED_MESSAGE);
}

#[test]
fn an_in_flight_measurement_resumes_at_its_time_and_is_terminated_on_stop() {
    let mut spec = spec(vec![metric("job")]);
    let in_flight = Measurement {
        phase: Running,
        started_at: Some(Time(at(0))),
        resume_at: Some(Time(at(20))),
        ..Default::default()
    };
    let mut script = Script(BTreeMap::from([(
        "job".to_string(),
        VecDeque::from([in_flight, measured(Successful, "")]),
    )]));
    let (first, _) = reconcile(&spec, &AnalysisRunStatus::default(), at(0), &mut script);
    assert_eq!(result(&first.status, "job").phase, Running);
    assert_eq!(first.requeue_at, Some(at(20)));
    let (_, tasks) = reconcile(&spec, &first.status, at(19), &mut script);
    assert!(tasks.is_empty());
    let (_, tasks) = reconcile(&spec, &first.status, at(20), &mut script);
    assert!(matches!(tasks[0].action, MeasurementAction::Resume(_)));

    spec.terminate = true;
    let mut stopping = Script::new(&[("job", &[Successful])]);
    let (stopped, tasks) = reconcile(&spec, &first.status, at(5), &mut stopping);
    assert!(matches!(tasks[0].action, MeasurementAction::Terminate(_)));
    let r = result(&stopped.status, "job");
    assert_eq!(
        r.measurements.len(),
        1,
        "the in-flight measurement is replaced"
    );
    assert_eq!(r.measurements[0].message, METRIC_TERMINATED_MESSAGE);
    assert_eq!(r.measurements[0].started_at, Some(Time(at(0))));
    assert_eq!(stopped.status.phase, Successful);
}

#[test]
fn measurement_history_is_trimmed() {
    let spec1 = spec(vec![every(metric("m"), "1s", Some(12))]);
    let mut script = Script::new(&[("m", &[Successful; 12])]);
    let passes = run_to_completion(&spec1, &mut script, 20);
    let r = result(last(&passes), "m");
    assert_eq!(r.count, 12);
    assert_eq!(r.measurements.len(), DEFAULT_MEASUREMENT_HISTORY_LIMIT);
    assert_eq!(r.measurements[0].finished_at, Some(Time(at(2))));

    let mut spec2 = spec1.clone();
    spec2.measurement_retention = vec![MeasurementRetention {
        metric_name: "m".into(),
        limit: 3,
    }];
    let mut script = Script::new(&[("m", &[Successful; 12])]);
    let passes = run_to_completion(&spec2, &mut script, 20);
    assert_eq!(result(last(&passes), "m").measurements.len(), 3);
}

#[test]
fn retention_rules_match_names_as_regular_expressions_last_rule_wins() {
    let metrics = vec![metric("success-rate"), metric("latency")];
    let rules = vec![
        MeasurementRetention {
            metric_name: ".*".into(),
            limit: 5,
        },
        MeasurementRetention {
            metric_name: "rate".into(),
            limit: 20,
        },
    ];
    let limits = retention_limits(&rules, &metrics).unwrap();
    assert_eq!(limits["success-rate"], 20);
    assert_eq!(limits["latency"], 5);
}

#[test]
fn rules_that_match_no_metric_make_the_run_error() {
    let mut spec = spec(vec![metric("m")]);
    spec.dry_run = vec![DryRun {
        metric_name: "other".into(),
    }];
    let Plan::Invalid { message } = plan(&spec, &AnalysisRunStatus::default(), at(0)) else {
        panic!("expected an invalid plan");
    };
    assert_eq!(
        message,
        "Analysis spec invalid: dryRun[0]: Rule didn't match any metric name(s)"
    );
    spec.dry_run = vec![DryRun {
        metric_name: "(".into(),
    }];
    let Plan::Invalid { message } = plan(&spec, &AnalysisRunStatus::default(), at(0)) else {
        panic!("expected an invalid plan");
    };
    assert!(message.contains("not a regular expression"), "{message}");
}

#[test]
fn an_argument_without_value_makes_the_run_error() {
    let mut m = metric("m");
    m.provider.prometheus.as_mut().unwrap().query = Some("up{svc=\"{{args.svc}}\"}".into());
    let mut spec = spec(vec![m]);
    spec.args = vec![AnalysisRunArgument {
        name: "svc".into(),
        value: None,
        value_from: None,
    }];
    let (outcome, _) = reconcile(
        &spec,
        &AnalysisRunStatus::default(),
        at(0),
        &mut Script::new(&[]),
    );
    assert_eq!(outcome.status.phase, Error);
    assert!(
        outcome
            .status
            .message
            .starts_with("Unable to resolve metric arguments: argument \"svc\"")
    );
    assert_eq!(outcome.status.completed_at, Some(Time(at(0))));
    assert_eq!(outcome.events[0].reason, "AnalysisRunError");
}

#[test]
fn secret_arguments_are_not_read_to_plan() {
    let mut m = metric("m");
    m.provider.prometheus.as_mut().unwrap().query = Some("up{token=\"{{args.token}}\"}".into());
    let mut spec = spec(vec![m]);
    spec.args = vec![AnalysisRunArgument {
        name: "token".into(),
        value: None,
        value_from: Some(ArgumentValueFrom {
            secret_key_ref: Some(SecretKeyRef {
                name: "s".into(),
                key: "k".into(),
            }),
            ..Default::default()
        }),
    }];
    let Plan::Measure(schedule) = plan(&spec, &AnalysisRunStatus::default(), at(0)) else {
        panic!("expected measurements");
    };
    assert_eq!(
        schedule.tasks[0]
            .metric
            .provider
            .prometheus
            .as_ref()
            .unwrap()
            .query
            .as_deref(),
        Some("up{token=\"{{args.token}}\"}"),
        "tasks carry the metric as written, for the caller to resolve with the secret"
    );
}

#[test]
fn an_invalid_metric_makes_the_run_error() {
    let spec = spec(vec![metric("m"), metric("m")]);
    let Plan::Invalid { message } = plan(&spec, &AnalysisRunStatus::default(), at(0)) else {
        panic!("expected an invalid plan");
    };
    assert!(
        message.starts_with("Analysis spec invalid: spec.metrics[1].name"),
        "{message}"
    );
    let Plan::Invalid { message } = plan(
        &AnalysisRunSpec::default(),
        &AnalysisRunStatus::default(),
        at(0),
    ) else {
        panic!("expected an invalid plan");
    };
    assert_eq!(message, "Analysis spec invalid: no metrics specified");
}

#[test]
fn a_finished_run_is_left_alone() {
    let status = AnalysisRunStatus {
        phase: Failed,
        ..Default::default()
    };
    assert_eq!(
        plan(&spec(vec![metric("m")]), &status, at(0)),
        Plan::Completed
    );
}

#[test]
fn the_next_reconcile_is_the_earliest_due_time() {
    let mut delayed = metric("delayed");
    delayed.initial_delay = Some("90s".into());
    let spec = spec(vec![
        every(metric("fast"), "20s", None),
        every(metric("slow"), "1m", None),
        delayed,
    ]);
    let mut script = Script::new(&[("fast", &[Successful]), ("slow", &[Error])]);
    let (first, _) = reconcile(&spec, &AnalysisRunStatus::default(), at(0), &mut script);
    // fast at 20s; slow errored -> retried at 10s; delayed at 90s.
    assert_eq!(first.requeue_at, Some(at(10)));
    let Plan::Measure(schedule) = plan(&spec, &first.status, at(10)) else {
        panic!("expected measurements");
    };
    let due: Vec<&str> = schedule
        .tasks
        .iter()
        .map(|t| t.metric.name.as_str())
        .collect();
    assert_eq!(due, ["slow"]);
}

#[test]
fn the_run_message_changes_only_with_its_phase() {
    let mut m = every(metric("m"), "10s", Some(3));
    m.failure_limit = int(2);
    let spec = spec(vec![m]);
    let mut script = Script::new(&[("m", &[Failed, Successful, Successful])]);
    let passes = run_to_completion(&spec, &mut script, 10);
    let messages: Vec<&str> = passes
        .iter()
        .map(|(_, o)| o.status.message.as_str())
        .collect();
    assert!(messages.iter().all(|m| m.is_empty()), "{messages:?}");
    assert_eq!(last(&passes).phase, Successful);
}

#[test]
fn fold_sets_finish_time_and_counters() {
    let mut r = MetricResult::default();
    fold_measurement(&mut r, measured(Successful, ""), false, at(3));
    fold_measurement(&mut r, measured(Successful, ""), false, at(4));
    fold_measurement(&mut r, measured(Error, ""), false, at(5));
    assert_eq!(
        (
            r.count,
            r.successful,
            r.error,
            r.consecutive_success,
            r.consecutive_error
        ),
        (2, 2, 1, 0, 1)
    );
    assert_eq!(r.measurements[2].finished_at, Some(Time(at(5))));
    let running = Measurement {
        phase: Running,
        ..Default::default()
    };
    fold_measurement(&mut r, running, false, at(6));
    assert_eq!(r.measurements[3].finished_at, None);
    assert_eq!(r.count, 2);
}

#[test]
fn terminating_ignores_dry_run_failures() {
    let mut spec = spec(vec![metric("m")]);
    let mut status = AnalysisRunStatus::default();
    status.metric_results.push(MetricResult {
        name: "m".into(),
        phase: Failed,
        dry_run: true,
        ..Default::default()
    });
    assert!(!is_terminating(&spec, &status));
    status.metric_results[0].dry_run = false;
    assert!(is_terminating(&spec, &status));
    status.metric_results[0].phase = Successful;
    spec.terminate = true;
    assert!(is_terminating(&spec, &status));
}

#[test]
fn tasks_are_numbered_by_finished_measurements() {
    let spec = spec(vec![every(metric("m"), "10s", Some(5))]);
    let mut script = Script::new(&[("m", &[Successful, Error, Successful])]);
    let mut status = AnalysisRunStatus::default();
    let mut numbers = Vec::new();
    for now in [0, 10, 20] {
        let Plan::Measure(schedule) = plan(&spec, &status, at(now)) else {
            panic!("expected measurements");
        };
        numbers.extend(schedule.tasks.iter().map(|t| t.number));
        let taken = schedule.tasks.iter().map(|t| script.next(t)).collect();
        status = conclude(&spec, &status, &schedule, taken, at(now)).status;
    }
    assert_eq!(numbers, [1, 2, 3]);
}

#[test]
fn counters_at_their_maximum_do_not_overflow() {
    let spec = spec(vec![every(metric("m"), "1s", None)]);
    let mut status = AnalysisRunStatus {
        phase: Running,
        started_at: Some(Time(at(0))),
        metric_results: vec![MetricResult {
            name: "m".into(),
            phase: Running,
            count: i32::MAX,
            error: i32::MAX,
            successful: i32::MAX,
            consecutive_success: i32::MAX,
            measurements: vec![Measurement {
                phase: Successful,
                finished_at: Some(Time(at(0))),
                ..measured(Successful, "")
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let Plan::Measure(schedule) = plan(&spec, &status, at(5)) else {
        panic!("a running metric is measured");
    };
    let numbers: Vec<i32> = schedule.tasks.iter().map(|t| t.number).collect();
    assert_eq!(numbers, vec![i32::MAX]);
    let result = &mut status.metric_results[0];
    fold_measurement(result, measured(Successful, ""), false, at(6));
    assert_eq!(result.count, i32::MAX);
}

#[test]
fn a_rule_pattern_over_the_size_bound_is_an_error() {
    let metrics = vec![metric("m")];
    let huge = DryRun {
        metric_name: "((a{100}){100}){100}".into(),
    };
    let err = dry_run_metrics(&[huge], &metrics).unwrap_err();
    assert!(matches!(err, RuleError::NotARegex { .. }), "{err}");
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    fn duration_text() -> impl Strategy<Value = Option<String>> {
        proptest::option::of(prop_oneof![
            "[0-9]{1,25}(ms|s|m|h|)",
            "\\PC{0,12}",
            Just("8760h".to_string()),
            Just("0s".to_string()),
        ])
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Any interval, initial delay, count and times in the status: a plan and a next
        /// time, never a panic.
        #[test]
        fn any_timing_plans_without_panicking(
            interval in duration_text(),
            initial_delay in duration_text(),
            count in proptest::option::of(any::<i32>()),
            started in proptest::option::of(-100_000_000_000i64..100_000_000_000),
            finished in proptest::option::of(-100_000_000_000i64..100_000_000_000),
            counters in any::<(i32, i32, i32)>(),
            now in -100_000_000_000i64..100_000_000_000,
        ) {
            let mut m = metric("m");
            m.interval = interval;
            m.initial_delay = initial_delay;
            m.count = count.map(IntOrString::Int);
            let spec = spec(vec![m]);
            let stamp = |secs: i64| Timestamp::from_second(secs).unwrap_or(Timestamp::MAX);
            let measurements = finished
                .map(|f| Measurement {
                    finished_at: Some(Time(stamp(f))),
                    ..measured(Successful, "")
                })
                .into_iter()
                .collect();
            let status = AnalysisRunStatus {
                phase: Running,
                started_at: started.map(|s| Time(stamp(s))),
                metric_results: vec![MetricResult {
                    name: "m".into(),
                    phase: Running,
                    count: counters.0,
                    error: counters.1,
                    failed: counters.2,
                    measurements,
                    ..Default::default()
                }],
                ..Default::default()
            };
            let _ = plan(&spec, &status, stamp(now));
            let _ = next_reconcile_time(&spec.metrics, &status, stamp(now));
        }

        /// Any `metricName` pattern: matched or refused with an error.
        #[test]
        fn any_rule_pattern_matches_or_errs(pattern in "\\PC{0,30}") {
            let rule = DryRun { metric_name: pattern };
            let _ = dry_run_metrics(&[rule], &[metric("m")]);
        }
    }
}

#[test]
fn a_condition_nested_too_deep_ends_the_run_in_error_before_parsing() {
    let mut deep = metric("deep");
    deep.success_condition = Some(format!(
        "{}result[0]{} > 0",
        "(".repeat(50_000),
        ")".repeat(50_000)
    ));
    let status = AnalysisRunStatus::default();
    let Plan::Invalid { message } = plan(&spec(vec![deep]), &status, at(0)) else {
        panic!("a condition over the bounds is invalid");
    };
    assert!(
        message.starts_with("Analysis spec invalid: spec.metrics[0].successCondition: "),
        "{message}"
    );
    assert!(message.contains("over the limit of 4096"), "{message}");
    assert!(message.len() < 1000, "{message}");
}

#[test]
fn a_judge_metrics_event_carries_its_reason_and_others_keep_argos_text() {
    let judge = Metric {
        name: "judged".into(),
        success_condition: Some("result.verdict != \"High\"".into()),
        provider: MetricProvider {
            judge: Some(serde_json::json!({"query": "q", "canary": "a", "baseline": "b"})),
            ..Default::default()
        },
        ..Default::default()
    };
    let reason = "shift interval [24.1ms, 41ms] lies above +8.1ms";
    let mut script = Script(BTreeMap::from([
        (
            "judged".to_string(),
            VecDeque::from([measured(Failed, reason)]),
        ),
        ("m".to_string(), VecDeque::from([measured(Successful, "")])),
    ]));
    let passes = run_to_completion(&spec(vec![judge, metric("m")]), &mut script, 5);
    let messages: Vec<&str> = passes[0]
        .1
        .events
        .iter()
        .map(|e| e.message.as_str())
        .collect();
    assert!(
        messages.contains(&format!("Metric 'judged' Completed. Result: Failed: {reason}").as_str()),
        "{messages:?}"
    );
    assert!(
        messages.contains(&"Metric 'm' Completed. Result: Successful"),
        "{messages:?}"
    );
}
