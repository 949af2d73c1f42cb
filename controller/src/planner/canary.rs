//! The canary step machine. Without a traffic router the canary weight is approximated by
//! replica counts and services select the canary and stable revisions; with `trafficRouting`
//! (planned in [`traffic`]) the plan also carries the routers' desired state, and replica counts
//! follow the weight or `setCanaryScale`.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use rollouts_crds::analysis::AnalysisPhase;
use rollouts_crds::conditions::*;
use rollouts_crds::rollout::{
    CanaryStep, CanaryStrategy, PauseCondition, ProgressType, ROLLOUT_TYPE_STEP,
    ReplicaProgressThreshold, Rollout, RolloutCondition, RolloutStatus,
};

use super::analysis_runs::{pending_pointer, record_run_phase};
use super::experiment_step::{self, Outcome, StepState};
use super::hash::{argo_steps_hash, pod_template_hash_of_value};
use super::pause::{PauseDecisions, pause_expiry};
use super::replicas::{
    BasicCanaryInputs, CanaryStableCounts, Fenceposts, MAX_WEIGHT, ReplicaSetCount, actual_weight,
    calculate_replica_counts_for_canary, sum_counts,
};
use super::revisions;
use super::status::{
    Outbox, Progress, deadline_of, generation_string, invalid_spec, is_healthy, made_progress,
    phase, set_conditions, timed_out,
};
use super::template_match::current_revision;
use super::validation::{ValidSpec, validate_canary};
use super::{
    AnalysisRunToCreate, CanaryWeight, EventType, Observed, ObservedAnalysisRun,
    ObservedReplicaSet, Plan, ScaleDownDeadline, ServiceSelector,
};

/// Plans the next move of a canary `rollout` from what was `observed`, at `now`.
pub(super) fn plan(rollout: &Rollout, observed: &Observed, now: Timestamp) -> Plan {
    let Some(canary) = rollout.spec.strategy.canary.as_ref() else {
        return Plan::unchanged(rollout);
    };
    match validate_canary(rollout, canary) {
        Ok(valid) => Planner::new(rollout, canary, valid, observed, now).run(),
        Err(error) => invalid_spec(rollout, &error, now),
    }
}

/// Hash of the canary steps (`status.currentStepHash`): a change restarts the steps.
pub fn steps_hash(steps: &[CanaryStep]) -> String {
    let encoded = serde_json::to_value(steps).unwrap_or_default();
    pod_template_hash_of_value(&serde_json::json!({ "steps": encoded }), None)
}

/// Who wrote `status.currentStepHash` for the current steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RecordedSteps {
    Ours,
    Argo,
    /// Not an encoding we compute, trusted on a Rollout Argo left at this generation.
    Unknown,
}

struct Planner<'a> {
    rollout: &'a Rollout,
    canary: &'a CanaryStrategy,
    observed: &'a Observed,
    now: Timestamp,
    fenceposts: Fenceposts,
    pause_durations: Vec<Option<Duration>>,
    spec_replicas: i32,
    step_count: i32,
    current_hash: String,
    /// The current revision's ReplicaSet carries a hash we did not compute (one Argo created):
    /// found by its template.
    adopted: bool,
    /// The status as this plan reads it: the previous one, restarted for a new template or
    /// new steps.
    base: RolloutStatus,
    new_rs: Option<&'a ObservedReplicaSet>,
    stable_rs: Option<&'a ObservedReplicaSet>,
    others: Vec<&'a ObservedReplicaSet>,
    pause: PauseDecisions,
    out: Outbox,
    /// A ReplicaSet of another template already has the new ReplicaSet's name.
    name_collision: bool,
    /// The `experiment` step's Experiment, as this plan found it.
    experiment: StepState,
}

impl<'a> Planner<'a> {
    fn new(
        rollout: &'a Rollout,
        canary: &'a CanaryStrategy,
        valid: ValidSpec,
        observed: &'a Observed,
        now: Timestamp,
    ) -> Self {
        let previous = rollout.status.clone().unwrap_or_default();
        let (current_hash, new_rs) =
            current_revision(&valid.template, previous.collision_count, observed);
        let adopted =
            current_hash != pod_template_hash_of_value(&valid.template, previous.collision_count);
        let stable_rs = observed.replica_sets.iter().find(|rs| {
            !previous.stable_rs.is_empty() && rs.pod_template_hash == previous.stable_rs
        });
        let others = observed
            .replica_sets
            .iter()
            .filter(|rs| {
                rs.pod_template_hash != current_hash && rs.pod_template_hash != previous.stable_rs
            })
            .collect();
        Self {
            rollout,
            canary,
            observed,
            now,
            fenceposts: valid.fenceposts,
            pause_durations: valid.pause_durations,
            spec_replicas: rollout.spec.effective_replicas(),
            step_count: i32::try_from(canary.steps().len()).unwrap_or(i32::MAX),
            current_hash,
            adopted,
            base: previous,
            new_rs,
            stable_rs,
            others,
            pause: PauseDecisions::default(),
            out: Outbox::default(),
            name_collision: false,
            experiment: StepState::default(),
        }
    }

    fn previous(&self) -> RolloutStatus {
        self.rollout.status.clone().unwrap_or_default()
    }

    fn run(mut self) -> Plan {
        self.restart_on_change();
        let mut plan = Plan::unchanged(self.rollout);
        let mut next = self.base.clone();

        self.reconcile_step_analysis(&mut plan, &mut next);
        if let Err(error) = self.reconcile_experiment_step(&mut plan, &mut next) {
            return invalid_spec(self.rollout, &error, self.now);
        }
        self.reconcile_background_analysis(&mut plan, &mut next);
        let counts = self.desired_counts();
        self.reconcile_replica_sets(&mut plan, counts);
        let scaling = plan.create_replica_set.is_some() || !plan.scale_replica_sets.is_empty();
        if !scaling {
            self.reconcile_pause_step();
        }
        self.advance_steps(&mut next, counts);
        self.counts_into(&mut next);
        if self.name_collision {
            next.collision_count = Some(self.base.collision_count.unwrap_or(0).saturating_add(1));
        }
        self.progress_deadline_abort(&next);
        self.apply_pause_decisions(&mut next);
        self.set_conditions(&mut next);
        next.observed_generation = generation_string(self.rollout);
        (next.phase, next.message) = phase(&self.rollout.spec, &next);

        plan.service_selectors = self.service_selectors(&next);
        if self.routed() {
            self.plan_traffic(&mut plan, &mut next, counts);
        } else {
            // `status.canary.weights` records what routers hold: a basic canary leaves it as
            // it is, as Argo's does (the weight its pods give is in the plan, for metrics).
            plan.canary_weight = self.canary_weight();
        }
        plan.replica_set_metadata = super::ephemeral_metadata(
            self.canary.canary_metadata.as_ref(),
            self.canary.stable_metadata.as_ref(),
            &self.new_rs_name(),
            self.stable_rs.map(|rs| rs.name.as_str()),
            next.stable_rs.is_empty() || next.stable_rs == self.current_hash,
            self.observed,
        );
        self.requeue_for_progress_deadline(&next);
        plan.status_changed = Some(&next) != self.rollout.status.as_ref();
        plan.status = next;
        plan.events = self.out.events;
        plan.requeue_after = self.out.requeue;
        plan
    }

    /// A new pod template or new steps start the steps again; going back to the stable
    /// template, or to a revision within `spec.rollbackWindow`, skips them (fast rollback).
    fn restart_on_change(&mut self) {
        let steps_hash = steps_hash(self.canary.steps());
        let previous_hash = self.base.current_pod_hash.clone();
        let template_changed = !previous_hash.is_empty() && previous_hash != self.current_hash;
        let recorded = self.recorded_steps_hash(&steps_hash);
        let steps_changed = recorded.is_none();
        let within_window = revisions::rollback_within_window(
            self.rollout,
            self.observed,
            self.new_rs,
            self.stable_rs,
        );
        if template_changed || steps_changed {
            let base = &mut self.base;
            base.pause_conditions.clear();
            base.controller_pause = false;
            base.abort = false;
            base.aborted_at = None;
            base.promote_full = false;
            base.canary.current_step_analysis_run_status = None;
            base.canary.current_background_analysis_run_status = None;
            base.current_step_index = (self.step_count > 0).then_some(0);
            if template_changed && self.step_count > 0 && base.stable_rs == self.current_hash {
                base.current_step_index = Some(self.step_count);
                self.out.event(
                    EventType::Normal,
                    "SkipSteps",
                    "Rollback to stable ReplicaSets".into(),
                );
            } else if template_changed
                && self.step_count > 0
                && within_window
                && self.new_rs.is_some_and(|rs| rs.replicas > 0)
            {
                base.current_step_index = Some(self.step_count);
                self.out.event(
                    EventType::Normal,
                    "SkipSteps",
                    "Rollback to active ReplicaSets within RollbackWindow".into(),
                );
            }
        }
        self.base.current_pod_hash = self.current_hash.clone();
        self.base.current_step_hash = match recorded {
            Some(RecordedSteps::Argo) if !template_changed => self.base.current_step_hash.clone(),
            _ => steps_hash,
        };
        if self.base.promote_full && self.base.stable_rs == self.current_hash {
            self.base.promote_full = false;
        }
        if self.base.promote_full || within_window {
            self.pause.clear = true;
            self.pause.remove_abort = true;
            if self.step_count > 0 {
                self.base.current_step_index = Some(self.step_count);
            }
        }
    }

    /// Whose encoding of the current steps `status.currentStepHash` is; `None` when the steps
    /// changed since it was written. Argo's is kept as it is (it stays recognised, and keeping
    /// it spares a status write). One we cannot compute (a step Argo encodes in a way we do not
    /// reproduce) is trusted only on a Rollout Argo left, whose status Argo wrote for this very
    /// generation; ours replaces it.
    fn recorded_steps_hash(&self, ours: &str) -> Option<RecordedSteps> {
        let recorded = self.base.current_step_hash.as_str();
        if recorded == ours {
            return Some(RecordedSteps::Ours);
        }
        if recorded.is_empty() {
            return None;
        }
        if recorded == argo_steps_hash(self.canary.steps.as_deref()) {
            return Some(RecordedSteps::Argo);
        }
        let same_generation = self.base.observed_generation == generation_string(self.rollout);
        (self.adopted && same_generation).then_some(RecordedSteps::Unknown)
    }

    fn is_aborted(&self) -> bool {
        self.pause.is_aborted(&self.base)
    }

    fn initial_deploy(&self) -> bool {
        self.stable_rs.is_none()
    }

    fn fully_promoted(&self) -> bool {
        !self.base.stable_rs.is_empty() && self.base.stable_rs == self.current_hash
    }

    fn step_index(&self) -> i32 {
        self.base.current_step_index.unwrap_or(0)
    }

    /// The length of the pause at step `index` (`None`: until promoted, or no such step).
    fn pause_duration(&self, index: i32) -> Option<Duration> {
        usize::try_from(index)
            .ok()
            .and_then(|index| self.pause_durations.get(index).copied().flatten())
    }

    fn current_step(&self) -> Option<&'a CanaryStep> {
        usize::try_from(self.step_index())
            .ok()
            .and_then(|index| self.canary.steps().get(index))
    }

    fn pause_condition(&self, reason: &str) -> Option<&PauseCondition> {
        self.base
            .pause_conditions
            .iter()
            .find(|condition| condition.reason == reason)
    }

    /// A person cleared the pause conditions the controller had set.
    fn resumed_by_person(&self) -> bool {
        self.base.controller_pause
            && self
                .pause_condition(PAUSE_REASON_CANARY_PAUSE_STEP)
                .is_none()
    }

    fn revision(&self) -> i64 {
        match self.new_rs {
            Some(rs) => rs.revision().unwrap_or_default(),
            None => self.next_revision(),
        }
    }

    fn next_revision(&self) -> i64 {
        revisions::next_revision(self.observed)
    }

    fn new_rs_name(&self) -> String {
        revisions::new_rs_name(self.rollout, self.new_rs, &self.current_hash)
    }

    fn rollout_name(&self) -> &str {
        self.rollout.metadata.name.as_deref().unwrap_or_default()
    }

    /// The run of the current analysis step: an in-flight run wins (it may have been created
    /// just before a restart), then the one status points at.
    fn current_step_run(&self, index: i32) -> Option<&'a ObservedAnalysisRun> {
        let of_step = |run: &&ObservedAnalysisRun| {
            run.step_index == Some(index) && run.pod_template_hash == self.current_hash
        };
        let in_flight = self
            .observed
            .analysis_runs
            .iter()
            .filter(of_step)
            .filter(|run| !run.phase.is_completed() && !run.terminating)
            .max_by_key(|run| run.created);
        let pointed = self
            .base
            .canary
            .current_step_analysis_run_status
            .as_ref()
            .and_then(|pointer| {
                self.observed
                    .analysis_runs
                    .iter()
                    .filter(of_step)
                    .find(|run| run.name == pointer.name)
            });
        in_flight.or(pointed)
    }

    fn reconcile_step_analysis(&mut self, plan: &mut Plan, next: &mut RolloutStatus) {
        let cancel_all = self.fully_promoted()
            || self.is_aborted()
            || self.base.promote_full
            || self.initial_deploy();
        let index = self.step_index();
        let mut current: Option<String> = None;
        if cancel_all {
            next.canary.current_step_analysis_run_status = None;
        } else if let Some(analysis) = self.current_step().and_then(|step| step.analysis.as_ref()) {
            let run = self.current_step_run(index);
            let paused_or_aborted = !self.base.pause_conditions.is_empty() || self.base.abort;
            let needs_new = match run {
                None => true,
                Some(run) => self.resumed_by_person() && run.phase == AnalysisPhase::Inconclusive,
            };
            if paused_or_aborted {
                current = run.map(|run| run.name.clone());
            } else if needs_new && !self.canary_warm(self.desired_counts()) {
                // Measurements would judge cold pods: the run starts once the canary is warm.
                next.canary.current_step_analysis_run_status = None;
            } else if needs_new {
                let name = self.new_run_name(index);
                plan.create_analysis_runs.push(AnalysisRunToCreate {
                    name: name.clone(),
                    step_index: index,
                    rollout_type: ROLLOUT_TYPE_STEP.into(),
                    pod_template_hash: self.current_hash.clone(),
                    stable_pod_template_hash: self.base.stable_rs.clone(),
                    analysis: analysis.clone(),
                    spec: None,
                    revision: None,
                });
                next.canary.current_step_analysis_run_status = Some(pending_pointer(&name));
                current = Some(name);
            } else if let Some(run) = run {
                self.record_run_phase(next, run);
                match run.phase {
                    AnalysisPhase::Inconclusive => {
                        self.pause.add.push(PAUSE_REASON_INCONCLUSIVE_ANALYSIS)
                    }
                    AnalysisPhase::Failed | AnalysisPhase::Error => {
                        let mut message = String::from("Step-based analysis phase error/failed");
                        if !run.message.is_empty() {
                            message = format!("{message}: {}", run.message);
                        }
                        self.pause.add_abort = Some(message);
                    }
                    _ => {}
                }
                current = Some(run.name.clone());
            }
        } else {
            next.canary.current_step_analysis_run_status = None;
        }
        plan.terminate_analysis_runs = self
            .observed
            .analysis_runs
            .iter()
            .filter(|run| run.step_index.is_some())
            .filter(|run| !run.phase.is_completed() && !run.terminating)
            .filter(|run| current.as_deref() != Some(run.name.as_str()))
            .map(|run| run.name.clone())
            .collect();
    }

    /// The `experiment` step ([`experiment_step`]): a failed Experiment aborts, an inconclusive
    /// one pauses.
    fn reconcile_experiment_step(
        &mut self,
        plan: &mut Plan,
        next: &mut RolloutStatus,
    ) -> Result<(), rollouts_crds::FieldError> {
        let mut out = Outbox::default();
        let inputs = experiment_step::StepInputs {
            rollout: self.rollout,
            observed: self.observed,
            step: self
                .current_step()
                .and_then(|step| step.experiment.as_ref())
                .map(|experiment| (self.step_index(), experiment)),
            current_hash: &self.current_hash,
            revision: self.revision(),
            new_rs: self.new_rs,
            stable_rs: self.distinct_stable(),
            cancel_all: self.fully_promoted()
                || self.is_aborted()
                || self.base.promote_full
                || self.initial_deploy(),
            paused: !self.base.pause_conditions.is_empty() || self.rollout.spec.is_paused(),
            inconclusive_analysis: self
                .pause_condition(PAUSE_REASON_INCONCLUSIVE_ANALYSIS)
                .is_some(),
            recorded: &self.base.canary.current_experiment,
        };
        let state = experiment_step::reconcile(&inputs, plan, next, &mut out)?;
        self.out.events.extend(out.events);
        match &state.outcome {
            Outcome::Inconclusive => self.pause.add.push(PAUSE_REASON_INCONCLUSIVE_EXPERIMENT),
            Outcome::Failed(message) => self.pause.add_abort = Some(message.clone()),
            Outcome::Waiting | Outcome::Successful => {}
        }
        self.experiment = state;
        Ok(())
    }

    /// Keeps `status.canary.currentStepAnalysisRunStatus` in step with the run, with an event
    /// when its phase changes.
    fn record_run_phase(&mut self, next: &mut RolloutStatus, run: &ObservedAnalysisRun) {
        let before = self.base.canary.current_step_analysis_run_status.as_ref();
        let pointer = record_run_phase(&mut self.out, "Step", before, run);
        next.canary.current_step_analysis_run_status = Some(pointer);
    }

    /// `<rollout>-<hash>-<revision>-<step>`, with `.N` appended while the name is taken.
    fn new_run_name(&self, index: i32) -> String {
        let base = format!(
            "{}-{}-{}-{index}",
            self.rollout_name(),
            self.current_hash,
            self.revision()
        );
        self.observed.unused_run_name(base)
    }

    /// The canary weight the steps ask for now.
    fn desired_weight(&self) -> i32 {
        if self.base.promote_full || self.initial_deploy() || self.fully_promoted() {
            return MAX_WEIGHT;
        }
        if self.is_aborted() {
            return 0;
        }
        let steps = self.canary.steps();
        let index = self.step_index();
        if index >= self.step_count {
            return MAX_WEIGHT;
        }
        let through = usize::try_from(index).unwrap_or(0);
        steps
            .get(..=through)
            .and_then(|steps| steps.iter().rev().find_map(|step| step.set_weight))
            .unwrap_or(0)
    }

    fn distinct_stable(&self) -> Option<&'a ObservedReplicaSet> {
        self.stable_rs
            .filter(|stable| stable.pod_template_hash != self.current_hash)
    }

    fn desired_counts(&self) -> CanaryStableCounts {
        if self.routed() {
            return self.routed_counts();
        }
        let count = |rs: &ObservedReplicaSet| ReplicaSetCount {
            replicas: rs.replicas,
            available: rs.available_replicas,
        };
        calculate_replica_counts_for_canary(BasicCanaryInputs {
            spec_replicas: self.spec_replicas,
            desired_weight: self.desired_weight(),
            fenceposts: self.fenceposts,
            canary: Some(self.new_rs.map(count).unwrap_or_default()),
            stable: self.distinct_stable().map(count),
            older_replicas: sum_counts(self.others.iter().map(|rs| rs.replicas)),
        })
    }

    /// `spec.paused` and an inconclusive analysis freeze the existing ReplicaSets' scale.
    fn halted(&self) -> bool {
        self.rollout.spec.is_paused()
            || self
                .pause_condition(PAUSE_REASON_INCONCLUSIVE_ANALYSIS)
                .is_some()
    }

    fn reconcile_replica_sets(&mut self, plan: &mut Plan, counts: CanaryStableCounts) {
        self.clean_up_history(plan);
        // A deadline left on the stable ReplicaSet (a rollback to a revision still within its
        // scale-down delay) is stale: it serves as stable now (Argo's removeScaleDownDeadlines).
        if let Some(stable) = self.distinct_stable()
            && !self.halted()
            && revisions::has_scale_down_annotation(stable)
        {
            plan.clear_scale_down_deadlines.push(stable.name.clone());
        }
        if let Some(stable) = self.distinct_stable()
            && stable.replicas != counts.stable
            && !self.halted()
        {
            self.scale(plan, stable, counts.stable);
        }
        match self.new_rs {
            None => {
                let name = self.new_rs_name();
                let hash = &self.current_hash;
                if !revisions::create(
                    plan,
                    &mut self.out,
                    self.observed,
                    name,
                    hash,
                    counts.canary,
                ) {
                    // Someone else's ReplicaSet has our name: salt the hash and try again.
                    self.name_collision = true;
                    return;
                }
            }
            Some(new_rs) => {
                let target = match self.abort_scale_down_delay() {
                    Some(delay) => self.aborted_canary_target(plan, new_rs, delay),
                    None => {
                        // No abort delay runs: a deadline left on the canary is stale (Argo's
                        // removeScaleDownDeadlines).
                        if revisions::has_scale_down_annotation(new_rs) {
                            plan.clear_scale_down_deadlines.push(new_rs.name.clone());
                        }
                        Some(counts.canary)
                    }
                };
                if let Some(target) = target
                    && target != new_rs.replicas
                    && !self.halted()
                {
                    self.scale(plan, new_rs, target);
                }
            }
        }
        let scaling = plan.create_replica_set.is_some() || !plan.scale_replica_sets.is_empty();
        if !scaling && !self.halted() {
            self.scale_down_others(plan);
        }
    }

    fn scale(&mut self, plan: &mut Plan, rs: &ObservedReplicaSet, to: i32) {
        revisions::scale(plan, &mut self.out, rs, to);
    }

    fn scale_down_deadline(&self, rs: &ObservedReplicaSet) -> Option<Timestamp> {
        revisions::scale_down_deadline(rs)
    }

    /// Older ReplicaSets serve traffic in a basic canary, so they all go to zero: unavailable
    /// pods first, then as many available ones as maxUnavailable allows, newest revision first.
    /// One with a `scale-down-deadline` still ahead is kept until then. With a router, the
    /// previous stable is first given a deadline (`scaleDownDelaySeconds`) after a promotion,
    /// and at most `scaleDownDelayRevisionLimit` of them wait, newest first (Argo's
    /// `scaleDownDelayHelper`); the rest go to zero.
    fn scale_down_others(&mut self, plan: &mut Plan) {
        let delay_limit = self
            .canary
            .scale_down_delay_revision_limit
            .filter(|_| self.routed())
            .unwrap_or(i32::MAX);
        let mut delayed = 0;
        let available = sum_counts(
            self.observed
                .replica_sets
                .iter()
                .map(|rs| rs.available_replicas),
        );
        let min_available = self
            .spec_replicas
            .saturating_sub(self.fenceposts.max_unavailable);
        let mut budget = available.saturating_sub(min_available);
        let mut others = self.others.clone();
        others.sort_by_key(|rs| std::cmp::Reverse((rs.revision().unwrap_or_default(), rs.created)));
        for rs in others {
            if let Some(deadline) = self.scale_down_deadline(rs) {
                if rs.replicas > 0 {
                    delayed += 1;
                }
                if deadline > self.now && delayed <= delay_limit {
                    self.out.requeue_at(self.now, deadline);
                    continue;
                }
                if rs.replicas == 0 {
                    plan.clear_scale_down_deadlines.push(rs.name.clone());
                    continue;
                }
            }
            if rs.replicas == 0 {
                continue;
            }
            if self.routed()
                && self.scale_down_deadline(rs).is_none()
                && delayed < delay_limit
                && let Some(seconds) = self.routed_scale_down_delay(rs)
            {
                delayed += 1;
                let deadline = self
                    .now
                    .checked_add(SignedDuration::from_secs(i64::from(seconds)))
                    .unwrap_or(Timestamp::MAX);
                plan.set_scale_down_deadlines.push(ScaleDownDeadline {
                    name: rs.name.clone(),
                    deadline,
                });
                self.out.requeue_at(self.now, deadline);
                continue;
            }
            let unavailable = rs.replicas.saturating_sub(rs.available_replicas).max(0);
            let removable = unavailable.saturating_add(budget.max(0));
            let target = rs.replicas.saturating_sub(removable).max(0);
            if target == rs.replicas {
                continue;
            }
            let removed = rs
                .replicas
                .saturating_sub(target)
                .saturating_sub(unavailable)
                .max(0);
            budget = budget.saturating_sub(removed);
            self.scale(plan, rs, target);
        }
    }

    /// Deletes the oldest empty ReplicaSets beyond `revisionHistoryLimit`.
    fn clean_up_history(&self, plan: &mut Plan) {
        let deleted =
            revisions::history_to_delete(self.rollout, self.others.iter().copied(), self.now);
        if !deleted.is_empty() {
            plan.delete_replica_sets = deleted;
        }
    }

    /// Adds the pause condition of a pause step, and asks to look again when it expires.
    fn reconcile_pause_step(&mut self) {
        if self.rollout.spec.is_paused() || self.base.promote_full || self.is_aborted() {
            return;
        }
        let index = self.step_index();
        if self.current_step().is_none_or(|step| step.pause.is_none()) {
            return;
        }
        let duration = self.pause_duration(index);
        match self.pause_condition(PAUSE_REASON_CANARY_PAUSE_STEP) {
            None if !self.base.controller_pause => {
                self.pause.add.push(PAUSE_REASON_CANARY_PAUSE_STEP);
                if let Some(duration) = duration {
                    self.out.requeue_in(duration);
                }
            }
            None => {}
            Some(condition) => {
                if let Some(duration) = duration {
                    let expires = pause_expiry(&condition.start_time, duration);
                    if expires > self.now {
                        self.out.requeue_at(self.now, expires);
                    }
                }
            }
        }
    }

    /// Promotes the current revision to stable, or moves the step index.
    fn advance_steps(&mut self, next: &mut RolloutStatus, counts: CanaryStableCounts) {
        if let Some(reason) = self.full_promotion_reason() {
            self.pause.clear = true;
            self.pause.remove_abort = true;
            next.promote_full = false;
            next.current_step_index = (self.step_count > 0).then_some(self.step_count);
            if next.stable_rs != self.current_hash {
                next.stable_rs = self.current_hash.clone();
                let message = format!(
                    "Rollout completed update to revision {} ({}): {reason}",
                    self.revision(),
                    self.current_hash
                );
                self.out
                    .event(EventType::Normal, ROLLOUT_COMPLETED_REASON, message);
            }
            return;
        }
        if self.is_aborted() {
            if self.step_count > 0 {
                let at_stable = next.stable_rs == self.current_hash;
                next.current_step_index = Some(if at_stable { self.step_count } else { 0 });
            }
            return;
        }
        if self.completed_current_step(counts) {
            let index = self.step_index();
            let step = self.current_step().map(step_summary).unwrap_or_default();
            next.current_step_index = Some(index.saturating_add(1));
            next.canary.current_step_analysis_run_status = None;
            next.canary.current_experiment.clear();
            self.pause.remove.push(PAUSE_REASON_CANARY_PAUSE_STEP);
            let message = format!(
                "Rollout step {}/{} completed ({step})",
                index.saturating_add(1),
                self.step_count
            );
            self.out
                .event(EventType::Normal, ROLLOUT_STEP_COMPLETED_REASON, message);
            self.out.requeue_in(Duration::ZERO);
        }
    }

    fn full_promotion_reason(&self) -> Option<String> {
        if self.initial_deploy() {
            return Some("Initial deploy".into());
        }
        if self.is_aborted() {
            return None;
        }
        let new_rs = self.new_rs?;
        if new_rs.available_replicas < self.spec_replicas
            && !progress_threshold_met(
                self.canary.replica_progress_threshold.as_ref(),
                new_rs,
                self.spec_replicas,
            )
        {
            return None;
        }
        if self.base.promote_full {
            return Some("Full promotion requested".into());
        }
        if self.fully_promoted() {
            return Some("Fast rollback".into());
        }
        let index = self.base.current_step_index;
        if self.step_count == 0 || index == Some(self.step_count) {
            let routed_weight_pending = self.routed()
                && self.step_count > 0
                && !self.weight_in_effect(self.max_traffic_weight());
            if routed_weight_pending {
                // The stable is promoted only once the routers hold the canary at full weight.
                return None;
            }
            return Some(format!("Completed all {} canary steps", self.step_count));
        }
        None
    }

    fn completed_current_step(&self, counts: CanaryStableCounts) -> bool {
        if self.rollout.spec.is_paused() {
            return false;
        }
        let Some(step) = self.current_step() else {
            return false;
        };
        if step.set_weight.is_some() {
            if self.routed() {
                return self.completed_routed_set_weight(counts);
            }
            return self.at_desired_counts(counts);
        }
        if step.set_canary_scale.is_some() {
            return self.at_routed_counts(counts);
        }
        if step.set_header_route.is_some() || step.set_mirror_route.is_some() {
            // Done once its route is in the plan the routers apply.
            return self.routes_apply(counts);
        }
        if step.pause.is_some() {
            if self.resumed_by_person() {
                return true;
            }
            let duration = self.pause_duration(self.step_index());
            let condition = self.pause_condition(PAUSE_REASON_CANARY_PAUSE_STEP);
            return match (duration, condition) {
                (Some(duration), Some(condition)) => {
                    self.now > pause_expiry(&condition.start_time, duration)
                }
                _ => false,
            };
        }
        if step.analysis.is_some() {
            return self.pause.add.is_empty()
                && self
                    .current_step_run(self.step_index())
                    .is_some_and(|run| run.phase == AnalysisPhase::Successful);
        }
        if step.experiment.is_some() {
            return self.pause.add.is_empty() && self.experiment.outcome == Outcome::Successful;
        }
        false
    }

    /// The canary and stable are at the counts the weight asks for, and no older pod serves.
    fn at_desired_counts(&self, counts: CanaryStableCounts) -> bool {
        let Some(new_rs) = self.new_rs else {
            return false;
        };
        let canary_ready = match self.canary.replica_progress_threshold.as_ref() {
            Some(threshold) if threshold.value >= 0 => {
                progress_threshold_met(Some(threshold), new_rs, counts.canary)
            }
            _ => new_rs.replicas == counts.canary && new_rs.available_replicas == counts.canary,
        };
        let stable_ready = self.distinct_stable().is_some_and(|stable| {
            stable.replicas == counts.stable && stable.current_replicas == counts.stable
        });
        let older_gone = self.others.iter().all(|rs| rs.available_replicas == 0);
        canary_ready && stable_ready && older_gone
    }

    fn counts_into(&self, next: &mut RolloutStatus) {
        let all = &self.observed.replica_sets;
        next.replicas = sum_counts(all.iter().map(|rs| rs.current_replicas));
        next.updated_replicas = self.new_rs.map_or(0, |rs| rs.current_replicas);
        next.ready_replicas = sum_counts(all.iter().map(|rs| rs.ready_replicas));
        next.available_replicas = sum_counts(all.iter().map(|rs| rs.available_replicas));
        next.hpa_replicas = next.replicas;
        next.selector = self
            .rollout
            .spec
            .selector
            .as_ref()
            .and_then(|selector| selector.match_labels.as_ref())
            .map(|labels| {
                labels
                    .iter()
                    .map(|(key, value)| format!("{key}={value}"))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
    }

    /// `progressDeadlineAbort`: an update that made no progress for the deadline is aborted.
    fn progress_deadline_abort(&mut self, next: &RolloutStatus) {
        if !self.rollout.spec.effective_progress_deadline_abort() || self.is_aborted() {
            return;
        }
        let previous = self.previous();
        let completed = !next.stable_rs.is_empty() && next.stable_rs == next.current_pod_hash;
        if completed
            || made_progress(&previous, next)
            || self.indefinite_step()
            || self.waiting_for_scale_down()
            || !timed_out(&previous, self.deadline_seconds(), self.now)
        {
            return;
        }
        self.pause.add_abort = Some(format!(
            "ReplicaSet \"{}\" has timed out progressing.",
            self.new_rs_name()
        ));
    }

    fn deadline_seconds(&self) -> i32 {
        self.rollout.spec.effective_progress_deadline_seconds()
    }

    /// Steps that wait on a person, an analysis or an experiment do not count against the progress
    /// deadline.
    fn indefinite_step(&self) -> bool {
        let waiting_step = self.current_step().is_some_and(|step| {
            step.pause.is_some() || step.analysis.is_some() || step.experiment.is_some()
        });
        let paused = self
            .base
            .condition(PAUSED)
            .is_some_and(RolloutCondition::is_true);
        waiting_step || paused
    }

    fn waiting_for_scale_down(&self) -> bool {
        self.others
            .iter()
            .any(|rs| self.scale_down_deadline(rs).is_some())
    }

    fn apply_pause_decisions(&mut self, next: &mut RolloutStatus) {
        self.pause.apply(&self.base, self.now, next);
    }

    fn set_conditions(&mut self, next: &mut RolloutStatus) {
        let previous = self.previous();
        let healthy = is_healthy(
            &self.rollout.spec,
            &generation_string(self.rollout),
            &previous,
            next,
        );
        let rs_name = self.new_rs_name();
        let progress = Progress {
            rollout: self.rollout,
            now: self.now,
            healthy,
            abort_reason: self.pause.add_abort.as_deref(),
            revision: self.revision(),
            rs_name: &rs_name,
            current_hash: &self.current_hash,
            deadline_paused: self.indefinite_step() || self.waiting_for_scale_down(),
            replica_failure: super::status::replica_failure(self.observed, &self.current_hash),
        };
        let events = set_conditions(&progress, next);
        self.out.events.extend(events);
    }

    /// Look again when the progress deadline would pass, unless nothing is expected to move.
    fn requeue_for_progress_deadline(&mut self, next: &RolloutStatus) {
        let Some(progressing) = next.condition(PROGRESSING) else {
            return;
        };
        let idle = progressing.reason == NEW_RS_AVAILABLE_REASON
            || progressing.reason == TIMED_OUT_REASON
            || progressing.reason == ROLLOUT_ABORTED_REASON
            || progressing.reason == ROLLOUT_PAUSED_REASON
            || next.abort
            || self.indefinite_step();
        if idle {
            return;
        }
        let deadline = deadline_of(progressing.last_update_time.0, self.deadline_seconds());
        let at = deadline
            .checked_add(SignedDuration::from_secs(1))
            .unwrap_or(deadline);
        self.out.requeue_at(self.now, at);
    }

    /// Selectors of `stableService` and `canaryService`, pointed only at revisions that have
    /// pods available to serve.
    fn service_selectors(&self, next: &RolloutStatus) -> Vec<ServiceSelector> {
        let serving = |hash: &str| {
            self.observed
                .replica_sets
                .iter()
                .any(|rs| rs.pod_template_hash == hash && rs.available_replicas > 0)
        };
        let mut selectors = Vec::new();
        if let Some(service) = self.canary.stable_service.as_ref()
            && !next.stable_rs.is_empty()
            && serving(&next.stable_rs)
        {
            selectors.push(ServiceSelector {
                service: service.clone(),
                pod_template_hash: next.stable_rs.clone(),
            });
        }
        if let Some(service) = self.canary.canary_service.as_ref() {
            let target = if serving(&self.current_hash) && !self.is_aborted() {
                Some(self.current_hash.clone())
            } else if !next.stable_rs.is_empty() && serving(&next.stable_rs) {
                Some(next.stable_rs.clone())
            } else {
                None
            };
            if let Some(hash) = target {
                selectors.push(ServiceSelector {
                    service: service.clone(),
                    pod_template_hash: hash,
                });
            }
        }
        selectors
    }

    fn canary_weight(&self) -> CanaryWeight {
        let canary_available = self.new_rs.map_or(0, |rs| rs.available_replicas);
        let total_available = sum_counts(
            self.observed
                .replica_sets
                .iter()
                .map(|rs| rs.available_replicas),
        );
        CanaryWeight {
            desired: self.desired_weight(),
            actual: actual_weight(canary_available, total_available),
        }
    }
}

/// `replicaProgressThreshold`: enough canary pods are available to move on.
fn progress_threshold_met(
    threshold: Option<&ReplicaProgressThreshold>,
    rs: &ObservedReplicaSet,
    desired: i32,
) -> bool {
    match threshold {
        Some(threshold) if threshold.value >= 0 => match threshold.type_ {
            ProgressType::Percent => {
                desired == 0
                    || i64::from(rs.available_replicas) * 100
                        >= i64::from(threshold.value) * i64::from(desired)
            }
            ProgressType::Pods => rs.available_replicas >= threshold.value,
        },
        _ => desired == rs.replicas && desired == rs.available_replicas,
    }
}

/// How a step reads in events, as Argo prints it.
fn step_summary(step: &CanaryStep) -> String {
    if let Some(weight) = step.set_weight {
        return format!("setWeight: {weight}");
    }
    if let Some(pause) = &step.pause {
        return match &pause.duration {
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(seconds)) => {
                format!("pause: {seconds}s")
            }
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(text)) => {
                format!("pause: {text}")
            }
            None => "pause".into(),
        };
    }
    if let Some(analysis) = &step.analysis {
        let names: Vec<&str> = analysis
            .templates()
            .iter()
            .map(|template| template.template_name.as_str())
            .collect();
        return format!("analysis: {}", names.join(","));
    }
    step.kinds().join(",")
}

mod analysis;
mod traffic;

#[cfg(test)]
mod analysis_tests;
#[cfg(test)]
mod tests;
