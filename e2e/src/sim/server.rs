//! The HTTP server: accepts connections, routes paths to discovery, OpenAPI and resource
//! handlers, injects faults and records every request.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, header};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::sync::watch;

use super::discovery;
use super::faults::{FaultLog, Faults, Injected, WriteCutCount};
use super::handlers::{self, ApiRequest, Reply, Verb};
use super::output::Output;
use super::request_log::{RequestLog, RequestRecord};
use super::status::ApiError;
use super::store::Store;
use super::watch::Body;

/// Everything the server and the simulated controllers share.
pub struct Sim {
    pub store: Store,
    /// A channel, so held requests learn at once that their rule was cleared.
    faults: watch::Sender<Faults>,
    pub requests: RequestLog,
    /// Writes counted by the write-cut rule since the faults were last set.
    pub write_cut: WriteCutCount,
    pub bookmark_interval: Duration,
    pub shutdown: watch::Receiver<bool>,
    pub address: SocketAddr,
    /// The seeded generator random faults are drawn from, and their counts.
    pub fault_log: FaultLog,
}

impl Sim {
    pub fn new(
        store: Store,
        faults: Faults,
        requests: RequestLog,
        bookmark_interval: Duration,
        shutdown: watch::Receiver<bool>,
        address: SocketAddr,
    ) -> Self {
        Self {
            store,
            fault_log: FaultLog::new(faults.random.seed),
            faults: watch::Sender::new(faults),
            requests,
            write_cut: WriteCutCount::default(),
            bookmark_interval,
            shutdown,
            address,
        }
    }

    pub fn faults(&self) -> Faults {
        self.faults.borrow().clone()
    }

    pub fn set_faults(&self, faults: Faults) {
        self.write_cut.reset();
        self.faults.send_replace(faults);
    }

    /// Waits while a rule holds requests on `resource` of `group`: until it is cleared, or for
    /// its delay.
    async fn wait_while_held(&self, group: &str, resource: &str) {
        let delay = match self.faults.borrow().hold(group, resource) {
            None => return,
            Some(hold) => hold.delay,
        };
        match delay {
            Some(delay) => tokio::time::sleep(delay).await,
            None => {
                let mut faults = self.faults.subscribe();
                // The sender lives as long as `self`: an error cannot happen while we wait.
                let _ = faults
                    .wait_for(|faults| faults.hold(group, resource).is_none())
                    .await;
            }
        }
    }
}

/// Serves connections until shutdown.
pub async fn serve(listener: tokio::net::TcpListener, sim: Arc<Sim>) {
    let mut shutdown = sim.shutdown.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let sim = sim.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let sim = sim.clone();
                        async move { Ok::<_, Infallible>(handle(sim, req).await) }
                    });
                    // A client hanging up mid-request is its business, not the server's.
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            _ = shutdown.changed() => return,
        }
    }
}

pub fn json_response(code: u16, value: &Value) -> Response<Body> {
    let body = serde_json::to_vec(value).expect("JSON values always serialize");
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)).boxed())
        .expect("static response parts are valid")
}

fn error_response(err: &ApiError) -> Response<Body> {
    json_response(err.code, &err.to_status())
}

fn text_response(code: u16, text: &'static str) -> Response<Body> {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from_static(text.as_bytes())).boxed())
        .expect("static response parts are valid")
}

/// Query parameters, percent-decoded (kube-rs may start a query with `?&`).
/// The name a list or watch selects with `fieldSelector=metadata.name=X`: the API server's
/// request info carries it, so RBAC's `resourceNames` can allow such a watch, and so does our
/// request log.
fn selected_name(field_selector: Option<&String>) -> String {
    field_selector
        .into_iter()
        .flat_map(|selector| selector.split(','))
        .find_map(|term| {
            let term = term.trim();
            term.strip_prefix("metadata.name==")
                .or_else(|| term.strip_prefix("metadata.name="))
        })
        .unwrap_or_default()
        .to_string()
}

pub fn parse_query(query: &str) -> HashMap<String, String> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A resource path: `/api/v1/...` or `/apis/G/V/...`.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourcePath {
    pub group: String,
    pub version: String,
    pub namespace: Option<String>,
    pub plural: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

pub fn parse_resource_path(segments: &[&str]) -> Option<ResourcePath> {
    let (group, version, rest) = match segments {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let (namespace, plural, tail) = match rest {
        ["namespaces", ns, sub @ ("status" | "finalize")] if group.is_empty() => {
            (None, "namespaces", vec![*ns, *sub])
        }
        ["namespaces", ns, plural, tail @ ..] => (Some(ns.to_string()), *plural, tail.to_vec()),
        [plural, tail @ ..] => (None, *plural, tail.to_vec()),
        [] => return None,
    };
    if tail.len() > 2 {
        return None;
    }
    Some(ResourcePath {
        group: group.into(),
        version: version.into(),
        namespace,
        plural: plural.into(),
        name: tail.first().map(|s| s.to_string()),
        subresource: tail.get(1).map(|s| s.to_string()),
    })
}

async fn handle(sim: Arc<Sim>, req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let header_str = |name: header::HeaderName| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let user_agent = header_str(header::USER_AGENT);
    let path = parts.uri.path().to_string();
    let query = parse_query(parts.uri.query().unwrap_or_default());
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let mut record = RequestRecord {
        verb: parts.method.as_str().to_lowercase(),
        group: String::new(),
        resource: String::new(),
        subresource: String::new(),
        namespace: String::new(),
        name: String::new(),
        path: path.clone(),
        user_agent,
        code: 200,
    };
    let response = match non_resource(&sim, &parts.method, &segments) {
        Some(response) => response,
        None => match parse_resource_path(&segments) {
            None => error_response(&ApiError::path_not_found(&path)),
            Some(rp) => {
                let body = match body.collect().await {
                    Ok(b) => b.to_bytes(),
                    Err(e) => {
                        return error_response(&ApiError::bad_request(format!(
                            "reading the request body: {e}"
                        )));
                    }
                };
                let verb = Verb::of(&parts.method, rp.name.is_some(), &query);
                record.verb = verb.as_str().to_string();
                record.group = rp.group.clone();
                record.resource = rp.plural.clone();
                record.subresource = rp.subresource.clone().unwrap_or_default();
                record.namespace = rp.namespace.clone().unwrap_or_default();
                record.name = rp.name.clone().unwrap_or_default();
                if record.name.is_empty() && matches!(verb.as_str(), "list" | "watch") {
                    record.name = selected_name(query.get("fieldSelector"));
                }
                record.path.clear();
                let request = ApiRequest {
                    verb,
                    path: rp,
                    query,
                    output: Output::from_accept(&header_str(header::ACCEPT)),
                    content_type: header_str(header::CONTENT_TYPE),
                    user_agent: record.user_agent.clone(),
                    body,
                };
                resource(&sim, request).await
            }
        },
    };
    record.code = response.status().as_u16();
    sim.requests.record(record);
    response
}

async fn resource(sim: &Arc<Sim>, request: ApiRequest) -> Response<Body> {
    let faults = sim.faults();
    if !faults.latency.is_zero() {
        tokio::time::sleep(faults.latency).await;
    }
    sim.wait_while_held(&request.path.group, &request.path.plural)
        .await;
    if sim.write_cut.refuses(
        faults.write_cut.as_ref(),
        &request.user_agent,
        request.verb.is_write(),
    ) {
        return error_response(&ApiError::internal(
            "injected fault: this client is cut off after its last allowed write (write-cut rule)",
        ));
    }
    if faults.forbids(&request.path.group, &request.path.plural) {
        let p = &request.path;
        return error_response(&ApiError::forbidden(
            &p.group,
            &p.plural,
            p.name.as_deref().unwrap_or_default(),
            "injected fault: the client's RBAC does not allow this (forbid rule)",
        ));
    }
    let (injected, spike) = sim.fault_log.draw(&faults, request.verb.is_write());
    if !spike.is_zero() {
        tokio::time::sleep(spike).await;
    }
    match injected {
        Injected::TooManyRequests => {
            let seconds = faults.random.retry_after_seconds;
            let mut response = json_response(
                429,
                &serde_json::json!({
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Failure",
                    "message": "injected fault: too many requests, please try again later",
                    "reason": "TooManyRequests",
                    "details": {"retryAfterSeconds": seconds},
                    "code": 429,
                }),
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(seconds));
            return response;
        }
        Injected::InternalError => {
            return error_response(&ApiError::internal("injected fault: internal error"));
        }
        Injected::Conflict => {
            let p = &request.path;
            return error_response(&ApiError::conflict(
                &p.group,
                &p.plural,
                p.name.as_deref().unwrap_or_default(),
                "injected fault: conflict",
            ));
        }
        Injected::None => {}
    }
    match handlers::serve(sim, request) {
        Ok((code, Reply::Json(value))) => json_response(code, &value),
        Ok((code, Reply::Stream(body))) => Response::builder()
            .status(code)
            .header(header::CONTENT_TYPE, "application/json")
            .body(body)
            .expect("static response parts are valid"),
        Err(err) => error_response(&err),
    }
}

/// `/version`, health, discovery and OpenAPI; None when the path is a resource path.
fn non_resource(sim: &Sim, method: &Method, segments: &[&str]) -> Option<Response<Body>> {
    let is_discovery = matches!(
        segments,
        ["version"]
            | ["healthz" | "readyz" | "livez", ..]
            | ["api"]
            | ["apis"]
            | ["apis", _]
            | ["api", _]
            | ["apis", _, _]
            | ["openapi", ..]
    );
    if !is_discovery {
        return None;
    }
    if method != Method::GET {
        return Some(error_response(&ApiError::method_not_allowed(format!(
            "{method} is not supported on /{}",
            segments.join("/")
        ))));
    }
    let not_found = || {
        error_response(&ApiError::path_not_found(&format!(
            "/{}",
            segments.join("/")
        )))
    };
    let state = sim.store.lock();
    let registry = &state.registry;
    Some(match segments {
        ["version"] => json_response(200, &discovery::version()),
        ["healthz" | "readyz" | "livez", ..] => text_response(200, "ok"),
        ["api"] => json_response(200, &discovery::api_versions(&sim.address.to_string())),
        ["apis"] => json_response(200, &discovery::api_group_list(registry)),
        ["apis", group] => discovery::api_group_doc(registry, group)
            .map_or_else(not_found, |d| json_response(200, &d)),
        ["api", version] => discovery::resource_list(registry, "", version)
            .map_or_else(not_found, |d| json_response(200, &d)),
        ["apis", group, version] => discovery::resource_list(registry, group, version)
            .map_or_else(not_found, |d| json_response(200, &d)),
        ["openapi", "v3"] => json_response(200, &discovery::openapi_root(registry)),
        ["openapi", "v3", rest @ ..] => discovery::openapi_group_version(registry, &rest.join("/"))
            .map_or_else(not_found, |d| json_response(200, &d)),
        _ => not_found(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_by_name_field_selector_is_logged_with_that_name() {
        let name = |selector: &str| selected_name(Some(&selector.to_string()));
        assert_eq!(name("metadata.name=cm"), "cm");
        assert_eq!(name("metadata.namespace=ops,metadata.name==cm"), "cm");
        assert_eq!(name("metadata.name!=cm"), "");
        assert_eq!(selected_name(None), "");
    }

    #[test]
    fn paths_parse_into_resources() {
        let p = |s: &str| {
            parse_resource_path(&s.split('/').filter(|x| !x.is_empty()).collect::<Vec<_>>())
        };
        let pods = p("/api/v1/namespaces/default/pods/web-1/status").expect("pod status path");
        assert_eq!(
            (
                pods.namespace.as_deref(),
                pods.plural.as_str(),
                pods.name.as_deref(),
                pods.subresource.as_deref()
            ),
            (Some("default"), "pods", Some("web-1"), Some("status"))
        );
        let ns = p("/api/v1/namespaces/default").expect("namespace path");
        assert_eq!(
            (ns.namespace, ns.plural.as_str(), ns.name.as_deref()),
            (None, "namespaces", Some("default"))
        );
        let ns_status = p("/api/v1/namespaces/default/status").expect("namespace status path");
        assert_eq!(
            (ns_status.name.as_deref(), ns_status.subresource.as_deref()),
            (Some("default"), Some("status"))
        );
        let all = p("/apis/argoproj.io/v1alpha1/rollouts").expect("cluster-wide list");
        assert_eq!(
            (all.group.as_str(), all.namespace, all.name),
            ("argoproj.io", None, None)
        );
        assert!(p("/apis/apps/v1/namespaces/a/deployments/b/scale/extra").is_none());
    }

    #[test]
    fn queries_are_percent_decoded() {
        let q = parse_query("&labelSelector=app%3Dweb%2Ctier+in+%28a%29&watch=true");
        assert_eq!(q["labelSelector"], "app=web,tier in (a)");
        assert_eq!(q["watch"], "true");
    }
}
