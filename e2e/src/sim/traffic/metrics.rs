//! The metrics the simulated pods "serve": per pod, `http_requests_total` by response code and
//! the `http_request_duration_seconds` histogram, in the Prometheus text format, over one
//! loopback HTTP listener: `/metrics` holds every pod's series labelled with namespace, pod and
//! template hash; `/metrics/pods/<namespace>/<pod>` holds one pod's, unlabelled, for per-pod
//! scrape targets whose labels come from the file_sd file.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use tokio::sync::watch;

use crate::sim::store::ObjectKey;

/// Upper bounds of the latency histogram's buckets: the Prometheus client libraries' defaults.
pub const BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// One pod's counters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodSeries {
    pub template_hash: String,
    /// Requests answered 200.
    pub ok: u64,
    /// Requests answered 500.
    pub errors: u64,
    /// Requests per latency bucket (not cumulative), the last one past every bound.
    buckets: [u64; BUCKETS.len() + 1],
    latency_sum: f64,
    /// The error rate last recorded with, and the (requests, errors) counts when it took
    /// effect: a new rate applies to the requests from then on, not to the pod's whole past.
    rate: f64,
    rate_since: (u64, u64),
}

impl PodSeries {
    /// Records one request and returns its response code. Errors are exactly
    /// floor(requests x error_rate), counted from when the rate last changed, so a run with
    /// a given count gives a given split.
    pub fn record(&mut self, error_rate: f64, latency_seconds: f64) -> u16 {
        if error_rate != self.rate {
            self.rate = error_rate;
            self.rate_since = (self.requests(), self.errors);
        }
        let (base_requests, base_errors) = self.rate_since;
        let total = self.ok + self.errors + 1 - base_requests;
        // The epsilon keeps 10 x 0.1 at 1 whatever the float rounding.
        let errors_due = base_errors + (total as f64 * error_rate + 1e-9).floor() as u64;
        self.observe(errors_due > self.errors, latency_seconds)
    }

    /// Records one request whose outcome was decided elsewhere (noisy traffic draws it) and
    /// returns its response code.
    pub fn observe(&mut self, error: bool, latency_seconds: f64) -> u16 {
        let code = if error {
            self.errors += 1;
            500
        } else {
            self.ok += 1;
            200
        };
        let bucket = BUCKETS
            .iter()
            .position(|bound| latency_seconds <= *bound)
            .unwrap_or(BUCKETS.len());
        self.buckets[bucket] += 1;
        self.latency_sum += latency_seconds;
        code
    }

    pub fn requests(&self) -> u64 {
        self.ok + self.errors
    }
}

/// Every pod's series, shared by the load generator and the metrics listener.
#[derive(Debug, Default)]
pub struct Metrics {
    pods: BTreeMap<ObjectKey, PodSeries>,
}

#[derive(Clone, Default)]
pub struct SharedMetrics(Arc<Mutex<Metrics>>);

impl SharedMetrics {
    pub fn lock(&self) -> MutexGuard<'_, Metrics> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Metrics {
    /// Starts series for pods that came and drops those of pods that went, as their
    /// endpoints would appear and disappear; `pods` yields (key, template hash).
    pub fn sync_pods<'a>(&mut self, pods: impl Iterator<Item = (&'a ObjectKey, &'a str)>) {
        let mut next = BTreeMap::new();
        for (key, hash) in pods {
            let mut series = self.pods.remove(key).unwrap_or_default();
            series.template_hash = hash.to_string();
            next.insert(key.clone(), series);
        }
        self.pods = next;
    }

    pub fn pod_mut(&mut self, key: &ObjectKey) -> Option<&mut PodSeries> {
        self.pods.get_mut(key)
    }

    pub fn pod(&self, key: &ObjectKey) -> Option<&PodSeries> {
        self.pods.get(key)
    }

    /// Every pod's series, each labelled with its namespace, pod and template hash.
    pub fn render_all(&self) -> String {
        let labelled: Vec<(String, &PodSeries)> = self
            .pods
            .iter()
            .map(|((ns, name), series)| {
                let mut labels = format!("namespace=\"{}\",pod=\"{}\",", escape(ns), escape(name));
                if !series.template_hash.is_empty() {
                    let _ = write!(
                        labels,
                        "rollouts_pod_template_hash=\"{}\",",
                        escape(&series.template_hash)
                    );
                }
                (labels, series)
            })
            .collect();
        render(&labelled)
    }

    /// One pod's series without identifying labels (its scrape target carries them).
    pub fn render_pod(&self, key: &ObjectKey) -> Option<String> {
        self.pods
            .get(key)
            .map(|series| render(&[(String::new(), series)]))
    }
}

/// The text exposition of some pods' series; each label prefix ends with a comma or is empty.
fn render(pods: &[(String, &PodSeries)]) -> String {
    let mut out = String::new();
    out.push_str(
        "# HELP http_requests_total Requests the simulated pod received, by response code.\n",
    );
    out.push_str("# TYPE http_requests_total counter\n");
    for (labels, series) in pods {
        for (code, count) in [("200", series.ok), ("500", series.errors)] {
            let _ = writeln!(
                out,
                "http_requests_total{{{labels}code=\"{code}\"}} {count}"
            );
        }
    }
    out.push_str("# HELP http_request_duration_seconds Latency of the requests the simulated pod received.\n");
    out.push_str("# TYPE http_request_duration_seconds histogram\n");
    for (labels, series) in pods {
        let mut cumulative = 0;
        for (bound, count) in BUCKETS.iter().zip(series.buckets) {
            cumulative += count;
            let _ = writeln!(
                out,
                "http_request_duration_seconds_bucket{{{labels}le=\"{bound}\"}} {cumulative}"
            );
        }
        let total = series.requests();
        let _ = writeln!(
            out,
            "http_request_duration_seconds_bucket{{{labels}le=\"+Inf\"}} {total}"
        );
        let bare = labels.trim_end_matches(',');
        let _ = writeln!(
            out,
            "http_request_duration_seconds_sum{{{bare}}} {}",
            series.latency_sum
        );
        let _ = writeln!(out, "http_request_duration_seconds_count{{{bare}}} {total}");
    }
    out
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Serves the metrics until shutdown.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: SharedMetrics,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let metrics = metrics.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let reply = respond(&metrics, req.method(), req.uri().path());
                        async move { Ok::<_, Infallible>(reply) }
                    });
                    // A scraper hanging up mid-request is its business.
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            _ = shutdown.changed() => return,
        }
    }
}

fn respond(metrics: &SharedMetrics, method: &Method, path: &str) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: String| {
        Response::builder()
            .status(status)
            .header(header::CONTENT_TYPE, CONTENT_TYPE)
            .body(Full::new(Bytes::from(body)))
            .expect("static response parts are valid")
    };
    if method != Method::GET && method != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} is not supported: GET /metrics\n"),
        );
    }
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segments.as_slice() {
        ["metrics"] => reply(StatusCode::OK, metrics.lock().render_all()),
        ["metrics", "pods", ns, name] => {
            match metrics
                .lock()
                .render_pod(&(ns.to_string(), name.to_string()))
            {
                Some(text) => reply(StatusCode::OK, text),
                None => reply(
                    StatusCode::NOT_FOUND,
                    format!("no pod {ns}/{name} in the simulated cluster\n"),
                ),
            }
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            format!("no metrics at {path}: try /metrics or /metrics/pods/<namespace>/<pod>\n"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_follow_the_rate_exactly() {
        let mut series = PodSeries::default();
        let codes: Vec<u16> = (0..10).map(|_| series.record(0.3, 0.02)).collect();
        assert_eq!(codes.iter().filter(|c| **c == 500).count(), 3);
        assert_eq!((series.ok, series.errors), (7, 3));
        let mut healthy = PodSeries::default();
        assert!((0..100).all(|_| healthy.record(0.0, 0.0) == 200));
    }

    #[test]
    fn a_new_error_rate_applies_from_when_it_changes() {
        let mut series = PodSeries::default();
        let warm_up: Vec<u16> = (0..10).map(|_| series.record(0.5, 0.0)).collect();
        assert_eq!(warm_up.iter().filter(|c| **c == 500).count(), 5);
        // Without a fresh count the 5 early errors would hide the next 490 requests' errors.
        let after: Vec<u16> = (0..100).map(|_| series.record(0.1, 0.0)).collect();
        assert_eq!(after.iter().filter(|c| **c == 500).count(), 10);
        assert_eq!((series.ok, series.errors), (95, 15));
    }

    #[test]
    fn exposition_has_counters_and_a_cumulative_histogram() {
        let mut metrics = Metrics::default();
        let key = ("ns".to_string(), "web-1".to_string());
        metrics.sync_pods([(&key, "abc")].into_iter());
        let series = metrics.pod_mut(&key).expect("the pod's series");
        series.record(0.5, 0.02);
        series.record(0.5, 0.2);
        let text = metrics.render_all();
        let labels = "namespace=\"ns\",pod=\"web-1\",rollouts_pod_template_hash=\"abc\"";
        for line in [
            format!("http_requests_total{{{labels},code=\"200\"}} 1"),
            format!("http_requests_total{{{labels},code=\"500\"}} 1"),
            format!("http_request_duration_seconds_bucket{{{labels},le=\"0.025\"}} 1"),
            format!("http_request_duration_seconds_bucket{{{labels},le=\"0.25\"}} 2"),
            format!("http_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} 2"),
            format!("http_request_duration_seconds_count{{{labels}}} 2"),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        let one = metrics.render_pod(&key).expect("the pod's own page");
        assert!(
            one.lines()
                .any(|l| l == "http_requests_total{code=\"500\"} 1")
        );
        assert!(
            one.lines()
                .any(|l| l == "http_request_duration_seconds_count{} 2")
        );
    }
}
