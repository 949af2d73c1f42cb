//! `list rollouts [-A] [--watch]`: one line per Rollout with its strategy, status, step,
//! weight and replica counts; with `--watch`, the table again whenever a Rollout changes.
//! A Rollout that does not decode takes no row: a warning line on stderr names it, its field
//! and the fix, and the others are listed as usual.

use futures::StreamExt;

use crate::cluster::{Cluster, Selection, Watched};
use crate::error::Result;
use crate::view::{list_row, list_table};

/// `list rollouts`.
#[derive(Debug, clap::Subcommand)]
pub enum Kind {
    /// List rollouts with their status, step, weight and replicas.
    #[command(visible_aliases = ["rollout", "ro"])]
    Rollouts(Args),
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

/// The table's lines, and one warning per Rollout that does not decode.
async fn table(cluster: &Cluster, args: &Args) -> Result<(Vec<String>, Vec<String>)> {
    let listing = cluster.list_json(&selection(args), "*").await?;
    let mut rollouts = listing.items;
    rollouts.sort_by_key(|r| {
        (
            r.pointer("/metadata/namespace")
                .and_then(|v| v.as_str())
                .map(String::from),
            r.pointer("/metadata/name")
                .and_then(|v| v.as_str())
                .map(String::from),
        )
    });
    let rows: Vec<_> = rollouts.iter().map(list_row).collect();
    let mut undecodable = listing.undecodable;
    undecodable.sort_by(|a, b| (a.namespace(), a.name()).cmp(&(b.namespace(), b.name())));
    let warnings = undecodable
        .iter()
        .map(|bad| format!("warning: {bad}"))
        .collect();
    Ok((list_table(&rows, args.all_namespaces), warnings))
}

fn warn(warnings: &[String]) {
    for warning in warnings {
        eprintln!("{warning}");
    }
}

pub async fn run(cluster: &Cluster, kind: &Kind) -> Result<()> {
    let Kind::Rollouts(args) = kind;
    let (mut shown, mut warned) = table(cluster, args).await?;
    warn(&warned);
    if shown.len() == 1 && warned.is_empty() && !args.watch {
        let scope = if args.all_namespaces {
            "any namespace".to_string()
        } else {
            format!("namespace '{}'", cluster.namespace)
        };
        println!("No rollouts found in {scope}.");
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
