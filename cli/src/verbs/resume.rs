//! `resume NAME...`: undo `pause`. Argo's plugin has no such verb (its `promote` also unpauses);
//! ours clears only `spec.paused`, so a rollout waiting at a pause step keeps waiting there.
//!
//! Sends the merge patch `{"spec":{"paused":false}}` to the main resource, and nothing when the
//! rollout is not paused by spec.

use serde_json::json;

use rollouts_crds::rollout::Rollout;

use crate::args::OutputFlag;
use crate::cluster::Cluster;
use crate::error::Result;
use crate::patch::PatchRequest;
use crate::verbs::report;

/// `resume` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Names of the rollouts.
    #[arg(required = true)]
    pub names: Vec<String>,
    #[command(flatten)]
    pub output: OutputFlag,
}

/// The patch that resumes `rollout`, or `None` when `spec.paused` is not set.
pub fn resume_patch(rollout: &Rollout) -> Option<PatchRequest> {
    let name = rollout.metadata.name.as_deref().unwrap_or_default();
    (rollout.spec.paused == Some(true))
        .then(|| PatchRequest::rollout_spec(name, json!({"spec": {"paused": false}})))
}

/// What `resume` says when there was nothing to resume.
pub fn not_paused_message(rollout: &Rollout) -> String {
    let name = rollout.metadata.name.as_deref().unwrap_or_default();
    let step_paused = rollout
        .status
        .as_ref()
        .is_some_and(|s| !s.pause_conditions.is_empty());
    if step_paused {
        format!(
            "rollout '{name}' is not paused by spec.paused but waits at a pause step or analysis; use 'kubectl rollouts promote {name}' to go on"
        )
    } else {
        format!("rollout '{name}' is not paused")
    }
}

/// Resumes each rollout in turn, stopping at the first failure.
pub async fn run(cluster: &Cluster, args: &Args) -> Result<()> {
    for name in &args.names {
        let rollout = cluster.rollout(name).await?;
        match resume_patch(&rollout) {
            Some(patch) => {
                let object = cluster.apply(&patch).await?;
                report(
                    &format!("rollout '{name}' resumed"),
                    &object,
                    args.output.output,
                )?;
            }
            None => report(&not_paused_message(&rollout), &rollout, args.output.output)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use rollouts_crds::rollout::{PauseCondition, RolloutSpec, RolloutStatus};
    use serde_json::json;

    use super::*;
    use crate::patch::{PatchType, TargetKind};

    #[test]
    fn resume_clears_spec_paused_on_the_main_resource() {
        let mut rollout = Rollout::new("web", RolloutSpec::default());
        rollout.spec.paused = Some(true);
        assert_eq!(
            resume_patch(&rollout),
            Some(PatchRequest {
                target: TargetKind::Rollout,
                name: "web".into(),
                subresource: None,
                patch_type: PatchType::Merge,
                body: json!({"spec": {"paused": false}}),
            })
        );
    }

    #[test]
    fn a_rollout_held_by_a_step_is_left_alone_and_promote_is_suggested() {
        let mut rollout = Rollout::new("web", RolloutSpec::default());
        assert_eq!(resume_patch(&rollout), None);
        assert_eq!(not_paused_message(&rollout), "rollout 'web' is not paused");
        rollout.status = Some(RolloutStatus {
            pause_conditions: vec![PauseCondition {
                reason: "CanaryPauseStep".into(),
                start_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
            }],
            ..Default::default()
        });
        assert!(not_paused_message(&rollout).contains("kubectl rollouts promote web"));
    }
}
