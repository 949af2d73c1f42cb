//! The blue-green strategy: the new revision comes up beside the active one behind the
//! preview Service (smaller while `previewReplicaCount` says so), the active Service switches to
//! it on promotion (automatic, timed or by a person, gated by pre-promotion analysis), and the
//! old revision keeps its pods for `scaleDownDelaySeconds` so that a rollback is instant.
//!
//! `status.blueGreen.activeSelector` records what the active Service selects: it is written in
//! the same plan that asks for the switch, so a restarted controller decides from status alone.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use rollouts_crds::FieldError;
use rollouts_crds::analysis::AnalysisPhase;
use rollouts_crds::conditions::*;
use rollouts_crds::rollout::{
    BlueGreenStrategy, DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY, ROLLOUT_TYPE_POST_PROMOTION,
    ROLLOUT_TYPE_PRE_PROMOTION, Rollout, RolloutAnalysis, RolloutAnalysisRunStatus, RolloutStatus,
};

use super::analysis_runs::{pending_pointer, record_run_phase};
use super::pause::{PauseDecisions, pause_expiry};
use super::replicas::sum_counts;
use super::revisions::{self, has_scale_down_annotation, scale_down_deadline};
use super::status::{
    Outbox, Progress, deadline_of, generation_string, invalid_spec, is_healthy_blue_green,
    made_progress, phase, set_conditions, timed_out,
};
use super::template_match::current_revision;
use super::validation::{has_templates, validate_blue_green};
use super::{
    AnalysisRunToCreate, EventType, Observed, ObservedAnalysisRun, ObservedReplicaSet, Plan,
    ReplicaSetMetadata, ReplicaSetRevision, ScaleDownDeadline, ServiceSelector,
};

/// Argo looks again this soon at a Rollout whose Services are missing: they may be applied
/// right after it.
const MISSING_SERVICE_REQUEUE: Duration = Duration::from_secs(20);

/// Plans the next move of a blue-green `rollout` from what was `observed`, at `now`.
pub(super) fn plan(
    rollout: &Rollout,
    blue_green: &BlueGreenStrategy,
    observed: &Observed,
    now: Timestamp,
) -> Plan {
    let template = match validate_blue_green(rollout, blue_green) {
        Ok(template) => template,
        Err(error) => return invalid_spec(rollout, &error, now),
    };
    if let Some(error) = missing_service(blue_green, observed) {
        let mut plan = invalid_spec(rollout, &error, now);
        plan.requeue_after = Some(MISSING_SERVICE_REQUEUE);
        return plan;
    }
    BlueGreen::new(rollout, blue_green, &template, observed, now).run()
}

/// The first Service the spec names that does not exist, as Argo reports it.
fn missing_service(blue_green: &BlueGreenStrategy, observed: &Observed) -> Option<FieldError> {
    [
        ("activeService", blue_green.active_service.as_ref()),
        ("previewService", blue_green.preview_service.as_ref()),
    ]
    .into_iter()
    .find_map(|(field, name)| {
        let name = name.filter(|name| observed.missing_services.contains(*name))?;
        Some(FieldError::new(
            format!("spec.strategy.blueGreen.{field}"),
            format!("services \"{name}\" not found"),
            format!("create Service {name} in the Rollout's namespace or name an existing one"),
        ))
    })
}

/// Which of the two promotion analyses.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Promotion {
    Pre,
    Post,
}

impl Promotion {
    fn rollout_type(self) -> &'static str {
        match self {
            Promotion::Pre => ROLLOUT_TYPE_PRE_PROMOTION,
            Promotion::Post => ROLLOUT_TYPE_POST_PROMOTION,
        }
    }

    /// Argo's name infix: `<rollout>-<hash>-<revision>-pre`.
    fn infix(self) -> &'static str {
        match self {
            Promotion::Pre => "pre",
            Promotion::Post => "post",
        }
    }

    fn pointer(self, status: &RolloutStatus) -> Option<&RolloutAnalysisRunStatus> {
        match self {
            Promotion::Pre => status.blue_green.pre_promotion_analysis_run_status.as_ref(),
            Promotion::Post => status
                .blue_green
                .post_promotion_analysis_run_status
                .as_ref(),
        }
    }

    fn pointer_mut(self, status: &mut RolloutStatus) -> &mut Option<RolloutAnalysisRunStatus> {
        match self {
            Promotion::Pre => &mut status.blue_green.pre_promotion_analysis_run_status,
            Promotion::Post => &mut status.blue_green.post_promotion_analysis_run_status,
        }
    }

    fn failure_message(self) -> &'static str {
        match self {
            Promotion::Pre => "Blue/green pre-promotion analysis phase error/failed",
            Promotion::Post => "Blue/green post-promotion analysis phase error/failed",
        }
    }
}

struct BlueGreen<'a> {
    rollout: &'a Rollout,
    blue_green: &'a BlueGreenStrategy,
    observed: &'a Observed,
    now: Timestamp,
    spec_replicas: i32,
    current_hash: String,
    /// The status as the Rollout carries it.
    previous: RolloutStatus,
    /// The status as this plan reads it: the previous one, reset for a new template.
    base: RolloutStatus,
    new_rs: Option<&'a ObservedReplicaSet>,
    stable_rs: Option<&'a ObservedReplicaSet>,
    others: Vec<&'a ObservedReplicaSet>,
    /// The new ReplicaSet is an old revision still inside its scale-down delay.
    new_rs_within_delay: bool,
    /// Going back to a revision within `spec.rollbackWindow` (Argo's `isRollbackWithinWindow`).
    rollback_within_window: bool,
    pause: PauseDecisions,
    out: Outbox,
    name_collision: bool,
    /// The current pre- and post-promotion runs, once reconciled.
    pre_run: Option<&'a ObservedAnalysisRun>,
    post_run: Option<&'a ObservedAnalysisRun>,
}

impl<'a> BlueGreen<'a> {
    fn new(
        rollout: &'a Rollout,
        blue_green: &'a BlueGreenStrategy,
        template: &serde_json::Value,
        observed: &'a Observed,
        now: Timestamp,
    ) -> Self {
        let previous = rollout.status.clone().unwrap_or_default();
        let (current_hash, new_rs) = current_revision(template, previous.collision_count, observed);
        let find = |hash: &str| {
            observed
                .replica_sets
                .iter()
                .find(|rs| !hash.is_empty() && rs.pod_template_hash == hash)
        };
        let stable_rs = find(&previous.stable_rs).filter(|rs| rs.pod_template_hash != current_hash);
        let others = observed
            .replica_sets
            .iter()
            .filter(|rs| {
                rs.pod_template_hash != current_hash && rs.pod_template_hash != previous.stable_rs
            })
            .collect();
        // Only a rollback (the new ReplicaSet is older than the stable one) is fast-tracked.
        let older_than_stable = match (new_rs, stable_rs) {
            (Some(new_rs), Some(stable)) => {
                (new_rs.revision(), new_rs.created) < (stable.revision(), stable.created)
            }
            _ => false,
        };
        let new_rs_within_delay = older_than_stable
            && new_rs
                .and_then(scale_down_deadline)
                .is_some_and(|at| at > now);
        let rollback_within_window =
            revisions::rollback_within_window(rollout, observed, new_rs, stable_rs);
        let mut planner = Self {
            rollout,
            blue_green,
            observed,
            now,
            spec_replicas: rollout.spec.effective_replicas(),
            current_hash,
            base: previous.clone(),
            previous,
            new_rs,
            stable_rs,
            others,
            new_rs_within_delay,
            rollback_within_window,
            pause: PauseDecisions::default(),
            out: Outbox::default(),
            name_collision: false,
            pre_run: None,
            post_run: None,
        };
        planner.restart_on_change();
        planner
    }

    fn run(mut self) -> Plan {
        let mut plan = Plan::unchanged(self.rollout);
        let mut next = self.base.clone();
        next.current_step_index = None;
        next.current_step_hash = String::new();

        self.reconcile_analysis(&mut plan, &mut next);
        let new_count = self.desired_new_replicas();
        self.reconcile_replica_sets(&mut plan, new_count);
        self.reconcile_pause(new_count);
        next.blue_green.active_selector = self.desired_active(new_count);
        next.blue_green.preview_selector = self.desired_preview();
        self.promote_or_check_point(&mut next);
        self.counts_into(&mut next);
        if self.name_collision {
            next.collision_count = Some(self.base.collision_count.unwrap_or(0).saturating_add(1));
        }
        self.progress_deadline_abort(&next);
        self.pause.apply(&self.base, self.now, &mut next);
        self.set_conditions(&mut next);
        next.observed_generation = generation_string(self.rollout);
        (next.phase, next.message) = phase(&self.rollout.spec, &next);

        plan.revise_replica_set = self.revise_replica_set();
        plan.service_selectors = self.service_selectors(&next);
        plan.replica_set_metadata = self.replica_set_metadata(&next);
        self.requeue_for_progress_deadline(&next);
        plan.status_changed = Some(&next) != self.rollout.status.as_ref();
        plan.status = next;
        plan.events = self.out.events;
        plan.requeue_after = self.out.requeue;
        plan
    }

    /// A new pod template starts the update over: pauses, abort, promote-full, the preview
    /// check point and the analysis pointers belong to the previous revision.
    fn restart_on_change(&mut self) {
        let previous_hash = &self.base.current_pod_hash;
        if !previous_hash.is_empty() && *previous_hash != self.current_hash {
            let base = &mut self.base;
            base.pause_conditions.clear();
            base.controller_pause = false;
            base.abort = false;
            base.aborted_at = None;
            base.promote_full = false;
            base.blue_green.scale_up_preview_check_point = false;
            base.blue_green.pre_promotion_analysis_run_status = None;
            base.blue_green.post_promotion_analysis_run_status = None;
        }
        self.base.current_pod_hash = self.current_hash.clone();
        if self.base.promote_full && self.fully_promoted() {
            self.base.promote_full = false;
        }
        if self.base.promote_full || self.rollback_within_window {
            self.pause.clear = true;
            self.pause.remove_abort = true;
        }
    }

    fn is_aborted(&self) -> bool {
        self.pause.is_aborted(&self.base)
    }

    fn initial_deploy(&self) -> bool {
        self.stable_rs.is_none() && self.base.stable_rs != self.current_hash
    }

    /// The current revision is stable and active (Argo's `IsFullyPromoted`).
    fn fully_promoted(&self) -> bool {
        self.base.stable_rs == self.current_hash
            && self.base.blue_green.active_selector == self.current_hash
    }

    /// Going back to the stable revision, to an old one still inside its scale-down delay, or
    /// to one within `spec.rollbackWindow`.
    fn fast_rollback(&self) -> bool {
        self.new_rs.is_some()
            && ((!self.base.stable_rs.is_empty() && self.base.stable_rs == self.current_hash)
                || self.new_rs_within_delay
                || self.rollback_within_window)
    }

    /// `spec.paused` and an inconclusive analysis hold the services where they are.
    fn halted(&self) -> bool {
        self.rollout.spec.is_paused() || self.has_pause(PAUSE_REASON_INCONCLUSIVE_ANALYSIS)
    }

    fn has_pause(&self, reason: &str) -> bool {
        self.base
            .pause_conditions
            .iter()
            .any(|condition| condition.reason == reason)
    }

    fn blue_green_pause(&self) -> Option<&Time> {
        self.base
            .pause_conditions
            .iter()
            .find(|condition| condition.reason == PAUSE_REASON_BLUE_GREEN_PAUSE)
            .map(|condition| &condition.start_time)
    }

    /// The current template's revision: a reused ReplicaSet older than another becomes the
    /// newest again (Argo's `syncReplicaSetRevision`).
    fn revision(&self) -> i64 {
        let Some(new_rs) = self.new_rs else {
            return self.next_revision();
        };
        let newest_other = self
            .observed
            .replica_sets
            .iter()
            .filter(|rs| rs.name != new_rs.name)
            .filter_map(ObservedReplicaSet::revision)
            .max()
            .unwrap_or_default();
        new_rs
            .revision()
            .unwrap_or_default()
            .max(newest_other.saturating_add(1))
    }

    fn revise_replica_set(&self) -> Option<ReplicaSetRevision> {
        let new_rs = self.new_rs?;
        let revision = self.revision();
        (new_rs.revision() != Some(revision)).then(|| ReplicaSetRevision {
            name: new_rs.name.clone(),
            revision,
        })
    }

    fn next_revision(&self) -> i64 {
        revisions::next_revision(self.observed)
    }

    fn rollout_name(&self) -> &str {
        self.rollout.metadata.name.as_deref().unwrap_or_default()
    }

    fn new_rs_name(&self) -> String {
        revisions::new_rs_name(self.rollout, self.new_rs, &self.current_hash)
    }

    fn auto_promotion_seconds(&self) -> i32 {
        self.blue_green.auto_promotion_seconds.unwrap_or(0).max(0)
    }

    /// The current run of one promotion analysis: an in-flight run of the current revision wins
    /// (it may have been created just before a restart), then the one status points at.
    fn current_run(&self, promotion: Promotion) -> Option<&'a ObservedAnalysisRun> {
        let observed = self.observed;
        let of_kind = |run: &&ObservedAnalysisRun| {
            run.rollout_type == promotion.rollout_type()
                && run.pod_template_hash == self.current_hash
        };
        let in_flight = observed
            .analysis_runs
            .iter()
            .filter(of_kind)
            .filter(|run| !run.phase.is_completed() && !run.terminating)
            .max_by_key(|run| run.created);
        let pointed = promotion.pointer(&self.base).and_then(|pointer| {
            observed
                .analysis_runs
                .iter()
                .filter(of_kind)
                .find(|run| run.name == pointer.name)
        });
        in_flight.or(pointed)
    }

    fn analysis_of(&self, promotion: Promotion) -> Option<&'a RolloutAnalysis> {
        let analysis = match promotion {
            Promotion::Pre => self.blue_green.pre_promotion_analysis.as_ref(),
            Promotion::Post => self.blue_green.post_promotion_analysis.as_ref(),
        };
        analysis.filter(|analysis| has_templates(Some(analysis)))
    }

    /// The new ReplicaSet runs `count` pods, all available.
    fn new_rs_at(&self, count: i32) -> bool {
        self.new_rs
            .is_some_and(|rs| rs.replicas == count && rs.available_replicas == count)
    }

    /// Whether this promotion analysis does not apply now (Argo's `skip*PromotionAnalysisRun`).
    fn skip_analysis(&self, promotion: Promotion, run: Option<&ObservedAnalysisRun>) -> bool {
        let active = &self.base.blue_green.active_selector;
        let promoted = self.base.stable_rs == self.current_hash;
        let not_yet = match promotion {
            Promotion::Pre => promoted || active.is_empty() || *active == self.current_hash,
            Promotion::Post => promoted || *active != self.current_hash,
        };
        if not_yet {
            return true;
        }
        if run.is_some() {
            return false;
        }
        match (promotion, self.blue_green.preview_replica_count) {
            (Promotion::Pre, Some(preview)) => !self.new_rs_at(preview),
            _ => !self.new_rs_at(self.spec_replicas),
        }
    }

    /// A person resumed after an inconclusive run, or retried after an abort.
    fn needs_new_run(&self, run: Option<&ObservedAnalysisRun>) -> bool {
        let Some(run) = run else {
            return true;
        };
        let resumed = self.base.controller_pause
            && !self.has_pause(PAUSE_REASON_CANARY_PAUSE_STEP)
            && !self.has_pause(PAUSE_REASON_BLUE_GREEN_PAUSE);
        if resumed {
            return run.phase == AnalysisPhase::Inconclusive;
        }
        self.base.aborted_at.is_some()
    }

    fn reconcile_analysis(&mut self, plan: &mut Plan, next: &mut RolloutStatus) {
        let cancel_all = self.fully_promoted()
            || self.is_aborted()
            || self.base.promote_full
            || self.fast_rollback()
            || self.initial_deploy();
        let mut keep: Vec<String> = Vec::new();
        for promotion in [Promotion::Pre, Promotion::Post] {
            let run = self.current_run(promotion);
            let Some(analysis) = self.analysis_of(promotion) else {
                *promotion.pointer_mut(next) = None;
                continue;
            };
            if cancel_all {
                // Blue-green keeps pointing at the last run once the update is over.
                if let Some(run) = run {
                    self.record_run(promotion, next, run);
                }
                continue;
            }
            if self.skip_analysis(promotion, run) {
                if let Some(run) = run {
                    self.record_run(promotion, next, run);
                }
                continue;
            }
            if self.has_pause(PAUSE_REASON_INCONCLUSIVE_ANALYSIS) {
                if let Some(run) = run {
                    keep.push(run.name.clone());
                    self.record_run(promotion, next, run);
                }
                continue;
            }
            if self.needs_new_run(run) {
                let name = self.new_run_name(promotion);
                plan.create_analysis_runs.push(AnalysisRunToCreate {
                    name: name.clone(),
                    step_index: 0,
                    rollout_type: promotion.rollout_type().into(),
                    pod_template_hash: self.current_hash.clone(),
                    stable_pod_template_hash: self.base.stable_rs.clone(),
                    analysis: analysis.clone(),
                    spec: None,
                    revision: None,
                });
                *promotion.pointer_mut(next) = Some(pending_pointer(&name));
                keep.push(name);
                continue;
            }
            if let Some(run) = run {
                keep.push(run.name.clone());
                self.record_run(promotion, next, run);
                match run.phase {
                    AnalysisPhase::Inconclusive => {
                        self.pause.add.push(PAUSE_REASON_INCONCLUSIVE_ANALYSIS)
                    }
                    AnalysisPhase::Failed | AnalysisPhase::Error => {
                        let mut message = promotion.failure_message().to_string();
                        if !run.message.is_empty() {
                            message = format!("{message}: {}", run.message);
                        }
                        self.pause.add_abort = Some(message);
                    }
                    _ => {}
                }
                match promotion {
                    Promotion::Pre => self.pre_run = Some(run),
                    Promotion::Post => self.post_run = Some(run),
                }
            }
        }
        plan.terminate_analysis_runs = self
            .observed
            .analysis_runs
            .iter()
            .filter(|run| run.step_index.is_none())
            .filter(|run| {
                run.rollout_type == ROLLOUT_TYPE_PRE_PROMOTION
                    || run.rollout_type == ROLLOUT_TYPE_POST_PROMOTION
            })
            .filter(|run| !run.phase.is_completed() && !run.terminating)
            .filter(|run| !keep.contains(&run.name))
            .map(|run| run.name.clone())
            .collect();
    }

    /// Keeps the status pointer in step with the run, with an event when its phase changes.
    fn record_run(
        &mut self,
        promotion: Promotion,
        next: &mut RolloutStatus,
        run: &ObservedAnalysisRun,
    ) {
        let before = promotion.pointer(&self.base);
        let pointer = record_run_phase(&mut self.out, promotion.rollout_type(), before, run);
        *promotion.pointer_mut(next) = Some(pointer);
    }

    /// `<rollout>-<hash>-<revision>-pre|post`, with `.N` appended while the name is taken.
    fn new_run_name(&self, promotion: Promotion) -> String {
        let base = format!(
            "{}-{}-{}-{}",
            self.rollout_name(),
            self.current_hash,
            self.revision(),
            promotion.infix()
        );
        self.observed.unused_run_name(base)
    }

    /// No pre-promotion analysis, or its run succeeded.
    fn completed_pre_promotion(&self) -> bool {
        self.analysis_of(Promotion::Pre).is_none()
            || self
                .pre_run
                .or_else(|| self.current_run(Promotion::Pre))
                .is_some_and(|run| run.phase == AnalysisPhase::Successful)
    }

    /// Pods the new revision should run (Argo's `NewRSNewReplicas` for blue-green).
    fn desired_new_replicas(&self) -> i32 {
        let Some(preview) = self.blue_green.preview_replica_count else {
            return self.spec_replicas;
        };
        let active = &self.base.blue_green.active_selector;
        let active_exists = self
            .observed
            .replica_sets
            .iter()
            .any(|rs| !active.is_empty() && rs.pod_template_hash == *active);
        if !active_exists || *active == self.current_hash || self.base.promote_full {
            return self.spec_replicas;
        }
        if self.previous.current_pod_hash != self.current_hash {
            return preview;
        }
        let not_paused = !self.rollout.spec.is_paused() && self.base.pause_conditions.is_empty();
        if not_paused && self.base.blue_green.scale_up_preview_check_point {
            return self.spec_replicas;
        }
        preview
    }

    /// After an abort the new ReplicaSet keeps its pods for `abortScaleDownDelaySeconds`,
    /// unless that is 0 (never scaled down) or there is no stable to fall back to.
    fn abort_scale_down_delay(&self) -> Option<Duration> {
        if !self.is_aborted() || self.stable_rs.is_none() {
            return None;
        }
        self.rollout.spec.effective_abort_scale_down_delay()
    }

    fn reconcile_replica_sets(&mut self, plan: &mut Plan, new_count: i32) {
        self.clean_up_history(plan);
        let delaying_abort = self.abort_scale_down_delay();
        if let Some(new_rs) = self.new_rs
            && delaying_abort.is_none()
            && scale_down_deadline(new_rs).is_some()
        {
            plan.clear_scale_down_deadlines.push(new_rs.name.clone());
        }
        if let Some(stable) = self.stable_rs {
            if has_scale_down_annotation(stable) {
                plan.clear_scale_down_deadlines.push(stable.name.clone());
            }
            if stable.replicas != self.spec_replicas {
                self.scale(plan, stable, self.spec_replicas);
            }
        }
        match self.new_rs {
            None => self.create_new_rs(plan, new_count),
            Some(new_rs) => {
                let target = match delaying_abort {
                    Some(delay) => self.new_rs_target_on_abort(plan, new_rs, delay),
                    None => Some(new_count),
                };
                if let Some(target) = target
                    && target != new_rs.replicas
                {
                    self.scale(plan, new_rs, target);
                }
            }
        }
        self.scale_down_others(plan);
    }

    fn create_new_rs(&mut self, plan: &mut Plan, replicas: i32) {
        let name = self.new_rs_name();
        let hash = &self.current_hash;
        if !revisions::create(plan, &mut self.out, self.observed, name, hash, replicas) {
            // Someone else's ReplicaSet has our name: salt the hash and try again.
            self.name_collision = true;
        }
    }

    /// The aborted ReplicaSet's scale: kept until its deadline, which is set once the stable
    /// serves every pod again; zero after it. `None` keeps the current scale.
    fn new_rs_target_on_abort(
        &mut self,
        plan: &mut Plan,
        new_rs: &ObservedReplicaSet,
        delay: Duration,
    ) -> Option<i32> {
        match scale_down_deadline(new_rs) {
            Some(deadline) if deadline > self.now => {
                self.out.requeue_at(self.now, deadline);
                None
            }
            Some(_) => Some(0),
            None => {
                let stable_serves = self
                    .stable_rs
                    .is_some_and(|stable| stable.available_replicas >= self.spec_replicas);
                if stable_serves {
                    self.set_deadline(plan, new_rs, delay);
                }
                None
            }
        }
    }

    fn set_deadline(&mut self, plan: &mut Plan, rs: &ObservedReplicaSet, delay: Duration) {
        let delay_signed = SignedDuration::try_from(delay).unwrap_or(SignedDuration::MAX);
        let deadline = self.now.checked_add(delay_signed).unwrap_or(Timestamp::MAX);
        // The annotation is written to the second, as Argo's RFC 3339 stamp is.
        let deadline = Timestamp::from_second(deadline.as_second()).unwrap_or(deadline);
        plan.set_scale_down_deadlines.push(ScaleDownDeadline {
            name: rs.name.clone(),
            deadline,
        });
        self.out.requeue_at(self.now, deadline);
    }

    fn scale(&mut self, plan: &mut Plan, rs: &ObservedReplicaSet, to: i32) {
        revisions::scale(plan, &mut self.out, rs, to);
    }

    /// A ReplicaSet a Service or the status still points at keeps its pods.
    fn referenced(&self, rs: &ObservedReplicaSet) -> bool {
        let status = &self.previous;
        [
            &status.stable_rs,
            &status.current_pod_hash,
            &status.blue_green.active_selector,
            &status.blue_green.preview_selector,
        ]
        .iter()
        .any(|hash| !hash.is_empty() && **hash == rs.pod_template_hash)
    }

    /// Old revisions keep their pods for `scaleDownDelaySeconds` after traffic left them (at
    /// most `scaleDownDelayRevisionLimit` of them, newest first), then go to zero.
    fn scale_down_others(&mut self, plan: &mut Plan) {
        if self.has_pause(PAUSE_REASON_INCONCLUSIVE_ANALYSIS) {
            return;
        }
        let waits_for_post_analysis = self.analysis_of(Promotion::Post).is_some()
            && self.blue_green.scale_down_delay_seconds.is_none()
            && !self.skip_analysis(Promotion::Post, self.post_run)
            && self
                .post_run
                .is_none_or(|run| run.phase != AnalysisPhase::Successful);
        if waits_for_post_analysis {
            return;
        }
        let delay = self.rollout.spec.effective_scale_down_delay();
        let limit = self
            .blue_green
            .scale_down_delay_revision_limit
            .unwrap_or(i32::MAX);
        let mut others = self.others.clone();
        others.sort_by_key(|rs| std::cmp::Reverse((rs.revision().unwrap_or_default(), rs.created)));
        let mut delayed = 0;
        for rs in others {
            if self.referenced(rs) || rs.replicas == 0 {
                continue;
            }
            let target = if has_scale_down_annotation(rs) {
                delayed += 1;
                match scale_down_deadline(rs) {
                    Some(deadline) if delayed <= limit && deadline > self.now => {
                        self.out.requeue_at(self.now, deadline);
                        self.spec_replicas
                    }
                    _ => 0,
                }
            } else if delayed < limit {
                delayed += 1;
                self.set_deadline(plan, rs, delay);
                rs.replicas
            } else {
                0
            };
            if target != rs.replicas {
                self.scale(plan, rs, target);
            }
        }
    }

    /// Deletes the oldest empty ReplicaSets beyond `revisionHistoryLimit`; one a Service or
    /// the status still points at is kept.
    fn clean_up_history(&self, plan: &mut Plan) {
        let candidates = self
            .others
            .iter()
            .copied()
            .filter(|rs| !self.referenced(rs));
        let deleted = revisions::history_to_delete(self.rollout, candidates, self.now);
        if !deleted.is_empty() {
            plan.delete_replica_sets = deleted;
        }
    }

    /// The new ReplicaSet runs and serves the pods it should (Argo's `ReadyForPause`).
    fn ready_for_pause(&self, new_count: i32) -> bool {
        self.new_rs_at(new_count)
    }

    /// The switch needs no pause: first deploy, promote-full, fast rollback, already active.
    fn fast_tracked(&self) -> bool {
        let active = &self.base.blue_green.active_selector;
        self.fast_rollback()
            || self.base.promote_full
            || active.is_empty()
            || *active == self.current_hash
    }

    /// `autoPromotionEnabled: false` or `autoPromotionSeconds` ask for a pause before the switch.
    fn needs_pause(&self) -> bool {
        !self.blue_green.effective_auto_promotion_enabled() || self.auto_promotion_seconds() > 0
    }

    /// The pause before the switch is over: timed out, or a person promoted.
    fn completed_pause(&self) -> bool {
        if self.pause.add.contains(&PAUSE_REASON_BLUE_GREEN_PAUSE) {
            return false;
        }
        if self.base.blue_green.scale_up_preview_check_point {
            return true;
        }
        let pause = self.blue_green_pause();
        if self.blue_green.effective_auto_promotion_enabled() {
            let seconds = self.auto_promotion_seconds();
            return match pause {
                _ if seconds == 0 => true,
                Some(start) => self.now > auto_promotion_at(start, seconds),
                None => false,
            };
        }
        self.base.controller_pause && pause.is_none()
    }

    /// Adds or removes the `BlueGreenPause` condition (Argo's `reconcileBlueGreenPause`).
    fn reconcile_pause(&mut self, new_count: i32) {
        if self.is_aborted() || !self.ready_for_pause(new_count) || self.halted() {
            return;
        }
        if self.fast_tracked()
            || self.base.blue_green.scale_up_preview_check_point
            || !self.needs_pause()
        {
            self.pause.remove.push(PAUSE_REASON_BLUE_GREEN_PAUSE);
            return;
        }
        if !self.completed_pre_promotion() {
            return;
        }
        match self.blue_green_pause().cloned() {
            Some(start) => {
                if self.completed_pause() {
                    self.pause.remove.push(PAUSE_REASON_BLUE_GREEN_PAUSE);
                } else if self.auto_promotion_seconds() > 0 {
                    self.out.requeue_at(
                        self.now,
                        auto_promotion_at(&start, self.auto_promotion_seconds()),
                    );
                }
            }
            None if !self.base.controller_pause => {
                self.pause.add.push(PAUSE_REASON_BLUE_GREEN_PAUSE);
                if self.auto_promotion_seconds() > 0 {
                    let seconds = u64::try_from(self.auto_promotion_seconds()).unwrap_or(0);
                    self.out
                        .requeue_in(Duration::from_secs(seconds.saturating_add(1)));
                }
            }
            None => {}
        }
    }

    /// The revision the active Service should select (Argo's `reconcileActiveService`).
    fn desired_active(&self, new_count: i32) -> String {
        let current = self.base.blue_green.active_selector.clone();
        if self.halted() {
            return current;
        }
        if self.is_aborted() {
            return if self.base.stable_rs.is_empty() {
                current
            } else {
                self.base.stable_rs.clone()
            };
        }
        if !self.ready_for_pause(new_count) || !self.new_rs_at(self.spec_replicas) {
            return current;
        }
        let promoted = self.completed_pause() && self.completed_pre_promotion();
        if self.fast_tracked() || promoted {
            return self.current_hash.clone();
        }
        current
    }

    /// The revision the preview Service should select: the new one, from the moment its
    /// ReplicaSet is created and through an abort (Argo's `reconcilePreviewService`), unless
    /// the Rollout is paused by spec or an inconclusive analysis. The Service's endpoints list
    /// only ready pods, so nothing is sent to pods that are not.
    fn desired_preview(&self) -> String {
        if self.blue_green.preview_service.is_none() || self.halted() {
            return self.base.blue_green.preview_selector.clone();
        }
        self.current_hash.clone()
    }

    /// Why the current revision becomes stable now (Argo's `shouldFullPromote`), if it does.
    fn full_promotion_reason(&self, next: &RolloutStatus) -> Option<&'static str> {
        if self.initial_deploy() {
            return Some("Initial deploy");
        }
        let active = &next.blue_green.active_selector;
        if active.is_empty() {
            return Some("Initial deploy");
        }
        if *active != self.current_hash {
            return None;
        }
        if self.base.promote_full {
            return Some("Full promotion requested");
        }
        if self.rollback_within_window {
            return Some("Rollback within window");
        }
        if self.fast_rollback() {
            return Some("Fast rollback");
        }
        if self.is_aborted() {
            return None;
        }
        if self.analysis_of(Promotion::Post).is_some()
            && self
                .post_run
                .is_none_or(|run| run.phase != AnalysisPhase::Successful)
        {
            return None;
        }
        Some("Completed blue-green update")
    }

    fn promote_or_check_point(&mut self, next: &mut RolloutStatus) {
        if let Some(reason) = self.full_promotion_reason(next) {
            self.pause.clear = true;
            self.pause.remove_abort = true;
            next.promote_full = false;
            next.blue_green.scale_up_preview_check_point = false;
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
        next.blue_green.scale_up_preview_check_point = self.scale_up_preview_check_point();
    }

    /// The preview ran at `previewReplicaCount`, passed its analysis and pause: scale it to
    /// full before the switch. Once set it stays set until the next update.
    fn scale_up_preview_check_point(&self) -> bool {
        let Some(preview) = self.blue_green.preview_replica_count else {
            return false;
        };
        if self.base.blue_green.scale_up_preview_check_point {
            return true;
        }
        if !self.completed_pre_promotion() || !self.completed_pause() {
            return false;
        }
        self.new_rs
            .is_some_and(|rs| rs.available_replicas == preview)
    }

    /// Counts as Argo writes them for blue-green: ready and available pods are the active
    /// revision's (old pods kept for the scale-down delay serve no one).
    fn counts_into(&self, next: &mut RolloutStatus) {
        let all = &self.observed.replica_sets;
        next.replicas = sum_counts(all.iter().map(|rs| rs.current_replicas));
        next.updated_replicas = self.new_rs.map_or(0, |rs| rs.current_replicas);
        let active = all.iter().find(|rs| {
            !next.blue_green.active_selector.is_empty()
                && rs.pod_template_hash == next.blue_green.active_selector
        });
        match active {
            Some(active) => {
                next.hpa_replicas = active.current_replicas;
                next.ready_replicas = active.ready_replicas;
                next.available_replicas = active.available_replicas;
            }
            None => {
                next.hpa_replicas = next.replicas;
                next.ready_replicas = sum_counts(all.iter().map(|rs| rs.ready_replicas));
                next.available_replicas = sum_counts(all.iter().map(|rs| rs.available_replicas));
            }
        }
        // The scale subresource selects the active revision's pods only, as Argo's does.
        let mut labels = self
            .rollout
            .spec
            .selector
            .as_ref()
            .and_then(|selector| selector.match_labels.clone())
            .unwrap_or_default();
        if let Some(active) = active {
            labels.insert(
                DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY.to_string(),
                active.pod_template_hash.clone(),
            );
        }
        next.selector = labels
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect::<Vec<_>>()
            .join(",");
    }

    /// Waiting on a person or a scale-down delay stops the progress deadline (Argo's
    /// `isIndefiniteStep` and `isWaitingForReplicaSetScaleDown`); a running pre- or
    /// post-promotion analysis does not, so one that never ends times the update out.
    fn deadline_paused(&self) -> bool {
        let paused = !self.base.pause_conditions.is_empty()
            || self.rollout.spec.is_paused()
            || self
                .base
                .condition(PAUSED)
                .is_some_and(|condition| condition.status == STATUS_TRUE);
        let scale_down_pending = self
            .others
            .iter()
            .any(|rs| rs.replicas > 0 && scale_down_deadline(rs).is_some_and(|at| at > self.now));
        paused || scale_down_pending
    }

    /// `progressDeadlineAbort`: an update that made no progress for the deadline is aborted.
    fn progress_deadline_abort(&mut self, next: &RolloutStatus) {
        if !self.rollout.spec.effective_progress_deadline_abort() || self.is_aborted() {
            return;
        }
        let completed = !next.stable_rs.is_empty() && next.stable_rs == next.current_pod_hash;
        if completed
            || made_progress(&self.previous, next)
            || self.deadline_paused()
            || !timed_out(&self.previous, self.deadline_seconds(), self.now)
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

    fn set_conditions(&mut self, next: &mut RolloutStatus) {
        let healthy = is_healthy_blue_green(
            &self.rollout.spec,
            &generation_string(self.rollout),
            &self.previous,
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
            deadline_paused: self.deadline_paused(),
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
        let idle = [
            NEW_RS_AVAILABLE_REASON,
            TIMED_OUT_REASON,
            ROLLOUT_ABORTED_REASON,
            ROLLOUT_PAUSED_REASON,
        ]
        .contains(&progressing.reason.as_str())
            || next.abort
            || self.deadline_paused();
        if idle {
            return;
        }
        let deadline = deadline_of(progressing.last_update_time.0, self.deadline_seconds());
        let at = deadline
            .checked_add(SignedDuration::from_secs(1))
            .unwrap_or(deadline);
        self.out.requeue_at(self.now, at);
    }

    /// Selectors of the active and preview Services, as desired state.
    fn service_selectors(&self, next: &RolloutStatus) -> Vec<ServiceSelector> {
        [
            (
                self.blue_green.active_service.as_ref(),
                &next.blue_green.active_selector,
            ),
            (
                self.blue_green.preview_service.as_ref(),
                &next.blue_green.preview_selector,
            ),
        ]
        .into_iter()
        .filter_map(|(service, hash)| {
            let service = service?;
            (!hash.is_empty()).then(|| ServiceSelector {
                service: service.clone(),
                pod_template_hash: hash.clone(),
            })
        })
        .collect()
    }

    /// `activeMetadata` on the active revision's pods, `previewMetadata` on the new revision's
    /// until it is promoted, nothing injected on older revisions.
    fn replica_set_metadata(&self, next: &RolloutStatus) -> Vec<ReplicaSetMetadata> {
        super::ephemeral_metadata(
            self.blue_green.preview_metadata.as_ref(),
            self.blue_green.active_metadata.as_ref(),
            &self.new_rs_name(),
            self.stable_rs.map(|rs| rs.name.as_str()),
            next.stable_rs.is_empty() || next.stable_rs == self.current_hash,
            self.observed,
        )
    }
}

fn auto_promotion_at(start: &Time, seconds: i32) -> Timestamp {
    pause_expiry(
        start,
        Duration::from_secs(u64::try_from(seconds).unwrap_or(0)),
    )
}

#[cfg(test)]
mod tests;
