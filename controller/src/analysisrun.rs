//! The AnalysisRun reconciler: a `Controller` of its own beside the Rollout one, so a Rollout
//! reconcile never waits on a metric provider. Each reconcile plans with the pure engine, takes
//! the measurements that are due (Prometheus, Web, Job, baseline judge), concludes, writes
//! `/status` only when it changed, publishes the engine's events and requeues exactly when the
//! next measurement is due. A finished run is never measured or written again; it costs no API
//! call at rest, except the one delete its `spec.ttlStrategy` asks for.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use rollouts_analysis::args;
use rollouts_analysis::engine::{self, MeasurementTask, Outcome, Plan, Schedule, TakenMeasurement};
use rollouts_analysis::provider::{
    self, BaselineJudgeProvider, JobProvider, MetricProvider, PrometheusProvider, RunContext,
    WebProvider,
};
use rollouts_crds::analysis::{
    AnalysisPhase, AnalysisRun, AnalysisRunSpec, AnalysisRunStatus, Metric,
};
use serde_json::Value;
use tracing::instrument;

use crate::cli::Flags;
use crate::context::{CONTROLLER_NAME, retry_backoff};
use crate::status_patch::merge_diff;

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
    /// `--concurrency`: runs reconciled at the same time.
    pub concurrency: u16,
    /// `--prometheus-address`: used by metrics that leave `address` empty.
    pub prometheus_address: Option<String>,
}

impl Options {
    pub fn from_flags(flags: &Flags) -> Self {
        Self {
            namespace: flags.namespace.clone(),
            label_selector: flags.rollout_label_selector(),
            concurrency: flags.concurrency,
            prometheus_address: flags.prometheus_address.clone(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MeasurementLabels {
    provider: String,
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileErrorLabels {
    error: String,
}

/// Counters of the AnalysisRun controller. Clones share their values, so one clone can be
/// registered with the process registry while the controller counts through another.
#[derive(Clone, Debug, Default)]
pub struct AnalysisRunMetrics {
    measurements: Family<MeasurementLabels, Counter>,
    reconcile_errors: Family<ReconcileErrorLabels, Counter>,
}

impl AnalysisRunMetrics {
    /// Registers `analysis_run_measurements` (by provider and phase) and
    /// `analysis_run_reconcile_error` (by error kind); both are scraped with a `_total` suffix.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "analysis_run_measurements",
            "Measurements taken for AnalysisRuns, by provider and phase",
            self.measurements.clone(),
        );
        registry.register(
            "analysis_run_reconcile_error",
            "Failed AnalysisRun reconciles, by error kind",
            self.reconcile_errors.clone(),
        );
    }

    /// Counts one measurement a provider returned.
    pub fn measured(&self, provider: &str, phase: &str) {
        self.measurements
            .get_or_create(&MeasurementLabels {
                provider: provider.to_string(),
                phase: phase.to_string(),
            })
            .inc();
    }

    fn reconcile_failed(&self, error: &Error) {
        self.reconcile_errors
            .get_or_create(&ReconcileErrorLabels {
                error: error.metric_label().to_string(),
            })
            .inc();
    }
}

/// Shared by every AnalysisRun reconcile: the client, events, providers and bookkeeping.
pub struct AnalysisContext {
    client: Client,
    recorder: Recorder,
    metrics: AnalysisRunMetrics,
    default_prometheus_address: Option<String>,
    /// The provider every per-address one is cloned from: clones share its HTTP clients and
    /// its coalescing of identical queries.
    prometheus_base: PrometheusProvider,
    /// One provider per Prometheus address, reused by every run that queries it.
    prometheus: Mutex<HashMap<String, PrometheusProvider>>,
    web: WebProvider,
    job: JobProvider,
    /// Consecutive failed reconciles per `namespace/name`, reset on success.
    failures: Mutex<HashMap<String, u32>>,
    /// resourceVersion of our last status write per `namespace/name`, until a reconcile has
    /// seen it: planning from a cached copy older than our write would measure twice.
    status_written: Mutex<HashMap<String, String>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl AnalysisContext {
    /// Builds the providers; their HTTP clients are created once and shared by all runs.
    pub fn new(
        client: Client,
        default_prometheus_address: Option<String>,
        metrics: AnalysisRunMetrics,
    ) -> Result<Self, String> {
        let prometheus_base = PrometheusProvider::new()
            .map_err(|e| format!("cannot build the Prometheus HTTP client: {e}"))?;
        let web =
            WebProvider::new().map_err(|e| format!("cannot build the Web HTTP client: {e}"))?;
        let reporter = Reporter {
            controller: CONTROLLER_NAME.to_string(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Ok(Self {
            recorder: Recorder::new(client.clone(), reporter),
            job: JobProvider::new(client.clone()),
            client,
            metrics,
            default_prometheus_address: default_prometheus_address.filter(|a| !a.is_empty()),
            prometheus_base,
            prometheus: Mutex::new(HashMap::new()),
            web,
            failures: Mutex::new(HashMap::new()),
            status_written: Mutex::new(HashMap::new()),
        })
    }

    /// The provider for a Prometheus address (the flag's default when the metric sets none).
    fn prometheus_for(&self, address: Option<&str>) -> PrometheusProvider {
        let address = address
            .filter(|a| !a.is_empty())
            .or(self.default_prometheus_address.as_deref())
            .unwrap_or_default()
            .to_string();
        lock(&self.prometheus)
            .entry(address.clone())
            .or_insert_with(|| {
                let provider = self.prometheus_base.clone();
                if address.is_empty() {
                    // Queries then end as Error measurements naming provider.prometheus.address.
                    provider
                } else {
                    provider.with_default_address(address)
                }
            })
            .clone()
    }
}

/// Runs the AnalysisRun controller until `stop` completes (finishing reconciles in flight).
/// Start it beside the Rollout controller, under the same leadership and shutdown signal.
pub async fn run(
    client: Client,
    options: Options,
    metrics: AnalysisRunMetrics,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), String> {
    let runs: Api<AnalysisRun> = match &options.namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    };
    let context = Arc::new(AnalysisContext::new(
        client,
        options.prometheus_address.clone(),
        metrics,
    )?);
    tracing::info!(
        namespace = options.namespace.as_deref().unwrap_or("(all)"),
        selector = %options.label_selector,
        prometheus_address = options.prometheus_address.as_deref().unwrap_or("(none)"),
        "watching AnalysisRuns"
    );
    Controller::new(
        runs,
        watcher::Config::default().labels(&options.label_selector),
    )
    .with_config(controller::Config::default().concurrency(options.concurrency))
    .graceful_shutdown_on(stop)
    .run(reconcile, error_policy, context)
    .for_each(|outcome| async move {
        match outcome {
            Ok(_) => {}
            // error_policy has already logged and counted failed reconciles.
            Err(controller::Error::ReconcilerFailed(..) | controller::Error::ObjectNotFound(_)) => {
            }
            Err(error) => tracing::warn!(%error, "AnalysisRun watch failed; retrying"),
        }
    })
    .await;
    Ok(())
}

fn object_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Reconciles one AnalysisRun.
#[instrument(skip(run, ctx), fields(namespace = run.namespace(), name = run.name_any()))]
pub async fn reconcile(run: Arc<AnalysisRun>, ctx: Arc<AnalysisContext>) -> Result<Action> {
    let namespace = run
        .namespace()
        .ok_or_else(|| Error::MissingNamespace(run.name_any()))?;
    let name = run.name_any();
    // A finished run is never measured or written again: no provider call, and no API call
    // unless its spec.ttlStrategy says it is to be deleted.
    if run
        .status
        .as_ref()
        .is_some_and(|status| status.phase.is_completed())
    {
        return collect_expired(&run, &namespace, &ctx).await;
    }
    let key = object_key(&namespace, &name);
    let run = if take_stale(&ctx, &key, run.resource_version().as_deref()) {
        let api: Api<AnalysisRun> = Api::namespaced(ctx.client.clone(), &namespace);
        match api.get_opt(&name).await {
            Ok(Some(fresh)) => Arc::new(fresh),
            Ok(None) => return Ok(Action::await_change()),
            Err(source) => {
                return Err(Error::GetRun {
                    namespace,
                    name,
                    source: Box::new(source),
                });
            }
        }
    } else {
        run
    };
    let action = reconcile_run(&run, &namespace, &ctx).await?;
    lock(&ctx.failures).remove(&key);
    Ok(action)
}

/// Deletes a finished run once its `spec.ttlStrategy` has run out, or waits for that moment;
/// a finished run without one waits for a change only.
async fn collect_expired(
    run: &AnalysisRun,
    namespace: &str,
    ctx: &AnalysisContext,
) -> Result<Action> {
    let Some(expiry) = ttl_expiry(run) else {
        return Ok(Action::await_change());
    };
    if run.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    if expiry > Timestamp::now() {
        return Ok(Action::requeue(until(expiry)));
    }
    let name = run.name_any();
    let api: Api<AnalysisRun> = Api::namespaced(ctx.client.clone(), namespace);
    match api.delete(&name, &DeleteParams::background()).await {
        Ok(_) => {
            tracing::info!("deleted the finished AnalysisRun: its spec.ttlStrategy ran out");
            let key = object_key(namespace, &name);
            lock(&ctx.failures).remove(&key);
            lock(&ctx.status_written).remove(&key);
            Ok(Action::await_change())
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Action::await_change()),
        Err(source) => Err(Error::DeleteRun {
            namespace: namespace.to_string(),
            name,
            source: Box::new(source),
        }),
    }
}

/// When a finished run is to be deleted under `spec.ttlStrategy`: more than the phase's
/// seconds (`secondsAfterSuccess`, `secondsAfterFailure`, else `secondsAfterCompletion`) after
/// `completedAt`, as Argo counts them. `None`: kept for good.
pub fn ttl_expiry(run: &AnalysisRun) -> Option<Timestamp> {
    let ttl = run.spec.ttl_strategy.as_ref()?;
    let status = run.status.as_ref()?;
    if !status.phase.is_completed() {
        return None;
    }
    let completed = status.completed_at.as_ref()?.0;
    let seconds = match status.phase {
        AnalysisPhase::Successful if ttl.seconds_after_success.is_some() => {
            ttl.seconds_after_success
        }
        AnalysisPhase::Failed if ttl.seconds_after_failure.is_some() => ttl.seconds_after_failure,
        _ => ttl.seconds_after_completion,
    }?;
    // Argo deletes once the whole seconds elapsed exceed the TTL.
    let wait = Duration::from_secs(u64::try_from(seconds).unwrap_or(0) + 1);
    Some(completed.checked_add(wait).unwrap_or(Timestamp::MAX))
}

/// Logs and counts a failed reconcile, then retries with a growing backoff.
pub fn error_policy(run: Arc<AnalysisRun>, error: &Error, ctx: Arc<AnalysisContext>) -> Action {
    let key = object_key(&run.namespace().unwrap_or_default(), &run.name_any());
    ctx.metrics.reconcile_failed(error);
    let failures = {
        let mut failures = lock(&ctx.failures);
        let count = failures.entry(key.clone()).or_insert(0);
        *count = count.saturating_add(1);
        *count
    };
    let retry_in = retry_backoff(failures);
    tracing::warn!(run = %key, %error, error_kind = error.metric_label(), ?retry_in, "AnalysisRun reconcile failed");
    Action::requeue(retry_in)
}

/// Whether a cached copy of `key` at `resource_version` may predate our last status write;
/// forgets the write once it has been seen or re-read.
fn take_stale(ctx: &AnalysisContext, key: &str, resource_version: Option<&str>) -> bool {
    match lock(&ctx.status_written).remove(key) {
        Some(written) => Some(written.as_str()) != resource_version,
        None => false,
    }
}

async fn reconcile_run(
    run: &AnalysisRun,
    namespace: &str,
    ctx: &AnalysisContext,
) -> Result<Action> {
    // Whole seconds, as the API stores times: due times computed here then match the status
    // the next reconcile reads back.
    let now = Timestamp::now();
    let now = Timestamp::from_second(now.as_second()).unwrap_or(now);
    let status = run.status.clone().unwrap_or_default();
    let outcome = match field_refs_resolved(run) {
        Err(message) => engine::invalid(&status, &message, now),
        Ok(spec) => match engine::plan(&spec, &status, now) {
            Plan::Completed => return Ok(Action::await_change()),
            Plan::Invalid { message } => engine::invalid(&status, &message, now),
            Plan::Measure(schedule) => {
                measure(run, namespace, &spec, &status, &schedule, now, ctx).await?
            }
        },
    };
    if outcome.status.phase != status.phase {
        tracing::info!(phase = %outcome.status.phase, message = %outcome.status.message, "AnalysisRun phase changed");
    }
    let wrote = match write_status(run, namespace, &outcome.status, ctx).await? {
        StatusWrite::Unchanged => false,
        StatusWrite::Written => true,
        StatusWrite::Conflict => {
            // Written by someone else since our copy: plan again from the API's copy.
            tracing::debug!("the status changed under us; looking again");
            lock(&ctx.status_written).insert(object_key(namespace, &run.name_any()), String::new());
            return Ok(Action::requeue(Duration::ZERO));
        }
    };
    if wrote {
        for event in &outcome.events {
            publish(run, event, ctx).await;
        }
    }
    Ok(match outcome.requeue_at {
        Some(at) if !outcome.status.phase.is_completed() => {
            Action::requeue(until(next_look(at, now, wrote)))
        }
        _ => Action::await_change(),
    })
}

/// When to look again for a run due at `at`. Times are whole seconds, so something due now
/// that this reconcile handled without a change (a Job still running) is next due in the next
/// second, not at once: looking again at once would only repeat the same calls.
pub fn next_look(at: Timestamp, now: Timestamp, wrote: bool) -> Timestamp {
    if wrote || at > now {
        return at;
    }
    now.checked_add(Duration::from_secs(1)).unwrap_or(at)
}

/// The wait until `at`, rounded up to the millisecond so a timer never fires just before a
/// measurement is due.
fn until(at: Timestamp) -> Duration {
    let nanos = u128::try_from(at.duration_since(Timestamp::now()).as_nanos()).unwrap_or(0);
    let millis = nanos.div_ceil(1_000_000);
    Duration::from_millis(u64::try_from(millis).unwrap_or(u64::MAX))
}

/// The run's spec with `fieldRef` arguments turned into values read from the run's own
/// metadata, as Kubernetes' downward API reads them; an unsupported path ends the run in Error.
pub fn field_refs_resolved(run: &AnalysisRun) -> Result<AnalysisRunSpec, String> {
    let mut spec = run.spec.clone();
    for (index, arg) in spec.args.iter_mut().enumerate() {
        let Some(field_ref) = arg.value_from.as_ref().and_then(|f| f.field_ref.as_ref()) else {
            continue;
        };
        let path = field_ref.field_path.clone();
        let value = metadata_field(run, &path).ok_or_else(|| {
            format!(
                "Unable to resolve metric arguments: spec.args[{index}].valueFrom.fieldRef.fieldPath {path:?} (argument {:?}) is not a field of the AnalysisRun's metadata: use metadata.name, metadata.namespace, metadata.uid, metadata.labels['<key>'] or metadata.annotations['<key>']",
                arg.name
            )
        })?;
        arg.value = Some(value);
        arg.value_from = None;
    }
    Ok(spec)
}

/// A downward-API metadata path of the run: a missing label or annotation is empty, whole
/// label and annotation maps are `key="value"` lines in key order.
fn metadata_field(run: &AnalysisRun, path: &str) -> Option<String> {
    let format_map = |map: &BTreeMap<String, String>| {
        map.iter()
            .map(|(k, v)| format!("{k}={v:?}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let keyed = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix("['"))
            .and_then(|rest| rest.strip_suffix("']"))
            .filter(|key| !key.is_empty())
    };
    match path {
        "metadata.name" => Some(run.name_any()),
        "metadata.namespace" => Some(run.namespace().unwrap_or_default()),
        "metadata.uid" => Some(run.uid().unwrap_or_default()),
        "metadata.labels" => Some(format_map(run.labels())),
        "metadata.annotations" => Some(format_map(run.annotations())),
        _ => {
            if let Some(key) = keyed("metadata.labels") {
                return Some(run.labels().get(key).cloned().unwrap_or_default());
            }
            keyed("metadata.annotations")
                .map(|key| run.annotations().get(key).cloned().unwrap_or_default())
        }
    }
}

/// Takes the measurements of `schedule` (secrets read first, only when one is due) and
/// concludes. A provider failure is an Error measurement; a secret that does not exist ends
/// the run in Error, as in Argo; an API failure reading one is retried.
async fn measure(
    run: &AnalysisRun,
    namespace: &str,
    spec: &AnalysisRunSpec,
    status: &AnalysisRunStatus,
    schedule: &Schedule,
    now: Timestamp,
    ctx: &AnalysisContext,
) -> Result<Outcome> {
    if schedule.tasks.is_empty() {
        return Ok(engine::conclude(spec, status, schedule, Vec::new(), now));
    }
    let secrets = read_secrets(run, namespace, spec, ctx).await?;
    let values = match args::values(&spec.args, |secret| {
        secrets
            .get(&(secret.name.clone(), secret.key.clone()))
            .cloned()
            .unwrap_or_else(|| Err("not read".to_string()))
    }) {
        Ok(values) => values,
        Err(e) => {
            let message = format!("Unable to resolve metric arguments: {e}");
            return Ok(engine::invalid(status, &message, now));
        }
    };
    let secret_values: Vec<String> = secrets.values().filter_map(|v| v.clone().ok()).collect();
    let name = run.name_any();
    let uid = run.uid().unwrap_or_default();
    let context = RunContext {
        namespace,
        run_name: &name,
        run_uid: &uid,
        measurement_number: 1,
        now,
    };
    let taken = futures::future::join_all(
        schedule
            .tasks
            .iter()
            .map(|task| take(ctx, context, task, &values, &secret_values)),
    )
    .await;
    Ok(engine::conclude(spec, status, schedule, taken, now))
}

/// Reads every Secret key the arguments name: the value, or why it cannot be had (missing
/// Secret or key), by (secret, key).
async fn read_secrets(
    run: &AnalysisRun,
    namespace: &str,
    spec: &AnalysisRunSpec,
    ctx: &AnalysisContext,
) -> Result<BTreeMap<(String, String), Result<String, String>>> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let mut read: BTreeMap<String, Option<Secret>> = BTreeMap::new();
    let mut values = BTreeMap::new();
    for arg in &spec.args {
        let Some(reference) = arg
            .value_from
            .as_ref()
            .and_then(|f| f.secret_key_ref.as_ref())
        else {
            continue;
        };
        if !read.contains_key(&reference.name) {
            let secret =
                api.get_opt(&reference.name)
                    .await
                    .map_err(|source| Error::ReadSecret {
                        namespace: namespace.to_string(),
                        secret: reference.name.clone(),
                        argument: arg.name.clone(),
                        run: run.name_any(),
                        source: Box::new(source),
                    })?;
            read.insert(reference.name.clone(), secret);
        }
        let value = match read.get(&reference.name).and_then(Option::as_ref) {
            None => Err(format!(
                "secret {:?} not found in namespace {namespace}: create it or fix valueFrom.secretKeyRef.name",
                reference.name
            )),
            Some(secret) => secret
                .data
                .as_ref()
                .and_then(|data| data.get(&reference.key))
                .map(|bytes| String::from_utf8_lossy(&bytes.0).into_owned())
                .ok_or_else(|| {
                    format!(
                        "key '{}' does not exist in secret '{}': add it or fix valueFrom.secretKeyRef.key",
                        reference.key, reference.name
                    )
                }),
        };
        values.insert((reference.name.clone(), reference.key.clone()), value);
    }
    Ok(values)
}

/// Takes one measurement with the metric's provider; never fails (see [`provider::take`]).
async fn take(
    ctx: &AnalysisContext,
    run: RunContext<'_>,
    task: &MeasurementTask,
    values: &args::ArgValues,
    secrets: &[String],
) -> TakenMeasurement {
    let mut taken = match args::resolve_metric(&task.metric, values) {
        Err(e) => {
            ctx.metrics.measured("Unknown", "Error");
            provider::provider_failed(task, e.to_string(), run.now)
        }
        Ok(metric) => match provider_kind(&metric) {
            Ok(ProviderKind::Prometheus) => {
                let address = metric
                    .provider
                    .prometheus
                    .as_ref()
                    .and_then(|p| p.address.as_deref());
                let prometheus = ctx.prometheus_for(address);
                take_with(ctx, &prometheus, run, task, &metric).await
            }
            Ok(ProviderKind::Web) => take_with(ctx, &ctx.web, run, task, &metric).await,
            Ok(ProviderKind::Job) => take_with(ctx, &ctx.job, run, task, &metric).await,
            Ok(ProviderKind::Judge) => {
                let address = metric
                    .provider
                    .judge
                    .as_ref()
                    .and_then(|j| j.pointer("/prometheus/address"))
                    .and_then(Value::as_str);
                let judge = BaselineJudgeProvider::new(ctx.prometheus_for(address));
                take_with(ctx, &judge, run, task, &metric).await
            }
            Err(message) => {
                ctx.metrics.measured("Unknown", "Error");
                provider::provider_failed(task, message, run.now)
            }
        },
    };
    provider::redact_secrets(&mut taken.measurement, secrets);
    taken
}

async fn take_with(
    ctx: &AnalysisContext,
    provider: &dyn MetricProvider,
    run: RunContext<'_>,
    task: &MeasurementTask,
    metric: &Metric,
) -> TakenMeasurement {
    let taken = provider::take(provider, run, task, metric).await;
    ctx.metrics
        .measured(provider.kind(), taken.measurement.phase.as_str());
    taken
}

/// The providers this controller runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderKind {
    Prometheus,
    Web,
    Job,
    Judge,
}

/// Which provider measures `metric`, or why none can.
pub fn provider_kind(metric: &Metric) -> Result<ProviderKind, String> {
    let configured = metric.provider.configured();
    match configured.as_slice() {
        [one] => match one.as_str() {
            "prometheus" => Ok(ProviderKind::Prometheus),
            "web" => Ok(ProviderKind::Web),
            "job" => Ok(ProviderKind::Job),
            "judge" => Ok(ProviderKind::Judge),
            other => Err(format!(
                "metric {:?}: provider.{other} is not supported by this controller: measure it with provider.prometheus, web, job or judge",
                metric.name
            )),
        },
        [] => Err(format!(
            "metric {:?} has no provider: set one of provider.prometheus, web, job or judge",
            metric.name
        )),
        many => Err(format!(
            "metric {:?} sets several providers ({}): keep exactly one",
            metric.name,
            many.join(", ")
        )),
    }
}

/// What became of a status write.
enum StatusWrite {
    /// Nothing changed: nothing was sent.
    Unchanged,
    Written,
    /// The run changed since the copy the status was computed from; nothing was written.
    Conflict,
}

/// Merge-patches `/status` to `desired` when it differs, on condition that the run is still at
/// the resourceVersion it was read at, so a measurement is never folded into a stale status.
async fn write_status(
    run: &AnalysisRun,
    namespace: &str,
    desired: &AnalysisRunStatus,
    ctx: &AnalysisContext,
) -> Result<StatusWrite> {
    let name = run.name_any();
    let Some(mut patch) =
        status_patch(run.status.as_ref(), desired).map_err(|source| Error::EncodeStatus {
            namespace: namespace.to_string(),
            name: name.clone(),
            source,
        })?
    else {
        return Ok(StatusWrite::Unchanged);
    };
    if let Some(version) = run.resource_version() {
        patch["metadata"] = serde_json::json!({ "resourceVersion": version });
    }
    let api: Api<AnalysisRun> = Api::namespaced(ctx.client.clone(), namespace);
    match api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(written) => {
            if let Some(version) = written.resource_version() {
                lock(&ctx.status_written).insert(object_key(namespace, &name), version);
            }
            Ok(StatusWrite::Written)
        }
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(StatusWrite::Conflict),
        // Deleted meanwhile: nothing left to record.
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(StatusWrite::Unchanged),
        Err(source) => Err(Error::PatchStatus {
            namespace: namespace.to_string(),
            name,
            source: Box::new(source),
        }),
    }
}

/// The merge patch (`{"status": ...}`) from the run's status to `desired`; `None` when equal.
pub fn status_patch(
    current: Option<&AnalysisRunStatus>,
    desired: &AnalysisRunStatus,
) -> Result<Option<Value>, serde_json::Error> {
    let want = serde_json::to_value(desired)?;
    let change = match current {
        None => Some(want),
        Some(current) if current == desired => None,
        Some(current) => merge_diff(&serde_json::to_value(current)?, &want),
    };
    Ok(change.map(|status| serde_json::json!({ "status": status })))
}

/// Records one of the engine's events on the run; a failure is logged, since status already
/// says what happened.
async fn publish(run: &AnalysisRun, event: &engine::RunEvent, ctx: &AnalysisContext) {
    let kube_event = Event {
        type_: if event.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: event.reason.clone(),
        note: Some(event.message.clone()),
        action: "Analyze".to_string(),
        secondary: None,
    };
    if let Err(error) = ctx
        .recorder
        .publish(&kube_event, &run.object_ref(&()))
        .await
    {
        tracing::warn!(%error, reason = %event.reason, "AnalysisRun event not published");
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use rollouts_crds::analysis::{MetricProvider as Providers, PrometheusMetric, WebMetric};
    use rollouts_crds::rollout::{AnalysisRunArgument, ArgumentValueFrom, FieldRef};

    use super::*;

    fn field_arg(name: &str, path: &str) -> AnalysisRunArgument {
        AnalysisRunArgument {
            name: name.into(),
            value: None,
            value_from: Some(ArgumentValueFrom {
                field_ref: Some(FieldRef {
                    field_path: path.into(),
                }),
                ..ArgumentValueFrom::default()
            }),
        }
    }

    fn run_with_args(args: Vec<AnalysisRunArgument>) -> AnalysisRun {
        AnalysisRun {
            metadata: ObjectMeta {
                name: Some("checkout-abc-1".into()),
                namespace: Some("shop".into()),
                uid: Some("6c1c0a52".into()),
                labels: Some(BTreeMap::from([
                    ("app".to_string(), "checkout".to_string()),
                    ("tier".to_string(), "web".to_string()),
                ])),
                ..ObjectMeta::default()
            },
            spec: AnalysisRunSpec {
                args,
                ..AnalysisRunSpec::default()
            },
            status: None,
        }
    }

    #[test]
    fn field_refs_read_the_runs_own_metadata() {
        let run = run_with_args(vec![
            field_arg("name", "metadata.name"),
            field_arg("namespace", "metadata.namespace"),
            field_arg("uid", "metadata.uid"),
            field_arg("app", "metadata.labels['app']"),
            field_arg("missing", "metadata.annotations['owner']"),
            field_arg("labels", "metadata.labels"),
            AnalysisRunArgument {
                name: "plain".into(),
                value: Some("kept".into()),
                value_from: None,
            },
        ]);
        let spec = field_refs_resolved(&run).expect("every path resolves");
        let values: Vec<(&str, Option<&str>)> = spec
            .args
            .iter()
            .map(|a| (a.name.as_str(), a.value.as_deref()))
            .collect();
        assert_eq!(
            values,
            [
                ("name", Some("checkout-abc-1")),
                ("namespace", Some("shop")),
                ("uid", Some("6c1c0a52")),
                ("app", Some("checkout")),
                ("missing", Some("")),
                ("labels", Some("app=\"checkout\"\ntier=\"web\"")),
                ("plain", Some("kept")),
            ]
        );
        assert!(spec.args.iter().all(|a| a.value_from.is_none()));
    }

    #[test]
    fn an_unsupported_field_path_names_the_argument_and_the_fix() {
        let run = run_with_args(vec![
            field_arg("ok", "metadata.name"),
            field_arg("replicas", "spec.replicas"),
        ]);
        let message = field_refs_resolved(&run).expect_err("spec paths are not metadata");
        assert!(
            message.contains("spec.args[1].valueFrom.fieldRef.fieldPath \"spec.replicas\""),
            "{message}"
        );
        assert!(message.contains("argument \"replicas\""), "{message}");
        assert!(message.contains("use metadata.name"), "{message}");
    }

    #[test]
    fn a_metric_is_measured_by_its_one_provider() {
        let metric = |provider: Providers| Metric {
            name: "m".into(),
            provider,
            ..Metric::default()
        };
        let prometheus = Providers {
            prometheus: Some(PrometheusMetric::default()),
            ..Providers::default()
        };
        assert_eq!(
            provider_kind(&metric(prometheus.clone())),
            Ok(ProviderKind::Prometheus)
        );
        let web = Providers {
            web: Some(WebMetric::default()),
            ..Providers::default()
        };
        assert_eq!(provider_kind(&metric(web)), Ok(ProviderKind::Web));
        let judge = Providers {
            judge: Some(serde_json::json!({})),
            ..Providers::default()
        };
        assert_eq!(provider_kind(&metric(judge)), Ok(ProviderKind::Judge));
        let datadog = Providers {
            datadog: Some(serde_json::json!({})),
            ..Providers::default()
        };
        let message = provider_kind(&metric(datadog)).expect_err("not implemented here");
        assert!(
            message.contains("provider.datadog is not supported"),
            "{message}"
        );
        let message = provider_kind(&metric(Providers::default())).expect_err("none set");
        assert!(message.contains("has no provider"), "{message}");
        let both = Providers {
            web: Some(WebMetric::default()),
            ..prometheus
        };
        let message = provider_kind(&metric(both)).expect_err("two set");
        assert!(message.contains("prometheus, web"), "{message}");
    }

    fn running(count: i32) -> AnalysisRunStatus {
        AnalysisRunStatus {
            phase: AnalysisPhase::Running,
            started_at: Some(Time(Timestamp::UNIX_EPOCH)),
            metric_results: vec![rollouts_crds::analysis::MetricResult {
                name: "m".into(),
                phase: AnalysisPhase::Running,
                count,
                successful: count,
                ..Default::default()
            }],
            ..AnalysisRunStatus::default()
        }
    }

    #[test]
    fn the_status_is_patched_only_when_it_changed() {
        let current = running(1);
        assert_eq!(
            status_patch(Some(&current), &current).expect("encodes"),
            None
        );
        let patch = status_patch(Some(&current), &running(2))
            .expect("encodes")
            .expect("a change");
        // Lists are replaced whole by a merge patch; unchanged fields are left out.
        assert_eq!(patch["status"]["metricResults"][0]["count"], 2);
        assert!(patch["status"].get("phase").is_none(), "{patch}");
        let first = status_patch(None, &current)
            .expect("encodes")
            .expect("a first status");
        assert_eq!(first["status"]["phase"], "Running");
    }

    #[test]
    fn the_requeue_never_fires_before_the_due_time() {
        let soon = Timestamp::now()
            .checked_add(Duration::from_millis(1500))
            .expect("in range");
        let wait = until(soon);
        assert!(wait <= Duration::from_millis(1500), "{wait:?}");
        assert_eq!(wait.subsec_nanos() % 1_000_000, 0, "whole milliseconds");
        assert_eq!(until(Timestamp::UNIX_EPOCH), Duration::ZERO);
    }

    #[test]
    fn a_due_time_already_handled_without_change_is_looked_at_next_second() {
        let at = |seconds: i64| Timestamp::from_second(seconds).expect("in range");
        assert_eq!(next_look(at(105), at(100), false), at(105));
        assert_eq!(
            next_look(at(100), at(100), true),
            at(100),
            "a write re-triggers anyway"
        );
        assert_eq!(next_look(at(100), at(100), false), at(101));
        assert_eq!(next_look(at(90), at(100), false), at(101));
    }

    #[test]
    fn a_finished_run_expires_after_the_ttl_of_its_phase() {
        let at = |seconds: i64| Timestamp::from_second(seconds).expect("in range");
        let mut run = run_with_args(Vec::new());
        run.spec.ttl_strategy = Some(rollouts_crds::analysis::TtlStrategy {
            seconds_after_completion: Some(60),
            seconds_after_failure: Some(600),
            seconds_after_success: None,
        });
        run.status = Some(AnalysisRunStatus {
            phase: AnalysisPhase::Running,
            ..AnalysisRunStatus::default()
        });
        assert_eq!(ttl_expiry(&run), None, "a running run never expires");
        let finished = |phase| AnalysisRunStatus {
            phase,
            completed_at: Some(Time(at(1000))),
            ..AnalysisRunStatus::default()
        };
        run.status = Some(finished(AnalysisPhase::Failed));
        assert_eq!(ttl_expiry(&run), Some(at(1601)));
        // No secondsAfterSuccess: secondsAfterCompletion applies.
        run.status = Some(finished(AnalysisPhase::Successful));
        assert_eq!(ttl_expiry(&run), Some(at(1061)));
        run.status = Some(finished(AnalysisPhase::Error));
        assert_eq!(ttl_expiry(&run), Some(at(1061)));
        run.spec.ttl_strategy = None;
        assert_eq!(
            ttl_expiry(&run),
            None,
            "kept for good without a ttlStrategy"
        );
    }

    #[test]
    fn measurements_are_counted_by_provider_and_phase() {
        let metrics = AnalysisRunMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        metrics.measured("Prometheus", "Successful");
        metrics.measured("Prometheus", "Successful");
        metrics.measured("Web", "Error");
        metrics.reconcile_failed(&Error::MissingNamespace("r".into()));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        assert!(
            text.contains(
                r#"analysis_run_measurements_total{provider="Prometheus",phase="Successful"} 2"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"analysis_run_measurements_total{provider="Web",phase="Error"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"analysis_run_reconcile_error_total{error="missing_namespace"} 1"#),
            "{text}"
        );
    }
}
