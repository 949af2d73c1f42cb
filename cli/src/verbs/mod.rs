//! One module per kubectl verb, plus how a verb reports what it did.

pub mod abort;
pub mod completion;
pub mod create;
pub mod get;
pub mod lint;
pub mod list;
pub mod notifications;
pub mod pause;
pub mod plan;
pub mod promote;
pub mod restart;
pub mod resume;
pub mod retry;
pub mod set_image;
pub mod status;
pub mod terminate;
pub mod undo;
pub mod version;

use serde::Serialize;
use serde_json::Value;

use crate::args::ObjectFormat;
use crate::error::{Error, Result};
use crate::patch::TargetKind;

/// Prints the object in the asked format, or else the sentence saying what was done.
pub(crate) fn report<T: Serialize>(
    sentence: &str,
    object: &T,
    output: Option<ObjectFormat>,
) -> Result<()> {
    match output {
        None => println!("{sentence}"),
        Some(format) => print!("{}", render(object, format)?),
    }
    Ok(())
}

/// An object as `-o json` or `-o yaml` prints it, ending with a newline.
pub(crate) fn render<T: Serialize>(value: &T, format: ObjectFormat) -> Result<String> {
    match format {
        ObjectFormat::Json => serde_json::to_string_pretty(value)
            .map(|text| text + "\n")
            .map_err(|e| Error::Output(e.to_string())),
        ObjectFormat::Yaml => {
            serde_saphyr::to_string(value).map_err(|e| Error::Output(e.to_string()))
        }
    }
}

/// Which object holds a rollout's pod template: the rollout itself, or the Deployment its
/// `spec.workloadRef` names. `rollout` is the Rollout as JSON.
pub fn template_holder(rollout_name: &str, rollout: &Value) -> Result<(TargetKind, String)> {
    let Some(workload_ref) = rollout.pointer("/spec/workloadRef") else {
        return Ok((TargetKind::Rollout, rollout_name.to_string()));
    };
    let kind = workload_ref
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("");
    if kind != "Deployment" {
        return Err(Error::Invalid(format!(
            "rollout '{rollout_name}': spec.workloadRef.kind is {kind:?}; only a Deployment's template can be changed from here (fix: change the template in the referenced object itself)"
        )));
    }
    match workload_ref.get("name").and_then(Value::as_str) {
        Some(name) if !name.is_empty() => Ok((TargetKind::Deployment, name.to_string())),
        _ => Err(Error::Invalid(format!(
            "rollout '{rollout_name}': spec.workloadRef.name is missing (fix: name the Deployment that holds the pod template)"
        ))),
    }
}

/// The lower-case kind word Argo's plugin prints (`rollout "web" image updated`).
pub(crate) fn kind_word(target: TargetKind) -> &'static str {
    match target {
        TargetKind::Rollout => "rollout",
        TargetKind::Deployment => "deployment",
        TargetKind::AnalysisRun => "analysisrun",
        TargetKind::AnalysisTemplate => "analysistemplate",
        TargetKind::ClusterAnalysisTemplate => "clusteranalysistemplate",
        TargetKind::Experiment => "experiment",
    }
}

/// An object read from the server as plain JSON.
pub(crate) fn to_json(object: kube::core::DynamicObject) -> Result<Value> {
    serde_json::to_value(object).map_err(|e| Error::Output(e.to_string()))
}
