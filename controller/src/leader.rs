//! Leader election on a `coordination.k8s.io/v1` Lease, so one replica acts at a time.
//!
//! [`decide`] is the pure rule (acquire, renew or wait); [`LeaderElection`] applies it with
//! optimistic concurrency (a write carries the resourceVersion it read, so two candidates
//! cannot both win). The leader renews every third of the lease duration; a follower polls
//! every [`RETRY_PERIOD`] and takes over as soon as the lease expires or is released.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ObjectMeta, PostParams};

use crate::error::{Error, Result};

/// How often a follower looks at the Lease.
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);

/// What the Lease says, reduced to what the decision needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseRecord {
    pub holder: Option<String>,
    pub renew_time: Option<Timestamp>,
    pub lease_duration: Option<Duration>,
}

impl LeaseRecord {
    fn of(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        Self {
            holder: spec.holder_identity.filter(|holder| !holder.is_empty()),
            renew_time: spec.renew_time.map(|time| time.0),
            lease_duration: spec
                .lease_duration_seconds
                .and_then(|seconds| u64::try_from(seconds).ok())
                .map(Duration::from_secs),
        }
    }
}

/// What a candidate should do with the Lease now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaderDecision {
    /// Nobody holds a valid lease: take it.
    Acquire,
    /// We hold it: renew it.
    Renew,
    /// Someone else holds a valid lease: look again after this long at the latest.
    Wait(Duration),
}

/// The election rule: a lease is held until `renewTime + leaseDuration`; an empty holder
/// (released) or a lease never renewed is free.
pub fn decide(lease: &LeaseRecord, identity: &str, now: Timestamp) -> LeaderDecision {
    let Some(holder) = &lease.holder else {
        return LeaderDecision::Acquire;
    };
    if holder == identity {
        return LeaderDecision::Renew;
    }
    let (Some(renewed), Some(duration)) = (lease.renew_time, lease.lease_duration) else {
        return LeaderDecision::Acquire;
    };
    let expires = renewed + SignedDuration::try_from(duration).unwrap_or(SignedDuration::MAX);
    match Duration::try_from(now.duration_until(expires)) {
        Ok(left) if !left.is_zero() => LeaderDecision::Wait(left),
        _ => LeaderDecision::Acquire,
    }
}

/// One candidate for the Lease `namespace/name`.
#[derive(Clone)]
pub struct LeaderElection {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    lease_duration: Duration,
}

impl LeaderElection {
    pub fn new(
        api: Api<Lease>,
        namespace: &str,
        name: &str,
        identity: String,
        lease_duration: Duration,
    ) -> Self {
        Self {
            api,
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity,
            lease_duration,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Waits until this candidate holds the Lease. API errors are retried: a follower has
    /// nothing to lose by waiting, and the leader may be the one that is unreachable.
    pub async fn acquire(&self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(LeaderDecision::Acquire | LeaderDecision::Renew) => return,
                Ok(LeaderDecision::Wait(left)) => {
                    tokio::time::sleep(left.min(RETRY_PERIOD)).await;
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot read or take the leader lease, retrying");
                    tokio::time::sleep(RETRY_PERIOD).await;
                }
            }
        }
    }

    /// Renews the Lease until it is lost; returns why. A renewal may fail for up to two
    /// thirds of the lease duration (network, API server) before leadership is given up.
    pub async fn hold(&self) -> Error {
        let renew_every = self.lease_duration / 3;
        let mut last_renewed = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(renew_every).await;
            match self.try_acquire_or_renew().await {
                Ok(LeaderDecision::Renew | LeaderDecision::Acquire) => {
                    last_renewed = tokio::time::Instant::now();
                }
                Ok(LeaderDecision::Wait(_)) => {
                    return self.lost("another replica holds the lease".to_string());
                }
                Err(error) if last_renewed.elapsed() + renew_every < self.lease_duration => {
                    tracing::warn!(%error, "cannot renew the leader lease, retrying");
                }
                Err(error) => {
                    return self.lost(format!("not renewed in time: {error}"));
                }
            }
        }
    }

    /// Gives the Lease up (empty holder) so a follower takes over without waiting for expiry.
    pub async fn release(&self) -> Result<()> {
        let Some(mut lease) = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.lease_error(e))?
        else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .map_err(|e| self.lease_error(e))?;
        Ok(())
    }

    /// One round: read the Lease, decide, and write it when acquiring or renewing. A write
    /// that loses a race (409) counts as Wait: the other candidate won this round.
    async fn try_acquire_or_renew(&self) -> Result<LeaderDecision> {
        let now = Timestamp::now();
        let existing = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.lease_error(e))?;
        let record = existing.as_ref().map(LeaseRecord::of).unwrap_or_default();
        let decision = decide(&record, &self.identity, now);
        let written = match (decision, existing) {
            (LeaderDecision::Wait(_), _) => return Ok(decision),
            (_, None) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        namespace: Some(self.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(self.spec(now, now, 0)),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            (_, Some(mut lease)) => {
                let previous = lease.spec.take().unwrap_or_default();
                let spec = if decision == LeaderDecision::Renew {
                    let acquired = previous.acquire_time.map_or(now, |time| time.0);
                    self.spec(acquired, now, previous.lease_transitions.unwrap_or(0))
                } else {
                    tracing::info!(previous = ?previous.holder_identity, "taking over the leader lease");
                    self.spec(now, now, previous.lease_transitions.unwrap_or(0) + 1)
                };
                lease.spec = Some(spec);
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match written {
            Ok(_) => Ok(decision),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                Ok(LeaderDecision::Wait(RETRY_PERIOD))
            }
            Err(error) => Err(self.lease_error(error)),
        }
    }

    fn spec(&self, acquired: Timestamp, renewed: Timestamp, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX),
            ),
            acquire_time: Some(MicroTime(acquired)),
            renew_time: Some(MicroTime(renewed)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    fn lease_error(&self, source: kube::Error) -> Error {
        Error::Lease {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source: Box::new(source),
        }
    }

    fn lost(&self, reason: String) -> Error {
        Error::LeaseLost {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            reason,
        }
    }
}

/// A name unique to this process: the pod name (or host name) and the process id.
pub fn candidate_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "rollouts-controller".to_string());
    format!("{host}_{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).expect("in range")
    }

    fn held_by(holder: &str, renewed: i64) -> LeaseRecord {
        LeaseRecord {
            holder: Some(holder.to_string()),
            renew_time: Some(at(renewed)),
            lease_duration: Some(Duration::from_secs(15)),
        }
    }

    #[test]
    fn a_missing_or_released_lease_is_acquired() {
        assert_eq!(
            decide(&LeaseRecord::default(), "me", at(100)),
            LeaderDecision::Acquire
        );
        let released = LeaseRecord {
            holder: None,
            ..held_by("other", 99)
        };
        assert_eq!(decide(&released, "me", at(100)), LeaderDecision::Acquire);
    }

    #[test]
    fn our_own_lease_is_renewed_even_when_expired() {
        assert_eq!(
            decide(&held_by("me", 99), "me", at(100)),
            LeaderDecision::Renew
        );
        assert_eq!(
            decide(&held_by("me", 0), "me", at(100)),
            LeaderDecision::Renew
        );
    }

    #[test]
    fn a_valid_lease_of_another_replica_is_waited_for_until_it_expires() {
        assert_eq!(
            decide(&held_by("other", 90), "me", at(100)),
            LeaderDecision::Wait(Duration::from_secs(5))
        );
    }

    #[test]
    fn an_expired_lease_of_another_replica_is_taken_over() {
        assert_eq!(
            decide(&held_by("other", 85), "me", at(100)),
            LeaderDecision::Acquire
        );
        assert_eq!(
            decide(&held_by("other", 50), "me", at(100)),
            LeaderDecision::Acquire
        );
    }

    #[test]
    fn a_lease_without_renew_time_or_duration_is_free() {
        let never_renewed = LeaseRecord {
            renew_time: None,
            ..held_by("other", 0)
        };
        assert_eq!(
            decide(&never_renewed, "me", at(100)),
            LeaderDecision::Acquire
        );
    }

    #[test]
    fn empty_holder_in_the_lease_means_released() {
        let lease = Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some(String::new()),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(at(99))),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        };
        assert_eq!(LeaseRecord::of(&lease).holder, None);
        assert_eq!(
            decide(&LeaseRecord::of(&lease), "me", at(100)),
            LeaderDecision::Acquire
        );
    }
}
