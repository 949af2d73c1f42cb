//! The unit of a judged metric's values (`provider.judge.unit`), and how a value is written in
//! it for people: the measurement's reason, events and `kubectl rollouts`.

use serde::{Deserialize, Serialize};

/// What the numbers a judge metric's query returns are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    /// Already in percent: 1.5 is 1.5%.
    Percent,
    /// A fraction: 0.015 is written 1.5%.
    Ratio,
    Seconds,
    Milliseconds,
    Bytes,
    /// A plain number of things.
    Count,
}

impl Unit {
    /// `value` written in this unit with three significant digits: `1.50%`, `153ms`, `2.40s`,
    /// `1.50MiB`, `1230`. Time and bytes move to the next unit up from 1,000 ms or 1,024 bytes.
    pub fn format(self, value: f64) -> String {
        if !value.is_finite() {
            return value.to_string();
        }
        match self {
            Unit::Percent => format!("{}%", significant(value)),
            Unit::Ratio => format!("{}%", significant(value * 100.0)),
            Unit::Seconds => duration(value),
            Unit::Milliseconds => duration(value / 1000.0),
            Unit::Bytes => bytes(value),
            Unit::Count => significant(value),
        }
    }
}

fn duration(seconds: f64) -> String {
    if seconds.abs() >= 1.0 {
        format!("{}s", significant(seconds))
    } else if seconds.abs() >= 1e-3 || seconds == 0.0 {
        format!("{}ms", significant(seconds * 1e3))
    } else {
        format!("{}µs", significant(seconds * 1e6))
    }
}

fn bytes(value: f64) -> String {
    const NAMES: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut scaled = value;
    let mut index = 0;
    while scaled.abs() >= 1024.0 && index + 1 < NAMES.len() {
        scaled /= 1024.0;
        index += 1;
    }
    format!("{}{}", significant(scaled), NAMES[index])
}

/// Three significant digits, without trailing zeros after the point; whole numbers of 1,000 and
/// more are written whole.
fn significant(value: f64) -> String {
    if value == 0.0 {
        return "0".to_owned();
    }
    let magnitude = value.abs().log10().floor() as i32;
    let decimals = (2 - magnitude).max(0) as usize;
    let text = format!("{value:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_written_in_their_unit() {
        assert_eq!(Unit::Ratio.format(0.015), "1.5%");
        assert_eq!(Unit::Ratio.format(0.00123), "0.123%");
        assert_eq!(Unit::Ratio.format(0.0), "0%");
        assert_eq!(Unit::Percent.format(12.345), "12.3%");
        assert_eq!(Unit::Seconds.format(0.1534), "153ms");
        assert_eq!(Unit::Seconds.format(2.4), "2.4s");
        assert_eq!(Unit::Seconds.format(0.0002), "200µs");
        assert_eq!(Unit::Milliseconds.format(153.4), "153ms");
        assert_eq!(Unit::Milliseconds.format(1530.0), "1.53s");
        assert_eq!(Unit::Bytes.format(512.0), "512B");
        assert_eq!(Unit::Bytes.format(1.5 * 1024.0 * 1024.0), "1.5MiB");
        assert_eq!(Unit::Count.format(1234.0), "1234");
        assert_eq!(Unit::Count.format(-0.5), "-0.5");
        assert_eq!(Unit::Count.format(f64::NAN), "NaN");
    }
}
