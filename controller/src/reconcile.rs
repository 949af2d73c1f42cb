//! Reconciling one Rollout: observe it, its ReplicaSets and its AnalysisRuns, refuse an invalid
//! spec (the `InvalidSpec` condition and a Warning event), otherwise plan and act
//! ([`apply_plan`]). `error_policy` logs, counts and backs off.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use rollouts_crds::FieldError;
use rollouts_crds::analysis::AnalysisRun;
use rollouts_crds::conditions;
use rollouts_crds::rollout::{
    DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY, ROLLOUT_CANARY_STEP_INDEX_LABEL, ROLLOUT_TYPE_LABEL, Rollout,
};
use rollouts_crds::validation;
use rollouts_traffic::TrafficRouter;
use tracing::instrument;

use crate::act::{self, LiveServices};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::planner::{
    self, Observed, ObservedAnalysisRun, ObservedDeployment, ObservedPod, ObservedReplicaSet,
};
use crate::status_patch;

/// How soon an invalid Rollout is looked at again: the cause may be timing (a Service applied
/// after the Rollout), as Argo assumes.
pub const INVALID_SPEC_REQUEUE: Duration = Duration::from_secs(20);

/// How soon a reconcile that found the watch caches behind its own writes looks again; the
/// watch event that brings them up to date triggers it sooner.
pub const CACHE_CATCH_UP: Duration = Duration::from_millis(500);

/// How long a reconcile waits for the first list of ReplicaSets and AnalysisRuns.
const CACHE_SYNC_TIMEOUT: Duration = Duration::from_secs(60);

/// Reconciles one Rollout; timing and outcome go to metrics.
#[instrument(skip(rollout, ctx), fields(namespace = rollout.namespace(), name = rollout.name_any()))]
pub async fn reconcile(rollout: Arc<Rollout>, ctx: Arc<Context>) -> Result<Action> {
    let namespace = rollout
        .namespace()
        .ok_or_else(|| Error::MissingObjectKey(rollout.name_any()))?;
    let name = rollout.name_any();
    let started = Instant::now();
    let key = object_key(&namespace, &name);
    let rollout = if ctx.is_stale(&key, rollout.resource_version().as_deref()) {
        // The watch has not caught up with our last status write: plan from the API's copy,
        // or a step could be taken twice.
        let api: Api<Rollout> = Api::namespaced(ctx.client.clone(), &namespace);
        match api.get_opt(&name).await {
            Ok(Some(fresh)) => Arc::new(fresh),
            Ok(None) => return Ok(Action::await_change()),
            Err(source) => {
                return Err(Error::GetRollout {
                    namespace,
                    name,
                    source: Box::new(source),
                });
            }
        }
    } else {
        rollout
    };
    let outcome = reconcile_rollout(&rollout, &namespace, &ctx).await;
    ctx.metrics
        .observe_reconcile(&namespace, &name, started.elapsed());
    if outcome.is_ok() {
        ctx.record_success(&key);
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
    let Some(routers) = ready_routers(rollout, namespace, ctx).await? else {
        return Ok(Action::requeue(INVALID_SPEC_REQUEUE));
    };
    if !ctx.caches.wait_ready(CACHE_SYNC_TIMEOUT).await {
        tracing::warn!(
            timeout = ?CACHE_SYNC_TIMEOUT,
            "the ReplicaSet and AnalysisRun watches have not listed yet: check that the controller's role may list and watch them"
        );
        return Ok(Action::requeue(CACHE_CATCH_UP));
    }
    if let Some(lagging) = ctx.caches.lagging(&rollout.uid().unwrap_or_default()) {
        // Planning from it could create a second ReplicaSet or scale twice.
        tracing::debug!(%lagging, "the watch cache does not show our last write yet");
        return Ok(Action::requeue(CACHE_CATCH_UP));
    }
    let (observed, services) = observe(rollout, namespace, &routers, ctx).await?;
    apply_plan(rollout, &observed, &services, &routers, ctx).await
}

/// Everything that stops the controller acting on this spec: Argo's validation and the
/// features this controller does not implement.
pub fn spec_findings(rollout: &Rollout) -> Vec<FieldError> {
    let mut findings = validation::validate(rollout);
    findings.extend(validation::unsupported_features(rollout));
    findings
}

/// Plans the Rollout's next move from what was observed and applies it. A strategy the
/// planner does not plan yet still gets `observedGeneration` and a `conditions` list.
pub async fn apply_plan(
    rollout: &Rollout,
    observed: &Observed,
    services: &LiveServices,
    routers: &[Box<dyn TrafficRouter>],
    ctx: &Context,
) -> Result<Action> {
    // With workloadRef, the ReplicaSets are built from the Deployment's template.
    let resolved = planner::workload_ref::resolve(rollout, observed).ok();
    let rollout = resolved.as_deref().unwrap_or(rollout);
    let plan = planner::coalesce::plan(rollout, observed, Timestamp::now());
    tracing::debug!(
        replica_sets = observed.replica_sets.len(),
        analysis_runs = observed.analysis_runs.len(),
        noop = plan.is_noop(),
        resource_version = rollout.resource_version(),
        step = ?rollout.status.as_ref().and_then(|status| status.current_step_index),
        next_step = ?plan.status.current_step_index,
        events = ?plan.events.iter().map(|event| event.reason.as_str()).collect::<Vec<_>>(),
        "planned"
    );
    let status = if plan.status.observed_generation == status_patch::observed_generation(rollout) {
        plan.status.clone()
    } else {
        status_patch::observed_status(rollout)
    };
    act::apply(rollout, observed, services, routers, &plan, &status, ctx).await
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
    if !act::write_status(rollout, &desired, ctx).await? {
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

/// Reads the ReplicaSets and AnalysisRuns the Rollout controls (by owner UID) from the watch
/// caches, ReplicaSets narrowed by its selector labels, and GETs the Services its spec names:
/// a Rollout is reconciled only while something moves, so reading them fresh costs nothing at
/// rest, where a cache would hold every Service in scope.
async fn observe(
    rollout: &Rollout,
    namespace: &str,
    routers: &[Box<dyn TrafficRouter>],
    ctx: &Context,
) -> Result<(Observed, LiveServices)> {
    let uid = rollout.uid().unwrap_or_default();
    let replica_sets: Vec<ObservedReplicaSet> = ctx
        .caches
        .replica_sets
        .owned_by(&uid)
        .iter()
        .filter(|rs| selected_by(rollout, rs.labels()))
        .map(|rs| observed_replica_set(rs))
        .collect();
    let analysis_runs = ctx
        .caches
        .analysis_runs
        .owned_by(&uid)
        .iter()
        .map(|run| observed_analysis_run(run))
        .collect();
    let service_api: Api<Service> = Api::namespaced(ctx.client.clone(), namespace);
    let mut services = LiveServices::new();
    let mut missing_services = BTreeSet::new();
    for (_, service) in act::named_services(rollout) {
        match service_api.get_opt(&service).await {
            Ok(Some(live)) => {
                services.insert(service, live);
            }
            Ok(None) => {
                missing_services.insert(service);
            }
            Err(source) => {
                return Err(Error::Read {
                    kind: "Service",
                    namespace: namespace.to_string(),
                    object: service,
                    rollout: rollout.name_any(),
                    source: Box::new(source),
                });
            }
        }
    }
    let (restart_pods, workload) =
        observe_restart_and_workload(rollout, &replica_sets, ctx).await?;
    // Every field named: a field the planner adds must be observed here, not defaulted.
    let observed = Observed {
        replica_sets,
        analysis_runs,
        missing_services,
        traffic_weight_verified: act::verify_recorded_weight(rollout, routers).await?,
        restart_pods,
        workload,
    };
    Ok((observed, services))
}

/// The pods a pending `spec.restartAt` restart needs (listed by the ReplicaSet selector, kept
/// when one of `replica_sets` controls them; not listed otherwise, as pods are not watched) and
/// the Deployment `spec.workloadRef` names (read by name; `None` when it does not exist).
async fn observe_restart_and_workload(
    rollout: &Rollout,
    replica_sets: &[ObservedReplicaSet],
    ctx: &Context,
) -> Result<(Option<Vec<ObservedPod>>, Option<ObservedDeployment>)> {
    let namespace = rollout.namespace().unwrap_or_default();
    let read_error = |kind: &'static str, object: String| {
        let namespace = namespace.clone();
        move |source: kube::Error| Error::Read {
            kind,
            namespace,
            object,
            rollout: rollout.name_any(),
            source: Box::new(source),
        }
    };
    let mut restart_pods = None;
    if planner::restart::needs_restart(rollout, Timestamp::now()) {
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
        let params = ListParams::default().labels(&replica_set_selector(rollout));
        let list = api
            .list(&params)
            .await
            .map_err(read_error("Pod", replica_set_selector(rollout)))?;
        let controlled = |pod: &&Pod| {
            pod.owner_references().iter().any(|owner| {
                owner.controller == Some(true)
                    && owner.kind == "ReplicaSet"
                    && replica_sets.iter().any(|rs| rs.name == owner.name)
            })
        };
        let pods = list
            .items
            .iter()
            .filter(controlled)
            .map(observed_pod)
            .collect();
        restart_pods = Some(pods);
    }
    let mut workload = None;
    if let Some(name) = planner::workload_ref::deployment_name(rollout) {
        let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &namespace);
        let found = api
            .get_opt(name)
            .await
            .map_err(read_error("Deployment", name.to_string()))?;
        workload = found.map(|deployment| observed_deployment(&deployment));
    }
    Ok((restart_pods, workload))
}

fn observed_pod(pod: &Pod) -> ObservedPod {
    let replica_set = pod
        .owner_references()
        .iter()
        .find(|owner| owner.controller == Some(true))
        .map(|owner| owner.name.clone())
        .unwrap_or_default();
    let ready_since = pod
        .status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .and_then(|conditions| {
            conditions
                .iter()
                .find(|condition| condition.type_ == "Ready" && condition.status == "True")
        })
        .map(|condition| {
            condition
                .last_transition_time
                .as_ref()
                .map_or(Timestamp::UNIX_EPOCH, |time| time.0)
        });
    ObservedPod {
        name: pod.name_any(),
        replica_set,
        created: pod
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(Timestamp::UNIX_EPOCH, |time| time.0),
        ready_since,
        terminating: pod.metadata.deletion_timestamp.is_some(),
    }
}

fn observed_deployment(deployment: &Deployment) -> ObservedDeployment {
    let spec = deployment.spec.as_ref();
    let template = spec
        .and_then(|spec| serde_json::to_value(&spec.template).ok())
        .and_then(|template| match template {
            serde_json::Value::Object(map) => Some(map),
            _ => None,
        });
    ObservedDeployment {
        name: deployment.name_any(),
        replicas: spec.and_then(|spec| spec.replicas).unwrap_or(1),
        template,
        selector: spec.map(|spec| spec.selector.clone()),
    }
}

/// The ReplicaSet carries every label of the Rollout's `selector.matchLabels` (the watch
/// already asked for the `rollouts-pod-template-hash` label), as the LIST by
/// [`replica_set_selector`] did.
fn selected_by(rollout: &Rollout, labels: &BTreeMap<String, String>) -> bool {
    rollout
        .spec
        .selector
        .as_ref()
        .and_then(|selector| selector.match_labels.as_ref())
        .is_none_or(|wanted| {
            wanted
                .iter()
                .all(|(key, value)| labels.get(key) == Some(value))
        })
}

fn observed_analysis_run(run: &AnalysisRun) -> ObservedAnalysisRun {
    let status = run.status.clone().unwrap_or_default();
    ObservedAnalysisRun {
        name: run.name_any(),
        pod_template_hash: run
            .labels()
            .get(DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY)
            .cloned()
            .unwrap_or_default(),
        step_index: run
            .labels()
            .get(ROLLOUT_CANARY_STEP_INDEX_LABEL)
            .and_then(|index| index.parse().ok()),
        phase: status.phase,
        message: status.message,
        terminating: run.spec.terminate,
        rollout_type: run
            .labels()
            .get(ROLLOUT_TYPE_LABEL)
            .cloned()
            .unwrap_or_default(),
        created: run
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(Timestamp::UNIX_EPOCH, |time| time.0),
    }
}

/// The routers of `spec.strategy.canary.trafficRouting` once they can be acted on; none without
/// it. A configuration the routers refuse gets `InvalidSpec` (`None`: look again later); a router
/// object that does not exist gets `InvalidSpec` naming it, and the reconcile fails so it is
/// retried with backoff (and at once when the object appears, through the router watches).
/// Nothing is scaled or routed meanwhile.
async fn ready_routers(
    rollout: &Rollout,
    namespace: &str,
    ctx: &Context,
) -> Result<Option<Vec<Box<dyn TrafficRouter>>>> {
    let routed = rollout
        .spec
        .strategy
        .canary
        .as_ref()
        .is_some_and(|canary| canary.traffic_routing.is_some());
    if !routed {
        return Ok(Some(Vec::new()));
    }
    let failed = |operation: &'static str, source: rollouts_traffic::Error| Error::Traffic {
        operation,
        router: "trafficRouting".to_string(),
        namespace: namespace.to_string(),
        rollout: rollout.name_any(),
        source: Box::new(source),
    };
    let routers = match rollouts_traffic::routers(ctx.client.clone(), rollout) {
        Ok(routers) => routers,
        Err(rollouts_traffic::Error::InvalidSpec { field, reason, .. }) => {
            let finding = FieldError::new(
                field,
                reason,
                "correct spec.strategy.canary.trafficRouting as the reason says",
            );
            record_invalid_spec(rollout, namespace, &[finding], ctx).await?;
            return Ok(None);
        }
        Err(source) => return Err(failed("configure", source)),
    };
    match rollouts_traffic::check_router_objects(&ctx.client, rollout).await {
        Ok(()) => Ok(Some(routers)),
        Err(rollouts_traffic::Error::NotFound {
            kind,
            object,
            rollout: reference,
            field,
        }) => {
            let finding = FieldError::new(
                field.as_str(),
                format!("{kind} {object} not found"),
                format!(
                    "create {kind} {object}, or name an existing one in {field} (the {kind} CRD must be installed)"
                ),
            );
            record_invalid_spec(rollout, namespace, &[finding], ctx).await?;
            let source = rollouts_traffic::Error::NotFound {
                kind,
                object,
                rollout: reference,
                field,
            };
            Err(failed("find the router objects", source))
        }
        Err(source) => Err(failed("find the router objects", source)),
    }
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
    fn an_analysis_run_is_observed_with_its_step_hash_and_phase() {
        let run: AnalysisRun = serde_json::from_value(serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "AnalysisRun",
            "metadata": {
                "name": "web-abc-2-1",
                "labels": {"rollout-type": "Step", "step-index": "1", "rollouts-pod-template-hash": "abc"}
            },
            "spec": {"metrics": [], "terminate": true},
            "status": {"phase": "Failed", "message": "error rate too high"}
        }))
        .expect("an AnalysisRun");
        let observed = observed_analysis_run(&run);
        assert_eq!(observed.name, "web-abc-2-1");
        assert_eq!(observed.pod_template_hash, "abc");
        assert_eq!(observed.step_index, Some(1));
        assert_eq!(observed.rollout_type, "Step");
        assert_eq!(
            observed.phase,
            rollouts_crds::analysis::AnalysisPhase::Failed
        );
        assert_eq!(observed.message, "error rate too high");
        assert!(observed.terminating);
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
