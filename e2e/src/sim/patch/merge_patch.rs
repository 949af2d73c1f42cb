//! RFC 7386 JSON merge patch (`application/merge-patch+json`): maps merge recursively, `null`
//! deletes, everything else (lists included) is replaced.

use serde_json::{Map, Value};

/// RFC 7386 JSON merge patch (`application/merge-patch+json`).
pub fn merge_patch(doc: &Value, patch: &Value) -> Value {
    let Value::Object(patch) = patch else {
        return patch.clone();
    };
    let mut out = match doc {
        Value::Object(d) => d.clone(),
        _ => Map::new(),
    };
    for (k, v) in patch {
        if v.is_null() {
            out.shift_remove(k);
        } else {
            let merged = merge_patch(out.get(k).unwrap_or(&Value::Null), v);
            out.insert(k.clone(), merged);
        }
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn merge_patch_rfc7386() {
        let doc = json!({"a": "b", "c": {"d": "e", "f": "g"}, "list": [1, 2]});
        let out = merge_patch(
            &doc,
            &json!({"a": "z", "c": {"f": null, "h": {"i": null, "j": 1}}, "list": [3]}),
        );
        assert_eq!(
            out,
            json!({"a": "z", "c": {"d": "e", "h": {"j": 1}}, "list": [3]})
        );
        assert_eq!(merge_patch(&json!({"a": 1}), &json!("x")), json!("x"));
        assert_eq!(merge_patch(&json!("x"), &json!({"a": 1})), json!({"a": 1}));
        // Key order is kept, so stored objects do not reshuffle on every patch.
        let keys: Vec<String> = merge_patch(
            &json!({"x": 1, "y": 2, "z": 3}),
            &json!({"x": 5, "y": null}),
        )
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
        assert_eq!(keys, ["x", "z"]);
    }
}
