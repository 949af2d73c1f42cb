use std::collections::{BTreeMap, BTreeSet};

use rollouts_crds::rollout::{PodTemplateMetadata, RolloutAnalysisTemplate, RolloutCondition};

use super::*;
use crate::planner::test_world::{apply_writes, at};
use rollouts_crds::rollout::SCALE_DOWN_DEADLINE_ANNOTATION_KEY;

use crate::planner::plan_once as plan;

const NAME: &str = "web";
const ACTIVE: &str = "web-active";
const PREVIEW: &str = "web-preview";

/// A fake cluster: applies plans as the act phase would, keeps the Services' selectors, and
/// checks every plan is a pure function of its inputs. Pods become available at once unless
/// `instant` is off.
struct World {
    rollout: Rollout,
    observed: Observed,
    now: Timestamp,
    instant: bool,
    selectors: BTreeMap<String, String>,
}

impl World {
    fn new(rollout: Rollout) -> Self {
        Self {
            rollout,
            observed: Observed::default(),
            now: at(0),
            instant: true,
            selectors: BTreeMap::new(),
        }
    }

    fn plan(&self) -> Plan {
        let first = plan(&self.rollout, &self.observed, self.now);
        assert_eq!(first, plan(&self.rollout, &self.observed, self.now));
        first
    }

    fn apply(&mut self, plan: &Plan) {
        apply_writes(&mut self.observed, plan, self.now, self.instant);
        for selector in &plan.service_selectors {
            let serves = self.observed.replica_sets.iter().any(|rs| {
                rs.pod_template_hash == selector.pod_template_hash && rs.available_replicas > 0
            });
            // The preview selects the new revision at once, as in Argo; the active Service only
            // ever selects pods that serve.
            assert!(
                serves || selector.service == PREVIEW,
                "{selector:?} points at no available pod"
            );
            self.selectors
                .insert(selector.service.clone(), selector.pod_template_hash.clone());
        }
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
        for _ in 0..40 {
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

    fn condition(&self, type_: &str) -> &RolloutCondition {
        self.status().condition(type_).expect("condition present")
    }

    fn active(&self) -> &str {
        self.selectors.get(ACTIVE).map_or("", String::as_str)
    }

    fn preview(&self) -> &str {
        self.selectors.get(PREVIEW).map_or("", String::as_str)
    }

    fn pause_reasons(&self) -> Vec<&str> {
        self.status()
            .pause_conditions
            .iter()
            .map(|c| c.reason.as_str())
            .collect()
    }

    /// A new pod template (a new revision); bumps `metadata.generation`. Returns its hash.
    fn update_image(&mut self, image: &str) -> String {
        let generation = self.rollout.metadata.generation.unwrap_or(1) + 1;
        self.rollout = self
            .rollout
            .clone()
            .with_image(image)
            .with_generation(generation);
        self.plan().status.current_pod_hash
    }

    /// `kubectl rollouts promote`: clears the pause conditions.
    fn promote(&mut self) {
        let status = self.rollout.status.as_mut().expect("status");
        status.pause_conditions.clear();
    }

    /// `kubectl rollouts abort`.
    fn abort(&mut self) {
        self.rollout.status.as_mut().expect("status").abort = true;
    }

    fn run_of(&mut self, rollout_type: &str) -> &mut ObservedAnalysisRun {
        self.observed
            .analysis_runs
            .iter_mut()
            .rev()
            .find(|run| run.rollout_type == rollout_type && !run.terminating)
            .expect("a run of that type exists")
    }

    /// Deploys the first revision and settles; returns its hash.
    fn deployed(rollout: Rollout) -> (Self, String) {
        let mut world = Self::new(rollout);
        world.settle();
        let stable = world.status().stable_rs.clone();
        (world, stable)
    }

    /// The Argo CD health contract for a healthy blue-green rollout.
    fn assert_healthy_at(&self, hash: &str) {
        let status = self.status();
        assert_eq!(status.phase, PHASE_HEALTHY, "{status:#?}");
        assert_eq!(status.stable_rs, hash);
        assert_eq!(status.current_pod_hash, hash);
        assert_eq!(status.blue_green.active_selector, hash);
        assert_eq!(self.active(), hash);
        assert!(status.pause_conditions.is_empty());
        assert!(self.condition(HEALTHY).is_true());
        assert!(self.condition(COMPLETED).is_true());
        assert!(self.plan().is_noop(), "a healthy rollout plans nothing");
    }
}

fn rollout(replicas: i32) -> Rollout {
    Rollout::test_blue_green(NAME).with_replicas(replicas)
}

fn analysis(template: &str) -> RolloutAnalysis {
    RolloutAnalysis {
        templates: Some(vec![RolloutAnalysisTemplate {
            template_name: template.into(),
            cluster_scope: None,
        }]),
        ..RolloutAnalysis::default()
    }
}

#[test]
fn first_rollout_points_both_services_at_the_new_revision() {
    for replicas in [1, 3] {
        let mut world = World::new(rollout(replicas));
        let first = world.step();
        let created = first.create_replica_set.clone().expect("creates the RS");
        assert_eq!(created.replicas, replicas);
        assert_eq!(first.status.stable_rs, created.pod_template_hash);
        world.settle();
        let hash = created.pod_template_hash;
        world.assert_healthy_at(&hash);
        assert_eq!(world.preview(), hash);
        assert_eq!(world.status().blue_green.preview_selector, hash);
        assert_eq!(world.status().available_replicas, replicas);
        assert_eq!(world.status().observed_generation, "1");
        assert_eq!(
            world.status().selector,
            format!("app={NAME},rollouts-pod-template-hash={hash}")
        );
    }
}

#[test]
fn update_with_auto_promotion_switches_then_delays_the_old_scale_down() {
    let (mut world, v1) = World::deployed(rollout(3));
    let v2 = world.update_image("nginx:1.28");

    // The new revision comes up beside the active one; the switch waits for it.
    world.instant = false;
    world.step();
    assert_eq!(world.rs(&v2).replicas, 3);
    assert_eq!(
        world.active(),
        v1,
        "no switch before the new pods are available"
    );
    assert_eq!(world.status().phase, PHASE_PROGRESSING);
    for rs in &mut world.observed.replica_sets {
        rs.available_replicas = rs.replicas;
        rs.ready_replicas = rs.replicas;
    }
    world.instant = true;
    world.settle();

    assert_eq!(world.active(), v2);
    assert_eq!(world.preview(), v2);
    assert_eq!(world.status().stable_rs, v2);
    // The old revision keeps its pods for the default 30s.
    assert_eq!(world.rs(&v1).replicas, 3);
    let deadline = world
        .rs(&v1)
        .annotations
        .get(SCALE_DOWN_DEADLINE_ANNOTATION_KEY)
        .cloned()
        .expect("scale-down deadline written");
    assert_eq!(deadline, at(30).to_string());
    assert!(
        world
            .plan()
            .requeue_after
            .is_some_and(|after| after <= Duration::from_secs(30))
    );
    assert_eq!(world.status().phase, PHASE_HEALTHY);

    world.now = at(31);
    world.settle();
    assert_eq!(world.rs(&v1).replicas, 0);
    world.assert_healthy_at(&v2);
}

#[test]
fn manual_promotion_waits_for_a_person() {
    let (mut world, v1) =
        World::deployed(rollout(2).with_blue_green(|bg| bg.auto_promotion_enabled = Some(false)));
    let v2 = world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(world.pause_reasons(), [PAUSE_REASON_BLUE_GREEN_PAUSE]);
    assert!(world.status().controller_pause);
    assert_eq!(world.status().phase, PHASE_PAUSED);
    assert_eq!(world.active(), v1);
    assert_eq!(world.preview(), v2, "the preview serves the new revision");
    assert_eq!(world.condition(PROGRESSING).reason, ROLLOUT_PAUSED_REASON);
    assert!(world.plan().is_noop(), "a paused rollout stays put");
    world.now = at(3600);
    assert!(world.plan().status.pause_conditions.len() == 1);

    world.promote();
    world.settle();
    assert_eq!(world.active(), v2);
    assert!(!world.status().controller_pause);
    world.now = at(3700);
    world.settle();
    world.assert_healthy_at(&v2);
    assert_eq!(world.rs(&v1).replicas, 0);
}

#[test]
fn spec_paused_holds_the_switch() {
    let (mut world, v1) = World::deployed(rollout(2));
    world.rollout = world.rollout.clone().paused();
    let v2 = world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(world.active(), v1);
    assert_eq!(world.rs(&v2).replicas, 2);
    assert_eq!(world.status().phase, PHASE_PAUSED);
    world.rollout.spec.paused = Some(false);
    world.settle();
    assert_eq!(world.active(), v2);
}

#[test]
fn auto_promotion_seconds_promote_after_the_delay() {
    let (mut world, v1) =
        World::deployed(rollout(2).with_blue_green(|bg| bg.auto_promotion_seconds = Some(60)));
    let v2 = world.update_image("nginx:1.28");
    let plans = world.settle();
    assert_eq!(world.pause_reasons(), [PAUSE_REASON_BLUE_GREEN_PAUSE]);
    let requeue = plans
        .iter()
        .filter_map(|plan| plan.requeue_after)
        .min()
        .expect("asks to look again");
    assert!(requeue <= Duration::from_secs(61), "{requeue:?}");
    world.now = at(30);
    world.settle();
    assert_eq!(world.active(), v1, "not before autoPromotionSeconds");
    world.now = at(61);
    world.settle();
    assert_eq!(world.active(), v2);
    assert_eq!(world.status().stable_rs, v2);
    assert!(world.status().pause_conditions.is_empty());
}

#[test]
fn preview_replica_count_runs_small_then_scales_before_the_switch() {
    let (mut world, v1) = World::deployed(rollout(4).with_blue_green(|bg| {
        bg.preview_replica_count = Some(1);
        bg.auto_promotion_enabled = Some(false);
    }));
    let v2 = world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(world.rs(&v2).replicas, 1, "preview runs smaller");
    assert_eq!(world.rs(&v1).replicas, 4);
    assert_eq!(world.active(), v1);
    assert_eq!(world.pause_reasons(), [PAUSE_REASON_BLUE_GREEN_PAUSE]);
    assert!(!world.status().blue_green.scale_up_preview_check_point);

    world.promote();
    world.instant = false;
    world.step();
    assert!(world.status().blue_green.scale_up_preview_check_point);
    world.step();
    assert_eq!(
        world.rs(&v2).replicas,
        4,
        "scaled to full before the switch"
    );
    assert_eq!(
        world.active(),
        v1,
        "no switch until the full preview is available"
    );
    world.rs_named(&format!("{NAME}-{v2}")).available_replicas = 4;
    world.instant = true;
    world.settle();
    assert_eq!(world.active(), v2);
    assert_eq!(world.status().stable_rs, v2);
    assert!(!world.status().blue_green.scale_up_preview_check_point);
}

#[test]
fn abort_before_the_switch_keeps_active_and_scales_the_preview_down_after_the_delay() {
    let (mut world, v1) =
        World::deployed(rollout(2).with_blue_green(|bg| bg.auto_promotion_enabled = Some(false)));
    let v2 = world.update_image("nginx:1.28");
    world.settle();
    world.abort();
    world.settle();
    assert_eq!(world.active(), v1);
    assert_eq!(
        world.preview(),
        v2,
        "the preview stays on the aborted revision, as in Argo"
    );
    assert!(world.status().abort);
    assert_eq!(world.status().phase, PHASE_DEGRADED);
    assert_eq!(world.condition(PROGRESSING).reason, ROLLOUT_ABORTED_REASON);
    assert!(world.status().pause_conditions.is_empty());
    assert_eq!(
        world.rs(&v2).replicas,
        2,
        "kept for abortScaleDownDelaySeconds"
    );
    world.now = at(31);
    world.settle();
    assert_eq!(world.rs(&v2).replicas, 0);
    assert_eq!(world.rs(&v1).replicas, 2);
}

#[test]
fn abort_after_the_switch_points_active_back_at_stable() {
    let (mut world, v1) = World::deployed(rollout(2).with_blue_green(|bg| {
        bg.post_promotion_analysis = Some(analysis("smoke"));
    }));
    let v2 = world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(
        world.active(),
        v2,
        "switched, post-promotion analysis running"
    );
    assert_eq!(
        world.status().stable_rs,
        v1,
        "not stable until the analysis passes"
    );
    assert_eq!(world.status().phase, PHASE_PROGRESSING);
    assert_eq!(world.status().message, "waiting for analysis to complete");
    assert_eq!(world.rs(&v1).replicas, 2, "the old revision stays up");
    world.abort();
    let plan = world.step();
    assert_eq!(plan.status.blue_green.active_selector, v1);
    assert!(
        !plan.terminate_analysis_runs.is_empty(),
        "the run is stopped"
    );
    world.settle();
    assert_eq!(world.active(), v1);
    assert_eq!(world.status().stable_rs, v1);
}

#[test]
fn abort_scale_down_delay_zero_keeps_the_preview() {
    let (mut world, v1) = World::deployed(rollout(2).with_blue_green(|bg| {
        bg.auto_promotion_enabled = Some(false);
        bg.abort_scale_down_delay_seconds = Some(0);
    }));
    let v2 = world.update_image("nginx:1.28");
    world.settle();
    world.abort();
    world.now = at(3600);
    world.settle();
    assert_eq!(world.active(), v1);
    assert_eq!(world.rs(&v2).replicas, 2);
}

#[test]
fn rollback_within_the_scale_down_delay_is_instant() {
    let (mut world, v1) =
        World::deployed(rollout(3).with_blue_green(|bg| bg.auto_promotion_enabled = Some(false)));
    world.update_image("nginx:1.28");
    world.settle();
    world.promote();
    world.settle();
    let v2 = world.status().stable_rs.clone();
    assert_eq!(world.active(), v2);
    assert_eq!(world.rs(&v1).replicas, 3, "v1 inside its scale-down delay");

    // Back to v1 ten seconds later: no pause, no scale-up, straight switch.
    world.now = at(10);
    let back = world.update_image("nginx:1.27");
    assert_eq!(back, v1);
    let plans = world.settle();
    assert!(plans.iter().all(|plan| plan.create_replica_set.is_none()));
    assert!(
        plans
            .iter()
            .flat_map(|plan| &plan.scale_replica_sets)
            .all(|scale| scale.name != format!("{NAME}-{v1}")),
        "v1 needs no scale-up"
    );
    assert_eq!(world.active(), v1);
    assert!(
        !world
            .rs(&v1)
            .annotations
            .contains_key(SCALE_DOWN_DEADLINE_ANNOTATION_KEY)
    );
    assert_eq!(world.rs(&v2).replicas, 3, "v2 now waits out its own delay");
    assert_eq!(
        world.rs(&v1).revision(),
        Some(3),
        "v1 is the newest revision again"
    );

    // And forth again inside v2's delay: as instant, v2 is the older revision now.
    world.now = at(20);
    assert_eq!(world.update_image("nginx:1.28"), v2);
    let plans = world.settle();
    assert!(plans.iter().all(|plan| plan.create_replica_set.is_none()));
    assert!(world.pause_reasons().is_empty(), "no pause for a rollback");
    world.assert_healthy_at(&v2);
    assert_eq!(world.rs(&v2).revision(), Some(4));
    assert_eq!(world.rs(&v1).replicas, 3, "v1 waits out its delay again");

    world.now = at(30);
    assert_eq!(world.update_image("nginx:1.27"), v1);
    world.settle();
    world.now = at(100);
    world.settle();
    world.assert_healthy_at(&v1);
    assert_eq!(world.rs(&v2).replicas, 0);
}

#[test]
fn scale_down_delay_revision_limit_scales_older_revisions_at_once() {
    let (mut world, v1) = World::deployed(rollout(2).with_blue_green(|bg| {
        bg.scale_down_delay_revision_limit = Some(1);
    }));
    let v2 = world.update_image("nginx:1.28");
    world.settle();
    world.now = at(5);
    let v3 = world.update_image("nginx:1.29");
    world.settle();
    assert_eq!(world.active(), v3);
    assert_eq!(
        world.rs(&v2).replicas,
        2,
        "the newest old revision keeps its delay"
    );
    assert_eq!(world.rs(&v1).replicas, 0, "beyond the limit: scaled down");
}

#[test]
fn pre_promotion_analysis_gates_the_switch() {
    let blue_green = |bg: &mut BlueGreenStrategy| {
        bg.pre_promotion_analysis = Some(analysis("smoke"));
    };
    // Good: the switch happens once the run succeeds.
    let (mut world, v1) = World::deployed(rollout(2).with_blue_green(blue_green));
    let v2 = world.update_image("nginx:1.28");
    world.settle();
    let run = world.run_of(ROLLOUT_TYPE_PRE_PROMOTION);
    assert!(run.name.ends_with("-2-pre"), "{}", run.name);
    assert_eq!(world.active(), v1);
    assert_eq!(
        world
            .status()
            .blue_green
            .pre_promotion_analysis_run_status
            .as_ref()
            .map(|run| run.status.as_str()),
        Some("Pending")
    );
    world.run_of(ROLLOUT_TYPE_PRE_PROMOTION).phase = AnalysisPhase::Successful;
    world.settle();
    assert_eq!(world.active(), v2);
    assert_eq!(world.status().stable_rs, v2);
    assert_eq!(world.observed.analysis_runs.len(), 1, "one run, no repeat");

    // Bad: the update aborts, the active Service never moves.
    let (mut world, v1) = World::deployed(rollout(2).with_blue_green(blue_green));
    world.update_image("nginx:1.28");
    world.settle();
    let run = world.run_of(ROLLOUT_TYPE_PRE_PROMOTION);
    run.phase = AnalysisPhase::Failed;
    run.message = "error rate 0.2".into();
    let plans = world.settle();
    assert_eq!(world.active(), v1);
    assert!(world.status().abort);
    let progressing = world.condition(PROGRESSING);
    assert_eq!(progressing.reason, ROLLOUT_ABORTED_REASON);
    assert!(
        progressing
            .message
            .contains("Blue/green pre-promotion analysis phase error/failed: error rate 0.2"),
        "{}",
        progressing.message
    );
    assert!(
        plans
            .iter()
            .flat_map(|plan| &plan.events)
            .any(|event| event.reason == "AnalysisRunFailed")
    );
}

#[test]
fn inconclusive_pre_promotion_pauses_and_a_new_run_follows_the_resume() {
    let (mut world, v1) = World::deployed(rollout(2).with_blue_green(|bg| {
        bg.pre_promotion_analysis = Some(analysis("smoke"));
    }));
    world.update_image("nginx:1.28");
    world.settle();
    world.run_of(ROLLOUT_TYPE_PRE_PROMOTION).phase = AnalysisPhase::Inconclusive;
    world.settle();
    assert_eq!(world.pause_reasons(), [PAUSE_REASON_INCONCLUSIVE_ANALYSIS]);
    assert_eq!(world.active(), v1);
    world.promote();
    world.settle();
    assert_eq!(
        world.observed.analysis_runs.len(),
        2,
        "a new run after the resume"
    );
    assert_eq!(world.active(), v1);
}

#[test]
fn post_promotion_failure_switches_back() {
    let (mut world, v1) = World::deployed(rollout(2).with_blue_green(|bg| {
        bg.post_promotion_analysis = Some(analysis("smoke"));
    }));
    let v2 = world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(world.active(), v2);
    let run = world.run_of(ROLLOUT_TYPE_POST_PROMOTION);
    assert!(run.name.ends_with("-2-post"), "{}", run.name);
    // Without scaleDownDelaySeconds the old revision waits for the analysis.
    assert!(
        !world
            .rs(&v1)
            .annotations
            .contains_key(SCALE_DOWN_DEADLINE_ANNOTATION_KEY)
    );
    world.run_of(ROLLOUT_TYPE_POST_PROMOTION).phase = AnalysisPhase::Failed;
    world.settle();
    assert_eq!(world.active(), v1, "switched back to the stable revision");
    assert_eq!(world.status().stable_rs, v1);
    assert!(world.status().abort);
    assert_eq!(world.status().phase, PHASE_DEGRADED);

    // Post-promotion success promotes.
    let (mut world, _) = World::deployed(rollout(2).with_blue_green(|bg| {
        bg.post_promotion_analysis = Some(analysis("smoke"));
    }));
    let v2 = world.update_image("nginx:1.28");
    world.settle();
    world.run_of(ROLLOUT_TYPE_POST_PROMOTION).phase = AnalysisPhase::Successful;
    world.now = at(100);
    world.settle();
    world.now = at(200);
    world.settle();
    world.assert_healthy_at(&v2);
}

#[test]
fn retry_after_abort_runs_the_analysis_again() {
    let (mut world, _) = World::deployed(rollout(2).with_blue_green(|bg| {
        bg.pre_promotion_analysis = Some(analysis("smoke"));
    }));
    let v2 = world.update_image("nginx:1.28");
    world.settle();
    world.run_of(ROLLOUT_TYPE_PRE_PROMOTION).phase = AnalysisPhase::Failed;
    world.settle();
    assert!(world.status().abort);
    // `kubectl rollouts retry` clears status.abort.
    world.rollout.status.as_mut().expect("status").abort = false;
    world.settle();
    assert!(!world.status().abort);
    assert_eq!(world.observed.analysis_runs.len(), 2);
    world.run_of(ROLLOUT_TYPE_PRE_PROMOTION).phase = AnalysisPhase::Successful;
    world.settle();
    assert_eq!(world.active(), v2);
}

#[test]
fn promote_full_skips_pause_and_analysis() {
    let (mut world, _) = World::deployed(rollout(2).with_blue_green(|bg| {
        bg.auto_promotion_enabled = Some(false);
        bg.pre_promotion_analysis = Some(analysis("smoke"));
    }));
    let v2 = world.update_image("nginx:1.28");
    world.settle();
    world.rollout.status.as_mut().expect("status").promote_full = true;
    world.settle();
    assert_eq!(world.active(), v2);
    assert_eq!(world.status().stable_rs, v2);
    assert!(!world.status().promote_full);
    assert!(
        world
            .observed
            .analysis_runs
            .iter()
            .all(|run| run.terminating)
    );
}

#[test]
fn a_restart_at_any_point_takes_the_same_decisions() {
    // Replays the manual-promotion flow; at every reconcile, a fresh controller (same status,
    // same cluster) plans exactly what the running one plans, and repeating a plan's
    // actions before its status lands creates nothing twice.
    let (mut world, _) = World::deployed(rollout(3).with_blue_green(|bg| {
        bg.auto_promotion_enabled = Some(false);
        bg.pre_promotion_analysis = Some(analysis("smoke"));
        bg.preview_replica_count = Some(1);
    }));
    let v2 = world.update_image("nginx:1.28");
    let mut seen_analysis = false;
    for round in 0..60 {
        world.now = at(round * 5);
        let plan = world.plan();
        // Crash after acting, before the status patch: the next plan must not act twice.
        let status = world.rollout.status.clone();
        world.apply(&plan);
        world.rollout.status = status;
        let again = world.plan();
        assert!(again.create_replica_set.is_none(), "round {round}");
        for run in &again.create_analysis_runs {
            assert!(
                plan.create_analysis_runs
                    .iter()
                    .all(|first| first.rollout_type != run.rollout_type),
                "round {round}: {} created again",
                run.rollout_type
            );
        }
        world.apply(&again);
        if let Some(run) = world
            .observed
            .analysis_runs
            .iter_mut()
            .find(|run| run.phase == AnalysisPhase::Pending)
        {
            run.phase = AnalysisPhase::Successful;
            seen_analysis = true;
        }
        if world.status().pause_conditions.len() == 1 && world.status().controller_pause {
            world.promote();
        }
        if world.status().stable_rs == v2 && world.plan().is_noop() {
            break;
        }
    }
    assert!(seen_analysis);
    assert_eq!(world.active(), v2);
    assert_eq!(world.status().stable_rs, v2);
    assert_eq!(world.observed.analysis_runs.len(), 1);
    assert_eq!(
        world
            .observed
            .replica_sets
            .iter()
            .filter(|rs| rs.pod_template_hash == v2)
            .count(),
        1
    );
}

#[test]
fn missing_services_are_an_invalid_spec_until_they_exist() {
    let mut world = World::new(rollout(2));
    world.observed.missing_services = BTreeSet::from([PREVIEW.to_string()]);
    let plan = world.step();
    assert!(plan.create_replica_set.is_none(), "nothing is touched");
    let condition = world.condition(INVALID_SPEC);
    assert!(
        condition
            .message
            .contains("spec.strategy.blueGreen.previewService"),
        "{}",
        condition.message
    );
    assert!(
        condition
            .message
            .contains("services \"web-preview\" not found")
    );
    assert_eq!(world.status().phase, PHASE_DEGRADED);
    assert_eq!(plan.requeue_after, Some(MISSING_SERVICE_REQUEUE));

    world.observed.missing_services.clear();
    world.settle();
    assert!(world.status().condition(INVALID_SPEC).is_none());
    let hash = world.status().current_pod_hash.clone();
    world.assert_healthy_at(&hash);
}

#[test]
fn invalid_blue_green_specs_name_the_field() {
    let cases: Vec<(Rollout, &str)> = vec![
        (
            rollout(2).with_blue_green(|bg| bg.active_service = None),
            "spec.strategy.blueGreen.activeService",
        ),
        (
            rollout(2).with_blue_green(|bg| bg.preview_service = Some(ACTIVE.into())),
            "spec.strategy.blueGreen.activeService",
        ),
        (
            rollout(2).with_blue_green(|bg| bg.preview_replica_count = Some(3)),
            "spec.strategy.blueGreen.previewReplicaCount",
        ),
        (
            rollout(2)
                .with_blue_green(|bg| bg.pre_promotion_analysis = Some(RolloutAnalysis::default())),
            "spec.strategy.blueGreen.prePromotionAnalysis.templates",
        ),
    ];
    for (rollout, field) in cases {
        let plan = plan(&rollout, &Observed::default(), at(0));
        let condition = plan.status.condition(INVALID_SPEC).expect("InvalidSpec");
        assert!(
            condition.message.starts_with(field),
            "{}",
            condition.message
        );
        assert!(plan.create_replica_set.is_none());
    }
}

#[test]
fn active_and_preview_metadata_follow_the_revisions() {
    let labels = |role: &str| PodTemplateMetadata {
        labels: Some(BTreeMap::from([("role".to_string(), role.to_string())])),
        annotations: None,
    };
    let (mut world, v1) = World::deployed(rollout(1).with_blue_green(|bg| {
        bg.active_metadata = Some(labels("active"));
        bg.preview_metadata = Some(labels("preview"));
        bg.auto_promotion_enabled = Some(false);
    }));
    let metadata_of = |plan: &Plan, hash: &str| {
        plan.replica_set_metadata
            .iter()
            .find(|entry| entry.name == format!("{NAME}-{hash}"))
            .and_then(|entry| entry.metadata.clone())
    };
    assert_eq!(metadata_of(&world.plan(), &v1), Some(labels("active")));
    let v2 = world.update_image("nginx:1.28");
    world.settle();
    let plan = world.plan();
    assert_eq!(metadata_of(&plan, &v2), Some(labels("preview")));
    assert_eq!(metadata_of(&plan, &v1), Some(labels("active")));
    world.promote();
    world.settle();
    let plan = world.plan();
    assert_eq!(metadata_of(&plan, &v2), Some(labels("active")));
    assert_eq!(
        metadata_of(&plan, &v1),
        None,
        "old revisions carry nothing injected"
    );
}

#[test]
fn blue_green_status_carries_no_canary_steps() {
    let mut world = World::new(rollout(1));
    world.settle();
    assert_eq!(world.status().current_step_index, None);
    assert!(world.status().current_step_hash.is_empty());
}

#[test]
fn going_back_to_stable_before_the_switch_skips_everything() {
    let (mut world, v1) =
        World::deployed(rollout(2).with_blue_green(|bg| bg.auto_promotion_enabled = Some(false)));
    let v2 = world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(world.preview(), v2);
    world.update_image("nginx:1.27");
    world.settle();
    assert_eq!(world.preview(), v1, "preview back on the stable revision");
    assert!(world.status().pause_conditions.is_empty());
    world.now = at(31);
    world.settle();
    assert_eq!(
        world.rs(&v2).replicas,
        0,
        "the abandoned revision goes after its delay"
    );
    world.assert_healthy_at(&v1);
}

#[test]
fn progress_deadline_degrades_then_aborts_when_asked() {
    for abort in [false, true] {
        let (mut world, v1) = World::deployed(rollout(2));
        world.rollout.spec.progress_deadline_seconds = Some(60);
        world.rollout.spec.progress_deadline_abort = Some(abort);
        world.update_image("nginx:1.28");
        world.instant = false;
        world.settle();
        world.now = at(61);
        world.settle();
        world.now = at(62);
        world.settle();
        assert_eq!(world.status().phase, PHASE_DEGRADED, "abort {abort}");
        assert_eq!(world.active(), v1);
        let progressing = world.condition(PROGRESSING);
        if abort {
            assert!(world.status().abort);
            assert_eq!(progressing.reason, ROLLOUT_ABORTED_REASON);
        } else {
            assert!(!world.status().abort);
            assert_eq!(progressing.reason, TIMED_OUT_REASON);
        }
    }
}

#[test]
fn both_strategies_at_once_are_rejected() {
    let mut both = rollout(1);
    both.spec.strategy.canary = Some(Default::default());
    let plan = plan(&both, &Observed::default(), at(0));
    let condition = plan.status.condition(INVALID_SPEC).expect("InvalidSpec");
    assert!(
        condition.message.starts_with("spec.strategy:"),
        "{}",
        condition.message
    );
}

/// Argo's progress deadline stops only for a pause or a scale-down delay (`isIndefiniteStep`,
/// `isWaitingForReplicaSetScaleDown`): a pre-promotion analysis that never ends times the
/// update out, and aborts it with `progressDeadlineAbort`.
#[test]
fn the_progress_deadline_runs_during_pre_promotion_analysis() {
    for abort in [false, true] {
        let (mut world, v1) = World::deployed(rollout(2).with_blue_green(|bg| {
            bg.pre_promotion_analysis = Some(analysis("smoke"));
        }));
        world.rollout.spec.progress_deadline_seconds = Some(60);
        world.rollout.spec.progress_deadline_abort = Some(abort);
        world.update_image("nginx:1.28");
        world.settle();
        world.run_of(ROLLOUT_TYPE_PRE_PROMOTION).phase = AnalysisPhase::Running;
        world.settle();
        assert_eq!(world.status().phase, PHASE_PROGRESSING);
        world.now = at(61);
        world.settle();
        world.now = at(62);
        world.settle();
        assert_eq!(world.status().phase, PHASE_DEGRADED, "abort {abort}");
        assert_eq!(world.active(), v1);
        let progressing = world.condition(PROGRESSING);
        if abort {
            assert!(world.status().abort);
            assert_eq!(progressing.reason, ROLLOUT_ABORTED_REASON);
        } else {
            assert!(!world.status().abort);
            assert_eq!(progressing.reason, TIMED_OUT_REASON);
        }
    }
}

/// Argo's `reconcilePreviewService` points the preview Service at the new ReplicaSet right
/// after creating it, before any of its pods is ready; the active Service waits.
#[test]
fn the_preview_selects_the_new_revision_at_once() {
    let (mut world, v1) =
        World::deployed(rollout(2).with_blue_green(|bg| bg.auto_promotion_enabled = Some(false)));
    world.instant = false;
    let v2 = world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(world.rs(&v2).available_replicas, 0);
    assert_eq!(world.preview(), v2);
    assert_eq!(world.status().blue_green.preview_selector, v2);
    assert_eq!(world.active(), v1);
}

#[test]
fn a_rollback_within_the_rollback_window_needs_no_promotion() {
    for (window, instant) in [(None, false), (Some(2), true)] {
        let mut ro = rollout(3).with_blue_green(|bg| bg.auto_promotion_enabled = Some(false));
        ro.spec.rollback_window =
            window.map(|revisions| rollouts_crds::rollout::RollbackWindowSpec {
                revisions: Some(revisions),
            });
        let (mut world, v1) = World::deployed(ro);
        world.now = at(10);
        world.update_image("nginx:1.28");
        world.settle();
        world.promote();
        world.settle();
        // Past v1's scale-down delay: only the window can make going back to it instant.
        world.now = at(3600);
        world.settle();
        assert_eq!(world.rs(&v1).replicas, 0);
        assert_eq!(world.update_image("nginx:1.27"), v1);
        world.settle();
        if instant {
            assert!(
                world.pause_reasons().is_empty(),
                "no pause within the window"
            );
            world.assert_healthy_at(&v1);
        } else {
            assert!(!world.pause_reasons().is_empty(), "waits for promotion");
            assert_ne!(world.active(), v1);
        }
    }
}
