//! `pause NAME...`: hold a rollout where it is.
//!
//! Sends the merge patch `{"spec":{"paused":true}}` to the main resource.

use serde_json::json;

use crate::args::OutputFlag;
use crate::cluster::Cluster;
use crate::error::Result;
use crate::patch::PatchRequest;
use crate::verbs::report;

/// `pause` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Names of the rollouts.
    #[arg(required = true)]
    pub names: Vec<String>,
    #[command(flatten)]
    pub output: OutputFlag,
}

/// The patch that pauses rollout `name`.
pub fn pause_patch(name: &str) -> PatchRequest {
    PatchRequest::rollout_spec(name, json!({"spec": {"paused": true}}))
}

/// Pauses each rollout in turn, stopping at the first failure.
pub async fn run(cluster: &Cluster, args: &Args) -> Result<()> {
    for name in &args.names {
        let object = cluster.apply(&pause_patch(name)).await?;
        report(
            &format!("rollout '{name}' paused"),
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
    fn pause_sets_spec_paused_on_the_main_resource() {
        assert_eq!(
            pause_patch("web"),
            PatchRequest {
                target: TargetKind::Rollout,
                name: "web".into(),
                subresource: None,
                patch_type: PatchType::Merge,
                body: json!({"spec": {"paused": true}}),
            }
        );
    }
}
