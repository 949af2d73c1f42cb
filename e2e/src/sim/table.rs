//! Server-side `Table` responses for `kubectl get`. (Interface fixed; bodies being written.)

use std::time::SystemTime;

use serde_json::{Value, json};

/// One `additionalPrinterColumns` entry of a CRD version.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PrinterColumn {
    pub name: String,
    pub type_: String,
    pub format: String,
    pub description: String,
    pub priority: i64,
    pub json_path: String,
}

impl PrinterColumn {
    /// Columns from a CRD version's `additionalPrinterColumns` array.
    pub fn from_crd(columns: &Value) -> Vec<Self> {
        columns
            .as_array()
            .map(|cols| {
                cols.iter()
                    .map(|c| Self {
                        name: c["name"].as_str().unwrap_or_default().to_string(),
                        type_: c["type"].as_str().unwrap_or("string").to_string(),
                        json_path: c["jsonPath"].as_str().unwrap_or_default().to_string(),
                        ..Default::default()
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A `meta.k8s.io/v1` Table for `objects` of resource `plural` in `group` (`""` for core).
/// `crd_columns` are the CRD's printer columns when the resource is a custom resource.
pub fn table(
    _plural: &str,
    _group: &str,
    _crd_columns: Option<&[PrinterColumn]>,
    objects: &[Value],
    resource_version: &str,
    _now: SystemTime,
) -> Value {
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| json!({"cells": [o["metadata"]["name"]], "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}}))
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [{"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0}],
        "rows": rows,
    })
}
