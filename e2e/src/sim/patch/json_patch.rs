//! RFC 6902 JSON patch (`application/json-patch+json`): the operation list and the JSON pointers
//! (RFC 6901) it addresses, applied to a copy so a failed operation leaves the object untouched.

use serde_json::Value;

use super::{PatchError, bad_request, json_equal};

/// RFC 6902 JSON patch (`application/json-patch+json`).
pub fn json_patch(doc: &Value, ops: &Value) -> Result<Value, PatchError> {
    let ops = ops.as_array().ok_or_else(|| {
        bad_request("json patch must be a JSON list of operations like [{\"op\":\"replace\",\"path\":\"/spec/replicas\",\"value\":3}]")
    })?;
    let mut doc = doc.clone();
    for (index, op) in ops.iter().enumerate() {
        apply_json_patch_op(&mut doc, index, op)?;
    }
    Ok(doc)
}

fn apply_json_patch_op(doc: &mut Value, index: usize, op: &Value) -> Result<(), PatchError> {
    let at = format!("json patch operation {index}");
    let op = op
        .as_object()
        .ok_or_else(|| bad_request(format!("{at}: must be an object, got {op}")))?;
    let name = op.get("op").and_then(Value::as_str).ok_or_else(|| {
        bad_request(format!(
            "{at}: \"op\" must be one of add, remove, replace, move, copy, test"
        ))
    })?;
    let path_text = op.get("path").and_then(Value::as_str).ok_or_else(|| {
        bad_request(format!(
            "{at} ({name}): \"path\" must be a JSON pointer string"
        ))
    })?;
    let at = format!("{at} ({name} {path_text})");
    let path = parse_pointer(path_text).map_err(|e| bad_request(format!("{at}: {e}")))?;
    let value = || {
        op.get("value")
            .cloned()
            .ok_or_else(|| bad_request(format!("{at}: \"value\" is required")))
    };
    let from = || -> Result<(String, Vec<String>), PatchError> {
        let text = op
            .get("from")
            .and_then(Value::as_str)
            .ok_or_else(|| bad_request(format!("{at}: \"from\" must be a JSON pointer string")))?;
        let tokens = parse_pointer(text).map_err(|e| bad_request(format!("{at}: from: {e}")))?;
        Ok((text.to_string(), tokens))
    };
    let invalid = |e: String| PatchError::Invalid(format!("{at}: {e}"));
    match name {
        "add" => pointer_add(doc, &path, value()?).map_err(invalid),
        "remove" => pointer_remove(doc, &path).map(drop).map_err(invalid),
        "replace" => {
            let value = value()?;
            let target = pointer_get_mut(doc, &path).ok_or_else(|| {
                invalid("path does not exist; use op \"add\" to create it".to_string())
            })?;
            *target = value;
            Ok(())
        }
        "move" => {
            let (from_text, from) = from()?;
            if from == path {
                return Ok(());
            }
            if path.len() > from.len() && path[..from.len()] == from[..] {
                return Err(invalid(format!(
                    "cannot move {from_text:?} into one of its own children"
                )));
            }
            let moved = pointer_remove(doc, &from).map_err(|e| invalid(format!("from: {e}")))?;
            pointer_add(doc, &path, moved).map_err(invalid)
        }
        "copy" => {
            let (_, from) = from()?;
            let copied = pointer_get(doc, &from)
                .cloned()
                .ok_or_else(|| invalid("from: path does not exist".to_string()))?;
            pointer_add(doc, &path, copied).map_err(invalid)
        }
        "test" => {
            let expected = value()?;
            match pointer_get(doc, &path) {
                Some(actual) if json_equal(actual, &expected) => Ok(()),
                Some(actual) => Err(invalid(format!(
                    "test failed: the value is {actual}, not {expected}"
                ))),
                None => Err(invalid("test failed: path does not exist".to_string())),
            }
        }
        other => Err(bad_request(format!(
            "{at}: unknown op {other:?}; use add, remove, replace, move, copy or test"
        ))),
    }
}

/// Splits a JSON pointer into unescaped reference tokens (`~1` is `/`, `~0` is `~`).
fn parse_pointer(pointer: &str) -> Result<Vec<String>, String> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err(format!("JSON pointer {pointer:?} must start with '/'"));
    };
    rest.split('/')
        .map(|token| {
            let mut out = String::with_capacity(token.len());
            let mut chars = token.chars();
            while let Some(c) = chars.next() {
                if c != '~' {
                    out.push(c);
                    continue;
                }
                match chars.next() {
                    Some('0') => out.push('~'),
                    Some('1') => out.push('/'),
                    _ => {
                        return Err(format!(
                            "JSON pointer {pointer:?}: '~' must be followed by 0 or 1"
                        ));
                    }
                }
            }
            Ok(out)
        })
        .collect()
}

/// An array index token: digits without leading zeros.
fn array_index(token: &str) -> Option<usize> {
    let well_formed = !token.is_empty()
        && token.bytes().all(|b| b.is_ascii_digit())
        && (token == "0" || !token.starts_with('0'));
    if well_formed {
        token.parse().ok()
    } else {
        None
    }
}

fn pointer_get<'a>(doc: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(doc, |cur, token| match cur {
        Value::Object(m) => m.get(token),
        Value::Array(a) => array_index(token).and_then(|i| a.get(i)),
        _ => None,
    })
}

fn pointer_get_mut<'a>(doc: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter().try_fold(doc, |cur, token| match cur {
        Value::Object(m) => m.get_mut(token),
        Value::Array(a) => array_index(token).and_then(|i| a.get_mut(i)),
        _ => None,
    })
}

fn pointer_add(doc: &mut Value, path: &[String], value: Value) -> Result<(), String> {
    let Some((last, parent_path)) = path.split_last() else {
        *doc = value;
        return Ok(());
    };
    let parent = pointer_get_mut(doc, parent_path)
        .ok_or_else(|| "the parent of the path does not exist".to_string())?;
    match parent {
        Value::Object(m) => {
            m.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(a) if last == "-" => {
            a.push(value);
            Ok(())
        }
        Value::Array(a) => match array_index(last) {
            Some(i) if i <= a.len() => {
                a.insert(i, value);
                Ok(())
            }
            _ => Err(format!(
                "index {last:?} is out of range for a list of {} items",
                a.len()
            )),
        },
        _ => Err("the parent of the path is neither an object nor a list".to_string()),
    }
}

fn pointer_remove(doc: &mut Value, path: &[String]) -> Result<Value, String> {
    let Some((last, parent_path)) = path.split_last() else {
        return Err("cannot remove the whole object".to_string());
    };
    let missing = || "path does not exist".to_string();
    match pointer_get_mut(doc, parent_path).ok_or_else(missing)? {
        Value::Object(m) => m.shift_remove(last).ok_or_else(missing),
        Value::Array(a) => match array_index(last) {
            Some(i) if i < a.len() => Ok(a.remove(i)),
            _ => Err(missing()),
        },
        _ => Err(missing()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::sim::patch::test_support::bad;

    fn invalid(r: Result<Value, PatchError>) -> String {
        match r {
            Err(PatchError::Invalid(m)) => m,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn json_patch_add_replace_remove() {
        let doc = json!({"spec": {"replicas": 1, "tags": ["a", "b"]}});
        let out = json_patch(
            &doc,
            &json!([
                {"op": "replace", "path": "/spec/replicas", "value": 3},
                {"op": "add", "path": "/spec/paused", "value": true},
                {"op": "add", "path": "/spec/tags/1", "value": "x"},
                {"op": "add", "path": "/spec/tags/-", "value": "z"},
                {"op": "remove", "path": "/spec/tags/0"},
            ]),
        )
        .unwrap();
        assert_eq!(
            out,
            json!({"spec": {"replicas": 3, "tags": ["x", "b", "z"], "paused": true}})
        );
    }

    #[test]
    fn json_patch_add_replaces_an_existing_member_and_the_root() {
        let doc = json!({"a": 1});
        assert_eq!(
            json_patch(&doc, &json!([{"op": "add", "path": "/a", "value": 2}])).unwrap(),
            json!({"a": 2})
        );
        assert_eq!(
            json_patch(&doc, &json!([{"op": "add", "path": "", "value": {"b": 1}}])).unwrap(),
            json!({"b": 1})
        );
        assert_eq!(
            json_patch(&doc, &json!([{"op": "add", "path": "/n", "value": null}])).unwrap(),
            json!({"a": 1, "n": null})
        );
    }

    #[test]
    fn json_patch_pointer_escaping() {
        let doc = json!({"metadata": {"annotations": {"rollouts.dev/step": "1", "a~b": "x"}}});
        let out = json_patch(
            &doc,
            &json!([
                {"op": "replace", "path": "/metadata/annotations/rollouts.dev~1step", "value": "2"},
                {"op": "remove", "path": "/metadata/annotations/a~0b"},
                {"op": "add", "path": "/metadata/annotations/x~1y~0z", "value": "3"},
            ]),
        )
        .unwrap();
        assert_eq!(
            out,
            json!({"metadata": {"annotations": {"rollouts.dev/step": "2", "x/y~z": "3"}}})
        );
    }

    #[test]
    fn json_patch_move_and_copy() {
        let doc = json!({"a": {"b": 1}, "list": [1, 2, 3]});
        let out = json_patch(
            &doc,
            &json!([
                {"op": "copy", "from": "/a/b", "path": "/c"},
                {"op": "move", "from": "/a", "path": "/moved"},
                {"op": "move", "from": "/list/0", "path": "/list/-"},
            ]),
        )
        .unwrap();
        assert_eq!(out, json!({"list": [2, 3, 1], "c": 1, "moved": {"b": 1}}));
        let err = invalid(json_patch(
            &doc,
            &json!([{"op": "move", "from": "/a", "path": "/a/b/c"}]),
        ));
        assert!(err.contains("own children"), "{err}");
        assert_eq!(
            json_patch(&doc, &json!([{"op": "move", "from": "/a", "path": "/a"}])).unwrap(),
            doc
        );
    }

    #[test]
    fn json_patch_test_op() {
        let doc = json!({"metadata": {"resourceVersion": "7"}, "spec": {"replicas": 2}});
        let ok = json_patch(
            &doc,
            &json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "test", "path": "/spec/replicas", "value": 2.0},
                {"op": "replace", "path": "/spec/replicas", "value": 5},
            ]),
        )
        .unwrap();
        assert_eq!(ok["spec"]["replicas"], 5);
        let err = invalid(json_patch(
            &doc,
            &json!([
                {"op": "replace", "path": "/spec/replicas", "value": 5},
                {"op": "test", "path": "/metadata/resourceVersion", "value": "6"},
            ]),
        ));
        assert!(
            err.contains("operation 1") && err.contains("test failed"),
            "{err}"
        );
        let err = invalid(json_patch(
            &doc,
            &json!([{"op": "test", "path": "/nope", "value": 1}]),
        ));
        assert!(err.contains("does not exist"), "{err}");
    }

    #[test]
    fn json_patch_missing_paths_are_invalid() {
        let doc = json!({"spec": {"list": [1]}});
        for ops in [
            json!([{"op": "replace", "path": "/spec/missing", "value": 1}]),
            json!([{"op": "remove", "path": "/spec/missing"}]),
            json!([{"op": "add", "path": "/nope/deeper", "value": 1}]),
            json!([{"op": "add", "path": "/spec/list/5", "value": 1}]),
            json!([{"op": "add", "path": "/spec/list/01", "value": 1}]),
            json!([{"op": "remove", "path": "/spec/list/-"}]),
            json!([{"op": "remove", "path": ""}]),
            json!([{"op": "copy", "from": "/x", "path": "/y"}]),
            json!([{"op": "move", "from": "/x", "path": "/y"}]),
        ] {
            let err = invalid(json_patch(&doc, &ops));
            assert!(err.starts_with("json patch operation 0"), "{err}");
        }
    }

    #[test]
    fn json_patch_malformed_is_bad_request() {
        let doc = json!({"a": 1});
        for (ops, reason) in [
            (json!({"op": "add"}), "list of operations"),
            (json!([1]), "must be an object"),
            (json!([{"path": "/a"}]), "\"op\""),
            (json!([{"op": "frobnicate", "path": "/a"}]), "unknown op"),
            (json!([{"op": "add", "value": 1}]), "\"path\""),
            (
                json!([{"op": "add", "path": "/b"}]),
                "\"value\" is required",
            ),
            (
                json!([{"op": "replace", "path": "/a"}]),
                "\"value\" is required",
            ),
            (json!([{"op": "move", "path": "/b"}]), "\"from\""),
            (
                json!([{"op": "add", "path": "a", "value": 1}]),
                "must start with '/'",
            ),
            (json!([{"op": "add", "path": "/a~2", "value": 1}]), "'~'"),
        ] {
            let err = bad(json_patch(&doc, &ops));
            assert!(err.contains(reason), "{ops}: {err}");
        }
    }

    #[test]
    fn json_patch_leaves_the_input_alone_on_failure() {
        let doc = json!({"a": 1});
        let _ = json_patch(
            &doc,
            &json!([{"op": "replace", "path": "/a", "value": 2}, {"op": "remove", "path": "/x"}]),
        );
        assert_eq!(doc, json!({"a": 1}));
    }
}
