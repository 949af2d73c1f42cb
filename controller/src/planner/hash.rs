//! The pod-template hash: the short name that ties a Rollout's pod template to its ReplicaSet
//! (the `rollouts-pod-template-hash` label, `status.currentPodHash`, `status.stableRS`).
//!
//! Our own encoding, fixed here so the hash stays the same across restarts and releases:
//! 1. the template is turned into JSON; the `rollouts-pod-template-hash` label and every
//!    `null` member are removed (a `null` is an absent field); empty objects stay, since some
//!    mean something (`emptyDir: {}`);
//! 2. that JSON is written compactly with every object's keys in byte order, strings escaped
//!    as serde_json escapes them and numbers as serde_json prints them;
//! 3. FNV-1a (32 bit) runs over those bytes, then, when `status.collisionCount` is set, over
//!    its value as 4 little-endian bytes followed by 4 zero bytes;
//! 4. the decimal digits of the 32-bit sum are mapped through Kubernetes' SafeEncodeString
//!    alphabet (`bcdfghjklmnpqrstvwxz2456789`), so the hash never spells a word.
//!
//! The result differs from Argo's hash (Argo hashes the Go struct), so a ReplicaSet Argo
//! created is found by its template instead ([`super::template_match`]).
//!
//! Also here: [`digest`], the 64-bit digest templates are compared by, and
//! [`argo_steps_hash`], Argo's `status.currentStepHash`, recognised on a Rollout Argo left.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use rollouts_crds::rollout::CanaryStep;
use serde_json::Value;

/// Label on ReplicaSets, pods and service selectors carrying the pod-template hash.
pub const POD_TEMPLATE_HASH_LABEL: &str = "rollouts-pod-template-hash";

const FNV_OFFSET_BASIS: u32 = 0x811c_9dc5;
const FNV_PRIME: u32 = 0x0100_0193;
const FNV64_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV64_PRIME: u64 = 0x0000_0100_0000_01b3;
/// Kubernetes' SafeEncodeString alphabet: no vowels, no 0, 1 or 3.
const SAFE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// The pod-template hash of `template`, salted with `collision_count` when set.
pub fn pod_template_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    // A PodTemplateSpec holds only string-keyed maps, so it always has a JSON form.
    let value = serde_json::to_value(template).unwrap_or(Value::Null);
    pod_template_hash_of_value(&value, collision_count)
}

/// [`pod_template_hash`] of a template already in JSON form.
pub fn pod_template_hash_of_value(template: &Value, collision_count: Option<i32>) -> String {
    let mut template = template.clone();
    if let Some(labels) = template
        .pointer_mut("/metadata/labels")
        .and_then(Value::as_object_mut)
    {
        labels.remove(POD_TEMPLATE_HASH_LABEL);
    }
    let mut encoded = Vec::new();
    write_canonical(&without_nulls(template), &mut encoded);
    let mut hash = fnv1a(FNV_OFFSET_BASIS, &encoded);
    if let Some(count) = collision_count {
        let mut salt = [0u8; 8];
        salt[..4].copy_from_slice(&(count as u32).to_le_bytes());
        hash = fnv1a(hash, &salt);
    }
    safe_encode(&hash.to_string())
}

/// Maps each byte of `text` into the SafeEncodeString alphabet.
pub fn safe_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| char::from(SAFE_ALPHABET[usize::from(byte) % SAFE_ALPHABET.len()]))
        .collect()
}

/// FNV-1a (64 bit) of `value`'s canonical form (as in [`pod_template_hash`], nulls kept), in
/// hex: what two templates are compared by, where a 32-bit sum would be too short.
pub fn digest(value: &Value) -> String {
    let mut encoded = Vec::new();
    write_canonical(value, &mut encoded);
    let hash = encoded.iter().fold(FNV64_OFFSET_BASIS, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(FNV64_PRIME)
    });
    format!("{hash:016x}")
}

/// Argo's `ComputeStepHash` (utils/conditions/conditions.go): FNV-1a (32 bit) over Go's
/// `json.Marshal` of `spec.strategy.canary.steps` (`None`: absent), SafeEncodeString'd. Go
/// writes struct fields in declaration order, which our types keep, omits empty strings,
/// `false` and empty lists and maps, and escapes `<`, `>`, `&`, U+2028 and U+2029.
pub fn argo_steps_hash(steps: Option<&[CanaryStep]>) -> String {
    let value = serde_json::to_value(steps).unwrap_or(Value::Null);
    let encoded = go_omit_empty(value).to_string();
    let mut escaped = String::with_capacity(encoded.len());
    for ch in encoded.chars() {
        match ch {
            '<' => escaped.push_str("\\u003c"),
            '>' => escaped.push_str("\\u003e"),
            '&' => escaped.push_str("\\u0026"),
            '\u{2028}' => escaped.push_str("\\u2028"),
            '\u{2029}' => escaped.push_str("\\u2029"),
            other => escaped.push(other),
        }
    }
    safe_encode(&fnv1a(FNV_OFFSET_BASIS, escaped.as_bytes()).to_string())
}

/// Drops the members Go's `omitempty` leaves out of a step: `""`, `false`, `[]`, and empty
/// maps (`labels`, `annotations`, `headers`); an empty struct such as `pause: {}` stays.
fn go_omit_empty(value: Value) -> Value {
    match value {
        Value::Array(items) => Value::Array(items.into_iter().map(go_omit_empty).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(key, member)| match member {
                    Value::String(text) => !text.is_empty(),
                    Value::Bool(flag) => *flag,
                    Value::Array(items) => !items.is_empty(),
                    Value::Object(entries) => {
                        !(entries.is_empty()
                            && matches!(key.as_str(), "labels" | "annotations" | "headers"))
                    }
                    _ => true,
                })
                .map(|(key, member)| (key, go_omit_empty(member)))
                .collect(),
        ),
        scalar => scalar,
    }
}

fn fnv1a(mut hash: u32, bytes: &[u8]) -> u32 {
    for byte in bytes {
        hash ^= u32::from(*byte);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

/// Drops `null` members of objects, at every depth.
fn without_nulls(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, member)| !member.is_null())
                .map(|(key, member)| (key, without_nulls(member)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_nulls).collect()),
        scalar => scalar,
    }
}

fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(flag) => out.extend_from_slice(if *flag { b"true" } else { b"false" }),
        Value::Number(number) => out.extend_from_slice(number.to_string().as_bytes()),
        Value::String(text) => write_string(text, out),
        Value::Array(items) => {
            out.push(b'[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_unstable();
            out.push(b'{');
            for (index, key) in keys.into_iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                write_string(key, out);
                out.push(b':');
                write_canonical(&map[key], out);
            }
            out.push(b'}');
        }
    }
}

fn write_string(text: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(Value::String(text.to_owned()).to_string().as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template() -> Value {
        json!({
            "metadata": {"labels": {"app": "guestbook"}},
            "spec": {"containers": [{"name": "web", "image": "nginx:1.27", "ports": [{"containerPort": 80}]}]}
        })
    }

    #[test]
    fn fixed_template_has_a_fixed_hash() {
        // Canonical form: {"metadata":{"labels":{"app":"guestbook"}},"spec":{"containers":
        // [{"image":"nginx:1.27","name":"web","ports":[{"containerPort":80}]}]}}; FNV-1a of it
        // computed outside this crate is 1043702946, and 2244326915 with collisionCount 1.
        assert_eq!(
            pod_template_hash_of_value(&template(), None),
            safe_encode("1043702946")
        );
        assert_eq!(
            pod_template_hash_of_value(&template(), Some(1)),
            safe_encode("2244326915")
        );
    }

    #[test]
    fn collision_count_changes_the_hash() {
        let plain = pod_template_hash_of_value(&template(), None);
        let zero = pod_template_hash_of_value(&template(), Some(0));
        let one = pod_template_hash_of_value(&template(), Some(1));
        let two = pod_template_hash_of_value(&template(), Some(2));
        assert_ne!(plain, zero);
        assert_ne!(zero, one);
        assert_ne!(one, two);
    }

    #[test]
    fn map_order_does_not_matter() {
        let reordered = json!({
            "spec": {"containers": [{"ports": [{"containerPort": 80}], "image": "nginx:1.27", "name": "web"}]},
            "metadata": {"labels": {"app": "guestbook"}}
        });
        assert_eq!(
            pod_template_hash_of_value(&template(), None),
            pod_template_hash_of_value(&reordered, None)
        );
    }

    #[test]
    fn hash_label_and_null_fields_do_not_matter() {
        let mut labelled = template();
        labelled["metadata"]["labels"][POD_TEMPLATE_HASH_LABEL] = json!("abc");
        labelled["spec"]["nodeSelector"] = Value::Null;
        labelled["spec"]["containers"][0]["args"] = Value::Null;
        assert_eq!(
            pod_template_hash_of_value(&template(), None),
            pod_template_hash_of_value(&labelled, None)
        );
    }

    #[test]
    fn empty_objects_still_count() {
        let volume = |source: &str| {
            let mut with_volume = template();
            with_volume["spec"]["volumes"] = json!([{ "name": "scratch", source: {} }]);
            pod_template_hash_of_value(&with_volume, None)
        };
        assert_ne!(volume("emptyDir"), volume("ephemeral"));
        assert_ne!(
            volume("emptyDir"),
            pod_template_hash_of_value(&template(), None)
        );
    }

    #[test]
    fn any_real_change_changes_the_hash() {
        let mut changed = template();
        changed["spec"]["containers"][0]["image"] = json!("nginx:1.28");
        assert_ne!(
            pod_template_hash_of_value(&template(), None),
            pod_template_hash_of_value(&changed, None)
        );
    }

    #[test]
    fn argo_steps_hash_matches_argos_own_test_values() {
        // Argo's TestComputeStepHash (utils/conditions/rollouts_test.go).
        let pause = CanaryStep::pause_indefinitely;
        assert_eq!(argo_steps_hash(Some(&[pause(), pause()])), "79c9b9f6bf");
        assert_eq!(argo_steps_hash(Some(&[pause()])), "6b9b86fbd5");
        assert_eq!(argo_steps_hash(None), "5ffbfbbd64");
    }

    #[test]
    fn argo_steps_hash_encodes_as_go_does() {
        // FNV-1a of Go's encoding, computed outside this crate:
        // [{"setWeight":20},{"pause":{}},{"setWeight":40},{"pause":{"duration":"10s"}}]
        let steps: Vec<CanaryStep> = serde_json::from_value(json!([
            {"setWeight": 20}, {"pause": {}}, {"setWeight": 40}, {"pause": {"duration": "10s"}}
        ]))
        .unwrap();
        assert_eq!(argo_steps_hash(Some(&steps)), safe_encode("1045042799"));
        // Go omits `clusterScope: false` and an empty `args`, and escapes `&`.
        let analysis: Vec<CanaryStep> = serde_json::from_value(json!([{"analysis": {
            "templates": [{"templateName": "a&b", "clusterScope": false}], "args": []
        }}]))
        .unwrap();
        // [{"analysis":{"templates":[{"templateName":"a\u0026b"}]}}]
        assert_eq!(argo_steps_hash(Some(&analysis)), safe_encode("1592453341"));
    }

    #[test]
    fn digest_follows_content_not_order() {
        let reordered = json!({
            "spec": {"containers": [{"ports": [{"containerPort": 80}], "image": "nginx:1.27", "name": "web"}]},
            "metadata": {"labels": {"app": "guestbook"}}
        });
        assert_eq!(digest(&template()), digest(&reordered));
        assert_ne!(digest(&template()), digest(&json!({})));
        assert_eq!(digest(&template()).len(), 16);
    }

    #[test]
    fn typed_template_hashes_like_its_json() {
        let typed: PodTemplateSpec = serde_json::from_value(template()).unwrap();
        let hash = pod_template_hash(&typed, None);
        assert_eq!(hash, pod_template_hash_of_value(&template(), None));
        assert!(!hash.is_empty() && hash.len() <= 10);
        assert!(hash.bytes().all(|byte| SAFE_ALPHABET.contains(&byte)));
    }
}
