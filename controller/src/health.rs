//! The HTTP endpoints: `/healthz` (the process serves), `/readyz` (this replica leads or stands
//! by ready to take over, or leader election is off; not while stopping, and not while one of
//! its supervised tasks is down) and `/metrics` (Prometheus text). Served by hyper on two
//! listeners, `--health-addr` and `--metrics-addr`, with the same routes on each. A connection
//! must send its request head within [`ServerLimits::header_read`] and is closed after
//! [`ServerLimits::connection`], so a slow or idle client cannot hold connections.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// Where this replica stands in leader election.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leadership {
    /// Waiting for the Lease held by another replica.
    Follower = 0,
    /// Holding the Lease: reconciling.
    Leader = 1,
    /// Leader election is off (`--leader-elect=false`): always reconciling.
    Disabled = 2,
    /// Shutting down or the Lease was lost: no longer reconciling.
    Stopping = 3,
}

/// Runtime state the endpoints report, shared with the rest of the controller.
#[derive(Debug)]
pub struct Diagnostics {
    leadership: AtomicU8,
    /// Supervised tasks by name: `None` while running, else why they are down.
    tasks: Mutex<BTreeMap<&'static str, Option<String>>>,
}

impl Diagnostics {
    pub fn new(leadership: Leadership) -> Self {
        Self {
            leadership: AtomicU8::new(leadership as u8),
            tasks: Mutex::new(BTreeMap::new()),
        }
    }

    /// Records that the supervised task `task` runs.
    pub fn task_up(&self, task: &'static str) {
        self.lock_tasks().insert(task, None);
    }

    /// Records that `task` is down and why: `/readyz` fails until it runs again.
    pub fn task_down(&self, task: &'static str, reason: &str) {
        self.lock_tasks().insert(task, Some(reason.to_string()));
    }

    /// Forgets `task`: it stopped because the controller is stopping.
    pub fn task_stopped(&self, task: &'static str) {
        self.lock_tasks().remove(task);
    }

    /// The tasks that are down, with why, by name.
    pub fn tasks_down(&self) -> Vec<(&'static str, String)> {
        self.lock_tasks()
            .iter()
            .filter_map(|(task, down)| down.clone().map(|reason| (*task, reason)))
            .collect()
    }

    fn lock_tasks(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, Option<String>>> {
        // A panic elsewhere while holding the lock leaves a map that is still consistent.
        self.tasks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn set_leadership(&self, leadership: Leadership) {
        self.leadership.store(leadership as u8, Ordering::SeqCst);
    }

    pub fn leadership(&self) -> Leadership {
        match self.leadership.load(Ordering::SeqCst) {
            0 => Leadership::Follower,
            1 => Leadership::Leader,
            2 => Leadership::Disabled,
            _ => Leadership::Stopping,
        }
    }
}

/// What the endpoints read.
#[derive(Clone)]
pub struct Endpoints {
    pub diagnostics: Arc<Diagnostics>,
    pub metrics: Arc<Metrics>,
}

/// Binds `addr` (the `flag` it came from is named if that fails).
pub async fn bind(addr: SocketAddr, flag: &'static str) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, flag, source })
}

/// How long a client of the health and metrics endpoints may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// To send a request's head (request line and headers), counted from the connection or
    /// from the previous response: an idle keep-alive connection is closed after it too.
    pub header_read: Duration,
    /// A connection's whole life; a request in flight then gets a short grace to finish.
    pub connection: Duration,
}

impl ServerLimits {
    /// Probes and scrapes send their request at once and take well under a second; Prometheus
    /// reconnects when a kept-alive connection is closed.
    pub const DEFAULT: Self = Self {
        header_read: Duration::from_secs(10),
        connection: Duration::from_secs(60),
    };
}

/// How long a request in flight may still take once its connection's time is up.
const CONNECTION_GRACE: Duration = Duration::from_secs(5);

/// How long to wait after `accept` fails (say, out of file descriptors) before accepting again,
/// so the loop does not spin.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Serves the endpoints on `listener` until the task is dropped. The listener is shared so a
/// supervisor can serve it again should this loop stop.
pub async fn serve(listener: Arc<TcpListener>, endpoints: Endpoints, limits: ServerLimits) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "cannot accept a connection on the health/metrics listener");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let endpoints = endpoints.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let endpoints = endpoints.clone();
                async move { Ok::<_, Infallible>(respond(&request, &endpoints)) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read)
                .serve_connection(TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            let outcome = tokio::select! {
                outcome = connection.as_mut() => outcome,
                () = tokio::time::sleep(limits.connection) => {
                    connection.as_mut().graceful_shutdown();
                    match tokio::time::timeout(CONNECTION_GRACE, connection.as_mut()).await {
                        Ok(outcome) => outcome,
                        // Dropping the connection closes it.
                        Err(_) => Ok(()),
                    }
                }
            };
            if let Err(error) = outcome {
                tracing::debug!(%error, %peer, "health/metrics connection ended with an error");
            }
        });
    }
}

fn respond(request: &Request<Incoming>, endpoints: &Endpoints) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n".to_string());
    }
    match request.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n".to_string()),
        "/readyz" => readiness(&endpoints.diagnostics),
        "/metrics" => {
            let mut response = text(StatusCode::OK, endpoints.metrics.render());
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            response
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /healthz, /readyz or /metrics\n".to_string(),
        ),
    }
}

/// 503 while stopping or while a supervised task is down (each named, with why); else 200.
fn readiness(diagnostics: &Diagnostics) -> Response<Full<Bytes>> {
    let down = diagnostics.tasks_down();
    match diagnostics.leadership() {
        Leadership::Stopping => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: stopping\n".to_string(),
        ),
        _ if !down.is_empty() => text(
            StatusCode::SERVICE_UNAVAILABLE,
            down.iter()
                .map(|(task, reason)| format!("not ready: the {task} is down: {reason}\n"))
                .collect(),
        ),
        Leadership::Leader => text(StatusCode::OK, "ok: leader\n".to_string()),
        Leadership::Disabled => text(StatusCode::OK, "ok: leader election disabled\n".to_string()),
        // A standby is healthy and Ready: otherwise a rolling update of the Deployment, or
        // a drain under the PodDisruptionBudget, would wait forever for the old leader.
        Leadership::Follower => text(
            StatusCode::OK,
            "ok: standby, waiting for the leader lease\n".to_string(),
        ),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector::store;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    /// A one-request HTTP/1.1 client: enough to read a status line and a body.
    async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        let mut stream = TcpStream::connect(addr).await.expect("connects");
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.expect("writes");
        let mut response = String::new();
        stream.read_to_string(&mut response).await.expect("reads");
        let status = response
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .expect("status line");
        let body = response
            .split("\r\n\r\n")
            .nth(1)
            .unwrap_or_default()
            .to_string();
        (status, body)
    }

    async fn start(leadership: Leadership) -> (SocketAddr, Arc<Diagnostics>) {
        start_with(leadership, ServerLimits::DEFAULT).await
    }

    async fn start_with(
        leadership: Leadership,
        limits: ServerLimits,
    ) -> (SocketAddr, Arc<Diagnostics>) {
        let listener = bind("127.0.0.1:0".parse().expect("addr"), "health-addr")
            .await
            .expect("binds");
        let addr = listener.local_addr().expect("addr");
        let diagnostics = Arc::new(Diagnostics::new(leadership));
        let metrics = Arc::new(Metrics::new(store::<crate::packed::PackedRollout>().0));
        metrics.event_published("shop", "web", "Normal", "RolloutUpdated");
        tokio::spawn(serve(
            Arc::new(listener),
            Endpoints {
                diagnostics: diagnostics.clone(),
                metrics,
            },
            limits,
        ));
        (addr, diagnostics)
    }

    #[tokio::test]
    async fn healthz_is_always_ok() {
        let (addr, _) = start(Leadership::Follower).await;
        assert_eq!(get(addr, "/healthz").await, (200, "ok\n".to_string()));
    }

    #[tokio::test]
    async fn readyz_follows_leadership() {
        let (addr, diagnostics) = start(Leadership::Follower).await;
        let (status, body) = get(addr, "/readyz").await;
        assert_eq!(status, 200);
        assert!(
            body.contains("standby, waiting for the leader lease"),
            "{body}"
        );
        diagnostics.set_leadership(Leadership::Leader);
        assert_eq!(get(addr, "/readyz").await.0, 200);
        diagnostics.set_leadership(Leadership::Stopping);
        assert_eq!(get(addr, "/readyz").await.0, 503);
    }

    #[tokio::test]
    async fn readyz_fails_while_a_supervised_task_is_down_and_names_it() {
        let (addr, diagnostics) = start(Leadership::Leader).await;
        diagnostics.task_up("AnalysisRun controller");
        assert_eq!(get(addr, "/readyz").await.0, 200);
        diagnostics.task_down("AnalysisRun controller", "panicked: boom");
        let (status, body) = get(addr, "/readyz").await;
        assert_eq!(status, 503);
        assert_eq!(
            body,
            "not ready: the AnalysisRun controller is down: panicked: boom\n"
        );
        assert_eq!(get(addr, "/healthz").await.0, 200);
        diagnostics.task_up("AnalysisRun controller");
        assert_eq!(get(addr, "/readyz").await.0, 200);
        diagnostics.task_down("AnalysisRun controller", "ended");
        diagnostics.task_stopped("AnalysisRun controller");
        assert_eq!(get(addr, "/readyz").await.0, 200);
    }

    /// Reads from `stream` until the server closes it; `None` if it is still open after
    /// `deadline` (far longer than the limits under test).
    async fn closed_by_server(stream: &mut TcpStream, deadline: Duration) -> Option<String> {
        let mut received = Vec::new();
        let read = tokio::time::timeout(deadline, stream.read_to_end(&mut received)).await;
        read.ok()
            .map(|_| String::from_utf8_lossy(&received).into_owned())
    }

    #[tokio::test]
    async fn a_client_that_sends_no_request_is_disconnected() {
        let limits = ServerLimits {
            header_read: Duration::from_millis(200),
            connection: Duration::from_secs(60),
        };
        let (addr, _) = start_with(Leadership::Leader, limits).await;
        let mut silent = TcpStream::connect(addr).await.expect("connects");
        let mut half_sent = TcpStream::connect(addr).await.expect("connects");
        half_sent
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            .await
            .expect("writes");
        assert!(
            closed_by_server(&mut silent, Duration::from_secs(30))
                .await
                .is_some()
        );
        assert!(
            closed_by_server(&mut half_sent, Duration::from_secs(30))
                .await
                .is_some()
        );
        // Others are still served.
        assert_eq!(get(addr, "/healthz").await.0, 200);
    }

    /// Sends one kept-alive request to a server with `limits`; the server answers it, then
    /// closes the connection by itself.
    async fn kept_alive_request_is_answered_then_closed(limits: ServerLimits) {
        let (addr, _) = start_with(Leadership::Leader, limits).await;
        let mut stream = TcpStream::connect(addr).await.expect("connects");
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("writes");
        let received = closed_by_server(&mut stream, Duration::from_secs(30))
            .await
            .expect("closed before the deadline");
        assert!(received.starts_with("HTTP/1.1 200"), "{received}");
    }

    #[tokio::test]
    async fn a_kept_alive_connection_is_closed_once_its_time_is_up() {
        kept_alive_request_is_answered_then_closed(ServerLimits {
            header_read: Duration::from_secs(60),
            connection: Duration::from_millis(200),
        })
        .await;
    }

    #[tokio::test]
    async fn an_idle_kept_alive_connection_is_closed_after_the_header_read_timeout() {
        kept_alive_request_is_answered_then_closed(ServerLimits {
            header_read: Duration::from_millis(200),
            connection: Duration::from_secs(60),
        })
        .await;
    }

    #[tokio::test]
    async fn readyz_is_ok_without_leader_election() {
        let (addr, _) = start(Leadership::Disabled).await;
        assert_eq!(get(addr, "/readyz").await.0, 200);
    }

    #[tokio::test]
    async fn metrics_are_served_as_openmetrics() {
        let (addr, _) = start(Leadership::Leader).await;
        let (status, body) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        assert!(
            body.contains(r#"rollout_events_total{namespace="shop",name="web",type="Normal",reason="RolloutUpdated"} 1"#),
            "{body}"
        );
        assert!(body.ends_with("# EOF\n"), "{body}");
    }

    #[tokio::test]
    async fn unknown_paths_are_404() {
        let (addr, _) = start(Leadership::Leader).await;
        assert_eq!(get(addr, "/nope").await.0, 404);
    }
}
