//! What a verb decides to send: the object, the subresource, the patch type and the body.
//! Verbs build these with pure functions; `cluster` applies them.

use serde_json::Value;

/// The content type a patch body is sent with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    /// RFC 7386 JSON merge patch (`application/merge-patch+json`); custom resources take it.
    Merge,
    /// RFC 6902 JSON patch (`application/json-patch+json`): a list of operations.
    Json,
}

impl PatchType {
    /// The HTTP content type of this patch type.
    pub fn content_type(self) -> &'static str {
        match self {
            PatchType::Merge => "application/merge-patch+json",
            PatchType::Json => "application/json-patch+json",
        }
    }
}

/// The kind of object a patch is sent to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetKind {
    Rollout,
    /// The Deployment a Rollout's `spec.workloadRef` names.
    Deployment,
    AnalysisRun,
    AnalysisTemplate,
    ClusterAnalysisTemplate,
    Experiment,
}

impl TargetKind {
    /// `resource.group`, as kubectl names it in messages (`rollouts.argoproj.io`).
    pub fn resource(self) -> &'static str {
        match self {
            TargetKind::Rollout => "rollouts.argoproj.io",
            TargetKind::Deployment => "deployments.apps",
            TargetKind::AnalysisRun => "analysisruns.argoproj.io",
            TargetKind::AnalysisTemplate => "analysistemplates.argoproj.io",
            TargetKind::ClusterAnalysisTemplate => "clusteranalysistemplates.argoproj.io",
            TargetKind::Experiment => "experiments.argoproj.io",
        }
    }

    /// The collection path, without the object name; cluster-scoped kinds ignore `namespace`.
    pub fn collection_path(self, namespace: &str) -> String {
        match self {
            TargetKind::Rollout => {
                format!("/apis/argoproj.io/v1alpha1/namespaces/{namespace}/rollouts")
            }
            TargetKind::Deployment => format!("/apis/apps/v1/namespaces/{namespace}/deployments"),
            TargetKind::AnalysisRun => {
                format!("/apis/argoproj.io/v1alpha1/namespaces/{namespace}/analysisruns")
            }
            TargetKind::AnalysisTemplate => {
                format!("/apis/argoproj.io/v1alpha1/namespaces/{namespace}/analysistemplates")
            }
            TargetKind::ClusterAnalysisTemplate => {
                "/apis/argoproj.io/v1alpha1/clusteranalysistemplates".to_string()
            }
            TargetKind::Experiment => {
                format!("/apis/argoproj.io/v1alpha1/namespaces/{namespace}/experiments")
            }
        }
    }
}

/// One patch a verb sends.
#[derive(Clone, Debug, PartialEq)]
pub struct PatchRequest {
    pub target: TargetKind,
    /// Name of the object patched.
    pub name: String,
    /// `Some("status")` to write through the status subresource.
    pub subresource: Option<&'static str>,
    pub patch_type: PatchType,
    pub body: Value,
}

impl PatchRequest {
    /// A merge patch of a Rollout's main resource (spec and metadata).
    pub fn rollout_spec(name: &str, body: Value) -> Self {
        Self {
            target: TargetKind::Rollout,
            name: name.to_string(),
            subresource: None,
            patch_type: PatchType::Merge,
            body,
        }
    }

    /// A merge patch of a Rollout's status subresource.
    pub fn rollout_status(name: &str, body: Value) -> Self {
        Self {
            target: TargetKind::Rollout,
            name: name.to_string(),
            subresource: Some("status"),
            patch_type: PatchType::Merge,
            body,
        }
    }
}
