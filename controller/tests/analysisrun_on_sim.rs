//! The AnalysisRun controller of the real `rollouts-controller` binary, against kube-sim
//! started in-process and a Prometheus stand-in on 127.0.0.1: a good metric ends Successful, a
//! bad one fails after exactly `consecutiveFailureLimit` bad measurements in a row, values
//! during `initialDelay` are never judged, a Prometheus that goes away gives Error
//! measurements and an Error run, and `terminate` stops a running run. A finished run is
//! never measured or written again.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use rollouts_crds::analysis::{AnalysisPhase, AnalysisRunStatus, MetricResult};
use rollouts_e2e::fake_prometheus::{Answer, FakePrometheus};
use serde_json::{Value, json};

use support::NAMESPACE;
use support::analysis_runs::{DEADLINE, RunHarness as Harness};

impl Harness {
    /// Status writes to the run's `/status`, as the API server saw them.
    fn status_writes(&self, name: &str) -> usize {
        self.sim
            .requests()
            .iter()
            .filter(|r| {
                r.resource == "analysisruns"
                    && r.subresource == "status"
                    && r.name == name
                    && matches!(r.verb.as_str(), "patch" | "update")
            })
            .count()
    }

    /// Runs one single-measurement run to completion: everything the controller was asked
    /// before it has had its turn.
    async fn settle(&self, name: &str) {
        let query = format!("barrier_{}", name.replace('-', "_"));
        self.prometheus.values(&query, &["1"]);
        self.create(run_manifest(name, json!({}), &query, "result[0] == 1"))
            .await;
        let status = self.wait_completed(name).await;
        assert_eq!(status.phase, AnalysisPhase::Successful, "{status:#?}");
    }

    /// Polls until the run has events with every one of `reasons`; returns (type, reason) of
    /// those events.
    async fn wait_for_events(&self, name: &str, reasons: &[&str]) -> Vec<(String, String)> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), NAMESPACE);
        let deadline = Instant::now() + DEADLINE;
        loop {
            let found: Vec<(String, String)> = events
                .list(&ListParams::default())
                .await
                .expect("lists events")
                .items
                .into_iter()
                .filter(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                        && reasons.contains(&e.reason.as_deref().unwrap_or_default())
                })
                .map(|e| (e.type_.unwrap_or_default(), e.reason.unwrap_or_default()))
                .collect();
            if reasons
                .iter()
                .all(|r| found.iter().any(|(_, reason)| reason == r))
            {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {DEADLINE:?} waiting for events {reasons:?} of {name}; found {found:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A run with one Prometheus metric named `metric`; `fields` add to or override the metric.
fn run_manifest(name: &str, fields: Value, query: &str, success: &str) -> Value {
    let mut metric = json!({
        "name": "metric",
        "successCondition": success,
        "provider": {"prometheus": {"query": query}},
    });
    for (key, value) in fields.as_object().cloned().unwrap_or_default() {
        metric[key] = value;
    }
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AnalysisRun",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"metrics": [metric]},
    })
}

fn only_result(status: &AnalysisRunStatus) -> &MetricResult {
    assert_eq!(status.metric_results.len(), 1, "{status:#?}");
    &status.metric_results[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_metric_ends_successful_and_is_never_measured_again() {
    let h = Harness::start(
        "rollouts-analysisrun",
        &["--log-level", "info,rollouts_controller=debug"],
    )
    .await;
    let secrets: Api<Secret> = Api::namespaced(h.client.clone(), NAMESPACE);
    secrets
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("prometheus-tenant".into()),
                    ..ObjectMeta::default()
                },
                data: Some(BTreeMap::from([(
                    "id".to_string(),
                    ByteString(b"tenant-7".to_vec()),
                )])),
                ..Secret::default()
            },
        )
        .await
        .expect("creates the Secret");
    let query = "success_rate{run=\"good\"}";
    h.prometheus.values(query, &["0.99"]);
    let mut manifest = run_manifest(
        "good",
        json!({
            "interval": "1s",
            "count": 3,
            "provider": {"prometheus": {
                // fieldRef: the run's own name; secretKeyRef: the tenant header.
                "query": "success_rate{run=\"{{args.run}}\"}",
                "headers": [{"key": "X-Scope-OrgID", "value": "{{args.tenant}}"}],
            }},
        }),
        "",
        "result[0] >= 0.95",
    );
    manifest["spec"]["args"] = json!([
        {"name": "run", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "tenant", "valueFrom": {"secretKeyRef": {"name": "prometheus-tenant", "key": "id"}}},
    ]);
    h.create(manifest).await;

    let status = h.wait_completed("good").await;
    assert_eq!(status.phase, AnalysisPhase::Successful, "{status:#?}");
    let result = only_result(&status);
    assert_eq!(
        (result.count, result.successful, result.failed, result.error),
        (3, 3, 0, 0),
        "{result:#?}"
    );
    assert_eq!(result.measurements.len(), 3);
    assert!(result.measurements.iter().all(|m| m.value == "[0.99]"));
    assert_eq!(result.metadata["ResolvedPrometheusQuery"], query);
    assert_eq!(status.run_summary.successful, 1);
    assert!(status.completed_at.is_some());
    let queries = h.prometheus.queries(query);
    assert_eq!(queries.len(), 3);
    assert!(
        queries
            .iter()
            .all(|q| q.headers.get("x-scope-orgid").map(String::as_str) == Some("tenant-7")),
        "{queries:?}"
    );
    // The API server logs a request just after applying it: wait for the log to catch up.
    let deadline = Instant::now() + DEADLINE;
    while h.status_writes("good") < 3 {
        assert!(
            Instant::now() < deadline,
            "the status writes were not logged"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Touch the finished run, then let another run go through the controller.
    let patch = json!({"metadata": {"labels": {"touched": "yes"}}});
    h.runs()
        .patch("good", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("labels the run");
    h.settle("after-good").await;
    assert_eq!(h.prometheus.queries(query).len(), 3);
    // One write per measurement: reconciles that change nothing write nothing.
    assert_eq!(h.status_writes("good"), 3);
    assert_eq!(h.status("good").await, status);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_metric_fails_after_exactly_the_consecutive_failure_limit() {
    let h = Harness::start(
        "rollouts-analysisrun",
        &["--log-level", "info,rollouts_controller=debug"],
    )
    .await;
    let query = "success_rate{run=\"bad\"}";
    // One bad value alone does not fail the run; the second of two in a row does.
    h.prometheus
        .values(query, &["0.99", "0.5", "0.99", "0.5", "0.4", "0.99"]);
    h.create(run_manifest(
        "bad",
        json!({"interval": "1s", "consecutiveFailureLimit": 2}),
        query,
        "result[0] >= 0.95",
    ))
    .await;

    let status = h.wait_completed("bad").await;
    assert_eq!(status.phase, AnalysisPhase::Failed, "{status:#?}");
    let result = only_result(&status);
    assert_eq!(result.phase, AnalysisPhase::Failed);
    assert_eq!(
        (
            result.count,
            result.successful,
            result.failed,
            result.consecutive_failure
        ),
        (5, 2, 3, 2),
        "{result:#?}"
    );
    assert_eq!(
        status.message,
        "Metric \"metric\" assessed Failed due to consecutiveFailures (2) >= consecutiveFailureLimit (2)"
    );
    let values: Vec<&str> = result
        .measurements
        .iter()
        .map(|m| m.value.as_str())
        .collect();
    assert_eq!(values, ["[0.99]", "[0.5]", "[0.99]", "[0.5]", "[0.4]"]);
    let events = h
        .wait_for_events("bad", &["MetricFailed", "AnalysisRunFailed"])
        .await;
    assert!(
        events.iter().all(|(type_, _)| type_ == "Warning"),
        "{events:?}"
    );
    h.settle("after-bad").await;
    assert_eq!(h.prometheus.queries(query).len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_during_the_initial_delay_are_not_judged() {
    let h = Harness::start(
        "rollouts-analysisrun",
        &["--log-level", "info,rollouts_controller=debug"],
    )
    .await;
    let query = "success_rate{run=\"delayed\"}";
    let now = Timestamp::now().as_second();
    // Bad until two seconds from now (no later than the run's start plus its delay).
    h.prometheus.answer(
        query,
        Answer::SwitchAt {
            at: now + 2,
            before: "0.1".into(),
            after: "0.99".into(),
        },
    );
    h.create(run_manifest(
        "delayed",
        json!({"initialDelay": "2s", "interval": "1s", "count": 2}),
        query,
        "result[0] >= 0.95",
    ))
    .await;

    let status = h.wait_completed("delayed").await;
    assert_eq!(status.phase, AnalysisPhase::Successful, "{status:#?}");
    let result = only_result(&status);
    assert_eq!((result.count, result.failed), (2, 0), "{result:#?}");
    let started = status.started_at.as_ref().expect("startedAt").0;
    let first = result.measurements[0]
        .started_at
        .as_ref()
        .expect("the measurement's startedAt")
        .0;
    assert!(
        first.as_second() >= started.as_second() + 2,
        "measured at {first} before the delay from {started} ended"
    );
    let queries = h.prometheus.queries(query);
    assert_eq!(queries.len(), 2);
    assert!(queries.iter().all(|q| q.time() >= now + 2), "{queries:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prometheus_that_goes_away_errors_the_run_never_passes_it() {
    let h = Harness::start(
        "rollouts-analysisrun",
        &["--log-level", "info,rollouts_controller=debug"],
    )
    .await;
    // This metric names its own address rather than taking the flag's default.
    let own = FakePrometheus::start().await;
    let query = "success_rate{run=\"unreachable\"}";
    own.values(query, &["0.99"]);
    h.create(run_manifest(
        "unreachable",
        json!({
            "interval": "1s",
            "count": 20,
            "consecutiveErrorLimit": 1,
            "provider": {"prometheus": {"address": own.address, "query": query}},
        }),
        query,
        "result[0] >= 0.95",
    ))
    .await;
    h.wait_for("unreachable", "measured once", |s| {
        s.metric_results.first().is_some_and(|r| r.successful >= 1)
    })
    .await;
    own.stop();

    let status = h.wait_completed("unreachable").await;
    assert_eq!(status.phase, AnalysisPhase::Error, "{status:#?}");
    let result = only_result(&status);
    assert_eq!(result.phase, AnalysisPhase::Error);
    assert_eq!(
        (result.error, result.consecutive_error),
        (2, 2),
        "{result:#?}"
    );
    assert!(result.successful >= 1 && result.count < 20, "{result:#?}");
    let last_two = &result.measurements[result.measurements.len() - 2..];
    assert!(
        last_two.iter().all(|m| m.phase == AnalysisPhase::Error
            && !m.message.is_empty()
            && m.finished_at.is_some()),
        "{last_two:#?}"
    );
    assert!(
        status
            .message
            .contains("consecutiveErrors (2) > consecutiveErrorLimit (1)"),
        "{}",
        status.message
    );
    assert!(
        h.prometheus.queries(query).is_empty(),
        "the default address was queried"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_stops_a_running_run() {
    let h = Harness::start(
        "rollouts-analysisrun",
        &["--log-level", "info,rollouts_controller=debug"],
    )
    .await;
    let query = "success_rate{run=\"endless\"}";
    h.prometheus.values(query, &["0.99"]);
    h.create(run_manifest(
        "endless",
        json!({"interval": "1s"}),
        query,
        "result[0] >= 0.95",
    ))
    .await;
    h.wait_for("endless", "measured twice", |s| {
        s.phase == AnalysisPhase::Running && s.metric_results.first().is_some_and(|r| r.count >= 2)
    })
    .await;
    let patch = json!({"spec": {"terminate": true}});
    h.runs()
        .patch("endless", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("sets spec.terminate");

    let status = h.wait_completed("endless").await;
    assert_eq!(status.phase, AnalysisPhase::Successful, "{status:#?}");
    assert_eq!(status.message, "Run Terminated");
    let result = only_result(&status);
    assert_eq!(result.phase, AnalysisPhase::Successful);
    let measured = h.prometheus.queries(query).len();
    assert_eq!(measured, usize::try_from(result.count).expect("a count"));
    h.settle("after-endless").await;
    assert_eq!(h.prometheus.queries(query).len(), measured);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_run_is_deleted_when_its_ttl_runs_out() {
    let h = Harness::start(
        "rollouts-analysisrun",
        &["--log-level", "info,rollouts_controller=debug"],
    )
    .await;
    let query = "success_rate{run=\"short-lived\"}";
    h.prometheus.values(query, &["0.99"]);
    let mut manifest = run_manifest("short-lived", json!({}), query, "result[0] >= 0.95");
    manifest["spec"]["ttlStrategy"] = json!({"secondsAfterSuccess": 0});
    h.create(manifest).await;
    let deadline = Instant::now() + DEADLINE;
    while h
        .runs()
        .get_opt("short-lived")
        .await
        .expect("reads the AnalysisRun")
        .is_some()
    {
        assert!(
            Instant::now() < deadline,
            "the run was not deleted; controller log:\n{}",
            h.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deleted_by_controller = h
        .sim
        .requests()
        .iter()
        .any(|r| r.resource == "analysisruns" && r.verb == "delete" && r.name == "short-lived");
    assert!(deleted_by_controller);
    assert_eq!(h.prometheus.queries(query).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_and_job_metrics_are_measured_by_their_providers() {
    let h = Harness::start(
        "rollouts-analysisrun",
        &["--log-level", "info,rollouts_controller=debug"],
    )
    .await;
    h.prometheus.values("web_check", &["0.99"]);
    let created = h
        .create(json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "AnalysisRun",
            "metadata": {"name": "web-and-job", "namespace": NAMESPACE},
            "spec": {"metrics": [
                {
                    "name": "web",
                    "successCondition": "asFloat(result) >= 0.95",
                    "provider": {"web": {
                        "url": format!("{}/api/v1/query?query=web_check", h.prometheus.address),
                        "jsonPath": "{$.data.result[0].value[1]}",
                    }},
                },
                {
                    "name": "job",
                    "provider": {"job": {"spec": {
                        "backoffLimit": 0,
                        "template": {"spec": {
                            "restartPolicy": "Never",
                            "containers": [{"name": "check", "image": "busybox", "command": ["true"]}],
                        }},
                    }}},
                },
            ]},
        }))
        .await;
    let uid = created.metadata.uid.clone().expect("a uid");
    let jobs: Api<Job> = Api::namespaced(h.client.clone(), NAMESPACE);
    let selector = format!("analysisrun.argoproj.io/uid={uid}");
    let deadline = Instant::now() + DEADLINE;
    let job = loop {
        let found = jobs
            .list(&ListParams::default().labels(&selector))
            .await
            .expect("lists jobs")
            .items;
        if let Some(job) = found.into_iter().next() {
            break job;
        }
        assert!(
            Instant::now() < deadline,
            "no Job was created; controller log:\n{}",
            h.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let owner = &job.metadata.owner_references.as_ref().expect("owned")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("AnalysisRun", uid.as_str())
    );
    // The web metric is done; the job metric waits on its Job.
    let running = h
        .wait_for("web-and-job", "running", |s| {
            s.phase == AnalysisPhase::Running
        })
        .await;
    assert!(running.completed_at.is_none(), "{running:#?}");

    // The simulator runs no Job controller: complete the Job as Kubernetes would.
    let name = job.metadata.name.clone().expect("a name");
    let complete = json!({"status": {"conditions": [{"type": "Complete", "status": "True"}]}});
    jobs.patch_status(&name, &PatchParams::default(), &Patch::Merge(&complete))
        .await
        .expect("completes the Job");

    let status = h.wait_completed("web-and-job").await;
    assert_eq!(status.phase, AnalysisPhase::Successful, "{status:#?}");
    let result = |metric: &str| {
        status
            .metric_results
            .iter()
            .find(|r| r.name == metric)
            .cloned()
            .unwrap_or_else(|| panic!("no result for {metric}: {status:#?}"))
    };
    let web = result("web");
    assert_eq!((web.phase, web.successful), (AnalysisPhase::Successful, 1));
    assert_eq!(web.measurements[0].value, "\"0.99\"");
    let job_result = result("job");
    assert_eq!(
        (job_result.phase, job_result.successful),
        (AnalysisPhase::Successful, 1)
    );
    assert_eq!(job_result.measurements[0].metadata["job-name"], name);
}

/// Creates run `name`, whose Prometheus query is sent with a bearer token read from key
/// `token` of Secret `prometheus-token` (not created here); returns the query, answered 0.99.
async fn create_run_with_secret_token(h: &Harness, name: &str) -> String {
    let query = format!("success_rate{{run=\"{name}\"}}");
    h.prometheus.values(&query, &["0.99"]);
    let mut manifest = run_manifest(
        name,
        json!({"provider": {"prometheus": {
            "query": query,
            "headers": [{"key": "Authorization", "value": "Bearer {{args.token}}"}],
        }}}),
        &query,
        "result[0] >= 0.95",
    );
    manifest["spec"]["args"] = json!([
        {"name": "token", "valueFrom": {"secretKeyRef": {"name": "prometheus-token", "key": "token"}}},
    ]);
    h.create(manifest).await;
    query
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_that_does_not_exist_ends_the_run_in_error_naming_it() {
    let h = Harness::start(
        "rollouts-analysisrun",
        &["--log-level", "info,rollouts_controller=debug"],
    )
    .await;
    let query = create_run_with_secret_token(&h, "no-secret").await;

    let status = h.wait_completed("no-secret").await;
    assert_eq!(status.phase, AnalysisPhase::Error, "{status:#?}");
    assert!(
        status
            .message
            .starts_with("Unable to resolve metric arguments")
            && status.message.contains("\"prometheus-token\"")
            && status.message.contains("\"token\""),
        "{}",
        status.message
    );
    assert!(
        h.prometheus.queries(&query).is_empty(),
        "measured without its secret"
    );
}

/// A run measured by a provider this controller lacks (Datadog here) ends in Error at once,
/// naming the metric and the provider, with no measurement taken: not an Error measurement at
/// every interval until `consecutiveErrorLimit`.
#[tokio::test]
async fn a_provider_this_controller_lacks_ends_the_run_in_error_at_once() {
    let h = Harness::start("rollouts-analysisrun", &["--log-level", "info"]).await;
    h.create(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AnalysisRun",
        "metadata": {"name": "datadog", "namespace": NAMESPACE},
        "spec": {"metrics": [{
            "name": "errors",
            "interval": "1s",
            "successCondition": "result < 0.05",
            "provider": {"datadog": {"query": "sum:errors{*}", "interval": "5m"}},
        }]},
    }))
    .await;
    let status = h.wait_completed("datadog").await;
    assert_eq!(status.phase, AnalysisPhase::Error, "{status:#?}");
    assert!(
        status.message.contains("metric \"errors\"")
            && status
                .message
                .contains("provider.datadog is not supported by this controller"),
        "{}",
        status.message
    );
    assert!(
        status
            .metric_results
            .iter()
            .all(|r| r.measurements.is_empty()),
        "measured anyway: {status:#?}"
    );
}

/// A Secret the controller may not read (403, as RBAC answers) ends the run in Error with the
/// API's reason and what to grant, instead of the run staying Running while every reconcile
/// fails; nothing is measured without it.
#[tokio::test]
async fn a_secret_the_controller_may_not_read_ends_the_run_in_error_saying_so() {
    let h = Harness::start("rollouts-analysisrun", &["--log-level", "info"]).await;
    h.sim.set_faults(rollouts_e2e::sim::Faults {
        forbidden: vec![(String::new(), "secrets".to_string())],
        ..Default::default()
    });
    let query = create_run_with_secret_token(&h, "forbidden-secret").await;

    let status = h.wait_completed("forbidden-secret").await;
    assert_eq!(status.phase, AnalysisPhase::Error, "{status:#?}");
    assert!(
        status.message.contains("\"prometheus-token\"")
            && status.message.contains("403 Forbidden")
            && status
                .message
                .contains("grant the controller get on secrets"),
        "{}",
        status.message
    );
    assert!(
        h.prometheus.queries(&query).is_empty(),
        "measured without its secret"
    );
}
