//! The `/scale` subresource: the autoscaling/v1 Scale view of ReplicaSets, Deployments and
//! custom resources with a scale subresource, and writing a Scale back into its object.

use serde_json::{Value, json};

use super::meta::{get_path, meta_str, set_path};
use super::registry::ResourceInfo;
use super::status::{ApiError, ApiResult};

/// The autoscaling/v1 Scale view of an object.
pub fn scale_of(info: &ResourceInfo, obj: &Value) -> Value {
    let paths = info
        .scale
        .as_ref()
        .expect("scale requests are routed only to resources with a scale subresource");
    let selector = match &paths.label_selector {
        Some(path) => get_path(obj, path).cloned().unwrap_or_else(|| "".into()),
        None => selector_string(&obj["spec"]["selector"]).into(),
    };
    let m = &obj["metadata"];
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": m["name"], "namespace": m["namespace"], "uid": m["uid"],
            "resourceVersion": m["resourceVersion"], "creationTimestamp": m["creationTimestamp"],
        },
        "spec": {"replicas": get_path(obj, &paths.spec_replicas).cloned().unwrap_or_else(|| 0.into())},
        "status": {"replicas": get_path(obj, &paths.status_replicas).cloned().unwrap_or_else(|| 0.into()), "selector": selector},
    })
}

/// `{matchLabels, matchExpressions}` in the query-string form.
fn selector_string(selector: &Value) -> String {
    let mut parts: Vec<String> = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    for expr in selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let key = expr["key"].as_str().unwrap_or_default();
        let values: Vec<&str> = expr["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        parts.push(match expr["operator"].as_str().unwrap_or_default() {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "DoesNotExist" => format!("!{key}"),
            _ => key.to_string(),
        });
    }
    parts.join(",")
}

/// Writes a Scale's `spec.replicas` into the object; the Scale's resourceVersion is a precondition.
pub fn with_scale(info: &ResourceInfo, mut obj: Value, scale: &Value) -> ApiResult<Value> {
    let paths = info
        .scale
        .as_ref()
        .expect("scale requests are routed only to resources with a scale subresource");
    let replicas = scale["spec"]["replicas"].as_i64().ok_or_else(|| {
        ApiError::invalid(
            &info.group,
            &info.plural,
            meta_str(&obj, "name"),
            "spec.replicas: Required value: an integer",
        )
    })?;
    if replicas < 0 {
        return Err(ApiError::invalid(
            &info.group,
            &info.plural,
            meta_str(&obj, "name"),
            format!("spec.replicas: Invalid value: {replicas}: must be greater than or equal to 0"),
        ));
    }
    set_path(&mut obj, &paths.spec_replicas, replicas.into());
    if let Some(rv) = scale["metadata"]["resourceVersion"]
        .as_str()
        .filter(|r| !r.is_empty())
    {
        obj["metadata"]["resourceVersion"] = rv.into();
    }
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_render_in_query_form() {
        let selector = json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["a", "b"]},
                {"key": "legacy", "operator": "DoesNotExist"},
            ],
        });
        assert_eq!(selector_string(&selector), "app=web,tier in (a,b),!legacy");
    }
}
