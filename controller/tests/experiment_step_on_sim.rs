//! A Rollout's `experiment` step with the real `rollouts-controller` binary (its Rollout and
//! Experiment controllers) against kube-sim started in-process and a Prometheus stand-in: the
//! step creates its Experiment from the stable and canary ReplicaSets, the Rollout waits for it
//! and is promoted when it succeeds; an Experiment whose analysis fails aborts the update; a new
//! revision terminates the running Experiment of the old one.

mod support;

use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, ListParams};
use rollouts_crds::analysis::AnalysisPhase;
use rollouts_crds::experiment::Experiment;
use rollouts_crds::rollout::RolloutStatus;
use serde_json::{Value, json};

use support::analysis_runs::{DEADLINE, RunHarness as Harness};
use support::{NAMESPACE, canary_rollout, eventually_with_log};

const HASH_LABEL: &str = "rollouts-pod-template-hash";

/// How often a test looks again.
const POLL: Duration = Duration::from_millis(50);

/// An experiment step running one pod of the stable template (`baseline`) and one of the canary
/// template (`canary`) for `duration`, judged by the `compare` template with both templates'
/// pod hashes.
fn steps(duration: &str, analysed: bool) -> Value {
    let mut experiment = json!({
        "duration": duration,
        "templates": [
            {"name": "baseline", "specRef": "stable", "replicas": 1},
            {"name": "canary", "specRef": "canary", "replicas": 1},
        ],
    });
    if analysed {
        experiment["analyses"] = json!([{
            "name": "compare",
            "templateName": "compare",
            "args": [
                {"name": "canary-hash", "value": "{{templates.canary.podTemplateHash}}"},
                {"name": "baseline-hash", "value": "{{templates.baseline.podTemplateHash}}"},
            ],
        }]);
    }
    json!([{"setWeight": 50}, {"experiment": experiment}])
}

impl Harness {
    fn experiments(&self) -> Api<Experiment> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    /// Rollout `name`'s status (the harness's own `status` reads AnalysisRuns).
    async fn rollout_status(&self, name: &str) -> RolloutStatus {
        support::Sim::status(self, name).await
    }

    /// Waits until Rollout `name` is Healthy with `replicas` pods on its current revision.
    async fn healthy(&self, name: &str, replicas: i32) -> RolloutStatus {
        self.eventually(&format!("{name} Healthy"), || async {
            let status = self.rollout_status(name).await;
            let done = status.phase == "Healthy"
                && !status.current_pod_hash.is_empty()
                && status.stable_rs == status.current_pod_hash
                && status.available_replicas == replicas
                && status.replicas == replicas;
            done.then_some(status)
        })
        .await
    }

    /// The Experiments Rollout `rollout` owns.
    async fn experiments_of(&self, rollout: &str) -> Vec<Experiment> {
        self.experiments()
            .list(&ListParams::default())
            .await
            .expect("lists Experiments")
            .items
            .into_iter()
            .filter(|ex| {
                ex.owner_references()
                    .iter()
                    .any(|owner| owner.kind == "Rollout" && owner.name == rollout)
            })
            .collect()
    }

    /// Waits for the Experiment `name` to exist and `check` to hold for it.
    async fn wait_experiment(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&Experiment) -> bool,
    ) -> Experiment {
        self.eventually(&format!("Experiment {name} {what}"), || async {
            self.experiments()
                .get_opt(name)
                .await
                .expect("reads the Experiment")
                .filter(|ex| check(ex))
        })
        .await
    }

    /// Polls `check` until it gives a value; fails after [`DEADLINE`] with the controller's log.
    async fn eventually<T, F, Fut>(&self, what: &str, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let log = || format!("\ncontroller log:\n{}", self.log());
        eventually_with_log(DEADLINE, POLL, what, log, check).await
    }
}

fn phase(experiment: &Experiment) -> Option<AnalysisPhase> {
    experiment.status.as_ref().and_then(|status| status.phase)
}

/// The image of an Experiment template's first container.
fn image(experiment: &Experiment, template: &str) -> String {
    let template = experiment
        .spec
        .templates
        .iter()
        .find(|t| t.name == template)
        .unwrap_or_else(|| panic!("no template {template}"));
    template.template.0["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_experiment_step_promotes_on_success_and_aborts_on_failure() {
    let h = Harness::start("rollouts-experiment-step", &["--log-level", "info"]).await;
    h.create_template(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AnalysisTemplate",
        "metadata": {"name": "compare", "namespace": NAMESPACE},
        "spec": {
            "args": [{"name": "canary-hash"}, {"name": "baseline-hash"}],
            "metrics": [{
                "name": "errors",
                "successCondition": "result[0] < 1",
                "provider": {"prometheus": {
                    "query": "errors{canary=\"{{args.canary-hash}}\",baseline=\"{{args.baseline-hash}}\"}"
                }},
            }],
        },
    }))
    .await;
    h.prometheus.answer_every_query("0");
    h.create_rollout(canary_rollout("web", 2, "shop:1", steps("2s", true)))
        .await;
    let first = h.healthy("web", 2).await;
    assert!(
        h.experiments_of("web").await.is_empty(),
        "a first deploy runs no step"
    );

    // A good release: the step's Experiment runs the stable and the canary template side by
    // side, succeeds, and the Rollout is promoted.
    h.set_image("web", "shop:2").await;
    let status = h
        .eventually("the experiment step's Experiment", || async {
            let status = h.rollout_status("web").await;
            (!status.canary.current_experiment.is_empty()).then_some(status)
        })
        .await;
    let second = status.current_pod_hash.clone();
    let name = status.canary.current_experiment.clone();
    assert_eq!(name, format!("web-{second}-2-1"), "Argo's name");
    assert_eq!(status.current_step_index, Some(1));
    // Status names it first; it is created right after.
    let experiment = h.wait_experiment(&name, "created", |_| true).await;
    assert_eq!(experiment.labels()[HASH_LABEL], second);
    assert_eq!(
        experiment.annotations()["rollout.argoproj.io/revision"],
        "2"
    );
    assert_eq!(image(&experiment, "baseline"), "shop:1");
    assert_eq!(image(&experiment, "canary"), "shop:2");
    let args: Vec<_> = experiment.spec.analyses[0]
        .args
        .iter()
        .map(|arg| arg.value.clone().unwrap_or_default())
        .collect();
    assert_eq!(
        args,
        [
            "{{templates.canary.podTemplateHash}}",
            "{{templates.baseline.podTemplateHash}}"
        ]
    );
    let promoted = h.healthy("web", 2).await;
    assert_eq!(promoted.stable_rs, second);
    assert_eq!(promoted.canary.current_experiment, "");
    let done = h.experiments().get(&name).await.expect("kept in history");
    assert_eq!(phase(&done), Some(AnalysisPhase::Successful));
    assert_ne!(first.stable_rs, promoted.stable_rs);

    // A bad release: the analysis fails the Experiment, and the Rollout aborts back to stable.
    h.prometheus.answer_every_query("5");
    h.set_image("web", "shop:3").await;
    let aborted = h
        .eventually("web aborted", || async {
            let status = h.rollout_status("web").await;
            status.abort.then_some(status)
        })
        .await;
    let third = aborted.current_pod_hash.clone();
    assert_eq!(aborted.stable_rs, second, "the stable stays");
    let progressing = aborted
        .condition("Progressing")
        .expect("a Progressing condition");
    assert_eq!(progressing.reason, "RolloutAborted");
    assert!(
        progressing
            .message
            .contains("Experiment analysis phase is error/failed"),
        "{}",
        progressing.message
    );
    let failed = h
        .wait_experiment(&format!("web-{third}-3-1"), "Failed", |ex| {
            phase(ex) == Some(AnalysisPhase::Failed)
        })
        .await;
    assert_eq!(image(&failed, "baseline"), "shop:2");
    h.eventually("the aborted canary scaled down", || async {
        let replica_sets = h.replica_sets("web").await;
        let canary = replica_sets.get(&format!("web-{third}"))?;
        (canary.0 == 0).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_revision_terminates_the_running_experiment() {
    let h = Harness::start("rollouts-experiment-step-new", &["--log-level", "info"]).await;
    h.create_rollout(canary_rollout("slow", 1, "shop:1", steps("1h", false)))
        .await;
    h.healthy("slow", 1).await;
    h.set_image("slow", "shop:2").await;
    let status = h
        .eventually("the experiment step's Experiment", || async {
            let status = h.rollout_status("slow").await;
            (!status.canary.current_experiment.is_empty()).then_some(status)
        })
        .await;
    let old = status.canary.current_experiment.clone();
    h.wait_experiment(&old, "Running", |ex| {
        phase(ex) == Some(AnalysisPhase::Running)
    })
    .await;

    h.set_image("slow", "shop:3").await;
    let terminated = h
        .wait_experiment(&old, "terminated", |ex| ex.spec.terminate)
        .await;
    assert!(terminated.spec.terminate);
    let status = h
        .eventually("the new revision's Experiment", || async {
            let status = h.rollout_status("slow").await;
            let current = &status.canary.current_experiment;
            (!current.is_empty() && current != &old).then_some(status)
        })
        .await;
    assert_eq!(
        status.canary.current_experiment,
        format!("slow-{}-3-1", status.current_pod_hash)
    );
    h.wait_experiment(&old, "finished", |ex| {
        phase(ex).is_some_and(AnalysisPhase::is_completed)
    })
    .await;
    let owned = h.experiments_of("slow").await;
    assert_eq!(
        owned.len(),
        2,
        "{:?}",
        owned.iter().map(|e| e.name_any()).collect::<Vec<_>>()
    );
}
