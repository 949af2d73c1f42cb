//! The act phase: applies a planner [`Plan`] to the cluster in the planner's order — create the
//! new ReplicaSet, scale, write or clear scale-down deadlines, sync ephemeral pod metadata, point
//! services, drive the traffic routers, create and terminate AnalysisRuns, delete old
//! ReplicaSets, patch status, record events — and says when to look again. Every write is
//! skipped when the live object already matches, so a reconcile with nothing to do writes
//! nothing.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event as KubeEvent, EventType as KubeEventType};
use kube::{Resource, ResourceExt};
use rollouts_analysis::compose;
use rollouts_crds::analysis::{
    AnalysisRun, AnalysisRunSpec, AnalysisTemplate, AnalysisTemplateSpec, ClusterAnalysisTemplate,
};
use rollouts_crds::rollout::{
    AnalysisRunArgument, CONTROLLER_INSTANCE_ID_LABEL_KEY, DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY,
    MANAGED_BY_ROLLOUTS_KEY, ROLLOUT_CANARY_STEP_INDEX_LABEL, ROLLOUT_TYPE_LABEL,
    ROLLOUT_TYPE_POST_PROMOTION, ROLLOUT_TYPE_PRE_PROMOTION, ROLLOUT_TYPE_STEP,
    RolloutAnalysisTemplate, SCALE_DOWN_DEADLINE_ANNOTATION_KEY, ValueFromPodTemplateHash,
};
use rollouts_crds::rollout::{PodTemplateMetadata, Rollout, RolloutStatus};
use rollouts_traffic::TrafficRouter;
use serde_json::{Value, json};

use crate::context::Context;
use crate::error::{Error, Result};
use crate::planner::anti_affinity;
use crate::planner::{
    AnalysisRunToCreate, DeploymentScale, EventType, NewReplicaSet, Observed, ObservedReplicaSet,
    Plan, REVISION_ANNOTATION, ServiceSelector, TrafficPlan,
};
use crate::status_patch;

/// Annotation on a ReplicaSet recording the ephemeral pod metadata applied to it (JSON), so
/// keys can be removed when the metadata changes; Argo's key.
pub const EPHEMERAL_METADATA_ANNOTATION: &str = "rollout.argoproj.io/ephemeral-metadata";

/// The Services the spec names that exist, as read during observe.
pub type LiveServices = BTreeMap<String, Service>;

/// Applies `plan` for `rollout` and returns when to reconcile again.
pub async fn apply(
    rollout: &Rollout,
    observed: &Observed,
    services: &LiveServices,
    routers: &[Box<dyn TrafficRouter>],
    plan: &Plan,
    status: &RolloutStatus,
    ctx: &Context,
) -> Result<Action> {
    let target = Target::of(rollout)?;
    for pod in &plan.evict_pods {
        evict_pod(&target, pod, ctx).await?;
    }
    if let Some(new_rs) = &plan.create_replica_set
        && !create_replica_set(
            &target,
            rollout,
            new_rs,
            ephemeral_for(plan, &new_rs.name),
            ctx,
        )
        .await?
    {
        // Someone created it between our list and our create: plan again from what is there.
        return Ok(Action::requeue(Duration::ZERO));
    }
    if plan.create_replica_set.is_none() {
        refresh_anti_affinity(
            &target,
            rollout,
            observed,
            &plan.status.current_pod_hash,
            ctx,
        )
        .await?;
    }
    if let Some(revise) = &plan.revise_replica_set {
        let value = revise.revision.to_string();
        let live = observed
            .replica_sets
            .iter()
            .find(|rs| rs.name == revise.name)
            .and_then(|rs| rs.annotations.get(REVISION_ANNOTATION));
        if live != Some(&value) {
            annotate_revision(&target, &revise.name, &value, ctx).await?;
        }
    }
    for scale in &plan.scale_replica_sets {
        let live = observed
            .replica_sets
            .iter()
            .find(|rs| rs.name == scale.name)
            .map(|rs| rs.replicas);
        if live != Some(scale.to) {
            scale_replica_set(&target, &scale.name, scale.to, ctx).await?;
        }
    }
    if let Some(scale) = &plan.scale_deployment {
        scale_deployment(&target, scale, ctx).await?;
    }
    for deadline in &plan.set_scale_down_deadlines {
        let value = deadline.deadline.to_string();
        let live = observed
            .replica_sets
            .iter()
            .find(|rs| rs.name == deadline.name)
            .and_then(|rs| rs.annotations.get(SCALE_DOWN_DEADLINE_ANNOTATION_KEY));
        if live != Some(&value) {
            annotate_scale_down_deadline(&target, &deadline.name, Some(&value), ctx).await?;
        }
    }
    for name in &plan.clear_scale_down_deadlines {
        let annotated = observed.replica_sets.iter().any(|rs| {
            &rs.name == name
                && rs
                    .annotations
                    .contains_key(SCALE_DOWN_DEADLINE_ANNOTATION_KEY)
        });
        if annotated {
            annotate_scale_down_deadline(&target, name, None, ctx).await?;
        }
    }
    for wanted in &plan.replica_set_metadata {
        if plan
            .create_replica_set
            .as_ref()
            .is_some_and(|new_rs| new_rs.name == wanted.name)
        {
            continue;
        }
        if let Some(rs) = observed
            .replica_sets
            .iter()
            .find(|rs| rs.name == wanted.name)
        {
            sync_ephemeral_metadata(&target, rollout, rs, wanted.metadata.as_ref(), ctx).await?;
        }
    }
    for selector in &plan.service_selectors {
        point_service(&target, rollout, services, selector, ctx).await?;
    }
    if let Some(traffic) = &plan.traffic {
        for router in routers {
            route_traffic(&target, router.as_ref(), traffic).await?;
        }
    }
    for run in &plan.create_analysis_runs {
        let revision = run_revision(plan, observed, &run.pod_template_hash);
        create_analysis_run(&target, rollout, run, revision, ctx).await?;
    }
    for name in &plan.terminate_analysis_runs {
        let running = observed
            .analysis_runs
            .iter()
            .any(|run| &run.name == name && !run.terminating);
        if running {
            terminate_analysis_run(&target, name, ctx).await?;
        }
    }
    for name in &plan.delete_analysis_runs {
        delete_analysis_run(&target, name, ctx).await?;
    }
    for name in &plan.delete_replica_sets {
        delete_replica_set(&target, name, ctx).await?;
    }
    write_status(rollout, status, ctx).await?;
    for event in &plan.events {
        publish(&target, rollout, event, ctx).await;
    }
    Ok(plan
        .requeue_after
        .map_or_else(Action::await_change, Action::requeue))
}

/// The Rollout's namespace and name, and the owner reference its objects carry.
struct Target {
    namespace: String,
    name: String,
    owner: OwnerReference,
}

impl Target {
    fn of(rollout: &Rollout) -> Result<Self> {
        let name = rollout.name_any();
        let namespace = rollout
            .namespace()
            .ok_or_else(|| Error::MissingObjectKey(name.clone()))?;
        let owner = rollout
            .controller_owner_ref(&())
            .ok_or_else(|| Error::MissingObjectKey(format!("{namespace}/{name} (no uid)")))?;
        Ok(Self {
            namespace,
            name,
            owner,
        })
    }

    fn api<K>(&self, ctx: &Context) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(ctx.client.clone(), &self.namespace)
    }

    fn write_error(
        &self,
        verb: &'static str,
        kind: &'static str,
        object: &str,
    ) -> impl FnOnce(kube::Error) -> Error {
        let namespace = self.namespace.clone();
        let rollout = self.name.clone();
        let object = object.to_string();
        move |source| Error::Write {
            verb,
            kind,
            namespace,
            object,
            rollout,
            source: Box::new(source),
        }
    }
}

/// The ephemeral pod metadata the plan wants on ReplicaSet `name`.
fn ephemeral_for<'a>(plan: &'a Plan, name: &str) -> Option<&'a PodTemplateMetadata> {
    plan.replica_set_metadata
        .iter()
        .find(|wanted| wanted.name == name)
        .and_then(|wanted| wanted.metadata.as_ref())
}

/// The ReplicaSet for the current pod template: the template with the hash label in its pod
/// labels and selector (and any ephemeral metadata), owned by the Rollout, annotated with its
/// revision.
pub fn replica_set_for(
    rollout: &Rollout,
    new_rs: &NewReplicaSet,
    ephemeral: Option<&PodTemplateMetadata>,
    owner: OwnerReference,
) -> Result<ReplicaSet, serde_json::Error> {
    let mut template = rollout
        .spec
        .template
        .as_ref()
        .map(|template| Value::Object(template.0.clone()))
        .unwrap_or_else(|| json!({}));
    if !template["metadata"].is_object() {
        template["metadata"] = json!({});
    }
    if !template["metadata"]["labels"].is_object() {
        template["metadata"]["labels"] = json!({});
    }
    let ephemeral = ephemeral.cloned().unwrap_or_default();
    for (key, value) in ephemeral.labels.iter().flatten() {
        template["metadata"]["labels"][key] = json!(value);
    }
    if ephemeral
        .annotations
        .as_ref()
        .is_some_and(|a| !a.is_empty())
        && !template["metadata"]["annotations"].is_object()
    {
        template["metadata"]["annotations"] = json!({});
    }
    for (key, value) in ephemeral.annotations.iter().flatten() {
        template["metadata"]["annotations"][key] = json!(value);
    }
    template["metadata"]["labels"][DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY] =
        json!(new_rs.pod_template_hash);
    anti_affinity::inject(&mut template, rollout, &new_rs.pod_template_hash);
    let labels = template["metadata"]["labels"].clone();
    let mut annotations = json!({ REVISION_ANNOTATION: new_rs.revision.to_string() });
    if let Some(applied) = applied_annotation(&ephemeral) {
        annotations[EPHEMERAL_METADATA_ANNOTATION] = json!(applied);
    }
    let mut selector = rollout.spec.selector.clone().unwrap_or(LabelSelector {
        match_labels: None,
        match_expressions: None,
    });
    selector
        .match_labels
        .get_or_insert_with(BTreeMap::new)
        .insert(
            DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY.to_string(),
            new_rs.pod_template_hash.clone(),
        );
    let mut replica_set = json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": new_rs.name,
            "namespace": rollout.namespace(),
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner],
        },
        "spec": {
            "replicas": new_rs.replicas,
            "selector": selector,
            "template": template,
        },
    });
    if let Some(seconds) = rollout.spec.min_ready_seconds {
        replica_set["spec"]["minReadySeconds"] = json!(seconds);
    }
    serde_json::from_value(replica_set)
}

/// Creates the new ReplicaSet; false when one of that name already exists.
async fn create_replica_set(
    target: &Target,
    rollout: &Rollout,
    new_rs: &NewReplicaSet,
    ephemeral: Option<&PodTemplateMetadata>,
    ctx: &Context,
) -> Result<bool> {
    let built = replica_set_for(rollout, new_rs, ephemeral, target.owner.clone());
    let replica_set = built.map_err(|source| Error::InvalidTemplate {
        namespace: target.namespace.clone(),
        name: target.name.clone(),
        source,
    })?;
    let api: Api<ReplicaSet> = target.api(ctx);
    match api.create(&PostParams::default(), &replica_set).await {
        Ok(created) => {
            ctx.caches.replica_sets.expect_written(
                &target.owner.uid,
                &new_rs.name,
                created.resource_version(),
            );
            tracing::info!(replica_set = %new_rs.name, replicas = new_rs.replicas, revision = new_rs.revision, "created ReplicaSet");
            Ok(true)
        }
        Err(kube::Error::Api(status)) if status.code == 409 => {
            // Plan again only once the cache shows the ReplicaSet that is there.
            ctx.caches
                .replica_sets
                .expect_written(&target.owner.uid, &new_rs.name, None);
            Ok(false)
        }
        Err(source) => Err(target.write_error("create", "ReplicaSet", &new_rs.name)(
            source,
        )),
    }
}

/// The `ephemeral-metadata` annotation value for `metadata`; `None` when it adds nothing.
fn applied_annotation(metadata: &PodTemplateMetadata) -> Option<String> {
    let normalized = normalized(Some(metadata));
    // Maps of strings always have a JSON form.
    (normalized != PodTemplateMetadata::default()).then(|| json!(normalized).to_string())
}

/// Empty maps become absent, so "nothing" has one form.
fn normalized(metadata: Option<&PodTemplateMetadata>) -> PodTemplateMetadata {
    let keep = |map: Option<&BTreeMap<String, String>>| map.filter(|m| !m.is_empty()).cloned();
    PodTemplateMetadata {
        labels: keep(metadata.and_then(|m| m.labels.as_ref())),
        annotations: keep(metadata.and_then(|m| m.annotations.as_ref())),
    }
}

/// The merge patch of a label or annotation map taking `applied` keys to `wanted` ones; keys
/// in `protected` (the selector's) are never touched.
fn map_delta(
    applied: Option<&BTreeMap<String, String>>,
    wanted: Option<&BTreeMap<String, String>>,
    protected: &BTreeMap<String, String>,
) -> serde_json::Map<String, Value> {
    let mut delta = serde_json::Map::new();
    for key in applied.into_iter().flatten().map(|(key, _)| key) {
        if !protected.contains_key(key) && !wanted.is_some_and(|w| w.contains_key(key)) {
            delta.insert(key.clone(), Value::Null);
        }
    }
    for (key, value) in wanted.into_iter().flatten() {
        if !protected.contains_key(key) {
            delta.insert(key.clone(), json!(value));
        }
    }
    delta
}

/// Puts the wanted ephemeral labels and annotations on a ReplicaSet's template and its running
/// pods, removing those applied before (recorded in the `ephemeral-metadata` annotation).
async fn sync_ephemeral_metadata(
    target: &Target,
    rollout: &Rollout,
    rs: &ObservedReplicaSet,
    wanted: Option<&PodTemplateMetadata>,
    ctx: &Context,
) -> Result<()> {
    let applied: PodTemplateMetadata = rs
        .annotations
        .get(EPHEMERAL_METADATA_ANNOTATION)
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default();
    let applied = normalized(Some(&applied));
    let wanted = normalized(wanted);
    if applied == wanted {
        return Ok(());
    }
    let mut protected = rollout
        .spec
        .selector
        .as_ref()
        .and_then(|selector| selector.match_labels.clone())
        .unwrap_or_default();
    protected.insert(
        DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY.to_string(),
        rs.pod_template_hash.clone(),
    );
    let labels = map_delta(applied.labels.as_ref(), wanted.labels.as_ref(), &protected);
    let annotations = map_delta(
        applied.annotations.as_ref(),
        wanted.annotations.as_ref(),
        &BTreeMap::new(),
    );
    let record = applied_annotation(&wanted);
    let pod_patch = json!({ "metadata": { "labels": labels, "annotations": annotations } });
    let rs_patch = json!({
        "metadata": { "annotations": { EPHEMERAL_METADATA_ANNOTATION: record } },
        "spec": { "template": pod_patch },
    });
    let replica_sets: Api<ReplicaSet> = target.api(ctx);
    let synced = replica_sets
        .patch(&rs.name, &PatchParams::default(), &Patch::Merge(&rs_patch))
        .await
        .map_err(target.write_error("update pod metadata of", "ReplicaSet", &rs.name))?;
    ctx.caches
        .replica_sets
        .expect_written(&target.owner.uid, &rs.name, synced.resource_version());
    let pods: Api<Pod> = target.api(ctx);
    let selector = format!(
        "{DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY}={}",
        rs.pod_template_hash
    );
    let listed = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|source| Error::Read {
            kind: "Pod",
            namespace: target.namespace.clone(),
            object: selector.clone(),
            rollout: target.name.clone(),
            source: Box::new(source),
        })?;
    for pod in listed
        .items
        .iter()
        .filter(|pod| pod.owner_references().iter().any(|o| o.name == rs.name))
    {
        let name = pod.name_any();
        pods.patch(&name, &PatchParams::default(), &Patch::Merge(&pod_patch))
            .await
            .map_err(target.write_error("update metadata of", "Pod", &name))?;
    }
    tracing::info!(replica_set = %rs.name, "synced ephemeral pod metadata");
    Ok(())
}

async fn scale_replica_set(target: &Target, name: &str, to: i32, ctx: &Context) -> Result<()> {
    let api: Api<ReplicaSet> = target.api(ctx);
    let scale = api
        .patch_scale(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "replicas": to } })),
        )
        .await
        .map_err(target.write_error("scale", "ReplicaSet", name))?;
    // The Scale carries the ReplicaSet's resourceVersion after the write.
    ctx.caches.replica_sets.expect_written(
        &target.owner.uid,
        name,
        scale.metadata.resource_version,
    );
    tracing::info!(replica_set = %name, replicas = to, "scaled ReplicaSet");
    Ok(())
}

/// Restarts a pod for `spec.restartAt` through the eviction subresource, so disruption budgets
/// are honoured: an eviction a budget refuses (429) is left for a later reconcile.
async fn evict_pod(target: &Target, name: &str, ctx: &Context) -> Result<()> {
    let api: Api<Pod> = target.api(ctx);
    match api.evict(name, &EvictParams::default()).await {
        Ok(_) => {
            tracing::info!(pod = %name, "evicted pod created before restartAt");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 429 => {
            tracing::warn!(pod = %name, reason = %status.message, "eviction refused by a disruption budget; retrying later");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => Err(target.write_error("evict", "Pod", name)(source)),
    }
}

/// Points the anti-affinity term of the current revision's ReplicaSet at the stable revision
/// when it names an older one (the stable changed since it was created), as Argo does. The
/// ReplicaSet is read only during an update of a Rollout with `antiAffinity`.
async fn refresh_anti_affinity(
    target: &Target,
    rollout: &Rollout,
    observed: &Observed,
    current_hash: &str,
    ctx: &Context,
) -> Result<()> {
    if !anti_affinity::may_need_refresh(rollout, current_hash) {
        return Ok(());
    }
    let Some(rs) = observed
        .replica_sets
        .iter()
        .find(|rs| rs.pod_template_hash == current_hash)
    else {
        return Ok(());
    };
    let api: Api<ReplicaSet> = target.api(ctx);
    let live = api.get(&rs.name).await.map_err(|source| Error::Read {
        kind: "ReplicaSet",
        namespace: target.namespace.clone(),
        object: rs.name.clone(),
        rollout: target.name.clone(),
        source: Box::new(source),
    })?;
    let live_template = live
        .spec
        .as_ref()
        .and_then(|spec| serde_json::to_value(&spec.template).ok())
        .unwrap_or(Value::Null);
    let Some(affinity) = anti_affinity::refreshed_affinity(&live_template, rollout, current_hash)
    else {
        return Ok(());
    };
    let patch = json!({ "spec": { "template": { "spec": { "affinity": affinity } } } });
    api.patch(&rs.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(target.write_error("update the anti-affinity of", "ReplicaSet", &rs.name))?;
    tracing::info!(replica_set = %rs.name, "pointed the injected anti-affinity at the stable revision");
    Ok(())
}

/// Sets the `spec.workloadRef` Deployment's `spec.replicas` (`scaleDown`).
async fn scale_deployment(target: &Target, scale: &DeploymentScale, ctx: &Context) -> Result<()> {
    let api: Api<Deployment> = target.api(ctx);
    let patch = json!({ "spec": { "replicas": scale.to } });
    api.patch(&scale.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(target.write_error("scale", "Deployment", &scale.name))?;
    tracing::info!(deployment = %scale.name, from = scale.from, to = scale.to, "scaled the workloadRef Deployment");
    Ok(())
}

/// Raises a reused ReplicaSet's revision annotation.
async fn annotate_revision(
    target: &Target,
    name: &str,
    revision: &str,
    ctx: &Context,
) -> Result<()> {
    let api: Api<ReplicaSet> = target.api(ctx);
    let patch = json!({ "metadata": { "annotations": { REVISION_ANNOTATION: revision } } });
    let revised = api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(target.write_error("set the revision of", "ReplicaSet", name))?;
    ctx.caches
        .replica_sets
        .expect_written(&target.owner.uid, name, revised.resource_version());
    tracing::info!(replica_set = %name, revision, "revised ReplicaSet");
    Ok(())
}

/// Sets (`Some`) or removes (`None`) a ReplicaSet's `scale-down-deadline` annotation.
async fn annotate_scale_down_deadline(
    target: &Target,
    name: &str,
    deadline: Option<&str>,
    ctx: &Context,
) -> Result<()> {
    let api: Api<ReplicaSet> = target.api(ctx);
    let patch =
        json!({ "metadata": { "annotations": { SCALE_DOWN_DEADLINE_ANNOTATION_KEY: deadline } } });
    let annotated = api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(target.write_error("annotate", "ReplicaSet", name))?;
    ctx.caches
        .replica_sets
        .expect_written(&target.owner.uid, name, annotated.resource_version());
    Ok(())
}

async fn delete_replica_set(target: &Target, name: &str, ctx: &Context) -> Result<()> {
    let api: Api<ReplicaSet> = target.api(ctx);
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => {
            ctx.caches
                .replica_sets
                .expect_deleted(&target.owner.uid, name);
            tracing::info!(replica_set = %name, "deleted old ReplicaSet beyond revisionHistoryLimit");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 404 => {
            ctx.caches
                .replica_sets
                .expect_deleted(&target.owner.uid, name);
            Ok(())
        }
        Err(source) => Err(target.write_error("delete", "ReplicaSet", name)(source)),
    }
}

/// Points a Service at a revision: merge-patches its selector only when it selects another.
async fn point_service(
    target: &Target,
    rollout: &Rollout,
    services: &LiveServices,
    selector: &ServiceSelector,
    ctx: &Context,
) -> Result<()> {
    let Some(service) = services.get(&selector.service) else {
        return Err(Error::ServiceNotFound {
            namespace: target.namespace.clone(),
            rollout: target.name.clone(),
            service: selector.service.clone(),
            field: service_field(rollout, &selector.service),
        });
    };
    let live = service
        .spec
        .as_ref()
        .and_then(|spec| spec.selector.as_ref())
        .and_then(|labels| labels.get(DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY));
    if live == Some(&selector.pod_template_hash) {
        return Ok(());
    }
    let patch = json!({
        "metadata": { "annotations": { MANAGED_BY_ROLLOUTS_KEY: target.name } },
        "spec": { "selector": { DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY: selector.pod_template_hash } },
    });
    let api: Api<Service> = target.api(ctx);
    api.patch(
        &selector.service,
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(target.write_error("patch selector of", "Service", &selector.service))?;
    tracing::info!(service = %selector.service, hash = %selector.pod_template_hash, "pointed Service");
    Ok(())
}

/// Brings one router to the plan's state, in the planner's order; each call writes only what
/// differs.
async fn route_traffic(
    target: &Target,
    router: &dyn TrafficRouter,
    traffic: &TrafficPlan,
) -> Result<()> {
    let failed = |operation: &'static str| {
        let namespace = target.namespace.clone();
        let rollout = target.name.clone();
        let router = router.kind().to_string();
        move |source| Error::Traffic {
            operation,
            router,
            namespace,
            rollout,
            source: Box::new(source),
        }
    };
    let mut written = Vec::new();
    if traffic.remove_managed_routes {
        written.extend(
            router
                .remove_managed_routes()
                .await
                .map_err(failed("remove managed routes"))?,
        );
    }
    if !traffic.canary_hash.is_empty() || !traffic.stable_hash.is_empty() {
        written.extend(
            router
                .update_hash(
                    &traffic.canary_hash,
                    &traffic.stable_hash,
                    &traffic.additional,
                )
                .await
                .map_err(failed("update hashes"))?,
        );
    }
    if let Some(route) = &traffic.set_header_route {
        written.extend(
            router
                .set_header_route(route)
                .await
                .map_err(failed("set header route"))?,
        );
    }
    if let Some(route) = &traffic.set_mirror_route {
        written.extend(
            router
                .set_mirror_route(route)
                .await
                .map_err(failed("set mirror route"))?,
        );
    }
    written.extend(
        router
            .set_weight(traffic.desired_weight, &traffic.additional)
            .await
            .map_err(failed("set weight"))?,
    );
    if !written.is_empty() {
        tracing::info!(router = %router.kind(), weight = traffic.desired_weight, ?written, "routed traffic");
    }
    Ok(())
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
fn service_field(rollout: &Rollout, service: &str) -> &'static str {
    named_services(rollout)
        .into_iter()
        .find(|(_, name)| name == service)
        .map_or("spec.strategy", |(field, _)| field)
}

/// Creates a step's AnalysisRun from its templates, with `Stable`/`Latest` hashes and field
/// references resolved into argument values.
/// The revision of the ReplicaSet a run analyses (the one this plan creates, revises, or an
/// existing one), which Argo writes on the run so tools group runs under their revision.
fn run_revision(plan: &Plan, observed: &Observed, hash: &str) -> Option<String> {
    if let Some(new) = plan
        .create_replica_set
        .as_ref()
        .filter(|new| new.pod_template_hash == hash)
    {
        return Some(new.revision.to_string());
    }
    let rs = observed
        .replica_sets
        .iter()
        .find(|rs| rs.pod_template_hash == hash)?;
    if let Some(revise) = plan
        .revise_replica_set
        .as_ref()
        .filter(|revise| revise.name == rs.name)
    {
        return Some(revise.revision.to_string());
    }
    rs.annotations.get(REVISION_ANNOTATION).cloned()
}

async fn create_analysis_run(
    target: &Target,
    rollout: &Rollout,
    run: &AnalysisRunToCreate,
    revision: Option<String>,
    ctx: &Context,
) -> Result<()> {
    let field = match run.rollout_type.as_str() {
        ROLLOUT_TYPE_PRE_PROMOTION => "spec.strategy.blueGreen.prePromotionAnalysis".to_string(),
        ROLLOUT_TYPE_POST_PROMOTION => "spec.strategy.blueGreen.postPromotionAnalysis".to_string(),
        rollouts_crds::rollout::ROLLOUT_TYPE_BACKGROUND => {
            "spec.strategy.canary.analysis".to_string()
        }
        _ => format!("spec.strategy.canary.steps[{}].analysis", run.step_index),
    };
    let invalid = |reason: String| Error::InvalidAnalysis {
        namespace: target.namespace.clone(),
        rollout: target.name.clone(),
        field: field.clone(),
        reason,
    };
    let templates = gather_templates(target, run.analysis.templates(), ctx)
        .await?
        .map_err(&invalid)?;
    let args = resolve_rollout_args(rollout, run).map_err(&invalid)?;
    let spec: AnalysisRunSpec = compose::run_spec(
        &templates,
        &args,
        run.analysis.dry_run.as_deref().unwrap_or_default(),
        run.analysis
            .measurement_retention
            .as_deref()
            .unwrap_or_default(),
    )
    .map_err(&invalid)?;
    let mut analysis_run = AnalysisRun::new(&run.name, spec);
    let metadata = run
        .analysis
        .analysis_run_metadata
        .clone()
        .unwrap_or_default();
    let mut labels = metadata.labels.unwrap_or_default();
    labels.insert(ROLLOUT_TYPE_LABEL.into(), run.rollout_type.clone());
    if run.rollout_type == ROLLOUT_TYPE_STEP {
        labels.insert(
            ROLLOUT_CANARY_STEP_INDEX_LABEL.into(),
            run.step_index.to_string(),
        );
    }
    labels.insert(
        DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY.into(),
        run.pod_template_hash.clone(),
    );
    // As Argo: the run carries its Rollout's instance label, so the AnalysisRun controller of
    // the same `--instance-id` (and only that one) measures it.
    if let Some(instance) = rollout.labels().get(CONTROLLER_INSTANCE_ID_LABEL_KEY) {
        labels.insert(CONTROLLER_INSTANCE_ID_LABEL_KEY.into(), instance.clone());
    }
    analysis_run.metadata.namespace = Some(target.namespace.clone());
    analysis_run.metadata.labels = Some(labels);
    let mut annotations = metadata.annotations.unwrap_or_default();
    if let Some(revision) = revision {
        annotations.insert(REVISION_ANNOTATION.into(), revision);
    }
    analysis_run.metadata.annotations = (!annotations.is_empty()).then_some(annotations);
    analysis_run.metadata.owner_references = Some(vec![target.owner.clone()]);
    let api: Api<AnalysisRun> = target.api(ctx);
    match api.create(&PostParams::default(), &analysis_run).await {
        Ok(created) => {
            ctx.caches.analysis_runs.expect_written(
                &target.owner.uid,
                &run.name,
                created.resource_version(),
            );
            tracing::info!(analysis_run = %run.name, step = run.step_index, "created AnalysisRun");
            Ok(())
        }
        // Created by an earlier attempt whose status write was lost: the next plan finds it.
        Err(kube::Error::Api(status)) if status.code == 409 => {
            ctx.caches
                .analysis_runs
                .expect_written(&target.owner.uid, &run.name, None);
            Ok(())
        }
        Err(source) => Err(target.write_error("create", "AnalysisRun", &run.name)(
            source,
        )),
    }
}

/// Fetches the templates the references name (and those they reference). The outer error is
/// an API failure; the inner one a template that is missing or does not compose.
async fn gather_templates(
    target: &Target,
    refs: &[RolloutAnalysisTemplate],
    ctx: &Context,
) -> Result<Result<compose::Templates, String>> {
    let mut fetched: HashMap<(bool, String), AnalysisTemplateSpec> = HashMap::new();
    loop {
        let mut missing = None;
        let gathered = compose::gather(refs, |reference| {
            let key = (
                reference.cluster_scope == Some(true),
                reference.template_name.clone(),
            );
            match fetched.get(&key) {
                Some(spec) => Ok(spec.clone()),
                None => {
                    missing = Some(key);
                    Err(String::new())
                }
            }
        });
        let Some((cluster, name)) = missing else {
            return Ok(gathered);
        };
        let found = if cluster {
            let api: Api<ClusterAnalysisTemplate> = Api::all(ctx.client.clone());
            api.get_opt(&name).await.map(|t| t.map(|t| t.spec.0))
        } else {
            let api: Api<AnalysisTemplate> = target.api(ctx);
            api.get_opt(&name).await.map(|t| t.map(|t| t.spec))
        }
        .map_err(|source| Error::Read {
            kind: if cluster {
                "ClusterAnalysisTemplate"
            } else {
                "AnalysisTemplate"
            },
            namespace: target.namespace.clone(),
            object: name.clone(),
            rollout: target.name.clone(),
            source: Box::new(source),
        })?;
        match found {
            Some(spec) => {
                fetched.insert((cluster, name), spec);
            }
            None => {
                let kind = if cluster {
                    "ClusterAnalysisTemplate"
                } else {
                    "AnalysisTemplate"
                };
                return Ok(Err(format!(
                    "{kind} {name:?} not found: create it, or fix templateName"
                )));
            }
        }
    }
}

/// The step's arguments with `podTemplateHashValue` and `fieldRef` turned into values, as the
/// Rollout resolves them before a run exists.
fn resolve_rollout_args(
    rollout: &Rollout,
    run: &AnalysisRunToCreate,
) -> Result<Vec<AnalysisRunArgument>, String> {
    let rollout_json = serde_json::to_value(rollout).map_err(|e| e.to_string())?;
    let mut resolved = Vec::new();
    for arg in run.analysis.args.iter().flatten() {
        let mut arg = arg.clone();
        if let Some(from) = arg.value_from.clone() {
            if let Some(which) = from.pod_template_hash_value {
                arg.value = Some(match which {
                    ValueFromPodTemplateHash::Stable => run.stable_pod_template_hash.clone(),
                    ValueFromPodTemplateHash::Latest => run.pod_template_hash.clone(),
                });
                arg.value_from = None;
            } else if let Some(field_ref) = from.field_ref {
                let value = field_value(&rollout_json, &field_ref.field_path).ok_or_else(|| {
                    format!(
                        "args[{:?}].valueFrom.fieldRef.fieldPath {:?} does not name a field of the Rollout",
                        arg.name, field_ref.field_path
                    )
                })?;
                arg.value = Some(value);
                arg.value_from = None;
            }
        }
        resolved.push(arg);
    }
    Ok(resolved)
}

/// The value at a field path such as `metadata.name` or `metadata.labels['app']`.
fn field_value(object: &Value, path: &str) -> Option<String> {
    let mut current = object;
    for segment in path.split('.') {
        let (field, key) = match segment.split_once("['") {
            Some((field, rest)) => (field, rest.strip_suffix("']")),
            None => (segment, None),
        };
        current = current.get(field)?;
        if let Some(key) = key {
            current = current.get(key)?;
        }
    }
    match current {
        Value::String(text) => Some(text.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

async fn terminate_analysis_run(target: &Target, name: &str, ctx: &Context) -> Result<()> {
    let api: Api<AnalysisRun> = target.api(ctx);
    match api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "terminate": true } })),
        )
        .await
    {
        Ok(terminated) => {
            ctx.caches.analysis_runs.expect_written(
                &target.owner.uid,
                name,
                terminated.resource_version(),
            );
            tracing::info!(analysis_run = %name, "terminated AnalysisRun");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 404 => {
            ctx.caches
                .analysis_runs
                .expect_deleted(&target.owner.uid, name);
            Ok(())
        }
        Err(source) => Err(target.write_error("terminate", "AnalysisRun", name)(source)),
    }
}

/// Deletes a finished run beyond the Rollout's run history limits; one already gone is fine.
async fn delete_analysis_run(target: &Target, name: &str, ctx: &Context) -> Result<()> {
    let api: Api<AnalysisRun> = target.api(ctx);
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => {
            ctx.caches
                .analysis_runs
                .expect_deleted(&target.owner.uid, name);
            tracing::info!(analysis_run = %name, "deleted AnalysisRun beyond the run history limits");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 404 => {
            ctx.caches
                .analysis_runs
                .expect_deleted(&target.owner.uid, name);
            Ok(())
        }
        Err(source) => Err(target.write_error("delete", "AnalysisRun", name)(source)),
    }
}

/// Merge-patches `/status` to `desired` when it differs; returns whether it wrote. The new
/// resourceVersion is remembered so the next reconcile does not plan from an older copy.
pub async fn write_status(
    rollout: &Rollout,
    desired: &RolloutStatus,
    ctx: &Context,
) -> Result<bool> {
    let namespace = rollout.namespace().unwrap_or_default();
    let name = rollout.name_any();
    let patch =
        status_patch::status_patch(rollout, desired).map_err(|source| Error::EncodeStatus {
            namespace: namespace.clone(),
            name: name.clone(),
            source,
        })?;
    let Some(patch) = patch else {
        return Ok(false);
    };
    let api: Api<Rollout> = Api::namespaced(ctx.client.clone(), &namespace);
    let written = api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::PatchStatus {
            namespace: namespace.clone(),
            name: name.clone(),
            source: Box::new(source),
        })?;
    if let Some(version) = written.resource_version() {
        ctx.record_status_written(&format!("{namespace}/{name}"), &version);
    }
    Ok(true)
}

/// Records one of the planner's events on the Rollout; a failure is logged, not returned,
/// since status already says what happened.
async fn publish(target: &Target, rollout: &Rollout, event: &crate::planner::Event, ctx: &Context) {
    let type_ = match event.type_ {
        EventType::Normal => KubeEventType::Normal,
        EventType::Warning => KubeEventType::Warning,
    };
    let kube_event = KubeEvent {
        type_,
        reason: event.reason.clone(),
        note: Some(event.message.clone()),
        action: event_action(&event.message),
        secondary: None,
    };
    match ctx
        .recorder
        .publish(&kube_event, &rollout.object_ref(&()))
        .await
    {
        Ok(()) => ctx.metrics.event_published(
            &target.namespace,
            &target.name,
            match event.type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            },
            &event.reason,
        ),
        Err(source) => {
            let error = Error::PublishEvent {
                namespace: target.namespace.clone(),
                name: target.name.clone(),
                reason: event.reason.clone(),
                source: Box::new(source),
            };
            tracing::warn!(%error, "event not published");
        }
    }
}

/// The event's `action`: its message, cut to the API's 128 bytes. The recorder folds events
/// with the same type, reason and action into one series and keeps the first note, so "step
/// 2/4 completed" and "step 3/4 completed" must differ here to both be seen.
fn event_action(message: &str) -> String {
    const MAX_ACTION_BYTES: usize = 128;
    let mut end = message.len().min(MAX_ACTION_BYTES);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message[..end].to_string()
}

#[cfg(test)]
mod tests {
    use rollouts_crds::rollout::{
        AnalysisRunArgument, ArgumentValueFrom, CanaryStep, FieldRef, RolloutAnalysis,
    };

    use super::*;

    fn owner() -> OwnerReference {
        OwnerReference {
            api_version: "argoproj.io/v1alpha1".into(),
            kind: "Rollout".into(),
            name: "web".into(),
            uid: "uid-1".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    #[test]
    fn the_new_replica_set_selects_its_own_pods_and_names_its_owner_and_revision() {
        let mut rollout = Rollout::test_canary("web", vec![CanaryStep::weight(20)]);
        rollout.spec.min_ready_seconds = Some(5);
        let new_rs = NewReplicaSet {
            name: "web-abc".into(),
            pod_template_hash: "abc".into(),
            replicas: 2,
            revision: 3,
        };
        let rs = replica_set_for(&rollout, &new_rs, None, owner()).expect("builds");
        assert_eq!(rs.metadata.name.as_deref(), Some("web-abc"));
        assert_eq!(rs.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(rs.annotations()[REVISION_ANNOTATION], "3");
        assert_eq!(rs.labels()[DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY], "abc");
        assert_eq!(rs.labels()["app"], "web");
        let owners = rs.metadata.owner_references.as_ref().expect("owner");
        assert_eq!(owners[0].controller, Some(true));
        let spec = rs.spec.expect("spec");
        assert_eq!(spec.replicas, Some(2));
        assert_eq!(spec.min_ready_seconds, Some(5));
        let selector = spec.selector.match_labels.expect("labels");
        assert_eq!(selector["app"], "web");
        assert_eq!(selector[DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY], "abc");
        let pod_labels = spec
            .template
            .expect("template")
            .metadata
            .expect("metadata")
            .labels
            .expect("labels");
        assert_eq!(pod_labels[DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY], "abc");
        assert_eq!(pod_labels["app"], "web");
    }

    #[test]
    fn ephemeral_metadata_goes_on_the_new_pods_and_is_recorded() {
        let rollout = Rollout::test_blue_green("web");
        let new_rs = NewReplicaSet {
            name: "web-abc".into(),
            pod_template_hash: "abc".into(),
            replicas: 1,
            revision: 1,
        };
        let preview = PodTemplateMetadata {
            labels: Some(BTreeMap::from([("role".into(), "preview".into())])),
            annotations: None,
        };
        let rs = replica_set_for(&rollout, &new_rs, Some(&preview), owner()).expect("builds");
        let template = rs.spec.expect("spec").template.expect("template");
        let labels = template.metadata.expect("metadata").labels.expect("labels");
        assert_eq!(labels["role"], "preview");
        assert_eq!(
            rs.metadata.annotations.expect("annotations")[EPHEMERAL_METADATA_ANNOTATION],
            r#"{"labels":{"role":"preview"}}"#
        );
    }

    #[test]
    fn changing_ephemeral_labels_removes_the_old_keys_but_never_selector_ones() {
        let applied = BTreeMap::from([
            ("role".to_string(), "preview".to_string()),
            ("tier".to_string(), "canary".to_string()),
        ]);
        let wanted = BTreeMap::from([
            ("role".to_string(), "active".to_string()),
            ("app".to_string(), "other".to_string()),
        ]);
        let protected = BTreeMap::from([("app".to_string(), "web".to_string())]);
        let delta = map_delta(Some(&applied), Some(&wanted), &protected);
        assert_eq!(
            Value::Object(delta),
            json!({"role": "active", "tier": null})
        );
    }

    #[test]
    fn hash_and_field_arguments_become_values() {
        let rollout = Rollout::test_canary("web", vec![CanaryStep::analysis("errors")]);
        let run = AnalysisRunToCreate {
            name: "web-abc-2-0".into(),
            step_index: 0,
            rollout_type: ROLLOUT_TYPE_STEP.into(),
            pod_template_hash: "abc".into(),
            stable_pod_template_hash: "xyz".into(),
            analysis: RolloutAnalysis {
                args: Some(vec![
                    AnalysisRunArgument {
                        name: "canary-hash".into(),
                        value: None,
                        value_from: Some(ArgumentValueFrom {
                            pod_template_hash_value: Some(ValueFromPodTemplateHash::Latest),
                            ..ArgumentValueFrom::default()
                        }),
                    },
                    AnalysisRunArgument {
                        name: "stable-hash".into(),
                        value: None,
                        value_from: Some(ArgumentValueFrom {
                            pod_template_hash_value: Some(ValueFromPodTemplateHash::Stable),
                            ..ArgumentValueFrom::default()
                        }),
                    },
                    AnalysisRunArgument {
                        name: "app".into(),
                        value: None,
                        value_from: Some(ArgumentValueFrom {
                            field_ref: Some(FieldRef {
                                field_path: "metadata.name".into(),
                            }),
                            ..ArgumentValueFrom::default()
                        }),
                    },
                ]),
                ..RolloutAnalysis::default()
            },
        };
        let args = resolve_rollout_args(&rollout, &run).expect("resolves");
        let values: Vec<(&str, Option<&str>)> = args
            .iter()
            .map(|a| (a.name.as_str(), a.value.as_deref()))
            .collect();
        assert_eq!(
            values,
            vec![
                ("canary-hash", Some("abc")),
                ("stable-hash", Some("xyz")),
                ("app", Some("web")),
            ]
        );
        assert!(args.iter().all(|a| a.value_from.is_none()));
    }

    #[test]
    fn event_actions_tell_messages_apart_within_the_api_limit() {
        assert_ne!(
            event_action("Rollout step 2/4 completed (pause)"),
            event_action("Rollout step 3/4 completed (setWeight: 50)")
        );
        let long = "é".repeat(100);
        let action = event_action(&long);
        assert!(action.len() <= 128);
        assert!(long.starts_with(&action));
    }

    /// The nginx router driven the way a [`TrafficPlan`] asks, on kube-sim: the canary
    /// Ingress gets the weight, and the recorded weight then verifies.
    #[tokio::test]
    async fn a_traffic_plan_sets_the_canary_ingress_weight_and_it_verifies() {
        use k8s_openapi::api::networking::v1::Ingress;
        use kube::api::DynamicObject;
        use kube::discovery::ApiResource;

        let sim = rollouts_e2e::sim::start(rollouts_e2e::sim::SimOptions::default())
            .expect("kube-sim starts");
        let config = kube::Config::new(sim.url().parse().expect("a URI"));
        let client = kube::Client::try_from(config).expect("a client");
        let mut rollout: Rollout = serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Rollout",
            "metadata": {"name": "shop", "namespace": "default", "uid": "uid-shop"},
            "spec": {
                "selector": {"matchLabels": {"app": "shop"}},
                "template": {"metadata": {"labels": {"app": "shop"}}},
                "strategy": {"canary": {
                    "stableService": "shop-stable",
                    "canaryService": "shop-canary",
                    "trafficRouting": {"nginx": {"stableIngress": "shop"}}
                }}
            }
        }))
        .expect("a Rollout");
        let ingress: Ingress = serde_json::from_value(json!({
            "metadata": {"name": "shop", "namespace": "default"},
            "spec": {"rules": [{"host": "shop.example.com", "http": {"paths": [{
                "path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": "shop-stable", "port": {"number": 80}}}
            }]}}]}
        }))
        .expect("an Ingress");
        let ingresses: Api<Ingress> = Api::namespaced(client.clone(), "default");
        ingresses
            .create(&PostParams::default(), &ingress)
            .await
            .expect("creates the stable Ingress");
        let services = ApiResource::erase::<Service>(&());
        for name in ["shop-stable", "shop-canary"] {
            let service = DynamicObject::new(name, &services)
                .within("default")
                .data(json!({"spec": {"ports": [{"port": 80}]}}));
            Api::<DynamicObject>::namespaced_with(client.clone(), "default", &services)
                .create(&PostParams::default(), &service)
                .await
                .expect("creates a Service");
        }
        let target = Target::of(&rollout).expect("a target");
        let routers = rollouts_traffic::routers(client.clone(), &rollout).expect("nginx");
        let traffic = TrafficPlan {
            desired_weight: 25,
            max_traffic_weight: 100,
            additional: Vec::new(),
            canary_hash: "new".into(),
            stable_hash: "old".into(),
            set_header_route: None,
            set_mirror_route: None,
            remove_managed_routes: false,
        };
        for router in &routers {
            route_traffic(&target, router.as_ref(), &traffic)
                .await
                .expect("routes");
        }
        let canary = ingresses
            .get(&rollouts_traffic::nginx::canary_ingress_name(
                "shop", "shop",
            ))
            .await
            .expect("the canary Ingress exists");
        let weight = canary
            .annotations()
            .iter()
            .find(|(key, _)| key.ends_with("/canary-weight"))
            .map(|(_, value)| value.clone());
        assert_eq!(weight.as_deref(), Some("25"));

        assert_eq!(
            verify_recorded_weight(&rollout, &routers)
                .await
                .expect("reads"),
            None,
            "no weight recorded yet"
        );
        let mut status = RolloutStatus::default();
        status.canary.weights = Some(rollouts_crds::rollout::TrafficWeights {
            canary: rollouts_crds::rollout::WeightDestination {
                weight: 25,
                ..Default::default()
            },
            ..Default::default()
        });
        rollout.status = Some(status);
        assert_eq!(
            verify_recorded_weight(&rollout, &routers)
                .await
                .expect("reads"),
            Some(true)
        );
    }

    #[test]
    fn field_paths_reach_into_label_maps() {
        let object = json!({"metadata": {"name": "web", "labels": {"team": "shop"}}, "spec": {"replicas": 4}});
        assert_eq!(
            field_value(&object, "metadata.labels['team']").as_deref(),
            Some("shop")
        );
        assert_eq!(field_value(&object, "spec.replicas").as_deref(), Some("4"));
        assert_eq!(field_value(&object, "metadata.labels['absent']"), None);
    }
}
