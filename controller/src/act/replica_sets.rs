//! Writes to the Rollout's ReplicaSets and their pods: create the current revision's (built
//! here from the resolved pod template), raise a reused one's revision, scale, write or clear
//! `scale-down-deadline`, sync ephemeral pod metadata, point the injected anti-affinity at the
//! stable revision, delete old ones; and the workloadRef Deployment's scale.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::ResourceExt;
use kube::api::{EvictParams, ListParams};
use rollouts_crds::rollout::{
    DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY, PodTemplateMetadata, Rollout,
    SCALE_DOWN_DEADLINE_ANNOTATION_KEY,
};
use serde_json::{Value, json};

use super::writer::{Created, Writer};
use crate::error::{Error, Result};
use crate::planner::anti_affinity;
use crate::planner::{
    AffinityRefresh, DeploymentScale, NewReplicaSet, ObservedReplicaSet, REVISION_ANNOTATION,
};

/// Annotation on a ReplicaSet recording the ephemeral pod metadata applied to it (JSON), so
/// keys can be removed when the metadata changes; Argo's key.
pub const EPHEMERAL_METADATA_ANNOTATION: &str = "rollout.argoproj.io/ephemeral-metadata";

/// Annotation on a ReplicaSet recording the Rollout's `spec.replicas` when it was created or
/// last scaled; Argo's key, written where Argo writes it (`SetReplicasAnnotations`), for the
/// tools that read it.
pub const DESIRED_REPLICAS_ANNOTATION: &str = "rollout.argoproj.io/desired-replicas";

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
    let mut annotations = json!({
        REVISION_ANNOTATION: new_rs.revision.to_string(),
        DESIRED_REPLICAS_ANNOTATION: rollout.spec.effective_replicas().to_string(),
    });
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

/// Creates the new ReplicaSet from the resolved `rollout`; false when one of that name already
/// exists.
pub(super) async fn create(
    writer: &Writer<'_>,
    rollout: &Rollout,
    new_rs: &NewReplicaSet,
    ephemeral: Option<&PodTemplateMetadata>,
) -> Result<bool> {
    let target = writer.target;
    let built = replica_set_for(rollout, new_rs, ephemeral, target.owner.clone());
    let replica_set = built.map_err(|source| Error::InvalidTemplate {
        namespace: target.namespace.clone(),
        name: target.name.clone(),
        source,
    })?;
    match writer.create(&replica_set).await? {
        Created::Created(_) => {
            tracing::info!(replica_set = %new_rs.name, replicas = new_rs.replicas, revision = new_rs.revision, "created ReplicaSet");
            Ok(true)
        }
        // Plan again only once the cache shows the ReplicaSet that is there.
        Created::AlreadyExists => Ok(false),
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
pub(super) async fn sync_ephemeral_metadata(
    writer: &Writer<'_>,
    rollout: &Rollout,
    rs: &ObservedReplicaSet,
    wanted: Option<&PodTemplateMetadata>,
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
    writer
        .patch::<ReplicaSet>("update pod metadata of", &rs.name, &rs_patch)
        .await?;
    let selector = format!(
        "{DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY}={}",
        rs.pod_template_hash
    );
    let target = writer.target;
    let listed = writer
        .api::<Pod>()
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
        writer
            .patch::<Pod>("update metadata of", &pod.name_any(), &pod_patch)
            .await?;
    }
    tracing::info!(replica_set = %rs.name, "synced ephemeral pod metadata");
    Ok(())
}

/// Scales `name` to `to`; with `desired_replicas` (its `desired-replicas` annotation is not the
/// Rollout's `spec.replicas`), the annotation is written in the same patch, as Argo's
/// `scaleReplicaSet` does, so it costs no extra write.
pub(super) async fn scale(
    writer: &Writer<'_>,
    name: &str,
    to: i32,
    desired_replicas: Option<String>,
) -> Result<()> {
    match desired_replicas {
        Some(desired) => {
            let patch = json!({
                "metadata": { "annotations": { DESIRED_REPLICAS_ANNOTATION: desired } },
                "spec": { "replicas": to },
            });
            writer.patch::<ReplicaSet>("scale", name, &patch).await?;
        }
        None => writer.scale::<ReplicaSet>(name, to).await?,
    }
    tracing::info!(replica_set = %name, replicas = to, "scaled ReplicaSet");
    Ok(())
}

/// Restarts a pod for `spec.restartAt` through the eviction subresource, so disruption budgets
/// are honoured: an eviction a budget refuses (429) is left for a later reconcile.
pub(super) async fn evict_pod(writer: &Writer<'_>, name: &str) -> Result<()> {
    match writer
        .api::<Pod>()
        .evict(name, &EvictParams::default())
        .await
    {
        Ok(_) => {
            tracing::info!(pod = %name, "evicted pod created before restartAt");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 429 => {
            tracing::warn!(pod = %name, reason = %status.message, "eviction refused by a disruption budget; retrying later");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => Err(writer.target.write_error("evict", "Pod", name)(source)),
    }
}

/// Points the anti-affinity term of the current revision's ReplicaSet at the stable revision
/// (the stable changed since it was created), as Argo does.
pub(super) async fn refresh_anti_affinity(
    writer: &Writer<'_>,
    refresh: &AffinityRefresh,
) -> Result<()> {
    let patch = json!({ "spec": { "template": { "spec": { "affinity": refresh.affinity } } } });
    writer
        .patch::<ReplicaSet>("update the anti-affinity of", &refresh.replica_set, &patch)
        .await?;
    tracing::info!(replica_set = %refresh.replica_set, "pointed the injected anti-affinity at the stable revision");
    Ok(())
}

/// Sets a live ReplicaSet's `spec.minReadySeconds` to the Rollout's.
pub(super) async fn sync_min_ready_seconds(
    writer: &Writer<'_>,
    name: &str,
    seconds: i32,
) -> Result<()> {
    let patch = json!({ "spec": { "minReadySeconds": seconds } });
    writer
        .patch::<ReplicaSet>("set minReadySeconds of", name, &patch)
        .await?;
    tracing::info!(replica_set = %name, seconds, "set minReadySeconds to the Rollout's");
    Ok(())
}

/// Sets the `spec.workloadRef` Deployment's `spec.replicas` (`scaleDown`).
pub(super) async fn scale_deployment(writer: &Writer<'_>, scale: &DeploymentScale) -> Result<()> {
    let patch = json!({ "spec": { "replicas": scale.to } });
    writer
        .patch::<Deployment>("scale", &scale.name, &patch)
        .await?;
    tracing::info!(deployment = %scale.name, from = scale.from, to = scale.to, "scaled the workloadRef Deployment");
    Ok(())
}

/// Raises a reused ReplicaSet's revision annotation.
pub(super) async fn annotate_revision(
    writer: &Writer<'_>,
    name: &str,
    revision: &str,
) -> Result<()> {
    let patch = json!({ "metadata": { "annotations": { REVISION_ANNOTATION: revision } } });
    writer
        .patch::<ReplicaSet>("set the revision of", name, &patch)
        .await?;
    tracing::info!(replica_set = %name, revision, "revised ReplicaSet");
    Ok(())
}

/// Sets (`Some`) or removes (`None`) a ReplicaSet's `scale-down-deadline` annotation.
pub(super) async fn annotate_scale_down_deadline(
    writer: &Writer<'_>,
    name: &str,
    deadline: Option<&str>,
) -> Result<()> {
    let patch =
        json!({ "metadata": { "annotations": { SCALE_DOWN_DEADLINE_ANNOTATION_KEY: deadline } } });
    writer.patch::<ReplicaSet>("annotate", name, &patch).await?;
    Ok(())
}

pub(super) async fn delete(writer: &Writer<'_>, name: &str) -> Result<()> {
    writer.delete::<ReplicaSet>(name).await?;
    tracing::info!(replica_set = %name, "deleted old ReplicaSet beyond revisionHistoryLimit");
    Ok(())
}

#[cfg(test)]
mod tests {
    use kube::ResourceExt;
    use rollouts_crds::rollout::CanaryStep;

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
        // The Rollout's replicas (1 here), not the ReplicaSet's first scale, as Argo writes it.
        assert_eq!(rs.annotations()[DESIRED_REPLICAS_ANNOTATION], "1");
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
}
