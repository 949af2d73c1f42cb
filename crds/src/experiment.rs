//! The `Experiment` kind, field for field as Argo Rollouts defines it: ReplicaSets run side by
//! side for a duration, with AnalysisRuns judging them.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::analysis::AnalysisPhase;
use crate::rollout::{
    AnalysisRunArgument, AnalysisRunMetadata, DryRun, MeasurementRetention, PodTemplate,
    TemplateService,
};

/// The CRDs this module defines.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![Experiment::crd()]
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// ReplicaSets run side by side for a while, judged by analyses.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "argoproj.io",
    version = "v1alpha1",
    kind = "Experiment",
    plural = "experiments",
    shortname = "exp",
    namespaced,
    status = "ExperimentStatus",
    derive = "PartialEq",
    derive = "Default",
    printcolumn(
        name = "Status",
        type_ = "string",
        json_path = ".status.phase",
        description = "Experiment status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time since resource was created"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ExperimentSpec {
    /// The ReplicaSets to run.
    #[serde(default)]
    pub templates: Vec<ExperimentTemplate>,
    /// How long the experiment runs (Go duration); without it, until terminated or an
    /// analysis fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    /// Seconds to make progress before the experiment is failed (default 600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_deadline_seconds: Option<i32>,
    /// Stops the experiment early.
    #[serde(default, skip_serializing_if = "is_false")]
    pub terminate: bool,
    /// Analyses run during the experiment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub analyses: Vec<ExperimentAnalysisTemplateRef>,
    /// Delay before scaling the ReplicaSets down (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down_delay_seconds: Option<i32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dry_run: Vec<DryRun>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measurement_retention: Vec<MeasurementRetention>,
    /// Labels and annotations added to the AnalysisRuns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis_run_metadata: Option<AnalysisRunMetadata>,
}

/// One ReplicaSet of an experiment (Argo's `TemplateSpec`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExperimentTemplate {
    pub name: String,
    /// Desired pods (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ready_seconds: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// The pod template, kept as written.
    #[serde(default)]
    pub template: PodTemplate,
    /// Creates a Service for this ReplicaSet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<TemplateService>,
}

/// An analysis run by an experiment.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExperimentAnalysisTemplateRef {
    /// Name of the analysis within the experiment.
    pub name: String,
    pub template_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_scope: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<AnalysisRunArgument>,
    /// The experiment does not complete before this analysis does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required_for_completion: Option<bool>,
}

/// Status of an Experiment.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExperimentStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<AnalysisPhase>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub template_statuses: Vec<TemplateStatus>,
    /// When every template became available; the duration counts from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<ExperimentCondition>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub analysis_runs: Vec<ExperimentAnalysisRunStatus>,
}

/// State of one template's ReplicaSet.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum TemplateStatusCode {
    Progressing,
    Running,
    Successful,
    Failed,
    Error,
}

/// Status of one template of an experiment.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateStatus {
    pub name: String,
    #[serde(default)]
    pub replicas: i32,
    #[serde(default)]
    pub updated_replicas: i32,
    #[serde(default)]
    pub ready_replicas: i32,
    #[serde(default)]
    pub available_replicas: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collision_count: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<TemplateStatusCode>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_template_hash: String,
}

/// A condition of an experiment (`InvalidSpec`, `Completed`, `Progressing`, `Running`,
/// `ReplicaFailure`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExperimentCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub last_update_time: Time,
    pub last_transition_time: Time,
    pub reason: String,
    pub message: String,
}

/// Status of one analysis of an experiment.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExperimentAnalysisRunStatus {
    pub name: String,
    pub analysis_run: String,
    // Argo writes an empty phase for an analysis whose run is not created yet: read as Pending.
    #[serde(deserialize_with = "empty_phase_is_pending")]
    pub phase: AnalysisPhase,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// An analysis phase, the empty string (Argo's phase of an analysis not started) as Pending.
fn empty_phase_is_pending<'de, D>(deserializer: D) -> Result<AnalysisPhase, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let phase = String::deserialize(deserializer)?;
    if phase.is_empty() {
        return Ok(AnalysisPhase::Pending);
    }
    AnalysisPhase::deserialize(serde::de::value::StrDeserializer::<D::Error>::new(&phase))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_analysis_argo_has_not_started_reads_as_pending() {
        let status: ExperimentStatus = serde_json::from_value(serde_json::json!({
            "phase": "Pending",
            "analysisRuns": [
                {"name": "judge", "analysisRun": "", "phase": ""},
                {"name": "other", "analysisRun": "exp-other", "phase": "Running"},
            ],
        }))
        .expect("decodes what Argo writes");
        assert_eq!(status.analysis_runs[0].phase, AnalysisPhase::Pending);
        assert_eq!(status.analysis_runs[1].phase, AnalysisPhase::Running);
        let bad = serde_json::from_value::<ExperimentAnalysisRunStatus>(
            serde_json::json!({"name": "judge", "analysisRun": "", "phase": "Sideways"}),
        );
        assert!(bad.is_err(), "an unknown phase is still refused");
    }
}
