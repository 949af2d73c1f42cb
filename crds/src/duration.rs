//! Durations as Argo writes them: Go duration strings ("30s", "1m30s", "500ms", "1h") and, for
//! pause steps, a bare integer meaning seconds.
//!
//! Every duration is bounded: longer than [`MAX`] (one year) is refused, as are negative
//! values, so no time arithmetic on a parsed duration can overflow.

use std::num::ParseFloatError;
use std::time::Duration;

/// The longest duration any field accepts: 365 days. Longer values are refused with
/// [`DurationError::TooLong`].
pub const MAX: Duration = Duration::from_secs(MAX_SECONDS);

/// [`MAX`] in whole seconds (31,536,000).
pub const MAX_SECONDS: u64 = 365 * 24 * 3600;

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
    #[error("duration {input:?} is negative")]
    Negative { input: String },
    #[error("duration {input:?} is longer than the limit of one year (8760h)")]
    TooLong { input: String },
}

/// Parses a Go-style duration string: a sequence of decimal numbers, each with a unit
/// (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`). A bare integer is taken as seconds, as Argo does
/// for `pause.duration`. Negative durations and durations over [`MAX`] are errors.
pub fn parse(input: &str) -> Result<Duration, DurationError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    if s.starts_with('-') {
        return Err(DurationError::Negative {
            input: input.to_string(),
        });
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        // Bare seconds; too many digits for a u64 is far over the bound.
        return match s.parse::<u64>() {
            Ok(secs) => bounded(Duration::from_secs(secs), input),
            Err(_) => Err(DurationError::TooLong {
                input: input.to_string(),
            }),
        };
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
        let (number, after) = rest.split_at(num_len);
        let value: f64 = number
            .parse()
            .map_err(|source| DurationError::MalformedNumber {
                input: input.to_string(),
                source,
            })?;
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after_unit) = after.split_at(unit_len);
        let scale = match unit {
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
        // Checked after every part, so the sum stays finite and small.
        if !total.is_finite() || total > MAX.as_secs_f64() {
            return Err(DurationError::TooLong {
                input: input.to_string(),
            });
        }
        rest = after_unit;
    }
    let duration = Duration::try_from_secs_f64(total).map_err(|_| DurationError::TooLong {
        input: input.to_string(),
    })?;
    bounded(duration, input)
}

/// A whole number of seconds from an integer field (`pause.duration: 30`), refused when
/// negative or over [`MAX`]; the error names the value as written.
pub fn from_seconds(seconds: i64) -> Result<Duration, DurationError> {
    let input = seconds.to_string();
    let secs = u64::try_from(seconds).map_err(|_| DurationError::Negative {
        input: input.clone(),
    })?;
    bounded(Duration::from_secs(secs), &input)
}

fn bounded(duration: Duration, input: &str) -> Result<Duration, DurationError> {
    if duration > MAX {
        return Err(DurationError::TooLong {
            input: input.to_string(),
        });
    }
    Ok(duration)
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
    fn refuses_absurd_durations_instead_of_panicking() {
        let reason = |input: &str| parse(input).expect_err(input).to_string();
        // Once a panic in Duration::from_secs_f64 inside the Rollout reconcile.
        assert!(reason("100000000000000000000s").contains("longer than the limit of one year"));
        assert!(reason("100000000000000000000").contains("longer than"));
        assert!(reason(&format!("{}h", "9".repeat(400))).contains("longer than"));
        assert!(reason(&"1000000h".repeat(100)).contains("longer than"));
        assert!(reason("18446744073709551615").contains("longer than"));
        assert!(reason("8761h").contains("longer than"));
        assert!(reason("-5s").contains("negative"));
        assert!(reason("NaNs").contains("not a number"));
        assert!(reason("infs").contains("not a number"));
        assert_eq!(parse("8760h"), Ok(MAX));
        assert_eq!(parse("31536000"), Ok(MAX));
    }

    #[test]
    fn whole_seconds_are_bounded_too() {
        assert_eq!(from_seconds(30), Ok(Duration::from_secs(30)));
        assert_eq!(from_seconds(0), Ok(Duration::ZERO));
        assert!(matches!(
            from_seconds(-1),
            Err(DurationError::Negative { .. })
        ));
        assert!(matches!(
            from_seconds(i64::from(i32::MAX)),
            Err(DurationError::TooLong { .. })
        ));
        assert!(from_seconds(i64::MIN).is_err());
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(format(Duration::from_secs(0)), "0s");
        assert_eq!(format(Duration::from_secs(30)), "30s");
        assert_eq!(format(Duration::from_secs(300)), "5m0s");
        assert_eq!(format(Duration::from_secs(3723)), "1h2m3s");
        assert_eq!(format(Duration::from_millis(250)), "250ms");
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(1000))]

            /// No text panics; whatever parses is within the bound and formats.
            #[test]
            fn any_text_parses_or_errs_within_the_bound(input in "\\PC{0,40}") {
                if let Ok(d) = parse(&input) {
                    prop_assert!(d <= MAX);
                    let _ = format(d);
                }
            }

            /// Text shaped like durations, with numbers of any size and any units.
            #[test]
            fn duration_shaped_text_parses_or_errs_within_the_bound(
                parts in proptest::collection::vec(
                    ("[0-9]{0,25}(\\.[0-9]{0,25})?", "(ns|us|µs|ms|s|m|h|d|)"),
                    0..6,
                ),
                sign in "(-|\\+|)",
            ) {
                let input: String = std::iter::once(sign)
                    .chain(parts.into_iter().map(|(n, u)| format!("{n}{u}")))
                    .collect();
                if let Ok(d) = parse(&input) {
                    prop_assert!(d <= MAX);
                }
            }

            #[test]
            fn any_whole_seconds_are_bounded(seconds in any::<i64>()) {
                match from_seconds(seconds) {
                    Ok(d) => prop_assert!(seconds >= 0 && d <= MAX),
                    Err(_) => prop_assert!(seconds < 0 || seconds > MAX_SECONDS as i64),
                }
            }

            #[test]
            fn any_duration_formats(secs in any::<u64>(), nanos in 0u32..1_000_000_000) {
                let _ = format(Duration::new(secs, nanos));
            }
        }
    }
}
