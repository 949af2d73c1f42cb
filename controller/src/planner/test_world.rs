//! The planner tests' fake cluster: what the act phase's writes (ReplicaSets, AnalysisRuns,
//! Experiments) do to what the next plan observes, written once for every strategy's tests.
//! Pods of a new or scaled-up ReplicaSet are available at once when `instant`, else they exist
//! and are not ready yet.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use rollouts_crds::analysis::AnalysisPhase;
use rollouts_crds::rollout::{ROLLOUT_TYPE_STEP, Rollout, SCALE_DOWN_DEADLINE_ANNOTATION_KEY};

use super::{
    Observed, ObservedAnalysisRun, ObservedExperiment, ObservedReplicaSet, Plan,
    REVISION_ANNOTATION,
};

/// A fixed instant `seconds` after the tests' epoch.
pub fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).expect("valid timestamp")
}

/// Applies the plan's ReplicaSet and AnalysisRun writes to `observed`, checking what the act
/// phase relies on: nothing created twice, a scale starts from the observed count.
pub fn apply_writes(observed: &mut Observed, plan: &Plan, now: Timestamp, instant: bool) {
    if let Some(new) = &plan.create_replica_set {
        assert!(
            observed.replica_sets.iter().all(|rs| rs.name != new.name),
            "ReplicaSet {} created twice",
            new.name
        );
        let available = if instant { new.replicas } else { 0 };
        observed.replica_sets.push(ObservedReplicaSet {
            name: new.name.clone(),
            pod_template_hash: new.pod_template_hash.clone(),
            replicas: new.replicas,
            current_replicas: new.replicas,
            ready_replicas: available,
            available_replicas: available,
            annotations: BTreeMap::from([(
                REVISION_ANNOTATION.to_string(),
                new.revision.to_string(),
            )]),
            created: now,
            min_ready_seconds: 0,
            replica_failure: None,
        });
    }
    if let Some((name, seconds)) = &plan.sync_min_ready_seconds {
        rs_named(observed, name).min_ready_seconds = *seconds;
    }
    if let Some(revise) = &plan.revise_replica_set {
        rs_named(observed, &revise.name)
            .annotations
            .insert(REVISION_ANNOTATION.to_string(), revise.revision.to_string());
    }
    for scale in &plan.scale_replica_sets {
        let rs = rs_named(observed, &scale.name);
        assert_eq!(rs.replicas, scale.from, "scale of {} from", scale.name);
        rs.replicas = scale.to;
        rs.current_replicas = scale.to;
        if instant || scale.to < rs.available_replicas {
            rs.ready_replicas = scale.to;
            rs.available_replicas = scale.to;
        }
    }
    for deadline in &plan.set_scale_down_deadlines {
        rs_named(observed, &deadline.name).annotations.insert(
            SCALE_DOWN_DEADLINE_ANNOTATION_KEY.to_string(),
            deadline.deadline.to_string(),
        );
    }
    for name in &plan.clear_scale_down_deadlines {
        rs_named(observed, name)
            .annotations
            .remove(SCALE_DOWN_DEADLINE_ANNOTATION_KEY);
    }
    observed
        .replica_sets
        .retain(|rs| !plan.delete_replica_sets.contains(&rs.name));
    for run in &plan.create_analysis_runs {
        assert!(
            observed.analysis_runs.iter().all(|r| r.name != run.name),
            "AnalysisRun {} created twice",
            run.name
        );
        observed.analysis_runs.push(ObservedAnalysisRun {
            name: run.name.clone(),
            pod_template_hash: run.pod_template_hash.clone(),
            step_index: (run.rollout_type == ROLLOUT_TYPE_STEP).then_some(run.step_index),
            phase: AnalysisPhase::Pending,
            message: String::new(),
            terminating: false,
            created: now,
            rollout_type: run.rollout_type.clone(),
        });
    }
    for run in &mut observed.analysis_runs {
        if plan.terminate_analysis_runs.contains(&run.name) {
            run.terminating = true;
        }
    }
    observed
        .analysis_runs
        .retain(|run| !plan.delete_analysis_runs.contains(&run.name));
    for experiment in &plan.create_experiments {
        assert!(
            observed
                .experiments
                .iter()
                .all(|e| e.name != experiment.name),
            "Experiment {} created twice",
            experiment.name
        );
        observed.experiments.push(ObservedExperiment {
            name: experiment.name.clone(),
            pod_template_hash: experiment.pod_template_hash.clone(),
            phase: None,
            message: String::new(),
            terminating: false,
            created: now,
            templates: Vec::new(),
        });
    }
    for experiment in &mut observed.experiments {
        if plan.terminate_experiments.contains(&experiment.name) {
            experiment.terminating = true;
        }
    }
    observed
        .experiments
        .retain(|experiment| !plan.delete_experiments.contains(&experiment.name));
}

/// The observed ReplicaSet called `name`.
pub fn rs_named<'a>(observed: &'a mut Observed, name: &str) -> &'a mut ObservedReplicaSet {
    observed
        .replica_sets
        .iter_mut()
        .find(|rs| rs.name == name)
        .expect("ReplicaSet exists")
}

/// Applies what a plan writes on the Rollout itself: its status and revision annotation.
pub fn apply_to_rollout(rollout: &mut Rollout, plan: &Plan) {
    rollout.status = Some(plan.status.clone());
    if let Some(revision) = &plan.rollout_revision {
        rollout
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(REVISION_ANNOTATION.to_string(), revision.clone());
    }
}
