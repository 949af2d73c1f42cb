//! Metric providers: the systems that take a measurement (Prometheus, Web, Job, and our baseline
//! judge over Prometheus). A provider answers every call with a [`Measurement`], an Error
//! measurement carrying the reason when something goes wrong, never a Rust error, so the engine
//! treats all failures the same way.

pub mod baseline;
pub mod body;
pub mod job;
pub mod prometheus;
pub mod redact;
pub mod web;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use reqwest::header::{HeaderName, HeaderValue, InvalidHeaderName, InvalidHeaderValue};
use rollouts_crds::analysis::{AnalysisPhase, Measurement, Metric, OAuth2Config, WebMetricHeader};

use crate::engine::{MeasurementAction, MeasurementTask, TakenMeasurement};

pub use baseline::BaselineJudgeProvider;
pub use body::{BodyError, DEFAULT_MAX_RESPONSE_BYTES, read_capped};
pub use job::JobProvider;
pub use prometheus::PrometheusProvider;
pub use redact::{REDACTED, Redactor};
pub use web::WebProvider;

/// The longest a metric may ask a provider to wait for an answer (`timeoutSeconds`,
/// `timeout`): a slow provider then holds a measurement slot for at most this long.
pub const MAX_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// A measurement being taken.
pub type MeasurementFuture<'a> = Pin<Box<dyn Future<Output = Measurement> + Send + 'a>>;

/// The run a measurement is taken for.
#[derive(Clone, Copy, Debug)]
pub struct RunContext<'a> {
    pub namespace: &'a str,
    pub run_name: &'a str,
    /// The run's UID: Jobs of a Job metric are owned by the run.
    pub run_uid: &'a str,
    /// The measurement's number for its metric ([`MeasurementTask::number`]).
    pub measurement_number: i32,
    /// The time the measurement is taken at (queries are evaluated at this instant).
    pub now: Timestamp,
}

/// A system that measures metrics. `metric` has its arguments substituted.
pub trait MetricProvider: Send + Sync {
    /// The provider's name, as in Argo (`Prometheus`, `Web`, `Job`).
    fn kind(&self) -> &'static str;

    /// Data stored on the metric result when its first measurement is taken.
    fn metadata(&self, _metric: &Metric) -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    /// Takes a new measurement. A measurement left unfinished (no `finishedAt`) is resumed later.
    fn run<'a>(&'a self, run: RunContext<'a>, metric: &'a Metric) -> MeasurementFuture<'a>;

    /// Continues an unfinished measurement. Providers that finish in `run` return it unchanged.
    fn resume<'a>(
        &'a self,
        _run: RunContext<'a>,
        _metric: &'a Metric,
        measurement: Measurement,
    ) -> MeasurementFuture<'a> {
        Box::pin(async move { measurement })
    }

    /// Stops an unfinished measurement because the run is terminating.
    fn terminate<'a>(
        &'a self,
        _run: RunContext<'a>,
        _metric: &'a Metric,
        measurement: Measurement,
    ) -> MeasurementFuture<'a> {
        Box::pin(async move { measurement })
    }
}

/// An Error measurement started and finished at `now`.
pub fn error_measurement(message: impl Into<String>, now: Timestamp) -> Measurement {
    Measurement {
        phase: AnalysisPhase::Error,
        message: message.into(),
        started_at: Some(Time(now)),
        finished_at: Some(Time(now)),
        ..Default::default()
    }
}

/// Carries out a task of [`crate::engine::Schedule::tasks`] with `provider`. `metric` is the
/// task's metric with its arguments (secrets included) substituted.
pub async fn take(
    provider: &dyn MetricProvider,
    mut run: RunContext<'_>,
    task: &MeasurementTask,
    metric: &Metric,
) -> TakenMeasurement {
    run.measurement_number = task.number;
    let (measurement, resumed, metadata) = match &task.action {
        MeasurementAction::Start => (
            provider.run(run, metric).await,
            false,
            provider.metadata(metric),
        ),
        MeasurementAction::Resume(in_flight) => (
            provider.resume(run, metric, in_flight.clone()).await,
            true,
            BTreeMap::new(),
        ),
        MeasurementAction::Terminate(in_flight) => (
            provider.terminate(run, metric, in_flight.clone()).await,
            true,
            BTreeMap::new(),
        ),
    };
    TakenMeasurement {
        metric_name: task.metric.name.clone(),
        measurement,
        resumed,
        metadata,
    }
}

/// The Error measurement for a task whose provider could not be set up (unknown provider,
/// unresolvable secret): an in-flight measurement ends with the error, else a new one records it.
pub fn provider_failed(
    task: &MeasurementTask,
    message: impl Into<String>,
    now: Timestamp,
) -> TakenMeasurement {
    let (measurement, resumed) = match &task.action {
        MeasurementAction::Start => (error_measurement(message, now), false),
        MeasurementAction::Resume(in_flight) | MeasurementAction::Terminate(in_flight) => {
            let mut measurement = in_flight.clone();
            measurement.phase = AnalysisPhase::Error;
            measurement.message = message.into();
            (measurement, true)
        }
    };
    TakenMeasurement {
        metric_name: task.metric.name.clone(),
        measurement,
        resumed,
        metadata: BTreeMap::new(),
    }
}

/// Installs rustls' ring crypto provider as the process default unless one is installed:
/// reqwest is built without one and panics building a client otherwise.
pub fn install_crypto_provider() {
    // An Err only says a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A provider's HTTP client could not be built (its TLS setup failed).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct HttpClientError(#[from] reqwest::Error);

/// Why a metric's `headers` cannot be sent. Clone (sources shared) so that queries coalesced
/// into one request can all report it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HeaderError {
    #[error("header {key:?} is not a valid header name: {source}")]
    Name {
        key: String,
        #[source]
        source: Arc<InvalidHeaderName>,
    },
    #[error("header {key:?} has an invalid value: {source}")]
    Value {
        key: String,
        #[source]
        source: Arc<InvalidHeaderValue>,
    },
}

/// A metric's `headers`, checked.
pub(crate) fn metric_headers(
    headers: &[WebMetricHeader],
) -> Result<Vec<(HeaderName, HeaderValue)>, HeaderError> {
    headers
        .iter()
        .map(|header| {
            let name =
                HeaderName::from_bytes(header.key.as_bytes()).map_err(|e| HeaderError::Name {
                    key: header.key.clone(),
                    source: Arc::new(e),
                })?;
            let value = HeaderValue::from_str(&header.value).map_err(|e| HeaderError::Value {
                key: header.key.clone(),
                source: Arc::new(e),
            })?;
            Ok((name, value))
        })
        .collect()
}

/// Why an OAuth2 access token could not be had (`authentication.oauth2`). Clone (sources
/// shared) so that queries coalesced into one request can all report it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum OAuth2Error {
    #[error(
        "missing mandatory parameter in metric for OAuth2 setup: set authentication.oauth2.clientId and clientSecret"
    )]
    MissingClientCredentials,
    #[error("oauth2: cannot fetch token from {token_url}: {source}")]
    Request {
        token_url: String,
        #[source]
        source: Arc<reqwest::Error>,
    },
    #[error("oauth2: cannot fetch token from {token_url}: {status}: {body}")]
    Status {
        token_url: String,
        status: reqwest::StatusCode,
        /// The start of the answer (at most [`ERROR_BODY_CHARS`] characters).
        body: String,
    },
    #[error("oauth2: cannot fetch token from {token_url}: {source}")]
    Body {
        token_url: String,
        #[source]
        source: Arc<BodyError>,
    },
    #[error("oauth2: cannot fetch token from {token_url}: not JSON: {source}")]
    NotJson {
        token_url: String,
        #[source]
        source: Arc<serde_json::Error>,
    },
    #[error("oauth2: cannot fetch token from {token_url}: the answer has no access_token")]
    NoAccessToken { token_url: String },
}

/// OAuth2 client credentials of a metric, when `authentication.oauth2.tokenUrl` is set. Argo
/// requires the client id and secret with it.
pub(crate) fn oauth2_credentials(
    config: Option<&OAuth2Config>,
) -> Result<Option<OAuth2Config>, OAuth2Error> {
    let Some(config) = config.filter(|c| c.token_url.as_deref().is_some_and(|u| !u.is_empty()))
    else {
        return Ok(None);
    };
    let missing = |v: &Option<String>| v.as_deref().unwrap_or("").is_empty();
    if missing(&config.client_id) || missing(&config.client_secret) {
        return Err(OAuth2Error::MissingClientCredentials);
    }
    Ok(Some(config.clone()))
}

fn form_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(char::from(byte));
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// Characters of an error answer quoted in a measurement's message.
pub const ERROR_BODY_CHARS: usize = 512;

/// The start of an answer, for an error message.
pub(crate) fn body_excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut excerpt: String = text.chars().take(ERROR_BODY_CHARS).collect();
    if excerpt.len() < text.len() {
        excerpt.push_str("...");
    }
    excerpt
}

/// Fetches an access token with the OAuth2 client-credentials grant (as Argo's providers do
/// for `authentication.oauth2`); the answer is read up to `max_body` bytes.
pub(crate) async fn oauth2_token(
    http: &reqwest::Client,
    config: &OAuth2Config,
    timeout: std::time::Duration,
    max_body: usize,
) -> Result<String, OAuth2Error> {
    let token_url = config.token_url.as_deref().unwrap_or("");
    let mut form = vec![
        ("grant_type", "client_credentials".to_string()),
        ("client_id", config.client_id.clone().unwrap_or_default()),
        (
            "client_secret",
            config.client_secret.clone().unwrap_or_default(),
        ),
    ];
    if !config.scopes.is_empty() {
        form.push(("scope", config.scopes.join(" ")));
    }
    let body = form
        .iter()
        .map(|(k, v)| format!("{k}={}", form_encode(v)))
        .collect::<Vec<_>>()
        .join("&");
    let request_failed = |source: reqwest::Error| OAuth2Error::Request {
        token_url: token_url.to_string(),
        source: Arc::new(source.without_url()),
    };
    let response = http
        .post(token_url)
        .header(
            reqwest::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        )
        .body(body)
        .timeout(timeout)
        .send()
        .await
        .map_err(request_failed)?;
    let status = response.status();
    let body = read_capped(response, max_body)
        .await
        .map_err(|source| OAuth2Error::Body {
            token_url: token_url.to_string(),
            source: Arc::new(source),
        })?;
    if !status.is_success() {
        return Err(OAuth2Error::Status {
            token_url: token_url.to_string(),
            status,
            body: body_excerpt(&body),
        });
    }
    let answer: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| OAuth2Error::NotJson {
            token_url: token_url.to_string(),
            source: Arc::new(e),
        })?;
    answer["access_token"]
        .as_str()
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .ok_or_else(|| OAuth2Error::NoAccessToken {
            token_url: token_url.to_string(),
        })
}

/// Standard base64 (for HTTP basic authentication).
pub(crate) fn base64(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A sample as Prometheus (and Argo's measurement value) prints it: shortest decimal, `NaN`,
/// `+Inf`, `-Inf`.
pub fn format_sample(value: f64) -> String {
    if value.is_nan() {
        "NaN".to_string()
    } else if value.is_infinite() {
        if value > 0.0 { "+Inf" } else { "-Inf" }.to_string()
    } else {
        format!("{value}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Finishes a measurement on resume, records what it was asked.
    struct Fake;

    impl MetricProvider for Fake {
        fn kind(&self) -> &'static str {
            "Fake"
        }

        fn metadata(&self, metric: &Metric) -> BTreeMap<String, String> {
            BTreeMap::from([("metric".to_string(), metric.name.clone())])
        }

        fn run<'a>(&'a self, run: RunContext<'a>, _metric: &'a Metric) -> MeasurementFuture<'a> {
            Box::pin(async move {
                Measurement {
                    phase: AnalysisPhase::Running,
                    started_at: Some(Time(run.now)),
                    ..Default::default()
                }
            })
        }

        fn resume<'a>(
            &'a self,
            run: RunContext<'a>,
            _metric: &'a Metric,
            mut measurement: Measurement,
        ) -> MeasurementFuture<'a> {
            Box::pin(async move {
                measurement.phase = AnalysisPhase::Successful;
                measurement.finished_at = Some(Time(run.now));
                measurement
            })
        }
    }

    fn task(action: MeasurementAction) -> MeasurementTask {
        MeasurementTask {
            metric: Metric {
                name: "m".into(),
                ..Default::default()
            },
            action,
            number: 1,
        }
    }

    fn block_on<F: Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(future)
    }

    #[test]
    fn take_maps_tasks_to_provider_calls() {
        let run = RunContext {
            namespace: "ns",
            run_name: "r",
            run_uid: "uid",
            measurement_number: 1,
            now: Timestamp::UNIX_EPOCH,
        };
        let t = task(MeasurementAction::Start);
        let started = block_on(take(&Fake, run, &t, &t.metric));
        assert!(!started.resumed);
        assert_eq!(started.metadata["metric"], "m");
        assert_eq!(started.measurement.phase, AnalysisPhase::Running);

        let t = task(MeasurementAction::Resume(started.measurement));
        let resumed = block_on(take(&Fake, run, &t, &t.metric));
        assert!(resumed.resumed);
        assert!(resumed.metadata.is_empty());
        assert_eq!(resumed.measurement.phase, AnalysisPhase::Successful);

        // The default terminate leaves the measurement as it was.
        let in_flight = Measurement {
            phase: AnalysisPhase::Running,
            ..Default::default()
        };
        let t = task(MeasurementAction::Terminate(in_flight.clone()));
        let terminated = block_on(take(&Fake, run, &t, &t.metric));
        assert_eq!(terminated.measurement, in_flight);
    }

    #[test]
    fn a_provider_that_cannot_start_gives_an_error_measurement() {
        let now = Timestamp::UNIX_EPOCH;
        let new = provider_failed(&task(MeasurementAction::Start), "no such provider", now);
        assert_eq!(new.measurement.phase, AnalysisPhase::Error);
        assert_eq!(new.measurement.message, "no such provider");
        assert!(!new.resumed);
        let in_flight = Measurement {
            phase: AnalysisPhase::Running,
            value: "partial".into(),
            ..Default::default()
        };
        let ended = provider_failed(&task(MeasurementAction::Resume(in_flight)), "gone", now);
        assert!(ended.resumed);
        assert_eq!(ended.measurement.phase, AnalysisPhase::Error);
        assert_eq!(ended.measurement.value, "partial");
    }

    #[test]
    fn form_values_are_encoded() {
        assert_eq!(form_encode("a b&c=d/é"), "a+b%26c%3Dd%2F%C3%A9");
        assert_eq!(form_encode("Az09-._~"), "Az09-._~");
    }

    #[test]
    fn oauth2_needs_client_id_and_secret() {
        assert!(matches!(oauth2_credentials(None), Ok(None)));
        let mut config = OAuth2Config {
            token_url: Some("http://auth/token".into()),
            client_id: Some("id".into()),
            ..Default::default()
        };
        assert!(
            oauth2_credentials(Some(&config))
                .unwrap_err()
                .to_string()
                .contains("clientSecret")
        );
        config.client_secret = Some("secret".into());
        assert_eq!(
            oauth2_credentials(Some(&config)).ok(),
            Some(Some(config.clone()))
        );
        config.token_url = None;
        assert!(matches!(oauth2_credentials(Some(&config)), Ok(None)));
    }

    #[test]
    fn base64_matches_the_standard_alphabet() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"user:pass"), "dXNlcjpwYXNz");
    }

    #[test]
    fn samples_print_as_prometheus_prints_them() {
        assert_eq!(format_sample(0.99), "0.99");
        assert_eq!(format_sample(1.0), "1");
        assert_eq!(format_sample(1e-7), "0.0000001");
        assert_eq!(format_sample(f64::NAN), "NaN");
        assert_eq!(format_sample(f64::INFINITY), "+Inf");
        assert_eq!(format_sample(f64::NEG_INFINITY), "-Inf");
    }

    #[test]
    fn error_answers_are_quoted_in_part() {
        assert_eq!(body_excerpt(b"denied"), "denied");
        let long = "x".repeat(ERROR_BODY_CHARS * 4);
        let excerpt = body_excerpt(long.as_bytes());
        assert_eq!(excerpt.len(), ERROR_BODY_CHARS + 3);
        assert!(excerpt.ends_with("..."));
    }
}
