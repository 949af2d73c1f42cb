//! The plugin's Experiment verbs through the real `kubectl` against an in-process kube-sim:
//! `get experiment` (and `--watch`), `list experiments`, `terminate experiment`, and a Rollout's
//! Experiment drawn under its revision by `get rollout`. No controller runs: the tests create the
//! ReplicaSets and AnalysisRuns an Experiment controller would own and write its status (kube-sim
//! runs the pods).

mod support;

use std::process::Stdio;
use std::time::Instant;

use k8s_openapi::jiff::{Timestamp, ToSpan};
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use support::{DEADLINE, NAMESPACE, World, eventually, lines_of, web_rollout};

fn world(label: &str) -> World {
    World::start("experiments", label)
}

/// An ownerReference to `owner` (an object as the server stored it).
fn owner_ref(owner: &Value) -> Value {
    json!([{
        "apiVersion": owner["apiVersion"], "kind": owner["kind"],
        "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"], "controller": true
    }])
}

/// An Experiment of a baseline (`app:v1`) and a canary (`app:v2`) of `app`, judged by `judge`.
fn experiment(name: &str, app: &str, duration: Option<&str>) -> Value {
    let template = |role: &str, image: &str| {
        json!({
            "name": role, "replicas": 1,
            "selector": {"matchLabels": {"app": app, "role": role}},
            "template": {
                "metadata": {"labels": {"app": app, "role": role}},
                "spec": {"containers": [{"name": "app", "image": image}]}
            }
        })
    };
    let mut spec = json!({
        "templates": [template("baseline", "app:v1"), template("canary", "app:v2")],
        "analyses": [{"name": "judge", "templateName": "judge"}]
    });
    if let Some(duration) = duration {
        spec["duration"] = json!(duration);
    }
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Experiment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec
    })
}

/// The ReplicaSet an Experiment controller runs for the experiment's template `role`.
fn template_replica_set(experiment: &Value, role: &str, revision: Option<&str>) -> Value {
    let template = experiment["spec"]["templates"]
        .as_array()
        .and_then(|templates| templates.iter().find(|t| t["name"] == role))
        .expect("the experiment has the template")
        .clone();
    let mut annotations = json!({"experiment.argoproj.io/template-name": role});
    if let Some(revision) = revision {
        annotations["rollout.argoproj.io/revision"] = json!(revision);
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": format!("{}-{role}", experiment["metadata"]["name"].as_str().unwrap_or_default()),
            "namespace": NAMESPACE,
            "labels": template["template"]["metadata"]["labels"],
            "annotations": annotations,
            "ownerReferences": owner_ref(experiment)
        },
        "spec": {
            "replicas": template["replicas"],
            "selector": template["selector"],
            "template": template["template"]
        }
    })
}

/// A running AnalysisRun of `owner` with one successful measurement.
fn analysis_run(name: &str, owner: &Value) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AnalysisRun",
        "metadata": {"name": name, "namespace": NAMESPACE, "ownerReferences": owner_ref(owner)},
        "spec": {"metrics": [{"name": "errors", "provider": {"web": {"url": "http://example.invalid/"}}}]}
    })
}

impl World {
    async fn experiment_status(&self, name: &str, status: Value) {
        self.argo("Experiment", "experiments")
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .expect("experiment status patch");
    }

    async fn run_status(&self, name: &str, status: Value) {
        self.argo("AnalysisRun", "analysisruns")
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .expect("analysis run status patch");
    }

    /// An Experiment called `name` with its two ReplicaSets and its AnalysisRun, Running.
    async fn running_experiment(&self, name: &str, app: &str) -> Value {
        let created = self
            .sim
            .create(NAMESPACE, experiment(name, app, Some("1h")))
            .expect("experiment");
        for role in ["baseline", "canary"] {
            self.sim
                .create(NAMESPACE, template_replica_set(&created, role, None))
                .expect("template ReplicaSet");
        }
        let judge = format!("{name}-judge");
        self.sim
            .create(NAMESPACE, analysis_run(&judge, &created))
            .expect("analysis run");
        self.run_status(&judge, running_run()).await;
        self.experiment_status(name, running(Timestamp::now()))
            .await;
        created
    }
}

fn running(available_at: Timestamp) -> Value {
    json!({
        "phase": "Running", "availableAt": available_at.to_string(),
        "templateStatuses": [
            {"name": "baseline", "replicas": 1, "availableReplicas": 1, "status": "Running"},
            {"name": "canary", "replicas": 1, "availableReplicas": 1, "status": "Running"}
        ]
    })
}

fn running_run() -> Value {
    json!({"phase": "Running", "metricResults": [
        {"name": "errors", "phase": "Running", "successful": 1, "count": 1,
         "measurements": [{"phase": "Successful", "value": "0.01",
                           "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:01Z"}]}
    ]})
}

/// The first line of `text` that holds `needle`.
fn line_of<'a>(text: &'a str, needle: &str) -> &'a str {
    text.lines()
        .find(|line| line.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{text}"))
}

fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_experiment_draws_its_sets_pods_and_runs() {
    let world = world("get");
    world.running_experiment("fresh-baseline", "shop").await;

    // kube-sim's ReplicaSet controller starts one pod per template; both become ready.
    let out = eventually("both template pods ready", async || {
        let out = world.ok(&["get", "experiment", "fresh-baseline", "--no-color"]);
        let ready = out
            .lines()
            .filter(|l| l.contains("□ fresh-baseline-") && l.contains("ready:1/1"))
            .count();
        (ready == 2).then_some(out)
    })
    .await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "Name:            fresh-baseline", "{out}");
    assert_eq!(lines[1], "Namespace:       default", "{out}");
    assert_eq!(lines[2], "Status:          ◌ Running", "{out}");
    assert_eq!(lines[3], "Images:          app:v1 (Σ:baseline)", "{out}");
    assert_eq!(lines[4], "                 app:v2 (Σ:canary)", "{out}");
    assert_eq!(lines[5], "", "{out}");
    assert_eq!(
        words(lines[6]),
        ["NAME", "KIND", "STATUS", "AGE", "INFO"],
        "{out}"
    );
    assert_eq!(
        &words(lines[7])[..4],
        ["Σ", "fresh-baseline", "Experiment", "◌"],
        "{out}"
    );
    assert!(
        lines[8].starts_with("├──⧉ fresh-baseline-baseline "),
        "{out}"
    );
    assert!(lines[8].contains("ReplicaSet   ✔ Healthy"), "{out}");
    assert!(
        lines[9].starts_with("│  └──□ fresh-baseline-baseline-"),
        "{out}"
    );
    assert!(
        lines[10].starts_with("├──⧉ fresh-baseline-canary "),
        "{out}"
    );
    assert!(
        lines[11].starts_with("│  └──□ fresh-baseline-canary-"),
        "{out}"
    );
    assert!(
        lines[12].starts_with("└──α fresh-baseline-judge ") && lines[12].ends_with("✔ 1"),
        "{out}"
    );
    assert_eq!(lines.len(), 13, "{out}");

    // The aliases Argo's plugin takes.
    for alias in ["exp", "experiments"] {
        let again = world.ok(&["get", alias, "fresh-baseline", "--no-color"]);
        assert!(
            again.starts_with("Name:            fresh-baseline\n"),
            "{again}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_experiment_watch_redraws_when_it_ends() {
    let world = world("watch");
    world.running_experiment("soak", "shop").await;
    let mut child = world
        .kubectl_rollouts(&["get", "experiment", "soak", "--watch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    let lines = lines_of(&mut child);
    let seen = |want: &str| {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) if line.contains(want) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    };
    assert!(seen("Status:          ◌ Running"), "no first picture");

    // When: the experiment ends and its ReplicaSets are scaled down.
    world
        .experiment_status(
            "soak",
            json!({"phase": "Successful", "message": "Experiment completed"}),
        )
        .await;
    let ended =
        seen("Status:          ✔ Successful") && seen("Message:         Experiment completed");
    let _ = child.kill();
    let _ = child.wait();
    assert!(ended, "the watch did not redraw the ended experiment");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_experiments_shows_argos_columns_and_terminate_ends_one() {
    let world = world("list");
    let empty = world.ok(&["list", "experiments"]);
    assert_eq!(empty, "No experiments found in namespace 'default'.\n");

    world
        .sim
        .create(NAMESPACE, experiment("timed", "shop", Some("1h")))
        .expect("experiment");
    // Available for 30 minutes of its hour: about 30 minutes remain.
    world
        .experiment_status("timed", running(Timestamp::now() - 30.minutes()))
        .await;
    world
        .sim
        .create(NAMESPACE, experiment("open", "shop", None))
        .expect("experiment");
    world
        .experiment_status("open", json!({"phase": "Successful"}))
        .await;

    let table = world.ok(&["list", "experiments"]);
    let rows: Vec<Vec<&str>> = table.lines().map(words).collect();
    assert_eq!(
        rows[0],
        ["NAME", "STATUS", "DURATION", "REMAINING", "AGE"],
        "{table}"
    );
    assert_eq!(rows.len(), 3, "{table}");
    assert_eq!(&rows[1][..3], ["open", "Successful", "-"], "{table}");
    assert_eq!(rows[1][3], "-", "{table}");
    assert_eq!(&rows[2][..3], ["timed", "Running", "60m"], "{table}");
    assert!(["29m", "30m"].contains(&rows[2][3]), "{table}");
    let all = world.ok(&["list", "exp", "-A"]);
    assert_eq!(
        words(all.lines().next().unwrap_or_default()),
        [
            "NAMESPACE",
            "NAME",
            "STATUS",
            "DURATION",
            "REMAINING",
            "AGE"
        ],
        "{all}"
    );
    assert!(
        all.lines()
            .nth(2)
            .is_some_and(|l| l.starts_with("default    timed ")),
        "{all}"
    );

    assert_eq!(
        world.ok(&["terminate", "experiment", "timed"]),
        "experiment 'timed' terminated\n"
    );
    let stored = world
        .argo("Experiment", "experiments")
        .get("timed")
        .await
        .expect("experiment");
    assert_eq!(stored.data["spec"]["terminate"], true);
    assert!(
        world
            .ok(&["terminate", "exp", "open", "-o", "json"])
            .contains("\"terminate\": true")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_rollout_draws_its_experiment_under_its_revision() {
    let world = world("rollout");
    let rollout = world
        .sim
        .create(
            NAMESPACE,
            web_rollout(
                "app",
                "app:v2",
                json!([{"experiment": {
                    "templates": [{"name": "baseline", "specRef": "stable"},
                                  {"name": "canary", "specRef": "canary"}]
                }}]),
            ),
        )
        .expect("rollout");
    let stable = world
        .sim
        .create(
            NAMESPACE,
            json!({
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {
                    "name": "web-v1", "namespace": NAMESPACE,
                    "labels": {"app": "web", "rollouts-pod-template-hash": "v1"},
                    "annotations": {"rollout.argoproj.io/revision": "1"},
                    "ownerReferences": owner_ref(&rollout)
                },
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": "web", "rollouts-pod-template-hash": "v1"}},
                    "template": {
                        "metadata": {"labels": {"app": "web", "rollouts-pod-template-hash": "v1"}},
                        "spec": {"containers": [{"name": "app", "image": "app:v1"}]}
                    }
                }
            }),
        )
        .expect("stable ReplicaSet");
    assert_eq!(stable["metadata"]["name"], "web-v1");
    world
        .patch_status(
            "web",
            json!({"observedGeneration": "1", "phase": "Progressing", "conditions": [],
                   "currentPodHash": "v2", "stableRS": "v1", "currentStepIndex": 0,
                   "replicas": 1, "availableReplicas": 1}),
        )
        .await;
    // The experiment step's Experiment: owned by the Rollout, at revision 2, its templates
    // labelled with the Rollout's selector.
    let mut step = experiment("web-v2-2-0", "web", None);
    step["metadata"]["ownerReferences"] = owner_ref(&rollout);
    step["metadata"]["annotations"] = json!({"rollout.argoproj.io/revision": "2"});
    let step = world.sim.create(NAMESPACE, step).expect("experiment");
    world
        .sim
        .create(NAMESPACE, template_replica_set(&step, "canary", Some("2")))
        .expect("experiment ReplicaSet");
    world
        .experiment_status("web-v2-2-0", running(Timestamp::now()))
        .await;

    let out = eventually("the experiment's pod ready", async || {
        let out = world.ok(&["get", "rollout", "web", "--no-color"]);
        out.lines()
            .any(|l| l.contains("□ web-v2-2-0-canary-") && l.contains("ready:1/1"))
            .then_some(out)
    })
    .await;
    let position = |needle: &str| {
        out.lines()
            .position(|line| line.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in:\n{out}"))
    };
    let revision_2 = position("├──# revision:2");
    let experiment_line = position("└──Σ web-v2-2-0 ");
    let its_set = position("│     └──⧉ web-v2-2-0-canary ");
    let revision_1 = position("└──# revision:1");
    assert!(
        revision_2 < experiment_line && experiment_line < its_set && its_set < revision_1,
        "{out}"
    );
    assert_eq!(
        &words(line_of(&out, "Σ web-v2-2-0 "))[3..6],
        ["Experiment", "◌", "Running"],
        "{out}"
    );
    // The experiment's ReplicaSet is drawn under the experiment only.
    assert_eq!(
        out.lines()
            .filter(|l| l.contains("⧉ web-v2-2-0-canary"))
            .count(),
        1,
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_experiment_that_does_not_decode_is_named_and_the_others_listed() {
    let world = world("undecodable");
    world
        .sim
        .create(NAMESPACE, experiment("good", "shop", None))
        .expect("experiment");
    let mut bad = experiment("bad", "shop", None);
    bad["spec"]["templates"][0]["replicas"] = json!(3_000_000_000u64);
    world
        .create_raw(
            "/apis/argoproj.io/v1alpha1/namespaces/default/experiments",
            &bad,
        )
        .await;

    let out = world.run(&["list", "experiments"]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    let names: Vec<&str> = stdout
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert_eq!(names, ["good"], "{stdout}");
    assert!(
        stderr.starts_with(
            "warning: Experiment \"bad\" in namespace \"default\" cannot be decoded: spec.templates[0].replicas: invalid value: integer `3000000000`"
        ) && stderr.contains("(fix: "),
        "{stderr}"
    );

    let get = world.run(&["get", "experiment", "bad"]);
    assert!(!get.status.success());
    let stderr = String::from_utf8_lossy(&get.stderr);
    assert!(
        stderr.starts_with("error: experiments.argoproj.io \"bad\" cannot be decoded: spec.templates[0].replicas: invalid value: integer `3000000000`"),
        "{stderr}"
    );
}
