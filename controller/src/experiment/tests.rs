//! The Experiment's phase rules on plain data: each test plans from an experiment and what was
//! observed, feeds the planned status back as the next pass would read it, and checks the
//! writes and the status Argo's `experiments` package would make.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use rollouts_analysis::compose::{FoundTemplate, Templates};
use rollouts_crds::analysis::{AnalysisPhase, AnalysisTemplateSpec, Metric};
use rollouts_crds::experiment::{
    Experiment, ExperimentCondition, ExperimentStatus, TemplateStatus, TemplateStatusCode,
};
use serde_json::{Value, json};

use super::build::{self, POD_TEMPLATE_HASH_LABEL};
use super::plan::{Observed, ObservedReplicaSet, ObservedRun, Plan, at_rest, plan};

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + seconds).expect("in range")
}

fn template(name: &str, replicas: i32) -> Value {
    json!({
        "name": name,
        "replicas": replicas,
        "selector": {"matchLabels": {"app": "shop", "role": name}},
        "template": {
            "metadata": {"labels": {"app": "shop", "role": name}},
            "spec": {"containers": [{"name": "app", "image": format!("shop:{name}"), "ports": [{"name": "http", "containerPort": 8080}]}]},
        },
    })
}

fn experiment(spec: Value) -> Experiment {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Experiment",
        "metadata": {"name": "exp", "namespace": "shop", "uid": "uid-1", "resourceVersion": "1"},
        "spec": spec,
    }))
    .expect("an Experiment")
}

/// Two templates of 2 pods for 10 minutes, scaled down 30s after it ends (the default).
fn two_templates() -> Experiment {
    experiment(
        json!({"duration": "10m", "templates": [template("baseline", 2), template("canary", 2)]}),
    )
}

/// The experiment as the next pass reads it: with the planned status.
fn next(experiment: &Experiment, plan: &Plan) -> Experiment {
    let mut next = experiment.clone();
    next.status = Some(plan.status.clone());
    next
}

/// The ReplicaSets the plan created, as observed with `available` pods of what they asked.
fn observed_from(plan: &Plan, available: i32) -> Observed {
    let mut observed = Observed::default();
    for (template, rs) in &plan.create_replica_sets {
        let desired = rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
        observed.replica_sets.insert(
            template.clone(),
            ObservedReplicaSet {
                name: rs.name_any(),
                desired,
                replicas: desired,
                ready: available,
                available,
                pod_template_hash: rs.labels()[POD_TEMPLATE_HASH_LABEL].clone(),
                scale_down_deadline: None,
            },
        );
    }
    observed
}

fn with_available(observed: &Observed, available: i32) -> Observed {
    let mut observed = observed.clone();
    for rs in observed.replica_sets.values_mut() {
        rs.ready = available;
        rs.available = available;
    }
    observed
}

/// The first pass over `experiment` (nothing observed, at 0s): its plan, the ReplicaSets it
/// created as observed with no pod available, and the experiment as the next pass reads it.
fn first_pass(experiment: &Experiment) -> (Plan, Observed, Experiment) {
    let first = plan(experiment, &Observed::default(), at(0));
    let created = observed_from(&first, 0);
    let next = next(experiment, &first);
    (first, created, next)
}

fn template_status<'a>(status: &'a ExperimentStatus, name: &str) -> &'a TemplateStatus {
    status
        .template_statuses
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("a status for template {name:?}"))
}

fn condition<'a>(status: &'a ExperimentStatus, type_: &str) -> &'a ExperimentCondition {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("a {type_} condition"))
}

fn template_code(status: &ExperimentStatus, name: &str) -> Option<TemplateStatusCode> {
    status
        .template_statuses
        .iter()
        .find(|t| t.name == name)
        .and_then(|t| t.status)
}

fn reasons(plan: &Plan) -> Vec<&str> {
    plan.events.iter().map(|e| e.reason.as_str()).collect()
}

/// Runs `experiment` from creation to every template available; returns the experiment as the
/// pass after that reads it, the observed ReplicaSets, and the time.
fn running(experiment: Experiment) -> (Experiment, Observed, Timestamp) {
    let (_, created, experiment) = first_pass(&experiment);
    let mut available = created.clone();
    for rs in available.replica_sets.values_mut() {
        (rs.ready, rs.available) = (rs.desired, rs.desired);
    }
    let second = plan(&experiment, &available, at(5));
    assert_eq!(second.status.phase, Some(AnalysisPhase::Running));
    (next(&experiment, &second), available, at(5))
}

#[test]
fn the_first_pass_creates_a_replica_set_per_template_with_its_own_hash_and_is_pending() {
    let experiment = two_templates();
    let first = plan(&experiment, &Observed::default(), at(0));
    assert_eq!(first.status.phase, Some(AnalysisPhase::Pending));
    let names: Vec<String> = first
        .create_replica_sets
        .iter()
        .map(|(_, rs)| rs.name_any())
        .collect();
    assert_eq!(
        names,
        ["exp-baseline", "exp-canary"],
        "Argo's <experiment>-<template>"
    );
    let (_, rs) = &first.create_replica_sets[0];
    let hash = rs.labels()[POD_TEMPLATE_HASH_LABEL].clone();
    let spec = rs.spec.as_ref().expect("spec");
    assert_eq!(spec.replicas, Some(2));
    assert_eq!(
        spec.selector.match_labels.as_ref().expect("labels")[POD_TEMPLATE_HASH_LABEL],
        hash
    );
    let pod_labels = spec
        .template
        .as_ref()
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .expect("pod labels");
    assert_eq!(pod_labels[POD_TEMPLATE_HASH_LABEL], hash);
    assert_eq!(pod_labels["role"], "baseline");
    let owner = &rs.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("Experiment", "uid-1", Some(true))
    );
    assert_eq!(
        rs.annotations()[build::EXPERIMENT_TEMPLATE_NAME_ANNOTATION],
        "baseline"
    );
    assert_ne!(
        hash,
        first.create_replica_sets[1].1.labels()[POD_TEMPLATE_HASH_LABEL],
        "each template has its own hash"
    );
    assert!(
        first
            .status
            .template_statuses
            .iter()
            .all(|t| t.status == Some(TemplateStatusCode::Progressing)),
        "{:#?}",
        first.status
    );
    assert!(first.status.available_at.is_none());
    assert_eq!(
        reasons(&first)
            .iter()
            .filter(|r| **r == "NewReplicaSetCreated")
            .count(),
        2
    );
    assert!(reasons(&first).contains(&"ExperimentPending"));
}

#[test]
fn every_template_available_marks_available_at_and_running_until_the_duration_ends() {
    let experiment = two_templates();
    let (_, created, experiment) = first_pass(&experiment);
    // Pods not ready yet: still Pending, looked at again at the progress deadline.
    let waiting = plan(&experiment, &created, at(1));
    assert_eq!(waiting.status.phase, Some(AnalysisPhase::Pending));
    assert!(waiting.create_replica_sets.is_empty(), "created once");
    assert_eq!(
        waiting.requeue_at,
        Some(at(601)),
        "the default progressDeadlineSeconds from the last change of pod counts"
    );
    let experiment = next(&experiment, &waiting);
    let available = with_available(&created, 2);
    let ready = plan(&experiment, &available, at(5));
    assert_eq!(ready.status.phase, Some(AnalysisPhase::Running));
    assert_eq!(ready.status.available_at.as_ref().map(|t| t.0), Some(at(5)));
    assert_eq!(
        template_code(&ready.status, "canary"),
        Some(TemplateStatusCode::Running)
    );
    let progressing = condition(&ready.status, "Progressing");
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_str()),
        ("True", "ReplicaSetUpdated")
    );
    assert_eq!(
        ready.requeue_at,
        Some(at(5 + 600)),
        "when the duration ends"
    );
    assert!(!ready.writes_objects());
    // The next pass, nothing moved: the running condition, no write but the status.
    let experiment = next(&experiment, &ready);
    let steady = plan(&experiment, &available, at(6));
    assert_eq!(steady.status.phase, Some(AnalysisPhase::Running));
    let progressing = condition(&steady.status, "Progressing");
    assert_eq!(progressing.reason, "NewReplicaSetAvailable");
    assert!(!steady.writes_objects());
    let experiment = next(&experiment, &steady);
    let again = plan(&experiment, &available, at(7));
    assert_eq!(
        again.status,
        experiment.status.clone().expect("status"),
        "at rest while it runs"
    );
    assert!(again.events.is_empty());
}

#[test]
fn once_the_duration_passed_it_succeeds_and_scales_down_after_the_delay() {
    let (experiment, observed, started) = running(two_templates());
    let end = started
        .checked_add(Duration::from_secs(601))
        .expect("in range");
    let done = plan(&experiment, &observed, end);
    assert_eq!(
        template_code(&done.status, "baseline"),
        Some(TemplateStatusCode::Successful)
    );
    assert_eq!(done.status.phase, Some(AnalysisPhase::Successful));
    let progressing = condition(&done.status, "Progressing");
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_str()),
        ("False", "ExperimentCompleted")
    );
    assert!(reasons(&done).contains(&"ExperimentSuccessful"));
    assert!(reasons(&done).contains(&"TemplateSuccessful"));

    // The pass after: the pods stay until the scale-down deadline, written now.
    let experiment = next(&experiment, &done);
    let delay = plan(&experiment, &observed, end);
    assert!(delay.scales.is_empty(), "{:?}", delay.scales);
    assert_eq!(delay.deadlines.len(), 2);
    let deadline = end.checked_add(Duration::from_secs(30)).expect("in range");
    assert_eq!(
        delay.deadlines[0].at.as_deref(),
        Some(deadline.to_string().as_str())
    );
    assert_eq!(delay.requeue_at, Some(deadline));
    // At the deadline, to zero.
    let mut with_deadline = observed.clone();
    for rs in with_deadline.replica_sets.values_mut() {
        rs.scale_down_deadline = Some(deadline.to_string());
    }
    let experiment = next(&experiment, &delay);
    let scaled = plan(
        &experiment,
        &with_deadline,
        deadline
            .checked_add(Duration::from_secs(1))
            .expect("in range"),
    );
    assert_eq!(
        scaled.scales,
        [
            ("exp-baseline".to_string(), 0),
            ("exp-canary".to_string(), 0)
        ]
    );
    assert!(scaled.deadlines.is_empty());
    assert_eq!(
        scaled.status.phase,
        Some(AnalysisPhase::Successful),
        "the result stands"
    );

    // Once every pod is gone, nothing is left to do: at rest.
    let mut gone = with_deadline.clone();
    for rs in gone.replica_sets.values_mut() {
        (rs.desired, rs.replicas, rs.ready, rs.available) = (0, 0, 0, 0);
    }
    let experiment = next(&experiment, &scaled);
    assert!(
        !at_rest(&experiment, &gone.replica_sets),
        "the status still counts pods"
    );
    let settled = plan(&experiment, &gone, at(2000));
    assert!(!settled.writes_objects());
    let experiment = next(&experiment, &settled);
    assert!(at_rest(&experiment, &gone.replica_sets));
}

#[test]
fn a_zero_scale_down_delay_scales_down_at_once() {
    let mut spec = two_templates();
    spec.spec.scale_down_delay_seconds = Some(0);
    let (mut experiment, observed, _) = running(spec);
    experiment.spec.terminate = true;
    let terminated = plan(&experiment, &observed, at(10));
    assert_eq!(
        terminated.status.phase,
        Some(AnalysisPhase::Successful),
        "terminate ends an experiment Successful, as in Argo"
    );
    assert_eq!(terminated.scales.len(), 2, "terminating: no pods wanted");
    assert!(terminated.deadlines.is_empty());
}

#[test]
fn a_template_short_of_its_pods_past_the_progress_deadline_fails_the_experiment() {
    let mut experiment = two_templates();
    experiment.spec.progress_deadline_seconds = Some(60);
    let (_, created, experiment) = first_pass(&experiment);
    // Pods appear (a change of counts) at 1s, then none becomes available.
    let started = plan(&experiment, &created, at(1));
    assert_eq!(started.status.phase, Some(AnalysisPhase::Pending));
    let experiment = next(&experiment, &started);
    let on_time = plan(&experiment, &created, at(61));
    assert_eq!(on_time.status.phase, Some(AnalysisPhase::Pending));
    let late = plan(&experiment, &created, at(62));
    assert_eq!(
        template_code(&late.status, "canary"),
        Some(TemplateStatusCode::Failed)
    );
    let canary = template_status(&late.status, "canary");
    assert_eq!(
        canary.message,
        "Template 'canary' exceeded its progressDeadlineSeconds (60)"
    );
    assert_eq!(late.status.phase, Some(AnalysisPhase::Failed));
    assert!(
        late.events
            .iter()
            .any(|e| e.reason == "TemplateFailed" && e.warning)
    );
    assert!(
        late.events
            .iter()
            .any(|e| e.reason == "ExperimentFailed" && e.warning)
    );
}

fn analysis_templates() -> Templates {
    let metric: Metric = serde_json::from_value(json!({
        "name": "errors",
        "successCondition": "result[0] < 0.05",
        "provider": {"prometheus": {"query": "rate(errors{hash=\"{{args.canary-hash}}\"}[1m])"}},
    }))
    .expect("a metric");
    Templates {
        namespaced: vec![FoundTemplate {
            name: "errors".into(),
            spec: AnalysisTemplateSpec {
                metrics: vec![metric],
                args: serde_json::from_value(
                    json!([{"name": "canary-hash"}, {"name": "baseline-rs"}]),
                )
                .expect("args"),
                ..AnalysisTemplateSpec::default()
            },
        }],
        cluster: Vec::new(),
    }
}

fn with_analysis(required: bool) -> Experiment {
    let mut experiment = experiment(json!({
        "templates": [template("baseline", 1), template("canary", 1)],
        "dryRun": [{"metricName": "errors"}],
        "measurementRetention": [{"metricName": "errors", "limit": 5}],
        "analysisRunMetadata": {"labels": {"team": "shop"}},
        "analyses": [{
            "name": "judge",
            "templateName": "errors",
            "requiredForCompletion": required,
            "args": [
                {"name": "canary-hash", "value": "{{templates.canary.podTemplateHash}}"},
                {"name": "baseline-rs", "value": "{{ templates.baseline.replicaset.name }}"},
            ],
        }],
    }));
    experiment
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(
            "argo-rollouts.argoproj.io/controller-instance-id".into(),
            "blue".into(),
        );
    experiment
}

fn observed_templates(mut observed: Observed) -> Observed {
    observed
        .templates
        .insert("judge".into(), Ok(analysis_templates()));
    observed
}

#[test]
fn the_analysis_run_starts_once_the_templates_are_available_with_their_hashes() {
    let experiment = with_analysis(true);
    let first = plan(&experiment, &observed_templates(Observed::default()), at(0));
    assert!(
        first.create_runs.is_empty(),
        "no run before the templates are available"
    );
    let created = observed_from(&first, 0);
    let experiment = next(&experiment, &first);
    let available = observed_templates(with_available(&created, 1));
    let ready = plan(&experiment, &available, at(3));
    assert!(
        ready.create_runs.is_empty(),
        "availableAt is recorded first, as in Argo"
    );
    let experiment = next(&experiment, &ready);
    let started = plan(&experiment, &available, at(4));
    assert_eq!(started.create_runs.len(), 1);
    let (analysis, run) = &started.create_runs[0];
    assert_eq!(analysis, "judge");
    assert_eq!(
        run.name_any(),
        "exp-judge",
        "Argo's <experiment>-<analysis>"
    );
    let args: Vec<(&str, Option<&str>)> = run
        .spec
        .args
        .iter()
        .map(|a| (a.name.as_str(), a.value.as_deref()))
        .collect();
    let canary_hash = available.replica_sets["canary"].pod_template_hash.as_str();
    assert_eq!(
        args,
        [
            ("canary-hash", Some(canary_hash)),
            ("baseline-rs", Some("exp-baseline"))
        ]
    );
    assert_eq!(run.spec.dry_run[0].metric_name, "errors");
    assert_eq!(run.spec.measurement_retention[0].limit, 5);
    assert_eq!(run.labels()["team"], "shop");
    assert_eq!(
        run.labels()["argo-rollouts.argoproj.io/controller-instance-id"],
        "blue"
    );
    assert_eq!(run.owner_references()[0].kind, "Experiment");
    let pointer = &started.status.analysis_runs[0];
    assert_eq!(
        (pointer.analysis_run.as_str(), pointer.phase),
        ("exp-judge", AnalysisPhase::Pending)
    );
    assert!(reasons(&started).contains(&"AnalysisRunPending"));
    assert_eq!(started.status.phase, Some(AnalysisPhase::Running));

    // Created once: the next pass follows it.
    let experiment = next(&experiment, &started);
    let mut following = available.clone();
    following.runs.insert(
        "exp-judge".into(),
        ObservedRun {
            phase: Some(AnalysisPhase::Running),
            ..ObservedRun::default()
        },
    );
    let followed = plan(&experiment, &following, at(5));
    assert!(followed.create_runs.is_empty());
    assert_eq!(
        followed.status.analysis_runs[0].phase,
        AnalysisPhase::Running
    );
    assert_eq!(followed.status.phase, Some(AnalysisPhase::Running));

    // A required analysis that succeeds ends an experiment without a duration.
    let experiment = next(&experiment, &followed);
    following.runs.insert(
        "exp-judge".into(),
        ObservedRun {
            phase: Some(AnalysisPhase::Successful),
            ..ObservedRun::default()
        },
    );
    let succeeded = plan(&experiment, &following, at(6));
    assert_eq!(succeeded.status.phase, Some(AnalysisPhase::Successful));
    assert_eq!(succeeded.status.message, "Required AnalysisRuns completed");
    // Then its pods go (after the delay).
    let experiment = next(&experiment, &succeeded);
    let after = plan(&experiment, &following, at(7));
    assert_eq!(after.deadlines.len(), 2);
    assert_eq!(after.status.phase, Some(AnalysisPhase::Successful));
}

#[test]
fn a_failed_analysis_fails_a_running_experiment_and_a_terminated_one_stops_its_runs() {
    let experiment = with_analysis(false);
    let (mut experiment, observed, _) = running(experiment);
    let mut observed = observed_templates(observed);
    let started = plan(&experiment, &observed, at(6));
    experiment = next(&experiment, &started);
    observed.runs.insert(
        "exp-judge".into(),
        ObservedRun {
            phase: Some(AnalysisPhase::Failed),
            message: "Metric \"errors\" assessed Failed".into(),
            ..ObservedRun::default()
        },
    );
    let failed = plan(&experiment, &observed, at(7));
    assert_eq!(failed.status.phase, Some(AnalysisPhase::Failed));
    assert_eq!(failed.status.message, "Metric \"errors\" assessed Failed");
    assert!(
        failed
            .events
            .iter()
            .any(|e| e.reason == "AnalysisRunFailed" && e.warning && e.on_rollout),
        "recorded on the owning Rollout too, as in Argo"
    );

    // Terminated while its run still runs: the run is terminated (once), and its end recorded.
    let (mut experiment, observed, _) = running(with_analysis(false));
    let mut observed = observed_templates(observed);
    let started = plan(&experiment, &observed, at(6));
    experiment = next(&experiment, &started);
    experiment.spec.terminate = true;
    observed.runs.insert(
        "exp-judge".into(),
        ObservedRun {
            phase: Some(AnalysisPhase::Running),
            ..ObservedRun::default()
        },
    );
    let terminating = plan(&experiment, &observed, at(7));
    assert_eq!(terminating.terminate_runs, ["exp-judge"]);
    assert!(reasons(&terminating).contains(&"AnalysisRunTerminating"));
    assert_eq!(terminating.status.phase, Some(AnalysisPhase::Successful));
    experiment = next(&experiment, &terminating);
    observed.runs.insert(
        "exp-judge".into(),
        ObservedRun {
            phase: Some(AnalysisPhase::Running),
            terminate: true,
            ..ObservedRun::default()
        },
    );
    let waiting = plan(&experiment, &observed, at(8));
    assert!(waiting.terminate_runs.is_empty(), "terminated once");
    observed.runs.insert(
        "exp-judge".into(),
        ObservedRun {
            phase: Some(AnalysisPhase::Successful),
            message: "Metric Terminated".into(),
            terminate: true,
        },
    );
    let ended = plan(&experiment, &observed, at(9));
    assert_eq!(
        ended.status.analysis_runs[0].phase,
        AnalysisPhase::Successful
    );
}

#[test]
fn a_missing_analysis_template_errors_the_analysis_then_the_experiment() {
    let experiment = with_analysis(true);
    let mut observed = Observed::default();
    observed.templates.insert(
        "judge".into(),
        Err("AnalysisTemplate \"errors\" not found: create it, or fix templateName".into()),
    );
    let first = plan(&experiment, &observed, at(0));
    let pointer = &first.status.analysis_runs[0];
    assert_eq!(pointer.phase, AnalysisPhase::Error);
    assert!(
        pointer
            .message
            .starts_with("AnalysisTemplate verification failed for analysis 'judge'"),
        "{}",
        pointer.message
    );
    let experiment = next(&experiment, &first);
    let created = observed_from(&first, 0);
    let second = plan(&experiment, &created, at(1));
    assert_eq!(second.status.phase, Some(AnalysisPhase::Error));
    assert!(
        second.status.message.contains("not found"),
        "{}",
        second.status.message
    );
}

#[test]
fn a_template_with_a_service_gets_one_while_it_runs_and_loses_it_at_zero() {
    let mut spec = template("canary", 1);
    spec["service"] = json!({});
    let mut no_ports = template("baseline", 1);
    no_ports["service"] = json!({"name": "baseline-svc"});
    no_ports["template"]["spec"]["containers"][0]
        .as_object_mut()
        .expect("container")
        .remove("ports");
    let experiment = experiment(json!({"scaleDownDelaySeconds": 0, "templates": [spec, no_ports]}));
    let (first, created, experiment) = first_pass(&experiment);
    assert!(
        first.create_services.is_empty(),
        "made once its ReplicaSet exists"
    );
    let second = plan(&experiment, &created, at(1));
    assert_eq!(
        second.create_services.len(),
        1,
        "a template without ports gets no Service"
    );
    let (template, service) = &second.create_services[0];
    assert_eq!(
        (template.as_str(), service.name_any().as_str()),
        ("canary", "exp-canary")
    );
    let spec = service.spec.as_ref().expect("spec");
    let hash = &created.replica_sets["canary"].pod_template_hash;
    assert_eq!(
        &spec.selector.as_ref().expect("selector")[POD_TEMPLATE_HASH_LABEL],
        hash
    );
    assert_eq!(spec.ports.as_ref().expect("ports")[0].port, 8080);
    let canary = template_status(&second.status, "canary");
    assert_eq!(
        (
            canary.service_name.as_str(),
            canary.pod_template_hash.as_str()
        ),
        ("exp-canary", hash.as_str())
    );

    // Terminated: once its pods are gone, the Service goes.
    let mut experiment = next(&experiment, &second);
    experiment.spec.terminate = true;
    let mut observed = with_available(&created, 1);
    observed
        .services
        .insert("canary".into(), "exp-canary".into());
    let scaling = plan(&experiment, &observed, at(2));
    assert!(scaling.delete_services.is_empty(), "pods still serve");
    let mut gone = observed.clone();
    for rs in gone.replica_sets.values_mut() {
        (rs.desired, rs.replicas, rs.ready, rs.available) = (0, 0, 0, 0);
    }
    let experiment = next(&experiment, &scaling);
    let deleted = plan(&experiment, &gone, at(3));
    assert_eq!(
        deleted.delete_services,
        [("canary".to_string(), "exp-canary".to_string())]
    );
    let canary = template_status(&deleted.status, "canary");
    assert!(canary.service_name.is_empty());
}

#[test]
fn an_invalid_spec_ends_in_error_naming_each_field_and_its_fix() {
    let mut unselected = template("canary", 1);
    unselected
        .as_object_mut()
        .expect("template")
        .remove("selector");
    let experiment = experiment(json!({
        "duration": "soon",
        "templates": [unselected, template("canary", 1)],
        "analyses": [{
            "name": "judge",
            "templateName": "errors",
            "args": [
                {"name": "stable", "valueFrom": {"podTemplateHashValue": "Stable"}},
                {"name": "other", "value": "{{templates.missing.podTemplateHash}}"},
            ],
        }],
    }));
    let invalid = plan(&experiment, &Observed::default(), at(0));
    assert_eq!(invalid.status.phase, Some(AnalysisPhase::Error));
    for field in [
        "spec.duration",
        "spec.templates[0].selector",
        "spec.templates[1].name",
        "spec.analyses[0].args[\"stable\"].valueFrom.podTemplateHashValue",
        "spec.analyses[0].args[\"other\"].value",
    ] {
        assert!(
            invalid.status.message.contains(field),
            "{field} in {}",
            invalid.status.message
        );
    }
    let condition = condition(&invalid.status, "InvalidSpec");
    assert_eq!(condition.message, invalid.status.message);
    assert!(
        condition.message.contains("(fix: "),
        "{}",
        condition.message
    );
    assert!(!invalid.writes_objects(), "nothing is created for it");
    assert!(
        invalid
            .events
            .iter()
            .any(|e| e.reason == "InvalidSpec" && e.warning)
    );
    // Planned again: the same status, no new event.
    let experiment = next(&experiment, &invalid);
    let again = plan(&experiment, &Observed::default(), at(1));
    assert_eq!(again.status, experiment.status.clone().expect("status"));
    assert!(again.events.is_empty());
}

#[test]
fn a_selector_that_misses_the_pod_labels_or_selects_everything_is_invalid() {
    let mut other = template("canary", 1);
    other["selector"] = json!({"matchLabels": {"app": "other"}});
    let mut everything = template("baseline", 1);
    everything["selector"] = json!({});
    let experiment = experiment(json!({"templates": [other, everything]}));
    let invalid = plan(&experiment, &Observed::default(), at(0));
    assert!(
        invalid
            .status
            .message
            .contains("spec.templates[0].selector.matchLabels[\"app\"]"),
        "{}",
        invalid.status.message
    );
    assert!(
        invalid
            .status
            .message
            .contains("spec.templates[1].selector: the selector is empty"),
        "{}",
        invalid.status.message
    );
}

#[test]
fn placeholders_resolve_or_name_the_unknown_one() {
    let values = BTreeMap::from([("templates.a.podTemplateHash".to_string(), "abc".to_string())]);
    assert_eq!(
        build::substitute("hash={{ templates.a.podTemplateHash }},x", &values).as_deref(),
        Ok("hash=abc,x")
    );
    assert_eq!(build::substitute("plain", &values).as_deref(), Ok("plain"));
    assert_eq!(
        build::substitute("{{templates.b.podTemplateHash}}", &values),
        Err("templates.b.podTemplateHash".to_string())
    );
    assert_eq!(
        build::substitute("{{ unclosed", &values).as_deref(),
        Ok("{{ unclosed")
    );
}

#[test]
fn a_template_short_of_its_pods_after_the_duration_waits_for_its_deadline_not_in_a_loop() {
    let (experiment, mut observed, started) = running(two_templates());
    let lost = observed.replica_sets.get_mut("canary").expect("canary");
    (lost.ready, lost.available) = (1, 1);
    let end = started
        .checked_add(Duration::from_secs(700))
        .expect("in range");
    let short = plan(&experiment, &observed, end);
    assert_eq!(
        template_code(&short.status, "canary"),
        Some(TemplateStatusCode::Progressing)
    );
    let deadline = end.checked_add(Duration::from_secs(600)).expect("in range");
    assert_eq!(
        short.requeue_at,
        Some(deadline),
        "the progress deadline, not the end of the duration already past"
    );
}

#[test]
fn a_spec_with_too_many_templates_or_findings_keeps_its_message_short() {
    let many: Vec<Value> = (0..60).map(|i| template(&format!("t{i}"), 1)).collect();
    let crowded = experiment(json!({"templates": many}));
    let invalid = plan(&crowded, &Observed::default(), at(0));
    assert_eq!(invalid.status.phase, Some(AnalysisPhase::Error));
    assert!(
        invalid
            .status
            .message
            .contains("spec.templates: 60 templates, more than 50"),
        "{}",
        invalid.status.message
    );
    let mut labels = serde_json::Map::new();
    for i in 0..40 {
        labels.insert(format!("k{i}"), json!("v"));
    }
    let mut unmatched = template("canary", 1);
    unmatched["selector"] = json!({"matchLabels": labels});
    let unselected = experiment(json!({"templates": [unmatched]}));
    let invalid = plan(&unselected, &Observed::default(), at(0));
    assert!(
        invalid.status.message.ends_with("; and 30 more"),
        "{}",
        invalid.status.message
    );
}

#[test]
fn every_experiment_in_the_examples_is_valid() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("reads examples/") {
        let path = entry.expect("an entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("reads the example");
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for doc in docs.into_iter().filter(|d| d["kind"] == "Experiment") {
            let mut experiment: Experiment =
                serde_json::from_value(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            experiment.metadata.namespace = Some("shop".into());
            let findings = super::validation::validate(&experiment);
            assert!(findings.is_empty(), "{}: {findings:?}", path.display());
            checked += 1;
        }
    }
    assert!(checked > 0, "examples/ holds an Experiment");
}

#[test]
fn a_template_of_zero_replicas_gets_an_empty_replica_set_and_its_hash() {
    let experiment = experiment(json!({"templates": [template("idle", 0), template("canary", 1)]}));
    let first = plan(&experiment, &Observed::default(), at(0));
    let idle = first
        .create_replica_sets
        .iter()
        .find(|(template, _)| template == "idle")
        .map(|(_, rs)| rs)
        .expect("a ReplicaSet for the idle template, as Argo makes");
    assert_eq!(idle.spec.as_ref().and_then(|s| s.replicas), Some(0));
    assert_eq!(
        reasons(&first)
            .iter()
            .filter(|r| **r == "NewReplicaSetCreated")
            .count(),
        1,
        "no creation event for an empty one, as in Argo"
    );
    assert_eq!(
        template_code(&first.status, "idle"),
        Some(TemplateStatusCode::Running)
    );
}
