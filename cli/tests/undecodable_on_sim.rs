//! The plugin against an in-process kube-sim holding objects that do not fit our types (an int32
//! field set to 3000000000, a free-form field nested 140 deep): a listing shows the objects that
//! fit and names each that does not, and a verb on a bad object fails naming its field and fix.

mod support;

use std::process::Stdio;
use std::time::Instant;

use serde_json::{Value, json};
use support::{DEADLINE, Kubectl, Setup, World, lines_of};

const ROLLOUTS: &str = "/apis/argoproj.io/v1alpha1/namespaces/default/rollouts";
const RUNS: &str = "/apis/argoproj.io/v1alpha1/namespaces/default/analysisruns";

fn world(label: &str) -> World {
    let setup = Setup {
        kubectl: Kubectl::Unused,
        ..Setup::default()
    };
    World::start_with("undecodable", label, setup)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn nested(depth: usize) -> Value {
    let mut value = json!(1);
    for _ in 0..depth {
        value = json!({ "a": value });
    }
    value
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

fn run_of(name: &str, owner: &Value, metric: Value) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AnalysisRun",
        "metadata": {"name": name, "namespace": "default", "ownerReferences": [{
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "name": owner["name"], "uid": owner["uid"], "controller": true
        }]},
        "spec": {"metrics": [metric]}
    })
}

const REPLICAS_ERROR: &str = "spec.replicas: invalid value: integer `3000000000`, expected i32 (fix: use a whole number from -2147483648 to 2147483647)";

#[tokio::test]
async fn a_list_names_the_bad_rollout_and_shows_the_good_one() {
    let w = world("list");
    w.create_raw(ROLLOUTS, &rollout("good")).await;
    let mut bad = rollout("bad");
    bad["spec"]["replicas"] = json!(3_000_000_000u64);
    w.create_raw(ROLLOUTS, &bad).await;
    let mut deep = rollout("deep");
    deep["spec"]["template"]["spec"]["deep"] = nested(140);
    w.create_raw(ROLLOUTS, &deep).await;

    let out = w.plugin(&["list", "rollouts"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "list failed: {stderr}");
    let names: Vec<&str> = stdout
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert_eq!(names, ["good"], "{stdout}");
    assert!(
        stderr.contains(&format!(
            "warning: Rollout \"bad\" in namespace \"default\" cannot be decoded: {REPLICAS_ERROR}"
        )),
        "{stderr}"
    );
    let deep_line = stderr
        .lines()
        .find(|line| line.contains("Rollout \"deep\""))
        .unwrap_or_else(|| panic!("the deep Rollout is not named: {stderr}"));
    assert!(
        deep_line.contains("cannot be decoded: spec.template.spec.deep.a.a"),
        "{deep_line}"
    );
    assert!(
        deep_line.contains("nested more than 128 levels deep")
            && deep_line.contains("(fix: nest the value less deeply)"),
        "{deep_line}"
    );
}

#[tokio::test]
async fn verbs_on_the_bad_rollout_name_the_field_and_the_fix() {
    let w = world("verbs");
    let mut bad = rollout("bad");
    bad["spec"]["replicas"] = json!(3_000_000_000u64);
    w.create_raw(ROLLOUTS, &bad).await;

    let expected =
        format!("error: rollouts.argoproj.io \"bad\" cannot be decoded: {REPLICAS_ERROR}");
    for args in [
        &["get", "rollout", "bad"][..],
        &["status", "bad", "--watch=false"],
        &["promote", "bad"],
        &["set", "image", "bad", "web=web:2"],
    ] {
        let out = w.plugin(args);
        let stderr = text(&out.stderr);
        assert!(
            !out.status.success(),
            "{args:?} succeeded: {}",
            text(&out.stdout)
        );
        assert_eq!(stderr.trim_end(), expected, "{args:?}");
    }

    // A verb that patches without reading first says the patch was made.
    let out = w.plugin(&["abort", "bad"]);
    assert!(
        !out.status.success(),
        "abort succeeded: {}",
        text(&out.stdout)
    );
    assert_eq!(
        text(&out.stderr).trim_end(),
        format!(
            "error: rollouts.argoproj.io \"bad\" was patched, but cannot be decoded, so the controller does not act on it: {REPLICAS_ERROR}"
        )
    );
}

#[tokio::test]
async fn get_shows_the_good_rollout_and_names_its_bad_analysis_runs() {
    let w = world("get");
    let good = w.create_raw(ROLLOUTS, &rollout("good")).await;
    let other = w.create_raw(ROLLOUTS, &rollout("other")).await;
    let web = json!({"web": {"url": "http://example.invalid/", "jsonPath": "{$.value}"}});
    w.create_raw(
        RUNS,
        &run_of(
            "too-many",
            &good,
            json!({"name": "m", "count": 3_000_000_000u64, "provider": web}),
        ),
    )
    .await;
    w.create_raw(
        RUNS,
        &run_of(
            "not-mine",
            &other,
            json!({"name": "m", "count": 3_000_000_000u64, "provider": web}),
        ),
    )
    .await;

    let out = w.plugin(&["get", "rollout", "good"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "get failed: {stderr}");
    assert!(
        stdout
            .lines()
            .any(|line| line.starts_with("Name:") && line.ends_with(" good")),
        "the Rollout is drawn: {stdout}"
    );
    assert!(
        stdout.contains(
            "⚠ AnalysisRun \"too-many\" in namespace \"default\" cannot be decoded: spec.metrics[0].count: invalid value: integer `3000000000`, expected a 32-bit integer (fix: use a whole number from -2147483648 to 2147483647)"
        ),
        "{stdout}"
    );
    assert!(
        !stdout.contains("not-mine"),
        "another Rollout's run is not shown: {stdout}"
    );
}

#[tokio::test]
async fn list_watch_keeps_listing_past_a_rollout_too_deep_to_read() {
    let w = world("watch");
    let mut deep = rollout("deep");
    deep["spec"]["template"]["spec"]["deep"] = nested(140);
    w.create_raw(ROLLOUTS, &deep).await;

    let mut child = w
        .plugin_command(&["list", "rollouts", "--watch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the plugin starts");
    let lines = lines_of(&mut child);
    // The table is printed (its header) before the watch starts.
    let deadline = Instant::now() + DEADLINE;
    let seen = |name: &str, deadline: Instant| loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.split_whitespace().next() == Some(name) => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    };
    assert!(seen("NAME", deadline), "no table header");
    // Created after the watch's first listing: it shows only if the watch survives the deep one.
    w.create_raw(ROLLOUTS, &rollout("late")).await;
    let late = seen("late", Instant::now() + DEADLINE);
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        late,
        "the watch did not see a Rollout created next to the deep one"
    );
}
