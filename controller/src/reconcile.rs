//! Reconciling one Rollout: refuse an invalid spec (the `InvalidSpec` condition and a Warning
//! event), otherwise observe ([`crate::observe`]), plan ([`crate::planner::plan`]) and act
//! ([`crate::act::apply`]). `error_policy` logs, counts and backs off.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use rollouts_crds::FieldError;
use rollouts_crds::conditions;
use rollouts_crds::rollout::Rollout;
use rollouts_crds::validation;
use rollouts_traffic::TrafficRouter;
use tracing::instrument;

use crate::act;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::observe::{self, LiveServices};
use crate::packed::PackedRollout;
use crate::planner::{self, Observed};
use crate::status_patch;
use crate::supervise::{self, Panicked};

/// How soon an invalid Rollout is looked at again: the cause may be timing (a Service applied
/// after the Rollout), as Argo assumes.
pub const INVALID_SPEC_REQUEUE: Duration = Duration::from_secs(20);

/// How soon a reconcile that found the watch caches behind its own writes looks again; the
/// watch event that brings them up to date triggers it sooner.
pub const CACHE_CATCH_UP: Duration = Duration::from_millis(500);

/// How long a reconcile waits for the first list of ReplicaSets and AnalysisRuns.
const CACHE_SYNC_TIMEOUT: Duration = Duration::from_secs(60);

/// Reconciles one Rollout; timing and outcome go to metrics. A panic inside is this Rollout's
/// error (logged, counted in `rollouts_controller_reconcile_panics_total`), so `error_policy`
/// backs it off while every other Rollout is still served.
pub async fn reconcile(rollout: Arc<Rollout>, ctx: Arc<Context>) -> Result<Action> {
    let namespace = rollout.namespace().unwrap_or_default();
    let name = rollout.name_any();
    let panics = ctx.metrics.reconcile_panics.clone();
    let reconcile = reconcile_uncontained(rollout, ctx);
    match supervise::contain("rollout", &namespace, &name, &panics, reconcile).await {
        Ok(outcome) => outcome,
        Err(Panicked { message }) => Err(Error::ReconcilePanicked {
            namespace,
            name,
            message,
        }),
    }
}

/// [`reconcile`] for the Rollout the watch cache packed ([`PackedRollout`]).
pub async fn reconcile_packed(rollout: Arc<PackedRollout>, ctx: Arc<Context>) -> Result<Action> {
    match rollout.unpack() {
        Ok(unpacked) => reconcile(Arc::new(unpacked), ctx).await,
        Err(reason) => Err(Error::CachedRollout {
            namespace: rollout.namespace().unwrap_or_default(),
            name: rollout.name_any(),
            reason,
        }),
    }
}

#[instrument(skip(rollout, ctx), fields(namespace = rollout.namespace(), name = rollout.name_any()))]
async fn reconcile_uncontained(rollout: Arc<Rollout>, ctx: Arc<Context>) -> Result<Action> {
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
pub fn error_policy<K: Resource>(rollout: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action {
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
            "the ReplicaSet, AnalysisRun and Experiment watches have not listed yet: check that the controller's role may list and watch them"
        );
        return Ok(Action::requeue(CACHE_CATCH_UP));
    }
    if let Some(undecodable) = ctx.caches.undecodable(&rollout.uid().unwrap_or_default()) {
        // Planning without it could create again what exists; its watch reported it, and a
        // change to it triggers this Rollout again.
        tracing::debug!(%undecodable, "an object this Rollout owns cannot be decoded; nothing is changed until it decodes or is deleted");
        return Ok(Action::requeue(INVALID_SPEC_REQUEUE));
    }
    if let Some(lagging) = ctx.caches.lagging(&rollout.uid().unwrap_or_default()) {
        // Planning from it could create a second ReplicaSet or scale twice.
        tracing::debug!(%lagging, "the watch cache does not show our last write yet");
        return Ok(Action::requeue(CACHE_CATCH_UP));
    }
    let (observed, services) = observe::observe(rollout, namespace, &routers, ctx).await?;
    apply_plan(rollout, observed, &services, &routers, ctx).await
}

/// Everything that stops the controller acting on this spec: Argo's validation and the
/// features this controller does not implement.
pub fn spec_findings(rollout: &Rollout) -> Vec<FieldError> {
    let mut findings = validation::validate(rollout);
    findings.extend(validation::unsupported_features(rollout));
    findings
}

/// Plans the Rollout's next move from what was observed and applies it. Analysis templates are
/// read only when the plan starts a run; the Rollout is then planned again with them, at the
/// same instant, so a missing template is a planned `InvalidSpec`.
pub async fn apply_plan(
    rollout: &Rollout,
    mut observed: Observed,
    services: &LiveServices,
    routers: &[Box<dyn TrafficRouter>],
    ctx: &Context,
) -> Result<Action> {
    let now = Timestamp::now();
    let (mut resolved, mut plan) = planner::plan(rollout, &observed, now);
    if plan
        .create_analysis_runs
        .iter()
        .any(|run| run.spec.is_none())
    {
        let namespace = rollout.namespace().unwrap_or_default();
        observed.analysis_templates = observe::templates(rollout, &namespace, ctx).await?;
        (resolved, plan) = planner::plan(rollout, &observed, now);
    }
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
    act::apply(&resolved, &observed, services, routers, &plan, ctx).await
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
    if !act::write_status(rollout, &desired, ctx).await? {
        // Said once, when the condition was written; a Rollout that stays invalid is quiet.
        tracing::debug!(%message, "spec is still invalid");
        return Ok(());
    }
    tracing::info!(%message, "spec is invalid; nothing is changed until it is fixed");
    let reason = conditions::INVALID_SPEC_REASON;
    let once = crate::events::Once {
        regarding: rollout.object_ref(&()),
        decided_at: rollout
            .meta()
            .resource_version
            .as_deref()
            .unwrap_or_default(),
        warning: true,
        reason,
        note: &message,
        action: "Validate",
    };
    match crate::events::send(&ctx.client, &ctx.reporter, &once).await {
        Ok(crate::events::Sent::Created) => {
            ctx.metrics
                .event_published(namespace, &rollout.name_any(), "Warning", reason)
        }
        Ok(crate::events::Sent::AlreadyThere) => {}
        Err(source) => {
            // An event is a courtesy; the condition already says what is wrong.
            let error = Error::PublishEvent {
                namespace: namespace.to_string(),
                name: rollout.name_any(),
                reason: reason.to_string(),
                source: Box::new(source),
            };
            tracing::warn!(%error, "event not published");
        }
    }
    Ok(())
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

fn object_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

#[cfg(test)]
mod tests {
    use rollouts_crds::rollout::{CanaryStep, RolloutStrategy};

    use super::*;

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
