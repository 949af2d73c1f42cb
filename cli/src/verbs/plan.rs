//! `plan -f FILE | NAME [--replicas N]`: a dry run of a Rollout's steps, with the canary and
//! stable replica counts and traffic weights the controller would set at each, its pauses and
//! analyses, and where pod counts make the weight differ from the one asked. The numbers come
//! from the controller's own replica arithmetic, so the plan and the controller agree.

use std::path::PathBuf;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use rollouts_controller::planner::replicas::{
    CanaryScale, MAX_WEIGHT, TrafficRoutedInputs, actual_weight,
    approximate_weighted_canary_stable_replica_counts,
    calculate_replica_counts_for_traffic_routed_canary, resolve_fenceposts,
};
use serde_json::Value;

use crate::cluster::Cluster;
use crate::error::{Error, Result};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Name of a rollout in the cluster (or give -f).
    #[arg(required_unless_present = "filename", conflicts_with = "filename")]
    pub name: Option<String>,
    /// A manifest file; every Rollout in it is planned.
    #[arg(short = 'f', long = "filename")]
    pub filename: Option<PathBuf>,
    /// Plan for this many replicas instead of spec.replicas.
    #[arg(long)]
    pub replicas: Option<i32>,
}

/// The pods and traffic a basic canary (no router) settles on for `weight`: the controller's
/// nearest split, with one surge pod when maxSurge allows, and the weight those pods give.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodSplit {
    pub canary: i32,
    pub stable: i32,
    /// The canary's real share of traffic, in percent.
    pub weight: i32,
}

/// See [`PodSplit`].
pub fn basic_canary_split(replicas: i32, weight: i32, max_surge: i32) -> PodSplit {
    let counts =
        approximate_weighted_canary_stable_replica_counts(replicas, weight, MAX_WEIGHT, max_surge);
    PodSplit {
        canary: counts.canary,
        stable: counts.stable,
        weight: actual_weight(counts.canary, counts.canary + counts.stable),
    }
}

fn int_or_string(value: Option<&Value>) -> Option<IntOrString> {
    match value? {
        Value::Number(n) => n.as_i64().map(|n| IntOrString::Int(n as i32)),
        Value::String(s) => Some(IntOrString::String(s.clone())),
        _ => None,
    }
}

fn template_names(analysis: &Value) -> String {
    let names: Vec<&str> = analysis
        .get("templates")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|t| t.get("templateName").and_then(Value::as_str))
        .collect();
    if names.is_empty() {
        "(no templates)".to_string()
    } else {
        names.join(", ")
    }
}

fn pause_words(pause: &Value) -> String {
    match pause.get("duration") {
        Some(Value::String(d)) => format!("pause {d}"),
        Some(Value::Number(n)) => format!("pause {n}s"),
        _ => "pause until promoted".to_string(),
    }
}

/// One line of the plan table.
struct PlanRow {
    step: String,
    action: String,
    canary: String,
    stable: String,
    weight: String,
    note: String,
}

fn table(rows: &[PlanRow]) -> Vec<String> {
    let header = PlanRow {
        step: "STEP".into(),
        action: "ACTION".into(),
        canary: "CANARY".into(),
        stable: "STABLE".into(),
        weight: "WEIGHT".into(),
        note: "NOTE".into(),
    };
    let all: Vec<&PlanRow> = std::iter::once(&header).chain(rows).collect();
    let width =
        |f: fn(&PlanRow) -> &String| all.iter().map(|r| f(r).chars().count()).max().unwrap_or(0);
    let widths = [
        width(|r| &r.step),
        width(|r| &r.action),
        width(|r| &r.canary),
        width(|r| &r.stable),
        width(|r| &r.weight),
    ];
    all.iter()
        .map(|r| {
            format!(
                "{:<w0$}  {:<w1$}  {:<w2$}  {:<w3$}  {:<w4$}  {}",
                r.step,
                r.action,
                r.canary,
                r.stable,
                r.weight,
                r.note,
                w0 = widths[0],
                w1 = widths[1],
                w2 = widths[2],
                w3 = widths[3],
                w4 = widths[4],
            )
            .trim_end()
            .to_string()
        })
        .collect()
}

/// The plan of one Rollout (its JSON), one string per line.
pub fn plan(rollout: &Value, replicas_override: Option<i32>) -> Result<Vec<String>> {
    let name = rollout
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("<unnamed>");
    let replicas = replicas_override.unwrap_or_else(|| {
        rollout
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .map_or(1, |r| r as i32)
    });
    if replicas < 0 {
        return Err(Error::Invalid(format!(
            "rollout '{name}': --replicas {replicas} is negative (fix: pass 0 or more)"
        )));
    }
    if let Some(canary) = rollout.pointer("/spec/strategy/canary") {
        return canary_plan(name, canary, replicas);
    }
    if let Some(blue_green) = rollout.pointer("/spec/strategy/blueGreen") {
        return Ok(blue_green_plan(name, blue_green, replicas));
    }
    Err(Error::Invalid(format!(
        "rollout '{name}': spec.strategy has neither canary nor blueGreen (fix: add one of them)"
    )))
}

fn canary_plan(name: &str, canary: &Value, replicas: i32) -> Result<Vec<String>> {
    let routed = canary.get("trafficRouting").is_some();
    let fenceposts = resolve_fenceposts(
        int_or_string(canary.get("maxSurge")).as_ref(),
        int_or_string(canary.get("maxUnavailable")).as_ref(),
        replicas,
    )
    .map_err(|e| Error::Invalid(format!("rollout '{name}': {e}")))?;
    let min_pods = canary
        .get("minPodsPerReplicaSet")
        .and_then(Value::as_i64)
        .map(|n| n as i32);
    let dynamic_stable_scale = canary
        .get("dynamicStableScale")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut lines = vec![format!(
        "Rollout '{name}': canary, {replicas} replica{}, {}, maxSurge {}, maxUnavailable {}",
        if replicas == 1 { "" } else { "s" },
        if routed {
            "traffic router sets the weights"
        } else {
            "no traffic router (traffic follows pod counts)"
        },
        fenceposts.max_surge,
        fenceposts.max_unavailable
    )];
    if let Some(background) = canary.get("analysis") {
        let start = background
            .get("startingStep")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        lines.push(format!(
            "Background analysis: {} (from step {start} until the rollout finishes; a failure aborts)",
            template_names(background)
        ));
    }
    let steps = canary
        .get("steps")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut weight = 0;
    let mut scale: Option<CanaryScale> = None;
    let mut rows = Vec::new();
    let sizes = |weight: i32, scale: Option<CanaryScale>| -> (i32, i32, i32, String) {
        if routed {
            let counts = calculate_replica_counts_for_traffic_routed_canary(TrafficRoutedInputs {
                spec_replicas: replicas,
                canary_scale: scale.unwrap_or(CanaryScale::Weight(weight)),
                max_weight: MAX_WEIGHT,
                min_pods_per_replica_set: min_pods,
                dynamic_stable_scale,
                current_weights: Some((weight, MAX_WEIGHT - weight)),
                aborted: false,
            });
            (counts.canary, counts.stable, weight, String::new())
        } else {
            let split = basic_canary_split(replicas, weight, fenceposts.max_surge);
            let note = if split.weight != weight {
                format!(
                    "asked {weight}%: {} of {} pods give {}%",
                    split.canary,
                    split.canary + split.stable,
                    split.weight
                )
            } else {
                String::new()
            };
            (split.canary, split.stable, split.weight, note)
        }
    };
    for (index, step) in steps.iter().enumerate() {
        let mut note = String::new();
        let action = if let Some(w) = step.get("setWeight").and_then(Value::as_i64) {
            weight = w as i32;
            format!("setWeight {weight}")
        } else if let Some(pause) = step.get("pause") {
            pause_words(pause)
        } else if let Some(analysis) = step.get("analysis") {
            note = "waits for the run: failed aborts, inconclusive pauses".to_string();
            format!("analysis {}", template_names(analysis))
        } else if let Some(set_scale) = step.get("setCanaryScale") {
            if !routed {
                note =
                    "ignored: setCanaryScale needs spec.strategy.canary.trafficRouting".to_string();
            }
            if let Some(n) = set_scale.get("replicas").and_then(Value::as_i64) {
                scale = routed.then_some(CanaryScale::Replicas(n as i32));
                format!("setCanaryScale replicas {n}")
            } else if let Some(w) = set_scale.get("weight").and_then(Value::as_i64) {
                scale = routed.then_some(CanaryScale::Weight(w as i32));
                format!("setCanaryScale weight {w}")
            } else {
                scale = None;
                "setCanaryScale matchTrafficWeight".to_string()
            }
        } else if let Some(experiment) = step.get("experiment") {
            let templates = experiment
                .get("templates")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            format!(
                "experiment ({templates} template{})",
                if templates == 1 { "" } else { "s" }
            )
        } else if let Some(route) = step.get("setHeaderRoute") {
            format!(
                "setHeaderRoute {}",
                route
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
            )
        } else if let Some(route) = step.get("setMirrorRoute") {
            format!(
                "setMirrorRoute {}",
                route
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
            )
        } else if let Some(plugin) = step.get("plugin") {
            format!(
                "plugin {}",
                plugin
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
            )
        } else {
            "(empty step)".to_string()
        };
        let (canary_pods, stable_pods, real_weight, rounding) = sizes(weight, scale);
        // Rounding is reported where the weight is set, not again on every step that keeps it.
        if note.is_empty() && step.get("setWeight").is_some() {
            note = rounding;
        }
        rows.push(PlanRow {
            step: index.to_string(),
            action,
            canary: canary_pods.to_string(),
            stable: stable_pods.to_string(),
            weight: real_weight.to_string(),
            note,
        });
    }
    rows.push(PlanRow {
        step: "end".into(),
        action: "promote: canary becomes stable".into(),
        canary: replicas.to_string(),
        stable: "0".into(),
        weight: MAX_WEIGHT.to_string(),
        note: "the old ReplicaSet scales down".into(),
    });
    lines.extend(table(&rows));
    Ok(lines)
}

fn blue_green_plan(name: &str, blue_green: &Value, replicas: i32) -> Vec<String> {
    let text = |key: &str| blue_green.get(key).and_then(Value::as_str);
    let preview_replicas = blue_green
        .get("previewReplicaCount")
        .and_then(Value::as_i64)
        .map_or(replicas, |n| n as i32);
    let mut lines = vec![format!(
        "Rollout '{name}': blueGreen, {replicas} replica{}, active service {}, preview service {}",
        if replicas == 1 { "" } else { "s" },
        text("activeService").unwrap_or("(none)"),
        text("previewService").unwrap_or("(none)")
    )];
    let mut steps = vec![format!(
        "the new ReplicaSet scales to {preview_replicas} pod{}; the preview service selects it",
        if preview_replicas == 1 { "" } else { "s" }
    )];
    if let Some(analysis) = blue_green.get("prePromotionAnalysis") {
        steps.push(format!(
            "prePromotionAnalysis {}: a failure aborts before any user traffic moves",
            template_names(analysis)
        ));
    }
    let auto = blue_green
        .get("autoPromotionEnabled")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let auto_seconds = blue_green
        .get("autoPromotionSeconds")
        .and_then(Value::as_i64);
    steps.push(match (auto, auto_seconds) {
        (false, _) => "pause until promoted (autoPromotionEnabled: false)".to_string(),
        (true, Some(seconds)) => format!("pause {seconds}s, then promote"),
        (true, None) => "promote as soon as the new pods are available".to_string(),
    });
    if preview_replicas != replicas {
        steps.push(format!(
            "the new ReplicaSet scales to {replicas} pods before the switch"
        ));
    }
    steps.push("the active service switches to the new ReplicaSet: 100% of traffic".to_string());
    if let Some(analysis) = blue_green.get("postPromotionAnalysis") {
        steps.push(format!(
            "postPromotionAnalysis {}: a failure switches the active service back",
            template_names(analysis)
        ));
    }
    let delay = blue_green
        .get("scaleDownDelaySeconds")
        .and_then(Value::as_i64)
        .unwrap_or(30);
    steps.push(format!("the old ReplicaSet scales down after {delay}s"));
    lines.extend(
        steps
            .into_iter()
            .enumerate()
            .map(|(i, step)| format!("{i}  {step}")),
    );
    lines
}

/// The Rollouts in a manifest file, as JSON.
fn rollouts_in(path: &PathBuf) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::ReadFile {
        path: path.display().to_string(),
        source,
    })?;
    let documents: Vec<Value> = serde_saphyr::from_multiple(&text).map_err(|e| {
        Error::Invalid(format!(
            "{}: not valid YAML: {e} (fix: run `kubectl rollouts lint -f {}`)",
            path.display(),
            path.display()
        ))
    })?;
    let rollouts: Vec<Value> = documents
        .into_iter()
        .filter(|d| d.get("kind").and_then(Value::as_str) == Some("Rollout"))
        .collect();
    if rollouts.is_empty() {
        return Err(Error::Invalid(format!(
            "{}: no document has kind: Rollout (fix: pass a file holding a Rollout)",
            path.display()
        )));
    }
    Ok(rollouts)
}

/// Plans the Rollouts of a file, or the named one from the cluster.
pub async fn run(args: &Args, connect: impl AsyncFnOnce() -> Result<Cluster>) -> Result<()> {
    let rollouts = match (&args.filename, &args.name) {
        (Some(path), _) => rollouts_in(path)?,
        (None, Some(name)) => vec![connect().await?.rollout_json(name).await?],
        (None, None) => {
            return Err(Error::Invalid(
                "plan needs a rollout: pass NAME or -f FILE".to_string(),
            ));
        }
    };
    let mut blocks = Vec::new();
    for rollout in &rollouts {
        blocks.push(plan(rollout, args.replicas)?.join("\n"));
    }
    println!("{}", blocks.join("\n\n"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn five_percent_of_four_pods_uses_a_surge_pod_and_says_so() {
        let split = basic_canary_split(4, 5, 1);
        assert_eq!(
            split.weight,
            actual_weight(split.canary, split.canary + split.stable)
        );
        assert_ne!(split.weight, 5);
        assert!(split.canary >= 1);
        let rollout = json!({
            "metadata": {"name": "web"},
            "spec": {"replicas": 4, "strategy": {"canary": {"steps": [{"setWeight": 5}, {"pause": {}}]}}}
        });
        let lines = plan(&rollout, None).unwrap();
        assert_eq!(
            lines[0],
            "Rollout 'web': canary, 4 replicas, no traffic router (traffic follows pod counts), maxSurge 1, maxUnavailable 1"
        );
        assert!(lines[2].starts_with("0     setWeight 5"), "{}", lines[2]);
        assert!(
            lines[2].contains(&format!("asked 5%: {} of", split.canary)),
            "{}",
            lines[2]
        );
        assert!(lines[3].contains("pause until promoted"), "{}", lines[3]);
    }

    #[test]
    fn a_router_carries_the_exact_weight_and_set_canary_scale_sizes_the_canary() {
        let rollout = json!({
            "metadata": {"name": "web"},
            "spec": {"replicas": 8, "strategy": {"canary": {
                "trafficRouting": {"nginx": {"stableIngress": "web"}},
                "steps": [{"setCanaryScale": {"replicas": 1}}, {"setWeight": 10},
                          {"setCanaryScale": {"matchTrafficWeight": true}}, {"setWeight": 50}]
            }}}
        });
        let lines = plan(&rollout, None).unwrap();
        let cells = |line: &str| {
            line.split_whitespace()
                .map(String::from)
                .collect::<Vec<_>>()
        };
        assert_eq!(cells(&lines[3])[..5], ["1", "setWeight", "10", "1", "8"]);
        assert_eq!(cells(&lines[3])[5], "10");
        assert_eq!(
            cells(&lines[5])[..6],
            ["3", "setWeight", "50", "4", "8", "50"]
        );
    }

    #[test]
    fn replicas_can_be_overridden_and_blue_green_is_described() {
        let rollout = json!({
            "metadata": {"name": "web"},
            "spec": {"replicas": 2, "strategy": {"blueGreen": {
                "activeService": "web", "previewService": "web-preview", "autoPromotionEnabled": false
            }}}
        });
        let lines = plan(&rollout, Some(6)).unwrap();
        assert_eq!(
            lines[0],
            "Rollout 'web': blueGreen, 6 replicas, active service web, preview service web-preview"
        );
        assert!(
            lines
                .iter()
                .any(|l| l == "1  pause until promoted (autoPromotionEnabled: false)")
        );
        assert!(plan(&rollout, Some(-1)).is_err());
    }
}
