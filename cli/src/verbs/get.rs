//! `get rollout NAME [--watch]`: the Rollout's summary and its tree of revisions, ReplicaSets,
//! pods, Experiments and AnalysisRuns; `get experiment NAME [--watch]`: the Experiment's summary
//! and its ReplicaSets, pods and AnalysisRuns. With `--watch`, redrawn in place whenever one of
//! the objects drawn changes.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use serde_json::Value;

use crate::cluster::{BadObject, Cluster, Listing, Selection, Watched};
use crate::error::{Error, Result};
use crate::patch::TargetKind;
use crate::view::tree::{Observed, ObservedExperiment, experiment_tree, owned_by, rollout_tree};

/// `get rollout`, `get experiment`.
#[derive(Debug, clap::Subcommand)]
pub enum Kind {
    /// Show a rollout, its revisions, ReplicaSets, pods, Experiments and AnalysisRuns.
    #[command(visible_aliases = ["rollouts", "ro"])]
    Rollout(Args),
    /// Show an experiment, its ReplicaSets, pods and AnalysisRuns.
    #[command(visible_aliases = ["experiments", "exp"])]
    Experiment(Args),
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Name of the object.
    pub name: String,
    /// Keep watching and redraw on every change (Ctrl-C to stop).
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// Do not colour the icons.
    #[arg(long)]
    pub no_color: bool,
}

/// Redraws never come closer together than this, however fast objects change.
const REDRAW_INTERVAL: Duration = Duration::from_millis(200);

/// Cursor home; each line then clears its own tail, and clear-to-end removes what is left of a
/// longer previous picture, so nothing flickers.
const HOME: &str = "\x1b[H";
const CLEAR_LINE_TAIL: &str = "\x1b[K";
const CLEAR_TO_END: &str = "\x1b[J";
const HIDE_CURSOR: &str = "\x1b[?25l";
const SHOW_CURSOR: &str = "\x1b[?25h";

/// A label selector (`key=value,...`) from a selector's matchLabels; None when it has none, or
/// when it also has matchExpressions (then everything is listed and ownership decides).
fn match_labels(selector: Option<&Value>) -> Option<String> {
    let selector = selector?;
    if selector
        .get("matchExpressions")
        .and_then(Value::as_array)
        .is_some_and(|expressions| !expressions.is_empty())
    {
        return None;
    }
    selector
        .get("matchLabels")
        .and_then(Value::as_object)
        .filter(|labels| !labels.is_empty())
        .map(|labels| {
            labels
                .iter()
                .map(|(key, value)| format!("{key}={}", value.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        })
}

/// What `get rollout` lists and watches: the Rollout itself and, by its selector when it has
/// one, its ReplicaSets and pods (an experiment step's ReplicaSets carry the same labels);
/// AnalysisRuns and Experiments by ownership only (their labels vary).
fn rollout_selections(name: &str, rollout: &Value) -> Vec<Selection> {
    let labels = match_labels(rollout.pointer("/spec/selector"));
    let by_labels = |kind| Selection {
        labels: labels.clone(),
        ..Selection::all(kind)
    };
    vec![
        Selection::named(Watched::Rollout, name),
        by_labels(Watched::ReplicaSet),
        by_labels(Watched::Pod),
        Selection::all(Watched::AnalysisRun),
        Selection::all(Watched::Experiment),
    ]
}

/// What `get experiment` lists and watches: the Experiment, the ReplicaSets and pods of each
/// template's selector (everything when a template's selector is not plain labels), and
/// AnalysisRuns by ownership.
fn experiment_selections(name: &str, experiment: &Value) -> Vec<Selection> {
    let templates = experiment
        .pointer("/spec/templates")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let selectors: Option<Vec<String>> = templates
        .iter()
        .map(|template| match_labels(template.get("selector")))
        .collect();
    let mut selections = vec![Selection::named(Watched::Experiment, name)];
    for kind in [Watched::ReplicaSet, Watched::Pod] {
        match &selectors {
            Some(selectors) if !selectors.is_empty() => {
                let mut distinct = selectors.clone();
                distinct.sort();
                distinct.dedup();
                selections.extend(distinct.into_iter().map(|labels| Selection {
                    labels: Some(labels),
                    ..Selection::all(kind)
                }));
            }
            _ => selections.push(Selection::all(kind)),
        }
    }
    selections.push(Selection::all(Watched::AnalysisRun));
    selections
}

/// Lists one kind; a kind the server does not serve (a CRD not installed) is simply empty.
async fn list_or_empty(
    cluster: &Cluster,
    selection: &Selection,
    target: Target,
    name: &str,
) -> Result<Listing> {
    let kind = match target {
        Target::Rollout => TargetKind::Rollout,
        Target::Experiment => TargetKind::Experiment,
    };
    match cluster.list_json_for(selection, kind, name).await {
        Err(Error::Api { status, .. }) if status.code == 404 => Ok(Listing::default()),
        other => other,
    }
}

/// Every object of `kind` the selections find, each once; one that does not decode is named.
async fn list_kind(
    cluster: &Cluster,
    selections: &[Selection],
    kind: Watched,
    target: Target,
    name: &str,
) -> Result<Listing> {
    let mut merged = Listing::default();
    let mut seen = std::collections::BTreeSet::new();
    for selection in selections.iter().filter(|s| s.kind == kind) {
        let listing = list_or_empty(cluster, selection, target, name).await?;
        for item in listing.items {
            let uid = item
                .pointer("/metadata/uid")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            if seen.insert(uid) {
                merged.items.push(item);
            }
        }
        for bad in listing.undecodable {
            if seen.insert(format!("{}/{}", bad.kind.kind(), bad.name())) {
                merged.undecodable.push(bad);
            }
        }
    }
    Ok(merged)
}

/// One line per object of the drawn one's that does not decode (ReplicaSets and pods by its
/// selector, AnalysisRuns and Experiments it owns), after the tree.
fn undecodable_lines(owner: &Value, listings: &[&Listing]) -> Vec<String> {
    let mine = |bad: &&BadObject| {
        !matches!(bad.kind, Watched::AnalysisRun | Watched::Experiment)
            || owned_by(&bad.metadata_json(), owner)
    };
    let lines: Vec<String> = listings
        .iter()
        .flat_map(|listing| listing.undecodable.iter().filter(mine))
        .map(|bad| format!("⚠ {bad}"))
        .collect();
    if lines.is_empty() {
        return lines;
    }
    std::iter::once(String::new()).chain(lines).collect()
}

/// What `get` draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Rollout,
    Experiment,
}

/// The picture of the object now, one string per line, and what to watch for changes.
async fn picture(
    cluster: &Cluster,
    target: Target,
    name: &str,
    colour: bool,
) -> Result<(Vec<String>, Vec<Selection>)> {
    match target {
        Target::Rollout => rollout_picture(cluster, name, colour).await,
        Target::Experiment => experiment_picture(cluster, name, colour).await,
    }
}

async fn rollout_picture(
    cluster: &Cluster,
    name: &str,
    colour: bool,
) -> Result<(Vec<String>, Vec<Selection>)> {
    let rollout = cluster.rollout_json(name).await?;
    let selections = rollout_selections(name, &rollout);
    let replica_sets = list_kind(
        cluster,
        &selections,
        Watched::ReplicaSet,
        Target::Rollout,
        name,
    )
    .await?;
    let pods = list_kind(cluster, &selections, Watched::Pod, Target::Rollout, name).await?;
    let analysis_runs = list_kind(
        cluster,
        &selections,
        Watched::AnalysisRun,
        Target::Rollout,
        name,
    )
    .await?;
    let experiments = list_kind(
        cluster,
        &selections,
        Watched::Experiment,
        Target::Rollout,
        name,
    )
    .await?;
    let mut lines = rollout_tree(
        Observed {
            rollout: &rollout,
            replica_sets: &replica_sets.items,
            pods: &pods.items,
            analysis_runs: &analysis_runs.items,
            experiments: &experiments.items,
        },
        Timestamp::now(),
        colour,
    );
    lines.extend(undecodable_lines(
        &rollout,
        &[&replica_sets, &pods, &analysis_runs, &experiments],
    ));
    Ok((lines, selections))
}

async fn experiment_picture(
    cluster: &Cluster,
    name: &str,
    colour: bool,
) -> Result<(Vec<String>, Vec<Selection>)> {
    let experiment = cluster.object_json(TargetKind::Experiment, name).await?;
    let selections = experiment_selections(name, &experiment);
    let replica_sets = list_kind(
        cluster,
        &selections,
        Watched::ReplicaSet,
        Target::Experiment,
        name,
    )
    .await?;
    let pods = list_kind(cluster, &selections, Watched::Pod, Target::Experiment, name).await?;
    let analysis_runs = list_kind(
        cluster,
        &selections,
        Watched::AnalysisRun,
        Target::Experiment,
        name,
    )
    .await?;
    let mut lines = experiment_tree(
        ObservedExperiment {
            experiment: &experiment,
            replica_sets: &replica_sets.items,
            pods: &pods.items,
            analysis_runs: &analysis_runs.items,
        },
        Timestamp::now(),
        colour,
    );
    lines.extend(undecodable_lines(
        &experiment,
        &[&replica_sets, &pods, &analysis_runs],
    ));
    Ok((lines, selections))
}

fn write_out(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| Error::Output(e.to_string()))
}

/// The whole screen for one redraw: home, each line with its tail cleared, then clear below.
pub fn frame(lines: &[String]) -> String {
    let mut text = String::from(HOME);
    for line in lines {
        text.push_str(line);
        text.push_str(CLEAR_LINE_TAIL);
        text.push('\n');
    }
    text.push_str(CLEAR_TO_END);
    text
}

pub async fn run(cluster: &Cluster, kind: &Kind) -> Result<()> {
    let (target, args) = match kind {
        Kind::Rollout(args) => (Target::Rollout, args),
        Kind::Experiment(args) => (Target::Experiment, args),
    };
    let colour = !args.no_color && std::io::stdout().is_terminal();
    if !args.watch {
        let (lines, _) = picture(cluster, target, &args.name, colour).await?;
        return write_out(&(lines.join("\n") + "\n"));
    }
    // The first picture also proves the object exists before the screen is taken over.
    let (mut shown, selections) = picture(cluster, target, &args.name, colour).await?;
    write_out(&format!("{HIDE_CURSOR}{}", frame(&shown)))?;
    let result = watch(cluster, target, &args.name, colour, &selections, &mut shown).await;
    write_out(SHOW_CURSOR)?;
    result
}

/// Redraws on changes until Ctrl-C.
async fn watch(
    cluster: &Cluster,
    target: Target,
    name: &str,
    colour: bool,
    selections: &[Selection],
    shown: &mut Vec<String>,
) -> Result<()> {
    let mut changes = cluster.changes(selections);
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let mut last_draw = Instant::now();
    // Ages move on even when nothing changes, so redraw at least once a second.
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = &mut interrupted => return Ok(()),
            change = changes.next() => if change.is_none() { return Ok(()) },
            _ = ticker.tick() => {}
        }
        let ready_at = last_draw + REDRAW_INTERVAL;
        tokio::select! {
            _ = &mut interrupted => return Ok(()),
            () = tokio::time::sleep_until(ready_at) => {}
        }
        // Changes that came in while waiting are covered by this redraw.
        while let Some(Some(())) = changes.next().now_or_never() {}
        let (lines, _) = picture(cluster, target, name, colour).await?;
        last_draw = Instant::now();
        if lines != *shown {
            write_out(&frame(&lines))?;
            *shown = lines;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_redraws_from_home_without_clearing_the_screen() {
        let frame = frame(&["Name: web".to_string(), "Status: ✔ Healthy".to_string()]);
        assert_eq!(
            frame,
            "\x1b[HName: web\x1b[K\nStatus: ✔ Healthy\x1b[K\n\x1b[J"
        );
        assert!(!frame.contains("\x1b[2J"), "a full clear flickers");
    }
}
