//! Background analysis and the warm-up rule for step analysis, planned over a fake cluster
//! that applies plans as the act phase would (a smaller copy of `tests.rs`'s world that keeps
//! background runs apart from step runs).

use std::collections::BTreeMap;

use rollouts_crds::rollout::{
    CanaryStep, ROLLOUT_TYPE_BACKGROUND, ROLLOUT_TYPE_STEP, RolloutAnalysisBackground,
};

use super::*;
use crate::planner::REVISION_ANNOTATION;

const NAME: &str = "web";

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).expect("valid timestamp")
}

struct World {
    rollout: Rollout,
    observed: Observed,
    now: Timestamp,
    /// New pods become available at once.
    instant: bool,
}

impl World {
    fn deployed(rollout: Rollout) -> (Self, String) {
        let mut world = Self {
            rollout,
            observed: Observed::default(),
            now: at(0),
            instant: true,
        };
        world.settle();
        let stable = world.status().stable_rs.clone();
        (world, stable)
    }

    fn plan(&self) -> Plan {
        let first = crate::planner::plan(&self.rollout, &self.observed, self.now);
        assert_eq!(
            first,
            crate::planner::plan(&self.rollout, &self.observed, self.now)
        );
        first
    }

    fn step(&mut self) -> Plan {
        let plan = self.plan();
        if let Some(new) = &plan.create_replica_set {
            let available = if self.instant { new.replicas } else { 0 };
            self.observed.replica_sets.push(ObservedReplicaSet {
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
                created: self.now,
            });
        }
        for scale in &plan.scale_replica_sets {
            let instant = self.instant;
            let rs = self
                .observed
                .replica_sets
                .iter_mut()
                .find(|rs| rs.name == scale.name)
                .expect("ReplicaSet exists");
            rs.replicas = scale.to;
            rs.current_replicas = scale.to;
            if instant || scale.to < rs.available_replicas {
                rs.ready_replicas = scale.to;
                rs.available_replicas = scale.to;
            }
        }
        self.observed
            .replica_sets
            .retain(|rs| !plan.delete_replica_sets.contains(&rs.name));
        for run in &plan.create_analysis_runs {
            assert!(
                self.observed
                    .analysis_runs
                    .iter()
                    .all(|r| r.name != run.name),
                "AnalysisRun {} created twice",
                run.name
            );
            self.observed.analysis_runs.push(ObservedAnalysisRun {
                name: run.name.clone(),
                pod_template_hash: run.pod_template_hash.clone(),
                step_index: (run.rollout_type == ROLLOUT_TYPE_STEP).then_some(run.step_index),
                phase: AnalysisPhase::Pending,
                message: String::new(),
                terminating: false,
                created: self.now,
                rollout_type: run.rollout_type.clone(),
            });
        }
        for run in &mut self.observed.analysis_runs {
            if plan.terminate_analysis_runs.contains(&run.name) {
                run.terminating = true;
            }
        }
        self.observed
            .analysis_runs
            .retain(|run| !plan.delete_analysis_runs.contains(&run.name));
        self.rollout.status = Some(plan.status.clone());
        self.now = self
            .now
            .checked_add(SignedDuration::from_secs(1))
            .expect("time");
        plan
    }

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

    fn status(&self) -> &RolloutStatus {
        self.rollout.status.as_ref().expect("status written")
    }

    fn update_image(&mut self, image: &str) {
        let generation = self.rollout.metadata.generation.unwrap_or(1) + 1;
        self.rollout = self
            .rollout
            .clone()
            .with_image(image)
            .with_generation(generation);
    }

    fn promote(&mut self) {
        let status = self.rollout.status.as_mut().expect("status");
        status.pause_conditions.clear();
    }

    fn runs_of_type(&self, rollout_type: &str) -> Vec<&ObservedAnalysisRun> {
        self.observed
            .analysis_runs
            .iter()
            .filter(|run| run.rollout_type == rollout_type)
            .collect()
    }

    fn background_runs(&self) -> Vec<&ObservedAnalysisRun> {
        self.runs_of_type(ROLLOUT_TYPE_BACKGROUND)
    }

    fn set_background_phase(&mut self, phase: AnalysisPhase, message: &str) {
        let run = self
            .observed
            .analysis_runs
            .iter_mut()
            .rev()
            .find(|run| run.rollout_type == ROLLOUT_TYPE_BACKGROUND && !run.terminating)
            .expect("a background run exists");
        run.phase = phase;
        run.message = message.into();
    }

    fn rs(&self, hash: &str) -> &ObservedReplicaSet {
        self.observed
            .replica_sets
            .iter()
            .find(|rs| rs.pod_template_hash == hash)
            .expect("ReplicaSet with that hash exists")
    }

    fn make_pods_available(&mut self) {
        for rs in &mut self.observed.replica_sets {
            rs.ready_replicas = rs.replicas;
            rs.available_replicas = rs.replicas;
        }
    }
}

/// 25%, pause, 50%, pause; background analysis from `starting_step`.
fn background_rollout(replicas: i32, starting_step: Option<i32>) -> Rollout {
    let steps = vec![
        CanaryStep::weight(25),
        CanaryStep::pause_indefinitely(),
        CanaryStep::weight(50),
        CanaryStep::pause_indefinitely(),
    ];
    Rollout::test_canary(NAME, steps)
        .with_replicas(replicas)
        .with_canary(|canary| {
            canary.analysis = Some(RolloutAnalysisBackground {
                analysis: CanaryStep::analysis("error-rate")
                    .analysis
                    .expect("an analysis"),
                starting_step,
            })
        })
}

#[test]
fn background_run_starts_at_starting_step_once_the_canary_pods_are_available() {
    for replicas in [1, 4, 10] {
        let (mut world, _) = World::deployed(background_rollout(replicas, Some(1)));
        assert!(
            world.background_runs().is_empty(),
            "none on the initial deploy"
        );
        world.instant = false;
        world.update_image("nginx:1.28");
        world.settle();
        assert_eq!(world.status().current_step_index, Some(0));
        assert!(
            world.background_runs().is_empty(),
            "before startingStep, and with cold pods"
        );

        world.make_pods_available();
        world.settle();
        let v2 = world.status().current_pod_hash.clone();
        assert_eq!(world.status().current_step_index, Some(1));
        let runs = world.background_runs();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].name, format!("{NAME}-{v2}-2"));
        assert_eq!(runs[0].pod_template_hash, v2);
        assert_eq!(runs[0].step_index, None);
        let pointer = world
            .status()
            .canary
            .current_background_analysis_run_status
            .clone()
            .expect("status points at the background run");
        assert_eq!(pointer.name, runs[0].name);

        // It keeps running through the next steps: no second run, nothing terminated.
        world.set_background_phase(AnalysisPhase::Running, "");
        world.instant = true;
        world.promote();
        let plans = world.settle();
        assert_eq!(world.status().current_step_index, Some(3));
        assert_eq!(world.background_runs().len(), 1);
        assert!(
            plans
                .iter()
                .all(|plan| plan.terminate_analysis_runs.is_empty())
        );
    }
}

#[test]
fn background_run_without_starting_step_starts_once_the_first_canary_pods_are_available() {
    let (mut world, _) = World::deployed(background_rollout(4, None));
    world.instant = false;
    world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(world.status().current_step_index, Some(0));
    assert!(
        world.background_runs().is_empty(),
        "cold pods are not judged"
    );
    world.make_pods_available();
    let plan = world.step();
    assert_eq!(plan.create_analysis_runs.len(), 1, "{plan:#?}");
    assert_eq!(
        plan.create_analysis_runs[0].rollout_type,
        ROLLOUT_TYPE_BACKGROUND
    );
    world.settle();
    assert_eq!(world.status().current_step_index, Some(1));
    assert_eq!(world.background_runs().len(), 1);
}

#[test]
fn a_failed_background_run_aborts_mid_rollout() {
    for failure in [AnalysisPhase::Failed, AnalysisPhase::Error] {
        let (mut world, v1) = World::deployed(background_rollout(4, Some(1)));
        world.update_image("nginx:1.28");
        world.settle();
        let v2 = world.status().current_pod_hash.clone();
        world.set_background_phase(AnalysisPhase::Running, "");
        world.promote();
        world.settle();
        assert_eq!(world.status().current_step_index, Some(3));

        world.set_background_phase(failure, "metric \"error-rate\" assessed Failed");
        let plans = world.settle();
        let status = world.status();
        assert!(status.abort);
        assert_eq!(status.phase, PHASE_DEGRADED);
        let progressing = status.condition(PROGRESSING).expect("Progressing");
        assert_eq!(progressing.reason, ROLLOUT_ABORTED_REASON);
        assert!(
            progressing
                .message
                .contains("Background analysis phase error/failed: metric \"error-rate\""),
            "{progressing:?}"
        );
        assert_eq!(world.rs(&v2).replicas, 0, "rolled back");
        assert_eq!(world.rs(&v1).replicas, 4);
        assert_eq!(status.stable_rs, v1);
        assert!(
            status
                .canary
                .current_background_analysis_run_status
                .is_none()
        );
        let warnings = plans
            .iter()
            .flat_map(|plan| &plan.events)
            .filter(|event| event.reason == format!("AnalysisRun{}", phase_name(failure)))
            .count();
        assert_eq!(warnings, 1);
        assert_eq!(world.background_runs().len(), 1, "no run while aborted");

        // kubectl rollouts retry: the steps start over and a fresh run starts at step 1.
        world.rollout.status.as_mut().expect("status").abort = false;
        world.settle();
        assert_eq!(world.status().current_step_index, Some(1));
        let runs = world.background_runs();
        assert_eq!(runs.len(), 2, "a fresh run for the retry");
        assert!(runs[1].phase == AnalysisPhase::Pending && runs[0].name != runs[1].name);
    }
}

#[test]
fn an_inconclusive_background_run_pauses_and_a_resume_starts_a_new_one() {
    let (mut world, _) = World::deployed(background_rollout(4, Some(1)));
    world.update_image("nginx:1.28");
    world.settle();
    world.promote();
    world.settle();
    world.set_background_phase(AnalysisPhase::Inconclusive, "");
    world.settle();
    let reasons: Vec<_> = world
        .status()
        .pause_conditions
        .iter()
        .map(|c| c.reason.clone())
        .collect();
    assert!(reasons.contains(&PAUSE_REASON_INCONCLUSIVE_ANALYSIS.to_string()));
    assert_eq!(world.background_runs().len(), 1);

    world.promote();
    world.settle();
    assert_eq!(
        world.background_runs().len(),
        2,
        "a fresh run after the resume"
    );
}

#[test]
fn the_background_run_is_terminated_when_the_rollout_completes() {
    let (mut world, _) = World::deployed(background_rollout(4, Some(1)));
    world.update_image("nginx:1.28");
    world.settle();
    let v2 = world.status().current_pod_hash.clone();
    world.set_background_phase(AnalysisPhase::Running, "");
    let run = world.background_runs()[0].name.clone();
    for _ in 0..2 {
        world.promote();
        world.settle();
    }
    assert_eq!(world.status().stable_rs, v2);
    assert!(world.background_runs()[0].terminating, "{run} terminated");
    assert_eq!(world.background_runs().len(), 1);
    assert!(
        world
            .status()
            .canary
            .current_background_analysis_run_status
            .is_none()
    );
}

#[test]
fn promote_full_and_fast_rollback_skip_the_analysis() {
    // promote-full: the running background run is stopped and none is started.
    let (mut world, _) = World::deployed(background_rollout(4, Some(1)));
    world.update_image("nginx:1.28");
    world.settle();
    let v2 = world.status().current_pod_hash.clone();
    world.set_background_phase(AnalysisPhase::Running, "");
    world.rollout.status.as_mut().expect("status").promote_full = true;
    world.settle();
    assert_eq!(world.status().stable_rs, v2);
    assert_eq!(world.background_runs().len(), 1);
    assert!(world.background_runs()[0].terminating);

    // Fast rollback: back to the stable template mid-rollout creates no run at all.
    let steps = vec![
        CanaryStep::weight(25),
        CanaryStep::pause_indefinitely(),
        CanaryStep::analysis("error-rate"),
    ];
    let analysed = Rollout::test_canary(NAME, steps)
        .with_replicas(4)
        .with_canary(|canary| {
            canary.analysis = background_rollout(4, Some(1))
                .spec
                .strategy
                .canary
                .and_then(|c| c.analysis);
        });
    let (mut world, v1) = World::deployed(analysed);
    world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(world.background_runs().len(), 1);
    world.set_background_phase(AnalysisPhase::Running, "");
    world.update_image("nginx:1.27");
    let plans = world.settle();
    assert_eq!(world.status().stable_rs, v1);
    assert!(
        plans
            .iter()
            .all(|plan| plan.create_analysis_runs.is_empty())
    );
    assert!(world.background_runs()[0].terminating);
    assert!(world.runs_of_type(ROLLOUT_TYPE_STEP).is_empty());
}

#[test]
fn a_step_analysis_waits_for_available_canary_pods() {
    let steps = vec![
        CanaryStep::weight(50),
        CanaryStep::pause_indefinitely(),
        CanaryStep::analysis("error-rate"),
    ];
    let (mut world, _) = World::deployed(Rollout::test_canary(NAME, steps).with_replicas(4));
    world.update_image("nginx:1.28");
    world.settle();
    let v2 = world.status().current_pod_hash.clone();
    assert_eq!(world.status().current_step_index, Some(1));
    // The canary pods turn unready during the pause, then a person promotes.
    world.instant = false;
    for rs in &mut world.observed.replica_sets {
        if rs.pod_template_hash == v2 {
            rs.ready_replicas = 0;
            rs.available_replicas = 0;
        }
    }
    world.promote();
    world.settle();
    assert_eq!(world.status().current_step_index, Some(2));
    assert!(
        world.runs_of_type(ROLLOUT_TYPE_STEP).is_empty(),
        "no run judges cold pods"
    );
    world.make_pods_available();
    world.settle();
    assert_eq!(world.runs_of_type(ROLLOUT_TYPE_STEP).len(), 1);
}
