//! Keeping `secretKeyRef` values out of everything a run writes or says. A secret can reach a
//! text in many shapes: as written, percent-encoded in a URL (any subset of its bytes, hex in
//! either case, `+` for a space), escaped in JSON or in a debug string, or base64-encoded
//! inside a longer value (an `Authorization: Basic` header). [`Redactor`] finds all of them
//! and puts [`REDACTED`] in their place, as Argo's `*****`.

use std::collections::BTreeMap;

use rollouts_crds::analysis::{AnalysisRunStatus, Measurement};

use crate::engine::{Outcome, TakenMeasurement};

/// What a secret value is replaced with.
pub const REDACTED: &str = "*****";

/// Secrets shorter than this are not searched for in base64 (their encodings are too short to
/// be told from ordinary text); they are still found as written and percent-encoded.
const MIN_BASE64_SECRET: usize = 6;

/// A secret cut off at the very end of a text (by a length cap) is redacted too, once at least
/// this many of its bytes are there.
const MIN_CUT_MATCH: usize = 4;

/// Finds every secret of a run, in every encoding, and redacts it.
#[derive(Clone, Debug, Default)]
pub struct Redactor {
    /// Byte strings to find: each secret, and the base64 encodings of its aligned parts.
    needles: Vec<Vec<u8>>,
}

impl Redactor {
    /// A redactor for these secret values (empty ones are ignored).
    pub fn new<S: AsRef<str>>(secrets: impl IntoIterator<Item = S>) -> Self {
        let mut needles = Vec::new();
        for secret in secrets {
            let secret = secret.as_ref().as_bytes();
            if secret.is_empty() {
                continue;
            }
            needles.push(secret.to_vec());
            if secret.len() >= MIN_BASE64_SECRET {
                needles.extend(base64_shapes(secret));
            }
        }
        // Longest first, so a longer shape wins where two start at the same place.
        needles.sort_by_key(|n| std::cmp::Reverse(n.len()));
        needles.dedup();
        Self { needles }
    }

    /// Whether there is nothing to redact.
    pub fn is_empty(&self) -> bool {
        self.needles.is_empty()
    }

    /// `text` with every secret, in any of its encodings, replaced by [`REDACTED`].
    pub fn redact(&self, text: &str) -> String {
        if self.needles.is_empty() || text.is_empty() {
            return text.to_string();
        }
        let bytes = text.as_bytes();
        let mut out: Vec<u8> = Vec::with_capacity(bytes.len());
        let mut at = 0;
        let mut copied_to = 0;
        while at < bytes.len() {
            // A marker already there stays as it is: redacting twice changes nothing, even
            // for a secret made of `*`.
            if bytes
                .get(at..)
                .is_some_and(|rest| rest.starts_with(REDACTED.as_bytes()))
            {
                at += REDACTED.len();
                continue;
            }
            let matched = self
                .needles
                .iter()
                .find_map(|needle| match_encoded(bytes, at, needle));
            match matched {
                Some(end) if end > at => {
                    out.extend_from_slice(bytes.get(copied_to..at).unwrap_or_default());
                    out.extend_from_slice(REDACTED.as_bytes());
                    at = end;
                    copied_to = end;
                }
                _ => at += 1,
            }
        }
        if copied_to == 0 {
            return text.to_string();
        }
        out.extend_from_slice(bytes.get(copied_to..).unwrap_or_default());
        match String::from_utf8(out) {
            Ok(redacted) => redacted,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }

    fn redact_in_place(&self, text: &mut String) {
        if !self.is_empty() {
            *text = self.redact(text);
        }
    }

    fn redact_map(&self, map: &mut BTreeMap<String, String>) {
        for value in map.values_mut() {
            self.redact_in_place(value);
        }
    }

    /// Redacts a measurement's value, message and metadata.
    pub fn measurement(&self, measurement: &mut Measurement) {
        self.redact_in_place(&mut measurement.value);
        self.redact_in_place(&mut measurement.message);
        self.redact_map(&mut measurement.metadata);
    }

    /// Redacts a provider's answer: the measurement and the metadata stored on the metric
    /// result (such as the resolved Prometheus query).
    pub fn taken(&self, taken: &mut TakenMeasurement) {
        self.measurement(&mut taken.measurement);
        self.redact_map(&mut taken.metadata);
    }

    /// Redacts every text of a status: the run's message, each metric result's message and
    /// metadata, and every measurement.
    pub fn status(&self, status: &mut AnalysisRunStatus) {
        if self.is_empty() {
            return;
        }
        self.redact_in_place(&mut status.message);
        for result in &mut status.metric_results {
            self.redact_in_place(&mut result.message);
            self.redact_map(&mut result.metadata);
            for measurement in &mut result.measurements {
                self.measurement(measurement);
            }
        }
    }

    /// Redacts a reconcile's outcome: its status and the messages of its events.
    pub fn outcome(&self, outcome: &mut Outcome) {
        self.status(&mut outcome.status);
        for event in &mut outcome.events {
            self.redact_in_place(&mut event.message);
        }
    }
}

/// The base64 texts that appear when `secret` is encoded inside a longer value, at each of
/// the three alignments, in the standard and the URL-safe alphabet; plus the whole secret
/// encoded alone, padding included.
fn base64_shapes(secret: &[u8]) -> Vec<Vec<u8>> {
    let mut shapes = Vec::new();
    for skip in 0..3 {
        let Some(rest) = secret.get(skip..) else {
            continue;
        };
        // Only whole 3-byte groups encode the same whatever surrounds them.
        let whole = rest.len() - rest.len() % 3;
        let Some(aligned) = rest.get(..whole) else {
            continue;
        };
        if aligned.len() >= 3 {
            let standard = super::base64(aligned);
            shapes.push(url_safe(&standard).into_bytes());
            shapes.push(standard.into_bytes());
        }
    }
    let whole = super::base64(secret);
    shapes.push(url_safe(&whole).into_bytes());
    shapes.push(whole.into_bytes());
    shapes
}

fn url_safe(standard: &str) -> String {
    standard.replace('+', "-").replace('/', "_")
}

fn hex_value(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

/// The byte of `%XX` at `at`, if there is one.
fn percent_byte(text: &[u8], at: usize) -> Option<u8> {
    if text.get(at) != Some(&b'%') {
        return None;
    }
    let high = hex_value(*text.get(at.checked_add(1)?)?)?;
    let low = hex_value(*text.get(at.checked_add(2)?)?)?;
    Some(high * 16 + low)
}

/// How `wanted` may be written escaped at `at` (JSON or Rust debug escapes); the escape's
/// length when it is.
fn escaped(text: &[u8], at: usize, wanted: u8) -> Option<usize> {
    if text.get(at) != Some(&b'\\') {
        return None;
    }
    let next = *text.get(at.checked_add(1)?)?;
    let simple = match next {
        b'"' | b'\\' | b'/' | b'\'' => Some(next),
        b'n' => Some(b'\n'),
        b't' => Some(b'\t'),
        b'r' => Some(b'\r'),
        b'b' => Some(0x08),
        b'f' => Some(0x0c),
        b'0' => Some(0),
        _ => None,
    };
    if simple == Some(wanted) {
        return Some(2);
    }
    if next == b'u' {
        // \u00XX (JSON) and \u{XX} (debug) for control characters.
        let digits = text.get(at.checked_add(2)?..)?;
        if let [b'0', b'0', high, low, ..] = digits
            && let (Some(high), Some(low)) = (hex_value(*high), hex_value(*low))
            && high * 16 + low == wanted
        {
            return Some(6);
        }
        if let [b'{', high, low, b'}', ..] = digits
            && let (Some(high), Some(low)) = (hex_value(*high), hex_value(*low))
            && high * 16 + low == wanted
        {
            return Some(6);
        }
    }
    None
}

/// Where a match of `needle` starting at `at` ends, each of its bytes as written,
/// percent-encoded, `+` for a space, or escaped. A text that ends part-way through a long
/// enough match counts as a match (a secret cut by a length cap).
fn match_encoded(text: &[u8], at: usize, needle: &[u8]) -> Option<usize> {
    let mut i = at;
    for (matched, &wanted) in needle.iter().enumerate() {
        let Some(&byte) = text.get(i) else {
            return (matched >= MIN_CUT_MATCH.min(needle.len())).then_some(i);
        };
        // Escapes first: a backslash or `%` in the text is more likely to start one than to
        // be the secret's own.
        if let Some(length) = escaped(text, i, wanted) {
            i += length;
        } else if percent_byte(text, i) == Some(wanted) {
            i += 3;
        } else if byte == wanted || (wanted == b' ' && byte == b'+') {
            i += 1;
        } else {
            return None;
        }
    }
    Some(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redact(secrets: &[&str], text: &str) -> String {
        Redactor::new(secrets.iter().copied()).redact(text)
    }

    #[test]
    fn a_secret_as_written_is_redacted_everywhere() {
        assert_eq!(
            redact(&["s3cr3t"], "401 for token s3cr3t at s3cr3t"),
            "401 for token ***** at *****"
        );
        assert_eq!(redact(&["s3cr3t", ""], "nothing here"), "nothing here");
        assert_eq!(redact(&[], "s3cr3t"), "s3cr3t");
    }

    #[test]
    fn percent_encoded_secrets_are_redacted_in_any_case_and_subset() {
        let secret = "p@ss w/rd&é";
        for text in [
            "http://h/q?token=p%40ss%20w%2Frd%26%C3%A9&x=1",
            "http://h/q?token=p%40ss+w%2frd%26%c3%a9&x=1",
            "http://h/q?token=p@ss%20w/rd%26é&x=1",
        ] {
            assert_eq!(
                redact(&[secret], text),
                "http://h/q?token=*****&x=1",
                "{text}"
            );
        }
    }

    #[test]
    fn escaped_secrets_are_redacted() {
        let secret = "a\"b\\c\nd";
        let json = serde_json::Value::String(format!("x{secret}y")).to_string();
        assert_eq!(redact(&[secret], &json), "\"x*****y\"");
        let debug = format!("{:?}", format!("x{secret}y"));
        assert_eq!(redact(&[secret], &debug), "\"x*****y\"");
    }

    #[test]
    fn base64_secrets_are_redacted_inside_longer_values() {
        let secret = "hunter2-password";
        for prefix in ["", "u:", "us:", "use:"] {
            let encoded = super::super::base64(format!("{prefix}{secret}").as_bytes());
            let redacted = redact(&[secret], &format!("Basic {encoded}"));
            // Left are only the group shared with the prefix and the last partial group: at
            // most two bytes of the secret each.
            let rest = redacted.replacen(REDACTED, "", 1);
            let prefix_chars = super::super::base64(prefix.as_bytes()).len();
            assert!(
                redacted.contains(REDACTED) && rest.len() <= "Basic ".len() + prefix_chars + 8,
                "{prefix}: {redacted}"
            );
        }
        let url_safe_text = url_safe(&super::super::base64(b"\xfb\xff\xfehunter2-password"));
        assert!(redact(&[secret], &url_safe_text).contains(REDACTED));
    }

    #[test]
    fn redacting_twice_changes_nothing() {
        for (secret, text) in [
            ("**", "a**b"),
            ("****abc", "token=****abc and ****"),
            ("s3cr3t", "s3cr3t s3cr3"),
        ] {
            let once = redact(&[secret], text);
            assert_eq!(redact(&[secret], &once), once, "{secret:?} in {text:?}");
        }
    }

    #[test]
    fn a_secret_cut_off_at_the_end_is_redacted() {
        assert_eq!(redact(&["s3cr3t-token"], "token=s3cr3t-t"), "token=*****");
        // Too little of it to tell.
        assert_eq!(redact(&["s3cr3t-token"], "token=s3c"), "token=s3c");
    }

    #[test]
    fn measurements_statuses_and_metadata_are_redacted() {
        let redactor = Redactor::new(["tok3n"]);
        let mut taken = TakenMeasurement {
            measurement: Measurement {
                value: "{\"echo\":\"tok3n\"}".into(),
                message: "GET /?t=tok3n failed".into(),
                metadata: BTreeMap::from([("url".into(), "/?t=tok3n".into())]),
                ..Default::default()
            },
            metadata: BTreeMap::from([(
                "ResolvedPrometheusQuery".into(),
                "up{token=\"tok3n\"}".into(),
            )]),
            ..Default::default()
        };
        redactor.taken(&mut taken);
        assert_eq!(taken.measurement.value, "{\"echo\":\"*****\"}");
        assert_eq!(taken.measurement.message, "GET /?t=***** failed");
        assert_eq!(taken.measurement.metadata["url"], "/?t=*****");
        assert_eq!(
            taken.metadata["ResolvedPrometheusQuery"],
            "up{token=\"*****\"}"
        );
        let mut status = AnalysisRunStatus {
            message: "Metric \"m\" assessed Error: tok3n".into(),
            metric_results: vec![rollouts_crds::analysis::MetricResult {
                message: "tok3n".into(),
                metadata: taken.metadata.clone(),
                measurements: vec![Measurement {
                    value: "tok3n".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        redactor.status(&mut status);
        let text = serde_json::to_string(&status).expect("encodes");
        assert!(!text.contains("tok3n"), "{text}");
    }
}
