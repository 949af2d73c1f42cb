//! Defaults exactly as Argo Rollouts applies them, in one place. The stored spec keeps what the
//! user wrote; the controller reads effective values through these accessors.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::rollout::{
    BlueGreenStrategy, CanaryStrategy, NginxTrafficRouting, RolloutSpec, SetMirrorRoute,
};

pub const DEFAULT_REPLICAS: i32 = 1;
pub const DEFAULT_REVISION_HISTORY_LIMIT: i32 = 10;
pub const DEFAULT_ANALYSIS_RUN_SUCCESSFUL_HISTORY_LIMIT: i32 = 5;
pub const DEFAULT_ANALYSIS_RUN_UNSUCCESSFUL_HISTORY_LIMIT: i32 = 5;
/// Argo stores the surge and unavailable defaults as `"25"` and reads them as percentages.
pub const DEFAULT_MAX_SURGE: &str = "25%";
pub const DEFAULT_MAX_UNAVAILABLE: &str = "25%";
pub const DEFAULT_PROGRESS_DEADLINE_SECONDS: i32 = 600;
pub const DEFAULT_SCALE_DOWN_DELAY_SECONDS: i32 = 30;
pub const DEFAULT_ABORT_SCALE_DOWN_DELAY_SECONDS: i32 = 30;
pub const DEFAULT_AUTO_PROMOTION_ENABLED: bool = true;
pub const DEFAULT_MAX_TRAFFIC_WEIGHT: i32 = 100;
pub const DEFAULT_NGINX_ANNOTATION_PREFIX: &str = "nginx.ingress.kubernetes.io";
pub const DEFAULT_MIRROR_PERCENTAGE: i32 = 100;

impl RolloutSpec {
    /// `replicas`, default 1.
    pub fn effective_replicas(&self) -> i32 {
        self.replicas.unwrap_or(DEFAULT_REPLICAS)
    }

    /// `revisionHistoryLimit`, default 10.
    pub fn effective_revision_history_limit(&self) -> i32 {
        self.revision_history_limit
            .unwrap_or(DEFAULT_REVISION_HISTORY_LIMIT)
    }

    /// `progressDeadlineSeconds`, default 600.
    pub fn effective_progress_deadline_seconds(&self) -> i32 {
        self.progress_deadline_seconds
            .unwrap_or(DEFAULT_PROGRESS_DEADLINE_SECONDS)
    }

    /// `progressDeadlineAbort`, default false.
    pub fn effective_progress_deadline_abort(&self) -> bool {
        self.progress_deadline_abort.unwrap_or(false)
    }

    /// `minReadySeconds`, default 0.
    pub fn effective_min_ready_seconds(&self) -> i32 {
        self.min_ready_seconds.unwrap_or(0)
    }

    /// `paused`, default false.
    pub fn is_paused(&self) -> bool {
        self.paused.unwrap_or(false)
    }

    /// `analysis.successfulRunHistoryLimit`, default 5.
    pub fn effective_successful_run_history_limit(&self) -> i32 {
        self.analysis
            .as_ref()
            .and_then(|a| a.successful_run_history_limit)
            .unwrap_or(DEFAULT_ANALYSIS_RUN_SUCCESSFUL_HISTORY_LIMIT)
    }

    /// `analysis.unsuccessfulRunHistoryLimit`, default 5.
    pub fn effective_unsuccessful_run_history_limit(&self) -> i32 {
        self.analysis
            .as_ref()
            .and_then(|a| a.unsuccessful_run_history_limit)
            .unwrap_or(DEFAULT_ANALYSIS_RUN_UNSUCCESSFUL_HISTORY_LIMIT)
    }

    /// Canary `maxSurge`, default 25%. Blue-green has no surge setting.
    pub fn effective_max_surge(&self) -> IntOrString {
        self.strategy
            .canary
            .as_ref()
            .and_then(|c| c.max_surge.clone())
            .unwrap_or_else(|| IntOrString::String(DEFAULT_MAX_SURGE.to_string()))
    }

    /// `maxUnavailable` of whichever strategy is set (blue-green first, as Argo reads it),
    /// default 25%.
    pub fn effective_max_unavailable(&self) -> IntOrString {
        let blue_green = self
            .strategy
            .blue_green
            .as_ref()
            .and_then(|b| b.max_unavailable.clone());
        let canary = self
            .strategy
            .canary
            .as_ref()
            .and_then(|c| c.max_unavailable.clone());
        blue_green
            .or(canary)
            .unwrap_or_else(|| IntOrString::String(DEFAULT_MAX_UNAVAILABLE.to_string()))
    }

    /// Surge and unavailable pod counts for `effective_replicas()`: surge rounds up,
    /// unavailable rounds down, and when both come out 0 unavailable becomes 1 (Argo's rule, so
    /// an update can always make progress). Errors name the malformed value.
    pub fn resolve_fenceposts(&self) -> Result<(i32, i32), IntOrPercentError> {
        let replicas = self.effective_replicas();
        let surge = scaled_value(&self.effective_max_surge(), replicas, true)?;
        let unavailable = scaled_value(&self.effective_max_unavailable(), replicas, false)?;
        if surge == 0 && unavailable == 0 {
            return Ok((0, 1));
        }
        Ok((surge, unavailable))
    }

    /// How long an old ReplicaSet keeps running after traffic left it: blue-green always,
    /// default 30s; canary only with traffic routing, default 30s; otherwise zero.
    pub fn effective_scale_down_delay(&self) -> Duration {
        let seconds = if let Some(blue_green) = &self.strategy.blue_green {
            blue_green
                .scale_down_delay_seconds
                .unwrap_or(DEFAULT_SCALE_DOWN_DELAY_SECONDS)
        } else if let Some(canary) = self.canary_with_traffic_routing() {
            canary
                .scale_down_delay_seconds
                .unwrap_or(DEFAULT_SCALE_DOWN_DELAY_SECONDS)
        } else {
            0
        };
        seconds_to_duration(seconds)
    }

    /// How long the canary / preview ReplicaSet keeps running after an abort. `None` means it
    /// is never scaled down (an explicit `abortScaleDownDelaySeconds: 0`). Blue-green defaults to
    /// 30s; canary defaults to 30s with traffic routing and to zero without it.
    pub fn effective_abort_scale_down_delay(&self) -> Option<Duration> {
        let (explicit, default) = if let Some(blue_green) = &self.strategy.blue_green {
            (
                blue_green.abort_scale_down_delay_seconds,
                DEFAULT_ABORT_SCALE_DOWN_DELAY_SECONDS,
            )
        } else if let Some(canary) = self.canary_with_traffic_routing() {
            (
                canary.abort_scale_down_delay_seconds,
                DEFAULT_ABORT_SCALE_DOWN_DELAY_SECONDS,
            )
        } else {
            (None, 0)
        };
        match explicit {
            Some(0) => None,
            Some(seconds) => Some(seconds_to_duration(seconds)),
            None => Some(seconds_to_duration(default)),
        }
    }

    /// Whether the user asked for a delayed scale-down on abort (an explicit non-zero
    /// `abortScaleDownDelaySeconds` that Argo honours for this strategy).
    pub fn has_explicit_abort_scale_down_delay(&self) -> bool {
        let explicit = if let Some(blue_green) = &self.strategy.blue_green {
            blue_green.abort_scale_down_delay_seconds
        } else if let Some(canary) = self.canary_with_traffic_routing() {
            canary.abort_scale_down_delay_seconds
        } else {
            None
        };
        matches!(explicit, Some(seconds) if seconds != 0)
    }

    /// `trafficRouting.maxTrafficWeight`, default 100: the total weights are expressed against.
    pub fn effective_max_traffic_weight(&self) -> i32 {
        self.strategy
            .canary
            .as_ref()
            .and_then(|c| c.traffic_routing.as_ref())
            .and_then(|t| t.max_traffic_weight)
            .unwrap_or(DEFAULT_MAX_TRAFFIC_WEIGHT)
    }

    fn canary_with_traffic_routing(&self) -> Option<&CanaryStrategy> {
        self.strategy
            .canary
            .as_ref()
            .filter(|c| c.traffic_routing.is_some())
    }
}

impl BlueGreenStrategy {
    /// `autoPromotionEnabled`, default true.
    pub fn effective_auto_promotion_enabled(&self) -> bool {
        self.auto_promotion_enabled
            .unwrap_or(DEFAULT_AUTO_PROMOTION_ENABLED)
    }
}

impl CanaryStrategy {
    /// `dynamicStableScale`, default false.
    pub fn effective_dynamic_stable_scale(&self) -> bool {
        self.dynamic_stable_scale.unwrap_or(false)
    }
}

impl NginxTrafficRouting {
    /// `annotationPrefix`, default `nginx.ingress.kubernetes.io`.
    pub fn effective_annotation_prefix(&self) -> &str {
        self.annotation_prefix
            .as_deref()
            .filter(|p| !p.is_empty())
            .unwrap_or(DEFAULT_NGINX_ANNOTATION_PREFIX)
    }
}

impl SetMirrorRoute {
    /// `percentage`, default 100.
    pub fn effective_percentage(&self) -> i32 {
        self.percentage.unwrap_or(DEFAULT_MIRROR_PERCENTAGE)
    }
}

/// Why an int-or-percent (`maxSurge`, `maxUnavailable`) cannot be read as a count.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IntOrPercentError {
    #[error("{text:?} is neither an integer nor a percentage like \"25%\"")]
    NotAPercentage { text: String },
    #[error("{text:?} of {total} is out of range")]
    OutOfRange { text: String, total: i32 },
    #[error("{text:?} is too large a percentage to count pods with")]
    PercentOutOfRange { text: String },
}

/// An int-or-percent (`3`, `"25%"`) as a count of `total`, rounding a percentage up or down.
/// A string without `%` is an error, as Kubernetes treats it.
pub fn scaled_value(
    value: &IntOrString,
    total: i32,
    round_up: bool,
) -> Result<i32, IntOrPercentError> {
    match value {
        IntOrString::Int(n) => Ok(*n),
        IntOrString::String(text) => {
            let percent = parse_percent(text)?;
            let scaled = i64::from(percent) * i64::from(total);
            let count = if round_up {
                (scaled + 99).div_euclid(100)
            } else {
                scaled.div_euclid(100)
            };
            i32::try_from(count).map_err(|_| IntOrPercentError::OutOfRange {
                text: text.clone(),
                total,
            })
        }
    }
}

/// `"25%"` as 25; anything else is an error naming the value (a number beyond `i32` says so).
pub fn parse_percent(text: &str) -> Result<i32, IntOrPercentError> {
    let not_a_percentage = || IntOrPercentError::NotAPercentage {
        text: text.to_string(),
    };
    let digits = text.strip_suffix('%').ok_or_else(not_a_percentage)?;
    digits.parse::<i32>().map_err(|e| match e.kind() {
        std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => {
            IntOrPercentError::PercentOutOfRange {
                text: text.to_string(),
            }
        }
        _ => not_a_percentage(),
    })
}

fn seconds_to_duration(seconds: i32) -> Duration {
    Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::{Rollout, RolloutTrafficRouting};

    fn canary() -> Rollout {
        Rollout::test_canary("web", vec![])
    }

    #[test]
    fn spec_defaults_match_argo() {
        let mut spec = canary().spec;
        spec.replicas = None;
        assert_eq!(spec.effective_replicas(), 1);
        assert_eq!(spec.effective_revision_history_limit(), 10);
        assert_eq!(spec.effective_progress_deadline_seconds(), 600);
        assert!(!spec.effective_progress_deadline_abort());
        assert!(!spec.is_paused());
        assert_eq!(spec.effective_successful_run_history_limit(), 5);
        assert_eq!(spec.effective_unsuccessful_run_history_limit(), 5);
        assert_eq!(
            spec.effective_max_surge(),
            IntOrString::String("25%".into())
        );
        assert_eq!(
            spec.effective_max_unavailable(),
            IntOrString::String("25%".into())
        );
        assert_eq!(spec.effective_max_traffic_weight(), 100);
    }

    #[test]
    fn written_values_win_over_defaults() {
        let mut spec = canary().spec;
        spec.replicas = Some(0);
        spec.revision_history_limit = Some(2);
        spec.progress_deadline_seconds = Some(30);
        spec.paused = Some(true);
        let canary = spec.strategy.canary.as_mut().expect("canary");
        canary.max_surge = Some(IntOrString::Int(0));
        canary.max_unavailable = Some(IntOrString::String("10%".into()));
        assert_eq!(spec.effective_replicas(), 0);
        assert_eq!(spec.effective_revision_history_limit(), 2);
        assert_eq!(spec.effective_progress_deadline_seconds(), 30);
        assert!(spec.is_paused());
        assert_eq!(spec.effective_max_surge(), IntOrString::Int(0));
        assert_eq!(
            spec.effective_max_unavailable(),
            IntOrString::String("10%".into())
        );
    }

    #[test]
    fn fenceposts_round_surge_up_unavailable_down_and_never_both_zero() {
        let spec = canary().with_replicas(10).spec;
        assert_eq!(spec.resolve_fenceposts(), Ok((3, 2)));
        let spec = canary().with_replicas(1).spec;
        assert_eq!(spec.resolve_fenceposts(), Ok((1, 0)));
        let mut spec = canary().with_replicas(3).spec;
        let c = spec.strategy.canary.as_mut().expect("canary");
        c.max_surge = Some(IntOrString::Int(0));
        c.max_unavailable = Some(IntOrString::String("10%".into()));
        assert_eq!(spec.resolve_fenceposts(), Ok((0, 1)));
        let c = spec.strategy.canary.as_mut().expect("canary");
        c.max_surge = Some(IntOrString::String("lots".into()));
        assert!(spec.resolve_fenceposts().is_err());
    }

    #[test]
    fn scale_down_delays_depend_on_strategy_and_traffic_routing() {
        let basic = canary().spec;
        assert_eq!(basic.effective_scale_down_delay(), Duration::ZERO);
        assert_eq!(
            basic.effective_abort_scale_down_delay(),
            Some(Duration::ZERO)
        );
        assert!(!basic.has_explicit_abort_scale_down_delay());

        let routed = canary()
            .with_traffic_routing(RolloutTrafficRouting::default())
            .spec;
        assert_eq!(routed.effective_scale_down_delay(), Duration::from_secs(30));
        assert_eq!(
            routed.effective_abort_scale_down_delay(),
            Some(Duration::from_secs(30))
        );

        let mut blue_green = Rollout::test_blue_green("web").spec;
        assert_eq!(
            blue_green.effective_scale_down_delay(),
            Duration::from_secs(30)
        );
        let bg = blue_green.strategy.blue_green.as_mut().expect("blue-green");
        bg.abort_scale_down_delay_seconds = Some(0);
        bg.scale_down_delay_seconds = Some(5);
        assert_eq!(blue_green.effective_abort_scale_down_delay(), None);
        assert!(!blue_green.has_explicit_abort_scale_down_delay());
        assert_eq!(
            blue_green.effective_scale_down_delay(),
            Duration::from_secs(5)
        );
        let bg = blue_green.strategy.blue_green.as_mut().expect("blue-green");
        bg.abort_scale_down_delay_seconds = Some(60);
        assert_eq!(
            blue_green.effective_abort_scale_down_delay(),
            Some(Duration::from_secs(60))
        );
        assert!(blue_green.has_explicit_abort_scale_down_delay());
    }

    #[test]
    fn strategy_level_defaults() {
        let bg = Rollout::test_blue_green("web")
            .spec
            .strategy
            .blue_green
            .expect("blue-green");
        assert!(bg.effective_auto_promotion_enabled());
        assert!(!CanaryStrategy::default().effective_dynamic_stable_scale());
        assert_eq!(
            NginxTrafficRouting::default().effective_annotation_prefix(),
            "nginx.ingress.kubernetes.io"
        );
        assert_eq!(SetMirrorRoute::default().effective_percentage(), 100);
    }

    #[test]
    fn scaled_values() {
        assert_eq!(scaled_value(&IntOrString::Int(4), 10, true), Ok(4));
        assert_eq!(
            scaled_value(&IntOrString::String("5%".into()), 4, true),
            Ok(1)
        );
        assert_eq!(
            scaled_value(&IntOrString::String("5%".into()), 4, false),
            Ok(0)
        );
        assert!(scaled_value(&IntOrString::String("5".into()), 4, false).is_err());
        assert_eq!(
            parse_percent("9223372036854775807%"),
            Err(IntOrPercentError::PercentOutOfRange {
                text: "9223372036854775807%".into()
            })
        );
        assert_eq!(parse_percent("-5%"), Ok(-5));
        assert!(matches!(
            scaled_value(&IntOrString::String("2147483647%".into()), i32::MAX, true),
            Err(IntOrPercentError::OutOfRange { .. })
        ));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn int_or_percent() -> impl Strategy<Value = IntOrString> {
            prop_oneof![
                any::<i32>().prop_map(IntOrString::Int),
                any::<i64>().prop_map(|n| IntOrString::String(format!("{n}%"))),
                any::<i32>().prop_map(|n| IntOrString::String(format!("{n}%"))),
                "\\PC{0,12}".prop_map(IntOrString::String),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(1000))]

            /// Any value against any total: a count or an error naming the value.
            #[test]
            fn any_int_or_percent_scales_or_errs(
                value in int_or_percent(),
                total in any::<i32>(),
                round_up in any::<bool>(),
            ) {
                if let (IntOrString::String(text), Err(e)) =
                    (&value, scaled_value(&value, total, round_up))
                {
                    let quoted = format!("{text:?}");
                    prop_assert!(e.to_string().contains(&quoted), "{e}");
                }
            }

            /// Any surge, unavailable and replicas: fenceposts or an error.
            #[test]
            fn any_fenceposts_resolve_or_err(
                surge in proptest::option::of(int_or_percent()),
                unavailable in proptest::option::of(int_or_percent()),
                replicas in proptest::option::of(any::<i32>()),
            ) {
                let mut spec = Rollout::test_canary("web", vec![]).spec;
                spec.replicas = replicas;
                if let Some(canary) = spec.strategy.canary.as_mut() {
                    canary.max_surge = surge;
                    canary.max_unavailable = unavailable;
                }
                let _ = spec.resolve_fenceposts();
            }
        }
    }
}
