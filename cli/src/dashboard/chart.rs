//! An AnalysisRun's measurements as charts: which series each metric has (its values and the
//! thresholds its conditions compare with, or canary and stable side by side for a judge
//! metric), and the SVG plotters draws for them on the server.

use k8s_openapi::jiff::Timestamp;
use plotters::prelude::*;
use rollouts_analysis::judge::Unit;
use serde_json::Value;

use crate::view::tree::judge_summary;

const WIDTH: u32 = 640;
const HEIGHT: u32 = 240;
const PALETTE: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];
const THRESHOLD: RGBColor = RGBColor(214, 39, 40);

/// One line of points: seconds since the run's first measurement, and the value.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// A horizontal line a condition compares the result with (`success >= 0.95`).
#[derive(Clone, Debug, PartialEq)]
pub struct Threshold {
    pub label: String,
    pub value: f64,
}

/// Everything one metric's chart shows.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricChart {
    pub metric: String,
    /// The metric's phase (`Successful`, `Failed`, ...).
    pub phase: String,
    /// The unit values are written in; `None` writes plain numbers.
    pub unit: Option<Unit>,
    pub series: Vec<Series>,
    pub thresholds: Vec<Threshold>,
    /// The last judge verdict in words, with its interval, for judge metrics.
    pub verdict: Option<String>,
}

fn text<'a>(value: &'a Value, pointer: &str) -> Option<&'a str> {
    value.pointer(pointer).and_then(Value::as_str)
}

/// When a measurement was taken: its finish, else its start.
fn taken_at(measurement: &Value) -> Option<Timestamp> {
    text(measurement, "/finishedAt")
        .or_else(|| text(measurement, "/startedAt"))
        .and_then(|t| t.parse().ok())
}

/// A judge measurement's value as an object (Argo stores values as strings).
fn judge_value(value: &Value) -> Option<Value> {
    let object = match value {
        Value::String(text) => serde_json::from_str::<Value>(text).ok()?,
        other => other.clone(),
    };
    (object.get("canaryMean").is_some() && object.get("verdict").is_some()).then_some(object)
}

/// The first number in a measurement value: `0.97`, `[0.97]`, `[0.97 0.5]` (Go's way of writing
/// a vector), `"12"`. `None` for values that hold no number (`[]`, `NaN`).
pub fn first_number(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(text) => text
            .split(|c: char| c == '[' || c == ']' || c == ',' || c.is_whitespace())
            .find(|word| !word.is_empty())
            .and_then(|word| word.parse::<f64>().ok())
            .filter(|v| v.is_finite()),
        Value::Array(items) => items.first().and_then(first_number),
        _ => None,
    }
}

/// The numbers a condition compares the result with: `result[0] >= 0.95 && result[0] < 2`
/// gives `>= 0.95` and `< 2`.
pub fn condition_thresholds(kind: &str, condition: &str) -> Vec<Threshold> {
    let mut found = Vec::new();
    let bytes = condition.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let op_len = match (bytes[i], bytes.get(i + 1)) {
            (b'<' | b'>' | b'=' | b'!', Some(b'=')) => 2,
            (b'<' | b'>', _) => 1,
            _ => 0,
        };
        if op_len == 0 {
            i += 1;
            continue;
        }
        let op = &condition[i..i + op_len];
        let rest = condition[i + op_len..].trim_start();
        let number: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | 'e' | 'E' | '+'))
            .collect();
        if let Ok(value) = number.parse::<f64>()
            && value.is_finite()
        {
            found.push(Threshold {
                label: format!("{kind} {op} {number}"),
                value,
            });
        }
        i += op_len;
    }
    found
}

/// One chart per metric of `run` (an AnalysisRun as JSON), in the order the run lists them.
pub fn metric_charts(run: &Value) -> Vec<MetricChart> {
    let results = run
        .pointer("/status/metricResults")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let specs = run
        .pointer("/spec/metrics")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    // One time axis for every metric of the run, so their charts line up.
    let start = results
        .iter()
        .filter_map(|r| r.get("measurements").and_then(Value::as_array))
        .flatten()
        .filter_map(taken_at)
        .min();
    results
        .iter()
        .map(|result| {
            let metric = text(result, "/name").unwrap_or_default().to_string();
            let spec = specs.iter().find(|s| text(s, "/name") == Some(&metric));
            chart_of(result, spec, start)
        })
        .collect()
}

fn chart_of(result: &Value, spec: Option<&Value>, start: Option<Timestamp>) -> MetricChart {
    let measurements = result
        .get("measurements")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let seconds = |m: &Value| -> Option<f64> {
        let (at, start) = (taken_at(m)?, start?);
        Some((at.as_millisecond() - start.as_millisecond()) as f64 / 1000.0)
    };
    let metric = text(result, "/name").unwrap_or_default().to_string();
    let phase = text(result, "/phase").unwrap_or("Pending").to_string();
    let judged: Vec<(f64, Value)> = measurements
        .iter()
        .filter_map(|m| Some((seconds(m)?, judge_value(m.get("value")?)?)))
        .collect();
    if !judged.is_empty() {
        let side = |field: &str| -> Vec<(f64, f64)> {
            judged
                .iter()
                .filter_map(|(t, v)| Some((*t, v.get(field)?.as_f64()?)))
                .collect()
        };
        let last = judged.last().map(|(_, v)| v);
        let unit = last
            .and_then(|v| v.get("unit"))
            .and_then(|u| serde_json::from_value::<Unit>(u.clone()).ok())
            // The judge's means without a unit are ratios (the tree writes them in percent).
            .or(Some(Unit::Ratio));
        let verdict = last.and_then(|v| {
            let summary = judge_summary(v)?;
            let interval = match (
                v.get("lower").and_then(Value::as_f64),
                v.get("upper").and_then(Value::as_f64),
            ) {
                (Some(lower), Some(upper)) => format!(
                    ", shift interval [{}, {}]",
                    axis_label(unit, lower),
                    axis_label(unit, upper)
                ),
                _ => String::new(),
            };
            Some(format!("{summary}{interval}"))
        });
        return MetricChart {
            metric,
            phase,
            unit,
            series: vec![
                Series {
                    label: "canary".into(),
                    points: side("canaryMean"),
                },
                Series {
                    label: "stable".into(),
                    points: side("baselineMean"),
                },
            ],
            thresholds: Vec::new(),
            verdict,
        };
    }
    let points = measurements
        .iter()
        .filter_map(|m| Some((seconds(m)?, first_number(m.get("value")?)?)))
        .collect();
    let mut thresholds = Vec::new();
    if let Some(spec) = spec {
        for (kind, pointer) in [
            ("success", "/successCondition"),
            ("failure", "/failureCondition"),
        ] {
            if let Some(condition) = text(spec, pointer) {
                thresholds.extend(condition_thresholds(kind, condition));
            }
        }
    }
    MetricChart {
        metric,
        phase,
        unit: None,
        series: vec![Series {
            label: "value".into(),
            points,
        }],
        thresholds,
        verdict: None,
    }
}

/// A value on the chart's axis, in the metric's unit.
fn axis_label(unit: Option<Unit>, value: f64) -> String {
    match unit {
        Some(unit) => unit.format(value),
        None => {
            let rounded = (value * 1000.0).round() / 1000.0;
            rounded.to_string()
        }
    }
}

/// The chart as an `<svg>` element, or `None` when the metric has no measurement yet.
pub fn render_svg(chart: &MetricChart) -> Result<Option<String>, String> {
    let values = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .chain(chart.thresholds.iter().map(|t| t.value));
    let (mut low, mut high) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if chart.series.iter().all(|s| s.points.is_empty()) {
        return Ok(None);
    }
    let pad = ((high - low) * 0.1)
        .max(low.abs().max(high.abs()) * 0.05)
        .max(1e-9);
    low -= pad;
    // Headroom above the data for the legend (drawn in the upper right), so it never hides
    // a measurement's marker.
    high += pad + (high - low) * 0.35;
    let last = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(0.0f64, f64::max)
        .max(1.0)
        // Room for the last point's marker.
        * 1.03;
    let error =
        |e: &dyn std::fmt::Display| format!("cannot draw the chart of {}: {e}", chart.metric);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| error(&e))?;
        let mut plot = ChartBuilder::on(&root)
            .margin(10)
            .x_label_area_size(32)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..last, low..high)
            .map_err(|e| error(&e))?;
        let unit = chart.unit;
        let y_label = move |v: &f64| axis_label(unit, *v);
        plot.configure_mesh()
            .x_desc("seconds since the first measurement")
            .y_label_formatter(&y_label)
            .light_line_style(WHITE)
            .draw()
            .map_err(|e| error(&e))?;
        for (i, series) in chart.series.iter().enumerate() {
            let colour = PALETTE[i % PALETTE.len()];
            plot.draw_series(LineSeries::new(
                series.points.iter().copied(),
                colour.stroke_width(2),
            ))
            .map_err(|e| error(&e))?
            .label(series.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], colour));
            plot.draw_series(
                series
                    .points
                    .iter()
                    .map(|p| Circle::new(*p, 3, colour.filled())),
            )
            .map_err(|e| error(&e))?;
        }
        for threshold in &chart.thresholds {
            plot.draw_series(LineSeries::new(
                [(0.0, threshold.value), (last, threshold.value)],
                THRESHOLD.stroke_width(1),
            ))
            .map_err(|e| error(&e))?
            .label(threshold.label.clone())
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], THRESHOLD));
        }
        plot.configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| error(&e))?;
        root.present().map_err(|e| error(&e))?;
    }
    Ok(Some(svg))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn run(metrics: Value, results: Value) -> Value {
        json!({"spec": {"metrics": metrics}, "status": {"metricResults": results}})
    }

    fn measured(at: &str, value: &str) -> Value {
        json!({"phase": "Successful", "startedAt": at, "finishedAt": at, "value": value})
    }

    #[test]
    fn values_are_read_as_argo_writes_them() {
        assert_eq!(first_number(&json!("0.97")), Some(0.97));
        assert_eq!(first_number(&json!("[0.97]")), Some(0.97));
        assert_eq!(first_number(&json!("[0.5 0.7]")), Some(0.5));
        assert_eq!(first_number(&json!(3)), Some(3.0));
        assert_eq!(first_number(&json!("[]")), None);
        assert_eq!(first_number(&json!("NaN")), None);
    }

    #[test]
    fn thresholds_come_from_the_conditions() {
        let found = condition_thresholds("success", "result[0] >= 0.95 && result[0]<2");
        assert_eq!(
            found,
            vec![
                Threshold {
                    label: "success >= 0.95".into(),
                    value: 0.95
                },
                Threshold {
                    label: "success < 2".into(),
                    value: 2.0
                },
            ]
        );
        assert!(condition_thresholds("success", "result.status == \"ok\"").is_empty());
    }

    #[test]
    fn a_plain_metric_is_one_series_in_seconds_with_its_thresholds() {
        let charts = metric_charts(&run(
            json!([{"name": "success-rate", "successCondition": "result[0] >= 0.95"}]),
            json!([{"name": "success-rate", "phase": "Running", "measurements": [
                measured("2026-01-01T00:00:00Z", "[0.99]"),
                measured("2026-01-01T00:00:10Z", "[0.93]"),
            ]}]),
        ));
        assert_eq!(charts.len(), 1);
        let chart = &charts[0];
        assert_eq!(chart.metric, "success-rate");
        assert_eq!(chart.phase, "Running");
        assert_eq!(chart.series[0].points, vec![(0.0, 0.99), (10.0, 0.93)]);
        assert_eq!(chart.thresholds[0].value, 0.95);
        let svg = render_svg(chart).expect("draws").expect("has measurements");
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.contains("success &gt;= 0.95") || svg.contains("success >= 0.95"));
        assert!(svg.contains("seconds since the first measurement"));
        // One point marker per measurement.
        assert_eq!(svg.matches("<circle").count(), 2, "{svg}");
    }

    #[test]
    fn a_judge_metric_plots_canary_and_stable_in_its_unit_with_the_verdict() {
        let value = json!({"verdict": "High", "canaryMean": 152.0, "baselineMean": 120.0,
            "meanRatio": 1.27, "lower": 10.5, "upper": 40.25, "unit": "milliseconds"})
        .to_string();
        let charts = metric_charts(&run(
            json!([{"name": "latency"}]),
            json!([{"name": "latency", "phase": "Failed", "measurements": [
                measured("2026-01-01T00:00:00Z", &value),
            ]}]),
        ));
        let chart = &charts[0];
        assert_eq!(chart.unit, Some(Unit::Milliseconds));
        assert_eq!(chart.series[0].label, "canary");
        assert_eq!(chart.series[0].points, vec![(0.0, 152.0)]);
        assert_eq!(chart.series[1].label, "stable");
        assert_eq!(chart.series[1].points, vec![(0.0, 120.0)]);
        assert_eq!(
            chart.verdict.as_deref(),
            Some("canary 152ms vs stable 120ms (High), shift interval [10.5ms, 40.2ms]")
        );
        let svg = render_svg(chart).expect("draws").expect("has measurements");
        assert!(svg.contains("canary") && svg.contains("stable"), "{svg}");
        assert!(svg.contains("ms"), "the axis is in milliseconds: {svg}");
    }

    #[test]
    fn a_metric_without_measurements_draws_no_chart() {
        let charts = metric_charts(&run(
            json!([{"name": "m"}]),
            json!([{"name": "m", "phase": "Pending"}]),
        ));
        assert_eq!(render_svg(&charts[0]), Ok(None));
    }
}
