//! The act phase: applies a planner [`Plan`] to the cluster, in this order, and says when to
//! look again.
//!
//! 1. evict pods for `spec.restartAt`;
//! 2. create the current revision's ReplicaSet (a name already taken ends the pass: the next
//!    plan sees what is there), or point a live one's anti-affinity at the stable revision;
//! 3. raise a reused ReplicaSet's revision, scale ReplicaSets (in plan order) and the
//!    workloadRef Deployment, write and clear `scale-down-deadline` annotations;
//! 4. sync ephemeral pod metadata;
//! 5. point Services, then drive the traffic routers (after scaling: traffic never points at
//!    pods that are not there);
//! 6. terminate and delete AnalysisRuns and Experiments; delete old ReplicaSets;
//! 7. record events (under names that make a repeat recognisable), then patch status last (it
//!    is the checkpoint: a write lost above is planned again), then create new AnalysisRuns and
//!    Experiments.
//!
//! Desired-state writes (revision, deadlines, metadata, selectors, run termination) are skipped
//! when the live object already matches, so a reconcile with nothing to do writes nothing.
//! Every write goes through [`writer::Writer`].

mod analysis_runs;
mod experiments;
mod replica_sets;
mod services;
mod status;
mod traffic;
mod writer;

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use rollouts_crds::rollout::{PodTemplateMetadata, Rollout, SCALE_DOWN_DEADLINE_ANNOTATION_KEY};
use rollouts_traffic::TrafficRouter;

pub use analysis_runs::analysis_run_for;
pub use experiments::experiment_for;
pub use replica_sets::{
    DESIRED_REPLICAS_ANNOTATION, EPHEMERAL_METADATA_ANNOTATION, replica_set_for,
};
pub use status::write_status;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::observe::LiveServices;
use crate::planner::{Observed, Plan, REVISION_ANNOTATION};
use writer::Writer;

/// Applies `plan` for `rollout` (as the planner resolved it: with `workloadRef`, the
/// Deployment's template) and returns when to reconcile again.
pub async fn apply(
    rollout: &Rollout,
    observed: &Observed,
    services: &LiveServices,
    routers: &[Box<dyn TrafficRouter>],
    plan: &Plan,
    ctx: &Context,
) -> Result<Action> {
    let target = Target::of(rollout)?;
    let writer = Writer {
        target: &target,
        ctx,
    };
    let live_rs = |name: &str| observed.replica_sets.iter().find(|rs| rs.name == name);

    for pod in &plan.evict_pods {
        replica_sets::evict_pod(&writer, pod).await?;
    }
    if let Some(new_rs) = &plan.create_replica_set {
        let ephemeral = ephemeral_for(plan, &new_rs.name);
        if !replica_sets::create(&writer, rollout, new_rs, ephemeral).await? {
            // Someone created it between our list and our create: plan again from what is there.
            return Ok(Action::requeue(Duration::ZERO));
        }
    }
    if let Some(refresh) = &plan.refresh_anti_affinity {
        replica_sets::refresh_anti_affinity(&writer, refresh).await?;
    }
    if let Some((name, seconds)) = &plan.sync_min_ready_seconds {
        replica_sets::sync_min_ready_seconds(&writer, name, *seconds).await?;
    }

    if let Some(revise) = &plan.revise_replica_set {
        let value = revise.revision.to_string();
        let live = live_rs(&revise.name).and_then(|rs| rs.annotations.get(REVISION_ANNOTATION));
        if live != Some(&value) {
            replica_sets::annotate_revision(&writer, &revise.name, &value).await?;
        }
    }
    let desired_replicas = rollout.spec.effective_replicas().to_string();
    for scale in &plan.scale_replica_sets {
        let live = live_rs(&scale.name);
        if live.map(|rs| rs.replicas) != Some(scale.to) {
            let stale = live
                .and_then(|rs| rs.annotations.get(DESIRED_REPLICAS_ANNOTATION))
                .is_none_or(|value| *value != desired_replicas);
            let annotate = stale.then(|| desired_replicas.clone());
            replica_sets::scale(&writer, &scale.name, scale.to, annotate).await?;
        }
    }
    if let Some(scale) = &plan.scale_deployment {
        replica_sets::scale_deployment(&writer, scale).await?;
    }
    for deadline in &plan.set_scale_down_deadlines {
        let value = deadline.deadline.to_string();
        let live = live_rs(&deadline.name)
            .and_then(|rs| rs.annotations.get(SCALE_DOWN_DEADLINE_ANNOTATION_KEY));
        if live != Some(&value) {
            replica_sets::annotate_scale_down_deadline(&writer, &deadline.name, Some(&value))
                .await?;
        }
    }
    for name in &plan.clear_scale_down_deadlines {
        let annotated = live_rs(name).is_some_and(|rs| {
            rs.annotations
                .contains_key(SCALE_DOWN_DEADLINE_ANNOTATION_KEY)
        });
        if annotated {
            replica_sets::annotate_scale_down_deadline(&writer, name, None).await?;
        }
    }

    for wanted in &plan.replica_set_metadata {
        let created_now = plan
            .create_replica_set
            .as_ref()
            .is_some_and(|new_rs| new_rs.name == wanted.name);
        if let Some(rs) = live_rs(&wanted.name).filter(|_| !created_now) {
            replica_sets::sync_ephemeral_metadata(&writer, rollout, rs, wanted.metadata.as_ref())
                .await?;
        }
    }

    for selector in &plan.service_selectors {
        services::point(&writer, rollout, services, selector).await?;
    }
    if let Some(traffic) = &plan.traffic {
        for router in routers {
            traffic::route(&target, router.as_ref(), traffic).await?;
        }
    }

    for name in &plan.terminate_analysis_runs {
        let running = observed
            .analysis_runs
            .iter()
            .any(|run| &run.name == name && !run.terminating);
        if running {
            analysis_runs::terminate(&writer, name).await?;
        }
    }
    for name in &plan.delete_analysis_runs {
        analysis_runs::delete(&writer, name).await?;
    }
    for name in &plan.terminate_experiments {
        let running = observed
            .experiments
            .iter()
            .any(|experiment| &experiment.name == name && !experiment.terminating);
        if running {
            experiments::terminate(&writer, name).await?;
        }
    }
    for name in &plan.delete_experiments {
        experiments::delete(&writer, name).await?;
    }
    for name in &plan.delete_replica_sets {
        replica_sets::delete(&writer, name).await?;
    }

    if let Some(revision) = &plan.rollout_revision {
        let patch = serde_json::json!({
            "metadata": {"annotations": {REVISION_ANNOTATION: revision}}
        });
        writer
            .patch::<Rollout>("set the revision annotation of", &target.name, &patch)
            .await?;
    }
    // Events before the status they report: a pass cut off between the two plans the same
    // events again from the same Rollout version, and those already sent are recognised by
    // name (see `status::publish`); after the status, a cut lost them.
    for event in &plan.events {
        status::publish(&target, rollout, event, ctx).await;
    }
    if let Some(notifier) = &ctx.notifier {
        notifier.notify(rollout, &plan.events);
    }
    status::write_status(rollout, &plan.status, ctx).await?;
    // A new run is created only once status points at it: the planner finds a run through
    // that pointer (or while it is still running), so a run created before a status write that
    // failed, or a kill, and finished before the next reconcile would be created again. With
    // the pointer written first, the next reconcile creates the missing run under its name.
    for run in &plan.create_analysis_runs {
        analysis_runs::create(&writer, rollout, run).await?;
    }
    // The same for an experiment step's Experiment, which `status.canary.currentExperiment`
    // names first.
    for experiment in &plan.create_experiments {
        experiments::create(&writer, rollout, experiment).await?;
    }
    Ok(plan
        .requeue_after
        .map_or_else(Action::await_change, Action::requeue))
}

/// The Rollout's namespace and name, and the owner reference its objects carry.
pub struct Target {
    namespace: String,
    name: String,
    owner: OwnerReference,
}

impl Target {
    pub fn of(rollout: &Rollout) -> Result<Self> {
        let name = rollout.name_any();
        let namespace = rollout
            .namespace()
            .ok_or_else(|| Error::MissingObjectKey(name.clone()))?;
        let owner = rollout
            .controller_owner_ref(&())
            .ok_or_else(|| Error::MissingObjectKey(format!("{namespace}/{name} (no uid)")))?;
        Ok(Self {
            namespace,
            name,
            owner,
        })
    }

    fn write_error(
        &self,
        verb: &'static str,
        kind: &'static str,
        object: &str,
    ) -> impl FnOnce(kube::Error) -> Error + use<> {
        let namespace = self.namespace.clone();
        let rollout = self.name.clone();
        let object = object.to_string();
        move |source| Error::Write {
            verb,
            kind,
            namespace,
            object,
            rollout,
            source: Box::new(source),
        }
    }
}

/// The ephemeral pod metadata the plan wants on ReplicaSet `name`.
fn ephemeral_for<'a>(plan: &'a Plan, name: &str) -> Option<&'a PodTemplateMetadata> {
    plan.replica_set_metadata
        .iter()
        .find(|wanted| wanted.name == name)
        .and_then(|wanted| wanted.metadata.as_ref())
}
