//! The plugin driving the real `rollouts-controller` binary: kube-sim in-process, the controller
//! as a process against it, and every verb run as `kubectl rollouts ...` through the real kubectl
//! (the plugin's directory first on PATH). Nothing here writes a Rollout's status: what the tests
//! see is what the controller did after the plugin's patch.
//!
//! The controller is not a binary of this package, so it is taken from next to the test
//! executable (`target/<profile>/rollouts-controller`); `cargo test --workspace` builds it first,
//! `cargo build -p rollouts-controller` does it alone.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use rollouts_crds::analysis::{AnalysisPhase, AnalysisRun};
use rollouts_crds::rollout::{Rollout, RolloutStatus};
use serde_json::{Value, json};
use support::{Controller, NAMESPACE, World, eventually_within, metric_stub};

// A deadline, not a timing: the suite shares two cores with builds and other tests.
const DEADLINE: Duration = Duration::from_secs(60);

/// A world with the controller running against it.
struct Live {
    world: World,
    _controller: Controller,
}

impl std::ops::Deref for Live {
    type Target = World;

    fn deref(&self) -> &World {
        &self.world
    }
}

impl Live {
    fn start(label: &str) -> Self {
        let world = World::start("live", label);
        let controller = Controller::start(&world.kubeconfig());
        Self {
            world,
            _controller: controller,
        }
    }

    fn rollouts(&self) -> Api<Rollout> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    async fn rollout(&self, name: &str) -> Rollout {
        self.rollouts().get(name).await.expect("reads the Rollout")
    }

    async fn status(&self, name: &str) -> RolloutStatus {
        self.rollout(name).await.status.unwrap_or_default()
    }

    /// The Rollout's ReplicaSets by pod-template hash: (spec.replicas, availableReplicas).
    async fn replica_sets(&self, rollout: &str) -> BTreeMap<String, (i32, i32)> {
        let api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), NAMESPACE);
        let listed = api.list(&ListParams::default()).await.expect("lists");
        listed
            .items
            .iter()
            .filter(|rs| rs.owner_references().iter().any(|o| o.name == rollout))
            .map(|rs| {
                let hash = rs
                    .labels()
                    .get("rollouts-pod-template-hash")
                    .cloned()
                    .unwrap_or_default();
                let replicas = rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                let available = rs
                    .status
                    .as_ref()
                    .and_then(|s| s.available_replicas)
                    .unwrap_or(0);
                (hash, (replicas, available))
            })
            .collect()
    }

    /// Waits until the Rollout is Healthy with every pod of its current revision available;
    /// returns that revision's hash.
    async fn healthy(&self, name: &str, replicas: i32) -> String {
        eventually(&format!("{name} Healthy"), async || {
            let status = self.status(name).await;
            let done = status.phase == "Healthy"
                && !status.current_pod_hash.is_empty()
                && status.stable_rs == status.current_pod_hash
                && status.available_replicas == replicas;
            done.then_some(status.current_pod_hash)
        })
        .await
    }

    /// Waits for a step pause at `index` with the ReplicaSets at `sizes` (hash -> replicas, all
    /// available, the others at zero).
    async fn paused_at(&self, name: &str, index: i32, sizes: &[(&str, i32)]) {
        eventually(
            &format!("{name} paused at step {index} with {sizes:?}"),
            async || {
                let status = self.status(name).await;
                let paused =
                    status.current_step_index == Some(index) && !status.pause_conditions.is_empty();
                let sets = self.replica_sets(name).await;
                let all_there = sizes.iter().all(|(hash, _)| sets.contains_key(*hash));
                let sized = all_there
                    && sets.iter().all(|(hash, (replicas, available))| {
                        let want = sizes.iter().find(|(h, _)| h == hash).map_or(0, |(_, n)| *n);
                        *replicas == want && *available == want
                    });
                (paused && sized).then_some(())
            },
        )
        .await
    }

    /// Waits for a new revision (a pod-template hash other than `old`); returns its hash.
    async fn new_revision(&self, name: &str, old: &str) -> String {
        eventually(&format!("{name} leaving revision {old}"), async || {
            let hash = self.status(name).await.current_pod_hash;
            (!hash.is_empty() && hash != old).then_some(hash)
        })
        .await
    }
}

/// A canary Rollout of four `app` pods with two indefinite pauses.
fn rollout(name: &str, image: &str) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": 4,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": image}]}
            },
            "strategy": {"canary": {"steps": [
                {"setWeight": 25}, {"pause": {}}, {"setWeight": 50}, {"pause": {}}
            ]}}
        }
    })
}

async fn eventually<T>(what: &str, check: impl AsyncFnMut() -> Option<T>) -> T {
    eventually_within(DEADLINE, what, check).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promote_abort_retry_and_status_drive_the_controller() {
    let world = Live::start("promote");
    world
        .sim
        .create(NAMESPACE, rollout("web", "app:v1"))
        .expect("seed");
    let v1 = world.healthy("web", 4).await;
    let healthy = world.ok(&["status", "web", "--timeout", "60s"]);
    assert!(healthy.ends_with("Healthy\n"), "{healthy}");

    assert_eq!(
        world.ok(&["set", "image", "web", "app=app:v2"]),
        "rollout \"web\" image updated\n"
    );
    let v2 = world.new_revision("web", &v1).await;
    world.paused_at("web", 1, &[(&v1, 3), (&v2, 1)]).await;

    // promote skips the step pause: on to setWeight 50 and the second pause.
    assert_eq!(world.ok(&["promote", "web"]), "rollout 'web' promoted\n");
    world.paused_at("web", 3, &[(&v1, 2), (&v2, 2)]).await;

    // abort: back to the stable pods, and the Rollout is Degraded.
    assert_eq!(world.ok(&["abort", "web"]), "rollout 'web' aborted\n");
    eventually("web aborted back to stable", async || {
        let status = world.status("web").await;
        let sets = world.replica_sets("web").await;
        (status.abort
            && status.phase == "Degraded"
            && status.stable_rs == v1
            && sets.get(&v1) == Some(&(4, 4))
            && sets.get(&v2).is_some_and(|(replicas, _)| *replicas == 0))
        .then_some(())
    })
    .await;
    let degraded = world.run(&["status", "web", "--timeout", "60s"]);
    assert!(
        !degraded.status.success(),
        "status exits non-zero on Degraded"
    );
    let stderr = String::from_utf8_lossy(&degraded.stderr);
    assert!(stderr.contains("rollout 'web' is degraded"), "{stderr}");

    // retry: the canary comes back from the first step.
    assert_eq!(
        world.ok(&["retry", "rollout", "web"]),
        "rollout 'web' retried\n"
    );
    world.paused_at("web", 1, &[(&v1, 3), (&v2, 1)]).await;
    assert!(!world.status("web").await.abort);

    // promote --full: every remaining step skipped, v2 becomes stable.
    assert_eq!(
        world.ok(&["promote", "web", "--full"]),
        "rollout 'web' fully promoted\n"
    );
    assert_eq!(world.healthy("web", 4).await, v2);
    let done = world.ok(&["status", "web", "--timeout", "60s"]);
    assert!(done.ends_with("Healthy\n"), "{done}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_resume_and_undo_drive_the_controller() {
    let world = Live::start("undo");
    world
        .sim
        .create(NAMESPACE, rollout("shop", "app:v1"))
        .expect("seed");
    let v1 = world.healthy("shop", 4).await;

    assert_eq!(world.ok(&["pause", "shop"]), "rollout 'shop' paused\n");
    assert_eq!(world.rollout("shop").await.spec.paused, Some(true));
    eventually("the controller to report the manual pause", async || {
        let status = world.status("shop").await;
        (status.phase == "Paused" && status.message == "manually paused").then_some(())
    })
    .await;
    let once = world.ok(&["status", "shop", "--watch=false"]);
    assert_eq!(once, "Paused - manually paused\n");

    world.ok(&["set", "image", "shop", "app=app:v2"]);
    let v2 = world.new_revision("shop", &v1).await;
    // As in Argo, spec.paused holds the steps, not the first step's canary: once that pod is
    // available, the step index still stays where it was.
    eventually("the canary pod available while paused", async || {
        let sets = world.replica_sets("shop").await;
        (sets.get(&v2) == Some(&(1, 1))).then_some(())
    })
    .await;
    let held = world.status("shop").await;
    assert_eq!(
        (held.current_step_index, held.phase.as_str()),
        (Some(0), "Paused")
    );
    assert!(held.pause_conditions.is_empty(), "{held:?}");
    assert_eq!(world.ok(&["resume", "shop"]), "rollout 'shop' resumed\n");
    assert_eq!(world.rollout("shop").await.spec.paused, Some(false));
    world.paused_at("shop", 1, &[(&v1, 3), (&v2, 1)]).await;
    world.ok(&["promote", "shop", "--full"]);
    assert_eq!(world.healthy("shop", 4).await, v2);

    // undo: the template of revision 1 comes back, and the controller rolls out to it.
    assert_eq!(
        world.ok(&["undo", "shop"]),
        "rollout 'shop' rolled back to revision 1\n"
    );
    let template = world
        .rollout("shop")
        .await
        .spec
        .template
        .unwrap_or_default();
    let image =
        serde_json::to_value(&template).expect("JSON")["spec"]["containers"][0]["image"].clone();
    assert_eq!(image, "app:v1");
    assert_eq!(world.new_revision("shop", &v2).await, v1);
    world.ok(&["promote", "shop", "--full"]);
    assert_eq!(world.healthy("shop", 4).await, v1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_analysisrun_starts_a_run_the_controller_measures() {
    let world = Live::start("create-run");
    let (stub, paths) = metric_stub(vec![json!({"rate": 0.99})]);
    world
        .sim
        .create(
            NAMESPACE,
            json!({
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "AnalysisTemplate",
                "metadata": {"name": "success-rate", "namespace": NAMESPACE,
                             "labels": {"team": "checkout"}},
                "spec": {
                    "args": [{"name": "service"}, {"name": "threshold", "value": "0.95"}],
                    "metrics": [{
                        "name": "success-rate",
                        "interval": "1s",
                        "count": 2,
                        "successCondition": "result >= {{args.threshold}}",
                        "provider": {"web": {
                            "url": format!("{stub}/rate/{{{{args.service}}}}"),
                            "jsonPath": "{$.rate}"
                        }}
                    }]
                }
            }),
        )
        .expect("seed the template");

    let missing = world.run(&["create", "analysisrun", "--from", "success-rate"]);
    assert!(!missing.status.success());
    assert_eq!(
        String::from_utf8_lossy(&missing.stderr),
        "error: analysistemplate \"success-rate\": argument \"service\" must be given a value (fix: pass -a service=VALUE)\n"
    );
    let unknown = world.run(&[
        "create",
        "analysisrun",
        "--from",
        "success-rate",
        "-a",
        "service=x",
        "-a",
        "colour=red",
    ]);
    assert!(!unknown.status.success());
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("has no argument \"colour\""),
        "{}",
        String::from_utf8_lossy(&unknown.stderr)
    );

    let created = world.ok(&[
        "create",
        "analysisrun",
        "--from",
        "success-rate",
        "-a",
        "service=checkout",
    ]);
    let name = created
        .strip_prefix("analysisrun.argoproj.io/")
        .and_then(|rest| rest.strip_suffix(" created\n"))
        .unwrap_or_else(|| panic!("unexpected output: {created}"))
        .to_string();
    assert!(name.starts_with("success-rate-"), "{name}");

    let runs: Api<AnalysisRun> = Api::namespaced(world.client.clone(), NAMESPACE);
    let run = runs.get(&name).await.expect("the run exists");
    assert_eq!(
        run.labels().get("team").map(String::as_str),
        Some("checkout")
    );
    assert_eq!(run.spec.args[0].value.as_deref(), Some("checkout"));
    let finished = eventually(
        "the controller to measure the run to Successful",
        async || {
            let run = runs.get(&name).await.ok()?;
            let status = run.status?;
            (status.phase == AnalysisPhase::Successful).then_some(status)
        },
    )
    .await;
    let result = &finished.metric_results[0];
    assert_eq!(result.successful, 2, "{result:?}");
    let paths = paths.lock().expect("paths").clone();
    assert!(
        paths.len() >= 2 && paths.iter().all(|path| path == "/rate/checkout"),
        "the argument is put into the URL of every measurement: {paths:?}"
    );

    let named = world.ok(&[
        "create",
        "analysisrun",
        "--from",
        "success-rate",
        "-a",
        "service=checkout",
        "--name",
        "by-hand",
    ]);
    assert_eq!(named, "analysisrun.argoproj.io/by-hand created\n");

    // A template in a local file, composing the one in the cluster.
    let file = world.dir.join("composed.yaml");
    std::fs::write(
        &file,
        "apiVersion: argoproj.io/v1alpha1\nkind: AnalysisTemplate\nmetadata:\n  name: composed\nspec:\n  templates:\n  - templateName: success-rate\n",
    )
    .expect("write the template file");
    let from_file = world.ok(&[
        "create",
        "analysisrun",
        "--from-file",
        &file.to_string_lossy(),
        "-a",
        "service=checkout",
        "--generate-name",
        "composed-by-hand-",
    ]);
    let composed_name = from_file
        .strip_prefix("analysisrun.argoproj.io/")
        .and_then(|rest| rest.strip_suffix(" created\n"))
        .unwrap_or_else(|| panic!("unexpected output: {from_file}"));
    assert!(
        composed_name.starts_with("composed-by-hand-"),
        "{composed_name}"
    );
    let composed = runs.get(composed_name).await.expect("the run exists");
    let metrics: Vec<&str> = composed
        .spec
        .metrics
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    assert_eq!(metrics, ["success-rate"]);
    assert_eq!(composed.spec.args.len(), 2);
    let again = world.run(&[
        "create",
        "analysisrun",
        "--from",
        "success-rate",
        "-a",
        "service=checkout",
        "--name",
        "by-hand",
    ]);
    assert!(!again.status.success());
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(
        stderr.starts_with("Error from server (AlreadyExists)") && stderr.contains("by-hand"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_list_and_terminate_an_experiment_the_controller_runs() {
    let world = Live::start("experiment");
    let template = |role: &str, image: &str| {
        json!({
            "name": role,
            "selector": {"matchLabels": {"app": "fresh", "role": role}},
            "template": {
                "metadata": {"labels": {"app": "fresh", "role": role}},
                "spec": {"containers": [{"name": "app", "image": image}]}
            }
        })
    };
    world
        .sim
        .create(
            NAMESPACE,
            json!({
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "Experiment",
                "metadata": {"name": "fresh", "namespace": NAMESPACE},
                "spec": {
                    "scaleDownDelaySeconds": 0,
                    "templates": [template("baseline", "app:v1"), template("canary", "app:v2")]
                }
            }),
        )
        .expect("seed the experiment");

    // The controller runs both templates: the tree shows them Running with a ready pod each.
    let running = eventually("the experiment Running with two ready pods", async || {
        let out = world.ok(&["get", "experiment", "fresh", "--no-color"]);
        let ready = out.matches("ready:1/1").count();
        (out.contains("Status:          ◌ Running") && ready == 2).then_some(out)
    })
    .await;
    for image in ["app:v1 (Σ:baseline)", "app:v2 (Σ:canary)"] {
        assert!(running.contains(image), "{running}");
    }
    assert!(running.contains("├──⧉ fresh-baseline "), "{running}");
    assert!(running.contains("└──⧉ fresh-canary "), "{running}");
    let listed = world.ok(&["list", "experiments"]);
    let row: Vec<&str> = listed
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(&row[..4], ["fresh", "Running", "-", "-"], "{listed}");

    // Terminated, it ends Successful and its ReplicaSets are scaled down at once.
    assert_eq!(
        world.ok(&["terminate", "experiment", "fresh"]),
        "experiment 'fresh' terminated\n"
    );
    let ended = eventually("the experiment ended and scaled down", async || {
        let out = world.ok(&["get", "experiment", "fresh", "--no-color"]);
        let scaled_down = out.matches("• ScaledDown").count();
        (out.contains("Status:          ✔ Successful") && scaled_down == 2).then_some(out)
    })
    .await;
    assert!(!ended.contains("Images:"), "no template runs now: {ended}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_rollout_draws_the_experiment_of_an_experiment_step() {
    let world = Live::start("experiment-step");
    let mut web = rollout("web", "app:v1");
    web["spec"]["strategy"]["canary"]["steps"] = json!([
        {"experiment": {"duration": "1h", "templates": [
            {"name": "baseline", "specRef": "stable"},
            {"name": "canary", "specRef": "canary"}
        ]}},
        {"pause": {}}
    ]);
    world.sim.create(NAMESPACE, web).expect("seed the rollout");
    let v1 = world.healthy("web", 4).await;
    world.ok(&["set", "image", "web", "app=app:v2"]);
    world.new_revision("web", &v1).await;

    // The step's Experiment, its two ReplicaSets and their pods, under revision 2.
    let out = eventually("the step's experiment in the tree", async || {
        let out = world.ok(&["get", "rollout", "web", "--no-color"]);
        let running = out
            .lines()
            .any(|l| l.contains("Σ web-") && l.contains("Experiment") && l.contains("Running"));
        let ready = out
            .lines()
            .filter(|l| l.contains("-2-0-baseline-") || l.contains("-2-0-canary-"))
            .filter(|l| l.contains("Pod") && l.contains("ready:1/1"))
            .count();
        (running && ready == 2).then_some(out)
    })
    .await;
    let lines: Vec<&str> = out.lines().collect();
    let at = |needle: &str| {
        lines
            .iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in:\n{out}"))
    };
    let (revision_2, experiment, revision_1) =
        (at("# revision:2"), at("Σ web-"), at("# revision:1"));
    assert!(revision_2 < experiment && experiment < revision_1, "{out}");
    for template in ["-2-0-baseline ", "-2-0-canary "] {
        assert!(
            lines[experiment + 1..revision_1]
                .iter()
                .any(|l| l.contains("⧉ web-") && l.contains(template)),
            "the{template}ReplicaSet is drawn under the experiment: {out}"
        );
    }
    // Promoted past the step, the experiment is terminated and ends.
    world.ok(&["promote", "web", "--full"]);
    eventually("the experiment to end", async || {
        let out = world.ok(&["get", "rollout", "web", "--no-color"]);
        out.lines()
            .any(|l| l.contains("Σ web-") && !l.contains("Running"))
            .then_some(())
    })
    .await;
}
