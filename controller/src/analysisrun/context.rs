//! What every AnalysisRun reconcile shares: the client, the event reporter, the providers and
//! the per-run bookkeeping of failures and status writes (dropped when the run finishes or is
//! gone, see [`AnalysisContext::forget`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use kube::Client;
use kube::runtime::events::Reporter;
use rollouts_analysis::provider::{HttpClientError, JobProvider, PrometheusProvider, WebProvider};
use tokio::sync::Semaphore;

use super::AnalysisRunMetrics;
use super::bounds::Limits;
use crate::context::CONTROLLER_NAME;

/// Why the AnalysisRun controller cannot start.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("cannot build the Prometheus HTTP client: {source}")]
    PrometheusClient {
        #[source]
        source: HttpClientError,
    },
    #[error("cannot build the Web HTTP client: {source}")]
    WebClient {
        #[source]
        source: HttpClientError,
    },
}

/// Shared by every AnalysisRun reconcile: the client, events, providers and bookkeeping.
pub struct AnalysisContext {
    pub(super) client: Client,
    /// Who the events this controller writes say reported them.
    pub(super) reporter: Reporter,
    pub(super) metrics: AnalysisRunMetrics,
    default_prometheus_address: Option<String>,
    /// The provider every per-address one is cloned from: clones share its HTTP clients and
    /// its coalescing of identical queries, so a clone per measurement costs nothing and no
    /// map of addresses (which runs could grow without end) is kept.
    prometheus_base: PrometheusProvider,
    pub(super) web: WebProvider,
    pub(super) job: JobProvider,
    /// Measurements in flight, all runs together (`--analysis-measurement-concurrency`).
    pub(super) measurement_slots: Arc<Semaphore>,
    pub(super) limits: Limits,
    /// Consecutive failed reconciles per `namespace/name`, reset on success.
    pub(super) failures: Mutex<HashMap<String, u32>>,
    /// resourceVersion of our last status write per `namespace/name`, until a reconcile has
    /// seen it: planning from a cached copy older than our write would measure twice.
    pub(super) status_written: Mutex<HashMap<String, String>>,
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl AnalysisContext {
    /// Builds the providers; their HTTP clients are created once and shared by all runs.
    pub fn new(
        client: Client,
        default_prometheus_address: Option<String>,
        metrics: AnalysisRunMetrics,
    ) -> Result<Self, SetupError> {
        let prometheus_base =
            PrometheusProvider::new().map_err(|source| SetupError::PrometheusClient { source })?;
        let web = WebProvider::new().map_err(|source| SetupError::WebClient { source })?;
        let reporter = Reporter {
            controller: CONTROLLER_NAME.to_string(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Ok(Self {
            reporter,
            job: JobProvider::new(client.clone()),
            client,
            metrics,
            default_prometheus_address: default_prometheus_address.filter(|a| !a.is_empty()),
            prometheus_base,
            web,
            measurement_slots: Arc::new(Semaphore::new(usize::from(
                Limits::default().measurement_concurrency,
            ))),
            limits: Limits::default(),
            failures: Mutex::new(HashMap::new()),
            status_written: Mutex::new(HashMap::new()),
        })
    }

    /// The same context with the controller's limits: the size of providers' answers and the
    /// measurements in flight at once.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.prometheus_base = self
            .prometheus_base
            .with_max_response_bytes(limits.max_response_bytes);
        self.web = self.web.with_max_response_bytes(limits.max_response_bytes);
        self.measurement_slots = Arc::new(Semaphore::new(usize::from(
            limits.measurement_concurrency.max(1),
        )));
        self.limits = limits;
        self
    }

    /// The provider for a Prometheus address (the flag's default when the metric sets none).
    pub(super) fn prometheus_for(&self, address: Option<&str>) -> PrometheusProvider {
        let address = address
            .filter(|a| !a.is_empty())
            .or(self.default_prometheus_address.as_deref())
            .unwrap_or_default()
            .to_string();
        let provider = self.prometheus_base.clone();
        if address.is_empty() {
            // Queries then end as Error measurements naming provider.prometheus.address.
            provider
        } else {
            provider.with_default_address(address)
        }
    }

    /// Drops the bookkeeping of run `key` (`namespace/name`): it finished (never written again)
    /// or is gone.
    pub fn forget(&self, key: &str) {
        lock(&self.failures).remove(key);
        lock(&self.status_written).remove(key);
    }

    /// How many runs have backoff or status bookkeeping kept, for tests of pruning.
    pub fn bookkeeping_len(&self) -> usize {
        lock(&self.failures).len() + lock(&self.status_written).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_forgotten_run_keeps_no_bookkeeping_and_the_others_keep_theirs() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URI"));
        let client = Client::try_from(config).expect("a client");
        let context =
            AnalysisContext::new(client, None, AnalysisRunMetrics::default()).expect("builds");
        for key in ["shop/gone", "shop/kept"] {
            lock(&context.failures).insert(key.to_string(), 3);
            lock(&context.status_written).insert(key.to_string(), "7".to_string());
        }
        context.forget("shop/gone");
        assert_eq!(context.bookkeeping_len(), 2);
        assert!(lock(&context.failures).contains_key("shop/kept"));
        assert!(lock(&context.status_written).contains_key("shop/kept"));
    }
}
