//! `abort NAME...`: stop a rollout and send everything back to the stable version.
//!
//! Sends the merge patch `{"status":{"abort":true}}` to the status subresource. The template
//! still names the new version; `retry rollout` goes back to it, `undo` replaces it.

use serde_json::json;

use crate::args::OutputFlag;
use crate::cluster::Cluster;
use crate::error::Result;
use crate::patch::PatchRequest;
use crate::verbs::report;

/// `abort` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Names of the rollouts.
    #[arg(required = true)]
    pub names: Vec<String>,
    #[command(flatten)]
    pub output: OutputFlag,
}

/// The patch that aborts rollout `name`.
pub fn abort_patch(name: &str) -> PatchRequest {
    PatchRequest::rollout_status(name, json!({"status": {"abort": true}}))
}

/// Aborts each rollout in turn, stopping at the first failure.
pub async fn run(cluster: &Cluster, args: &Args) -> Result<()> {
    for name in &args.names {
        let object = cluster.apply(&abort_patch(name)).await?;
        report(
            &format!("rollout '{name}' aborted"),
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
    fn abort_sets_status_abort_through_the_status_subresource() {
        assert_eq!(
            abort_patch("web"),
            PatchRequest {
                target: TargetKind::Rollout,
                name: "web".into(),
                subresource: Some("status"),
                patch_type: PatchType::Merge,
                body: json!({"status": {"abort": true}}),
            }
        );
    }
}
