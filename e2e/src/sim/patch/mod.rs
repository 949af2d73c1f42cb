//! Patches as the API server applies them. This module owns what the four algorithms share, the
//! [`PatchError`] a refused patch becomes and JSON equality by value, and re-exports their entry
//! points: RFC 6902 JSON patch, RFC 7386 merge patch, strategic merge patch for built-in kinds,
//! and server-side apply with field ownership in `metadata.managedFields`.

mod json_patch;
mod merge_patch;
mod schema;
mod server_side_apply;
mod strategic_merge;

pub use json_patch::json_patch;
pub use merge_patch::merge_patch;
pub use schema::{ListMerge, list_merge};
pub use server_side_apply::{
    record_subresource_update, record_update, server_side_apply, server_side_apply_subresource,
};
pub use strategic_merge::strategic_merge_patch;

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

impl std::fmt::Display for PatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PatchError::BadRequest(m) | PatchError::Conflict(m) | PatchError::Invalid(m) => {
                f.write_str(m)
            }
        }
    }
}

impl std::error::Error for PatchError {}

fn bad_request(message: impl Into<String>) -> PatchError {
    PatchError::BadRequest(message.into())
}

/// JSON equality where numbers compare by value (`1` equals `1.0`), as RFC 6902 `test` requires.
fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            x == y || matches!((x.as_f64(), y.as_f64()), (Some(p), Some(q)) if p == q)
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_equal(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_equal(v, w)))
        }
        _ => a == b,
    }
}

/// Helpers the algorithms' tests share.
#[cfg(test)]
mod test_support {
    use serde_json::Value;

    use super::PatchError;

    const KUBECTL_APPLY: &str =
        include_str!("../../../tests/fixtures/patch/kubectl-1.32-apply-deployment.json");

    pub(super) fn bad(r: Result<Value, PatchError>) -> String {
        match r {
            Err(PatchError::BadRequest(m)) => m,
            other => panic!("expected BadRequest, got {other:?}"),
        }
    }

    /// Request bodies the real kubectl sent for client- and server-side apply (see `source`).
    pub(super) fn kubectl_apply_fixture() -> Value {
        serde_json::from_str(KUBECTL_APPLY).expect("the fixture is JSON")
    }
}
