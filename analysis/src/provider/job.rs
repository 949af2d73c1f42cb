//! The Job provider: a measurement is a Kubernetes Job the run owns; it succeeds when the Job
//! completes and fails when the Job fails, as Argo's job metric. What the Job looks like and how
//! its state reads are pure functions; [`JobProvider`] is the thin shell that talks to the API.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, PostParams};
use rollouts_crds::analysis::{AnalysisPhase, Measurement, Metric};
use serde_json::{Value, json};

use super::{MeasurementFuture, MetricProvider, RunContext, error_measurement};

/// Measurement metadata key of the Job's name.
pub const JOB_NAME_KEY: &str = "job-name";
/// Measurement metadata key of the Job's namespace.
pub const JOB_NAMESPACE_KEY: &str = "job-namespace";
/// Label (on the Job and its pods) holding the owning run's UID.
pub const RUN_UID_LABEL: &str = "analysisrun.argoproj.io/uid";
/// Annotation holding the owning run's name.
pub const RUN_NAME_ANNOTATION: &str = "analysisrun.argoproj.io/name";
/// Annotation holding the owning run's namespace.
pub const RUN_NAMESPACE_ANNOTATION: &str = "analysisrun.argoproj.io/namespace";
/// Annotation holding the metric's name.
pub const METRIC_NAME_ANNOTATION: &str = "analysisrun.argoproj.io/metric-name";
/// Longest Job name.
const DNS_NAME_LIMIT: usize = 63;
/// Pod waiting reasons that never resolve on their own.
const TERMINAL_WAITING_REASONS: [&str; 3] =
    ["ErrImagePull", "ImagePullBackOff", "InvalidImageName"];

/// The Job's name: `<run uid>.<metric>.<number>`, the metric name shortened to fit 63
/// characters.
pub fn job_name(run_uid: &str, metric_name: &str, number: i32) -> String {
    let name = format!("{run_uid}.{metric_name}.{number}");
    if name.len() <= DNS_NAME_LIMIT {
        return name;
    }
    let mut keep = metric_name
        .len()
        .saturating_sub(name.len() - DNS_NAME_LIMIT);
    while !metric_name.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{run_uid}.{}.{number}", &metric_name[..keep])
}

/// The Job a measurement creates: the metric's job template, named for the run and metric,
/// labelled with the run's UID (pods too), annotated with run and metric, and owned by the run
/// when it lives in the run's namespace.
pub fn job_manifest(run: &RunContext<'_>, metric: &Metric, job_namespace: Option<&str>) -> Value {
    let template = metric.provider.job.as_ref();
    let metadata = template
        .and_then(|j| j.metadata.as_ref())
        .map(|m| serde_json::to_value(m).unwrap_or_default())
        .unwrap_or_else(|| json!({}));
    let mut labels = metadata["labels"].as_object().cloned().unwrap_or_default();
    labels.insert(RUN_UID_LABEL.into(), run.run_uid.into());
    let mut annotations = metadata["annotations"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    annotations.insert(RUN_NAME_ANNOTATION.into(), run.run_name.into());
    annotations.insert(RUN_NAMESPACE_ANNOTATION.into(), run.namespace.into());
    annotations.insert(METRIC_NAME_ANNOTATION.into(), metric.name.clone().into());

    let mut spec = template
        .map(|j| j.spec.clone())
        .unwrap_or_else(|| json!({}));
    if !spec.is_object() {
        spec = json!({});
    }
    let pod_labels = spec
        .pointer_mut("/template/metadata/labels")
        .and_then(Value::as_object_mut);
    match pod_labels {
        Some(pod_labels) => {
            pod_labels.insert(RUN_UID_LABEL.into(), run.run_uid.into());
        }
        None => {
            let template = spec
                .as_object_mut()
                .map(|s| s.entry("template").or_insert_with(|| json!({})));
            if let Some(Value::Object(template)) = template {
                let metadata = template.entry("metadata").or_insert_with(|| json!({}));
                if let Value::Object(metadata) = metadata {
                    metadata.insert("labels".into(), json!({ RUN_UID_LABEL: run.run_uid }));
                }
            }
        }
    }

    let namespace = job_namespace.unwrap_or(run.namespace);
    let mut job_metadata = json!({
        "name": job_name(run.run_uid, &metric.name, run.measurement_number),
        "namespace": namespace,
        "labels": labels,
        "annotations": annotations,
    });
    if namespace == run.namespace {
        job_metadata["ownerReferences"] = json!([{
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "AnalysisRun",
            "name": run.run_name,
            "uid": run.run_uid,
            "controller": true,
            "blockOwnerDeletion": true,
        }]);
    }
    json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": job_metadata,
        "spec": spec,
    })
}

/// How a Job ended, from its conditions: Complete is Successful, Failed is Failed, otherwise
/// still running.
pub fn job_outcome(job: &Value) -> Option<AnalysisPhase> {
    let conditions = job.pointer("/status/conditions")?.as_array()?;
    let mut outcome = None;
    for condition in conditions {
        // Argo reads the condition types regardless of their status.
        match condition["type"].as_str() {
            Some("Complete") => outcome = Some(AnalysisPhase::Successful),
            Some("Failed") => outcome = Some(AnalysisPhase::Failed),
            _ => {}
        }
    }
    outcome
}

/// A pod of the Job stuck for good (an image that cannot be pulled), as a message.
pub fn terminal_pod_error(pods: &[Value]) -> Option<String> {
    pods.iter().find_map(|pod| {
        let statuses = ["initContainerStatuses", "containerStatuses"]
            .into_iter()
            .filter_map(|key| pod["status"][key].as_array())
            .flatten();
        statuses.into_iter().find_map(|status| {
            let waiting = &status["state"]["waiting"];
            let reason = waiting["reason"].as_str()?;
            TERMINAL_WAITING_REASONS.contains(&reason).then(|| {
                format!(
                    "Pod {}, container {} has terminal error ({reason}): {}",
                    pod["metadata"]["name"].as_str().unwrap_or(""),
                    status["name"].as_str().unwrap_or(""),
                    waiting["message"].as_str().unwrap_or("")
                )
            })
        })
    })
}

/// When to look at a running Job again: sqrt(2 x elapsed) seconds from now, so checks thin
/// out as the Job runs longer.
pub fn resume_delay(elapsed: Duration) -> Duration {
    Duration::from_secs_f64((2.0 * elapsed.as_secs_f64()).sqrt())
}

/// A measurement of a Job metric whose metadata names no Job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("job metadata reference missing")]
pub struct MissingJobReference;

/// The Job a measurement refers to, from its metadata.
fn job_reference<'a>(
    measurement: &'a Measurement,
    run_namespace: &'a str,
) -> Result<(&'a str, &'a str), MissingJobReference> {
    let name = measurement
        .metadata
        .get(JOB_NAME_KEY)
        .filter(|n| !n.is_empty())
        .ok_or(MissingJobReference)?;
    let namespace = measurement
        .metadata
        .get(JOB_NAMESPACE_KEY)
        .filter(|n| !n.is_empty())
        .map_or(run_namespace, String::as_str);
    Ok((namespace, name))
}

fn label_selector(job: &Value) -> String {
    job.pointer("/spec/selector/matchLabels")
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .iter()
                .filter_map(|(k, v)| v.as_str().map(|v| format!("{k}={v}")))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

/// Runs Job metrics against the cluster.
#[derive(Clone)]
pub struct JobProvider {
    client: kube::Client,
    /// Namespace for every Job (Argo's `--analysis-jobs-namespace`); the run's by default.
    job_namespace: Option<String>,
}

impl JobProvider {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            job_namespace: None,
        }
    }

    /// Creates every Job in `namespace` (not owned by the run, as in Argo).
    pub fn with_job_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.job_namespace = Some(namespace.into());
        self
    }

    fn jobs(&self, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            namespace,
            &ApiResource::erase::<Job>(&()),
        )
    }

    async fn start(&self, run: RunContext<'_>, metric: &Metric) -> Measurement {
        let now = run.now;
        let mut measurement = Measurement {
            phase: AnalysisPhase::Running,
            started_at: Some(Time(now)),
            ..Default::default()
        };
        let manifest = job_manifest(&run, metric, self.job_namespace.as_deref());
        let namespace = manifest["metadata"]["namespace"]
            .as_str()
            .unwrap_or(run.namespace)
            .to_string();
        let name = manifest["metadata"]["name"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let job: DynamicObject = match serde_json::from_value(manifest) {
            Ok(job) => job,
            Err(e) => return error_measurement(format!("job {name}: {e}"), now),
        };
        let jobs = self.jobs(&namespace);
        match jobs.create(&PostParams::default(), &job).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {
                // Created by an earlier attempt at this measurement: take it if it is ours.
                let ours = match jobs.get(&name).await {
                    Ok(existing) => existing
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(RUN_UID_LABEL))
                        .is_some_and(|uid| uid == run.run_uid),
                    Err(_) => false,
                };
                if !ours {
                    return error_measurement(
                        format!("job {namespace}/{name} already exists and belongs to another run"),
                        now,
                    );
                }
            }
            Err(e) => return error_measurement(format!("job {namespace}/{name}: {e}"), now),
        }
        measurement.metadata = BTreeMap::from([
            (JOB_NAME_KEY.to_string(), name),
            (JOB_NAMESPACE_KEY.to_string(), namespace),
        ]);
        measurement.resume_at = Some(Time(now));
        measurement
    }

    async fn check(&self, run: RunContext<'_>, mut measurement: Measurement) -> Measurement {
        let now = run.now;
        let fail = |mut m: Measurement, message: String| {
            m.phase = AnalysisPhase::Error;
            m.message = message;
            m.finished_at = Some(Time(now));
            m
        };
        let (namespace, name) = match job_reference(&measurement, run.namespace) {
            Ok((namespace, name)) => (namespace.to_string(), name.to_string()),
            Err(e) => return fail(measurement, e.to_string()),
        };
        let job = match self.jobs(&namespace).get(&name).await {
            Ok(job) => serde_json::to_value(job).unwrap_or_default(),
            Err(e) => return fail(measurement, format!("job {namespace}/{name}: {e}")),
        };
        if let Some(phase) = job_outcome(&job) {
            measurement.phase = phase;
            measurement.finished_at = Some(Time(now));
            return measurement;
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        let selector = label_selector(&job);
        let pods = match pods.list(&ListParams::default().labels(&selector)).await {
            Ok(list) => list
                .items
                .iter()
                .map(|p| serde_json::to_value(p).unwrap_or_default())
                .collect::<Vec<_>>(),
            Err(e) => return fail(measurement, format!("pods of job {namespace}/{name}: {e}")),
        };
        if let Some(message) = terminal_pod_error(&pods) {
            measurement.phase = AnalysisPhase::Inconclusive;
            measurement.message = message;
            measurement.finished_at = Some(Time(now));
            return measurement;
        }
        let started = measurement.started_at.as_ref().map_or(now, |t| t.0);
        let elapsed = Duration::try_from(now.duration_since(started)).unwrap_or_default();
        let resume: Timestamp = now.checked_add(resume_delay(elapsed)).unwrap_or(now);
        measurement.resume_at = Some(Time(resume));
        measurement
    }

    async fn stop(&self, run: RunContext<'_>, mut measurement: Measurement) -> Measurement {
        let now = run.now;
        let (namespace, name) = match job_reference(&measurement, run.namespace) {
            Ok((namespace, name)) => (namespace.to_string(), name.to_string()),
            Err(e) => {
                measurement.phase = AnalysisPhase::Error;
                measurement.message = e.to_string();
                measurement.finished_at = Some(Time(now));
                return measurement;
            }
        };
        match self
            .jobs(&namespace)
            .delete(&name, &DeleteParams::foreground())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => {
                measurement.phase = AnalysisPhase::Error;
                measurement.message = format!("job {namespace}/{name}: {e}");
                measurement.finished_at = Some(Time(now));
                return measurement;
            }
        }
        // Argo ends a stopped Job's measurement Inconclusive.
        measurement.phase = AnalysisPhase::Inconclusive;
        measurement.finished_at = Some(Time(now));
        measurement
    }
}

impl MetricProvider for JobProvider {
    fn kind(&self) -> &'static str {
        "Job"
    }

    fn run<'a>(&'a self, run: RunContext<'a>, metric: &'a Metric) -> MeasurementFuture<'a> {
        Box::pin(self.start(run, metric))
    }

    fn resume<'a>(
        &'a self,
        run: RunContext<'a>,
        _metric: &'a Metric,
        measurement: Measurement,
    ) -> MeasurementFuture<'a> {
        Box::pin(self.check(run, measurement))
    }

    fn terminate<'a>(
        &'a self,
        run: RunContext<'a>,
        _metric: &'a Metric,
        measurement: Measurement,
    ) -> MeasurementFuture<'a> {
        Box::pin(self.stop(run, measurement))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rollouts_crds::analysis::{JobMetric, MetricProvider as Provider};

    const UID: &str = "6c1c0a52-0000-4000-8000-000000000001";

    fn context(namespace: &'static str) -> RunContext<'static> {
        RunContext {
            namespace,
            run_name: "checkout-abc-1",
            run_uid: UID,
            measurement_number: 3,
            now: Timestamp::UNIX_EPOCH,
        }
    }

    fn job_metric(template: Value) -> Metric {
        let job: JobMetric = serde_json::from_value(template).expect("job metric");
        Metric {
            name: "smoke".into(),
            provider: Provider {
                job: Some(job),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn job_names_fit_a_dns_label() {
        assert_eq!(job_name(UID, "smoke", 2), format!("{UID}.smoke.2"));
        let long = "a-metric-name-that-is-far-too-long-to-fit";
        let name = job_name(UID, long, 12);
        assert_eq!(name.len(), 63);
        assert!(name.starts_with(&format!("{UID}.a-metric-name")));
        assert!(name.ends_with(".12"));
    }

    #[test]
    fn the_job_is_labelled_annotated_and_owned_by_the_run() {
        let metric = job_metric(json!({
            "metadata": {"labels": {"team": "a"}, "annotations": {"note": "x"}},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "metadata": {"labels": {"app": "smoke"}},
                    "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}
                }
            }
        }));
        let job = job_manifest(&context("shop"), &metric, None);
        assert_eq!(job["metadata"]["name"], format!("{UID}.smoke.3"));
        assert_eq!(job["metadata"]["namespace"], "shop");
        assert_eq!(job["metadata"]["labels"]["team"], "a");
        assert_eq!(job["metadata"]["labels"][RUN_UID_LABEL], UID);
        assert_eq!(job["metadata"]["annotations"]["note"], "x");
        assert_eq!(
            job["metadata"]["annotations"][RUN_NAME_ANNOTATION],
            "checkout-abc-1"
        );
        assert_eq!(
            job["metadata"]["annotations"][RUN_NAMESPACE_ANNOTATION],
            "shop"
        );
        assert_eq!(
            job["metadata"]["annotations"][METRIC_NAME_ANNOTATION],
            "smoke"
        );
        assert_eq!(job["metadata"]["ownerReferences"][0]["uid"], UID);
        assert_eq!(job["metadata"]["ownerReferences"][0]["kind"], "AnalysisRun");
        assert_eq!(job["spec"]["backoffLimit"], 0);
        assert_eq!(
            job["spec"]["template"]["metadata"]["labels"]["app"],
            "smoke"
        );
        assert_eq!(
            job["spec"]["template"]["metadata"]["labels"][RUN_UID_LABEL],
            UID
        );
        assert!(serde_json::from_value::<DynamicObject>(job).is_ok());
    }

    #[test]
    fn a_job_in_another_namespace_is_not_owned_and_pods_get_labels() {
        let metric = job_metric(json!({"spec": {"template": {"spec": {}}}}));
        let job = job_manifest(&context("shop"), &metric, Some("analysis-jobs"));
        assert_eq!(job["metadata"]["namespace"], "analysis-jobs");
        assert!(job["metadata"]["ownerReferences"].is_null());
        assert_eq!(
            job["spec"]["template"]["metadata"]["labels"][RUN_UID_LABEL],
            UID
        );
    }

    #[test]
    fn job_conditions_decide_the_measurement() {
        assert_eq!(job_outcome(&json!({"status": {}})), None);
        assert_eq!(
            job_outcome(
                &json!({"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
            ),
            Some(AnalysisPhase::Successful)
        );
        assert_eq!(
            job_outcome(&json!({"status": {"conditions": [{"type": "Failed", "status": "True"}]}})),
            Some(AnalysisPhase::Failed)
        );
        assert_eq!(
            job_outcome(
                &json!({"status": {"conditions": [{"type": "Suspended", "status": "True"}]}})
            ),
            None
        );
    }

    #[test]
    fn unpullable_images_are_terminal() {
        let pods = vec![
            json!({"metadata": {"name": "ok"}, "status": {"containerStatuses": [{"name": "c", "state": {"running": {}}}]}}),
            json!({"metadata": {"name": "p"}, "status": {"initContainerStatuses": [
                {"name": "init", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}}
            ]}}),
        ];
        assert_eq!(
            terminal_pod_error(&pods).as_deref(),
            Some("Pod p, container init has terminal error (ImagePullBackOff): no such image")
        );
        let waiting = vec![json!({"status": {"containerStatuses": [
            {"name": "c", "state": {"waiting": {"reason": "ContainerCreating"}}}
        ]}})];
        assert_eq!(terminal_pod_error(&waiting), None);
    }

    #[test]
    fn checks_thin_out_as_a_job_runs() {
        assert_eq!(resume_delay(Duration::ZERO), Duration::ZERO);
        assert_eq!(
            resume_delay(Duration::from_secs(50)),
            Duration::from_secs(10)
        );
        assert_eq!(
            resume_delay(Duration::from_secs(1800)),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn a_measurement_names_its_job() {
        let mut m = Measurement::default();
        assert!(job_reference(&m, "shop").is_err());
        m.metadata.insert(JOB_NAME_KEY.into(), "j".into());
        assert_eq!(job_reference(&m, "shop"), Ok(("shop", "j")));
        m.metadata.insert(JOB_NAMESPACE_KEY.into(), "jobs".into());
        assert_eq!(job_reference(&m, "shop"), Ok(("jobs", "j")));
        assert_eq!(
            label_selector(&json!({"spec": {"selector": {"matchLabels": {"a": "1", "b": "2"}}}})),
            "a=1,b=2"
        );
    }
}
