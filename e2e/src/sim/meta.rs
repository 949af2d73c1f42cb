//! Object metadata helpers: timestamps, uids, generated names and JSON path access.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::Rng;
use serde_json::{Map, Value};

/// Alphabet the API server uses for generated name suffixes (no vowels, no look-alikes).
const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// `n` random characters for `generateName` and pod names.
pub fn random_suffix(n: usize) -> String {
    let mut rng = rand::rng();
    (0..n)
        .map(|_| NAME_ALPHABET[rng.random_range(0..NAME_ALPHABET.len())] as char)
        .collect()
}

/// A random RFC 4122 version-4 uid.
pub fn new_uid() -> String {
    let b: [u8; 16] = rand::rng().random();
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-4{}-{:x}{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        8 | (b[8] & 0x3),
        &hex[17..20],
        &hex[20..32]
    )
}

/// A stable short hash in the API server's safe alphabet (pod-template-hash style).
pub fn safe_hash(data: &[u8]) -> String {
    // FNV-1a: stable across runs and processes, unlike std's RandomState.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let mut out = String::new();
    for _ in 0..10 {
        out.push(NAME_ALPHABET[(h % NAME_ALPHABET.len() as u64) as usize] as char);
        h /= NAME_ALPHABET.len() as u64;
    }
    out
}

/// RFC 3339 UTC time with second precision, as Kubernetes writes `metav1.Time`.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Parses the `YYYY-MM-DDTHH:MM:SSZ` form written by [`rfc3339`] (fractions are ignored).
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[10] != b'T' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let days = days_from_civil(num(0..4)?, num(5..7)?, num(8..10)?);
    let secs = days * 86_400 + num(11..13)? * 3600 + num(14..16)? * 60 + num(17..19)?;
    Some(UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).ok()?))
}

// Howard Hinnant's days-from-civil algorithms (proleptic Gregorian calendar).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `obj.metadata.<field>` as a string, or "".
pub fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj["metadata"][field].as_str().unwrap_or_default()
}

/// The object's `metadata` map, created when missing.
pub fn metadata_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    let root = obj.as_object_mut().expect("object ensured above");
    let meta = root
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    meta.as_object_mut().expect("object ensured above")
}

/// Reads a simple JSON path such as `.spec.replicas` (the CRD scale-subresource form).
pub fn get_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    path.trim_start_matches('.')
        .split('.')
        .filter(|s| !s.is_empty())
        .try_fold(obj, |cur, seg| cur.get(seg))
}

/// Writes a simple JSON path such as `.spec.replicas`, creating objects on the way.
pub fn set_path(obj: &mut Value, path: &str, value: Value) {
    let segments: Vec<&str> = path
        .trim_start_matches('.')
        .split('.')
        .filter(|s| !s.is_empty())
        .collect();
    let mut cur = obj;
    for seg in &segments[..segments.len().saturating_sub(1)] {
        if !cur.get(*seg).is_some_and(Value::is_object) {
            cur[*seg] = Value::Object(Map::new());
        }
        cur = cur.get_mut(*seg).expect("inserted above");
    }
    if let Some(last) = segments.last() {
        cur[*last] = value;
    }
}

/// The ownerReferences of an object.
pub fn owner_refs(obj: &Value) -> &[Value] {
    obj["metadata"]["ownerReferences"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// The uid of the controller owner, if any.
pub fn controller_uid(obj: &Value) -> Option<&str> {
    owner_refs(obj)
        .iter()
        .find(|r| r["controller"].as_bool() == Some(true))
        .and_then(|r| r["uid"].as_str())
}

/// Parses a Go duration as written in annotations (`500ms`, `3s`, `2m`, `1h`).
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return None,
    };
    Some(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip() {
        let t = UNIX_EPOCH + Duration::from_secs(1_796_256_000 + 3_725);
        let s = rfc3339(t);
        assert_eq!(s, "2026-12-03T01:02:05Z");
        assert_eq!(parse_rfc3339(&s), Some(t));
    }

    #[test]
    fn uids_and_hashes_have_the_expected_shape() {
        let uid = new_uid();
        assert_eq!(uid.len(), 36);
        assert_eq!(&uid[14..15], "4");
        assert_eq!(safe_hash(b"x"), safe_hash(b"x"));
        assert_ne!(safe_hash(b"x"), safe_hash(b"y"));
    }

    #[test]
    fn paths_and_durations() {
        let mut v = serde_json::json!({});
        set_path(&mut v, ".spec.replicas", 3.into());
        assert_eq!(get_path(&v, ".spec.replicas"), Some(&Value::from(3)));
        assert_eq!(parse_duration("3s"), Some(Duration::from_secs(3)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("x"), None);
    }
}
