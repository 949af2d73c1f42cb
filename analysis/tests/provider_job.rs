//! The Job provider against kube-sim started in-process on a loopback port: the Job it creates,
//! its completion or failure, and termination.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use rollouts_analysis::provider::job::{JOB_NAME_KEY, RUN_UID_LABEL};
use rollouts_analysis::provider::{JobProvider, MetricProvider, RunContext};
use rollouts_crds::analysis::{
    AnalysisPhase, JobMetric, Measurement, Metric, MetricProvider as Provider,
};
use rollouts_e2e::sim::{self, SimOptions};
use serde_json::json;

const UID: &str = "6c1c0a52-0000-4000-8000-000000000001";

fn context(number: i32) -> RunContext<'static> {
    RunContext {
        namespace: "default",
        run_name: "checkout-abc-1",
        run_uid: UID,
        measurement_number: number,
        now: Timestamp::now(),
    }
}

fn job_metric(name: &str, annotations: serde_json::Value) -> Metric {
    let job: JobMetric = serde_json::from_value(json!({
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "check", "image": "busybox", "command": ["true"]}]
                }
            }
        }
    }))
    .expect("job metric");
    Metric {
        name: name.into(),
        provider: Provider {
            job: Some(job),
            ..Default::default()
        },
        ..Default::default()
    }
}

async fn client(handle: &sim::SimHandle) -> kube::Client {
    let config = kube::Config::new(handle.url().parse().expect("sim url"));
    kube::Client::try_from(config).expect("kube client")
}

/// Resumes the measurement until it finishes, polling with a deadline.
async fn finish(
    provider: &JobProvider,
    metric: &Metric,
    mut measurement: Measurement,
) -> Measurement {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while measurement.finished_at.is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the job never finished: {measurement:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        measurement = provider.resume(context(1), metric, measurement).await;
    }
    measurement
}

#[tokio::test]
async fn a_job_that_completes_is_a_successful_measurement() {
    let handle = sim::start(SimOptions::default()).expect("kube-sim");
    let client = client(&handle).await;
    let provider = JobProvider::new(client.clone());
    let metric = job_metric("smoke", json!({"sim.rollouts.dev/run-for": "100ms"}));

    let started = provider.run(context(1), &metric).await;
    assert_eq!(started.phase, AnalysisPhase::Running, "{}", started.message);
    assert!(started.resume_at.is_some());
    let name = started.metadata[JOB_NAME_KEY].clone();
    assert_eq!(name, format!("{UID}.smoke.1"));
    let job = Api::<Job>::namespaced(client, "default")
        .get(&name)
        .await
        .expect("job created");
    assert_eq!(
        job.metadata.labels.as_ref().expect("labels")[RUN_UID_LABEL],
        UID
    );
    assert_eq!(
        job.metadata.owner_references.as_ref().expect("owner")[0].uid,
        UID
    );

    let finished = finish(&provider, &metric, started).await;
    assert_eq!(finished.phase, AnalysisPhase::Successful);
}

#[tokio::test]
async fn a_job_that_fails_is_a_failed_measurement() {
    let handle = sim::start(SimOptions::default()).expect("kube-sim");
    let provider = JobProvider::new(client(&handle).await);
    let metric = job_metric(
        "fails",
        json!({"sim.rollouts.dev/run-for": "100ms", "sim.rollouts.dev/job-fails": "true"}),
    );
    let started = provider.run(context(1), &metric).await;
    let finished = finish(&provider, &metric, started).await;
    assert_eq!(finished.phase, AnalysisPhase::Failed);
}

#[tokio::test]
async fn a_second_attempt_at_the_same_measurement_reuses_its_job() {
    let handle = sim::start(SimOptions::default()).expect("kube-sim");
    let provider = JobProvider::new(client(&handle).await);
    let metric = job_metric("again", json!({"sim.rollouts.dev/run-for": "10s"}));
    let first = provider.run(context(2), &metric).await;
    let second = provider.run(context(2), &metric).await;
    assert_eq!(second.phase, AnalysisPhase::Running, "{}", second.message);
    assert_eq!(first.metadata, second.metadata);
}

#[tokio::test]
async fn terminating_deletes_the_job() {
    let handle = sim::start(SimOptions::default()).expect("kube-sim");
    let client = client(&handle).await;
    let provider = JobProvider::new(client.clone());
    let metric = job_metric("long", json!({"sim.rollouts.dev/run-for": "1h"}));
    let started = provider.run(context(1), &metric).await;
    let name = started.metadata[JOB_NAME_KEY].clone();
    let stopped = provider.terminate(context(1), &metric, started).await;
    assert_eq!(
        stopped.phase,
        AnalysisPhase::Inconclusive,
        "{}",
        stopped.message
    );
    assert!(stopped.finished_at.is_some());

    let jobs = Api::<Job>::namespaced(client, "default");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while jobs.get_opt(&name).await.expect("get").is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "job {name} was not deleted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
