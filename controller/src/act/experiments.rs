//! Writes to the Rollout's Experiments: create the `experiment` step's Experiment (each
//! template's pod template copied from the ReplicaSet its `specRef` names, read fresh: the watch
//! cache keeps no templates), stop Experiments (`spec.terminate`), delete those beyond the
//! history limits.

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use rollouts_crds::experiment::{
    Experiment, ExperimentAnalysisTemplateRef, ExperimentSpec, ExperimentTemplate,
};
use rollouts_crds::rollout::{
    DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY, PodTemplate, Rollout, RolloutExperimentTemplate,
    TemplateService,
};
use serde_json::{Value, json};

use super::Target;
use super::writer::{Created, Writer};
use crate::error::{Error, Result};
use crate::planner::{ExperimentToCreate, REVISION_ANNOTATION};

/// The Experiment for `step` (Argo's `GetExperimentFromTemplate`): labelled with the Rollout's
/// labels and the current revision's hash, annotated with its revision, owned by the Rollout;
/// each template runs the pod template, `minReadySeconds` and selector (unless the step gives
/// one) of the `canary` or `stable` ReplicaSet, with the step's metadata added. The copied
/// template and selector lose the ReplicaSet's `rollouts-pod-template-hash`: the Experiment's
/// ReplicaSets carry their own, which the Rollout's Services do not select.
pub fn experiment_for(
    target: &Target,
    rollout: &Rollout,
    step: &ExperimentToCreate,
    canary: &ReplicaSet,
    stable: &ReplicaSet,
) -> std::result::Result<Experiment, String> {
    let mut templates = Vec::new();
    for template in &step.step.templates {
        let source = match template.spec_ref.as_str() {
            "canary" => canary,
            "stable" => stable,
            other => {
                return Err(format!(
                    "template {:?}: specRef {other:?} is neither canary nor stable",
                    template.name
                ));
            }
        };
        templates.push(template_from(template, source));
    }
    let analyses = step
        .step
        .analyses
        .iter()
        .flatten()
        .map(|analysis| ExperimentAnalysisTemplateRef {
            name: analysis.name.clone(),
            template_name: analysis.template_name.clone(),
            cluster_scope: analysis.cluster_scope,
            args: analysis.args.clone().unwrap_or_default(),
            required_for_completion: analysis.required_for_completion,
        })
        .collect();
    let spec = ExperimentSpec {
        templates,
        duration: step.step.duration.clone(),
        progress_deadline_seconds: rollout.spec.progress_deadline_seconds,
        terminate: false,
        analyses,
        scale_down_delay_seconds: step.step.scale_down_delay_seconds,
        dry_run: step.step.dry_run.clone().unwrap_or_default(),
        measurement_retention: Vec::new(),
        analysis_run_metadata: step.step.analysis_run_metadata.clone(),
    };
    let mut experiment = Experiment::new(&step.name, spec);
    let mut labels = rollout.labels().clone();
    labels.insert(
        DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY.into(),
        step.pod_template_hash.clone(),
    );
    experiment.metadata.namespace = Some(target.namespace.clone());
    experiment.metadata.labels = Some(labels);
    experiment.metadata.annotations = Some(
        [(REVISION_ANNOTATION.to_string(), step.revision.clone())]
            .into_iter()
            .collect(),
    );
    experiment.metadata.owner_references = Some(vec![target.owner.clone()]);
    Ok(experiment)
}

/// One Experiment template from a step template and the ReplicaSet it copies.
fn template_from(template: &RolloutExperimentTemplate, source: &ReplicaSet) -> ExperimentTemplate {
    let spec = source.spec.as_ref();
    let mut pod_template = spec
        .and_then(|spec| spec.template.as_ref())
        .map(PodTemplate::from_spec)
        .unwrap_or_default();
    let mut selector = template
        .selector
        .clone()
        .or_else(|| spec.map(|spec| spec.selector.clone()))
        .unwrap_or_default();
    if template.selector.is_none()
        && let Some(labels) = selector.match_labels.as_mut()
    {
        labels.remove(DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY);
    }
    remove_label(&mut pod_template, DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY);
    let metadata = template.metadata.clone().unwrap_or_default();
    for (key, value) in metadata.labels.iter().flatten() {
        set_metadata(&mut pod_template, "labels", key, value);
        selector_label(&mut selector, key, value);
    }
    for (key, value) in metadata.annotations.iter().flatten() {
        set_metadata(&mut pod_template, "annotations", key, value);
    }
    // A weight needs a Service to send traffic to (Argo adds one).
    let service =
        (template.weight.is_some() || template.service.is_some()).then(|| TemplateService {
            name: template
                .service
                .as_ref()
                .and_then(|service| service.name.clone())
                .filter(|name| !name.is_empty()),
        });
    ExperimentTemplate {
        name: template.name.clone(),
        replicas: template.replicas,
        min_ready_seconds: spec.and_then(|spec| spec.min_ready_seconds),
        selector: Some(selector),
        template: pod_template,
        service,
    }
}

fn remove_label(template: &mut PodTemplate, key: &str) {
    if let Some(Value::Object(labels)) = template
        .0
        .get_mut("metadata")
        .and_then(|metadata| metadata.get_mut("labels"))
    {
        labels.remove(key);
    }
}

fn set_metadata(template: &mut PodTemplate, field: &str, key: &str, value: &str) {
    let metadata = template.0.entry("metadata").or_insert_with(|| json!({}));
    if !metadata.is_object() {
        *metadata = json!({});
    }
    let entries = &mut metadata[field];
    if !entries.is_object() {
        *entries = json!({});
    }
    entries[key] = Value::String(value.to_string());
}

fn selector_label(selector: &mut LabelSelector, key: &str, value: &str) {
    selector
        .match_labels
        .get_or_insert_with(Default::default)
        .insert(key.to_string(), value.to_string());
}

/// Creates the step's Experiment; one created by an earlier attempt whose status write was
/// lost is left as it is (the next plan finds it).
pub(super) async fn create(
    writer: &Writer<'_>,
    rollout: &Rollout,
    step: &ExperimentToCreate,
) -> Result<()> {
    let target = writer.target;
    let canary = read_replica_set(writer, &step.canary_replica_set).await?;
    let stable = read_replica_set(writer, &step.stable_replica_set).await?;
    let experiment = experiment_for(target, rollout, step, &canary, &stable).map_err(|reason| {
        Error::InvalidAnalysis {
            namespace: target.namespace.clone(),
            rollout: target.name.clone(),
            field: format!("spec.strategy.canary.steps[{}].experiment", step.step_index),
            reason,
        }
    })?;
    if let Created::Created(_) = writer.create(&experiment).await? {
        tracing::info!(experiment = %step.name, step = step.step_index, "created Experiment");
    }
    Ok(())
}

async fn read_replica_set(writer: &Writer<'_>, name: &str) -> Result<ReplicaSet> {
    let target = writer.target;
    writer
        .api::<ReplicaSet>()
        .get(name)
        .await
        .map_err(|source| Error::Read {
            kind: "ReplicaSet",
            namespace: target.namespace.clone(),
            object: name.to_string(),
            rollout: target.name.clone(),
            source: Box::new(source),
        })
}

pub(super) async fn terminate(writer: &Writer<'_>, name: &str) -> Result<()> {
    let patch = json!({ "spec": { "terminate": true } });
    if writer
        .patch_if_present::<Experiment>("terminate", name, &patch)
        .await?
        .is_some()
    {
        tracing::info!(experiment = %name, "terminated Experiment");
    }
    Ok(())
}

/// Deletes an Experiment beyond the Rollout's history limits; one already gone is fine.
pub(super) async fn delete(writer: &Writer<'_>, name: &str) -> Result<()> {
    writer.delete::<Experiment>(name).await?;
    tracing::info!(experiment = %name, "deleted Experiment beyond the history limits");
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rollouts_crds::rollout::{
        AnalysisRunArgument, CanaryStep, PodTemplateMetadata, RolloutExperimentStep,
        RolloutExperimentStepAnalysisTemplateRef,
    };

    use super::*;

    fn replica_set(hash: &str, image: &str) -> ReplicaSet {
        let labels = json!({"app": "web", DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY: hash});
        serde_json::from_value(json!({
            "metadata": {"name": format!("web-{hash}")},
            "spec": {
                "replicas": 4,
                "minReadySeconds": 3,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "web", "image": image}]}
                }
            }
        }))
        .expect("a ReplicaSet")
    }

    fn image(template: &ExperimentTemplate) -> String {
        template.template.0["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    #[test]
    fn templates_copy_the_replica_set_their_spec_ref_names() {
        let mut rollout = Rollout::test_canary("web", vec![CanaryStep::weight(20)]);
        rollout.metadata.uid = Some("uid-1".into());
        rollout.metadata.labels = Some(BTreeMap::from([("team".into(), "shop".into())]));
        rollout.spec.progress_deadline_seconds = Some(120);
        let target = Target::of(&rollout).unwrap();
        let step = ExperimentToCreate {
            name: "web-new-2-1".into(),
            step_index: 1,
            pod_template_hash: "new".into(),
            revision: "2".into(),
            canary_replica_set: "web-new".into(),
            stable_replica_set: "web-old".into(),
            step: RolloutExperimentStep {
                templates: vec![
                    RolloutExperimentTemplate {
                        name: "baseline".into(),
                        spec_ref: "stable".into(),
                        replicas: Some(2),
                        metadata: Some(PodTemplateMetadata {
                            labels: Some(BTreeMap::from([("role".into(), "baseline".into())])),
                            annotations: None,
                        }),
                        ..RolloutExperimentTemplate::default()
                    },
                    RolloutExperimentTemplate {
                        name: "canary".into(),
                        spec_ref: "canary".into(),
                        replicas: Some(2),
                        weight: Some(10),
                        ..RolloutExperimentTemplate::default()
                    },
                ],
                duration: Some("5m".into()),
                analyses: Some(vec![RolloutExperimentStepAnalysisTemplateRef {
                    name: "judge".into(),
                    template_name: "judge-error-rate".into(),
                    args: Some(vec![AnalysisRunArgument {
                        name: "stable-hash".into(),
                        value: Some("old".into()),
                        value_from: None,
                    }]),
                    required_for_completion: Some(true),
                    ..RolloutExperimentStepAnalysisTemplateRef::default()
                }]),
                ..RolloutExperimentStep::default()
            },
        };
        let experiment = experiment_for(
            &target,
            &rollout,
            &step,
            &replica_set("new", "web:2"),
            &replica_set("old", "web:1"),
        )
        .expect("builds");
        let labels = experiment.metadata.labels.clone().unwrap();
        assert_eq!(labels["team"], "shop");
        assert_eq!(labels[DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY], "new");
        assert_eq!(
            experiment.metadata.annotations.clone().unwrap()[REVISION_ANNOTATION],
            "2"
        );
        assert_eq!(
            experiment.metadata.owner_references.clone().unwrap()[0].uid,
            "uid-1"
        );
        let spec = &experiment.spec;
        assert_eq!(spec.duration.as_deref(), Some("5m"));
        assert_eq!(spec.progress_deadline_seconds, Some(120));
        let [baseline, canary] = spec.templates.as_slice() else {
            panic!("two templates: {:?}", spec.templates);
        };
        assert_eq!(
            (image(baseline), image(canary)),
            ("web:1".into(), "web:2".into())
        );
        assert_eq!(baseline.min_ready_seconds, Some(3));
        assert_eq!(baseline.replicas, Some(2));
        // The step's labels go on the pods and into the selector; the ReplicaSet's hash goes.
        let selector = baseline.selector.clone().unwrap().match_labels.unwrap();
        assert_eq!(
            selector,
            BTreeMap::from([
                ("app".to_string(), "web".to_string()),
                ("role".to_string(), "baseline".to_string())
            ])
        );
        let pod_labels = &baseline.template.0["metadata"]["labels"];
        assert_eq!(pod_labels["role"], "baseline");
        assert!(pod_labels.get(DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY).is_none());
        // A weighted template gets a Service; an unweighted one without `service` none.
        assert_eq!(baseline.service, None);
        assert_eq!(canary.service, Some(TemplateService { name: None }));
        assert_eq!(spec.analyses[0].template_name, "judge-error-rate");
        assert_eq!(spec.analyses[0].args[0].value.as_deref(), Some("old"));
        assert_eq!(spec.analyses[0].required_for_completion, Some(true));
    }
}
