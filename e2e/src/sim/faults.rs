//! Fault injection for reliability tests: failed requests, write conflicts, cut watch streams
//! and added latency. Everything is off by default.

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
}

/// What the server does to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Injected {
    None,
    InternalError,
    Conflict,
}

impl Faults {
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
}
