//! `terminate analysisrun NAME...`: stop a running AnalysisRun.
//!
//! Sends the merge patch `{"spec":{"terminate":true}}` to the AnalysisRun's main resource.

use serde_json::json;

use crate::args::OutputFlag;
use crate::cluster::Cluster;
use crate::error::Result;
use crate::patch::{PatchRequest, PatchType, TargetKind};
use crate::verbs::report;

/// What to terminate.
#[derive(Debug, clap::Subcommand)]
pub enum Kind {
    /// Terminate an AnalysisRun.
    #[command(name = "analysisrun", visible_aliases = ["ar", "analysisruns"])]
    AnalysisRun(Args),
}

/// `terminate analysisrun` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Names of the AnalysisRuns.
    #[arg(required = true)]
    pub names: Vec<String>,
    #[command(flatten)]
    pub output: OutputFlag,
}

/// The patch that terminates AnalysisRun `name`.
pub fn terminate_patch(name: &str) -> PatchRequest {
    PatchRequest {
        target: TargetKind::AnalysisRun,
        name: name.to_string(),
        subresource: None,
        patch_type: PatchType::Merge,
        body: json!({"spec": {"terminate": true}}),
    }
}

/// Terminates each AnalysisRun in turn, stopping at the first failure.
pub async fn run(cluster: &Cluster, kind: &Kind) -> Result<()> {
    let Kind::AnalysisRun(args) = kind;
    for name in &args.names {
        let object = cluster.apply(&terminate_patch(name)).await?;
        report(
            &format!("analysisRun '{name}' terminated"),
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

    #[test]
    fn terminate_sets_spec_terminate_on_the_analysis_run() {
        let patch = terminate_patch("web-abc-2-success-rate");
        assert_eq!(patch.target, TargetKind::AnalysisRun);
        assert_eq!(patch.name, "web-abc-2-success-rate");
        assert_eq!(patch.subresource, None);
        assert_eq!(patch.patch_type, PatchType::Merge);
        assert_eq!(patch.body, json!({"spec": {"terminate": true}}));
    }
}
