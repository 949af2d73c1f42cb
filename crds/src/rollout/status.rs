//! `status` of a Rollout, shaped as Argo's controller writes it (Argo CD reads it).
//!
//! Zero values are left out as Go's `omitempty` does; `conditions`, `canary` and `blueGreen` are
//! always written, as Argo writes them. String-typed fields take the constants in
//! [`crate::conditions`].

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::preserve_unknown_object_schema;

fn is_zero(n: &i32) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// `status` of a Rollout.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// The update was aborted (by a person, a failed analysis or the progress deadline).
    #[serde(default, skip_serializing_if = "is_false")]
    pub abort: bool,
    /// Why the rollout is paused and since when; reasons from [`crate::conditions`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pause_conditions: Vec<PauseCondition>,
    /// The controller paused the rollout (as opposed to `spec.paused`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub controller_pause: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aborted_at: Option<Time>,
    /// Hash of `spec.template`: the revision being rolled out.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub current_pod_hash: String,
    /// Hash of the canary steps, to notice when they change.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub current_step_hash: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub replicas: i32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub updated_replicas: i32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ready_replicas: i32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub available_replicas: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_step_index: Option<i32>,
    /// Bumped when a ReplicaSet name collides, to change the next hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collision_count: Option<i32>,
    /// `metadata.generation` last acted on, as a string of digits (as Argo writes it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub observed_generation: String,
    /// Always written, `[]` when empty.
    #[serde(default)]
    pub conditions: Vec<RolloutCondition>,
    /// Always written (Argo writes `canary: {}` for every rollout).
    #[serde(default)]
    pub canary: CanaryStatus,
    /// Always written (Argo writes `blueGreen: {}` for every rollout).
    #[serde(default)]
    pub blue_green: BlueGreenStatus,
    /// Pods counted for the scale subresource (what an HPA reads).
    #[serde(default, rename = "HPAReplicas", skip_serializing_if = "is_zero")]
    pub hpa_replicas: i32,
    /// Label selector of the pods, serialised (`app=web`), for the scale subresource.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub selector: String,
    /// Pod-template hash of the stable ReplicaSet.
    #[serde(default, rename = "stableRS", skip_serializing_if = "String::is_empty")]
    pub stable_rs: String,
    /// Last time pods were restarted for `spec.restartAt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarted_at: Option<Time>,
    /// Skip the remaining steps and analyses and go to 100%.
    #[serde(default, skip_serializing_if = "is_false")]
    pub promote_full: bool,
    /// `Healthy`, `Progressing`, `Paused` or `Degraded`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub phase: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// `metadata.generation` of the `workloadRef` object last acted on.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub workload_observed_generation: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alb: Option<AlbStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub albs: Option<Vec<AlbStatus>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<RolloutDurationStatus>,
}

impl RolloutStatus {
    /// The condition of the given type, if present.
    pub fn condition(&self, type_: &str) -> Option<&RolloutCondition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

/// Why a rollout is paused, and since when.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PauseCondition {
    pub reason: String,
    pub start_time: Time,
}

/// One entry of `status.conditions`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutCondition {
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    pub last_update_time: Time,
    pub last_transition_time: Time,
    pub reason: String,
    pub message: String,
}

/// `status.canary`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_step_analysis_run_status: Option<RolloutAnalysisRunStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_background_analysis_run_status: Option<RolloutAnalysisRunStatus>,
    /// Name of the running Experiment.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub current_experiment: String,
    /// Weights the router was last set to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<TrafficWeights>,
    /// Which ping-pong service is stable: `ping` or `pong`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stable_ping_pong: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub step_plugin_statuses: Vec<StepPluginStatus>,
}

/// `ping` value of `status.canary.stablePingPong`.
pub const PING_PONG_PING: &str = "ping";
/// `pong` value of `status.canary.stablePingPong`.
pub const PING_PONG_PONG: &str = "pong";

/// The traffic split last applied.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrafficWeights {
    pub canary: WeightDestination,
    pub stable: WeightDestination,
    /// Experiment ReplicaSets that also receive traffic.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub additional: Vec<WeightDestination>,
    /// Whether the router confirmed the weight; absent when not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified: Option<bool>,
}

/// Where a share of the traffic goes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WeightDestination {
    /// Always written, `0` included.
    pub weight: i32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_template_hash: String,
}

/// Name and phase of an AnalysisRun the rollout is waiting on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutAnalysisRunStatus {
    pub name: String,
    /// The run's phase: `Pending`, `Running`, `Successful`, `Failed`, `Error`, `Inconclusive`.
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// `status.blueGreen`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlueGreenStatus {
    /// Pod-template hash the preview service selects.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub preview_selector: String,
    /// Pod-template hash the active service selects.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub active_selector: String,
    /// The preview ReplicaSet was scaled to full size before promotion.
    #[serde(default, skip_serializing_if = "is_false")]
    pub scale_up_preview_check_point: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_promotion_analysis_run_status: Option<RolloutAnalysisRunStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_promotion_analysis_run_status: Option<RolloutAnalysisRunStatus>,
}

/// State of one `plugin` step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepPluginStatus {
    pub index: i32,
    pub name: String,
    /// `Run` or `Terminate` / `Abort`.
    pub operation: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub phase: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub backoff: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub executions: i32,
    #[serde(default, skip_serializing_if = "is_false")]
    pub disabled: bool,
    /// Plugin-specific state, kept as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object_schema")]
    pub status: Option<Value>,
}

/// `status.alb` / `status.albs`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AlbStatus {
    #[serde(default)]
    pub load_balancer: AwsResourceRef,
    #[serde(default)]
    pub canary_target_group: AwsResourceRef,
    #[serde(default)]
    pub stable_target_group: AwsResourceRef,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ingress: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AwsResourceRef {
    pub name: String,
    pub arn: String,
    pub full_name: String,
}

/// `status.duration`: timing of the current update.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutDurationStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manual_pause_started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_manual_pause_duration_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// `Promoted`, `FastPromoted`, `Aborted`, `Superseded`, `RolledBack`, `FastRolledBack`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_status: Option<String>,
}
