//! `restart NAME [--in 30s]`: replace every pod of a rollout, a few at a time.
//!
//! Sends the merge patch `{"spec":{"restartAt":"<RFC 3339 time, whole seconds, UTC>"}}` to the
//! main resource; the controller restarts pods created before that time.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::json;

use crate::args::OutputFlag;
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::patch::PatchRequest;
use crate::verbs::report;

/// `restart` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Name of the rollout.
    pub name: String,
    /// Wait this long before restarting (e.g. 30s, 5m, 1h).
    #[arg(short = 'i', long = "in", value_name = "DURATION")]
    pub delay: Option<String>,
    #[command(flatten)]
    pub output: OutputFlag,
}

/// The patch that restarts rollout `name` at `now + delay`.
pub fn restart_patch(name: &str, now: Timestamp, delay: Duration) -> Result<PatchRequest> {
    let restart_at = SignedDuration::try_from(delay)
        .ok()
        .and_then(|delay| now.checked_add(delay).ok())
        .ok_or_else(|| {
            Error::Invalid(format!(
                "--in {} is too far in the future for rollout '{name}' (fix: use a shorter delay)",
                rollouts_crds::duration::format(delay)
            ))
        })?;
    let restart_at = restart_at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    Ok(PatchRequest::rollout_spec(
        name,
        json!({"spec": {"restartAt": restart_at}}),
    ))
}

/// Parses `--in`, naming the flag and the fix when it does not parse.
pub fn parse_delay(text: Option<&str>) -> Result<Duration> {
    match text {
        None => Ok(Duration::ZERO),
        Some(text) => rollouts_crds::duration::parse(text).map_err(|reason| {
            Error::Invalid(format!(
                "--in {text:?}: {reason} (fix: write a duration such as 30s, 5m or 1h)"
            ))
        }),
    }
}

/// Sends the restart patch and prints when the restart happens.
pub async fn run(cluster: &Cluster, args: &Args) -> Result<()> {
    let delay = parse_delay(args.delay.as_deref())?;
    let object = cluster
        .apply(&restart_patch(&args.name, Timestamp::now(), delay)?)
        .await?;
    let sentence = format!(
        "rollout '{}' restarts in {}",
        args.name,
        rollouts_crds::duration::format(delay)
    );
    report(&sentence, &object, args.output.output)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::patch::{PatchType, TargetKind};

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn restart_now_writes_the_current_second() {
        let patch = restart_patch("web", at("2026-03-01T10:20:30.750Z"), Duration::ZERO).unwrap();
        assert_eq!(patch.target, TargetKind::Rollout);
        assert_eq!(patch.subresource, None);
        assert_eq!(patch.patch_type, PatchType::Merge);
        assert_eq!(
            patch.body,
            json!({"spec": {"restartAt": "2026-03-01T10:20:30Z"}})
        );
    }

    #[test]
    fn restart_in_adds_the_delay() {
        let delay = parse_delay(Some("1m30s")).unwrap();
        let patch = restart_patch("web", at("2026-03-01T23:59:00Z"), delay).unwrap();
        assert_eq!(
            patch.body,
            json!({"spec": {"restartAt": "2026-03-02T00:00:30Z"}})
        );
    }

    #[test]
    fn a_bad_delay_names_the_flag_and_the_fix() {
        let err = parse_delay(Some("soon")).unwrap_err().to_string();
        assert!(err.contains("--in \"soon\""), "{err}");
        assert!(err.contains("30s"), "{err}");
    }
}
