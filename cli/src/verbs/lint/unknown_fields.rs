//! Fields the API does not define, found by walking a document beside a schema: the CRD's
//! `openAPIV3Schema` for the object, and Kubernetes' `PodTemplateSpec` for a Rollout's template
//! (which the CRD keeps as free-form JSON). The API server drops such fields silently.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::Value;

use super::{Finding, Severity};

/// Every field under `spec` of `document` that `crd_schema` (an `openAPIV3Schema`) does not
/// define; each one is an error.
pub fn unknown_spec_fields(document: &Value, crd_schema: &Value) -> Vec<Finding> {
    let mut walker = Walker {
        root: crd_schema,
        severity: Severity::Error,
        what: "the API server would drop it".to_string(),
        findings: Vec::new(),
    };
    if let (Some(spec), Some(spec_schema)) =
        (document.get("spec"), crd_schema.pointer("/properties/spec"))
    {
        walker.walk(spec, spec_schema, "spec");
    }
    walker.findings
}

/// Every field of a Rollout's `spec.template` that Kubernetes' `PodTemplateSpec` does not
/// define. Warnings, because a newer Kubernetes than the one this build knows may define it.
pub fn unknown_template_fields(document: &Value, pod_template_schema: &Value) -> Vec<Finding> {
    let mut walker = Walker {
        root: pod_template_schema,
        severity: Severity::Warning,
        what: format!(
            "not a field of a pod template in Kubernetes {}",
            KUBERNETES_VERSION
        ),
        findings: Vec::new(),
    };
    if let Some(template) = document.pointer("/spec/template") {
        walker.walk(template, pod_template_schema, "spec.template");
    }
    walker.findings
}

/// The Kubernetes version whose API this build's k8s-openapi describes.
const KUBERNETES_VERSION: &str = "1.32";

/// Kubernetes' `PodTemplateSpec` schema as JSON, with its definitions under `$defs`.
pub fn pod_template_schema() -> Value {
    serde_json::to_value(schemars::schema_for!(PodTemplateSpec)).unwrap_or(Value::Null)
}

struct Walker<'a> {
    /// The schema `$ref`s resolve against.
    root: &'a Value,
    severity: Severity,
    /// Why an unknown field matters, for the finding's reason.
    what: String,
    findings: Vec<Finding>,
}

impl<'a> Walker<'a> {
    fn walk(&mut self, value: &Value, schema: &Value, path: &str) {
        let schema = self.resolve(schema);
        if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
            return;
        }
        match value {
            Value::Object(fields) => {
                if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
                    for (key, field) in fields {
                        let field_path = format!("{path}.{key}");
                        match properties.get(key) {
                            Some(field_schema) => self.walk(field, field_schema, &field_path),
                            None => {
                                let finding = self.unknown(key, &field_path, properties.keys());
                                self.findings.push(finding);
                            }
                        }
                    }
                } else if let Some(values) =
                    schema.get("additionalProperties").filter(|s| s.is_object())
                {
                    for (key, field) in fields {
                        self.walk(field, values, &format!("{path}.{key}"));
                    }
                }
            }
            Value::Array(items) => {
                if let Some(item_schema) = schema.get("items") {
                    for (index, item) in items.iter().enumerate() {
                        self.walk(item, item_schema, &format!("{path}[{index}]"));
                    }
                }
            }
            _ => {}
        }
    }

    /// Follows a local `$ref` (`#/$defs/Name`); anything else is the schema itself.
    fn resolve<'s>(&self, schema: &'s Value) -> &'s Value
    where
        'a: 's,
    {
        let Some(reference) = schema.get("$ref").and_then(Value::as_str) else {
            return schema;
        };
        reference
            .strip_prefix("#/$defs/")
            .and_then(|name| self.root.get("$defs")?.get(name))
            .unwrap_or(schema)
    }

    fn unknown<'k>(
        &self,
        key: &str,
        path: &str,
        known: impl Iterator<Item = &'k String>,
    ) -> Finding {
        let closest = known
            .map(|name| (edit_distance(key, name), name))
            .filter(|(distance, name)| *distance <= 2.max(name.len() / 4))
            .min();
        let fix = match closest {
            Some((_, name)) => format!("did you mean {name:?}? Rename or remove the field"),
            None => "remove the field, or check the spelling against the API reference".to_string(),
        };
        Finding::new(
            self.severity,
            path,
            format!("unknown field {key:?}: {}", self.what),
            fix,
        )
    }
}

/// Levenshtein distance, case-insensitive (a wrong capital is the commonest typo).
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.to_lowercase().chars().collect();
    let b: Vec<char> = b.to_lowercase().chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != cb);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schema() -> Value {
        json!({"properties": {"spec": {"properties": {
            "replicas": {"type": "integer"},
            "strategy": {"properties": {"canary": {"properties": {
                "steps": {"items": {"properties": {"setWeight": {"type": "integer"}}}}
            }}}},
            "template": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "labels": {"additionalProperties": {"type": "string"}}
        }}}})
    }

    #[test]
    fn unknown_keys_are_reported_with_their_path_and_closest_name() {
        let document = json!({"spec": {
            "replica": 3,
            "strategy": {"canary": {"steps": [{"setWeight": 5}, {"setweigth": 10}]}},
            "template": {"anything": {"goes": true}},
            "labels": {"free": "form"},
            "zzzzzzzz": 1
        }});
        let findings = unknown_spec_fields(&document, &schema());
        let lines: Vec<String> = findings
            .iter()
            .map(|f| format!("{}: {}", f.path, f.fix))
            .collect();
        assert_eq!(
            lines,
            vec![
                "spec.replica: did you mean \"replicas\"? Rename or remove the field",
                "spec.strategy.canary.steps[1].setweigth: did you mean \"setWeight\"? Rename or remove the field",
                "spec.zzzzzzzz: remove the field, or check the spelling against the API reference",
            ]
        );
        assert!(findings.iter().all(|f| f.severity == Severity::Error));
    }

    #[test]
    fn template_fields_are_checked_against_kubernetes_through_refs() {
        let document = json!({"spec": {"template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{
                "name": "web",
                "image": "web:1",
                "imagePulPolicy": "Always",
                "ports": [{"containerPort": 80, "protocl": "TCP"}],
                "resources": {"limits": {"cpu": "1"}}
            }]}
        }}});
        let findings = unknown_template_fields(&document, &pod_template_schema());
        let lines: Vec<String> = findings
            .iter()
            .map(|f| format!("{}: {}", f.path, f.fix))
            .collect();
        assert_eq!(
            lines,
            vec![
                "spec.template.spec.containers[0].imagePulPolicy: did you mean \"imagePullPolicy\"? Rename or remove the field",
                "spec.template.spec.containers[0].ports[0].protocl: did you mean \"protocol\"? Rename or remove the field",
            ]
        );
        assert!(findings.iter().all(|f| f.severity == Severity::Warning));
        assert!(findings[0].reason.contains("Kubernetes 1.32"));
    }

    #[test]
    fn edit_distance_counts_single_edits() {
        assert_eq!(edit_distance("steps", "steps"), 0);
        assert_eq!(edit_distance("step", "steps"), 1);
        assert_eq!(edit_distance("setweigth", "setWeight"), 2);
    }
}
