//! What every reconcile shares: the client, the event reporter, metrics, diagnostics, the
//! settings taken from flags, the watch caches of owned objects, and the per-Rollout failure
//! counts that drive retry backoff.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;
use kube::runtime::events::Reporter;

use crate::claims::Claims;
use crate::health::Diagnostics;
use crate::metrics::Metrics;
use crate::notify::Notifier;
use crate::owned_cache::OwnedCaches;

/// Name the controller reports as on events (`reportingController`), as Argo's does.
pub const CONTROLLER_NAME: &str = "rollouts-controller";

/// Flags the reconcilers read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// `--instance-id`: the Rollouts this instance owns.
    pub instance_id: Option<String>,
    /// `--prometheus-address`: the address analysis uses when a template leaves it empty.
    pub prometheus_address: Option<String>,
}

/// Shared state handed to every reconcile.
pub struct Context {
    pub client: Client,
    /// Who the events this controller writes say reported them.
    pub reporter: Reporter,
    pub metrics: Arc<Metrics>,
    pub diagnostics: Arc<Diagnostics>,
    pub settings: Settings,
    /// The ReplicaSets and AnalysisRuns of every Rollout, from the watches that trigger
    /// reconciles.
    pub caches: Arc<OwnedCaches>,
    /// Which Rollouts name which Services and router objects, from the Rollout watch.
    pub claims: Arc<Claims>,
    /// Sends the notifications subscribed to a Rollout's events (none without one).
    pub notifier: Option<Arc<Notifier>>,
    /// Consecutive failed reconciles per `namespace/name`, reset on success.
    failures: Mutex<HashMap<String, u32>>,
    /// resourceVersion of the last status this controller wrote, per `namespace/name`, until a
    /// reconcile has seen a copy at least that new.
    status_written: Mutex<HashMap<String, String>>,
}

impl Context {
    pub fn new(
        client: Client,
        metrics: Arc<Metrics>,
        diagnostics: Arc<Diagnostics>,
        settings: Settings,
        caches: Arc<OwnedCaches>,
    ) -> Self {
        let reporter = Reporter {
            controller: CONTROLLER_NAME.to_string(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            reporter,
            client,
            metrics,
            diagnostics,
            settings,
            caches,
            claims: Arc::default(),
            notifier: None,
            failures: Mutex::new(HashMap::new()),
            status_written: Mutex::new(HashMap::new()),
        }
    }

    /// The claims index the Rollout watch feeds (an empty one otherwise).
    #[must_use]
    pub fn with_claims(mut self, claims: Arc<Claims>) -> Self {
        self.claims = claims;
        self
    }

    /// The notifier the reconciles hand their events to.
    #[must_use]
    pub fn with_notifier(mut self, notifier: Arc<Notifier>) -> Self {
        self.notifier = Some(notifier);
        self
    }

    /// Drops what is kept per Rollout for `namespace/name` (backoff, status bookkeeping,
    /// metric series) once it is gone.
    pub fn forget(&self, namespace: &str, name: &str) {
        let key = format!("{namespace}/{name}");
        lock(&self.failures).remove(&key);
        lock(&self.status_written).remove(&key);
        self.metrics.forget_rollout(namespace, name);
    }

    /// [`Self::forget`] for the object of a `ObjectNotFound` reconcile outcome: the Rollout was
    /// deleted (its delete event or a later requeue triggered it).
    pub fn forget_object(
        &self,
        object: &kube::runtime::reflector::ObjectRef<kube::api::DynamicObject>,
    ) {
        let namespace = object.namespace.as_deref().unwrap_or_default();
        tracing::debug!(%namespace, name = %object.name, "Rollout is gone; its bookkeeping and metric series are dropped");
        self.forget(namespace, &object.name);
    }

    /// How many Rollouts have backoff or status bookkeeping kept, for tests of pruning.
    pub fn bookkeeping_len(&self) -> usize {
        lock(&self.failures).len() + lock(&self.status_written).len()
    }

    /// Remembers the resourceVersion our status write of `key` produced.
    pub fn record_status_written(&self, key: &str, resource_version: &str) {
        self.status_written
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(key.to_string(), resource_version.to_string());
    }

    /// Whether a cached copy of `key` at `resource_version` may predate our last status write
    /// (the watch has not delivered it yet). The write is forgotten once the cache holds it or
    /// something newer.
    pub fn is_stale(&self, key: &str, resource_version: Option<&str>) -> bool {
        let mut written = self
            .status_written
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(ours) = written.get(key) else {
            return false;
        };
        let caught_up = caught_up(resource_version, ours);
        if caught_up {
            written.remove(key);
        }
        !caught_up
    }

    /// Counts one more failure of `key` and returns how long to wait before retrying.
    pub fn record_failure(&self, key: &str) -> Duration {
        let mut failures = self
            .failures
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = failures.entry(key.to_string()).or_insert(0);
        *count = count.saturating_add(1);
        retry_backoff(*count)
    }

    /// Forgets the failures of `key` after a successful reconcile.
    pub fn record_success(&self, key: &str) {
        let mut failures = self
            .failures
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        failures.remove(key);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether a copy at `cached` includes the write that produced `ours`.
pub fn caught_up(cached: Option<&str>, ours: &str) -> bool {
    match cached {
        Some(cached) if cached == ours => true,
        // resourceVersions are opaque, but every API server we know counts up.
        Some(cached) => matches!(
            (cached.parse::<u64>(), ours.parse::<u64>()),
            (Ok(cached), Ok(ours)) if cached > ours
        ),
        None => false,
    }
}

/// Wait before the next try after `failures` failures in a row: 0.5 s, doubling, at most 5 min.
/// It starts short because most failures pass at once (a 500, a conflict, a throttle): a reconcile
/// of a routed canary makes a dozen requests, so under a few percent of refused requests several
/// fail in a row, and a wait starting at 5 s had reached 80 s by the fifth.
pub fn retry_backoff(failures: u32) -> Duration {
    const FIRST: Duration = Duration::from_millis(500);
    const MAX: Duration = Duration::from_secs(300);
    let doublings = failures.saturating_sub(1).min(16);
    FIRST.saturating_mul(1 << doublings).min(MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_copy_has_caught_up_with_our_write_or_anything_newer() {
        assert!(caught_up(Some("42"), "42"));
        assert!(caught_up(Some("43"), "42"));
        assert!(!caught_up(Some("41"), "42"));
        assert!(!caught_up(None, "42"));
        assert!(
            !caught_up(Some("b"), "a"),
            "opaque versions must match exactly"
        );
    }

    #[tokio::test]
    async fn forgetting_a_rollout_drops_its_backoff_bookkeeping_and_series_only() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URI"));
        let client = Client::try_from(config).expect("a client");
        let (store, _writer) = kube::runtime::reflector::store();
        let metrics = Arc::new(Metrics::new(store));
        let context = Context::new(
            client,
            metrics.clone(),
            Arc::new(Diagnostics::new(crate::health::Leadership::Disabled)),
            Settings::default(),
            Arc::new(OwnedCaches::new()),
        );
        for name in ["gone", "kept"] {
            let key = format!("shop/{name}");
            context.record_failure(&key);
            context.record_status_written(&key, "42");
            metrics.observe_reconcile("shop", name, Duration::from_millis(1));
        }
        assert_eq!(context.bookkeeping_len(), 4);
        context.forget("shop", "gone");
        assert_eq!(context.bookkeeping_len(), 2);
        assert!(
            context.is_stale("shop/kept", Some("41")),
            "the other is kept"
        );
        let text = metrics.render();
        assert!(!text.contains(r#"name="gone""#), "{text}");
        assert!(text.contains(r#"name="kept""#), "{text}");
    }

    #[test]
    fn backoff_doubles_from_half_a_second_up_to_five_minutes() {
        let waits: Vec<u128> = (1..=12).map(|n| retry_backoff(n).as_millis()).collect();
        assert_eq!(
            waits,
            vec![
                500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000, 256_000, 300_000,
                300_000
            ]
        );
        assert_eq!(retry_backoff(u32::MAX), Duration::from_secs(300));
    }
}
