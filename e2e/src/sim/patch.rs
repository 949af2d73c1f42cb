//! Patches as the API server applies them. (Interface fixed; bodies being written.)

use serde_json::Value;

/// Why a patch was refused; the server maps each to a Kubernetes `Status`.
#[derive(Debug, Clone, PartialEq)]
pub enum PatchError {
    /// Malformed patch document: 400 BadRequest.
    BadRequest(String),
    /// Server-side apply field conflict without `force`: 409 Conflict.
    Conflict(String),
    /// The patched object is not acceptable (e.g. a JSON patch `test` failed): 422 Invalid.
    Invalid(String),
}

/// RFC 6902 JSON patch (`application/json-patch+json`).
pub fn json_patch(_doc: &Value, _ops: &Value) -> Result<Value, PatchError> {
    Err(PatchError::BadRequest("json patch: not written yet".into()))
}

/// RFC 7386 JSON merge patch (`application/merge-patch+json`).
pub fn merge_patch(doc: &Value, patch: &Value) -> Value {
    match (doc, patch) {
        (Value::Object(d), Value::Object(p)) => {
            let mut out = d.clone();
            for (k, v) in p {
                if v.is_null() {
                    out.remove(k);
                } else {
                    let merged = merge_patch(out.get(k).unwrap_or(&Value::Null), v);
                    out.insert(k.clone(), merged);
                }
            }
            Value::Object(out)
        }
        (_, Value::Object(p)) => merge_patch(
            &Value::Object(Default::default()),
            &Value::Object(p.clone()),
        ),
        (_, p) => p.clone(),
    }
}

/// Strategic merge patch (`application/strategic-merge-patch+json`) for built-in kinds.
pub fn strategic_merge_patch(doc: &Value, patch: &Value) -> Result<Value, PatchError> {
    Ok(merge_patch(doc, patch))
}

/// Server-side apply (`application/apply-patch+yaml`): create when `live` is None, else deep
/// merge `applied` into `live`, recording `manager` in `metadata.managedFields` (`now` is the
/// RFC 3339 time for the entry).
pub fn server_side_apply(
    live: Option<&Value>,
    applied: &Value,
    _manager: &str,
    _force: bool,
    _now: &str,
) -> Result<Value, PatchError> {
    Ok(match live {
        Some(l) => merge_patch(l, applied),
        None => applied.clone(),
    })
}
