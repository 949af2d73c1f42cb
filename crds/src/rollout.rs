//! The `Rollout` kind (`argoproj.io/v1alpha1`), field for field as Argo Rollouts defines it, and
//! the argument / template-reference shapes the analysis kinds share with it.
//!
//! Serialisation rules:
//! - spec fields Argo marks `omitempty` are `Option`s here, so a manifest read and written back
//!   keeps exactly the fields the user wrote (an explicit `paused: false` stays, an absent one
//!   stays absent). Defaults live in [`crate::defaults`], never in the stored value.
//! - status fields follow Argo's writer: zero values are left out, except `conditions`, `canary`
//!   and `blueGreen`, which are always written (`conditions: []` when empty; Argo CD's health
//!   script iterates it). A status read without `conditions` therefore gains `conditions: []`
//!   when written back.

mod pod_template;
mod status;
// Test builders for every crate's tests. Not behind a cargo feature: the demo test builds the
// binaries without dev-dependencies, and a feature would make cargo build this crate twice.
#[doc(hidden)]
pub mod testing;
mod traffic_routing;

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use pod_template::PodTemplate;
pub use pod_template::{preserve_unknown_object, preserve_unknown_object_schema};
pub use status::*;
pub use traffic_routing::*;

/// The CRDs this module defines.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![Rollout::crd()]
}

/// Label added to ReplicaSets and pods so that each revision selects only its own pods.
pub const DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY: &str = "rollouts-pod-template-hash";
/// Annotation on an old ReplicaSet holding the time it may be scaled down.
pub const SCALE_DOWN_DEADLINE_ANNOTATION_KEY: &str = "scale-down-deadline";
/// Annotation on objects a Rollout manages without owning (services, ingresses).
pub const MANAGED_BY_ROLLOUTS_KEY: &str = "argo-rollouts.argoproj.io/managed-by-rollouts";
/// Annotation on a ReplicaSet restarted by `spec.restartAt`.
pub const REPLICA_SET_RESTART_ANNOTATION_KEY: &str = "argo-rollouts.argoproj.io/restarted-after";
/// Label that assigns an object to one controller instance.
pub const CONTROLLER_INSTANCE_ID_LABEL_KEY: &str =
    "argo-rollouts.argoproj.io/controller-instance-id";
/// Label on an AnalysisRun saying which part of the rollout created it.
pub const ROLLOUT_TYPE_LABEL: &str = "rollout-type";
/// `rollout-type` value: created by a canary analysis step.
pub const ROLLOUT_TYPE_STEP: &str = "Step";
/// `rollout-type` value: background analysis.
pub const ROLLOUT_TYPE_BACKGROUND: &str = "Background";
/// `rollout-type` value: blue-green pre-promotion analysis.
pub const ROLLOUT_TYPE_PRE_PROMOTION: &str = "PrePromotion";
/// `rollout-type` value: blue-green post-promotion analysis.
pub const ROLLOUT_TYPE_POST_PROMOTION: &str = "PostPromotion";
/// Label on a step AnalysisRun with the index of the step that created it.
pub const ROLLOUT_CANARY_STEP_INDEX_LABEL: &str = "step-index";

/// `workloadRef.scaleDown`: never scale the referenced Deployment down.
pub const SCALE_DOWN_NEVER: &str = "never";
/// `workloadRef.scaleDown`: scale the Deployment to zero once the Rollout is healthy.
pub const SCALE_DOWN_ON_SUCCESS: &str = "onsuccess";
/// `workloadRef.scaleDown`: scale the Deployment down as the Rollout scales up.
pub const SCALE_DOWN_PROGRESSIVELY: &str = "progressively";

/// `spec` of a Rollout: a Deployment-like pod template plus a canary or blue-green strategy.
// Each printer column repeats `type_ = "integer"`, which clippy mistakes for a duplicate.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "argoproj.io",
    version = "v1alpha1",
    kind = "Rollout",
    namespaced,
    shortname = "ro",
    status = "RolloutStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "Rollout is a specification for a Rollout resource",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.HPAReplicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Desired",
        type_ = "integer",
        description = "Number of desired pods",
        json_path = ".spec.replicas"
    ),
    printcolumn(
        name = "Current",
        type_ = "integer",
        description = "Total number of non-terminated pods targeted by this rollout",
        json_path = ".status.replicas"
    ),
    printcolumn(
        name = "Up-to-date",
        type_ = "integer",
        description = "Total number of non-terminated pods targeted by this rollout that have the desired template spec",
        json_path = ".status.updatedReplicas"
    ),
    printcolumn(
        name = "Available",
        type_ = "integer",
        description = "Total number of available pods (ready for at least minReadySeconds) targeted by this rollout",
        json_path = ".status.availableReplicas"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        description = "Time since resource was created",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    /// Desired pods; defaults to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 1))]
    pub replicas: Option<i32>,
    /// Label selector for pods; must match the template's labels. Optional with `workloadRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Pods to create; optional with `workloadRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<PodTemplate>,
    /// A Deployment whose template and selector this Rollout uses instead of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_ref: Option<ObjectRef>,
    /// Seconds a new pod must be ready, without crashing, to count as available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ready_seconds: Option<i32>,
    /// Revisions within which a rollback skips analysis and steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_window: Option<RollbackWindowSpec>,
    /// How a new revision replaces the old one.
    #[serde(default, skip_serializing_if = "RolloutStrategy::is_unset")]
    pub strategy: RolloutStrategy,
    /// Old ReplicaSets kept for rollback; defaults to 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_history_limit: Option<i32>,
    /// Pauses the rollout at its current step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// Seconds without progress before the rollout is marked as failed; defaults to 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_deadline_seconds: Option<i32>,
    /// Abort the update when the progress deadline is exceeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_deadline_abort: Option<bool>,
    /// Restart every pod created before this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_at: Option<Time>,
    /// How many finished AnalysisRuns and Experiments to keep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<AnalysisRunStrategy>,
}

/// A reference to the object (a Deployment) that supplies the pod template.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `never`, `onsuccess` or `progressively`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down: Option<String>,
}

/// `spec.rollbackWindow`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RollbackWindowSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revisions: Option<i32>,
}

/// `spec.analysis`: history limits for AnalysisRuns and Experiments.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AnalysisRunStrategy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub successful_run_history_limit: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsuccessful_run_history_limit: Option<i32>,
}

/// `spec.strategy`: exactly one of `canary` and `blueGreen`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStrategy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blue_green: Option<BlueGreenStrategy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryStrategy>,
}

impl RolloutStrategy {
    /// Neither strategy set (the spec is invalid; see validation).
    pub fn is_unset(&self) -> bool {
        self.blue_green.is_none() && self.canary.is_none()
    }
}

/// `spec.strategy.blueGreen`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlueGreenStrategy {
    /// Service that receives production traffic; required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_service: Option<String>,
    /// Service that selects the new revision before promotion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview_service: Option<String>,
    /// Pods of the new revision before promotion; defaults to all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview_replica_count: Option<i32>,
    /// Promote as soon as the new revision is ready; defaults to true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_promotion_enabled: Option<bool>,
    /// Seconds to wait before promoting automatically.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_promotion_seconds: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
    /// Seconds the old revision keeps running after promotion; defaults to 30.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down_delay_seconds: Option<i32>,
    /// Old ReplicaSets kept running during their scale-down delay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down_delay_revision_limit: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_promotion_analysis: Option<RolloutAnalysis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anti_affinity: Option<AntiAffinity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_promotion_analysis: Option<RolloutAnalysis>,
    /// Metadata added to the new revision's pods while they are in preview.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview_metadata: Option<PodTemplateMetadata>,
    /// Metadata added to the pods the active service selects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_metadata: Option<PodTemplateMetadata>,
    /// Seconds before the preview ReplicaSet is scaled down after an abort; defaults to 30.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort_scale_down_delay_seconds: Option<i32>,
}

/// Pod anti-affinity injected between the old and the new revision.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AntiAffinity {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_during_scheduling_ignored_during_execution:
        Option<PreferredDuringSchedulingIgnoredDuringExecution>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required_during_scheduling_ignored_during_execution:
        Option<RequiredDuringSchedulingIgnoredDuringExecution>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreferredDuringSchedulingIgnoredDuringExecution {
    /// Weight of the scheduling preference, 1..=100.
    pub weight: i32,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RequiredDuringSchedulingIgnoredDuringExecution {}

/// `canary.replicaProgressThreshold.type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ProgressType {
    Percent,
    Pods,
}

/// How many canary pods must be available before the rollout moves on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaProgressThreshold {
    #[serde(rename = "type")]
    pub type_: ProgressType,
    pub value: i32,
}

/// `spec.strategy.canary`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryStrategy {
    /// Service the controller points at the canary pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_service: Option<String>,
    /// Service the controller points at the stable pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_service: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<Vec<CanaryStep>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_routing: Option<RolloutTrafficRouting>,
    /// Pods that may be unavailable during the update; defaults to 25%.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
    /// Pods that may exist above `replicas` during the update; defaults to 25%.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge: Option<IntOrString>,
    /// Background analysis that runs while the steps progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<RolloutAnalysisBackground>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anti_affinity: Option<AntiAffinity>,
    /// Metadata added to canary pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_metadata: Option<PodTemplateMetadata>,
    /// Metadata added to stable pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_metadata: Option<PodTemplateMetadata>,
    /// With traffic routing: seconds the old stable keeps running after the switch; defaults to 30.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down_delay_seconds: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down_delay_revision_limit: Option<i32>,
    /// With traffic routing: seconds before the canary is scaled down after an abort; defaults to 30.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort_scale_down_delay_seconds: Option<i32>,
    /// Scale the stable down as traffic moves to the canary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic_stable_scale: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ping_pong: Option<PingPongSpec>,
    /// Minimum pods of a ReplicaSet that receives traffic (with traffic routing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_pods_per_replica_set: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_progress_threshold: Option<ReplicaProgressThreshold>,
}

impl CanaryStrategy {
    /// The steps, empty when none are written.
    pub fn steps(&self) -> &[CanaryStep] {
        self.steps.as_deref().unwrap_or_default()
    }
}

/// Two services that swap roles (ping-pong) instead of a canary and a stable service.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PingPongSpec {
    pub ping_service: String,
    pub pong_service: String,
}

/// Labels and annotations added to the pods of one role (canary, stable, active, preview).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplateMetadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// Labels and annotations added to the AnalysisRuns a rollout creates.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AnalysisRunMetadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// One canary step. Exactly one field is set (validation reports steps with none or several).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryStep {
    /// Percentage of traffic (or of pods, without a router) sent to the canary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_weight: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause: Option<RolloutPause>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experiment: Option<RolloutExperimentStep>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<RolloutAnalysis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_canary_scale: Option<SetCanaryScale>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_header_route: Option<SetHeaderRoute>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_mirror_route: Option<SetMirrorRoute>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<PluginStep>,
}

impl CanaryStep {
    /// Names of the step kinds set in this step, in Argo's field order.
    pub fn kinds(&self) -> Vec<&'static str> {
        let mut kinds = Vec::new();
        let set = [
            ("setWeight", self.set_weight.is_some()),
            ("pause", self.pause.is_some()),
            ("experiment", self.experiment.is_some()),
            ("analysis", self.analysis.is_some()),
            ("setCanaryScale", self.set_canary_scale.is_some()),
            ("setHeaderRoute", self.set_header_route.is_some()),
            ("setMirrorRoute", self.set_mirror_route.is_some()),
            ("plugin", self.plugin.is_some()),
        ];
        for (name, present) in set {
            if present {
                kinds.push(name);
            }
        }
        kinds
    }
}

/// `pause` step. No duration means wait until promoted.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutPause {
    /// Seconds as an integer, or a Go duration string (`"30s"`, `"1h"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<IntOrString>,
}

impl RolloutPause {
    /// The pause length: `Ok(None)` for an indefinite pause, an error when the duration is
    /// negative, longer than [`crate::duration::MAX`] or does not parse.
    pub fn duration(&self) -> Result<Option<std::time::Duration>, PauseDurationError> {
        match &self.duration {
            None => Ok(None),
            Some(IntOrString::Int(secs)) if *secs < 0 => {
                Err(PauseDurationError::Negative { seconds: *secs })
            }
            Some(IntOrString::Int(secs)) => {
                Ok(Some(crate::duration::from_seconds(i64::from(*secs))?))
            }
            Some(IntOrString::String(text)) => Ok(Some(crate::duration::parse(text)?)),
        }
    }
}

/// Why `pause.duration` cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PauseDurationError {
    #[error("pause duration {seconds} is negative")]
    Negative { seconds: i32 },
    #[error(transparent)]
    Malformed(#[from] crate::duration::DurationError),
}

/// `setCanaryScale` step: size the canary independently of the traffic weight.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SetCanaryScale {
    /// Canary pods as a percentage of `spec.replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
    /// Canary pods as an absolute count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Go back to scaling the canary with the traffic weight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_traffic_weight: Option<bool>,
}

/// `setHeaderRoute` step: send requests matching headers to the canary. No `match` removes the
/// route.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SetHeaderRoute {
    /// Name of the route; must be listed in `trafficRouting.managedRoutes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub match_: Option<Vec<HeaderRoutingMatch>>,
}

/// One header condition of a header route.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeaderRoutingMatch {
    pub header_name: String,
    pub header_value: StringMatch,
}

/// Exactly one of `exact`, `prefix` or `regex`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StringMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
}

/// `setMirrorRoute` step: copy matching requests to the canary. No `match` removes the route.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SetMirrorRoute {
    /// Name of the route; must be listed in `trafficRouting.managedRoutes`.
    pub name: String,
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub match_: Option<Vec<RouteMatch>>,
    /// Percentage of matching requests mirrored; defaults to 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percentage: Option<i32>,
}

/// Request conditions of a mirror route; all given conditions must hold.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<StringMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<StringMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, StringMatch>>,
}

/// `plugin` step: a step executed by a named step plugin.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginStep {
    pub name: String,
    /// Plugin-specific configuration, kept as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object_schema")]
    pub config: Option<Value>,
}

/// `experiment` step: run ReplicaSets of the canary and/or stable template side by side.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutExperimentStep {
    pub templates: Vec<RolloutExperimentTemplate>,
    /// How long the experiment runs (Go duration); without it, until its analyses finish.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analyses: Option<Vec<RolloutExperimentStepAnalysisTemplateRef>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<Vec<DryRun>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis_run_metadata: Option<AnalysisRunMetadata>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down_delay_seconds: Option<i32>,
}

/// An analysis run by an experiment step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutExperimentStepAnalysisTemplateRef {
    pub name: String,
    pub template_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_scope: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<AnalysisRunArgument>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required_for_completion: Option<bool>,
}

/// One ReplicaSet of an experiment step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutExperimentTemplate {
    pub name: String,
    /// Which pod template to run: `canary` or `stable`.
    pub spec_ref: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<PodTemplateMetadata>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Traffic weight sent to this ReplicaSet (with traffic routing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<TemplateService>,
}

/// A Service created for an experiment ReplicaSet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateService {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// Background analysis: a [`RolloutAnalysis`] plus the step at which it starts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutAnalysisBackground {
    #[serde(flatten)]
    pub analysis: RolloutAnalysis,
    /// Index of the step at which the background analysis starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starting_step: Option<i32>,
}

/// AnalysisTemplates to run, with their arguments.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutAnalysis {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub templates: Option<Vec<RolloutAnalysisTemplate>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<AnalysisRunArgument>>,
    /// Metrics whose failures do not fail the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<Vec<DryRun>>,
    /// How many measurements to keep per metric.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measurement_retention: Option<Vec<MeasurementRetention>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis_run_metadata: Option<AnalysisRunMetadata>,
}

impl RolloutAnalysis {
    /// The template references, empty when none are written.
    pub fn templates(&self) -> &[RolloutAnalysisTemplate] {
        self.templates.as_deref().unwrap_or_default()
    }

    /// The arguments, empty when none are written.
    pub fn args(&self) -> &[AnalysisRunArgument] {
        self.args.as_deref().unwrap_or_default()
    }
}

/// A reference to an AnalysisTemplate (or, with `clusterScope`, a ClusterAnalysisTemplate).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutAnalysisTemplate {
    pub template_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_scope: Option<bool>,
}

/// An argument handed to an analysis: a literal `value` or a `valueFrom` source.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AnalysisRunArgument {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<ArgumentValueFrom>,
}

/// Where an argument's value comes from. Rollouts use `podTemplateHashValue` and `fieldRef`;
/// AnalysisTemplates use `secretKeyRef` and `fieldRef`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArgumentValueFrom {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template_hash_value: Option<ValueFromPodTemplateHash>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_ref: Option<FieldRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<SecretKeyRef>,
}

/// Which ReplicaSet's pod-template hash an argument takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ValueFromPodTemplateHash {
    /// The stable ReplicaSet's hash.
    Stable,
    /// The newest ReplicaSet's hash.
    Latest,
}

/// A field of the Rollout, e.g. `metadata.labels['app']`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FieldRef {
    pub field_path: String,
}

/// A key of a Secret in the analysis' namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    pub name: String,
    pub key: String,
}

/// A metric run in dry-run mode (its result does not count).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DryRun {
    /// Metric name, or a regular expression over metric names.
    pub metric_name: String,
}

/// How many measurements of a metric are kept in the AnalysisRun's status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MeasurementRetention {
    /// Metric name, or a regular expression over metric names.
    pub metric_name: String,
    pub limit: i32,
}

impl Rollout {
    /// The canary strategy, when this is a canary rollout.
    pub fn canary(&self) -> Option<&CanaryStrategy> {
        self.spec.strategy.canary.as_ref()
    }

    /// The blue-green strategy, when this is a blue-green rollout.
    pub fn blue_green(&self) -> Option<&BlueGreenStrategy> {
        self.spec.strategy.blue_green.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(value: Value) -> Rollout {
        serde_json::from_value(value).expect("parses as a Rollout")
    }

    #[test]
    fn pod_template_keeps_fields_k8s_openapi_does_not_know() {
        let doc = json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Rollout",
            "metadata": {"name": "web"},
            "spec": {
                "template": {
                    "metadata": {"labels": {"app": "web"}, "annotations": {"a": "b"}},
                    "spec": {
                        "futurePodField": {"enabled": true},
                        "containers": [{"name": "web", "image": "nginx", "futureContainerField": 3}]
                    }
                }
            }
        });
        let rollout = parse(doc.clone());
        assert_eq!(serde_json::to_value(&rollout).expect("serialises"), doc);
        let template = rollout.spec.template.expect("template");
        let typed = template.to_spec().expect("typed view");
        let containers = typed.spec.clone().expect("pod spec").containers;
        assert_eq!(containers[0].image.as_deref(), Some("nginx"));
        assert_eq!(
            template.labels().get("app").map(String::as_str),
            Some("web")
        );
        assert_eq!(template.annotations().len(), 1);
        assert!(!template.is_empty_template());
        assert_eq!(PodTemplate::from_spec(&typed).labels(), template.labels());
    }

    #[test]
    fn explicit_defaults_are_kept_and_absent_fields_stay_absent() {
        let doc = json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Rollout",
            "metadata": {"name": "web"},
            "spec": {
                "paused": false,
                "replicas": 1,
                "strategy": {"canary": {"steps": [], "dynamicStableScale": false}}
            }
        });
        assert_eq!(
            serde_json::to_value(parse(doc.clone())).expect("serialises"),
            doc
        );
    }

    #[test]
    fn pause_durations() {
        let pause = |d: Option<IntOrString>| RolloutPause { duration: d }.duration();
        assert_eq!(pause(None), Ok(None));
        assert_eq!(
            pause(Some(IntOrString::Int(45))),
            Ok(Some(std::time::Duration::from_secs(45)))
        );
        assert_eq!(
            pause(Some(IntOrString::String("45".into()))),
            Ok(Some(std::time::Duration::from_secs(45)))
        );
        assert_eq!(
            pause(Some(IntOrString::String("1m30s".into()))),
            Ok(Some(std::time::Duration::from_secs(90)))
        );
        assert!(pause(Some(IntOrString::Int(-1))).is_err());
        assert!(pause(Some(IntOrString::String("soon".into()))).is_err());
    }

    #[test]
    fn step_kinds_in_argo_order() {
        let mut step = CanaryStep::weight(5);
        assert_eq!(step.kinds(), ["setWeight"]);
        step.plugin = Some(PluginStep {
            name: "p".into(),
            config: None,
        });
        step.pause = Some(RolloutPause::default());
        assert_eq!(step.kinds(), ["setWeight", "pause", "plugin"]);
        assert!(CanaryStep::default().kinds().is_empty());
    }

    #[test]
    fn status_is_written_as_argo_writes_it() {
        let status = RolloutStatus {
            observed_generation: "4".into(),
            hpa_replicas: 3,
            stable_rs: "abc".into(),
            ..RolloutStatus::default()
        };
        assert_eq!(
            serde_json::to_value(&status).expect("serialises"),
            json!({
                "observedGeneration": "4",
                "conditions": [],
                "canary": {},
                "blueGreen": {},
                "HPAReplicas": 3,
                "stableRS": "abc"
            })
        );
    }

    #[test]
    fn background_analysis_fields_sit_beside_starting_step() {
        let background: RolloutAnalysisBackground = serde_json::from_value(json!({
            "templates": [{"templateName": "rate"}],
            "startingStep": 2
        }))
        .expect("parses");
        assert_eq!(background.starting_step, Some(2));
        assert_eq!(background.analysis.templates()[0].template_name, "rate");
    }

    #[test]
    fn accessors_for_routers_and_strategies() {
        let routing: RolloutTrafficRouting = serde_json::from_value(json!({
            "managedRoutes": [{"name": "a"}, {"name": "b"}],
            "nginx": {"stableIngress": "one", "stableIngresses": ["two"]},
            "istio": {"virtualService": {"name": "vs1"}, "virtualServices": [{"name": "vs2"}]},
            "plugins": {"argoproj-labs/gatewayAPI": {"httpRoute": "web"}}
        }))
        .expect("parses");
        assert_eq!(routing.managed_route_names(), ["a", "b"]);
        let nginx = routing.nginx.as_ref().expect("nginx");
        assert_eq!(nginx.stable_ingress_names(), ["one", "two"]);
        let istio = routing.istio.as_ref().expect("istio");
        let names: Vec<_> = istio
            .all_virtual_services()
            .iter()
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(names, ["vs1", "vs2"]);
        assert_eq!(
            routing.plugin(GATEWAY_API_PLUGIN),
            Some(&json!({"httpRoute": "web"}))
        );

        let canary = Rollout::test_canary("web", vec![CanaryStep::weight(10)]);
        assert_eq!(canary.canary().map(|c| c.steps().len()), Some(1));
        assert!(canary.blue_green().is_none());
        assert!(Rollout::test_blue_green("web").blue_green().is_some());
    }
}
