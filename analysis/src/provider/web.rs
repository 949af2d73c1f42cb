//! The Web provider: an HTTP request whose JSON answer (or the part a JSONPath picks) is the
//! measured `result`, as Argo's web metric. A body that is not JSON is the result as text.

use std::time::Duration;

use expr::Value;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use rollouts_crds::analysis::{Measurement, Metric, WebMetric};

use super::{
    BodyError, DEFAULT_MAX_RESPONSE_BYTES, HeaderError, HttpClientError, MAX_TIMEOUT,
    MeasurementFuture, MetricProvider, OAuth2Error, RunContext, base64, error_measurement,
    metric_headers, oauth2_credentials, oauth2_token, read_capped,
};
use crate::condition;

/// Request timeout when a metric sets none (or 0); a larger one is cut to
/// [`MAX_TIMEOUT`](super::MAX_TIMEOUT).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a web metric's request gave no body to measure.
#[derive(Debug, thiserror::Error)]
pub enum WebError {
    #[error("use either Body or JSONBody; both cannot exists for WebMetric payload")]
    BodyAndJsonBody,
    #[error("Body/JSONBody can only be used with POST or PUT WebMetric Method types")]
    BodyWithGet,
    #[error("method {method:?} is not an HTTP method: use GET, POST or PUT")]
    NotAMethod { method: String },
    #[error(transparent)]
    Header(#[from] HeaderError),
    #[error(transparent)]
    OAuth2(#[from] OAuth2Error),
    /// The error names no URL: its query can carry a secret.
    #[error(transparent)]
    Request(reqwest::Error),
    #[error("received non 2xx response code: {code}")]
    Status { code: u16 },
    #[error(transparent)]
    Body(#[from] BodyError),
}

/// Why a JSONPath picked no value out of a web metric's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonPathError {
    #[error("JSONPath {template:?} is not supported: {why}")]
    Unsupported { template: String, why: &'static str },
    #[error("Could not find JSONPath in body: {template} selects nothing at {step}")]
    SelectsNothing {
        template: String,
        /// The step that selected nothing, as written by `Debug`.
        step: String,
    },
    #[error("result of web metric produced no value")]
    NoValue,
}

/// Sends web metric requests. Holds one HTTP client that verifies TLS and one that does not.
#[derive(Clone, Debug)]
pub struct WebProvider {
    secure: reqwest::Client,
    insecure: reqwest::Client,
    /// Bytes of an answer read at most.
    max_body: usize,
}

impl WebProvider {
    /// A provider using the given clients (the second skips TLS verification).
    pub fn with_clients(secure: reqwest::Client, insecure: reqwest::Client) -> Self {
        Self {
            secure,
            insecure,
            max_body: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }

    /// Reads at most `bytes` of an answer (the OAuth2 token's included); a larger one is an
    /// Error measurement naming the limit.
    pub fn with_max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// A provider with its own HTTP clients (see [`super::install_crypto_provider`]).
    pub fn new() -> Result<Self, HttpClientError> {
        super::install_crypto_provider();
        Ok(Self::with_clients(
            reqwest::Client::builder().build()?,
            reqwest::Client::builder()
                .danger_accept_invalid_certs(true)
                .build()?,
        ))
    }

    async fn measure(&self, run: RunContext<'_>, metric: &Metric) -> Measurement {
        let now = run.now;
        let Some(web) = &metric.provider.web else {
            return error_measurement(format!("metric {:?} has no provider.web", metric.name), now);
        };
        let body = match self.fetch(web).await {
            Ok(body) => body,
            Err(e) => return error_measurement(e.to_string(), now),
        };
        let (value, result) = match serde_json::from_slice::<serde_json::Value>(&body) {
            Err(_) => {
                let text = String::from_utf8_lossy(&body).into_owned();
                (text.clone(), Value::String(text))
            }
            Ok(document) => {
                let path = web
                    .json_path
                    .as_deref()
                    .filter(|p| !p.is_empty())
                    .unwrap_or("{$}");
                match find(&document, path) {
                    Ok(found) => (found.to_string(), condition::from_json(&found)),
                    Err(e) => return error_measurement(e.to_string(), now),
                }
            }
        };
        match condition::evaluate_metric(&result, metric) {
            Ok(phase) => Measurement {
                phase,
                value,
                started_at: Some(Time(now)),
                finished_at: Some(Time(now)),
                ..Default::default()
            },
            Err(e) => error_measurement(e.to_string(), now),
        }
    }

    /// Sends the request; the response body of a 2xx answer, or the reason it failed.
    async fn fetch(&self, web: &WebMetric) -> Result<Vec<u8>, WebError> {
        let method = web
            .method
            .as_deref()
            .filter(|m| !m.is_empty())
            .unwrap_or("GET");
        let text_body = web.body.as_deref().filter(|b| !b.is_empty());
        if text_body.is_some() && web.json_body.is_some() {
            return Err(WebError::BodyAndJsonBody);
        }
        if (text_body.is_some() || web.json_body.is_some()) && method == "GET" {
            return Err(WebError::BodyWithGet);
        }
        let method =
            reqwest::Method::from_bytes(method.as_bytes()).map_err(|_| WebError::NotAMethod {
                method: method.to_string(),
            })?;
        let client = if web.insecure == Some(true) {
            &self.insecure
        } else {
            &self.secure
        };
        let timeout = match web.timeout_seconds {
            Some(seconds) if seconds > 0 => {
                Duration::from_secs(seconds.unsigned_abs()).min(MAX_TIMEOUT)
            }
            _ => DEFAULT_TIMEOUT,
        };
        let mut request = client.request(method, &web.url).timeout(timeout);
        for (name, value) in metric_headers(&web.headers)? {
            request = request.header(name, value);
        }
        if let Some(auth) = &web.authentication {
            if let Some(oauth2) = oauth2_credentials(auth.oauth2.as_ref())? {
                let token = oauth2_token(client, &oauth2, timeout, self.max_body).await?;
                request = request.header(AUTHORIZATION, format!("Bearer {token}"));
            }
            if let Some(basic) = &auth.basic_auth {
                let username = basic.username.as_deref().unwrap_or("");
                let password = basic.password.as_deref().unwrap_or("");
                if !username.is_empty() || !password.is_empty() {
                    let token = base64(format!("{username}:{password}").as_bytes());
                    request = request.header(AUTHORIZATION, format!("Basic {token}"));
                }
            }
        }
        if let Some(body) = text_body {
            request = request.body(body.to_string());
        } else if let Some(json) = &web.json_body {
            request = request
                .header(CONTENT_TYPE, "application/json")
                .body(json.to_string());
        }
        let response = request
            .send()
            .await
            .map_err(|e| WebError::Request(e.without_url()))?;
        let status = response.status();
        if !status.is_success() {
            return Err(WebError::Status {
                code: status.as_u16(),
            });
        }
        Ok(read_capped(response, self.max_body).await?)
    }
}

/// One step of a JSONPath.
#[derive(Debug, PartialEq)]
enum Step {
    Field(String),
    Index(i64),
    Wildcard,
}

/// Parses the Kubernetes JSONPath subset web metrics use: `{$}`, `{$.a.b}`, `{.a[0].b}`,
/// `{$.a['b-c']}`, `{.items[*].x}`, `{.items[-1]}`.
fn parse_path(template: &str) -> Result<Vec<Step>, JsonPathError> {
    let unsupported = |why: &'static str| JsonPathError::Unsupported {
        template: template.to_string(),
        why,
    };
    let inner = template
        .trim()
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .ok_or_else(|| unsupported("write it as {$.field} or {.field}"))?
        .trim();
    let mut rest = inner.strip_prefix('$').unwrap_or(inner);
    let mut steps = Vec::new();
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            let name = &after[..end];
            match name {
                "" => return Err(unsupported("empty field name")),
                "*" => steps.push(Step::Wildcard),
                _ => steps.push(Step::Field(name.to_string())),
            }
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix('[') {
            let end = after
                .find(']')
                .ok_or_else(|| unsupported("[ is not closed"))?;
            let inside = after[..end].trim();
            if inside == "*" {
                steps.push(Step::Wildcard);
            } else if let Some(quoted) = inside
                .strip_prefix('\'')
                .and_then(|q| q.strip_suffix('\''))
                .or_else(|| inside.strip_prefix('"').and_then(|q| q.strip_suffix('"')))
            {
                steps.push(Step::Field(quoted.to_string()));
            } else {
                let index = inside
                    .parse::<i64>()
                    .map_err(|_| unsupported("only [index], ['name'] and [*] are supported"))?;
                steps.push(Step::Index(index));
            }
            rest = &after[end + 1..];
        } else {
            return Err(unsupported("expected . or ["));
        }
    }
    Ok(steps)
}

/// The first value the JSONPath selects in `document`.
fn find(document: &serde_json::Value, template: &str) -> Result<serde_json::Value, JsonPathError> {
    let steps = parse_path(template)?;
    let mut current = vec![document];
    for step in &steps {
        let mut next = Vec::new();
        for value in current {
            match (step, value) {
                (Step::Field(name), serde_json::Value::Object(map)) => {
                    next.extend(map.get(name));
                }
                (Step::Index(i), serde_json::Value::Array(items)) => {
                    // A negative index counts from the end; out of range selects nothing.
                    let index = if *i < 0 {
                        i64::try_from(items.len())
                            .ok()
                            .and_then(|len| len.checked_add(*i))
                    } else {
                        Some(*i)
                    };
                    let item = index
                        .and_then(|i| usize::try_from(i).ok())
                        .and_then(|i| items.get(i));
                    next.extend(item);
                }
                (Step::Wildcard, serde_json::Value::Array(items)) => next.extend(items),
                (Step::Wildcard, serde_json::Value::Object(map)) => next.extend(map.values()),
                _ => {}
            }
        }
        if next.is_empty() {
            return Err(JsonPathError::SelectsNothing {
                template: template.to_string(),
                step: format!("{step:?}"),
            });
        }
        current = next;
    }
    current
        .first()
        .map(|v| (*v).clone())
        .ok_or(JsonPathError::NoValue)
}

impl MetricProvider for WebProvider {
    fn kind(&self) -> &'static str {
        "Web"
    }

    fn run<'a>(&'a self, run: RunContext<'a>, metric: &'a Metric) -> MeasurementFuture<'a> {
        Box::pin(self.measure(run, metric))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_paths_select_like_kubernetes() {
        let doc = json!({
            "data": {"ok": true, "rate": 0.5, "my-key": "v"},
            "items": [{"x": 1}, {"x": 2}]
        });
        assert_eq!(find(&doc, "{$}").unwrap(), doc);
        assert_eq!(find(&doc, "{$.data.rate}").unwrap(), json!(0.5));
        assert_eq!(find(&doc, "{.data.ok}").unwrap(), json!(true));
        assert_eq!(find(&doc, "{$.data['my-key']}").unwrap(), json!("v"));
        assert_eq!(find(&doc, "{.items[1].x}").unwrap(), json!(2));
        assert_eq!(find(&doc, "{.items[-1].x}").unwrap(), json!(2));
        assert_eq!(find(&doc, "{.items[*].x}").unwrap(), json!(1));
        assert!(
            find(&doc, "{.data.missing}")
                .unwrap_err()
                .to_string()
                .contains("selects nothing")
        );
        assert!(
            find(&doc, "$.data")
                .unwrap_err()
                .to_string()
                .contains("not supported")
        );
        assert!(
            find(&doc, "{.items[?(@.x==1)]}")
                .unwrap_err()
                .to_string()
                .contains("not supported")
        );
    }

    #[test]
    fn extreme_indexes_select_nothing() {
        let doc = json!({"items": [1, 2]});
        assert_eq!(find(&doc, "{.items[-2]}").unwrap(), json!(1));
        for path in [
            "{.items[-3]}",
            "{.items[9223372036854775807]}",
            "{.items[-9223372036854775808]}",
        ] {
            assert!(
                find(&doc, path)
                    .unwrap_err()
                    .to_string()
                    .contains("selects nothing"),
                "{path}"
            );
        }
        assert!(find(&doc, "{.items[99999999999999999999]}").is_err());
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn any_json() -> impl Strategy<Value = serde_json::Value> {
            let leaf = prop_oneof![
                Just(serde_json::Value::Null),
                any::<bool>().prop_map(serde_json::Value::from),
                any::<i64>().prop_map(serde_json::Value::from),
                any::<f64>().prop_map(serde_json::Value::from),
                "[a-z]{0,3}".prop_map(serde_json::Value::from),
            ];
            leaf.prop_recursive(4, 32, 4, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..4)
                        .prop_map(serde_json::Value::from),
                    proptest::collection::btree_map("[a-z]{1,2}", inner, 0..4)
                        .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
                ]
            })
        }

        fn path_text() -> impl Strategy<Value = String> {
            let step = prop_oneof![
                "\\.[a-z*]{0,2}",
                "\\[-?[0-9]{1,20}\\]",
                Just("[*]".to_string()),
                "\\['[a-z\\]\\[.]{0,3}'\\]",
                "[\\[\\]{}$.'\"]",
            ];
            (
                prop_oneof![Just("{$"), Just("{"), Just("$"), Just("")],
                proptest::collection::vec(step, 0..6),
                prop_oneof![Just("}"), Just("")],
            )
                .prop_map(|(open, steps, close)| format!("{open}{}{close}", steps.concat()))
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(500))]

            /// Any JSONPath on any document: a value or an error, never a panic.
            #[test]
            fn any_path_on_any_document_finds_or_errs(
                document in any_json(),
                path in prop_oneof![path_text(), "\\PC{0,24}".boxed()],
            ) {
                let _ = find(&document, &path);
            }
        }
    }
}
