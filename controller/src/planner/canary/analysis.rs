//! Background analysis of a canary (`spec.strategy.canary.analysis`): one run per revision,
//! started as soon as the update is at or past `startingStep`, whether or not the canary has
//! available pods (Argo's `reconcileBackgroundAnalysisRun`), so a canary whose pods crash is
//! analysed and aborted rather than waiting forever; it runs until the update ends and is
//! terminated then. A failed or errored run aborts the update, an inconclusive one pauses it.
//! Step analysis keeps its warm-up rule (`canary_warm`).

use rollouts_crds::analysis::AnalysisPhase;
use rollouts_crds::conditions::PAUSE_REASON_INCONCLUSIVE_ANALYSIS;
use rollouts_crds::rollout::{ROLLOUT_TYPE_BACKGROUND, RolloutStatus};

use super::super::analysis_runs::{pending_pointer, record_run_phase};
use super::super::replicas::CanaryStableCounts;
use super::super::validation::has_templates;
use super::super::{AnalysisRunToCreate, ObservedAnalysisRun, Plan};
use super::{Planner, progress_threshold_met};

impl<'a> Planner<'a> {
    /// The canary ReplicaSet has the pods the current step sizes it to, available (or as many
    /// as `replicaProgressThreshold` asks for), and a router (if any) holds the step's weight:
    /// measurements from now on judge warm pods.
    pub(super) fn canary_warm(&self, counts: CanaryStableCounts) -> bool {
        let Some(new_rs) = self.new_rs else {
            return false;
        };
        let threshold = self.canary.replica_progress_threshold.as_ref();
        let sized = new_rs.replicas == counts.canary
            && progress_threshold_met(threshold, new_rs, counts.canary);
        sized && (!self.routed() || self.weight_in_effect(self.desired_weight()))
    }

    fn is_background_run(&self, run: &ObservedAnalysisRun) -> bool {
        run.rollout_type == ROLLOUT_TYPE_BACKGROUND
    }

    /// The background run of the current revision: an in-flight one wins (it may have been
    /// created just before a restart), then the one status points at.
    fn current_background_run(&self) -> Option<&'a ObservedAnalysisRun> {
        let observed: &'a [ObservedAnalysisRun] = &self.observed.analysis_runs;
        let of_revision = |run: &&'a ObservedAnalysisRun| {
            self.is_background_run(run) && run.pod_template_hash == self.current_hash
        };
        let in_flight = observed
            .iter()
            .filter(of_revision)
            .filter(|run| !run.phase.is_completed() && !run.terminating)
            .max_by_key(|run| run.created);
        let pointed = self
            .base
            .canary
            .current_background_analysis_run_status
            .as_ref()
            .and_then(|pointer| {
                observed
                    .iter()
                    .filter(of_revision)
                    .find(|run| run.name == pointer.name)
            });
        in_flight.or(pointed)
    }

    /// The step index before which no background run starts (`startingStep`, 0 when unset).
    fn background_starting_step(&self) -> i32 {
        self.canary
            .analysis
            .as_ref()
            .and_then(|background| background.starting_step)
            .unwrap_or(0)
    }

    /// Creates, reads and stops the background run; terminates every other in-flight one.
    pub(super) fn reconcile_background_analysis(
        &mut self,
        plan: &mut Plan,
        next: &mut RolloutStatus,
    ) {
        let background = self
            .canary
            .analysis
            .as_ref()
            .filter(|background| has_templates(Some(&background.analysis)));
        let update_over = self.fully_promoted()
            || self.is_aborted()
            || self.base.promote_full
            || self.initial_deploy();
        let mut current: Option<String> = None;
        match background {
            Some(background)
                if !update_over && self.step_index() >= self.background_starting_step() =>
            {
                let run = self.current_background_run();
                let needs_new = match run {
                    None => true,
                    Some(run) => {
                        self.resumed_by_person() && run.phase == AnalysisPhase::Inconclusive
                    }
                };
                let inconclusive_pause = self
                    .pause_condition(PAUSE_REASON_INCONCLUSIVE_ANALYSIS)
                    .is_some();
                if inconclusive_pause {
                    current = run.map(|run| run.name.clone());
                } else if needs_new {
                    let name = self.new_background_run_name();
                    plan.create_analysis_runs.push(AnalysisRunToCreate {
                        name: name.clone(),
                        step_index: self.step_index(),
                        rollout_type: ROLLOUT_TYPE_BACKGROUND.into(),
                        pod_template_hash: self.current_hash.clone(),
                        stable_pod_template_hash: self.base.stable_rs.clone(),
                        analysis: background.analysis.clone(),
                        spec: None,
                        revision: None,
                    });
                    next.canary.current_background_analysis_run_status =
                        Some(pending_pointer(&name));
                    current = Some(name);
                } else if let Some(run) = run {
                    self.record_background_phase(next, run);
                    match run.phase {
                        AnalysisPhase::Inconclusive => {
                            self.pause.add.push(PAUSE_REASON_INCONCLUSIVE_ANALYSIS)
                        }
                        AnalysisPhase::Failed | AnalysisPhase::Error => {
                            let mut message =
                                String::from("Background analysis phase error/failed");
                            if !run.message.is_empty() {
                                message = format!("{message}: {}", run.message);
                            }
                            self.pause.add_abort = Some(message);
                        }
                        _ => {}
                    }
                    current = Some(run.name.clone());
                }
            }
            _ => next.canary.current_background_analysis_run_status = None,
        }
        let stop: Vec<String> = self
            .observed
            .analysis_runs
            .iter()
            .filter(|run| self.is_background_run(run))
            .filter(|run| !run.phase.is_completed() && !run.terminating)
            .filter(|run| current.as_deref() != Some(run.name.as_str()))
            .map(|run| run.name.clone())
            .collect();
        plan.terminate_analysis_runs.extend(stop);
    }

    /// Keeps `status.canary.currentBackgroundAnalysisRunStatus` in step with the run, with an
    /// event when its phase changes.
    fn record_background_phase(&mut self, next: &mut RolloutStatus, run: &ObservedAnalysisRun) {
        let before = self
            .base
            .canary
            .current_background_analysis_run_status
            .as_ref();
        let pointer = record_run_phase(&mut self.out, "Background", before, run);
        next.canary.current_background_analysis_run_status = Some(pointer);
    }

    /// `<rollout>-<hash>-<revision>`, with `.N` appended while the name is taken.
    fn new_background_run_name(&self) -> String {
        let base = format!(
            "{}-{}-{}",
            self.rollout_name(),
            self.current_hash,
            self.revision()
        );
        self.observed.unused_run_name(base)
    }
}
