use std::collections::BTreeSet;

use rollouts_crds::conditions::*;
use rollouts_crds::rollout::{
    CanaryStep, HeaderRoutingMatch, IstioDestinationRule, IstioTrafficRouting, IstioVirtualService,
    ManagedRoute, NginxTrafficRouting, Rollout, RolloutTrafficRouting,
    SCALE_DOWN_DEADLINE_ANNOTATION_KEY, SetCanaryScale, SetHeaderRoute, SetMirrorRoute,
    StringMatch,
};

use super::*;
use crate::planner::replicas::traffic_weight_to_replicas;
use crate::planner::test_world::{apply_writes, at};
use crate::planner::{Observed, plan_once as planner_plan};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

const NAME: &str = "web";

/// How the fake router answers `verify_weight`.
#[derive(Clone, Copy, PartialEq)]
enum Verify {
    /// The router cannot tell (`None`).
    Unknown,
    /// The router reports whether it holds the weight status records.
    Honest,
    /// The router has not taken the weight yet (`Some(false)`).
    Lagging,
}

/// The router objects, as the fake act phase leaves them.
#[derive(Default)]
struct Router {
    weight: i32,
    routes: BTreeSet<String>,
    /// Every weight written, in order.
    history: Vec<i32>,
}

/// A fake cluster and router: applies plans the way the act phase would, pods available at once
/// unless `instant` is off, and checks after every plan that traffic only reaches available pods.
struct World {
    rollout: Rollout,
    observed: Observed,
    router: Router,
    now: Timestamp,
    instant: bool,
    verify: Verify,
}

impl World {
    fn new(rollout: Rollout) -> Self {
        Self {
            rollout,
            observed: Observed::default(),
            router: Router::default(),
            now: at(0),
            instant: true,
            verify: Verify::Unknown,
        }
    }

    fn observe_router(&mut self) {
        let recorded = self
            .rollout
            .status
            .as_ref()
            .and_then(|status| status.canary.weights.as_ref())
            .map(|weights| weights.canary.weight);
        self.observed.traffic_weight_verified = match (self.verify, recorded) {
            (_, None) | (Verify::Unknown, _) => None,
            (Verify::Honest, Some(weight)) => Some(weight == self.router.weight),
            (Verify::Lagging, Some(_)) => Some(false),
        };
    }

    fn plan(&mut self) -> Plan {
        self.observe_router();
        let first = super::super::plan(&self.rollout, &self.observed, self.now);
        assert_eq!(
            first,
            super::super::plan(&self.rollout, &self.observed, self.now)
        );
        first
    }

    fn step(&mut self) -> Plan {
        let plan = self.plan();
        self.apply(&plan);
        plan
    }

    fn apply(&mut self, plan: &Plan) {
        apply_writes(&mut self.observed, plan, self.now, self.instant);
        if let Some(traffic) = &plan.traffic {
            self.apply_traffic(traffic);
        }
        crate::planner::test_world::apply_to_rollout(&mut self.rollout, plan);
        self.check_traffic_on_available_pods();
    }

    /// The router calls, in the order `TrafficPlan` documents.
    fn apply_traffic(&mut self, traffic: &TrafficPlan) {
        let router = &mut self.router;
        if traffic.remove_managed_routes {
            router.routes.clear();
        }
        if let Some(route) = &traffic.set_header_route {
            let name = route.name.clone().expect("named route");
            match route.match_ {
                Some(_) => router.routes.insert(name),
                None => router.routes.remove(&name),
            };
        }
        if let Some(route) = &traffic.set_mirror_route {
            match route.match_ {
                Some(_) => router.routes.insert(route.name.clone()),
                None => router.routes.remove(&route.name),
            };
        }
        if router.history.last() != Some(&traffic.desired_weight) {
            router.history.push(traffic.desired_weight);
        }
        if self.verify != Verify::Lagging {
            router.weight = traffic.desired_weight;
        }
    }

    /// Invariant 3: whatever weight the router holds, the canary has the available pods for it
    /// and the stable for the rest.
    fn check_traffic_on_available_pods(&self) {
        let status = self.status();
        let Some(weights) = status.canary.weights.as_ref() else {
            return;
        };
        let spec = self.rollout.spec.effective_replicas();
        let max = self
            .rollout
            .canary()
            .and_then(|canary| canary.traffic_routing.as_ref())
            .and_then(|routing| routing.max_traffic_weight)
            .unwrap_or(100);
        let weight = self.router.weight;
        if weight > 0 && weights.canary.pod_template_hash != status.stable_rs {
            let canary = self.rs(&weights.canary.pod_template_hash);
            assert!(
                canary.available_replicas >= traffic_weight_to_replicas(spec, weight, max)
                    || self.uses_set_canary_scale(),
                "weight {weight} on {} available canary pods",
                canary.available_replicas
            );
        }
        if weight < max && !weights.stable.pod_template_hash.is_empty() {
            let stable = self.rs(&weights.stable.pod_template_hash);
            assert!(
                stable.available_replicas >= (max - weight) * spec / max,
                "stable weight {} on {} available stable pods",
                max - weight,
                stable.available_replicas
            );
        }
    }

    fn uses_set_canary_scale(&self) -> bool {
        self.rollout
            .canary()
            .is_some_and(|canary| canary.steps().iter().any(|s| s.set_canary_scale.is_some()))
    }

    /// Plans and applies until a plan changes nothing, letting pause deadlines pass.
    fn settle(&mut self) -> Vec<Plan> {
        let mut plans = Vec::new();
        for _ in 0..80 {
            let plan = self.step();
            let done = plan.is_noop();
            plans.push(plan);
            if done {
                return plans;
            }
        }
        panic!("no steady state; last plan: {:#?}", plans.last());
    }

    /// Lets `seconds` pass, then settles.
    fn wait(&mut self, seconds: i64) -> Vec<Plan> {
        self.now = self
            .now
            .checked_add(SignedDuration::from_secs(seconds))
            .expect("time moves on");
        self.settle()
    }

    fn rs(&self, hash: &str) -> &ObservedReplicaSet {
        self.observed
            .replica_sets
            .iter()
            .find(|rs| rs.pod_template_hash == hash)
            .expect("ReplicaSet with that hash exists")
    }

    fn rs_mut(&mut self, hash: &str) -> &mut ObservedReplicaSet {
        self.observed
            .replica_sets
            .iter_mut()
            .find(|rs| rs.pod_template_hash == hash)
            .expect("ReplicaSet with that hash exists")
    }

    fn make_available(&mut self, hash: &str, available: i32) {
        let rs = self.rs_mut(hash);
        rs.available_replicas = available;
        rs.ready_replicas = available;
    }

    fn status(&self) -> &RolloutStatus {
        self.rollout.status.as_ref().expect("status written")
    }

    fn status_mut(&mut self) -> &mut RolloutStatus {
        self.rollout.status.as_mut().expect("status written")
    }

    fn index(&self) -> Option<i32> {
        self.status().current_step_index
    }

    fn recorded_weight(&self) -> i32 {
        self.status()
            .canary
            .weights
            .as_ref()
            .expect("weights recorded")
            .canary
            .weight
    }

    fn update_image(&mut self, image: &str) -> String {
        let generation = self.rollout.metadata.generation.unwrap_or(1) + 1;
        self.rollout = self
            .rollout
            .clone()
            .with_image(image)
            .with_generation(generation);
        self.plan().status.current_pod_hash
    }

    fn promote(&mut self) {
        self.status_mut().pause_conditions.clear();
    }

    /// Deploys the first revision and settles; returns its hash.
    fn deployed(rollout: Rollout) -> (Self, String) {
        let mut world = Self::new(rollout);
        world.settle();
        let stable = world.status().stable_rs.clone();
        (world, stable)
    }
}

fn routing() -> RolloutTrafficRouting {
    RolloutTrafficRouting {
        nginx: Some(NginxTrafficRouting {
            stable_ingress: Some(NAME.into()),
            ..NginxTrafficRouting::default()
        }),
        managed_routes: Some(vec![
            ManagedRoute {
                name: "header".into(),
            },
            ManagedRoute {
                name: "mirror".into(),
            },
        ]),
        ..RolloutTrafficRouting::default()
    }
}

fn routed(replicas: i32, steps: Vec<CanaryStep>) -> Rollout {
    Rollout::test_canary(NAME, steps)
        .with_replicas(replicas)
        .with_traffic_routing(routing())
}

fn weight_steps(weights: &[i32]) -> Vec<CanaryStep> {
    weights
        .iter()
        .flat_map(|weight| {
            [
                CanaryStep::weight(*weight),
                CanaryStep::pause_indefinitely(),
            ]
        })
        .collect()
}

fn header_step(with_match: bool) -> CanaryStep {
    CanaryStep {
        set_header_route: Some(SetHeaderRoute {
            name: Some("header".into()),
            match_: with_match.then(|| {
                vec![HeaderRoutingMatch {
                    header_name: "x-canary".into(),
                    header_value: StringMatch {
                        exact: Some("yes".into()),
                        ..StringMatch::default()
                    },
                }]
            }),
        }),
        ..CanaryStep::default()
    }
}

fn mirror_step(with_match: bool) -> CanaryStep {
    CanaryStep {
        set_mirror_route: Some(SetMirrorRoute {
            name: "mirror".into(),
            match_: with_match.then(|| vec![Default::default()]),
            percentage: Some(50),
        }),
        ..CanaryStep::default()
    }
}

fn canary_scale(scale: SetCanaryScale) -> CanaryStep {
    CanaryStep {
        set_canary_scale: Some(scale),
        ..CanaryStep::default()
    }
}

#[test]
fn initial_deploy_is_stable_at_once_with_weight_zero() {
    for replicas in [1, 3, 4, 10] {
        let (world, stable) = World::deployed(routed(replicas, weight_steps(&[5])));
        assert_eq!(world.rs(&stable).replicas, replicas);
        assert_eq!(world.router.weight, 0);
        assert_eq!(world.status().phase, PHASE_HEALTHY);
        let weights = world.status().canary.weights.clone().expect("weights");
        assert_eq!(weights.stable.weight, 100);
        assert_eq!(weights.stable.service_name, "web-stable");
        assert_eq!(weights.canary.service_name, "web-canary");
    }
}

#[test]
fn weights_0_5_33_100_size_the_canary_and_keep_the_stable_full() {
    for replicas in [1, 3, 4, 10] {
        let (mut world, stable) = World::deployed(routed(replicas, weight_steps(&[0, 5, 33, 100])));
        let canary = world.update_image("nginx:1.28");
        for (pause_index, weight) in [(1, 0), (3, 5), (5, 33), (7, 100)] {
            world.settle();
            assert_eq!(world.index(), Some(pause_index), "{replicas} replicas");
            assert_eq!(world.router.weight, weight, "{replicas} replicas");
            assert_eq!(world.recorded_weight(), weight);
            let expected = traffic_weight_to_replicas(replicas, weight, 100);
            assert_eq!(
                world.rs(&canary).replicas,
                expected,
                "{replicas} at {weight}"
            );
            assert_eq!(world.rs(&stable).replicas, replicas, "stable stays full");
            let plan = world.plan();
            let traffic = plan.traffic.expect("router plan");
            assert_eq!(traffic.desired_weight, weight);
            assert_eq!(traffic.max_traffic_weight, 100);
            assert_eq!(traffic.canary_hash, canary);
            assert_eq!(traffic.stable_hash, stable);
            assert_eq!(plan.canary_weight.desired, weight);
            world.promote();
        }
        world.settle();
        let status = world.status().clone();
        assert_eq!(status.stable_rs, canary, "promoted after the last step");
        assert_eq!(
            world.router.weight, 0,
            "weight back to 0 once stable is promoted"
        );
        assert_eq!(world.router.history.last(), Some(&0));
        assert_eq!(
            world.rs(&stable).replicas,
            replicas,
            "the previous stable waits for scaleDownDelaySeconds"
        );
        assert!(
            world
                .rs(&stable)
                .annotations
                .contains_key(SCALE_DOWN_DEADLINE_ANNOTATION_KEY)
        );
        world.wait(31);
        assert_eq!(world.rs(&stable).replicas, 0);
        assert_eq!(world.status().phase, PHASE_HEALTHY, "{replicas} replicas");
    }
}

#[test]
fn the_weight_is_raised_only_once_the_canary_pods_are_available() {
    let (mut world, _) = World::deployed(routed(10, weight_steps(&[10, 33])));
    world.instant = false;
    let canary = world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(world.rs(&canary).replicas, 1);
    assert_eq!(world.router.weight, 0, "no canary pod is available yet");
    world.make_available(&canary, 1);
    world.settle();
    assert_eq!(world.router.weight, 10);
    assert_eq!(world.index(), Some(1));
    world.promote();
    world.settle();
    assert_eq!(world.rs(&canary).replicas, 4);
    assert_eq!(world.router.weight, 10, "waits for the pods of 33%");
    world.make_available(&canary, 3);
    world.settle();
    assert_eq!(world.router.weight, 10, "three of four pods are not enough");
    assert_eq!(world.index(), Some(2));
    world.make_available(&canary, 4);
    world.settle();
    assert_eq!(world.router.weight, 33);
    assert_eq!(world.index(), Some(3));
    assert_eq!(world.router.history, vec![0, 10, 33]);
}

#[test]
fn a_set_weight_step_completes_only_once_its_weight_is_verified() {
    let (mut world, _) = World::deployed(routed(4, weight_steps(&[25])));
    world.verify = Verify::Lagging;
    world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(world.recorded_weight(), 25, "the weight was sent");
    assert_eq!(
        world.index(),
        Some(0),
        "but the router does not hold it yet"
    );
    let plan = world.plan();
    assert_eq!(plan.requeue_after, Some(VERIFY_RETRY_INTERVAL));
    assert_eq!(
        plan.status.canary.weights.as_ref().and_then(|w| w.verified),
        Some(false)
    );
    world.verify = Verify::Honest;
    world.router.weight = 25;
    world.settle();
    assert_eq!(world.index(), Some(1));
    assert_eq!(
        world
            .status()
            .canary
            .weights
            .as_ref()
            .and_then(|w| w.verified),
        Some(true)
    );
}

#[test]
fn the_stable_is_promoted_only_once_full_weight_is_verified() {
    let (mut world, stable) = World::deployed(routed(3, vec![CanaryStep::weight(50)]));
    world.verify = Verify::Honest;
    let canary = world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(world.status().stable_rs, canary);
    world.update_image("nginx:1.29");
    world.step();
    while world.index() != Some(1) {
        world.step();
    }
    world.verify = Verify::Lagging;
    let mut promoted_early = false;
    for _ in 0..20 {
        world.step();
        promoted_early |= world.status().stable_rs != canary;
    }
    assert!(!promoted_early, "not promoted while the router lags");
    assert_eq!(world.recorded_weight(), 100);
    world.verify = Verify::Honest;
    world.router.weight = 100;
    world.settle();
    assert_ne!(world.status().stable_rs, canary);
    assert_ne!(world.status().stable_rs, stable);
}

#[test]
fn abort_sets_the_weight_to_zero_before_scaling_the_canary_down() {
    for replicas in [1, 3, 4, 10] {
        let steps = vec![
            CanaryStep::weight(33),
            header_step(true),
            mirror_step(true),
            CanaryStep::pause_indefinitely(),
        ];
        let (mut world, stable) = World::deployed(routed(replicas, steps));
        let canary = world.update_image("nginx:1.28");
        world.settle();
        assert_eq!(world.router.weight, 33);
        assert_eq!(world.router.routes.len(), 2);
        let canary_pods = world.rs(&canary).replicas;
        world.status_mut().abort = true;
        let first = world.step();
        let traffic = first.traffic.clone().expect("router plan");
        assert_eq!(traffic.desired_weight, 0);
        assert!(traffic.remove_managed_routes);
        assert!(traffic.set_header_route.is_none() && traffic.set_mirror_route.is_none());
        assert!(
            first
                .scale_replica_sets
                .iter()
                .all(|s| s.name != world.rs(&canary).name),
            "the canary keeps its pods while the weight moves"
        );
        assert_eq!(world.rs(&canary).replicas, canary_pods);
        assert!(world.router.routes.is_empty());
        world.settle();
        assert_eq!(
            world.rs(&canary).replicas,
            canary_pods,
            "abortScaleDownDelaySeconds (30 s by default) not over yet"
        );
        world.wait(29);
        assert_eq!(world.rs(&canary).replicas, canary_pods);
        world.wait(1);
        assert_eq!(
            world.rs(&canary).replicas,
            0,
            "scaled down 30 s after the weight is 0 with the stable whole"
        );
        assert_eq!(world.rs(&stable).replicas, replicas);
        assert_eq!(world.router.weight, 0);
        assert!(world.status().abort);
    }
}

#[test]
fn an_aborted_canary_keeps_its_pods_while_the_router_still_sends_it_traffic() {
    let (mut world, _) = World::deployed(routed(4, weight_steps(&[50])));
    world.verify = Verify::Honest;
    let canary = world.update_image("nginx:1.28");
    world.settle();
    world.verify = Verify::Lagging;
    world.status_mut().abort = true;
    for _ in 0..5 {
        world.step();
    }
    assert_eq!(world.recorded_weight(), 0);
    assert_eq!(world.router.weight, 50, "the router has not taken weight 0");
    assert_eq!(
        world.rs(&canary).replicas,
        2,
        "so the canary keeps its pods"
    );
    world.verify = Verify::Honest;
    world.router.weight = 0;
    world.settle();
    assert_eq!(world.rs(&canary).replicas, 2, "the abort delay starts now");
    world.wait(30);
    assert_eq!(world.rs(&canary).replicas, 0);
}

#[test]
fn header_and_mirror_routes_are_added_then_removed_at_the_end() {
    let steps = vec![
        CanaryStep::weight(20),
        header_step(true),
        mirror_step(true),
        CanaryStep::pause_indefinitely(),
        header_step(false),
        CanaryStep::pause_indefinitely(),
    ];
    let (mut world, _) = World::deployed(routed(5, steps));
    let canary = world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(world.index(), Some(3));
    assert_eq!(
        world.router.routes,
        BTreeSet::from(["header".to_string(), "mirror".to_string()])
    );
    world.promote();
    world.settle();
    assert_eq!(world.index(), Some(5));
    assert_eq!(
        world.router.routes,
        BTreeSet::from(["mirror".to_string()]),
        "a route step without match removes its route"
    );
    world.promote();
    world.settle();
    assert_eq!(world.status().stable_rs, canary);
    assert!(
        world.router.routes.is_empty(),
        "managed routes removed at the end"
    );
    assert_eq!(world.router.weight, 0);
}

#[test]
fn route_steps_wait_for_a_canary_pod_to_send_requests_to() {
    let steps = vec![
        canary_scale(SetCanaryScale {
            replicas: Some(1),
            ..SetCanaryScale::default()
        }),
        header_step(true),
        CanaryStep::weight(50),
    ];
    let (mut world, _) = World::deployed(routed(2, steps));
    world.instant = false;
    let canary = world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(
        world.index(),
        Some(0),
        "the canary pod is not available yet"
    );
    world.make_available(&canary, 1);
    world.step();
    assert_eq!(world.index(), Some(1));
    world.make_available(&canary, 0);
    let plan = world.step();
    let traffic = plan.traffic.expect("router plan");
    assert!(traffic.set_header_route.is_none());
    assert!(traffic.remove_managed_routes);
    assert_eq!(world.index(), Some(1), "the route step is not skipped");
    world.make_available(&canary, 1);
    let plan = world.step();
    assert!(
        plan.traffic
            .expect("router plan")
            .set_header_route
            .is_some()
    );
    assert_eq!(world.index(), Some(2));
    assert!(world.router.routes.contains("header"));
}

#[test]
fn set_canary_scale_sizes_the_canary_apart_from_its_weight() {
    let steps = vec![
        canary_scale(SetCanaryScale {
            replicas: Some(3),
            ..SetCanaryScale::default()
        }),
        CanaryStep::weight(10),
        CanaryStep::pause_indefinitely(),
        canary_scale(SetCanaryScale {
            weight: Some(50),
            ..SetCanaryScale::default()
        }),
        CanaryStep::pause_indefinitely(),
        canary_scale(SetCanaryScale {
            match_traffic_weight: Some(true),
            ..SetCanaryScale::default()
        }),
        CanaryStep::pause_indefinitely(),
    ];
    let (mut world, stable) = World::deployed(routed(10, steps));
    let canary = world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(world.index(), Some(2));
    assert_eq!(world.rs(&canary).replicas, 3, "setCanaryScale.replicas");
    assert_eq!(world.router.weight, 10, "the weight follows setWeight");
    assert_eq!(world.rs(&stable).replicas, 10);
    world.promote();
    world.settle();
    assert_eq!(world.index(), Some(4));
    assert_eq!(
        world.rs(&canary).replicas,
        5,
        "setCanaryScale.weight: 50% of 10"
    );
    assert_eq!(world.router.weight, 10);
    world.promote();
    world.settle();
    assert_eq!(world.index(), Some(6));
    assert_eq!(
        world.rs(&canary).replicas,
        1,
        "matchTrafficWeight: 10% of 10"
    );
}

#[test]
fn dynamic_stable_scale_shrinks_the_stable_after_the_weight_moves() {
    let rollout = routed(10, weight_steps(&[30, 100]))
        .with_canary(|canary| canary.dynamic_stable_scale = Some(true));
    let (mut world, stable) = World::deployed(rollout);
    let canary = world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(world.router.weight, 30);
    assert_eq!(world.rs(&canary).replicas, 3);
    assert_eq!(world.rs(&stable).replicas, 7, "the stable keeps 70%");
    world.promote();
    world.settle();
    assert_eq!(world.router.weight, 100);
    assert_eq!(world.rs(&stable).replicas, 0);
    world.promote();
    world.settle();
    assert_eq!(world.status().stable_rs, canary);
    assert_eq!(world.router.weight, 0);
    assert_eq!(world.rs(&canary).replicas, 10);
}

#[test]
fn dynamic_stable_scale_abort_gives_traffic_back_as_the_stable_returns() {
    let rollout = routed(10, weight_steps(&[60]))
        .with_canary(|canary| canary.dynamic_stable_scale = Some(true));
    let (mut world, stable) = World::deployed(rollout);
    let canary = world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(world.rs(&stable).replicas, 4);
    world.instant = false;
    world.status_mut().abort = true;
    world.settle();
    assert_eq!(
        world.rs(&stable).replicas,
        10,
        "the stable scales back up first"
    );
    assert_eq!(world.router.weight, 60, "no stable pod has come back yet");
    assert_eq!(world.rs(&canary).replicas, 6);
    world.make_available(&stable, 7);
    world.settle();
    assert_eq!(world.router.weight, 30);
    assert!(world.rs(&canary).replicas >= 3);
    world.make_available(&stable, 10);
    world.settle();
    assert_eq!(world.router.weight, 0);
    assert_eq!(world.rs(&canary).replicas, 0);
}

/// Aborted at 80%, the canary steps back through 60, 40 and 20 as the stable's pods come
/// back, never asking for more stable pods than the step allows (Argo's
/// `GetDesiredCanaryWeight`): no surge.
#[test]
fn dynamic_stable_scale_abort_steps_back_through_the_weights() {
    let rollout = routed(10, weight_steps(&[20, 40, 60, 80]))
        .with_canary(|canary| canary.dynamic_stable_scale = Some(true));
    let (mut world, stable) = World::deployed(rollout);
    let canary = world.update_image("nginx:1.28");
    for _ in 0..3 {
        world.settle();
        world.promote();
    }
    world.settle();
    assert_eq!(world.router.weight, 80);
    assert_eq!(world.rs(&stable).replicas, 2);
    world.instant = false;
    world.status_mut().abort = true;
    let mut seen = Vec::new();
    for _ in 0..20 {
        world.settle();
        let stable_rs = world.rs(&stable).replicas;
        seen.push((world.router.weight, stable_rs, world.rs(&canary).replicas));
        if world.router.weight == 0 && world.rs(&canary).replicas == 0 {
            break;
        }
        // The stable gets the pods it asked for; the canary's are gone as it shrinks.
        world.make_available(&stable, stable_rs);
        let canary_rs = world.rs(&canary).replicas;
        world.make_available(&canary, canary_rs);
    }
    let weights: Vec<i32> = seen.iter().map(|(weight, _, _)| *weight).collect();
    assert_eq!(weights, [80, 60, 40, 20, 0], "{seen:?}");
    for (weight, stable_replicas, canary_replicas) in &seen {
        assert!(
            stable_replicas + canary_replicas <= 10 + 2,
            "no surge at weight {weight}: {seen:?}"
        );
    }
    assert_eq!(world.rs(&stable).replicas, 10);
}

/// With an explicit abortScaleDownDelaySeconds the canary keeps its pods until its deadline,
/// set once the stable is whole again.
#[test]
fn dynamic_stable_scale_abort_with_a_delay_keeps_the_canary_until_its_deadline() {
    let rollout = routed(10, weight_steps(&[50])).with_canary(|canary| {
        canary.dynamic_stable_scale = Some(true);
        canary.abort_scale_down_delay_seconds = Some(60);
    });
    let (mut world, stable) = World::deployed(rollout);
    let canary = world.update_image("nginx:1.28");
    world.settle();
    world.instant = false;
    world.status_mut().abort = true;
    world.settle();
    assert_eq!(world.rs(&stable).replicas, 10);
    assert_eq!(
        world.rs(&canary).replicas,
        5,
        "kept while the stable comes back"
    );
    world.make_available(&stable, 10);
    world.settle();
    assert_eq!(world.router.weight, 0);
    assert_eq!(world.rs(&canary).replicas, 5, "kept until its deadline");
    assert!(
        world
            .rs(&canary)
            .annotations
            .contains_key(SCALE_DOWN_DEADLINE_ANNOTATION_KEY)
    );
    world.now = at(61);
    world.settle();
    assert_eq!(world.rs(&canary).replicas, 0);
}

#[test]
fn max_traffic_weight_scales_weights_and_replicas() {
    let rollout = routed(10, weight_steps(&[250])).with_canary(|canary| {
        if let Some(routing) = canary.traffic_routing.as_mut() {
            routing.max_traffic_weight = Some(1000);
        }
    });
    let (mut world, _) = World::deployed(rollout);
    let canary = world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(world.router.weight, 250);
    assert_eq!(world.rs(&canary).replicas, 3);
    let weights = world.status().canary.weights.clone().expect("weights");
    assert_eq!(weights.stable.weight, 750);
}

#[test]
fn restarted_planning_resumes_without_repeating_a_weight() {
    let (mut world, _) = World::deployed(routed(4, weight_steps(&[25, 50])));
    world.update_image("nginx:1.28");
    world.settle();
    let before = world.status().clone();
    let plan = world.plan();
    assert!(plan.is_noop(), "a settled rollout plans nothing");
    assert_eq!(plan.traffic.expect("router plan").desired_weight, 25);
    assert_eq!(world.status(), &before);
}

/// Edits a valid routed Rollout into an invalid one.
type Breakage = fn(&mut Rollout);

#[test]
fn invalid_router_specs_name_the_field() {
    let cases: [(Breakage, &str); 9] = [
        (
            |ro| {
                let canary = ro.spec.strategy.canary.as_mut().expect("canary");
                let routing = canary.traffic_routing.as_mut().expect("routing");
                routing.nginx = None;
                routing.istio = Some(rollouts_crds::rollout::IstioTrafficRouting {
                    virtual_service: Some(Default::default()),
                    ..Default::default()
                });
                routing.max_traffic_weight = Some(1000);
            },
            "spec.strategy.canary.trafficRouting.maxTrafficWeight",
        ),
        (
            |ro| {
                ro.spec.strategy.canary.as_mut().expect("canary").steps = Some(vec![CanaryStep {
                    set_header_route: Some(SetHeaderRoute {
                        name: Some("unlisted".into()),
                        match_: None,
                    }),
                    ..CanaryStep::default()
                }])
            },
            "spec.strategy.canary.steps[0].setHeaderRoute.name",
        ),
        (
            |ro| {
                ro.spec.strategy.canary.as_mut().expect("canary").steps =
                    Some(vec![canary_scale(SetCanaryScale {
                        replicas: Some(1),
                        weight: Some(10),
                        ..SetCanaryScale::default()
                    })])
            },
            "spec.strategy.canary.steps[0].setCanaryScale",
        ),
        (
            |ro| {
                ro.spec.strategy.canary.as_mut().expect("canary").steps =
                    Some(vec![CanaryStep::weight(101)])
            },
            "spec.strategy.canary.steps[0].setWeight",
        ),
        (
            |ro| {
                let routing = ro.spec.strategy.canary.as_mut().expect("canary");
                routing.traffic_routing.as_mut().expect("routing").alb = Some(Default::default());
            },
            "spec.strategy.canary.trafficRouting.alb",
        ),
        (
            |ro| {
                ro.spec
                    .strategy
                    .canary
                    .as_mut()
                    .expect("canary")
                    .canary_service = None
            },
            "spec.strategy.canary.canaryService",
        ),
        (
            |ro| {
                let canary = ro.spec.strategy.canary.as_mut().expect("canary");
                canary.dynamic_stable_scale = Some(true);
                canary.scale_down_delay_seconds = Some(30);
            },
            "spec.strategy.canary.dynamicStableScale",
        ),
        (
            |ro| {
                let canary = ro.spec.strategy.canary.as_mut().expect("canary");
                canary.traffic_routing.as_mut().expect("routing").nginx = Some(Default::default());
            },
            "spec.strategy.canary.trafficRouting.nginx.stableIngress",
        ),
        (
            |ro| {
                ro.spec.strategy.canary.as_mut().expect("canary").steps = Some(vec![CanaryStep {
                    set_mirror_route: Some(SetMirrorRoute {
                        name: "mirror".into(),
                        match_: None,
                        percentage: Some(150),
                    }),
                    ..CanaryStep::default()
                }])
            },
            "spec.strategy.canary.steps[0].setMirrorRoute.percentage",
        ),
    ];
    let valid = routed(3, weight_steps(&[20]));
    for (break_it, field) in cases {
        let mut ro = valid.clone();
        break_it(&mut ro);
        let plan = super::super::plan(&ro, &Observed::default(), at(0));
        let invalid = plan.status.condition(INVALID_SPEC).expect("InvalidSpec");
        assert!(invalid.message.starts_with(field), "{}", invalid.message);
        assert!(plan.create_replica_set.is_none() && plan.traffic.is_none());
    }
}

#[test]
fn routed_rollouts_are_planned_with_their_traffic() {
    let ro = routed(3, weight_steps(&[20]));
    let plan = planner_plan(&ro, &Observed::default(), at(0));
    assert!(plan.status.condition(INVALID_SPEC).is_none());
    assert!(plan.traffic.is_some());
    assert!(plan.create_replica_set.is_some());
}

#[test]
fn full_promotion_keeps_the_weight_until_the_stable_is_promoted() {
    let steps = vec![
        CanaryStep::weight(20),
        header_step(true),
        CanaryStep::pause_indefinitely(),
    ];
    let (mut world, _) = World::deployed(routed(10, steps));
    world.instant = false;
    let canary = world.update_image("nginx:1.28");
    world.settle();
    world.make_available(&canary, 2);
    world.settle();
    assert_eq!(world.router.weight, 20);
    assert!(world.router.routes.contains("header"));
    world.status_mut().promote_full = true;
    let plan = world.step();
    let traffic = plan.traffic.expect("router plan");
    assert_eq!(
        traffic.desired_weight, 20,
        "the weight holds while pods come up"
    );
    assert!(traffic.remove_managed_routes);
    assert_eq!(world.rs(&canary).replicas, 10);
    assert!(world.router.routes.is_empty());
    world.make_available(&canary, 10);
    world.settle();
    assert_eq!(world.status().stable_rs, canary);
    assert_eq!(world.router.weight, 0);
    assert_eq!(world.router.history, vec![0, 20, 0]);
}

#[test]
fn rolling_back_to_the_stable_template_sends_it_all_traffic_at_once() {
    let (mut world, stable) = World::deployed(routed(4, weight_steps(&[50])));
    let canary = world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(world.router.weight, 50);
    world.update_image("nginx:1.27");
    let plan = world.step();
    assert_eq!(plan.traffic.expect("router plan").desired_weight, 0);
    assert_eq!(world.status().stable_rs, stable);
    assert_eq!(world.rs(&stable).replicas, 4);
    world.settle();
    assert_eq!(
        world.rs(&canary).replicas,
        2,
        "the rolled-back canary waits for scaleDownDelaySeconds"
    );
    world.wait(31);
    assert_eq!(world.rs(&canary).replicas, 0);
    assert_eq!(world.router.weight, 0);
}

#[test]
fn a_restart_between_the_router_write_and_the_status_patch_repeats_the_same_safe_plan() {
    let (mut world, _) = World::deployed(routed(4, weight_steps(&[50])));
    let canary = world.update_image("nginx:1.28");
    world.settle();
    world.status_mut().abort = true;
    let first = world.plan();
    // The router took weight 0 but the controller died before patching status.
    world.apply_traffic(first.traffic.as_ref().expect("router plan"));
    let again = world.plan();
    assert_eq!(first, again);
    assert!(
        again.scale_replica_sets.is_empty(),
        "the canary is not scaled down yet"
    );
    world.apply(&again);
    world.settle();
    world.wait(30);
    assert_eq!(world.rs(&canary).replicas, 0);
}

#[test]
fn min_pods_per_replica_set_keeps_a_small_canary_from_being_a_single_pod() {
    let rollout = routed(10, weight_steps(&[5]))
        .with_canary(|canary| canary.min_pods_per_replica_set = Some(2));
    let (mut world, stable) = World::deployed(rollout);
    let canary = world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(world.router.weight, 5);
    assert_eq!(
        world.rs(&canary).replicas,
        2,
        "5% of 10 is 1 pod, raised to 2"
    );
    assert_eq!(world.rs(&stable).replicas, 10);
}

/// Istio subset-level splitting (Argo's `istio-subset-split` example): no canaryService or
/// stableService, the router weights the DestinationRule's subsets and labels them with the
/// hashes the plan gives.
#[test]
fn istio_subset_level_routing_runs_without_services() {
    let routing = RolloutTrafficRouting {
        istio: Some(IstioTrafficRouting {
            virtual_service: Some(IstioVirtualService {
                name: "web-routes".into(),
                routes: Some(vec!["primary".into()]),
                ..IstioVirtualService::default()
            }),
            destination_rule: Some(IstioDestinationRule {
                name: "web-subsets".into(),
                canary_subset_name: "canary".into(),
                stable_subset_name: "stable".into(),
                additional_subset_names: None,
            }),
            ..IstioTrafficRouting::default()
        }),
        ..RolloutTrafficRouting::default()
    };
    let rollout = Rollout::test_canary(NAME, weight_steps(&[10]))
        .with_replicas(4)
        .with_traffic_routing(routing)
        .with_canary(|canary| {
            canary.canary_service = None;
            canary.stable_service = None;
        });
    let (mut world, stable) = World::deployed(rollout);
    assert_eq!(world.status().phase, PHASE_HEALTHY, "{:?}", world.status());
    assert!(
        world
            .status()
            .conditions
            .iter()
            .all(|c| c.type_ != INVALID_SPEC)
    );
    let canary = world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(world.index(), Some(1));
    assert_eq!(world.router.weight, 10);
    let traffic = world.plan().traffic.expect("router plan");
    assert_eq!(
        (traffic.canary_hash.as_str(), traffic.stable_hash.as_str()),
        (canary.as_str(), stable.as_str())
    );
    let weights = world.status().canary.weights.clone().expect("weights");
    assert_eq!(weights.canary.service_name, "", "no Service to name");
    world.promote();
    world.settle();
    assert_eq!(world.status().stable_rs, canary);
    assert_eq!(world.router.weight, 0);
}

/// Argo's `reconcileNewReplicaSet` on abort with a router: the canary keeps its pods until the
/// stable has every pod available, then `abortScaleDownDelaySeconds` more.
#[test]
fn an_aborted_canary_waits_for_the_whole_stable_then_its_abort_delay() {
    let rollout = routed(4, weight_steps(&[50])).with_canary(|canary| {
        canary.abort_scale_down_delay_seconds = Some(10);
    });
    let (mut world, stable) = World::deployed(rollout);
    let canary = world.update_image("nginx:1.28");
    world.settle();
    world.status_mut().abort = true;
    // Weight 0 is in effect, but the stable lacks a pod: no deadline yet (planned only, since
    // the fake world refuses traffic on missing stable pods).
    let first = world.step();
    assert_eq!(first.traffic.expect("router plan").desired_weight, 0);
    world.make_available(&stable, 3);
    let waiting = world.plan();
    assert!(waiting.set_scale_down_deadlines.is_empty(), "{waiting:#?}");
    assert!(waiting.scale_replica_sets.is_empty(), "{waiting:#?}");
    world.now = at(60);
    world.make_available(&stable, 4);
    let plan = world.step();
    let deadline = plan
        .set_scale_down_deadlines
        .iter()
        .find(|d| d.name == world.rs(&canary).name)
        .expect("the canary gets its deadline")
        .deadline;
    assert_eq!(deadline, at(70));
    assert_eq!(plan.requeue_after, Some(std::time::Duration::from_secs(10)));
    world.wait(9);
    assert_eq!(world.rs(&canary).replicas, 2);
    world.wait(1);
    assert_eq!(world.rs(&canary).replicas, 0);
    assert_eq!(world.rs(&stable).replicas, 4);
}

/// `abortScaleDownDelaySeconds: 0`: Argo keeps `setCanaryScale` in force on abort, so a canary
/// sized by it keeps its pods for good (its e2e `TestCanaryUnScaleDownOnAbort`); a canary sized
/// by its weight follows the weight to 0 at once, with no deadline.
#[test]
fn abort_scale_down_delay_zero_keeps_a_set_canary_scale_canary() {
    let steps = vec![
        canary_scale(SetCanaryScale {
            replicas: Some(1),
            ..SetCanaryScale::default()
        }),
        CanaryStep::pause_indefinitely(),
    ];
    let rollout = routed(4, steps).with_canary(|canary| {
        canary.abort_scale_down_delay_seconds = Some(0);
    });
    let (mut world, _) = World::deployed(rollout);
    let canary = world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(world.rs(&canary).replicas, 1);
    world.status_mut().abort = true;
    world.settle();
    world.wait(3600);
    assert_eq!(world.router.weight, 0);
    assert_eq!(world.rs(&canary).replicas, 1, "left up");
    assert!(
        !world
            .rs(&canary)
            .annotations
            .contains_key(SCALE_DOWN_DEADLINE_ANNOTATION_KEY)
    );

    let rollout = routed(4, weight_steps(&[50])).with_canary(|canary| {
        canary.abort_scale_down_delay_seconds = Some(0);
    });
    let (mut world, _) = World::deployed(rollout);
    let canary = world.update_image("nginx:1.28");
    world.settle();
    world.status_mut().abort = true;
    world.settle();
    assert_eq!(world.rs(&canary).replicas, 0, "weight 0 means no pods");
}

/// `scaleDownDelayRevisionLimit` with a router: of the previous stables waiting out
/// `scaleDownDelaySeconds`, only the newest `limit` keep their pods (Argo's
/// `scaleDownDelayHelper`).
#[test]
fn scale_down_delay_revision_limit_bounds_the_waiting_revisions() {
    let rollout = routed(2, vec![CanaryStep::weight(50)]).with_canary(|canary| {
        canary.scale_down_delay_seconds = Some(600);
        canary.scale_down_delay_revision_limit = Some(1);
    });
    let (mut world, v1) = World::deployed(rollout);
    let v2 = world.update_image("nginx:1.28");
    world.settle();
    assert_eq!(world.status().stable_rs, v2);
    assert_eq!(world.rs(&v1).replicas, 2, "v1 waits out its delay");
    world.wait(10);
    let v3 = world.update_image("nginx:1.29");
    world.settle();
    assert_eq!(world.status().stable_rs, v3);
    assert_eq!(
        world.rs(&v2).replicas,
        2,
        "the newest previous stable waits"
    );
    assert_eq!(
        world.rs(&v1).replicas,
        0,
        "beyond the limit, scaled down before its deadline"
    );
}
