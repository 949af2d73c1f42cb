//! The observe phase: everything the planner reads besides the Rollout, gathered before it
//! plans, so that what is missing (a Service, a template, a Deployment) is planned data rather
//! than an error in the middle of acting. ReplicaSets, AnalysisRuns and Experiments come from
//! the watch caches; Services, the workloadRef Deployment, the pods of a pending
//! restart and the routers' weights are read fresh (a Rollout is reconciled only while
//! something moves, so reading them costs nothing at rest). Analysis templates are read only
//! for a plan that starts a run ([`templates`]).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use rollouts_crds::analysis::{AnalysisRun, AnalysisTemplate, ClusterAnalysisTemplate};
use rollouts_crds::experiment::Experiment;
use rollouts_crds::rollout::{
    DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY, MANAGED_BY_ROLLOUTS_KEY, ROLLOUT_CANARY_STEP_INDEX_LABEL,
    ROLLOUT_TYPE_LABEL, Rollout, RolloutAnalysisTemplate,
};
use rollouts_traffic::TrafficRouter;

use crate::claims::{Claims, SERVICE, claims_of};
use crate::context::Context;
use crate::decode::Decoded;
use crate::error::{Error, Result};
use crate::planner::template_match;
use crate::planner::{
    self, Observed, ObservedAnalysisRun, ObservedDeployment, ObservedExperiment,
    ObservedExperimentTemplate, ObservedPod, ObservedReplicaSet, ObservedTemplates, ReplicaFailure,
    SharedObject, TemplateKey,
};
use rollouts_crds::conditions::REPLICA_FAILURE;

/// The Services the spec names that exist, as read during observe.
pub type LiveServices = BTreeMap<String, Service>;

/// Reads the ReplicaSets and AnalysisRuns the Rollout controls (by owner UID) from the watch
/// caches, ReplicaSets narrowed by its selector labels, and GETs the Services its spec names:
/// a Rollout is reconciled only while something moves, so reading them fresh costs nothing at
/// rest, where a cache would hold every Service in scope.
pub async fn observe(
    rollout: &Rollout,
    namespace: &str,
    routers: &[Box<dyn TrafficRouter>],
    ctx: &Context,
) -> Result<(Observed, LiveServices)> {
    let uid = rollout.uid().unwrap_or_default();
    let owned_replica_sets: Vec<_> = ctx
        .caches
        .replica_sets
        .owned_by(&uid)
        .into_iter()
        .filter(|rs| selected_by(rollout, rs.labels()))
        .collect();
    let replica_sets: Vec<ObservedReplicaSet> = owned_replica_sets
        .iter()
        .map(|rs| observed_replica_set(rs))
        .collect();
    let template_digests = owned_replica_sets
        .iter()
        .filter_map(|rs| Some((rs.name_any(), template_match::cached_digest(rs)?.clone())))
        .collect();
    let analysis_runs = ctx
        .caches
        .analysis_runs
        .owned_by(&uid)
        .iter()
        .map(|run| observed_analysis_run(run))
        .collect();
    let experiments = ctx
        .caches
        .experiments
        .owned_by(&uid)
        .iter()
        .map(|experiment| observed_experiment(experiment))
        .collect();
    // The reads are independent: sent together, a reconcile waits for the slowest one rather
    // than for their sum before its first write.
    let (services, (restart_pods, workload), live_templates, traffic_weight_verified) = tokio::try_join!(
        read_services(rollout, namespace, ctx),
        observe_restart_and_workload(rollout, &replica_sets, ctx),
        observe_live_templates(rollout, &replica_sets, ctx),
        verify_recorded_weight(rollout, routers),
    )?;
    let (services, missing_services) = services;
    let shared_objects = shared_objects(rollout, &services, &ctx.claims);
    // Every field named: a field the planner adds must be observed here, not defaulted.
    let observed = Observed {
        replica_sets,
        analysis_runs,
        experiments,
        missing_services,
        traffic_weight_verified,
        restart_pods,
        workload,
        // Read by `templates` only when a plan creates a run.
        analysis_templates: None,
        live_templates,
        template_digests,
        shared_objects,
    };
    Ok((observed, services))
}

/// The Services the spec names that exist, and those that do not, read at once.
async fn read_services(
    rollout: &Rollout,
    namespace: &str,
    ctx: &Context,
) -> Result<(LiveServices, BTreeSet<String>)> {
    let service_api: Api<Service> = Api::namespaced(ctx.client.clone(), namespace);
    let reads = named_services(rollout).into_iter().map(|(_, service)| {
        let service_api = service_api.clone();
        async move {
            match service_api.get_opt(&service).await {
                Ok(live) => Ok((service, live)),
                Err(source) => Err(Error::Read {
                    kind: "Service",
                    namespace: namespace.to_string(),
                    object: service,
                    rollout: rollout.name_any(),
                    source: Box::new(source),
                }),
            }
        }
    });
    let mut services = LiveServices::new();
    let mut missing_services = BTreeSet::new();
    for (service, live) in futures::future::try_join_all(reads).await? {
        match live {
            Some(live) => {
                services.insert(service, live);
            }
            None => {
                missing_services.insert(service);
            }
        }
    }
    Ok((services, missing_services))
}

/// The objects the spec names that other Rollouts name too, from the claims index (no API
/// call); a Service's `managed-by-rollouts` annotation from the copy just read.
fn shared_objects(
    rollout: &Rollout,
    services: &LiveServices,
    claims: &Claims,
) -> Vec<SharedObject> {
    let namespace = rollout.namespace().unwrap_or_default();
    let name = rollout.name_any();
    claims_of(rollout)
        .into_iter()
        .filter_map(|claim| {
            let others = claims.others((&namespace, &name), &claim);
            if others.is_empty() {
                return None;
            }
            let managed_by = services
                .get(&claim.name)
                .filter(|_| claim.kind == SERVICE)
                .and_then(|service| service.annotations().get(MANAGED_BY_ROLLOUTS_KEY).cloned());
            Some(SharedObject {
                field: claim.field.to_string(),
                kind: claim.kind.to_string(),
                namespace: claim.namespace,
                name: claim.name,
                managed_by,
                others,
            })
        })
        .collect()
}

/// The pods a pending `spec.restartAt` restart needs (listed by the ReplicaSet selector, kept
/// when one of `replica_sets` controls them; not listed otherwise, as pods are not watched) and
/// the Deployment `spec.workloadRef` names (read by name; `None` when it does not exist).
async fn observe_restart_and_workload(
    rollout: &Rollout,
    replica_sets: &[ObservedReplicaSet],
    ctx: &Context,
) -> Result<(Option<Vec<ObservedPod>>, Option<ObservedDeployment>)> {
    let namespace = rollout.namespace().unwrap_or_default();
    let read_error = |kind: &'static str, object: String| {
        let namespace = namespace.clone();
        move |source: kube::Error| Error::Read {
            kind,
            namespace,
            object,
            rollout: rollout.name_any(),
            source: Box::new(source),
        }
    };
    let mut restart_pods = None;
    if planner::restart::needs_restart(rollout, Timestamp::now()) {
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
        let params = ListParams::default().labels(&replica_set_selector(rollout));
        let list = api
            .list(&params)
            .await
            .map_err(read_error("Pod", replica_set_selector(rollout)))?;
        let controlled = |pod: &&Pod| {
            pod.owner_references().iter().any(|owner| {
                owner.controller == Some(true)
                    && owner.kind == "ReplicaSet"
                    && replica_sets.iter().any(|rs| rs.name == owner.name)
            })
        };
        let pods = list
            .items
            .iter()
            .filter(controlled)
            .map(observed_pod)
            .collect();
        restart_pods = Some(pods);
    }
    let mut workload = None;
    if let Some(name) = planner::workload_ref::deployment_name(rollout) {
        let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &namespace);
        let found = api
            .get_opt(name)
            .await
            .map_err(read_error("Deployment", name.to_string()))?;
        workload = found.map(|deployment| observed_deployment(&deployment));
    }
    Ok((restart_pods, workload))
}

fn observed_pod(pod: &Pod) -> ObservedPod {
    let replica_set = pod
        .owner_references()
        .iter()
        .find(|owner| owner.controller == Some(true))
        .map(|owner| owner.name.clone())
        .unwrap_or_default();
    let ready_since = pod
        .status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .and_then(|conditions| {
            conditions
                .iter()
                .find(|condition| condition.type_ == "Ready" && condition.status == "True")
        })
        .map(|condition| {
            condition
                .last_transition_time
                .as_ref()
                .map_or(Timestamp::UNIX_EPOCH, |time| time.0)
        });
    ObservedPod {
        name: pod.name_any(),
        replica_set,
        created: pod
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(Timestamp::UNIX_EPOCH, |time| time.0),
        ready_since,
        terminating: pod.metadata.deletion_timestamp.is_some(),
    }
}

fn observed_deployment(deployment: &Deployment) -> ObservedDeployment {
    let spec = deployment.spec.as_ref();
    let template = spec
        .and_then(|spec| serde_json::to_value(&spec.template).ok())
        .and_then(|template| match template {
            serde_json::Value::Object(map) => Some(map),
            _ => None,
        });
    ObservedDeployment {
        name: deployment.name_any(),
        replicas: spec.and_then(|spec| spec.replicas).unwrap_or(1),
        template,
        selector: spec.map(|spec| spec.selector.clone()),
    }
}

/// The ReplicaSet carries every label of the Rollout's `selector.matchLabels` (the watch
/// already asked for the `rollouts-pod-template-hash` label), as the LIST by
/// [`replica_set_selector`] did.
fn selected_by(rollout: &Rollout, labels: &BTreeMap<String, String>) -> bool {
    rollout
        .spec
        .selector
        .as_ref()
        .and_then(|selector| selector.match_labels.as_ref())
        .is_none_or(|wanted| {
            wanted
                .iter()
                .all(|(key, value)| labels.get(key) == Some(value))
        })
}

fn observed_analysis_run(run: &AnalysisRun) -> ObservedAnalysisRun {
    let status = run.status.clone().unwrap_or_default();
    ObservedAnalysisRun {
        name: run.name_any(),
        pod_template_hash: run
            .labels()
            .get(DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY)
            .cloned()
            .unwrap_or_default(),
        step_index: run
            .labels()
            .get(ROLLOUT_CANARY_STEP_INDEX_LABEL)
            .and_then(|index| index.parse().ok()),
        phase: status.phase,
        message: status.message,
        terminating: run.spec.terminate,
        rollout_type: run
            .labels()
            .get(ROLLOUT_TYPE_LABEL)
            .cloned()
            .unwrap_or_default(),
        created: run
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(Timestamp::UNIX_EPOCH, |time| time.0),
    }
}

fn observed_experiment(experiment: &Experiment) -> ObservedExperiment {
    let status = experiment.status.clone().unwrap_or_default();
    ObservedExperiment {
        name: experiment.name_any(),
        pod_template_hash: experiment
            .labels()
            .get(DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY)
            .cloned()
            .unwrap_or_default(),
        phase: status.phase,
        message: status.message,
        terminating: experiment.spec.terminate,
        created: experiment
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(Timestamp::UNIX_EPOCH, |time| time.0),
        templates: status
            .template_statuses
            .into_iter()
            .map(|template| ObservedExperimentTemplate {
                name: template.name,
                service_name: template.service_name,
                pod_template_hash: template.pod_template_hash,
            })
            .collect(),
    }
}

/// The (Cluster)AnalysisTemplates every analysis of the spec names, nested references
/// followed; `None` when the spec names none. A template that does not exist is recorded as
/// missing, for the planner to refuse the run that needs it. Read only when a plan creates a
/// run, so a Rollout between runs reads none.
pub async fn templates(
    rollout: &Rollout,
    namespace: &str,
    ctx: &Context,
) -> Result<Option<ObservedTemplates>> {
    let mut pending: Vec<TemplateKey> = analysis_template_refs(rollout)
        .into_iter()
        .map(TemplateKey::of)
        .collect();
    if pending.is_empty() {
        return Ok(None);
    }
    let mut templates = ObservedTemplates::default();
    while let Some(key) = pending.pop() {
        if templates.found.contains_key(&key) || templates.missing.contains(&key) {
            continue;
        }
        // Decoded on their own, so a template that does not fit our types is named with the
        // field that does not.
        let found = if key.cluster {
            let api: Api<Decoded<ClusterAnalysisTemplate>> = Api::all(ctx.client.clone());
            api.get_opt(&key.name)
                .await
                .and_then(|t| t.map(|t| typed(t).map(|t| t.spec.0)).transpose())
        } else {
            let api: Api<Decoded<AnalysisTemplate>> =
                Api::namespaced(ctx.client.clone(), namespace);
            api.get_opt(&key.name)
                .await
                .and_then(|t| t.map(|t| typed(t).map(|t| t.spec)).transpose())
        }
        .map_err(|source| Error::Read {
            kind: key.kind(),
            namespace: namespace.to_string(),
            object: key.name.clone(),
            rollout: rollout.name_any(),
            source: Box::new(source),
        })?;
        match found {
            Some(spec) => {
                pending.extend(spec.templates.iter().map(TemplateKey::of));
                templates.found.insert(key, spec);
            }
            None => {
                templates.missing.insert(key);
            }
        }
    }
    Ok(Some(templates))
}

/// The typed object, or a decode error naming the field that does not fit.
fn typed<K>(decoded: Decoded<K>) -> std::result::Result<K, kube::Error> {
    match decoded {
        Decoded::Typed(object) => Ok(object),
        Decoded::Undecodable(undecodable) => Err(kube::Error::SerdeError(
            <serde_json::Error as serde::de::Error>::custom(undecodable.error),
        )),
    }
}

/// Every template reference of the spec: canary steps and background analysis, blue-green
/// pre- and post-promotion analysis.
fn analysis_template_refs(rollout: &Rollout) -> Vec<&RolloutAnalysisTemplate> {
    let strategy = &rollout.spec.strategy;
    let mut refs = Vec::new();
    if let Some(canary) = strategy.canary.as_ref() {
        for step in canary.steps() {
            refs.extend(
                step.analysis
                    .iter()
                    .flat_map(|analysis| analysis.templates()),
            );
        }
        refs.extend(
            canary
                .analysis
                .iter()
                .flat_map(|background| background.analysis.templates()),
        );
    }
    if let Some(blue_green) = strategy.blue_green.as_ref() {
        for analysis in [
            blue_green.pre_promotion_analysis.as_ref(),
            blue_green.post_promotion_analysis.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            refs.extend(analysis.templates());
        }
    }
    refs
}

/// The live pod template of the recorded current revision's ReplicaSet, read only while the
/// anti-affinity injected at its creation may name an older stable revision (the watch cache
/// keeps no templates).
async fn observe_live_templates(
    rollout: &Rollout,
    replica_sets: &[ObservedReplicaSet],
    ctx: &Context,
) -> Result<BTreeMap<String, serde_json::Value>> {
    let mut templates = BTreeMap::new();
    let current_hash = rollout
        .status
        .as_ref()
        .map(|status| status.current_pod_hash.as_str())
        .unwrap_or_default();
    if !planner::anti_affinity::may_need_refresh(rollout, current_hash) {
        return Ok(templates);
    }
    let Some(rs) = replica_sets
        .iter()
        .find(|rs| rs.pod_template_hash == current_hash)
    else {
        return Ok(templates);
    };
    let namespace = rollout.namespace().unwrap_or_default();
    let api: Api<ReplicaSet> = Api::namespaced(ctx.client.clone(), &namespace);
    let live = api.get(&rs.name).await.map_err(|source| Error::Read {
        kind: "ReplicaSet",
        namespace: namespace.clone(),
        object: rs.name.clone(),
        rollout: rollout.name_any(),
        source: Box::new(source),
    })?;
    let template = live
        .spec
        .as_ref()
        .and_then(|spec| serde_json::to_value(&spec.template).ok())
        .unwrap_or(serde_json::Value::Null);
    templates.insert(rs.name.clone(), template);
    Ok(templates)
}

/// Whether every router holds the weight `status` records: `None` without routers, without a
/// recorded weight, or when a router cannot tell.
pub async fn verify_recorded_weight(
    rollout: &Rollout,
    routers: &[Box<dyn TrafficRouter>],
) -> Result<Option<bool>> {
    let Some(weights) = rollout
        .status
        .as_ref()
        .and_then(|status| status.canary.weights.as_ref())
    else {
        return Ok(None);
    };
    let mut verified = None;
    for router in routers {
        let answer = router
            .verify_weight(weights.canary.weight, &weights.additional)
            .await
            .map_err(|source| Error::Traffic {
                operation: "verify weight",
                router: router.kind().to_string(),
                namespace: rollout.namespace().unwrap_or_default(),
                rollout: rollout.name_any(),
                source: Box::new(source),
            })?;
        match answer {
            Some(false) => return Ok(Some(false)),
            Some(true) => verified = Some(true),
            None => return Ok(None),
        }
    }
    Ok(verified)
}

/// The Services the spec names, keyed by the field that names them.
pub fn named_services(rollout: &Rollout) -> Vec<(&'static str, String)> {
    let mut named = Vec::new();
    if let Some(canary) = rollout.spec.strategy.canary.as_ref() {
        named.extend(
            canary
                .stable_service
                .clone()
                .map(|s| ("spec.strategy.canary.stableService", s)),
        );
        named.extend(
            canary
                .canary_service
                .clone()
                .map(|s| ("spec.strategy.canary.canaryService", s)),
        );
    }
    if let Some(blue_green) = rollout.spec.strategy.blue_green.as_ref() {
        named.extend(
            blue_green
                .active_service
                .clone()
                .map(|s| ("spec.strategy.blueGreen.activeService", s)),
        );
        named.extend(
            blue_green
                .preview_service
                .clone()
                .map(|s| ("spec.strategy.blueGreen.previewService", s)),
        );
    }
    named
}

/// Which Rollout field names `service`, for error messages.
pub fn service_field(rollout: &Rollout, service: &str) -> &'static str {
    named_services(rollout)
        .into_iter()
        .find(|(_, name)| name == service)
        .map_or("spec.strategy", |(field, _)| field)
}

/// `rollouts-pod-template-hash` plus the selector's matchLabels: only our ReplicaSets come back.
pub fn replica_set_selector(rollout: &Rollout) -> String {
    let mut terms = vec![DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY.to_string()];
    if let Some(labels) = rollout
        .spec
        .selector
        .as_ref()
        .and_then(|selector| selector.match_labels.as_ref())
    {
        terms.extend(labels.iter().map(|(key, value)| format!("{key}={value}")));
    }
    terms.join(",")
}

fn observed_replica_set(rs: &ReplicaSet) -> ObservedReplicaSet {
    let status = rs.status.clone().unwrap_or_default();
    ObservedReplicaSet {
        name: rs.name_any(),
        pod_template_hash: rs
            .labels()
            .get(DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY)
            .cloned()
            .unwrap_or_default(),
        replicas: rs.spec.as_ref().and_then(|spec| spec.replicas).unwrap_or(1),
        current_replicas: status.replicas,
        ready_replicas: status.ready_replicas.unwrap_or(0),
        available_replicas: status.available_replicas.unwrap_or(0),
        annotations: rs.annotations().clone(),
        created: rs
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(Timestamp::UNIX_EPOCH, |time| time.0),
        min_ready_seconds: rs
            .spec
            .as_ref()
            .and_then(|spec| spec.min_ready_seconds)
            .unwrap_or(0),
        replica_failure: status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == REPLICA_FAILURE && c.status == "True")
            .map(|c| ReplicaFailure {
                reason: c.reason.clone().unwrap_or_default(),
                message: c.message.clone().unwrap_or_default(),
                since: c.last_transition_time.as_ref().map(|t| t.0),
            }),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::apps::v1::{ReplicaSetSpec, ReplicaSetStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
    use rollouts_crds::rollout::CanaryStep;

    use super::*;

    #[test]
    fn replica_sets_are_selected_by_hash_label_and_match_labels() {
        let mut rollout = Rollout::test_canary("web", vec![CanaryStep::weight(20)]);
        rollout.spec.selector = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([("app".to_string(), "web".to_string())])),
            ..LabelSelector::default()
        });
        assert_eq!(
            replica_set_selector(&rollout),
            "rollouts-pod-template-hash,app=web"
        );
        rollout.spec.selector = None;
        assert_eq!(replica_set_selector(&rollout), "rollouts-pod-template-hash");
    }

    #[test]
    fn a_replica_set_is_observed_with_its_hash_and_counts() {
        let rs = ReplicaSet {
            metadata: ObjectMeta {
                name: Some("web-abc".into()),
                labels: Some(BTreeMap::from([(
                    DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY.to_string(),
                    "abc".to_string(),
                )])),
                ..ObjectMeta::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(3),
                ..ReplicaSetSpec::default()
            }),
            status: Some(ReplicaSetStatus {
                replicas: 3,
                ready_replicas: Some(2),
                available_replicas: Some(1),
                ..ReplicaSetStatus::default()
            }),
        };
        let observed = observed_replica_set(&rs);
        assert_eq!(observed.name, "web-abc");
        assert_eq!(observed.pod_template_hash, "abc");
        assert_eq!(
            (
                observed.replicas,
                observed.current_replicas,
                observed.ready_replicas,
                observed.available_replicas
            ),
            (3, 3, 2, 1)
        );
    }

    #[test]
    fn an_analysis_run_is_observed_with_its_step_hash_and_phase() {
        let run: AnalysisRun = serde_json::from_value(serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "AnalysisRun",
            "metadata": {
                "name": "web-abc-2-1",
                "labels": {"rollout-type": "Step", "step-index": "1", "rollouts-pod-template-hash": "abc"}
            },
            "spec": {"metrics": [], "terminate": true},
            "status": {"phase": "Failed", "message": "error rate too high"}
        }))
        .expect("an AnalysisRun");
        let observed = observed_analysis_run(&run);
        assert_eq!(observed.name, "web-abc-2-1");
        assert_eq!(observed.pod_template_hash, "abc");
        assert_eq!(observed.step_index, Some(1));
        assert_eq!(observed.rollout_type, "Step");
        assert_eq!(
            observed.phase,
            rollouts_crds::analysis::AnalysisPhase::Failed
        );
        assert_eq!(observed.message, "error rate too high");
        assert!(observed.terminating);
    }
}
