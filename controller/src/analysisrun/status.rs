//! Writing a run's `/status` (only when it changed, only over the copy it was computed from)
//! and recording the engine's events on the run.

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use rollouts_analysis::engine;
use rollouts_crds::analysis::{AnalysisRun, AnalysisRunStatus};
use serde_json::Value;

use super::context::{AnalysisContext, lock};
use super::reconcile::object_key;
use super::{Error, Result};
use crate::events;
use crate::status_patch::patch_when_changed;

/// What became of a status write.
pub(super) enum StatusWrite {
    /// Nothing changed: nothing was sent.
    Unchanged,
    Written,
    /// The run changed since the copy the status was computed from; nothing was written.
    Conflict,
}

/// Merge-patches `/status` to `desired` when it differs, on condition that the run is still at
/// the resourceVersion it was read at, so a measurement is never folded into a stale status.
pub(super) async fn write_status(
    run: &AnalysisRun,
    namespace: &str,
    desired: &AnalysisRunStatus,
    ctx: &AnalysisContext,
) -> Result<StatusWrite> {
    let name = run.name_any();
    let Some(mut patch) =
        status_patch(run.status.as_ref(), desired).map_err(|source| Error::EncodeStatus {
            namespace: namespace.to_string(),
            name: name.clone(),
            source,
        })?
    else {
        return Ok(StatusWrite::Unchanged);
    };
    if let Some(version) = run.resource_version() {
        patch["metadata"] = serde_json::json!({ "resourceVersion": version });
    }
    let api: Api<AnalysisRun> = Api::namespaced(ctx.client.clone(), namespace);
    match api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(written) => {
            if let Some(version) = written.resource_version() {
                lock(&ctx.status_written).insert(object_key(namespace, &name), version);
            }
            Ok(StatusWrite::Written)
        }
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(StatusWrite::Conflict),
        // Deleted meanwhile: nothing left to record.
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(StatusWrite::Unchanged),
        Err(source) => Err(Error::PatchStatus {
            namespace: namespace.to_string(),
            name,
            source: Box::new(source),
        }),
    }
}

/// The merge patch (`{"status": ...}`) from the run's status to `desired`; `None` when equal.
pub fn status_patch(
    current: Option<&AnalysisRunStatus>,
    desired: &AnalysisRunStatus,
) -> Result<Option<Value>, serde_json::Error> {
    patch_when_changed(current, desired)
}

/// Records one of the engine's events on the run, after the status write it follows; a
/// failure is logged, since status already says what happened. Sent once
/// ([`crate::events`]), named by the run's uid, the resourceVersion the status was written
/// over (a write on that condition succeeds once) and the event: a passing refusal is tried
/// again without making a second one. A kill between the status write and the event loses it.
pub(super) async fn publish(run: &AnalysisRun, event: &engine::RunEvent, ctx: &AnalysisContext) {
    let once = events::Once {
        regarding: run.object_ref(&()),
        decided_at: run.meta().resource_version.as_deref().unwrap_or_default(),
        warning: event.warning,
        reason: &event.reason,
        note: &event.message,
        action: "Analyze",
    };
    if let Err(error) = events::send(&ctx.client, &ctx.reporter, &once).await {
        tracing::warn!(%error, reason = %event.reason, "AnalysisRun event not published");
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use rollouts_crds::analysis::AnalysisPhase;

    use super::*;

    fn running(count: i32) -> AnalysisRunStatus {
        AnalysisRunStatus {
            phase: AnalysisPhase::Running,
            started_at: Some(Time(Timestamp::UNIX_EPOCH)),
            metric_results: vec![rollouts_crds::analysis::MetricResult {
                name: "m".into(),
                phase: AnalysisPhase::Running,
                count,
                successful: count,
                ..Default::default()
            }],
            ..AnalysisRunStatus::default()
        }
    }

    #[test]
    fn the_status_is_patched_only_when_it_changed() {
        let current = running(1);
        assert_eq!(
            status_patch(Some(&current), &current).expect("encodes"),
            None
        );
        let patch = status_patch(Some(&current), &running(2))
            .expect("encodes")
            .expect("a change");
        // Lists are replaced whole by a merge patch; unchanged fields are left out.
        assert_eq!(patch["status"]["metricResults"][0]["count"], 2);
        assert!(patch["status"].get("phase").is_none(), "{patch}");
        let first = status_patch(None, &current)
            .expect("encodes")
            .expect("a first status");
        assert_eq!(first["status"]["phase"], "Running");
    }
}
