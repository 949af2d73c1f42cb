//! Replica arithmetic of a canary: how many pods the canary and the stable ReplicaSet get for a
//! weight, within maxSurge / maxUnavailable, with and without a traffic router.
//!
//! Plain integers in, plain integers out. The numbers follow Argo Rollouts' controller
//! (`utils/replicaset/canary.go`), so a Rollout moved from Argo scales the same way.
//!
//! Spec values reach here within `rollouts_crds::validation`'s bounds, but observed counts
//! (a ReplicaSet scaled by hand to 2^31-1) do not: every sum and difference saturates and
//! every narrowing clamps, so no input panics or wraps.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use rollouts_crds::FieldError;

/// Weights are percentages unless a traffic router says otherwise.
pub const MAX_WEIGHT: i32 = 100;

/// maxSurge and maxUnavailable when the spec leaves them out, as Argo documents them.
pub const DEFAULT_MAX_SURGE_PERCENT: i32 = 25;
/// See [`DEFAULT_MAX_SURGE_PERCENT`].
pub const DEFAULT_MAX_UNAVAILABLE_PERCENT: i32 = 25;

/// maxSurge and maxUnavailable resolved to pod counts for one `spec.replicas`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fenceposts {
    pub max_surge: i32,
    pub max_unavailable: i32,
}

/// What one ReplicaSet asks for (`spec.replicas`) and what it has (`status.availableReplicas`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaSetCount {
    pub replicas: i32,
    pub available: i32,
}

/// Replica counts the canary and the stable ReplicaSet should be scaled to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CanaryStableCounts {
    pub canary: i32,
    pub stable: i32,
}

/// Resolves an int-or-percent field against `total`. Percentages round up when
/// `round_up` (maxSurge) and down otherwise (maxUnavailable), as Kubernetes does.
pub fn resolve_int_or_percent(
    value: &IntOrString,
    total: i32,
    round_up: bool,
    field: &str,
) -> Result<i32, FieldError> {
    let not_a_count = || {
        FieldError::new(
            field,
            format!("{value:?} is neither a whole number of pods nor a percentage"),
            "write a non-negative integer such as 1, or a percentage such as \"25%\"",
        )
    };
    let count = match value {
        IntOrString::Int(count) => *count,
        IntOrString::String(text) => {
            let percent: i64 = text
                .strip_suffix('%')
                .and_then(|digits| digits.trim().parse().ok())
                .ok_or_else(not_a_count)?;
            let scaled = percent
                .checked_mul(i64::from(total))
                .ok_or_else(not_a_count)?;
            let resolved = if round_up {
                ceil_div(scaled, 100)
            } else {
                scaled.div_euclid(100)
            };
            i32::try_from(resolved).map_err(|_| not_a_count())?
        }
    };
    if count < 0 {
        return Err(not_a_count());
    }
    Ok(count)
}

/// Resolves maxSurge (rounded up) and maxUnavailable (rounded down) for `replicas`, with
/// Argo's defaults (25% each). When both resolve to zero, maxUnavailable becomes 1 so a
/// rollout can still move (surge may be blocked by a quota); maxUnavailable never exceeds
/// `replicas`.
pub fn resolve_fenceposts(
    max_surge: Option<&IntOrString>,
    max_unavailable: Option<&IntOrString>,
    replicas: i32,
) -> Result<Fenceposts, FieldError> {
    let default_surge = IntOrString::String(format!("{DEFAULT_MAX_SURGE_PERCENT}%"));
    let default_unavailable = IntOrString::String(format!("{DEFAULT_MAX_UNAVAILABLE_PERCENT}%"));
    let surge = resolve_int_or_percent(
        max_surge.unwrap_or(&default_surge),
        replicas,
        true,
        "spec.strategy.canary.maxSurge",
    )?;
    let mut unavailable = resolve_int_or_percent(
        max_unavailable.unwrap_or(&default_unavailable),
        replicas,
        false,
        "spec.strategy.canary.maxUnavailable",
    )?;
    if surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    Ok(Fenceposts {
        max_surge: surge,
        max_unavailable: unavailable.min(replicas.max(0)),
    })
}

/// The canary and stable counts that best approximate `desired_weight` out of `max_weight`
/// with `spec_replicas` pods, possibly using one surge pod when `max_surge > 0`.
///
/// A weight strictly between 0 and `max_weight` never gives either side zero pods, except
/// with one replica and no surge, where a single pod cannot be split.
pub fn approximate_weighted_canary_stable_replica_counts(
    spec_replicas: i32,
    desired_weight: i32,
    max_weight: i32,
    max_surge: i32,
) -> CanaryStableCounts {
    if spec_replicas <= 0 || max_weight <= 0 {
        return CanaryStableCounts {
            canary: 0,
            stable: spec_replicas.max(0),
        };
    }
    let weighted = i64::from(spec_replicas) * i64::from(desired_weight);
    let ceil_canary = clamp_i32(ceil_div(weighted, i64::from(max_weight)));
    let floor_canary = clamp_i32(weighted.div_euclid(i64::from(max_weight)));
    let zero_allowed = desired_weight == max_weight
        || desired_weight == 0
        || (spec_replicas == 1 && max_surge == 0);

    // (canary, total) candidates, in Argo's order: the first of equally good ones wins.
    let mut options: Vec<(i32, i32)> = Vec::with_capacity(4);
    if ceil_canary < spec_replicas || zero_allowed {
        options.push((ceil_canary, spec_replicas));
    }
    let floor_usable = floor_canary != 0 || zero_allowed;
    if !floor_ceiling_tied(desired_weight, max_weight, spec_replicas) && floor_usable {
        options.push((floor_canary, spec_replicas));
    }
    if max_surge > 0 {
        let surged = spec_replicas.saturating_add(1);
        options.push((ceil_canary, surged));
        if !floor_ceiling_tied(desired_weight, max_weight, surged) && floor_usable {
            options.push((floor_canary, surged));
        }
    }

    let mut best: Option<((i32, i32), f64)> = None;
    for option in options {
        let delta = weight_delta(desired_weight, max_weight, option.0, option.1);
        if best.is_none_or(|(_, best_delta)| delta < best_delta) {
            best = Some((option, delta));
        }
    }
    match best {
        Some(((canary, total), _)) => CanaryStableCounts {
            canary,
            stable: total.saturating_sub(canary),
        },
        None => CanaryStableCounts {
            canary: 0,
            stable: spec_replicas,
        },
    }
}

/// True when `total * weight / max_weight` sits exactly halfway between two integers, so
/// rounding down and up are equally close (3 pods at 50%: 1 or 2).
fn floor_ceiling_tied(desired_weight: i32, max_weight: i32, total: i32) -> bool {
    // In i128: two i32 extremes and the factor 2 overflow an i64.
    let twice = 2 * i128::from(total) * i128::from(desired_weight);
    let modulus = 2 * i128::from(max_weight);
    modulus > 0 && twice.rem_euclid(modulus) == i128::from(max_weight)
}

/// How far `canary` of `total` pods is from the desired weight. Computed in f64 exactly as
/// Argo does, so ties between candidates break the same way.
fn weight_delta(desired_weight: i32, max_weight: i32, canary: i32, total: i32) -> f64 {
    let actual = f64::from(canary) * f64::from(max_weight) / f64::from(total);
    (actual - f64::from(desired_weight)).abs()
}

/// What a basic canary (no traffic router) knows when it sizes its ReplicaSets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BasicCanaryInputs {
    /// `spec.replicas` of the Rollout.
    pub spec_replicas: i32,
    /// Canary weight asked for, 0..=[`MAX_WEIGHT`].
    pub desired_weight: i32,
    pub fenceposts: Fenceposts,
    /// The ReplicaSet of the current pod template, if it exists yet.
    pub canary: Option<ReplicaSetCount>,
    /// The stable ReplicaSet; `None` when there is none or it is the canary itself, in which
    /// case the steps do not apply and the canary goes to `spec.replicas`.
    pub stable: Option<ReplicaSetCount>,
    /// Sum of `spec.replicas` over every other ReplicaSet of the Rollout.
    pub older_replicas: i32,
}

/// Canary and stable replica counts for the next move of a basic canary: towards the weight
/// asked for, never above `spec.replicas + maxSurge` pods in total, never below
/// `spec.replicas - maxUnavailable` available ones. Older ReplicaSets are drained first; while
/// they hold pods, neither canary nor stable is scaled down.
pub fn calculate_replica_counts_for_canary(inputs: BasicCanaryInputs) -> CanaryStableCounts {
    let BasicCanaryInputs {
        spec_replicas,
        desired_weight,
        fenceposts,
        canary,
        stable,
        older_replicas,
    } = inputs;
    let CanaryStableCounts {
        canary: mut desired_canary,
        stable: mut desired_stable,
    } = approximate_weighted_canary_stable_replica_counts(
        spec_replicas,
        desired_weight,
        MAX_WEIGHT,
        fenceposts.max_surge,
    );
    let mut canary_count = canary.map_or(0, |rs| rs.replicas);
    let mut stable_count = 0;
    match stable {
        Some(rs) => stable_count = rs.replicas,
        None => {
            desired_canary = spec_replicas;
            desired_stable = 0;
        }
    }

    let max_total = spec_replicas.saturating_add(fenceposts.max_surge);
    let current_total = older_replicas
        .saturating_add(canary.map_or(0, |rs| rs.replicas))
        .saturating_add(stable.map_or(0, |rs| rs.replicas));
    let mut scale_up = max_total.saturating_sub(current_total);

    // The stable side is topped up first: it is what serves traffic if the canary goes wrong.
    if let Some(rs) = stable
        && rs.replicas < desired_stable
        && scale_up > 0
    {
        if rs.replicas.saturating_add(scale_up) < desired_stable {
            stable_count = rs.replicas.saturating_add(scale_up);
            scale_up = 0;
        } else {
            stable_count = desired_stable;
            scale_up = scale_up.saturating_sub(desired_stable.saturating_sub(rs.replicas));
        }
    }
    if let Some(rs) = canary
        && rs.replicas < desired_canary
        && scale_up > 0
    {
        canary_count = rs.replicas.saturating_add(scale_up).min(desired_canary);
    }

    if older_replicas > 0 {
        return CanaryStableCounts {
            canary: canary_count,
            stable: stable_count,
        };
    }

    let min_available = spec_replicas.saturating_sub(fenceposts.max_unavailable);
    // Going up, the stable's pods may be counted as they are (not available ones); going
    // down (abort, lower weight), the canary's may.
    let increasing = canary.is_none_or(|rs| desired_canary >= rs.replicas);
    let removable = replicas_for_scale_down(canary, !increasing)
        .saturating_add(replicas_for_scale_down(stable, increasing));
    if removable <= min_available {
        return CanaryStableCounts {
            canary: canary_count,
            stable: stable_count,
        };
    }
    let scale_down = removable.saturating_sub(min_available);
    if !increasing {
        canary_count = scale_down_count(canary, desired_canary, scale_down, canary_count);
        (canary_count, stable_count) = adjust_within_limits(
            canary,
            stable,
            canary_count,
            stable_count,
            max_total,
            min_available,
        );
    } else if stable.is_some() {
        stable_count = scale_down_count(stable, desired_stable, scale_down, stable_count);
        (stable_count, canary_count) = adjust_within_limits(
            stable,
            canary,
            stable_count,
            canary_count,
            max_total,
            min_available,
        );
    }
    CanaryStableCounts {
        canary: canary_count,
        stable: stable_count,
    }
}

/// Pods of `rs` that may be counted as present when deciding how many can go. Pods above
/// `spec.replicas` are already on their way out, so they never count.
fn replicas_for_scale_down(rs: Option<ReplicaSetCount>, ignore_availability: bool) -> i32 {
    match rs {
        None => 0,
        Some(rs) if rs.replicas < rs.available || ignore_availability => rs.replicas,
        Some(rs) => rs.available,
    }
}

/// The count `drain` goes down to: towards `desired`, by at most `scale_down`.
fn scale_down_count(
    drain: Option<ReplicaSetCount>,
    desired: i32,
    scale_down: i32,
    current: i32,
) -> i32 {
    match drain {
        Some(rs) if rs.replicas > desired => desired.max(rs.replicas.saturating_sub(scale_down)),
        _ => current,
    }
}

/// Brings `adjust_count` back within maxSurge, then gives back as many of its available pods
/// as maxUnavailable needs, taking the difference out of `drain_count`.
fn adjust_within_limits(
    drain: Option<ReplicaSetCount>,
    adjust: Option<ReplicaSetCount>,
    mut drain_count: i32,
    mut adjust_count: i32,
    max_total: i32,
    min_available: i32,
) -> (i32, i32) {
    let over = |adjust_count: i32, drain_count: i32| {
        adjust_count
            .saturating_add(drain_count)
            .saturating_sub(max_total)
            .max(0)
    };
    let over_limit = over(adjust_count, drain_count);
    let mut available = drain.map_or(0, |rs| rs.available.min(drain_count));
    if let Some(rs) = adjust {
        adjust_count = adjust_count.saturating_sub(over_limit);
        available = available.saturating_add(rs.available.min(adjust_count));
        let lost_available = rs.available.saturating_sub(adjust_count).max(0);
        let still_needed = min_available.saturating_sub(available).max(0);
        adjust_count = adjust_count.saturating_add(lost_available.min(still_needed));
        drain_count = drain_count.saturating_sub(over(adjust_count, drain_count));
    }
    (drain_count, adjust_count)
}

/// How many canary pods a step asks for when a traffic router carries the weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CanaryScale {
    /// `setWeight` (or `setCanaryScale.matchTrafficWeight`), or `setCanaryScale.weight`:
    /// a share of `spec.replicas`.
    Weight(i32),
    /// `setCanaryScale.replicas`: an exact count.
    Replicas(i32),
}

/// What a traffic-routed canary knows when it sizes its ReplicaSets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrafficRoutedInputs {
    pub spec_replicas: i32,
    pub canary_scale: CanaryScale,
    pub max_weight: i32,
    /// `spec.strategy.canary.minPodsPerReplicaSet`.
    pub min_pods_per_replica_set: Option<i32>,
    /// `spec.strategy.canary.dynamicStableScale`.
    pub dynamic_stable_scale: bool,
    /// (canary, stable) weights the router holds now, if known.
    pub current_weights: Option<(i32, i32)>,
    /// `status.abort`.
    pub aborted: bool,
}

/// Canary and stable counts when a router carries the weight: the canary gets its share
/// (rounded up); the stable stays at `spec.replicas` unless `dynamicStableScale`, in which
/// case it keeps enough pods for the larger of the traffic it has and the traffic it will get.
pub fn calculate_replica_counts_for_traffic_routed_canary(
    inputs: TrafficRoutedInputs,
) -> CanaryStableCounts {
    let spec_replicas = inputs.spec_replicas;
    let min_pods =
        |count| min_pods_per_replica_set(count, inputs.min_pods_per_replica_set, spec_replicas);
    let (mut canary, desired_weight) = match inputs.canary_scale {
        CanaryScale::Replicas(count) => (count, 0),
        CanaryScale::Weight(weight) => (
            min_pods(traffic_weight_to_replicas(
                spec_replicas,
                weight,
                inputs.max_weight,
            )),
            weight,
        ),
    };
    if !inputs.dynamic_stable_scale {
        return CanaryStableCounts {
            canary,
            stable: spec_replicas,
        };
    }
    let mut stable = traffic_weight_to_replicas(
        spec_replicas,
        inputs.max_weight.saturating_sub(desired_weight),
        inputs.max_weight,
    );
    if let Some((canary_weight, stable_weight)) = inputs.current_weights {
        stable = stable.max(traffic_weight_to_replicas(
            spec_replicas,
            stable_weight,
            inputs.max_weight,
        ));
        // On abort the canary keeps its pods until the router has moved traffic off them.
        if inputs.aborted {
            canary = canary.max(traffic_weight_to_replicas(
                spec_replicas,
                canary_weight,
                inputs.max_weight,
            ));
        }
    }
    CanaryStableCounts {
        canary: min_pods(canary),
        stable: min_pods(stable),
    }
}

/// Pods for `weight` of `replicas`, rounded up.
pub fn traffic_weight_to_replicas(replicas: i32, weight: i32, max_weight: i32) -> i32 {
    if max_weight <= 0 {
        return 0;
    }
    clamp_i32(ceil_div(
        i64::from(weight) * i64::from(replicas),
        i64::from(max_weight),
    ))
}

/// `minPodsPerReplicaSet` applied to a non-zero count, capped at `spec.replicas` so a small
/// Rollout never asks for more pods than it has.
pub fn min_pods_per_replica_set(count: i32, min_pods: Option<i32>, spec_replicas: i32) -> i32 {
    match min_pods {
        Some(min_pods) if count != 0 => count.max(min_pods.min(spec_replicas)),
        _ => count,
    }
}

/// The canary weight the available pods really give, in percent rounded to the nearest
/// whole number (ties up): 1 available canary pod next to 3 stable ones gives 25.
pub fn actual_weight(canary_available: i32, total_available: i32) -> i32 {
    if total_available <= 0 || canary_available <= 0 {
        return 0;
    }
    let canary = i64::from(canary_available.min(total_available));
    let total = i64::from(total_available);
    clamp_i32((2 * canary * i64::from(MAX_WEIGHT) + total) / (2 * total))
}

/// The sum of pod counts, saturating at `i32::MAX` (observed counts can be anything).
pub fn sum_counts(counts: impl IntoIterator<Item = i32>) -> i32 {
    counts.into_iter().fold(0, i32::saturating_add)
}

/// `value` narrowed to `i32`, clamped at its ends.
fn clamp_i32(value: i64) -> i32 {
    i32::try_from(value).unwrap_or(if value < 0 { i32::MIN } else { i32::MAX })
}

/// `numerator / denominator` rounded up; `denominator` is positive. The operands come from
/// `i32` products, so negating cannot overflow.
fn ceil_div(numerator: i64, denominator: i64) -> i64 {
    -((-numerator).div_euclid(denominator))
}

#[cfg(test)]
mod tests;
