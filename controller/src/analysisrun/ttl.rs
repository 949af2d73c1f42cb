//! `spec.ttlStrategy`: a finished run is deleted once its phase's seconds have passed.

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::Action;
use rollouts_crds::analysis::{AnalysisPhase, AnalysisRun};
use std::time::Duration;

use super::bounds::bounded_requeue;
use super::context::{AnalysisContext, lock};
use super::reconcile::{object_key, until};
use super::{Error, Result};

/// Deletes a finished run once its `spec.ttlStrategy` has run out, or waits for that moment;
/// a finished run without one waits for a change only.
pub(super) async fn collect_expired(
    run: &AnalysisRun,
    namespace: &str,
    ctx: &AnalysisContext,
) -> Result<Action> {
    let Some(expiry) = ttl_expiry(run) else {
        return Ok(Action::await_change());
    };
    if run.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    if expiry > Timestamp::now() {
        // A TTL of years cannot be one timer (the controller's queue holds about two years):
        // look again within the hour, at no API cost, until it runs out.
        return Ok(Action::requeue(bounded_requeue(until(expiry))));
    }
    let name = run.name_any();
    let api: Api<AnalysisRun> = Api::namespaced(ctx.client.clone(), namespace);
    match api.delete(&name, &DeleteParams::background()).await {
        Ok(_) => {
            tracing::info!("deleted the finished AnalysisRun: its spec.ttlStrategy ran out");
            let key = object_key(namespace, &name);
            lock(&ctx.failures).remove(&key);
            lock(&ctx.status_written).remove(&key);
            Ok(Action::await_change())
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Action::await_change()),
        Err(source) => Err(Error::DeleteRun {
            namespace: namespace.to_string(),
            name,
            source: Box::new(source),
        }),
    }
}

/// When a finished run is to be deleted under `spec.ttlStrategy`: more than the phase's
/// seconds (`secondsAfterSuccess`, `secondsAfterFailure`, else `secondsAfterCompletion`) after
/// `completedAt`, as Argo counts them. `None`: kept for good.
pub fn ttl_expiry(run: &AnalysisRun) -> Option<Timestamp> {
    let ttl = run.spec.ttl_strategy.as_ref()?;
    let status = run.status.as_ref()?;
    if !status.phase.is_completed() {
        return None;
    }
    let completed = status.completed_at.as_ref()?.0;
    let seconds = match status.phase {
        AnalysisPhase::Successful if ttl.seconds_after_success.is_some() => {
            ttl.seconds_after_success
        }
        AnalysisPhase::Failed if ttl.seconds_after_failure.is_some() => ttl.seconds_after_failure,
        _ => ttl.seconds_after_completion,
    }?;
    // Argo deletes once the whole seconds elapsed exceed the TTL.
    let wait = Duration::from_secs(u64::try_from(seconds).unwrap_or(0) + 1);
    Some(completed.checked_add(wait).unwrap_or(Timestamp::MAX))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use rollouts_crds::analysis::AnalysisRunStatus;

    use super::super::fixtures::run_with_args;
    use super::*;

    #[test]
    fn a_finished_run_expires_after_the_ttl_of_its_phase() {
        let at = |seconds: i64| Timestamp::from_second(seconds).expect("in range");
        let mut run = run_with_args(Vec::new());
        run.spec.ttl_strategy = Some(rollouts_crds::analysis::TtlStrategy {
            seconds_after_completion: Some(60),
            seconds_after_failure: Some(600),
            seconds_after_success: None,
        });
        run.status = Some(AnalysisRunStatus {
            phase: AnalysisPhase::Running,
            ..AnalysisRunStatus::default()
        });
        assert_eq!(ttl_expiry(&run), None, "a running run never expires");
        let finished = |phase| AnalysisRunStatus {
            phase,
            completed_at: Some(Time(at(1000))),
            ..AnalysisRunStatus::default()
        };
        run.status = Some(finished(AnalysisPhase::Failed));
        assert_eq!(ttl_expiry(&run), Some(at(1601)));
        // No secondsAfterSuccess: secondsAfterCompletion applies.
        run.status = Some(finished(AnalysisPhase::Successful));
        assert_eq!(ttl_expiry(&run), Some(at(1061)));
        run.status = Some(finished(AnalysisPhase::Error));
        assert_eq!(ttl_expiry(&run), Some(at(1061)));
        run.spec.ttl_strategy = None;
        assert_eq!(
            ttl_expiry(&run),
            None,
            "kept for good without a ttlStrategy"
        );
    }
}
