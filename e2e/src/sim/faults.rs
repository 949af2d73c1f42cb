//! Fault injection for reliability tests: failed requests, write conflicts, cut watch streams,
//! added latency and held requests on chosen resources. Everything is off by default.

use std::time::Duration;

use rand::Rng;

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
    /// One client is no longer served after its Nth write (see [`WriteCut`]).
    pub write_cut: Option<WriteCut>,
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
}

impl Faults {
    /// The rule holding requests on `resource` of `group`, if any.
    pub fn hold(&self, group: &str, resource: &str) -> Option<&Hold> {
        self.holds.iter().find(|hold| hold.matches(group, resource))
    }

    /// Draws the fault for one request.
    pub fn draw(&self, is_write: bool) -> Injected {
        let mut rng = rand::rng();
        if self.error_rate > 0.0 && rng.random_bool(self.error_rate.clamp(0.0, 1.0)) {
            Injected::InternalError
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
}
