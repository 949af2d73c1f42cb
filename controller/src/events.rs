//! Kubernetes events that are sent once: each is created under a name made from the object's
//! uid, the resourceVersion it was decided at and its content, so sending it again (a pass
//! planned again from the same version after a kill or a refused write) finds it there (409
//! AlreadyExists) instead of making a second one. A create refused for a passing reason is
//! tried again a few times, briefly, as client-go's recorder does.
//!
//! The kube recorder is not used for these: it names events by the clock and folds repeats
//! into series, so it can neither recognise an event already sent nor tell one apart from it.
//! The events here are transitions, decided once each: there is nothing to fold.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::events::Reporter;

/// The waits before each further try of an event the API server refused for a passing reason.
const RETRY_DELAYS: [Duration; 3] = [
    Duration::from_millis(100),
    Duration::from_millis(300),
    Duration::from_millis(900),
];

/// An event about to be sent.
pub struct Once<'a> {
    /// The object it is about; its namespace is the event's.
    pub regarding: ObjectReference,
    /// The object's resourceVersion when the event was decided.
    pub decided_at: &'a str,
    pub warning: bool,
    pub reason: &'a str,
    pub note: &'a str,
    /// What was done; `kubectl get events` shows it. Cut to the API's 128 bytes.
    pub action: &'a str,
}

/// What became of a send.
#[derive(Debug, PartialEq, Eq)]
pub enum Sent {
    Created,
    /// Created by an earlier send of the same event.
    AlreadyThere,
}

/// Creates the event (see the module), trying again while the refusal is a passing one.
pub async fn send(client: &Client, reporter: &Reporter, once: &Once<'_>) -> kube::Result<Sent> {
    let event = build(reporter, once);
    let namespace = once.regarding.namespace.as_deref().unwrap_or("default");
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    let mut created = api.create(&PostParams::default(), &event).await;
    for delay in RETRY_DELAYS {
        match &created {
            Err(error) if worth_retrying(error) => {
                tokio::time::sleep(delay).await;
                created = api.create(&PostParams::default(), &event).await;
            }
            _ => break,
        }
    }
    match created {
        Ok(_) => Ok(Sent::Created),
        Err(error) if already_there(&error) => Ok(Sent::AlreadyThere),
        Err(error) => Err(error),
    }
}

/// Whether a failed create may succeed if sent again: a transient failure
/// ([`crate::error::is_transient`]) or a 409 other than AlreadyExists (a conflict).
fn worth_retrying(error: &kube::Error) -> bool {
    crate::error::is_transient(error)
        || matches!(error, kube::Error::Api(status) if status.code == 409 && !already_there(error))
}

fn already_there(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409 && status.reason == "AlreadyExists")
}

/// The events.k8s.io/v1 Event for `once`.
fn build(reporter: &Reporter, once: &Once<'_>) -> Event {
    Event {
        action: Some(truncated(once.action, MAX_ACTION_BYTES).to_string()),
        reason: Some(once.reason.to_string()),
        note: Some(once.note.to_string()),
        type_: Some(if once.warning { "Warning" } else { "Normal" }.to_string()),
        event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(
            reporter
                .instance
                .clone()
                .unwrap_or_else(|| reporter.controller.clone()),
        ),
        metadata: ObjectMeta {
            name: Some(name(once)),
            namespace: once.regarding.namespace.clone(),
            ..ObjectMeta::default()
        },
        regarding: Some(once.regarding.clone()),
        ..Event::default()
    }
}

const MAX_ACTION_BYTES: usize = 128;

/// `<object>.<16 hex digits>`: the same for the same event decided at the same version of the
/// same object, different otherwise.
fn name(once: &Once<'_>) -> String {
    /// Room left for the object's name in an object name of 253 bytes.
    const MAX_PREFIX_BYTES: usize = 253 - 17;
    let mut hash = FNV_OFFSET;
    for part in [
        once.regarding.uid.as_deref().unwrap_or_default(),
        once.decided_at,
        if once.warning { "Warning" } else { "Normal" },
        once.reason,
        once.note,
    ] {
        hash = fnv1a64(hash, part.as_bytes());
        // A byte no UTF-8 text holds: parts of any content hash apart.
        hash = fnv1a64(hash, &[0xff]);
    }
    let object = once.regarding.name.as_deref().unwrap_or_default();
    format!("{}.{hash:016x}", truncated(object, MAX_PREFIX_BYTES))
}

/// `text` cut to at most `max` bytes, on a character boundary.
fn truncated(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

fn fnv1a64(mut hash: u64, bytes: &[u8]) -> u64 {
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    fn about(uid: &str, name: &str) -> ObjectReference {
        ObjectReference {
            kind: Some("Rollout".to_string()),
            namespace: Some("team".to_string()),
            name: Some(name.to_string()),
            uid: Some(uid.to_string()),
            ..ObjectReference::default()
        }
    }

    fn once<'a>(uid: &str, version: &'a str, note: &'a str) -> Once<'a> {
        Once {
            regarding: about(uid, "web"),
            decided_at: version,
            warning: false,
            reason: "RolloutStepCompleted",
            note,
            action: note,
        }
    }

    #[test]
    fn an_event_decided_again_at_the_same_version_has_the_same_name() {
        let step = "Rollout step 2/4 completed (pause)";
        let first = name(&once("u1", "41", step));
        assert_eq!(first, name(&once("u1", "41", step)));
        assert!(first.starts_with("web."), "{first}");
        assert_eq!(first.len(), "web.".len() + 16, "{first}");
        // Another version, object or content: another event.
        for other in [
            name(&once("u1", "42", step)),
            name(&once("u2", "41", step)),
            name(&once("u1", "41", "Rollout step 3/4 completed (pause)")),
            name(&Once {
                warning: true,
                ..once("u1", "41", step)
            }),
        ] {
            assert_ne!(first, other);
        }
    }

    #[test]
    fn a_long_object_name_leaves_a_valid_event_name() {
        let long = "é".repeat(200);
        let event = Once {
            regarding: about("u1", &long),
            ..once("u1", "1", "x")
        };
        let name = name(&event);
        assert!(name.len() <= 253, "{}", name.len());
        assert!(name.starts_with("éé"), "{name}");
        assert_eq!(name.as_bytes()[name.len() - 17], b'.', "{name}");
    }

    #[test]
    fn the_event_names_its_object_reporter_and_content() {
        let reporter = Reporter {
            controller: "rollouts-controller".to_string(),
            instance: None,
        };
        let long_action = "a".repeat(300);
        let event = build(
            &reporter,
            &Once {
                warning: true,
                action: &long_action,
                ..once("u1", "7", "done")
            },
        );
        assert_eq!(event.reason.as_deref(), Some("RolloutStepCompleted"));
        assert_eq!(event.note.as_deref(), Some("done"));
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        assert_eq!(event.action.as_deref().map(str::len), Some(128));
        assert_eq!(event.metadata.namespace.as_deref(), Some("team"));
        assert_eq!(
            event.reporting_instance.as_deref(),
            Some("rollouts-controller")
        );
        assert_eq!(event.regarding.and_then(|r| r.uid).as_deref(), Some("u1"));
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
        assert!(already_there(&api_error(409, "AlreadyExists")));
        assert!(!worth_retrying(&api_error(409, "AlreadyExists")));
        assert!(!already_there(&api_error(409, "Conflict")));
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
    fn actions_are_cut_on_a_character_boundary() {
        let long = "é".repeat(100);
        let cut = truncated(&long, MAX_ACTION_BYTES);
        assert!(cut.len() <= MAX_ACTION_BYTES);
        assert!(long.starts_with(cut));
    }
}
