//! `kubectl rollouts dashboard` through the real `kubectl` against an in-process kube-sim: the
//! overview lists the Rollouts, a change made with kubectl arrives on the page's live stream,
//! promote from the page promotes, and a user the API server forbids to patch gets the API's
//! own message. Most tests write status where a controller would; one runs the real controller
//! and has chromium plot the AnalysisRun it measured.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use support::{Controller, DEADLINE, World, eventually, metric_stub, on_path};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

fn world(label: &str) -> World {
    World::start("dashboard", label)
}

/// `kubectl rollouts dashboard --port 0` with `kubeconfig`; the dashboard and its URL.
fn dashboard(world: &World, kubeconfig: &Path) -> Dashboard {
    let mut child = world
        .kubectl(kubeconfig, &["rollouts", "dashboard", "--port", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("kubectl runs");
    let stdout = child.stdout.take().expect("piped stdout");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = sender.send(line);
    });
    let line = receiver
        .recv_timeout(DEADLINE)
        .expect("the dashboard printed its address in time");
    let authority = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    Dashboard { child, authority }
}

/// A running dashboard, stopped when dropped.
struct Dashboard {
    child: Child,
    authority: String,
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 exchange on its own connection: the status and the body.
async fn exchange(authority: &str, method: &str, path: &str, headers: &[&str]) -> (u16, String) {
    exchange_with_body(authority, method, path, headers, "").await
}

/// [`exchange`] with a request body.
async fn exchange_with_body(
    authority: &str,
    method: &str,
    path: &str,
    headers: &[&str],
    body: &str,
) -> (u16, String) {
    let mut stream = TcpStream::connect(authority)
        .await
        .expect("dashboard answers");
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers
        .iter()
        .any(|h| h.to_lowercase().starts_with("host:"))
    {
        request.push_str(&format!("Host: {authority}\r\n"));
    }
    for header in headers {
        request.push_str(header);
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("read");
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    (status, body)
}

impl Dashboard {
    async fn get(&self, path: &str) -> (u16, String) {
        exchange(&self.authority, "GET", path, &[]).await
    }

    async fn post(&self, path: &str) -> (u16, String) {
        exchange(
            &self.authority,
            "POST",
            path,
            &["X-Rollouts-Dashboard: action"],
        )
        .await
    }

    /// Opens a live stream; everything it receives is appended to the returned text.
    async fn stream(&self, path: &str) -> Arc<Mutex<String>> {
        let mut stream = TcpStream::connect(&self.authority)
            .await
            .expect("dashboard answers");
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\n\r\n",
            self.authority
        );
        stream.write_all(request.as_bytes()).await.expect("send");
        let received = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&received);
        tokio::spawn(async move {
            let mut lines = BufReader::new(stream).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut text = sink.lock().expect("stream text");
                text.push_str(&line);
                text.push('\n');
            }
        });
        received
    }
}

fn rollout(name: &str, image: &str) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": image}]}
            },
            "strategy": {"canary": {"steps": [{"setWeight": 50}, {"pause": {}}, {"setWeight": 100}]}}
        }
    })
}

fn paused_at_step_one() -> Value {
    json!({
        "observedGeneration": "1", "currentStepIndex": 1, "conditions": [],
        "currentPodHash": "bbb", "stableRS": "aaa",
        "pauseConditions": [{"reason": "CanaryPauseStep", "startTime": "2026-01-01T00:00:00Z"}],
        "replicas": 2, "updatedReplicas": 1, "readyReplicas": 2, "availableReplicas": 2
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_lists_streams_changes_and_promotes() {
    let world = world("main");
    let created = world
        .sim
        .create("default", rollout("web", "web:1"))
        .expect("seed web");
    world
        .sim
        .create("default", rollout("api", "api:1"))
        .expect("seed api");
    world.patch_status("web", paused_at_step_one()).await;
    // A Rollout deeper than serde_json decodes by default must not hide the others.
    let mut deep = rollout("deep", "deep:1");
    let mut nested = json!(1);
    for _ in 0..140 {
        nested = json!({ "a": nested });
    }
    deep["spec"]["template"]["spec"]["deep"] = nested;
    let request =
        kube::core::Request::new("/apis/argoproj.io/v1alpha1/namespaces/default/rollouts")
            .create(
                &kube::api::PostParams::default(),
                serde_json::to_vec(&deep).expect("encodes"),
            )
            .expect("a create request");
    world
        .client
        .request_text(request)
        .await
        .expect("kube-sim stores the deep Rollout");
    let kubeconfig = world.dir.join("kubeconfig");
    let dashboard = dashboard(&world, &kubeconfig);

    // Given: the overview lists both Rollouts (once the watches have listed them), and names
    // the one it cannot decode.
    let overview = eventually("the overview to list web and api", async || {
        let (status, body) = dashboard.get("/").await;
        assert_eq!(status, 200, "{body}");
        (body.contains("id=\"row:default:web\"")
            && body.contains("id=\"row:default:api\"")
            && body.contains("Rollout &quot;deep&quot;"))
        .then_some(body)
    })
    .await;
    assert!(
        overview.contains("Rollout &quot;deep&quot; in namespace &quot;default&quot; cannot be decoded: spec.template.spec.deep.a.a"),
        "{overview}"
    );
    assert!(overview.contains("॥ Paused"), "{overview}");
    assert!(overview.contains("<td>1/3</td>"), "{overview}");
    assert!(
        overview.contains("web:1") && overview.contains("api:1"),
        "{overview}"
    );
    assert!(
        !overview.contains("https://"),
        "nothing from a CDN: {overview}"
    );
    let (status, script) = dashboard.get("/assets/app.js").await;
    assert_eq!(status, 200);
    assert!(script.contains("EventSource"), "{script}");

    // When: the image is changed with kubectl, the overview's stream carries the new row.
    let live = dashboard.stream("/events/overview").await;
    eventually("the stream's first rows", async || {
        live.lock()
            .expect("text")
            .contains("event: row")
            .then_some(())
    })
    .await;
    let changed_at = Instant::now();
    let patched = world
        .kubectl(
            &kubeconfig,
            &[
                "patch", "rollout", "web", "--type", "merge", "-p",
                r#"{"spec":{"template":{"spec":{"containers":[{"name":"main","image":"web:2"}]}}}}"#,
            ],
        )
        .output()
        .expect("kubectl runs");
    assert!(
        patched.status.success(),
        "{}",
        String::from_utf8_lossy(&patched.stderr)
    );
    let patch_done = changed_at.elapsed();
    eventually("web:2 on the live stream", async || {
        live.lock().expect("text").contains("web:2").then_some(())
    })
    .await;
    println!(
        "live update: kubectl patch took {patch_done:?}; the row arrived {:?} after kubectl returned",
        changed_at.elapsed() - patch_done
    );

    // The Rollout's page: the plugin's tree, the steps with the current one marked, buttons.
    let (status, page) = dashboard.get("/rollouts/default/web").await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Name:") && page.contains("web"), "{page}");
    assert!(page.contains("◀ current, paused"), "{page}");
    assert!(
        page.contains("data-url=\"/api/rollouts/default/web/promote\""),
        "{page}"
    );
    assert!(page.contains("data-stream=\"/events/rollouts/default/web?page=detail\""));

    // The analysis page plots a run the Rollout owns.
    let uid = created["metadata"]["uid"].as_str().expect("uid");
    world
        .sim
        .create(
            "default",
            json!({
                "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisRun",
                "metadata": {"name": "web-bbb-2", "namespace": "default",
                    "ownerReferences": [{"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
                                         "name": "web", "uid": uid, "controller": true}]},
                "spec": {"metrics": [{"name": "success-rate", "successCondition": "result[0] >= 0.95",
                    "provider": {"web": {"url": "http://example.invalid"}}}]}
            }),
        )
        .expect("seed the run");
    let runs = Api::<DynamicObject>::namespaced_with(
        world.client.clone(),
        "default",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "AnalysisRun"),
            "analysisruns",
        ),
    );
    runs.patch_status(
        "web-bbb-2",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running", "metricResults": [
            {"name": "success-rate", "phase": "Running", "measurements": [
                {"phase": "Successful", "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:00Z", "value": "[0.99]"},
                {"phase": "Successful", "startedAt": "2026-01-01T00:00:30Z", "finishedAt": "2026-01-01T00:00:30Z", "value": "[0.97]"}
            ]}]}})),
    )
    .await
    .expect("run status");
    let analysis = eventually("the run's chart", async || {
        let (_, body) = dashboard.get("/rollouts/default/web/analysis").await;
        body.contains("<svg").then_some(body)
    })
    .await;
    assert!(analysis.contains("success-rate: Running"), "{analysis}");
    assert_eq!(analysis.matches("<circle").count(), 2, "{analysis}");

    // Actions need the page's header; with it, promote sends the plugin's patch.
    let (status, _) = exchange(
        &dashboard.authority,
        "POST",
        "/api/rollouts/default/web/promote",
        &[],
    )
    .await;
    assert_eq!(
        status, 403,
        "an action without the page's header is refused"
    );
    let (status, body) = dashboard.post("/api/rollouts/default/web/promote").await;
    assert_eq!((status, body.as_str()), (200, "rollout 'web' promoted"));
    let promoted = world.rollout("web").await;
    assert!(
        promoted["status"]["pauseConditions"].is_null(),
        "{promoted}"
    );
    let (status, body) = dashboard.post("/api/rollouts/default/web/abort").await;
    assert_eq!((status, body.as_str()), (200, "rollout 'web' aborted"));
    assert_eq!(world.rollout("web").await["status"]["abort"], true);
    let (status, body) = exchange_with_body(
        &dashboard.authority,
        "POST",
        "/api/rollouts/default/web/set-image",
        &["X-Rollouts-Dashboard: action"],
        "main=web:3",
    )
    .await;
    assert_eq!(
        (status, body.as_str()),
        (200, "rollout \"web\" image updated")
    );
    assert_eq!(
        world.rollout("web").await["spec"]["template"]["spec"]["containers"][0]["image"],
        "web:3"
    );
    let (status, body) = exchange_with_body(
        &dashboard.authority,
        "POST",
        "/api/rollouts/default/web/set-image",
        &["X-Rollouts-Dashboard: action"],
        "sidecar=x:1",
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("unable to find container named \"sidecar\""),
        "{body}"
    );
    let (status, body) = dashboard.post("/api/rollouts/default/nope/abort").await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("NotFound"), "{body}");

    // A request naming another host (a DNS-rebinding page) is refused.
    let (status, _) = exchange(
        &dashboard.authority,
        "GET",
        "/",
        &["Host: evil.example:3100"],
    )
    .await;
    assert_eq!(status, 403);
}

/// The API server's answer to a user who may read but not patch, as kube-apiserver words it.
fn forbidden(method: &str, path: &str) -> String {
    // /apis/argoproj.io/v1alpha1/namespaces/NS/rollouts/NAME[/status]
    let parts: Vec<&str> = path
        .split('?')
        .next()
        .unwrap_or_default()
        .split('/')
        .collect();
    let (group, namespace, resource, name) = (parts[2], parts[5], parts[6], parts[7]);
    let subresource = parts.get(8).map(|s| format!("/{s}")).unwrap_or_default();
    let verb = method.to_lowercase();
    let message = format!(
        "{resource}.{group} \"{name}\" is forbidden: User \"viewer\" cannot {verb} resource \"{resource}{subresource}\" in API group \"{group}\" in the namespace \"{namespace}\""
    );
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": "Forbidden",
           "details": {"name": name, "group": group, "kind": resource}, "code": 403})
    .to_string()
}

/// Stands in front of kube-sim as the API server's authorizer would for a read-only user:
/// reads and watches pass through, every PATCH is answered 403 with the API's Status.
async fn read_only_front(upstream: String) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match client.read(&mut byte).await {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let mut request_line = head.split(' ');
                let method = request_line.next().unwrap_or_default().to_string();
                let path = request_line.next().unwrap_or_default().to_string();
                if method == "PATCH" {
                    let body = forbidden(&method, &path);
                    let answer = format!(
                        "HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = client.write_all(answer.as_bytes()).await;
                    return;
                }
                // One request per connection, so a later PATCH cannot ride on this one.
                let mut forwarded: String = head
                    .trim_end_matches("\r\n")
                    .split("\r\n")
                    .filter(|line| !line.to_lowercase().starts_with("connection:"))
                    .map(|line| format!("{line}\r\n"))
                    .collect();
                forwarded.push_str("Connection: close\r\n\r\n");
                let Ok(mut server) = TcpStream::connect(&upstream).await else {
                    return;
                };
                if server.write_all(forwarded.as_bytes()).await.is_err() {
                    return;
                }
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    });
    address
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_forbidden_to_patch_sees_the_page_and_the_api_message() {
    let world = world("forbidden");
    world
        .sim
        .create("default", rollout("web", "web:1"))
        .expect("seed web");
    world.patch_status("web", paused_at_step_one()).await;
    let front = read_only_front(world.sim.address().to_string()).await;
    let kubeconfig = world.dir.join("viewer-kubeconfig");
    std::fs::write(
        &kubeconfig,
        world
            .sim
            .kubeconfig()
            .replace(&world.sim.url(), &format!("http://{front}"))
            .replace("user: {}", "user:\n    token: viewer"),
    )
    .expect("write kubeconfig");
    let dashboard = dashboard(&world, &kubeconfig);

    eventually("the overview through the read-only user", async || {
        let (_, body) = dashboard.get("/").await;
        body.contains("id=\"row:default:web\"").then_some(())
    })
    .await;
    let (status, body) = dashboard.post("/api/rollouts/default/web/abort").await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        body,
        "Error from server (Forbidden): rollouts.argoproj.io \"web\" is forbidden: User \"viewer\" cannot patch resource \"rollouts/status\" in API group \"argoproj.io\" in the namespace \"default\""
    );
    assert_ne!(
        world.rollout("web").await["status"]["abort"],
        true,
        "nothing was written"
    );
}

/// Decodes standard base64 (WebDriver's screenshots).
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        })
    };
    let digits: Vec<u32> = text.bytes().filter_map(value).collect();
    let mut bytes = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, d)| n | (d << (18 - 6 * i)));
        let [_, a, b, c] = n.to_be_bytes();
        bytes.extend_from_slice(&[a, b, c][..chunk.len().saturating_sub(1)]);
    }
    bytes
}

/// A headless Chromium driven through Debian's chromedriver (W3C WebDriver over HTTP).
struct Browser {
    driver: Child,
    authority: String,
    session: String,
    profile: PathBuf,
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ending the session quits Chromium; killing chromedriver alone would leave it running.
        if let Ok(mut stream) = std::net::TcpStream::connect(&self.authority) {
            use std::io::{Read, Write};
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            let request = format!(
                "DELETE /session/{} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\n\r\n",
                self.session, self.authority
            );
            if stream.write_all(request.as_bytes()).is_ok() {
                // chromedriver answers once Chromium has quit.
                let _ = stream.read(&mut [0u8; 512]);
            }
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// One WebDriver command; its `value`.
async fn webdriver(authority: &str, method: &str, path: &str, body: Option<&Value>) -> Value {
    let mut stream = TcpStream::connect(authority)
        .await
        .expect("chromedriver answers");
    let body = body.map(Value::to_string).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    // chromedriver keeps the connection open: read the head, then Content-Length bytes.
    let mut reader = BufReader::new(stream);
    let mut length = 0usize;
    let mut head = String::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).await.expect("read a header");
        if line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().expect("a length");
        }
        head.push_str(&line);
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).await.expect("read the body");
    let body = String::from_utf8_lossy(&body).into_owned();
    let answer = format!("{head}\n{body}");
    let parsed: Value = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("chromedriver answered {answer:?}: {e}"));
    parsed["value"].clone()
}

impl Browser {
    async fn start(dir: &Path) -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let authority = format!("127.0.0.1:{port}");
        let profile = dir.join("chromium-profile");
        let mut browser = Browser {
            driver,
            authority,
            session: String::new(),
            profile,
        };
        eventually("chromedriver to be ready", async || {
            TcpStream::connect(&browser.authority).await.ok()?;
            let status = webdriver(&browser.authority, "GET", "/status", None).await;
            (status["ready"] == true).then_some(())
        })
        .await;
        let session = webdriver(
            &browser.authority,
            "POST",
            "/session",
            Some(&json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "unhandledPromptBehavior": "ignore",
                "goog:chromeOptions": {
                    "binary": "/usr/bin/chromium",
                    "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                             "--no-first-run", "--disable-background-networking",
                             "--disable-component-update", "--disable-sync",
                             "--window-size=1280,900",
                             format!("--user-data-dir={}", browser.profile.display())]
                }
            }}})),
        )
        .await;
        browser.session = session["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {session}"))
            .to_string();
        browser
    }

    async fn command(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        webdriver(&self.authority, method, &path, body.as_ref()).await
    }

    async fn open(&self, url: &str) {
        self.command("POST", "/url", Some(json!({ "url": url })))
            .await;
    }

    /// The text of the first element matching `css`, if there is one.
    async fn text(&self, css: &str) -> Option<String> {
        let found = self
            .command(
                "POST",
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        let id = found.as_object()?.values().next()?.as_str()?.to_string();
        let text = self
            .command("GET", &format!("/element/{id}/text"), None)
            .await;
        text.as_str().map(String::from)
    }

    /// Scrolls the first element matching `css` to the bottom of the window.
    async fn scroll_to(&self, css: &str) {
        self.command(
            "POST",
            "/execute/sync",
            Some(json!({
                "script": "document.querySelector(arguments[0]).scrollIntoView(false);",
                "args": [css]
            })),
        )
        .await;
    }

    /// How many elements match `css`.
    async fn count(&self, css: &str) -> usize {
        let found = self
            .command(
                "POST",
                "/elements",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        found.as_array().map_or(0, Vec::len)
    }

    async fn click(&self, css: &str) {
        let found = self
            .command(
                "POST",
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        let id = found
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no element {css}: {found}"))
            .to_string();
        self.command("POST", &format!("/element/{id}/click"), Some(json!({})))
            .await;
    }

    /// Accepts the confirmation the page asks, once it is shown; its text.
    async fn confirm(&self) -> String {
        eventually("the confirmation", async || {
            let text = self.command("GET", "/alert/text", None).await;
            let text = text.as_str()?.to_string();
            self.command("POST", "/alert/accept", Some(json!({}))).await;
            Some(text)
        })
        .await
    }

    async fn screenshot(&self, path: &Path) {
        let image = self.command("GET", "/screenshot", None).await;
        let png = base64_decode(image.as_str().expect("base64 PNG"));
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        std::fs::write(path, png).expect("write screenshot");
    }
}

/// A baseline-judge measurement value in milliseconds, as the judge provider stores it.
fn judge_value(verdict: &str, canary: f64, stable: f64) -> String {
    json!({"verdict": verdict, "canaryMean": canary, "baselineMean": stable,
           "meanRatio": canary / stable, "lower": (canary - stable) * 0.5,
           "upper": (canary - stable) * 1.5, "unit": "milliseconds"})
    .to_string()
}

/// `target/dashboard-screenshots/`, for a person to look at.
fn screenshot_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_kubectl-rollouts"))
        .parent()
        .and_then(Path::parent)
        .expect("target directory")
        .join("dashboard-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot directory");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_the_pages_update_live_and_the_buttons_act() {
    assert!(
        on_path("chromium") && on_path("chromedriver"),
        "chromium and chromedriver are not on PATH: install Debian's chromium and chromium-driver (.ci/run does)"
    );
    let world = world("browser");
    let created = world
        .sim
        .create("default", rollout("web", "web:1"))
        .expect("seed web");
    world
        .sim
        .create("default", rollout("api", "api:1"))
        .expect("seed api");
    world.patch_status("web", paused_at_step_one()).await;
    let uid = created["metadata"]["uid"].as_str().expect("uid");
    world
        .sim
        .create(
            "default",
            json!({
                "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisRun",
                "metadata": {"name": "web-bbb-2", "namespace": "default",
                    "ownerReferences": [{"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
                                         "name": "web", "uid": uid, "controller": true}]},
                "spec": {"metrics": [{"name": "success-rate", "successCondition": "result[0] >= 0.95",
                    "provider": {"web": {"url": "http://example.invalid"}}}]}
            }),
        )
        .expect("seed the run");
    Api::<DynamicObject>::namespaced_with(
        world.client.clone(),
        "default",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "AnalysisRun"),
            "analysisruns",
        ),
    )
    .patch_status(
        "web-bbb-2",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running", "metricResults": [
        {"name": "success-rate", "phase": "Running", "measurements": [
            {"phase": "Successful", "finishedAt": "2026-01-01T00:00:00Z", "value": "[0.99]"},
            {"phase": "Successful", "finishedAt": "2026-01-01T00:00:30Z", "value": "[0.97]"},
            {"phase": "Successful", "finishedAt": "2026-01-01T00:01:00Z", "value": "[0.96]"}
        ]},
        {"name": "latency", "phase": "Failed", "measurements": [
            {"phase": "Successful", "finishedAt": "2026-01-01T00:00:00Z",
             "value": judge_value("Pass", 121.0, 119.0)},
            {"phase": "Successful", "finishedAt": "2026-01-01T00:00:30Z",
             "value": judge_value("Pass", 138.0, 120.0)},
            {"phase": "Failed", "finishedAt": "2026-01-01T00:01:00Z",
             "value": judge_value("High", 162.0, 121.0)}
        ]}]}})),
    )
    .await
    .expect("run status");
    let kubeconfig = world.dir.join("kubeconfig");
    let dashboard = dashboard(&world, &kubeconfig);
    let base = format!("http://{}", dashboard.authority);
    let shots = screenshot_dir();
    let browser = Browser::start(&world.dir).await;

    // The overview lists the Rollouts.
    browser.open(&format!("{base}/")).await;
    let web_row = "tr[id=\"row:default:web\"]";
    eventually("both rows in the page", async || {
        browser.text(web_row).await?;
        browser.text("tr[id=\"row:default:api\"]").await
    })
    .await;
    eventually("the live stream to connect", async || {
        (browser.text("#connection").await? == "live").then_some(())
    })
    .await;
    browser.screenshot(&shots.join("overview.png")).await;

    // A change made with kubectl shows on the page without a reload.
    let changed_at = Instant::now();
    let patched = world
        .kubectl(
            &kubeconfig,
            &[
                "patch",
                "rollout",
                "web",
                "--type",
                "merge",
                "-p",
                r#"{"spec":{"template":{"spec":{"containers":[{"name":"main","image":"web:2"}]}}}}"#,
            ],
        )
        .output()
        .expect("kubectl runs");
    assert!(patched.status.success());
    let kubectl_took = changed_at.elapsed();
    eventually("web:2 in the page", async || {
        browser.text(web_row).await?.contains("web:2").then_some(())
    })
    .await;
    println!(
        "in chromium: the changed row showed {:?} after kubectl patch returned ({kubectl_took:?} for kubectl itself)",
        changed_at.elapsed() - kubectl_took
    );
    browser.screenshot(&shots.join("overview-live.png")).await;

    // Promote and abort from the Rollout's page, each after its confirmation.
    browser.open(&format!("{base}/rollouts/default/web")).await;
    eventually("the tree", async || {
        browser
            .text("pre.tree")
            .await
            .filter(|t| t.contains("Name:"))
    })
    .await;
    browser.screenshot(&shots.join("rollout.png")).await;
    browser.click("button[data-action=\"promote\"]").await;
    assert!(browser.confirm().await.contains("Promote rollout 'web'"));
    eventually("the promoted message", async || {
        browser
            .text("#toast")
            .await
            .filter(|t| t.contains("rollout 'web' promoted"))
    })
    .await;
    assert!(world.rollout("web").await["status"]["pauseConditions"].is_null());
    browser.click("button[data-action=\"abort\"]").await;
    assert!(browser.confirm().await.contains("Abort rollout 'web'"));
    eventually("the Rollout aborted", async || {
        (world.rollout("web").await["status"]["abort"] == true).then_some(())
    })
    .await;
    eventually("the page to show the abort", async || {
        browser
            .text("ol.steps")
            .await
            .filter(|t| t.contains("aborted"))
    })
    .await;
    browser.screenshot(&shots.join("rollout-aborted.png")).await;

    // The analysis chart shows the run's measurements.
    browser
        .open(&format!("{base}/rollouts/default/web/analysis"))
        .await;
    eventually("the chart", async || {
        browser.text("figure.metric figcaption").await
    })
    .await;
    let judged = eventually("the judge metric's chart", async || {
        browser
            .text("section.run")
            .await
            .filter(|t| t.contains("latency: Failed"))
    })
    .await;
    assert!(
        judged.contains("canary 162ms vs stable 121ms (High)"),
        "{judged}"
    );
    browser.screenshot(&shots.join("analysis.png")).await;
    println!("screenshots in {}", shots.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_the_real_controllers_analysis_run_is_plotted() {
    assert!(
        on_path("chromium") && on_path("chromedriver"),
        "chromium and chromedriver are not on PATH: install Debian's chromium and chromium-driver (.ci/run does)"
    );
    let world = world("controller-run");
    let _controller = Controller::start(&world.kubeconfig());
    // Given: a web metric the controller measures three times, a second apart.
    let (stub, asked) = metric_stub(vec![
        json!({"rate": 0.99}),
        json!({"rate": 0.97}),
        json!({"rate": 0.96}),
    ]);
    world
        .sim
        .create(
            "default",
            json!({
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "AnalysisTemplate",
                "metadata": {"name": "success-rate", "namespace": "default"},
                "spec": {"metrics": [{
                    "name": "success-rate", "interval": "1s", "count": 3,
                    "successCondition": "result >= 0.95",
                    "provider": {"web": {"url": format!("{stub}/rate"), "jsonPath": "{$.rate}"}}
                }]}
            }),
        )
        .expect("seed the template");
    let mut web = rollout("web", "web:1");
    // An experiment step first: its Experiment shows in the Rollout page's tree.
    web["spec"]["strategy"]["canary"]["steps"] = json!([
        {"setWeight": 50},
        {"experiment": {"duration": "1s", "templates": [
            {"name": "baseline", "specRef": "stable"},
            {"name": "canary", "specRef": "canary"}
        ]}},
        {"analysis": {"templates": [{"templateName": "success-rate"}]}},
        {"pause": {}}
    ]);
    world.sim.create("default", web).expect("seed web");
    eventually("web Healthy", async || {
        (world.rollout("web").await["status"]["phase"] == "Healthy").then_some(())
    })
    .await;

    // When: a new image starts the canary, whose analysis step the controller runs.
    let container = world.rollout("web").await["spec"]["template"]["spec"]["containers"][0]["name"]
        .as_str()
        .expect("a container name")
        .to_string();
    let set = world
        .kubectl(
            &world.kubeconfig(),
            &[
                "rollouts",
                "set",
                "image",
                "web",
                &format!("{container}=web:2"),
            ],
        )
        .output()
        .expect("kubectl runs");
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    let runs = Api::<DynamicObject>::namespaced_with(
        world.client.clone(),
        "default",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "AnalysisRun"),
            "analysisruns",
        ),
    );
    let (run, measured) = eventually("the controller's run to finish", async || {
        let listed = runs.list(&Default::default()).await.ok()?;
        let run = listed.items.into_iter().next()?;
        let status = &run.data["status"];
        (status["phase"] == "Successful").then_some(())?;
        let measured = status["metricResults"][0]["measurements"].as_array()?.len();
        Some((run.metadata.name.clone()?, measured))
    })
    .await;
    assert_eq!(measured, 3, "the run measured {measured} times");
    assert!(asked.lock().expect("paths").len() >= 3);

    // Then: its page plots each of the controller's measurements.
    let kubeconfig = world.kubeconfig();
    let dashboard = dashboard(&world, &kubeconfig);
    let browser = Browser::start(&world.dir).await;
    browser
        .open(&format!(
            "http://{}/rollouts/default/web/analysis",
            dashboard.authority
        ))
        .await;
    let section = eventually("the run's chart", async || {
        browser
            .text("section.run")
            .await
            .filter(|t| t.contains(&run) && t.contains("success-rate: Successful"))
    })
    .await;
    assert!(section.contains("Successful"), "{section}");
    let points = browser.count("section.run figure.metric svg circle").await;
    assert_eq!(points, measured, "one marker per measurement");
    let shots = screenshot_dir();
    browser
        .screenshot(&shots.join("analysis-controller.png"))
        .await;

    // The Rollout's page draws the experiment step's Experiment, ended, under revision 2.
    browser
        .open(&format!(
            "http://{}/rollouts/default/web",
            dashboard.authority
        ))
        .await;
    let tree = eventually("the experiment in the tree", async || {
        browser.text("pre.tree").await.filter(|t| {
            t.lines()
                .any(|l| l.contains("Σ web-") && l.contains("Successful"))
        })
    })
    .await;
    let at = |needle: &str| tree.lines().position(|l| l.contains(needle));
    assert!(
        at("# revision:2") < at("Σ web-") && at("Σ web-") < at("# revision:1"),
        "{tree}"
    );
    assert!(tree.contains("-2-1-baseline"), "{tree}");
    browser.scroll_to("pre.tree").await;
    browser
        .screenshot(&shots.join("rollout-experiment.png"))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_restores_the_revision_the_page_names() {
    let world = world("rollback");
    let created = world
        .sim
        .create("default", rollout("web", "web:2"))
        .expect("seed web");
    for (revision, hash, image) in [("1", "aaa", "web:1"), ("2", "bbb", "web:2")] {
        world
            .sim
            .create(
                "default",
                json!({
                    "apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "metadata": {
                        "name": format!("web-{hash}"), "namespace": "default",
                        "labels": {"app": "web", "rollouts-pod-template-hash": hash},
                        "annotations": {"rollout.argoproj.io/revision": revision},
                        "ownerReferences": [{"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
                            "name": "web", "uid": created["metadata"]["uid"], "controller": true}]
                    },
                    "spec": {
                        "replicas": 0,
                        "selector": {"matchLabels": {"app": "web", "rollouts-pod-template-hash": hash}},
                        "template": {
                            "metadata": {"labels": {"app": "web", "rollouts-pod-template-hash": hash}},
                            "spec": {"containers": [{"name": "main", "image": image}]}
                        }
                    }
                }),
            )
            .expect("seed a revision's ReplicaSet");
    }
    let kubeconfig = world.kubeconfig();
    let dashboard = dashboard(&world, &kubeconfig);
    let page = eventually("web's page", async || {
        let (_, page) = dashboard.get("/rollouts/default/web").await;
        page.contains("data-action=").then_some(page)
    })
    .await;
    assert!(
        page.contains("data-action=\"rollback\"")
            && page.contains("data-prompt=\"REVISION (0: the one before the newest)\""),
        "{page}"
    );
    let rollback = async |revision: &str| {
        exchange_with_body(
            &dashboard.authority,
            "POST",
            "/api/rollouts/default/web/rollback",
            &["X-Rollouts-Dashboard: action"],
            revision,
        )
        .await
    };
    let (status, body) = rollback("1").await;
    assert_eq!(
        (status, body.as_str()),
        (200, "rollout 'web' rolled back to revision 1")
    );
    assert_eq!(
        world.rollout("web").await["spec"]["template"]["spec"]["containers"][0]["image"],
        "web:1"
    );
    let (status, body) = rollback("1").await;
    assert_eq!(
        (status, body.as_str()),
        (
            200,
            "skipped rollback (current template already matches revision 1)"
        )
    );
    let (status, body) = rollback("one").await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("\"one\" is not a revision number"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rollout_page_draws_its_experiment_and_streams_its_changes() {
    let world = world("experiment");
    let created = world
        .sim
        .create("default", rollout("web", "web:1"))
        .expect("seed web");
    world.patch_status("web", paused_at_step_one()).await;
    let owner = |object: &Value| {
        json!([{"apiVersion": object["apiVersion"], "kind": object["kind"],
                "name": object["metadata"]["name"], "uid": object["metadata"]["uid"],
                "controller": true}])
    };
    let experiment = world
        .sim
        .create(
            "default",
            json!({
                "apiVersion": "argoproj.io/v1alpha1", "kind": "Experiment",
                "metadata": {"name": "web-bbb-2-0", "namespace": "default",
                             "annotations": {"rollout.argoproj.io/revision": "2"},
                             "ownerReferences": owner(&created)},
                "spec": {"templates": [{"name": "canary",
                    "selector": {"matchLabels": {"app": "web", "role": "canary"}},
                    "template": {"metadata": {"labels": {"app": "web", "role": "canary"}},
                                 "spec": {"containers": [{"name": "main", "image": "web:2"}]}}}]}
            }),
        )
        .expect("seed the experiment");
    world
        .sim
        .create(
            "default",
            json!({
                "apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {"name": "web-bbb-2-0-canary", "namespace": "default",
                             "labels": {"app": "web", "role": "canary"},
                             "annotations": {"experiment.argoproj.io/template-name": "canary"},
                             "ownerReferences": owner(&experiment)},
                "spec": {"replicas": 1,
                         "selector": {"matchLabels": {"app": "web", "role": "canary"}},
                         "template": {"metadata": {"labels": {"app": "web", "role": "canary"}},
                                      "spec": {"containers": [{"name": "main", "image": "web:2"}]}}}
            }),
        )
        .expect("seed the experiment's ReplicaSet");
    let experiments = Api::<DynamicObject>::namespaced_with(
        world.client.clone(),
        "default",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Experiment"),
            "experiments",
        ),
    );
    let set_phase = async |phase: &str| {
        experiments
            .patch_status(
                "web-bbb-2-0",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": phase}})),
            )
            .await
            .expect("experiment status");
    };
    set_phase("Running").await;

    let kubeconfig = world.kubeconfig();
    let dashboard = dashboard(&world, &kubeconfig);
    // The page draws the experiment under revision 2, its ReplicaSet and pod under it.
    let page = eventually("the experiment's pod in the page", async || {
        let (_, page) = dashboard.get("/rollouts/default/web").await;
        page.contains("□ web-bbb-2-0-canary-").then_some(page)
    })
    .await;
    let tree = page
        .split("<pre class=\"tree\">")
        .nth(1)
        .and_then(|rest| rest.split("</pre>").next())
        .unwrap_or_else(|| panic!("no tree in the page: {page}"));
    let at = |needle: &str| {
        tree.lines()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in the tree:\n{tree}"))
    };
    assert!(at("# revision:2") < at("Σ web-bbb-2-0 "), "{tree}");
    assert!(at("Σ web-bbb-2-0 ") < at("⧉ web-bbb-2-0-canary"), "{tree}");
    assert!(
        tree.lines()
            .nth(at("Σ web-bbb-2-0 "))
            .is_some_and(|l| l.contains("◌ Running"))
    );

    // When the experiment ends, the page's stream carries the new tree.
    let live = dashboard
        .stream("/events/rollouts/default/web?page=detail")
        .await;
    eventually("the stream's response head", async || {
        live.lock()
            .expect("text")
            .contains("text/event-stream")
            .then_some(())
    })
    .await;
    set_phase("Successful").await;
    eventually("the ended experiment on the stream", async || {
        let text = live.lock().expect("text").clone();
        text.lines()
            .any(|l| l.contains("Σ web-bbb-2-0 ") && l.contains("✔ Successful"))
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_rollouts_are_listed_and_one_change_is_streamed_alone() {
    const COUNT: usize = 1000;
    let world = world("thousand");
    for i in 0..COUNT {
        world
            .sim
            .create("default", rollout(&format!("app-{i:04}"), "app:1"))
            .expect("seed");
    }
    let kubeconfig = world.dir.join("kubeconfig");
    let dashboard = dashboard(&world, &kubeconfig);
    let overview = eventually("all rows listed", async || {
        let (_, body) = dashboard.get("/").await;
        (body.matches("<tr id=\"row:").count() == COUNT).then_some(body)
    })
    .await;
    let loaded_at = Instant::now();
    let (status, body) = dashboard.get("/").await;
    let page_load = loaded_at.elapsed();
    assert_eq!(status, 200);
    assert_eq!(body.matches("<tr id=\"row:").count(), COUNT);
    let since = overview
        .split("/events/overview?since=")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the page names its stream")
        .to_string();

    // A page loaded at the current version is sent only the row that changes.
    let live = dashboard
        .stream(&format!("/events/overview?since={since}"))
        .await;
    // The stream has registered once a keep-alive or a row could arrive; the change below is
    // made after connecting, and the stream starts from the store, so nothing is missed.
    eventually("the stream's response head", async || {
        live.lock()
            .expect("text")
            .contains("text/event-stream")
            .then_some(())
    })
    .await;
    let changed_at = Instant::now();
    world
        .rollouts()
        .patch(
            "app-0500",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"spec": {"containers": [{"name": "main", "image": "app:2"}]}}}})),
        )
        .await
        .expect("patch");
    eventually("app:2 on the stream", async || {
        live.lock().expect("text").contains("app:2").then_some(())
    })
    .await;
    let streamed = changed_at.elapsed();
    let text = live.lock().expect("text").clone();
    assert_eq!(
        text.matches("event: row").count(),
        1,
        "only the changed row is sent: {text}"
    );
    println!(
        "{COUNT} rollouts: overview page {} KiB served in {page_load:?}; one change on the stream {streamed:?} after the API write",
        body.len() / 1024
    );
}
