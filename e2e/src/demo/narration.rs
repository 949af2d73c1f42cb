//! The narration: from successive [`Snapshot`]s, one line per decision the controller made
//! (a step begun, a judge measurement, an analysis concluded, an abort, a rollback finished, a
//! version healthy), the controller's own events, and the traffic split Prometheus measured.
//! Everything said comes from the state read; nothing here knows the story in advance.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use super::cluster::Snapshot;

/// Who a line speaks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Voice {
    /// The demo explaining a decision it sees in the state.
    Story,
    /// An Event the controller recorded.
    Controller,
    /// The request rates Prometheus measured.
    Traffic,
}

/// One narration line; a milestone is worth a picture of the Rollout when there is no live view.
#[derive(Clone, Debug, PartialEq)]
pub struct Note {
    pub voice: Voice,
    pub text: String,
    pub milestone: bool,
}

impl Note {
    fn story(text: String, milestone: bool) -> Note {
        Note {
            voice: Voice::Story,
            text,
            milestone,
        }
    }
}

/// A request rate below this share of the highest seen means pods are coming and going.
const SETTLED_SHARE_OF_PEAK: f64 = 0.85;

/// A traffic split as reported: (version, share in percent rounded to 5).
type Split = Vec<(String, i64)>;

/// Remembers what has been said, so each decision is narrated once.
#[derive(Default)]
pub struct Narrator {
    /// (current hash, step index) last narrated.
    step: Option<(String, i64)>,
    measurements: HashSet<String>,
    run_phases: HashMap<String, String>,
    events: HashSet<String>,
    healthy: Option<String>,
    aborted: Option<String>,
    rolled_back: Option<String>,
    /// The split last reported, and the one seen on the previous poll (a split is reported once
    /// two polls agree, so the blend while pods change is not).
    split_reported: Split,
    split_seen: Split,
    /// The highest request rate seen: a total well below it is pods changing, not a split.
    peak_rps: f64,
    /// The canary's weight while it was last running, for measurements read after an abort.
    canary_weight: Option<i64>,
}

fn text<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

impl Narrator {
    pub fn observe(&mut self, now: &Snapshot) -> Vec<Note> {
        if !now.exists() {
            return Vec::new();
        }
        if !now.aborted()
            && let Some(weight) = now.canary_weight().filter(|w| *w > 0)
        {
            self.canary_weight = Some(weight);
        }
        // The step first, then what the analysis measured, then what the controller did about it.
        let mut notes: Vec<Note> = self.step(now).into_iter().collect();
        notes.extend(self.measurements(now));
        notes.extend(self.analysis_outcomes(now));
        notes.extend(self.controller_events(now));
        notes.extend(self.abort_and_rollback(now));
        notes.extend(self.healthy(now));
        notes.extend(self.traffic(now));
        notes
    }

    /// New Events about the Rollout and its AnalysisRuns, oldest first.
    fn controller_events(&mut self, now: &Snapshot) -> Vec<Note> {
        let rollout = text(&now.rollout, "/metadata/name");
        let mut fresh: Vec<&Value> = now
            .events
            .iter()
            .filter(|event| {
                let regarding = text(event, "/regarding/name");
                regarding == rollout
                    || (text(event, "/regarding/kind") == "AnalysisRun"
                        && now
                            .analysis_run(regarding)
                            .is_some_and(|run| owned_by(run, rollout)))
            })
            .filter(|event| !self.events.contains(text(event, "/metadata/uid")))
            .collect();
        fresh.sort_by_key(|event| text(event, "/eventTime").to_string());
        fresh
            .into_iter()
            .map(|event| {
                self.events.insert(text(event, "/metadata/uid").to_string());
                Note {
                    voice: Voice::Controller,
                    text: format!("{}: {}", text(event, "/reason"), text(event, "/note")),
                    milestone: false,
                }
            })
            .collect()
    }

    /// The step an update has just begun, with the pods each version has.
    fn step(&mut self, now: &Snapshot) -> Option<Note> {
        let (current, stable) = (now.current_hash(), now.stable_hash());
        let updating = !current.is_empty() && current != stable && !now.aborted();
        let index = now.step_index()?;
        let key = (current.to_string(), index);
        if !updating || self.step.as_ref() == Some(&key) {
            return None;
        }
        self.step = Some(key);
        let steps = now.steps();
        let step = steps.get(usize::try_from(index).ok()?)?;
        let position = format!("step {}/{}", index + 1, steps.len());
        let canary = now.version(current);
        let pods = format!(
            "{} of {} pods run {canary}, {} run stable {}",
            now.available(current),
            now.desired_replicas(),
            now.available(stable),
            now.version(stable)
        );
        let weight = now
            .canary_weight()
            .map_or(String::new(), |w| format!("canary at {w}%, "));
        let (text, milestone) = if let Some(weight) = step.get("setWeight") {
            (
                format!("{position}: setWeight {weight} — scaling canary {canary} up"),
                false,
            )
        } else if let Some(pause) = step.get("pause") {
            let how_long = match pause.get("duration") {
                Some(duration) => format!(
                    "pausing {} while the canary takes its share of traffic",
                    duration_text(duration)
                ),
                None => "paused until someone promotes it".to_string(),
            };
            (format!("{weight}{pods}; {position}: {how_long}"), true)
        } else if let Some(analysis) = step.get("analysis") {
            let templates: Vec<&str> = analysis
                .pointer("/templates")
                .and_then(Value::as_array)
                .map(|ts| ts.iter().map(|t| text(t, "/templateName")).collect())
                .unwrap_or_default();
            (
                format!(
                    "{position}: analysis {} — {weight}the judge compares canary {canary} with stable {} over the same window",
                    templates.join(", "),
                    now.version(stable)
                ),
                false,
            )
        } else {
            (format!("{weight}{position}"), false)
        };
        Some(Note::story(text, milestone))
    }

    /// Each new measurement of the Rollout's AnalysisRuns, judge measurements with both sides.
    fn measurements(&mut self, now: &Snapshot) -> Vec<Note> {
        let rollout = text(&now.rollout, "/metadata/name");
        let mut notes = Vec::new();
        for run in now
            .analysis_runs
            .iter()
            .filter(|run| owned_by(run, rollout))
        {
            let run_name = text(run, "/metadata/name");
            let results = run
                .pointer("/status/metricResults")
                .and_then(Value::as_array);
            for result in results.into_iter().flatten() {
                let metric_name = text(result, "/name");
                let spec = run
                    .pointer("/spec/metrics")
                    .and_then(Value::as_array)
                    .and_then(|ms| ms.iter().find(|m| text(m, "/name") == metric_name));
                let measurements = result.pointer("/measurements").and_then(Value::as_array);
                for (taken, measurement) in measurements.into_iter().flatten().enumerate() {
                    let phase = text(measurement, "/phase");
                    if phase.is_empty() || phase == "Running" || phase == "Pending" {
                        continue;
                    }
                    let key = format!(
                        "{run_name}/{metric_name}/{}/{taken}",
                        text(measurement, "/startedAt")
                    );
                    if !self.measurements.insert(key) {
                        continue;
                    }
                    let count = spec
                        .and_then(|m| m.get("count"))
                        .and_then(|c| c.as_i64().or_else(|| c.as_str()?.parse().ok()));
                    let ordinal = match count {
                        Some(count) => format!("{}/{count}", taken + 1),
                        None => format!("{}", taken + 1),
                    };
                    let weight = self
                        .canary_weight
                        .map_or(String::new(), |w| format!("canary at {w}%, "));
                    let said = judged(measurement, spec, metric_name).unwrap_or_else(|| {
                        format!("{metric_name}: {phase}, {}", text(measurement, "/message"))
                    });
                    notes.push(Note::story(
                        format!("{weight}analysis running: {said} ({ordinal})"),
                        false,
                    ));
                }
            }
        }
        notes
    }

    /// AnalysisRuns of the Rollout that have just concluded.
    fn analysis_outcomes(&mut self, now: &Snapshot) -> Vec<Note> {
        let rollout = text(&now.rollout, "/metadata/name");
        let mut notes = Vec::new();
        for run in now
            .analysis_runs
            .iter()
            .filter(|run| owned_by(run, rollout))
        {
            let (name, phase) = (text(run, "/metadata/name"), text(run, "/status/phase"));
            if !matches!(phase, "Successful" | "Failed" | "Error" | "Inconclusive") {
                continue;
            }
            if self.run_phases.get(name).map(String::as_str) == Some(phase) {
                continue;
            }
            self.run_phases.insert(name.to_string(), phase.to_string());
            let what_follows = match phase {
                "Successful" => "the Rollout moves on",
                "Inconclusive" => "the Rollout pauses for a person",
                _ => "rolling back",
            };
            notes.push(Note::story(
                format!("analysis {name}: {phase} — {what_follows}"),
                true,
            ));
        }
        notes
    }

    fn abort_and_rollback(&mut self, now: &Snapshot) -> Vec<Note> {
        let mut notes = Vec::new();
        let (current, stable) = (now.current_hash(), now.stable_hash());
        if !now.aborted() || current.is_empty() {
            return notes;
        }
        if self.aborted.as_deref() != Some(current) {
            self.aborted = Some(current.to_string());
            notes.push(Note::story(
                format!(
                    "Rollout aborted: canary {} goes back to stable {} by itself",
                    now.version(current),
                    now.version(stable),
                ),
                false,
            ));
        }
        let back = now.wanted(current) == 0
            && now.available(current) == 0
            && now.available(stable) >= now.desired_replicas()
            && now.canary_weight().unwrap_or(0) == 0;
        if back && self.rolled_back.as_deref() != Some(current) {
            self.rolled_back = Some(current.to_string());
            notes.push(Note::story(
                format!(
                    "back at 100% stable: {} of {} pods run {}, canary {} scaled to 0",
                    now.available(stable),
                    now.desired_replicas(),
                    now.version(stable),
                    now.version(current)
                ),
                true,
            ));
        }
        notes
    }

    fn healthy(&mut self, now: &Snapshot) -> Option<Note> {
        let current = now.current_hash();
        let healthy =
            now.phase() == "Healthy" && !current.is_empty() && now.stable_hash() == current;
        if !healthy || self.healthy.as_deref() == Some(current) {
            return None;
        }
        self.healthy = Some(current.to_string());
        Some(Note::story(
            format!(
                "{} is Healthy: {} of {} pods run {} (stable)",
                text(&now.rollout, "/metadata/name"),
                now.available(current),
                now.desired_replicas(),
                now.version(current)
            ),
            true,
        ))
    }

    /// The split of requests between versions, once two polls agree on it.
    fn traffic(&mut self, now: &Snapshot) -> Option<Note> {
        let traffic = now.traffic.as_ref()?;
        let total: f64 = traffic.iter().map(|t| t.rps).sum();
        self.peak_rps = self.peak_rps.max(total);
        if total <= 0.0 || total < SETTLED_SHARE_OF_PEAK * self.peak_rps {
            return None;
        }
        let split: Split = traffic
            .iter()
            .map(|t| (t.hash.clone(), ((t.rps / total * 20.0).round() as i64) * 5))
            .filter(|(_, share)| *share > 0)
            .collect();
        // Prometheus lags the pods by a scrape or two: a version with no pod left is history.
        if split.iter().any(|(hash, _)| now.available(hash) == 0) {
            self.split_seen.clear();
            return None;
        }
        let settled = split == self.split_seen;
        self.split_seen = split.clone();
        if !settled || split == self.split_reported {
            return None;
        }
        self.split_reported = split.clone();
        let shares: Vec<String> = split
            .iter()
            .map(|(hash, share)| {
                let role = if hash == now.stable_hash() {
                    " (stable)"
                } else if hash == now.current_hash() {
                    " (canary)"
                } else {
                    ""
                };
                format!("{share}% to {}{role}", now.version(hash))
            })
            .collect();
        Some(Note {
            voice: Voice::Traffic,
            text: format!("{total:.0} req/s: {}", shares.join(", ")),
            milestone: false,
        })
    }
}

fn owned_by(run: &Value, rollout: &str) -> bool {
    run.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|owners| {
            owners
                .iter()
                .any(|o| text(o, "/kind") == "Rollout" && text(o, "/name") == rollout)
        })
}

/// "canary 0.9% vs stable 1.0% on errors — judge: Pass" for a judge measurement (None for
/// other providers); a High or Low verdict comes first, so a narrow screen still shows it.
fn judged(measurement: &Value, spec: Option<&Value>, metric_name: &str) -> Option<String> {
    let value: Value = serde_json::from_str(text(measurement, "/value")).ok()?;
    let verdict = value.get("verdict")?.as_str()?;
    let judge = spec.and_then(|m| m.pointer("/provider/judge"));
    let query = judge.map(|j| text(j, "/query")).unwrap_or_default();
    let mean = |field: &str| value.get(field).and_then(Value::as_f64);
    let sides = match (mean("canaryMean"), mean("baselineMean")) {
        (Some(canary), Some(baseline)) => format!(
            "canary {} vs stable {}",
            quantity(canary, baseline, query, canary),
            quantity(canary, baseline, query, baseline)
        ),
        _ => format!(
            "canary {} samples vs stable {}",
            value
                .get("canarySamples")
                .and_then(Value::as_u64)
                .unwrap_or(0),
            value
                .get("baselineSamples")
                .and_then(Value::as_u64)
                .unwrap_or(0)
        ),
    };
    let confidence = judge
        .and_then(|j| j.get("confidence"))
        .and_then(Value::as_f64)
        .unwrap_or(0.98);
    let ratio = mean("meanRatio").map_or(String::new(), |r| format!(" ({r:.1}x)"));
    Some(match verdict {
        "High" | "Low" => format!(
            "judge: {verdict} at {:.0}% confidence — {sides} on {metric_name}{ratio}",
            confidence * 100.0
        ),
        "NoData" => format!("{sides} on {metric_name} — judge: NoData (too few samples)"),
        _ => format!("{sides} on {metric_name} — judge: {verdict}"),
    })
}

/// A mean in the metric's unit: milliseconds for a query over `_seconds` series, a percentage
/// for ratios (both means within 0..1), else the plain number.
fn quantity(canary: f64, baseline: f64, query: &str, value: f64) -> String {
    if query.contains("_seconds") {
        format!("{:.1} ms", value * 1000.0)
    } else if (0.0..=1.0).contains(&canary) && (0.0..=1.0).contains(&baseline) {
        format!("{:.1}%", value * 100.0)
    } else {
        format!("{value:.3}")
    }
}

fn duration_text(duration: &Value) -> String {
    match duration {
        Value::Number(seconds) => format!("{seconds}s"),
        other => other.as_str().unwrap_or_default().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::cluster::VersionTraffic;
    use super::*;
    use serde_json::json;

    const STABLE: &str = "aaaa";
    const CANARY: &str = "bbbb";

    fn replica_set(hash: &str, tag: &str, replicas: i64, available: i64) -> Value {
        json!({
            "metadata": {"name": format!("web-{hash}"), "labels": {"rollouts-pod-template-hash": hash}},
            "spec": {"replicas": replicas, "template": {"spec": {"containers": [{"image": format!("registry.example.com/web:{tag}")}]}}},
            "status": {"availableReplicas": available},
        })
    }

    fn rollout(status: Value) -> Value {
        json!({
            "metadata": {"name": "web"},
            "spec": {"replicas": 5, "strategy": {"canary": {"steps": [
                {"setWeight": 20},
                {"pause": {"duration": "20s"}},
                {"analysis": {"templates": [{"templateName": "judge-error-rate"}]}},
            ]}}},
            "status": status,
        })
    }

    fn judge_run(phase: &str, measurements: Value) -> Value {
        json!({
            "metadata": {"name": "web-bbbb-2-2", "ownerReferences": [{"kind": "Rollout", "name": "web"}]},
            "spec": {"metrics": [{"name": "errors-vs-stable", "count": 3, "provider": {"judge": {
                "query": "sum(rate(http_requests_total{code=~\"5..\"}[5s]))", "confidence": 0.98}}}]},
            "status": {"phase": phase, "metricResults": [{"name": "errors-vs-stable", "measurements": measurements}]},
        })
    }

    fn measurement(started: &str, phase: &str, verdict: &str, canary: f64, stable: f64) -> Value {
        json!({
            "phase": phase,
            "startedAt": started,
            "value": json!({"verdict": verdict, "canaryMean": canary, "baselineMean": stable,
                "meanRatio": canary / stable}).to_string(),
        })
    }

    fn canary_paused() -> Snapshot {
        Snapshot {
            rollout: rollout(json!({
                "currentPodHash": CANARY, "stableRS": STABLE, "currentStepIndex": 1,
                "phase": "Paused", "canary": {"weights": {"canary": {"weight": 20}}},
            })),
            replica_sets: vec![
                replica_set(STABLE, "1.0.0", 4, 4),
                replica_set(CANARY, "2.0.0", 1, 1),
            ],
            ..Snapshot::default()
        }
    }

    fn texts(notes: &[Note]) -> Vec<&str> {
        notes.iter().map(|n| n.text.as_str()).collect()
    }

    #[test]
    fn a_pause_step_says_the_weight_and_the_pods_of_each_version_once() {
        let mut narrator = Narrator::default();
        let notes = narrator.observe(&canary_paused());
        assert_eq!(
            texts(&notes),
            [
                "canary at 20%, 1 of 5 pods run 2.0.0, 4 run stable 1.0.0; step 2/3: pausing 20s while the canary takes its share of traffic"
            ]
        );
        assert!(notes[0].milestone);
        assert!(narrator.observe(&canary_paused()).is_empty(), "said once");
    }

    #[test]
    fn judge_measurements_give_both_sides_and_the_verdict() {
        let mut narrator = Narrator::default();
        let mut snapshot = canary_paused();
        narrator.observe(&snapshot);
        snapshot.analysis_runs = vec![judge_run(
            "Running",
            json!([measurement("t1", "Successful", "Pass", 0.009, 0.010)]),
        )];
        assert_eq!(
            texts(&narrator.observe(&snapshot)),
            [
                "canary at 20%, analysis running: canary 0.9% vs stable 1.0% on errors-vs-stable — judge: Pass (1/3)"
            ]
        );
        snapshot.analysis_runs = vec![judge_run(
            "Failed",
            json!([
                measurement("t1", "Successful", "Pass", 0.009, 0.010),
                measurement("t2", "Failed", "High", 0.2, 0.01),
            ]),
        )];
        assert_eq!(
            texts(&narrator.observe(&snapshot)),
            [
                "canary at 20%, analysis running: judge: High at 98% confidence — canary 20.0% vs stable 1.0% on errors-vs-stable (20.0x) (2/3)",
                "analysis web-bbbb-2-2: Failed — rolling back",
            ]
        );
    }

    #[test]
    fn an_abort_is_told_then_the_return_to_stable_once_the_canary_is_gone() {
        let mut narrator = Narrator::default();
        let mut snapshot = canary_paused();
        snapshot.rollout = rollout(json!({
            "currentPodHash": CANARY, "stableRS": STABLE, "abort": true, "phase": "Degraded",
            "message": "RolloutAborted: analysis failed",
            "canary": {"weights": {"canary": {"weight": 0}}},
        }));
        snapshot.replica_sets = vec![
            replica_set(STABLE, "1.0.0", 5, 4),
            replica_set(CANARY, "2.0.0", 0, 0),
        ];
        assert_eq!(
            texts(&narrator.observe(&snapshot)),
            ["Rollout aborted: canary 2.0.0 goes back to stable 1.0.0 by itself"]
        );
        snapshot.replica_sets[0] = replica_set(STABLE, "1.0.0", 5, 5);
        let notes = narrator.observe(&snapshot);
        assert_eq!(
            texts(&notes),
            ["back at 100% stable: 5 of 5 pods run 1.0.0, canary 2.0.0 scaled to 0"]
        );
        assert!(notes[0].milestone);
    }

    #[test]
    fn healthy_is_said_once_per_version() {
        let mut narrator = Narrator::default();
        let mut snapshot = canary_paused();
        snapshot.rollout = rollout(json!({
            "currentPodHash": CANARY, "stableRS": CANARY, "phase": "Healthy", "currentStepIndex": 3,
        }));
        snapshot.replica_sets = vec![replica_set(CANARY, "2.0.0", 5, 5)];
        assert_eq!(
            texts(&narrator.observe(&snapshot)),
            ["web is Healthy: 5 of 5 pods run 2.0.0 (stable)"]
        );
        assert!(narrator.observe(&snapshot).is_empty());
    }

    #[test]
    fn a_traffic_split_is_reported_once_two_polls_agree() {
        let mut narrator = Narrator::default();
        let mut snapshot = canary_paused();
        narrator.observe(&snapshot);
        let split = |stable: f64, canary: f64| {
            Some(vec![
                VersionTraffic {
                    hash: STABLE.into(),
                    rps: stable,
                },
                VersionTraffic {
                    hash: CANARY.into(),
                    rps: canary,
                },
            ])
        };
        snapshot.traffic = split(400.0, 100.0);
        assert!(narrator.observe(&snapshot).is_empty(), "seen once");
        snapshot.traffic = split(401.0, 99.0);
        assert_eq!(
            texts(&narrator.observe(&snapshot)),
            ["500 req/s: 80% to 1.0.0 (stable), 20% to 2.0.0 (canary)"]
        );
        assert!(narrator.observe(&snapshot).is_empty(), "unchanged");
        snapshot.replica_sets[1] = replica_set(CANARY, "2.0.0", 0, 0);
        snapshot.traffic = split(425.0, 75.0);
        assert!(
            narrator.observe(&snapshot).is_empty(),
            "a version without pods"
        );
        assert!(
            narrator.observe(&snapshot).is_empty(),
            "a version without pods"
        );
    }

    #[test]
    fn events_of_the_rollout_are_told_in_order_once() {
        let mut narrator = Narrator::default();
        let mut snapshot = canary_paused();
        narrator.observe(&snapshot);
        let event = |uid: &str, at: &str, name: &str, reason: &str| {
            json!({"metadata": {"uid": uid}, "eventTime": at, "reason": reason, "note": "n",
                "regarding": {"kind": "Rollout", "name": name}})
        };
        snapshot.events = vec![
            event("2", "2026-01-01T00:00:02Z", "web", "Second"),
            event("1", "2026-01-01T00:00:01Z", "web", "First"),
            event("3", "2026-01-01T00:00:03Z", "other", "Elsewhere"),
        ];
        assert_eq!(
            texts(&narrator.observe(&snapshot)),
            ["First: n", "Second: n"]
        );
        assert!(narrator.observe(&snapshot).is_empty());
    }
}
