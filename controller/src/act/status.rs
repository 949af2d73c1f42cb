//! The Rollout's own record of a reconcile: its `/status` (merge-patched only when it
//! changed) and the planner's events.

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType as KubeEventType};
use kube::{Resource, ResourceExt};
use rollouts_crds::rollout::{Rollout, RolloutStatus};

use super::Target;
use crate::context::Context;
use crate::error::{Error, Result};
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

/// Records one of the planner's events on the Rollout; a failure is logged, not returned,
/// since status already says what happened.
pub(super) async fn publish(
    target: &Target,
    rollout: &Rollout,
    event: &crate::planner::Event,
    ctx: &Context,
) {
    let type_ = match event.type_ {
        EventType::Normal => KubeEventType::Normal,
        EventType::Warning => KubeEventType::Warning,
    };
    let kube_event = KubeEvent {
        type_,
        reason: event.reason.clone(),
        note: Some(event.message.clone()),
        action: event_action(&event.message),
        secondary: None,
    };
    let reference = rollout.object_ref(&());
    let mut published = ctx.recorder.publish(&kube_event, &reference).await;
    // An event lost to a server error or a throttle is a step nobody sees completed: tried
    // again a few times, briefly, as client-go's recorder does.
    for delay in EVENT_RETRY_DELAYS {
        match &published {
            Err(error) if worth_retrying(error) => {
                tokio::time::sleep(delay).await;
                published = ctx.recorder.publish(&kube_event, &reference).await;
            }
            _ => break,
        }
    }
    match published {
        Ok(()) => ctx.metrics.event_published(
            &target.namespace,
            &target.name,
            match event.type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            },
            &event.reason,
        ),
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

/// The waits before each further try of an event the API server refused for a passing reason.
const EVENT_RETRY_DELAYS: [std::time::Duration; 3] = [
    std::time::Duration::from_millis(100),
    std::time::Duration::from_millis(300),
    std::time::Duration::from_millis(900),
];

/// Whether a failed event write may succeed if sent again: a transient failure
/// ([`crate::error::is_transient`]) or a conflict.
fn worth_retrying(error: &kube::Error) -> bool {
    crate::error::is_transient(error)
        || matches!(error, kube::Error::Api(status) if status.code == 409)
}

/// The event's `action`: its message, cut to the API's 128 bytes. The recorder folds events
/// with the same type, reason and action into one series and keeps the first note, so "step
/// 2/4 completed" and "step 3/4 completed" must differ here to both be seen.
fn event_action(message: &str) -> String {
    const MAX_ACTION_BYTES: usize = 128;
    let mut end = message.len().min(MAX_ACTION_BYTES);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("refused by the test", "Refused")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn passing_event_write_failures_are_tried_again_and_lasting_ones_are_not() {
        for code in [500, 502, 503, 504, 429, 409, 408] {
            assert!(worth_retrying(&api_error(code)), "{code} is worth retrying");
        }
        for code in [400, 401, 403, 404, 422, 501] {
            assert!(
                !worth_retrying(&api_error(code)),
                "{code} is not worth retrying"
            );
        }
    }

    #[test]
    fn event_actions_tell_messages_apart_within_the_api_limit() {
        assert_ne!(
            event_action("Rollout step 2/4 completed (pause)"),
            event_action("Rollout step 3/4 completed (setWeight: 50)")
        );
        let long = "é".repeat(100);
        let action = event_action(&long);
        assert!(action.len() <= 128);
        assert!(long.starts_with(&action));
    }
}
