//! One AnalysisRun reconcile: re-read a stale copy, plan, measure, write the status, publish
//! events and requeue when the next measurement is due; the error policy's backoff.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use rollouts_analysis::engine::{self, Plan};
use rollouts_crds::analysis::{AnalysisRun, AnalysisRunSpec};
use tracing::instrument;

use super::arguments::field_refs_resolved;
use super::context::{AnalysisContext, lock};
use super::measure::measure;
use super::status::{StatusWrite, publish, write_status};
use super::ttl::collect_expired;
use super::{Error, Result};
use super::{bounds, budget};
use crate::context::retry_backoff;

pub(super) fn object_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Reconciles one AnalysisRun.
#[instrument(skip(run, ctx), fields(namespace = run.namespace(), name = run.name_any()))]
pub async fn reconcile(run: Arc<AnalysisRun>, ctx: Arc<AnalysisContext>) -> Result<Action> {
    let namespace = run
        .namespace()
        .ok_or_else(|| Error::MissingNamespace(run.name_any()))?;
    let name = run.name_any();
    // A finished run is never measured or written again: no provider call, and no API call
    // unless its spec.ttlStrategy says it is to be deleted.
    if run
        .status
        .as_ref()
        .is_some_and(|status| status.phase.is_completed())
    {
        // Its last status write is behind it: nothing is to be checked against it any more.
        lock(&ctx.status_written).remove(&object_key(&namespace, &name));
        return collect_expired(&run, &namespace, &ctx).await;
    }
    let key = object_key(&namespace, &name);
    let run = if take_stale(&ctx, &key, run.resource_version().as_deref()) {
        let api: Api<AnalysisRun> = Api::namespaced(ctx.client.clone(), &namespace);
        match api.get_opt(&name).await {
            Ok(Some(fresh)) => Arc::new(fresh),
            Ok(None) => return Ok(Action::await_change()),
            Err(source) => {
                return Err(Error::GetRun {
                    namespace,
                    name,
                    source: Box::new(source),
                });
            }
        }
    } else {
        run
    };
    let action = reconcile_run(&run, &namespace, &ctx).await?;
    lock(&ctx.failures).remove(&key);
    Ok(action)
}

/// Logs and counts a failed reconcile, then retries with a growing backoff.
pub fn error_policy(run: Arc<AnalysisRun>, error: &Error, ctx: Arc<AnalysisContext>) -> Action {
    let key = object_key(&run.namespace().unwrap_or_default(), &run.name_any());
    ctx.metrics.reconcile_failed(error);
    let failures = {
        let mut failures = lock(&ctx.failures);
        let count = failures.entry(key.clone()).or_insert(0);
        *count = count.saturating_add(1);
        *count
    };
    let retry_in = retry_backoff(failures);
    tracing::warn!(run = %key, %error, error_kind = error.metric_label(), ?retry_in, "AnalysisRun reconcile failed");
    Action::requeue(retry_in)
}

/// Whether a cached copy of `key` at `resource_version` may predate our last status write;
/// forgets the write once it has been seen or re-read.
fn take_stale(ctx: &AnalysisContext, key: &str, resource_version: Option<&str>) -> bool {
    match lock(&ctx.status_written).remove(key) {
        Some(written) => Some(written.as_str()) != resource_version,
        None => false,
    }
}

async fn reconcile_run(
    run: &AnalysisRun,
    namespace: &str,
    ctx: &AnalysisContext,
) -> Result<Action> {
    // Whole seconds, as the API stores times: due times computed here then match the status
    // the next reconcile reads back.
    let now = Timestamp::now();
    let now = Timestamp::from_second(now.as_second()).unwrap_or(now);
    let status = run.status.clone().unwrap_or_default();
    let mut outcome = match field_refs_resolved(run) {
        Err(e) => engine::invalid(&status, &e.to_string(), now),
        Ok(spec) => match bounds::check(&spec)
            .map_err(|e| format!("Analysis spec invalid: {e}"))
            .and_then(|()| providers_chosen(&spec))
            .and_then(|()| {
                bounds::check_status(&status).map_err(|e| format!("Analysis status invalid: {e}"))
            }) {
            Err(message) => engine::invalid(&status, &message, now),
            Ok(()) => match engine::plan(&spec, &status, now) {
                Plan::Completed => return Ok(Action::await_change()),
                Plan::Invalid { message } => engine::invalid(&status, &message, now),
                Plan::Measure(schedule) => {
                    measure(run, namespace, &spec, &status, &schedule, now, ctx).await?
                }
            },
        },
    };
    budget::fit(&mut outcome.status);
    if outcome.status.phase != status.phase {
        tracing::info!(phase = %outcome.status.phase, message = %outcome.status.message, "AnalysisRun phase changed");
    }
    let wrote = match write_status(run, namespace, &outcome.status, ctx).await? {
        StatusWrite::Unchanged => false,
        StatusWrite::Written => true,
        StatusWrite::Conflict => {
            // Written by someone else since our copy: plan again from the API's copy.
            tracing::debug!("the status changed under us; looking again");
            lock(&ctx.status_written).insert(object_key(namespace, &run.name_any()), String::new());
            return Ok(Action::requeue(bounds::MIN_REQUEUE));
        }
    };
    if wrote {
        for event in &outcome.events {
            publish(run, event, ctx).await;
        }
    }
    Ok(match outcome.requeue_at {
        Some(at) if !outcome.status.phase.is_completed() => {
            Action::requeue(bounds::bounded_requeue(until(next_look(at, now, wrote))))
        }
        _ => Action::await_change(),
    })
}

/// Every metric has the one provider this controller measures it with; otherwise the run
/// ends in Error at once, naming the metric and the provider, instead of erroring at every
/// measurement until `consecutiveErrorLimit`.
fn providers_chosen(spec: &AnalysisRunSpec) -> std::result::Result<(), String> {
    spec.metrics
        .iter()
        .try_for_each(|metric| super::provider_kind(metric).map(drop))
        .map_err(|e| format!("Analysis spec invalid: {e}"))
}

/// When to look again for a run due at `at`. Times are whole seconds, so something due now
/// that this reconcile handled without a change (a Job still running) is next due in the next
/// second, not at once: looking again at once would only repeat the same calls.
pub fn next_look(at: Timestamp, now: Timestamp, wrote: bool) -> Timestamp {
    if wrote || at > now {
        return at;
    }
    now.checked_add(Duration::from_secs(1)).unwrap_or(at)
}

/// The wait until `at`, rounded up to the millisecond so a timer never fires just before a
/// measurement is due.
pub(super) fn until(at: Timestamp) -> Duration {
    let nanos = u128::try_from(at.duration_since(Timestamp::now()).as_nanos()).unwrap_or(0);
    let millis = nanos.div_ceil(1_000_000);
    Duration::from_millis(u64::try_from(millis).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_requeue_never_fires_before_the_due_time() {
        let soon = Timestamp::now()
            .checked_add(Duration::from_millis(1500))
            .expect("in range");
        let wait = until(soon);
        assert!(wait <= Duration::from_millis(1500), "{wait:?}");
        assert_eq!(wait.subsec_nanos() % 1_000_000, 0, "whole milliseconds");
        assert_eq!(until(Timestamp::UNIX_EPOCH), Duration::ZERO);
    }

    #[test]
    fn a_due_time_already_handled_without_change_is_looked_at_next_second() {
        let at = |seconds: i64| Timestamp::from_second(seconds).expect("in range");
        assert_eq!(next_look(at(105), at(100), false), at(105));
        assert_eq!(
            next_look(at(100), at(100), true),
            at(100),
            "a write re-triggers anyway"
        );
        assert_eq!(next_look(at(100), at(100), false), at(101));
        assert_eq!(next_look(at(90), at(100), false), at(101));
    }
}
