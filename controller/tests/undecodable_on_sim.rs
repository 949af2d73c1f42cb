//! Objects that do not fit the controller's types, against kube-sim (in-process) and the real
//! `rollouts-controller` binary. A Rollout with `spec.replicas: 3000000000` and one with a pod
//! template annotation nested 140 levels deep each get the `InvalidSpec` condition and one
//! Warning event naming the field, written once (not again after a relist or after our own
//! status write), while a control Rollout beside them rolls out and becomes Healthy; fixed, the
//! bad one rolls out too. An AnalysisRun with a web `jsonBody` nested 140 levels deep gets the
//! Error phase naming the field while a control run beside it is measured. A Rollout broken in
//! the middle of a canary keeps its step and its ReplicaSets, and goes on from there once fixed.
//! An AnalysisTemplate that does not decode fails its Rollout's reconcile naming the field.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use rollouts_crds::analysis::{AnalysisPhase, AnalysisRun};
use rollouts_crds::rollout::RolloutStatus;
use rollouts_e2e::fake_prometheus::FakePrometheus;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use support::{Controller, NAMESPACE, Sim, canary_rollout, eventually};

const DEADLINE: Duration = Duration::from_secs(60);
/// The prefix of this file's temp dirs.
const TEMP_PREFIX: &str = "rollouts-undecodable-on-sim";
/// Deeper than serde_json's default limit of 128, far below an API server's 10,000.
const DEEP: usize = 140;

/// `{"a": {"a": ... "bottom"}}`, `depth` objects deep.
fn nested(depth: usize) -> Value {
    let mut value = json!("bottom");
    for _ in 0..depth {
        value = json!({ "a": value });
    }
    value
}

/// A canary Rollout with no steps, as JSON, so fields can hold what our types cannot.
fn rollout_manifest(name: &str, replicas: Value, template_annotations: Value) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": template_annotations},
                "spec": {"containers": [{"name": "app", "image": "app:v1"}]}
            },
            "strategy": {"canary": {"steps": []}}
        }
    })
}

fn collection_path(plural: &str) -> String {
    format!("/apis/argoproj.io/v1alpha1/namespaces/{NAMESPACE}/{plural}")
}

/// Creates `manifest` with a plain POST: a typed client could neither encode nor decode it.
async fn create_raw(client: &Client, plural: &str, manifest: &Value) {
    let body = serde_json::to_vec(manifest).expect("encodes the manifest");
    let request = hyper::Request::post(collection_path(plural))
        .header("content-type", "application/json")
        .body(body)
        .expect("a request");
    client
        .request_text(request)
        .await
        .unwrap_or_else(|error| panic!("creates {plural} from {manifest:.200}: {error}"));
}

/// The `status` of an object read with a plain GET, taken out raw: the whole object may be too
/// deep for serde_json's default limit.
async fn raw_status<T: DeserializeOwned + Default>(client: &Client, plural: &str, name: &str) -> T {
    let request = hyper::Request::get(format!("{}/{name}", collection_path(plural)))
        .body(Vec::new())
        .expect("a request");
    let text = client
        .request_text(request)
        .await
        .unwrap_or_else(|error| panic!("reads {plural}/{name}: {error}"));
    let object: BTreeMap<String, Box<RawValue>> =
        serde_json::from_str(&text).expect("an object, taken raw");
    object
        .get("status")
        .map(|status| serde_json::from_str(status.get()).expect("status decodes"))
        .unwrap_or_default()
}

/// The notes of the Warning events regarding `name`.
async fn warnings(client: &Client, name: &str) -> Vec<String> {
    Api::<Event>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await
        .expect("lists events")
        .items
        .into_iter()
        .filter(|event| {
            event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && event.type_.as_deref() == Some("Warning")
        })
        .map(|event| event.note.unwrap_or_default())
        .collect()
}

/// Status writes to `plural/name`, as kube-sim saw them.
fn status_writes(cluster: &Sim, plural: &str, name: &str) -> usize {
    cluster
        .sim
        .requests()
        .iter()
        .filter(|r| {
            r.resource == plural
                && r.subresource == "status"
                && r.name == name
                && matches!(r.verb.as_str(), "patch" | "update")
        })
        .count()
}

/// The controller's log lines saying it cannot decode `default/name`.
fn decode_logs(controller: &Controller, name: &str) -> usize {
    let object = format!("{NAMESPACE}/{name}");
    controller
        .logs()
        .lock()
        .expect("logs")
        .iter()
        .filter(|line| {
            line["object"] == object.as_str()
                && line["message"]
                    .as_str()
                    .is_some_and(|message| message.starts_with("cannot decode the object"))
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_rollouts_are_reported_once_and_the_others_roll_out() {
    let cluster = Sim::start_named(TEMP_PREFIX, "rollouts");
    let client = &cluster.client;
    // Listed first, so the controller's very first list holds both.
    create_raw(
        client,
        "rollouts",
        &rollout_manifest("huge", json!(3_000_000_000u64), json!({})),
    )
    .await;
    create_raw(
        client,
        "rollouts",
        &rollout_manifest("deep", json!(1), json!({ "deep": nested(DEEP) })),
    )
    .await;
    cluster
        .create_rollout(canary_rollout("control", 2, "app:v1", json!([])))
        .await;
    let controller = Controller::start(&cluster.kubeconfig, DEADLINE);

    let first = cluster.wait_healthy(DEADLINE, "control", 2).await;
    let bad = [
        ("huge", "spec.replicas"),
        ("deep", "spec.template.metadata.annotations.deep.a.a"),
    ];
    for (name, field) in bad {
        let status: RolloutStatus =
            eventually(DEADLINE, &format!("{name} InvalidSpec"), || async {
                let status: RolloutStatus = raw_status(client, "rollouts", name).await;
                status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "InvalidSpec")
                    .then_some(status)
            })
            .await;
        let condition = status
            .conditions
            .iter()
            .find(|c| c.type_ == "InvalidSpec")
            .expect("the condition");
        assert!(
            condition.message.contains(field) && condition.message.contains("cannot be decoded"),
            "{name}: {}",
            condition.message
        );
        assert_eq!(status.phase, "Degraded", "{name}: {status:?}");
        assert_eq!(status.observed_generation, "1", "{name}: {status:?}");
        let events = eventually(DEADLINE, &format!("a Warning event on {name}"), || async {
            let notes = warnings(client, name).await;
            (!notes.is_empty()).then_some(notes)
        })
        .await;
        assert!(events[0].contains(field), "{name}: {events:?}");
    }

    // A relist, and a new revision of the control Rollout rolled out after it: by then the
    // controller has seen the bad Rollouts again, and wrote and logged nothing new for them.
    cluster.sim.expire_watches();
    cluster.set_image("control", "app:v2").await;
    eventually(DEADLINE, "control Healthy on app:v2", || async {
        let status = cluster.status("control").await;
        let done = status.phase == "Healthy"
            && status.current_pod_hash != first.current_pod_hash
            && status.stable_rs == status.current_pod_hash
            && status.available_replicas == 2;
        done.then_some(())
    })
    .await;
    for (name, _) in bad {
        assert_eq!(
            status_writes(&cluster, "rollouts", name),
            1,
            "{name}: one status write"
        );
        assert_eq!(warnings(client, name).await.len(), 1, "{name}: one event");
        assert_eq!(decode_logs(&controller, name), 1, "{name}: logged once");
    }

    // Fixed, it is a Rollout like any other.
    cluster
        .rollouts()
        .patch(
            "huge",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .expect("fixes spec.replicas");
    let fixed = cluster.wait_healthy(DEADLINE, "huge", 1).await;
    assert!(
        fixed.conditions.iter().all(|c| c.type_ != "InvalidSpec"),
        "{fixed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_analysis_run_errors_and_the_others_are_measured() {
    let cluster = Sim::start_named(TEMP_PREFIX, "analysis-runs");
    let client = &cluster.client;
    let prometheus = FakePrometheus::start().await;
    prometheus.values("control_query", &["1"]);
    create_raw(
        client,
        "analysisruns",
        &json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "AnalysisRun",
            "metadata": {"name": "deep", "namespace": NAMESPACE},
            "spec": {"metrics": [{
                "name": "web",
                "successCondition": "result == 1",
                "provider": {"web": {"url": "http://127.0.0.1:9/", "method": "POST", "jsonBody": nested(DEEP)}}
            }]}
        }),
    )
    .await;
    let control: AnalysisRun = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AnalysisRun",
        "metadata": {"name": "control", "namespace": NAMESPACE},
        "spec": {"metrics": [{
            "name": "up",
            "successCondition": "result[0] == 1",
            "provider": {"prometheus": {"address": prometheus.address, "query": "control_query"}}
        }]}
    }))
    .expect("an AnalysisRun");
    let runs: Api<AnalysisRun> = Api::namespaced(client.clone(), NAMESPACE);
    runs.create(&PostParams::default(), &control)
        .await
        .expect("creates the control run");
    let _controller = Controller::start(&cluster.kubeconfig, DEADLINE);

    eventually(DEADLINE, "the control run Successful", || async {
        let run = runs.get("control").await.expect("reads the control run");
        let phase = run.status.map(|status| status.phase);
        (phase == Some(AnalysisPhase::Successful)).then_some(())
    })
    .await;
    let field = "spec.metrics[0].provider.web.jsonBody.a.a";
    let status: Value = eventually(DEADLINE, "the deep run in Error", || async {
        let status: Value = raw_status(client, "analysisruns", "deep").await;
        (status["phase"] == "Error").then_some(status)
    })
    .await;
    let message = status["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(field) && message.contains("128 levels deep"),
        "{message}"
    );
    let events = eventually(DEADLINE, "a Warning event on the deep run", || async {
        let notes = warnings(client, "deep").await;
        (!notes.is_empty()).then_some(notes)
    })
    .await;
    assert!(events[0].contains(field), "{events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_broken_mid_canary_keeps_its_place_and_goes_on_once_fixed() {
    let cluster = Sim::start_named(TEMP_PREFIX, "mid-canary");
    let client = &cluster.client;
    let steps = json!([{"setWeight": 50}, {"pause": {}}]);
    cluster
        .create_rollout(canary_rollout("web", 2, "app:v1", steps))
        .await;
    let _controller = Controller::start(&cluster.kubeconfig, DEADLINE);
    cluster.wait_healthy(DEADLINE, "web", 2).await;
    cluster.set_image("web", "app:v2").await;
    let replica_sets = eventually(DEADLINE, "web paused at step 1, pods up", || async {
        let status = cluster.status("web").await;
        let paused = status.current_step_index == Some(1) && !status.pause_conditions.is_empty();
        let replica_sets = cluster.replica_sets("web").await;
        let up = replica_sets.len() == 2
            && replica_sets
                .values()
                .all(|(replicas, available)| replicas == available);
        (paused && up).then_some(replica_sets)
    })
    .await;

    // Broken by hand, with a new image beside it that, acted on, would make a third ReplicaSet.
    let broken = json!({"spec": {"replicas": 3_000_000_000u64, "template": {"spec": {"containers": [{"name": "app", "image": "app:v3"}]}}}});
    let request = hyper::Request::patch(format!("{}/web", collection_path("rollouts")))
        .header("content-type", "application/merge-patch+json")
        .body(serde_json::to_vec(&broken).expect("encodes the patch"))
        .expect("a request");
    client
        .request_text(request)
        .await
        .expect("breaks spec.replicas");
    let reported: RolloutStatus = eventually(DEADLINE, "web InvalidSpec", || async {
        let status: RolloutStatus = raw_status(client, "rollouts", "web").await;
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "InvalidSpec" && c.message.contains("spec.replicas"))
            .then_some(status)
    })
    .await;
    assert_eq!(reported.current_step_index, Some(1), "{reported:?}");
    assert_eq!(reported.observed_generation, "3", "{reported:?}");
    assert_eq!(cluster.replica_sets("web").await, replica_sets);

    // Fixed back to the revision it was rolling out: still paused at step 1, nothing new.
    cluster
        .rollouts()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "app", "image": "app:v2"}]}}}})),
        )
        .await
        .expect("fixes spec.replicas");
    let fixed = eventually(DEADLINE, "web valid again", || async {
        let status = cluster.status("web").await;
        let valid = status.observed_generation == "4"
            && status.conditions.iter().all(|c| c.type_ != "InvalidSpec");
        valid.then_some(status)
    })
    .await;
    assert_eq!(fixed.current_step_index, Some(1), "{fixed:?}");
    assert!(!fixed.pause_conditions.is_empty(), "{fixed:?}");
    assert_eq!(cluster.replica_sets("web").await, replica_sets);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_template_is_named_with_its_field() {
    let cluster = Sim::start_named(TEMP_PREFIX, "template");
    create_raw(
        &cluster.client,
        "analysistemplates",
        &json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "AnalysisTemplate",
            "metadata": {"name": "broken", "namespace": NAMESPACE},
            "spec": {"metrics": [{
                "name": "up",
                "count": 3_000_000_000u64,
                "successCondition": "result[0] == 1",
                "provider": {"prometheus": {"address": "http://127.0.0.1:9", "query": "up"}}
            }]}
        }),
    )
    .await;
    let steps = json!([{"analysis": {"templates": [{"templateName": "broken"}]}}]);
    cluster
        .create_rollout(canary_rollout("web", 1, "app:v1", steps))
        .await;
    let controller = Controller::start(&cluster.kubeconfig, DEADLINE);
    cluster.wait_healthy(DEADLINE, "web", 1).await;
    cluster.set_image("web", "app:v2").await;

    let error = eventually(DEADLINE, "the reconcile error naming the field", || async {
        controller
            .logs()
            .lock()
            .expect("logs")
            .iter()
            .filter_map(|line| line["error"].as_str())
            .find(|error| error.contains("AnalysisTemplate default/broken"))
            .map(str::to_string)
    })
    .await;
    assert!(
        error.contains("spec.metrics[0].count")
            && error.contains("fix: use a whole number from -2147483648 to 2147483647"),
        "{error}"
    );
}
