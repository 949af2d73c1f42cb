//! `spec.workloadRef`: a Rollout whose pod template (and selector, when it has none) comes from
//! a Deployment, and the scale-down of that Deployment (`scaleDown: never | onsuccess |
//! progressively`) as the Rollout takes over its pods, with Argo's rules. The Deployment is read
//! by name on each reconcile (it is not watched), so a Rollout that references one is looked at
//! again every [`WORKLOAD_RECHECK`] to pick up a new template.

use std::borrow::Cow;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::Timestamp;
use rollouts_crds::FieldError;
use rollouts_crds::conditions::{INVALID_SPEC, PHASE_HEALTHY};
use rollouts_crds::rollout::{
    ObjectRef, PodTemplate, Rollout, SCALE_DOWN_NEVER, SCALE_DOWN_ON_SUCCESS,
    SCALE_DOWN_PROGRESSIVELY,
};

use super::{Observed, Plan};

/// How often a Rollout with `workloadRef` reads its Deployment again when nothing else happens.
pub const WORKLOAD_RECHECK: Duration = Duration::from_secs(30);

/// How soon a Rollout whose Deployment is missing or unusable looks again.
pub const MISSING_WORKLOAD_REQUEUE: Duration = Duration::from_secs(20);

/// The only workload kind that can supply the template here.
const DEPLOYMENT_API_VERSION: &str = "apps/v1";
const DEPLOYMENT_KIND: &str = "Deployment";

/// The Deployment `spec.workloadRef` names, as read during observe.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedDeployment {
    pub name: String,
    /// `spec.replicas` (1 when unset, as Kubernetes defaults it).
    pub replicas: i32,
    /// `spec.template`; `None` when the Deployment has none.
    pub template: Option<serde_json::Map<String, serde_json::Value>>,
    /// `spec.selector`.
    pub selector: Option<LabelSelector>,
}

/// A change of the referenced Deployment's `spec.replicas`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeploymentScale {
    pub name: String,
    pub from: i32,
    pub to: i32,
}

/// The Deployment's name when `rollout` has a `workloadRef` this controller can follow.
pub fn deployment_name(rollout: &Rollout) -> Option<&str> {
    let reference = rollout.spec.workload_ref.as_ref()?;
    (supported(reference).is_ok())
        .then_some(reference.name.as_deref())
        .flatten()
        .filter(|name| !name.is_empty())
}

fn supported(reference: &ObjectRef) -> Result<(), FieldError> {
    let kind = reference.kind.as_deref().unwrap_or_default();
    let api_version = reference.api_version.as_deref().unwrap_or_default();
    if kind == DEPLOYMENT_KIND && api_version == DEPLOYMENT_API_VERSION {
        return Ok(());
    }
    Err(FieldError::new(
        "spec.workloadRef.kind",
        format!(
            "{api_version}/{kind} cannot supply the pod template: this controller follows Deployments only"
        ),
        "set workloadRef to apiVersion: apps/v1, kind: Deployment, or write spec.template inline",
    ))
}

/// The Rollout as the planner and the act phase read it: with `workloadRef`, `spec.template`
/// is the Deployment's (the Rollout's own is ignored) and a missing `spec.selector` is the
/// Deployment's. Without `workloadRef` the Rollout itself.
pub fn resolve<'a>(
    rollout: &'a Rollout,
    observed: &Observed,
) -> Result<Cow<'a, Rollout>, FieldError> {
    let Some(reference) = rollout.spec.workload_ref.as_ref() else {
        return Ok(Cow::Borrowed(rollout));
    };
    supported(reference)?;
    let name = reference.name.as_deref().unwrap_or_default();
    let Some(deployment) = observed.workload.as_ref().filter(|d| d.name == name) else {
        return Err(FieldError::new(
            "spec.workloadRef.name",
            format!("Deployment \"{name}\" not found"),
            format!(
                "create Deployment {name} in the Rollout's namespace, or name an existing one in spec.workloadRef.name"
            ),
        ));
    };
    let Some(template) = deployment.template.as_ref() else {
        return Err(FieldError::new(
            "spec.workloadRef.name",
            format!("Deployment \"{name}\" has no spec.template"),
            format!("give Deployment {name} a pod template"),
        ));
    };
    let mut resolved = rollout.clone();
    resolved.spec.template = Some(PodTemplate(template.clone()));
    if resolved.spec.selector.is_none() {
        resolved.spec.selector = deployment.selector.clone();
    }
    Ok(Cow::Owned(resolved))
}

/// `InvalidSpec` for a `workloadRef` that cannot be resolved; nothing else is touched.
pub(super) fn invalid_spec(rollout: &Rollout, error: &FieldError, now: Timestamp) -> Plan {
    let mut plan = super::status::invalid_spec(rollout, error, now);
    plan.requeue_within(MISSING_WORKLOAD_REQUEUE);
    plan
}

/// Looks again at the Deployment every [`WORKLOAD_RECHECK`], and scales it down per
/// `scaleDown`, as Argo does, only while the new ReplicaSet is the Rollout's first revision
/// (the migration from the Deployment):
/// - `onsuccess`: to 0 once the Rollout is Healthy;
/// - `progressively`: to `replicas - status.readyReplicas` while the Rollout comes up (so the
///   two together keep `replicas` ready), to 0 once it is Healthy;
/// - `never` (the default): untouched.
pub(super) fn reconcile(rollout: &Rollout, observed: &Observed, plan: &mut Plan) {
    let Some(reference) = rollout.spec.workload_ref.as_ref() else {
        return;
    };
    plan.requeue_within(WORKLOAD_RECHECK);
    let Some(deployment) = observed.workload.as_ref() else {
        return;
    };
    let mode = reference.scale_down.as_deref().unwrap_or(SCALE_DOWN_NEVER);
    if mode == SCALE_DOWN_NEVER || plan.status.condition(INVALID_SPEC).is_some() {
        return;
    }
    let current_hash = plan.status.current_pod_hash.as_str();
    let Some(new_rs) = observed
        .replica_sets
        .iter()
        .find(|rs| !current_hash.is_empty() && rs.pod_template_hash == current_hash)
    else {
        return;
    };
    if new_rs.revision() != Some(1) {
        return;
    }
    let previous = rollout.status.clone().unwrap_or_default();
    let healthy = previous.phase == PHASE_HEALTHY;
    let target = match mode {
        SCALE_DOWN_ON_SUCCESS => healthy.then_some(0),
        SCALE_DOWN_PROGRESSIVELY if healthy => Some(0),
        SCALE_DOWN_PROGRESSIVELY => {
            let new_replicas = plan
                .scale_replica_sets
                .iter()
                .find(|scale| scale.name == new_rs.name)
                .map_or(new_rs.replicas, |scale| scale.to);
            let moving = previous.ready_replicas > 0 || new_rs.replicas > new_replicas;
            moving.then(|| (rollout.spec.effective_replicas() - previous.ready_replicas).max(0))
        }
        _ => None,
    };
    if let Some(to) = target
        && to != deployment.replicas
    {
        plan.scale_deployment = Some(DeploymentScale {
            name: deployment.name.clone(),
            from: deployment.replicas,
            to,
        });
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rollouts_crds::conditions::INVALID_SPEC_REASON;
    use rollouts_crds::rollout::{CanaryStep, RolloutStatus};
    use serde_json::json;

    use super::*;
    use crate::planner::{ObservedReplicaSet, REVISION_ANNOTATION, plan_once as plan};

    fn now() -> Timestamp {
        Timestamp::from_second(1_800_000_000).expect("valid timestamp")
    }

    fn deployment(image: &str, replicas: i32) -> ObservedDeployment {
        let template = json!({
            "metadata": {"labels": {"app": "catalog"}},
            "spec": {"containers": [{"name": "catalog", "image": image}]}
        });
        ObservedDeployment {
            name: "catalog".into(),
            replicas,
            template: template.as_object().cloned(),
            selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([("app".into(), "catalog".into())])),
                match_expressions: None,
            }),
        }
    }

    /// A canary Rollout of 3 pods taking its template from Deployment `catalog`.
    fn referencing(scale_down: &str) -> Rollout {
        let mut rollout =
            Rollout::test_canary("catalog", vec![CanaryStep::weight(34)]).with_replicas(3);
        rollout.spec.template = None;
        rollout.spec.selector = None;
        rollout.spec.workload_ref = Some(ObjectRef {
            api_version: Some("apps/v1".into()),
            kind: Some("Deployment".into()),
            name: Some("catalog".into()),
            scale_down: Some(scale_down.into()),
        });
        rollout
    }

    fn observed(deployment: ObservedDeployment) -> Observed {
        Observed {
            workload: Some(deployment),
            ..Observed::default()
        }
    }

    /// The ReplicaSet `plan` creates, running with `ready` of its pods ready.
    fn running(plan: &Plan, ready: i32) -> ObservedReplicaSet {
        let new = plan
            .create_replica_set
            .as_ref()
            .expect("a ReplicaSet to create");
        ObservedReplicaSet {
            name: new.name.clone(),
            pod_template_hash: new.pod_template_hash.clone(),
            replicas: new.replicas,
            current_replicas: new.replicas,
            ready_replicas: ready,
            available_replicas: ready,
            annotations: BTreeMap::from([(
                REVISION_ANNOTATION.to_string(),
                new.revision.to_string(),
            )]),
            created: now(),
            min_ready_seconds: 0,
            replica_failure: None,
        }
    }

    #[test]
    fn the_template_and_selector_come_from_the_deployment() {
        let mut rollout = referencing(SCALE_DOWN_NEVER);
        rollout.spec.template = Some(PodTemplate::default());
        let observed = observed(deployment("catalog:1.0", 3));
        let resolved = resolve(&rollout, &observed).expect("resolves");
        let template =
            serde_json::Value::Object(resolved.spec.template.clone().expect("a template").0);
        assert_eq!(template["spec"]["containers"][0]["image"], "catalog:1.0");
        assert_eq!(
            resolved.spec.selector,
            observed.workload.as_ref().and_then(|d| d.selector.clone())
        );

        let plan = plan(&rollout, &observed, now());
        let created = plan
            .create_replica_set
            .expect("creates the first ReplicaSet");
        assert_eq!(created.replicas, 3);
        assert!(plan.status.condition(INVALID_SPEC).is_none());
    }

    #[test]
    fn a_missing_deployment_is_an_invalid_spec_naming_it_and_nothing_is_touched() {
        let rollout = referencing(SCALE_DOWN_PROGRESSIVELY);
        let plan = plan(&rollout, &Observed::default(), now());
        let condition = plan.status.condition(INVALID_SPEC).expect("InvalidSpec");
        assert!(
            condition.message.contains("spec.workloadRef.name"),
            "{}",
            condition.message
        );
        assert!(
            condition
                .message
                .contains("Deployment \"catalog\" not found"),
            "{}",
            condition.message
        );
        assert!(
            plan.events
                .iter()
                .any(|event| event.reason == INVALID_SPEC_REASON)
        );
        assert!(plan.create_replica_set.is_none() && plan.scale_deployment.is_none());
        assert_eq!(plan.requeue_after, Some(MISSING_WORKLOAD_REQUEUE));
    }

    #[test]
    fn only_a_deployment_can_be_referenced() {
        let mut rollout = referencing(SCALE_DOWN_NEVER);
        if let Some(reference) = rollout.spec.workload_ref.as_mut() {
            reference.kind = Some("ReplicaSet".into());
        }
        assert_eq!(deployment_name(&rollout), None);
        let plan = plan(&rollout, &observed(deployment("catalog:1.0", 3)), now());
        let condition = plan.status.condition(INVALID_SPEC).expect("InvalidSpec");
        assert!(
            condition.message.contains("spec.workloadRef.kind"),
            "{}",
            condition.message
        );
        assert!(plan.create_replica_set.is_none());
    }

    #[test]
    fn a_new_deployment_template_is_a_new_revision() {
        let rollout = referencing(SCALE_DOWN_NEVER);
        let first = plan(&rollout, &observed(deployment("catalog:1.0", 3)), now());
        let second = plan(&rollout, &observed(deployment("catalog:2.0", 3)), now());
        let hash = |plan: &Plan| {
            plan.create_replica_set
                .as_ref()
                .map(|rs| rs.pod_template_hash.clone())
        };
        assert_ne!(hash(&first), hash(&second));
    }

    /// The Rollout after its first ReplicaSet was created, with `ready` pods ready and the given
    /// phase in the status the previous reconcile wrote.
    fn migrating(scale_down: &str, ready: i32, phase: &str) -> (Rollout, Observed) {
        let rollout = referencing(scale_down);
        let mut observed = observed(deployment("catalog:1.0", 3));
        let created = plan(&rollout, &observed, now());
        observed.replica_sets.push(running(&created, ready));
        let status = RolloutStatus {
            ready_replicas: ready,
            phase: phase.into(),
            ..created.status
        };
        (rollout.with_status(status), observed)
    }

    fn deployment_target(scale_down: &str, ready: i32, phase: &str) -> Option<i32> {
        let (rollout, observed) = migrating(scale_down, ready, phase);
        let plan = plan(&rollout, &observed, now());
        assert!(
            plan.requeue_after
                .is_some_and(|after| after <= WORKLOAD_RECHECK)
        );
        plan.scale_deployment.map(|scale| {
            assert_eq!((scale.name.as_str(), scale.from), ("catalog", 3));
            scale.to
        })
    }

    #[test]
    fn progressively_keeps_the_two_together_at_replicas_then_scales_to_zero() {
        assert_eq!(
            deployment_target(SCALE_DOWN_PROGRESSIVELY, 0, "Progressing"),
            None
        );
        assert_eq!(
            deployment_target(SCALE_DOWN_PROGRESSIVELY, 1, "Progressing"),
            Some(2)
        );
        assert_eq!(
            deployment_target(SCALE_DOWN_PROGRESSIVELY, 3, "Progressing"),
            Some(0)
        );
        assert_eq!(
            deployment_target(SCALE_DOWN_PROGRESSIVELY, 3, PHASE_HEALTHY),
            Some(0)
        );
    }

    #[test]
    fn onsuccess_waits_for_healthy_and_never_leaves_the_deployment_alone() {
        assert_eq!(
            deployment_target(SCALE_DOWN_ON_SUCCESS, 2, "Progressing"),
            None
        );
        assert_eq!(
            deployment_target(SCALE_DOWN_ON_SUCCESS, 3, PHASE_HEALTHY),
            Some(0)
        );
        assert_eq!(deployment_target(SCALE_DOWN_NEVER, 3, PHASE_HEALTHY), None);
    }

    #[test]
    fn the_workload_ref_example_is_planned_from_its_deployment() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/rollout-workload-ref.yaml"
        );
        let text = std::fs::read_to_string(path).expect("the example exists");
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).expect("YAML");
        let rollout: Rollout = serde_json::from_value(docs[0].clone()).expect("a Rollout");
        let deployment = &docs[1];
        let observed = observed(ObservedDeployment {
            name: deployment["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .into(),
            replicas: 3,
            template: deployment["spec"]["template"].as_object().cloned(),
            selector: serde_json::from_value(deployment["spec"]["selector"].clone()).ok(),
        });
        let plan = plan(&rollout, &observed, now());
        assert!(
            plan.status.condition(INVALID_SPEC).is_none(),
            "{:?}",
            plan.status
        );
        assert_eq!(plan.create_replica_set.map(|rs| rs.replicas), Some(3));
    }

    #[test]
    fn a_later_revision_does_not_scale_the_deployment() {
        let (rollout, mut observed) = migrating(SCALE_DOWN_ON_SUCCESS, 3, PHASE_HEALTHY);
        observed.replica_sets[0]
            .annotations
            .insert(REVISION_ANNOTATION.into(), "2".into());
        assert_eq!(plan(&rollout, &observed, now()).scale_deployment, None);
    }
}
