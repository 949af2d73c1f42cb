//! The Experiment's phase rules as a pure function: from the Experiment and what was observed
//! of its ReplicaSets, Services and AnalysisRuns, the writes to make and the status to record,
//! as Argo's `experiments` package decides them (`reconcileTemplate`, `reconcileAnalysisRun`,
//! `calculateStatus`, `calculateExperimentConditions`, `calculateEnqueueDuration`).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use rollouts_analysis::compose;
use rollouts_crds::analysis::{AnalysisPhase, AnalysisRun};
use rollouts_crds::conditions::{
    INVALID_SPEC, INVALID_SPEC_REASON, NEW_RS_AVAILABLE_REASON, PROGRESSING,
    REPLICA_SET_UPDATED_REASON, STATUS_FALSE, STATUS_TRUE,
};
use rollouts_crds::experiment::{
    Experiment, ExperimentAnalysisRunStatus, ExperimentAnalysisTemplateRef, ExperimentCondition,
    ExperimentStatus, ExperimentTemplate, TemplateStatus, TemplateStatusCode,
};

use super::build;
use super::validation;

/// Seconds a template may go without progress before it fails, when unset (Argo's default).
pub const DEFAULT_PROGRESS_DEADLINE_SECONDS: i32 = 600;
/// Seconds the ReplicaSets of a finished experiment keep their pods, when unset (Argo's).
pub const DEFAULT_SCALE_DOWN_DELAY_SECONDS: i32 = 30;
/// The `Progressing` condition's reason once the experiment succeeded (Argo's).
pub const EXPERIMENT_COMPLETED_REASON: &str = "ExperimentCompleted";
/// The most findings an invalid spec's message lists (status size is bounded).
const MAX_FINDINGS_SHOWN: usize = 10;
/// The experiment's message once every analysis required for completion succeeded (Argo's).
pub const REQUIRED_ANALYSIS_COMPLETED_MESSAGE: &str = "Required AnalysisRuns completed";

/// A template's ReplicaSet as observed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ObservedReplicaSet {
    pub name: String,
    /// `spec.replicas`.
    pub desired: i32,
    pub replicas: i32,
    pub ready: i32,
    pub available: i32,
    pub pod_template_hash: String,
    /// The `scale-down-deadline` annotation as written.
    pub scale_down_deadline: Option<String>,
}

impl ObservedReplicaSet {
    pub fn of(rs: &ReplicaSet) -> Self {
        let status = rs.status.clone().unwrap_or_default();
        Self {
            name: rs.name_any(),
            desired: rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
            replicas: status.replicas,
            ready: status.ready_replicas.unwrap_or(0),
            available: status.available_replicas.unwrap_or(0),
            pod_template_hash: rs
                .labels()
                .get(build::POD_TEMPLATE_HASH_LABEL)
                .cloned()
                .unwrap_or_default(),
            scale_down_deadline: rs
                .annotations()
                .get(build::SCALE_DOWN_DEADLINE_ANNOTATION)
                .cloned(),
        }
    }
}

/// An AnalysisRun of the experiment as observed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ObservedRun {
    pub phase: Option<AnalysisPhase>,
    pub message: String,
    pub terminate: bool,
}

/// What one reconcile observed of the experiment's objects.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    /// The ReplicaSet of each template, by template name.
    pub replica_sets: BTreeMap<String, ObservedReplicaSet>,
    /// The Service of each template that has one, by template name: its name.
    pub services: BTreeMap<String, String>,
    /// The experiment's AnalysisRuns by name; a run named in status and missing here is gone.
    pub runs: BTreeMap<String, ObservedRun>,
    /// For each analysis whose templates were read: the templates gathered, or why not.
    pub templates: BTreeMap<String, Result<compose::Templates, String>>,
}

/// A ReplicaSet's `scale-down-deadline` annotation to write (`Some`) or remove (`None`).
#[derive(Clone, Debug, PartialEq)]
pub struct Deadline {
    pub replica_set: String,
    pub at: Option<String>,
}

/// An event on the experiment.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedEvent {
    pub warning: bool,
    pub reason: String,
    pub message: String,
    /// Also recorded on the Rollout that owns the experiment (an analysis run's transition, as
    /// Argo does so the Rollout's notifications see it, argo-rollouts #4009).
    pub on_rollout: bool,
}

/// What to write for one experiment, in order: ReplicaSets, deadlines, scales, Services,
/// AnalysisRuns, then the status and the events.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub create_replica_sets: Vec<(String, ReplicaSet)>,
    pub deadlines: Vec<Deadline>,
    /// (ReplicaSet, replicas).
    pub scales: Vec<(String, i32)>,
    pub create_services: Vec<(String, Service)>,
    pub delete_services: Vec<(String, String)>,
    pub create_runs: Vec<(String, AnalysisRun)>,
    pub terminate_runs: Vec<String>,
    pub status: ExperimentStatus,
    pub events: Vec<PlannedEvent>,
    /// When to look again without a watch event (a duration, a deadline, a scale-down delay).
    pub requeue_at: Option<Timestamp>,
}

impl Plan {
    fn event(&mut self, warning: bool, reason: impl Into<String>, message: impl Into<String>) {
        self.events.push(PlannedEvent {
            warning,
            reason: reason.into(),
            message: message.into(),
            on_rollout: false,
        });
    }

    fn look_again_at(&mut self, at: Timestamp) {
        self.requeue_at = Some(self.requeue_at.map_or(at, |current| current.min(at)));
    }

    /// Whether the plan writes any object (the status aside).
    pub fn writes_objects(&self) -> bool {
        !(self.create_replica_sets.is_empty()
            && self.deadlines.is_empty()
            && self.scales.is_empty()
            && self.create_services.is_empty()
            && self.delete_services.is_empty()
            && self.create_runs.is_empty()
            && self.terminate_runs.is_empty())
    }
}

/// The experiment's timing settings, defaults applied.
struct Settings {
    duration: Option<Duration>,
    progress_deadline: Duration,
    scale_down_delay: Duration,
}

fn settings(experiment: &Experiment) -> Settings {
    let spec = &experiment.spec;
    Settings {
        // Validation refused a duration that does not parse.
        duration: spec
            .duration
            .as_deref()
            .and_then(|d| rollouts_crds::duration::parse(d).ok()),
        progress_deadline: seconds(
            spec.progress_deadline_seconds
                .unwrap_or(DEFAULT_PROGRESS_DEADLINE_SECONDS),
        ),
        scale_down_delay: seconds(
            spec.scale_down_delay_seconds
                .unwrap_or(DEFAULT_SCALE_DOWN_DELAY_SECONDS),
        ),
    }
}

fn seconds(value: i32) -> Duration {
    Duration::from_secs(u64::try_from(value).unwrap_or(0))
}

fn add(at: Timestamp, duration: Duration) -> Timestamp {
    at.checked_add(duration).unwrap_or(Timestamp::MAX)
}

/// Whether the experiment has run its `duration` since it became available.
fn passed_duration(status: &ExperimentStatus, settings: &Settings, now: Timestamp) -> bool {
    match (&status.available_at, settings.duration) {
        (Some(available_at), Some(duration)) => now > add(available_at.0, duration),
        _ => false,
    }
}

fn is_completed(code: Option<TemplateStatusCode>) -> bool {
    matches!(
        code,
        Some(
            TemplateStatusCode::Successful | TemplateStatusCode::Failed | TemplateStatusCode::Error
        )
    )
}

fn phase_completed(phase: Option<AnalysisPhase>) -> bool {
    phase.is_some_and(AnalysisPhase::is_completed)
}

fn required(analysis: &ExperimentAnalysisTemplateRef) -> bool {
    analysis.required_for_completion == Some(true)
}

/// Every analysis required for completion succeeded (and there is at least one).
fn required_runs_successful(experiment: &Experiment, status: &ExperimentStatus) -> bool {
    let mut any = false;
    for analysis in experiment.spec.analyses.iter().filter(|a| required(a)) {
        any = true;
        let successful = status
            .analysis_runs
            .iter()
            .any(|run| run.name == analysis.name && run.phase == AnalysisPhase::Successful);
        if !successful {
            return false;
        }
    }
    any
}

/// Argo's `IsTerminating`, from the status the reconcile started from: terminated by the user,
/// finished, a template failed, an analysis failed, or the required analyses succeeded.
pub fn is_terminating(experiment: &Experiment) -> bool {
    let status = experiment.status.clone().unwrap_or_default();
    experiment.spec.terminate
        || phase_completed(status.phase)
        || status.template_statuses.iter().any(|t| {
            matches!(
                t.status,
                Some(TemplateStatusCode::Failed | TemplateStatusCode::Error)
            )
        })
        || status.analysis_runs.iter().any(|run| {
            matches!(
                run.phase,
                AnalysisPhase::Failed | AnalysisPhase::Error | AnalysisPhase::Inconclusive
            )
        })
        || required_runs_successful(experiment, &status)
}

/// The pods a template should have now: none once the experiment or the template is done.
fn desired_replicas(
    experiment: &Experiment,
    terminating: bool,
    template: &ExperimentTemplate,
) -> i32 {
    let status = experiment.status.clone().unwrap_or_default();
    let done = status
        .template_statuses
        .iter()
        .any(|t| t.name == template.name && is_completed(t.status));
    if terminating || done {
        0
    } else {
        template.replicas.unwrap_or(1)
    }
}

/// Decides the next writes and the status of `experiment`. Pure: the same inputs give the
/// same plan.
pub fn plan(experiment: &Experiment, observed: &Observed, now: Timestamp) -> Plan {
    let mut plan = Plan::default();
    let previous = experiment.status.clone().unwrap_or_default();
    plan.status = previous.clone();
    let findings = validation::validate(experiment);
    if !findings.is_empty() {
        invalid(experiment, &findings, now, &mut plan);
        return plan;
    }
    plan.status
        .conditions
        .retain(|condition| condition.type_ != INVALID_SPEC);
    let settings = settings(experiment);
    let terminating = is_terminating(experiment);
    for template in &experiment.spec.templates {
        reconcile_template(
            experiment,
            template,
            observed,
            &settings,
            terminating,
            now,
            &mut plan,
        );
    }
    for analysis in &experiment.spec.analyses {
        reconcile_analysis(experiment, analysis, observed, terminating, &mut plan);
    }
    calculate_status(experiment, now, &mut plan);
    conditions(experiment, &settings, now, &mut plan);
    if !terminating {
        enqueue(experiment, &settings, now, &mut plan);
    }
    plan
}

/// A spec that cannot run: the `InvalidSpec` condition and the Error phase, both naming the
/// field and the fix; everything running is scaled down by the next plans (the phase is final).
fn invalid(
    experiment: &Experiment,
    findings: &[rollouts_crds::FieldError],
    now: Timestamp,
    plan: &mut Plan,
) {
    let mut shown: Vec<String> = findings
        .iter()
        .take(MAX_FINDINGS_SHOWN)
        .map(ToString::to_string)
        .collect();
    if findings.len() > MAX_FINDINGS_SHOWN {
        shown.push(format!(
            "and {} more",
            findings.len().saturating_sub(MAX_FINDINGS_SHOWN)
        ));
    }
    let message = format!(
        "Experiment {} has an invalid spec: {}",
        experiment.name_any(),
        shown.join("; ")
    );
    set_condition(
        &mut plan.status,
        condition(
            INVALID_SPEC,
            STATUS_TRUE,
            INVALID_SPEC_REASON,
            &message,
            now,
        ),
        true,
    );
    if !phase_completed(plan.status.phase) {
        let before = plan.status.phase;
        plan.status.phase = Some(AnalysisPhase::Error);
        plan.status.message = message.clone();
        plan.event(true, INVALID_SPEC_REASON, message);
        phase_event(before, AnalysisPhase::Error, plan);
    }
}

fn phase_event(before: Option<AnalysisPhase>, after: AnalysisPhase, plan: &mut Plan) {
    if before == Some(after) {
        return;
    }
    let warning = matches!(
        after,
        AnalysisPhase::Error | AnalysisPhase::Failed | AnalysisPhase::Inconclusive
    );
    plan.event(
        warning,
        format!("Experiment{after}"),
        format!(
            "Experiment transitioned from {} -> {after}",
            before.map(AnalysisPhase::as_str).unwrap_or_default()
        ),
    );
}

/// Argo's `reconcileTemplate`: creates the template's ReplicaSet (and Service), scales it to
/// what the experiment needs (after the scale-down delay when it ends), and records its status.
#[allow(clippy::too_many_arguments)]
fn reconcile_template(
    experiment: &Experiment,
    template: &ExperimentTemplate,
    observed: &Observed,
    settings: &Settings,
    terminating: bool,
    now: Timestamp,
    plan: &mut Plan,
) {
    let before = plan
        .status
        .template_statuses
        .iter()
        .find(|t| t.name == template.name)
        .cloned();
    let mut status = before.clone().unwrap_or_else(|| TemplateStatus {
        name: template.name.clone(),
        ..TemplateStatus::default()
    });
    let desired = desired_replicas(experiment, terminating, template);
    let rs = observed.replica_sets.get(&template.name);
    match rs {
        None => {
            // A template never started is not started once the experiment ends; one of zero
            // replicas still gets its (empty) ReplicaSet, and so its hash, as in Argo.
            if !terminating && !is_completed(status.status) {
                match build::replica_set(experiment, template, desired) {
                    Ok(replica_set) => {
                        if desired > 0 {
                            plan.event(
                                false,
                                "NewReplicaSetCreated",
                                format!(
                                    "Created new replica set \"{}\" with size {desired}",
                                    replica_set.name_any()
                                ),
                            );
                        }
                        plan.create_replica_sets
                            .push((template.name.clone(), replica_set));
                        status.last_transition_time = Some(Time(now));
                    }
                    Err(message) => {
                        status.status = Some(TemplateStatusCode::Error);
                        status.message = format!(
                            "Failed to create ReplicaSet for template '{}': {message}",
                            template.name
                        );
                    }
                }
            }
        }
        Some(rs) => {
            let service = observed.services.get(&template.name);
            if template.service.is_some() {
                if desired != 0 {
                    if service.is_none() {
                        // Without container ports there is nothing to serve (as Argo).
                        if let Some(service) =
                            build::service(experiment, template, &rs.pod_template_hash)
                        {
                            status.service_name = service.name_any();
                            status.pod_template_hash = rs.pod_template_hash.clone();
                            plan.create_services.push((template.name.clone(), service));
                        }
                    } else if let Some(name) = service {
                        status.service_name = name.clone();
                        status.pod_template_hash = rs.pod_template_hash.clone();
                    }
                } else if rs.available == 0 {
                    if let Some(name) = service {
                        plan.delete_services
                            .push((template.name.clone(), name.clone()));
                    }
                    status.service_name.clear();
                    status.pod_template_hash.clear();
                }
            } else if let Some(name) = service {
                plan.delete_services
                    .push((template.name.clone(), name.clone()));
            }
            if desired == 0 {
                scale_down(rs, settings, now, &mut status, plan);
            } else if rs.desired != desired {
                plan.scales.push((rs.name.clone(), desired));
                scale_event(rs, desired, plan);
                status.last_transition_time = Some(Time(now));
            }
        }
    }
    let counts = rs.map_or((0, 0, 0), |rs| (rs.replicas, rs.ready, rs.available));
    let before_counts = before.as_ref().map_or((0, 0, 0), |b| {
        (b.replicas, b.ready_replicas, b.available_replicas)
    });
    status.replicas = counts.0;
    status.updated_replicas = counts.0;
    status.ready_replicas = counts.1;
    status.available_replicas = counts.2;
    if before.is_some() && before_counts != counts {
        status.last_transition_time = Some(Time(now));
    }
    if !is_completed(status.status) {
        let previous = experiment.status.clone().unwrap_or_default();
        if desired == status.available_replicas {
            status.status = Some(
                if passed_duration(&previous, settings, now) || terminating {
                    TemplateStatusCode::Successful
                } else {
                    TemplateStatusCode::Running
                },
            );
        } else {
            let from = status.last_transition_time.as_ref().map_or(now, |t| t.0);
            if now > add(from, settings.progress_deadline) {
                status.status = Some(TemplateStatusCode::Failed);
                status.message = format!(
                    "Template '{}' exceeded its progressDeadlineSeconds ({})",
                    template.name,
                    settings.progress_deadline.as_secs()
                );
            } else if terminating {
                status.status = Some(TemplateStatusCode::Successful);
            } else {
                status.status = Some(TemplateStatusCode::Progressing);
            }
        }
    }
    let before_code = before.as_ref().and_then(|b| b.status);
    if before_code != status.status
        && let Some(code) = status.status
    {
        let mut message = format!(
            "Template '{}' transitioned from {} -> {}",
            template.name,
            before_code.map(code_name).unwrap_or_default(),
            code_name(code)
        );
        if !status.message.is_empty() {
            message = format!("{message}: {}", status.message);
        }
        let warning = matches!(code, TemplateStatusCode::Failed | TemplateStatusCode::Error);
        plan.event(warning, format!("Template{}", code_name(code)), message);
    }
    match plan
        .status
        .template_statuses
        .iter_mut()
        .find(|t| t.name == template.name)
    {
        Some(slot) => *slot = status,
        None => plan.status.template_statuses.push(status),
    }
}

fn scale_event(rs: &ObservedReplicaSet, replicas: i32, plan: &mut Plan) {
    let direction = if rs.desired < replicas { "up" } else { "down" };
    plan.event(
        false,
        "ScalingReplicaSet",
        format!(
            "Scaled {direction} ReplicaSet {} from {} to {replicas}",
            rs.name, rs.desired
        ),
    );
}

/// A template that is done keeps its pods until its `scale-down-deadline` (now + the delay,
/// written the first time), then goes to zero; a delay of zero scales down at once.
fn scale_down(
    rs: &ObservedReplicaSet,
    settings: &Settings,
    now: Timestamp,
    status: &mut TemplateStatus,
    plan: &mut Plan,
) {
    if rs.desired == 0 {
        return;
    }
    if settings.scale_down_delay.is_zero() {
        if rs.scale_down_deadline.is_some() {
            plan.deadlines.push(Deadline {
                replica_set: rs.name.clone(),
                at: None,
            });
        }
    } else {
        let deadline = match rs.scale_down_deadline.as_deref() {
            Some(written) => written.parse::<Timestamp>().ok(),
            None => {
                let at = add(now, settings.scale_down_delay);
                plan.deadlines.push(Deadline {
                    replica_set: rs.name.clone(),
                    at: Some(at.to_string()),
                });
                Some(at)
            }
        };
        // A deadline that does not parse is no reason to keep the pods.
        if let Some(deadline) = deadline
            && deadline > now
        {
            plan.look_again_at(deadline);
            return;
        }
    }
    plan.scales.push((rs.name.clone(), 0));
    scale_event(rs, 0, plan);
    status.last_transition_time = Some(Time(now));
}

fn code_name(code: TemplateStatusCode) -> &'static str {
    match code {
        TemplateStatusCode::Progressing => "Progressing",
        TemplateStatusCode::Running => "Running",
        TemplateStatusCode::Successful => "Successful",
        TemplateStatusCode::Failed => "Failed",
        TemplateStatusCode::Error => "Error",
    }
}

/// Argo's `reconcileAnalysisRun`: before the templates are available only checks that the
/// analysis templates exist; then creates the run once, follows its phase, and terminates it
/// when the experiment ends.
fn reconcile_analysis(
    experiment: &Experiment,
    analysis: &ExperimentAnalysisTemplateRef,
    observed: &Observed,
    terminating: bool,
    plan: &mut Plan,
) {
    let previous = experiment.status.clone().unwrap_or_default();
    let before = previous
        .analysis_runs
        .iter()
        .find(|run| run.name == analysis.name)
        .cloned();
    let mut status = before.clone();
    let error = |message: String| ExperimentAnalysisRunStatus {
        name: analysis.name.clone(),
        analysis_run: before
            .as_ref()
            .map(|b| b.analysis_run.clone())
            .unwrap_or_default(),
        phase: AnalysisPhase::Error,
        message,
    };
    let templates = observed.templates.get(&analysis.name);
    if previous.available_at.is_none() {
        if let Some(Err(reason)) = templates {
            status = Some(error(format!(
                "AnalysisTemplate verification failed for analysis '{}': {reason}",
                analysis.name
            )));
        }
    } else {
        match before.as_ref().filter(|b| !b.analysis_run.is_empty()) {
            None if terminating => {}
            None => {
                let created = match templates {
                    Some(Ok(templates)) => {
                        build::analysis_run(experiment, analysis, templates, observed)
                    }
                    Some(Err(reason)) => Err(reason.clone()),
                    None => Err(format!(
                        "the templates of analysis '{}' were not read",
                        analysis.name
                    )),
                };
                status = Some(match created {
                    Ok(run) => {
                        let name = run.name_any();
                        plan.create_runs.push((analysis.name.clone(), run));
                        ExperimentAnalysisRunStatus {
                            name: analysis.name.clone(),
                            analysis_run: name,
                            phase: AnalysisPhase::Pending,
                            message: String::new(),
                        }
                    }
                    Err(reason) => error(format!(
                        "Failed to create AnalysisRun for analysis '{}': {reason}",
                        analysis.name
                    )),
                });
            }
            Some(before) if before.phase.is_completed() => {}
            Some(before) => match observed.runs.get(&before.analysis_run) {
                None => {
                    status = Some(error(format!(
                        "AnalysisRun {} not found: it was deleted while the experiment ran",
                        before.analysis_run
                    )));
                }
                Some(run) => {
                    let completed = phase_completed(run.phase);
                    if terminating && !completed {
                        if !run.terminate {
                            plan.terminate_runs.push(before.analysis_run.clone());
                            plan.event(
                                false,
                                "AnalysisRunTerminating",
                                format!("Terminating {} ({})", analysis.name, before.analysis_run),
                            );
                        }
                    } else if let Some(phase) = run.phase {
                        // Argo stops following a run once the experiment terminates; the phase a
                        // terminated run ends in is recorded here, so an experiment waiting on it
                        // can conclude.
                        status = Some(ExperimentAnalysisRunStatus {
                            phase,
                            message: run.message.clone(),
                            ..before.clone()
                        });
                    }
                }
            },
        }
    }
    let Some(status) = status else {
        return;
    };
    let before_phase = before.as_ref().map(|b| b.phase);
    if before_phase != Some(status.phase) {
        let mut message = format!(
            "AnalysisRun '{}' transitioned from {} -> {}",
            analysis.name,
            before_phase.map(AnalysisPhase::as_str).unwrap_or_default(),
            status.phase
        );
        if !status.message.is_empty() {
            message = format!("{message}: {}", status.message);
        }
        let warning = matches!(
            status.phase,
            AnalysisPhase::Failed | AnalysisPhase::Error | AnalysisPhase::Inconclusive
        );
        plan.events.push(PlannedEvent {
            warning,
            reason: format!("AnalysisRun{}", status.phase),
            message,
            on_rollout: true,
        });
    }
    match plan
        .status
        .analysis_runs
        .iter_mut()
        .find(|run| run.name == analysis.name)
    {
        Some(slot) => *slot = status,
        None => plan.status.analysis_runs.push(status),
    }
}

fn template_rank(code: TemplateStatusCode) -> usize {
    match code {
        TemplateStatusCode::Successful => 0,
        TemplateStatusCode::Running => 1,
        TemplateStatusCode::Progressing => 2,
        TemplateStatusCode::Error => 3,
        TemplateStatusCode::Failed => 4,
    }
}

fn phase_rank(phase: AnalysisPhase) -> usize {
    AnalysisPhase::BEST_TO_WORST
        .iter()
        .position(|p| *p == phase)
        .unwrap_or(0)
}

/// The worst template status, as the experiment's phase, with its message.
fn assess_templates(experiment: &Experiment, status: &ExperimentStatus) -> (AnalysisPhase, String) {
    let mut worst = TemplateStatusCode::Successful;
    let mut message = String::new();
    for template in &experiment.spec.templates {
        match status
            .template_statuses
            .iter()
            .find(|t| t.name == template.name)
        {
            None => {
                if template_rank(TemplateStatusCode::Progressing) > template_rank(worst) {
                    worst = TemplateStatusCode::Progressing;
                }
            }
            Some(t) => {
                let code = t.status.unwrap_or(TemplateStatusCode::Successful);
                if template_rank(code) > template_rank(worst) {
                    worst = code;
                    message = t.message.clone();
                }
            }
        }
    }
    let phase = match worst {
        TemplateStatusCode::Progressing => AnalysisPhase::Pending,
        TemplateStatusCode::Running => AnalysisPhase::Running,
        TemplateStatusCode::Successful => AnalysisPhase::Successful,
        TemplateStatusCode::Failed => AnalysisPhase::Failed,
        TemplateStatusCode::Error => AnalysisPhase::Error,
    };
    (phase, message)
}

/// The worst analysis phase (an analysis not started counts as Successful, as Argo's empty
/// phase does); Successful once every required analysis succeeded and the rest did too.
fn assess_analyses(experiment: &Experiment, status: &ExperimentStatus) -> (AnalysisPhase, String) {
    let mut worst = AnalysisPhase::Successful;
    let mut message = String::new();
    for analysis in &experiment.spec.analyses {
        if let Some(run) = status
            .analysis_runs
            .iter()
            .find(|r| r.name == analysis.name)
            && phase_rank(run.phase) > phase_rank(worst)
        {
            worst = run.phase;
            message = run.message.clone();
        }
    }
    if required_runs_successful(experiment, status) && worst == AnalysisPhase::Successful {
        return (
            AnalysisPhase::Successful,
            REQUIRED_ANALYSIS_COMPLETED_MESSAGE.to_string(),
        );
    }
    if worst == AnalysisPhase::Pending {
        worst = AnalysisPhase::Running;
    }
    (worst, message)
}

/// Argo's `calculateStatus`: the phase from the templates and the analyses.
fn calculate_status(experiment: &Experiment, now: Timestamp, plan: &mut Plan) {
    let before = plan.status.phase;
    match plan.status.phase {
        None => plan.status.phase = Some(AnalysisPhase::Pending),
        Some(AnalysisPhase::Pending | AnalysisPhase::Running) => {
            let (templates, template_message) = assess_templates(experiment, &plan.status);
            let (analyses, analyses_message) = assess_analyses(experiment, &plan.status);
            if templates == AnalysisPhase::Running && plan.status.available_at.is_none() {
                plan.status.available_at = Some(Time(now));
            }
            let (phase, message) = if templates.is_completed() {
                let analyses_decide =
                    analyses.is_completed() || experiment.spec.analyses.iter().any(required);
                if templates == AnalysisPhase::Successful && analyses_decide {
                    (analyses, analyses_message)
                } else {
                    (templates, template_message)
                }
            } else if (analyses.is_completed() && analyses != AnalysisPhase::Successful)
                || required_runs_successful(experiment, &plan.status)
            {
                (analyses, analyses_message)
            } else {
                (templates, template_message)
            };
            plan.status.phase = Some(phase);
            plan.status.message = message;
        }
        Some(_) => {}
    }
    if let Some(after) = plan.status.phase {
        phase_event(before, after, plan);
    }
}

/// Argo's `calculateExperimentConditions`: `Progressing` False/ExperimentCompleted once
/// successful, True/ReplicaSetUpdated while pod counts move, True/NewReplicaSetAvailable while
/// it runs its duration.
fn conditions(experiment: &Experiment, settings: &Settings, now: Timestamp, plan: &mut Plan) {
    let name = experiment.name_any();
    let previous = experiment.status.clone().unwrap_or_default();
    if plan.status.phase == Some(AnalysisPhase::Successful) {
        let message = format!("Experiment \"{name}\" has successfully ran and completed.");
        set_condition(
            &mut plan.status,
            condition(
                PROGRESSING,
                STATUS_FALSE,
                EXPERIMENT_COMPLETED_REASON,
                &message,
                now,
            ),
            false,
        );
    } else if progressed(&previous, &plan.status) {
        let message = format!("Experiment \"{name}\" is progressing.");
        let mut new = condition(
            PROGRESSING,
            STATUS_TRUE,
            REPLICA_SET_UPDATED_REASON,
            &message,
            now,
        );
        if let Some(current) = previous
            .conditions
            .iter()
            .find(|c| c.type_ == PROGRESSING && c.status == STATUS_TRUE)
        {
            new.last_transition_time = current.last_transition_time.clone();
        }
        plan.status.conditions.retain(|c| c.type_ != PROGRESSING);
        plan.status.conditions.push(new);
    } else if previous.available_at.is_some() && !passed_duration(&previous, settings, now) {
        let message = format!("Experiment \"{name}\" is running.");
        set_condition(
            &mut plan.status,
            condition(
                PROGRESSING,
                STATUS_TRUE,
                NEW_RS_AVAILABLE_REASON,
                &message,
                now,
            ),
            false,
        );
    }
}

/// Whether a template was added or its pod counts moved.
fn progressed(before: &ExperimentStatus, after: &ExperimentStatus) -> bool {
    if before.template_statuses.len() < after.template_statuses.len() {
        return true;
    }
    before.template_statuses.iter().any(|old| {
        after.template_statuses.iter().any(|new| {
            new.name == old.name
                && (
                    old.replicas,
                    old.updated_replicas,
                    old.ready_replicas,
                    old.available_replicas,
                ) != (
                    new.replicas,
                    new.updated_replicas,
                    new.ready_replicas,
                    new.available_replicas,
                )
        })
    })
}

fn condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> ExperimentCondition {
    ExperimentCondition {
        type_: type_.to_string(),
        status: status.to_string(),
        last_update_time: Time(now),
        last_transition_time: Time(now),
        reason: reason.to_string(),
        message: message.to_string(),
    }
}

/// Argo's `SetExperimentCondition`: a condition of the same type, status and reason is kept
/// as it is (unless `replace_message` and its message differs); the transition time is kept
/// while the status stays.
fn set_condition(
    status: &mut ExperimentStatus,
    mut new: ExperimentCondition,
    replace_message: bool,
) {
    if let Some(current) = status.conditions.iter().find(|c| c.type_ == new.type_) {
        if current.status == new.status
            && current.reason == new.reason
            && (!replace_message || current.message == new.message)
        {
            return;
        }
        if current.status == new.status {
            new.last_transition_time = current.last_transition_time.clone();
        }
    }
    status.conditions.retain(|c| c.type_ != new.type_);
    status.conditions.push(new);
}

/// Argo's `calculateEnqueueDuration`: the end of the duration, and the progress deadline of
/// each template still short of its pods.
fn enqueue(experiment: &Experiment, settings: &Settings, now: Timestamp, plan: &mut Plan) {
    let status = plan.status.clone();
    if phase_completed(status.phase) {
        return;
    }
    // The end of the duration, unless it passed (then templates short of their pods wait for
    // their progress deadline, not a busy loop).
    if let (Some(available_at), Some(duration)) = (&status.available_at, settings.duration) {
        let end = add(available_at.0, duration);
        if end >= now {
            plan.look_again_at(end);
        }
    }
    for template in &experiment.spec.templates {
        let Some(ts) = status
            .template_statuses
            .iter()
            .find(|t| t.name == template.name)
        else {
            continue;
        };
        if !matches!(
            ts.status,
            Some(TemplateStatusCode::Progressing | TemplateStatusCode::Running)
        ) {
            continue;
        }
        if ts.available_replicas != template.replicas.unwrap_or(1)
            && let Some(since) = &ts.last_transition_time
        {
            plan.look_again_at(add(since.0, settings.progress_deadline));
        }
    }
}

/// Whether the experiment is over and nothing of it is left to scale or delete: such an
/// experiment is not read or written again until it changes.
pub fn at_rest(
    experiment: &Experiment,
    replica_sets: &BTreeMap<String, ObservedReplicaSet>,
) -> bool {
    let Some(status) = experiment.status.as_ref() else {
        return false;
    };
    phase_completed(status.phase)
        && status
            .template_statuses
            .iter()
            .all(|t| t.service_name.is_empty() && t.replicas == 0 && t.available_replicas == 0)
        && replica_sets
            .values()
            .all(|rs| rs.desired == 0 && rs.replicas == 0 && rs.available == 0)
}
