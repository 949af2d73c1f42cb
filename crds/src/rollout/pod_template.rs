//! The Rollout's pod template, kept as the JSON the user wrote so that fields this build of
//! k8s-openapi does not know (newer Kubernetes versions) survive a read-modify-write.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `spec.template`: a `PodTemplateSpec` stored as raw JSON. Read it typed with
/// [`PodTemplate::to_spec`]; build one from a typed spec with [`PodTemplate::from_spec`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PodTemplate(pub Map<String, Value>);

impl PodTemplate {
    /// Wraps a typed pod template.
    pub fn from_spec(spec: &PodTemplateSpec) -> Self {
        match serde_json::to_value(spec) {
            Ok(Value::Object(map)) => Self(map),
            // A PodTemplateSpec always serialises to an object.
            _ => Self::default(),
        }
    }

    /// The template as k8s-openapi's `PodTemplateSpec` (unknown fields are dropped in the copy).
    pub fn to_spec(&self) -> Result<PodTemplateSpec, serde_json::Error> {
        serde_json::from_value(Value::Object(self.0.clone()))
    }

    /// `template.metadata.labels` (empty when absent or not a string map).
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.metadata_map("labels")
    }

    /// `template.metadata.annotations` (empty when absent or not a string map).
    pub fn annotations(&self) -> BTreeMap<String, String> {
        self.metadata_map("annotations")
    }

    /// Whether the template has neither labels nor annotations, which is how Argo tells a
    /// template left out for `workloadRef` from one written inline.
    pub fn is_empty_template(&self) -> bool {
        self.labels().is_empty() && self.annotations().is_empty()
    }

    fn metadata_map(&self, key: &str) -> BTreeMap<String, String> {
        self.0
            .get("metadata")
            .and_then(|m| m.get(key))
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl From<PodTemplateSpec> for PodTemplate {
    fn from(spec: PodTemplateSpec) -> Self {
        Self::from_spec(&spec)
    }
}

impl JsonSchema for PodTemplate {
    fn schema_name() -> Cow<'static, str> {
        "PodTemplate".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        preserve_unknown_object()
    }
}

/// An object schema whose content the API server keeps as written.
pub fn preserve_unknown_object() -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// `schema_with` form of [`preserve_unknown_object`].
pub fn preserve_unknown_object_schema(_: &mut SchemaGenerator) -> Schema {
    preserve_unknown_object()
}
