//! Anti-affinity between revisions (`spec.strategy.canary.antiAffinity`,
//! `spec.strategy.blueGreen.antiAffinity`): the pod anti-affinity term a new ReplicaSet's
//! template gets against the stable revision's pods, built as Argo builds it, so new pods avoid
//! the nodes that run the old version.

use rollouts_crds::rollout::{AntiAffinity, DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY, Rollout};

use super::{AffinityRefresh, Observed};
use serde_json::{Value, json};

/// The node label the injected term spreads over, as in Argo.
pub const TOPOLOGY_KEY: &str = "kubernetes.io/hostname";

/// The strategy's `antiAffinity` when it asks for a rule (Argo reads canary over blue-green).
pub fn rollout_anti_affinity(rollout: &Rollout) -> Option<&AntiAffinity> {
    let strategy = &rollout.spec.strategy;
    let canary = strategy
        .canary
        .as_ref()
        .and_then(|canary| canary.anti_affinity.as_ref());
    let blue_green = strategy
        .blue_green
        .as_ref()
        .and_then(|blue_green| blue_green.anti_affinity.as_ref());
    canary.or(blue_green).filter(|anti_affinity| {
        anti_affinity
            .preferred_during_scheduling_ignored_during_execution
            .is_some()
            || anti_affinity
                .required_during_scheduling_ignored_during_execution
                .is_some()
    })
}

/// The term that keeps a pod off nodes running pods of revision `stable_hash`.
pub fn injected_term(namespace: &str, stable_hash: &str) -> Value {
    json!({
        "labelSelector": {
            "matchExpressions": [{
                "key": DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY,
                "operator": "In",
                "values": [stable_hash],
            }],
        },
        "namespaces": [namespace],
        "topologyKey": TOPOLOGY_KEY,
    })
}

/// Adds the anti-affinity term against `status.stableRS` to `template` (a pod template as
/// JSON) for the ReplicaSet of `current_hash`, keeping the template's own affinity rules.
/// Nothing is added without `antiAffinity`, without a stable revision, or when the new
/// revision is the stable one.
pub fn inject(template: &mut Value, rollout: &Rollout, current_hash: &str) {
    let Some(anti_affinity) = rollout_anti_affinity(rollout) else {
        return;
    };
    let stable_hash = rollout
        .status
        .as_ref()
        .map(|status| status.stable_rs.as_str())
        .unwrap_or_default();
    if stable_hash.is_empty() || stable_hash == current_hash {
        return;
    }
    let namespace = rollout.metadata.namespace.as_deref().unwrap_or("default");
    let term = injected_term(namespace, stable_hash);
    let (list, entry) = match &anti_affinity.preferred_during_scheduling_ignored_during_execution {
        Some(preferred) => (
            "preferredDuringSchedulingIgnoredDuringExecution",
            json!({ "weight": preferred.weight, "podAffinityTerm": term }),
        ),
        None => ("requiredDuringSchedulingIgnoredDuringExecution", term),
    };
    let Some(anti) = object_at(template, &["spec", "affinity", "podAntiAffinity"]) else {
        return;
    };
    let terms = anti.entry(list).or_insert_with(|| json!([]));
    if !terms.is_array() {
        *terms = json!([]);
    }
    if let Some(terms) = terms.as_array_mut() {
        terms.push(entry);
    }
}

/// The object at `path` under `value`, created (replacing anything that is not an object) on
/// the way; `None` when `value` itself is not an object.
fn object_at<'a>(
    value: &'a mut Value,
    path: &[&str],
) -> Option<&'a mut serde_json::Map<String, Value>> {
    let mut at = value.as_object_mut()?;
    for key in path {
        let next = at.entry(*key).or_insert_with(|| json!({}));
        if !next.is_object() {
            *next = json!({});
        }
        at = next.as_object_mut()?;
    }
    Some(at)
}

/// The revision an injected term in `template` keeps pods away from, if it has one.
pub fn injected_stable_hash(template: &Value) -> Option<String> {
    let anti = &template["spec"]["affinity"]["podAntiAffinity"];
    let preferred = anti["preferredDuringSchedulingIgnoredDuringExecution"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|entry| &entry["podAffinityTerm"]);
    let required = anti["requiredDuringSchedulingIgnoredDuringExecution"]
        .as_array()
        .into_iter()
        .flatten();
    preferred.chain(required).find_map(|term| {
        term["labelSelector"]["matchExpressions"]
            .as_array()?
            .iter()
            .find(|expression| expression["key"] == DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY)?["values"]
            .get(0)?
            .as_str()
            .map(str::to_string)
    })
}

/// Whether the current revision's ReplicaSet may carry a term against a revision that is no
/// longer stable: the Rollout asks for anti-affinity and is mid-update.
pub fn may_need_refresh(rollout: &Rollout, current_hash: &str) -> bool {
    let stable_hash = rollout
        .status
        .as_ref()
        .map(|status| status.stable_rs.as_str())
        .unwrap_or_default();
    rollout_anti_affinity(rollout).is_some()
        && !stable_hash.is_empty()
        && stable_hash != current_hash
}

/// The refresh of the current revision's anti-affinity, when its live template (read into
/// `observed.live_templates`) names a revision other than the stable one.
pub(super) fn planned_refresh(
    rollout: &Rollout,
    observed: &Observed,
    current_hash: &str,
) -> Option<AffinityRefresh> {
    let rs = observed
        .replica_sets
        .iter()
        .find(|rs| rs.pod_template_hash == current_hash)?;
    let live_template = observed.live_templates.get(&rs.name)?;
    let affinity = refreshed_affinity(live_template, rollout, current_hash)?;
    Some(AffinityRefresh {
        replica_set: rs.name.clone(),
        affinity,
    })
}

/// The affinity the live template of the `current_hash` ReplicaSet should have when its
/// injected term names a revision other than the stable one: the Rollout's own affinity plus a
/// term against the stable revision (Argo regenerates it the same way). `None` when it is right.
pub fn refreshed_affinity(
    live_template: &Value,
    rollout: &Rollout,
    current_hash: &str,
) -> Option<Value> {
    if !may_need_refresh(rollout, current_hash) {
        return None;
    }
    let stable_hash = rollout.status.as_ref()?.stable_rs.as_str();
    if injected_stable_hash(live_template)? == stable_hash {
        return None;
    }
    let mut template = rollout
        .spec
        .template
        .as_ref()
        .map(|template| Value::Object(template.0.clone()))
        .unwrap_or_else(|| json!({}));
    inject(&mut template, rollout, current_hash);
    Some(template["spec"]["affinity"].clone())
}

#[cfg(test)]
mod tests {
    use rollouts_crds::rollout::{
        CanaryStep, PreferredDuringSchedulingIgnoredDuringExecution,
        RequiredDuringSchedulingIgnoredDuringExecution, RolloutStatus,
    };

    use super::*;

    fn with_stable(rollout: Rollout, stable: &str) -> Rollout {
        let mut rollout = rollout.with_status(RolloutStatus {
            stable_rs: stable.into(),
            ..RolloutStatus::default()
        });
        rollout.metadata.namespace = Some("shop".into());
        rollout
    }

    fn preferred(weight: i32) -> AntiAffinity {
        AntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(
                PreferredDuringSchedulingIgnoredDuringExecution { weight },
            ),
            required_during_scheduling_ignored_during_execution: None,
        }
    }

    #[test]
    fn a_canary_gets_a_weighted_term_against_the_stable_hash() {
        let rollout = Rollout::test_canary("web", vec![CanaryStep::weight(20)])
            .with_canary(|canary| canary.anti_affinity = Some(preferred(50)));
        let rollout = with_stable(rollout, "stable1");
        let mut template = json!({"spec": {"containers": []}});
        inject(&mut template, &rollout, "canary2");
        assert_eq!(
            template["spec"]["affinity"],
            json!({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 50,
                "podAffinityTerm": {
                    "labelSelector": {"matchExpressions": [{
                        "key": "rollouts-pod-template-hash", "operator": "In", "values": ["stable1"]
                    }]},
                    "namespaces": ["shop"],
                    "topologyKey": "kubernetes.io/hostname"
                }
            }]}})
        );
        assert_eq!(injected_stable_hash(&template).as_deref(), Some("stable1"));
    }

    #[test]
    fn a_required_rule_is_appended_after_the_templates_own_terms() {
        let rollout = Rollout::test_blue_green("web").with_blue_green(|blue_green| {
            blue_green.anti_affinity = Some(AntiAffinity {
                preferred_during_scheduling_ignored_during_execution: None,
                required_during_scheduling_ignored_during_execution: Some(
                    RequiredDuringSchedulingIgnoredDuringExecution {},
                ),
            })
        });
        let rollout = with_stable(rollout, "blue");
        let own = json!({"topologyKey": "zone", "labelSelector": {"matchLabels": {"db": "x"}}});
        let mut template = json!({"spec": {"affinity": {
            "nodeAffinity": {"x": 1},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [own.clone()]}
        }}});
        inject(&mut template, &rollout, "green");
        let terms = &template["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
        assert_eq!(terms[0], own);
        assert_eq!(terms[1], injected_term("shop", "blue"));
        assert_eq!(
            template["spec"]["affinity"]["nodeAffinity"],
            json!({"x": 1})
        );
        assert_eq!(injected_stable_hash(&template).as_deref(), Some("blue"));
    }

    #[test]
    fn a_term_against_an_old_stable_is_pointed_at_the_current_one() {
        let rollout = Rollout::test_canary("web", vec![CanaryStep::weight(20)])
            .with_canary(|canary| canary.anti_affinity = Some(preferred(30)));
        let created = with_stable(rollout.clone(), "first");
        let mut live = json!({"spec": {"containers": []}});
        inject(&mut live, &created, "canary");
        assert_eq!(refreshed_affinity(&live, &created, "canary"), None);

        let later = with_stable(rollout, "second");
        assert!(may_need_refresh(&later, "canary"));
        let affinity = refreshed_affinity(&live, &later, "canary").expect("a new term");
        let refreshed = json!({"spec": {"affinity": affinity}});
        assert_eq!(injected_stable_hash(&refreshed).as_deref(), Some("second"));
        assert!(!may_need_refresh(&later, "second"));
        assert_eq!(refreshed_affinity(&live, &later, "second"), None);
    }

    #[test]
    fn nothing_is_injected_without_a_distinct_stable_or_a_rule() {
        let asked = Rollout::test_canary("web", vec![])
            .with_canary(|canary| canary.anti_affinity = Some(preferred(10)));
        let empty_rule = Rollout::test_canary("web", vec![])
            .with_canary(|canary| canary.anti_affinity = Some(AntiAffinity::default()));
        for (rollout, stable, current) in [
            (with_stable(asked.clone(), ""), "", "new"),
            (with_stable(asked, "same"), "same", "same"),
            (with_stable(empty_rule, "old"), "old", "new"),
        ] {
            let mut template = json!({"spec": {}});
            inject(&mut template, &rollout, current);
            assert_eq!(template, json!({"spec": {}}), "stable {stable:?}");
            assert_eq!(injected_stable_hash(&template), None);
        }
    }

    #[test]
    fn a_template_of_any_shape_is_injected_into_or_left_alone() {
        let rollout = Rollout::test_canary("web", vec![CanaryStep::weight(20)])
            .with_canary(|canary| canary.anti_affinity = Some(preferred(50)));
        let rollout = with_stable(rollout, "stable1");
        for shape in [
            json!("a string"),
            json!([1, 2]),
            json!(null),
            json!({"spec": "a string"}),
            json!({"spec": {"affinity": [1]}}),
            json!({"spec": {"affinity": {"podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": "x"
            }}}}),
        ] {
            let mut template = shape.clone();
            inject(&mut template, &rollout, "canary1");
            if shape.is_object() {
                assert_eq!(injected_stable_hash(&template).as_deref(), Some("stable1"));
            } else {
                assert_eq!(template, shape);
            }
        }
    }
}
