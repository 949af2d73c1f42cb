//! Reconciling one Rollout: observe it and its ReplicaSets, refuse an invalid spec (the
//! `InvalidSpec` condition and a Warning event), otherwise hand over to [`apply_plan`], the seam
//! where the planner's plan is applied. `error_policy` logs, counts and backs off.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use rollouts_crds::FieldError;
use rollouts_crds::conditions;
use rollouts_crds::rollout::{DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY, Rollout, RolloutStatus};
use rollouts_crds::validation;
use serde_json::Value;
use tracing::instrument;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::planner::{Observed, ObservedReplicaSet};
use crate::status_patch;

/// How soon an invalid Rollout is looked at again: the cause may be timing (a Service applied
/// after the Rollout), as Argo assumes.
pub const INVALID_SPEC_REQUEUE: Duration = Duration::from_secs(20);

/// Reconciles one Rollout; timing and outcome go to metrics.
#[instrument(skip(rollout, ctx), fields(namespace = rollout.namespace(), name = rollout.name_any()))]
pub async fn reconcile(rollout: Arc<Rollout>, ctx: Arc<Context>) -> Result<Action> {
    let namespace = rollout
        .namespace()
        .ok_or_else(|| Error::MissingObjectKey(rollout.name_any()))?;
    let name = rollout.name_any();
    let started = Instant::now();
    let outcome = reconcile_rollout(&rollout, &namespace, &ctx).await;
    ctx.metrics
        .observe_reconcile(&namespace, &name, started.elapsed());
    if outcome.is_ok() {
        ctx.record_success(&object_key(&namespace, &name));
    }
    outcome
}

/// Logs and counts a failed reconcile, then retries with a growing backoff.
pub fn error_policy(rollout: Arc<Rollout>, error: &Error, ctx: Arc<Context>) -> Action {
    let namespace = rollout.namespace().unwrap_or_default();
    let name = rollout.name_any();
    ctx.metrics.reconcile_failed(&namespace, &name, error);
    let retry_in = ctx.record_failure(&object_key(&namespace, &name));
    tracing::warn!(%namespace, %name, %error, error_kind = error.metric_label(), ?retry_in, "reconcile failed");
    Action::requeue(retry_in)
}

async fn reconcile_rollout(rollout: &Rollout, namespace: &str, ctx: &Context) -> Result<Action> {
    let findings = spec_findings(rollout);
    if !findings.is_empty() {
        record_invalid_spec(rollout, namespace, &findings, ctx).await?;
        return Ok(Action::requeue(INVALID_SPEC_REQUEUE));
    }
    let observed = observe(rollout, namespace, ctx).await?;
    apply_plan(rollout, &observed, ctx).await
}

/// Everything that stops the controller acting on this spec: Argo's validation and the
/// features this controller does not implement.
pub fn spec_findings(rollout: &Rollout) -> Vec<FieldError> {
    let mut findings = validation::validate(rollout);
    findings.extend(validation::unsupported_features(rollout));
    findings
}

/// The seam where the planner's plan is applied. No plan yet: it records
/// `status.observedGeneration` and keeps `status.conditions` a list, and writes nothing else.
pub async fn apply_plan(rollout: &Rollout, observed: &Observed, ctx: &Context) -> Result<Action> {
    tracing::debug!(replica_sets = observed.replica_sets.len(), "observed");
    let desired = status_patch::observed_status(rollout);
    write_status(rollout, &desired, ctx).await?;
    Ok(Action::await_change())
}

/// Writes the `InvalidSpec` condition; the Warning event goes out only when the status
/// changed, so a Rollout that stays invalid does not flood events.
async fn record_invalid_spec(
    rollout: &Rollout,
    namespace: &str,
    findings: &[FieldError],
    ctx: &Context,
) -> Result<()> {
    let desired = status_patch::invalid_spec_status(rollout, findings, Timestamp::now());
    let message = status_patch::invalid_spec_message(rollout, findings);
    tracing::info!(%message, "spec is invalid; nothing is changed until it is fixed");
    if !write_status(rollout, &desired, ctx).await? {
        return Ok(());
    }
    let event = Event {
        type_: EventType::Warning,
        reason: conditions::INVALID_SPEC_REASON.to_string(),
        note: Some(message),
        action: "Validate".to_string(),
        secondary: None,
    };
    match ctx.recorder.publish(&event, &rollout.object_ref(&())).await {
        Ok(()) => {
            ctx.metrics
                .event_published(namespace, &rollout.name_any(), "Warning", &event.reason)
        }
        Err(source) => {
            // An event is a courtesy; the condition already says what is wrong.
            let error = Error::PublishEvent {
                namespace: namespace.to_string(),
                name: rollout.name_any(),
                reason: event.reason.clone(),
                source: Box::new(source),
            };
            tracing::warn!(%error, "event not published");
        }
    }
    Ok(())
}

/// Merge-patches `/status` to `desired` when it differs; returns whether it wrote.
async fn write_status(rollout: &Rollout, desired: &RolloutStatus, ctx: &Context) -> Result<bool> {
    let namespace = rollout.namespace().unwrap_or_default();
    let name = rollout.name_any();
    let patch: Option<Value> =
        status_patch::status_patch(rollout, desired).map_err(|source| Error::EncodeStatus {
            namespace: namespace.clone(),
            name: name.clone(),
            source,
        })?;
    let Some(patch) = patch else {
        return Ok(false);
    };
    let api: Api<Rollout> = Api::namespaced(ctx.client.clone(), &namespace);
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::PatchStatus {
            namespace,
            name,
            source: Box::new(source),
        })?;
    Ok(true)
}

/// Lists the ReplicaSets the Rollout controls (by owner UID), narrowed by its selector labels.
async fn observe(rollout: &Rollout, namespace: &str, ctx: &Context) -> Result<Observed> {
    let api: Api<ReplicaSet> = Api::namespaced(ctx.client.clone(), namespace);
    let params = ListParams::default().labels(&replica_set_selector(rollout));
    let list = api
        .list(&params)
        .await
        .map_err(|source| Error::ListReplicaSets {
            namespace: namespace.to_string(),
            name: rollout.name_any(),
            source: Box::new(source),
        })?;
    let uid = rollout.uid();
    let replica_sets = list
        .items
        .iter()
        .filter(|rs| {
            rs.owner_references()
                .iter()
                .any(|owner| owner.controller == Some(true) && Some(&owner.uid) == uid.as_ref())
        })
        .map(observed_replica_set)
        .collect();
    Ok(Observed {
        replica_sets,
        ..Observed::default()
    })
}

/// `rollouts-pod-template-hash` plus the selector's matchLabels: only our ReplicaSets come back.
pub fn replica_set_selector(rollout: &Rollout) -> String {
    let mut terms = vec![DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY.to_string()];
    if let Some(labels) = rollout
        .spec
        .selector
        .as_ref()
        .and_then(|selector| selector.match_labels.as_ref())
    {
        terms.extend(labels.iter().map(|(key, value)| format!("{key}={value}")));
    }
    terms.join(",")
}

fn observed_replica_set(rs: &ReplicaSet) -> ObservedReplicaSet {
    let status = rs.status.clone().unwrap_or_default();
    ObservedReplicaSet {
        name: rs.name_any(),
        pod_template_hash: rs
            .labels()
            .get(DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY)
            .cloned()
            .unwrap_or_default(),
        replicas: rs.spec.as_ref().and_then(|spec| spec.replicas).unwrap_or(1),
        current_replicas: status.replicas,
        ready_replicas: status.ready_replicas.unwrap_or(0),
        available_replicas: status.available_replicas.unwrap_or(0),
        annotations: rs.annotations().clone(),
        created: rs
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(Timestamp::UNIX_EPOCH, |time| time.0),
    }
}

fn object_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::apps::v1::{ReplicaSetSpec, ReplicaSetStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
    use rollouts_crds::rollout::{CanaryStep, RolloutStrategy};

    use super::*;

    #[test]
    fn replica_sets_are_selected_by_hash_label_and_match_labels() {
        let mut rollout = Rollout::test_canary("web", vec![CanaryStep::weight(20)]);
        rollout.spec.selector = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([("app".to_string(), "web".to_string())])),
            ..LabelSelector::default()
        });
        assert_eq!(
            replica_set_selector(&rollout),
            "rollouts-pod-template-hash,app=web"
        );
        rollout.spec.selector = None;
        assert_eq!(replica_set_selector(&rollout), "rollouts-pod-template-hash");
    }

    #[test]
    fn a_replica_set_is_observed_with_its_hash_and_counts() {
        let rs = ReplicaSet {
            metadata: ObjectMeta {
                name: Some("web-abc".into()),
                labels: Some(BTreeMap::from([(
                    DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY.to_string(),
                    "abc".to_string(),
                )])),
                ..ObjectMeta::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(3),
                ..ReplicaSetSpec::default()
            }),
            status: Some(ReplicaSetStatus {
                replicas: 3,
                ready_replicas: Some(2),
                available_replicas: Some(1),
                ..ReplicaSetStatus::default()
            }),
        };
        let observed = observed_replica_set(&rs);
        assert_eq!(observed.name, "web-abc");
        assert_eq!(observed.pod_template_hash, "abc");
        assert_eq!(
            (
                observed.replicas,
                observed.current_replicas,
                observed.ready_replicas,
                observed.available_replicas
            ),
            (3, 3, 2, 1)
        );
    }

    #[test]
    fn a_rollout_without_strategy_has_a_finding_naming_the_field() {
        let mut rollout = Rollout::test_canary("web", vec![CanaryStep::weight(20)]);
        rollout.spec.strategy = RolloutStrategy::default();
        let findings = spec_findings(&rollout);
        assert!(
            findings.iter().any(|f| f.path == "spec.strategy"),
            "{findings:?}"
        );
    }
}
