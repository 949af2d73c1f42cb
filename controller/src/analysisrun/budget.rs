//! The size budget of an AnalysisRun's status, so that no answer a provider gives and no
//! number of metrics can make a status write exceed what the API server stores (etcd refuses
//! objects over 1.5 MiB). Long texts are cut with a marker; then the oldest finished
//! measurements are dropped, oldest first; only if that is not enough are texts cut shorter
//! (and old measurements dropped again). A metric's last measurement is kept while the metric
//! runs: its times schedule the next one.

use std::io;

use k8s_openapi::jiff::Timestamp;
use rollouts_crds::analysis::{AnalysisRunStatus, Measurement};

/// The most bytes an AnalysisRun's status takes, encoded as JSON: a third of the API server's
/// object limit, leaving room for the spec and metadata.
pub const STATUS_BUDGET: usize = 512 * 1024;
/// The most bytes of a stored text: a measurement's value or message, a metric result's
/// message or metadata value, the run's message.
pub const MAX_TEXT: usize = 4096;
/// Texts are cut to this when dropping old measurements was not enough.
pub const SHORT_TEXT: usize = 256;
/// Ends a text that was cut.
pub const TRUNCATED: &str = "... (truncated)";

/// Bytes `status` takes as JSON.
pub fn encoded_len(status: &AnalysisRunStatus) -> usize {
    let mut counter = Counter(0);
    match serde_json::to_writer(&mut counter, status) {
        Ok(()) => counter.0,
        // A status that cannot be encoded is reported when it is written.
        Err(_) => 0,
    }
}

struct Counter(usize);

impl io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 = self.0.saturating_add(buf.len());
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Cuts `text` to at most `max` bytes (on a character boundary), ending it with [`TRUNCATED`].
pub fn truncate(text: &mut String, max: usize) {
    if text.len() <= max {
        return;
    }
    let mut end = max.saturating_sub(TRUNCATED.len());
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(TRUNCATED);
}

fn truncate_measurement(measurement: &mut Measurement, max: usize) {
    truncate(&mut measurement.value, max);
    truncate(&mut measurement.message, max);
    for value in measurement.metadata.values_mut() {
        truncate(value, max);
    }
}

/// Cuts every text of `status` to `max` bytes.
fn truncate_texts(status: &mut AnalysisRunStatus, max: usize) {
    truncate(&mut status.message, max);
    for result in &mut status.metric_results {
        truncate(&mut result.message, max);
        for value in result.metadata.values_mut() {
            truncate(value, max);
        }
        for measurement in &mut result.measurements {
            truncate_measurement(measurement, max);
        }
    }
}

/// Cuts a provider's answer before anything else looks at it (redaction included): twice
/// [`MAX_TEXT`], so that whatever is cut off then is cut off again, whole, by [`fit`].
pub fn precut(measurement: &mut Measurement) {
    let max = MAX_TEXT.saturating_mul(2);
    truncate_measurement(measurement, max);
}

/// The oldest measurement that may be dropped: finished, and not the last of a metric that is
/// still running. (metric result index, measurement index).
fn oldest_droppable(status: &AnalysisRunStatus) -> Option<(usize, usize)> {
    let mut oldest: Option<((usize, usize), Option<Timestamp>)> = None;
    for (r, result) in status.metric_results.iter().enumerate() {
        let keep_last = !result.phase.is_completed();
        let droppable = if keep_last {
            result.measurements.len().saturating_sub(1)
        } else {
            result.measurements.len()
        };
        // Measurements of a metric are in the order they were taken.
        let Some(first) = result.measurements.first().filter(|_| droppable > 0) else {
            continue;
        };
        if first.finished_at.is_none() {
            continue;
        }
        let when = first
            .started_at
            .as_ref()
            .or(first.finished_at.as_ref())
            .map(|t| t.0);
        if oldest.as_ref().is_none_or(|(_, w)| when < *w) {
            oldest = Some(((r, 0), when));
        }
    }
    oldest.map(|(at, _)| at)
}

/// Drops the oldest droppable measurements until the status fits `budget`; whether it does.
fn drop_oldest(status: &mut AnalysisRunStatus, budget: usize) -> bool {
    let mut size = encoded_len(status);
    while size > budget {
        let Some((r, m)) = oldest_droppable(status) else {
            return false;
        };
        let Some(result) = status.metric_results.get_mut(r) else {
            return false;
        };
        if m < result.measurements.len() {
            let dropped = result.measurements.remove(m);
            // Its JSON and the comma between it and its neighbour; checked exactly below.
            let freed = serde_json::to_vec(&dropped).map_or(0, |v| v.len()) + 1;
            size = size.saturating_sub(freed);
        }
        if size <= budget {
            size = encoded_len(status);
        }
    }
    true
}

/// Brings `status` within [`STATUS_BUDGET`]; returns its encoded size.
pub fn fit(status: &mut AnalysisRunStatus) -> usize {
    fit_within(status, STATUS_BUDGET)
}

/// [`fit`] with another budget (for tests).
pub fn fit_within(status: &mut AnalysisRunStatus, budget: usize) -> usize {
    truncate_texts(status, MAX_TEXT);
    if encoded_len(status) <= budget || drop_oldest(status, budget) {
        return encoded_len(status);
    }
    truncate_texts(status, SHORT_TEXT);
    drop_oldest(status, budget);
    encoded_len(status)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use rollouts_crds::analysis::{AnalysisPhase, MetricResult};

    use super::*;

    fn at(second: i64) -> Option<Time> {
        Some(Time(Timestamp::from_second(second).expect("in range")))
    }

    fn measurement(second: i64, value: &str) -> Measurement {
        Measurement {
            phase: AnalysisPhase::Successful,
            value: value.to_string(),
            started_at: at(second),
            finished_at: at(second),
            ..Measurement::default()
        }
    }

    #[test]
    fn long_texts_are_cut_with_a_marker_on_a_character_boundary() {
        let mut text = "é".repeat(MAX_TEXT);
        truncate(&mut text, MAX_TEXT);
        assert!(
            text.len() <= MAX_TEXT && text.ends_with(TRUNCATED),
            "{}",
            text.len()
        );
        let mut short = "fine".to_string();
        truncate(&mut short, MAX_TEXT);
        assert_eq!(short, "fine");
    }

    #[test]
    fn a_huge_value_is_cut_and_the_status_stays_within_budget() {
        let huge = "x".repeat(10 * 1024 * 1024);
        let mut status = AnalysisRunStatus {
            phase: AnalysisPhase::Running,
            metric_results: vec![MetricResult {
                name: "web".into(),
                phase: AnalysisPhase::Running,
                measurements: vec![measurement(1, &huge)],
                ..MetricResult::default()
            }],
            ..AnalysisRunStatus::default()
        };
        let size = fit(&mut status);
        assert!(size <= STATUS_BUDGET, "{size}");
        let value = &status.metric_results[0].measurements[0].value;
        assert!(value.len() <= MAX_TEXT && value.ends_with(TRUNCATED));
    }

    #[test]
    fn many_metrics_with_long_histories_fit_by_dropping_the_oldest_first() {
        let value = "v".repeat(MAX_TEXT);
        let metrics = 100;
        let mut status = AnalysisRunStatus {
            phase: AnalysisPhase::Running,
            metric_results: (0..metrics)
                .map(|m| MetricResult {
                    name: format!("metric-{m}"),
                    phase: AnalysisPhase::Running,
                    measurements: (0..30)
                        .map(|i| measurement(1000 + i * 10 + m, &value))
                        .collect(),
                    ..MetricResult::default()
                })
                .collect(),
            ..AnalysisRunStatus::default()
        };
        let size = fit(&mut status);
        assert!(size <= STATUS_BUDGET, "{size}");
        assert_eq!(encoded_len(&status), size);
        for result in &status.metric_results {
            // The latest measurement of every running metric is kept...
            let last = result.measurements.last().expect("kept");
            assert!(
                last.started_at
                    .as_ref()
                    .is_some_and(|t| t.0.as_second() >= 1290)
            );
        }
        // ...and what was dropped was older than anything kept.
        let kept_oldest = status
            .metric_results
            .iter()
            .filter_map(|r| r.measurements.first())
            .filter_map(|m| m.started_at.as_ref())
            .map(|t| t.0.as_second())
            .min()
            .expect("measurements left");
        assert!(kept_oldest > 1000, "{kept_oldest}");
    }

    #[test]
    fn a_status_within_budget_is_left_as_it_is() {
        let mut status = AnalysisRunStatus {
            phase: AnalysisPhase::Running,
            metric_results: vec![MetricResult {
                name: "m".into(),
                measurements: vec![measurement(1, "0.99"), measurement(2, "0.98")],
                ..MetricResult::default()
            }],
            ..AnalysisRunStatus::default()
        };
        let before = status.clone();
        fit(&mut status);
        assert_eq!(status, before);
    }

    #[test]
    fn a_running_metric_keeps_its_last_measurement_even_over_budget() {
        let mut status = AnalysisRunStatus {
            phase: AnalysisPhase::Running,
            metric_results: vec![MetricResult {
                name: "m".into(),
                phase: AnalysisPhase::Running,
                measurements: vec![measurement(1, "a"), measurement(2, "b")],
                ..MetricResult::default()
            }],
            ..AnalysisRunStatus::default()
        };
        fit_within(&mut status, 10);
        assert_eq!(status.metric_results[0].measurements.len(), 1);
        assert_eq!(status.metric_results[0].measurements[0].value, "b");
    }
}
