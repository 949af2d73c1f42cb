//! Fault injection for reliability tests: failed requests, write conflicts, cut watch streams,
//! added latency and held requests on chosen resources. Everything is off by default.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Faults the server injects into resource requests (discovery and `/version` are spared so
/// clients can always start).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Faults {
    /// Share of requests (0.0..=1.0) answered 500 InternalError.
    pub error_rate: f64,
    /// Share of writes (create, update, patch, delete) answered 409 Conflict.
    pub conflict_rate: f64,
    /// Every watch stream ends after this many events (bookmarks not counted).
    pub watch_cut_after: Option<u64>,
    /// Added to every resource request before it is served.
    pub latency: Duration,
    /// Requests on these resources are held (see [`Hold`]).
    pub holds: Vec<Hold>,
    /// Faults drawn at random for soaks (429s, timed watch cuts, forced relists, latency
    /// spikes); with a seed, `error_rate` and `conflict_rate` are drawn from it too.
    pub random: RandomFaults,
    /// One client is no longer served after its Nth write (see [`WriteCut`]).
    pub write_cut: Option<WriteCut>,
    /// Requests on these (group, resource) pairs are answered 403 Forbidden, as an API server
    /// whose RBAC does not grant them would answer (`""` is the core group).
    pub forbidden: Vec<(String, String)>,
}

/// Faults drawn from the server's fault generator ([`FaultLog`]), seeded so a soak can be
/// replayed: the same seed draws the same sequence of faults for the same sequence of requests
/// (concurrent clients may reach the server in another order, so a replay is close, not exact).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RandomFaults {
    /// Seed of the generator; None seeds it from the OS, and [`FaultLog::seed`] tells which.
    /// Read when the server starts.
    pub seed: Option<u64>,
    /// Share of requests (0.0..=1.0) answered 429 TooManyRequests with a `Retry-After` header.
    pub too_many_rate: f64,
    /// The `Retry-After` of those answers, in whole seconds (the header has no finer unit).
    pub retry_after_seconds: u64,
    /// Every watch stream is cut at a moment drawn between half this span and all of it.
    pub watch_cut_within: Option<Duration>,
    /// Share of watches that resume from a resourceVersion answered with 410 Expired, so the
    /// client must relist.
    pub gone_rate: f64,
    /// Share of resource requests delayed by `spike` on top of `latency`.
    pub spike_rate: f64,
    pub spike: Duration,
}

/// How many faults of each kind the server injected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounts {
    pub internal_errors: u64,
    pub conflicts: u64,
    pub too_many_requests: u64,
    pub watch_cuts: u64,
    pub watch_gone: u64,
    pub latency_spikes: u64,
}

impl FaultCounts {
    pub fn total(&self) -> u64 {
        [
            self.internal_errors,
            self.conflicts,
            self.too_many_requests,
            self.watch_cuts,
            self.watch_gone,
            self.latency_spikes,
        ]
        .iter()
        .fold(0u64, |sum, n| sum.saturating_add(*n))
    }
}

impl std::fmt::Display for FaultCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "500 InternalError {}, 409 Conflict {}, 429 TooManyRequests {}, watches cut {}, \
             watches answered 410 Expired {}, latency spikes {}",
            self.internal_errors,
            self.conflicts,
            self.too_many_requests,
            self.watch_cuts,
            self.watch_gone,
            self.latency_spikes
        )
    }
}

/// The server's fault generator and the count of every fault it injected.
#[derive(Debug)]
pub struct FaultLog {
    seed: u64,
    rng: Mutex<StdRng>,
    internal_errors: AtomicU64,
    conflicts: AtomicU64,
    too_many_requests: AtomicU64,
    watch_cuts: AtomicU64,
    watch_gone: AtomicU64,
    latency_spikes: AtomicU64,
}

impl FaultLog {
    /// A generator seeded with `seed`, or from the OS when None.
    pub fn new(seed: Option<u64>) -> Self {
        let seed = seed.unwrap_or_else(|| rand::rng().random());
        Self {
            seed,
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            internal_errors: AtomicU64::new(0),
            conflicts: AtomicU64::new(0),
            too_many_requests: AtomicU64::new(0),
            watch_cuts: AtomicU64::new(0),
            watch_gone: AtomicU64::new(0),
            latency_spikes: AtomicU64::new(0),
        }
    }

    /// The seed that replays this server's faults.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn counts(&self) -> FaultCounts {
        let read = |n: &AtomicU64| n.load(Ordering::Relaxed);
        FaultCounts {
            internal_errors: read(&self.internal_errors),
            conflicts: read(&self.conflicts),
            too_many_requests: read(&self.too_many_requests),
            watch_cuts: read(&self.watch_cuts),
            watch_gone: read(&self.watch_gone),
            latency_spikes: read(&self.latency_spikes),
        }
    }

    fn with_rng<T>(&self, draw: impl FnOnce(&mut StdRng) -> T) -> T {
        // A panic while drawing cannot leave the generator half-written: take it back.
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        draw(&mut rng)
    }

    /// Draws (and counts) the fault for one resource request: its answer and its extra delay.
    pub fn draw(&self, faults: &Faults, is_write: bool) -> (Injected, Duration) {
        let (injected, spike) = self.with_rng(|rng| {
            let injected = faults.draw_with(rng, is_write);
            let spike = faults.random.spike_rate > 0.0
                && rng.random_bool(faults.random.spike_rate.clamp(0.0, 1.0));
            (injected, spike)
        });
        let counter = match injected {
            Injected::None => None,
            Injected::InternalError => Some(&self.internal_errors),
            Injected::Conflict => Some(&self.conflicts),
            Injected::TooManyRequests => Some(&self.too_many_requests),
        };
        if let Some(counter) = counter {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        if spike {
            self.latency_spikes.fetch_add(1, Ordering::Relaxed);
            (injected, faults.random.spike)
        } else {
            (injected, Duration::ZERO)
        }
    }

    /// Whether a watch resuming from a resourceVersion is answered 410 Expired (counted).
    pub fn draw_gone(&self, faults: &Faults) -> bool {
        let rate = faults.random.gone_rate;
        let gone = rate > 0.0 && self.with_rng(|rng| rng.random_bool(rate.clamp(0.0, 1.0)));
        if gone {
            self.watch_gone.fetch_add(1, Ordering::Relaxed);
        }
        gone
    }

    /// When a new watch stream is cut, if the faults cut watches.
    pub fn draw_watch_cut(&self, faults: &Faults) -> Option<Duration> {
        let span = faults.random.watch_cut_within?;
        let millis = u64::try_from(span.as_millis()).unwrap_or(u64::MAX).max(2);
        let at = self.with_rng(|rng| rng.random_range(millis / 2..=millis));
        Some(Duration::from_millis(at))
    }

    /// Counts a watch stream cut by [`FaultLog::draw_watch_cut`]'s deadline.
    pub fn count_watch_cut(&self) {
        self.watch_cuts.fetch_add(1, Ordering::Relaxed);
    }
}

/// Holds every request on one resource (matched by API group and plural, so on plain paths):
/// never answered while the rule is set, or answered after a delay. Clearing the rule (with
/// `set_faults`) releases the requests it holds forever; they are then served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// The resource's API group, `""` for the core group (e.g. `coordination.k8s.io`).
    pub group: String,
    /// The resource's plural (e.g. `leases`).
    pub resource: String,
    /// `None`: held until the rule is cleared; `Some(delay)`: served after `delay`.
    pub delay: Option<Duration>,
}

impl Hold {
    /// Holds every request on Lease objects until the rule is cleared.
    pub fn leases() -> Self {
        Self {
            group: "coordination.k8s.io".to_string(),
            resource: "leases".to_string(),
            delay: None,
        }
    }

    /// The same rule, answering after `delay` instead.
    pub fn after(self, delay: Duration) -> Self {
        Self {
            delay: Some(delay),
            ..self
        }
    }

    /// Parses `RESOURCE[.GROUP]` as kubectl writes it (`leases.coordination.k8s.io`,
    /// `configmaps`), held until cleared.
    pub fn parse(resource: &str) -> Result<Self, String> {
        let (plural, group) = resource.split_once('.').unwrap_or((resource, ""));
        if plural.is_empty() || !plural.chars().all(|c| c.is_ascii_lowercase()) {
            return Err(format!(
                "{resource:?} is not a resource: write its plural and group, like leases.coordination.k8s.io"
            ));
        }
        Ok(Self {
            group: group.to_string(),
            resource: plural.to_string(),
            delay: None,
        })
    }

    pub fn matches(&self, group: &str, resource: &str) -> bool {
        self.group == group && self.resource == resource
    }
}

/// Stops serving one client at an exact write: once `after_writes` write requests (create,
/// update, patch, delete) from clients whose `User-Agent` starts with `user_agent_prefix` have
/// been let through since the rule was set, every further request from them, read or write,
/// is refused with a 500 until the rule is cleared or replaced. Other clients are served as
/// usual. A test kills the client once it has been cut: the cut is at a write, not at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteCut {
    /// `rollouts-controller/` matches every version of the controller.
    pub user_agent_prefix: String,
    pub after_writes: u64,
}

impl WriteCut {
    /// The controller (`rollouts-controller/<version>`), cut after `after_writes` writes.
    pub fn controller(after_writes: u64) -> Self {
        Self {
            user_agent_prefix: "rollouts-controller/".to_string(),
            after_writes,
        }
    }

    pub fn matches(&self, user_agent: &str) -> bool {
        user_agent.starts_with(&self.user_agent_prefix)
    }
}

/// The server's count of the writes a [`WriteCut`] let through; reset whenever the faults are
/// set.
#[derive(Debug, Default)]
pub struct WriteCutCount {
    /// (writes let through, requests refused) since the faults were last set.
    counts: std::sync::Mutex<(u64, u64)>,
}

impl WriteCutCount {
    /// Decides one request under `rule`: true when it must be refused. A write let through is
    /// counted in the same step, so concurrent writes never pass the limit.
    pub fn refuses(&self, rule: Option<&WriteCut>, user_agent: &str, is_write: bool) -> bool {
        let Some(rule) = rule.filter(|rule| rule.matches(user_agent)) else {
            return false;
        };
        let mut counts = self.lock();
        if counts.0 >= rule.after_writes {
            counts.1 = counts.1.saturating_add(1);
            return true;
        }
        if is_write {
            counts.0 = counts.0.saturating_add(1);
        }
        false
    }

    /// Writes let through since the faults were last set.
    pub fn writes(&self) -> u64 {
        self.lock().0
    }

    /// Requests refused since the faults were last set.
    pub fn refused(&self) -> u64 {
        self.lock().1
    }

    pub fn reset(&self) {
        *self.lock() = (0, 0);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, u64)> {
        // Two integers cannot be left half-written: a poisoned lock still holds valid counts.
        self.counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What the server does to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Injected {
    None,
    InternalError,
    Conflict,
    /// 429 with a `Retry-After` of [`RandomFaults::retry_after_seconds`].
    TooManyRequests,
}

impl Faults {
    /// The rule holding requests on `resource` of `group`, if any.
    pub fn hold(&self, group: &str, resource: &str) -> Option<&Hold> {
        self.holds.iter().find(|hold| hold.matches(group, resource))
    }

    /// Whether requests on `resource` of `group` are refused as forbidden.
    pub fn forbids(&self, group: &str, resource: &str) -> bool {
        self.forbidden
            .iter()
            .any(|(g, r)| g == group && r == resource)
    }

    /// Draws the fault for one request.
    pub fn draw(&self, is_write: bool) -> Injected {
        self.draw_with(&mut rand::rng(), is_write)
    }

    /// Draws the fault for one request from `rng`.
    pub fn draw_with(&self, rng: &mut impl Rng, is_write: bool) -> Injected {
        if self.error_rate > 0.0 && rng.random_bool(self.error_rate.clamp(0.0, 1.0)) {
            Injected::InternalError
        } else if self.random.too_many_rate > 0.0
            && rng.random_bool(self.random.too_many_rate.clamp(0.0, 1.0))
        {
            Injected::TooManyRequests
        } else if is_write
            && self.conflict_rate > 0.0
            && rng.random_bool(self.conflict_rate.clamp(0.0, 1.0))
        {
            Injected::Conflict
        } else {
            Injected::None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certain_faults_always_fire_and_absent_ones_never_do() {
        let off = Faults::default();
        assert_eq!(off.draw(true), Injected::None);
        let errors = Faults {
            error_rate: 1.0,
            ..Faults::default()
        };
        assert_eq!(errors.draw(false), Injected::InternalError);
        let conflicts = Faults {
            conflict_rate: 1.0,
            ..Faults::default()
        };
        assert_eq!(conflicts.draw(false), Injected::None);
        assert_eq!(conflicts.draw(true), Injected::Conflict);
    }

    #[test]
    fn a_write_cut_lets_exactly_n_writes_of_its_client_through() {
        let rule = WriteCut::controller(2);
        let count = WriteCutCount::default();
        let controller = "rollouts-controller/0.1.0";
        assert!(!count.refuses(Some(&rule), controller, false));
        assert!(!count.refuses(Some(&rule), controller, true));
        assert!(!count.refuses(Some(&rule), "kubectl/v1.32", true));
        assert!(!count.refuses(Some(&rule), controller, true));
        assert_eq!(count.writes(), 2);
        assert!(count.refuses(Some(&rule), controller, false));
        assert!(count.refuses(Some(&rule), controller, true));
        assert!(!count.refuses(Some(&rule), "kubectl/v1.32", true));
        assert!(!count.refuses(None, controller, true));
        assert_eq!((count.writes(), count.refused()), (2, 2));
        count.reset();
        assert_eq!((count.writes(), count.refused()), (0, 0));
        let none = WriteCut::controller(0);
        assert!(count.refuses(Some(&none), controller, false));
    }

    #[test]
    fn holds_match_their_resource_and_group_only() {
        let faults = Faults {
            holds: vec![Hold::leases()],
            ..Faults::default()
        };
        assert_eq!(
            faults.hold("coordination.k8s.io", "leases"),
            Some(&Hold::leases())
        );
        assert_eq!(faults.hold("", "leases"), None);
        assert_eq!(faults.hold("coordination.k8s.io", "configmaps"), None);
        assert_eq!(
            Hold::parse("leases.coordination.k8s.io"),
            Ok(Hold::leases())
        );
        let config_maps = Hold::parse("configmaps").expect("a core resource");
        assert!(config_maps.matches("", "configmaps"));
        assert!(Hold::parse(".apps").is_err());
        assert!(Hold::parse("Leases").is_err());
        assert_eq!(
            Hold::leases().after(Duration::from_secs(30)).delay,
            Some(Duration::from_secs(30))
        );
    }

    #[test]
    fn one_seed_draws_one_sequence_and_counts_each_kind() {
        let faults = Faults {
            error_rate: 0.05,
            conflict_rate: 0.05,
            random: RandomFaults {
                too_many_rate: 0.01,
                gone_rate: 0.5,
                spike_rate: 0.1,
                spike: Duration::from_millis(200),
                watch_cut_within: Some(Duration::from_secs(4)),
                ..RandomFaults::default()
            },
            ..Faults::default()
        };
        let run = |seed| {
            let log = FaultLog::new(Some(seed));
            let draws: Vec<_> = (0..2_000)
                .map(|i| {
                    (
                        log.draw(&faults, i % 2 == 0),
                        log.draw_gone(&faults),
                        log.draw_watch_cut(&faults),
                    )
                })
                .collect();
            (draws, log.counts())
        };
        let (draws, counts) = run(7);
        assert_eq!(run(7), (draws.clone(), counts));
        assert_ne!(run(8).0, draws);
        let injected = |kind| draws.iter().filter(|((i, _), ..)| *i == kind).count() as u64;
        assert_eq!(counts.internal_errors, injected(Injected::InternalError));
        assert_eq!(counts.conflicts, injected(Injected::Conflict));
        assert_eq!(
            counts.too_many_requests,
            injected(Injected::TooManyRequests)
        );
        assert!(counts.internal_errors > 0 && counts.conflicts > 0 && counts.too_many_requests > 0);
        let spikes = draws.iter().filter(|((_, d), ..)| !d.is_zero()).count() as u64;
        assert_eq!(counts.latency_spikes, spikes);
        assert!(
            draws
                .iter()
                .filter_map(|(.., cut)| *cut)
                .all(|cut| (Duration::from_secs(2)..=Duration::from_secs(4)).contains(&cut))
        );
        assert_eq!(
            counts.watch_gone,
            draws.iter().filter(|(_, gone, _)| *gone).count() as u64
        );
        assert_eq!(FaultLog::new(Some(3)).seed(), 3);
    }
}
