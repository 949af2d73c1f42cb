//! The traffic-router side of the canary step machine: the weight, header and mirror routes the
//! routers must hold ([`TrafficPlan`]), replica counts that follow the weight or
//! `setCanaryScale`, and the gates that keep traffic on available pods (DESIGN invariant 3).
//!
//! Everything is read from the status as this plan found it: the weight `status.canary.weights`
//! records is the weight the routers were last set to, and `Observed::traffic_weight_verified`
//! says whether they still hold it.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use rollouts_crds::conditions::TRAFFIC_WEIGHT_UPDATED_REASON;
use rollouts_crds::rollout::{
    CanaryStep, RolloutStatus, SetCanaryScale, TrafficWeights, WeightDestination,
};

use super::super::replicas::{
    CanaryScale, CanaryStableCounts, MAX_WEIGHT, TrafficRoutedInputs,
    calculate_replica_counts_for_traffic_routed_canary, traffic_weight_to_replicas,
};
use super::super::revisions;
use super::super::{
    CanaryWeight, EventType, ObservedReplicaSet, Plan, ScaleDownDeadline, TrafficPlan,
};
use super::{Planner, progress_threshold_met};

/// How long to wait before asking a router again about a weight it does not hold yet (Argo's
/// default verify retry interval).
pub(super) const VERIFY_RETRY_INTERVAL: Duration = Duration::from_secs(10);

/// How long the previous stable keeps its pods after a promotion when `scaleDownDelaySeconds` is
/// not set, so routers and endpoints have moved off them (Argo's default).
const DEFAULT_SCALE_DOWN_DELAY_SECONDS: i32 = 30;

impl<'a> Planner<'a> {
    /// The canary has `trafficRouting`.
    pub(super) fn routed(&self) -> bool {
        self.canary.traffic_routing.is_some()
    }

    fn dynamic_stable_scale(&self) -> bool {
        self.canary.dynamic_stable_scale == Some(true)
    }

    /// `maxTrafficWeight`, or 100.
    pub(super) fn max_traffic_weight(&self) -> i32 {
        self.canary
            .traffic_routing
            .as_ref()
            .and_then(|routing| routing.max_traffic_weight)
            .unwrap_or(MAX_WEIGHT)
    }

    /// `status.canary.weights` as this plan found it.
    fn recorded_weights(&self) -> Option<&TrafficWeights> {
        self.base.canary.weights.as_ref()
    }

    /// The canary weight the routers were last set to (0 when none was ever set).
    fn recorded_weight(&self) -> i32 {
        self.recorded_weights()
            .map_or(0, |weights| weights.canary.weight)
    }

    /// The routers hold `weight` for the current revision: it is recorded in status (so it was
    /// written) and the routers did not say otherwise when asked.
    pub(super) fn weight_in_effect(&self, weight: i32) -> bool {
        let recorded_hash = self
            .recorded_weights()
            .map(|weights| weights.canary.pod_template_hash.as_str());
        let for_this_revision = weight == 0 || recorded_hash == Some(self.current_hash.as_str());
        self.recorded_weight() == weight
            && for_this_revision
            && self.observed.traffic_weight_verified != Some(false)
    }

    /// The weight the steps ask for at the current step (Argo's `GetCurrentSetWeight`): the last
    /// `setWeight` at or before it, the whole of `maxTrafficWeight` past the last step.
    fn routed_step_weight(&self) -> i32 {
        if self.is_aborted() {
            return 0;
        }
        let index = self.step_index();
        if index >= self.step_count {
            return self.max_traffic_weight();
        }
        self.last_set_weight_through(index).unwrap_or(0)
    }

    /// The last `setWeight` among steps `0..=index`.
    fn last_set_weight_through(&self, index: i32) -> Option<i32> {
        let steps = self.canary.steps();
        let end = usize::try_from(index.saturating_add(1))
            .unwrap_or(0)
            .min(steps.len());
        steps
            .get(..end)?
            .iter()
            .rev()
            .find_map(|step| step.set_weight)
    }

    /// The `setCanaryScale` in force (Argo's `UseSetCanaryScale`): the latest one at or before the
    /// current step, unless it is `matchTrafficWeight`, the update is aborted or the steps are done.
    fn set_canary_scale(&self) -> Option<&'a SetCanaryScale> {
        // `abortScaleDownDelaySeconds: 0` asks to leave the canary up on abort, so the scale
        // stays in force then.
        if self.is_aborted() && self.canary.abort_scale_down_delay_seconds != Some(0) {
            return None;
        }
        let steps: &'a [CanaryStep] = self.canary.steps();
        let index = usize::try_from(self.step_index()).ok()?;
        if index >= steps.len() {
            return None;
        }
        let scale = steps[..=index]
            .iter()
            .rev()
            .find_map(|step| step.set_canary_scale.as_ref())?;
        (scale.match_traffic_weight != Some(true)).then_some(scale)
    }

    /// Canary and stable counts with a router: the canary sized to the weight or
    /// `setCanaryScale`, the stable full unless `dynamicStableScale`. An aborted canary keeps its
    /// pods until the routers hold weight 0.
    pub(super) fn routed_counts(&self) -> CanaryStableCounts {
        let max_weight = self.max_traffic_weight();
        let whole =
            self.base.promote_full || self.base.stable_rs.is_empty() || self.fully_promoted();
        let canary_scale = match self.set_canary_scale() {
            _ if whole => CanaryScale::Weight(max_weight),
            Some(SetCanaryScale {
                replicas: Some(replicas),
                ..
            }) => CanaryScale::Replicas(*replicas),
            Some(SetCanaryScale {
                weight: Some(weight),
                ..
            }) => CanaryScale::Weight(*weight),
            _ => CanaryScale::Weight(
                self.dynamic_abort_weight()
                    .unwrap_or_else(|| self.routed_step_weight()),
            ),
        };
        let mut counts = calculate_replica_counts_for_traffic_routed_canary(TrafficRoutedInputs {
            spec_replicas: self.spec_replicas,
            canary_scale,
            max_weight,
            min_pods_per_replica_set: self.canary.min_pods_per_replica_set,
            dynamic_stable_scale: self.dynamic_stable_scale(),
            current_weights: self
                .recorded_weights()
                .map(|weights| (weights.canary.weight, weights.stable.weight)),
            aborted: self.is_aborted(),
        });
        // (With dynamicStableScale the counts above already keep the canary's pods for the
        // weight the routers still hold.)
        if self.is_aborted()
            && !self.dynamic_stable_scale()
            && !self.weight_in_effect(0)
            && let Some(new_rs) = self.new_rs
        {
            counts.canary = counts.canary.max(new_rs.replicas);
        }
        counts
    }

    /// Argo's `AtDesiredReplicaCountsForCanary` with a router: the canary has its pods available
    /// and, unless the stable scales with its traffic, the stable has all its pods. Older
    /// ReplicaSets may still run: the router sends them nothing.
    pub(super) fn at_routed_counts(&self, counts: CanaryStableCounts) -> bool {
        let Some(new_rs) = self.new_rs else {
            return false;
        };
        if !progress_threshold_met(
            self.canary.replica_progress_threshold.as_ref(),
            new_rs,
            counts.canary,
        ) {
            return false;
        }
        self.dynamic_stable_scale()
            || self.distinct_stable().is_some_and(|stable| {
                stable.replicas == counts.stable && stable.current_replicas == counts.stable
            })
    }

    /// A `setWeight` step with a router is done once its weight is in effect.
    pub(super) fn completed_routed_set_weight(&self, counts: CanaryStableCounts) -> bool {
        self.at_routed_counts(counts) && self.weight_in_effect(self.routed_step_weight())
    }

    /// Whether the current step's header and mirror routes go to the routers now: only during an
    /// update, once the canary has the pods it is sized to (none, if the steps ask for none).
    pub(super) fn routes_apply(&self, counts: CanaryStableCounts) -> bool {
        !self.initial_deploy()
            && !self.fully_promoted()
            && !self.is_aborted()
            && !self.base.promote_full
            && self
                .new_rs
                .is_some_and(|rs| progress_threshold_met(None, rs, counts.canary))
    }

    fn canary_serving(&self) -> bool {
        self.new_rs.is_some_and(|rs| rs.available_replicas > 0)
    }

    /// The update is over, or the canary should have pods and none serves matching requests.
    fn remove_managed_routes(&self, counts: CanaryStableCounts) -> bool {
        let canary_down = counts.canary > 0 && !self.canary_serving();
        self.fully_promoted() || self.is_aborted() || self.base.promote_full || canary_down
    }

    /// The canary weight the routers are to hold next (Argo's `reconcileTrafficRouting`): raised
    /// to a step's weight only once the canary pods for it are available, 0 once the stable is
    /// promoted or on abort, and unchanged while the stable lacks the pods for its share.
    fn routed_weight(&self, counts: CanaryStableCounts) -> i32 {
        let max_weight = self.max_traffic_weight();
        if self.fully_promoted() || self.initial_deploy() {
            return 0;
        }
        if self.is_aborted() {
            return self.weight_on_abort();
        }
        if !self.canary_serving() {
            return 0;
        }
        let weight = if self.base.promote_full {
            match self.new_rs {
                Some(new_rs) if self.dynamic_stable_scale() && self.spec_replicas > 0 => {
                    floor_share(max_weight, new_rs.available_replicas, self.spec_replicas)
                }
                _ => self.recorded_weight(),
            }
        } else if self.step_count == 0 {
            0
        } else if self.at_routed_counts(counts) {
            self.routed_step_weight()
        } else {
            self.last_set_weight_through(self.step_index().saturating_sub(1))
                .unwrap_or(0)
        };
        if self.stable_can_take(max_weight.saturating_sub(weight)) {
            weight
        } else {
            self.recorded_weight()
        }
    }

    /// The canary weight an aborted `dynamicStableScale` canary steps back to (Argo's
    /// `GetDesiredCanaryWeight`): the `setWeight` steps in reverse, the first one that needs
    /// fewer pods than the canary still has (or than the stable still lacks), so the stable
    /// grows step by step instead of surging to `spec.replicas`. `None` when this does not
    /// apply (not aborted, no `dynamicStableScale`, no distinct stable or canary).
    fn dynamic_abort_weight(&self) -> Option<i32> {
        if !self.is_aborted() || !self.dynamic_stable_scale() {
            return None;
        }
        let (Some(new_rs), Some(stable)) = (self.new_rs, self.distinct_stable()) else {
            return None;
        };
        let max_weight = self.max_traffic_weight();
        let expected = self.spec_replicas.saturating_sub(stable.available_replicas);
        // An explicit abort delay keeps the canary at full scale until its deadline, so only the
        // stable's progress may move the weight (else the abort would wait on itself).
        let explicit_delay = self.rollout.spec.has_explicit_abort_scale_down_delay();
        let canary_replicas = if explicit_delay {
            expected
        } else {
            expected.max(new_rs.available_replicas)
        };
        let weight = self
            .canary
            .steps()
            .iter()
            .rev()
            .filter_map(|step| step.set_weight)
            .find(|weight| {
                traffic_weight_to_replicas(self.spec_replicas, *weight, max_weight)
                    < canary_replicas
            });
        Some(weight.unwrap_or(0))
    }

    /// On abort the canary's weight goes to 0; a stable that scales with its traffic takes it
    /// back only as fast as its pods become available, and with the steps' weights in reverse
    /// (Argo's `calculateDesiredWeightOnAbortOrStableRollback`).
    fn weight_on_abort(&self) -> i32 {
        let Some(stable) = self.distinct_stable() else {
            return 0;
        };
        let Some(desired) = self.dynamic_abort_weight() else {
            return 0;
        };
        if self.spec_replicas <= 0 {
            return 0;
        }
        let max_weight = self.max_traffic_weight();
        let stable_share = floor_share(max_weight, stable.available_replicas, self.spec_replicas);
        let expected = max_weight.saturating_sub(stable_share).max(0);
        if self.recorded_weights().is_none() {
            return expected.max(desired);
        }
        let current = self.recorded_weight();
        if desired <= 0 {
            // Never raise the weight again because the stable's availability flapped.
            return expected.min(current);
        }
        if stable_share < max_weight.saturating_sub(desired) {
            // The stable is still scaling up: the weight stays where it is.
            return current;
        }
        desired.min(current)
    }

    /// The stable has the available pods (or meets `replicaProgressThreshold`) for `weight`.
    fn stable_can_take(&self, weight: i32) -> bool {
        let Some(stable) = self.distinct_stable() else {
            return true;
        };
        let max_weight = self.max_traffic_weight();
        let needed = floor_share(self.spec_replicas, weight, max_weight);
        stable.available_replicas >= needed
            || progress_threshold_met(
                self.canary.replica_progress_threshold.as_ref(),
                stable,
                needed,
            )
    }

    /// The running experiment step's weighted templates (Argo's
    /// `calculateWeightDestinationsFromExperiment`); none once the update is aborted or promoted.
    fn experiment_destinations(&self) -> Vec<WeightDestination> {
        if self.is_aborted() || self.base.promote_full || self.fully_promoted() {
            return Vec::new();
        }
        self.experiment.destinations.clone()
    }

    /// The routers' desired state, and `status.canary.weights` recording it.
    pub(super) fn plan_traffic(
        &mut self,
        plan: &mut Plan,
        next: &mut RolloutStatus,
        counts: CanaryStableCounts,
    ) {
        let max_weight = self.max_traffic_weight();
        let desired_weight = self.routed_weight(counts);
        let step = self.current_step().filter(|_| self.routes_apply(counts));
        let traffic = TrafficPlan {
            desired_weight,
            max_traffic_weight: max_weight,
            additional: self.experiment_destinations(),
            canary_hash: self
                .new_rs
                .map(|rs| rs.pod_template_hash.clone())
                .unwrap_or_default(),
            stable_hash: self
                .stable_rs
                .map(|rs| rs.pod_template_hash.clone())
                .unwrap_or_default(),
            set_header_route: step.and_then(|step| step.set_header_route.clone()),
            set_mirror_route: step.and_then(|step| step.set_mirror_route.clone()),
            remove_managed_routes: self.remove_managed_routes(counts),
        };
        let mut weights = TrafficWeights {
            canary: WeightDestination {
                weight: desired_weight,
                service_name: self.canary.canary_service.clone().unwrap_or_default(),
                pod_template_hash: traffic.canary_hash.clone(),
            },
            stable: WeightDestination {
                weight: max_weight.saturating_sub(desired_weight),
                service_name: self.canary.stable_service.clone().unwrap_or_default(),
                pod_template_hash: traffic.stable_hash.clone(),
            },
            additional: traffic.additional.clone(),
            verified: None,
        };
        let recorded = self.recorded_weights();
        let unchanged = recorded.is_some_and(|recorded| {
            recorded.canary == weights.canary
                && recorded.stable == weights.stable
                && recorded.additional == weights.additional
        });
        if unchanged {
            weights.verified = self.observed.traffic_weight_verified;
            if weights.verified == Some(false) {
                self.out.requeue_in(VERIFY_RETRY_INTERVAL);
            }
        } else {
            let change = match recorded {
                Some(recorded) if recorded.canary.weight != desired_weight => {
                    format!("from {} to {desired_weight}", recorded.canary.weight)
                }
                Some(_) => format!("to {desired_weight} (revisions changed)"),
                None => format!("to {desired_weight}"),
            };
            self.out.event(
                EventType::Normal,
                TRAFFIC_WEIGHT_UPDATED_REASON,
                format!("Traffic weight updated {change}"),
            );
            // The next plan reads back whether the routers took the weight.
            self.out.requeue_in(Duration::ZERO);
        }
        plan.canary_weight = CanaryWeight {
            desired: desired_weight,
            actual: self.recorded_weight(),
        };
        next.canary.weights = Some(weights);
        plan.traffic = Some(traffic);
    }

    /// How long an aborted routed canary keeps its pods once the routers send it nothing and the
    /// stable has all its pods available (Argo's `shouldDelayScaleDownOnAbort`):
    /// `abortScaleDownDelaySeconds`, 30 s unless set. `None` when there is no stable to fall back
    /// to, the delay is 0 (the canary keeps the scale its steps give it) or the stable scales
    /// with its traffic (the canary follows the weight down).
    pub(super) fn abort_scale_down_delay(&self) -> Option<Duration> {
        // With dynamicStableScale only an explicit abortScaleDownDelaySeconds delays it (Argo's
        // shouldDelayScaleDownOnAbort); the default follows the weight down.
        let explicit_delay = self.rollout.spec.has_explicit_abort_scale_down_delay();
        if !self.routed()
            || !self.is_aborted()
            || self.distinct_stable().is_none()
            || (self.dynamic_stable_scale() && !explicit_delay)
        {
            return None;
        }
        self.rollout.spec.effective_abort_scale_down_delay()
    }

    /// The aborted canary's scale while its abort delay runs: kept until its
    /// `scale-down-deadline`, which is set once the routers hold weight 0 and the stable has
    /// every pod available; zero after it. `None` keeps the current scale.
    pub(super) fn aborted_canary_target(
        &mut self,
        plan: &mut Plan,
        new_rs: &ObservedReplicaSet,
        delay: Duration,
    ) -> Option<i32> {
        let traffic_gone = self.weight_in_effect(0);
        match revisions::scale_down_deadline(new_rs) {
            Some(deadline) if deadline > self.now => {
                self.out.requeue_at(self.now, deadline);
                None
            }
            Some(_) => traffic_gone.then_some(0),
            None => {
                let stable_serves = self
                    .distinct_stable()
                    .is_some_and(|stable| stable.available_replicas >= self.spec_replicas);
                if stable_serves && traffic_gone && new_rs.replicas > 0 {
                    let delay = SignedDuration::try_from(delay).unwrap_or(SignedDuration::MAX);
                    let deadline = self.now.checked_add(delay).unwrap_or(Timestamp::MAX);
                    // Written to the second, as Argo's RFC 3339 stamp is.
                    let deadline = Timestamp::from_second(deadline.as_second()).unwrap_or(deadline);
                    plan.set_scale_down_deadlines.push(ScaleDownDeadline {
                        name: new_rs.name.clone(),
                        deadline,
                    });
                    self.out.requeue_at(self.now, deadline);
                }
                None
            }
        }
    }

    /// What happens to an older ReplicaSet with a router, before maxUnavailable limits it: the
    /// previous stable keeps its pods for `scaleDownDelaySeconds` after a promotion (returns the
    /// delay to annotate), anything else goes to zero since the router sends it nothing.
    pub(super) fn routed_scale_down_delay(&self, rs: &ObservedReplicaSet) -> Option<i32> {
        if !self.fully_promoted() || self.dynamic_stable_scale() || rs.replicas == 0 {
            return None;
        }
        let seconds = self
            .canary
            .scale_down_delay_seconds
            .unwrap_or(DEFAULT_SCALE_DOWN_DELAY_SECONDS);
        (seconds > 0).then_some(seconds)
    }
}

/// `total * part / whole`, rounded down, without overflowing; 0 when `whole` is not positive.
fn floor_share(total: i32, part: i32, whole: i32) -> i32 {
    if whole <= 0 {
        return 0;
    }
    let share = i64::from(total) * i64::from(part) / i64::from(whole);
    i32::try_from(share).unwrap_or(if share < 0 { i32::MIN } else { i32::MAX })
}

#[cfg(test)]
mod tests;
