//! The HTTP endpoints: `/healthz` (the process serves), `/readyz` (this replica leads or stands
//! by ready to take over, or leader election is off; not while stopping) and `/metrics` (Prometheus text). Served by hyper on two listeners,
//! `--health-addr` and `--metrics-addr`, with the same routes on each.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
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
}

impl Diagnostics {
    pub fn new(leadership: Leadership) -> Self {
        Self {
            leadership: AtomicU8::new(leadership as u8),
        }
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

/// Serves the endpoints on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, endpoints: Endpoints) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "cannot accept a connection on the health/metrics listener");
                continue;
            }
        };
        let endpoints = endpoints.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let endpoints = endpoints.clone();
                async move { Ok::<_, Infallible>(respond(&request, &endpoints)) }
            });
            if let Err(error) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
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
        "/readyz" => match endpoints.diagnostics.leadership() {
            Leadership::Leader => text(StatusCode::OK, "ok: leader\n".to_string()),
            Leadership::Disabled => {
                text(StatusCode::OK, "ok: leader election disabled\n".to_string())
            }
            // A standby is healthy and Ready: otherwise a rolling update of the Deployment, or
            // a drain under the PodDisruptionBudget, would wait forever for the old leader.
            Leadership::Follower => text(
                StatusCode::OK,
                "ok: standby, waiting for the leader lease\n".to_string(),
            ),
            Leadership::Stopping => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: stopping\n".to_string(),
            ),
        },
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
    use rollouts_crds::rollout::Rollout;
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
        let listener = bind("127.0.0.1:0".parse().expect("addr"), "health-addr")
            .await
            .expect("binds");
        let addr = listener.local_addr().expect("addr");
        let diagnostics = Arc::new(Diagnostics::new(leadership));
        let metrics = Arc::new(Metrics::new(store::<Rollout>().0));
        metrics.event_published("shop", "web", "Normal", "RolloutUpdated");
        tokio::spawn(serve(
            listener,
            Endpoints {
                diagnostics: diagnostics.clone(),
                metrics,
            },
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
