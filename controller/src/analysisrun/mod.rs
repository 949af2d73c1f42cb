//! The AnalysisRun reconciler: a `Controller` of its own beside the Rollout one, so a Rollout
//! reconcile never waits on a metric provider. Each reconcile plans with the pure engine, takes
//! the measurements that are due (Prometheus, Web, Job, baseline judge), concludes, writes
//! `/status` only when it changed, publishes the engine's events and requeues exactly when the
//! next measurement is due. A finished run is never measured or written again; it costs no API
//! call at rest, except the one delete its `spec.ttlStrategy` asks for.
//!
//! Files by concern: `reconcile` (one reconcile, the error policy), `arguments` (fieldRef and
//! secretKeyRef values), `measure` (providers), `status` (status writes, events), `ttl` (deleting
//! finished runs), `context` (what reconciles share), `metrics` (counters). This file holds the
//! errors, the options and the watch loop.

mod arguments;
pub mod bounds;
pub mod budget;
mod context;
mod measure;
mod metrics;
mod reconcile;
mod status;
mod ttl;

#[cfg(test)]
mod fixtures;

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use kube::Client;
use kube::api::Api;
use kube::runtime::controller::{self, Controller};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use rollouts_crds::analysis::AnalysisRun;

use crate::cli::Flags;
use crate::decode::{self, Decoded, Sorter};
use crate::metrics::ReconcilePanics;
use crate::supervise::{self, Panicked};

pub use arguments::{SecretError, UnsupportedFieldRef, field_refs_resolved};
pub use context::{AnalysisContext, SetupError};
pub use measure::{ProviderChoiceError, ProviderKind, provider_kind};
pub use metrics::AnalysisRunMetrics;
pub use reconcile::{error_policy, next_look, reconcile};
pub use status::status_patch;
pub use ttl::ttl_expiry;

/// Everything that can make an AnalysisRun reconcile fail and be retried with backoff.
/// Provider failures are not here: they are Error measurements.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "AnalysisRun {0} has no namespace: AnalysisRuns are namespaced, recreate it in a namespace"
    )]
    MissingNamespace(String),

    #[error("cannot read AnalysisRun {namespace}/{name}: {source}")]
    GetRun {
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },

    #[error(
        "cannot read Secret {namespace}/{secret} for spec.args {argument:?} of AnalysisRun {namespace}/{run}: {source} (check that the controller may get secrets in {namespace})"
    )]
    ReadSecret {
        namespace: String,
        secret: String,
        argument: String,
        run: String,
        #[source]
        source: Box<kube::Error>,
    },

    #[error(
        "cannot delete AnalysisRun {namespace}/{name} after its spec.ttlStrategy ran out: {source} (check that the controller may delete analysisruns)"
    )]
    DeleteRun {
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },

    #[error("cannot encode the status of AnalysisRun {namespace}/{name}: {source}")]
    EncodeStatus {
        namespace: String,
        name: String,
        #[source]
        source: serde_json::Error,
    },

    #[error("cannot write the status of AnalysisRun {namespace}/{name}: {source}")]
    PatchStatus {
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },

    #[error(
        "reconcile of AnalysisRun {namespace}/{name} panicked: {message}; it is retried with backoff, other AnalysisRuns are not affected"
    )]
    Panicked {
        namespace: String,
        name: String,
        message: String,
    },
}

impl Error {
    /// A short, stable name for the `error` label of metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::MissingNamespace(_) => "missing_namespace",
            Error::GetRun { .. } => "get_analysis_run",
            Error::ReadSecret { .. } => "read_secret",
            Error::DeleteRun { .. } => "delete_analysis_run",
            Error::EncodeStatus { .. } => "encode_status",
            Error::PatchStatus { .. } => "patch_status",
            Error::Panicked { .. } => "panic",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the AnalysisRun controller takes from the command line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// `--namespace`: only runs in this namespace (all namespaces when unset).
    pub namespace: Option<String>,
    /// The instance-id selector, the same as for Rollouts, as Argo scopes every informer.
    pub label_selector: String,
    /// `--analysis-threads`: runs reconciled at the same time.
    pub concurrency: u16,
    /// `--prometheus-address`: used by metrics that leave `address` empty.
    pub prometheus_address: Option<String>,
    /// `--analysis-max-response-bytes` and `--analysis-measurement-concurrency`.
    pub limits: bounds::Limits,
}

impl Options {
    pub fn from_flags(flags: &Flags) -> Self {
        Self {
            namespace: flags.namespace.clone(),
            label_selector: flags.rollout_label_selector(),
            // A run waiting on a measurement slot holds a reconcile slot: never fewer of
            // those than of measurement slots.
            concurrency: flags
                .analysis_threads
                .max(flags.analysis_measurement_concurrency),
            prometheus_address: flags.prometheus_address.clone(),
            limits: bounds::Limits {
                max_response_bytes: usize::try_from(flags.analysis_max_response_bytes)
                    .unwrap_or(usize::MAX),
                measurement_concurrency: flags.analysis_measurement_concurrency,
            },
        }
    }
}

/// Runs the AnalysisRun controller until `stop` completes (finishing reconciles in flight).
/// Start it beside the Rollout controller, under the same leadership and shutdown signal. A
/// reconcile that panics is that run's error (counted in `panics`); the others go on.
pub async fn run(
    client: Client,
    options: Options,
    metrics: AnalysisRunMetrics,
    panics: ReconcilePanics,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), SetupError> {
    // Runs are decoded one by one: one that does not fit our types gets the Error phase and a
    // Warning event, and the others are still measured.
    let runs: Api<Decoded<AnalysisRun>> = match &options.namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    };
    let mut sorter =
        Sorter::<AnalysisRun>::new(Some(decode::spawn_reporter::<AnalysisRun>(client.clone())));
    let (store, writer) = reflector::store();
    metrics.watch(store.clone());
    let runs = watcher(
        runs,
        watcher::Config::default().labels(&options.label_selector),
    )
    .default_backoff()
    .filter_map(move |event| {
        std::future::ready(match event {
            Ok(event) => sorter.sort(event).map(Ok),
            Err(error) => Some(Err(error)),
        })
    })
    .reflect(writer)
    .applied_objects();
    let context = Arc::new(
        AnalysisContext::new(client, options.prometheus_address.clone(), metrics)?
            .with_limits(options.limits),
    );
    tracing::info!(
        namespace = options.namespace.as_deref().unwrap_or("(all)"),
        selector = %options.label_selector,
        prometheus_address = options.prometheus_address.as_deref().unwrap_or("(none)"),
        "watching AnalysisRuns"
    );
    let forget = context.clone();
    Controller::for_stream(runs, store)
        .with_config(controller::Config::default().concurrency(options.concurrency))
        .graceful_shutdown_on(stop)
        .run(
            move |run, context| contained_reconcile(run, context, panics.clone()),
            error_policy,
            context,
        )
        .inspect(move |outcome| {
            // A run that is gone (a requeue or trigger found no object): drop its bookkeeping.
            if let Err(controller::Error::ObjectNotFound(object)) = outcome {
                let namespace = object.namespace.as_deref().unwrap_or_default();
                forget.forget(&reconcile::object_key(namespace, &object.name));
            }
        })
        .for_each(|outcome| async move {
            match outcome {
                Ok(_) => {}
                // error_policy has already logged and counted failed reconciles.
                Err(
                    controller::Error::ReconcilerFailed(..) | controller::Error::ObjectNotFound(_),
                ) => {}
                Err(error) => tracing::warn!(%error, "AnalysisRun watch failed; retrying"),
            }
        })
        .await;
    Ok(())
}

/// [`reconcile`], with a panic inside turned into this run's [`Error::Panicked`].
async fn contained_reconcile(
    run: Arc<AnalysisRun>,
    context: Arc<AnalysisContext>,
    panics: ReconcilePanics,
) -> Result<kube::runtime::controller::Action> {
    use kube::ResourceExt;
    let namespace = run.namespace().unwrap_or_default();
    let name = run.name_any();
    let reconcile = reconcile(run, context);
    match supervise::contain("analysisrun", &namespace, &name, &panics, reconcile).await {
        Ok(outcome) => outcome,
        Err(Panicked { message }) => Err(Error::Panicked {
            namespace,
            name,
            message,
        }),
    }
}
