//! AnalysisRun history of a Rollout (either strategy): which finished runs to delete so that
//! at most `spec.analysis.successfulRunHistoryLimit` successful and
//! `unsuccessfulRunHistoryLimit` failed, errored or inconclusive runs remain, and none of a
//! revision whose ReplicaSet is gone. The runs the status points at are always kept.

use std::cmp::Reverse;

use rollouts_crds::analysis::AnalysisPhase;
use rollouts_crds::rollout::{Rollout, RolloutStatus};

use super::{Observed, ObservedAnalysisRun, Plan};

/// Names of the finished runs to delete once `plan` is applied, oldest last.
pub(super) fn runs_to_delete(rollout: &Rollout, observed: &Observed, plan: &Plan) -> Vec<String> {
    let current = current_run_names(&plan.status);
    let mut finished: Vec<&ObservedAnalysisRun> = observed
        .analysis_runs
        .iter()
        .filter(|run| run.phase.is_completed())
        .filter(|run| !current.contains(&run.name.as_str()))
        .collect();
    finished.sort_by_key(|run| Reverse((run.created, run.name.clone())));
    let (successful_limit, unsuccessful_limit) = history_limits(rollout);
    let (mut successful, mut unsuccessful) = (0, 0);
    let mut delete = Vec::new();
    for run in finished {
        let beyond_limit = !revision_kept(observed, plan, &run.pod_template_hash)
            || if run.phase == AnalysisPhase::Successful {
                successful += 1;
                successful > successful_limit
            } else {
                unsuccessful += 1;
                unsuccessful > unsuccessful_limit
            };
        if beyond_limit {
            delete.push(run.name.clone());
        }
    }
    delete
}

/// `successfulRunHistoryLimit` and `unsuccessfulRunHistoryLimit` (for AnalysisRuns and
/// Experiments alike); a negative limit keeps nothing, as zero does.
pub(super) fn history_limits(rollout: &Rollout) -> (usize, usize) {
    let limit = |value: i32| usize::try_from(value).unwrap_or(0);
    (
        limit(rollout.spec.effective_successful_run_history_limit()),
        limit(rollout.spec.effective_unsuccessful_run_history_limit()),
    )
}

/// Whether revision `hash` still has its ReplicaSet once `plan` is applied (kept, or created
/// by it): what belongs to a revision that is gone goes too.
pub(super) fn revision_kept(observed: &Observed, plan: &Plan, hash: &str) -> bool {
    let kept_rs = observed
        .replica_sets
        .iter()
        .any(|rs| rs.pod_template_hash == hash && !plan.delete_replica_sets.contains(&rs.name));
    let created = plan
        .create_replica_set
        .as_ref()
        .is_some_and(|new_rs| new_rs.pod_template_hash == hash);
    !hash.is_empty() && (kept_rs || created)
}

/// The runs status records as current (step, background, pre- and post-promotion).
fn current_run_names(status: &RolloutStatus) -> Vec<&str> {
    [
        status.canary.current_step_analysis_run_status.as_ref(),
        status
            .canary
            .current_background_analysis_run_status
            .as_ref(),
        status.blue_green.pre_promotion_analysis_run_status.as_ref(),
        status
            .blue_green
            .post_promotion_analysis_run_status
            .as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(|pointer| pointer.name.as_str())
    .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::jiff::Timestamp;
    use rollouts_crds::rollout::{AnalysisRunStrategy, RolloutAnalysisRunStatus};

    use super::*;
    use crate::planner::ObservedReplicaSet;

    fn rs(hash: &str) -> ObservedReplicaSet {
        ObservedReplicaSet {
            name: format!("web-{hash}"),
            pod_template_hash: hash.into(),
            replicas: 0,
            current_replicas: 0,
            ready_replicas: 0,
            available_replicas: 0,
            annotations: BTreeMap::new(),
            created: Timestamp::UNIX_EPOCH,
            min_ready_seconds: 0,
            replica_failure: None,
        }
    }

    fn run(name: &str, hash: &str, phase: AnalysisPhase, second: i64) -> ObservedAnalysisRun {
        ObservedAnalysisRun {
            name: name.into(),
            pod_template_hash: hash.into(),
            step_index: Some(1),
            phase,
            message: String::new(),
            terminating: false,
            created: Timestamp::from_second(1_800_000_000 + second).expect("time"),
            rollout_type: "Step".into(),
        }
    }

    fn rollout(limits: Option<(i32, i32)>) -> Rollout {
        let mut rollout = Rollout::test_canary("web", vec![]);
        rollout.spec.analysis = limits.map(|(successful, unsuccessful)| AnalysisRunStrategy {
            successful_run_history_limit: Some(successful),
            unsuccessful_run_history_limit: Some(unsuccessful),
        });
        rollout
    }

    /// `count` runs of each phase for revision `a`, oldest first, named `<phase>-<i>`.
    fn history(count: i64) -> Observed {
        let mut runs = Vec::new();
        for i in 0..count {
            for (prefix, phase) in [
                ("ok", AnalysisPhase::Successful),
                ("failed", AnalysisPhase::Failed),
            ] {
                runs.push(run(&format!("{prefix}-{i}"), "a", phase, i));
            }
        }
        Observed {
            replica_sets: vec![rs("a")],
            analysis_runs: runs,
            ..Observed::default()
        }
    }

    fn deleted(rollout: &Rollout, observed: &Observed, plan: &Plan) -> Vec<String> {
        let mut names = runs_to_delete(rollout, observed, plan);
        names.sort();
        names
    }

    #[test]
    fn the_oldest_finished_runs_beyond_each_limit_are_deleted() {
        let rollout = rollout(Some((2, 3)));
        let observed = history(6);
        let plan = Plan::unchanged(&rollout);
        assert_eq!(
            deleted(&rollout, &observed, &plan),
            [
                "failed-0", "failed-1", "failed-2", "ok-0", "ok-1", "ok-2", "ok-3"
            ]
        );
    }

    #[test]
    fn five_of_each_are_kept_by_default() {
        let rollout = rollout(None);
        let observed = history(7);
        let plan = Plan::unchanged(&rollout);
        assert_eq!(
            deleted(&rollout, &observed, &plan),
            ["failed-0", "failed-1", "ok-0", "ok-1"]
        );
    }

    #[test]
    fn running_and_current_runs_are_kept_and_runs_of_gone_revisions_deleted() {
        let rollout = rollout(Some((0, 0)));
        let mut observed = history(1);
        observed
            .analysis_runs
            .push(run("running", "a", AnalysisPhase::Running, 5));
        observed
            .analysis_runs
            .push(run("gone", "b", AnalysisPhase::Inconclusive, 6));
        let mut plan = Plan::unchanged(&rollout);
        plan.status.canary.current_step_analysis_run_status = Some(RolloutAnalysisRunStatus {
            name: "ok-0".into(),
            status: "Successful".into(),
            message: String::new(),
        });
        assert_eq!(deleted(&rollout, &observed, &plan), ["failed-0", "gone"]);

        // A limit of 2 keeps revision a's runs, but never those of a deleted ReplicaSet.
        let rollout = super::tests::rollout(Some((2, 2)));
        let mut plan = Plan::unchanged(&rollout);
        plan.delete_replica_sets = vec!["web-a".into()];
        assert_eq!(
            deleted(&rollout, &observed, &plan),
            ["failed-0", "gone", "ok-0"]
        );
    }
}
