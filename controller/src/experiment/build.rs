//! The objects an Experiment owns, built as Argo builds them: a ReplicaSet per template
//! (`<experiment>-<template>`, its own pod-template hash), a Service per template that asks
//! for one, an AnalysisRun per analysis (`<experiment>-<analysis>`), with its argument values
//! resolved from the experiment (`{{templates.NAME.podTemplateHash}}` and the like).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::{Resource, ResourceExt};
use rollouts_analysis::compose;
use rollouts_crds::analysis::{AnalysisRun, AnalysisRunArgument};
use rollouts_crds::experiment::{Experiment, ExperimentAnalysisTemplateRef, ExperimentTemplate};
use rollouts_crds::rollout::CONTROLLER_INSTANCE_ID_LABEL_KEY;
use serde_json::{Value, json};

use super::plan::Observed;
use crate::planner::hash::pod_template_hash_of_value;

pub use crate::planner::hash::POD_TEMPLATE_HASH_LABEL;
pub use rollouts_crds::rollout::SCALE_DOWN_DEADLINE_ANNOTATION_KEY as SCALE_DOWN_DEADLINE_ANNOTATION;

/// Annotation on an experiment's ReplicaSets and Services: the experiment's name (Argo's key).
pub const EXPERIMENT_NAME_ANNOTATION: &str = "experiment.argoproj.io/name";
/// Annotation on an experiment's ReplicaSets and Services: the template's name (Argo's key).
pub const EXPERIMENT_TEMPLATE_NAME_ANNOTATION: &str = "experiment.argoproj.io/template-name";

/// The name of a template's ReplicaSet (Argo's).
pub fn replica_set_name(experiment: &str, template: &str) -> String {
    format!("{experiment}-{template}")
}

/// The name of an analysis's AnalysisRun (Argo's).
pub fn analysis_run_name(experiment: &str, analysis: &str) -> String {
    format!("{experiment}-{analysis}")
}

/// The name of a template's Service: `service.name`, or its ReplicaSet's name (Argo's).
pub fn service_name(experiment: &str, template: &ExperimentTemplate) -> String {
    template
        .service
        .as_ref()
        .and_then(|s| s.name.clone())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| replica_set_name(experiment, &template.name))
}

/// The pod-template hash of a template: its hash label left out, as for Rollouts.
pub fn template_hash(template: &ExperimentTemplate) -> String {
    pod_template_hash_of_value(&Value::Object(template.template.0.clone()), None)
}

fn owner(experiment: &Experiment) -> Result<OwnerReference, String> {
    experiment
        .controller_owner_ref(&())
        .filter(|owner| !owner.uid.is_empty())
        .ok_or_else(|| "the Experiment has no uid yet".to_string())
}

fn object_annotations(experiment: &Experiment, template: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            EXPERIMENT_NAME_ANNOTATION.to_string(),
            experiment.name_any(),
        ),
        (
            EXPERIMENT_TEMPLATE_NAME_ANNOTATION.to_string(),
            template.to_string(),
        ),
    ])
}

/// The pod labels of a template's pods: its own and the hash.
fn pod_labels(template: &ExperimentTemplate, hash: &str) -> BTreeMap<String, String> {
    let mut labels = template.template.labels();
    labels.insert(POD_TEMPLATE_HASH_LABEL.to_string(), hash.to_string());
    labels
}

/// The ReplicaSet of `template` with `replicas` pods: the template's pods with the hash label,
/// its selector with the hash added, `minReadySeconds`, owned by the experiment.
pub fn replica_set(
    experiment: &Experiment,
    template: &ExperimentTemplate,
    replicas: i32,
) -> Result<ReplicaSet, String> {
    let hash = template_hash(template);
    let mut pod_template = Value::Object(template.template.0.clone());
    if !pod_template["metadata"].is_object() {
        pod_template["metadata"] = json!({});
    }
    let labels = pod_labels(template, &hash);
    pod_template["metadata"]["labels"] = json!(labels);
    let mut selector = template.selector.clone().unwrap_or(LabelSelector {
        match_expressions: None,
        match_labels: None,
    });
    selector
        .match_labels
        .get_or_insert_with(BTreeMap::new)
        .insert(POD_TEMPLATE_HASH_LABEL.to_string(), hash);
    let mut replica_set = json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": replica_set_name(&experiment.name_any(), &template.name),
            "namespace": experiment.namespace(),
            "labels": labels,
            "annotations": object_annotations(experiment, &template.name),
            "ownerReferences": [owner(experiment)?],
        },
        "spec": {
            "replicas": replicas,
            "selector": selector,
            "template": pod_template,
        },
    });
    if let Some(seconds) = template.min_ready_seconds {
        replica_set["spec"]["minReadySeconds"] = json!(seconds);
    }
    serde_json::from_value(replica_set).map_err(|e| {
        format!(
            "spec.templates[name={}].template does not make a ReplicaSet: {e}",
            template.name
        )
    })
}

/// The Service of a template that asks for one: selecting its pods (the ReplicaSet's labels),
/// one port per container port; `None` when the containers declare no port (as Argo).
pub fn service(
    experiment: &Experiment,
    template: &ExperimentTemplate,
    hash: &str,
) -> Option<Service> {
    let ports: Vec<Value> = template
        .template
        .0
        .get("spec")
        .and_then(|spec| spec.get("containers"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(|container| {
            container
                .get("ports")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|port| {
            let number = port.get("containerPort")?.as_i64()?;
            let mut service_port = json!({
                "port": number,
                "targetPort": number,
                "protocol": port.get("protocol").and_then(Value::as_str).unwrap_or("TCP"),
            });
            if let Some(name) = port
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
            {
                service_port["name"] = json!(name);
            }
            Some(service_port)
        })
        .collect();
    if ports.is_empty() {
        return None;
    }
    let service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(&experiment.name_any(), template),
            "namespace": experiment.namespace(),
            "annotations": object_annotations(experiment, &template.name),
            "ownerReferences": [owner(experiment).ok()?],
        },
        "spec": {
            "selector": pod_labels(template, hash),
            "ports": ports,
        },
    });
    serde_json::from_value(service).ok()
}

/// The AnalysisRun of `analysis`, composed from its gathered templates with the experiment's
/// argument values, dry-run and retention rules; labelled with `analysisRunMetadata` and the
/// experiment's instance label, owned by the experiment.
pub fn analysis_run(
    experiment: &Experiment,
    analysis: &ExperimentAnalysisTemplateRef,
    templates: &compose::Templates,
    observed: &Observed,
) -> Result<AnalysisRun, String> {
    let args = resolve_args(experiment, &analysis.args, observed)?;
    let spec = compose::run_spec(
        templates,
        &args,
        &experiment.spec.dry_run,
        &experiment.spec.measurement_retention,
    )?;
    let name = analysis_run_name(&experiment.name_any(), &analysis.name);
    let mut run = AnalysisRun::new(&name, spec);
    let metadata = experiment
        .spec
        .analysis_run_metadata
        .clone()
        .unwrap_or_default();
    let mut labels = metadata.labels.unwrap_or_default();
    if let Some(instance) = experiment.labels().get(CONTROLLER_INSTANCE_ID_LABEL_KEY) {
        labels.insert(CONTROLLER_INSTANCE_ID_LABEL_KEY.into(), instance.clone());
    }
    run.metadata.namespace = experiment.namespace();
    run.metadata.labels = (!labels.is_empty()).then_some(labels);
    run.metadata.annotations = metadata.annotations.filter(|a| !a.is_empty());
    run.metadata.owner_references = Some(vec![owner(experiment)?]);
    Ok(run)
}

/// The values an experiment's analysis argument may name (Argo's): each template's
/// `podTemplateHash` and `replicaset.name` once its ReplicaSet exists, and
/// `experiment.availableAt` and `experiment.finishedAt` (with a duration) once available.
fn placeholder_values(experiment: &Experiment, observed: &Observed) -> BTreeMap<String, String> {
    let mut values = BTreeMap::new();
    let status = experiment.status.clone().unwrap_or_default();
    if let Some(available_at) = &status.available_at {
        values.insert(
            "experiment.availableAt".to_string(),
            available_at.0.to_string(),
        );
        if let Some(duration) = experiment
            .spec
            .duration
            .as_deref()
            .and_then(|d| rollouts_crds::duration::parse(d).ok())
            && let Some(end) = available_at.0.checked_add(duration).ok()
        {
            values.insert("experiment.finishedAt".to_string(), end.to_string());
        }
    }
    for template in &experiment.spec.templates {
        if let Some(rs) = observed.replica_sets.get(&template.name) {
            values.insert(
                format!("templates.{}.podTemplateHash", template.name),
                rs.pod_template_hash.clone(),
            );
            values.insert(
                format!("templates.{}.replicaset.name", template.name),
                rs.name.clone(),
            );
        }
    }
    values
}

/// The analysis's arguments with every `{{...}}` in their values replaced; one that names
/// nothing known is an error naming it. `valueFrom.secretKeyRef` is passed on to the run.
fn resolve_args(
    experiment: &Experiment,
    args: &[AnalysisRunArgument],
    observed: &Observed,
) -> Result<Vec<AnalysisRunArgument>, String> {
    let values = placeholder_values(experiment, observed);
    args.iter()
        .map(|arg| {
            let mut arg = arg.clone();
            if let Some(value) = &arg.value {
                arg.value = Some(substitute(value, &values).map_err(|tag| {
                    format!("args[{:?}]: failed to resolve {{{{{tag}}}}}", arg.name)
                })?);
            }
            Ok(arg)
        })
        .collect()
}

/// `text` with each `{{ tag }}` replaced by its value; the first unknown tag is the error.
pub fn substitute(text: &str, values: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let Some(close) = after.find("}}") else {
            out.push_str(&rest[open..]);
            return Ok(out);
        };
        let tag = after[..close].trim();
        match values.get(tag) {
            Some(value) => out.push_str(value),
            None => return Err(tag.to_string()),
        }
        rest = &after[close + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The tags `{{...}}` in `text`.
pub fn tags(text: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("{{") {
        let after = &rest[open + 2..];
        let Some(close) = after.find("}}") else {
            break;
        };
        found.push(after[..close].trim());
        rest = &after[close + 2..];
    }
    found
}
