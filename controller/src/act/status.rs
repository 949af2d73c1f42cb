//! The Rollout's own record of a reconcile: its `/status` (merge-patched only when it
//! changed) and the planner's events.

use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::Reporter;
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

/// Records one of the planner's events on the Rollout, before the status that follows it is
/// written; a failure is logged, not returned, since status says what happened.
///
/// The event is created under a name derived from the Rollout's uid, the resourceVersion the
/// plan was made from and the event's content (not its place in the plan: a pass after a
/// partial one plans fewer events, a scale already done no longer reported). A pass cut off after the
/// event and before its status (a kill, a refused status write) plans again from the same
/// resourceVersion, makes the same event and finds it already there (409): it is sent once,
/// not lost (as it was when events came after the status) and not repeated. The kube
/// recorder is not used for these: it names events by the clock and folds repeats into
/// series, so it can neither recognise an event already sent nor be told apart from one.
pub(super) async fn publish(
    target: &Target,
    rollout: &Rollout,
    event: &crate::planner::Event,
    ctx: &Context,
) {
    let kube_event = plan_event(rollout, event, &ctx.reporter);
    let api: Api<K8sEvent> = Api::namespaced(ctx.client.clone(), &target.namespace);
    let mut created = api.create(&PostParams::default(), &kube_event).await;
    // An event lost to a server error or a throttle is a step nobody sees completed: tried
    // again a few times, briefly, as client-go's recorder does.
    for delay in EVENT_RETRY_DELAYS {
        match &created {
            Err(error) if worth_retrying(error) => {
                tokio::time::sleep(delay).await;
                created = api.create(&PostParams::default(), &kube_event).await;
            }
            _ => break,
        }
    }
    match created {
        Ok(_) => ctx.metrics.event_published(
            &target.namespace,
            &target.name,
            event_type_name(event.type_),
            &event.reason,
        ),
        // Sent by an earlier pass over this same Rollout version.
        Err(error) if already_sent(&error) => {}
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

/// Whether a failed event create may succeed if sent again: a transient failure
/// ([`crate::error::is_transient`]) or a 409 other than AlreadyExists (a conflict).
fn worth_retrying(error: &kube::Error) -> bool {
    crate::error::is_transient(error)
        || matches!(error, kube::Error::Api(status) if status.code == 409 && !already_sent(error))
}

/// The event exists already: an earlier pass from the same Rollout version created it.
fn already_sent(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409 && status.reason == "AlreadyExists")
}

fn event_type_name(type_: EventType) -> &'static str {
    match type_ {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

/// The events.k8s.io/v1 Event for an event of a plan made from `rollout`.
fn plan_event(rollout: &Rollout, event: &crate::planner::Event, reporter: &Reporter) -> K8sEvent {
    let reference = rollout.object_ref(&());
    K8sEvent {
        action: Some(event_action(&event.message)),
        reason: Some(event.reason.clone()),
        note: Some(event.message.clone()),
        type_: Some(event_type_name(event.type_).to_string()),
        event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        regarding: Some(reference),
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(
            reporter
                .instance
                .clone()
                .unwrap_or_else(|| reporter.controller.clone()),
        ),
        metadata: ObjectMeta {
            name: Some(plan_event_name(rollout, event)),
            namespace: rollout.namespace(),
            ..ObjectMeta::default()
        },
        ..K8sEvent::default()
    }
}

/// `<rollout>.<16 hex digits>`: the same for the same event planned from the same version of
/// the same Rollout, different otherwise.
fn plan_event_name(rollout: &Rollout, event: &crate::planner::Event) -> String {
    /// Room left for the Rollout's name in an object name of 253 bytes.
    const MAX_PREFIX_BYTES: usize = 253 - 17;
    let meta = rollout.meta();
    let mut hash = FNV_OFFSET;
    for part in [
        meta.uid.as_deref().unwrap_or_default(),
        meta.resource_version.as_deref().unwrap_or_default(),
        event_type_name(event.type_),
        &event.reason,
        &event.message,
    ] {
        hash = fnv1a64(hash, part.as_bytes());
        // A separator no part's bytes can fake: parts of any content hash apart.
        hash = fnv1a64(hash, &[0xff]);
    }
    let name = rollout.name_any();
    let mut end = name.len().min(MAX_PREFIX_BYTES);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}.{hash:016x}", &name[..end])
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

fn fnv1a64(mut hash: u64, bytes: &[u8]) -> u64 {
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The waits before each further try of an event the API server refused for a passing reason.
const EVENT_RETRY_DELAYS: [std::time::Duration; 3] = [
    std::time::Duration::from_millis(100),
    std::time::Duration::from_millis(300),
    std::time::Duration::from_millis(900),
];

/// The event's `action`: its message, cut to the API's 128 bytes (`kubectl get events` shows
/// it; a recorder would fold events with the same type, reason and action into one series).
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

    use crate::planner::Event;
    use rollouts_crds::rollout::RolloutSpec;

    fn rollout(uid: &str, version: &str) -> Rollout {
        let mut rollout = Rollout::new("web", RolloutSpec::default());
        rollout.metadata.namespace = Some("team".to_string());
        rollout.metadata.uid = Some(uid.to_string());
        rollout.metadata.resource_version = Some(version.to_string());
        rollout
    }

    fn step_event(message: &str) -> Event {
        Event {
            type_: EventType::Normal,
            reason: "RolloutStepCompleted".to_string(),
            message: message.to_string(),
        }
    }

    #[test]
    fn an_event_planned_again_from_the_same_rollout_version_has_the_same_name() {
        let step = step_event("Rollout step 2/4 completed (pause)");
        let name = plan_event_name(&rollout("u1", "41"), &step);
        assert_eq!(name, plan_event_name(&rollout("u1", "41"), &step));
        assert!(name.starts_with("web."), "{name}");
        assert_eq!(name.len(), "web.".len() + 16, "{name}");
        // Another version, Rollout or content: another event.
        for other in [
            plan_event_name(&rollout("u1", "42"), &step),
            plan_event_name(&rollout("u2", "41"), &step),
            plan_event_name(
                &rollout("u1", "41"),
                &step_event("Rollout step 3/4 completed (pause)"),
            ),
        ] {
            assert_ne!(name, other);
        }
    }

    #[test]
    fn a_long_rollout_name_leaves_a_valid_event_name() {
        let mut long = rollout("u1", "1");
        long.metadata.name = Some("é".repeat(200));
        let name = plan_event_name(&long, &step_event("x"));
        assert!(name.len() <= 253, "{}", name.len());
        assert!(name.starts_with("éé"), "{name}");
        assert_eq!(name.as_bytes()[name.len() - 17], b'.', "{name}");
    }

    #[test]
    fn the_event_names_its_rollout_reporter_and_content() {
        let reporter = Reporter {
            controller: "rollouts-controller".to_string(),
            instance: None,
        };
        let event = plan_event(&rollout("u1", "7"), &step_event("done"), &reporter);
        assert_eq!(event.reason.as_deref(), Some("RolloutStepCompleted"));
        assert_eq!(event.note.as_deref(), Some("done"));
        assert_eq!(event.type_.as_deref(), Some("Normal"));
        assert_eq!(event.metadata.namespace.as_deref(), Some("team"));
        assert_eq!(
            event.reporting_instance.as_deref(),
            Some("rollouts-controller")
        );
        let regarding = event.regarding.expect("the Rollout it is about");
        assert_eq!(regarding.kind.as_deref(), Some("Rollout"));
        assert_eq!(regarding.uid.as_deref(), Some("u1"));
        assert!(event.event_time.is_some());
    }

    fn api_error(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("refused by the test", reason)
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn an_event_that_exists_is_sent_and_other_refusals_are_tried_again_when_passing() {
        assert!(already_sent(&api_error(409, "AlreadyExists")));
        assert!(!worth_retrying(&api_error(409, "AlreadyExists")));
        assert!(!already_sent(&api_error(409, "Conflict")));
        for code in [500, 502, 503, 504, 429, 409, 408] {
            assert!(
                worth_retrying(&api_error(code, "Refused")),
                "{code} is worth retrying"
            );
        }
        for code in [400, 401, 403, 404, 422, 501] {
            assert!(
                !worth_retrying(&api_error(code, "Refused")),
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
