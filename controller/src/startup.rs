//! Starting and stopping the controller: logging, the client, the CRD check, the HTTP
//! endpoints, leader election, the Rollout `Controller` with the watches that feed its caches,
//! and shutdown on SIGTERM/SIGINT.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::controller::{self, Controller};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, Config};
use rollouts_crds::analysis::AnalysisRun;
use rollouts_crds::rollout::{DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY, ROLLOUT_TYPE_LABEL, Rollout};
use tokio::sync::watch;
use tokio::task::{JoinError, JoinHandle};
use tracing_subscriber::EnvFilter;

use crate::claims::{self, Claims};
use crate::cli::{Flags, LogFormat};
use crate::context::{Context, Settings};
use crate::decode::{self, Decoded, Notes, Sorter};
use crate::error::{Error, Result};
use crate::health::{self, Diagnostics, Endpoints, Leadership, ServerLimits};
use crate::leader::{self, LeaderElection};
use crate::metrics::Metrics;
use crate::notify::{ConfigSource, Notifier};
use crate::owned_cache::{self, OwnedCaches};
use crate::packed::{self, PackedRollout};
use crate::reconcile::{error_policy, reconcile_packed};
use crate::supervise::{GaveUp, RestartPolicy, panic_message, supervise};
use crate::throttle::{Limit, ThrottleLayer};

/// How long AnalysisRun reconciles in flight get to finish once the Rollout controller stopped.
const ANALYSIS_RUN_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How long both controllers get to stop after SIGTERM before they are cancelled: a kube
/// `Controller` told to stop before its first list completed waits for its store forever, and
/// the process must still end (and release its Lease) well inside a pod's termination grace.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Installs the global log subscriber: `--log-format` text or JSON, filtered by `--log-level`.
pub fn init_logging(flags: &Flags) -> Result<()> {
    let format = match flags.log_format {
        LogFormat::Text => "text",
        LogFormat::Json => "json",
    };
    let logging_error =
        |source: Box<dyn std::error::Error + Send + Sync>| Error::Logging { format, source };
    let filter = EnvFilter::try_new(&flags.log_level).map_err(|e| logging_error(Box::new(e)))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal());
    match flags.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    }
    .map_err(logging_error)
}

/// A client for `--kubeconfig`, or else KUBECONFIG / ~/.kube/config / in-cluster.
pub async fn client(flags: &Flags) -> Result<Client> {
    let kubeconfig_error = |context: String| {
        move |source: Box<dyn std::error::Error + Send + Sync>| Error::Kubeconfig {
            context,
            source,
        }
    };
    let config = match &flags.kubeconfig {
        Some(path) => {
            let context = format!("--kubeconfig {}", path.display());
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| kubeconfig_error(context.clone())(Box::new(e)))?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| kubeconfig_error(context)(Box::new(e)))?
        }
        None => Config::infer().await.map_err(|e| {
            kubeconfig_error("KUBECONFIG, ~/.kube/config or in-cluster".to_string())(Box::new(e))
        })?,
    };
    let mut config = config;
    // Names this controller's requests in API server audit and request logs.
    config.headers.push((
        hyper::header::USER_AGENT,
        hyper::header::HeaderValue::from_static(USER_AGENT),
    ));
    let limit = ThrottleLayer::new(Limit {
        qps: flags.qps,
        burst: flags.burst,
    });
    Ok(ClientBuilder::try_from(config)
        .map_err(|e| kubeconfig_error("client".to_string())(Box::new(e)))?
        .with_layer(&limit)
        .build())
}

/// The `User-Agent` of every request the controller makes.
pub const USER_AGENT: &str = concat!("rollouts-controller/", env!("CARGO_PKG_VERSION"));

/// How long the start-up list of Rollouts may take before it counts as failed and is retried.
const STARTUP_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The wait before the first start-up retry, doubled for each further one up to
/// [`STARTUP_MAX_BACKOFF`].
const STARTUP_FIRST_BACKOFF: Duration = Duration::from_millis(500);
const STARTUP_MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Names of the supervised tasks, as `/readyz` and the logs name them.
const ROLLOUT_CONTROLLER: &str = "Rollout controller";
const ANALYSIS_RUN_CONTROLLER: &str = "AnalysisRun controller";
const EXPERIMENT_CONTROLLER: &str = "Experiment controller";
const LEASE_HOLDER: &str = "leader lease holder";
const HEALTH_SERVER: &str = "health server";
const METRICS_SERVER: &str = "metrics server";
/// Down (so `/readyz` fails, while `/healthz` answers) until the start-up check has listed
/// Rollouts.
const STARTUP_CHECK: &str = "start-up check";

/// Lists one Rollout. A 404 means the CRD is not installed and a 401 or 403 that the
/// controller may not list Rollouts: no retry fixes those. Transient failures (5xx, 429,
/// timeouts, connection errors) are retried with a growing backoff, each logged, for as long
/// as it takes.
/// Give it an `Api<Decoded<Rollout>>`: a first Rollout that does not decode must not stop the
/// controller from starting.
pub async fn check_crd_installed<K>(
    api: &Api<K>,
    scope: &str,
    diagnostics: &Diagnostics,
) -> Result<()>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut attempt: u32 = 0;
    loop {
        attempt = attempt.saturating_add(1);
        let listed = tokio::time::timeout(
            STARTUP_REQUEST_TIMEOUT,
            api.list(&ListParams::default().limit(1)),
        )
        .await;
        let transient = match listed {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(error)) => match startup_failure(error, scope) {
                StartupFailure::Fatal(error) => return Err(error),
                StartupFailure::Transient(error) => error.to_string(),
            },
            Err(_) => format!("no answer within {STARTUP_REQUEST_TIMEOUT:?}"),
        };
        let retry_in = startup_backoff(attempt);
        diagnostics.task_down(
            STARTUP_CHECK,
            &format!("cannot list Rollouts {scope} yet (attempt {attempt}): {transient}"),
        );
        tracing::warn!(
            attempt,
            error = %transient,
            ?retry_in,
            "cannot list Rollouts {scope} at startup; retrying"
        );
        tokio::time::sleep(retry_in).await;
    }
}

/// What to do about a failed start-up request.
#[derive(Debug)]
enum StartupFailure {
    /// Worth retrying: the API server or the network may recover.
    Transient(kube::Error),
    /// No retry helps; the process exits with this.
    Fatal(Error),
}

/// Sorts a failed start-up list of Rollouts: 404 is a missing CRD, 401 and 403 are refused
/// access (naming the request), 5xx (but 501), 408 and 429 and connection errors are
/// transient; anything else is reported as it is.
fn startup_failure(error: kube::Error, scope: &str) -> StartupFailure {
    match error {
        kube::Error::Api(status) if status.code == 404 => {
            StartupFailure::Fatal(Error::CrdNotInstalled {
                source: Box::new(kube::Error::Api(status)),
            })
        }
        kube::Error::Api(status) if status.code == 401 || status.code == 403 => {
            StartupFailure::Fatal(Error::StartupRefused {
                request: format!("list rollouts.argoproj.io {scope}"),
                code: status.code,
                reason: status.reason.clone(),
                message: status.message.clone(),
            })
        }
        error if crate::error::is_transient(&error) => StartupFailure::Transient(error),
        source => StartupFailure::Fatal(Error::StartupList {
            scope: scope.to_string(),
            source: Box::new(source),
        }),
    }
}

/// The wait after start-up attempt number `attempt` failed.
fn startup_backoff(attempt: u32) -> Duration {
    let doublings = attempt.saturating_sub(1).min(16);
    STARTUP_FIRST_BACKOFF
        .saturating_mul(1u32 << doublings)
        .min(STARTUP_MAX_BACKOFF)
}

/// Runs the controller until SIGTERM/SIGINT (Ok), or until the leader lease is lost or a
/// supervised task fails for good (Err: the process exits non-zero and the Deployment restarts
/// it). Once the lease is lost the controllers are cancelled at once, reconciles in flight
/// included; a failing task takes `/readyz` down before anything else stops.
pub async fn run(flags: Flags) -> Result<()> {
    let client = client(&flags).await?;
    let namespace = flags.namespace.as_deref();
    let scope = match namespace {
        Some(namespace) => format!("in namespace {namespace}"),
        None => "in all namespaces".to_string(),
    };
    let selector = flags.rollout_label_selector();
    let caches = Arc::new(OwnedCaches::new());
    let claims = Arc::new(Claims::default());
    let rollout_controller = rollout_controller(&client, namespace, &selector, &caches, &claims)
        .with_config(controller::Config::default().concurrency(flags.rollout_threads));
    let metrics = Arc::new(Metrics::new(rollout_controller.store()));
    let diagnostics = Arc::new(Diagnostics::new(if flags.leader_elect {
        Leadership::Follower
    } else {
        Leadership::Disabled
    }));
    // Served from the start: while the start-up check retries a passing API failure, /healthz
    // answers (a liveness probe does not restart the pod for the API server's trouble) and
    // /readyz says what it waits for.
    diagnostics.task_down(STARTUP_CHECK, &format!("listing Rollouts {scope}"));
    serve_endpoints(
        &flags,
        Endpoints {
            diagnostics: diagnostics.clone(),
            metrics: metrics.clone(),
        },
    )
    .await?;

    let rollouts: Api<Decoded<Rollout>> = scoped_api(&client, namespace);
    check_crd_installed(&rollouts, &scope, &diagnostics).await?;
    diagnostics.task_stopped(STARTUP_CHECK);
    tracing::info!(scope = %scope, %selector, "watching Rollouts");
    let rollout_controller =
        watch_router_objects(rollout_controller, &client, namespace, &claims).await;

    let shutdown = shutdown_on_signal();
    let election = if flags.leader_elect {
        let namespace = flags
            .leader_election_namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string());
        let election = LeaderElection::new(
            Api::<Lease>::namespaced(client.clone(), &namespace),
            &namespace,
            &flags.lease_name,
            leader::candidate_identity(),
            flags.lease_duration,
        );
        let timing = election.timing();
        tracing::info!(
            identity = election.identity(),
            lease = %flags.lease_name,
            %namespace,
            lease_duration = ?timing.lease_duration,
            renew_deadline = ?timing.renew_deadline,
            retry_period = ?timing.retry_period,
            "waiting for the leader lease"
        );
        let acquired = tokio::select! {
            acquired = election.acquire() => acquired,
            () = wait_for(shutdown.clone()) => {
                tracing::info!("shutdown requested before becoming leader");
                return Ok(());
            }
        };
        diagnostics.set_leadership(Leadership::Leader);
        tracing::info!("became leader");
        Some((election, acquired))
    } else {
        None
    };

    // The Lease holder: however it ends (lost, not renewed in time, panicked), the controllers
    // are cancelled at once.
    let mut holder = election.as_ref().map(|(election, acquired)| {
        let (election, acquired) = (election.clone(), *acquired);
        diagnostics.task_up(LEASE_HOLDER);
        tokio::spawn(async move { election.hold(acquired).await })
    });

    let notifier = Arc::new(start_notifier(
        &client,
        &metrics,
        flags.notifications_enabled,
    ));
    let notifier_client = client.clone();
    let context = Arc::new(
        Context::new(
            client,
            metrics,
            diagnostics.clone(),
            Settings {
                instance_id: flags.instance_id.clone(),
                prometheus_address: flags.prometheus_address.clone(),
            },
            caches,
        )
        .with_claims(claims)
        .with_notifier(notifier.clone()),
    );
    // A signal stops both controllers gracefully, finishing reconciles in flight.
    let stop = futures::FutureExt::shared(wait_for(shutdown.clone()));
    // AnalysisRuns have their own controller, under the same leadership and shutdown,
    // restarted with a backoff should it end or panic.
    let analysis_runs = tokio::spawn({
        let client = context.client.clone();
        let options = crate::analysisrun::Options::from_flags(&flags);
        let run_metrics = context.metrics.analysis_runs.clone();
        let panics = context.metrics.reconcile_panics.clone();
        let experiment_options = crate::experiment::Options::from_flags(&flags);
        let experiment_metrics = context.metrics.experiments.clone();
        let (diagnostics, shutdown, stop) = (diagnostics.clone(), shutdown.clone(), stop.clone());
        async move {
            let analysis_runs = supervise(
                ANALYSIS_RUN_CONTROLLER,
                &diagnostics,
                RestartPolicy::DEFAULT,
                || *shutdown.borrow(),
                || {
                    let run = crate::analysisrun::run(
                        client.clone(),
                        options.clone(),
                        run_metrics.clone(),
                        panics.clone(),
                        stop.clone(),
                    );
                    async move { run.await.map_err(|error| error.to_string()) }
                },
            );
            // Experiments have their own controller, supervised in the same task: either one
            // giving up ends it.
            let experiments = supervise(
                EXPERIMENT_CONTROLLER,
                &diagnostics,
                RestartPolicy::DEFAULT,
                || *shutdown.borrow(),
                || {
                    crate::experiment::run(
                        client.clone(),
                        experiment_options.clone(),
                        experiment_metrics.clone(),
                        panics.clone(),
                        stop.clone(),
                    )
                },
            );
            futures::future::try_join(analysis_runs, experiments)
                .await
                .map(drop)
        }
    });
    diagnostics.task_up(ROLLOUT_CONTROLLER);
    let forget = context.clone();
    let rollouts = tokio::spawn(
        rollout_controller
            .graceful_shutdown_on(stop)
            .run(reconcile_packed, error_policy, context)
            .inspect(move |outcome| {
                // A Rollout that is gone: its backoff, bookkeeping and metric series go too.
                if let Err(controller::Error::ObjectNotFound(object)) = outcome {
                    forget.forget_object(object);
                }
            })
            .for_each(|outcome| async move {
                match outcome {
                    Ok(_) => {}
                    // error_policy has already logged and counted failed reconciles.
                    Err(
                        controller::Error::ReconcilerFailed(..)
                        | controller::Error::ObjectNotFound(_),
                    ) => {}
                    Err(error) => tracing::warn!(%error, "watch failed; retrying"),
                }
            }),
    );
    let mut controllers = Controllers {
        rollouts: Some(rollouts),
        analysis_runs: Some(analysis_runs),
    };
    if !*shutdown.borrow() {
        watch_notifications(&flags, &notifier_client, &notifier);
    }

    let lease_ended = async {
        match holder.as_mut() {
            Some(holder) => holder.await,
            None => std::future::pending().await,
        }
    };
    let stopped = async {
        let until_stopped = controllers.until_stopped(&shutdown, &diagnostics);
        tokio::pin!(until_stopped);
        tokio::select! {
            outcome = &mut until_stopped => outcome,
            () = async {
                wait_for(shutdown.clone()).await;
                tokio::time::sleep(SHUTDOWN_GRACE).await;
            } => {
                tracing::warn!(
                    grace = ?SHUTDOWN_GRACE,
                    "the controllers did not stop in time after the signal; cancelling them"
                );
                Ok(())
            }
        }
    };
    let (outcome, lease_held) = tokio::select! {
        outcome = stopped => (outcome, true),
        ended = lease_ended => {
            let error = match ended {
                Ok(error) => error,
                Err(join) => Error::TaskFailed { task: LEASE_HOLDER, reason: join_failure(join) },
            };
            diagnostics.task_down(LEASE_HOLDER, &error.to_string());
            tracing::error!(%error, "stopping at once: this replica may no longer act");
            (Err(error), false)
        }
    };
    diagnostics.set_leadership(Leadership::Stopping);
    controllers.abort().await;
    if let Some(holder) = holder {
        holder.abort();
    }
    if lease_held && let Some((election, _)) = election {
        match election.release().await {
            Ok(()) => tracing::info!("released the leader lease"),
            Err(error) => {
                tracing::warn!(%error, "cannot release the leader lease; it expires on its own")
            }
        }
    }
    if outcome.is_ok() {
        tracing::info!("stopped");
    }
    outcome
}

/// The two controllers, each in its own task; a handle is taken once its task is joined.
struct Controllers {
    rollouts: Option<JoinHandle<()>>,
    analysis_runs: Option<JoinHandle<std::result::Result<(), GaveUp>>>,
}

/// Which controller task ended first, and how.
enum Ended {
    Rollouts(std::result::Result<(), JoinError>),
    AnalysisRuns(std::result::Result<std::result::Result<(), GaveUp>, JoinError>),
}

impl Controllers {
    /// Waits until both controllers stopped after a signal (Ok), or one of them failed for
    /// good (Err; `/readyz` already names it). The Rollout controller is not restarted: the
    /// metrics read its cache and its watches restart themselves, so its end is a fault.
    async fn until_stopped(
        &mut self,
        shutdown: &watch::Receiver<bool>,
        diagnostics: &Diagnostics,
    ) -> Result<()> {
        let stopping = || *shutdown.borrow();
        let ended = match (self.rollouts.as_mut(), self.analysis_runs.as_mut()) {
            (Some(rollouts), Some(analysis_runs)) => tokio::select! {
                ended = rollouts => Ended::Rollouts(ended),
                ended = analysis_runs => Ended::AnalysisRuns(ended),
            },
            _ => return Ok(()),
        };
        match ended {
            Ended::Rollouts(ended) => {
                self.rollouts = None;
                if ended.is_ok() && stopping() {
                    diagnostics.task_stopped(ROLLOUT_CONTROLLER);
                    self.finish_analysis_runs().await;
                    return Ok(());
                }
                let reason = match ended {
                    Ok(()) => "ended".to_string(),
                    Err(join) => join_failure(join),
                };
                diagnostics.task_down(ROLLOUT_CONTROLLER, &reason);
                Err(Error::TaskFailed {
                    task: ROLLOUT_CONTROLLER,
                    reason,
                })
            }
            Ended::AnalysisRuns(ended) => {
                self.analysis_runs = None;
                // The task supervises the AnalysisRun and the Experiment controllers: the one
                // that gave up is named.
                let (task, reason) = match ended {
                    Ok(Ok(())) => {
                        // The supervisor returns only once the controller is stopping.
                        if let Some(rollouts) = self.rollouts.take() {
                            let _ = rollouts.await;
                        }
                        diagnostics.task_stopped(ROLLOUT_CONTROLLER);
                        return Ok(());
                    }
                    Ok(Err(gave_up)) => (
                        gave_up.task,
                        format!("{} ({} times in a row)", gave_up.reason, gave_up.failures),
                    ),
                    Err(join) => (ANALYSIS_RUN_CONTROLLER, join_failure(join)),
                };
                diagnostics.task_down(task, &reason);
                Err(Error::TaskFailed { task, reason })
            }
        }
    }

    /// Gives AnalysisRun reconciles in flight a grace period once the Rollout controller
    /// stopped.
    async fn finish_analysis_runs(&mut self) {
        let Some(analysis_runs) = self.analysis_runs.as_mut() else {
            return;
        };
        match tokio::time::timeout(ANALYSIS_RUN_SHUTDOWN_GRACE, analysis_runs).await {
            Ok(Ok(Err(gave_up))) => {
                tracing::error!(reason = %gave_up.reason, "the AnalysisRun controller did not run")
            }
            Ok(_) => {}
            // kube's Controller stopped before its first list waits for its store forever.
            Err(_) => {
                tracing::warn!("the AnalysisRun controller did not stop in time; stopping it");
                return;
            }
        }
        self.analysis_runs = None;
    }

    /// Cancels what still runs and waits until it is gone: no reconcile goes on after this.
    async fn abort(&mut self) {
        if let Some(rollouts) = self.rollouts.take() {
            rollouts.abort();
            let _ = rollouts.await;
        }
        if let Some(analysis_runs) = self.analysis_runs.take() {
            analysis_runs.abort();
            let _ = analysis_runs.await;
        }
    }
}

/// How a task that did not return ended: its panic message, or cancelled.
fn join_failure(join: JoinError) -> String {
    match join.try_into_panic() {
        Ok(payload) => format!("panicked: {}", panic_message(&*payload)),
        Err(_) => "was cancelled".to_string(),
    }
}

/// The Rollout `Controller`: Rollouts (managedFields dropped) trigger themselves; ReplicaSets
/// and AnalysisRuns (a run finishing moves its step on) are stored in `caches`, stripped, before
/// they trigger their owner, so a reconcile reads its own objects from memory instead of
/// listing them.
///
/// Each watch decodes objects one by one ([`Decoded`]): an object that does not fit our types
/// is kept out of the store and reported (a Rollout gets `InvalidSpec`, a ReplicaSet a Warning
/// event; AnalysisRuns are reported by their own controller), and every other object is served.
fn rollout_controller(
    client: &Client,
    namespace: Option<&str>,
    selector: &str,
    caches: &Arc<OwnedCaches>,
    claims: &Arc<Claims>,
) -> Controller<PackedRollout> {
    let (rollout_store, rollout_writer) = reflector::store();
    let (feed_claims, claims_changed) = claims::feeder(claims.clone());
    let mut rollout_sorter =
        Sorter::<Rollout>::new(Some(decode::spawn_reporter::<Rollout>(client.clone())));
    let rollouts = watcher(
        scoped_api::<Decoded<Rollout>>(client, namespace),
        watcher::Config::default().labels(selector),
    )
    .default_backoff()
    .filter_map(move |event| {
        std::future::ready(match event {
            Ok(event) => rollout_sorter.sort(event).map(Ok),
            Err(error) => Some(Err(error)),
        })
    })
    .modify(|rollout| rollout.metadata.managed_fields = None)
    .inspect_ok(feed_claims)
    .map_ok(packed::pack_event)
    .reflect(rollout_writer)
    .applied_objects();
    let mut replica_set_notes = Notes::new(
        "ReplicaSet".to_string(),
        Some(decode::spawn_reporter::<ReplicaSet>(client.clone())),
    );
    let replica_sets = watcher(
        scoped_api::<Decoded<ReplicaSet>>(client, namespace),
        watcher::Config::default().labels(DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY),
    )
    .default_backoff()
    .modify(|object| {
        if let Decoded::Typed(rs) = object {
            owned_cache::strip_replica_set(rs);
        }
    })
    .inspect_ok({
        let caches = caches.clone();
        move |event| {
            replica_set_notes.observe_event(event);
            caches.replica_sets.apply_decoded(event);
        }
    })
    .touched_objects();
    let analysis_runs = watcher(
        scoped_api::<Decoded<AnalysisRun>>(client, namespace),
        watcher::Config::default().labels(ROLLOUT_TYPE_LABEL),
    )
    .default_backoff()
    .modify(|object| {
        if let Decoded::Typed(run) = object {
            owned_cache::strip_analysis_run(run);
        }
    })
    .inspect_ok({
        let caches = caches.clone();
        move |event| caches.analysis_runs.apply_decoded(event)
    })
    .touched_objects();
    // An experiment step's Experiments carry the revision's hash label, as Argo's do.
    let experiments = watcher(
        scoped_api::<Decoded<rollouts_crds::experiment::Experiment>>(client, namespace),
        watcher::Config::default().labels(DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY),
    )
    .default_backoff()
    .modify(|object| {
        if let Decoded::Typed(experiment) = object {
            owned_cache::strip_experiment(experiment);
        }
    })
    .inspect_ok({
        let caches = caches.clone();
        move |event| caches.experiments.apply_decoded(event)
    })
    .touched_objects();
    Controller::for_stream(rollouts, rollout_store)
        .owns_stream(replica_sets)
        .owns_stream(analysis_runs)
        .owns_stream(experiments)
        // Rollouts sharing an object with one that changed or went, and the gone ones.
        .reconcile_on(claims_changed.map(|rollout| packed::packed_ref(&rollout)))
}

/// The notifier, configured by [`watch_notifications`] once the controllers run.
fn start_notifier(client: &Client, metrics: &Metrics, enabled: bool) -> Notifier {
    let reporter = kube::runtime::events::Reporter {
        controller: crate::context::CONTROLLER_NAME.to_string(),
        instance: std::env::var("POD_NAME").ok(),
    };
    // Enabled, events planned before the configuration is read are held for it, so a restart's
    // first passes notify as any other.
    Notifier::start(
        client.clone(),
        reporter,
        metrics.notifications.clone(),
        enabled,
    )
}

/// With `--notifications-enabled`, watches the notification ConfigMap and Secret in
/// `--notifications-namespace` (the controller's own by default), and with
/// `--self-service-notification-enabled` those of the same names in every namespace. Started
/// after the controllers, so their first lists go out first.
fn watch_notifications(flags: &Flags, client: &Client, notifier: &Notifier) {
    if !flags.notifications_enabled {
        return;
    }
    let source = ConfigSource {
        namespace: flags
            .notifications_namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string()),
        configmap: flags.notifications_configmap.clone(),
        secret: flags.notifications_secret.clone(),
    };
    tracing::info!(namespace = %source.namespace, configmap = %source.configmap, secret = %source.secret, "notifications configured from");
    if flags.self_service_notification_enabled {
        tracing::info!("self-service notifications: each Rollout's namespace may hold its own");
        notifier.watch_self_service(client.clone(), source.clone());
    }
    notifier.watch(client.clone(), source);
}

/// An API for `K` in `namespace`, or in all namespaces.
fn scoped_api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    }
}

/// Binds the health and metrics listeners (once when both flags name the same address) and
/// serves them, each under a supervisor that serves it again should it stop.
async fn serve_endpoints(flags: &Flags, endpoints: Endpoints) -> Result<()> {
    let health = health::bind(flags.health_addr, "health-addr").await?;
    // The bound address, not the flag: with port 0 the kernel picks the port.
    let addr = health.local_addr().unwrap_or(flags.health_addr);
    tracing::info!(%addr, "serving /healthz and /readyz");
    let metrics = if flags.metrics_addr != flags.health_addr {
        let metrics = health::bind(flags.metrics_addr, "metrics-addr").await?;
        let addr = metrics.local_addr().unwrap_or(flags.metrics_addr);
        tracing::info!(%addr, "serving /metrics");
        Some(metrics)
    } else {
        None
    };
    let listeners = std::iter::once((HEALTH_SERVER, health))
        .chain(metrics.map(|metrics| (METRICS_SERVER, metrics)));
    for (task, listener) in listeners {
        let listener = Arc::new(listener);
        let endpoints = endpoints.clone();
        tokio::spawn(async move {
            let diagnostics = endpoints.diagnostics.clone();
            // Restarting forever returns nothing; the process ending drops this task.
            let _ = supervise(
                task,
                &diagnostics,
                RestartPolicy::FOREVER,
                || false,
                || {
                    let serving =
                        health::serve(listener.clone(), endpoints.clone(), ServerLimits::DEFAULT);
                    async move {
                        serving.await;
                        Ok(())
                    }
                },
            )
            .await;
        });
    }
    Ok(())
}

/// A flag that turns true on the first SIGTERM or SIGINT.
fn shutdown_on_signal() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let interrupt = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut terminate) => {
                    tokio::select! {
                        _ = interrupt => {}
                        _ = terminate.recv() => {}
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot listen for SIGTERM; only SIGINT stops the controller");
                    let _ = interrupt.await;
                }
            }
        }
        #[cfg(not(unix))]
        let _ = interrupt.await;
        tracing::info!("shutdown requested; finishing reconciles in flight");
        tx.send_replace(true);
    });
    rx
}

async fn wait_for(mut shutdown: watch::Receiver<bool>) {
    // An Err means the sender is gone, which only happens if the signal task died: stop too.
    let _ = shutdown.wait_for(|requested| *requested).await;
}

/// Adds a watch per router object kind (Ingress, and VirtualService, DestinationRule and
/// HTTPRoute where their CRDs are installed) that reconciles the Rollouts naming the object, so
/// an out-of-band edit to a field the routers own is put back within seconds. A kind whose CRD
/// is installed after start-up is not watched until a restart.
async fn watch_router_objects(
    rollout_controller: Controller<PackedRollout>,
    client: &Client,
    namespace: Option<&str>,
    claims: &Arc<Claims>,
) -> Controller<PackedRollout> {
    use kube::ResourceExt;
    use kube::api::DynamicObject;

    let mut rollout_controller = rollout_controller;
    let kinds = [
        rollouts_traffic::INGRESS,
        rollouts_traffic::VIRTUAL_SERVICE,
        rollouts_traffic::DESTINATION_RULE,
        rollouts_traffic::HTTP_ROUTE,
    ];
    for kind in kinds {
        let resource = kind.api_resource();
        let api: Api<DynamicObject> = match namespace {
            Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        match api.list_metadata(&ListParams::default().limit(1)).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {
                tracing::info!(
                    kind = kind.kind,
                    "not installed; its router objects are not watched"
                );
                continue;
            }
            Err(kube::Error::Api(status)) if status.code == 403 => {
                tracing::warn!(kind = kind.kind, reason = %status.message, "not permitted to list; its router objects are not watched (grant list and watch in the controller's role)");
                continue;
            }
            // The watcher retries on its own; the kind is there but the list failed this once.
            Err(error) => tracing::warn!(kind = kind.kind, %error, "cannot list router objects"),
        }
        // Only the name and namespace are read, so an object that does not decode (nested too
        // deep) still triggers the Rollouts naming it, and never fails the watch. The claims
        // index answers who names it, without going through every Rollout.
        let claims = claims.clone();
        let mapper = move |object: Decoded<DynamicObject>| {
            let object_namespace = object.namespace().unwrap_or_default();
            claims
                .naming(kind.kind, &object_namespace, &object.name_any())
                .iter()
                .map(packed::packed_ref)
                .collect::<Vec<_>>()
        };
        tracing::info!(kind = kind.kind, "watching router objects");
        let api: Api<Decoded<DynamicObject>> = match namespace {
            Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        rollout_controller =
            rollout_controller.watches_with(api, resource, watcher::Config::default(), mapper);
    }
    rollout_controller
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("refused by the test", reason)
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn transient_startup_failures_are_retried() {
        for code in [500, 502, 503, 504, 429, 408] {
            assert!(
                matches!(
                    startup_failure(api_error(code, "InternalError"), "in all namespaces"),
                    StartupFailure::Transient(_)
                ),
                "{code}"
            );
        }
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(matches!(
            startup_failure(kube::Error::Service(Box::new(refused)), "in all namespaces"),
            StartupFailure::Transient(_)
        ));
    }

    #[test]
    fn refused_access_names_the_request_and_a_missing_crd_stays_a_missing_crd() {
        for code in [401, 403] {
            let StartupFailure::Fatal(error) =
                startup_failure(api_error(code, "Forbidden"), "in namespace shop")
            else {
                panic!("{code} is final");
            };
            let message = error.to_string();
            assert!(
                message.contains("refused list rollouts.argoproj.io in namespace shop"),
                "{message}"
            );
            assert!(message.contains(&format!("{code} Forbidden")), "{message}");
            assert!(message.contains("RBAC"), "{message}");
        }
        assert!(matches!(
            startup_failure(api_error(404, "NotFound"), "in all namespaces"),
            StartupFailure::Fatal(Error::CrdNotInstalled { .. })
        ));
        for code in [400, 501] {
            let StartupFailure::Fatal(error) =
                startup_failure(api_error(code, "BadRequest"), "in all namespaces")
            else {
                panic!("{code} is final");
            };
            assert!(matches!(error, Error::StartupList { .. }), "{error}");
            assert!(!error.to_string().contains("RBAC"), "{error}");
        }
    }

    #[test]
    fn startup_retries_back_off_up_to_a_maximum() {
        assert_eq!(startup_backoff(1), Duration::from_millis(500));
        assert_eq!(startup_backoff(2), Duration::from_secs(1));
        assert_eq!(startup_backoff(4), Duration::from_secs(4));
        assert_eq!(startup_backoff(7), Duration::from_secs(30));
        assert_eq!(startup_backoff(u32::MAX), Duration::from_secs(30));
    }
}
