//! The real `rollouts-controller` binary running blue-green Rollouts against kube-sim
//! (in-process, CRDs from crds/yaml): automatic, manual and timed promotion, abort before the
//! switch and retry, fast rollbacks inside the scale-down delay, `previewReplicaCount`, pre- and
//! post-promotion analysis (the test plays the AnalysisRun controller by setting the run's
//! phase) and a controller killed during the preview. Each test has its own simulator and
//! controller, so they run in parallel.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use rollouts_crds::analysis::{AnalysisPhase, AnalysisRun};
use rollouts_crds::rollout::{Rollout, RolloutAnalysisRunStatus, RolloutStatus};
use serde_json::{Value, json};
use support::{Controller, NAMESPACE, Sim, eventually};

const DEADLINE: Duration = Duration::from_secs(40);
const REPLICAS: i32 = 3;
/// The label the controller adds to pods and Service selectors.
const HASH_LABEL: &str = "rollouts-pod-template-hash";
/// The annotation that keeps an old ReplicaSet's pods until the time it holds.
const SCALE_DOWN_DEADLINE: &str = "scale-down-deadline";

/// The shared simulator; this file adds its blue-green reads and waits.
type Cluster = Sim;

impl Cluster {
    fn start(name: &str) -> Self {
        Self::start_named("rollouts-bluegreen-on-sim", name)
    }

    fn controller(&self) -> Controller {
        Controller::start(&self.kubeconfig, DEADLINE)
    }

    /// Creates `<app>-active` and `<app>-preview`, then the blue-green Rollout `app` of v1.
    async fn create(&self, app: &str, blue_green: Value) {
        for service in [active(app), preview(app)] {
            self.create_service(&service, app).await;
        }
        self.create_rollout(rollout(app, "app:v1", blue_green))
            .await;
    }

    async fn rollout(&self, name: &str) -> Rollout {
        self.rollouts().get(name).await.expect("reads the Rollout")
    }

    /// The `scale-down-deadline` annotation of ReplicaSet `name`, parsed.
    async fn scale_down_deadline(&self, name: &str) -> Option<Timestamp> {
        let api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), NAMESPACE);
        let rs = api.get(name).await.expect("reads the ReplicaSet");
        rs.annotations()
            .get(SCALE_DOWN_DEADLINE)
            .and_then(|value| value.parse().ok())
    }

    /// The `rollout.argoproj.io/revision` annotation of ReplicaSet `name`.
    async fn revision(&self, name: &str) -> Option<i64> {
        let api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), NAMESPACE);
        let rs = api.get(name).await.expect("reads the ReplicaSet");
        rs.annotations()
            .get("rollout.argoproj.io/revision")
            .and_then(|value| value.parse().ok())
    }

    /// Names of the pods of revision `hash`.
    async fn pods(&self, hash: &str) -> BTreeSet<String> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), NAMESPACE);
        api.list(&ListParams::default().labels(&format!("{HASH_LABEL}={hash}")))
            .await
            .expect("lists pods")
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect()
    }

    /// Sets a new image whose pods take a second to become ready, so a Service switched too
    /// early would be seen.
    async fn set_slow_image(&self, name: &str, image: &str) {
        let patch = json!({"spec": {"template": {
            "metadata": {"annotations": {"sim.rollouts.dev/ready-after": "1s"}},
            "spec": {"containers": [{"name": "app", "image": image}]}
        }}});
        self.rollouts()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("changes the template");
    }

    /// Sets a new image and waits for the controller to see it; returns the new hash.
    async fn update(&self, name: &str, image: &str, from: &str) -> String {
        self.set_image(name, image).await;
        self.update_seen(name, from).await
    }

    /// Waits for a current revision other than `from` (empty: any); returns its hash.
    async fn update_seen(&self, name: &str, from: &str) -> String {
        eventually(DEADLINE, &format!("{name}'s new revision"), || async {
            let hash = self.status(name).await.current_pod_hash;
            (!hash.is_empty() && hash != from).then_some(hash)
        })
        .await
    }

    /// `kubectl rollouts promote` of a paused blue-green Rollout.
    async fn promote(&self, name: &str) {
        self.patch_status(name, json!({"pauseConditions": null}))
            .await;
    }

    /// The revision Service `name` selects, if it selects one.
    async fn selected(&self, name: &str) -> Option<String> {
        let service = self.services().get(name).await.expect("reads the Service");
        let selector = service.spec?.selector?;
        assert_eq!(
            selector.get("app").map(String::as_str),
            Some(name.rsplit_once('-').map_or(name, |(app, _)| app)),
            "the user's selector is kept on {name}"
        );
        selector.get(HASH_LABEL).cloned()
    }

    /// Waits until Service `name` selects the pods of revision `hash`.
    async fn selects(&self, name: &str, hash: &str) {
        eventually(
            DEADLINE,
            &format!("Service {name} selecting {hash}"),
            || async { (self.selected(name).await.as_deref() == Some(hash)).then_some(()) },
        )
        .await;
    }

    /// Waits until `hash` is promoted: Healthy, stable, active, every active pod available.
    async fn promoted(&self, name: &str, hash: &str) -> RolloutStatus {
        let status = eventually(DEADLINE, &format!("{name} Healthy on {hash}"), || async {
            let status = self.status(name).await;
            let done = status.phase == "Healthy"
                && status.current_pod_hash == hash
                && status.stable_rs == hash
                && status.blue_green.active_selector == hash
                && status.available_replicas == REPLICAS;
            done.then_some(status)
        })
        .await;
        self.selects(&active(name), hash).await;
        status
    }

    /// Waits until `hash` is promoted, checking on every look that the active Service selects
    /// it only once all its pods are available (the preview selects it at once, as in Argo).
    async fn switches_safely(&self, name: &str, hash: &str) -> RolloutStatus {
        let rs = format!("{name}-{hash}");
        eventually(DEADLINE, &format!("{name} switched to {hash}"), || async {
            // Services first: pods seen afterwards are at least those they switched with.
            let active_on_new = self.selected(&active(name)).await.as_deref() == Some(hash);
            let available = self.replica_sets(name).await.get(&rs).map_or(0, |n| n.1);
            assert!(
                !active_on_new || available == REPLICAS,
                "{} selects {rs} with {available} of {REPLICAS} pods available",
                active(name)
            );
            let status = self.status(name).await;
            (active_on_new && status.phase == "Healthy" && status.stable_rs == hash).then_some(())
        })
        .await;
        self.promoted(name, hash).await
    }

    /// Waits for the BlueGreenPause with the new revision at `preview_pods` (all available)
    /// and the old one still at full size.
    async fn paused_in_preview(
        &self,
        name: &str,
        old: &str,
        new: &str,
        preview_pods: i32,
    ) -> RolloutStatus {
        let want = BTreeMap::from([
            (format!("{name}-{old}"), (REPLICAS, REPLICAS)),
            (format!("{name}-{new}"), (preview_pods, preview_pods)),
        ]);
        eventually(
            DEADLINE,
            &format!("{name} paused in preview with {want:?}"),
            || async {
                let status = self.status(name).await;
                let paused = status
                    .pause_conditions
                    .iter()
                    .any(|c| c.reason == "BlueGreenPause");
                (paused && self.replica_sets(name).await == want).then_some(status)
            },
        )
        .await
    }

    /// Events recorded on Rollout `name` with `reason`: (note, event time).
    async fn events(&self, name: &str, reason: &str) -> Vec<(String, Option<Timestamp>)> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), NAMESPACE);
        events
            .list(&ListParams::default())
            .await
            .expect("lists events")
            .items
            .into_iter()
            .filter(|event| event.reason.as_deref() == Some(reason))
            .filter(|event| event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .map(|event| {
                let time = event.event_time.map(|time| time.0);
                (event.note.unwrap_or_default(), time)
            })
            .collect()
    }
}

fn active(app: &str) -> String {
    format!("{app}-active")
}

fn preview(app: &str) -> String {
    format!("{app}-preview")
}

/// A blue-green Rollout of [`REPLICAS`] pods of `image`; `blue_green` adds to the strategy's
/// active and preview Services.
fn rollout(name: &str, image: &str, blue_green: Value) -> Rollout {
    let mut strategy = json!({"activeService": active(name), "previewService": preview(name)});
    if let (Some(strategy), Value::Object(extra)) = (strategy.as_object_mut(), blue_green) {
        strategy.extend(extra);
    }
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": REPLICAS,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": image}]}
            },
            "strategy": {"blueGreen": strategy}
        }
    }))
    .expect("a valid Rollout")
}

#[tokio::test]
async fn auto_promotion_switches_to_v2_and_scales_v1_down_after_the_delay() {
    let cluster = Cluster::start("auto");
    let _controller = cluster.controller();
    cluster
        .create("web", json!({"scaleDownDelaySeconds": 2}))
        .await;
    let v1 = cluster.update_seen("web", "").await;
    // First deploy: no pause, both Services on v1.
    cluster.promoted("web", &v1).await;
    cluster.selects(&preview("web"), &v1).await;
    let v1_pods = cluster.pods(&v1).await;
    assert_eq!(v1_pods.len(), 3);

    cluster.set_slow_image("web", "app:v2").await;
    let v2 = cluster.update_seen("web", &v1).await;
    let status = cluster.switches_safely("web", &v2).await;
    assert_eq!(status.stable_rs, status.current_pod_hash);
    assert_eq!(status.blue_green.active_selector, v2);
    assert!(status.pause_conditions.is_empty());
    cluster.selects(&preview("web"), &v2).await;

    // The old revision waits out scaleDownDelaySeconds with its pods, then goes to zero.
    let v1_rs = format!("web-{v1}");
    let deadline = eventually(DEADLINE, "the scale-down deadline on v1", || async {
        cluster.scale_down_deadline(&v1_rs).await
    })
    .await;
    let want = BTreeMap::from([(v1_rs.clone(), (0, 0)), (format!("web-{v2}"), (3, 3))]);
    eventually(DEADLINE, "v1 scaled to zero", || async {
        (cluster.replica_sets("web").await == want).then_some(())
    })
    .await;
    assert!(cluster.pods(&v1).await.is_empty());
    let scaled_down = cluster.events("web", "ScalingReplicaSet").await;
    let (note, at) = scaled_down
        .iter()
        .find(|(note, _)| note.contains(&format!("Scaled down ReplicaSet {v1_rs}")))
        .unwrap_or_else(|| panic!("no scale-down event for {v1_rs}: {scaled_down:?}"));
    let at = at.unwrap_or_else(|| panic!("the event {note:?} has a time"));
    assert!(
        at >= deadline,
        "{v1_rs} was scaled down at {at}, before its deadline {deadline}"
    );
}

#[tokio::test]
async fn manual_promotion_pauses_in_preview_until_promoted() {
    let cluster = Cluster::start("manual");
    let _controller = cluster.controller();
    cluster
        .create("shop", json!({"autoPromotionEnabled": false}))
        .await;
    let v1 = cluster.update_seen("shop", "").await;
    cluster.promoted("shop", &v1).await;

    let v2 = cluster.update("shop", "app:v2", &v1).await;
    let paused = cluster.paused_in_preview("shop", &v1, &v2, REPLICAS).await;
    assert_eq!(paused.phase, "Paused");
    assert!(paused.controller_pause);
    assert_eq!(paused.stable_rs, v1);
    assert_eq!(paused.blue_green.active_selector, v1);
    assert_eq!(paused.blue_green.preview_selector, v2);
    assert_eq!(cluster.selected(&active("shop")).await, Some(v1.clone()));
    cluster.selects(&preview("shop"), &v2).await;

    cluster.promote("shop").await;
    let status = cluster.promoted("shop", &v2).await;
    assert!(status.pause_conditions.is_empty());
    assert!(!status.controller_pause);
    cluster.selects(&preview("shop"), &v2).await;
}

#[tokio::test]
async fn auto_promotion_seconds_switch_by_itself_after_the_delay() {
    let cluster = Cluster::start("timed");
    let _controller = cluster.controller();
    cluster
        .create("cart", json!({"autoPromotionSeconds": 2}))
        .await;
    let v1 = cluster.update_seen("cart", "").await;
    cluster.promoted("cart", &v1).await;

    let v2 = cluster.update("cart", "app:v2", &v1).await;
    let paused = cluster.paused_in_preview("cart", &v1, &v2, REPLICAS).await;
    let started = paused
        .pause_conditions
        .iter()
        .find(|c| c.reason == "BlueGreenPause")
        .map(|c| c.start_time.0)
        .expect("the BlueGreenPause start");
    assert_eq!(paused.blue_green.active_selector, v1);

    // No promote: the pause runs out by itself.
    let status = cluster.promoted("cart", &v2).await;
    let resumed = status
        .condition("Paused")
        .filter(|c| c.status == "False")
        .map(|c| c.last_transition_time.0)
        .expect("the Paused condition, now False");
    let waited = resumed.duration_since(started);
    assert!(
        waited >= k8s_openapi::jiff::SignedDuration::from_secs(2),
        "resumed {waited} after the pause started, before autoPromotionSeconds"
    );
}

#[tokio::test]
async fn abort_in_preview_keeps_active_on_v1_and_the_preview_on_the_aborted_revision() {
    let cluster = Cluster::start("abort");
    let _controller = cluster.controller();
    cluster
        .create(
            "feed",
            json!({"autoPromotionEnabled": false, "abortScaleDownDelaySeconds": 2}),
        )
        .await;
    let v1 = cluster.update_seen("feed", "").await;
    cluster.promoted("feed", &v1).await;
    let v2 = cluster.update("feed", "app:v2", &v1).await;
    cluster.paused_in_preview("feed", &v1, &v2, REPLICAS).await;
    cluster.selects(&preview("feed"), &v2).await;

    cluster.patch_status("feed", json!({"abort": true})).await;
    let aborted = eventually(DEADLINE, "the abort", || async {
        let status = cluster.status("feed").await;
        (status.abort && status.phase == "Degraded").then_some(status)
    })
    .await;
    let progressing = aborted.condition("Progressing").expect("Progressing");
    assert_eq!(progressing.reason, "RolloutAborted");
    assert_eq!(aborted.stable_rs, v1);
    assert_eq!(aborted.current_pod_hash, v2);
    assert_eq!(aborted.blue_green.active_selector, v1);
    assert!(aborted.pause_conditions.is_empty());
    // As Argo's reconcilePreviewService: the preview stays on the new revision.
    assert_eq!(aborted.blue_green.preview_selector, v2);
    cluster.selects(&preview("feed"), &v2).await;
    assert_eq!(cluster.selected(&active("feed")).await, Some(v1.clone()));
    // abortScaleDownDelaySeconds later the aborted revision has no pods; v1 never lost one.
    let v1_pods = cluster.pods(&v1).await;
    let want = BTreeMap::from([
        (format!("feed-{v1}"), (REPLICAS, REPLICAS)),
        (format!("feed-{v2}"), (0, 0)),
    ]);
    eventually(DEADLINE, "v2 scaled down after the abort delay", || async {
        (cluster.replica_sets("feed").await == want).then_some(())
    })
    .await;
    assert_eq!(cluster.pods(&v1).await, v1_pods);
    assert_eq!(cluster.selected(&active("feed")).await, Some(v1.clone()));

    // Retry: the preview comes back and waits for a person again.
    cluster.patch_status("feed", json!({"abort": false})).await;
    let retried = cluster.paused_in_preview("feed", &v1, &v2, REPLICAS).await;
    assert!(!retried.abort);
    assert_eq!(retried.blue_green.active_selector, v1);
    cluster.selects(&preview("feed"), &v2).await;
    cluster.promote("feed").await;
    cluster.promoted("feed", &v2).await;
}

#[tokio::test]
async fn a_rollback_within_the_scale_down_delay_switches_back_without_new_pods() {
    let cluster = Cluster::start("rollback");
    let _controller = cluster.controller();
    // Long enough that v1 still has its pods when the test rolls back.
    cluster
        .create("pay", json!({"scaleDownDelaySeconds": 300}))
        .await;
    let v1 = cluster.update_seen("pay", "").await;
    cluster.promoted("pay", &v1).await;
    let v1_pods = cluster.pods(&v1).await;
    let v2 = cluster.update("pay", "app:v2", &v1).await;
    cluster.promoted("pay", &v2).await;
    let v1_rs = format!("pay-{v1}");
    eventually(DEADLINE, "the scale-down deadline on v1", || async {
        cluster.scale_down_deadline(&v1_rs).await
    })
    .await;
    assert_eq!(
        cluster.replica_sets("pay").await.get(&v1_rs),
        Some(&(REPLICAS, REPLICAS))
    );
    let v2_pods = cluster.pods(&v2).await;

    let back = cluster.update("pay", "app:v1", &v2).await;
    assert_eq!(back, v1, "the same template gives the same revision");
    let status = cluster.promoted("pay", &v1).await;
    assert!(status.pause_conditions.is_empty());
    cluster.selects(&preview("pay"), &v1).await;
    // The switch reused v1's running pods; v2 keeps its own for the delay.
    assert_eq!(cluster.pods(&v1).await, v1_pods);
    assert_eq!(cluster.pods(&v2).await, v2_pods);
    assert_eq!(
        cluster.replica_sets("pay").await.len(),
        2,
        "no new ReplicaSet"
    );
    assert_eq!(cluster.scale_down_deadline(&v1_rs).await, None);
    assert_eq!(
        cluster.revision(&v1_rs).await,
        Some(3),
        "v1 is the newest revision"
    );
    let v2_rs = format!("pay-{v2}");
    eventually(DEADLINE, "the scale-down deadline on v2", || async {
        cluster.scale_down_deadline(&v2_rs).await
    })
    .await;
}

#[tokio::test]
async fn preview_replica_count_runs_one_pod_until_promotion_then_scales_up_before_the_switch() {
    let cluster = Cluster::start("preview-count");
    let _controller = cluster.controller();
    cluster
        .create(
            "search",
            json!({"autoPromotionEnabled": false, "previewReplicaCount": 1}),
        )
        .await;
    let v1 = cluster.update_seen("search", "").await;
    cluster.promoted("search", &v1).await;
    // The first deploy is not a preview: every pod at once.
    assert_eq!(
        cluster.replica_sets("search").await,
        BTreeMap::from([(format!("search-{v1}"), (REPLICAS, REPLICAS))])
    );

    cluster.set_slow_image("search", "app:v2").await;
    let v2 = cluster.update_seen("search", &v1).await;
    let paused = cluster.paused_in_preview("search", &v1, &v2, 1).await;
    assert_eq!(paused.blue_green.active_selector, v1);
    assert!(!paused.blue_green.scale_up_preview_check_point);
    cluster.selects(&preview("search"), &v2).await;

    cluster.promote("search").await;
    let status = cluster.switches_safely("search", &v2).await;
    assert!(!status.blue_green.scale_up_preview_check_point);
}

/// An AnalysisTemplate whose metric errors at once (nothing listens on port 9) and measures
/// again only after an hour, so the run stays Running until the test sets its phase.
async fn create_template(cluster: &Cluster, name: &str) {
    cluster
        .create_template(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AnalysisTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "args": [{"name": "preview-hash"}],
            "metrics": [{
                "name": "errors",
                "interval": "1h",
                "successCondition": "result < 1",
                "provider": {"web": {"url": "http://127.0.0.1:9/errors?hash={{args.preview-hash}}"}}
            }]
        }
        }))
        .await;
}

/// `prePromotionAnalysis` or `postPromotionAnalysis` of the `smoke` template on the new hash.
fn promotion_analysis(promotion: Promotion) -> Value {
    let field = match promotion {
        Promotion::Pre => "prePromotionAnalysis",
        Promotion::Post => "postPromotionAnalysis",
    };
    json!({field: {
        "templates": [{"templateName": "smoke"}],
        "args": [{"name": "preview-hash", "valueFrom": {"podTemplateHashValue": "Latest"}}]
    }})
}

/// Which promotion analysis a run belongs to.
#[derive(Clone, Copy)]
enum Promotion {
    Pre,
    Post,
}

impl Promotion {
    fn rollout_type(self) -> &'static str {
        match self {
            Promotion::Pre => "PrePromotion",
            Promotion::Post => "PostPromotion",
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Promotion::Pre => "pre",
            Promotion::Post => "post",
        }
    }

    fn pointer(self, status: &RolloutStatus) -> Option<&RolloutAnalysisRunStatus> {
        match self {
            Promotion::Pre => status.blue_green.pre_promotion_analysis_run_status.as_ref(),
            Promotion::Post => status
                .blue_green
                .post_promotion_analysis_run_status
                .as_ref(),
        }
    }
}

/// Waits for the `promotion` run of revision `hash` (revision 2) to be measured and recorded
/// in status, checks how it was created; returns its name and that status.
async fn promotion_run(
    cluster: &Cluster,
    rollout: &str,
    hash: &str,
    promotion: Promotion,
) -> (String, RolloutStatus) {
    let runs: Api<AnalysisRun> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let name = format!("{rollout}-{hash}-2-{}", promotion.suffix());
    let run = eventually(
        DEADLINE,
        &format!("AnalysisRun {name}, measured once"),
        || async {
            let run = runs.get_opt(&name).await.ok()??;
            let measured = run
                .status
                .as_ref()
                .is_some_and(|s| s.phase == AnalysisPhase::Running);
            measured.then_some(run)
        },
    )
    .await;
    assert!(run.owner_references().iter().any(|o| o.name == rollout));
    let labels = run.labels();
    assert_eq!(labels["rollout-type"], promotion.rollout_type());
    assert_eq!(labels[HASH_LABEL], hash);
    let arg = run
        .spec
        .args
        .iter()
        .find(|arg| arg.name == "preview-hash")
        .expect("the template's argument");
    assert_eq!(arg.value.as_deref(), Some(hash));
    let status = eventually(DEADLINE, "the run recorded in status", || async {
        let status = cluster.status(rollout).await;
        let pointer = promotion.pointer(&status)?;
        (pointer.name == name && pointer.status == "Running").then_some(status.clone())
    })
    .await;
    (name, status)
}

#[tokio::test]
async fn a_successful_pre_promotion_analysis_lets_the_switch_happen() {
    let cluster = Cluster::start("analysis-pass");
    let _controller = cluster.controller();
    create_template(&cluster, "smoke").await;
    cluster
        .create("api", promotion_analysis(Promotion::Pre))
        .await;
    let v1 = cluster.update_seen("api", "").await;
    cluster.promoted("api", &v1).await;
    let v2 = cluster.update("api", "app:v2", &v1).await;
    let (run, waiting) = promotion_run(&cluster, "api", &v2, Promotion::Pre).await;
    assert_eq!(waiting.blue_green.active_selector, v1);
    assert_eq!(cluster.selected(&active("api")).await, Some(v1.clone()));
    cluster.selects(&preview("api"), &v2).await;

    cluster.finish_run(&run, "Successful").await;
    let status = cluster.promoted("api", &v2).await;
    let pointer = status
        .blue_green
        .pre_promotion_analysis_run_status
        .expect("the last run stays recorded");
    assert_eq!(
        (pointer.name.as_str(), pointer.status.as_str()),
        (run.as_str(), "Successful")
    );
}

#[tokio::test]
async fn a_failed_pre_promotion_analysis_aborts_with_active_on_v1() {
    let cluster = Cluster::start("analysis-fail");
    let _controller = cluster.controller();
    create_template(&cluster, "smoke").await;
    cluster
        .create("mail", promotion_analysis(Promotion::Pre))
        .await;
    let v1 = cluster.update_seen("mail", "").await;
    cluster.promoted("mail", &v1).await;
    let v2 = cluster.update("mail", "app:v2", &v1).await;
    let (run, waiting) = promotion_run(&cluster, "mail", &v2, Promotion::Pre).await;
    assert_eq!(waiting.blue_green.active_selector, v1);

    cluster.finish_run(&run, "Failed").await;
    let status = eventually(DEADLINE, "the automatic abort", || async {
        let status = cluster.status("mail").await;
        (status.abort && status.phase == "Degraded").then_some(status)
    })
    .await;
    let progressing = status.condition("Progressing").expect("Progressing");
    assert_eq!(progressing.reason, "RolloutAborted");
    assert!(
        progressing.message.contains("run Failed"),
        "{}",
        progressing.message
    );
    assert_eq!(status.stable_rs, v1);
    assert_eq!(status.blue_green.active_selector, v1);
    assert_eq!(cluster.selected(&active("mail")).await, Some(v1.clone()));
    // The preview stays on the aborted revision, as Argo's reconcilePreviewService leaves it.
    cluster.selects(&preview("mail"), &v2).await;
}

#[tokio::test]
async fn a_controller_killed_during_the_preview_pause_changes_nothing() {
    let cluster = Cluster::start("kill");
    let controller = cluster.controller();
    cluster
        .create("news", json!({"autoPromotionEnabled": false}))
        .await;
    let v1 = cluster.update_seen("news", "").await;
    cluster.promoted("news", &v1).await;
    let v2 = cluster.update("news", "app:v2", &v1).await;
    cluster.paused_in_preview("news", &v1, &v2, REPLICAS).await;
    cluster.selects(&preview("news"), &v2).await;
    // The pause is written in the plan that finds every preview pod available: nothing is
    // left to change until a person acts.
    let before = cluster.rollout("news").await;
    let sets = cluster.replica_sets("news").await;
    let pods = (cluster.pods(&v1).await, cluster.pods(&v2).await);
    let selectors = (
        cluster.selected(&active("news")).await,
        cluster.selected(&preview("news")).await,
    );
    controller.kill().await;

    let restarted = cluster.controller();
    eventually(DEADLINE, "a reconcile by the new controller", || async {
        (restarted.reconciles("news").await >= 1).then_some(())
    })
    .await;
    let after = cluster.rollout("news").await;
    assert_eq!(after.status, before.status);
    assert_eq!(
        after.resource_version(),
        before.resource_version(),
        "no write"
    );
    assert_eq!(cluster.replica_sets("news").await, sets);
    assert_eq!((cluster.pods(&v1).await, cluster.pods(&v2).await), pods);
    assert_eq!(
        (
            cluster.selected(&active("news")).await,
            cluster.selected(&preview("news")).await,
        ),
        selectors
    );

    // And the paused update still finishes on a promote.
    cluster.promote("news").await;
    cluster.promoted("news", &v2).await;
}

#[tokio::test]
async fn flipping_back_and_forth_within_the_delay_never_waits_for_a_person() {
    let cluster = Cluster::start("flip");
    let _controller = cluster.controller();
    cluster
        .create(
            "flip",
            json!({"autoPromotionEnabled": false, "scaleDownDelaySeconds": 300}),
        )
        .await;
    let v1 = cluster.update_seen("flip", "").await;
    cluster.promoted("flip", &v1).await;
    let v2 = cluster.update("flip", "app:v2", &v1).await;
    cluster.paused_in_preview("flip", &v1, &v2, REPLICAS).await;
    cluster.promote("flip").await;
    cluster.promoted("flip", &v2).await;
    let v1_rs = format!("flip-{v1}");
    eventually(DEADLINE, "the scale-down deadline on v1", || async {
        cluster.scale_down_deadline(&v1_rs).await
    })
    .await;

    cluster.update("flip", "app:v1", &v2).await;
    cluster.promoted("flip", &v1).await;
    let v2_rs = format!("flip-{v2}");
    eventually(DEADLINE, "the scale-down deadline on v2", || async {
        cluster.scale_down_deadline(&v2_rs).await
    })
    .await;
    let pods = (cluster.pods(&v1).await, cluster.pods(&v2).await);

    cluster.update("flip", "app:v2", &v1).await;
    let status = cluster.promoted("flip", &v2).await;
    assert!(status.pause_conditions.is_empty());
    assert_eq!((cluster.pods(&v1).await, cluster.pods(&v2).await), pods);
}

#[tokio::test]
async fn a_failed_post_promotion_analysis_switches_active_back_to_v1() {
    let cluster = Cluster::start("post-fail");
    let _controller = cluster.controller();
    create_template(&cluster, "smoke").await;
    cluster
        .create("blog", promotion_analysis(Promotion::Post))
        .await;
    let v1 = cluster.update_seen("blog", "").await;
    cluster.promoted("blog", &v1).await;
    let v2 = cluster.update("blog", "app:v2", &v1).await;
    let (run, switched) = promotion_run(&cluster, "blog", &v2, Promotion::Post).await;
    // Switched, but not stable until the analysis passes; v1 keeps its pods meanwhile.
    assert_eq!(switched.blue_green.active_selector, v2);
    assert_eq!(switched.stable_rs, v1);
    assert_ne!(switched.phase, "Healthy");
    cluster.selects(&active("blog"), &v2).await;
    assert_eq!(
        cluster
            .replica_sets("blog")
            .await
            .get(&format!("blog-{v1}")),
        Some(&(REPLICAS, REPLICAS))
    );

    cluster.finish_run(&run, "Failed").await;
    let status = eventually(DEADLINE, "the automatic abort", || async {
        let status = cluster.status("blog").await;
        (status.abort && status.phase == "Degraded").then_some(status)
    })
    .await;
    assert_eq!(status.stable_rs, v1);
    assert_eq!(status.blue_green.active_selector, v1);
    cluster.selects(&active("blog"), &v1).await;
    cluster.selects(&preview("blog"), &v2).await;
}

#[tokio::test]
async fn a_successful_post_promotion_analysis_makes_v2_stable() {
    let cluster = Cluster::start("post-pass");
    let _controller = cluster.controller();
    create_template(&cluster, "smoke").await;
    cluster
        .create("wiki", promotion_analysis(Promotion::Post))
        .await;
    let v1 = cluster.update_seen("wiki", "").await;
    cluster.promoted("wiki", &v1).await;
    let v2 = cluster.update("wiki", "app:v2", &v1).await;
    let (run, switched) = promotion_run(&cluster, "wiki", &v2, Promotion::Post).await;
    assert_eq!(switched.stable_rs, v1);

    cluster.finish_run(&run, "Successful").await;
    let status = cluster.promoted("wiki", &v2).await;
    let pointer = Promotion::Post
        .pointer(&status)
        .expect("the run stays recorded");
    assert_eq!(pointer.status, "Successful");
}
