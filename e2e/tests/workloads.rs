//! The simulated cluster: ReplicaSets make pods that become ready, Deployments make
//! ReplicaSets, and deleting an owner collects its dependents.

mod common;

use std::time::Duration;

use common::{client, eventually, replica_set, sim};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(10);

fn rs(value: Value) -> ReplicaSet {
    serde_json::from_value(value).expect("valid ReplicaSet")
}

/// (pods, readyReplicas, availableReplicas) of a ReplicaSet.
async fn counts(
    pods: &Api<Pod>,
    replica_sets: &Api<ReplicaSet>,
    name: &str,
) -> Option<(usize, i32, i32)> {
    let listed = pods
        .list(&ListParams::default().labels(&format!("app={name}")))
        .await
        .ok()?;
    let status = replica_sets.get(name).await.ok()?.status?;
    Some((
        listed.items.len(),
        status.ready_replicas.unwrap_or(0),
        status.available_replicas.unwrap_or(0),
    ))
}

#[tokio::test]
async fn replica_set_scales_from_zero_to_five_to_two() {
    let sim = sim();
    let client = client(&sim);
    let replica_sets: Api<ReplicaSet> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client);
    replica_sets
        .create(&PostParams::default(), &rs(replica_set("web", 0)))
        .await
        .expect("create");
    eventually("status observed at replicas 0", WAIT, || async {
        let status = replica_sets.get("web").await.ok()?.status?;
        (status.observed_generation == Some(1) && status.replicas == 0).then_some(())
    })
    .await;

    for target in [5usize, 2] {
        replica_sets
            .patch_scale(
                "web",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": target}})),
            )
            .await
            .expect("scale");
        let t = target as i32;
        eventually(&format!("{target} ready pods"), WAIT, || async {
            (counts(&pods, &replica_sets, "web").await? == (target, t, t)).then_some(())
        })
        .await;
    }
    let listed = pods.list(&ListParams::default()).await.expect("pods");
    for pod in &listed.items {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let suffix = name
            .strip_prefix("web-")
            .expect("pod names start with the ReplicaSet's");
        assert_eq!(suffix.len(), 5, "{name}");
        let owner = &pod.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("ReplicaSet", Some(true))
        );
    }
    let status = replica_sets
        .get("web")
        .await
        .expect("get")
        .status
        .expect("status");
    assert_eq!(status.fully_labeled_replicas, Some(2));
    assert_eq!(status.observed_generation, Some(3));
}

#[tokio::test]
async fn annotations_delay_readiness_or_make_pods_never_ready_or_crash_loop() {
    let sim = sim();
    let client = client(&sim);
    let replica_sets: Api<ReplicaSet> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client);
    for (name, annotation, setting) in [
        ("stuck", "sim.rollouts.dev/never-ready", "true"),
        ("crashy", "sim.rollouts.dev/crash-loop", "true"),
        ("later", "sim.rollouts.dev/ready-after", "1h"),
    ] {
        let mut value = replica_set(name, 1);
        value["spec"]["template"]["metadata"]["annotations"] = json!({annotation: setting});
        replica_sets
            .create(&PostParams::default(), &rs(value))
            .await
            .expect("create");
    }
    let running = |name: &'static str| {
        let pods = pods.clone();
        async move {
            let pod = pods
                .list(&ListParams::default().labels(&format!("app={name}")))
                .await
                .ok()?
                .items
                .pop()?;
            let status = pod.status?;
            (status.phase.as_deref() == Some("Running")).then_some(status)
        }
    };
    let stuck = eventually("the never-ready pod running", WAIT, || running("stuck")).await;
    let ready = stuck
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready condition");
    assert_eq!(ready.status, "False");
    let crashy = eventually("the crash-looping pod running", WAIT, || running("crashy")).await;
    let container = &crashy.container_statuses.expect("container statuses")[0];
    assert_eq!(
        container
            .state
            .as_ref()
            .and_then(|s| s.waiting.as_ref())
            .and_then(|w| w.reason.as_deref()),
        Some("CrashLoopBackOff")
    );
    for name in ["stuck", "crashy"] {
        let status = replica_sets
            .get(name)
            .await
            .expect("get")
            .status
            .expect("status");
        assert_eq!(
            (status.replicas, status.ready_replicas.unwrap_or(0)),
            (1, 0),
            "{name}"
        );
    }
    let later = pods
        .list(&ListParams::default().labels("app=later"))
        .await
        .expect("pods")
        .items;
    let phase = later[0].status.as_ref().and_then(|s| s.phase.as_deref());
    assert_eq!(
        phase,
        Some("Pending"),
        "ready-after: 1h keeps the pod starting while the others run"
    );
}

#[tokio::test]
async fn min_ready_seconds_delays_availability() {
    let sim = sim();
    let client = client(&sim);
    let replica_sets: Api<ReplicaSet> = Api::default_namespaced(client);
    let mut value = replica_set("slow", 1);
    // Two seconds: Ready times have second precision, so one second could already have passed.
    value["spec"]["minReadySeconds"] = json!(2);
    replica_sets
        .create(&PostParams::default(), &rs(value))
        .await
        .expect("create");
    let ready_first = eventually("a ready pod", WAIT, || async {
        let status = replica_sets.get("slow").await.ok()?.status?;
        (status.ready_replicas == Some(1)).then_some(status.available_replicas.unwrap_or(0))
    })
    .await;
    assert_eq!(
        ready_first, 0,
        "a pod is not available until it has been ready for minReadySeconds"
    );
    eventually("the pod available", WAIT, || async {
        (replica_sets
            .get("slow")
            .await
            .ok()?
            .status?
            .available_replicas
            == Some(1))
        .then_some(())
    })
    .await;
}

#[tokio::test]
async fn deployment_rolls_to_a_new_replica_set_per_template() {
    let sim = sim();
    let client = client(&sim);
    let deployments: Api<Deployment> = Api::default_namespaced(client.clone());
    let replica_sets: Api<ReplicaSet> = Api::default_namespaced(client);
    let mut d = replica_set("web", 2);
    d["kind"] = json!("Deployment");
    deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(d).expect("valid Deployment"),
        )
        .await
        .expect("create");
    let available = |generation: i64| {
        let deployments = deployments.clone();
        async move {
            let status = deployments.get("web").await.ok()?.status?;
            let progressing = status
                .conditions
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == "Progressing")?;
            (status.observed_generation == Some(generation)
                && status.updated_replicas == Some(2)
                && status.available_replicas == Some(2)
                && status.replicas == Some(2)
                && progressing.reason.as_deref() == Some("NewReplicaSetAvailable"))
            .then_some(())
        }
    };
    eventually("the first template available", WAIT, || available(1)).await;
    deployments
        .patch("web", &PatchParams::default(), &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [{"name": "main", "image": "nginx:2"}]}}}})))
        .await
        .expect("new image");
    eventually("the second template available", WAIT, || available(2)).await;
    let all = replica_sets
        .list(&ListParams::default())
        .await
        .expect("replica sets")
        .items;
    assert_eq!(all.len(), 2);
    let mut replicas: Vec<(i32, String)> = all
        .iter()
        .map(|rs| {
            (
                rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(-1),
                rs.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("pod-template-hash"))
                    .cloned()
                    .unwrap_or_default(),
            )
        })
        .collect();
    replicas.sort();
    assert_eq!(replicas[0].0, 0, "the old ReplicaSet is scaled down");
    assert_eq!(replicas[1].0, 2, "the new ReplicaSet runs every replica");
    assert!(replicas.iter().all(|(_, hash)| !hash.is_empty()));
}

async fn pods_of(pods: &Api<Pod>, app: &str) -> usize {
    pods.list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .map(|l| l.items.len())
        .unwrap_or(usize::MAX)
}

#[tokio::test]
async fn deleting_an_owner_collects_dependents_in_background_and_foreground() {
    let sim = sim();
    let client = client(&sim);
    let replica_sets: Api<ReplicaSet> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client);
    for name in ["bg", "fg"] {
        replica_sets
            .create(&PostParams::default(), &rs(replica_set(name, 2)))
            .await
            .expect("create");
        eventually(&format!("{name} pods"), WAIT, || async {
            (pods_of(&pods, name).await == 2).then_some(())
        })
        .await;
    }

    replica_sets
        .delete("bg", &DeleteParams::background())
        .await
        .expect("background delete");
    eventually("background dependents collected", WAIT, || async {
        (pods_of(&pods, "bg").await == 0).then_some(())
    })
    .await;

    // A finalizer on one pod holds the foreground deletion of its owner until it is removed.
    let held = pods
        .list(&ListParams::default().labels("app=fg"))
        .await
        .expect("pods")
        .items[0]
        .metadata
        .name
        .clone()
        .expect("name");
    pods.patch(
        &held,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["e2e/hold"]}})),
    )
    .await
    .expect("finalizer");
    replica_sets
        .delete("fg", &DeleteParams::foreground())
        .await
        .expect("foreground delete");
    let owner = replica_sets
        .get("fg")
        .await
        .expect("the owner waits for its dependents");
    assert!(owner.metadata.deletion_timestamp.is_some());
    assert!(
        owner
            .metadata
            .finalizers
            .unwrap_or_default()
            .contains(&"foregroundDeletion".to_string())
    );
    let pod = pods.get(&held).await.expect("the held pod is still there");
    assert!(pod.metadata.deletion_timestamp.is_some());
    pods.patch(
        &held,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("release");
    eventually(
        "the owner removed once its dependents are gone",
        WAIT,
        || async {
            replica_sets
                .get_opt("fg")
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await;
    assert_eq!(pods_of(&pods, "fg").await, 0);

    replica_sets
        .create(&PostParams::default(), &rs(replica_set("orphans", 1)))
        .await
        .expect("create");
    eventually("orphans pod", WAIT, || async {
        (pods_of(&pods, "orphans").await == 1).then_some(())
    })
    .await;
    let orphan_params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Orphan),
        ..DeleteParams::default()
    };
    replica_sets
        .delete("orphans", &orphan_params)
        .await
        .expect("orphan delete");
    let left = pods
        .list(&ListParams::default().labels("app=orphans"))
        .await
        .expect("pods")
        .items;
    assert_eq!(left.len(), 1, "orphaned dependents stay");
    assert!(
        left[0]
            .metadata
            .owner_references
            .clone()
            .unwrap_or_default()
            .is_empty()
    );
}

#[tokio::test]
async fn jobs_complete_or_fail_as_their_template_says() {
    use k8s_openapi::api::batch::v1::Job;
    let sim = sim();
    let jobs: Api<Job> = Api::default_namespaced(client(&sim));
    for (name, fails) in [("passes", "false"), ("fails", "true")] {
        let job = json!({
            "metadata": {"name": name},
            "spec": {"template": {
                "metadata": {"annotations": {"sim.rollouts.dev/run-for": "100ms", "sim.rollouts.dev/job-fails": fails}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "check", "image": "curl:1"}]},
            }},
        });
        jobs.create(
            &PostParams::default(),
            &serde_json::from_value(job).expect("valid Job"),
        )
        .await
        .expect("create");
    }
    for (name, condition) in [("passes", "Complete"), ("fails", "Failed")] {
        let status = eventually(&format!("{name} finished"), WAIT, || async {
            let status = jobs.get(name).await.ok()?.status?;
            status
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == condition && c.status == "True")
                .then_some(status)
        })
        .await;
        assert!(status.start_time.is_some() && status.active.is_none());
        assert_eq!(
            status.succeeded.is_some(),
            condition == "Complete",
            "{name}"
        );
    }
}
