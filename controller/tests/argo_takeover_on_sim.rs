//! Taking over from Argo Rollouts, on kube-sim with the real controller binary. Each test
//! writes the objects exactly as Argo's controller leaves them: ReplicaSets named, labelled and
//! selected by Argo's pod-template hash (which we do not compute), their templates as an API
//! server stores them (defaults filled in), Argo's `revision` and `desired-replicas`
//! annotations and owner reference, Services pointed by hash and annotated
//! `managed-by-rollouts`, an AnalysisRun Argo created, and the Rollout's status as Argo wrote
//! it. Then our controller starts, and kube-sim's request log shows that it creates no
//! ReplicaSet or AnalysisRun, scales nothing, points no Service elsewhere and repeats no step.
//! Last, each is promoted as Argo's kubectl plugin does, and finishes on Argo's ReplicaSets.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use rollouts_crds::analysis::{AnalysisPhase, AnalysisRun};
use rollouts_crds::rollout::Rollout;
use rollouts_e2e::fake_prometheus::FakePrometheus;
use rollouts_e2e::sim::{RequestRecord, SimOptions};
use serde_json::{Value, json};

use support::{Controller, NAMESPACE, Sim, eventually};

const DEADLINE: Duration = Duration::from_secs(40);
/// Argo's hash of the `web:1.0` template, as Argo would have named it.
const STABLE: &str = "5d7c8f9b6";
/// Argo's hash of the `web:2.0` template.
const CANARY: &str = "6c9f7d8b4";
const V1: &str = "registry.example.com/web:1.0";
const V2: &str = "registry.example.com/web:2.0";
/// Argo's `currentStepHash` of `[{setWeight: 25}, {pause: {}}]`: FNV-1a of Go's JSON of the
/// steps, SafeEncodeString'd (utils/conditions/conditions.go, ComputeStepHash).
const PAUSE_STEPS_HASH: &str = "77b4b4f4c6";
/// Argo's `currentStepHash` of `[{setWeight: 25}, {analysis: {templates: [{templateName:
/// success-rate}]}}]`.
const ANALYSIS_STEPS_HASH: &str = "7d8dd59f46";
/// The user agent our controller sends.
const CONTROLLER_AGENT: &str = "rollouts-controller/";

/// A Rollout `web` as Argo left it, with its ReplicaSets and Services, on a fresh kube-sim.
struct Takeover {
    sim: Sim,
    uid: String,
}

impl Takeover {
    /// Creates Rollout `web` (`replicas` pods of `image`, `strategy`), then writes `status` on
    /// it as Argo's controller did.
    async fn new(test: &str, replicas: i32, image: &str, strategy: Value, status: Value) -> Self {
        let sim = Sim::start_named("rollouts-argo-takeover", test);
        Self::on(sim, replicas, image, strategy, status).await
    }

    /// [`Self::new`] on a simulator that also serves Istio's and the Gateway API's kinds.
    async fn routed(
        test: &str,
        replicas: i32,
        image: &str,
        strategy: Value,
        status: Value,
    ) -> Self {
        let root = support::workspace_root();
        let sim = Sim::start_with(
            "rollouts-argo-takeover",
            test,
            SimOptions {
                crd_dirs: vec![root.join("crds/yaml"), root.join("e2e/crds")],
                pod_ready_after: Duration::from_millis(200),
                ..SimOptions::default()
            },
        );
        Self::on(sim, replicas, image, strategy, status).await
    }

    async fn on(sim: Sim, replicas: i32, image: &str, strategy: Value, status: Value) -> Self {
        let rollout: Rollout = serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Rollout",
            "metadata": {
                "name": "web",
                "namespace": NAMESPACE,
                "annotations": {"rollout.argoproj.io/revision": "2"}
            },
            "spec": {
                "replicas": replicas,
                "revisionHistoryLimit": 3,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{
                        "name": "app",
                        "image": image,
                        "resources": {"requests": {"cpu": 0.5, "memory": "64Mi"}}
                    }]}
                },
                "strategy": strategy
            }
        }))
        .expect("a valid Rollout");
        let created = sim
            .rollouts()
            .create(&PostParams::default(), &rollout)
            .await
            .expect("creates the Rollout");
        let uid = created.uid().expect("the Rollout has a uid");
        sim.patch_status("web", status).await;
        Self { sim, uid }
    }

    /// ReplicaSet `web-<hash>` of `image` at `replicas`, as Argo creates it and an API server
    /// stores it: defaults filled in, the Rollout's `cpu: 0.5` stored as `500m` (`annotations`
    /// add to Argo's).
    async fn replica_set(
        &self,
        hash: &str,
        image: &str,
        replicas: i32,
        revision: &str,
        annotations: Value,
    ) {
        let mut all = json!({
            "rollout.argoproj.io/desired-replicas": replicas.to_string(),
            "rollout.argoproj.io/revision": revision,
        });
        for (key, value) in annotations.as_object().into_iter().flatten() {
            all[key] = value.clone();
        }
        let labels = json!({"app": "web", "rollouts-pod-template-hash": hash});
        let rs: ReplicaSet = serde_json::from_value(json!({
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": format!("web-{hash}"),
                "namespace": NAMESPACE,
                "labels": labels,
                "annotations": all,
                "ownerReferences": [{
                    "apiVersion": "argoproj.io/v1alpha1",
                    "kind": "Rollout",
                    "name": "web",
                    "uid": self.uid,
                    "controller": true,
                    "blockOwnerDeletion": true
                }]
            },
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"creationTimestamp": null, "labels": labels},
                    "spec": {
                        "containers": [{
                            "name": "app",
                            "image": image,
                            "imagePullPolicy": "IfNotPresent",
                            "resources": {"requests": {"cpu": "500m", "memory": "64Mi"}},
                            "terminationMessagePath": "/dev/termination-log",
                            "terminationMessagePolicy": "File"
                        }],
                        "dnsPolicy": "ClusterFirst",
                        "restartPolicy": "Always",
                        "schedulerName": "default-scheduler",
                        "securityContext": {},
                        "terminationGracePeriodSeconds": 30
                    }
                }
            }
        }))
        .expect("a valid ReplicaSet");
        Api::<ReplicaSet>::namespaced(self.sim.client.clone(), NAMESPACE)
            .create(&PostParams::default(), &rs)
            .await
            .expect("creates the ReplicaSet");
    }

    /// Service `name` selecting revision `hash`, as Argo points and annotates it.
    async fn service(&self, name: &str, hash: &str) {
        let service = serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "annotations": {"argo-rollouts.argoproj.io/managed-by-rollouts": "web"}
            },
            "spec": {
                "selector": {"app": "web", "rollouts-pod-template-hash": hash},
                "ports": [{"port": 80, "targetPort": 8080}]
            }
        }))
        .expect("a valid Service");
        self.sim
            .services()
            .create(&PostParams::default(), &service)
            .await
            .expect("creates the Service");
    }

    /// Waits until every ReplicaSet has all its pods available, as Argo left them running.
    async fn wait_running(&self, expected: &[(&str, i32)]) {
        let expected: BTreeMap<String, (i32, i32)> = expected
            .iter()
            .map(|(hash, replicas)| (format!("web-{hash}"), (*replicas, *replicas)))
            .collect();
        eventually(DEADLINE, "Argo's pods running", || async {
            (self.sim.replica_sets("web").await == expected).then_some(())
        })
        .await;
    }

    /// Our controller, started on a cleared request log, and the Rollout's status as Argo left
    /// it.
    async fn start_controller(&self) -> (Controller, Value) {
        let argo_status = self.status_json().await;
        self.sim.sim.clear_requests();
        (
            Controller::start(&self.sim.kubeconfig, DEADLINE),
            argo_status,
        )
    }

    /// The Rollout's status as JSON, without `canary.weights.verified`: this controller reads
    /// an Istio or Gateway API router back and records that it holds the weight, where Argo
    /// verifies only ALB target groups and leaves the field unset.
    async fn status_json(&self) -> Value {
        let mut status =
            serde_json::to_value(self.sim.status("web").await).expect("a status has a JSON form");
        if let Some(weights) = status
            .pointer_mut("/canary/weights")
            .and_then(Value::as_object_mut)
        {
            weights.remove("verified");
        }
        status
    }

    /// Waits until the controller has planned `web` once more than it wrote its status, so
    /// what it does on taking over has been done (each status write triggers one more plan).
    async fn settled(&self, controller: &Controller) {
        eventually(DEADLINE, "the takeover planned", || async {
            let status_writes = self
                .writes()
                .iter()
                .filter(|r| r.resource == "rollouts" && r.subresource == "status")
                .count();
            let reconciles = controller.try_reconciles("web").await?;
            (reconciles > u64::try_from(status_writes).ok()?).then_some(())
        })
        .await;
    }

    /// The writes our controller made.
    fn writes(&self) -> Vec<RequestRecord> {
        self.sim
            .sim
            .requests()
            .into_iter()
            .filter(|r| r.user_agent.starts_with(CONTROLLER_AGENT))
            .filter(|r| !matches!(r.verb.as_str(), "get" | "list" | "watch"))
            .collect()
    }

    /// Fails naming them if our controller wrote anything but the Rollout's status and the
    /// measurements of a run that exists: no ReplicaSet, Service, AnalysisRun or router object
    /// written, and no event (a step entered again would record one). The status itself is
    /// Argo's, field for field, but `canary.weights.verified`.
    async fn assert_nothing_moved(&self, argo_status: &Value) {
        assert_eq!(&self.status_json().await, argo_status, "status moved");
        let allowed = |r: &RequestRecord| {
            r.subresource == "status"
                && matches!(r.verb.as_str(), "patch" | "update")
                && matches!(r.resource.as_str(), "rollouts" | "analysisruns")
        };
        let moved: Vec<RequestRecord> = self.writes().into_iter().filter(|r| !allowed(r)).collect();
        assert!(moved.is_empty(), "the takeover wrote {moved:#?}");
    }

    /// `web-<hash>` -> (spec.replicas, availableReplicas).
    async fn replica_sets(&self) -> BTreeMap<String, (i32, i32)> {
        self.sim.replica_sets("web").await
    }

    /// The revision Service `name` selects.
    async fn selected_hash(&self, name: &str) -> String {
        let service = self
            .sim
            .services()
            .get(name)
            .await
            .expect("reads the Service");
        let selector = service.spec.and_then(|spec| spec.selector);
        selector
            .and_then(|selector| selector.get("rollouts-pod-template-hash").cloned())
            .unwrap_or_default()
    }

    /// Promotes as `kubectl argo rollouts promote` does on a Rollout paused by its controller.
    async fn promote(&self) {
        self.sim
            .patch_status("web", json!({"pauseConditions": null}))
            .await;
    }
}

/// RFC 3339 `seconds` before now, to the second (as Kubernetes writes times).
fn seconds_ago(seconds: i64) -> String {
    let now = Timestamp::now().as_second();
    Timestamp::from_second(now - seconds)
        .expect("a time")
        .to_string()
}

fn condition(type_: &str, status: &str, reason: &str, message: &str, at: &str) -> Value {
    json!({
        "type": type_, "status": status, "reason": reason, "message": message,
        "lastTransitionTime": at, "lastUpdateTime": at
    })
}

fn pause_steps() -> Value {
    json!({"canary": {"steps": [{"setWeight": 25}, {"pause": {}}]}})
}

/// A canary Argo released fully: `web-5d7c8f9b6` runs all 4 pods, status Healthy on it.
#[tokio::test]
async fn a_healthy_canary_argo_left_moves_nothing_and_releases_from_argos_replica_set() {
    let at = seconds_ago(600);
    let status = json!({
        "HPAReplicas": 4, "replicas": 4, "updatedReplicas": 4, "readyReplicas": 4,
        "availableReplicas": 4,
        "blueGreen": {}, "canary": {},
        "conditions": [
            condition("Available", "True", "AvailableReason", "Rollout has minimum availability", &at),
            condition("Progressing", "True", "NewReplicaSetAvailable",
                &format!("ReplicaSet \"web-{STABLE}\" has successfully progressed."), &at),
            condition("Completed", "True", "RolloutCompleted", "RolloutCompleted", &at),
            condition("Healthy", "True", "RolloutHealthy", "Rollout is healthy", &at),
        ],
        "currentPodHash": STABLE, "stableRS": STABLE,
        "currentStepHash": PAUSE_STEPS_HASH, "currentStepIndex": 2,
        "observedGeneration": "1", "phase": "Healthy", "selector": "app=web"
    });
    let argo = Takeover::new("healthy", 4, V1, pause_steps(), status).await;
    // Revision 2, as the Rollout's own annotation says: Argo keeps the two equal.
    argo.replica_set(STABLE, V1, 4, "2", json!({})).await;
    argo.wait_running(&[(STABLE, 4)]).await;

    let (controller, argo_status) = argo.start_controller().await;
    argo.settled(&controller).await;
    argo.assert_nothing_moved(&argo_status).await;
    // Without a router Argo keeps no `status.canary.weights`, and neither do we: not a write.
    let writes = argo.writes();
    assert!(
        writes.is_empty(),
        "a Healthy basic canary taken over: {writes:#?}"
    );
    let status = argo.sim.status("web").await;
    assert_eq!(
        (status.current_pod_hash.as_str(), status.stable_rs.as_str()),
        (STABLE, STABLE)
    );
    assert_eq!(status.current_step_index, Some(2));
    assert_eq!(status.phase, "Healthy");
    assert_eq!(
        argo.replica_sets().await,
        BTreeMap::from([(format!("web-{STABLE}"), (4, 4))])
    );

    // The next release starts from Argo's ReplicaSet as its stable revision.
    argo.sim.set_image("web", V2).await;
    let paused = eventually(DEADLINE, "the update paused at step 1", || async {
        let status = argo.sim.status("web").await;
        (status.current_step_index == Some(1) && !status.pause_conditions.is_empty())
            .then_some(status)
    })
    .await;
    assert_eq!(paused.stable_rs, STABLE);
    let ours = paused.current_pod_hash.clone();
    assert_ne!(ours, STABLE);
    argo.promote().await;
    argo.sim.wait_healthy(DEADLINE, "web", 4).await;
    eventually(DEADLINE, "Argo's ReplicaSet scaled down", || async {
        let replica_sets = argo.replica_sets().await;
        let expected = BTreeMap::from([
            (format!("web-{STABLE}"), (0, 0)),
            (format!("web-{ours}"), (4, 4)),
        ]);
        (replica_sets == expected).then_some(())
    })
    .await;
}

/// A canary Argo paused at `pause: {}` after `setWeight: 25`: 1 pod of `web-6c9f7d8b4`, 3 of
/// `web-5d7c8f9b6`, Services pointed by Argo.
#[tokio::test]
async fn a_canary_argo_paused_stays_paused_then_finishes_on_argos_replica_sets() {
    let paused_at = seconds_ago(60);
    let at = seconds_ago(600);
    let strategy = json!({"canary": {
        "stableService": "web-stable", "canaryService": "web-canary",
        "steps": [{"setWeight": 25}, {"pause": {}}]
    }});
    let status = json!({
        "HPAReplicas": 4, "replicas": 4, "updatedReplicas": 1, "readyReplicas": 4,
        "availableReplicas": 4,
        "blueGreen": {}, "canary": {},
        "conditions": [
            condition("Available", "True", "AvailableReason", "Rollout has minimum availability", &at),
            condition("Progressing", "Unknown", "RolloutPaused", "Rollout is paused", &paused_at),
            condition("Paused", "True", "RolloutPaused", "Rollout is paused", &paused_at),
            condition("Completed", "False", "RolloutCompleted", "RolloutCompleted", &paused_at),
            condition("Healthy", "False", "RolloutHealthy", "Rollout is not healthy", &paused_at),
        ],
        "currentPodHash": CANARY, "stableRS": STABLE,
        "currentStepHash": PAUSE_STEPS_HASH, "currentStepIndex": 1,
        "pauseConditions": [{"reason": "CanaryPauseStep", "startTime": paused_at}],
        "controllerPause": true,
        "observedGeneration": "1", "phase": "Paused", "message": "CanaryPauseStep",
        "selector": "app=web"
    });
    let argo = Takeover::new("paused", 4, V2, strategy, status).await;
    argo.replica_set(STABLE, V1, 3, "1", json!({})).await;
    argo.replica_set(CANARY, V2, 1, "2", json!({})).await;
    argo.service("web-stable", STABLE).await;
    argo.service("web-canary", CANARY).await;
    argo.wait_running(&[(STABLE, 3), (CANARY, 1)]).await;

    let (controller, argo_status) = argo.start_controller().await;
    argo.settled(&controller).await;
    argo.assert_nothing_moved(&argo_status).await;
    let status = argo.sim.status("web").await;
    assert_eq!(status.current_pod_hash, CANARY);
    assert_eq!(status.stable_rs, STABLE);
    assert_eq!(status.current_step_index, Some(1));
    assert_eq!(status.current_step_hash, PAUSE_STEPS_HASH);
    assert!(status.controller_pause);
    let pause_times: Vec<String> = status
        .pause_conditions
        .iter()
        .map(|condition| condition.start_time.0.to_string())
        .collect();
    assert_eq!(
        pause_times,
        vec![paused_at.clone()],
        "the pause is not entered again"
    );

    argo.promote().await;
    let done = argo.sim.wait_healthy(DEADLINE, "web", 4).await;
    assert_eq!(
        (done.current_pod_hash.as_str(), done.stable_rs.as_str()),
        (CANARY, CANARY)
    );
    eventually(
        DEADLINE,
        "the release finished on Argo's ReplicaSets",
        || async {
            let expected = BTreeMap::from([
                (format!("web-{STABLE}"), (0, 0)),
                (format!("web-{CANARY}"), (4, 4)),
            ]);
            (argo.replica_sets().await == expected).then_some(())
        },
    )
    .await;
    assert_eq!(argo.selected_hash("web-stable").await, CANARY);
    assert_eq!(argo.selected_hash("web-canary").await, CANARY);
}

/// A canary Argo left in its analysis step: the AnalysisRun Argo created is Running with one
/// good measurement of the two it needs. The stand-in Prometheus is down at first, so the run
/// stays Running while the takeover is checked; once it answers, the run succeeds and the
/// release finishes.
#[tokio::test]
async fn a_canary_argo_left_mid_analysis_picks_up_argos_run() {
    let prometheus = FakePrometheus::start().await;
    prometheus.answer_every_query("0.99");
    prometheus.stop_and_wait().await;
    let started = seconds_ago(30);
    let at = seconds_ago(600);
    let metric = json!({
        "name": "success-rate",
        "interval": "1s",
        "count": 2,
        "consecutiveErrorLimit": 100,
        "successCondition": "result[0] >= 0.95",
        "provider": {"prometheus": {"address": prometheus.address, "query": "success_rate"}}
    });
    let strategy = json!({"canary": {"steps": [
        {"setWeight": 25},
        {"analysis": {"templates": [{"templateName": "success-rate"}]}}
    ]}});
    let run_name = format!("web-{CANARY}-2-1");
    let status = json!({
        "HPAReplicas": 4, "replicas": 4, "updatedReplicas": 1, "readyReplicas": 4,
        "availableReplicas": 4,
        "blueGreen": {},
        "canary": {"currentStepAnalysisRunStatus": {"name": run_name, "status": "Running"}},
        "conditions": [
            condition("Available", "True", "AvailableReason", "Rollout has minimum availability", &at),
            condition("Progressing", "True", "ReplicaSetUpdated",
                &format!("ReplicaSet \"web-{CANARY}\" is progressing."), &started),
            condition("Completed", "False", "RolloutCompleted", "RolloutCompleted", &started),
            condition("Healthy", "False", "RolloutHealthy", "Rollout is not healthy", &started),
        ],
        "currentPodHash": CANARY, "stableRS": STABLE,
        "currentStepHash": ANALYSIS_STEPS_HASH, "currentStepIndex": 1,
        "observedGeneration": "1", "phase": "Progressing",
        "message": "more replicas need to be updated", "selector": "app=web"
    });
    let argo = Takeover::new("analysis", 4, V2, strategy, status).await;
    argo.sim
        .create_template(json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "AnalysisTemplate",
            "metadata": {"name": "success-rate", "namespace": NAMESPACE},
            "spec": {"metrics": [metric]}
        }))
        .await;
    argo.replica_set(STABLE, V1, 3, "1", json!({})).await;
    argo.replica_set(CANARY, V2, 1, "2", json!({})).await;
    let runs: Api<AnalysisRun> = Api::namespaced(argo.sim.client.clone(), NAMESPACE);
    let run: AnalysisRun = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AnalysisRun",
        "metadata": {
            "name": run_name,
            "namespace": NAMESPACE,
            "labels": {
                "app": "web", "rollout-type": "Step", "step-index": "1",
                "rollouts-pod-template-hash": CANARY
            },
            "annotations": {"rollout.argoproj.io/revision": "2"},
            "ownerReferences": [{
                "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "name": "web",
                "uid": argo.uid, "controller": true, "blockOwnerDeletion": true
            }]
        },
        "spec": {"metrics": [metric]}
    }))
    .expect("a valid AnalysisRun");
    runs.create(&PostParams::default(), &run)
        .await
        .expect("creates Argo's AnalysisRun");
    runs.patch_status(
        &run_name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "phase": "Running",
            "startedAt": started,
            "metricResults": [{
                "name": "success-rate", "phase": "Running", "count": 1, "successful": 1,
                "measurements": [{
                    "phase": "Successful", "value": "[0.99]",
                    "startedAt": started, "finishedAt": started
                }]
            }]
        }})),
    )
    .await
    .expect("writes the run's status as Argo did");
    argo.wait_running(&[(STABLE, 3), (CANARY, 1)]).await;

    let (controller, argo_status) = argo.start_controller().await;
    argo.settled(&controller).await;
    argo.assert_nothing_moved(&argo_status).await;
    let status = argo.sim.status("web").await;
    assert_eq!(status.current_step_index, Some(1));
    assert_eq!(
        status
            .canary
            .current_step_analysis_run_status
            .as_ref()
            .map(|run| run.name.as_str()),
        Some(run_name.as_str())
    );
    let listed = runs.list(&Default::default()).await.expect("lists runs");
    let names: Vec<String> = listed.items.iter().map(|run| run.name_any()).collect();
    assert_eq!(names, vec![run_name.clone()]);
    // Our AnalysisRun controller measures Argo's run: with Prometheus down, errors.
    eventually(DEADLINE, "Argo's run measured by us", || async {
        let run = runs.get(&run_name).await.ok()?;
        let status = run.status?;
        let result = status.metric_results.first()?;
        (status.phase == AnalysisPhase::Running && result.error > 0).then_some(())
    })
    .await;

    prometheus.resume().await;
    let done = argo.sim.wait_healthy(DEADLINE, "web", 4).await;
    assert_eq!(done.stable_rs, CANARY);
    let run = runs.get(&run_name).await.expect("reads Argo's run");
    assert_eq!(
        run.status.map(|status| status.phase),
        Some(AnalysisPhase::Successful)
    );
    let listed = runs.list(&Default::default()).await.expect("lists runs");
    assert_eq!(listed.items.len(), 1, "no second run for the step");
    eventually(
        DEADLINE,
        "the release finished on Argo's ReplicaSets",
        || async {
            let expected = BTreeMap::from([
                (format!("web-{STABLE}"), (0, 0)),
                (format!("web-{CANARY}"), (4, 4)),
            ]);
            (argo.replica_sets().await == expected).then_some(())
        },
    )
    .await;
}

fn blue_green(scale_down_delay: i32) -> Value {
    json!({"blueGreen": {
        "activeService": "web-active",
        "previewService": "web-preview",
        "autoPromotionEnabled": false,
        "scaleDownDelaySeconds": scale_down_delay
    }})
}

/// A blue-green Argo left waiting for promotion: `web-5d7c8f9b6` active, `web-6c9f7d8b4` in
/// preview, both at 2 pods.
#[tokio::test]
async fn a_blue_green_argo_left_waiting_for_promotion_is_promoted_on_argos_replica_sets() {
    let paused_at = seconds_ago(60);
    let at = seconds_ago(600);
    let status = json!({
        "HPAReplicas": 2, "replicas": 4, "updatedReplicas": 2, "readyReplicas": 2,
        "availableReplicas": 2,
        "blueGreen": {"activeSelector": STABLE, "previewSelector": CANARY},
        "canary": {},
        "conditions": [
            condition("Available", "True", "AvailableReason", "Rollout has minimum availability", &at),
            condition("Progressing", "Unknown", "RolloutPaused", "Rollout is paused", &paused_at),
            condition("Paused", "True", "RolloutPaused", "Rollout is paused", &paused_at),
            condition("Completed", "False", "RolloutCompleted", "RolloutCompleted", &paused_at),
            condition("Healthy", "False", "RolloutHealthy", "Rollout is not healthy", &paused_at),
        ],
        "currentPodHash": CANARY, "stableRS": STABLE,
        "pauseConditions": [{"reason": "BlueGreenPause", "startTime": paused_at}],
        "controllerPause": true,
        "observedGeneration": "1", "phase": "Paused", "message": "BlueGreenPause",
        "selector": format!("app=web,rollouts-pod-template-hash={STABLE}")
    });
    let argo = Takeover::new("bluegreen-paused", 2, V2, blue_green(2), status).await;
    argo.replica_set(STABLE, V1, 2, "1", json!({})).await;
    argo.replica_set(CANARY, V2, 2, "2", json!({})).await;
    argo.service("web-active", STABLE).await;
    argo.service("web-preview", CANARY).await;
    argo.wait_running(&[(STABLE, 2), (CANARY, 2)]).await;

    let (controller, argo_status) = argo.start_controller().await;
    argo.settled(&controller).await;
    argo.assert_nothing_moved(&argo_status).await;
    let status = argo.sim.status("web").await;
    assert_eq!(status.current_pod_hash, CANARY);
    assert_eq!(status.blue_green.active_selector, STABLE);
    assert_eq!(status.blue_green.preview_selector, CANARY);
    assert_eq!(
        status
            .pause_conditions
            .iter()
            .map(|condition| condition.reason.as_str())
            .collect::<Vec<_>>(),
        vec!["BlueGreenPause"]
    );

    argo.promote().await;
    let done = eventually(DEADLINE, "promoted to Argo's preview", || async {
        let status = argo.sim.status("web").await;
        (status.stable_rs == CANARY && status.blue_green.active_selector == CANARY)
            .then_some(status)
    })
    .await;
    assert_eq!(done.current_pod_hash, CANARY);
    eventually(
        DEADLINE,
        "Argo's old active scaled down after the delay",
        || async {
            let expected = BTreeMap::from([
                (format!("web-{STABLE}"), (0, 0)),
                (format!("web-{CANARY}"), (2, 2)),
            ]);
            (argo.replica_sets().await == expected).then_some(())
        },
    )
    .await;
}

/// A blue-green Argo promoted 10 seconds before it stopped: `web-6c9f7d8b4` active, the old
/// `web-5d7c8f9b6` still at 2 pods with Argo's `scale-down-deadline` 25 seconds ahead.
#[tokio::test]
async fn a_blue_green_argo_left_in_its_scale_down_delay_scales_down_at_argos_deadline() {
    let at = seconds_ago(600);
    let promoted = seconds_ago(10);
    let deadline_second = Timestamp::now().as_second() + 25;
    let deadline = Timestamp::from_second(deadline_second)
        .expect("a time")
        .to_string();
    let status = json!({
        "HPAReplicas": 2, "replicas": 4, "updatedReplicas": 2, "readyReplicas": 2,
        "availableReplicas": 2,
        "blueGreen": {"activeSelector": CANARY, "previewSelector": CANARY},
        "canary": {},
        "conditions": [
            condition("Available", "True", "AvailableReason", "Rollout has minimum availability", &at),
            condition("Progressing", "True", "NewReplicaSetAvailable",
                &format!("ReplicaSet \"web-{CANARY}\" has successfully progressed."), &promoted),
            condition("Completed", "True", "RolloutCompleted", "RolloutCompleted", &promoted),
            condition("Healthy", "True", "RolloutHealthy", "Rollout is healthy", &promoted),
        ],
        "currentPodHash": CANARY, "stableRS": CANARY,
        "observedGeneration": "1", "phase": "Healthy",
        "selector": format!("app=web,rollouts-pod-template-hash={CANARY}")
    });
    let argo = Takeover::new("bluegreen-delay", 2, V2, blue_green(30), status).await;
    argo.replica_set(STABLE, V1, 2, "1", json!({"scale-down-deadline": deadline}))
        .await;
    argo.replica_set(CANARY, V2, 2, "2", json!({})).await;
    argo.service("web-active", CANARY).await;
    argo.service("web-preview", CANARY).await;
    argo.wait_running(&[(STABLE, 2), (CANARY, 2)]).await;

    let (controller, argo_status) = argo.start_controller().await;
    argo.settled(&controller).await;
    assert!(
        Timestamp::now().as_second() < deadline_second,
        "the takeover took longer than Argo's delay: nothing left to check"
    );
    argo.assert_nothing_moved(&argo_status).await;
    let status = argo.sim.status("web").await;
    assert_eq!(status.stable_rs, CANARY);
    assert_eq!(status.blue_green.active_selector, CANARY);

    eventually(DEADLINE, "Argo's old active scaled down", || async {
        let expected = BTreeMap::from([
            (format!("web-{STABLE}"), (0, 0)),
            (format!("web-{CANARY}"), (2, 2)),
        ]);
        (argo.replica_sets().await == expected).then_some(())
    })
    .await;
    assert!(
        Timestamp::now().as_second() >= deadline_second,
        "scaled down before Argo's scale-down-deadline {deadline}"
    );
}

fn istio(kind: &str, plural: &str) -> ApiResource {
    let gvk = GroupVersionKind::gvk("networking.istio.io", "v1alpha3", kind);
    ApiResource::from_gvk_with_plural(&gvk, plural)
}

/// Argo's VirtualService route `primary` at `canary` percent, between DestinationRule subsets.
fn primary_route(canary: i64) -> Value {
    json!({"name": "primary", "route": [
        {"destination": {"host": "web", "subset": "stable"}, "weight": 100 - canary},
        {"destination": {"host": "web", "subset": "canary"}, "weight": canary}
    ]})
}

/// A canary routed by Istio subsets that Argo paused at `pause: {}` after `setWeight: 25`:
/// the VirtualService at 75/25 and the DestinationRule's subsets labelled with Argo's hashes,
/// `web-6c9f7d8b4` at 1 pod beside `web-5d7c8f9b6` at all 4.
#[tokio::test]
async fn an_istio_canary_argo_paused_keeps_argos_hashes_in_the_destination_rule() {
    let paused_at = seconds_ago(60);
    let at = seconds_ago(600);
    let strategy = json!({"canary": {
        "stableService": "web-stable", "canaryService": "web-canary",
        "scaleDownDelaySeconds": 2,
        "trafficRouting": {"istio": {
            "virtualService": {"name": "web", "routes": ["primary"]},
            "destinationRule": {"name": "web", "canarySubsetName": "canary", "stableSubsetName": "stable"}
        }},
        "steps": [{"setWeight": 25}, {"pause": {}}]
    }});
    let status = json!({
        "HPAReplicas": 5, "replicas": 5, "updatedReplicas": 1, "readyReplicas": 5,
        "availableReplicas": 5,
        "blueGreen": {},
        "canary": {"weights": {
            "canary": {"weight": 25, "podTemplateHash": CANARY, "serviceName": "web-canary"},
            "stable": {"weight": 75, "podTemplateHash": STABLE, "serviceName": "web-stable"}
        }},
        "conditions": [
            condition("Available", "True", "AvailableReason", "Rollout has minimum availability", &at),
            condition("Progressing", "Unknown", "RolloutPaused", "Rollout is paused", &paused_at),
            condition("Paused", "True", "RolloutPaused", "Rollout is paused", &paused_at),
            condition("Completed", "False", "RolloutCompleted", "RolloutCompleted", &paused_at),
            condition("Healthy", "False", "RolloutHealthy", "Rollout is not healthy", &paused_at),
        ],
        "currentPodHash": CANARY, "stableRS": STABLE,
        "currentStepHash": PAUSE_STEPS_HASH, "currentStepIndex": 1,
        "pauseConditions": [{"reason": "CanaryPauseStep", "startTime": paused_at}],
        "controllerPause": true,
        "observedGeneration": "1", "phase": "Paused", "message": "CanaryPauseStep",
        "selector": "app=web"
    });
    let argo = Takeover::routed("istio", 4, V2, strategy, status).await;
    argo.replica_set(STABLE, V1, 4, "1", json!({})).await;
    argo.replica_set(CANARY, V2, 1, "2", json!({})).await;
    argo.service("web-stable", STABLE).await;
    argo.service("web-canary", CANARY).await;
    let virtual_services: Api<DynamicObject> = Api::namespaced_with(
        argo.sim.client.clone(),
        NAMESPACE,
        &istio("VirtualService", "virtualservices"),
    );
    let destination_rules: Api<DynamicObject> = Api::namespaced_with(
        argo.sim.client.clone(),
        NAMESPACE,
        &istio("DestinationRule", "destinationrules"),
    );
    let vs: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "networking.istio.io/v1alpha3", "kind": "VirtualService",
        "metadata": {"name": "web", "namespace": NAMESPACE},
        "spec": {"hosts": ["web"], "http": [primary_route(25)]}
    }))
    .expect("a VirtualService");
    virtual_services
        .create(&PostParams::default(), &vs)
        .await
        .expect("creates the VirtualService");
    let subset = |name: &str, hash: &str| json!({"name": name, "labels": {"app": "web", "rollouts-pod-template-hash": hash}});
    let rule: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "networking.istio.io/v1alpha3", "kind": "DestinationRule",
        "metadata": {
            "name": "web", "namespace": NAMESPACE,
            "annotations": {"argo-rollouts.argoproj.io/managed-by-rollouts": "web"}
        },
        "spec": {"host": "web", "subsets": [subset("canary", CANARY), subset("stable", STABLE)]}
    }))
    .expect("a DestinationRule");
    destination_rules
        .create(&PostParams::default(), &rule)
        .await
        .expect("creates the DestinationRule");
    argo.wait_running(&[(STABLE, 4), (CANARY, 1)]).await;

    let (controller, argo_status) = argo.start_controller().await;
    argo.settled(&controller).await;
    argo.assert_nothing_moved(&argo_status).await;
    let status = argo.sim.status("web").await;
    assert_eq!(status.current_step_index, Some(1));
    assert_eq!(status.current_pod_hash, CANARY);

    argo.promote().await;
    let done = argo.sim.wait_healthy(DEADLINE, "web", 4).await;
    assert_eq!(done.stable_rs, CANARY);
    let rule = destination_rules
        .get("web")
        .await
        .expect("reads the DestinationRule");
    let hashes: Vec<Value> = rule.data["spec"]["subsets"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|subset| subset["labels"]["rollouts-pod-template-hash"].clone())
        .collect();
    assert_eq!(hashes, vec![json!(CANARY), json!(CANARY)]);
    let vs = virtual_services
        .get("web")
        .await
        .expect("reads the VirtualService");
    assert_eq!(vs.data["spec"]["http"][0], primary_route(0));
    eventually(
        DEADLINE,
        "Argo's stable scaled down after the delay",
        || async {
            let expected = BTreeMap::from([
                (format!("web-{STABLE}"), (0, 0)),
                (format!("web-{CANARY}"), (4, 4)),
            ]);
            (argo.replica_sets().await == expected).then_some(())
        },
    )
    .await;
}
