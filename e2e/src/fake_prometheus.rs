//! The one Prometheus stand-in every test and bench uses, on an ephemeral 127.0.0.1 port. It
//! answers `/api/v1/query` and `/api/v1/query_range` from values set per query text (or one
//! value for every query), falls back to a few canned answers chosen by the query text, answers
//! `/oauth/token` with a token, and records every request. Connections are kept alive, as a
//! real Prometheus keeps them, and [`FakePrometheus::stop`] closes them all;
//! [`FakePrometheus::resume`] listens on the same port again. A query can also be scripted to
//! fail ([`Reply`]): an HTTP error status, an empty vector, or an answer sent late.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The sample time of a canned answer, and of an instant answer to a query sent without `time`.
pub const SAMPLE_TIME: i64 = 1_714_557_600;

/// A request the stand-in received.
#[derive(Clone, Debug)]
pub struct Request {
    pub path: String,
    /// Decoded parameters: the query string's and, for `/api/` paths, a form body's.
    pub params: BTreeMap<String, String>,
    /// Header names lower-cased.
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

impl Request {
    /// The `query` parameter; empty when absent.
    pub fn query(&self) -> &str {
        self.params.get("query").map_or("", String::as_str)
    }

    /// The `time` parameter in whole Unix seconds; 0 when absent.
    pub fn time(&self) -> i64 {
        self.params
            .get("time")
            .and_then(|time| time.parse::<f64>().ok())
            .map_or(0, |time| time as i64)
    }
}

/// How the stand-in answers one query text.
#[derive(Clone, Debug)]
pub enum Answer {
    /// These values in turn, one per request; the last one repeats.
    Values(VecDeque<String>),
    /// These values in turn, one per request; once used up, the canned answers apply. A range
    /// query gets one series whose points are the value's comma-separated samples.
    Once(VecDeque<String>),
    /// `before` for evaluation times earlier than `at` (Unix seconds), `after` from then on.
    SwitchAt {
        at: i64,
        before: String,
        after: String,
    },
    /// These replies in turn, one per request; the last one repeats.
    Replies(VecDeque<Reply>),
}

/// One scripted reply to a query.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A one-sample vector of this value (`NaN` included) or, to a range query, one series of
    /// the value's comma-separated samples.
    Value(String),
    /// A successful answer with no series: an empty vector (or matrix).
    Empty,
    /// This HTTP status with this body, as a proxy in front of a Prometheus that is down
    /// answers (for example 503 and `no healthy upstream`).
    Status(u16, String),
    /// The answer `Value` would give, sent only after this delay.
    Late(Duration, String),
}

#[derive(Default)]
struct State {
    answers: HashMap<String, Answer>,
    /// The value of every query that has no answer of its own.
    every_query: Option<String>,
    requests: Vec<Request>,
}

pub struct FakePrometheus {
    /// `http://127.0.0.1:PORT`.
    pub address: String,
    state: Arc<Mutex<State>>,
    stopped: Arc<AtomicBool>,
    /// The task accepting connections; `None` once stopped.
    server: Mutex<Option<JoinHandle<()>>>,
}

impl FakePrometheus {
    /// Starts the stand-in on an ephemeral loopback port.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds loopback");
        let address = format!("http://{}", listener.local_addr().expect("an address"));
        let state = Arc::new(Mutex::new(State::default()));
        let stopped = Arc::new(AtomicBool::new(false));
        let server = tokio::spawn(serve(listener, state.clone(), stopped.clone()));
        Self {
            address,
            state,
            stopped,
            server: Mutex::new(Some(server)),
        }
    }

    /// `query` is answered with `replies` in turn, the last one repeating.
    pub fn replies(&self, query: &str, replies: &[Reply]) {
        self.answer(query, Answer::Replies(replies.iter().cloned().collect()));
    }

    /// From now on `query` is answered as `answer` says.
    pub fn answer(&self, query: &str, answer: Answer) {
        self.lock().answers.insert(query.to_string(), answer);
    }

    /// `query` is answered with `values` in turn, the last one repeating.
    pub fn values(&self, query: &str, values: &[&str]) {
        self.answer(query, Answer::Values(owned(values)));
    }

    /// `query` is answered with `values` in turn, then with the canned answers.
    pub fn script(&self, query: &str, values: &[&str]) {
        self.answer(query, Answer::Once(owned(values)));
    }

    /// Every query without an answer of its own gets a one-sample vector of `value`.
    pub fn answer_every_query(&self, value: &str) {
        self.lock().every_query = Some(value.to_string());
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Request> {
        self.lock().requests.clone()
    }

    /// The requests so far for `query`.
    pub fn queries(&self, query: &str) -> Vec<Request> {
        let state = self.lock();
        state
            .requests
            .iter()
            .filter(|request| request.query() == query)
            .cloned()
            .collect()
    }

    /// Every request so far, forgotten here.
    pub fn take_requests(&self) -> Vec<Request> {
        std::mem::take(&mut self.lock().requests)
    }

    /// Stops answering: the port is closed and open connections are closed at their next
    /// request.
    pub fn stop(&self) {
        if let Some(server) = self.stop_accepting() {
            server.abort();
        }
    }

    /// [`FakePrometheus::stop`], returning once the port is closed, so that a connection
    /// attempt from then on is refused (rather than accepted into the backlog and reset).
    pub async fn stop_and_wait(&self) {
        if let Some(server) = self.stop_accepting() {
            server.abort();
            // Cancelled: the task, and with it the listener, has been dropped.
            let _ = server.await;
        }
    }

    fn stop_accepting(&self) -> Option<JoinHandle<()>> {
        self.stopped.store(true, Ordering::SeqCst);
        self.server
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    /// Listens again on the same address after [`FakePrometheus::stop`], answering as before.
    /// Panics if the port was taken meanwhile.
    pub async fn resume(&self) {
        let address = self.address.trim_start_matches("http://");
        let listener = TcpListener::bind(address)
            .await
            .expect("binds the stopped stand-in's port again");
        self.stopped.store(false, Ordering::SeqCst);
        let server = tokio::spawn(serve(listener, self.state.clone(), self.stopped.clone()));
        let previous = self
            .server
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .replace(server);
        if let Some(previous) = previous {
            previous.abort();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("the stand-in's state")
    }
}

impl Drop for FakePrometheus {
    fn drop(&mut self) {
        self.stop();
    }
}

fn owned(values: &[&str]) -> VecDeque<String> {
    values.iter().map(|value| value.to_string()).collect()
}

async fn serve(listener: TcpListener, state: Arc<Mutex<State>>, stopped: Arc<AtomicBool>) {
    while let Ok((stream, _)) = listener.accept().await {
        tokio::spawn(connection(stream, state.clone(), stopped.clone()));
    }
}

/// Answers the requests of one connection in turn.
async fn connection(mut stream: TcpStream, state: Arc<Mutex<State>>, stopped: Arc<AtomicBool>) {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let head_end = loop {
            if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        };
        let mut request = parse_head(&String::from_utf8_lossy(&buffer[..head_end]));
        let length: usize = request
            .headers
            .get("content-length")
            .and_then(|length| length.parse().ok())
            .unwrap_or(0);
        while buffer.len() < head_end + length {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        request.body = String::from_utf8_lossy(&buffer[head_end..head_end + length]).into_owned();
        buffer.drain(..head_end + length);
        if request.path.starts_with("/api/") {
            // A POSTed form carries the parameters in the body, a GET in the target.
            request.params.extend(form_params(&request.body));
        }
        if stopped.load(Ordering::SeqCst) {
            return;
        }
        let (code, body, delay) = {
            let mut state = state.lock().expect("the stand-in's state");
            let answer = respond(&request, &mut state);
            state.requests.push(request);
            answer
        };
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        let reason = match code {
            200 => "OK",
            500 => "Internal Server Error",
            502 => "Bad Gateway",
            503 => "Service Unavailable",
            504 => "Gateway Timeout",
            _ => "Bad Request",
        };
        let content_type = if body.starts_with('{') {
            "application/json"
        } else {
            "text/plain"
        };
        let response = format!(
            "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if stream.write_all(response.as_bytes()).await.is_err() {
            return;
        }
    }
}

fn parse_head(head: &str) -> Request {
    let mut lines = head.split("\r\n");
    let target = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .unwrap_or("/");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
        .collect();
    Request {
        path: path.to_string(),
        params: form_params(query),
        headers,
        body: String::new(),
    }
}

fn form_params(text: &str) -> BTreeMap<String, String> {
    text.split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(key, value)| (percent_decode(key), percent_decode(value)))
        .collect()
}

/// Decodes a form-encoded component (`+` and `%XX`).
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
            byte => out.push(byte),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The status code and body for `request`, and how long to wait before sending them.
fn respond(request: &Request, state: &mut State) -> (u16, String, Option<Duration>) {
    if request.path == "/oauth/token" {
        return (
            200,
            r#"{"access_token":"tok-1","token_type":"Bearer","expires_in":3600}"#.into(),
            None,
        );
    }
    let query = request.query();
    let range = request.path == "/api/v1/query_range";
    let reply = match state.answers.get_mut(query) {
        Some(Answer::Replies(replies)) if replies.len() > 1 => replies.pop_front(),
        Some(Answer::Replies(replies)) => replies.front().cloned(),
        _ => None,
    };
    if let Some(reply) = reply {
        let result_type = if range { "matrix" } else { "vector" };
        return match reply {
            Reply::Value(value) if range => (200, matrix(&value), None),
            Reply::Value(value) => (200, vector(request, &value), None),
            Reply::Empty => (200, success(result_type, "[]"), None),
            Reply::Status(code, body) => (code, body, None),
            Reply::Late(delay, value) if range => (200, matrix(&value), Some(delay)),
            Reply::Late(delay, value) => (200, vector(request, &value), Some(delay)),
        };
    }
    let value = match state.answers.get_mut(query) {
        Some(Answer::Values(values)) if values.len() > 1 => values.pop_front(),
        Some(Answer::Values(values)) => values.front().cloned(),
        Some(Answer::Once(values)) => values.pop_front(),
        Some(Answer::SwitchAt { at, before, after }) => Some(if request.time() < *at {
            before.clone()
        } else {
            after.clone()
        }),
        Some(Answer::Replies(_)) => None,
        None => state.every_query.clone(),
    };
    match value {
        Some(value) if range => (200, matrix(&value), None),
        Some(value) => (200, vector(request, &value), None),
        None => {
            let (code, body) = canned(query);
            (code, body, None)
        }
    }
}

fn success(result_type: &str, result: &str) -> String {
    format!(r#"{{"status":"success","data":{{"resultType":"{result_type}","result":{result}}}}}"#)
}

/// A one-sample vector at the query's evaluation time (as sent), or at [`SAMPLE_TIME`].
fn vector(request: &Request, value: &str) -> String {
    let time = request
        .params
        .get("time")
        .filter(|time| time.parse::<f64>().is_ok())
        .cloned()
        .unwrap_or_else(|| SAMPLE_TIME.to_string());
    success(
        "vector",
        &format!(r#"[{{"metric":{{}},"value":[{time},"{value}"]}}]"#),
    )
}

/// One series whose points, 15 s apart from [`SAMPLE_TIME`], are the comma-separated samples.
fn matrix(value: &str) -> String {
    let points: Vec<String> = value
        .split(',')
        .enumerate()
        .map(|(i, sample)| format!("[{},\"{sample}\"]", SAMPLE_TIME + 15 * i as i64))
        .collect();
    success(
        "matrix",
        &format!(r#"[{{"metric":{{}},"values":[{}]}}]"#, points.join(",")),
    )
}

/// Answers chosen by the query text, for provider tests; any other query is a parse error.
fn canned(query: &str) -> (u16, String) {
    let result = match query {
        "vector_good" => success(
            "vector",
            r#"[{"metric":{"pod":"a"},"value":[1714557600,"0.99"]},{"metric":{"pod":"b"},"value":[1714557600,"0.97"]}]"#,
        ),
        "vector_bad" => success("vector", r#"[{"metric":{},"value":[1714557600,"0.5"]}]"#),
        "vector_nan" => success("vector", r#"[{"metric":{},"value":[1714557600,"NaN"]}]"#),
        "vector_empty" => success("vector", "[]"),
        "scalar" => success("scalar", r#"[1714557600,"42"]"#),
        "matrix" => success(
            "matrix",
            r#"[{"metric":{"pod":"a"},"values":[[1714557540,"0.1"],[1714557600,"0.2"]]},{"metric":{"pod":"b"},"values":[[1714557600,"0.25"]]}]"#,
        ),
        _ => {
            return (
                400,
                r#"{"status":"error","errorType":"bad_data","error":"parse error at char 1: unexpected end of input"}"#
                    .to_string(),
            );
        }
    };
    (200, result)
}
