//! `list rollouts [-A] [--watch]`: one line per Rollout with its strategy, status, step,
//! weight and replica counts; with `--watch`, the table again whenever a Rollout changes.
//! `list experiments [-A]`: one line per Experiment with its status, duration, time remaining
//! and age (Argo's columns). An object that does not decode takes no row: a warning line on
//! stderr names it, its field and the fix, and the others are listed as usual.

use futures::StreamExt;

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use crate::cluster::{BadObject, Cluster, Selection, Watched};
use crate::error::Result;
use crate::patch::TargetKind;
use crate::view::{experiment_row, experiment_table, list_row, list_table};

/// `list rollouts`, `list experiments`.
#[derive(Debug, clap::Subcommand)]
pub enum Kind {
    /// List rollouts with their status, step, weight and replicas.
    #[command(visible_aliases = ["rollout", "ro"])]
    Rollouts(Args),
    /// List experiments with their status, duration, time remaining and age.
    #[command(visible_aliases = ["experiment", "exp"])]
    Experiments(ExperimentArgs),
}

#[derive(Debug, clap::Args)]
pub struct ExperimentArgs {
    /// List experiments in every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// List rollouts in every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Print the table again whenever a rollout changes (Ctrl-C to stop).
    #[arg(short = 'w', long)]
    pub watch: bool,
}

fn selection(args: &Args) -> Selection {
    Selection {
        all_namespaces: args.all_namespaces,
        ..Selection::all(Watched::Rollout)
    }
}

/// Objects ordered by namespace, then name.
fn sort_by_namespace_and_name(objects: &mut [Value]) {
    objects.sort_by_key(|object| {
        (
            object
                .pointer("/metadata/namespace")
                .and_then(|v| v.as_str())
                .map(String::from),
            object
                .pointer("/metadata/name")
                .and_then(|v| v.as_str())
                .map(String::from),
        )
    });
}

/// One warning per object that does not decode, ordered by namespace and name.
fn warnings(mut undecodable: Vec<BadObject>) -> Vec<String> {
    undecodable.sort_by(|a, b| (a.namespace(), a.name()).cmp(&(b.namespace(), b.name())));
    undecodable
        .iter()
        .map(|bad| format!("warning: {bad}"))
        .collect()
}

/// The table's lines, and one warning per Rollout that does not decode.
async fn table(cluster: &Cluster, args: &Args) -> Result<(Vec<String>, Vec<String>)> {
    let listing = cluster.list_json(&selection(args), "*").await?;
    let mut rollouts = listing.items;
    sort_by_namespace_and_name(&mut rollouts);
    let rows: Vec<_> = rollouts.iter().map(list_row).collect();
    Ok((
        list_table(&rows, args.all_namespaces),
        warnings(listing.undecodable),
    ))
}

fn scope(cluster: &Cluster, all_namespaces: bool) -> String {
    if all_namespaces {
        "any namespace".to_string()
    } else {
        format!("namespace '{}'", cluster.namespace)
    }
}

/// `list experiments`: the table once.
async fn experiments(cluster: &Cluster, args: &ExperimentArgs) -> Result<()> {
    let selection = Selection {
        all_namespaces: args.all_namespaces,
        ..Selection::all(Watched::Experiment)
    };
    let listing = cluster
        .list_json_for(&selection, TargetKind::Experiment, "*")
        .await?;
    let mut experiments = listing.items;
    sort_by_namespace_and_name(&mut experiments);
    let warned = warnings(listing.undecodable);
    warn(&warned);
    if experiments.is_empty() && warned.is_empty() {
        println!(
            "No experiments found in {}.",
            scope(cluster, args.all_namespaces)
        );
        return Ok(());
    }
    let now = Timestamp::now();
    let rows: Vec<_> = experiments.iter().map(|e| experiment_row(e, now)).collect();
    println!(
        "{}",
        experiment_table(&rows, args.all_namespaces).join("\n")
    );
    Ok(())
}

fn warn(warnings: &[String]) {
    for warning in warnings {
        eprintln!("{warning}");
    }
}

pub async fn run(cluster: &Cluster, kind: &Kind) -> Result<()> {
    let args = match kind {
        Kind::Rollouts(args) => args,
        Kind::Experiments(args) => return experiments(cluster, args).await,
    };
    let (mut shown, mut warned) = table(cluster, args).await?;
    warn(&warned);
    if shown.len() == 1 && warned.is_empty() && !args.watch {
        println!(
            "No rollouts found in {}.",
            scope(cluster, args.all_namespaces)
        );
        return Ok(());
    }
    println!("{}", shown.join("\n"));
    if !args.watch {
        return Ok(());
    }
    let mut changes = cluster.changes(&[selection(args)]);
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        tokio::select! {
            _ = &mut interrupted => return Ok(()),
            change = changes.next() => if change.is_none() { return Ok(()) },
        }
        let (lines, warnings) = table(cluster, args).await?;
        let new: Vec<String> = warnings
            .iter()
            .filter(|warning| !warned.contains(warning))
            .cloned()
            .collect();
        warn(&new);
        warned = warnings;
        // The header is printed once and only changed rows again, as `kubectl get -w` does.
        for line in lines.iter().skip(1).filter(|line| !shown.contains(line)) {
            println!("{line}");
        }
        shown = lines;
    }
}
