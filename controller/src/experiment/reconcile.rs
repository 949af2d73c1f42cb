//! One Experiment reconcile: observe its ReplicaSets, Services, AnalysisRuns and analysis
//! templates, plan (pure, [`super::plan`]), write what the plan asks, then the status (only
//! when it changed, only over the copy it was planned from) and the events; the error policy.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{ObjectReference, Service};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use rollouts_analysis::compose;
use rollouts_crds::analysis::{
    AnalysisPhase, AnalysisRun, AnalysisTemplate, AnalysisTemplateSpec, ClusterAnalysisTemplate,
    RolloutAnalysisTemplate,
};
use rollouts_crds::experiment::{Experiment, ExperimentStatus, TemplateStatusCode};
use serde_json::json;
use tracing::instrument;

use super::build::{self, EXPERIMENT_NAME_ANNOTATION, EXPERIMENT_TEMPLATE_NAME_ANNOTATION};
use super::plan::{self, Observed, ObservedReplicaSet, ObservedRun, Plan, PlannedEvent};
use super::{Error, ExperimentContext, Result, lock};
use crate::context::retry_backoff;
use crate::events;

/// The soonest a requeue fires, and the latest (a long duration is looked at again anyway).
const MIN_REQUEUE: Duration = Duration::from_millis(200);
const MAX_REQUEUE: Duration = Duration::from_secs(300);

fn object_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Reconciles one Experiment.
#[instrument(skip(experiment, ctx), fields(namespace = experiment.namespace(), name = experiment.name_any()))]
pub async fn reconcile(experiment: Arc<Experiment>, ctx: Arc<ExperimentContext>) -> Result<Action> {
    let namespace = experiment
        .namespace()
        .ok_or_else(|| Error::MissingNamespace(experiment.name_any()))?;
    let name = experiment.name_any();
    let key = object_key(&namespace, &name);
    if experiment.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let replica_sets = cached_replica_sets(&experiment, &ctx);
    // Finished with nothing left to scale or delete: no read, no write.
    if plan::at_rest(&experiment, &replica_sets) && !stale(&ctx, &key, &experiment) {
        lock(&ctx.status_written).remove(&key);
        lock(&ctx.failures).remove(&key);
        return Ok(Action::await_change());
    }
    let experiment = if take_stale(&ctx, &key, experiment.resource_version().as_deref()) {
        let api: Api<Experiment> = Api::namespaced(ctx.client.clone(), &namespace);
        match api.get_opt(&name).await {
            Ok(Some(fresh)) => Arc::new(fresh),
            Ok(None) => return Ok(Action::await_change()),
            Err(source) => {
                return Err(Error::Read {
                    kind: "Experiment",
                    namespace,
                    name: name.clone(),
                    experiment: name,
                    source: Box::new(source),
                });
            }
        }
    } else {
        experiment
    };
    let action = reconcile_experiment(&experiment, &namespace, replica_sets, &ctx).await?;
    lock(&ctx.failures).remove(&key);
    Ok(action)
}

/// Logs a failed reconcile, then retries with a growing backoff.
pub fn error_policy(
    experiment: Arc<Experiment>,
    error: &Error,
    ctx: Arc<ExperimentContext>,
) -> Action {
    let key = object_key(
        &experiment.namespace().unwrap_or_default(),
        &experiment.name_any(),
    );
    let failures = {
        let mut failures = lock(&ctx.failures);
        let count = failures.entry(key.clone()).or_insert(0);
        *count = count.saturating_add(1);
        *count
    };
    let retry_in = retry_backoff(failures);
    tracing::warn!(experiment = %key, %error, error_kind = error.metric_label(), ?retry_in, "Experiment reconcile failed");
    Action::requeue(retry_in)
}

fn stale(ctx: &ExperimentContext, key: &str, experiment: &Experiment) -> bool {
    lock(&ctx.status_written)
        .get(key)
        .is_some_and(|written| Some(written.as_str()) != experiment.resource_version().as_deref())
}

/// Whether a cached copy at `resource_version` may predate our last status write; forgets
/// the write once it has been seen or re-read.
fn take_stale(ctx: &ExperimentContext, key: &str, resource_version: Option<&str>) -> bool {
    match lock(&ctx.status_written).remove(key) {
        Some(written) => Some(written.as_str()) != resource_version,
        None => false,
    }
}

/// Whether `meta` is controlled by this experiment and made for one of its templates.
fn ours(
    experiment: &Experiment,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<String> {
    let uid = experiment.uid()?;
    let controlled = meta
        .owner_references
        .iter()
        .flatten()
        .any(|owner| owner.controller == Some(true) && owner.uid == uid);
    let annotations = meta.annotations.as_ref()?;
    if !controlled || annotations.get(EXPERIMENT_NAME_ANNOTATION) != Some(&experiment.name_any()) {
        return None;
    }
    let template = annotations.get(EXPERIMENT_TEMPLATE_NAME_ANNOTATION)?;
    experiment
        .spec
        .templates
        .iter()
        .any(|t| &t.name == template)
        .then(|| template.clone())
}

/// The experiment's ReplicaSets in the watch cache, by template.
fn cached_replica_sets(
    experiment: &Experiment,
    ctx: &ExperimentContext,
) -> BTreeMap<String, ObservedReplicaSet> {
    let namespace = experiment.namespace();
    let mut found = BTreeMap::new();
    for rs in ctx.replica_sets.state() {
        if rs.namespace() != namespace {
            continue;
        }
        if let Some(template) = ours(experiment, rs.meta()) {
            found
                .entry(template)
                .or_insert_with(|| ObservedReplicaSet::of(&rs));
        }
    }
    found
}

fn read_error(
    kind: &'static str,
    namespace: &str,
    name: &str,
    experiment: &Experiment,
) -> impl FnOnce(kube::Error) -> Error {
    let (namespace, name, experiment) = (
        namespace.to_string(),
        name.to_string(),
        experiment.name_any(),
    );
    move |source| Error::Read {
        kind,
        namespace,
        name,
        experiment,
        source: Box::new(source),
    }
}

/// Everything the plan needs, read before planning.
async fn observe(
    experiment: &Experiment,
    namespace: &str,
    mut replica_sets: BTreeMap<String, ObservedReplicaSet>,
    ctx: &ExperimentContext,
) -> Result<Observed> {
    let status = experiment.status.clone().unwrap_or_default();
    let finished = status.phase.is_some_and(AnalysisPhase::is_completed);
    // One created by an earlier pass that the watch has not delivered yet is read by name.
    let rs_api: Api<ReplicaSet> = Api::namespaced(ctx.client.clone(), namespace);
    for template in &experiment.spec.templates {
        if replica_sets.contains_key(&template.name)
            || !status
                .template_statuses
                .iter()
                .any(|t| t.name == template.name)
        {
            continue;
        }
        let name = build::replica_set_name(&experiment.name_any(), &template.name);
        if let Some(rs) = rs_api.get_opt(&name).await.map_err(read_error(
            "ReplicaSet",
            namespace,
            &name,
            experiment,
        ))? && ours(experiment, rs.meta()).as_deref() == Some(template.name.as_str())
        {
            replica_sets.insert(template.name.clone(), ObservedReplicaSet::of(&rs));
        }
    }
    // Services: one the status records was created by an earlier pass and is taken as there
    // (deleting it tolerates its absence); one wanted and not recorded is read by name.
    let mut services = BTreeMap::new();
    let svc_api: Api<Service> = Api::namespaced(ctx.client.clone(), namespace);
    for template in &experiment.spec.templates {
        let recorded = status
            .template_statuses
            .iter()
            .find(|t| t.name == template.name)
            .map(|t| t.service_name.clone())
            .filter(|name| !name.is_empty());
        if let Some(name) = recorded {
            services.insert(template.name.clone(), name);
            continue;
        }
        if template.service.is_none() || finished {
            continue;
        }
        let name = build::service_name(&experiment.name_any(), template);
        if let Some(service) = svc_api
            .get_opt(&name)
            .await
            .map_err(read_error("Service", namespace, &name, experiment))?
            && ours(experiment, service.meta()).as_deref() == Some(template.name.as_str())
        {
            services.insert(template.name.clone(), name);
        }
    }
    // Runs the status follows.
    let mut runs = BTreeMap::new();
    let run_api: Api<AnalysisRun> = Api::namespaced(ctx.client.clone(), namespace);
    for pointer in &status.analysis_runs {
        if pointer.analysis_run.is_empty() || pointer.phase.is_completed() {
            continue;
        }
        let cached = ctx
            .runs
            .get(&ObjectRef::new(&pointer.analysis_run).within(namespace));
        let run = match cached {
            Some(run) => Some((*run).clone()),
            None => run_api
                .get_opt(&pointer.analysis_run)
                .await
                .map_err(read_error(
                    "AnalysisRun",
                    namespace,
                    &pointer.analysis_run,
                    experiment,
                ))?,
        };
        if let Some(run) = run {
            let run_status = run.status.clone();
            runs.insert(
                pointer.analysis_run.clone(),
                ObservedRun {
                    phase: run_status.as_ref().map(|s| s.phase),
                    message: run_status.map(|s| s.message).unwrap_or_default(),
                    terminate: run.spec.terminate,
                },
            );
        }
    }
    // Templates of analyses not started yet, while the experiment may still start them.
    let mut templates = BTreeMap::new();
    if !plan::is_terminating(experiment) {
        let mut cache = TemplateCache::default();
        for analysis in &experiment.spec.analyses {
            let started = status.analysis_runs.iter().any(|run| {
                run.name == analysis.name
                    && (!run.analysis_run.is_empty() || run.phase.is_completed())
            });
            if started {
                continue;
            }
            let reference = RolloutAnalysisTemplate {
                template_name: analysis.template_name.clone(),
                cluster_scope: analysis.cluster_scope,
            };
            cache.fetch(&reference, namespace, experiment, ctx).await?;
            let gathered = compose::gather(std::slice::from_ref(&reference), |r| cache.lookup(r));
            templates.insert(analysis.name.clone(), gathered);
        }
    }
    Ok(Observed {
        replica_sets,
        services,
        runs,
        templates,
    })
}

/// Analysis templates read for one reconcile: found (or why not), by (cluster scope, name).
#[derive(Default)]
struct TemplateCache {
    found: BTreeMap<(bool, String), Result<AnalysisTemplateSpec, String>>,
}

impl TemplateCache {
    /// Reads `reference` and every template it names, nested ones included (at most
    /// [`compose::MAX_TEMPLATES`]).
    async fn fetch(
        &mut self,
        reference: &RolloutAnalysisTemplate,
        namespace: &str,
        experiment: &Experiment,
        ctx: &ExperimentContext,
    ) -> Result<()> {
        let mut pending = vec![(
            reference.cluster_scope == Some(true),
            reference.template_name.clone(),
        )];
        while let Some(key) = pending.pop() {
            if self.found.contains_key(&key) || self.found.len() > compose::MAX_TEMPLATES {
                continue;
            }
            let (cluster, name) = &key;
            let kind = if *cluster {
                "ClusterAnalysisTemplate"
            } else {
                "AnalysisTemplate"
            };
            let read = if *cluster {
                let api: Api<ClusterAnalysisTemplate> = Api::all(ctx.client.clone());
                api.get_opt(name).await.map(|t| t.map(|t| t.spec.0))
            } else {
                let api: Api<AnalysisTemplate> = Api::namespaced(ctx.client.clone(), namespace);
                api.get_opt(name).await.map(|t| t.map(|t| t.spec))
            };
            let found = match read {
                Ok(Some(spec)) => {
                    pending.extend(
                        spec.templates
                            .iter()
                            .map(|r| (r.cluster_scope == Some(true), r.template_name.clone())),
                    );
                    Ok(spec)
                }
                Ok(None) => Err(format!(
                    "{kind} {name:?} not found: create it, or fix templateName"
                )),
                Err(kube::Error::SerdeError(error)) => {
                    Err(format!("{kind} {name:?} cannot be decoded: {error}"))
                }
                Err(source) => return Err(read_error(kind, namespace, name, experiment)(source)),
            };
            self.found.insert(key, found);
        }
        Ok(())
    }

    fn lookup(&self, reference: &RolloutAnalysisTemplate) -> Result<AnalysisTemplateSpec, String> {
        let cluster = reference.cluster_scope == Some(true);
        let kind = if cluster {
            "ClusterAnalysisTemplate"
        } else {
            "AnalysisTemplate"
        };
        let spec = self
            .found
            .get(&(cluster, reference.template_name.clone()))
            .cloned()
            .unwrap_or_else(|| Err(format!("{kind} {:?} was not read", reference.template_name)))?;
        // A provider this controller lacks is refused before a run is made that would only
        // error at every measurement.
        for metric in &spec.metrics {
            if let Err(error @ crate::analysisrun::ProviderChoiceError::Unsupported { .. }) =
                crate::analysisrun::provider_kind(metric)
            {
                return Err(format!("{kind} {:?}: {error}", reference.template_name));
            }
        }
        Ok(spec)
    }
}

async fn reconcile_experiment(
    experiment: &Experiment,
    namespace: &str,
    replica_sets: BTreeMap<String, ObservedReplicaSet>,
    ctx: &ExperimentContext,
) -> Result<Action> {
    let observed = observe(experiment, namespace, replica_sets, ctx).await?;
    // Whole seconds, as the API stores times: times computed here match those read back.
    let now = Timestamp::now();
    let now = Timestamp::from_second(now.as_second()).unwrap_or(now);
    let mut plan = plan::plan(experiment, &observed, now);
    act(experiment, namespace, &mut plan, ctx).await?;
    if plan.status.phase != experiment.status.as_ref().and_then(|s| s.phase) {
        tracing::info!(phase = ?plan.status.phase, message = %plan.status.message, "Experiment phase changed");
    }
    match write_status(experiment, namespace, &plan.status, ctx).await? {
        StatusWrite::Conflict => {
            tracing::debug!("the experiment changed under us; looking again");
            lock(&ctx.status_written)
                .insert(object_key(namespace, &experiment.name_any()), String::new());
            return Ok(Action::requeue(MIN_REQUEUE));
        }
        StatusWrite::Written | StatusWrite::Unchanged => {}
    }
    for event in &plan.events {
        publish(experiment, event, ctx).await;
    }
    Ok(match plan.requeue_at {
        Some(at) => Action::requeue(until(at).clamp(MIN_REQUEUE, MAX_REQUEUE)),
        None => Action::await_change(),
    })
}

/// The wait until `at`, rounded up to the millisecond.
fn until(at: Timestamp) -> Duration {
    let nanos = u128::try_from(at.duration_since(Timestamp::now()).as_nanos()).unwrap_or(0);
    Duration::from_millis(u64::try_from(nanos.div_ceil(1_000_000)).unwrap_or(u64::MAX))
}

/// A write the API server refused for good: the template or analysis it was for gets the
/// Error status with this message, as Argo records a failed create.
enum Refusal {
    Template(String, String),
    Analysis(String, String),
}

fn write_error(
    verb: &'static str,
    kind: &'static str,
    namespace: &str,
    name: &str,
    experiment: &Experiment,
) -> impl FnOnce(kube::Error) -> Error {
    let (namespace, name, experiment) = (
        namespace.to_string(),
        name.to_string(),
        experiment.name_any(),
    );
    move |source| Error::Write {
        verb,
        kind,
        namespace,
        name,
        experiment,
        source: Box::new(source),
    }
}

/// What a create found.
enum Created {
    Done,
    /// An object of that name exists and is not this experiment's.
    Taken,
    Refused(kube::Error),
}

/// Creates `object`; one of that name already there is fine when `is_ours` says it is ours.
async fn create<K>(
    api: &Api<K>,
    object: &K,
    is_ours: impl Fn(&K) -> bool,
) -> std::result::Result<Created, kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(Created::Done),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            match api.get_opt(&object.name_any()).await? {
                Some(existing) if is_ours(&existing) => Ok(Created::Done),
                Some(_) => Ok(Created::Taken),
                // Deleted in between: the next pass creates it.
                None => Ok(Created::Done),
            }
        }
        Err(error) if crate::error::is_transient(&error) => Err(error),
        Err(error) => Ok(Created::Refused(error)),
    }
}

/// A write's result with a 404 as `None`: the object is gone, so there is nothing left to change.
fn unless_gone<T>(result: kube::Result<T>) -> kube::Result<Option<T>> {
    match result {
        Ok(written) => Ok(Some(written)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(error) => Err(error),
    }
}

/// Makes the plan's writes, in order; a refusal for good becomes the status of the template or
/// analysis it was for, a passing failure the reconcile's error (retried).
async fn act(
    experiment: &Experiment,
    namespace: &str,
    plan: &mut Plan,
    ctx: &ExperimentContext,
) -> Result<()> {
    let mut refusals = Vec::new();
    let rs_api: Api<ReplicaSet> = Api::namespaced(ctx.client.clone(), namespace);
    for (template, rs) in &plan.create_replica_sets {
        let name = rs.name_any();
        match create(&rs_api, rs, |existing| ours(experiment, existing.meta()).as_deref() == Some(template.as_str()))
            .await
            .map_err(write_error("create", "ReplicaSet", namespace, &name, experiment))?
        {
            Created::Done => tracing::info!(replica_set = %name, "created ReplicaSet"),
            Created::Taken => refusals.push(Refusal::Template(
                template.clone(),
                format!("Failed to create ReplicaSet for template '{template}': ReplicaSet {name} exists and is not owned by this experiment (delete it, or rename the template)"),
            )),
            Created::Refused(error) => refusals.push(Refusal::Template(
                template.clone(),
                format!("Failed to create ReplicaSet for template '{template}': {error}"),
            )),
        }
    }
    for deadline in &plan.deadlines {
        // A deadline already written (the watch cache may not show it yet) is never moved.
        if deadline.at.is_some()
            && rs_api
                .get_opt(&deadline.replica_set)
                .await
                .map_err(read_error(
                    "ReplicaSet",
                    namespace,
                    &deadline.replica_set,
                    experiment,
                ))?
                .is_some_and(|rs| {
                    rs.annotations()
                        .contains_key(build::SCALE_DOWN_DEADLINE_ANNOTATION)
                })
        {
            continue;
        }
        let patch = json!({"metadata": {"annotations": {build::SCALE_DOWN_DEADLINE_ANNOTATION: deadline.at}}});
        unless_gone(
            rs_api
                .patch(
                    &deadline.replica_set,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await,
        )
        .map_err(write_error(
            "patch",
            "ReplicaSet",
            namespace,
            &deadline.replica_set,
            experiment,
        ))?;
    }
    for (name, replicas) in &plan.scales {
        let patch = json!({"spec": {"replicas": replicas}});
        let scaled = rs_api
            .patch_scale(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        if unless_gone(scaled)
            .map_err(write_error(
                "scale",
                "ReplicaSet",
                namespace,
                name,
                experiment,
            ))?
            .is_some()
        {
            tracing::info!(replica_set = %name, replicas, "scaled ReplicaSet");
        }
    }
    let svc_api: Api<Service> = Api::namespaced(ctx.client.clone(), namespace);
    for (template, service) in &plan.create_services {
        let name = service.name_any();
        match create(&svc_api, service, |existing| ours(experiment, existing.meta()).as_deref() == Some(template.as_str()))
            .await
            .map_err(write_error("create", "Service", namespace, &name, experiment))?
        {
            Created::Done => tracing::info!(service = %name, "created Service"),
            Created::Taken => refusals.push(Refusal::Template(
                template.clone(),
                format!("Failed to create Service {name} for template '{template}': it exists and is not owned by this experiment (delete it, or set service.name)"),
            )),
            Created::Refused(error) => refusals.push(Refusal::Template(
                template.clone(),
                format!("Failed to create Service {name} for template '{template}': {error}"),
            )),
        }
    }
    for (template, name) in &plan.delete_services {
        let deleted = svc_api.delete(name, &DeleteParams::background()).await;
        if unless_gone(deleted)
            .map_err(write_error(
                "delete", "Service", namespace, name, experiment,
            ))?
            .is_some()
        {
            tracing::info!(service = %name, %template, "deleted Service");
        }
    }
    let run_api: Api<AnalysisRun> = Api::namespaced(ctx.client.clone(), namespace);
    for (analysis, run) in &plan.create_runs {
        let name = run.name_any();
        let uid = experiment.uid();
        let is_ours = |existing: &AnalysisRun| {
            existing
                .owner_references()
                .iter()
                .any(|o| o.controller == Some(true) && Some(&o.uid) == uid.as_ref())
        };
        match create(&run_api, run, is_ours)
            .await
            .map_err(write_error("create", "AnalysisRun", namespace, &name, experiment))?
        {
            Created::Done => tracing::info!(analysis_run = %name, "created AnalysisRun"),
            Created::Taken => refusals.push(Refusal::Analysis(
                analysis.clone(),
                format!("Failed to create AnalysisRun for analysis '{analysis}': AnalysisRun {name} exists and is not owned by this experiment (delete it, or rename the analysis)"),
            )),
            Created::Refused(error) => refusals.push(Refusal::Analysis(
                analysis.clone(),
                format!("Failed to create AnalysisRun for analysis '{analysis}': {error}"),
            )),
        }
    }
    for name in &plan.terminate_runs {
        let patch = json!({"spec": {"terminate": true}});
        let terminated = run_api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        if unless_gone(terminated)
            .map_err(write_error(
                "patch",
                "AnalysisRun",
                namespace,
                name,
                experiment,
            ))?
            .is_some()
        {
            tracing::info!(analysis_run = %name, "terminated AnalysisRun");
        }
    }
    record_refusals(&mut plan.status, &mut plan.events, refusals);
    Ok(())
}

fn record_refusals(
    status: &mut ExperimentStatus,
    events: &mut Vec<PlannedEvent>,
    refusals: Vec<Refusal>,
) {
    for refusal in refusals {
        match refusal {
            Refusal::Template(template, message) => {
                if let Some(ts) = status
                    .template_statuses
                    .iter_mut()
                    .find(|t| t.name == template)
                {
                    let before = ts.status;
                    ts.status = Some(TemplateStatusCode::Error);
                    ts.message = message.clone();
                    if before != ts.status {
                        events.push(PlannedEvent {
                            warning: true,
                            reason: "TemplateError".into(),
                            message: format!(
                                "Template '{template}' transitioned to Error: {message}"
                            ),
                            on_rollout: false,
                        });
                    }
                }
            }
            Refusal::Analysis(analysis, message) => {
                if let Some(run) = status.analysis_runs.iter_mut().find(|r| r.name == analysis) {
                    run.phase = AnalysisPhase::Error;
                    run.analysis_run.clear();
                    run.message = message.clone();
                    events.push(PlannedEvent {
                        warning: true,
                        reason: "AnalysisRunError".into(),
                        message: format!(
                            "AnalysisRun '{analysis}' transitioned to Error: {message}"
                        ),
                        on_rollout: true,
                    });
                }
            }
        }
    }
}

/// What became of a status write.
enum StatusWrite {
    Unchanged,
    Written,
    /// The experiment changed since the copy the status was planned from; nothing written.
    Conflict,
}

/// Merge-patches `/status` to `desired` when it differs, on condition that the experiment is
/// still at the resourceVersion it was read at.
async fn write_status(
    experiment: &Experiment,
    namespace: &str,
    desired: &ExperimentStatus,
    ctx: &ExperimentContext,
) -> Result<StatusWrite> {
    let name = experiment.name_any();
    let Some(mut patch) =
        crate::status_patch::patch_when_changed(experiment.status.as_ref(), desired).map_err(
            |source| Error::EncodeStatus {
                namespace: namespace.to_string(),
                name: name.clone(),
                source,
            },
        )?
    else {
        return Ok(StatusWrite::Unchanged);
    };
    if let Some(version) = experiment.resource_version() {
        patch["metadata"] = json!({ "resourceVersion": version });
    }
    let api: Api<Experiment> = Api::namespaced(ctx.client.clone(), namespace);
    match api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(written) => {
            if let Some(version) = written.resource_version() {
                lock(&ctx.status_written).insert(object_key(namespace, &name), version);
            }
            Ok(StatusWrite::Written)
        }
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(StatusWrite::Conflict),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(StatusWrite::Unchanged),
        Err(source) => Err(write_error(
            "patch",
            "Experiment status",
            namespace,
            &name,
            experiment,
        )(source)),
    }
}

/// Records one event on the experiment, sent once ([`crate::events`]): named by its uid, the
/// resourceVersion it was decided at and its content. A failure is logged: status already
/// says what happened.
async fn publish(experiment: &Experiment, event: &PlannedEvent, ctx: &ExperimentContext) {
    let once = events::Once {
        regarding: experiment.object_ref(&()),
        decided_at: experiment
            .meta()
            .resource_version
            .as_deref()
            .unwrap_or_default(),
        warning: event.warning,
        reason: &event.reason,
        note: &event.message,
        action: "Experiment",
    };
    if let Err(error) = events::send(&ctx.client, &ctx.reporter, &once).await {
        tracing::warn!(%error, reason = %event.reason, "Experiment event not published");
    }
    if !event.on_rollout {
        return;
    }
    // As Argo: an analysis run's transition is a Warning on the owning Rollout too.
    let Some(rollout) = experiment
        .owner_references()
        .iter()
        .find(|owner| owner.kind == "Rollout" && owner.api_version.starts_with("argoproj.io/"))
    else {
        return;
    };
    let once = events::Once {
        regarding: ObjectReference {
            api_version: Some(rollout.api_version.clone()),
            kind: Some(rollout.kind.clone()),
            name: Some(rollout.name.clone()),
            namespace: experiment.namespace(),
            uid: Some(rollout.uid.clone()),
            ..ObjectReference::default()
        },
        warning: true,
        ..once
    };
    if let Err(error) = events::send(&ctx.client, &ctx.reporter, &once).await {
        tracing::warn!(%error, reason = %event.reason, rollout = %rollout.name, "event on the Experiment's Rollout not published");
    }
}
