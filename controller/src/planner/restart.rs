//! `spec.restartAt`: restarting every pod created before that time, as Argo's pod restarter
//! does. Pods are evicted a few at a time (at most maxUnavailable, at least one) and only
//! while the available pods stay above what the strategy may lose; `status.restartedAt`
//! records the restart once no pod older than `restartAt` is left. Pods are not watched: the
//! act phase lists them only while [`needs_restart`] says a restart is pending.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use rollouts_crds::conditions::INVALID_SPEC;
use rollouts_crds::rollout::Rollout;

use super::replicas::{resolve_fenceposts, resolve_int_or_percent, sum_counts};
use super::status::phase;
use super::{EventType, Observed, Plan};

/// How soon a restart that could not evict every old pod looks again (Argo's
/// `restartPodCheckTime`): ReplicaSet changes usually wake it sooner.
pub const RESTART_CHECK: Duration = Duration::from_secs(30);

/// Event reason once every pod is newer than `restartAt`.
pub const ROLLOUT_RESTARTED_REASON: &str = "RolloutRestarted";

/// A pod of one of the Rollout's ReplicaSets, as the restart needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedPod {
    pub name: String,
    /// The ReplicaSet that controls it.
    pub replica_set: String,
    /// `metadata.creationTimestamp`.
    pub created: Timestamp,
    /// When its `Ready` condition last became true; `None` while it is not ready.
    pub ready_since: Option<Timestamp>,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
}

impl ObservedPod {
    /// Ready for `min_ready_seconds` and not on its way out (Kubernetes' pod availability).
    fn is_available(&self, min_ready_seconds: i32, now: Timestamp) -> bool {
        let since = SignedDuration::from_secs(i64::from(min_ready_seconds));
        !self.terminating
            && self.ready_since.is_some_and(|ready| {
                min_ready_seconds <= 0 || ready.checked_add(since).is_ok_and(|at| at < now)
            })
    }
}

/// A restart is pending: `restartAt` has passed and `status.restartedAt` does not record it.
pub fn needs_restart(rollout: &Rollout, now: Timestamp) -> bool {
    let Some(restart_at) = rollout.spec.restart_at.as_ref() else {
        return false;
    };
    let recorded = rollout
        .status
        .as_ref()
        .and_then(|status| status.restarted_at.as_ref());
    recorded.is_none_or(|at| at.0 != restart_at.0) && now > restart_at.0
}

/// Adds the restart to `plan` (made by the strategy for `rollout`).
///
/// - A `restartAt` still ahead asks to look again then.
/// - A new pod template ends a pending restart: its pods are new anyway (Argo resets it too).
/// - Otherwise old pods are evicted, as many as the available pods exceed
///   `max(replicas, Σ ReplicaSet replicas) - max(maxUnavailable, 1)`. A canary that evicts
///   does nothing else this time, as Argo returns early: the availability the scaling relies
///   on no longer holds.
/// - `status.restartedAt` is set (with a `RolloutRestarted` event) once no old pod is left.
pub(super) fn reconcile(rollout: &Rollout, observed: &Observed, now: Timestamp, plan: &mut Plan) {
    let Some(restart_at) = rollout.spec.restart_at.as_ref().map(|time| time.0) else {
        return;
    };
    if plan.status.condition(INVALID_SPEC).is_some() {
        return;
    }
    if restart_at >= now {
        plan.requeue_within(remaining(now, restart_at));
        return;
    }
    if !needs_restart(rollout, now) {
        return;
    }
    let previous_hash = rollout
        .status
        .as_ref()
        .map(|status| status.current_pod_hash.as_str())
        .unwrap_or_default();
    if !previous_hash.is_empty() && previous_hash != plan.status.current_pod_hash {
        record_restarted(rollout, plan, restart_at, None);
        return;
    }
    let Some(pods) = observed.restart_pods.as_ref() else {
        // Observed just before restartAt passed: list the pods next time.
        plan.requeue_within(Duration::ZERO);
        return;
    };
    let replicas = rollout.spec.effective_replicas();
    let total_replicas = sum_counts(observed.replica_sets.iter().map(|rs| rs.replicas));
    let min_ready_seconds = rollout.spec.min_ready_seconds.unwrap_or(0);
    let available = pods
        .iter()
        .filter(|pod| pod.is_available(min_ready_seconds, now))
        .count();
    let available = i32::try_from(available).unwrap_or(i32::MAX);
    let concurrent = max_unavailable(rollout).max(1);
    let mut can_restart =
        available.saturating_sub(replicas.max(total_replicas).saturating_sub(concurrent));

    let mut ordered: Vec<_> = pods.iter().collect();
    ordered.sort_by_key(|pod| {
        (
            replica_set_priority(rollout, plan, &pod.replica_set),
            pod.created,
        )
    });
    let mut old_pods = 0;
    let mut evict = Vec::new();
    for pod in ordered {
        if pod.created >= restart_at {
            continue;
        }
        old_pods += 1;
        if can_restart <= 0 || pod.terminating {
            continue;
        }
        evict.push(pod.name.clone());
        can_restart -= 1;
    }
    if old_pods == 0 {
        record_restarted(rollout, plan, restart_at, Some(pods.len()));
        return;
    }
    plan.requeue_within(RESTART_CHECK);
    if evict.is_empty() {
        return;
    }
    let canary = rollout.spec.strategy.blue_green.is_none();
    if canary {
        let mut restart_only = Plan::unchanged(rollout);
        restart_only.requeue_after = Some(RESTART_CHECK);
        *plan = restart_only;
    }
    plan.evict_pods = evict;
}

/// Sets `status.restartedAt` to `restart_at`, with the phase it gives.
fn record_restarted(
    rollout: &Rollout,
    plan: &mut Plan,
    restart_at: Timestamp,
    pods: Option<usize>,
) {
    plan.status.restarted_at = Some(Time(restart_at));
    (plan.status.phase, plan.status.message) = phase(&rollout.spec, &plan.status);
    plan.status_changed = rollout.status.as_ref() != Some(&plan.status);
    let message = match pods {
        Some(count) => {
            format!("Restarted pods created before {restart_at}: all {count} pods are newer")
        }
        None => format!("Restart at {restart_at} done by the new revision's pods"),
    };
    plan.events.push(super::Event {
        type_: EventType::Normal,
        reason: ROLLOUT_RESTARTED_REASON.into(),
        message,
    });
}

/// Pods of the stable ReplicaSet first, then the new one's, then older ones (Argo's order).
fn replica_set_priority(rollout: &Rollout, plan: &Plan, replica_set: &str) -> u8 {
    let name = rollout.metadata.name.as_deref().unwrap_or_default();
    let named = |hash: &str| !hash.is_empty() && replica_set == format!("{name}-{hash}");
    if named(&plan.status.stable_rs) {
        0
    } else if named(&plan.status.current_pod_hash) {
        1
    } else {
        2
    }
}

/// Argo's `MaxUnavailable`: the canary's resolved fencepost, or the blue-green
/// `maxUnavailable` (25% unless set) rounded down; never above `replicas`.
fn max_unavailable(rollout: &Rollout) -> i32 {
    let replicas = rollout.spec.effective_replicas();
    if replicas <= 0 {
        return 0;
    }
    let strategy = &rollout.spec.strategy;
    let resolved = match (strategy.canary.as_ref(), strategy.blue_green.as_ref()) {
        (Some(canary), _) => resolve_fenceposts(
            canary.max_surge.as_ref(),
            canary.max_unavailable.as_ref(),
            replicas,
        )
        .map(|fenceposts| fenceposts.max_unavailable),
        (None, Some(blue_green)) => {
            let default = IntOrString::String("25%".into());
            resolve_int_or_percent(
                blue_green.max_unavailable.as_ref().unwrap_or(&default),
                replicas,
                false,
                "spec.strategy.blueGreen.maxUnavailable",
            )
        }
        (None, None) => Ok(0),
    };
    resolved.unwrap_or(0).min(replicas)
}

fn remaining(now: Timestamp, at: Timestamp) -> Duration {
    let left = at.duration_since(now);
    if left.is_negative() {
        Duration::ZERO
    } else {
        left.unsigned_abs()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use rollouts_crds::conditions::PHASE_HEALTHY;
    use rollouts_crds::rollout::CanaryStep;

    use super::*;
    use crate::planner::plan_once as plan;
    use crate::planner::test_world::{apply_writes, at};

    /// A canary of `replicas` pods planned until it is Healthy at `at(0)`, its pods started then.
    fn healthy(rollout: Rollout) -> (Rollout, Observed) {
        let mut rollout = rollout;
        let mut observed = Observed::default();
        for _ in 0..10 {
            let plan = plan(&rollout, &observed, at(0));
            apply_writes(&mut observed, &plan, at(0), true);
            let done = plan.is_noop();
            crate::planner::test_world::apply_to_rollout(&mut rollout, &plan);
            if done {
                break;
            }
        }
        let status = rollout.status.as_ref().expect("planned");
        assert_eq!(status.phase, PHASE_HEALTHY, "{status:?}");
        (rollout, observed)
    }

    fn web(replicas: i32) -> (Rollout, Observed) {
        healthy(Rollout::test_canary("web", vec![CanaryStep::weight(50)]).with_replicas(replicas))
    }

    fn restart_at(rollout: &mut Rollout, seconds: i64) {
        rollout.spec.restart_at = Some(Time(at(seconds)));
    }

    /// `count` pods of the Rollout's only ReplicaSet, created and ready at `created`.
    fn pods(observed: &Observed, count: usize, created: Timestamp) -> Vec<ObservedPod> {
        let rs = &observed.replica_sets[0];
        (0..count)
            .map(|index| ObservedPod {
                name: format!("{}-pod{index}", rs.name),
                replica_set: rs.name.clone(),
                created,
                ready_since: Some(created),
                terminating: false,
            })
            .collect()
    }

    #[test]
    fn a_restart_is_pending_only_once_restart_at_has_passed_and_is_not_recorded() {
        let (mut rollout, _) = web(2);
        assert!(!needs_restart(&rollout, at(100)));
        restart_at(&mut rollout, 50);
        assert!(!needs_restart(&rollout, at(50)));
        assert!(needs_restart(&rollout, at(51)));
        rollout.status.as_mut().expect("status").restarted_at = Some(Time(at(50)));
        assert!(!needs_restart(&rollout, at(100)));
        restart_at(&mut rollout, 60);
        assert!(needs_restart(&rollout, at(100)));
    }

    #[test]
    fn a_restart_ahead_asks_to_look_again_when_it_is_due() {
        let (mut rollout, observed) = web(2);
        restart_at(&mut rollout, 40);
        let plan = plan(&rollout, &observed, at(10));
        assert_eq!(plan.requeue_after, Some(Duration::from_secs(30)));
        assert!(plan.evict_pods.is_empty());
        assert_eq!(plan.status.restarted_at, None);
    }

    #[test]
    fn one_old_pod_at_a_time_is_evicted_and_a_canary_does_nothing_else() {
        let (mut rollout, mut observed) = web(4);
        restart_at(&mut rollout, 60);
        observed.restart_pods = Some(pods(&observed, 4, at(0)));
        let plan = plan(&rollout, &observed, at(100));
        // maxUnavailable 25% of 4 is 1.
        assert_eq!(
            plan.evict_pods,
            vec![format!("{}-pod0", observed.replica_sets[0].name)]
        );
        assert!(plan.scale_replica_sets.is_empty() && plan.create_replica_set.is_none());
        assert!(!plan.status_changed);
        assert_eq!(plan.requeue_after, Some(RESTART_CHECK));
        assert_eq!(plan.status.phase, PHASE_HEALTHY);
    }

    #[test]
    fn max_unavailable_sets_how_many_pods_restart_together() {
        let (rollout, mut observed) = web(4);
        let mut rollout = rollout.with_canary(|canary| {
            canary.max_unavailable = Some(IntOrString::Int(2));
            canary.max_surge = Some(IntOrString::Int(0));
        });
        restart_at(&mut rollout, 60);
        observed.restart_pods = Some(pods(&observed, 4, at(0)));
        assert_eq!(plan(&rollout, &observed, at(100)).evict_pods.len(), 2);
    }

    #[test]
    fn no_pod_is_evicted_while_the_rollout_is_already_short_of_available_pods() {
        let (mut rollout, mut observed) = web(4);
        restart_at(&mut rollout, 60);
        let mut listed = pods(&observed, 4, at(0));
        // The pod evicted last time is back but not ready yet.
        listed[0].created = at(101);
        listed[0].ready_since = None;
        observed.restart_pods = Some(listed.clone());
        let plan = plan(&rollout, &observed, at(102));
        assert!(plan.evict_pods.is_empty());
        assert_eq!(plan.status.restarted_at, None);
        assert_eq!(plan.requeue_after, Some(RESTART_CHECK));

        listed[0].ready_since = Some(at(103));
        observed.restart_pods = Some(listed);
        let next = super::super::plan_once(&rollout, &observed, at(104));
        assert_eq!(next.evict_pods.len(), 1);
        assert_ne!(
            next.evict_pods[0],
            format!("{}-pod0", observed.replica_sets[0].name)
        );
    }

    #[test]
    fn a_terminating_pod_counts_as_old_until_it_is_gone() {
        let (mut rollout, mut observed) = web(2);
        restart_at(&mut rollout, 60);
        let mut listed = pods(&observed, 2, at(0));
        listed[0].terminating = true;
        listed[1].created = at(70);
        observed.restart_pods = Some(listed);
        let plan = plan(&rollout, &observed, at(100));
        assert!(plan.evict_pods.is_empty());
        assert_eq!(plan.status.restarted_at, None);
    }

    #[test]
    fn the_restart_is_recorded_once_every_pod_is_newer() {
        let (mut rollout, mut observed) = web(3);
        restart_at(&mut rollout, 60);
        assert_eq!(
            super::super::status::phase(&rollout.spec, rollout.status.as_ref().expect("status")).1,
            "rollout is restarting"
        );
        observed.restart_pods = Some(pods(&observed, 3, at(70)));
        let plan = plan(&rollout, &observed, at(100));
        assert!(plan.evict_pods.is_empty());
        assert_eq!(plan.status.restarted_at, Some(Time(at(60))));
        assert_eq!(plan.status.phase, PHASE_HEALTHY);
        assert!(plan.status_changed);
        assert!(
            plan.events
                .iter()
                .any(|event| event.reason == ROLLOUT_RESTARTED_REASON)
        );
    }

    #[test]
    fn pods_not_listed_yet_are_listed_on_the_next_reconcile() {
        let (mut rollout, observed) = web(2);
        restart_at(&mut rollout, 60);
        let plan = plan(&rollout, &observed, at(100));
        assert_eq!(plan.requeue_after, Some(Duration::ZERO));
        assert!(plan.evict_pods.is_empty());
        assert_eq!(plan.status.restarted_at, None);
    }

    #[test]
    fn a_new_pod_template_ends_the_pending_restart() {
        let (rollout, mut observed) = web(2);
        let mut rollout = rollout.with_image("nginx:1.28");
        restart_at(&mut rollout, 60);
        observed.restart_pods = Some(pods(&observed, 2, at(0)));
        let plan = plan(&rollout, &observed, at(100));
        assert!(plan.evict_pods.is_empty());
        assert!(plan.create_replica_set.is_some());
        assert_eq!(plan.status.restarted_at, Some(Time(at(60))));
    }

    #[test]
    fn the_basic_canary_example_with_restart_at_and_anti_affinity_is_planned() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/rollout-canary-basic.yaml"
        );
        let text = std::fs::read_to_string(path).expect("the example exists");
        let rollout: Rollout = serde_saphyr::from_str(&text).expect("a Rollout");
        assert!(rollout.spec.restart_at.is_some());
        let now = Timestamp::now();
        let first = plan(&rollout, &Observed::default(), now);
        assert!(
            first.status.condition(INVALID_SPEC).is_none(),
            "{:?}",
            first.status
        );
        assert!(first.create_replica_set.is_some());
        // No pod predates restartAt: the restart is recorded at once.
        let observed = Observed {
            restart_pods: Some(Vec::new()),
            ..Observed::default()
        };
        let planned = plan(&rollout, &observed, now);
        assert_eq!(planned.status.restarted_at, rollout.spec.restart_at);
    }

    #[test]
    fn a_blue_green_restart_evicts_alongside_the_rest_of_the_plan() {
        let (mut rollout, mut observed) =
            healthy(Rollout::test_blue_green("shop").with_replicas(4));
        restart_at(&mut rollout, 60);
        observed.restart_pods = Some(pods(&observed, 4, at(0)));
        let planned = plan(&rollout, &observed, at(100));
        // maxUnavailable 25% of 4 is 1.
        assert_eq!(planned.evict_pods.len(), 1);
        assert!(planned.status_changed, "the strategy's plan is kept");
        assert_eq!(planned.status.restarted_at, None);
    }

    #[test]
    fn blue_green_pods_follow_max_unavailable_rounded_down() {
        let rollout = Rollout::test_blue_green("shop").with_replicas(8);
        assert_eq!(max_unavailable(&rollout), 2);
        let rollout = rollout.with_blue_green(|blue_green| {
            blue_green.max_unavailable = Some(IntOrString::String("10%".into()))
        });
        assert_eq!(max_unavailable(&rollout), 0);
    }
}
