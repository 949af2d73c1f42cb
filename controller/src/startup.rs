//! Starting and stopping the controller: logging, the client, the CRD check, the HTTP
//! endpoints, leader election, the Rollout `Controller` with the watches that feed its caches,
//! and shutdown on SIGTERM/SIGINT.

use std::io::IsTerminal;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::controller::{self, Controller};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, Config};
use rollouts_crds::analysis::AnalysisRun;
use rollouts_crds::rollout::{DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY, ROLLOUT_TYPE_LABEL, Rollout};
use tokio::sync::watch;
use tracing_subscriber::EnvFilter;

use crate::cli::{Flags, LogFormat};
use crate::context::{Context, Settings};
use crate::error::{Error, Result};
use crate::health::{self, Diagnostics, Endpoints, Leadership};
use crate::leader::{self, LeaderElection};
use crate::metrics::Metrics;
use crate::owned_cache::{self, OwnedCaches};
use crate::reconcile::{error_policy, reconcile};

/// How long AnalysisRun reconciles in flight get to finish once the Rollout controller stopped.
const ANALYSIS_RUN_SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

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
    Client::try_from(config).map_err(|e| kubeconfig_error("client".to_string())(Box::new(e)))
}

/// The `User-Agent` of every request the controller makes.
pub const USER_AGENT: &str = concat!("rollouts-controller/", env!("CARGO_PKG_VERSION"));

/// Lists one Rollout: a 404 means the CRD is not installed, which no retry will fix.
pub async fn check_crd_installed(api: &Api<Rollout>, scope: &str) -> Result<()> {
    match api.list(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Err(Error::CrdNotInstalled {
            source: Box::new(kube::Error::Api(status)),
        }),
        Err(source) => Err(Error::StartupList {
            scope: scope.to_string(),
            source: Box::new(source),
        }),
    }
}

/// Runs the controller until SIGTERM/SIGINT (Ok) or until the leader lease is lost (Err).
pub async fn run(flags: Flags) -> Result<()> {
    let client = client(&flags).await?;
    let namespace = flags.namespace.as_deref();
    let scope = match namespace {
        Some(namespace) => format!("in namespace {namespace}"),
        None => "in all namespaces".to_string(),
    };
    let rollouts: Api<Rollout> = scoped_api(&client, namespace);
    check_crd_installed(&rollouts, &scope).await?;

    let selector = flags.rollout_label_selector();
    tracing::info!(scope = %scope, %selector, "watching Rollouts");
    let caches = Arc::new(OwnedCaches::new());
    let rollout_controller = rollout_controller(&client, namespace, &selector, &caches)
        .with_config(controller::Config::default().concurrency(flags.concurrency));
    let rollout_controller = watch_router_objects(rollout_controller, &client, namespace).await;

    let metrics = Arc::new(Metrics::new(rollout_controller.store()));
    let diagnostics = Arc::new(Diagnostics::new(if flags.leader_elect {
        Leadership::Follower
    } else {
        Leadership::Disabled
    }));
    serve_endpoints(
        &flags,
        Endpoints {
            diagnostics: diagnostics.clone(),
            metrics: metrics.clone(),
        },
    )
    .await?;

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
        tracing::info!(identity = election.identity(), lease = %flags.lease_name, %namespace, "waiting for the leader lease");
        tokio::select! {
            () = election.acquire() => {}
            () = wait_for(shutdown.clone()) => {
                tracing::info!("shutdown requested before becoming leader");
                return Ok(());
            }
        }
        diagnostics.set_leadership(Leadership::Leader);
        tracing::info!("became leader");
        Some(election)
    } else {
        None
    };

    // Losing the lease stops the controller like a signal does, and makes the process fail.
    let (lost_tx, lost_rx) = watch::channel(false);
    let stop = futures::FutureExt::shared({
        let mut lost = lost_rx.clone();
        let shutdown = shutdown.clone();
        async move {
            let lease_lost = async move {
                // Without leader election the sender is dropped at once: that is not a loss.
                if lost.wait_for(|lost| *lost).await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                () = wait_for(shutdown) => {}
                () = lease_lost => {}
            }
        }
    });
    let holder = election.clone().map(|election| {
        let diagnostics = diagnostics.clone();
        tokio::spawn(async move {
            let error = election.hold().await;
            diagnostics.set_leadership(Leadership::Stopping);
            lost_tx.send_replace(true);
            error
        })
    });

    let context = Arc::new(Context::new(
        client,
        metrics,
        diagnostics.clone(),
        Settings {
            instance_id: flags.instance_id.clone(),
            prometheus_address: flags.prometheus_address.clone(),
        },
        caches,
    ));
    // AnalysisRuns have their own controller, under the same leadership and shutdown.
    let analysis_runs = tokio::spawn(crate::analysisrun::run(
        context.client.clone(),
        crate::analysisrun::Options::from_flags(&flags),
        context.metrics.analysis_runs.clone(),
        stop.clone(),
    ));
    rollout_controller
        .graceful_shutdown_on(stop)
        .run(reconcile, error_policy, context)
        .for_each(|outcome| async move {
            match outcome {
                Ok(_) => {}
                // error_policy has already logged and counted failed reconciles.
                Err(
                    controller::Error::ReconcilerFailed(..) | controller::Error::ObjectNotFound(_),
                ) => {}
                Err(error) => tracing::warn!(%error, "watch failed; retrying"),
            }
        })
        .await;
    let mut analysis_runs = analysis_runs;
    match tokio::time::timeout(ANALYSIS_RUN_SHUTDOWN_GRACE, &mut analysis_runs).await {
        Ok(Ok(Err(error))) => tracing::error!(%error, "the AnalysisRun controller did not run"),
        Ok(_) => {}
        // kube's Controller stopped before its first list waits for its store forever.
        Err(_) => {
            tracing::warn!("the AnalysisRun controller did not stop in time; stopping it");
            analysis_runs.abort();
        }
    }
    diagnostics.set_leadership(Leadership::Stopping);

    if let Some(holder) = holder {
        if *lost_rx.borrow() {
            if let Ok(error) = holder.await {
                return Err(error);
            }
        } else {
            holder.abort();
        }
    }
    if let Some(election) = election {
        match election.release().await {
            Ok(()) => tracing::info!("released the leader lease"),
            Err(error) => {
                tracing::warn!(%error, "cannot release the leader lease; it expires on its own")
            }
        }
    }
    tracing::info!("stopped");
    Ok(())
}

/// The Rollout `Controller`: Rollouts (managedFields dropped) trigger themselves; ReplicaSets
/// and AnalysisRuns (a run finishing moves its step on) are stored in `caches`, stripped, before
/// they trigger their owner, so a reconcile reads its own objects from memory instead of
/// listing them.
fn rollout_controller(
    client: &Client,
    namespace: Option<&str>,
    selector: &str,
    caches: &Arc<OwnedCaches>,
) -> Controller<Rollout> {
    let (rollout_store, rollout_writer) = reflector::store();
    let rollouts = watcher(
        scoped_api::<Rollout>(client, namespace),
        watcher::Config::default().labels(selector),
    )
    .default_backoff()
    .modify(|rollout| rollout.metadata.managed_fields = None)
    .reflect(rollout_writer)
    .applied_objects();
    let replica_sets = watcher(
        scoped_api::<ReplicaSet>(client, namespace),
        watcher::Config::default().labels(DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY),
    )
    .default_backoff()
    .modify(owned_cache::strip_replica_set)
    .inspect_ok({
        let caches = caches.clone();
        move |event| caches.replica_sets.apply(event)
    })
    .touched_objects();
    let analysis_runs = watcher(
        scoped_api::<AnalysisRun>(client, namespace),
        watcher::Config::default().labels(ROLLOUT_TYPE_LABEL),
    )
    .default_backoff()
    .modify(owned_cache::strip_analysis_run)
    .inspect_ok({
        let caches = caches.clone();
        move |event| caches.analysis_runs.apply(event)
    })
    .touched_objects();
    Controller::for_stream(rollouts, rollout_store)
        .owns_stream(replica_sets)
        .owns_stream(analysis_runs)
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

/// Binds the health and metrics listeners (once when both flags name the same address).
async fn serve_endpoints(flags: &Flags, endpoints: Endpoints) -> Result<()> {
    let health = health::bind(flags.health_addr, "health-addr").await?;
    // The bound address, not the flag: with port 0 the kernel picks the port.
    let addr = health.local_addr().unwrap_or(flags.health_addr);
    tracing::info!(%addr, "serving /healthz and /readyz");
    tokio::spawn(health::serve(health, endpoints.clone()));
    if flags.metrics_addr != flags.health_addr {
        let metrics = health::bind(flags.metrics_addr, "metrics-addr").await?;
        let addr = metrics.local_addr().unwrap_or(flags.metrics_addr);
        tracing::info!(%addr, "serving /metrics");
        tokio::spawn(health::serve(metrics, endpoints));
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
    rollout_controller: Controller<Rollout>,
    client: &Client,
    namespace: Option<&str>,
) -> Controller<Rollout> {
    use kube::ResourceExt;
    use kube::api::DynamicObject;
    use kube::runtime::reflector::ObjectRef;

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
        let rollouts = rollout_controller.store();
        let mapper = move |object: DynamicObject| {
            let object_namespace = object.namespace().unwrap_or_default();
            let object_name = object.name_any();
            rollouts
                .state()
                .into_iter()
                .filter(|rollout| {
                    rollouts_traffic::router_objects(rollout)
                        .iter()
                        .any(|named| named.is(kind.kind, &object_namespace, &object_name))
                })
                .map(|rollout| ObjectRef::from_obj(rollout.as_ref()))
                .collect::<Vec<_>>()
        };
        tracing::info!(kind = kind.kind, "watching router objects");
        rollout_controller =
            rollout_controller.watches_with(api, resource, watcher::Config::default(), mapper);
    }
    rollout_controller
}
