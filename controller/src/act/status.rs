//! The Rollout's own record of a reconcile: its `/status` (merge-patched only when it
//! changed) and the planner's events.

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use rollouts_crds::rollout::{Rollout, RolloutStatus};

use super::Target;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::events;
use crate::planner::EventType;
use crate::status_patch;

/// Merge-patches `/status` to `desired` when it differs; returns whether it wrote. The new
/// resourceVersion is remembered so the next reconcile does not plan from an older copy.
pub async fn write_status(
    rollout: &Rollout,
    desired: &RolloutStatus,
    ctx: &Context,
) -> Result<bool> {
    let namespace = rollout.namespace().unwrap_or_default();
    let name = rollout.name_any();
    let patch =
        status_patch::status_patch(rollout, desired).map_err(|source| Error::EncodeStatus {
            namespace: namespace.clone(),
            name: name.clone(),
            source,
        })?;
    let Some(patch) = patch else {
        return Ok(false);
    };
    let api: Api<Rollout> = Api::namespaced(ctx.client.clone(), &namespace);
    let written = api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::PatchStatus {
            namespace: namespace.clone(),
            name: name.clone(),
            source: Box::new(source),
        })?;
    if let Some(version) = written.resource_version() {
        ctx.record_status_written(&format!("{namespace}/{name}"), &version);
    }
    Ok(true)
}

/// Records one of the planner's events on the Rollout, before the status that follows it is
/// written; a failure is logged, not returned, since status says what happened.
///
/// The event is sent once ([`crate::events`]): named by the Rollout's uid, the resourceVersion
/// the plan was made from and the event's content (not its place in the plan: a pass after a
/// partial one plans fewer events, a scale already done no longer reported). A pass cut off
/// after the event and before its status (a kill, a refused status write) plans again from
/// the same resourceVersion, makes the same event and finds it already there: it is neither
/// lost (as it was when events came after the status) nor repeated.
pub(super) async fn publish(
    target: &Target,
    rollout: &Rollout,
    event: &crate::planner::Event,
    ctx: &Context,
) {
    let once = events::Once {
        regarding: rollout.object_ref(&()),
        decided_at: rollout
            .meta()
            .resource_version
            .as_deref()
            .unwrap_or_default(),
        warning: event.type_ == EventType::Warning,
        reason: &event.reason,
        note: &event.message,
        // The message, so `kubectl get events` tells "step 2/4" from "step 3/4".
        action: &event.message,
    };
    match events::send(&ctx.client, &ctx.reporter, &once).await {
        Ok(events::Sent::Created) => ctx.metrics.event_published(
            &target.namespace,
            &target.name,
            match event.type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            },
            &event.reason,
        ),
        // Sent by an earlier pass over this same Rollout version.
        Ok(events::Sent::AlreadyThere) => {}
        Err(source) => {
            let error = Error::PublishEvent {
                namespace: target.namespace.clone(),
                name: target.name.clone(),
                reason: event.reason.clone(),
                source: Box::new(source),
            };
            tracing::warn!(%error, "event not published");
        }
    }
}
