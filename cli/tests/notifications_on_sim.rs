//! `kubectl rollouts notifications` through the real `kubectl` against an in-process kube-sim:
//! Argo's ConfigMap and Secret in the namespace, a live Rollout, the templates and triggers
//! printed, a template previewed against the Rollout, a test message sent to a loopback webhook
//! (with the Secret's token in its header), and a trigger evaluated against the Rollout.

mod support;

use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use support::{NAMESPACE, World, eventually, web_rollout};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// What a loopback webhook received: each request's head and body.
type Requests = Arc<Mutex<Vec<(String, String)>>>;

/// A loopback webhook answering 200 to every request; keeps each one.
async fn webhook() -> (String, Requests) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds loopback");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let requests: Requests = Arc::new(Mutex::new(Vec::new()));
    let kept = requests.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut bytes = Vec::new();
            let mut buffer = [0u8; 4096];
            let (head, body) = loop {
                match stream.read(&mut buffer).await {
                    Ok(0) | Err(_) => break (String::new(), String::new()),
                    Ok(n) => bytes.extend_from_slice(&buffer[..n]),
                }
                let text = String::from_utf8_lossy(&bytes).into_owned();
                let Some((head, body)) = text.split_once("\r\n\r\n") else {
                    continue;
                };
                let length: usize = head
                    .lines()
                    .find_map(|line| {
                        let (name, value) = line.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                if body.len() >= length {
                    break (head.to_string(), body.to_string());
                }
            };
            kept.lock().expect("requests").push((head, body));
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
                .await;
        }
    });
    (url, requests)
}

/// Creates the notification ConfigMap with `data`.
async fn create_configmap(world: &World, data: Value) {
    let configmap: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "argo-rollouts-notification-configmap", "namespace": NAMESPACE},
        "data": data,
    }))
    .expect("a ConfigMap");
    Api::<ConfigMap>::namespaced(world.client.clone(), NAMESPACE)
        .create(&PostParams::default(), &configmap)
        .await
        .expect("creates the ConfigMap");
}

/// Creates the Rollout `web`: `rollout` as [`web_rollout`] gives it.
async fn create_rollout(world: &World, rollout: &Value) {
    world
        .create_raw(
            &format!("/apis/argoproj.io/v1alpha1/namespaces/{NAMESPACE}/rollouts"),
            rollout,
        )
        .await;
}

async fn configure(world: &World, webhook_url: &str) {
    create_configmap(
        world,
        json!({
            "service.webhook.ops": format!("url: {webhook_url}\nheaders:\n- name: Authorization\n  value: Bearer $ops-token\n"),
            "template.rollout-aborted": "message: Rollout {{.rollout.metadata.name}} has been aborted.\nwebhook:\n  ops:\n    method: POST\n    path: /hooks/{{.rollout.metadata.namespace}}\n    body: '{\"text\": \"{{.rollout.metadata.name}} aborted\", \"to\": \"{{.recipient}}\"}'\n",
            "trigger.on-purple": "- when: rollout.spec.template.spec.containers[0].image == 'argoproj/rollouts-demo:purple'\n  send: [rollout-aborted]\n",
        }),
    )
    .await;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "argo-rollouts-notification-secret", "namespace": NAMESPACE},
        "stringData": {"ops-token": "t0ken"}
    }))
    .expect("a Secret");
    Api::<Secret>::namespaced(world.client.clone(), NAMESPACE)
        .create(&PostParams::default(), &secret)
        .await
        .expect("creates the Secret");
    let purple = web_rollout(
        "web",
        "argoproj/rollouts-demo:purple",
        json!([{"setWeight": 50}]),
    );
    create_rollout(world, &purple).await;
}

/// Runs `kubectl rollouts ARGS` off the runtime (the webhook answers on it meanwhile).
async fn kubectl_rollouts_output(world: &World, args: &[&str]) -> std::process::Output {
    let mut command = world.kubectl_rollouts(args);
    tokio::task::spawn_blocking(move || command.output().expect("kubectl runs"))
        .await
        .expect("joins")
}

/// [`kubectl_rollouts_output`]'s stdout, after checking it succeeded.
async fn kubectl_rollouts(world: &World, args: &[&str]) -> String {
    let out = kubectl_rollouts_output(world, args).await;
    assert!(
        out.status.success(),
        "kubectl rollouts {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn templates_and_triggers_are_printed_previewed_sent_and_run_against_a_live_rollout() {
    let world = World::start("notifications", "live");
    let (url, requests) = webhook().await;
    configure(&world, &url).await;

    let templates = kubectl_rollouts(&world, &["notifications", "template", "get"]).await;
    assert!(
        templates
            .lines()
            .next()
            .is_some_and(|l| l.starts_with("NAME")),
        "{templates}"
    );
    assert!(
        templates.lines().any(|l| l.starts_with("rollout-aborted")
            && l.ends_with("Rollout {{.rollout.metadata.name}} has been aborted.")),
        "the ConfigMap's template: {templates}"
    );
    assert!(
        templates.lines().any(|l| l.starts_with("rollout-paused")),
        "a built-in template: {templates}"
    );

    // Preview: rendered against the live Rollout, printed as Argo's console service prints it.
    let preview = kubectl_rollouts(
        &world,
        &[
            "notifications",
            "template",
            "notify",
            "rollout-aborted",
            "web",
        ],
    )
    .await;
    let printed: Value = serde_saphyr::from_str(&preview).expect("YAML");
    assert_eq!(printed["message"], "Rollout web has been aborted.");
    assert_eq!(printed["webhook"]["ops"]["path"], "/hooks/default");
    assert!(
        requests.lock().expect("requests").is_empty(),
        "nothing sent"
    );

    // A test message to the webhook, with the Secret's token.
    let sent = kubectl_rollouts(
        &world,
        &[
            "notifications",
            "template",
            "notify",
            "rollout-aborted",
            "web",
            "--recipient",
            "ops",
        ],
    )
    .await;
    assert_eq!(sent.trim(), "notification sent to ops");
    let (head, body) = eventually("the test message at the webhook", async || {
        requests.lock().expect("requests").first().cloned()
    })
    .await;
    assert!(head.starts_with("POST /hooks/default "), "{head}");
    assert!(
        head.lines()
            .any(|l| l.eq_ignore_ascii_case("authorization: Bearer t0ken")),
        "{head}"
    );
    let body: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(body, json!({"text": "web aborted", "to": ""}));

    let triggers =
        kubectl_rollouts(&world, &["notifications", "trigger", "get", "on-purple"]).await;
    assert!(
        triggers
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("on-purple")
                && l.contains("rollout-aborted")
                && l.ends_with("== 'argoproj/rollouts-demo:purple'")),
        "{triggers}"
    );
    let run = kubectl_rollouts(
        &world,
        &["notifications", "trigger", "run", "on-purple", "web"],
    )
    .await;
    assert!(
        run.lines().nth(1).is_some_and(|l| l.ends_with("  true")),
        "the purple image matches: {run}"
    );

    // An unknown trigger is named, with the ones there are.
    let out = kubectl_rollouts_output(
        &world,
        &["notifications", "trigger", "run", "on-nothing", "web"],
    )
    .await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("on-nothing") && stderr.contains("on-purple"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_template_sees_the_analysis_runs_of_the_rollouts_current_revision() {
    let world = World::start("notifications", "runs");
    create_configmap(
        &world,
        json!({
            "template.runs": "message: '{{range .analysisRuns}}{{.metadata.name}};{{end}}'\n",
            "trigger.on-current-run": "- when: len(analysisRuns) == 1 && analysisRuns[0].metadata.name == 'web-6f8b9c-2-0'\n  send: [runs]\n",
        }),
    )
    .await;
    let mut rollout = web_rollout("web", "web:2", json!([{"setWeight": 50}]));
    rollout["metadata"]["annotations"] = json!({"rollout.argoproj.io/revision": "2"});
    create_rollout(&world, &rollout).await;
    world
        .patch_status("web", json!({"currentPodHash": "6f8b9c"}))
        .await;
    // Only the run of the current hash and revision is the template's, as in Argo.
    for (name, hash, revision) in [
        ("web-6f8b9c-2-0", "6f8b9c", "2"),
        ("web-6f8b9c-1-0", "6f8b9c", "1"),
        ("web-5d4c3b-2-0", "5d4c3b", "2"),
    ] {
        world
            .create_raw(
                &format!("/apis/argoproj.io/v1alpha1/namespaces/{NAMESPACE}/analysisruns"),
                &json!({
                    "apiVersion": "argoproj.io/v1alpha1",
                    "kind": "AnalysisRun",
                    "metadata": {
                        "name": name,
                        "namespace": NAMESPACE,
                        "labels": {"rollouts-pod-template-hash": hash},
                        "annotations": {"rollout.argoproj.io/revision": revision}
                    },
                    "spec": {"metrics": [{"name": "m", "provider": {"job": {"spec": {"template": {"spec": {"containers": []}}}}}}]}
                }),
            )
            .await;
    }
    let printed = kubectl_rollouts(
        &world,
        &[
            "notifications",
            "template",
            "notify",
            "runs",
            "web",
            "--secret",
            ":empty",
        ],
    )
    .await;
    let printed: Value = serde_saphyr::from_str(&printed).expect("YAML");
    assert_eq!(printed["message"], "web-6f8b9c-2-0;");
    // A trigger's condition sees them too.
    let run = kubectl_rollouts(
        &world,
        &[
            "notifications",
            "trigger",
            "run",
            "on-current-run",
            "web",
            "--secret",
            ":empty",
        ],
    )
    .await;
    assert!(
        run.lines().nth(1).is_some_and(|l| l.ends_with("  true")),
        "{run}"
    );
}
