//! `get rollout NAME [--watch]`: the Rollout's summary and its tree of revisions, ReplicaSets,
//! pods and AnalysisRuns; with `--watch`, redrawn in place whenever one of them changes.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use serde_json::Value;

use crate::cluster::{BadObject, Cluster, Listing, Selection, Watched};
use crate::error::{Error, Result};
use crate::view::tree::{Observed, owned_by, rollout_tree};

/// `get rollout`.
#[derive(Debug, clap::Subcommand)]
pub enum Kind {
    /// Show a rollout, its revisions, ReplicaSets, pods and AnalysisRuns.
    #[command(visible_aliases = ["rollouts", "ro"])]
    Rollout(Args),
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Name of the rollout.
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

/// What `get` lists and watches: the Rollout itself and, by its selector when it has one,
/// its ReplicaSets and pods; AnalysisRuns by ownership only (their labels vary).
fn selections(name: &str, rollout: &Value) -> Vec<Selection> {
    let labels = rollout
        .pointer("/spec/selector/matchLabels")
        .and_then(Value::as_object)
        .filter(|labels| !labels.is_empty())
        .map(|labels| {
            labels
                .iter()
                .map(|(key, value)| format!("{key}={}", value.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        });
    let by_labels = |kind| Selection {
        labels: labels.clone(),
        ..Selection::all(kind)
    };
    vec![
        Selection::named(Watched::Rollout, name),
        by_labels(Watched::ReplicaSet),
        by_labels(Watched::Pod),
        Selection::all(Watched::AnalysisRun),
    ]
}

/// Lists one kind; a kind the server does not serve (the AnalysisRun CRD not installed) is
/// simply empty.
async fn list_or_empty(cluster: &Cluster, selection: &Selection, name: &str) -> Result<Listing> {
    match cluster.list_json(selection, name).await {
        Err(Error::Api { status, .. }) if status.code == 404 => Ok(Listing::default()),
        other => other,
    }
}

/// One line per object of the Rollout's that does not decode (ReplicaSets and pods by its
/// selector, AnalysisRuns it owns), after the tree.
fn undecodable_lines(rollout: &Value, listings: [&Listing; 3]) -> Vec<String> {
    let mine = |bad: &&BadObject| {
        bad.kind != Watched::AnalysisRun || owned_by(&bad.metadata_json(), rollout)
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

/// The picture of the Rollout now, one string per line, and what to watch for changes.
async fn picture(
    cluster: &Cluster,
    name: &str,
    colour: bool,
) -> Result<(Vec<String>, Vec<Selection>)> {
    let rollout = cluster.rollout_json(name).await?;
    let selections = selections(name, &rollout);
    let replica_sets = list_or_empty(cluster, &selections[1], name).await?;
    let pods = list_or_empty(cluster, &selections[2], name).await?;
    let analysis_runs = list_or_empty(cluster, &selections[3], name).await?;
    let mut lines = rollout_tree(
        Observed {
            rollout: &rollout,
            replica_sets: &replica_sets.items,
            pods: &pods.items,
            analysis_runs: &analysis_runs.items,
        },
        Timestamp::now(),
        colour,
    );
    lines.extend(undecodable_lines(
        &rollout,
        [&replica_sets, &pods, &analysis_runs],
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
    let Kind::Rollout(args) = kind;
    let colour = !args.no_color && std::io::stdout().is_terminal();
    if !args.watch {
        let (lines, _) = picture(cluster, &args.name, colour).await?;
        return write_out(&(lines.join("\n") + "\n"));
    }
    // The first picture also proves the Rollout exists before the screen is taken over.
    let (mut shown, selections) = picture(cluster, &args.name, colour).await?;
    write_out(&format!("{HIDE_CURSOR}{}", frame(&shown)))?;
    let result = watch(cluster, &args.name, colour, &selections, &mut shown).await;
    write_out(SHOW_CURSOR)?;
    result
}

/// Redraws on changes until Ctrl-C.
async fn watch(
    cluster: &Cluster,
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
        let (lines, _) = picture(cluster, name, colour).await?;
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
