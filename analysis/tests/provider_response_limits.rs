//! Every answer a provider reads is capped: the Web provider, Prometheus and the OAuth2 token
//! request stop reading once an answer passes the cap, announced (`Content-Length`) or not
//! (chunked, even endless), and the measurement is an Error naming the cap.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use k8s_openapi::jiff::Timestamp;
use rollouts_analysis::provider::{MetricProvider, PrometheusProvider, RunContext, WebProvider};
use rollouts_crds::analysis::{
    AnalysisPhase, Authentication, Measurement, Metric, MetricProvider as Provider, OAuth2Config,
    PrometheusMetric, WebMetric,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The cap the providers of these tests are given.
const CAP: usize = 4096;

/// A chunk of an endless answer.
const CHUNK: usize = 1024;

/// Bytes after which the endless answer gives up (the test has failed by then).
const ENDLESS_LIMIT: usize = 64 * 1024 * 1024;

/// A server on 127.0.0.1 whose answers are too large, in every way one can be.
struct Server {
    address: String,
    /// Bytes of the endless answer written before the client went away.
    endless_written: Arc<AtomicUsize>,
}

async fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(String::from_utf8_lossy(buffer.get(..end)?).into_owned());
        }
        let n = stream.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
        buffer.extend_from_slice(chunk.get(..n)?);
    }
}

/// `{"data":[0,0,0,...]}` of about `size` bytes.
fn json_of_size(size: usize) -> String {
    let items = vec!["0"; size / 2].join(",");
    format!("{{\"data\":[{items}]}}")
}

async fn answer(mut stream: TcpStream, endless_written: Arc<AtomicUsize>) {
    let Some(head) = read_head(&mut stream).await else {
        return;
    };
    let path = head
        .split(' ')
        .nth(1)
        .unwrap_or_default()
        .split('?')
        .next()
        .unwrap_or_default()
        .to_string();
    let fixed = |body: String| {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    match path.as_str() {
        "/small" => {
            let _ = stream
                .write_all(fixed("{\"ok\":true}".into()).as_bytes())
                .await;
        }
        "/announced" => {
            let _ = stream
                .write_all(fixed(json_of_size(CAP * 4)).as_bytes())
                .await;
        }
        "/oauth/token" => {
            let token = format!("{{\"access_token\":\"{}\"}}", "t".repeat(CAP * 4));
            let _ = stream.write_all(fixed(token).as_bytes()).await;
        }
        // An answer that never ends, as Prometheus' /api/v1/query or a web endpoint.
        _ => {
            let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
            if stream.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let mut chunk = format!("{CHUNK:x}\r\n").into_bytes();
            chunk.extend(std::iter::repeat_n(b' ', CHUNK));
            chunk.extend_from_slice(b"\r\n");
            let mut written = 0;
            while written < ENDLESS_LIMIT {
                if stream.write_all(&chunk).await.is_err() {
                    break;
                }
                written += CHUNK;
                endless_written.store(written, Ordering::SeqCst);
            }
        }
    }
    let _ = stream.shutdown().await;
}

async fn start() -> Server {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let address = format!("http://{}", listener.local_addr().expect("address"));
    let endless_written = Arc::new(AtomicUsize::new(0));
    let counter = endless_written.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(answer(stream, counter.clone()));
        }
    });
    Server {
        address,
        endless_written,
    }
}

fn run() -> RunContext<'static> {
    RunContext {
        namespace: "default",
        run_name: "run",
        run_uid: "6c1c0a52-0000-4000-8000-000000000001",
        measurement_number: 1,
        now: Timestamp::UNIX_EPOCH,
    }
}

fn web_metric(web: WebMetric) -> Metric {
    Metric {
        name: "web".into(),
        success_condition: Some("true".into()),
        provider: Provider {
            web: Some(web),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn web() -> WebProvider {
    WebProvider::new()
        .expect("http clients")
        .with_max_response_bytes(CAP)
}

fn assert_names_the_cap(measurement: &Measurement) {
    assert_eq!(
        measurement.phase,
        AnalysisPhase::Error,
        "{}",
        measurement.message
    );
    assert!(
        measurement.message.contains(&format!(
            "larger than the controller's limit of {CAP} bytes"
        )) && measurement
            .message
            .contains("--analysis-max-response-bytes"),
        "{}",
        measurement.message
    );
}

#[tokio::test]
async fn a_web_answer_under_the_cap_is_measured() {
    let server = start().await;
    let metric = web_metric(WebMetric {
        url: format!("{}/small", server.address),
        ..Default::default()
    });
    let measured = web().run(run(), &metric).await;
    assert_eq!(
        measured.phase,
        AnalysisPhase::Successful,
        "{}",
        measured.message
    );
}

#[tokio::test]
async fn a_web_answer_announced_over_the_cap_is_an_error_naming_it() {
    let server = start().await;
    let metric = web_metric(WebMetric {
        url: format!("{}/announced", server.address),
        ..Default::default()
    });
    assert_names_the_cap(&web().run(run(), &metric).await);
}

#[tokio::test]
async fn an_endless_web_answer_is_read_only_up_to_the_cap() {
    let server = start().await;
    let metric = web_metric(WebMetric {
        url: format!("{}/endless", server.address),
        ..Default::default()
    });
    assert_names_the_cap(&web().run(run(), &metric).await);
    // The reader stopped: the server did not get to write its whole (huge) answer.
    assert!(server.endless_written.load(Ordering::SeqCst) < ENDLESS_LIMIT);
}

#[tokio::test]
async fn an_oversized_oauth2_token_answer_is_an_error_naming_the_cap() {
    let server = start().await;
    let metric = web_metric(WebMetric {
        url: format!("{}/small", server.address),
        authentication: Some(Authentication {
            oauth2: Some(OAuth2Config {
                token_url: Some(format!("{}/oauth/token", server.address)),
                client_id: Some("rollouts".into()),
                client_secret: Some("secret".into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let measured = web().run(run(), &metric).await;
    assert_names_the_cap(&measured);
    assert!(
        measured.message.starts_with("oauth2:"),
        "{}",
        measured.message
    );
}

#[tokio::test]
async fn an_endless_prometheus_answer_is_an_error_naming_the_cap() {
    let server = start().await;
    let metric = Metric {
        name: "prometheus".into(),
        success_condition: Some("result[0] > 0".into()),
        provider: Provider {
            prometheus: Some(PrometheusMetric {
                address: Some(server.address.clone()),
                query: Some("up".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let prometheus = PrometheusProvider::new()
        .expect("http clients")
        .with_max_response_bytes(CAP);
    assert_names_the_cap(&prometheus.run(run(), &metric).await);
    assert!(server.endless_written.load(Ordering::SeqCst) < ENDLESS_LIMIT);
}
