//! Advice on judge metrics (`provider.judge`, continuous kind): samples overlap when `step` is
//! shorter than a range in the query, and `window / step` must reach `minSamples` (see
//! docs/judge.md, "Independent samples").

use std::time::Duration;

use serde_json::Value;

use super::{Finding, Severity};

/// What the judge assumes when a field is left out (as `rollouts_analysis::provider` does).
const DEFAULT_WINDOW: &str = "5m";
const DEFAULT_STEP: &str = "15s";
const DEFAULT_MIN_SAMPLES: u64 = 5;

/// Warnings for the judge metrics in `spec.metrics` of an AnalysisTemplate,
/// ClusterAnalysisTemplate or AnalysisRun.
pub fn advise(document: &Value) -> Vec<Finding> {
    let Some(metrics) = document.pointer("/spec/metrics").and_then(Value::as_array) else {
        return Vec::new();
    };
    let mut findings = Vec::new();
    for (index, metric) in metrics.iter().enumerate() {
        let Some(judge) = metric.pointer("/provider/judge") else {
            continue;
        };
        if judge.get("kind").and_then(Value::as_str) == Some("ratio") {
            continue;
        }
        let path = format!("spec.metrics[{index}].provider.judge");
        let text = |field: &str, default: &'static str| {
            judge
                .get(field)
                .and_then(Value::as_str)
                .unwrap_or(default)
                .to_owned()
        };
        let (window_text, step_text) = (text("window", DEFAULT_WINDOW), text("step", DEFAULT_STEP));
        // Unparsable durations are the validation's business (and the measurement's error).
        let (Some(window), Some(step)) =
            (promql_duration(&window_text), promql_duration(&step_text))
        else {
            continue;
        };
        if step.is_zero() {
            continue;
        }
        let query = judge
            .get("query")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let longest = range_selectors(query)
            .into_iter()
            .filter_map(|range| {
                let duration = if range.trim() == "{{window}}" {
                    Some(window)
                } else {
                    promql_duration(&range)
                };
                duration.map(|d| (range, d))
            })
            .max_by_key(|(_, d)| *d);
        if let Some((range, duration)) = longest
            && duration > step
        {
            findings.push(Finding::new(
                Severity::Warning,
                format!("{path}.step"),
                format!(
                    "step {step_text} is shorter than the query's range [{range}], so each sample \
                     shares most of its requests with the next: the samples are not independent \
                     and the judge raises false alarms well above 1 - confidence"
                ),
                format!(
                    "set step to at least {range} (or shorten the range), or count errors with \
                     kind: ratio; see docs/judge.md, \"Independent samples\""
                ),
            ));
        }
        let min_samples = judge
            .get("minSamples")
            .and_then(Value::as_u64)
            .unwrap_or(DEFAULT_MIN_SAMPLES);
        // A range query's points run from start to end inclusive.
        let samples = (window.as_secs_f64() / step.as_secs_f64()).floor() as u64 + 1;
        if samples < min_samples {
            findings.push(Finding::new(
                Severity::Warning,
                format!("{path}.window"),
                format!(
                    "window {window_text} at step {step_text} gives at most {samples} samples a \
                     side, fewer than minSamples {min_samples}: every measurement is NoData"
                ),
                format!(
                    "lengthen window to at least {} x {step_text}, or lower minSamples",
                    min_samples - 1
                ),
            ));
        }
    }
    findings
}

/// The range of each `[range]` and `[range:resolution]` in a PromQL query, outside quoted
/// strings (a regex such as `code=~"[45].."` holds brackets too).
pub fn range_selectors(query: &str) -> Vec<String> {
    let mut ranges = Vec::new();
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut open: Option<String> = None;
    for c in query.chars() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' && q != '`' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match (c, open.as_mut()) {
            ('"' | '\'' | '`', None) => quote = Some(c),
            ('[', _) => open = Some(String::new()),
            (']', Some(inside)) => {
                let range = inside.split(':').next().unwrap_or_default().trim();
                if !range.is_empty() {
                    ranges.push(range.to_owned());
                }
                open = None;
            }
            (_, Some(inside)) => inside.push(c),
            _ => {}
        }
    }
    ranges
}

/// A PromQL (or Go) duration: numbers with units `ms`, `s`, `m`, `h`, `d`, `w`, `y`; None when
/// it is not one (a template tag, a typo).
pub fn promql_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let mut seconds = 0.0_f64;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3_600.0,
            "d" => 86_400.0,
            "w" => 604_800.0,
            "y" => 31_536_000.0,
            _ => return None,
        };
        seconds += number * scale;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(seconds).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template(judge: Value) -> Value {
        json!({"spec": {"metrics": [{"name": "m", "provider": {"judge": judge}}]}})
    }

    #[test]
    fn ranges_are_found_outside_quotes_and_subqueries_give_their_range() {
        let query = r#"sum(rate(x{code=~"[45]..",h="{{hash}}"}[1m])) / max_over_time(y[5m:30s]) + z[{{window}}]"#;
        assert_eq!(range_selectors(query), ["1m", "5m", "{{window}}"]);
        assert_eq!(promql_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(promql_duration("2d"), Some(Duration::from_secs(172_800)));
        assert_eq!(promql_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(promql_duration("{{args.range}}"), None);
        assert_eq!(promql_duration("5x"), None);
    }

    #[test]
    fn a_step_shorter_than_the_range_is_a_warning_naming_both() {
        let findings = advise(&template(json!({
            "query": "sum(rate(x{h=\"{{hash}}\"}[1m]))",
            "window": "5m",
            "step": "15s",
        })));
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert_eq!(findings[0].path, "spec.metrics[0].provider.judge.step");
        assert!(findings[0].reason.contains("[1m]"), "{findings:?}");
        assert!(findings[0].fix.contains("at least 1m"), "{findings:?}");
        // A range of the whole window overlaps too.
        let whole = advise(&template(json!({"query": "x[{{window}}]", "step": "1m"})));
        assert_eq!(whole.len(), 1, "{whole:?}");
    }

    #[test]
    fn independent_samples_and_ratio_metrics_are_fine() {
        let good = json!({"query": "rate(x[15s])", "window": "5m", "step": "15s", "minSamples": 8});
        assert_eq!(advise(&template(good)), []);
        let ratio = json!({"kind": "ratio", "errors": "increase(e[{{window}}])", "total": "t"});
        assert_eq!(advise(&template(ratio)), []);
        let tagged = json!({"query": "rate(x[{{args.range}}])", "step": "15s"});
        assert_eq!(advise(&template(tagged)), []);
    }

    #[test]
    fn a_window_too_short_for_min_samples_is_a_warning() {
        let findings = advise(&template(json!({
            "query": "rate(x[1m])",
            "window": "5m",
            "step": "1m",
            "minSamples": 8,
        })));
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert_eq!(findings[0].path, "spec.metrics[0].provider.judge.window");
        assert!(
            findings[0].reason.contains("at most 6 samples"),
            "{findings:?}"
        );
    }
}
