//! The Experiment controller of the real `rollouts-controller` binary, against kube-sim started
//! in-process and a Prometheus stand-in: a standalone Experiment with a duration runs its
//! ReplicaSets (and a template's Service) to available, ends Successful, and its ReplicaSets go
//! to zero and its Service away, after which it is never written again; `terminate` ends one
//! early (Successful, as in Argo); a failing required analysis ends one Failed and a passing one
//! ends one Successful; a bad template, an Experiment that does not decode or a missing
//! AnalysisTemplate ends one in Error naming the field; a template whose pods never become ready
//! fails one at its progress deadline; an Experiment Argo left running (its ReplicaSet, hash and
//! status) is continued without anything created again.

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use rollouts_crds::analysis::{AnalysisPhase, AnalysisRun, AnalysisTemplate};
use rollouts_crds::experiment::{Experiment, ExperimentStatus, TemplateStatusCode};
use serde_json::{Value, json};

use support::analysis_runs::{DEADLINE, RunHarness as Harness};
use support::{NAMESPACE, eventually_with_log};

/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(50);

const HASH_LABEL: &str = "rollouts-pod-template-hash";

impl Harness {
    fn experiments(&self) -> Api<Experiment> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    fn replica_set_api(&self) -> Api<ReplicaSet> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    async fn create_analysis_template(&self, name: &str, query: &str, success: &str) {
        let template: AnalysisTemplate = serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "AnalysisTemplate",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "args": [{"name": "hash"}],
                "metrics": [{
                    "name": "check",
                    "successCondition": success,
                    "provider": {"prometheus": {"query": query}},
                }],
            },
        }))
        .expect("an AnalysisTemplate");
        Api::<AnalysisTemplate>::namespaced(self.client.clone(), NAMESPACE)
            .create(&PostParams::default(), &template)
            .await
            .expect("creates the AnalysisTemplate");
    }

    async fn experiment_status(&self, name: &str) -> ExperimentStatus {
        self.experiments()
            .get(name)
            .await
            .expect("reads the Experiment")
            .status
            .unwrap_or_default()
    }

    /// Polls the experiment until `done` holds for its status; fails with the controller's log.
    async fn wait_experiment(
        &self,
        name: &str,
        what: &str,
        done: impl Fn(&ExperimentStatus) -> bool,
    ) -> ExperimentStatus {
        self.wait_status(name, what, || self.experiment_status(name), done)
            .await
    }

    async fn wait_phase(&self, name: &str, phase: AnalysisPhase) -> ExperimentStatus {
        self.wait_experiment(name, phase.as_str(), |s| s.phase == Some(phase))
            .await
    }

    /// Polls until `check` holds for the ReplicaSet `name` (which must exist).
    async fn wait_replica_set(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&ReplicaSet) -> bool,
    ) -> ReplicaSet {
        let read = || async { self.replica_set_api().get_opt(name).await.expect("reads") };
        self.wait_status(&format!("ReplicaSet {name}"), what, read, |rs| {
            rs.as_ref().is_some_and(&check)
        })
        .await
        .expect("the ReplicaSet the wait found")
    }

    /// Writes to the experiment's status, as the API server saw them.
    fn status_writes(&self, name: &str) -> usize {
        self.sim
            .requests()
            .iter()
            .filter(|r| {
                r.resource == "experiments"
                    && r.subresource == "status"
                    && r.name == name
                    && matches!(r.verb.as_str(), "patch" | "update")
            })
            .count()
    }

    /// Every request about the objects of experiment `name` (itself, its ReplicaSets,
    /// Services and AnalysisRuns, all named after it).
    fn requests_about(&self, name: &str) -> usize {
        self.sim
            .requests()
            .iter()
            .filter(|r| {
                r.verb != "watch"
                    && r.verb != "list"
                    && (r.name == name || r.name.starts_with(&format!("{name}-")))
            })
            .count()
    }
}

fn spec_replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(-1)
}

fn available(rs: &ReplicaSet) -> i32 {
    rs.status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0)
}

/// A template of `replicas` pods labelled `app: exp, role: <name>`, serving on 8080.
fn template(name: &str, replicas: i32) -> Value {
    json!({
        "name": name,
        "replicas": replicas,
        "selector": {"matchLabels": {"app": "exp", "role": name}},
        "template": {
            "metadata": {"labels": {"app": "exp", "role": name}},
            "spec": {"containers": [{
                "name": "app",
                "image": format!("shop:{name}"),
                "ports": [{"name": "http", "containerPort": 8080}],
            }]},
        },
    })
}

fn template_status<'a>(
    status: &'a ExperimentStatus,
    name: &str,
) -> &'a rollouts_crds::experiment::TemplateStatus {
    status
        .template_statuses
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no status for template {name}: {status:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_experiment_runs_its_duration_then_scales_down_and_rests() {
    let h = Harness::start("rollouts-experiment", &["--log-level", "info"]).await;
    let mut baseline = template("baseline", 2);
    baseline["service"] = json!({});
    h.create_experiment(
        "fresh",
        json!({
            "duration": "3s",
            "scaleDownDelaySeconds": 1,
            "templates": [baseline, template("canary", 2)],
        }),
    )
    .await;

    // Given time, both templates run their pods, each ReplicaSet named as Argo names it.
    let running = h
        .wait_experiment("fresh", "Running with every pod available", |s| {
            s.phase == Some(AnalysisPhase::Running)
                && s.available_at.is_some()
                && s.template_statuses.len() == 2
                && s.template_statuses.iter().all(|t| {
                    t.status == Some(TemplateStatusCode::Running) && t.available_replicas == 2
                })
        })
        .await;
    let experiment = h.experiments().get("fresh").await.expect("reads");
    for name in ["baseline", "canary"] {
        let rs = h
            .replica_set_api()
            .get(&format!("fresh-{name}"))
            .await
            .expect("the template's ReplicaSet is <experiment>-<template>");
        let owner = &rs.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("Experiment", Some(true))
        );
        assert_eq!(Some(&owner.uid), experiment.metadata.uid.as_ref());
        let hash = rs.labels()[HASH_LABEL].clone();
        let selector = rs.spec.as_ref().expect("spec").selector.clone();
        assert_eq!(
            selector.match_labels.expect("labels")[HASH_LABEL],
            hash,
            "the selector carries the template's own hash"
        );
        assert_eq!(spec_replicas(&rs), 2);
        assert_eq!(
            rs.annotations()["experiment.argoproj.io/template-name"],
            name
        );
    }
    let baseline_hash = h
        .replica_set_api()
        .get("fresh-baseline")
        .await
        .expect("reads")
        .labels()[HASH_LABEL]
        .clone();
    let canary_hash = h
        .replica_set_api()
        .get("fresh-canary")
        .await
        .expect("reads")
        .labels()[HASH_LABEL]
        .clone();
    assert_ne!(baseline_hash, canary_hash, "each template has its own hash");
    let baseline_status = template_status(&running, "baseline");
    assert_eq!(baseline_status.service_name, "fresh-baseline");
    assert_eq!(baseline_status.pod_template_hash, baseline_hash);
    let service = h
        .services()
        .get("fresh-baseline")
        .await
        .expect("the template with service: {} has its Service");
    let spec = service.spec.expect("spec");
    assert_eq!(
        spec.selector.expect("selector")[HASH_LABEL],
        baseline_hash,
        "the Service selects the template's pods only"
    );
    assert_eq!(spec.ports.expect("ports")[0].port, 8080);
    assert!(
        h.services()
            .get_opt("fresh-canary")
            .await
            .expect("reads")
            .is_none(),
        "a template without service gets none"
    );

    // When the duration has passed, it ends Successful...
    let done = h.wait_phase("fresh", AnalysisPhase::Successful).await;
    let progressing = done
        .conditions
        .iter()
        .find(|c| c.type_ == "Progressing")
        .expect("a Progressing condition");
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_str()),
        ("False", "ExperimentCompleted")
    );
    // ...its ReplicaSets go to zero after scaleDownDelaySeconds and its Service away.
    for name in ["fresh-baseline", "fresh-canary"] {
        let rs = h
            .wait_replica_set(name, "scaled to zero", |rs| {
                spec_replicas(rs) == 0 && available(rs) == 0
            })
            .await;
        assert!(
            rs.annotations().contains_key("scale-down-deadline"),
            "scaled down at its deadline"
        );
    }
    h.wait_experiment("fresh", "at zero with no Service", |s| {
        s.template_statuses
            .iter()
            .all(|t| t.replicas == 0 && t.available_replicas == 0 && t.service_name.is_empty())
    })
    .await;
    assert!(
        h.services()
            .get_opt("fresh-baseline")
            .await
            .expect("reads")
            .is_none(),
        "the Service is deleted"
    );

    // At rest: between two experiments the controller handled after this one finished (bad
    // ones, which end at once), it is neither read nor written.
    let barrier = |name: &'static str| {
        let mut bad = template("bad", 1);
        bad["selector"] = json!({"matchLabels": {"app": "other"}});
        let h = &h;
        async move {
            h.create_experiment(name, json!({"templates": [bad]})).await;
            h.wait_phase(name, AnalysisPhase::Error).await;
        }
    };
    barrier("barrier-1").await;
    let writes = h.status_writes("fresh");
    let requests = h.requests_about("fresh");
    barrier("barrier-2").await;
    assert_eq!(h.status_writes("fresh"), writes, "no status write at rest");
    assert_eq!(
        h.requests_about("fresh"),
        requests,
        "no request about a finished experiment at rest"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_ends_an_experiment_without_duration_successful() {
    let h = Harness::start("rollouts-experiment", &["--log-level", "info"]).await;
    h.create_experiment(
        "open",
        json!({"scaleDownDelaySeconds": 0, "templates": [template("canary", 1)]}),
    )
    .await;
    h.wait_experiment("open", "Running", |s| {
        s.phase == Some(AnalysisPhase::Running) && s.available_at.is_some()
    })
    .await;
    h.experiments()
        .patch(
            "open",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"terminate": true}})),
        )
        .await
        .expect("terminates");
    let status = h.wait_phase("open", AnalysisPhase::Successful).await;
    assert_eq!(
        template_status(&status, "canary").status,
        Some(TemplateStatusCode::Successful)
    );
    h.wait_replica_set("open-canary", "scaled to zero", |rs| spec_replicas(rs) == 0)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_analyses_decide_the_experiment() {
    let h = Harness::start("rollouts-experiment", &["--log-level", "info"]).await;
    h.prometheus.values("exp_ok", &["1"]);
    // Every other query (the failing template's, which names the canary's hash) gets 0.
    h.prometheus.answer_every_query("0");
    h.create_analysis_template("ok", "exp_ok", "result[0] == 1")
        .await;
    h.create_analysis_template(
        "errors",
        "exp_bad{hash=\"{{args.hash}}\"}",
        "result[0] == 1",
    )
    .await;
    let analysis = |template: &str| {
        json!({
            "name": "judge",
            "templateName": template,
            "requiredForCompletion": true,
            "args": [{"name": "hash", "value": "{{templates.canary.podTemplateHash}}"}],
        })
    };
    h.create_experiment(
        "good",
        json!({"scaleDownDelaySeconds": 0, "templates": [template("canary", 1)], "analyses": [analysis("ok")]}),
    )
    .await;
    // The failing one belongs to a Rollout, as an experiment step's does.
    h.create_rollout(support::canary_rollout("web", 1, "shop:web", json!([])))
        .await;
    let rollout = h.rollouts().get("web").await.expect("reads the Rollout");
    let bad: Experiment = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Experiment",
        "metadata": {
            "name": "bad",
            "namespace": NAMESPACE,
            "ownerReferences": [{
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "Rollout",
                "name": "web",
                "uid": rollout.metadata.uid,
                "controller": true,
            }],
        },
        "spec": {"scaleDownDelaySeconds": 0, "templates": [template("canary", 1)], "analyses": [analysis("errors")]},
    }))
    .expect("an Experiment");
    h.experiments()
        .create(&PostParams::default(), &bad)
        .await
        .expect("creates the Experiment");

    // Without a duration, a required analysis that succeeds ends the experiment Successful.
    let good = h.wait_phase("good", AnalysisPhase::Successful).await;
    assert_eq!(good.message, "Required AnalysisRuns completed");
    assert_eq!(good.analysis_runs[0].analysis_run, "good-judge");
    assert_eq!(good.analysis_runs[0].phase, AnalysisPhase::Successful);

    // One that fails ends it Failed, and its pods go.
    let bad = h.wait_phase("bad", AnalysisPhase::Failed).await;
    assert_eq!(
        bad.analysis_runs[0].phase,
        AnalysisPhase::Failed,
        "{bad:#?}"
    );
    let run = Api::<AnalysisRun>::namespaced(h.client.clone(), NAMESPACE)
        .get("bad-judge")
        .await
        .expect("the run is <experiment>-<analysis>");
    let canary = h
        .wait_replica_set("bad-canary", "scaled to zero", |rs| spec_replicas(rs) == 0)
        .await;
    assert_eq!(
        run.spec.args[0].value.as_deref(),
        Some(canary.labels()[HASH_LABEL].as_str()),
        "{{{{templates.canary.podTemplateHash}}}} is the canary ReplicaSet's hash"
    );
    assert_eq!(run.owner_references()[0].kind, "Experiment");
    // As Argo: the run's transition is a Warning on the Rollout too, for its notifications.
    let events: Api<Event> = Api::namespaced(h.client.clone(), NAMESPACE);
    eventually_with_log(
        DEADLINE,
        POLL,
        "an AnalysisRunFailed event on Rollout web",
        || format!("\ncontroller log:\n{}", h.log()),
        || async {
            events
                .list(&ListParams::default())
                .await
                .expect("lists events")
                .items
                .into_iter()
                .any(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web")
                        && e.reason.as_deref() == Some("AnalysisRunFailed")
                        && e.type_.as_deref() == Some("Warning")
                })
                .then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_template_an_undecodable_experiment_or_a_missing_analysis_template_ends_in_error() {
    let h = Harness::start("rollouts-experiment", &["--log-level", "info"]).await;
    let mut bad = template("canary", 1);
    bad["selector"] = json!({"matchLabels": {"app": "other"}});
    h.create_experiment("unselected", json!({"templates": [bad]}))
        .await;
    let status = h.wait_phase("unselected", AnalysisPhase::Error).await;
    assert!(
        status
            .message
            .contains("spec.templates[0].selector.matchLabels[\"app\"]"),
        "{}",
        status.message
    );
    let invalid = status
        .conditions
        .iter()
        .find(|c| c.type_ == "InvalidSpec")
        .expect("an InvalidSpec condition");
    assert!(invalid.message.contains("fix:"), "{}", invalid.message);
    assert!(
        h.replica_set_api()
            .get_opt("unselected-canary")
            .await
            .expect("reads")
            .is_none(),
        "nothing is created for a spec that cannot run"
    );

    // One that does not even decode (replicas beyond 32 bits) gets the Error phase naming the
    // field, and the watch goes on.
    let resource = kube::api::ApiResource::erase::<Experiment>(&());
    let raw: Api<kube::api::DynamicObject> =
        Api::namespaced_with(h.client.clone(), NAMESPACE, &resource);
    let mut huge = template("canary", 1);
    huge["replicas"] = json!(3_000_000_000_i64);
    let undecodable: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Experiment",
        "metadata": {"name": "huge", "namespace": NAMESPACE},
        "spec": {"templates": [huge]},
    }))
    .expect("an object");
    raw.create(&PostParams::default(), &undecodable)
        .await
        .expect("creates the undecodable Experiment");
    let message = eventually_with_log(
        DEADLINE,
        POLL,
        "the undecodable Experiment's Error phase",
        || format!("\ncontroller log:\n{}", h.log()),
        || async {
            let object = raw.get("huge").await.expect("reads it untyped");
            let status = &object.data["status"];
            (status["phase"] == "Error")
                .then(|| status["message"].as_str().unwrap_or_default().to_string())
        },
    )
    .await;
    assert!(
        message.contains("cannot be decoded") && message.contains("replicas"),
        "{message}"
    );

    h.create_experiment(
        "unjudged",
        json!({
            "scaleDownDelaySeconds": 0,
            "templates": [template("canary", 1)],
            "analyses": [{"name": "judge", "templateName": "missing"}],
        }),
    )
    .await;
    let status = h.wait_phase("unjudged", AnalysisPhase::Error).await;
    assert!(
        status
            .message
            .contains("AnalysisTemplate \"missing\" not found"),
        "{}",
        status.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_experiment_argo_left_running_is_continued_without_creating_anything() {
    let h = Harness::start("rollouts-experiment", &["--log-level", "info"]).await;
    // Argo's: assigned to another controller instance while its state is put in place.
    let instance = "argo-rollouts.argoproj.io/controller-instance-id";
    let experiment: Experiment = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Experiment",
        "metadata": {"name": "left", "namespace": NAMESPACE, "labels": {instance: "argo"}},
        "spec": {"duration": "3s", "scaleDownDelaySeconds": 0, "templates": [template("canary", 1)]},
    }))
    .expect("an Experiment");
    let created = h
        .experiments()
        .create(&PostParams::default(), &experiment)
        .await
        .expect("creates the Experiment");
    let uid = created.metadata.uid.clone().expect("a uid");
    // The ReplicaSet Argo made, with Argo's hash, and the status Argo wrote.
    let labels = json!({"app": "exp", "role": "canary", HASH_LABEL: "argo5c9d7"});
    let rs: ReplicaSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": "left-canary",
            "namespace": NAMESPACE,
            "labels": labels,
            "annotations": {
                "experiment.argoproj.io/name": "left",
                "experiment.argoproj.io/template-name": "canary",
            },
            "ownerReferences": [{
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "Experiment",
                "name": "left",
                "uid": uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "app", "image": "shop:canary"}]},
            },
        },
    }))
    .expect("a ReplicaSet");
    h.replica_set_api()
        .create(&PostParams::default(), &rs)
        .await
        .expect("creates Argo's ReplicaSet");
    h.wait_replica_set("left-canary", "available", |rs| available(rs) == 1)
        .await;
    // Whole seconds, as Argo writes times.
    let now =
        k8s_openapi::jiff::Timestamp::from_second(k8s_openapi::jiff::Timestamp::now().as_second())
            .expect("in range")
            .to_string();
    h.experiments()
        .patch_status(
            "left",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "phase": "Running",
                "availableAt": now,
                "templateStatuses": [{
                    "name": "canary",
                    "replicas": 1,
                    "updatedReplicas": 1,
                    "readyReplicas": 1,
                    "availableReplicas": 1,
                    "status": "Running",
                    "lastTransitionTime": now,
                }],
            }})),
        )
        .await
        .expect("writes Argo's status");
    // Handed over: this controller takes it from there.
    h.experiments()
        .patch(
            "left",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {instance: null}}})),
        )
        .await
        .expect("hands the Experiment over");
    let status = h.wait_phase("left", AnalysisPhase::Successful).await;
    assert!(
        status
            .available_at
            .as_ref()
            .is_some_and(|t| t.0.to_string() == now),
        "Argo's availableAt stands: {status:#?}"
    );
    h.wait_replica_set("left-canary", "scaled to zero", |rs| spec_replicas(rs) == 0)
        .await;
    let creates: Vec<String> = h
        .sim
        .requests()
        .iter()
        .filter(|r| {
            r.user_agent.starts_with("rollouts-controller")
                && r.verb == "create"
                && r.resource == "replicasets"
        })
        .map(|r| format!("{r:?}"))
        .collect();
    assert!(creates.is_empty(), "nothing created again: {creates:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_whose_pods_never_become_ready_fails_at_its_progress_deadline() {
    let h = Harness::start("rollouts-experiment", &["--log-level", "info"]).await;
    let mut stuck = template("canary", 1);
    stuck["template"]["metadata"]["annotations"] = json!({"sim.rollouts.dev/never-ready": "true"});
    h.create_experiment(
        "stuck",
        json!({
            "duration": "1h",
            "progressDeadlineSeconds": 2,
            "scaleDownDelaySeconds": 0,
            "templates": [template("baseline", 1), stuck],
        }),
    )
    .await;
    // Nothing changes once its pod exists: only the deadline, looked at when due, ends it.
    let status = h.wait_phase("stuck", AnalysisPhase::Failed).await;
    assert_eq!(
        status.message,
        "Template 'canary' exceeded its progressDeadlineSeconds (2)"
    );
    assert!(status.available_at.is_none(), "it never became available");
    for name in ["stuck-baseline", "stuck-canary"] {
        h.wait_replica_set(name, "scaled to zero", |rs| spec_replicas(rs) == 0)
            .await;
    }
}
