//! Analysis kinds, field for field as Argo Rollouts defines them: `AnalysisTemplate`,
//! `ClusterAnalysisTemplate` and `AnalysisRun`, their metrics, providers, arguments and run
//! status, plus [`AnalysisPhase`] with Argo's ordering. Our additions are new optional fields:
//! `consecutiveFailureLimit` on a metric, `consecutiveFailure` in a metric result, and the
//! `judge` provider (kept as preserved JSON here; the analysis crate parses it).
//!
//! Providers this project does not run (kayenta, datadog, newRelic, wavefront, cloudWatch,
//! graphite, influxdb, skywalking, plugin) are kept as preserved JSON so manifests survive a
//! read-modify-write unchanged.

mod validation;

pub use validation::{
    NotAnInteger, arg_references, int_or_string_value, validate_cluster_template, validate_metrics,
    validate_run, validate_template, validate_template_spec,
};

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use kube::CustomResourceExt;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use crate::rollout::{
    AnalysisRunArgument, ArgumentValueFrom, DryRun, FieldRef, MeasurementRetention,
    RolloutAnalysisTemplate, SecretKeyRef,
};

/// The CRDs this module defines.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        AnalysisTemplate::crd(),
        ClusterAnalysisTemplate::crd(),
        AnalysisRun::crd(),
    ]
}

/// Schema of a field kept as arbitrary JSON: the API server must not prune what we do not model.
pub(crate) fn preserved_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// Schema of a field that may hold any JSON value (Argo's `json.RawMessage`).
pub(crate) fn preserved_any(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "x-kubernetes-preserve-unknown-fields": true
    })
}

fn is_false(value: &bool) -> bool {
    !*value
}

fn is_zero(value: &i32) -> bool {
    *value == 0
}

/// The template for performing analysis (namespaced).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "argoproj.io",
    version = "v1alpha1",
    kind = "AnalysisTemplate",
    plural = "analysistemplates",
    shortname = "at",
    namespaced,
    derive = "PartialEq",
    derive = "Default",
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time since resource was created"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct AnalysisTemplateSpec {
    /// Metrics to query as part of an analysis run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<Metric>,
    /// Arguments to the template.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<AnalysisRunArgument>,
    /// Metrics (by regular expression on the name) to run in dry-run mode.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dry_run: Vec<DryRun>,
    /// How many measurements to keep per metric.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measurement_retention: Vec<MeasurementRetention>,
    /// Other templates whose metrics are combined with these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub templates: Vec<RolloutAnalysisTemplate>,
}

/// The template for performing analysis, usable from any namespace (cluster-scoped). Its spec
/// is an [`AnalysisTemplateSpec`].
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "argoproj.io",
    version = "v1alpha1",
    kind = "ClusterAnalysisTemplate",
    plural = "clusteranalysistemplates",
    shortname = "cat",
    derive = "PartialEq",
    derive = "Default",
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time since resource was created"
    )
)]
#[serde(transparent)]
pub struct ClusterAnalysisTemplateSpec(pub AnalysisTemplateSpec);

impl std::ops::Deref for ClusterAnalysisTemplateSpec {
    type Target = AnalysisTemplateSpec;
    fn deref(&self) -> &AnalysisTemplateSpec {
        &self.0
    }
}

impl std::ops::DerefMut for ClusterAnalysisTemplateSpec {
    fn deref_mut(&mut self) -> &mut AnalysisTemplateSpec {
        &mut self.0
    }
}

/// An instantiation of one or more analysis templates.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "argoproj.io",
    version = "v1alpha1",
    kind = "AnalysisRun",
    plural = "analysisruns",
    shortname = "ar",
    namespaced,
    status = "AnalysisRunStatus",
    derive = "PartialEq",
    derive = "Default",
    printcolumn(
        name = "Status",
        type_ = "string",
        json_path = ".status.phase",
        description = "AnalysisRun status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time since resource was created"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct AnalysisRunSpec {
    /// Metrics to query as part of this run.
    #[serde(default)]
    pub metrics: Vec<Metric>,
    /// Arguments used in this run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<AnalysisRunArgument>,
    /// Stops the run early (for example the rollout completed and analysis is no longer wanted).
    #[serde(default, skip_serializing_if = "is_false")]
    pub terminate: bool,
    /// Metrics (by regular expression on the name) to run in dry-run mode.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dry_run: Vec<DryRun>,
    /// How many measurements to keep per metric.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measurement_retention: Vec<MeasurementRetention>,
    /// How long a completed run is kept before it is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_strategy: Option<TtlStrategy>,
}

/// One metric: what to measure, how often, and how to judge each measurement.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Metric {
    /// Name of the metric, unique within the run.
    pub name: String,
    /// Time between measurements (Go duration, e.g. `30s`). Absent: a single measurement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    /// How long to wait after the run starts before the first measurement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_delay: Option<String>,
    /// Number of measurements. Absent with no interval: 1; absent with an interval: unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<IntOrString>,
    /// Expression over `result` that makes a measurement Successful.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_condition: Option<String>,
    /// Expression over `result` that makes a measurement Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_condition: Option<String>,
    /// Failed measurements allowed before the metric fails (default 0; -1 disables).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_limit: Option<IntOrString>,
    /// Inconclusive measurements allowed before the metric is Inconclusive (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inconclusive_limit: Option<IntOrString>,
    /// Errors in a row allowed before the metric is Error (default 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_error_limit: Option<IntOrString>,
    /// Successes in a row that make the metric Successful (default 0: disabled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_success_limit: Option<IntOrString>,
    /// Our addition: failures in a row that fail the metric (default 0: disabled). A success
    /// or an inconclusive measurement resets the run of failures; an error leaves it as is.
    /// With this set and `failureLimit` left out, failures count only in a row (failureLimit
    /// is taken as -1 rather than Argo's default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_failure_limit: Option<IntOrString>,
    /// The external system that takes the measurement.
    #[serde(default)]
    pub provider: MetricProvider,
}

impl Metric {
    /// Argo's effective count: 1 when neither count nor interval is set, unbounded (`None`) when
    /// only the interval is set, otherwise the count. A count that is not a number counts as 0.
    pub fn effective_count(&self) -> Option<i64> {
        let count = self
            .count
            .as_ref()
            .map(|c| int_or_string_value(c).unwrap_or(0))
            .unwrap_or(0);
        if count == 0 {
            if self.interval.as_deref().unwrap_or("").is_empty() {
                return Some(1);
            }
            return None;
        }
        Some(count)
    }
}

/// Which external system measures a metric. Exactly one field is set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricProvider {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusMetric>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object")]
    pub kayenta: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web: Option<WebMetric>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object")]
    pub datadog: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object")]
    pub wavefront: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object")]
    pub new_relic: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobMetric>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object")]
    pub cloud_watch: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object")]
    pub graphite: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object")]
    pub influxdb: Option<Value>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "skywalking"
    )]
    #[schemars(schema_with = "preserved_object")]
    pub skywalking: Option<Value>,
    /// Plugin providers by plugin name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object")]
    pub plugin: Option<Value>,
    /// Our addition: the baseline judge (canary against stable in the same window). Its
    /// configuration is parsed by the analysis crate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object")]
    pub judge: Option<Value>,
}

impl MetricProvider {
    /// Names of the providers that are set, in the order Argo lists them. Each plugin entry
    /// counts as one provider, as Argo counts them.
    pub fn configured(&self) -> Vec<String> {
        let mut names: Vec<String> = [
            ("prometheus", self.prometheus.is_some()),
            ("kayenta", self.kayenta.is_some()),
            ("web", self.web.is_some()),
            ("datadog", self.datadog.is_some()),
            ("wavefront", self.wavefront.is_some()),
            ("newRelic", self.new_relic.is_some()),
            ("job", self.job.is_some()),
            ("cloudWatch", self.cloud_watch.is_some()),
            ("graphite", self.graphite.is_some()),
            ("influxdb", self.influxdb.is_some()),
            ("skywalking", self.skywalking.is_some()),
            ("judge", self.judge.is_some()),
        ]
        .into_iter()
        .filter(|(_, set)| *set)
        .map(|(name, _)| name.to_string())
        .collect();
        if let Some(Value::Object(plugins)) = &self.plugin {
            names.extend(plugins.keys().map(|k| format!("plugin.{k}")));
        }
        names
    }
}

/// A Prometheus query.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusMetric {
    /// HTTP address of the Prometheus server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// PromQL query.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authentication: Option<Authentication>,
    /// Query timeout in seconds (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
    /// Skip TLS verification of the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure: Option<bool>,
    /// Extra HTTP headers sent with the query.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<WebMetricHeader>,
    /// Makes this a range query.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range_query: Option<PrometheusRangeQueryArgs>,
}

/// Range of a Prometheus range query; start and end are expressions such as
/// `now() - duration("5m")`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusRangeQueryArgs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
    /// Resolution step (Go duration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

/// How to authenticate to a metric provider.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Authentication {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sigv4: Option<Sigv4Config>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauth2: Option<OAuth2Config>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic_auth: Option<BasicAuthConfig>,
}

/// AWS SigV4 signing (Amazon Managed Prometheus).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Sigv4Config {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "roleArn")]
    pub role_arn: Option<String>,
}

/// OAuth2 client credentials.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OAuth2Config {
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "tokenUrl")]
    pub token_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
}

/// HTTP basic authentication.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BasicAuthConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

/// A generic HTTP metric.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebMetric {
    /// GET (default), POST or PUT.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    pub url: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<WebMetricHeader>,
    /// Request body (POST/PUT only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// Request timeout in seconds (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i64>,
    /// JSONPath of the value bound to `result` (default `{$}`).
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "jsonPath")]
    pub json_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure: Option<bool>,
    /// Request body as JSON (POST/PUT only).
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "jsonBody")]
    #[schemars(schema_with = "preserved_any")]
    pub json_body: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authentication: Option<Authentication>,
}

/// One HTTP header.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct WebMetricHeader {
    pub key: String,
    pub value: String,
}

/// A Kubernetes Job whose success or failure is the measurement.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct JobMetric {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMeta>,
    /// A `batch/v1` JobSpec, kept as written.
    #[serde(default)]
    #[schemars(schema_with = "preserved_object")]
    pub spec: Value,
}

/// Time to live of a completed run.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TtlStrategy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds_after_completion: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds_after_failure: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds_after_success: Option<i32>,
}

/// Phase of an AnalysisRun, a metric result or a measurement.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum AnalysisPhase {
    #[default]
    Pending,
    Running,
    Successful,
    Failed,
    Error,
    Inconclusive,
}

impl AnalysisPhase {
    /// Every phase, best to worst in Argo's order.
    pub const BEST_TO_WORST: [AnalysisPhase; 6] = [
        AnalysisPhase::Successful,
        AnalysisPhase::Running,
        AnalysisPhase::Pending,
        AnalysisPhase::Inconclusive,
        AnalysisPhase::Error,
        AnalysisPhase::Failed,
    ];

    /// Whether the phase is final (Successful, Failed, Error, Inconclusive).
    pub fn is_completed(self) -> bool {
        matches!(
            self,
            AnalysisPhase::Successful
                | AnalysisPhase::Failed
                | AnalysisPhase::Error
                | AnalysisPhase::Inconclusive
        )
    }

    /// Position in Argo's order Successful < Running < Pending < Inconclusive < Error < Failed.
    pub fn severity(self) -> usize {
        match self {
            AnalysisPhase::Successful => 0,
            AnalysisPhase::Running => 1,
            AnalysisPhase::Pending => 2,
            AnalysisPhase::Inconclusive => 3,
            AnalysisPhase::Error => 4,
            AnalysisPhase::Failed => 5,
        }
    }

    /// Whether `self` is a worse outcome than `other`.
    pub fn is_worse_than(self, other: AnalysisPhase) -> bool {
        self.severity() > other.severity()
    }

    /// The worse of the two phases.
    pub fn worst(self, other: AnalysisPhase) -> AnalysisPhase {
        if other.is_worse_than(self) {
            other
        } else {
            self
        }
    }

    /// The phase as Argo spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            AnalysisPhase::Pending => "Pending",
            AnalysisPhase::Running => "Running",
            AnalysisPhase::Successful => "Successful",
            AnalysisPhase::Failed => "Failed",
            AnalysisPhase::Error => "Error",
            AnalysisPhase::Inconclusive => "Inconclusive",
        }
    }
}

impl fmt::Display for AnalysisPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Status of an AnalysisRun.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AnalysisRunStatus {
    /// Phase of the run.
    #[serde(default)]
    pub phase: AnalysisPhase,
    /// Why the run is in this phase.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Per metric results.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metric_results: Vec<MetricResult>,
    /// When the run started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// Counts of metrics by outcome (dry-run metrics excluded).
    #[serde(default)]
    pub run_summary: RunSummary,
    /// Counts of dry-run metrics by outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run_summary: Option<RunSummary>,
    /// When the run completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
}

/// Counts of metrics by outcome.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunSummary {
    /// Number of metrics.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub count: i32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub successful: i32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failed: i32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub inconclusive: i32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub error: i32,
}

/// The recent measurements of one metric and counters of their outcomes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricResult {
    pub name: String,
    pub phase: AnalysisPhase,
    /// Most recent measurements (trimmed to the retention limit).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measurements: Vec<Measurement>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Measurements without error: successful + failed + inconclusive.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub count: i32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub successful: i32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failed: i32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub inconclusive: i32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub error: i32,
    /// Errors in a row; reset by any other outcome.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub consecutive_error: i32,
    #[serde(default, skip_serializing_if = "is_false")]
    pub dry_run: bool,
    /// Provider data, e.g. the resolved Prometheus query.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// Successes in a row; reset by any other outcome.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub consecutive_success: i32,
    /// Our addition: failures in a row; reset by a success or inconclusive measurement.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub consecutive_failure: i32,
}

/// One measurement of a metric.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Measurement {
    pub phase: AnalysisPhase,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// The measured value as text (`[0.99]` for a Prometheus vector).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// When to resume an in-flight measurement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_at: Option<Time>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_order_as_argo() {
        use AnalysisPhase::*;
        let order = AnalysisPhase::BEST_TO_WORST;
        for pair in order.windows(2) {
            assert!(pair[1].is_worse_than(pair[0]), "{} vs {}", pair[1], pair[0]);
            assert_eq!(pair[0].worst(pair[1]), pair[1]);
            assert_eq!(pair[1].worst(pair[0]), pair[1]);
        }
        assert_eq!(Failed.worst(Failed), Failed);
        assert!(!Successful.is_worse_than(Successful));
    }

    #[test]
    fn completed_phases() {
        use AnalysisPhase::*;
        let completed: Vec<_> = AnalysisPhase::BEST_TO_WORST
            .into_iter()
            .filter(|p| p.is_completed())
            .collect();
        assert_eq!(completed, [Successful, Inconclusive, Error, Failed]);
    }

    #[test]
    fn phases_serialise_as_argo_spells_them() {
        for phase in AnalysisPhase::BEST_TO_WORST {
            assert_eq!(
                serde_json::to_value(phase).ok(),
                Some(Value::String(phase.as_str().to_string()))
            );
        }
    }

    #[test]
    fn cluster_template_spec_reads_like_a_template_spec() {
        let cat: ClusterAnalysisTemplate = serde_json::from_value(serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "ClusterAnalysisTemplate",
            "metadata": {"name": "c"},
            "spec": {"metrics": [{"name": "m", "provider": {"web": {"url": "http://x"}}}]}
        }))
        .expect("parses");
        assert_eq!(cat.spec.metrics[0].name, "m");
    }
}
