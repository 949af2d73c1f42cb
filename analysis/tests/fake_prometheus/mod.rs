//! A small Prometheus stand-in on 127.0.0.1 for tests: answers `/api/v1/query` and
//! `/api/v1/query_range` with canned JSON chosen by the query text, or with the next value of a
//! scripted sequence, and records every request.

#![allow(dead_code)]

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A request the server received: path, decoded query parameters, lower-cased headers.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub params: BTreeMap<String, String>,
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

pub struct FakePrometheus {
    pub address: String,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// Values answered, one per query, for a query text (as a one-sample vector).
    pub scripted: Arc<Mutex<BTreeMap<String, VecDeque<String>>>>,
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("00");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(b'?'));
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_request(head: &str) -> Seen {
    let mut lines = head.split("\r\n");
    let target = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .unwrap_or("/")
        .to_string();
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let params = query
        .split('&')
        .filter(|p| !p.is_empty())
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (percent_decode(k), percent_decode(v)))
        .collect();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Seen {
        path: path.to_string(),
        params,
        headers,
        body: String::new(),
    }
}

type Scripted = Arc<Mutex<BTreeMap<String, VecDeque<String>>>>;

/// The answer for a query: the next scripted value, else canned JSON chosen by the query text.
fn answer(seen: &Seen, scripted: &Scripted) -> (u16, String) {
    if seen.path == "/oauth/token" {
        return (
            200,
            r#"{"access_token":"tok-1","token_type":"Bearer","expires_in":3600}"#.into(),
        );
    }
    let query = seen.params.get("query").map(String::as_str).unwrap_or("");
    let next = scripted
        .lock()
        .expect("lock")
        .get_mut(query)
        .and_then(VecDeque::pop_front);
    if let Some(value) = next
        .as_deref()
        .filter(|_| seen.path == "/api/v1/query_range")
    {
        // A range query gets the scripted values as one series, one point per value.
        let points: Vec<String> = value
            .split(',')
            .enumerate()
            .map(|(i, v)| format!("[{},\"{v}\"]", 1714557600 + 15 * i))
            .collect();
        return (
            200,
            format!(
                r#"{{"status":"success","data":{{"resultType":"matrix","result":[{{"metric":{{}},"values":[{}]}}]}}}}"#,
                points.join(",")
            ),
        );
    }
    if let Some(value) = next {
        return (
            200,
            format!(
                r#"{{"status":"success","data":{{"resultType":"vector","result":[{{"metric":{{}},"value":[1714557600,"{value}"]}}]}}}}"#
            ),
        );
    }
    let success = |result_type: &str, result: &str| {
        (
            200,
            format!(
                r#"{{"status":"success","data":{{"resultType":"{result_type}","result":{result}}}}}"#
            ),
        )
    };
    match query {
        "vector_good" => success(
            "vector",
            r#"[{"metric":{"pod":"a"},"value":[1714557600,"0.99"]},{"metric":{"pod":"b"},"value":[1714557600,"0.97"]}]"#,
        ),
        "vector_bad" => success(
            "vector",
            r#"[{"metric":{},"value":[1714557600,"0.5"]}]"#,
        ),
        "vector_nan" => success("vector", r#"[{"metric":{},"value":[1714557600,"NaN"]}]"#),
        "vector_empty" => success("vector", "[]"),
        "scalar" => success("scalar", r#"[1714557600,"42"]"#),
        "matrix" => success(
            "matrix",
            r#"[{"metric":{"pod":"a"},"values":[[1714557540,"0.1"],[1714557600,"0.2"]]},{"metric":{"pod":"b"},"values":[[1714557600,"0.25"]]}]"#,
        ),
        _ => (
            400,
            r#"{"status":"error","errorType":"bad_data","error":"parse error at char 1: unexpected end of input"}"#
                .to_string(),
        ),
    }
}

async fn serve(listener: TcpListener, seen: Arc<Mutex<Vec<Seen>>>, scripted: Scripted) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        let seen = seen.clone();
        let scripted = scripted.clone();
        tokio::spawn(async move {
            let mut buffer = Vec::new();
            let mut chunk = [0u8; 4096];
            let head_end = loop {
                if let Some(i) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                }
            };
            let mut request = parse_request(&String::from_utf8_lossy(&buffer[..head_end]));
            let length: usize = request
                .headers
                .get("content-length")
                .and_then(|l| l.parse().ok())
                .unwrap_or(0);
            while buffer.len() < head_end + length {
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                }
            }
            request.body =
                String::from_utf8_lossy(&buffer[head_end..head_end + length]).into_owned();
            let (code, body) = answer(&request, &scripted);
            seen.lock().expect("lock").push(request);
            let reason = if code == 200 { "OK" } else { "Bad Request" };
            let response = format!(
                "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

impl FakePrometheus {
    /// Answers `query` with these values, one per request: an instant query gets a one-sample
    /// vector; a range query gets one series whose points are the comma-separated samples.
    pub fn script(&self, query: &str, values: &[&str]) {
        self.scripted.lock().expect("lock").insert(
            query.to_string(),
            values.iter().map(|v| v.to_string()).collect(),
        );
    }
}

/// Starts the server on an ephemeral loopback port.
pub async fn start() -> FakePrometheus {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let address = format!("http://{}", listener.local_addr().expect("address"));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let scripted = Scripted::default();
    tokio::spawn(serve(listener, seen.clone(), scripted.clone()));
    FakePrometheus {
        address,
        seen,
        scripted,
    }
}
