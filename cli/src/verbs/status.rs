//! `status NAME [--watch=true] [--timeout 60s]`: the Rollout's health as Argo CD computes it;
//! by default watched until Healthy (exit 0), Degraded or the timeout (non-zero).

use std::time::Duration;

use futures::StreamExt;

use crate::cluster::{Cluster, Selection, Watched};
use crate::error::{Error, Result};
use crate::view::health::{Health, HealthStatus, rollout_health};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Name of the rollout.
    pub name: String,
    /// Watch until the rollout is Healthy or Degraded; `--watch=false` prints once.
    #[arg(short = 'w', long, default_value_t = true, action = clap::ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true")]
    pub watch: bool,
    /// Give up watching after this long (`90s`, `5m`, `1h`, `500ms`); 0 waits forever.
    #[arg(short = 't', long, default_value = "0", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// Why a `--timeout` value is not a duration.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TimeoutError {
    #[error("{text:?} is not a duration (fix: write a number with a unit, such as 60s or 5m)")]
    NotANumber {
        text: String,
        #[source]
        source: std::num::ParseFloatError,
    },
    #[error("unknown unit {unit:?} in {text:?} (fix: use ms, s, m or h)")]
    UnknownUnit { text: String, unit: String },
    #[error("{text:?} is too long a duration (fix: use 0 to wait forever)")]
    TooLong { text: String },
}

/// A duration as kubectl flags take it: a number with `ms`, `s`, `m` or `h`, or bare seconds.
pub fn parse_duration(text: &str) -> std::result::Result<Duration, TimeoutError> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().map_err(|source| TimeoutError::NotANumber {
        text: text.to_string(),
        source,
    })?;
    let seconds = match unit {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        other => {
            return Err(TimeoutError::UnknownUnit {
                text: text.to_string(),
                unit: other.to_string(),
            });
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| TimeoutError::TooLong {
        text: text.to_string(),
    })
}

/// What `status` prints for a health when not watching: the final phases alone, the others
/// with their message (as Argo's plugin does).
pub fn once_line(health: &Health) -> String {
    if health.status.is_final() {
        health.status.phase_word().to_string()
    } else {
        health.line()
    }
}

/// The error a final health ends with, if it is not Healthy.
fn outcome(name: &str, health: &Health) -> Result<()> {
    match health.status {
        HealthStatus::Degraded => Err(Error::Unhealthy(format!(
            "rollout '{name}' is degraded: {} (fix: see `kubectl rollouts get rollout {name}`, then `kubectl rollouts retry rollout {name}` or `undo`)",
            health.message
        ))),
        _ => Ok(()),
    }
}

pub async fn run(cluster: &Cluster, args: &Args) -> Result<()> {
    let health = rollout_health(&cluster.rollout_json(&args.name).await?);
    if !args.watch {
        println!("{}", once_line(&health));
        return outcome(&args.name, &health);
    }
    let watched = watch(cluster, args, health);
    let last = if args.timeout.is_zero() {
        watched.await?
    } else {
        match tokio::time::timeout(args.timeout, watched).await {
            Ok(last) => last?,
            Err(_) => {
                return Err(Error::Unhealthy(format!(
                    "rollout '{}' did not finish within {:?} (fix: raise --timeout, or look at `kubectl rollouts get rollout {}`)",
                    args.name, args.timeout, args.name
                )));
            }
        }
    };
    outcome(&args.name, &last)
}

/// Prints one line per change of health until a final one, which it returns.
async fn watch(cluster: &Cluster, args: &Args, first: Health) -> Result<Health> {
    println!("{}", first.line());
    if first.status.is_final() {
        return Ok(first);
    }
    let mut last = first;
    let mut changes = cluster.changes(&[Selection::named(Watched::Rollout, &args.name)]);
    while changes.next().await.is_some() {
        let health = rollout_health(&cluster.rollout_json(&args.name).await?);
        if health != last {
            println!("{}", health.line());
        }
        if health.status.is_final() {
            return Ok(health);
        }
        last = health;
    }
    Ok(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_kubectl_flags() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert!(
            parse_duration("5d")
                .unwrap_err()
                .to_string()
                .contains("use ms, s, m or h")
        );
        assert!(parse_duration("soon").is_err());
        let huge = format!("{}h", "9".repeat(400));
        assert_eq!(
            parse_duration(&huge),
            Err(TimeoutError::TooLong { text: huge.clone() })
        );
    }

    #[test]
    fn once_prints_final_phases_bare_and_others_with_their_message() {
        let healthy = Health {
            status: HealthStatus::Healthy,
            message: String::new(),
        };
        assert_eq!(once_line(&healthy), "Healthy");
        let paused = Health {
            status: HealthStatus::Suspended,
            message: "CanaryPauseStep".into(),
        };
        assert_eq!(once_line(&paused), "Paused - CanaryPauseStep");
        let degraded = Health {
            status: HealthStatus::Degraded,
            message: "RolloutAborted".into(),
        };
        assert_eq!(once_line(&degraded), "Degraded");
        assert!(
            outcome("web", &degraded)
                .unwrap_err()
                .to_string()
                .contains("rollout 'web' is degraded: RolloutAborted")
        );
    }
}
