//! Turns a Rollout's spec (canary or blue-green) into what the planner works from: the pod
//! template, the surge and unavailable fenceposts and the pause lengths. The rules a spec must
//! follow live in [`rollouts_crds::validation`]; a spec that breaks one is refused with its
//! first finding.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use rollouts_crds::FieldError;
use rollouts_crds::rollout::{BlueGreenStrategy, CanaryStrategy, Rollout, RolloutAnalysis};
use rollouts_crds::validation::{
    missing_template, negative_replicas, pause_duration, planning_limits, unsupported_features,
    validate_strategy,
};

use super::replicas::{Fenceposts, resolve_fenceposts};
use super::{Claimant, Observed, SharedObject};

/// What validation resolved for planning.
pub(super) struct ValidSpec {
    pub template: serde_json::Value,
    pub fenceposts: Fenceposts,
    /// Per step: the pause length of a timed pause step, `None` otherwise.
    pub pause_durations: Vec<Option<Duration>>,
}

/// Refuses a canary spec the planner cannot plan, else resolves it for planning.
pub(super) fn validate_canary(
    rollout: &Rollout,
    canary: &CanaryStrategy,
) -> Result<ValidSpec, FieldError> {
    let template = template(rollout)?;
    let fenceposts = resolve_fenceposts(
        canary.max_surge.as_ref(),
        canary.max_unavailable.as_ref(),
        rollout.spec.effective_replicas(),
    )?;
    let pause_durations = canary
        .steps()
        .iter()
        .enumerate()
        .map(|(index, step)| match &step.pause {
            Some(pause) => pause_duration(pause, &format!("spec.strategy.canary.steps[{index}]")),
            None => Ok(None),
        })
        .collect::<Result<_, _>>()?;
    Ok(ValidSpec {
        template,
        fenceposts,
        pause_durations,
    })
}

/// Refuses a blue-green spec the planner cannot plan; returns the pod template.
pub(super) fn validate_blue_green(
    rollout: &Rollout,
    _blue_green: &BlueGreenStrategy,
) -> Result<serde_json::Value, FieldError> {
    template(rollout)
}

/// The pod template, once no rule refuses the spec.
fn template(rollout: &Rollout) -> Result<serde_json::Value, FieldError> {
    if let Some(finding) = first_finding(rollout) {
        return Err(finding);
    }
    let template = rollout
        .spec
        .template
        .as_ref()
        .ok_or_else(missing_template)?;
    Ok(serde_json::Value::Object(template.0.clone()))
}

/// The first finding that stops planning. The selector and the template's contents are not
/// checked here: reconcile checked them on the Rollout as written, and with `workloadRef` the
/// planner sees the Deployment's template instead.
fn first_finding(rollout: &Rollout) -> Option<FieldError> {
    negative_replicas(&rollout.spec)
        .into_iter()
        .chain(validate_strategy(rollout))
        .chain(unsupported_features(rollout))
        .chain(planning_limits(rollout))
        .next()
}

/// Refuses a Rollout that names a Service or router object another Rollout drives, naming
/// that Rollout, as Argo does; `None` when this Rollout is the first of those naming each
/// object it names. Who is first:
/// - for a Service, the Rollout its `argo-rollouts.argoproj.io/managed-by-rollouts`
///   annotation names (Argo writes it when a Rollout first points the Service), while that
///   Rollout still names the Service;
/// - otherwise the oldest Rollout naming the object (`metadata.creationTimestamp`, then
///   namespace and name), so every reconcile of every one of them reaches the same answer.
///
/// The first keeps working; the others stay refused with the same message (no status write,
/// no event) until it is deleted or stops naming the object.
pub(super) fn claimed_elsewhere(rollout: &Rollout, observed: &Observed) -> Option<FieldError> {
    let me = Claimant {
        namespace: rollout.metadata.namespace.clone().unwrap_or_default(),
        name: rollout.metadata.name.clone().unwrap_or_default(),
        created: rollout
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(Timestamp::UNIX_EPOCH, |time| time.0),
    };
    observed.shared_objects.iter().find_map(|shared| {
        let owner = first_claimant(&me, shared);
        let mine = owner.namespace == me.namespace && owner.name == me.name;
        (!mine).then(|| managed_elsewhere(&me, shared, owner))
    })
}

/// The Rollout that drives `shared`, of `me` and the others naming it.
fn first_claimant<'a>(me: &'a Claimant, shared: &'a SharedObject) -> &'a Claimant {
    let all = || std::iter::once(me).chain(shared.others.iter());
    let annotated = shared.managed_by.as_deref().and_then(|managed_by| {
        all().find(|claimant| claimant.namespace == shared.namespace && claimant.name == managed_by)
    });
    annotated
        .or_else(|| all().min_by_key(|c| (c.created, c.namespace.as_str(), c.name.as_str())))
        .unwrap_or(me)
}

/// Argo's message (`Service "web" is managed by another Rollout`), with that Rollout's name.
fn managed_elsewhere(me: &Claimant, shared: &SharedObject, owner: &Claimant) -> FieldError {
    let qualified = |namespace: &str, name: &str| {
        if namespace == me.namespace {
            name.to_string()
        } else {
            format!("{namespace}/{name}")
        }
    };
    let object = qualified(&shared.namespace, &shared.name);
    let owner = qualified(&owner.namespace, &owner.name);
    let kind = &shared.kind;
    FieldError::new(
        shared.field.clone(),
        format!("{kind} {object:?} is managed by another Rollout, {owner:?}"),
        format!(
            "only one Rollout may drive a {kind}: name another {kind} here, or take it out of Rollout {owner:?} (or delete that Rollout); this Rollout proceeds as soon as no earlier Rollout names it"
        ),
    )
}

/// Whether `analysis` has templates to run.
pub(super) fn has_templates(analysis: Option<&RolloutAnalysis>) -> bool {
    analysis.is_some_and(|a| !a.templates().is_empty())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use rollouts_crds::conditions::INVALID_SPEC;
    use rollouts_crds::rollout::CanaryStep;

    use super::*;
    use crate::planner::plan_once;
    use crate::planner::test_world::at;

    fn rollout(name: &str, created: i64) -> Rollout {
        let mut rollout = Rollout::test_canary(name, vec![CanaryStep::weight(20)]);
        rollout.metadata.namespace = Some("shop".into());
        rollout.metadata.creation_timestamp = Some(Time(at(created)));
        rollout
    }

    fn claimant(name: &str, created: i64) -> Claimant {
        Claimant {
            namespace: "shop".into(),
            name: name.into(),
            created: at(created),
        }
    }

    fn service_shared_with(others: Vec<Claimant>, managed_by: Option<&str>) -> Observed {
        Observed {
            shared_objects: vec![SharedObject {
                field: "spec.strategy.canary.stableService".into(),
                kind: "Service".into(),
                namespace: "shop".into(),
                name: "web".into(),
                managed_by: managed_by.map(Into::into),
                others,
            }],
            ..Observed::default()
        }
    }

    #[test]
    fn the_younger_of_two_rollouts_on_one_service_is_refused_naming_the_older() {
        let observed = service_shared_with(vec![claimant("first", 10)], None);
        let error = claimed_elsewhere(&rollout("second", 20), &observed).expect("refused");
        assert_eq!(error.path, "spec.strategy.canary.stableService");
        assert_eq!(
            error.reason,
            r#"Service "web" is managed by another Rollout, "first""#
        );
        assert!(error.fix.contains(r#"Rollout "first""#), "{}", error.fix);
        let observed = service_shared_with(vec![claimant("second", 20)], None);
        assert_eq!(claimed_elsewhere(&rollout("first", 10), &observed), None);
    }

    #[test]
    fn the_managed_by_annotation_decides_while_its_rollout_still_names_the_service() {
        // Argo's rule: the Rollout that pointed the Service keeps it, even if it is younger.
        let observed = service_shared_with(vec![claimant("old", 10)], Some("young"));
        assert_eq!(claimed_elsewhere(&rollout("young", 20), &observed), None);
        let observed = service_shared_with(vec![claimant("young", 20)], Some("young"));
        let error = claimed_elsewhere(&rollout("old", 10), &observed).expect("refused");
        assert!(error.reason.contains(r#""young""#), "{}", error.reason);
        // An annotation naming a Rollout that no longer names the Service (or is gone) is
        // stale: the oldest of those naming it now is first.
        let observed = service_shared_with(vec![claimant("young", 20)], Some("deleted"));
        assert_eq!(claimed_elsewhere(&rollout("old", 10), &observed), None);
    }

    #[test]
    fn rollouts_created_the_same_second_are_ordered_by_name() {
        let observed = service_shared_with(vec![claimant("a", 10)], None);
        assert!(claimed_elsewhere(&rollout("b", 10), &observed).is_some());
        let observed = service_shared_with(vec![claimant("b", 10)], None);
        assert_eq!(claimed_elsewhere(&rollout("a", 10), &observed), None);
    }

    #[test]
    fn a_router_object_in_another_namespace_is_named_with_its_namespace() {
        let observed = Observed {
            shared_objects: vec![SharedObject {
                field: "spec.strategy.canary.trafficRouting.istio.virtualService.name".into(),
                kind: "VirtualService".into(),
                namespace: "mesh".into(),
                name: "web".into(),
                managed_by: None,
                others: vec![Claimant {
                    namespace: "other".into(),
                    name: "first".into(),
                    created: at(1),
                }],
            }],
            ..Observed::default()
        };
        let error = claimed_elsewhere(&rollout("second", 20), &observed).expect("refused");
        assert_eq!(
            error.reason,
            r#"VirtualService "mesh/web" is managed by another Rollout, "other/first""#
        );
    }

    #[test]
    fn a_refused_rollout_gets_invalid_spec_touches_nothing_and_stays_stable() {
        let second = rollout("second", 20);
        let observed = service_shared_with(vec![claimant("first", 10)], None);
        let plan = plan_once(&second, &observed, at(30));
        let condition = plan.status.condition(INVALID_SPEC).expect("InvalidSpec");
        assert!(
            condition
                .message
                .contains(r#"managed by another Rollout, "first""#),
            "{}",
            condition.message
        );
        assert!(plan.create_replica_set.is_none());
        assert!(plan.service_selectors.is_empty());
        assert!(plan.scale_replica_sets.is_empty());
        assert!(
            plan.requeue_after.is_some(),
            "looked at again should an event be missed"
        );
        assert_eq!(plan.events.len(), 1, "one Warning event");

        let mut again = second.clone();
        again.status = Some(plan.status.clone());
        let later = plan_once(&again, &observed, at(300));
        assert!(!later.status_changed, "the same refusal writes nothing");
        assert!(later.events.is_empty(), "and publishes no event");

        let freed = plan_once(&again, &Observed::default(), at(400));
        assert!(
            freed.status.condition(INVALID_SPEC).is_none(),
            "proceeds once alone"
        );
        assert!(freed.create_replica_set.is_some());
    }
}
