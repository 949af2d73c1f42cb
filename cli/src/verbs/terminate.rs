//! `terminate analysisrun NAME...`, `terminate experiment NAME...`: stop a running AnalysisRun
//! or Experiment.
//!
//! Sends the merge patch `{"spec":{"terminate":true}}` to the object's main resource, as Argo's
//! plugin does.

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
    /// Terminate an Experiment: its ReplicaSets are scaled down and its analyses stopped.
    #[command(name = "experiment", visible_aliases = ["exp", "experiments"])]
    Experiment(Args),
}

/// `terminate analysisrun|experiment` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Names of the objects.
    #[arg(required = true)]
    pub names: Vec<String>,
    #[command(flatten)]
    pub output: OutputFlag,
}

/// The patch that terminates the AnalysisRun or Experiment (`target`) called `name`.
pub fn terminate_patch(target: TargetKind, name: &str) -> PatchRequest {
    PatchRequest {
        target,
        name: name.to_string(),
        subresource: None,
        patch_type: PatchType::Merge,
        body: json!({"spec": {"terminate": true}}),
    }
}

/// Terminates each object in turn, stopping at the first failure.
pub async fn run(cluster: &Cluster, kind: &Kind) -> Result<()> {
    // Argo's plugin says `analysisRun '...' terminated`; for an experiment it says "retried",
    // which is a slip: this says what was done.
    let (target, word, args) = match kind {
        Kind::AnalysisRun(args) => (TargetKind::AnalysisRun, "analysisRun", args),
        Kind::Experiment(args) => (TargetKind::Experiment, "experiment", args),
    };
    for name in &args.names {
        let object = cluster.apply(&terminate_patch(target, name)).await?;
        report(
            &format!("{word} '{name}' terminated"),
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
    fn terminate_sets_spec_terminate_on_the_experiment() {
        let patch = terminate_patch(TargetKind::Experiment, "web-abc-2-0");
        assert_eq!(patch.target, TargetKind::Experiment);
        assert_eq!(patch.name, "web-abc-2-0");
        assert_eq!(patch.subresource, None);
        assert_eq!(patch.patch_type, PatchType::Merge);
        assert_eq!(patch.body, json!({"spec": {"terminate": true}}));
        assert_eq!(
            patch.target.collection_path("shop"),
            "/apis/argoproj.io/v1alpha1/namespaces/shop/experiments"
        );
    }

    #[test]
    fn terminate_sets_spec_terminate_on_the_analysis_run() {
        let patch = terminate_patch(TargetKind::AnalysisRun, "web-abc-2-success-rate");
        assert_eq!(patch.target, TargetKind::AnalysisRun);
        assert_eq!(patch.name, "web-abc-2-success-rate");
        assert_eq!(patch.subresource, None);
        assert_eq!(patch.patch_type, PatchType::Merge);
        assert_eq!(patch.body, json!({"spec": {"terminate": true}}));
    }
}
