use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use rollouts_crds::rollout::{CanaryStep, RolloutPause, SetCanaryScale};

use rollouts_crds::rollout::SCALE_DOWN_DEADLINE_ANNOTATION_KEY;

use super::*;
use crate::planner::REVISION_ANNOTATION;
use crate::planner::replicas::{
    approximate_weighted_canary_stable_replica_counts, resolve_fenceposts,
};
use crate::planner::test_world::{apply_writes, at};

const NAME: &str = "web";

/// A fake cluster: applies plans the way the act phase would. Pods become available at once
/// unless `instant` is off, and every plan is checked to be a pure function of its inputs.
struct World {
    rollout: Rollout,
    observed: Observed,
    now: Timestamp,
    instant: bool,
}

impl World {
    fn new(rollout: Rollout) -> Self {
        Self {
            rollout,
            observed: Observed::default(),
            now: at(0),
            instant: true,
        }
    }

    fn plan(&self) -> Plan {
        let first = plan(&self.rollout, &self.observed, self.now);
        assert_eq!(first, plan(&self.rollout, &self.observed, self.now));
        first
    }

    fn apply_actions(&mut self, plan: &Plan) {
        apply_writes(&mut self.observed, plan, self.now, self.instant);
    }

    fn apply(&mut self, plan: &Plan) {
        self.apply_actions(plan);
        crate::planner::test_world::apply_to_rollout(&mut self.rollout, plan);
    }

    fn step(&mut self) -> Plan {
        let plan = self.plan();
        self.apply(&plan);
        plan
    }

    /// Plans and applies until a plan changes nothing; returns every plan.
    fn settle(&mut self) -> Vec<Plan> {
        let mut plans = Vec::new();
        for _ in 0..60 {
            let plan = self.step();
            let done = plan.is_noop();
            plans.push(plan);
            if done {
                return plans;
            }
        }
        panic!("no steady state; last plan: {:#?}", plans.last());
    }

    fn rs_named(&mut self, name: &str) -> &mut ObservedReplicaSet {
        self.observed
            .replica_sets
            .iter_mut()
            .find(|rs| rs.name == name)
            .expect("ReplicaSet exists")
    }

    fn rs(&self, hash: &str) -> &ObservedReplicaSet {
        self.observed
            .replica_sets
            .iter()
            .find(|rs| rs.pod_template_hash == hash)
            .expect("ReplicaSet with that hash exists")
    }

    fn status(&self) -> &RolloutStatus {
        self.rollout.status.as_ref().expect("status written")
    }

    fn index(&self) -> Option<i32> {
        self.status().current_step_index
    }

    fn condition(&self, type_: &str) -> &RolloutCondition {
        self.status().condition(type_).expect("condition present")
    }

    /// A new pod template (a new revision); bumps `metadata.generation`.
    fn update_image(&mut self, image: &str) {
        let generation = self.rollout.metadata.generation.unwrap_or(1) + 1;
        self.rollout = self
            .rollout
            .clone()
            .with_image(image)
            .with_generation(generation);
    }

    /// `kubectl rollouts promote`: clears the pause conditions (Argo's status patch).
    fn promote(&mut self) {
        let status = self.rollout.status.as_mut().expect("status");
        status.pause_conditions.clear();
    }

    fn set_run_phase(&mut self, phase: AnalysisPhase, message: &str) {
        let run = self
            .observed
            .analysis_runs
            .iter_mut()
            .rev()
            .find(|run| !run.terminating)
            .expect("a run exists");
        run.phase = phase;
        run.message = message.into();
    }

    fn pause_reasons(&self) -> Vec<&str> {
        self.status()
            .pause_conditions
            .iter()
            .map(|c| c.reason.as_str())
            .collect()
    }

    /// Deploys the first revision and settles; returns its hash.
    fn deployed(rollout: Rollout) -> (Self, String) {
        let mut world = Self::new(rollout);
        world.settle();
        let stable = world.status().stable_rs.clone();
        (world, stable)
    }
}

fn steps() -> Vec<CanaryStep> {
    vec![
        CanaryStep::weight(20),
        CanaryStep::pause_indefinitely(),
        CanaryStep::weight(50),
        CanaryStep::pause_seconds(30),
    ]
}

fn rollout(replicas: i32, steps: Vec<CanaryStep>) -> Rollout {
    Rollout::test_canary(NAME, steps).with_replicas(replicas)
}

#[test]
fn initial_deploy_is_stable_at_once() {
    for replicas in [1, 3, 4, 10] {
        let mut world = World::new(rollout(replicas, steps()));
        let first = world.step();
        let created = first
            .create_replica_set
            .clone()
            .expect("creates the ReplicaSet");
        assert_eq!(created.replicas, replicas);
        assert_eq!(created.revision, 1);
        assert_eq!(
            created.name,
            format!("{NAME}-{}", created.pod_template_hash)
        );
        assert_eq!(first.status.stable_rs, created.pod_template_hash);
        assert_eq!(first.status.current_step_index, Some(4));
        world.settle();
        let status = world.status();
        assert_eq!(status.phase, PHASE_HEALTHY, "{status:?}");
        assert_eq!(status.observed_generation, "1");
        assert_eq!(status.current_pod_hash, created.pod_template_hash);
        assert_eq!(status.available_replicas, replicas);
        assert_eq!(world.condition(PROGRESSING).reason, NEW_RS_AVAILABLE_REASON);
        assert!(world.condition(AVAILABLE).is_true());
        assert!(world.condition(COMPLETED).is_true());
        assert!(world.condition(HEALTHY).is_true());
        assert!(world.plan().is_noop(), "a settled rollout plans nothing");
    }
}

#[test]
fn set_weight_and_pause_steps_for_odd_replica_counts() {
    for replicas in [1, 3, 4, 10] {
        let (mut world, v1) = World::deployed(rollout(replicas, steps()));
        world.update_image("nginx:1.28");
        world.settle();
        let v2 = world.status().current_pod_hash.clone();
        assert_ne!(v1, v2);

        // setWeight 20 done, paused at the indefinite pause.
        assert_eq!(world.index(), Some(1), "replicas {replicas}");
        assert_eq!(world.pause_reasons(), [PAUSE_REASON_CANARY_PAUSE_STEP]);
        assert_eq!(world.status().phase, PHASE_PAUSED);
        let surge = resolve_fenceposts(None, None, replicas).unwrap().max_surge;
        let expected = approximate_weighted_canary_stable_replica_counts(replicas, 20, 100, surge);
        assert_eq!(
            world.rs(&v2).replicas,
            expected.canary,
            "replicas {replicas}"
        );
        assert_eq!(
            world.rs(&v1).replicas,
            expected.stable,
            "replicas {replicas}"
        );
        let plan = world.plan();
        assert_eq!(plan.canary_weight.desired, 20);
        let total = expected.canary + expected.stable;
        assert_eq!(
            plan.canary_weight.actual,
            actual_weight(expected.canary, total)
        );
        // Without a router the status records no weights, as Argo's does.
        assert_eq!(world.status().canary.weights, None, "{v1} -> {v2}");
        assert!(world.plan().is_noop(), "a paused rollout stays put");

        // Promote: on to setWeight 50 and the 30s pause.
        world.promote();
        world.settle();
        assert_eq!(world.index(), Some(3));
        let expected = approximate_weighted_canary_stable_replica_counts(replicas, 50, 100, surge);
        assert_eq!(world.rs(&v2).replicas, expected.canary);
        assert_eq!(world.rs(&v1).replicas, expected.stable);
        let pause = world.plan();
        assert!(
            pause
                .requeue_after
                .is_some_and(|after| after <= Duration::from_secs(30))
        );

        // The timed pause ends on its own.
        world.now = at(31);
        world.settle();
        assert_eq!(world.status().stable_rs, v2, "replicas {replicas}");
        assert_eq!(world.index(), Some(4));
        assert_eq!(world.rs(&v2).replicas, replicas);
        assert_eq!(world.rs(&v1).replicas, 0);
        assert_eq!(world.status().phase, PHASE_HEALTHY);
        assert!(world.status().pause_conditions.is_empty());
        assert!(!world.status().controller_pause);
    }
}

#[test]
fn zero_and_full_weights() {
    for replicas in [1, 3, 4, 10] {
        let steps = vec![
            CanaryStep::weight(0),
            CanaryStep::pause_indefinitely(),
            CanaryStep::weight(100),
            CanaryStep::pause_indefinitely(),
        ];
        let (mut world, v1) = World::deployed(rollout(replicas, steps));
        world.update_image("nginx:1.28");
        world.settle();
        let v2 = world.status().current_pod_hash.clone();
        assert_eq!(world.index(), Some(1));
        assert_eq!(world.rs(&v2).replicas, 0, "weight 0 runs no canary pod");
        assert_eq!(world.rs(&v1).replicas, replicas);
        world.promote();
        world.settle();
        assert_eq!(world.index(), Some(3));
        assert_eq!(world.rs(&v2).replicas, replicas, "weight 100 is all canary");
        assert_eq!(world.rs(&v1).replicas, 0);
        assert_ne!(
            world.status().stable_rs,
            v2,
            "steps remain, so not stable yet"
        );
        world.promote();
        world.settle();
        assert_eq!(world.status().stable_rs, v2);
    }
}

#[test]
fn canary_waits_for_available_pods_before_the_step_completes() {
    let (mut world, _) = World::deployed(rollout(4, steps()));
    world.instant = false;
    world.update_image("nginx:1.28");
    world.settle();
    let v2 = world.status().current_pod_hash.clone();
    assert_eq!(world.index(), Some(0), "setWeight waits for the canary pod");
    assert_eq!(world.rs(&v2).available_replicas, 0);
    assert!(
        world.plan().service_selectors.is_empty(),
        "no service points at pods that are not available"
    );
    let rs = world.rs_named(&format!("{NAME}-{v2}"));
    rs.available_replicas = rs.replicas;
    rs.ready_replicas = rs.replicas;
    world.instant = true;
    world.settle();
    assert_eq!(world.index(), Some(1));
}

#[test]
fn services_follow_stable_and_canary() {
    let mut ro = rollout(3, steps());
    if let Some(canary) = ro.spec.strategy.canary.as_mut() {
        canary.stable_service = Some("web-stable".into());
        canary.canary_service = Some("web-canary".into());
    }
    let (mut world, v1) = World::deployed(ro);
    let selectors = world.plan().service_selectors;
    assert_eq!(
        selectors,
        [
            ServiceSelector {
                service: "web-stable".into(),
                pod_template_hash: v1.clone()
            },
            ServiceSelector {
                service: "web-canary".into(),
                pod_template_hash: v1.clone()
            },
        ]
    );
    world.update_image("nginx:1.28");
    world.settle();
    let v2 = world.status().current_pod_hash.clone();
    let selectors = world.plan().service_selectors;
    assert_eq!(selectors[0].pod_template_hash, v1);
    assert_eq!(selectors[1].pod_template_hash, v2);
}

fn analysis_steps() -> Vec<CanaryStep> {
    vec![
        CanaryStep::weight(25),
        CanaryStep::analysis("success-rate"),
        CanaryStep::weight(75),
    ]
}

#[test]
fn analysis_step_creates_one_run_and_advances_on_success() {
    for replicas in [1, 3, 4, 10] {
        let (mut world, _) = World::deployed(rollout(replicas, analysis_steps()));
        world.update_image("nginx:1.28");
        world.settle();
        let v2 = world.status().current_pod_hash.clone();
        assert_eq!(world.index(), Some(1));
        assert_eq!(world.observed.analysis_runs.len(), 1);
        let run = world.observed.analysis_runs[0].clone();
        assert_eq!(run.name, format!("{NAME}-{v2}-2-1"));
        assert_eq!(run.step_index, Some(1));
        let pointer = world
            .status()
            .canary
            .current_step_analysis_run_status
            .clone()
            .expect("status points at the run");
        assert_eq!(pointer.name, run.name);

        world.set_run_phase(AnalysisPhase::Running, "");
        world.settle();
        assert_eq!(world.index(), Some(1), "a running analysis blocks the step");
        assert_eq!(world.observed.analysis_runs.len(), 1);

        world.set_run_phase(AnalysisPhase::Successful, "");
        world.settle();
        assert_eq!(world.status().stable_rs, v2);
        assert_eq!(world.observed.analysis_runs.len(), 1);
        assert!(
            world
                .status()
                .canary
                .current_step_analysis_run_status
                .is_none()
        );
    }
}

#[test]
fn failed_analysis_aborts_and_retry_starts_over() {
    for replicas in [1, 3, 4, 10] {
        for failure in [AnalysisPhase::Failed, AnalysisPhase::Error] {
            let (mut world, v1) = World::deployed(rollout(replicas, analysis_steps()));
            world.update_image("nginx:1.28");
            world.settle();
            let v2 = world.status().current_pod_hash.clone();
            world.set_run_phase(failure, "error rate 7%");
            let plans = world.settle();
            let status = world.status();
            assert!(status.abort);
            assert!(status.aborted_at.is_some());
            assert_eq!(status.current_step_index, Some(0));
            assert_eq!(status.phase, PHASE_DEGRADED);
            let progressing = world.condition(PROGRESSING);
            assert_eq!(progressing.reason, ROLLOUT_ABORTED_REASON);
            assert!(
                progressing.message.contains("error rate 7%"),
                "{progressing:?}"
            );
            assert_eq!(world.rs(&v2).replicas, 0, "rolled back");
            assert_eq!(world.rs(&v1).replicas, replicas);
            let aborted_events = plans
                .iter()
                .flat_map(|plan| &plan.events)
                .filter(|event| event.reason == ROLLOUT_ABORTED_REASON)
                .count();
            assert_eq!(aborted_events, 1);

            // kubectl rollouts retry: status.abort = false.
            world.rollout.status.as_mut().expect("status").abort = false;
            world.settle();
            assert_eq!(world.index(), Some(1));
            assert_eq!(
                world.observed.analysis_runs.len(),
                2,
                "a fresh run for the retry"
            );
            let names: Vec<_> = world
                .observed
                .analysis_runs
                .iter()
                .map(|r| r.name.clone())
                .collect();
            assert_ne!(names[0], names[1]);
            world.set_run_phase(AnalysisPhase::Successful, "");
            world.settle();
            assert_eq!(world.status().stable_rs, v2);
        }
    }
}

#[test]
fn inconclusive_analysis_pauses_for_a_person() {
    for replicas in [1, 3, 4, 10] {
        let (mut world, _) = World::deployed(rollout(replicas, analysis_steps()));
        world.update_image("nginx:1.28");
        world.settle();
        let v2 = world.status().current_pod_hash.clone();
        world.set_run_phase(AnalysisPhase::Inconclusive, "");
        world.settle();
        assert_eq!(world.pause_reasons(), [PAUSE_REASON_INCONCLUSIVE_ANALYSIS]);
        assert!(world.status().controller_pause);
        assert_eq!(world.status().phase, PHASE_PAUSED);
        assert_eq!(world.index(), Some(1));

        // Argo's promote on an inconclusive pause clears it and moves past the step.
        let status = world.rollout.status.as_mut().expect("status");
        status.pause_conditions.clear();
        status.controller_pause = false;
        status.current_step_index = Some(2);
        world.settle();
        assert_eq!(world.status().stable_rs, v2);
        assert_eq!(world.observed.analysis_runs.len(), 1);
    }
}

#[test]
fn resuming_an_inconclusive_pause_in_place_runs_the_analysis_again() {
    for replicas in [1, 3, 4, 10] {
        let (mut world, _) = World::deployed(rollout(replicas, analysis_steps()));
        world.update_image("nginx:1.28");
        world.settle();
        world.set_run_phase(AnalysisPhase::Inconclusive, "");
        world.settle();
        world.promote();
        world.settle();
        assert_eq!(world.index(), Some(1));
        assert_eq!(world.observed.analysis_runs.len(), 2);
        assert!(world.status().pause_conditions.is_empty());
        assert!(!world.status().controller_pause);
    }
}

#[test]
fn promote_full_skips_the_remaining_steps() {
    for replicas in [1, 3, 4, 10] {
        let (mut world, v1) = World::deployed(rollout(replicas, steps()));
        world.update_image("nginx:1.28");
        world.settle();
        let v2 = world.status().current_pod_hash.clone();
        world.rollout.status.as_mut().expect("status").promote_full = true;
        world.settle();
        let status = world.status();
        assert_eq!(status.stable_rs, v2);
        assert!(!status.promote_full);
        assert_eq!(status.current_step_index, Some(4));
        assert!(status.pause_conditions.is_empty());
        assert_eq!(world.rs(&v2).replicas, replicas);
        assert_eq!(world.rs(&v1).replicas, 0);
    }
}

#[test]
fn abort_from_the_plugin_goes_back_to_stable() {
    for replicas in [1, 3, 4, 10] {
        let (mut world, v1) = World::deployed(rollout(replicas, steps()));
        world.update_image("nginx:1.28");
        world.settle();
        let v2 = world.status().current_pod_hash.clone();
        world.rollout.status.as_mut().expect("status").abort = true;
        world.settle();
        assert_eq!(world.rs(&v2).replicas, 0);
        assert_eq!(world.rs(&v1).replicas, replicas);
        assert_eq!(world.status().phase, PHASE_DEGRADED);
        assert!(world.status().pause_conditions.is_empty());
        assert_eq!(world.status().stable_rs, v1);
        assert_eq!(world.status().canary.weights, None);
    }
}

#[test]
fn spec_paused_holds_the_step() {
    for replicas in [1, 3, 4, 10] {
        let (mut world, v1) = World::deployed(rollout(replicas, steps()));
        world.rollout.spec.paused = Some(true);
        world.update_image("nginx:1.28");
        world.settle();
        let v2 = world.status().current_pod_hash.clone();
        let first_move = calculate_replica_counts_for_canary(BasicCanaryInputs {
            spec_replicas: replicas,
            desired_weight: 20,
            fenceposts: resolve_fenceposts(None, None, replicas).unwrap(),
            canary: Some(ReplicaSetCount::default()),
            stable: Some(ReplicaSetCount {
                replicas,
                available: replicas,
            }),
            older_replicas: 0,
        });
        assert_eq!(
            world.rs(&v2).replicas,
            first_move.canary,
            "the new ReplicaSet starts at its step size"
        );
        assert_eq!(
            world.rs(&v1).replicas,
            replicas,
            "nothing else is scaled while paused"
        );
        assert_eq!(
            world.index(),
            Some(0),
            "no step completes while spec.paused"
        );
        assert_eq!(world.status().phase, PHASE_PAUSED);
        assert_eq!(world.status().message, "manually paused");
        assert!(world.condition(PAUSED).is_true());
        world.rollout.spec.paused = Some(false);
        world.settle();
        assert_eq!(world.index(), Some(1));
        assert_eq!(world.pause_reasons(), [PAUSE_REASON_CANARY_PAUSE_STEP]);
    }
}

#[test]
fn new_template_mid_rollout_restarts_and_drains_the_intermediate() {
    for replicas in [1, 3, 4, 10] {
        let (mut world, v1) = World::deployed(rollout(replicas, steps()));
        world.update_image("nginx:1.28");
        world.settle();
        let v2 = world.status().current_pod_hash.clone();
        world.promote();
        world.settle();
        assert_eq!(world.index(), Some(3));

        world.update_image("nginx:1.29");
        let first = world.plan();
        assert_eq!(first.status.current_step_index, Some(0));
        world.settle();
        let v3 = world.status().current_pod_hash.clone();
        assert_eq!(world.rs(&v2).replicas, 0, "intermediate drained");
        let surge = resolve_fenceposts(None, None, replicas).unwrap().max_surge;
        let expected = approximate_weighted_canary_stable_replica_counts(replicas, 20, 100, surge);
        assert_eq!(world.rs(&v3).replicas, expected.canary);
        assert_eq!(world.rs(&v1).replicas, expected.stable);
        assert_eq!(world.index(), Some(1));
        assert_eq!(world.status().stable_rs, v1);
    }
}

#[test]
fn back_to_the_stable_template_is_a_fast_rollback() {
    for replicas in [1, 3, 4, 10] {
        let (mut world, v1) = World::deployed(rollout(replicas, steps()));
        world.update_image("nginx:1.28");
        world.settle();
        let v2 = world.status().current_pod_hash.clone();
        world.update_image("nginx:1.27");
        let plans = world.settle();
        assert!(
            plans[0]
                .events
                .iter()
                .any(|event| event.reason == "SkipSteps")
        );
        assert_eq!(world.status().current_pod_hash, v1);
        assert_eq!(world.index(), Some(4));
        assert_eq!(world.rs(&v1).replicas, replicas);
        assert_eq!(world.rs(&v2).replicas, 0);
        assert_eq!(world.status().phase, PHASE_HEALTHY);
    }
}

#[test]
fn progress_deadline_marks_the_rollout_degraded() {
    for replicas in [1, 3, 4, 10] {
        let mut ro = rollout(replicas, steps());
        ro.spec.progress_deadline_seconds = Some(60);
        let (mut world, _) = World::deployed(ro);
        world.instant = false;
        world.update_image("nginx:1.28");
        world.settle();
        assert!(
            world
                .plan()
                .requeue_after
                .is_some_and(|after| after <= Duration::from_secs(61))
        );
        world.now = at(30);
        world.settle();
        assert_ne!(world.condition(PROGRESSING).reason, TIMED_OUT_REASON);
        world.now = at(61);
        world.settle();
        let progressing = world.condition(PROGRESSING);
        assert_eq!(progressing.reason, TIMED_OUT_REASON);
        assert_eq!(progressing.status, STATUS_FALSE);
        assert_eq!(world.status().phase, PHASE_DEGRADED);
        assert!(
            !world.status().abort,
            "no abort without progressDeadlineAbort"
        );
    }
}

#[test]
fn progress_deadline_abort_rolls_back() {
    for replicas in [1, 3, 4, 10] {
        let mut ro = rollout(replicas, steps());
        ro.spec.progress_deadline_seconds = Some(60);
        ro.spec.progress_deadline_abort = Some(true);
        let (mut world, v1) = World::deployed(ro);
        world.instant = false;
        world.update_image("nginx:1.28");
        world.settle();
        let v2 = world.status().current_pod_hash.clone();
        world.now = at(61);
        world.settle();
        assert!(world.status().abort);
        assert_eq!(world.condition(PROGRESSING).reason, ROLLOUT_ABORTED_REASON);
        assert_eq!(world.rs(&v2).replicas, 0);
        assert_eq!(world.rs(&v1).replicas, replicas);
    }
}

fn old_replica_set(
    name: &str,
    revision: i64,
    replicas: i32,
    deadline: Option<Timestamp>,
) -> ObservedReplicaSet {
    let mut annotations = BTreeMap::from([(REVISION_ANNOTATION.to_string(), revision.to_string())]);
    if let Some(deadline) = deadline {
        annotations.insert(
            SCALE_DOWN_DEADLINE_ANNOTATION_KEY.into(),
            deadline.to_string(),
        );
    }
    ObservedReplicaSet {
        name: name.into(),
        pod_template_hash: name.into(),
        replicas,
        current_replicas: replicas,
        ready_replicas: replicas,
        available_replicas: replicas,
        annotations,
        created: at(-1000 + revision),
        min_ready_seconds: 0,
        replica_failure: None,
    }
}

#[test]
fn scale_down_deadline_keeps_an_old_replica_set_until_it_passes() {
    let (mut world, _) = World::deployed(rollout(3, steps()));
    world
        .observed
        .replica_sets
        .push(old_replica_set("old", 0, 2, Some(at(100))));
    let plan = world.plan();
    assert!(plan.scale_replica_sets.is_empty());
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(100)));
    world.now = at(101);
    world.settle();
    let old = world.rs("old");
    assert_eq!(old.replicas, 0);
    assert!(
        !old.annotations
            .contains_key(SCALE_DOWN_DEADLINE_ANNOTATION_KEY)
    );
}

#[test]
fn revision_history_limit_deletes_the_oldest_empty_replica_sets() {
    let mut ro = rollout(3, steps());
    ro.spec.revision_history_limit = Some(1);
    let (mut world, _) = World::deployed(ro);
    for (name, revision) in [("r-a", 0), ("r-b", -2), ("r-c", -1)] {
        world
            .observed
            .replica_sets
            .push(old_replica_set(name, revision, 0, None));
    }
    let plan = world.plan();
    assert_eq!(plan.delete_replica_sets, ["r-b", "r-c"]);
}

/// The controller may die after acting and before writing status: planning again from the old
/// status must not create a second ReplicaSet or AnalysisRun, nor skip or repeat a step.
#[test]
fn restart_between_any_two_actions_resumes_from_status() {
    for replicas in [1, 3, 4, 10] {
        let (mut world, _) = World::deployed(rollout(replicas, analysis_steps()));
        world.update_image("nginx:1.28");
        for round in 0..40 {
            let plan = world.plan();
            // Crash: the actions happened, the status patch did not.
            world.apply_actions(&plan);
            let replay = world.plan();
            assert!(replay.create_replica_set.is_none(), "round {round}");
            assert!(replay.create_analysis_runs.is_empty(), "round {round}");
            assert!(
                replay.status.current_step_index >= plan.status.current_step_index,
                "round {round}: a step was repeated"
            );
            world.rollout.status = Some(replay.status.clone());
            world.apply_actions(&replay);
            if world.index() == Some(1) && world.observed.analysis_runs.len() == 1 {
                world.set_run_phase(AnalysisPhase::Successful, "");
            }
            if world.plan().is_noop() {
                break;
            }
        }
        assert_eq!(world.observed.analysis_runs.len(), 1, "replicas {replicas}");
        assert_eq!(world.index(), Some(3));
        assert_eq!(
            world.status().stable_rs,
            world.status().current_pod_hash,
            "replicas {replicas}"
        );
    }
}

#[test]
fn same_status_snapshot_gives_the_same_next_action() {
    let (mut world, _) = World::deployed(rollout(4, steps()));
    world.update_image("nginx:1.28");
    for _ in 0..10 {
        let snapshot = (world.rollout.clone(), world.observed.clone());
        let plan = world.step();
        let again = plan_again(&snapshot.0, &snapshot.1, world.now);
        assert_eq!(plan, again);
    }
}

fn plan_again(rollout: &Rollout, observed: &Observed, now: Timestamp) -> Plan {
    plan(rollout, observed, now)
}

#[test]
fn set_canary_scale_without_a_router_is_an_invalid_spec() {
    let scale = CanaryStep {
        set_canary_scale: Some(SetCanaryScale {
            replicas: Some(2),
            ..SetCanaryScale::default()
        }),
        ..CanaryStep::default()
    };
    let (mut world, v1) = World::deployed(rollout(3, steps()));
    world
        .rollout
        .spec
        .strategy
        .canary
        .as_mut()
        .expect("canary")
        .steps = Some(vec![CanaryStep::weight(20), scale]);
    world.update_image("nginx:1.28");
    let plan = world.step();
    assert!(plan.create_replica_set.is_none() && plan.scale_replica_sets.is_empty());
    let invalid = world.condition(INVALID_SPEC);
    assert!(
        invalid
            .message
            .contains("spec.strategy.canary.steps[1].setCanaryScale")
    );
    assert!(invalid.message.contains("trafficRouting"));
    assert_eq!(world.status().phase, PHASE_DEGRADED);
    assert_eq!(plan.events.len(), 1);
    assert_eq!(world.rs(&v1).replicas, 3, "nothing running is touched");
    assert!(
        world.plan().is_noop(),
        "the same invalid spec is reported once"
    );
}

/// Edits a valid Rollout into an invalid one.
type Breakage = fn(&mut Rollout);

#[test]
fn malformed_fields_name_the_field() {
    let cases: [(Breakage, &str); 9] = [
        (
            |ro| {
                let canary = ro.spec.strategy.canary.as_mut().expect("canary");
                canary.canary_service = Some("web".into());
                canary.stable_service = Some("web".into());
            },
            "spec.strategy.canary.stableService",
        ),
        (
            |ro| {
                ro.spec.strategy.canary.as_mut().expect("canary").max_surge =
                    Some(IntOrString::String("lots".into()))
            },
            "spec.strategy.canary.maxSurge",
        ),
        (
            |ro| {
                ro.spec.strategy.canary.as_mut().expect("canary").steps =
                    Some(vec![CanaryStep::weight(120)])
            },
            "spec.strategy.canary.steps[0].setWeight",
        ),
        (|ro| ro.spec.template = None, "spec.template"),
        // Hostile values: each once panicked or overflowed somewhere in planning.
        (
            |ro| {
                ro.spec.strategy.canary.as_mut().expect("canary").steps = Some(vec![CanaryStep {
                    pause: Some(RolloutPause {
                        duration: Some(IntOrString::String("100000000000000000000s".into())),
                    }),
                    ..CanaryStep::default()
                }])
            },
            "spec.strategy.canary.steps[0].pause.duration",
        ),
        (
            |ro| {
                ro.spec.strategy.canary.as_mut().expect("canary").steps =
                    Some(vec![CanaryStep::weight(-5)])
            },
            "spec.strategy.canary.steps[0].setWeight",
        ),
        (
            |ro| {
                ro.spec.strategy.canary.as_mut().expect("canary").max_surge =
                    Some(IntOrString::String("9223372036854775807%".into()))
            },
            "spec.strategy.canary.maxSurge",
        ),
        (|ro| ro.spec.replicas = Some(i32::MAX), "spec.replicas"),
        (
            |ro| ro.spec.progress_deadline_seconds = Some(i32::MAX),
            "spec.progressDeadlineSeconds",
        ),
    ];
    for (break_it, field) in cases {
        let mut ro = rollout(3, steps());
        break_it(&mut ro);
        let plan = plan(&ro, &Observed::default(), at(0));
        let invalid = plan.status.condition(INVALID_SPEC).expect("InvalidSpec");
        assert!(invalid.message.starts_with(field), "{}", invalid.message);
        assert!(plan.create_replica_set.is_none());
    }
}

#[test]
fn status_contract_for_argo_cd() {
    let (mut world, _) = World::deployed(rollout(3, steps()).with_generation(7));
    let json = serde_json::to_value(world.status()).expect("serialises");
    assert_eq!(json["observedGeneration"], "7");
    assert!(json["conditions"].is_array());
    world.update_image("nginx:1.28");
    world.settle();
    let json = serde_json::to_value(world.status()).expect("serialises");
    assert_eq!(json["observedGeneration"], "8");
    assert_eq!(
        json["pauseConditions"][0]["reason"],
        PAUSE_REASON_CANARY_PAUSE_STEP
    );
    assert!(json["pauseConditions"][0]["startTime"].is_string());
}

#[test]
fn strategies_not_planned_here_are_left_alone() {
    let blue_green = Rollout::test_blue_green(NAME);
    assert!(plan(&blue_green, &Observed::default(), at(0)).is_noop());
}

#[test]
fn runs_no_longer_current_are_terminated() {
    for replicas in [1, 3, 4, 10] {
        let (mut world, _) = World::deployed(rollout(replicas, analysis_steps()));
        world.update_image("nginx:1.28");
        world.settle();
        world.set_run_phase(AnalysisPhase::Running, "");
        let run = world.observed.analysis_runs[0].name.clone();
        assert!(world.plan().terminate_analysis_runs.is_empty());

        world.rollout.status.as_mut().expect("status").abort = true;
        let plan = world.step();
        assert_eq!(plan.terminate_analysis_runs, std::slice::from_ref(&run));
        world.settle();
        assert!(
            world.plan().terminate_analysis_runs.is_empty(),
            "a run already terminating is not terminated again"
        );

        // A new template while a run is in flight also stops it.
        let (mut world, _) = World::deployed(rollout(replicas, analysis_steps()));
        world.update_image("nginx:1.28");
        world.settle();
        world.set_run_phase(AnalysisPhase::Running, "");
        world.update_image("nginx:1.29");
        let plan = world.step();
        assert_eq!(plan.terminate_analysis_runs.len(), 1);
        assert_eq!(plan.status.current_step_index, Some(0));
    }
}

#[test]
fn a_pause_of_a_year_is_looked_at_hourly() {
    let year = vec![
        CanaryStep::weight(50),
        CanaryStep::pause_seconds(31_536_000),
    ];
    let (mut world, _) = World::deployed(rollout(4, year));
    world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(world.pause_reasons(), [PAUSE_REASON_CANARY_PAUSE_STEP]);
    assert_eq!(
        world.plan().requeue_after,
        Some(Duration::from_secs(31_536_000))
    );
    let (_, plan) = crate::planner::plan(&world.rollout, &world.observed, world.now);
    assert_eq!(plan.requeue_after, Some(crate::planner::MAX_REQUEUE));
}

#[test]
fn promote_ends_a_timed_pause_early() {
    let timed = vec![CanaryStep::weight(50), CanaryStep::pause_seconds(600)];
    let (mut world, _) = World::deployed(rollout(4, timed));
    world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(world.pause_reasons(), [PAUSE_REASON_CANARY_PAUSE_STEP]);
    assert!(world.condition(PAUSED).is_true());
    assert_eq!(world.condition(PROGRESSING).reason, ROLLOUT_PAUSED_REASON);
    assert_eq!(world.plan().requeue_after, Some(Duration::from_secs(600)));
    world.now = at(10);
    world.promote();
    world.settle();
    let v2 = world.status().current_pod_hash.clone();
    assert_eq!(world.status().stable_rs, v2);
    assert!(!world.condition(PAUSED).is_true());
}

#[test]
fn changed_steps_restart_from_the_first_step() {
    let (mut world, _) = World::deployed(rollout(4, steps()));
    world.update_image("nginx:1.28");
    world.settle();
    world.promote();
    world.settle();
    assert_eq!(world.index(), Some(3));
    world
        .rollout
        .spec
        .strategy
        .canary
        .as_mut()
        .expect("canary")
        .steps = Some(vec![
        CanaryStep::weight(10),
        CanaryStep::pause_indefinitely(),
    ]);
    let plan = world.step();
    assert_eq!(plan.status.current_step_index, Some(0));
    assert_eq!(
        plan.status.current_step_hash,
        steps_hash(&[CanaryStep::weight(10), CanaryStep::pause_indefinitely(),])
    );
    world.settle();
    assert_eq!(world.index(), Some(1));
}

#[test]
fn fixing_an_invalid_spec_clears_the_condition() {
    let (mut world, _) = World::deployed(rollout(3, steps()));
    let good_steps = world
        .rollout
        .spec
        .strategy
        .canary
        .as_ref()
        .expect("canary")
        .steps
        .clone();
    world
        .rollout
        .spec
        .strategy
        .canary
        .as_mut()
        .expect("canary")
        .steps = Some(vec![CanaryStep::default()]);
    world.step();
    assert!(world.status().condition(INVALID_SPEC).is_some());
    world
        .rollout
        .spec
        .strategy
        .canary
        .as_mut()
        .expect("canary")
        .steps = good_steps;
    world.settle();
    assert!(world.status().condition(INVALID_SPEC).is_none());
    assert_eq!(world.status().phase, PHASE_HEALTHY);
}

#[test]
fn steps_hash_is_stable_and_follows_the_steps() {
    assert_eq!(steps_hash(&steps()), steps_hash(&steps()));
    assert_ne!(steps_hash(&steps()), steps_hash(&steps()[..2]));
    assert_ne!(steps_hash(&[]), steps_hash(&steps()));
    assert_ne!(
        steps_hash(&[]),
        steps_hash(&[CanaryStep::pause_indefinitely()]),
        "an indefinite pause is a step too"
    );
}

#[test]
fn a_name_collision_salts_the_hash() {
    let mut world = World::new(rollout(3, steps()));
    let intended = world.plan().create_replica_set.expect("would create").name;
    let mut squatter = old_replica_set("squatter", 0, 0, None);
    squatter.name = intended.clone();
    world.observed.replica_sets.push(squatter);
    let plan = world.step();
    assert!(plan.create_replica_set.is_none());
    assert_eq!(plan.status.collision_count, Some(1));
    assert_eq!(plan.requeue_after, Some(Duration::ZERO));
    let next = world.step();
    let created = next.create_replica_set.expect("creates under a new name");
    assert_ne!(created.name, intended);
    assert_eq!(next.status.collision_count, Some(1));
    world.settle();
    assert_eq!(world.status().phase, PHASE_HEALTHY);
}

/// A small deterministic generator, so a failing sequence can be replayed from its seed.
struct Xorshift(u64);

impl Xorshift {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound
    }
}

/// Pods that exist in every ReplicaSet and those available, summed.
fn pod_totals(world: &World) -> (i32, i32) {
    let replicas = world
        .observed
        .replica_sets
        .iter()
        .map(|rs| rs.replicas)
        .sum();
    let available = world
        .observed
        .replica_sets
        .iter()
        .map(|rs| rs.available_replicas)
        .sum();
    (replicas, available)
}

/// Random people and random pods against the planner: every plan keeps maxSurge and
/// maxUnavailable, never creates anything twice, and once the people stop the rollout
/// finishes healthy on the last template.
#[test]
fn random_interference_keeps_the_invariants_and_converges() {
    let all_steps = vec![
        CanaryStep::weight(1),
        CanaryStep::pause_seconds(20),
        CanaryStep::weight(33),
        CanaryStep::analysis("success-rate"),
        CanaryStep::pause_indefinitely(),
        CanaryStep::weight(99),
    ];
    for seed in 1..=60u64 {
        let mut random = Xorshift(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let replicas = [1, 3, 4, 10][random.below(4) as usize];
        let fenceposts = resolve_fenceposts(None, None, replicas).unwrap();
        let (mut world, _) = World::deployed(rollout(replicas, all_steps.clone()));
        let images = ["nginx:1.27", "nginx:1.28", "nginx:1.29"];
        for round in 0..80 {
            match random.below(12) {
                0 => world.update_image(images[random.below(3) as usize]),
                1 => world.promote(),
                2 => world.rollout.status.as_mut().expect("status").abort = true,
                3 => world.rollout.status.as_mut().expect("status").abort = false,
                4 => world.rollout.status.as_mut().expect("status").promote_full = true,
                5 => {
                    let phases = [
                        AnalysisPhase::Running,
                        AnalysisPhase::Successful,
                        AnalysisPhase::Failed,
                        AnalysisPhase::Inconclusive,
                    ];
                    if world
                        .observed
                        .analysis_runs
                        .iter()
                        .any(|run| !run.terminating)
                    {
                        world.set_run_phase(phases[random.below(4) as usize], "");
                    }
                }
                6 => world.now += SignedDuration::from_secs(15),
                7 => world.instant = !world.instant,
                8 => {
                    for rs in &mut world.observed.replica_sets {
                        rs.available_replicas = rs.replicas;
                        rs.ready_replicas = rs.replicas;
                    }
                }
                _ => {}
            }
            let (total_before, available_before) = pod_totals(&world);
            let plan = world.plan();
            let scales_up = plan
                .create_replica_set
                .as_ref()
                .is_some_and(|rs| rs.replicas > 0)
                || plan
                    .scale_replica_sets
                    .iter()
                    .any(|scale| scale.to > scale.from);
            let scales_down = plan
                .scale_replica_sets
                .iter()
                .any(|scale| scale.to < scale.from);
            world.apply(&plan);
            let (total_after, available_after) = pod_totals(&world);
            let context = format!("seed {seed}, round {round}, replicas {replicas}");
            if scales_up {
                assert!(
                    total_after <= (replicas + fenceposts.max_surge).max(total_before),
                    "{context}: surge exceeded ({total_before} -> {total_after})"
                );
            }
            if scales_down && !world.instant {
                let floor = (replicas - fenceposts.max_unavailable).min(available_before);
                assert!(
                    available_after >= floor,
                    "{context}: availability {available_before} -> {available_after} below {floor}"
                );
            }
            let status = world.status();
            assert_eq!(
                status.observed_generation,
                world
                    .rollout
                    .metadata
                    .generation
                    .unwrap_or_default()
                    .to_string()
            );
            assert!(status.condition(AVAILABLE).is_some(), "{context}");
            for selector in &plan.service_selectors {
                assert!(
                    world.rs(&selector.pod_template_hash).available_replicas > 0,
                    "{context}: a service points at pods that are not available"
                );
            }
        }

        // People stop; pods come up; analyses pass; pauses end.
        world.instant = true;
        world.rollout.status.as_mut().expect("status").abort = false;
        for _ in 0..30 {
            for rs in &mut world.observed.replica_sets {
                rs.available_replicas = rs.replicas;
                rs.ready_replicas = rs.replicas;
            }
            for run in &mut world.observed.analysis_runs {
                if !run.terminating {
                    run.phase = AnalysisPhase::Successful;
                }
            }
            world.promote();
            world.now += SignedDuration::from_secs(60);
            world.settle();
        }
        let status = world.status();
        let context = format!("seed {seed}, replicas {replicas}");
        assert_eq!(
            status.stable_rs, status.current_pod_hash,
            "{context}: {status:#?}"
        );
        assert_eq!(status.phase, PHASE_HEALTHY, "{context}: {status:#?}");
        let current = world.rs(&status.current_pod_hash);
        assert_eq!(current.replicas, replicas, "{context}");
        let others: i32 = world
            .observed
            .replica_sets
            .iter()
            .filter(|rs| rs.pod_template_hash != status.current_pod_hash)
            .map(|rs| rs.replicas)
            .sum();
        assert_eq!(others, 0, "{context}: old pods left running");
    }
}

#[test]
fn status_shows_the_weight_the_pods_really_give() {
    let five_percent = vec![CanaryStep::weight(5), CanaryStep::pause_indefinitely()];
    let (mut world, _) = World::deployed(rollout(4, five_percent));
    world.update_image("nginx:1.28");
    world.settle();
    // One canary pod next to four stable ones: 5% asked, 20% given.
    assert_eq!(
        world.plan().canary_weight,
        CanaryWeight {
            desired: 5,
            actual: 20
        }
    );
    // The plan carries it (for the metrics); the status does not, as Argo's without a router.
    assert_eq!(world.status().canary.weights, None);
}

#[test]
fn canary_and_stable_metadata_follow_the_revisions() {
    let labels = |role: &str| rollouts_crds::rollout::PodTemplateMetadata {
        labels: Some(BTreeMap::from([("role".to_string(), role.to_string())])),
        annotations: None,
    };
    let (mut world, v1) = World::deployed(rollout(4, steps()).with_canary(|canary| {
        canary.canary_metadata = Some(labels("canary"));
        canary.stable_metadata = Some(labels("stable"));
    }));
    let metadata_of = |plan: &Plan, hash: &str| {
        plan.replica_set_metadata
            .iter()
            .find(|entry| entry.name == format!("{NAME}-{hash}"))
            .and_then(|entry| entry.metadata.clone())
    };
    assert_eq!(metadata_of(&world.plan(), &v1), Some(labels("stable")));
    world.update_image("nginx:1.28");
    world.settle();
    let v2 = world.status().current_pod_hash.clone();
    let plan = world.plan();
    assert_eq!(metadata_of(&plan, &v2), Some(labels("canary")));
    assert_eq!(metadata_of(&plan, &v1), Some(labels("stable")));
    world.rollout.status.as_mut().expect("status").promote_full = true;
    world.settle();
    let plan = world.plan();
    assert_eq!(world.status().stable_rs, v2);
    assert_eq!(metadata_of(&plan, &v2), Some(labels("stable")));
    assert_eq!(
        metadata_of(&plan, &v1),
        None,
        "old revisions carry nothing injected"
    );
}

/// Whatever the spec's numbers (within what the API server accepts), the status says and the
/// cluster shows, the planner answers with a plan and never panics.
mod properties {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use proptest::prelude::*;
    use rollouts_crds::rollout::{
        NginxTrafficRouting, PauseCondition, RolloutStatus, RolloutTrafficRouting, TrafficWeights,
        WeightDestination,
    };

    use super::*;
    use crate::planner::plan_once;

    /// Observed counts: small, or anything at all.
    fn count() -> impl Strategy<Value = i32> {
        prop_oneof![0..12i32, any::<i32>()]
    }

    /// Spec values: mostly within the bounds validation enforces (so the plan goes past
    /// validation), now and then anything at all.
    fn spec_count() -> impl Strategy<Value = i32> {
        prop_oneof![19 => 0..12i32, 1 => any::<i32>()]
    }

    fn time() -> impl Strategy<Value = Timestamp> {
        prop_oneof![
            (0..100_000i64).prop_map(at),
            any::<i64>().prop_map(|s| Timestamp::from_second(s).unwrap_or(Timestamp::MAX)),
            Just(Timestamp::MIN),
            Just(Timestamp::MAX),
        ]
    }

    fn step() -> impl Strategy<Value = CanaryStep> {
        prop_oneof![
            prop_oneof![19 => 0..=100i32, 1 => any::<i32>()].prop_map(|w| CanaryStep {
                set_weight: Some(w),
                ..CanaryStep::default()
            }),
            proptest::option::of(prop_oneof![
                9 => (0..100i32).prop_map(IntOrString::Int),
                1 => any::<i32>().prop_map(IntOrString::Int),
                9 => "[0-9]{1,3}(s|m|h)".prop_map(IntOrString::String),
                1 => "[0-9]{1,22}(s|m|h)".prop_map(IntOrString::String),
            ])
            .prop_map(|duration| CanaryStep {
                pause: Some(RolloutPause { duration }),
                ..CanaryStep::default()
            }),
            (any::<bool>(), spec_count()).prop_map(|(by_weight, value)| CanaryStep {
                set_canary_scale: Some(SetCanaryScale {
                    weight: by_weight.then_some(value),
                    replicas: (!by_weight).then_some(value),
                    ..SetCanaryScale::default()
                }),
                ..CanaryStep::default()
            }),
        ]
    }

    fn replica_set() -> impl Strategy<Value = ObservedReplicaSet> {
        (
            prop_oneof![Just("a"), Just("b"), Just("c")],
            (count(), count(), count(), count()),
            prop_oneof![
                any::<i64>().prop_map(|r| r.to_string()),
                Just("9223372036854775807".to_string()),
                "\\PC{0,4}",
            ],
            time(),
        )
            .prop_map(
                |(hash, (replicas, current, ready, available), revision, created)| {
                    ObservedReplicaSet {
                        name: format!("{NAME}-{hash}"),
                        pod_template_hash: hash.to_string(),
                        replicas,
                        current_replicas: current,
                        ready_replicas: ready,
                        available_replicas: available,
                        annotations: BTreeMap::from([(REVISION_ANNOTATION.to_string(), revision)]),
                        created,
                        min_ready_seconds: 0,
                        replica_failure: None,
                    }
                },
            )
    }

    fn status() -> impl Strategy<Value = RolloutStatus> {
        (
            proptest::option::of(any::<i32>()),
            proptest::option::of(any::<i32>()),
            proptest::option::of((count(), count())),
            proptest::option::of(time()),
            prop_oneof![Just(""), Just("a"), Just("b")],
            any::<(bool, bool, bool)>(),
        )
            .prop_map(
                |(step, collisions, weights, paused_at, stable, (abort, promote_full, pause))| {
                    let mut status = RolloutStatus {
                        current_step_index: step,
                        collision_count: collisions,
                        stable_rs: stable.to_string(),
                        abort,
                        promote_full,
                        controller_pause: pause,
                        ..RolloutStatus::default()
                    };
                    status.canary.weights = weights.map(|(canary, stable)| TrafficWeights {
                        canary: WeightDestination {
                            weight: canary,
                            ..WeightDestination::default()
                        },
                        stable: WeightDestination {
                            weight: stable,
                            ..WeightDestination::default()
                        },
                        ..TrafficWeights::default()
                    });
                    if let Some(start) = paused_at {
                        status.pause_conditions = vec![PauseCondition {
                            reason: "CanaryPauseStep".into(),
                            start_time: Time(start),
                        }];
                    }
                    status
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn any_canary_plans_without_panicking(
            replicas in proptest::option::of(spec_count()),
            surge in proptest::option::of(spec_count()),
            steps in proptest::collection::vec(step(), 0..5),
            routed in proptest::option::of(proptest::option::of(
                prop_oneof![9 => Just(100), 9 => Just(1000), 1 => any::<i32>()],
            )),
            min_pods in proptest::option::of(spec_count()),
            dynamic in any::<bool>(),
            status in status(),
            replica_sets in proptest::collection::vec(replica_set(), 0..4),
            now in time(),
        ) {
            let mut rollout = Rollout::test_canary(NAME, steps).with_canary(|c| {
                c.max_surge = surge.map(IntOrString::Int);
                c.min_pods_per_replica_set = min_pods;
                c.dynamic_stable_scale = routed.is_some().then_some(dynamic);
            });
            if let Some(max_traffic_weight) = routed {
                rollout = rollout.with_traffic_routing(RolloutTrafficRouting {
                    nginx: Some(NginxTrafficRouting {
                        stable_ingress: Some(NAME.into()),
                        ..NginxTrafficRouting::default()
                    }),
                    max_traffic_weight,
                    ..RolloutTrafficRouting::default()
                }).with_canary(|c| {
                    c.canary_service = Some(format!("{NAME}-canary"));
                    c.stable_service = Some(format!("{NAME}-stable"));
                });
            }
            rollout.spec.replicas = replicas;
            let rollout = rollout.with_status(status);
            let observed = Observed {
                replica_sets,
                ..Observed::default()
            };
            let _ = plan_once(&rollout, &observed, now);
        }

        #[test]
        fn any_blue_green_plans_without_panicking(
            replicas in proptest::option::of(spec_count()),
            preview in proptest::option::of(spec_count()),
            seconds in any::<(Option<i32>, Option<i32>, Option<i32>)>(),
            auto_promotion in proptest::option::of(any::<bool>()),
            status in status(),
            replica_sets in proptest::collection::vec(replica_set(), 0..4),
            now in time(),
        ) {
            let mut rollout = Rollout::test_blue_green(NAME).with_blue_green(|bg| {
                bg.preview_replica_count = preview;
                bg.auto_promotion_seconds = seconds.0;
                bg.scale_down_delay_seconds = seconds.1;
                bg.abort_scale_down_delay_seconds = seconds.2;
                bg.auto_promotion_enabled = auto_promotion;
            });
            rollout.spec.replicas = replicas;
            let rollout = rollout.with_status(status);
            let observed = Observed {
                replica_sets,
                ..Observed::default()
            };
            let _ = plan_once(&rollout, &observed, now);
        }
    }
}

/// A ReplicaSet that cannot create its pods (a quota) puts its `ReplicaFailure` on the
/// Rollout, as Argo copies it, and the condition goes once no ReplicaSet fails.
#[test]
fn a_replica_set_failure_is_carried_on_the_rollout_until_it_clears() {
    let (mut world, stable) = World::deployed(rollout(2, steps()));
    let name = world
        .observed
        .replica_sets
        .iter()
        .find(|rs| rs.pod_template_hash == stable)
        .map(|rs| rs.name.clone())
        .expect("the stable ReplicaSet");
    crate::planner::test_world::rs_named(&mut world.observed, &name).replica_failure =
        Some(crate::planner::ReplicaFailure {
            reason: "FailedCreate".into(),
            message: "pods \"web-x\" is forbidden: exceeded quota: compute".into(),
            since: Some(at(5)),
        });
    world.step();
    let condition = world
        .status()
        .condition(rollouts_crds::conditions::REPLICA_FAILURE)
        .cloned()
        .expect("ReplicaFailure on the Rollout");
    assert_eq!(condition.status, "True");
    assert_eq!(condition.reason, "FailedCreate");
    assert!(
        condition.message.contains("exceeded quota"),
        "{condition:?}"
    );
    assert_eq!(condition.last_transition_time.0, at(5));

    crate::planner::test_world::rs_named(&mut world.observed, &name).replica_failure = None;
    world.step();
    assert!(
        world
            .status()
            .condition(rollouts_crds::conditions::REPLICA_FAILURE)
            .is_none()
    );
}

#[test]
fn a_stale_deadline_on_the_stable_replica_set_is_cleared() {
    let (mut world, _) = World::deployed(rollout(3, steps()));
    let stable = world.status().stable_rs.clone();
    let stable_rs = world
        .observed
        .replica_sets
        .iter_mut()
        .find(|rs| rs.pod_template_hash == stable)
        .unwrap();
    stable_rs.annotations.insert(
        SCALE_DOWN_DEADLINE_ANNOTATION_KEY.into(),
        at(100).to_string(),
    );
    let name = stable_rs.name.clone();
    world.update_image("nginx:1.28");
    let plan = world.plan();
    assert_eq!(plan.clear_scale_down_deadlines, std::slice::from_ref(&name));
    world.settle();
    assert!(
        !world
            .rs(&stable)
            .annotations
            .contains_key(SCALE_DOWN_DEADLINE_ANNOTATION_KEY)
    );
}

/// Releases `image` at `seconds` and settles it to fully promoted (steps without pauses).
fn release(world: &mut World, image: &str, seconds: i64) {
    world.now = at(seconds);
    world.update_image(image);
    world.settle();
    assert_eq!(world.status().stable_rs, world.status().current_pod_hash);
}

#[test]
fn a_rollback_within_the_rollback_window_skips_the_steps() {
    for (window, skipped) in [(None, false), (Some(1), true), (Some(0), false)] {
        let mut ro = rollout(3, vec![CanaryStep::weight(50), CanaryStep::weight(80)]);
        ro.spec.rollback_window =
            window.map(|revisions| rollouts_crds::rollout::RollbackWindowSpec {
                revisions: Some(revisions),
            });
        let (mut world, first) = World::deployed(ro);
        release(&mut world, "nginx:1.28", 100);
        // Back to the first template: its ReplicaSet is older than the stable one, and no
        // revision was created between the two.
        world.now = at(200);
        world.update_image("nginx:1.27");
        let plan = world.step();
        assert_eq!(world.status().current_pod_hash, first, "{window:?}");
        let index = plan.status.current_step_index;
        assert_eq!(
            index == Some(2),
            skipped,
            "window {window:?}: index {index:?}"
        );
        let skip_event = plan
            .events
            .iter()
            .any(|event| event.message.contains("within RollbackWindow"));
        // As in Argo, the event is only for a ReplicaSet that still has pods.
        assert!(
            !skip_event,
            "the first ReplicaSet is scaled down: not active"
        );
        world.settle();
        assert_eq!(world.status().stable_rs, first);
    }
}

#[test]
fn a_rollback_beyond_the_rollback_window_runs_the_steps() {
    let mut ro = rollout(3, vec![CanaryStep::weight(50), CanaryStep::weight(80)]);
    ro.spec.rollback_window =
        Some(rollouts_crds::rollout::RollbackWindowSpec { revisions: Some(1) });
    let (mut world, first) = World::deployed(ro);
    release(&mut world, "nginx:1.28", 100);
    release(&mut world, "nginx:1.29", 200);
    // One revision (1.28) was created between the first and the stable one: outside a window
    // of 1.
    world.now = at(300);
    world.update_image("nginx:1.27");
    let plan = world.step();
    assert_eq!(world.status().current_pod_hash, first);
    assert_eq!(plan.status.current_step_index, Some(0));
}
