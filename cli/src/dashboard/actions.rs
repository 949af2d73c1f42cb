//! The buttons of a Rollout's page: each sends the very patches the plugin's verb sends (built
//! by the verb's own function), with the user's credentials, and answers with the verb's
//! sentence or the API's error.

use k8s_openapi::jiff::Timestamp;
use std::time::Duration;

use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::patch::PatchRequest;
use crate::verbs::{abort, pause, promote, restart, resume, retry, set_image, undo};

/// What a button asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Promote,
    PromoteFull,
    Abort,
    Retry,
    Pause,
    Resume,
    Restart,
    /// `CONTAINER=IMAGE`, sent as the request body.
    SetImage,
    /// `kubectl rollouts undo --to-revision N`; the revision (0: the one before the newest)
    /// is sent as the request body.
    Rollback,
}

impl Action {
    pub const ALL: [Action; 9] = [
        Action::Promote,
        Action::PromoteFull,
        Action::Abort,
        Action::Retry,
        Action::Pause,
        Action::Resume,
        Action::Restart,
        Action::SetImage,
        Action::Rollback,
    ];

    /// The action's name in URLs.
    pub fn slug(self) -> &'static str {
        match self {
            Action::Promote => "promote",
            Action::PromoteFull => "promote-full",
            Action::Abort => "abort",
            Action::Retry => "retry",
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::Restart => "restart",
            Action::SetImage => "set-image",
            Action::Rollback => "rollback",
        }
    }

    pub fn parse(slug: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.slug() == slug)
    }

    /// The button's text.
    pub fn label(self) -> &'static str {
        match self {
            Action::Promote => "Promote",
            Action::PromoteFull => "Promote full",
            Action::Abort => "Abort",
            Action::Retry => "Retry",
            Action::Pause => "Pause",
            Action::Resume => "Resume",
            Action::Restart => "Restart",
            Action::SetImage => "Set image",
            Action::Rollback => "Rollback",
        }
    }

    /// The question the page asks before sending.
    pub fn confirmation(self, name: &str) -> String {
        match self {
            Action::Promote => format!("Promote rollout '{name}' to its next step?"),
            Action::PromoteFull => format!(
                "Promote rollout '{name}' fully, skipping its remaining steps, pauses and analyses?"
            ),
            Action::Abort => {
                format!("Abort rollout '{name}' and send all traffic back to the stable version?")
            }
            Action::Retry => format!("Retry aborted rollout '{name}'?"),
            Action::Pause => format!("Pause rollout '{name}' (sets spec.paused)?"),
            Action::Resume => format!("Resume rollout '{name}' (clears spec.paused)?"),
            Action::Restart => format!("Restart every pod of rollout '{name}'?"),
            Action::SetImage => format!("Set this image on rollout '{name}'?"),
            Action::Rollback => {
                format!("Roll rollout '{name}' back to this revision's pod template?")
            }
        }
    }
}

/// Sends `action` to rollout `name` in `cluster`'s namespace; the sentence the plugin prints.
/// `argument` is what the action was given (`CONTAINER=IMAGE` for set image).
pub async fn perform(
    cluster: &Cluster,
    name: &str,
    action: Action,
    argument: &str,
) -> Result<String> {
    let send = async |patches: Vec<PatchRequest>| -> Result<bool> {
        for patch in &patches {
            cluster.apply(patch).await?;
        }
        Ok(!patches.is_empty())
    };
    match action {
        Action::Promote | Action::PromoteFull => {
            let full = action == Action::PromoteFull;
            let rollout = cluster.rollout(name).await?;
            let patched = send(promote::promote_patch(&rollout, full)).await?;
            Ok(promote::promote_message(name, full, patched))
        }
        Action::Abort => {
            send(vec![abort::abort_patch(name)]).await?;
            Ok(format!("rollout '{name}' aborted"))
        }
        Action::Retry => {
            send(vec![retry::retry_patch(name)]).await?;
            Ok(format!("rollout '{name}' retried"))
        }
        Action::Pause => {
            send(vec![pause::pause_patch(name)]).await?;
            Ok(format!("rollout '{name}' paused"))
        }
        Action::Resume => {
            let rollout = cluster.rollout(name).await?;
            match resume::resume_patch(&rollout) {
                Some(patch) => {
                    send(vec![patch]).await?;
                    Ok(format!("rollout '{name}' resumed"))
                }
                None => Ok(resume::not_paused_message(&rollout)),
            }
        }
        Action::SetImage => {
            let (container, image) = set_image::parse_assignment(argument.trim())?;
            set_image::set_image(cluster, name, container, image).await
        }
        Action::Rollback => {
            let revision = rollback_revision(argument)?;
            undo::undo(cluster, name, revision).await
        }
        Action::Restart => {
            send(vec![restart::restart_patch(
                name,
                Timestamp::now(),
                Duration::ZERO,
            )?])
            .await?;
            Ok(format!(
                "rollout '{name}' restarts in {}",
                rollouts_crds::duration::format(Duration::ZERO)
            ))
        }
    }
}

/// The revision a Rollback was given: a number, empty or 0 for the one before the newest.
fn rollback_revision(argument: &str) -> Result<i64> {
    let text = argument.trim();
    if text.is_empty() {
        return Ok(0);
    }
    text.parse::<i64>()
        .ok()
        .filter(|revision| *revision >= 0)
        .ok_or_else(|| {
            Error::Invalid(format!(
                "rollback: revision {text:?} is not a revision number (fix: give the number of a revision the rollout's tree shows, or 0 for the one before the newest)"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rollback_takes_a_revision_number_or_nothing() {
        assert_eq!(rollback_revision(" 3 ").ok(), Some(3));
        assert_eq!(rollback_revision("").ok(), Some(0));
        let error = rollback_revision("three").expect_err("not a number");
        assert!(
            error
                .to_string()
                .contains("\"three\" is not a revision number")
        );
        assert!(rollback_revision("-1").is_err());
    }

    #[test]
    fn every_action_round_trips_through_its_url_name() {
        for action in Action::ALL {
            assert_eq!(Action::parse(action.slug()), Some(action));
        }
        assert_eq!(Action::parse("delete"), None);
    }

    #[test]
    fn confirmations_name_the_rollout() {
        for action in Action::ALL {
            assert!(action.confirmation("web").contains("'web'"), "{action:?}");
        }
    }
}
