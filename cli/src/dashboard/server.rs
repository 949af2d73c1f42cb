//! The dashboard's HTTP server: pages, their live streams (server-sent events fed by the
//! store's changes), the action endpoint and the embedded assets.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc};

use super::actions::{Action, perform};
use super::pages;
use super::sse;
use super::store::{Change, Store};
use crate::cluster::Cluster;
use crate::error::Error;
use crate::patch::TargetKind;

/// The header the page's script sends with every action: a form or a script on another site
/// cannot send it without a CORS preflight, which this server never grants.
pub const ACTION_HEADER: &str = "x-rollouts-dashboard";
/// Quiet streams send a comment this often, which also tells when the page has gone.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// A burst of changes (a ReplicaSet scaling its pods) is drawn once.
const COALESCE: Duration = Duration::from_millis(100);
const APP_JS: &str = include_str!("assets/app.js");
const STYLE_CSS: &str = include_str!("assets/style.css");

type Body = BoxBody<Bytes, Infallible>;

/// What every request handler shares.
pub struct Dashboard {
    pub store: Arc<Store>,
    pub client: kube::Client,
    /// The API server's URL, for "unable to connect" messages.
    pub server: String,
    /// The `Host` headers accepted; `None` when bound to a non-loopback address on purpose.
    pub allowed_hosts: Option<Vec<String>>,
    /// Overview rows by row id, with the resourceVersions they were drawn from.
    pub row_cache: std::sync::Mutex<BTreeMap<String, (String, String)>>,
}

impl Dashboard {
    fn cluster(&self, namespace: &str) -> Cluster {
        Cluster {
            client: self.client.clone(),
            namespace: namespace.to_string(),
            server: self.server.clone(),
        }
    }

    /// A Rollout's events (newest last as listed), or why they cannot be read.
    async fn events(&self, namespace: &str, name: &str) -> Result<Vec<Value>, String> {
        let fields = format!("involvedObject.kind=Rollout,involvedObject.name={name}");
        Api::<Event>::namespaced(self.client.clone(), namespace)
            .list(&ListParams::default().fields(&fields).limit(200))
            .await
            .map_err(|e| {
                Error::from_kube(
                    e,
                    "listing events of",
                    TargetKind::Rollout,
                    name,
                    &self.server,
                )
                .to_string()
            })
            .map(|list| {
                list.items
                    .into_iter()
                    .filter_map(|event| serde_json::to_value(event).ok())
                    .collect()
            })
    }

    /// The live part of a Rollout's page, or `None` when the Rollout is gone.
    async fn live(&self, namespace: &str, name: &str, page: Page) -> Option<String> {
        let objects = self.store.rollout_objects(namespace, name)?;
        Some(match page {
            Page::Detail => {
                let events = self.events(namespace, name).await;
                pages::detail_live(
                    &objects,
                    &events,
                    &self.store.watch_errors(),
                    Timestamp::now(),
                )
            }
            Page::Analysis => pages::analysis_live(&objects),
        })
    }

    /// Every overview row, by row id. A row is drawn again only when its Rollout or one of
    /// its ReplicaSets has a new resourceVersion; the others come from the cache.
    fn rows(&self) -> BTreeMap<String, String> {
        let mut cache = self
            .row_cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut rows = BTreeMap::new();
        self.store.each_rollout_with_sets(|rollout, sets| {
            let text = |value: &Value, p: &str| {
                value
                    .pointer(p)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            let id = pages::row_id(
                &text(rollout, "/metadata/namespace"),
                &text(rollout, "/metadata/name"),
            );
            let mut versions = text(rollout, "/metadata/resourceVersion");
            for set in sets {
                versions.push(',');
                versions.push_str(&text(set, "/metadata/resourceVersion"));
            }
            let row = match cache.get(&id) {
                Some((seen, row)) if *seen == versions && !versions.is_empty() => row.clone(),
                _ => {
                    let row = pages::overview_row(rollout, sets);
                    cache.insert(id.clone(), (versions, row.clone()));
                    row
                }
            };
            rows.insert(id, row);
        });
        cache.retain(|id, _| rows.contains_key(id));
        rows
    }
}

/// Which page of a Rollout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Page {
    Detail,
    Analysis,
}

fn full(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}

fn html(body: String) -> Response<Body> {
    full(StatusCode::OK, "text/html; charset=utf-8", body)
}

fn plain(status: StatusCode, body: impl Into<String>) -> Response<Body> {
    full(status, "text/plain; charset=utf-8", body.into())
}

/// A Kubernetes object name or namespace, as it may appear in a path.
fn is_name(segment: &str) -> bool {
    !segment.is_empty()
        && segment.len() <= 253
        && segment
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
}

fn query_param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// Serves until the listener fails.
pub async fn serve(listener: TcpListener, dashboard: Arc<Dashboard>) -> std::io::Result<()> {
    loop {
        let (stream, _) = listener.accept().await?;
        let dashboard = Arc::clone(&dashboard);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let dashboard = Arc::clone(&dashboard);
                async move { Ok::<_, Infallible>(handle(dashboard, request).await) }
            });
            // A connection the browser drops mid-stream is not an error worth reporting.
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(dashboard: Arc<Dashboard>, request: Request<Incoming>) -> Response<Body> {
    if let Some(allowed) = &dashboard.allowed_hosts {
        let host = request
            .headers()
            .get(HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default();
        if !allowed.iter().any(|a| a == host) {
            return plain(
                StatusCode::FORBIDDEN,
                format!(
                    "host {host:?} is not this dashboard's address (fix: open http://{} instead)",
                    allowed.first().map(String::as_str).unwrap_or_default()
                ),
            );
        }
    }
    let path = request.uri().path().to_string();
    let query = request.uri().query().unwrap_or_default().to_string();
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match (request.method(), segments.as_slice()) {
        (&Method::GET, []) => overview(&dashboard),
        (&Method::GET, ["assets", "app.js"]) => {
            full(StatusCode::OK, "text/javascript; charset=utf-8", APP_JS)
        }
        (&Method::GET, ["assets", "style.css"]) => {
            full(StatusCode::OK, "text/css; charset=utf-8", STYLE_CSS)
        }
        (&Method::GET, ["rollouts", ns, name]) if is_name(ns) && is_name(name) => {
            rollout_page(&dashboard, ns, name, Page::Detail).await
        }
        (&Method::GET, ["rollouts", ns, name, "analysis"]) if is_name(ns) && is_name(name) => {
            rollout_page(&dashboard, ns, name, Page::Analysis).await
        }
        (&Method::GET, ["events", "overview"]) => {
            let since = query_param(&query, "since").and_then(|v| v.parse().ok());
            overview_stream(dashboard, since)
        }
        (&Method::GET, ["events", "rollouts", ns, name]) if is_name(ns) && is_name(name) => {
            let page = match query_param(&query, "page") {
                Some("analysis") => Page::Analysis,
                _ => Page::Detail,
            };
            rollout_stream(dashboard, ns.to_string(), name.to_string(), page)
        }
        (&Method::POST, ["api", "rollouts", ns, name, action]) if is_name(ns) && is_name(name) => {
            if request.headers().get(ACTION_HEADER).is_none() {
                return plain(
                    StatusCode::FORBIDDEN,
                    format!(
                        "actions need the {ACTION_HEADER} header, which the dashboard's page sends"
                    ),
                );
            }
            let Some(action) = Action::parse(action) else {
                return plain(
                    StatusCode::NOT_FOUND,
                    format!(
                        "no action {action:?} (one of: {})",
                        Action::ALL.map(Action::slug).join(", ")
                    ),
                );
            };
            // The argument (set image's CONTAINER=IMAGE) is small; more is refused.
            let argument = match http_body_util::Limited::new(request.into_body(), 4096)
                .collect()
                .await
            {
                Ok(body) => String::from_utf8_lossy(&body.to_bytes()).into_owned(),
                Err(error) => {
                    return plain(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        format!("cannot read the action's argument: {error}"),
                    );
                }
            };
            act(&dashboard, ns, name, action, &argument).await
        }
        (_, ["api", ..]) => plain(StatusCode::METHOD_NOT_ALLOWED, "actions are POSTed"),
        _ => plain(StatusCode::NOT_FOUND, format!("no page at {path}")),
    }
}

fn overview(dashboard: &Dashboard) -> Response<Body> {
    let version = dashboard.store.version();
    let rows: Vec<String> = dashboard.rows().into_values().collect();
    html(pages::overview_page(
        &rows,
        &dashboard.store.namespaces(),
        &dashboard.store.watch_errors(),
        &format!("/events/overview?since={version}"),
    ))
}

async fn rollout_page(dashboard: &Dashboard, ns: &str, name: &str, page: Page) -> Response<Body> {
    let Some(live) = dashboard.live(ns, name, page).await else {
        return full(
            StatusCode::NOT_FOUND,
            "text/html; charset=utf-8",
            pages::layout(
                name,
                "",
                &format!(
                    "<p class=\"error\">The dashboard sees no rollout \"{}\" in namespace \"{}\" (fix: check the name, or start the dashboard with -n {} or -A)</p>",
                    pages::escape(name),
                    pages::escape(ns),
                    pages::escape(ns)
                ),
            ),
        );
    };
    let stream = match page {
        Page::Detail => format!("/events/rollouts/{ns}/{name}?page=detail"),
        Page::Analysis => format!("/events/rollouts/{ns}/{name}?page=analysis"),
    };
    html(match page {
        Page::Detail => match dashboard.store.rollout_objects(ns, name) {
            Some(objects) => pages::detail_page(&objects.rollout, &live, &stream),
            // Deleted between the two reads: the stream will say so.
            None => pages::layout(name, &stream, &format!("<div id=\"live\">{live}</div>")),
        },
        Page::Analysis => pages::analysis_page(ns, name, &live, &stream),
    })
}

async fn act(
    dashboard: &Dashboard,
    ns: &str,
    name: &str,
    action: Action,
    argument: &str,
) -> Response<Body> {
    match perform(&dashboard.cluster(ns), name, action, argument).await {
        Ok(sentence) => plain(StatusCode::OK, sentence),
        Err(error) => {
            let status = match &error {
                Error::Api { status, .. } => StatusCode::from_u16(status.code)
                    .ok()
                    .filter(|code| code.is_client_error() || code.is_server_error())
                    .unwrap_or(StatusCode::BAD_GATEWAY),
                Error::Unreachable { .. } | Error::Client { .. } => StatusCode::BAD_GATEWAY,
                _ => StatusCode::UNPROCESSABLE_ENTITY,
            };
            plain(status, error.to_string())
        }
    }
}

/// An event-stream response fed by `feed`, which writes into the channel until the page goes.
fn event_stream<F>(feed: impl FnOnce(mpsc::Sender<Bytes>) -> F) -> Response<Body>
where
    F: Future<Output = ()> + Send + 'static,
{
    let (sender, receiver) = mpsc::channel::<Bytes>(64);
    tokio::spawn(feed(sender));
    let frames = futures::stream::unfold(receiver, |mut receiver| async move {
        let bytes = receiver.recv().await?;
        Some((Ok::<_, Infallible>(Frame::data(bytes)), receiver))
    });
    let mut response = Response::new(StreamBody::new(frames).boxed());
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(
        CACHE_CONTROL,
        hyper::header::HeaderValue::from_static("no-cache"),
    );
    response
}

/// Waits for a change `relevant` to the page, sending keep-alives meanwhile, then lets a burst
/// settle. `false` when the page has gone.
async fn next_change(
    changes: &mut broadcast::Receiver<Change>,
    relevant: impl Fn(&Change) -> bool,
    sender: &mpsc::Sender<Bytes>,
) -> bool {
    loop {
        tokio::select! {
            received = changes.recv() => match received {
                Ok(change) if relevant(&change) => break,
                Ok(_) => {}
                // Missed changes: draw again from the store, which has them all.
                Err(broadcast::error::RecvError::Lagged(_)) => break,
                Err(broadcast::error::RecvError::Closed) => return false,
            },
            () = tokio::time::sleep(KEEP_ALIVE) => {
                if sender.send(Bytes::from_static(sse::keep_alive().as_bytes())).await.is_err() {
                    return false;
                }
            }
            () = sender.closed() => return false,
        }
    }
    tokio::time::sleep(COALESCE).await;
    loop {
        match changes.try_recv() {
            Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) => {}
            Err(broadcast::error::TryRecvError::Empty) => return true,
            Err(broadcast::error::TryRecvError::Closed) => return false,
        }
    }
}

/// The overview's stream: a `row` message for each added or changed row, `remove` for each
/// deleted one. A page rendered at the store's current version gets only what changes after.
fn overview_stream(dashboard: Arc<Dashboard>, since: Option<u64>) -> Response<Body> {
    event_stream(move |sender| async move {
        let mut changes = dashboard.store.subscribe();
        let version = dashboard.store.version();
        let mut sent = BTreeMap::new();
        if since == Some(version) {
            sent = dashboard.rows();
        }
        loop {
            let rows = dashboard.rows();
            let mut messages = String::new();
            for (id, row) in &rows {
                if sent.get(id) != Some(row) {
                    messages.push_str(&sse::encode("row", row));
                }
            }
            for id in sent.keys().filter(|id| !rows.contains_key(*id)) {
                messages.push_str(&sse::encode("remove", id));
            }
            if !messages.is_empty() && sender.send(Bytes::from(messages)).await.is_err() {
                return;
            }
            sent = rows;
            if !next_change(&mut changes, |_| true, &sender).await {
                return;
            }
        }
    })
}

/// A Rollout page's stream: its live part again (`live`) whenever something in its namespace
/// changed and the drawing differs.
fn rollout_stream(
    dashboard: Arc<Dashboard>,
    ns: String,
    name: String,
    page: Page,
) -> Response<Body> {
    event_stream(move |sender| async move {
        let mut changes = dashboard.store.subscribe();
        let mut last = String::new();
        // What the last drawing was made from: a change elsewhere in the namespace that leaves
        // these alone is not drawn (nor are the events read) again.
        let mut drawn_from = None;
        loop {
            let inputs = (
                dashboard
                    .store
                    .rollout_objects(&ns, &name)
                    .map(|objects| objects.versions()),
                dashboard.store.watch_errors(),
            );
            if drawn_from.as_ref() == Some(&inputs) {
                let relevant =
                    |change: &Change| change.namespace.is_empty() || change.namespace == ns;
                if !next_change(&mut changes, relevant, &sender).await {
                    return;
                }
                continue;
            }
            drawn_from = Some(inputs);
            let live = dashboard.live(&ns, &name, page).await.unwrap_or_else(|| {
                format!(
                    "<p class=\"error\">Rollout \"{}\" is gone from namespace \"{}\".</p>",
                    pages::escape(&name),
                    pages::escape(&ns)
                )
            });
            if live != last {
                if sender
                    .send(Bytes::from(sse::encode("live", &live)))
                    .await
                    .is_err()
                {
                    return;
                }
                last = live;
            }
            let relevant = |change: &Change| change.namespace.is_empty() || change.namespace == ns;
            if !next_change(&mut changes, relevant, &sender).await {
                return;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kubernetes_names_are_routed() {
        assert!(is_name("web-1.shop"));
        assert!(!is_name(""));
        assert!(!is_name("Web"));
        assert!(!is_name("a%2Fb"));
        assert!(!is_name(&"a".repeat(254)));
    }

    #[test]
    fn query_parameters_are_found_by_name() {
        assert_eq!(query_param("since=12&page=x", "page"), Some("x"));
        assert_eq!(query_param("since=12", "page"), None);
    }
}
