//! The pure planner: from a Rollout, what the controller observed and the time, what should be
//! true next. Plain data in, plain data out; no client, no clock, no I/O.
//!
//! [`plan`] owns the canary step machine (current step, pause conditions, promote,
//! promote-full, abort, retry, restart on a new template, fast rollback, progress deadline) and
//! the blue-green switch (preview, pause, pre/post-promotion analysis, scale-down delay).
//! Everything it decides is written back into `status`, so a restarted controller planning
//! from the same status takes the same next action. `spec.workloadRef` ([`workload_ref`]) is
//! resolved before either strategy plans; `spec.restartAt` ([`restart`]) and the Deployment's
//! scale-down are planned on top of the strategy's plan.

mod analysis_runs;
pub mod anti_affinity;
mod bluegreen;
mod canary;
mod coalesce;
mod experiment_step;
pub mod hash;
mod pause;
pub mod replicas;
pub mod restart;
mod revisions;
mod run_history;
mod state_events;
mod status;
pub mod template_match;
#[cfg(test)]
mod test_world;
mod validation;
pub mod workload_ref;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use rollouts_crds::analysis::{AnalysisPhase, AnalysisRunSpec, AnalysisTemplateSpec};
use rollouts_crds::rollout::{
    PodTemplateMetadata, Rollout, RolloutAnalysis, RolloutAnalysisTemplate, RolloutExperimentStep,
    RolloutStatus, SetHeaderRoute, SetMirrorRoute, WeightDestination,
};

pub use canary::steps_hash;
pub use restart::ObservedPod;
pub use workload_ref::{DeploymentScale, ObservedDeployment};

/// How soon a Rollout whose analysis cannot be composed (a template missing) is looked at
/// again: templates are not watched.
const MISSING_TEMPLATE_REQUEUE: Duration = Duration::from_secs(20);

/// How soon a Rollout refused because another Rollout drives an object it names looks again,
/// should the watch event that frees the object be missed.
const CLAIM_RECHECK: Duration = Duration::from_secs(20);

/// The longest a plan waits before looking again. A pause of up to a year is waited out an
/// hour at a time: the controller's timer queue holds no deadline beyond about two years, and
/// a long wait looked at hourly costs nothing.
pub const MAX_REQUEUE: Duration = Duration::from_secs(3600);

/// The planner's one entry point: resolves `spec.workloadRef` once, then plans the next move of
/// `rollout` from what was `observed`, at `now` ([`coalesce`]: a completed step is followed at
/// once, count-only status writes wait for the counts to settle). Returns the Rollout as
/// resolved, which the act phase builds ReplicaSets from, with the plan.
pub fn plan<'a>(
    rollout: &'a Rollout,
    observed: &Observed,
    now: Timestamp,
) -> (Cow<'a, Rollout>, Plan) {
    match workload_ref::resolve(rollout, observed) {
        Ok(resolved) => {
            let mut plan = coalesce::coalesced(&resolved, observed, now);
            if plan.status.observed_generation != status::generation_string(&resolved) {
                // A strategy the planner does not plan still gets observedGeneration and a
                // conditions list, which Argo CD reads.
                plan.status = crate::status_patch::observed_status(&resolved);
            }
            plan.requeue_after = plan.requeue_after.map(|after| after.min(MAX_REQUEUE));
            state_events::add(&resolved, &mut plan);
            (resolved, plan)
        }
        Err(error) => {
            let plan = workload_ref::invalid_spec(rollout, &error, now);
            (Cow::Borrowed(rollout), plan)
        }
    }
}

/// One planning pass, without coalescing: what each test of a single decision reads.
#[cfg(test)]
pub fn plan_once(rollout: &Rollout, observed: &Observed, now: Timestamp) -> Plan {
    match workload_ref::resolve(rollout, observed) {
        Ok(resolved) => plan_resolved(&resolved, observed, now),
        Err(error) => workload_ref::invalid_spec(rollout, &error, now),
    }
}

/// One planning pass over a Rollout whose `workloadRef` is resolved: blue-green or canary, then
/// what both share (the runs' specs, anti-affinity, run history, `restartAt`, the workloadRef
/// Deployment's scale).
fn plan_resolved(rollout: &Rollout, observed: &Observed, now: Timestamp) -> Plan {
    if let Some(error) = validation::claimed_elsewhere(rollout, observed) {
        let mut invalid = status::invalid_spec(rollout, &error, now);
        invalid.requeue_within(CLAIM_RECHECK);
        return invalid;
    }
    let mut plan = match rollout.spec.strategy.blue_green.as_ref() {
        Some(blue_green) => bluegreen::plan(rollout, blue_green, observed, now),
        None => canary::plan(rollout, observed, now),
    };
    if let Err(error) = analysis_runs::complete_runs(rollout, observed, &mut plan) {
        let mut invalid = status::invalid_spec(rollout, &error, now);
        invalid.requeue_within(MISSING_TEMPLATE_REQUEUE);
        return invalid;
    }
    if plan.create_replica_set.is_none() {
        plan.refresh_anti_affinity =
            anti_affinity::planned_refresh(rollout, observed, &plan.status.current_pod_hash);
        plan.sync_min_ready_seconds =
            min_ready_seconds_to_sync(rollout, observed, &plan.status.current_pod_hash);
    }
    plan.rollout_revision = rollout_revision_to_write(rollout, observed, &plan);
    plan.delete_analysis_runs = run_history::runs_to_delete(rollout, observed, &plan);
    plan.delete_experiments = experiment_step::experiments_to_delete(rollout, observed, &plan);
    restart::reconcile(rollout, observed, now, &mut plan);
    workload_ref::reconcile(rollout, observed, &mut plan);
    plan
}

/// The current revision's number, when the Rollout's own revision annotation says otherwise:
/// the ReplicaSet this plan creates or revises, else the live one of the current hash.
fn rollout_revision_to_write(
    rollout: &Rollout,
    observed: &Observed,
    plan: &Plan,
) -> Option<String> {
    let current = &plan.status.current_pod_hash;
    let revision = match (&plan.create_replica_set, &plan.revise_replica_set) {
        (Some(new_rs), _) => Some(new_rs.revision),
        (None, Some(revised)) => Some(revised.revision),
        (None, None) => observed
            .replica_sets
            .iter()
            .find(|rs| &rs.pod_template_hash == current && !current.is_empty())
            .and_then(ObservedReplicaSet::revision),
    }?;
    let wanted = revision.to_string();
    let carried = rollout
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(REVISION_ANNOTATION));
    (carried != Some(&wanted)).then_some(wanted)
}

/// The current revision's ReplicaSet and the Rollout's `minReadySeconds`, when they differ.
fn min_ready_seconds_to_sync(
    rollout: &Rollout,
    observed: &Observed,
    current_hash: &str,
) -> Option<(String, i32)> {
    let wanted = rollout.spec.min_ready_seconds.unwrap_or(0);
    observed
        .replica_sets
        .iter()
        .find(|rs| rs.pod_template_hash == current_hash && !current_hash.is_empty())
        .filter(|rs| rs.min_ready_seconds != wanted)
        .map(|rs| (rs.name.clone(), wanted))
}

/// Annotation carrying a ReplicaSet's revision, as Argo and Deployments write it.
pub const REVISION_ANNOTATION: &str = "rollout.argoproj.io/revision";

/// A ReplicaSet owned by the Rollout, as the controller saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedReplicaSet {
    pub name: String,
    /// Its `rollouts-pod-template-hash` label.
    pub pod_template_hash: String,
    /// `spec.replicas`.
    pub replicas: i32,
    /// `status.replicas`: pods that exist.
    pub current_replicas: i32,
    /// `status.readyReplicas`.
    pub ready_replicas: i32,
    /// `status.availableReplicas`.
    pub available_replicas: i32,
    pub annotations: BTreeMap<String, String>,
    /// `metadata.creationTimestamp`.
    pub created: Timestamp,
    /// `spec.minReadySeconds`.
    pub min_ready_seconds: i32,
    /// Its `ReplicaFailure` condition (pods it could not create: a quota, a policy), when
    /// true.
    pub replica_failure: Option<ReplicaFailure>,
}

/// A ReplicaSet's true `ReplicaFailure` condition, which the Rollout's status carries as Argo's
/// does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaFailure {
    pub reason: String,
    pub message: String,
    pub since: Option<Timestamp>,
}

impl ObservedReplicaSet {
    /// The `rollout.argoproj.io/revision` annotation, when present and numeric.
    pub fn revision(&self) -> Option<i64> {
        self.annotations
            .get(REVISION_ANNOTATION)
            .and_then(|value| value.parse().ok())
    }
}

/// An AnalysisRun owned by the Rollout, as the controller saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedAnalysisRun {
    pub name: String,
    /// The `rollouts-pod-template-hash` label: the revision it analyses.
    pub pod_template_hash: String,
    /// The `step-index` label of a step run; `None` for other runs.
    pub step_index: Option<i32>,
    pub phase: AnalysisPhase,
    pub message: String,
    /// `spec.terminate` is already set.
    pub terminating: bool,
    pub created: Timestamp,
    /// The `rollout-type` label (`Step`, `Background`, `PrePromotion`, `PostPromotion`); empty
    /// when absent.
    pub rollout_type: String,
}

/// An Experiment owned by the Rollout (an `experiment` step's), as the controller saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedExperiment {
    pub name: String,
    /// The `rollouts-pod-template-hash` label: the revision whose step started it.
    pub pod_template_hash: String,
    /// `status.phase`; `None` until the Experiment controller wrote one.
    pub phase: Option<AnalysisPhase>,
    pub message: String,
    /// `spec.terminate` is already set.
    pub terminating: bool,
    pub created: Timestamp,
    /// `status.templateStatuses`: where each template's pods are.
    pub templates: Vec<ObservedExperimentTemplate>,
}

impl ObservedExperiment {
    /// The phase is final (Successful, Failed, Error, Inconclusive).
    pub fn finished(&self) -> bool {
        self.phase.is_some_and(AnalysisPhase::is_completed)
    }
}

/// One entry of an Experiment's `status.templateStatuses`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObservedExperimentTemplate {
    pub name: String,
    /// The Service the Experiment created for it; empty without one.
    pub service_name: String,
    pub pod_template_hash: String,
}

/// Everything the planner reads besides the Rollout itself.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    pub replica_sets: Vec<ObservedReplicaSet>,
    pub analysis_runs: Vec<ObservedAnalysisRun>,
    /// The Experiments the Rollout owns.
    pub experiments: Vec<ObservedExperiment>,
    /// Services the spec names that were looked up and not found (the rest exist).
    pub missing_services: BTreeSet<String>,
    /// The routers' `verify_weight` for the weight `status.canary.weights` records: `None` when
    /// there is no router, no weight recorded yet, or the router cannot tell.
    pub traffic_weight_verified: Option<bool>,
    /// The Rollout's pods, listed only while a `spec.restartAt` restart is pending
    /// ([`restart::needs_restart`]); `None` when not listed.
    pub restart_pods: Option<Vec<ObservedPod>>,
    /// The Deployment `spec.workloadRef` names; `None` without workloadRef or when it does not
    /// exist.
    pub workload: Option<ObservedDeployment>,
    /// The (Cluster)AnalysisTemplates the spec's analyses name, nested ones included; `None`
    /// when none were read (the spec names none).
    pub analysis_templates: Option<ObservedTemplates>,
    /// Live pod templates of ReplicaSets, by name (the watch cache keeps none): read only for
    /// the current revision, while the anti-affinity it was created with may name an old
    /// stable revision.
    pub live_templates: BTreeMap<String, serde_json::Value>,
    /// The digest of each ReplicaSet's pod template, by name ([`template_match`]): how a
    /// ReplicaSet under a hash we did not compute (Argo's) is found to run the Rollout's
    /// template.
    pub template_digests: BTreeMap<String, String>,
    /// The objects the spec names that other Rollouts name too (Services and router objects):
    /// only the first of them may drive one ([`validation::claimed_elsewhere`]).
    pub shared_objects: Vec<SharedObject>,
}

/// A Service or router object that this Rollout's spec and other Rollouts' specs all name.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedObject {
    /// The field of this Rollout's spec naming it.
    pub field: String,
    /// `Service`, `Ingress`, `VirtualService`, `DestinationRule` or `HTTPRoute`.
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// A Service's `argo-rollouts.argoproj.io/managed-by-rollouts` annotation: the Rollout that
    /// last pointed it, as Argo writes it; `None` for router objects and unannotated Services.
    pub managed_by: Option<String>,
    /// The other Rollouts naming it.
    pub others: Vec<Claimant>,
}

/// A Rollout naming a shared object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claimant {
    pub namespace: String,
    pub name: String,
    /// `metadata.creationTimestamp`.
    pub created: Timestamp,
}

/// Which template a reference names: cluster-scoped or in the Rollout's namespace, and its name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TemplateKey {
    pub cluster: bool,
    pub name: String,
}

impl TemplateKey {
    pub fn of(reference: &RolloutAnalysisTemplate) -> Self {
        Self {
            cluster: reference.cluster_scope == Some(true),
            name: reference.template_name.clone(),
        }
    }

    pub fn kind(&self) -> &'static str {
        if self.cluster {
            "ClusterAnalysisTemplate"
        } else {
            "AnalysisTemplate"
        }
    }
}

/// The analysis templates read for a Rollout: those found, and those looked up and not found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ObservedTemplates {
    pub found: BTreeMap<TemplateKey, AnalysisTemplateSpec>,
    pub missing: BTreeSet<TemplateKey>,
}

impl ObservedTemplates {
    /// The spec of the template `reference` names, or why there is none.
    fn lookup(&self, reference: &RolloutAnalysisTemplate) -> Result<AnalysisTemplateSpec, String> {
        let key = TemplateKey::of(reference);
        match self.found.get(&key) {
            Some(spec) => {
                // A provider this controller lacks is refused here, before a run is created
                // that would only error at every measurement and abort the release.
                // (A metric with no provider, or several, is the run's Error to report.)
                for metric in &spec.metrics {
                    if let Err(
                        error @ crate::analysisrun::ProviderChoiceError::Unsupported { .. },
                    ) = crate::analysisrun::provider_kind(metric)
                    {
                        return Err(format!("{} {:?}: {error}", key.kind(), key.name));
                    }
                }
                Ok(spec.clone())
            }
            None => Err(format!(
                "{} {:?} not found: create it, or fix templateName",
                key.kind(),
                key.name
            )),
        }
    }
}

impl Observed {
    /// `base`, or `base.N` with the first N no observed AnalysisRun is named, as Argo names a
    /// run again after a retry.
    fn unused_run_name(&self, base: String) -> String {
        let taken = |name: &str| self.analysis_runs.iter().any(|run| run.name == name);
        if !taken(&base) {
            return base;
        }
        (1..)
            .map(|attempt| format!("{base}.{attempt}"))
            .find(|name| !taken(name))
            .unwrap_or(base)
    }
}

/// A ReplicaSet to create for the current pod template: `spec.template` with the
/// `rollouts-pod-template-hash` label added to its pod labels and selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewReplicaSet {
    /// `<rollout>-<hash>`.
    pub name: String,
    pub pod_template_hash: String,
    pub replicas: i32,
    /// Value of the `rollout.argoproj.io/revision` annotation.
    pub revision: i64,
}

/// A new revision number for the existing ReplicaSet of the current pod template: going back
/// to an older template makes it the newest revision again, as Argo does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaSetRevision {
    pub name: String,
    /// Value of the `rollout.argoproj.io/revision` annotation.
    pub revision: i64,
}

/// A change of `spec.replicas` on an existing ReplicaSet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaSetScale {
    pub name: String,
    pub from: i32,
    pub to: i32,
}

/// A Service whose selector must carry `rollouts-pod-template-hash: <hash>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceSelector {
    pub service: String,
    pub pod_template_hash: String,
}

/// An AnalysisRun to create, labelled `rollout-type: <rollout_type>`, `step-index` (step runs
/// only) and `rollouts-pod-template-hash` so the next plan finds it again.
#[derive(Clone, Debug, PartialEq)]
pub struct AnalysisRunToCreate {
    pub name: String,
    /// The canary step that runs it; meaningful only when `rollout_type` is `Step`.
    pub step_index: i32,
    /// Value of the `rollout-type` label: `Step`, `Background`, `PrePromotion` or `PostPromotion`.
    pub rollout_type: String,
    /// The revision under analysis (labels the run; `Latest` arguments resolve to it).
    pub pod_template_hash: String,
    /// The stable revision (`Stable` arguments resolve to it).
    pub stable_pod_template_hash: String,
    pub analysis: RolloutAnalysis,
    /// The run's spec, composed from the observed templates; `None` until the planner composed
    /// it (never when the templates were observed).
    pub spec: Option<AnalysisRunSpec>,
    /// The revision of the ReplicaSet it analyses, written on the run as Argo does.
    pub revision: Option<String>,
}

/// An Experiment to create for the current `experiment` step (Argo's
/// `GetExperimentFromTemplate`): the act phase copies each template's pod template from the
/// ReplicaSet its `specRef` names.
#[derive(Clone, Debug, PartialEq)]
pub struct ExperimentToCreate {
    /// `<rollout>-<hash>-<revision>-<step>`, with `-N` appended while the name is taken.
    pub name: String,
    pub step_index: i32,
    /// The current revision (the `rollouts-pod-template-hash` label of the Experiment).
    pub pod_template_hash: String,
    /// Value of the `rollout.argoproj.io/revision` annotation.
    pub revision: String,
    /// The ReplicaSet `specRef: canary` copies.
    pub canary_replica_set: String,
    /// The ReplicaSet `specRef: stable` copies.
    pub stable_replica_set: String,
    /// The step, its analyses' `podTemplateHashValue` and `fieldRef` arguments resolved.
    pub step: RolloutExperimentStep,
}

/// The current revision's ReplicaSet carries an anti-affinity term against an older stable
/// revision: its pod template's affinity becomes `affinity`.
#[derive(Clone, Debug, PartialEq)]
pub struct AffinityRefresh {
    pub replica_set: String,
    pub affinity: serde_json::Value,
}

/// A `scale-down-deadline` annotation to write on a ReplicaSet: it keeps its pods until then.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScaleDownDeadline {
    pub name: String,
    /// Written as RFC 3339 (`Timestamp`'s display).
    pub deadline: Timestamp,
}

/// Labels and annotations a ReplicaSet's pod template and running pods must carry on top of
/// `spec.template` (blue-green `activeMetadata` / `previewMetadata`); `None` means none.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicaSetMetadata {
    pub name: String,
    pub metadata: Option<PodTemplateMetadata>,
}

/// Argo's ephemeral metadata: `new` (canary / preview metadata) on the new revision's pods
/// until it is promoted, `stable` (stable / active metadata) on the stable revision's, and on
/// the new revision's once it is stable; nothing injected on older revisions.
pub(crate) fn ephemeral_metadata(
    new: Option<&PodTemplateMetadata>,
    stable: Option<&PodTemplateMetadata>,
    new_rs_name: &str,
    stable_rs_name: Option<&str>,
    promoted: bool,
    observed: &Observed,
) -> Vec<ReplicaSetMetadata> {
    if new.is_none() && stable.is_none() {
        return Vec::new();
    }
    let entry = |name: &str, metadata: Option<&PodTemplateMetadata>| ReplicaSetMetadata {
        name: name.to_string(),
        metadata: metadata.cloned(),
    };
    let mut entries = vec![entry(new_rs_name, if promoted { stable } else { new })];
    if let Some(stable_rs) = stable_rs_name
        && !promoted
        && stable_rs != new_rs_name
    {
        entries.push(entry(stable_rs, stable));
    }
    let listed: Vec<String> = entries.iter().map(|entry| entry.name.clone()).collect();
    entries.extend(
        observed
            .replica_sets
            .iter()
            .filter(|rs| !listed.contains(&rs.name))
            .map(|rs| entry(&rs.name, None)),
    );
    entries
}

/// Kubernetes event type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

/// An event to record on the Rollout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub type_: EventType,
    pub reason: String,
    pub message: String,
}

/// The canary weight asked for by the steps and the weight the available pods really give.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CanaryWeight {
    pub desired: i32,
    pub actual: i32,
}

/// What the traffic routers of a canary with `trafficRouting` must hold next: one field per
/// `TrafficRouter` method (rollouts-traffic). Applied after service selectors and scaling, in
/// this order: `remove_managed_routes`, `update_hash`, `set_header_route`, `set_mirror_route`,
/// `set_weight`; status is patched only once they all succeeded, because the weight it records
/// is what later plans treat as set. Every call is idempotent, so all are made on each plan.
#[derive(Clone, Debug, PartialEq)]
pub struct TrafficPlan {
    /// `set_weight(desired_weight, additional)`: the canary's share out of `max_traffic_weight`.
    pub desired_weight: i32,
    /// `trafficRouting.maxTrafficWeight`, 100 unless set.
    pub max_traffic_weight: i32,
    /// Experiment destinations for `set_weight` / `update_hash`: the weighted templates of the
    /// running experiment step.
    pub additional: Vec<WeightDestination>,
    /// `update_hash(canary_hash, stable_hash, additional)`; empty when that ReplicaSet is absent.
    pub canary_hash: String,
    pub stable_hash: String,
    /// `set_header_route(route)` of the current `setHeaderRoute` step.
    pub set_header_route: Option<SetHeaderRoute>,
    /// `set_mirror_route(route)` of the current `setMirrorRoute` step.
    pub set_mirror_route: Option<SetMirrorRoute>,
    /// `remove_managed_routes()`: the update is over (promoted, aborted, no canary pod serves).
    pub remove_managed_routes: bool,
}

/// What should be true next. The act phase applies it in this order: create the ReplicaSet
/// (or raise a reused one's revision), scale (in list order) and write or clear
/// `scale-down-deadline` annotations, point services, apply `traffic` to the routers, create,
/// terminate and delete runs, delete old ReplicaSets, patch
/// status when `status_changed`, record events, requeue. Service selectors, ReplicaSet metadata
/// and `traffic` are desired state: they are written only where the live object differs.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub create_replica_set: Option<NewReplicaSet>,
    /// The reused ReplicaSet's revision annotation to raise (written before scaling).
    pub revise_replica_set: Option<ReplicaSetRevision>,
    pub scale_replica_sets: Vec<ReplicaSetScale>,
    /// ReplicaSets whose `scale-down-deadline` annotation is to be removed.
    pub clear_scale_down_deadlines: Vec<String>,
    /// `scale-down-deadline` annotations to write (applied with the scaling).
    pub set_scale_down_deadlines: Vec<ScaleDownDeadline>,
    /// Ephemeral metadata per ReplicaSet, as desired state: applied where it differs.
    pub replica_set_metadata: Vec<ReplicaSetMetadata>,
    pub service_selectors: Vec<ServiceSelector>,
    pub create_analysis_runs: Vec<AnalysisRunToCreate>,
    /// Names of runs to stop (`spec.terminate: true`).
    pub terminate_analysis_runs: Vec<String>,
    /// Finished runs beyond `spec.analysis` history limits, or of revisions no longer kept.
    pub delete_analysis_runs: Vec<String>,
    /// Experiments to create (created after the status that points at them is written).
    pub create_experiments: Vec<ExperimentToCreate>,
    /// Names of Experiments to stop (`spec.terminate: true`).
    pub terminate_experiments: Vec<String>,
    /// Finished Experiments beyond the history limits, or of revisions no longer kept.
    pub delete_experiments: Vec<String>,
    /// Old, empty ReplicaSets beyond `revisionHistoryLimit`.
    pub delete_replica_sets: Vec<String>,
    pub canary_weight: CanaryWeight,
    /// The traffic routers' desired state; `None` without `trafficRouting`.
    pub traffic: Option<TrafficPlan>,
    pub status: RolloutStatus,
    /// `status` differs from the Rollout's current status.
    pub status_changed: bool,
    pub events: Vec<Event>,
    /// Look again after this long even if nothing changes (a pause or deadline expires).
    pub requeue_after: Option<Duration>,
    /// Pods to restart for `spec.restartAt`, through the eviction subresource, in order.
    pub evict_pods: Vec<String>,
    /// The new `spec.replicas` of the `spec.workloadRef` Deployment (`scaleDown`).
    pub scale_deployment: Option<DeploymentScale>,
    /// The anti-affinity to point at the current stable revision (written after creation).
    pub refresh_anti_affinity: Option<AffinityRefresh>,
    /// The current revision's ReplicaSet and the `spec.minReadySeconds` it must have: the
    /// Rollout's, changed since it was created (not part of the pod template, so no new
    /// revision), as Argo keeps it in step.
    pub sync_min_ready_seconds: Option<(String, i32)>,
    /// The `rollout.argoproj.io/revision` annotation the Rollout itself must carry: its
    /// current revision's, as Argo keeps it (tools read the revision from the Rollout).
    pub rollout_revision: Option<String>,
}

impl Plan {
    /// Look again after `after` at the latest.
    fn requeue_within(&mut self, after: Duration) {
        self.requeue_after = Some(
            self.requeue_after
                .map_or(after, |current| current.min(after)),
        );
    }

    /// A plan that changes nothing.
    fn unchanged(rollout: &Rollout) -> Self {
        Self {
            create_replica_set: None,
            revise_replica_set: None,
            scale_replica_sets: Vec::new(),
            clear_scale_down_deadlines: Vec::new(),
            set_scale_down_deadlines: Vec::new(),
            replica_set_metadata: Vec::new(),
            service_selectors: Vec::new(),
            create_analysis_runs: Vec::new(),
            terminate_analysis_runs: Vec::new(),
            delete_analysis_runs: Vec::new(),
            create_experiments: Vec::new(),
            terminate_experiments: Vec::new(),
            delete_experiments: Vec::new(),
            delete_replica_sets: Vec::new(),
            canary_weight: CanaryWeight::default(),
            traffic: None,
            status: rollout.status.clone().unwrap_or_default(),
            status_changed: false,
            events: Vec::new(),
            requeue_after: None,
            evict_pods: Vec::new(),
            scale_deployment: None,
            refresh_anti_affinity: None,
            sync_min_ready_seconds: None,
            rollout_revision: None,
        }
    }

    /// Whether applying the plan writes anything.
    pub fn is_noop(&self) -> bool {
        self.create_replica_set.is_none()
            && self.revise_replica_set.is_none()
            && self.scale_replica_sets.is_empty()
            && self.clear_scale_down_deadlines.is_empty()
            && self.set_scale_down_deadlines.is_empty()
            && self.create_analysis_runs.is_empty()
            && self.terminate_analysis_runs.is_empty()
            && self.delete_analysis_runs.is_empty()
            && self.create_experiments.is_empty()
            && self.terminate_experiments.is_empty()
            && self.delete_experiments.is_empty()
            && self.delete_replica_sets.is_empty()
            && !self.status_changed
            && self.events.is_empty()
            && self.evict_pods.is_empty()
            && self.scale_deployment.is_none()
            && self.refresh_anti_affinity.is_none()
            && self.sync_min_ready_seconds.is_none()
            && self.rollout_revision.is_none()
    }
}

#[cfg(test)]
mod replica_set_sync_tests {
    use rollouts_crds::rollout::CanaryStep;

    use super::*;

    fn rs(name: &str, hash: &str, min_ready_seconds: i32) -> ObservedReplicaSet {
        ObservedReplicaSet {
            name: name.into(),
            pod_template_hash: hash.into(),
            replicas: 2,
            current_replicas: 2,
            ready_replicas: 2,
            available_replicas: 2,
            annotations: BTreeMap::new(),
            created: Timestamp::UNIX_EPOCH,
            min_ready_seconds,
            replica_failure: None,
        }
    }

    #[test]
    fn the_current_replica_set_is_given_the_rollouts_min_ready_seconds() {
        let mut rollout = Rollout::test_canary("web", vec![CanaryStep::weight(50)]);
        rollout.spec.min_ready_seconds = Some(7);
        let observed = Observed {
            replica_sets: vec![rs("web-old", "old", 0), rs("web-new", "new", 0)],
            ..Observed::default()
        };
        assert_eq!(
            min_ready_seconds_to_sync(&rollout, &observed, "new"),
            Some(("web-new".to_string(), 7))
        );
        let synced = Observed {
            replica_sets: vec![rs("web-old", "old", 0), rs("web-new", "new", 7)],
            ..Observed::default()
        };
        assert_eq!(min_ready_seconds_to_sync(&rollout, &synced, "new"), None);
        // Unset is 0, as Kubernetes reads it.
        rollout.spec.min_ready_seconds = None;
        assert_eq!(
            min_ready_seconds_to_sync(&rollout, &synced, "new"),
            Some(("web-new".to_string(), 0))
        );
        assert_eq!(min_ready_seconds_to_sync(&rollout, &observed, ""), None);
    }

    #[test]
    fn the_current_revisions_replica_failure_comes_first() {
        let failure = |reason: &str| ReplicaFailure {
            reason: reason.into(),
            message: format!("{reason}: pods forbidden"),
            since: None,
        };
        let mut old = rs("web-old", "old", 0);
        old.replica_failure = Some(failure("FailedCreate-old"));
        let mut new = rs("web-new", "new", 0);
        let observed = Observed {
            replica_sets: vec![old.clone(), new.clone()],
            ..Observed::default()
        };
        assert_eq!(
            status::replica_failure(&observed, "new").map(|f| f.reason.as_str()),
            Some("FailedCreate-old"),
            "another ReplicaSet's, when the current one has none"
        );
        new.replica_failure = Some(failure("FailedCreate-new"));
        let observed = Observed {
            replica_sets: vec![old, new],
            ..Observed::default()
        };
        assert_eq!(
            status::replica_failure(&observed, "new").map(|f| f.reason.as_str()),
            Some("FailedCreate-new")
        );
        let healthy = Observed {
            replica_sets: vec![rs("web-new", "new", 0)],
            ..Observed::default()
        };
        assert_eq!(status::replica_failure(&healthy, "new"), None);
    }
}

#[cfg(test)]
mod rollout_revision_tests {
    use rollouts_crds::rollout::CanaryStep;

    use super::*;

    fn rs(hash: &str, revision: &str) -> ObservedReplicaSet {
        ObservedReplicaSet {
            name: format!("web-{hash}"),
            pod_template_hash: hash.into(),
            replicas: 1,
            current_replicas: 1,
            ready_replicas: 1,
            available_replicas: 1,
            annotations: BTreeMap::from([(REVISION_ANNOTATION.to_string(), revision.to_string())]),
            created: Timestamp::UNIX_EPOCH,
            min_ready_seconds: 0,
            replica_failure: None,
        }
    }

    #[test]
    fn the_rollout_carries_its_current_revisions_number() {
        let mut rollout = Rollout::test_canary("web", vec![CanaryStep::weight(50)]);
        let observed = Observed {
            replica_sets: vec![rs("old", "1"), rs("new", "3")],
            ..Observed::default()
        };
        let mut plan = Plan::unchanged(&rollout);
        plan.status.current_pod_hash = "new".into();
        assert_eq!(
            rollout_revision_to_write(&rollout, &observed, &plan).as_deref(),
            Some("3")
        );
        rollout.metadata.annotations = Some(BTreeMap::from([(
            REVISION_ANNOTATION.to_string(),
            "3".to_string(),
        )]));
        assert_eq!(rollout_revision_to_write(&rollout, &observed, &plan), None);
        // A ReplicaSet this plan creates or revises gives the number.
        plan.revise_replica_set = Some(ReplicaSetRevision {
            name: "web-old".into(),
            revision: 4,
        });
        assert_eq!(
            rollout_revision_to_write(&rollout, &observed, &plan).as_deref(),
            Some("4")
        );
        plan.revise_replica_set = None;
        plan.status.current_pod_hash = String::new();
        assert_eq!(rollout_revision_to_write(&rollout, &observed, &plan), None);
    }
}
