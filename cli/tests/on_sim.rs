//! The plugin through the real `kubectl` (`kubectl rollouts ...`, found on PATH) against an
//! in-process kube-sim. No controller runs: tests write the Rollout's status themselves,
//! through the /status subresource, where a controller would.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};
use support::{Tmux, World, eventually, lines_of, next_line, on_path, wait_exit};

fn world(label: &str) -> World {
    World::start("sim", label)
}

fn rollout(name: &str) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "web", "image": "web:1"}]}
            },
            "strategy": {"canary": {"steps": [{"setWeight": 50}, {"pause": {}}]}}
        }
    })
}

fn healthy() -> Value {
    json!({
        "observedGeneration": "1", "phase": "Healthy", "message": "", "conditions": [],
        "currentPodHash": "aaa", "stableRS": "aaa", "currentStepIndex": 2,
        "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2, "availableReplicas": 2
    })
}

fn progressing() -> Value {
    json!({
        "observedGeneration": "1", "phase": "Progressing",
        "message": "more replicas need to be updated", "conditions": [],
        "currentPodHash": "aaa", "replicas": 2, "updatedReplicas": 0, "availableReplicas": 2
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_verbs_change_the_rollout_through_kubectl() {
    let world = world("verbs");
    world.sim.create("default", rollout("web")).expect("seed");
    world
        .patch_status(
            "web",
            json!({"observedGeneration": "1", "currentStepIndex": 1, "conditions": [],
                   "pauseConditions": [{"reason": "CanaryPauseStep", "startTime": "2026-01-01T00:00:00Z"}]}),
        )
        .await;

    assert_eq!(world.ok(&["pause", "web"]), "rollout 'web' paused\n");
    assert_eq!(world.rollout("web").await["spec"]["paused"], true);
    assert_eq!(world.ok(&["resume", "web"]), "rollout 'web' resumed\n");
    assert_eq!(world.rollout("web").await["spec"]["paused"], false);

    assert_eq!(world.ok(&["promote", "web"]), "rollout 'web' promoted\n");
    let promoted = world.rollout("web").await;
    assert!(
        promoted["status"]["pauseConditions"].is_null(),
        "{promoted}"
    );

    assert_eq!(world.ok(&["abort", "web"]), "rollout 'web' aborted\n");
    assert_eq!(world.rollout("web").await["status"]["abort"], true);
    assert_eq!(
        world.ok(&["retry", "rollout", "web"]),
        "rollout 'web' retried\n"
    );
    assert_ne!(world.rollout("web").await["status"]["abort"], true);

    assert_eq!(
        world.ok(&["set", "image", "web", "web=web:2"]),
        "rollout \"web\" image updated\n"
    );
    assert_eq!(
        world.rollout("web").await["spec"]["template"]["spec"]["containers"][0]["image"],
        "web:2"
    );

    let missing = world.run(&["abort", "nope"]);
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("NotFound"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_watches_until_healthy_or_degraded() {
    let world = world("status");
    for name in ["good", "bad", "slow"] {
        world.sim.create("default", rollout(name)).expect("seed");
        world.patch_status(name, progressing()).await;
    }

    let once = world.run(&["status", "good", "--watch=false"]);
    assert!(once.status.success());
    assert_eq!(
        String::from_utf8_lossy(&once.stdout),
        "Progressing - more replicas need to be updated\n"
    );

    let mut good = world
        .kubectl_rollouts(&["status", "good", "--timeout", "30s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("status runs");
    let good_lines = lines_of(&mut good);
    assert_eq!(
        next_line(&good_lines),
        "Progressing - more replicas need to be updated"
    );
    world.patch_status("good", healthy()).await;
    assert_eq!(next_line(&good_lines), "Healthy");
    assert!(wait_exit(&mut good).success());

    let mut bad = world
        .kubectl_rollouts(&["status", "bad"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("status runs");
    let bad_lines = lines_of(&mut bad);
    next_line(&bad_lines);
    world
        .patch_status(
            "bad",
            json!({"phase": "Degraded", "message": "RolloutAborted: metric error-rate failed",
                   "abort": true}),
        )
        .await;
    assert_eq!(
        next_line(&bad_lines),
        "Degraded - RolloutAborted: metric error-rate failed"
    );
    assert!(!wait_exit(&mut bad).success());
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut bad.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(
        stderr.contains("rollout 'bad' is degraded: RolloutAborted: metric error-rate failed"),
        "{stderr}"
    );

    let slow = world.run(&["status", "slow", "--timeout", "1s"]);
    assert!(!slow.status.success());
    assert!(
        String::from_utf8_lossy(&slow.stderr).contains("did not finish within 1s"),
        "{}",
        String::from_utf8_lossy(&slow.stderr)
    );
}

/// Seeds `web` with a stable ReplicaSet of two pods, owned as the controller would own it.
async fn seed_tree(world: &World) {
    let created = world.sim.create("default", rollout("web")).expect("seed");
    let uid = created["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_string();
    world
        .sim
        .create(
            "default",
            json!({
                "apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {
                    "name": "web-aaa", "namespace": "default",
                    "labels": {"app": "web", "rollouts-pod-template-hash": "aaa"},
                    "annotations": {"rollout.argoproj.io/revision": "1"},
                    "ownerReferences": [{"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
                                         "name": "web", "uid": uid, "controller": true}]
                },
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": {"app": "web", "rollouts-pod-template-hash": "aaa"}},
                    "template": {
                        "metadata": {"labels": {"app": "web", "rollouts-pod-template-hash": "aaa"}},
                        "spec": {"containers": [{"name": "web", "image": "web:1"}]}
                    }
                }
            }),
        )
        .expect("seed the ReplicaSet");
    let mut paused = healthy();
    paused["phase"] = json!("Paused");
    paused["message"] = json!("CanaryPauseStep");
    world.patch_status("web", paused).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_rollout_draws_the_tree_and_list_the_table() {
    let world = world("get");
    seed_tree(&world).await;
    let tree = eventually("two ready pods in the tree", async || {
        let out = world.ok(&["get", "rollout", "web", "--no-color"]);
        (out.matches("ready:1/1").count() == 2).then_some(out)
    })
    .await;
    for expected in [
        "Name:            web",
        "Status:          ॥ Paused",
        "Message:         CanaryPauseStep",
        "Images:          web:1 (stable)",
        "⟳ web",
        "└──# revision:1",
        "   └──⧉ web-aaa",
        "stable",
        "□ web-aaa-",
    ] {
        assert!(tree.contains(expected), "no {expected:?} in:\n{tree}");
    }
    assert!(
        !tree.contains('\x1b'),
        "--no-color printed escapes:\n{tree}"
    );

    let table = world.ok(&["list", "rollouts"]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("NAME  STRATEGY  STATUS"), "{table}");
    let cells: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        cells,
        [
            "web", "Canary", "Paused", "2/2", "100", "2/2", "2", "2", "2"
        ]
    );
    let all = world.ok(&["list", "rollouts", "-A"]);
    assert!(
        all.lines().nth(1).unwrap().starts_with("default    web"),
        "{all}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_rollout_watch_redraws_in_place_and_stops_on_ctrl_c() {
    let world = world("watch");
    assert!(
        on_path("tmux"),
        "tmux is not on PATH: apt-get install -y tmux (.ci/run does)"
    );
    seed_tree(&world).await;
    let tmux = Tmux {
        socket: world.dir.join("tmux.sock"),
    };
    let script = format!(
        // The plugin itself, not through kubectl: the kubectl on these machines is a dispatcher
        // process that also receives the pane's Ctrl-C, and its own exit status would race the
        // plugin's. Plugin discovery through kubectl is proven by the other tests here.
        "env PATH='{}' KUBECONFIG='{}' KUBECACHEDIR='{}' HOME='{}' kubectl-rollouts get rollout web --watch",
        world.path_var().to_string_lossy(),
        world.dir.join("kubeconfig").display(),
        world.dir.join("cache").display(),
        world.dir.display()
    );
    let started = tmux.command(&[
        "new-session",
        "-d",
        "-s",
        "watch",
        "-x",
        "120",
        "-y",
        "40",
        &script,
    ]);
    assert!(
        started.status.success(),
        "{}",
        String::from_utf8_lossy(&started.stderr)
    );
    tmux.command(&["set-option", "-t", "watch", "remain-on-exit", "on"]);

    tmux.wait_for("the first picture, paused with two ready pods", |screen| {
        screen.contains("॥ Paused") && screen.matches("ready:1/1").count() == 2
    })
    .await;
    world.patch_status("web", healthy()).await;
    let redrawn = tmux
        .wait_for("the redraw showing Healthy", |screen| {
            screen.contains("Status:          ✔ Healthy")
        })
        .await;
    assert!(
        !redrawn.contains("Paused"),
        "the old picture is left:\n{redrawn}"
    );
    assert_eq!(
        redrawn.matches("Name:            web").count(),
        1,
        "{redrawn}"
    );

    tmux.command(&["send-keys", "-t", "watch", "C-c"]);
    // Dead, and neither killed by the signal nor exiting non-zero. tmux sometimes reports a dead
    // pane before it has reaped the process, with no status at all: that counts as clean too.
    eventually("the watch to exit on Ctrl-C", async || {
        let out = tmux.command(&[
            "display-message",
            "-p",
            "-t",
            "watch",
            "#{pane_dead}|#{pane_dead_status}|#{pane_dead_signal}",
        ]);
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let mut fields = text.split('|');
        let (dead, status, signal) = (fields.next(), fields.next(), fields.next());
        if dead != Some("1") {
            return None;
        }
        assert!(
            matches!(status, Some("" | "0")) && matches!(signal, Some("") | None),
            "the watch did not exit cleanly on Ctrl-C: pane {text}"
        );
        Some(())
    })
    .await;
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

fn plugin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kubectl-rollouts"))
        .current_dir(examples())
        .args(args)
        .output()
        .expect("the plugin runs")
}

/// Compares `output` with `tests/fixtures/examples/NAME`; `UPDATE_EXPECTED=1` rewrites it.
fn assert_expected(name: &str, output: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/examples")
        .join(name);
    if std::env::var_os("UPDATE_EXPECTED").is_some() {
        std::fs::write(&path, output).expect("expected file is writable");
    }
    let expected = std::fs::read_to_string(&path).expect("expected file exists");
    assert_eq!(output, expected, "output for {name} changed");
}

#[test]
fn plan_and_lint_on_the_examples() {
    for example in [
        "rollout-canary-basic",
        "rollout-canary-nginx",
        "rollout-canary-set-canary-scale",
        "rollout-canary-background-analysis",
        "rollout-blue-green",
    ] {
        let file = format!("{example}.yaml");
        let plan = plugin(&["plan", "-f", &file]);
        assert!(
            plan.status.success(),
            "{}",
            String::from_utf8_lossy(&plan.stderr)
        );
        assert_expected(
            &format!("{example}.plan"),
            &String::from_utf8_lossy(&plan.stdout),
        );
        let lint = plugin(&["lint", "-f", &file]);
        assert_expected(
            &format!("{example}.lint"),
            &String::from_utf8_lossy(&lint.stdout),
        );
    }
    let resized = plugin(&["plan", "-f", "rollout-canary-basic.yaml", "--replicas", "3"]);
    assert_expected(
        "rollout-canary-basic-3.plan",
        &String::from_utf8_lossy(&resized.stdout),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_watch_prints_changed_rows() {
    let world = world("list-watch");
    world.sim.create("default", rollout("web")).expect("seed");
    world.patch_status("web", progressing()).await;
    let mut child = world
        .kubectl_rollouts(&["list", "rollouts", "--watch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("list runs");
    let lines = lines_of(&mut child);
    assert!(next_line(&lines).starts_with("NAME"));
    let first: Vec<String> = next_line(&lines)
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(first[..3], ["web", "Canary", "Progressing"]);
    world.patch_status("web", healthy()).await;
    let changed: Vec<String> = next_line(&lines)
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(changed[..3], ["web", "Canary", "Healthy"]);
    child.kill().expect("stop the watch");
    child.wait().expect("reap the watch");
}
