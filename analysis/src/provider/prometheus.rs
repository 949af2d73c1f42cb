//! The Prometheus provider: an instant query evaluated at the measurement's time, or a range
//! query, with per-metric headers, timeout, TLS verification, basic and OAuth2
//! (client-credentials) authentication. Results
//! reach conditions the way Argo shapes them: a scalar is a number, a vector or a matrix is a
//! list of its sample values (so `result[0]`). Identical queries for the same evaluation time
//! (many runs of one template) share a single request.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared};

use expr::Value;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use prometheus_http_query::{Client, response::Data};
use reqwest::header::{AUTHORIZATION, HeaderName, HeaderValue, InvalidHeaderValue};
use rollouts_crds::analysis::{Measurement, Metric, OAuth2Config, PrometheusMetric};
use rollouts_crds::duration;

use super::{
    BodyError, DEFAULT_MAX_RESPONSE_BYTES, HeaderError, HttpClientError, MAX_TIMEOUT,
    MeasurementFuture, MetricProvider, OAuth2Error, RunContext, base64, body_excerpt,
    error_measurement, format_sample, metric_headers, oauth2_credentials, oauth2_token,
    read_capped,
};
use crate::condition::{self, ExpressionError};

/// Metadata key of the query a metric ran, with arguments substituted.
pub const RESOLVED_QUERY_KEY: &str = "ResolvedPrometheusQuery";
/// Query timeout when a metric sets none; a larger one is cut to
/// [`MAX_TIMEOUT`](super::MAX_TIMEOUT).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a Prometheus query gave no answer. Clone (sources shared): every run whose identical
/// query was coalesced into one request gets the same error.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PrometheusError {
    #[error("prometheus address is not configured: set provider.prometheus.address")]
    NoAddress,
    #[error("prometheus address {address:?} is not a URL: write it as http://host:port")]
    NotAUrl { address: String },
    #[error("prometheus timeout should not be negative")]
    NegativeTimeout,
    #[error("failed to parse rangeQuery.{field} as time: {source}")]
    RangeTime {
        /// `start` or `end`.
        field: &'static str,
        #[source]
        source: Arc<ExpressionError>,
    },
    #[error("failed to parse rangeQuery.step as duration: {reason}")]
    RangeStep { reason: String },
    #[error(transparent)]
    Header(#[from] HeaderError),
    #[error("missing mandatory parameter in metric for basic auth setup: {field}")]
    BasicAuthMissing {
        /// `username` or `password`.
        field: &'static str,
    },
    #[error("basic auth header: {source}")]
    BasicAuthHeader {
        #[source]
        source: Arc<InvalidHeaderValue>,
    },
    #[error(
        "authentication.sigv4 is not supported by this controller: query Amazon Managed Prometheus through a SigV4 proxy and point provider.prometheus.address at it"
    )]
    SigV4Unsupported,
    #[error(transparent)]
    OAuth2(#[from] OAuth2Error),
    #[error("oauth2 token is not a valid header value: {source}")]
    BearerHeader {
        #[source]
        source: Arc<InvalidHeaderValue>,
    },
    #[error("{source}")]
    Client {
        #[source]
        source: Arc<prometheus_http_query::Error>,
    },
    #[error("prometheus query timed out after {}", duration::format(*.timeout))]
    Timeout { timeout: Duration },
    #[error("prometheus answer: {source}")]
    Body {
        #[source]
        source: Arc<BodyError>,
    },
    #[error("prometheus answered {status} with a body that is not a query result: {excerpt}")]
    NotAnAnswer {
        status: reqwest::StatusCode,
        /// The start of the body.
        excerpt: String,
    },
    /// The text names every cause (connection refused, DNS, TLS), with the URL's query,
    /// which can carry a secret, left out.
    #[error("{}", with_causes(.source.as_ref()))]
    Query {
        #[source]
        source: Arc<prometheus_http_query::Error>,
    },
}

/// Queries Prometheus. Holds one HTTP client that verifies TLS and one that does not (for
/// metrics with `insecure: true`).
#[derive(Clone, Debug)]
pub struct PrometheusProvider {
    secure: reqwest::Client,
    insecure: reqwest::Client,
    default_address: Option<String>,
    /// Bytes of an answer read at most.
    max_body: usize,
    /// Queries being answered (and recent answers), shared by clones of this provider.
    in_flight: Arc<Mutex<HashMap<QueryKey, SharedAnswer>>>,
}

impl PrometheusProvider {
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

    /// A provider using the given clients (to share connection pools with the caller).
    pub fn with_clients(secure: reqwest::Client, insecure: reqwest::Client) -> Self {
        Self {
            secure,
            insecure,
            default_address: None,
            max_body: DEFAULT_MAX_RESPONSE_BYTES,
            in_flight: Arc::default(),
        }
    }

    /// Reads at most `bytes` of an answer (the OAuth2 token's included); a larger one is an
    /// Error measurement naming the limit.
    pub fn with_max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// The address used by metrics that set none (Argo reads it from
    /// `ARGO_ROLLOUTS_PROMETHEUS_ADDRESS`).
    pub fn with_default_address(mut self, address: impl Into<String>) -> Self {
        self.default_address = Some(address.into());
        self
    }

    async fn measure(&self, run: RunContext<'_>, metric: &Metric) -> Measurement {
        let now = run.now;
        let Some(config) = &metric.provider.prometheus else {
            return error_measurement(
                format!("metric {:?} has no provider.prometheus", metric.name),
                now,
            );
        };
        let data = match self.query(config, run).await {
            Ok(data) => data,
            Err(e) => return error_measurement(e.to_string(), now),
        };
        let (value, result) = shape(&data);
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

    /// Runs the metric's query: the answer, or the reason it failed. Identical queries for the
    /// same evaluation time share one request (see [`QueryKey`]).
    pub(crate) async fn query(
        &self,
        config: &PrometheusMetric,
        run: RunContext<'_>,
    ) -> Result<Data, PrometheusError> {
        let address = config
            .address
            .as_deref()
            .filter(|a| !a.is_empty())
            .or(self.default_address.as_deref())
            .ok_or(PrometheusError::NoAddress)?;
        let url = reqwest::Url::parse(address)
            .ok()
            .filter(|u| !u.scheme().is_empty() && u.host_str().is_some())
            .ok_or_else(|| PrometheusError::NotAUrl {
                address: address.to_string(),
            })?;
        let timeout = match config.timeout {
            None => DEFAULT_TIMEOUT,
            Some(seconds) if seconds >= 0 => {
                Duration::from_secs(seconds.unsigned_abs()).min(MAX_TIMEOUT)
            }
            Some(_) => return Err(PrometheusError::NegativeTimeout),
        };
        let window = match &config.range_query {
            None => Window::Instant(run.now.as_second()),
            Some(range) => {
                let time = |field, expression: &Option<String>| {
                    condition::eval_time(expression.as_deref().unwrap_or(""), run.now).map_err(
                        |source| PrometheusError::RangeTime {
                            field,
                            source: Arc::new(source),
                        },
                    )
                };
                let start = time("start", &range.start)?;
                let end = time("end", &range.end)?;
                let step = duration::parse(range.step.as_deref().unwrap_or("")).map_err(|e| {
                    PrometheusError::RangeStep {
                        reason: e.to_string(),
                    }
                })?;
                Window::Range {
                    start: start.as_second(),
                    end: end.as_second(),
                    step_millis: step.as_millis(),
                }
            }
        };
        let key = QueryKey {
            address: url.to_string(),
            insecure: config.insecure == Some(true),
            headers: request_headers(config)?,
            query: config.query.clone().unwrap_or_default(),
            window,
            timeout,
            oauth2: oauth2_credentials(
                config
                    .authentication
                    .as_ref()
                    .and_then(|a| a.oauth2.as_ref()),
            )?
            .map(|c| OAuth2Key {
                token_url: c.token_url.unwrap_or_default(),
                client_id: c.client_id.unwrap_or_default(),
                client_secret: c.client_secret.unwrap_or_default(),
                scopes: c.scopes,
            }),
        };
        let answer = {
            let mut in_flight = self
                .in_flight
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // Answers for evaluation times well in the past will not be asked for again.
            let horizon = run.now.as_second() - COALESCE_HORIZON_SECONDS;
            in_flight.retain(|k, _| k.window.at() >= horizon);
            match in_flight.get(&key) {
                Some(answer) => answer.clone(),
                None => {
                    let http = if key.insecure {
                        self.insecure.clone()
                    } else {
                        self.secure.clone()
                    };
                    let answer = send(http, key.clone(), self.max_body).boxed().shared();
                    in_flight.insert(key, answer.clone());
                    answer
                }
            }
        };
        answer.await
    }
}

/// How long (in evaluation-time seconds) an answer stays available to identical queries.
const COALESCE_HORIZON_SECONDS: i64 = 60;

/// The time a query looks at.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Window {
    /// An instant query at this Unix second.
    Instant(i64),
    /// A range query.
    Range {
        start: i64,
        end: i64,
        step_millis: u128,
    },
}

impl Window {
    fn at(&self) -> i64 {
        match self {
            Window::Instant(at) => *at,
            Window::Range { end, .. } => *end,
        }
    }
}

/// Everything that makes two queries the same request: many runs of one template, measured in
/// the same second, ask Prometheus once.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct QueryKey {
    address: String,
    insecure: bool,
    headers: Vec<(HeaderName, HeaderValue)>,
    query: String,
    window: Window,
    timeout: Duration,
    oauth2: Option<OAuth2Key>,
}

/// OAuth2 client credentials; the token is fetched when the query is sent, so runs sharing
/// credentials still share the query.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct OAuth2Key {
    token_url: String,
    client_id: String,
    client_secret: String,
    scopes: Vec<String>,
}

type SharedAnswer = Shared<BoxFuture<'static, Result<Data, PrometheusError>>>;

/// Prometheus' answer to a query, read by us so that its size can be capped.
#[derive(serde::Deserialize)]
#[serde(tag = "status")]
enum ApiAnswer {
    #[serde(rename = "success")]
    Success { data: Data },
    #[serde(rename = "error")]
    Error(prometheus_http_query::error::PrometheusError),
}

/// Sends one query, within its timeout (the OAuth2 token request included); reads at most
/// `max_body` bytes of any answer.
async fn send(
    http: reqwest::Client,
    key: QueryKey,
    max_body: usize,
) -> Result<Data, PrometheusError> {
    let timeout = key.timeout;
    match tokio::time::timeout(timeout, send_within(http, key, max_body)).await {
        Err(_) => Err(PrometheusError::Timeout { timeout }),
        Ok(answer) => answer,
    }
}

async fn send_within(
    http: reqwest::Client,
    mut key: QueryKey,
    max_body: usize,
) -> Result<Data, PrometheusError> {
    if let Some(oauth2) = &key.oauth2 {
        let config = OAuth2Config {
            token_url: Some(oauth2.token_url.clone()),
            client_id: Some(oauth2.client_id.clone()),
            client_secret: Some(oauth2.client_secret.clone()),
            scopes: oauth2.scopes.clone(),
        };
        let token = oauth2_token(&http, &config, key.timeout, max_body).await?;
        let value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|e| {
            PrometheusError::BearerHeader {
                source: Arc::new(e),
            }
        })?;
        key.headers.push((AUTHORIZATION, value));
    }
    let client = Client::from(http, &key.address).map_err(|e| PrometheusError::Client {
        source: Arc::new(e),
    })?;
    let request = match key.window {
        Window::Range {
            start,
            end,
            step_millis,
        } => {
            let mut builder =
                client.query_range(&key.query, start, end, step_millis as f64 / 1000.0);
            for (name, value) in key.headers {
                builder = builder.header(name, value);
            }
            builder.get_raw().boxed()
        }
        Window::Instant(at) => {
            let mut builder = client.query(&key.query).at(at);
            for (name, value) in key.headers {
                builder = builder.header(name, value);
            }
            builder.get_raw().boxed()
        }
    };
    let response = request.await.map_err(|e| PrometheusError::Query {
        source: Arc::new(e),
    })?;
    let status = response.status();
    let body = read_capped(response, max_body)
        .await
        .map_err(|source| PrometheusError::Body {
            source: Arc::new(source),
        })?;
    match serde_json::from_slice::<ApiAnswer>(&body) {
        Ok(ApiAnswer::Success { data }) => Ok(data),
        Ok(ApiAnswer::Error(e)) => Err(PrometheusError::Query {
            source: Arc::new(prometheus_http_query::Error::Prometheus(e)),
        }),
        Err(_) => Err(PrometheusError::NotAnAnswer {
            status,
            excerpt: body_excerpt(&body),
        }),
    }
}

/// An error followed by its causes: the client's own text ("failed to send request to server")
/// does not say where to or why (connection refused, DNS, TLS).
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let mut next = e.to_string();
        if let Some(url) = e
            .downcast_ref::<reqwest::Error>()
            .and_then(reqwest::Error::url)
        {
            // The query string can carry a secret argument, percent-encoded past redaction.
            let mut bare = url.clone();
            bare.set_query(None);
            let _ = bare.set_password(None);
            let _ = bare.set_username("");
            next = next.replace(url.as_str(), bare.as_str());
        }
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        cause = e.source();
    }
    text
}

/// The metric's headers plus basic authentication, checked.
fn request_headers(
    config: &PrometheusMetric,
) -> Result<Vec<(HeaderName, HeaderValue)>, PrometheusError> {
    let mut headers = metric_headers(&config.headers)?;
    let Some(auth) = &config.authentication else {
        return Ok(headers);
    };
    if let Some(basic) = &auth.basic_auth {
        let username = basic.username.as_deref().unwrap_or("");
        let password = basic.password.as_deref().unwrap_or("");
        if !username.is_empty() || !password.is_empty() {
            if username.is_empty() {
                return Err(PrometheusError::BasicAuthMissing { field: "username" });
            }
            if password.is_empty() {
                return Err(PrometheusError::BasicAuthMissing { field: "password" });
            }
            let token = base64(format!("{username}:{password}").as_bytes());
            let value = HeaderValue::from_str(&format!("Basic {token}")).map_err(|e| {
                PrometheusError::BasicAuthHeader {
                    source: Arc::new(e),
                }
            })?;
            headers.push((AUTHORIZATION, value));
        }
    }
    let address = config.address.as_deref().unwrap_or("");
    if address.contains("aps-workspaces")
        && auth
            .sigv4
            .as_ref()
            .is_some_and(|s| s != &Default::default())
    {
        return Err(PrometheusError::SigV4Unsupported);
    }
    Ok(headers)
}

/// Every sample value of an answer: a scalar's, each series' of a vector, every point of every
/// series of a matrix, in order.
pub fn samples(data: &Data) -> Vec<f64> {
    match data {
        Data::Scalar(sample) => vec![sample.value()],
        Data::Vector(series) => series.iter().map(|s| s.sample().value()).collect(),
        Data::Matrix(series) => series
            .iter()
            .flat_map(|s| s.samples().iter().map(|sample| sample.value()))
            .collect(),
    }
}

/// The measurement value and the condition's `result` for a query answer: a scalar is a
/// number; a vector, or a matrix flattened series by series, is a list of sample values.
pub fn shape(data: &Data) -> (String, Value) {
    if let Data::Scalar(sample) = data {
        return (format_sample(sample.value()), Value::Float(sample.value()));
    }
    let samples = samples(data);
    let text: Vec<String> = samples.iter().map(|s| format_sample(*s)).collect();
    (
        format!("[{}]", text.join(",")),
        condition::from_samples(&samples),
    )
}

impl MetricProvider for PrometheusProvider {
    fn kind(&self) -> &'static str {
        "Prometheus"
    }

    fn metadata(&self, metric: &Metric) -> BTreeMap<String, String> {
        metric
            .provider
            .prometheus
            .as_ref()
            .and_then(|p| p.query.clone())
            .filter(|q| !q.is_empty())
            .map(|q| BTreeMap::from([(RESOLVED_QUERY_KEY.to_string(), q)]))
            .unwrap_or_default()
    }

    fn run<'a>(&'a self, run: RunContext<'a>, metric: &'a Metric) -> MeasurementFuture<'a> {
        Box::pin(self.measure(run, metric))
    }
}
