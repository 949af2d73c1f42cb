//! Durations as Argo writes them: Go duration strings ("30s", "1m30s", "500ms", "1h") and, for
//! pause steps, a bare integer meaning seconds.

use std::num::ParseFloatError;
use std::time::Duration;

/// Why a duration string does not parse; each variant carries the text as written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("empty duration")]
    Empty,
    #[error("duration {input:?} is missing a unit (s, m, h, ms)")]
    MissingUnit { input: String },
    #[error("duration {input:?} is not a number followed by a unit")]
    NotANumber { input: String },
    #[error("duration {input:?} has a malformed number")]
    MalformedNumber {
        input: String,
        #[source]
        source: ParseFloatError,
    },
    #[error("duration {input:?} has unknown unit {unit:?} (use ms, s, m or h)")]
    UnknownUnit { input: String, unit: String },
}

/// Parses a Go-style duration string: a sequence of decimal numbers, each with a unit
/// (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`). A bare integer is taken as seconds, as Argo does
/// for `pause.duration`.
pub fn parse(input: &str) -> Result<Duration, DurationError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| DurationError::MissingUnit {
                input: input.to_string(),
            })?;
        if num_len == 0 {
            return Err(DurationError::NotANumber {
                input: input.to_string(),
            });
        }
        let value: f64 =
            rest[..num_len]
                .parse()
                .map_err(|source| DurationError::MalformedNumber {
                    input: input.to_string(),
                    source,
                })?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            unit => {
                return Err(DurationError::UnknownUnit {
                    input: input.to_string(),
                    unit: unit.to_string(),
                });
            }
        };
        total += value * scale;
        rest = &rest[unit_len..];
    }
    Ok(Duration::from_secs_f64(total))
}

/// Formats a duration the way Go does for whole units ("1h2m3s", "5m0s", "30s", "0s").
pub fn format(d: Duration) -> String {
    let secs = d.as_secs();
    let millis = d.subsec_millis();
    if secs == 0 && millis > 0 {
        return format!("{millis}ms");
    }
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations_and_bare_seconds() {
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("10"), Ok(Duration::from_secs(10)));
    }

    #[test]
    fn rejects_malformed_durations_with_the_reason() {
        let reason = |input: &str| parse(input).expect_err(input).to_string();
        assert!(reason("").contains("empty"));
        assert!(reason("5x").contains("unknown unit"));
        assert!(reason("m").contains("not a number"));
        assert!(reason("5.5.5s").contains("malformed"));
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(format(Duration::from_secs(0)), "0s");
        assert_eq!(format(Duration::from_secs(30)), "30s");
        assert_eq!(format(Duration::from_secs(300)), "5m0s");
        assert_eq!(format(Duration::from_secs(3723)), "1h2m3s");
        assert_eq!(format(Duration::from_millis(250)), "250ms");
    }
}
