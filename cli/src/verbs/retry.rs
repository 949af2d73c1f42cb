//! `retry rollout NAME...`: take an aborted rollout back to the new version.
//!
//! Sends the merge patch `{"status":{"abort":false}}` to the status subresource.

use serde_json::json;

use crate::args::OutputFlag;
use crate::cluster::Cluster;
use crate::error::Result;
use crate::patch::PatchRequest;
use crate::verbs::report;

/// What to retry.
#[derive(Debug, clap::Subcommand)]
pub enum Kind {
    /// Retry an aborted rollout.
    #[command(visible_aliases = ["ro", "rollouts"])]
    Rollout(Args),
}

/// `retry rollout` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Names of the rollouts.
    #[arg(required = true)]
    pub names: Vec<String>,
    #[command(flatten)]
    pub output: OutputFlag,
}

/// The patch that retries rollout `name`.
pub fn retry_patch(name: &str) -> PatchRequest {
    PatchRequest::rollout_status(name, json!({"status": {"abort": false}}))
}

/// Retries each rollout in turn, stopping at the first failure.
pub async fn run(cluster: &Cluster, kind: &Kind) -> Result<()> {
    let Kind::Rollout(args) = kind;
    for name in &args.names {
        let object = cluster.apply(&retry_patch(name)).await?;
        report(
            &format!("rollout '{name}' retried"),
            &object,
            args.output.output,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::patch::{PatchType, TargetKind};

    #[test]
    fn retry_clears_status_abort_through_the_status_subresource() {
        assert_eq!(
            retry_patch("web"),
            PatchRequest {
                target: TargetKind::Rollout,
                name: "web".into(),
                subresource: Some("status"),
                patch_type: PatchType::Merge,
                body: json!({"status": {"abort": false}}),
            }
        );
    }
}
