//! The Experiment controller: a `Controller` of its own beside the Rollout and AnalysisRun
//! ones, running Argo's `Experiment` kind. Each template becomes a ReplicaSet (and a Service
//! when it asks for one), each analysis an AnalysisRun once the templates are available; the
//! experiment ends when its duration passes, its required analyses succeed, an analysis fails,
//! a template misses its progress deadline, or it is terminated; then its ReplicaSets go to
//! zero after `scaleDownDelaySeconds` and its Services are deleted. A finished experiment with
//! nothing left to scale down costs no API call.
//!
//! Files by concern: `plan` (the phase rules, pure), `build` (the objects it owns),
//! `validation` (specs that cannot run), `reconcile` (observe, act, status, events). This file
//! holds the errors, the options and the watch loop.

pub mod build;
mod metrics;
pub mod plan;
mod reconcile;
pub mod validation;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use rollouts_crds::analysis::AnalysisRun;
use rollouts_crds::experiment::Experiment;

use crate::cli::Flags;
use crate::context::CONTROLLER_NAME;
use crate::decode::{self, Decoded, Report, Sorter, StatusReport, Undecodable};
use crate::metrics::ReconcilePanics;
use crate::supervise::{self, Panicked};

pub use build::{EXPERIMENT_NAME_ANNOTATION, EXPERIMENT_TEMPLATE_NAME_ANNOTATION};
pub use metrics::ExperimentMetrics;
pub use reconcile::{error_policy, reconcile};

/// Everything that can make an Experiment reconcile fail and be retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "Experiment {0} has no namespace: Experiments are namespaced, recreate it in a namespace"
    )]
    MissingNamespace(String),

    #[error("cannot read {kind} {namespace}/{name} for Experiment {experiment}: {source}")]
    Read {
        kind: &'static str,
        namespace: String,
        name: String,
        experiment: String,
        #[source]
        source: Box<kube::Error>,
    },

    #[error(
        "cannot {verb} {kind} {namespace}/{name} for Experiment {experiment}: {source} (check that the controller may {verb} {kind} objects in {namespace})"
    )]
    Write {
        verb: &'static str,
        kind: &'static str,
        namespace: String,
        name: String,
        experiment: String,
        #[source]
        source: Box<kube::Error>,
    },

    #[error("cannot encode the status of Experiment {namespace}/{name}: {source}")]
    EncodeStatus {
        namespace: String,
        name: String,
        #[source]
        source: serde_json::Error,
    },

    #[error(
        "reconcile of Experiment {namespace}/{name} panicked: {message}; it is retried with backoff, other Experiments are not affected"
    )]
    Panicked {
        namespace: String,
        name: String,
        message: String,
    },
}

impl Error {
    /// A short, stable name for the `error` label of metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::MissingNamespace(_) => "missing_namespace",
            Error::Read { .. } => "read",
            Error::Write { .. } => "write",
            Error::EncodeStatus { .. } => "encode_status",
            Error::Panicked { .. } => "panic",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the Experiment controller takes from the command line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// `--namespace`: only experiments in this namespace (all namespaces when unset).
    pub namespace: Option<String>,
    /// The instance-id selector, the same as for Rollouts, as Argo scopes every informer.
    pub label_selector: String,
    /// `--experiment-threads`: Experiments reconciled at the same time.
    pub concurrency: u16,
}

impl Options {
    pub fn from_flags(flags: &Flags) -> Self {
        Self {
            namespace: flags.namespace.clone(),
            label_selector: flags.rollout_label_selector(),
            concurrency: flags.experiment_threads,
        }
    }
}

/// Shared by every Experiment reconcile.
pub struct ExperimentContext {
    pub(crate) client: Client,
    pub(crate) reporter: Reporter,
    /// ReplicaSets owned by an Experiment (no other).
    pub(crate) replica_sets: Store<ReplicaSet>,
    /// AnalysisRuns owned by an Experiment (no other).
    pub(crate) runs: Store<AnalysisRun>,
    /// Consecutive failed reconciles per `namespace/name`, reset on success.
    pub(crate) failures: Mutex<HashMap<String, u32>>,
    /// resourceVersion of our last status write per `namespace/name`, until a reconcile has
    /// seen it: planning from a cached copy older than our write would create twice.
    pub(crate) status_written: Mutex<HashMap<String, String>>,
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ExperimentContext {
    /// Drops the bookkeeping of an experiment that is gone.
    fn forget(&self, key: &str) {
        lock(&self.failures).remove(key);
        lock(&self.status_written).remove(key);
    }
}

/// Whether an object's controller is an Experiment.
fn owned_by_experiment(meta: &ObjectMeta) -> bool {
    meta.owner_references.iter().flatten().any(|owner| {
        owner.controller == Some(true)
            && owner.kind == "Experiment"
            && owner.api_version.starts_with("argoproj.io/")
    })
}

/// Keeps only the watch events of objects an Experiment owns (list markers pass).
fn experiment_owned<K: Resource>(event: watcher::Event<K>) -> Option<watcher::Event<K>> {
    match &event {
        watcher::Event::Init | watcher::Event::InitDone => Some(event),
        watcher::Event::InitApply(object)
        | watcher::Event::Apply(object)
        | watcher::Event::Delete(object) => owned_by_experiment(object.meta()).then_some(event),
    }
}

/// Runs the Experiment controller until `stop` completes (finishing reconciles in flight). A
/// reconcile that panics is that experiment's error (counted in `panics`); the others go on.
/// Reconciles, failures and the experiments in the watch cache are served through `metrics`.
pub async fn run(
    client: Client,
    options: Options,
    metrics: ExperimentMetrics,
    panics: ReconcilePanics,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) -> std::result::Result<(), String> {
    let scoped = |client: &Client| -> (
        Api<Decoded<Experiment>>,
        Api<ReplicaSet>,
        Api<Decoded<AnalysisRun>>,
    ) {
        match &options.namespace {
            Some(namespace) => (
                Api::namespaced(client.clone(), namespace),
                Api::namespaced(client.clone(), namespace),
                Api::namespaced(client.clone(), namespace),
            ),
            None => (
                Api::all(client.clone()),
                Api::all(client.clone()),
                Api::all(client.clone()),
            ),
        }
    };
    let (experiments, replica_sets, runs) = scoped(&client);
    let mut sorter =
        Sorter::<Experiment>::new(Some(decode::spawn_reporter::<Experiment>(client.clone())));
    let (store, writer) = reflector::store();
    metrics.watch(store.clone());
    let experiments = watcher(
        experiments,
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
    // Deletions too: the reconcile then finds it gone (ObjectNotFound below) and its
    // bookkeeping and metric series go, whether or not an owned object's event follows.
    .touched_objects();

    let (rs_store, rs_writer) = reflector::store();
    let replica_sets = watcher(replica_sets, watcher::Config::default())
        .default_backoff()
        .filter_map(|event| {
            std::future::ready(match event {
                Ok(event) => experiment_owned(event).map(Ok),
                Err(error) => Some(Err(error)),
            })
        })
        // Kept: what a template's status and the scale-down read (counts, labels, annotations).
        .modify(|rs| {
            rs.managed_fields_mut().clear();
            if let Some(spec) = rs.spec.as_mut() {
                spec.template = None;
            }
        })
        .reflect(rs_writer)
        .touched_objects();

    // Runs that do not decode are the AnalysisRun controller's to report.
    let mut run_sorter = Sorter::<AnalysisRun>::new(None);
    let (run_store, run_writer) = reflector::store();
    let runs = watcher(
        runs,
        watcher::Config::default().labels(&options.label_selector),
    )
    .default_backoff()
    .filter_map(move |event| {
        std::future::ready(match event {
            Ok(event) => run_sorter.sort(event).and_then(experiment_owned).map(Ok),
            Err(error) => Some(Err(error)),
        })
    })
    // Kept: what the experiment follows (phase, message, terminate).
    .modify(|run| {
        run.managed_fields_mut().clear();
        run.spec.metrics.clear();
        if let Some(status) = run.status.as_mut() {
            status.metric_results.clear();
        }
    })
    .reflect(run_writer)
    .touched_objects();

    let context = Arc::new(ExperimentContext {
        reporter: Reporter {
            controller: CONTROLLER_NAME.to_string(),
            instance: std::env::var("POD_NAME").ok(),
        },
        client,
        replica_sets: rs_store,
        runs: run_store,
        failures: Mutex::default(),
        status_written: Mutex::default(),
    });
    tracing::info!(
        namespace = options.namespace.as_deref().unwrap_or("(all)"),
        selector = %options.label_selector,
        "watching Experiments"
    );
    let forget = context.clone();
    let forget_series = metrics.clone();
    Controller::for_stream(experiments, store)
        .owns_stream(replica_sets)
        .owns_stream(runs)
        .with_config(controller::Config::default().concurrency(options.concurrency))
        .graceful_shutdown_on(stop)
        .run(
            move |experiment, context| {
                contained_reconcile(experiment, context, metrics.clone(), panics.clone())
            },
            error_policy,
            context,
        )
        .inspect(move |outcome| {
            if let Err(controller::Error::ObjectNotFound(object)) = outcome {
                let namespace = object.namespace.as_deref().unwrap_or_default();
                forget.forget(&format!("{namespace}/{}", object.name));
                forget_series.forget(namespace, &object.name);
            }
        })
        .for_each(|outcome| async move {
            match outcome {
                Ok(_) => {}
                Err(
                    controller::Error::ReconcilerFailed(..) | controller::Error::ObjectNotFound(_),
                ) => {}
                Err(error) => tracing::warn!(%error, "Experiment watch failed; retrying"),
            }
        })
        .await;
    Ok(())
}

/// [`reconcile`], with a panic inside turned into this experiment's [`Error::Panicked`]; its
/// duration and failure recorded in `metrics`.
async fn contained_reconcile(
    experiment: Arc<Experiment>,
    context: Arc<ExperimentContext>,
    metrics: ExperimentMetrics,
    panics: ReconcilePanics,
) -> Result<controller::Action> {
    let namespace = experiment.namespace().unwrap_or_default();
    let name = experiment.name_any();
    let started = Instant::now();
    let reconcile = reconcile(experiment, context);
    let outcome =
        match supervise::contain("experiment", &namespace, &name, &panics, reconcile).await {
            Ok(outcome) => outcome,
            Err(Panicked { message }) => Err(Error::Panicked {
                namespace: namespace.clone(),
                name: name.clone(),
                message,
            }),
        };
    metrics.observe_reconcile(&namespace, &name, started.elapsed());
    if let Err(error) = &outcome {
        metrics.reconcile_failed(&namespace, &name, error);
    }
    outcome
}

impl Report for Experiment {
    fn from_metadata(metadata: ObjectMeta) -> Self {
        Experiment {
            metadata,
            spec: Default::default(),
            status: None,
        }
    }

    /// The `Error` phase with a message naming the field, unless the experiment finished
    /// before: its result stands.
    fn status_report(undecodable: &Undecodable, _now: Timestamp) -> StatusReport {
        #[derive(serde::Deserialize)]
        struct Phase {
            #[serde(default)]
            phase: String,
            #[serde(default)]
            message: String,
        }
        let current = undecodable
            .status
            .as_ref()
            .and_then(|raw| serde_json::from_str::<Phase>(raw.get()).ok());
        let message = format!("The Experiment cannot be decoded: {}", undecodable.error);
        match current {
            Some(current) if current.phase == "Error" && current.message == message => {
                StatusReport::Recorded
            }
            Some(current)
                if ["Successful", "Failed", "Error", "Inconclusive"]
                    .contains(&current.phase.as_str()) =>
            {
                StatusReport::NoStatus
            }
            _ => StatusReport::Patch(serde_json::json!({
                "status": {"phase": "Error", "message": message}
            })),
        }
    }
}
