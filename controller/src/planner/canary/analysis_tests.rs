//! Background analysis (started without waiting for canary pods, as in Argo), the warm-up rule
//! for step analysis and the composition of each run from its templates, planned over the
//! shared fake cluster ([`crate::planner::test_world`]).

use rollouts_crds::rollout::{
    CanaryStep, ROLLOUT_TYPE_BACKGROUND, ROLLOUT_TYPE_STEP, RolloutAnalysisBackground,
};

use std::collections::{BTreeMap, BTreeSet};

use rollouts_crds::analysis::{AnalysisTemplateSpec, Metric};
use rollouts_crds::rollout::{AnalysisRunArgument, ArgumentValueFrom, ValueFromPodTemplateHash};

use super::*;
use crate::planner::test_world::{apply_writes, at};
use crate::planner::{ObservedTemplates, TemplateKey};

const NAME: &str = "web";

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
        let first = crate::planner::plan_once(&self.rollout, &self.observed, self.now);
        assert_eq!(
            first,
            crate::planner::plan_once(&self.rollout, &self.observed, self.now)
        );
        first
    }

    fn step(&mut self) -> Plan {
        let plan = self.plan();
        apply_writes(&mut self.observed, &plan, self.now, self.instant);
        crate::planner::test_world::apply_to_rollout(&mut self.rollout, &plan);
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
fn background_run_without_starting_step_starts_at_once_without_waiting_for_canary_pods() {
    let (mut world, _) = World::deployed(background_rollout(4, None));
    world.instant = false;
    world.update_image("nginx:1.28");
    let plan = world.step();
    assert_eq!(plan.create_analysis_runs.len(), 1, "{plan:#?}");
    assert_eq!(
        plan.create_analysis_runs[0].rollout_type,
        ROLLOUT_TYPE_BACKGROUND
    );
    world.settle();
    assert_eq!(world.status().current_step_index, Some(0));
    assert_eq!(world.background_runs().len(), 1, "one run, with cold pods");
    world.make_pods_available();
    world.settle();
    assert_eq!(world.status().current_step_index, Some(1));
    assert_eq!(world.background_runs().len(), 1, "the same run goes on");
}

/// Argo's `reconcileBackgroundAnalysisRun` does not look at the canary's pods: a canary whose
/// pods never become available is still analysed, and the failed run aborts the update back to
/// the stable.
#[test]
fn a_crash_looping_canary_is_analysed_and_aborted() {
    let (mut world, v1) = World::deployed(background_rollout(4, None));
    world.instant = false;
    world.update_image("nginx:1.28");
    world.settle();
    let v2 = world.status().current_pod_hash.clone();
    assert_eq!(world.rs(&v2).available_replicas, 0, "the canary pods crash");
    assert_eq!(world.status().current_step_index, Some(0));
    assert_eq!(world.background_runs().len(), 1);
    world.set_background_phase(
        AnalysisPhase::Failed,
        "metric \"error-rate\" assessed Failed",
    );
    world.settle();
    let status = world.status();
    assert!(status.abort);
    assert_eq!(status.phase, PHASE_DEGRADED);
    assert_eq!(status.stable_rs, v1);
    assert_eq!(
        world.rs(&v2).replicas,
        0,
        "the crashing canary is scaled down"
    );
    assert_eq!(world.rs(&v1).replicas, 4);
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
            .filter(|event| event.reason == format!("AnalysisRun{}", failure.as_str()))
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

/// A step naming a template that does not exist is a planned `InvalidSpec` naming the step and
/// the template, and nothing is created; once the template exists, the run is planned with its
/// spec composed (the `Latest` hash argument resolved) and the revision it analyses.
#[test]
fn a_missing_template_is_an_invalid_spec_and_a_found_one_is_composed_into_the_run() {
    let mut step = CanaryStep::analysis("error-rate");
    if let Some(analysis) = step.analysis.as_mut() {
        analysis.args = Some(vec![AnalysisRunArgument {
            name: "canary-hash".into(),
            value: None,
            value_from: Some(ArgumentValueFrom {
                pod_template_hash_value: Some(ValueFromPodTemplateHash::Latest),
                ..ArgumentValueFrom::default()
            }),
        }]);
    }
    let rollout = Rollout::test_canary(NAME, vec![CanaryStep::weight(25), step]).with_replicas(4);
    let (mut world, _) = World::deployed(rollout);
    let key = TemplateKey {
        cluster: false,
        name: "error-rate".into(),
    };
    world.observed.analysis_templates = Some(ObservedTemplates {
        found: BTreeMap::new(),
        missing: BTreeSet::from([key.clone()]),
    });
    world.update_image("nginx:1.28");
    world.settle();
    let invalid = world
        .status()
        .condition(INVALID_SPEC)
        .expect("InvalidSpec")
        .message
        .clone();
    assert!(
        invalid.starts_with(
            "spec.strategy.canary.steps[1].analysis: AnalysisTemplate \"error-rate\" not found"
        ),
        "{invalid}"
    );
    assert!(world.observed.analysis_runs.is_empty());

    let template = AnalysisTemplateSpec {
        metrics: vec![Metric {
            name: "errors".into(),
            ..Default::default()
        }],
        args: vec![AnalysisRunArgument {
            name: "canary-hash".into(),
            value: None,
            value_from: None,
        }],
        ..Default::default()
    };
    world.observed.analysis_templates = Some(ObservedTemplates {
        found: BTreeMap::from([(key, template)]),
        missing: BTreeSet::new(),
    });
    let plans = world.settle();
    assert!(world.status().condition(INVALID_SPEC).is_none());
    let run = plans
        .iter()
        .flat_map(|plan| &plan.create_analysis_runs)
        .next()
        .expect("the step's run is created");
    let spec = run.spec.as_ref().expect("composed");
    assert_eq!(spec.metrics[0].name, "errors");
    assert_eq!(
        spec.args[0].value.as_deref(),
        Some(run.pod_template_hash.as_str())
    );
    assert_eq!(run.revision.as_deref(), Some("2"));
}

/// A template measured by a provider this controller lacks (Datadog) is refused when the step
/// would create its run: an `InvalidSpec` naming the step, the template, the metric and the
/// provider, no run created and nothing aborted, instead of a run that errors at every
/// measurement and aborts the release.
#[test]
fn a_template_with_a_provider_we_lack_is_an_invalid_spec_naming_it() {
    let rollout = Rollout::test_canary(
        NAME,
        vec![
            CanaryStep::weight(25),
            CanaryStep::analysis("datadog-errors"),
        ],
    )
    .with_replicas(4);
    let (mut world, _) = World::deployed(rollout);
    let template = AnalysisTemplateSpec {
        metrics: vec![Metric {
            name: "errors".into(),
            provider: rollouts_crds::analysis::MetricProvider {
                datadog: Some(serde_json::json!({"query": "sum:errors{*}"})),
                ..Default::default()
            },
            ..Default::default()
        }],
        ..Default::default()
    };
    world.observed.analysis_templates = Some(ObservedTemplates {
        found: BTreeMap::from([(
            TemplateKey {
                cluster: false,
                name: "datadog-errors".into(),
            },
            template,
        )]),
        missing: BTreeSet::new(),
    });
    world.update_image("nginx:1.28");
    world.settle();
    let invalid = world
        .status()
        .condition(INVALID_SPEC)
        .expect("InvalidSpec")
        .message
        .clone();
    assert!(
        invalid.starts_with(
            "spec.strategy.canary.steps[1].analysis: AnalysisTemplate \"datadog-errors\": metric \"errors\": provider.datadog is not supported by this controller"
        ),
        "{invalid}"
    );
    assert!(world.observed.analysis_runs.is_empty());
    assert!(!world.status().abort, "nothing is aborted");
}
