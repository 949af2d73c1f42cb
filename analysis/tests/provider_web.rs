//! The Web provider against a small in-test HTTP server on 127.0.0.1.

use std::sync::{Arc, Mutex};

use k8s_openapi::jiff::Timestamp;
use rollouts_analysis::provider::{MetricProvider, RunContext, WebProvider};
use rollouts_crds::analysis::{
    AnalysisPhase, Authentication, BasicAuthConfig, Measurement, Metric,
    MetricProvider as Provider, WebMetric, WebMetricHeader,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A request as received: method, path, lower-cased headers, body.
#[derive(Clone, Debug, Default)]
struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn respond(request: &Request) -> (u16, String) {
    match request.path.as_str() {
        "/status" => (
            200,
            r#"{"data":{"status":"ok","errorRate":0.01,"count":3}}"#.into(),
        ),
        "/text" => (200, "healthy".into()),
        "/unavailable" => (503, "down".into()),
        "/echo" => {
            let body: serde_json::Value = serde_json::from_str(&request.body)
                .unwrap_or(serde_json::Value::String(request.body.clone()));
            let answer = serde_json::json!({
                "method": request.method,
                "contentType": request.header("content-type"),
                "authorization": request.header("authorization"),
                "team": request.header("x-team"),
                "body": body,
            });
            (200, answer.to_string())
        }
        _ => (404, "not found".into()),
    }
}

async fn read_request(stream: &mut tokio::net::TcpStream) -> Option<Request> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let mut request = Request {
        method: first.next()?.to_string(),
        path: first.next()?.to_string(),
        ..Default::default()
    };
    request.headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length: usize = request
        .header("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    while buffer.len() < head_end + length {
        let n = stream.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
        buffer.extend_from_slice(&chunk[..n]);
    }
    request.body = String::from_utf8_lossy(&buffer[head_end..head_end + length]).into_owned();
    Some(request)
}

async fn start() -> (String, Arc<Mutex<Vec<Request>>>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let address = format!("http://{}", listener.local_addr().expect("address"));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let Some(request) = read_request(&mut stream).await else {
                    return;
                };
                let (code, body) = respond(&request);
                log.lock().expect("lock").push(request);
                let response = format!(
                    "HTTP/1.1 {code} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    (address, seen)
}

fn metric(web: WebMetric, success: &str) -> Metric {
    Metric {
        name: "web".into(),
        success_condition: Some(success.into()),
        provider: Provider {
            web: Some(web),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn get(url: String) -> WebMetric {
    WebMetric {
        url,
        ..Default::default()
    }
}

async fn measure(metric: &Metric) -> Measurement {
    let provider = WebProvider::new().expect("http clients");
    let run = RunContext {
        namespace: "default",
        run_name: "run",
        run_uid: "6c1c0a52-0000-4000-8000-000000000001",
        measurement_number: 1,
        now: Timestamp::UNIX_EPOCH,
    };
    provider.run(run, metric).await
}

#[tokio::test]
async fn a_json_answer_is_the_result() {
    let (address, _) = start().await;
    let whole = measure(&metric(
        get(format!("{address}/status")),
        "result.data.status == \"ok\" && result.data.count == 3",
    ))
    .await;
    assert_eq!(whole.phase, AnalysisPhase::Successful, "{}", whole.message);

    let mut picked = get(format!("{address}/status"));
    picked.json_path = Some("{$.data.errorRate}".into());
    let m = measure(&metric(picked, "result < 0.05")).await;
    assert_eq!(m.phase, AnalysisPhase::Successful, "{}", m.message);
    assert_eq!(m.value, "0.01");

    let mut missing = get(format!("{address}/status"));
    missing.json_path = Some("{$.data.latency}".into());
    let m = measure(&metric(missing, "result < 1")).await;
    assert_eq!(m.phase, AnalysisPhase::Error);
    assert!(
        m.message.starts_with("Could not find JSONPath in body"),
        "{}",
        m.message
    );
}

#[tokio::test]
async fn a_text_answer_is_a_string_result() {
    let (address, _) = start().await;
    let m = measure(&metric(
        get(format!("{address}/text")),
        "result == \"healthy\"",
    ))
    .await;
    assert_eq!(m.phase, AnalysisPhase::Successful, "{}", m.message);
    assert_eq!(m.value, "healthy");
}

#[tokio::test]
async fn a_post_sends_the_json_body_headers_and_basic_auth() {
    let (address, seen) = start().await;
    let web = WebMetric {
        method: Some("POST".into()),
        url: format!("{address}/echo"),
        headers: vec![WebMetricHeader {
            key: "X-Team".into(),
            value: "checkout".into(),
        }],
        json_body: Some(serde_json::json!({"window": "5m"})),
        authentication: Some(Authentication {
            basic_auth: Some(BasicAuthConfig {
                username: Some("user".into()),
                password: Some("pass".into()),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let m = measure(&metric(
        web,
        "result.method == \"POST\" && result.body.window == \"5m\" && result.team == \"checkout\" && result.contentType == \"application/json\" && result.authorization == \"Basic dXNlcjpwYXNz\"",
    ))
    .await;
    assert_eq!(
        m.phase,
        AnalysisPhase::Successful,
        "{} {}",
        m.message,
        m.value
    );
    assert_eq!(seen.lock().expect("lock").len(), 1);
}

#[tokio::test]
async fn failures_are_error_measurements() {
    let (address, seen) = start().await;
    let down = measure(&metric(get(format!("{address}/unavailable")), "true")).await;
    assert_eq!(down.phase, AnalysisPhase::Error);
    assert_eq!(down.message, "received non 2xx response code: 503");

    let mut body_on_get = get(format!("{address}/echo"));
    body_on_get.body = Some("x".into());
    let m = measure(&metric(body_on_get, "true")).await;
    assert_eq!(
        m.message,
        "Body/JSONBody can only be used with POST or PUT WebMetric Method types"
    );
    assert!(seen.lock().expect("lock").iter().all(|r| r.path != "/echo"));

    let wrong_type = measure(&metric(get(format!("{address}/text")), "result > 1")).await;
    assert_eq!(wrong_type.phase, AnalysisPhase::Error);
    assert!(
        wrong_type
            .message
            .starts_with("could not evaluate successCondition")
    );
}
