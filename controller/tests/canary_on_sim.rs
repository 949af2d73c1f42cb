//! The real `rollouts-controller` binary against kube-sim (in-process, CRDs from crds/yaml):
//! a canary's steps with promote, abort and retry, a new image mid-rollout, a controller killed
//! mid-rollout, the progress deadline, an invalid spec, no writes at rest, and step analysis
//! (the test plays the AnalysisRun controller by setting the run's phase). Each test has its
//! own simulator and controller, so they run in parallel.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use rollouts_crds::analysis::AnalysisRun;
use rollouts_crds::rollout::RolloutStatus;
use rollouts_e2e::sim::RequestRecord;
use serde_json::{Value, json};
use support::{Controller, NAMESPACE, Sim, canary_rollout as rollout, eventually};

const DEADLINE: Duration = Duration::from_secs(30);
/// The prefix of the controller's `User-Agent`, which tells its requests from the test's.
const CONTROLLER_AGENT: &str = "rollouts-controller/";

/// The shared simulator; this file adds its canary reads and waits.
type Cluster = Sim;

impl Cluster {
    fn start(name: &str) -> Self {
        Self::start_named("rollouts-canary-on-sim", name)
    }

    fn controller(&self) -> Controller {
        Controller::start(&self.kubeconfig, DEADLINE)
    }

    /// Waits until the Rollout is Healthy on its current revision with every pod available;
    /// returns that revision's hash.
    async fn healthy(&self, name: &str, replicas: i32) -> String {
        self.wait_healthy(DEADLINE, name, replicas)
            .await
            .current_pod_hash
    }

    /// Waits for a paused step at `index` with the ReplicaSets at `sizes` (hash -> replicas,
    /// all available).
    async fn paused_at(&self, name: &str, index: i32, sizes: &[(&str, i32)]) -> RolloutStatus {
        let want: BTreeMap<String, (i32, i32)> = sizes
            .iter()
            .map(|(hash, n)| (format!("{name}-{hash}"), (*n, *n)))
            .collect();
        eventually(
            DEADLINE,
            &format!("{name} paused at step {index} with {want:?}"),
            || async {
                let status = self.status(name).await;
                let paused =
                    status.current_step_index == Some(index) && !status.pause_conditions.is_empty();
                (paused && self.replica_sets(name).await == want).then_some(status)
            },
        )
        .await
    }

    /// Waits until Service `name` selects the pods of revision `hash`.
    async fn selects(&self, name: &str, hash: &str) {
        let services: Api<Service> = Api::namespaced(self.client.clone(), NAMESPACE);
        eventually(
            DEADLINE,
            &format!("Service {name} selecting {hash}"),
            || async {
                let service = services.get(name).await.ok()?;
                let selector = service.spec?.selector?;
                (selector
                    .get("rollouts-pod-template-hash")
                    .map(String::as_str)
                    == Some(hash)
                    && selector.contains_key("app"))
                .then_some(())
            },
        )
        .await;
    }

    /// Writes (create, update, patch, delete) the controller made, leases and events aside.
    fn controller_writes(&self) -> Vec<RequestRecord> {
        self.sim
            .requests()
            .into_iter()
            .filter(|r| r.user_agent.starts_with(CONTROLLER_AGENT))
            .filter(|r| matches!(r.verb.as_str(), "create" | "update" | "patch" | "delete"))
            .filter(|r| r.resource != "events" && r.resource != "leases")
            .collect()
    }
}

#[tokio::test]
async fn a_four_step_canary_moves_from_v1_to_v2_with_a_promote() {
    let cluster = Cluster::start("steps");
    let _controller = cluster.controller();
    let steps =
        json!([{"setWeight": 25}, {"pause": {}}, {"setWeight": 50}, {"pause": {"duration": "2s"}}]);
    cluster
        .create_rollout(rollout("web", 4, "app:v1", steps))
        .await;
    let v1 = cluster.healthy("web", 4).await;
    assert_eq!(
        cluster.replica_sets("web").await,
        BTreeMap::from([(format!("web-{v1}"), (4, 4))])
    );

    let before = cluster.controller_writes().len();
    cluster.set_image("web", "app:v2").await;
    let status = eventually(DEADLINE, "the v2 hash", || async {
        let status = cluster.status("web").await;
        (status.current_pod_hash != v1).then_some(status)
    })
    .await;
    let v2 = status.current_pod_hash;
    // setWeight 25 of 4 pods: one canary, three stable; then the pause holds it.
    let paused = cluster.paused_at("web", 1, &[(&v1, 3), (&v2, 1)]).await;
    assert_eq!(paused.stable_rs, v1);
    assert_eq!(paused.phase, "Paused");

    cluster
        .patch_status("web", json!({"pauseConditions": null}))
        .await;
    // setWeight 50, then the timed pause: two and two until it expires.
    cluster.paused_at("web", 3, &[(&v1, 2), (&v2, 2)]).await;
    let done = cluster.healthy("web", 4).await;
    assert_eq!(done, v2);
    let status = cluster.status("web").await;
    assert_eq!(status.stable_rs, status.current_pod_hash);
    assert_eq!(status.current_step_index, Some(4));
    assert!(status.pause_conditions.is_empty());
    assert_eq!(
        cluster.replica_sets("web").await,
        BTreeMap::from([(format!("web-{v1}"), (0, 0)), (format!("web-{v2}"), (4, 4))])
    );
    let writes = &cluster.controller_writes()[before..];
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for write in writes {
        let kind = format!("{} {}/{}", write.verb, write.resource, write.subresource);
        *by_kind.entry(kind).or_default() += 1;
    }
    // A figure, not an assertion: the minimum is one scale and one status patch per step.
    eprintln!(
        "API writes by the controller from v1 to v2: {} over 4 steps ({:.1} per step): {by_kind:?}",
        writes.len(),
        writes.len() as f64 / 4.0
    );
}

#[tokio::test]
async fn abort_returns_to_stable_and_retry_resumes() {
    let cluster = Cluster::start("abort");
    let _controller = cluster.controller();
    for service in ["shop-stable", "shop-canary"] {
        cluster.create_service(service, "shop").await;
    }
    let steps = json!([{"setWeight": 50}, {"pause": {}}]);
    let mut shop = rollout("shop", 4, "app:v1", steps);
    if let Some(canary) = shop.spec.strategy.canary.as_mut() {
        canary.stable_service = Some("shop-stable".into());
        canary.canary_service = Some("shop-canary".into());
    }
    cluster.create_rollout(shop).await;
    let v1 = cluster.healthy("shop", 4).await;
    cluster.selects("shop-stable", &v1).await;
    cluster.set_image("shop", "app:v2").await;
    let v2 = eventually(DEADLINE, "the v2 hash", || async {
        let hash = cluster.status("shop").await.current_pod_hash;
        (hash != v1).then_some(hash)
    })
    .await;
    cluster.paused_at("shop", 1, &[(&v1, 2), (&v2, 2)]).await;
    cluster.selects("shop-canary", &v2).await;
    cluster.selects("shop-stable", &v1).await;

    cluster.patch_status("shop", json!({"abort": true})).await;
    let aborted = eventually(DEADLINE, "the abort back to stable", || async {
        let status = cluster.status("shop").await;
        let sets = cluster.replica_sets("shop").await;
        let back = sets.get(&format!("shop-{v1}")) == Some(&(4, 4))
            && sets.get(&format!("shop-{v2}")) == Some(&(0, 0));
        (status.abort && back).then_some(status)
    })
    .await;
    let progressing = aborted.condition("Progressing").expect("Progressing");
    assert_eq!(progressing.reason, "RolloutAborted");
    assert_eq!(aborted.phase, "Degraded");
    assert_eq!(aborted.stable_rs, v1);
    // Aborted: the canary Service goes back to the stable pods.
    cluster.selects("shop-canary", &v1).await;

    cluster.patch_status("shop", json!({"abort": false})).await;
    let retried = cluster.paused_at("shop", 1, &[(&v1, 2), (&v2, 2)]).await;
    assert!(!retried.abort);
    cluster
        .patch_status("shop", json!({"pauseConditions": null}))
        .await;
    assert_eq!(cluster.healthy("shop", 4).await, v2);
    cluster.selects("shop-stable", &v2).await;
    cluster.selects("shop-canary", &v2).await;
}

#[tokio::test]
async fn a_new_image_during_a_rollout_restarts_the_steps() {
    let cluster = Cluster::start("restart");
    let _controller = cluster.controller();
    let steps = json!([{"setWeight": 25}, {"pause": {}}]);
    let mut cart = rollout("cart", 4, "app:v1", steps);
    cart.spec.revision_history_limit = Some(1);
    cluster.create_rollout(cart).await;
    let v1 = cluster.healthy("cart", 4).await;
    cluster.set_image("cart", "app:v2").await;
    let v2 = eventually(DEADLINE, "the v2 hash", || async {
        let hash = cluster.status("cart").await.current_pod_hash;
        (hash != v1).then_some(hash)
    })
    .await;
    cluster.paused_at("cart", 1, &[(&v1, 3), (&v2, 1)]).await;

    cluster.set_image("cart", "app:v3").await;
    let v3 = eventually(DEADLINE, "the v3 hash", || async {
        let hash = cluster.status("cart").await.current_pod_hash;
        (hash != v1 && hash != v2).then_some(hash)
    })
    .await;
    // Step 0 again for v3 (its 25%), the v2 canary emptied, the stable untouched.
    let status = cluster
        .paused_at("cart", 1, &[(&v1, 3), (&v2, 0), (&v3, 1)])
        .await;
    assert_eq!(status.stable_rs, v1);
    cluster
        .patch_status("cart", json!({"pauseConditions": null}))
        .await;
    assert_eq!(cluster.healthy("cart", 4).await, v3);
    // revisionHistoryLimit 1: the oldest empty ReplicaSet (v1) is deleted, v2 is kept.
    let want = BTreeMap::from([
        (format!("cart-{v2}"), (0, 0)),
        (format!("cart-{v3}"), (4, 4)),
    ]);
    eventually(
        DEADLINE,
        "the history trimmed to one old ReplicaSet",
        || async { (cluster.replica_sets("cart").await == want).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn a_controller_killed_mid_rollout_resumes_without_repeating_a_step() {
    let cluster = Cluster::start("kill");
    let controller = cluster.controller();
    let steps = json!([{"setWeight": 25}, {"pause": {}}, {"setWeight": 50}, {"pause": {}}]);
    cluster
        .create_rollout(rollout("pay", 4, "app:v1", steps))
        .await;
    let v1 = cluster.healthy("pay", 4).await;
    cluster.set_image("pay", "app:v2").await;
    let v2 = eventually(DEADLINE, "the v2 hash", || async {
        let hash = cluster.status("pay").await.current_pod_hash;
        (hash != v1).then_some(hash)
    })
    .await;
    let paused = cluster.paused_at("pay", 1, &[(&v1, 3), (&v2, 1)]).await;
    let sets_before = cluster.replica_sets("pay").await;
    controller.kill().await;

    let restarted = cluster.controller();
    eventually(DEADLINE, "a reconcile by the new controller", || async {
        (restarted.reconciles("pay").await >= 1).then_some(())
    })
    .await;
    let resumed = cluster.status("pay").await;
    assert_eq!(resumed.current_step_index, paused.current_step_index);
    assert_eq!(resumed.pause_conditions, paused.pause_conditions);
    assert_eq!(cluster.replica_sets("pay").await, sets_before);

    cluster
        .patch_status("pay", json!({"pauseConditions": null}))
        .await;
    cluster.paused_at("pay", 3, &[(&v1, 2), (&v2, 2)]).await;
    cluster
        .patch_status("pay", json!({"pauseConditions": null}))
        .await;
    assert_eq!(cluster.healthy("pay", 4).await, v2);
    assert_eq!(
        cluster.replica_sets("pay").await.len(),
        2,
        "no extra ReplicaSet"
    );
    // Each step completed once, across both controllers (a new process has a new event
    // cache, so a repeated step would be a second Event with the same note).
    let events: Api<Event> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let notes: Vec<String> = events
        .list(&ListParams::default())
        .await
        .expect("lists events")
        .items
        .into_iter()
        .filter(|event| event.reason.as_deref() == Some("RolloutStepCompleted"))
        .filter(|event| event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("pay"))
        .inspect(|event| assert!(event.series.is_none(), "repeated: {event:?}"))
        .filter_map(|event| event.note)
        .collect();
    let v2_steps: Vec<&String> = notes.iter().filter(|note| note.contains("/4 ")).collect();
    let unique: std::collections::BTreeSet<&&String> = v2_steps.iter().collect();
    assert_eq!(
        unique.len(),
        v2_steps.len(),
        "a step completed twice: {notes:?}"
    );
    assert_eq!(v2_steps.len(), 4, "{notes:?}");
}

#[tokio::test]
async fn a_canary_that_never_becomes_ready_exceeds_the_progress_deadline() {
    let cluster = Cluster::start("deadline");
    let _controller = cluster.controller();
    let steps = json!([{"setWeight": 50}, {"pause": {}}]);
    let mut stuck = rollout("stuck", 2, "app:v1", steps);
    stuck.spec.progress_deadline_seconds = Some(3);
    cluster.create_rollout(stuck).await;
    cluster.healthy("stuck", 2).await;

    let patch = json!({"spec": {"template": {
        "metadata": {"annotations": {"sim.rollouts.dev/never-ready": "true"}},
        "spec": {"containers": [{"name": "app", "image": "app:v2"}]}
    }}});
    cluster
        .rollouts()
        .patch("stuck", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("changes the template");
    let status = eventually(DEADLINE, "ProgressDeadlineExceeded", || async {
        let status = cluster.status("stuck").await;
        let timed_out = status
            .condition("Progressing")
            .is_some_and(|c| c.reason == "ProgressDeadlineExceeded" && c.status == "False");
        timed_out.then_some(status)
    })
    .await;
    assert_eq!(status.phase, "Degraded");
    assert_ne!(status.stable_rs, status.current_pod_hash);
}

#[tokio::test]
async fn an_invalid_rollout_gets_invalid_spec_and_no_replica_set() {
    let cluster = Cluster::start("invalid");
    let _controller = cluster.controller();
    let steps = json!([{"setWeight": 150}]);
    cluster
        .create_rollout(rollout("broken", 2, "app:v1", steps))
        .await;
    let status = eventually(DEADLINE, "the InvalidSpec condition", || async {
        let status = cluster.status("broken").await;
        status.condition("InvalidSpec").is_some().then_some(status)
    })
    .await;
    let condition = status.condition("InvalidSpec").expect("InvalidSpec");
    assert!(
        condition.message.contains("setWeight"),
        "{}",
        condition.message
    );
    assert_eq!(status.phase, "Degraded");
    assert!(cluster.replica_sets("broken").await.is_empty());
}

#[tokio::test]
async fn a_healthy_rollout_is_reconciled_again_without_a_single_write() {
    let cluster = Cluster::start("idle");
    let controller = cluster.controller();
    let steps = json!([{"setWeight": 50}, {"pause": {}}]);
    cluster
        .create_rollout(rollout("idle", 2, "app:v1", steps))
        .await;
    cluster.healthy("idle", 2).await;
    controller.kill().await;

    // A new controller lists and reconciles everything it finds.
    cluster.sim.clear_requests();
    let restarted = cluster.controller();
    eventually(DEADLINE, "a reconcile of the healthy Rollout", || async {
        (restarted.reconciles("idle").await >= 1).then_some(())
    })
    .await;
    let requests = cluster.sim.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.user_agent.starts_with(CONTROLLER_AGENT) && r.resource == "replicasets"),
        "the controller looked at the ReplicaSets"
    );
    let writes: Vec<RequestRecord> = cluster
        .sim
        .requests()
        .into_iter()
        .filter(|r| r.user_agent.starts_with(CONTROLLER_AGENT))
        .filter(|r| matches!(r.verb.as_str(), "create" | "update" | "patch" | "delete"))
        .collect();
    assert!(writes.is_empty(), "writes at rest: {writes:?}");
}

/// An AnalysisTemplate whose one metric needs the canary's hash.
async fn create_template(cluster: &Cluster, name: &str) {
    cluster
        .create_template(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AnalysisTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "args": [{"name": "canary-hash"}],
            "metrics": [{
                "name": "errors",
                "successCondition": "result < 1",
                "provider": {"web": {"url": "http://127.0.0.1:9/errors?hash={{args.canary-hash}}"}}
            }]
        }
        }))
        .await;
}

/// Steps: 50%, then an analysis of the canary's hash.
fn analysed_steps() -> Value {
    json!([
        {"setWeight": 50},
        {"analysis": {
            "templates": [{"templateName": "error-rate"}],
            "args": [{"name": "canary-hash", "valueFrom": {"podTemplateHashValue": "Latest"}}]
        }}
    ])
}

/// Waits for the step run of `rollout` and checks how it was created; returns its name.
async fn step_run(cluster: &Cluster, rollout: &str, hash: &str) -> String {
    let runs: Api<AnalysisRun> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let run = eventually(DEADLINE, "the step's AnalysisRun", || async {
        runs.list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|run| run.owner_references().iter().any(|o| o.name == rollout))
    })
    .await;
    let labels = run.labels();
    assert_eq!(labels["rollout-type"], "Step");
    assert_eq!(labels["step-index"], "1");
    assert_eq!(labels["rollouts-pod-template-hash"], hash);
    assert_eq!(run.owner_references()[0].controller, Some(true));
    let arg = run
        .spec
        .args
        .iter()
        .find(|arg| arg.name == "canary-hash")
        .expect("the template's argument");
    assert_eq!(arg.value.as_deref(), Some(hash));
    assert_eq!(run.spec.metrics[0].name, "errors");
    run.name_any()
}

#[tokio::test]
async fn a_successful_step_analysis_lets_the_rollout_finish() {
    let cluster = Cluster::start("analysis-pass");
    let _controller = cluster.controller();
    create_template(&cluster, "error-rate").await;
    cluster
        .create_rollout(rollout("search", 2, "app:v1", analysed_steps()))
        .await;
    let v1 = cluster.healthy("search", 2).await;
    cluster.set_image("search", "app:v2").await;
    let v2 = eventually(DEADLINE, "the v2 hash", || async {
        let hash = cluster.status("search").await.current_pod_hash;
        (hash != v1).then_some(hash)
    })
    .await;
    let run = step_run(&cluster, "search", &v2).await;
    // The run is created before the status that points at it is patched: wait for both.
    eventually(
        DEADLINE,
        "the status pointing at the step's run",
        || async {
            let status = cluster.status("search").await;
            let pointer = status
                .canary
                .current_step_analysis_run_status
                .as_ref()
                .map(|pointer| pointer.name.clone());
            (status.current_step_index == Some(1) && pointer.as_deref() == Some(run.as_str()))
                .then_some(())
        },
    )
    .await;

    cluster.finish_run(&run, "Successful").await;
    assert_eq!(cluster.healthy("search", 2).await, v2);
}

#[tokio::test]
async fn a_failed_step_analysis_aborts_back_to_stable() {
    let cluster = Cluster::start("analysis-fail");
    let _controller = cluster.controller();
    create_template(&cluster, "error-rate").await;
    cluster
        .create_rollout(rollout("feed", 2, "app:v1", analysed_steps()))
        .await;
    let v1 = cluster.healthy("feed", 2).await;
    cluster.set_image("feed", "app:v2").await;
    let v2 = eventually(DEADLINE, "the v2 hash", || async {
        let hash = cluster.status("feed").await.current_pod_hash;
        (hash != v1).then_some(hash)
    })
    .await;
    let run = step_run(&cluster, "feed", &v2).await;

    cluster.finish_run(&run, "Failed").await;
    let status = eventually(DEADLINE, "the automatic rollback", || async {
        let status = cluster.status("feed").await;
        let sets = cluster.replica_sets("feed").await;
        let back = sets.get(&format!("feed-{v1}")) == Some(&(2, 2))
            && sets.get(&format!("feed-{v2}")) == Some(&(0, 0));
        (status.abort && back).then_some(status)
    })
    .await;
    let progressing = status.condition("Progressing").expect("Progressing");
    assert_eq!(progressing.reason, "RolloutAborted");
    assert!(
        progressing.message.contains("run Failed"),
        "{}",
        progressing.message
    );
}

/// The Rollout carries its revision's number in `rollout.argoproj.io/revision`, and
/// `spec.minReadySeconds`, not part of the pod template, makes no new revision when changed:
/// the live ReplicaSet is given the new value, as Argo keeps it in step.
#[tokio::test]
async fn a_changed_min_ready_seconds_reaches_the_live_replica_set() {
    let cluster = Cluster::start("min-ready");
    let _controller = cluster.controller();
    let steps = json!([{"setWeight": 50}, {"pause": {}}]);
    cluster
        .create_rollout(rollout("min-ready", 2, "app:v1", steps))
        .await;
    let hash = cluster.healthy("min-ready", 2).await;
    // The Rollout carries its revision, as Argo's does.
    let revision = eventually(DEADLINE, "the Rollout's revision annotation", || async {
        let rollout = cluster.rollouts().get("min-ready").await.ok()?;
        rollout
            .annotations()
            .get("rollout.argoproj.io/revision")
            .cloned()
    })
    .await;
    assert_eq!(revision, "1");
    cluster
        .rollouts()
        .patch(
            "min-ready",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"minReadySeconds": 7}})),
        )
        .await
        .expect("patch minReadySeconds");
    let live = eventually(
        DEADLINE,
        "minReadySeconds 7 on the live ReplicaSet",
        || async {
            let sets = cluster.owned_replica_sets("min-ready").await;
            sets.into_iter()
                .find(|rs| rs.spec.as_ref().and_then(|s| s.min_ready_seconds) == Some(7))
        },
    )
    .await;
    assert_eq!(
        live.labels().get("rollouts-pod-template-hash"),
        Some(&hash),
        "the current revision's ReplicaSet, no new one"
    );
    assert_eq!(cluster.owned_replica_sets("min-ready").await.len(), 1);
    assert_eq!(cluster.status("min-ready").await.current_pod_hash, hash);
}
