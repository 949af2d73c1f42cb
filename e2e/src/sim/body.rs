//! Request bodies as JSON, nested as deep as [`MAX_DEPTH`].
//!
//! An API server decodes JSON with `sigs.k8s.io/json` (a fork of `encoding/json`), which refuses
//! documents nested deeper than 10,000 levels and takes anything shallower. serde_json stops at
//! 128 by default, so kube-sim would refuse objects a cluster stores, and tests of a client's
//! handling of deep objects could not run. kube-sim takes up to [`MAX_DEPTH`] levels instead:
//! well past 128, and low enough that its own recursive handling of an object (patches,
//! selectors, encoding, dropping) stays inside its threads' stacks. The depth is measured by one
//! pass over the bytes, without recursion, before anything is decoded.

use serde::Deserialize;
use serde_json::Value;

/// The deepest nesting of objects and arrays kube-sim accepts in a body.
pub const MAX_DEPTH: usize = 1_000;

/// The stack of kube-sim's threads: objects [`MAX_DEPTH`] deep take a few MiB to decode,
/// patch and encode in a debug build (the 2 MiB default overflows).
pub const THREAD_STACK: usize = 32 * 1024 * 1024;

/// Decodes `body` as JSON; an error names the depth when it is the reason.
pub fn parse_json(body: &[u8]) -> Result<Value, String> {
    if exceeds_depth(body, MAX_DEPTH) {
        return Err(format!(
            "exceeded max depth: the body nests objects and arrays more than {MAX_DEPTH} levels deep, more than kube-sim accepts (an API server accepts 10000)"
        ));
    }
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    // Bounded by the scan above.
    deserializer.disable_recursion_limit();
    let value = Value::deserialize(&mut deserializer).map_err(|e| e.to_string())?;
    deserializer.end().map_err(|e| e.to_string())?;
    Ok(value)
}

/// Whether objects and arrays in `json` nest more than `limit` levels deep (strings skipped).
pub fn exceeds_depth(json: &[u8], limit: usize) -> bool {
    let mut depth: usize = 0;
    let mut in_string = false;
    let mut escaped = false;
    for &byte in json {
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth = depth.saturating_add(1);
                if depth > limit {
                    return true;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(depth: usize) -> String {
        format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn bodies_up_to_the_limit_decode_past_serde_jsons_default() {
        // On a thread like kube-sim's: the limit and the stack go together.
        let decoded = std::thread::Builder::new()
            .stack_size(THREAD_STACK)
            .spawn(|| {
                let shallow = parse_json(nested(200).as_bytes()).is_ok();
                let deepest = parse_json(nested(MAX_DEPTH).as_bytes())
                    .and_then(|value| serde_json::to_vec(&value).map_err(|e| e.to_string()))
                    .is_ok();
                shallow && deepest
            })
            .expect("starts a thread")
            .join()
            .expect("no overflow");
        assert!(decoded);
    }

    #[test]
    fn deeper_bodies_are_refused_before_decoding() {
        let error = parse_json(nested(50_000).as_bytes()).expect_err("refused");
        assert!(error.contains("exceeded max depth"), "{error}");
        assert!(parse_json(nested(MAX_DEPTH + 1).as_bytes()).is_err());
    }

    #[test]
    fn brackets_inside_strings_do_not_count() {
        let body = format!(r#"{{"a": "{}\"{}"}}"#, "[".repeat(5_000), "{".repeat(5_000));
        assert!(!exceeds_depth(body.as_bytes(), 2));
        assert!(parse_json(body.as_bytes()).is_ok());
    }

    #[test]
    fn invalid_json_is_still_an_error() {
        assert!(parse_json(b"{\"a\": ").is_err());
        assert!(parse_json(b"{} {}").is_err());
    }
}
