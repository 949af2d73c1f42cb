//! Watch streams: newline-delimited events from a resourceVersion (replayed from the retained
//! log, or 410 Expired when it is too old), streaming lists, bookmarks, selectors, timeouts.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody, combinators::BoxBody};
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use super::output::{Output, render_object};
use super::registry::ResourceInfo;
use super::selector::{FieldSelector, LabelSelector};
use super::server::Sim;
use super::status::ApiError;
use super::store::{EventType, WatchEvent};

/// What a watch request asked for.
pub struct WatchRequest {
    pub info: Arc<ResourceInfo>,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    /// None for unset or "0": start with ADDED events for the current objects.
    pub resource_version: Option<u64>,
    pub send_initial_events: bool,
    pub bookmarks: bool,
    pub timeout: Option<Duration>,
    pub output: Output,
}

/// Turns store events into the lines one watch sends.
struct Encoder {
    request: WatchRequest,
    first_table: bool,
}

impl Encoder {
    fn selected(&self, obj: &Value) -> bool {
        let ns_ok = self
            .request
            .namespace
            .as_deref()
            .is_none_or(|ns| obj["metadata"]["namespace"].as_str() == Some(ns));
        ns_ok
            && self
                .request
                .labels
                .matches(obj["metadata"]["labels"].as_object())
            && self.request.fields.matches(obj)
    }

    /// The event this watcher sees, if any: a modification across the selector boundary
    /// becomes ADDED or DELETED, as the API server does it.
    fn translate(&self, event: &WatchEvent) -> Option<(EventType, Arc<Value>)> {
        if event.resource != self.request.info.key() {
            return None;
        }
        let now = self.selected(&event.object);
        let before = event.previous.as_deref().map(|p| self.selected(p));
        let event_type = match (event.event_type, before, now) {
            (EventType::Modified, Some(true), true) => EventType::Modified,
            (EventType::Modified, Some(false), true) => EventType::Added,
            (EventType::Modified, Some(true), false) => EventType::Deleted,
            (EventType::Modified, _, _) => return None,
            (t, _, true) => t,
            (_, _, false) => return None,
        };
        Some((event_type, event.object.clone()))
    }

    fn line(&mut self, event_type: &str, obj: &Value) -> Bytes {
        let mut object = render_object(&self.request.info, obj, self.request.output);
        if self.request.output == Output::Table {
            // Like the API server: only the first event of a watch carries column definitions.
            if !self.first_table {
                object["columnDefinitions"] = json!([]);
            }
            self.first_table = false;
        }
        encode(event_type, object)
    }

    fn bookmark(&self, rv: u64, initial_events_end: bool) -> Bytes {
        let info = &self.request.info;
        let (kind, api_version) = match self.request.output {
            Output::Metadata => (
                "PartialObjectMetadata".to_string(),
                "meta.k8s.io/v1".to_string(),
            ),
            _ => (info.kind.clone(), info.api_version()),
        };
        let mut metadata = json!({"resourceVersion": rv.to_string()});
        if initial_events_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        encode(
            "BOOKMARK",
            json!({"kind": kind, "apiVersion": api_version, "metadata": metadata}),
        )
    }
}

fn encode(event_type: &str, object: Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": event_type, "object": object}))
        .expect("JSON values always serialize");
    line.push(b'\n');
    Bytes::from(line)
}

fn expired(rv: u64, oldest: u64) -> Bytes {
    let status =
        ApiError::expired(format!("too old resource version: {rv} ({oldest})")).to_status();
    encode("ERROR", status)
}

pub type Body = BoxBody<Bytes, Infallible>;

/// Starts a watch: the snapshot and the subscription are taken under one lock, so no event
/// falls between what is replayed and what is streamed.
pub fn start(sim: &Arc<Sim>, request: WatchRequest) -> Body {
    let mut encoder = Encoder {
        request,
        first_table: true,
    };
    // (line, counts toward the cut-after fault): bookmarks do not count.
    let mut initial = Vec::new();
    let mut expired_now = false;
    let (events, snapshot_rv) = {
        let state = sim.store.lock();
        let events = sim.store.subscribe();
        let current = state.resource_version();
        let key = encoder.request.info.key();
        match encoder.request.resource_version {
            Some(rv) if !encoder.request.send_initial_events => {
                if rv < state.log_start() || sim.fault_log.draw_gone(&sim.faults()) {
                    initial.push((expired(rv, state.log_start()), true));
                    expired_now = true;
                } else {
                    let replay: Vec<(EventType, Arc<Value>)> = state
                        .events_after(rv)
                        .filter_map(|e| encoder.translate(e))
                        .collect();
                    for (t, obj) in replay {
                        initial.push((encoder.line(t.as_str(), &obj), true));
                    }
                }
            }
            _ => {
                let objects: Vec<Arc<Value>> = state
                    .list(&key, encoder.request.namespace.as_deref(), None)
                    .map(|(_, o)| o.clone())
                    .filter(|o| encoder.selected(o))
                    .collect();
                for obj in objects {
                    initial.push((encoder.line("ADDED", &obj), true));
                }
                if encoder.request.send_initial_events {
                    initial.push((encoder.bookmark(current, true), false));
                }
            }
        }
        // A watch from a future resourceVersion starts there, not at the present.
        (
            events,
            current.max(encoder.request.resource_version.unwrap_or(0)),
        )
    };
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let sim = sim.clone();
    tokio::spawn(async move {
        if expired_now {
            for (line, _) in initial {
                let _ = tx.send(line).await;
            }
            return;
        }
        stream(sim, encoder, initial, events, snapshot_rv, tx).await;
    });
    let mut rx = rx;
    let frames = futures::stream::poll_fn(move |cx| {
        rx.poll_recv(cx)
            .map(|line| line.map(|b| Ok::<_, Infallible>(Frame::data(b))))
    });
    StreamBody::new(frames).boxed()
}

async fn stream(
    sim: Arc<Sim>,
    mut encoder: Encoder,
    initial: Vec<(Bytes, bool)>,
    mut events: broadcast::Receiver<Arc<WatchEvent>>,
    snapshot_rv: u64,
    tx: mpsc::Sender<Bytes>,
) {
    let cut_after = sim.faults().watch_cut_after;
    let cut_at = sim.fault_log.draw_watch_cut(&sim.faults());
    let mut sent: u64 = 0;
    for (line, counts) in initial {
        if tx.send(line).await.is_err() {
            return;
        }
        sent += u64::from(counts);
        if cut_after.is_some_and(|n| sent >= n) {
            return;
        }
    }
    let mut last_rv = snapshot_rv;
    let bookmark_every = sim.bookmark_interval.max(Duration::from_millis(10));
    let mut bookmarks =
        tokio::time::interval_at(tokio::time::Instant::now() + bookmark_every, bookmark_every);
    let deadline = encoder
        .request
        .timeout
        .map(|t| tokio::time::Instant::now() + t);
    let mut expiry = sim.store.expiry();
    let mut shutdown = sim.shutdown.clone();
    let cut = async {
        match cut_at {
            Some(at) => tokio::time::sleep(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(cut);
    loop {
        let timeout = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            received = events.recv() => match received {
                Ok(event) => {
                    if event.rv <= last_rv {
                        continue;
                    }
                    last_rv = event.rv;
                    let Some((t, obj)) = encoder.translate(&event) else { continue };
                    if tx.send(encoder.line(t.as_str(), &obj)).await.is_err() {
                        return;
                    }
                    sent += 1;
                    if cut_after.is_some_and(|n| sent >= n) {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // This watcher fell behind the fan-out buffer: make it relist.
                    let oldest = sim.store.lock().log_start();
                    let _ = tx.send(expired(last_rv, oldest)).await;
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = bookmarks.tick(), if encoder.request.bookmarks => {
                if tx.send(encoder.bookmark(last_rv, false)).await.is_err() {
                    return;
                }
            }
            _ = timeout => return,
            _ = &mut cut => {
                sim.fault_log.count_watch_cut();
                return;
            }
            _ = expiry.changed() => return,
            _ = shutdown.changed() => return,
            _ = tx.closed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::registry::Registry;

    fn event(event_type: EventType, labels: Value, previous: Option<Value>) -> WatchEvent {
        let object = |labels: Value| {
            Arc::new(json!({"metadata": {"name": "p", "namespace": "default", "labels": labels}}))
        };
        WatchEvent {
            rv: 7,
            resource: Registry::with_builtins()
                .get("", "v1", "pods")
                .expect("pods")
                .key(),
            event_type,
            object: object(labels),
            previous: previous.map(object),
        }
    }

    #[test]
    fn selector_boundaries_turn_modifications_into_additions_and_deletions() {
        let encoder = Encoder {
            request: WatchRequest {
                info: Registry::with_builtins()
                    .get("", "v1", "pods")
                    .expect("pods"),
                namespace: Some("default".into()),
                labels: LabelSelector::parse("app=web").expect("selector"),
                fields: FieldSelector::default(),
                resource_version: None,
                send_initial_events: false,
                bookmarks: false,
                timeout: None,
                output: Output::Full,
            },
            first_table: true,
        };
        let web = json!({"app": "web"});
        let other = json!({"app": "other"});
        let seen = |e: WatchEvent| encoder.translate(&e).map(|(t, _)| t);
        assert_eq!(
            seen(event(EventType::Added, web.clone(), None)),
            Some(EventType::Added)
        );
        assert_eq!(seen(event(EventType::Added, other.clone(), None)), None);
        assert_eq!(
            seen(event(EventType::Modified, web.clone(), Some(web.clone()))),
            Some(EventType::Modified)
        );
        assert_eq!(
            seen(event(EventType::Modified, web.clone(), Some(other.clone()))),
            Some(EventType::Added)
        );
        assert_eq!(
            seen(event(EventType::Modified, other.clone(), Some(web.clone()))),
            Some(EventType::Deleted)
        );
        assert_eq!(
            seen(event(EventType::Modified, other.clone(), Some(other))),
            None
        );
        assert_eq!(
            seen(event(EventType::Deleted, web, None)),
            Some(EventType::Deleted)
        );
    }
}
