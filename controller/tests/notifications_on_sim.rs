//! Notifications end to end on kube-sim with the real controller binary and loopback
//! receivers: Argo's ConfigMap and Secret in the controller's namespace, subscriptions by
//! annotation, an aborted canary sending exactly one message to a subscribed webhook (through
//! two 500s), the send recorded so that a restarted controller does not repeat it while a second
//! abort is a new message, Slack's chat.postMessage per channel, and a receiver that always
//! fails turning into a warning event and a failure count without slowing the rollout.

mod support;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use support::{Controller, ControllerLog, NAMESPACE, Sim, canary_rollout, eventually, http_get};

const DEADLINE: Duration = Duration::from_secs(45);
const NOTIFIED: &str = "notified.notifications.argoproj.io";

/// One request a receiver got.
#[derive(Clone, Debug)]
struct Received {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: String,
    /// The status it was answered with.
    answered: u16,
    at: Instant,
    wall: SystemTime,
}

impl Received {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A loopback HTTP receiver: answers the statuses scripted, then `then` (with `body`), and
/// keeps every request.
struct Receiver {
    url: String,
    received: Arc<Mutex<Vec<Received>>>,
    server: JoinHandle<()>,
}

impl Receiver {
    async fn start(script: &[u16], then: u16, body: &'static str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds loopback");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let received = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(
            script.iter().copied().collect::<VecDeque<u16>>(),
        ));
        let seen = received.clone();
        let server = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (seen, script) = (seen.clone(), script.clone());
                tokio::spawn(async move {
                    serve(stream, seen, script, then, body).await;
                });
            }
        });
        Self {
            url,
            received,
            server,
        }
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().expect("received").clone()
    }

    fn accepted(&self) -> Vec<Received> {
        self.accepted_with(200)
    }

    /// The requests answered `status`.
    fn accepted_with(&self, status: u16) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| r.answered == status)
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn serve(
    mut stream: TcpStream,
    seen: Arc<Mutex<Vec<Received>>>,
    script: Arc<Mutex<VecDeque<u16>>>,
    then: u16,
    answer: &str,
) {
    let Some(head) = support::read_request_head(&mut stream).await else {
        return;
    };
    let (head_text, rest) = head.split_once("\r\n\r\n").unwrap_or((&head, ""));
    let mut lines = head_text.lines();
    let request_line = lines.next().unwrap_or_default().to_string();
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let path = parts.next().unwrap_or_default().to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            Some((name.trim().to_string(), value.trim().to_string()))
        })
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = rest.as_bytes().to_vec();
    while body.len() < length {
        let mut chunk = vec![0u8; length - body.len()];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    let answered = script.lock().expect("script").pop_front().unwrap_or(then);
    seen.lock().expect("received").push(Received {
        method,
        path,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
        answered,
        at: Instant::now(),
        wall: SystemTime::now(),
    });
    let response = format!(
        "HTTP/1.1 {answered} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
        answer.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// A receiver that takes each request and never answers, keeping the connection open.
struct Hanging {
    url: String,
    held: Arc<Mutex<Vec<TcpStream>>>,
    server: JoinHandle<()>,
}

impl Hanging {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds loopback");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let held = Arc::new(Mutex::new(Vec::new()));
        let keep = held.clone();
        let server = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                if support::read_request_head(&mut stream).await.is_some() {
                    keep.lock().expect("held").push(stream);
                }
            }
        });
        Self { url, held, server }
    }

    fn requests(&self) -> usize {
        self.held.lock().expect("held").len()
    }
}

impl Drop for Hanging {
    fn drop(&mut self) {
        self.server.abort();
    }
}

type Cluster = Sim;

impl Cluster {
    fn start(name: &str) -> Self {
        Self::start_named("rollouts-notifications-on-sim", name)
    }

    /// Argo's notification ConfigMap (and its Secret) in the controller's namespace.
    async fn configure(&self, data: Value, secret: Value) {
        self.configure_in(NAMESPACE, data, secret).await;
    }

    /// Argo's notification ConfigMap (and its Secret) in `namespace`.
    async fn configure_in(&self, namespace: &str, data: Value, secret: Value) {
        if namespace != NAMESPACE {
            let object: Namespace =
                serde_json::from_value(json!({"metadata": {"name": namespace}}))
                    .expect("a Namespace");
            Api::<Namespace>::all(self.client.clone())
                .create(&PostParams::default(), &object)
                .await
                .expect("creates the namespace");
        }
        let configmap: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "argo-rollouts-notification-configmap", "namespace": namespace},
            "data": data
        }))
        .expect("a ConfigMap");
        Api::<ConfigMap>::namespaced(self.client.clone(), namespace)
            .create(&PostParams::default(), &configmap)
            .await
            .expect("creates the notification ConfigMap");
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "argo-rollouts-notification-secret", "namespace": namespace},
            "stringData": secret
        }))
        .expect("a Secret");
        Api::<Secret>::namespaced(self.client.clone(), namespace)
            .create(&PostParams::default(), &secret)
            .await
            .expect("creates the notification Secret");
    }

    /// A 2-pod canary with a pause, subscribed by `annotations`, released and paused on v2.
    async fn paused_canary(&self, name: &str, annotations: Value) {
        let mut rollout =
            canary_rollout(name, 2, "app:v1", json!([{"setWeight": 50}, {"pause": {}}]));
        rollout.metadata.annotations =
            Some(serde_json::from_value(annotations).expect("annotations"));
        self.create_rollout(rollout).await;
        let v1 = self.wait_healthy(DEADLINE, name, 2).await.current_pod_hash;
        self.set_image(name, "app:v2").await;
        eventually(DEADLINE, &format!("{name} paused on v2"), || async {
            let status = self.status(name).await;
            (status.current_pod_hash != v1
                && status.current_step_index == Some(1)
                && !status.pause_conditions.is_empty())
            .then_some(())
        })
        .await;
    }

    async fn abort(&self, name: &str) -> Instant {
        let at = Instant::now();
        self.patch_status(name, json!({"abort": true})).await;
        at
    }

    /// The Rollout's `notified.notifications.argoproj.io`, parsed.
    async fn notified(&self, name: &str) -> serde_json::Map<String, Value> {
        let rollout = self.rollouts().get(name).await.expect("reads the Rollout");
        rollout
            .annotations()
            .get(NOTIFIED)
            .and_then(|value| serde_json::from_str(value).ok())
            .unwrap_or_default()
    }

    /// The events recorded on Rollout `name` with `reason`.
    async fn warnings_or_events(&self, name: &str, reason: &str) -> Vec<Event> {
        Api::<Event>::namespaced(self.client.clone(), NAMESPACE)
            .list(&ListParams::default())
            .await
            .expect("lists events")
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .filter(|e| e.reason.as_deref() == Some(reason))
            .collect()
    }
}

/// `notification_send_total{service=..., result=...}` from the controller's /metrics.
async fn sends(controller: &Controller, service: &str, result: &str) -> u64 {
    let body = http_get(controller.metrics_addr().await, "/metrics").await;
    let series = format!("notification_send_total{{service=\"{service}\",result=\"{result}\"}}");
    body.lines()
        .find_map(|line| line.strip_prefix(&series))
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or(0)
}

/// Waits until the controller has reconciled `name` `more` more times than `since`.
async fn reconciled(controller: &Controller, name: &str, since: u64, more: u64) {
    eventually(
        DEADLINE,
        &format!("{more} more reconciles of {name}"),
        || async { (controller.reconciles(name).await >= since + more).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn an_aborted_canary_notifies_its_webhook_once_through_500s_and_not_again_after_a_restart() {
    let cluster = Cluster::start("abort");
    // Two 500s, then 200: the message arrives on the third try.
    let receiver = Receiver::start(&[500, 500], 200, "{}").await;
    cluster
        .configure(
            json!({
                "service.webhook.ops": format!(
                    "url: {}\nheaders:\n- name: Authorization\n  value: Bearer $ops-token\nretryWaitMin: 200ms\nretryWaitMax: 1s\n",
                    receiver.url
                ),
                "template.rollout-aborted": "message: Rollout {{.rollout.metadata.name}} has been aborted.\nwebhook:\n  ops:\n    method: POST\n    path: /hooks/{{.rollout.metadata.namespace}}\n    body: |\n      {\"text\": \"Rollout {{.rollout.metadata.name}} aborted at step {{.rollout.status.currentStepIndex}}\", \"recipient\": \"{{.recipient}}\"}\n",
                "trigger.on-rollout-aborted": "- send: [rollout-aborted]\n",
            }),
            json!({"ops-token": "s3cret-token"}),
        )
        .await;
    let controller = Controller::start(&cluster.kubeconfig, DEADLINE);
    cluster
        .paused_canary(
            "shop",
            json!({"notifications.argoproj.io/subscribe.on-rollout-aborted.ops": ""}),
        )
        .await;
    assert!(
        receiver.received().is_empty(),
        "nothing is sent before the abort (only on-rollout-aborted is subscribed): {:?}",
        receiver.received()
    );

    let aborted_at = cluster.abort("shop").await;
    let message = eventually(DEADLINE, "the abort message", || async {
        receiver.accepted().first().cloned()
    })
    .await;
    eprintln!(
        "figure: abort to webhook delivery through two 500s: {:?}",
        message.at.duration_since(aborted_at)
    );
    assert_eq!(message.method, "POST");
    assert_eq!(message.path, "/hooks/default");
    assert_eq!(message.header("authorization"), Some("Bearer s3cret-token"));
    let body: Value = serde_json::from_str(&message.body).expect("the body is JSON");
    assert_eq!(
        body,
        json!({"text": "Rollout shop aborted at step 1", "recipient": ""})
    );
    let tries: Vec<u16> = receiver.received().iter().map(|r| r.answered).collect();
    assert_eq!(
        tries,
        [500, 500, 200],
        "tried again after each 500, then stopped"
    );

    let recorded = eventually(DEADLINE, "the send recorded on the Rollout", || async {
        let notified = cluster.notified("shop").await;
        (!notified.is_empty()).then_some(notified)
    })
    .await;
    let key = recorded.keys().next().expect("one key").clone();
    assert!(
        key.ends_with(":on-rollout-aborted:[0].2jmj7l5rSw0yVb_vlWAYkK_YBwk:ops:"),
        "Argo's engine key shape: {key}"
    );
    eventually(DEADLINE, "one success counted", || async {
        (sends(&controller, "ops", "success").await == 1).then_some(())
    })
    .await;
    let log = controller.logs();
    let leaked = log
        .lock()
        .expect("logs")
        .iter()
        .any(|entry| entry.to_string().contains("s3cret-token"));
    assert!(!leaked, "the Secret's value is never logged");

    // Killed after the send and started again: the abort is not sent a second time.
    controller.kill().await;
    let controller = Controller::start(&cluster.kubeconfig, DEADLINE);
    let since = controller.reconciles("shop").await;
    reconciled(&controller, "shop", since, 1).await;
    cluster
        .patch_status("shop", json!({"message": "touched to reconcile again"}))
        .await;
    reconciled(&controller, "shop", since, 2).await;
    assert_eq!(
        receiver.accepted().len(),
        1,
        "a restarted controller does not repeat a sent notification"
    );

    // Retried and aborted again: a new occurrence, a new message.
    cluster.patch_status("shop", json!({"abort": false})).await;
    eventually(DEADLINE, "shop paused again after the retry", || async {
        let status = cluster.status("shop").await;
        (!status.abort && !status.pause_conditions.is_empty()).then_some(())
    })
    .await;
    cluster.abort("shop").await;
    eventually(DEADLINE, "the second abort's message", || async {
        (receiver.accepted().len() == 2).then_some(())
    })
    .await;
    eventually(DEADLINE, "both sends recorded", || async {
        (cluster.notified("shop").await.len() == 2).then_some(())
    })
    .await;
}

#[tokio::test]
async fn slack_gets_each_step_per_channel_pagerduty_the_abort_and_a_failing_webhook_becomes_a_warning()
 {
    let cluster = Cluster::start("slack");
    let slack = Receiver::start(&[], 200, r#"{"ok": true}"#).await;
    let pagerduty = Receiver::start(&[], 202, r#"{"status": "success"}"#).await;
    let broken = Receiver::start(&[], 503, "{}").await;
    cluster
        .configure(
            json!({
                "service.slack": format!("token: $slack-token\napiURL: {}/api/\nusername: rollouts\n", slack.url),
                "service.webhook.broken": format!("url: {}\nretryMax: 1\nretryWaitMin: 100ms\n", broken.url),
                "service.pagerdutyv2": format!("serviceKeys:\n  checkout: $pd-key\napiURL: {}/v2/enqueue\n", pagerduty.url),
                "template.rollout-aborted": "message: Rollout {{.rollout.metadata.name}} has been aborted.\npagerdutyv2:\n  summary: Rollout {{.rollout.metadata.name}} is aborted.\n  severity: critical\n  source: '{{.rollout.metadata.name}}'\n",
                "template.rollout-step-completed": "message: Rollout {{.rollout.metadata.name}} step number {{ add .rollout.status.currentStepIndex 1}}/{{len .rollout.spec.strategy.canary.steps}} has been completed.\nslack:\n  attachments: |\n    [{\"title\": \"{{ .rollout.metadata.name}}\", \"color\": \"#18be52\"}]\n",
            }),
            json!({"slack-token": "xoxb-test", "pd-key": "R0UTING-KEY"}),
        )
        .await;
    let controller = Controller::start(&cluster.kubeconfig, DEADLINE);
    cluster
        .paused_canary(
            "cart",
            json!({
                "notifications.argoproj.io/subscribe.on-rollout-step-completed.slack": "dev;ops",
                // The default triggers (failures only): the abort.
                "notifications.argoproj.io/subscribe.broken": "",
                "notifications.argoproj.io/subscribe.on-rollout-aborted.pagerdutyv2": "checkout",
            }),
        )
        .await;
    let posts = eventually(DEADLINE, "step 1 posted to both channels", || async {
        let posts = slack.accepted();
        (posts.len() == 2).then_some(posts)
    })
    .await;
    let mut channels = Vec::new();
    for post in &posts {
        assert_eq!(post.method, "POST");
        assert_eq!(post.path, "/api/chat.postMessage");
        assert_eq!(post.header("authorization"), Some("Bearer xoxb-test"));
        let body: Value = serde_json::from_str(&post.body).expect("JSON");
        assert_eq!(
            body["text"],
            "Rollout cart step number 1/2 has been completed."
        );
        assert_eq!(body["attachments"][0]["title"], "cart");
        assert_eq!(body["username"], "rollouts");
        channels.push(body["channel"].as_str().unwrap_or_default().to_string());
    }
    channels.sort();
    assert_eq!(channels, ["dev", "ops"]);

    cluster.abort("cart").await;
    eventually(DEADLINE, "the abort back to stable", || async {
        let status = cluster.status("cart").await;
        (status.abort && status.phase == "Degraded").then_some(())
    })
    .await;
    let warning = eventually(DEADLINE, "a NotificationFailed warning", || async {
        cluster
            .warnings_or_events("cart", "NotificationFailed")
            .await
            .into_iter()
            .next()
    })
    .await;
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    let note = warning.note.unwrap_or_default();
    assert!(
        note.contains("on-rollout-aborted") && note.contains("broken") && note.contains("503"),
        "{note}"
    );
    assert!(!note.contains(&broken.url), "no URL in the event: {note}");
    assert_eq!(broken.received().len(), 2, "one try and one retry");
    eventually(DEADLINE, "the failure counted", || async {
        (sends(&controller, "broken", "failure").await == 1).then_some(())
    })
    .await;
    assert_eq!(sends(&controller, "slack", "success").await, 2);
    let incident = eventually(DEADLINE, "the abort at PagerDuty", || async {
        pagerduty.received().first().cloned()
    })
    .await;
    assert_eq!(incident.path, "/v2/enqueue");
    let event: Value = serde_json::from_str(&incident.body).expect("JSON");
    assert_eq!(
        event,
        json!({
            "routing_key": "R0UTING-KEY",
            "event_action": "trigger",
            "payload": {"summary": "Rollout cart is aborted.", "severity": "critical", "source": "cart"}
        })
    );
    eventually(DEADLINE, "the PagerDuty send counted", || async {
        (sends(&controller, "pagerdutyv2", "success").await == 1).then_some(())
    })
    .await;
    eventually(
        DEADLINE,
        "the Slack and PagerDuty sends recorded, not the failure",
        || async { (cluster.notified("cart").await.len() == 3).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn every_step_reaches_its_webhook_once_in_order_while_a_hanging_receiver_holds_up_nothing() {
    // Twenty steps: the latency figure below is over at least twenty events.
    const STEPS: usize = 20;
    let cluster = Cluster::start("steps");
    let receiver = Receiver::start(&[], 200, "{}").await;
    let hanging = Hanging::start().await;
    cluster
        .configure(
            json!({
                "service.webhook.steps": format!("url: {}\n", receiver.url),
                "service.webhook.stuck": format!("url: {}\n", hanging.url),
                "template.rollout-step-completed": "message: step\nwebhook:\n  steps:\n    method: POST\n    body: '{{ add .rollout.status.currentStepIndex 1}}'\n  stuck:\n    method: POST\n    body: '{{ add .rollout.status.currentStepIndex 1}}'\n",
            }),
            json!({}),
        )
        .await;
    let controller = Controller::start(&cluster.kubeconfig, DEADLINE);
    let steps: Vec<Value> = (1..=STEPS)
        .map(|i| json!({"setWeight": i * 100 / STEPS}))
        .collect();
    let mut rollout = canary_rollout("steps", 4, "app:v1", Value::Array(steps));
    rollout.metadata.annotations = Some(
        [
            "notifications.argoproj.io/subscribe.on-rollout-step-completed.steps",
            "notifications.argoproj.io/subscribe.on-rollout-step-completed.stuck",
        ]
        .into_iter()
        .map(|key| (key.to_string(), String::new()))
        .collect(),
    );
    cluster.create_rollout(rollout).await;
    let v1 = cluster
        .wait_healthy(DEADLINE, "steps", 4)
        .await
        .current_pod_hash;
    cluster.set_image("steps", "app:v2").await;
    eventually(DEADLINE, "the v2 revision", || async {
        (cluster.status("steps").await.current_pod_hash != v1).then_some(())
    })
    .await;
    let v2 = cluster
        .wait_healthy(DEADLINE, "steps", 4)
        .await
        .current_pod_hash;
    assert_ne!(v1, v2);
    assert_eq!(
        hanging.requests(),
        1,
        "the release finished while the hanging receiver still held its first request"
    );

    let received = eventually(DEADLINE, "every step at the webhook", || async {
        let received = receiver.accepted();
        (received.len() >= STEPS).then_some(received)
    })
    .await;
    let order: Vec<String> = received.iter().map(|r| r.body.clone()).collect();
    let expected: Vec<String> = (1..=STEPS).map(|i| i.to_string()).collect();
    assert_eq!(order, expected, "each step once, in order");

    // Delivery latency: from each step event's time to the webhook receiving it.
    let events: Vec<Event> = cluster
        .warnings_or_events("steps", "RolloutStepCompleted")
        .await;
    let mut latencies: Vec<Duration> = received
        .iter()
        .filter_map(|message| {
            let prefix = format!("Rollout step {}/{STEPS} completed", message.body);
            let event = events
                .iter()
                .find(|e| e.note.as_deref().is_some_and(|n| n.starts_with(&prefix)))?;
            let at = event.event_time.as_ref()?.0;
            let at = SystemTime::UNIX_EPOCH
                + Duration::from_micros(u64::try_from(at.as_microsecond()).ok()?);
            message.wall.duration_since(at).ok()
        })
        .collect();
    assert_eq!(latencies.len(), STEPS, "every message matched to its event");
    latencies.sort();
    // Nearest rank: the p-th percentile is the ceil(p * n)-th smallest.
    let percentile = |p: usize| latencies[(p * STEPS).div_ceil(100).max(1) - 1];
    eprintln!(
        "figure: step event to webhook delivery over {STEPS} steps: median {:?}, p99 {:?}, max {:?}",
        percentile(50),
        percentile(99),
        latencies[STEPS - 1]
    );
    assert_eq!(sends(&controller, "steps", "success").await, STEPS as u64);
}

/// Mails a [`MailServer`] took: each one's envelope recipients and data.
type Mails = Arc<Mutex<Vec<(Vec<String>, String)>>>;

/// A loopback SMTP server without TLS or AUTH: keeps each mail's envelope recipients and data.
struct MailServer {
    port: u16,
    mails: Mails,
    server: JoinHandle<()>,
}

impl MailServer {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds loopback");
        let port = listener.local_addr().expect("address").port();
        let mails = Arc::new(Mutex::new(Vec::new()));
        let kept = mails.clone();
        let server = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let kept = kept.clone();
                tokio::spawn(async move {
                    let _ = smtp_session(stream, kept).await;
                });
            }
        });
        Self {
            port,
            mails,
            server,
        }
    }

    fn mails(&self) -> Vec<(Vec<String>, String)> {
        self.mails.lock().expect("mails").clone()
    }
}

impl Drop for MailServer {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn smtp_session(stream: TcpStream, kept: Mails) -> std::io::Result<()> {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    write.write_all(b"220 mail.test ESMTP\r\n").await?;
    let mut recipients = Vec::new();
    while let Some(line) = lines.next_line().await? {
        let command = line.to_ascii_uppercase();
        if command.starts_with("EHLO") || command.starts_with("HELO") {
            write
                .write_all(b"250-mail.test\r\n250 8BITMIME\r\n")
                .await?;
        } else if command.starts_with("RCPT TO:") {
            recipients.push(line[8..].trim().trim_matches(['<', '>']).to_string());
            write.write_all(b"250 OK\r\n").await?;
        } else if command.starts_with("DATA") {
            write.write_all(b"354 go on\r\n").await?;
            let mut data = String::new();
            while let Some(line) = lines.next_line().await? {
                if line == "." {
                    break;
                }
                data.push_str(&line);
                data.push('\n');
            }
            kept.lock()
                .expect("mails")
                .push((std::mem::take(&mut recipients), data));
            write.write_all(b"250 queued\r\n").await?;
        } else if command.starts_with("QUIT") {
            write.write_all(b"221 bye\r\n").await?;
            return Ok(());
        } else {
            write.write_all(b"250 OK\r\n").await?;
        }
    }
    Ok(())
}

#[tokio::test]
async fn an_aborted_canary_mails_each_subscribed_address_once() {
    let cluster = Cluster::start("email");
    let mail = MailServer::start().await;
    cluster
        .configure(
            json!({
                "service.email": format!("host: 127.0.0.1\nport: {}\nfrom: $mail-from\n", mail.port),
                "template.rollout-aborted": "message: Rollout {{.rollout.metadata.name}} has been aborted.\nemail:\n  subject: Rollout {{.rollout.metadata.name}} aborted\n",
            }),
            json!({"mail-from": "rollouts@example.com"}),
        )
        .await;
    let controller = Controller::start(&cluster.kubeconfig, DEADLINE);
    cluster
        .paused_canary(
            "pay",
            json!({"notifications.argoproj.io/subscribe.on-rollout-aborted.email": "dev@example.com;ops@example.com"}),
        )
        .await;
    cluster.abort("pay").await;
    let mails = eventually(DEADLINE, "a mail to each address", || async {
        let mails = mail.mails();
        (mails.len() == 2).then_some(mails)
    })
    .await;
    let mut to: Vec<String> = mails.iter().flat_map(|(rcpt, _)| rcpt.clone()).collect();
    to.sort();
    assert_eq!(to, ["dev@example.com", "ops@example.com"]);
    for (_, data) in &mails {
        assert!(data.contains("Subject: Rollout pay aborted"), "{data}");
        assert!(data.contains("From: rollouts@example.com"), "{data}");
        assert!(data.contains("Rollout pay has been aborted."), "{data}");
    }
    eventually(DEADLINE, "both sends counted and recorded", || async {
        let counted = sends(&controller, "email", "success").await == 2;
        (counted && cluster.notified("pay").await.len() == 2).then_some(())
    })
    .await;
}

#[tokio::test]
async fn teams_hears_each_new_revision_and_the_pause_as_message_cards() {
    let cluster = Cluster::start("teams");
    // A Teams incoming webhook answers `1`; anything else is a refusal, even with a 200.
    let teams = Receiver::start(&[], 200, "1").await;
    let refusing = Receiver::start(
        &[],
        200,
        "Webhook message delivery failed with error: Microsoft Teams endpoint returned HTTP error 400",
    )
    .await;
    // A Teams Workflows (Power Automate) webhook answers 202.
    let flows = Receiver::start(&[], 202, "").await;
    cluster
        .configure(
            json!({
                "service.teams": "recipientUrls:\n  ops: $teams-ops\n  old-channel: $teams-old\n",
                "service.teams-workflows": "recipientUrls:\n  ops: $flows-ops\n",
                "template.rollout-updated": "message: Rollout {{.rollout.metadata.name}} has been updated.\nteams:\n  title: Rollout {{.rollout.metadata.name}} updated\n  facts: |\n    [{\"name\": \"revision\", \"value\": \"{{index .rollout.metadata.annotations \"rollout.argoproj.io/revision\"}}\"}, {\"name\": \"service\", \"value\": \"{{.serviceType}}\"}]\n",
                "template.rollout-paused": "message: Rollout {{.rollout.metadata.name}} has been paused.\nteams:\n  title: Paused\n  themeColor: '#FFA500'\nteams-workflows:\n  title: Paused\n  themeColor: Warning\n",
            }),
            json!({
                "teams-ops": format!("{}/webhookb2/ops", teams.url),
                "teams-old": format!("{}/webhookb2/old", refusing.url),
                "flows-ops": format!("{}/powerautomate/ops", flows.url),
            }),
        )
        .await;
    let controller = Controller::start(&cluster.kubeconfig, DEADLINE);
    cluster
        .paused_canary(
            "tell",
            json!({
                "notifications.argoproj.io/subscribe.on-rollout-updated.teams": "ops",
                "notifications.argoproj.io/subscribe.on-rollout-paused.teams": "ops;old-channel",
                "notifications.argoproj.io/subscribe.on-rollout-paused.teams-workflows": "ops",
            }),
        )
        .await;
    let cards = eventually(DEADLINE, "two updates and the pause at Teams", || async {
        let cards = teams.accepted();
        (cards.len() >= 3).then_some(cards)
    })
    .await;
    let bodies: Vec<Value> = cards
        .iter()
        .map(|card| {
            assert_eq!(card.method, "POST");
            assert_eq!(card.path, "/webhookb2/ops");
            assert_eq!(card.header("content-type"), Some("application/json"));
            serde_json::from_str(&card.body).expect("a JSON MessageCard")
        })
        .collect();
    let summary: Vec<(String, String)> = bodies
        .iter()
        .map(|card| {
            assert_eq!(card["@type"], "MessageCard");
            (
                card["title"].as_str().unwrap_or_default().to_string(),
                card["text"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                "Rollout tell updated".to_string(),
                "Rollout tell has been updated.".to_string()
            ),
            (
                "Rollout tell updated".to_string(),
                "Rollout tell has been updated.".to_string()
            ),
            (
                "Paused".to_string(),
                "Rollout tell has been paused.".to_string()
            ),
        ],
        "revision 1 on creation, revision 2 on the new image, then the pause step"
    );
    let facts = |card: &Value| card["sections"][0]["facts"].clone();
    assert_eq!(
        facts(&bodies[0]),
        json!([{"name": "revision", "value": "1"}, {"name": "service", "value": "teams"}])
    );
    assert_eq!(facts(&bodies[1])[0]["value"], "2");
    assert_eq!(bodies[2]["themeColor"], "#FFA500");
    eventually(DEADLINE, "three Teams sends counted", || async {
        (sends(&controller, "teams", "success").await == 3).then_some(())
    })
    .await;
    let warning = eventually(DEADLINE, "the refused card as a warning", || async {
        cluster
            .warnings_or_events("tell", "NotificationFailed")
            .await
            .into_iter()
            .next()
    })
    .await;
    let note = warning.note.unwrap_or_default();
    assert!(
        note.contains("teams:old-channel") && note.contains("Teams refused the message"),
        "{note}"
    );
    assert_eq!(
        refusing.received().len(),
        1,
        "a refusal is final, not tried again"
    );
    let flow = eventually(DEADLINE, "the pause at the Teams workflow", || async {
        flows.accepted_with(202).first().cloned()
    })
    .await;
    assert_eq!(flow.path, "/powerautomate/ops");
    let message: Value = serde_json::from_str(&flow.body).expect("JSON");
    assert_eq!(message["type"], "message");
    assert_eq!(
        message["attachments"][0]["content"]["body"],
        json!([
            {"type": "TextBlock", "text": "Paused", "size": "Large", "weight": "Bolder", "color": "Warning", "wrap": true},
            {"type": "TextBlock", "text": "Rollout tell has been paused.", "wrap": true}
        ])
    );
    let events = cluster.warnings_or_events("tell", "RolloutPaused").await;
    assert_eq!(events.len(), 1, "one RolloutPaused event: {events:?}");
    assert_eq!(
        events[0].note.as_deref(),
        Some("Rollout is paused (CanaryPauseStep)")
    );
}

#[tokio::test]
async fn once_per_sends_one_step_message_per_revision() {
    let cluster = Cluster::start("once-per");
    let receiver = Receiver::start(&[], 200, "{}").await;
    cluster
        .configure(
            json!({
                "service.webhook.deploys": format!("url: {}\n", receiver.url),
                "trigger.on-rollout-step-completed": "- send: [first-step]\n  oncePer: rollout.status.currentPodHash\n",
                "template.first-step": "message: started\nwebhook:\n  deploys:\n    method: POST\n    body: '{{.rollout.status.currentPodHash}}'\n",
            }),
            json!({}),
        )
        .await;
    let _controller = Controller::start(&cluster.kubeconfig, DEADLINE);
    let mut rollout = canary_rollout(
        "once",
        2,
        "app:v1",
        json!([{"setWeight": 25}, {"setWeight": 50}, {"setWeight": 75}]),
    );
    rollout.metadata.annotations = Some(
        [(
            "notifications.argoproj.io/subscribe.on-rollout-step-completed.deploys".to_string(),
            String::new(),
        )]
        .into_iter()
        .collect(),
    );
    cluster.create_rollout(rollout).await;
    let mut hashes = vec![
        cluster
            .wait_healthy(DEADLINE, "once", 2)
            .await
            .current_pod_hash,
    ];
    for image in ["app:v2", "app:v3"] {
        cluster.set_image("once", image).await;
        let previous = hashes.last().cloned().unwrap_or_default();
        eventually(DEADLINE, &format!("the {image} revision"), || async {
            (cluster.status("once").await.current_pod_hash != previous).then_some(())
        })
        .await;
        let status = cluster.wait_healthy(DEADLINE, "once", 2).await;
        assert_eq!(
            status.stable_rs, status.current_pod_hash,
            "{image} released"
        );
        hashes.push(status.current_pod_hash);
    }
    let received = eventually(DEADLINE, "a message per revision released", || async {
        let received = receiver.accepted();
        (received.len() >= 2).then_some(received)
    })
    .await;
    // Both released; every step event of both was planned and handed over before each
    // Rollout was healthy, so nothing more is on its way.
    let bodies: Vec<String> = received.iter().map(|r| r.body.clone()).collect();
    assert_eq!(
        bodies,
        [hashes[1].clone(), hashes[2].clone()],
        "three steps each, one message per pod template hash"
    );
    let steps = cluster
        .warnings_or_events("once", "RolloutStepCompleted")
        .await;
    assert!(
        steps.len() >= 6,
        "every step of both revisions completed: {}",
        steps.len()
    );
}

#[tokio::test]
async fn an_unreachable_receiver_does_not_hold_up_a_release_or_other_receivers() {
    let cluster = Cluster::start("unreachable");
    let working = Receiver::start(&[], 200, "{}").await;
    // A port nobody listens on: each try is refused at once, then waits out the backoff.
    let closed = {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds loopback");
        listener.local_addr().expect("address").port()
    };
    cluster
        .configure(
            json!({
                "service.webhook.gone": format!("url: http://127.0.0.1:{closed}/\nretryMax: 5\nretryWaitMin: 10s\nretryWaitMax: 60s\n"),
                "service.webhook.working": format!("url: {}\n", working.url),
                "template.rollout-step-completed": "message: step\nwebhook:\n  gone:\n    method: POST\n    body: step\n  working:\n    method: POST\n    body: '{{ add .rollout.status.currentStepIndex 1}}'\n",
            }),
            json!({}),
        )
        .await;
    let controller = Controller::start(&cluster.kubeconfig, DEADLINE);
    let mut rollout = canary_rollout(
        "far",
        2,
        "app:v1",
        json!([{"setWeight": 50}, {"setWeight": 100}]),
    );
    rollout.metadata.annotations = Some(
        [
            "notifications.argoproj.io/subscribe.on-rollout-step-completed.gone",
            "notifications.argoproj.io/subscribe.on-rollout-step-completed.working",
        ]
        .into_iter()
        .map(|key| (key.to_string(), String::new()))
        .collect(),
    );
    cluster.create_rollout(rollout).await;
    let v1 = cluster
        .wait_healthy(DEADLINE, "far", 2)
        .await
        .current_pod_hash;
    let released_at = Instant::now();
    cluster.set_image("far", "app:v2").await;
    eventually(DEADLINE, "the v2 revision", || async {
        (cluster.status("far").await.current_pod_hash != v1).then_some(())
    })
    .await;
    let status = cluster.wait_healthy(DEADLINE, "far", 2).await;
    assert_eq!(status.stable_rs, status.current_pod_hash, "v2 released");
    eprintln!(
        "figure: two-step release with an unreachable receiver subscribed: {:?}",
        released_at.elapsed()
    );
    assert_eq!(
        sends(&controller, "gone", "failure").await,
        0,
        "released while the unreachable receiver's first message was still being retried \
         (its retries alone take over 2 minutes)"
    );
    let bodies = eventually(DEADLINE, "both steps at the working receiver", || async {
        let bodies: Vec<String> = working.accepted().iter().map(|r| r.body.clone()).collect();
        (bodies.len() >= 2).then_some(bodies)
    })
    .await;
    assert_eq!(bodies, ["1", "2"]);
}

#[tokio::test]
async fn with_self_service_a_rollouts_own_namespace_configures_its_notifications_too() {
    const CONTROLLER_NAMESPACE: &str = "rollouts-system";
    let cluster = Cluster::start("self-service");
    let central = Receiver::start(&[], 200, "{}").await;
    let team = Receiver::start(&[], 200, "{}").await;
    let aborted = |service: &str| {
        format!(
            "message: aborted\nwebhook:\n  {service}:\n    method: POST\n    body: '{service} {{{{.rollout.metadata.name}}}}'\n"
        )
    };
    cluster
        .configure_in(
            CONTROLLER_NAMESPACE,
            json!({
                "service.webhook.central": format!("url: {}\n", central.url),
                "template.rollout-aborted": aborted("central"),
            }),
            json!({}),
        )
        .await;
    // The team's own pair, in the Rollout's namespace: its service, template and Secret.
    cluster
        .configure_in(
            NAMESPACE,
            json!({
                "service.webhook.team": format!("url: {}\nheaders:\n- name: Authorization\n  value: Bearer $team-token\n", team.url),
                "template.rollout-aborted": aborted("team"),
            }),
            json!({"team-token": "t3am"}),
        )
        .await;
    let _controller = Controller::start_with_args(
        &cluster.kubeconfig,
        DEADLINE,
        ControllerLog::Json,
        &[
            "--notifications-namespace",
            CONTROLLER_NAMESPACE,
            "--self-service-notification-enabled",
        ],
    );
    cluster
        .paused_canary(
            "team-app",
            json!({
                "notifications.argoproj.io/subscribe.on-rollout-aborted.central": "",
                "notifications.argoproj.io/subscribe.on-rollout-aborted.team": "",
            }),
        )
        .await;
    cluster.abort("team-app").await;
    let to_team = eventually(DEADLINE, "the abort at the team's receiver", || async {
        team.accepted().first().cloned()
    })
    .await;
    assert_eq!(to_team.body, "team team-app");
    assert_eq!(to_team.header("authorization"), Some("Bearer t3am"));
    let to_central = eventually(DEADLINE, "the abort at the central receiver", || async {
        central.accepted().first().cloned()
    })
    .await;
    assert_eq!(to_central.body, "central team-app");
    let recorded = eventually(DEADLINE, "both sends recorded", || async {
        let notified = cluster.notified("team-app").await;
        (notified.len() == 2).then_some(notified)
    })
    .await;
    let mut shapes: Vec<String> = recorded
        .keys()
        .map(|key| {
            key.split_once(':')
                .map(|(_, rest)| rest.to_string())
                .unwrap_or_default()
        })
        .collect();
    shapes.sort();
    assert_eq!(
        shapes,
        [
            format!("{NAMESPACE}:on-rollout-aborted:[0].2jmj7l5rSw0yVb_vlWAYkK_YBwk:team:"),
            "on-rollout-aborted:[0].2jmj7l5rSw0yVb_vlWAYkK_YBwk:central:".to_string(),
        ],
        "a self-service send is keyed by its configuration's namespace, as Argo's engine keys it"
    );
    assert_eq!(team.accepted().len(), 1);
    assert_eq!(central.accepted().len(), 1);
}

#[tokio::test]
async fn without_self_service_a_rollouts_own_namespace_configures_nothing() {
    const CONTROLLER_NAMESPACE: &str = "rollouts-system";
    let cluster = Cluster::start("no-self-service");
    let central = Receiver::start(&[], 200, "{}").await;
    let team = Receiver::start(&[], 200, "{}").await;
    cluster
        .configure_in(
            CONTROLLER_NAMESPACE,
            json!({"service.webhook.central": format!("url: {}\n", central.url)}),
            json!({}),
        )
        .await;
    cluster
        .configure_in(
            NAMESPACE,
            json!({"service.webhook.team": format!("url: {}\n", team.url)}),
            json!({}),
        )
        .await;
    let _controller = Controller::start_with_args(
        &cluster.kubeconfig,
        DEADLINE,
        ControllerLog::Json,
        &["--notifications-namespace", CONTROLLER_NAMESPACE],
    );
    cluster
        .paused_canary(
            "plain",
            json!({
                "notifications.argoproj.io/subscribe.on-rollout-aborted.central": "",
                "notifications.argoproj.io/subscribe.on-rollout-aborted.team": "",
            }),
        )
        .await;
    cluster.abort("plain").await;
    eventually(DEADLINE, "the abort at the central receiver", || async {
        central.accepted().first().cloned()
    })
    .await;
    eventually(DEADLINE, "the central send recorded", || async {
        (cluster.notified("plain").await.len() == 1).then_some(())
    })
    .await;
    assert!(
        team.received().is_empty(),
        "the Rollout's namespace's ConfigMap is not read without the flag"
    );
}

#[tokio::test]
async fn a_trigger_and_its_template_see_the_analysis_runs_of_the_aborted_revision() {
    let cluster = Cluster::start("analysis-runs");
    let receiver = Receiver::start(&[], 200, "{}").await;
    // A web metric that fails its first measurement.
    let metric = Receiver::start(&[], 200, r#"{"value": 1}"#).await;
    cluster
        .create_template(json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "AnalysisTemplate",
            "metadata": {"name": "never-good", "namespace": NAMESPACE},
            "spec": {"metrics": [{
                "name": "value",
                "count": 1,
                "successCondition": "result > 1",
                "provider": {"web": {"url": format!("{}/metric", metric.url), "jsonPath": "{$.value}"}}
            }]}
        }))
        .await;
    cluster
        .configure(
            json!({
                "service.webhook.ops": format!("url: {}\n", receiver.url),
                "trigger.on-rollout-aborted": "- when: len(analysisRuns) > 0 && analysisRuns[0].status.phase == 'Failed'\n  send: [aborted-by-analysis]\n",
                "template.aborted-by-analysis": "message: aborted\nwebhook:\n  ops:\n    method: POST\n    body: '{{range .analysisRuns}}{{.metadata.name}}={{.status.phase}};{{end}}'\n",
            }),
            json!({}),
        )
        .await;
    let _controller = Controller::start(&cluster.kubeconfig, DEADLINE);
    let mut rollout = canary_rollout(
        "judged",
        2,
        "app:v1",
        json!([{"setWeight": 50}, {"analysis": {"templates": [{"templateName": "never-good"}]}}]),
    );
    rollout.metadata.annotations = Some(
        [(
            "notifications.argoproj.io/subscribe.on-rollout-aborted.ops".to_string(),
            String::new(),
        )]
        .into_iter()
        .collect(),
    );
    cluster.create_rollout(rollout).await;
    cluster.wait_healthy(DEADLINE, "judged", 2).await;
    cluster.set_image("judged", "app:v2").await;
    let message = eventually(DEADLINE, "the abort, with its failed run", || async {
        receiver.accepted().first().cloned()
    })
    .await;
    let status = cluster.status("judged").await;
    assert!(status.abort, "aborted by the failed analysis");
    let runs: Vec<&str> = message.body.split_terminator(';').collect();
    assert_eq!(
        runs.len(),
        1,
        "the current revision's one run: {}",
        message.body
    );
    let (name, phase) = runs[0].split_once('=').expect("name=phase");
    assert!(
        name.starts_with(&format!("judged-{}-", status.current_pod_hash)),
        "{name}"
    );
    assert_eq!(phase, "Failed");
}

/// A restarted controller plans its first events before it has read the notification
/// configuration (it reads it once its controllers run): they are held for it, not lost.
#[tokio::test]
async fn events_planned_before_the_configuration_is_read_are_sent_once_it_is() {
    let cluster = Cluster::start("early");
    let receiver = Receiver::start(&[], 200, "{}").await;
    cluster
        .configure(
            json!({
                "service.webhook.ops": format!("url: {}\n", receiver.url),
                "template.rollout-updated": "webhook:\n  ops:\n    method: POST\n    body: '{\"revision\": \"{{index .rollout.metadata.annotations \"rollout.argoproj.io/revision\"}}\"}'\n",
            }),
            json!({}),
        )
        .await;
    // The Rollout is there before the controller: its first pass plans RolloutUpdated
    // (revision 1) at once.
    let mut rollout = canary_rollout("early", 1, "app:v1", json!([{"setWeight": 50}]));
    rollout.metadata.annotations = Some(
        serde_json::from_value(
            json!({"notifications.argoproj.io/subscribe.on-rollout-updated.ops": ""}),
        )
        .expect("annotations"),
    );
    cluster.create_rollout(rollout).await;
    // The notification ConfigMap cannot be read until the Rollout has been reconciled.
    let mut faults = cluster.sim.faults();
    faults.holds.push(rollouts_e2e::sim::faults::Hold {
        group: String::new(),
        resource: "configmaps".into(),
        delay: None,
    });
    cluster.sim.set_faults(faults.clone());
    let controller = Controller::start(&cluster.kubeconfig, DEADLINE);
    cluster.wait_healthy(DEADLINE, "early", 1).await;
    assert!(receiver.received().is_empty(), "nothing configured yet");
    faults.holds.clear();
    cluster.sim.set_faults(faults);
    let message = eventually(DEADLINE, "the first revision's message", || async {
        receiver.accepted().first().cloned()
    })
    .await;
    assert_eq!(message.body, r#"{"revision": "1"}"#);
    // Recorded as sent, so once: a second pass (or a restart) does not send it again.
    eventually(DEADLINE, "the send recorded", || async {
        (!cluster.notified("early").await.is_empty()).then_some(())
    })
    .await;
    assert_eq!(receiver.accepted().len(), 1, "{:?}", receiver.received());
    drop(controller);
}
