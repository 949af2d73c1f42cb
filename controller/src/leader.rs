//! Leader election on a `coordination.k8s.io/v1` Lease, so one replica acts at a time.
//!
//! [`decide`] is the pure rule (acquire, renew or wait); [`LeaderElection`] applies it with
//! optimistic concurrency (a write carries the resourceVersion it read, so two candidates
//! cannot both win). Timings follow client-go's leader election, in its proportions of the
//! lease duration ([`Timing`]): the leader renews every retry period, and one that has not
//! renewed within the renew deadline stops acting, before its lease can expire and another
//! replica may take over. Every request on the Lease has a timeout, so a hung API server
//! cannot keep a leader acting past its deadline or a follower waiting forever.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::time::Instant;

use crate::error::{Error, Result};

/// The timings of leader election, derived from `--lease-duration` in client-go's proportions:
/// a 15s lease (the default) gives a 10s renew deadline, a 2s retry period and 5s per request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long a Lease stays valid without renewal.
    pub lease_duration: Duration,
    /// A leader that has not renewed for this long since the start of its last successful
    /// renewal stops acting: two thirds of the lease, so it stops a third of the lease before
    /// any other replica may take over.
    pub renew_deadline: Duration,
    /// Between a leader's renewals, and between a follower's looks at the Lease.
    pub retry_period: Duration,
    /// The longest one request on the Lease (get, create, replace) may take.
    pub request_timeout: Duration,
}

impl Timing {
    pub fn for_lease(lease_duration: Duration) -> Self {
        // Divided first, so no duration can overflow.
        let renew_deadline = lease_duration / 3 * 2;
        Self {
            lease_duration,
            renew_deadline,
            retry_period: lease_duration / 15 * 2,
            request_timeout: renew_deadline / 2,
        }
    }
}

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
/// (released), a lease never renewed or one with a negative duration is free. Times are
/// another replica's data: an expiry past the end of representable time means held.
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
    let expires = SignedDuration::try_from(duration)
        .ok()
        .and_then(|duration| renewed.checked_add(duration).ok());
    let Some(expires) = expires else {
        return LeaderDecision::Wait(Duration::MAX);
    };
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
    timing: Timing,
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
            timing: Timing::for_lease(lease_duration),
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// Waits until this candidate holds the Lease; returns when the winning round started,
    /// which is when the lease's validity is counted from. API errors and timeouts are retried:
    /// a follower has nothing to lose by waiting, and the leader may be the one that is
    /// unreachable.
    pub async fn acquire(&self) -> Instant {
        loop {
            let started = Instant::now();
            match self.try_acquire_or_renew().await {
                Ok(LeaderDecision::Acquire | LeaderDecision::Renew) => return started,
                Ok(LeaderDecision::Wait(left)) => {
                    tokio::time::sleep(left.min(self.timing.retry_period)).await;
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot read or take the leader lease, retrying");
                    tokio::time::sleep(self.timing.retry_period).await;
                }
            }
        }
    }

    /// Renews the Lease every retry period until it is lost; returns why. `renewed` is when
    /// the round that acquired it started. Renewals may fail (network, API server, timeouts)
    /// until the renew deadline after the start of the last successful one: then this returns
    /// at once, even with a request still hanging, before the lease can expire.
    pub async fn hold(&self, renewed: Instant) -> Error {
        let mut renewed = renewed;
        loop {
            let deadline = renewed + self.timing.renew_deadline;
            tokio::time::sleep_until((Instant::now() + self.timing.retry_period).min(deadline))
                .await;
            let started = Instant::now();
            if started >= deadline {
                return self.not_renewed_in_time();
            }
            match tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await {
                Ok(Ok(LeaderDecision::Renew | LeaderDecision::Acquire)) => renewed = started,
                Ok(Ok(LeaderDecision::Wait(_))) => {
                    return self.lost("another replica holds the lease".to_string());
                }
                Ok(Err(error)) => {
                    tracing::warn!(%error, "cannot renew the leader lease, retrying until the renew deadline");
                }
                Err(_) => return self.not_renewed_in_time(),
            }
        }
    }

    fn not_renewed_in_time(&self) -> Error {
        self.lost(format!(
            "not renewed within the renew deadline ({:?}, the lease lasts {:?}); stopped acting before it can expire",
            self.timing.renew_deadline, self.timing.lease_duration
        ))
    }

    /// Gives the Lease up (empty holder) so a follower takes over without waiting for expiry.
    pub async fn release(&self) -> Result<()> {
        let Some(mut lease) = self
            .request("get", self.api.get_opt(&self.name))
            .await?
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
        self.request(
            "replace",
            self.api.replace(&self.name, &PostParams::default(), &lease),
        )
        .await?
        .map_err(|e| self.lease_error(e))?;
        Ok(())
    }

    /// One request on the Lease, given up after the request timeout.
    async fn request<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = kube::Result<T>>,
    ) -> Result<kube::Result<T>> {
        tokio::time::timeout(self.timing.request_timeout, call)
            .await
            .map_err(|_| Error::LeaseTimeout {
                operation,
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                timeout: self.timing.request_timeout,
            })
    }

    /// One round: read the Lease, decide, and write it when acquiring or renewing. A write
    /// that loses a race (409) is an error: the next round reads who won. (For a leader, the
    /// race may be with its own earlier renewal, answered too late but applied.)
    async fn try_acquire_or_renew(&self) -> Result<LeaderDecision> {
        let now = Timestamp::now();
        let existing = self
            .request("get", self.api.get_opt(&self.name))
            .await?
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
                self.request("create", self.api.create(&PostParams::default(), &lease))
                    .await?
            }
            (_, Some(mut lease)) => {
                let previous = lease.spec.take().unwrap_or_default();
                let transitions = previous.lease_transitions.unwrap_or(0);
                let spec = if decision == LeaderDecision::Renew {
                    let acquired = previous.acquire_time.map_or(now, |time| time.0);
                    self.spec(acquired, now, transitions)
                } else {
                    tracing::info!(previous = ?previous.holder_identity, "taking over the leader lease");
                    self.spec(now, now, transitions.saturating_add(1))
                };
                lease.spec = Some(spec);
                self.request(
                    "replace",
                    self.api.replace(&self.name, &PostParams::default(), &lease),
                )
                .await?
            }
        };
        written
            .map(|_| decision)
            .map_err(|error| self.lease_error(error))
    }

    fn spec(&self, acquired: Timestamp, renewed: Timestamp, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.timing.lease_duration.as_secs()).unwrap_or(i32::MAX),
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

    /// A leader whose renewals conflict (as when an earlier renewal, answered too late, was
    /// applied after all) keeps the lease once a renewal goes through.
    #[tokio::test]
    async fn a_leader_keeps_its_lease_through_renewal_conflicts() {
        use rollouts_e2e::sim::{Faults, SimOptions, start};

        let sim = start(SimOptions::default()).expect("kube-sim starts");
        let config = kube::Config::new(sim.url().parse().expect("a URI"));
        let client = kube::Client::try_from(config).expect("a client");
        let election = LeaderElection::new(
            Api::namespaced(client, "default"),
            "default",
            "lock",
            "me".to_string(),
            Duration::from_secs(3),
        );
        let acquired = election.acquire().await;
        let holder = tokio::spawn({
            let election = election.clone();
            async move { election.hold(acquired).await }
        });
        let renewals = |code: u16| {
            sim.requests()
                .iter()
                .filter(|r| r.resource == "leases" && r.verb == "update" && r.code == code)
                .count()
        };
        sim.set_faults(Faults {
            conflict_rate: 1.0,
            ..Faults::default()
        });
        wait_until(|| renewals(409) > 0).await;
        // Every renewal from now until the faults are cleared conflicts.
        let renewed_before = renewals(200);
        sim.set_faults(Faults::default());
        wait_until(|| renewals(200) > renewed_before).await;
        assert!(!holder.is_finished(), "the leader gave up on a conflict");
        holder.abort();
    }

    async fn wait_until(condition: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !condition() {
            assert!(tokio::time::Instant::now() < deadline, "not reached");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[test]
    fn timings_follow_client_go_proportions() {
        assert_eq!(
            Timing::for_lease(Duration::from_secs(15)),
            Timing {
                lease_duration: Duration::from_secs(15),
                renew_deadline: Duration::from_secs(10),
                retry_period: Duration::from_secs(2),
                request_timeout: Duration::from_secs(5),
            }
        );
        let shortest = Timing::for_lease(Duration::from_secs(3));
        assert_eq!(shortest.renew_deadline, Duration::from_secs(2));
        assert_eq!(shortest.retry_period, Duration::from_millis(400));
        let longest = Timing::for_lease(Duration::MAX);
        assert!(longest.renew_deadline < longest.lease_duration);
    }

    #[test]
    fn absurd_lease_times_from_another_holder_do_not_panic() {
        let far_future = Timestamp::MAX;
        let forever = LeaseRecord {
            holder: Some("other".to_string()),
            renew_time: Some(far_future),
            lease_duration: Some(Duration::from_secs(i32::MAX.unsigned_abs().into())),
        };
        assert!(matches!(
            decide(&forever, "me", at(100)),
            LeaderDecision::Wait(_)
        ));
        let ancient = LeaseRecord {
            renew_time: Some(Timestamp::MIN),
            ..forever.clone()
        };
        assert_eq!(decide(&ancient, "me", at(100)), LeaderDecision::Acquire);
        let huge = LeaseRecord {
            lease_duration: Some(Duration::MAX),
            ..held_by("other", 99)
        };
        assert!(matches!(
            decide(&huge, "me", at(100)),
            LeaderDecision::Wait(_)
        ));
        let lease = Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some("other".to_string()),
                lease_duration_seconds: Some(i32::MIN),
                renew_time: Some(MicroTime(far_future)),
                lease_transitions: Some(i32::MAX),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        };
        assert_eq!(
            decide(&LeaseRecord::of(&lease), "me", at(100)),
            LeaderDecision::Acquire,
            "a negative duration is no lease"
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
