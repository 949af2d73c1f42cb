//! `undo NAME [--to-revision N]`: put an earlier revision's pod template back.
//!
//! Reads the ReplicaSets the rollout controls (owner reference with its uid), each carrying its
//! revision in the `rollout.argoproj.io/revision` annotation, takes the template of the asked
//! revision (default: the one before the newest), removes the pod-template-hash label, and sends
//! the JSON patch `[{"op":"replace","path":"/spec/template","value":<template>}]` to the rollout,
//! or to the Deployment of `spec.workloadRef`. Nothing is sent when the template already matches.

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use rollouts_crds::rollout::DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY;
use serde_json::{Value, json};

use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::patch::{PatchRequest, PatchType, TargetKind};
use crate::verbs::{template_holder, to_json};

/// Annotation holding a ReplicaSet's revision number.
pub const REVISION_ANNOTATION: &str = "rollout.argoproj.io/revision";

/// `undo` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Name of the rollout.
    pub name: String,
    /// The revision to go back to; 0 (the default) means the one before the newest.
    #[arg(long, default_value_t = 0)]
    pub to_revision: i64,
}

/// What `undo` decided.
#[derive(Debug, PartialEq)]
pub enum UndoDecision {
    /// The template already is that revision's.
    AlreadyAt { revision: i64 },
    /// Send `patch` to put `revision` back.
    Restore { revision: i64, patch: PatchRequest },
}

/// Decides the undo of rollout `rollout_name` (uid `rollout_uid`): `holder` is the object whose
/// `spec.template` is replaced (`target`, `holder_name`), `replica_sets` every ReplicaSet that
/// may belong to the rollout.
pub fn undo_patch(
    rollout_name: &str,
    rollout_uid: &str,
    (target, holder_name): (TargetKind, &str),
    holder: &Value,
    replica_sets: &[ReplicaSet],
    to_revision: i64,
) -> Result<UndoDecision> {
    let mut revisions: Vec<(i64, &ReplicaSet)> = replica_sets
        .iter()
        .filter(|rs| controlled_by(rs, rollout_uid))
        .filter_map(|rs| revision(rs).map(|r| (r, rs)))
        .collect();
    revisions.sort_by_key(|(r, _)| std::cmp::Reverse(*r));
    let listed = || {
        let numbers: Vec<String> = revisions.iter().map(|(r, _)| r.to_string()).collect();
        if numbers.is_empty() {
            "none".to_string()
        } else {
            numbers.join(", ")
        }
    };
    let (revision, replica_set) = if to_revision > 0 {
        revisions
            .iter()
            .find(|(r, _)| *r == to_revision)
            .copied()
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "rollout '{rollout_name}' has no revision {to_revision} in its history (revisions: {}) (fix: pick one of them with --to-revision)",
                    listed()
                ))
            })?
    } else {
        revisions.get(1).copied().ok_or_else(|| {
            Error::Invalid(format!(
                "rollout '{rollout_name}' has no earlier revision to go back to (revisions: {})",
                listed()
            ))
        })?
    };
    let mut template = replica_set
        .spec
        .as_ref()
        .and_then(|spec| spec.template.as_ref())
        .map(serde_json::to_value)
        .transpose()
        .map_err(|e| Error::Output(e.to_string()))?
        .unwrap_or_else(|| json!({}));
    remove_hash_label(&mut template);
    if let Some(current) = holder.pointer("/spec/template") {
        let mut current = current.clone();
        remove_hash_label(&mut current);
        if is_derivative(&current, &template) {
            return Ok(UndoDecision::AlreadyAt { revision });
        }
    }
    Ok(UndoDecision::Restore {
        revision,
        patch: PatchRequest {
            target,
            name: holder_name.to_string(),
            subresource: None,
            patch_type: PatchType::Json,
            body: json!([{"op": "replace", "path": "/spec/template", "value": template}]),
        },
    })
}

fn controlled_by(rs: &ReplicaSet, uid: &str) -> bool {
    rs.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|owner| owner.controller == Some(true) && owner.uid == uid)
}

/// The revision annotation; absent counts as 0 (as Argo counts it), unparsable is skipped.
fn revision(rs: &ReplicaSet) -> Option<i64> {
    match rs
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REVISION_ANNOTATION))
    {
        None => Some(0),
        Some(text) => text.parse().ok(),
    }
}

fn remove_hash_label(template: &mut Value) {
    if let Some(labels) = template
        .pointer_mut("/metadata/labels")
        .and_then(Value::as_object_mut)
    {
        labels.remove(DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY);
    }
}

/// Whether every field set in `written` has the same value in `stored`; fields left empty in
/// `written` are ignored, because the API server fills defaults into the ReplicaSet's copy.
pub fn is_derivative(written: &Value, stored: &Value) -> bool {
    match (written, stored) {
        (Value::Null, _) => true,
        (Value::String(a), _) if a.is_empty() => true,
        (Value::Array(a), _) if a.is_empty() => true,
        (Value::Object(a), _) if a.is_empty() => true,
        (Value::Object(a), Value::Object(b)) => a
            .iter()
            .all(|(key, value)| is_derivative(value, b.get(key).unwrap_or(&Value::Null))),
        (Value::Array(a), Value::Array(b)) => {
            a.len() <= b.len() && a.iter().zip(b).all(|(x, y)| is_derivative(x, y))
        }
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (a, b) => a == b,
    }
}

/// `matchLabels` and `matchExpressions` as a label selector query (`app=web,tier in (a,b)`).
pub fn selector_query(selector: &LabelSelector) -> String {
    let mut terms: Vec<String> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for expr in selector.match_expressions.iter().flatten() {
        let values = expr.values.clone().unwrap_or_default().join(",");
        terms.push(match expr.operator.as_str() {
            "In" => format!("{} in ({values})", expr.key),
            "NotIn" => format!("{} notin ({values})", expr.key),
            "Exists" => expr.key.clone(),
            _ => format!("!{}", expr.key),
        });
    }
    terms.join(",")
}

/// Reads the rollout and its ReplicaSets, then restores the chosen revision's template.
pub async fn run(cluster: &Cluster, args: &Args) -> Result<()> {
    println!("{}", undo(cluster, &args.name, args.to_revision).await?);
    Ok(())
}

/// Restores revision `to_revision` (0: the one before the newest) of rollout `name`; the
/// sentence the verb prints. The dashboard's Rollback button calls it too.
pub async fn undo(cluster: &Cluster, name: &str, to_revision: i64) -> Result<String> {
    let rollout = to_json(cluster.object(TargetKind::Rollout, name).await?)?;
    let uid = rollout
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let selector: LabelSelector = rollout
        .pointer("/spec/selector")
        .cloned()
        .map(serde_json::from_value)
        .transpose()
        .map_err(|e| {
            Error::Invalid(format!(
                "rollout '{name}': spec.selector is not a label selector: {e}"
            ))
        })?
        .unwrap_or_default();
    let replica_sets = cluster
        .replica_sets(&selector_query(&selector), name)
        .await?;
    let (target, holder_name) = template_holder(name, &rollout)?;
    let holder = match target {
        TargetKind::Rollout => rollout,
        _ => to_json(cluster.object(target, &holder_name).await?)?,
    };
    let decision = undo_patch(
        name,
        &uid,
        (target, &holder_name),
        &holder,
        &replica_sets,
        to_revision,
    )?;
    Ok(match decision {
        UndoDecision::AlreadyAt { revision } => {
            format!("skipped rollback (current template already matches revision {revision})")
        }
        UndoDecision::Restore { revision, patch } => {
            cluster.apply(&patch).await?;
            format!("rollout '{name}' rolled back to revision {revision}")
        }
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::apps::v1::ReplicaSetSpec;
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        LabelSelectorRequirement, ObjectMeta, OwnerReference,
    };

    use super::*;

    fn replica_set(owner: &str, revision: &str, hash: &str, image: &str) -> ReplicaSet {
        ReplicaSet {
            metadata: ObjectMeta {
                name: Some(format!("web-{hash}")),
                annotations: Some(BTreeMap::from([(
                    REVISION_ANNOTATION.to_string(),
                    revision.to_string(),
                )])),
                owner_references: Some(vec![OwnerReference {
                    api_version: "argoproj.io/v1alpha1".into(),
                    kind: "Rollout".into(),
                    name: "web".into(),
                    uid: owner.into(),
                    controller: Some(true),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            spec: Some(ReplicaSetSpec {
                template: Some(PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(BTreeMap::from([
                            ("app".to_string(), "web".to_string()),
                            (
                                DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY.to_string(),
                                hash.to_string(),
                            ),
                        ])),
                        ..Default::default()
                    }),
                    spec: Some(PodSpec {
                        containers: vec![Container {
                            name: "web".into(),
                            image: Some(image.into()),
                            termination_message_path: Some("/dev/termination-log".into()),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn rollout_with_image(image: &str) -> Value {
        json!({"spec": {"template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": image}]}
        }}})
    }

    fn history() -> Vec<ReplicaSet> {
        vec![
            replica_set("uid-1", "1", "aaa", "web:1"),
            replica_set("uid-1", "3", "ccc", "web:3"),
            replica_set("uid-1", "2", "bbb", "web:2"),
            // Same revision number, another owner: never considered.
            replica_set("uid-other", "9", "zzz", "other:9"),
        ]
    }

    #[test]
    fn default_goes_back_to_the_revision_before_the_newest() {
        let decision = undo_patch(
            "web",
            "uid-1",
            (TargetKind::Rollout, "web"),
            &rollout_with_image("web:3"),
            &history(),
            0,
        )
        .unwrap();
        let UndoDecision::Restore { revision, patch } = decision else {
            panic!("expected a restore, got {decision:?}");
        };
        assert_eq!(revision, 2);
        assert_eq!(patch.target, TargetKind::Rollout);
        assert_eq!(patch.name, "web");
        assert_eq!(patch.subresource, None);
        assert_eq!(patch.patch_type, PatchType::Json);
        assert_eq!(
            patch.body,
            json!([{"op": "replace", "path": "/spec/template", "value": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{
                    "name": "web",
                    "image": "web:2",
                    "terminationMessagePath": "/dev/termination-log"
                }]}
            }}])
        );
    }

    #[test]
    fn to_revision_picks_that_revision_and_workload_ref_patches_the_deployment() {
        let deployment = rollout_with_image("web:3");
        let decision = undo_patch(
            "web",
            "uid-1",
            (TargetKind::Deployment, "web-deploy"),
            &deployment,
            &history(),
            1,
        )
        .unwrap();
        let UndoDecision::Restore { revision, patch } = decision else {
            panic!("expected a restore, got {decision:?}");
        };
        assert_eq!(revision, 1);
        assert_eq!(patch.target, TargetKind::Deployment);
        assert_eq!(patch.name, "web-deploy");
        assert_eq!(
            patch.body[0]["value"]["spec"]["containers"][0]["image"],
            "web:1"
        );
    }

    #[test]
    fn a_template_that_already_matches_is_skipped_despite_server_defaults() {
        let decision = undo_patch(
            "web",
            "uid-1",
            (TargetKind::Rollout, "web"),
            &rollout_with_image("web:2"),
            &history(),
            2,
        )
        .unwrap();
        assert_eq!(decision, UndoDecision::AlreadyAt { revision: 2 });
    }

    #[test]
    fn a_missing_revision_lists_the_ones_there() {
        let err = undo_patch(
            "web",
            "uid-1",
            (TargetKind::Rollout, "web"),
            &rollout_with_image("web:3"),
            &history(),
            7,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            "error: rollout 'web' has no revision 7 in its history (revisions: 3, 2, 1) (fix: pick one of them with --to-revision)"
        );
        let only_one = vec![replica_set("uid-1", "1", "aaa", "web:1")];
        let err = undo_patch(
            "web",
            "uid-1",
            (TargetKind::Rollout, "web"),
            &rollout_with_image("web:1"),
            &only_one,
            0,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("no earlier revision"), "{err}");
    }

    #[test]
    fn derivative_ignores_fields_left_empty_but_not_changed_ones() {
        assert!(is_derivative(
            &json!({"a": 1, "b": ""}),
            &json!({"a": 1, "c": 2})
        ));
        assert!(!is_derivative(&json!({"a": 1}), &json!({"a": 2})));
        assert!(!is_derivative(&json!({"a": [1, 2]}), &json!({"a": [1]})));
        assert!(is_derivative(&json!({"a": 1.0}), &json!({"a": 1})));
    }

    #[test]
    fn selectors_become_label_queries() {
        let selector = LabelSelector {
            match_labels: Some(BTreeMap::from([("app".to_string(), "web".to_string())])),
            match_expressions: Some(vec![
                LabelSelectorRequirement {
                    key: "tier".into(),
                    operator: "In".into(),
                    values: Some(vec!["a".into(), "b".into()]),
                },
                LabelSelectorRequirement {
                    key: "canary".into(),
                    operator: "DoesNotExist".into(),
                    values: None,
                },
            ]),
        };
        assert_eq!(selector_query(&selector), "app=web,tier in (a,b),!canary");
    }
}
