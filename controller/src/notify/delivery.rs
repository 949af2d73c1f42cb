//! The notifier: keeps the configuration current from watches of the ConfigMap and Secret,
//! takes a reconcile's events without waiting ([`Notifier::notify`]), and delivers them on
//! tasks of its own: one worker per Rollout and destination (a Rollout's notifications reach
//! each receiver in order, and a receiver that hangs holds up no other), each send tried again
//! on transient failures with backoff, what was sent recorded in the Rollout's
//! `notified.notifications.argoproj.io` annotation by JSON merge patch.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use base64::Engine;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::events::Reporter;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use rollouts_crds::rollout::Rollout;
use tokio::sync::mpsc;

use super::config::NotificationConfig;
use super::services::{self, HttpClients, SendError};
use super::subscriptions::{self, Destination};
use super::template::Notification;
use super::template::{ExtraVariables, variables_with};
use super::{
    NOTIFICATION_FAILED_REASON, NOTIFIED_ANNOTATION, NotificationSends, template,
    trigger_conditions, trigger_for_reason,
};
use crate::planner::{Event, REVISION_ANNOTATION};
use rollouts_crds::analysis::AnalysisRun;

/// Notifications waiting for delivery at most; past it a notification is dropped (and
/// counted), never a reconcile held up.
const QUEUE_CAPACITY: usize = 1024;
/// Rollout event batches held while the configuration is first read; beyond this the oldest
/// go, with a warning.
const HELD_CAPACITY: usize = 1000;
/// Sent notifications remembered per Rollout, oldest forgotten first (Argo's engine keeps 100).
const NOTIFIED_HISTORY: usize = 100;

/// Where the configuration lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigSource {
    pub namespace: String,
    pub configmap: String,
    pub secret: String,
}

/// One event to deliver to one subscriber.
struct Job {
    namespace: String,
    name: String,
    reference: ObjectReference,
    trigger: String,
    /// Tells this occurrence of the event from another of the same trigger (a second abort).
    occurrence: String,
    rollout: Arc<serde_json::Value>,
    destination: Destination,
    config: Arc<NotificationConfig>,
    /// The namespace of a self-service configuration (the Rollout's own ConfigMap); `None`
    /// for the controller's.
    config_namespace: Option<String>,
    /// The Rollout's annotation as the reconcile saw it.
    notified: BTreeMap<String, i64>,
}

impl Job {
    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The worker this job goes to: its Rollout and destination.
    fn route(&self) -> String {
        format!(
            "{}/{}/{}/{}/{}",
            self.namespace,
            self.name,
            self.config_namespace.as_deref().unwrap_or_default(),
            self.destination.service,
            self.destination.recipient
        )
    }
}

struct Shared {
    client: Client,
    reporter: Reporter,
    http: HttpClients,
    sends: NotificationSends,
    /// What this process sent or saw recorded, per `namespace/name`: a reconcile's copy of a
    /// Rollout may predate our last annotation write.
    notified: Mutex<SentLedger>,
    /// Held while the annotation is written, so a write never carries less than an earlier one.
    recording: tokio::sync::Mutex<()>,
}

/// Events planned before the configuration was first read (a restart's first passes), kept
/// until it is, so no subscriber misses one; `None` once it has been read.
type Held = Arc<Mutex<Option<Vec<(Rollout, Vec<Event>)>>>>;

/// Hands events to the delivery task; cheap to call from a reconcile.
#[derive(Clone)]
pub struct Notifier {
    config: Arc<RwLock<Arc<NotificationConfig>>>,
    held: Held,
    /// Self-service configurations by namespace (`--self-service-notification-enabled`).
    namespaced: NamespacedConfigs,
    queue: mpsc::Sender<Job>,
    sends: NotificationSends,
}

impl Notifier {
    /// Starts the delivery task; nothing is configured until [`Self::watch`]. With `hold`
    /// (notifications are enabled), events are held until [`Self::watch`] has read the
    /// configuration once, then notified as if they had just been planned.
    pub fn start(client: Client, reporter: Reporter, sends: NotificationSends, hold: bool) -> Self {
        let (config, _) = NotificationConfig::parse(&BTreeMap::new(), &BTreeMap::new());
        let config = Arc::new(RwLock::new(Arc::new(config)));
        let (queue, jobs) = mpsc::channel::<Job>(QUEUE_CAPACITY);
        let shared_sends = sends.clone();
        // The HTTP clients are built on the delivery task, off the start-up path.
        tokio::spawn(async move {
            let http = match HttpClients::new() {
                Ok(http) => http,
                Err(error) => {
                    tracing::error!(%error, "notifications cannot be sent: no HTTP client");
                    let mut jobs = jobs;
                    while let Some(job) = jobs.recv().await {
                        shared_sends.count(&job.destination.service, "failure");
                    }
                    return;
                }
            };
            let shared = Arc::new(Shared {
                client,
                reporter,
                http,
                sends: shared_sends,
                notified: Mutex::new(SentLedger::default()),
                recording: tokio::sync::Mutex::new(()),
            });
            dispatch(jobs, shared).await;
        });
        Self {
            config,
            held: Arc::new(Mutex::new(hold.then(Vec::new))),
            namespaced: NamespacedConfigs::default(),
            queue,
            sends,
        }
    }

    /// Keeps the configuration current from the ConfigMap and Secret `source` names.
    pub fn watch(&self, client: Client, source: ConfigSource) {
        let (read, first_read) = tokio::sync::oneshot::channel();
        tokio::spawn(watch_config(client, source, self.config.clone(), read));
        let notifier = self.clone();
        tokio::spawn(async move {
            if first_read.await.is_ok() {
                notifier.release_held();
            }
        });
    }

    /// Notifies what was held while the configuration was first read; from now on events go
    /// straight through.
    fn release_held(&self) {
        let held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            .unwrap_or_default();
        if !held.is_empty() {
            tracing::info!(
                batches = held.len(),
                "notifying the events planned before the configuration was read"
            );
        }
        for (rollout, events) in held {
            self.notify(&rollout, &events);
        }
    }

    /// Holds `events` while the configuration has not been read yet; false once it has.
    fn hold(&self, rollout: &Rollout, events: &[Event]) -> bool {
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(waiting) = held.as_mut() else {
            return false;
        };
        if waiting.len() >= HELD_CAPACITY {
            let (dropped, _) = waiting.remove(0);
            tracing::warn!(
                namespace = %dropped.namespace().unwrap_or_default(),
                rollout = %dropped.name_any(),
                "the notification configuration is still not read: an early event is dropped"
            );
        }
        waiting.push((rollout.clone(), events.to_vec()));
        true
    }

    /// Self-service notifications, as Argo's `--self-service-notification-enabled`: also keeps
    /// the ConfigMap and Secret of `source`'s names in every other namespace, whose Rollouts
    /// are then notified through both their namespace's configuration and the controller's.
    pub fn watch_self_service(&self, client: Client, source: ConfigSource) {
        tokio::spawn(watch_namespaced(client, source, self.namespaced.clone()));
    }

    fn current(&self) -> Arc<NotificationConfig> {
        self.config
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Queues a notification for each of `events` someone subscribed to. Templates see the
    /// Rollout as the reconcile found it, as Argo's do (a step's template adds 1 to
    /// `.rollout.status.currentStepIndex` to name the step just completed).
    pub fn notify(&self, rollout: &Rollout, events: &[Event]) {
        if events.is_empty() || self.hold(rollout, events) {
            return;
        }
        let namespace = rollout.namespace().unwrap_or_default();
        let mut configs = vec![(None, self.current())];
        if let Some(own) = self.namespaced.get(&namespace) {
            configs.insert(0, (Some(namespace.clone()), own));
        }
        let mut rollout_json = None;
        for (config_namespace, config) in configs {
            self.notify_with(rollout, events, config_namespace, config, &mut rollout_json);
        }
    }

    /// [`Self::notify`] through one configuration.
    fn notify_with(
        &self,
        rollout: &Rollout,
        events: &[Event],
        config_namespace: Option<String>,
        config: Arc<NotificationConfig>,
        rollout_json: &mut Option<Arc<serde_json::Value>>,
    ) {
        let namespace = rollout.namespace().unwrap_or_default();
        let name = rollout.name_any();
        let annotations = rollout.annotations();
        let labels = rollout.labels();
        for event in events {
            let trigger = trigger_for_reason(&event.reason);
            let (found, errors) =
                subscriptions::destinations(&config, &trigger, annotations, labels);
            for error in errors {
                tracing::warn!(%namespace, rollout = %name, "{error}");
            }
            let destinations = config.configured(found);
            if destinations.is_empty() || trigger_conditions(&config, &trigger).is_none() {
                continue;
            }
            let mut rollout_json = rollout_json
                .get_or_insert_with(|| Arc::new(serde_json::to_value(rollout).unwrap_or_default()))
                .clone();
            if let Some(index) = completed_step_index(event)
                && rollout_json["status"]["currentStepIndex"] != index
            {
                let mut at_step = (*rollout_json).clone();
                at_step["status"]["currentStepIndex"] = index.into();
                rollout_json = Arc::new(at_step);
            }
            // Argo records RolloutUpdated once the Rollout carries its new revision; ours is
            // written in the same pass as the event, after the Rollout was read.
            if let Some(revision) = updated_revision(event)
                && rollout_json["metadata"]["annotations"][REVISION_ANNOTATION] != revision
            {
                let mut updated = (*rollout_json).clone();
                updated["metadata"]["annotations"][REVISION_ANNOTATION] = revision.into();
                rollout_json = Arc::new(updated);
            }
            let notified: BTreeMap<String, i64> = annotations
                .get(NOTIFIED_ANNOTATION)
                .and_then(|value| serde_json::from_str(value).ok())
                .unwrap_or_default();
            for destination in destinations {
                let job = Job {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    reference: rollout.object_ref(&()),
                    occurrence: occurrence(event, rollout),
                    trigger: trigger.clone(),
                    rollout: rollout_json.clone(),
                    destination,
                    config: config.clone(),
                    config_namespace: config_namespace.clone(),
                    notified: notified.clone(),
                };
                if let Err(error) = self.queue.try_send(job) {
                    let job = match error {
                        mpsc::error::TrySendError::Full(job)
                        | mpsc::error::TrySendError::Closed(job) => job,
                    };
                    self.sends.count(&job.destination.service, "dropped");
                    tracing::warn!(%namespace, rollout = %name, trigger = %job.trigger, service = %job.destination.service, "notification dropped: the delivery queue is full");
                }
            }
        }
    }
}

/// The index of the step a `RolloutStepCompleted` event reports ("Rollout step 2/8 completed
/// ..." is index 1). One reconcile may complete several steps that need no scaling; each
/// event's template then sees the index its step had, as Argo's (one step a reconcile) do.
fn completed_step_index(event: &Event) -> Option<i64> {
    if event.reason != rollouts_crds::conditions::ROLLOUT_STEP_COMPLETED_REASON {
        return None;
    }
    let (number, _) = event
        .message
        .strip_prefix("Rollout step ")?
        .split_once('/')?;
    number.parse::<i64>().ok()?.checked_sub(1)
}

/// The revision a `RolloutUpdated` event reports ("Rollout updated to revision 3").
fn updated_revision(event: &Event) -> Option<&str> {
    if event.reason != rollouts_crds::conditions::ROLLOUT_UPDATED_REASON {
        return None;
    }
    event
        .message
        .strip_prefix("Rollout updated to revision ")
        .filter(|revision| !revision.is_empty())
}

/// The once-per part of an event's key: its reason and message and the version of the
/// Rollout it was planned from, hashed. A pass cut short plans the same events again from the
/// same version, and a new leader or a restarted controller sees that version too, so a repeat
/// has the same key; a new occurrence (a second abort, the next step) comes from a newer one.
fn occurrence(event: &Event, rollout: &Rollout) -> String {
    let text = format!(
        "{}\n{}\n{}",
        event.reason,
        event.message,
        rollout.resource_version().unwrap_or_default()
    );
    let mut hashed = sha1_base64(&text);
    hashed.truncate(12);
    hashed
}

/// SHA-1, base64url without padding, as Argo's engine keys conditions.
fn sha1_base64(text: &str) -> String {
    let digest = sha1_smol::Sha1::from(text).digest().bytes();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest)
}

/// Keeps `config` current from the ConfigMap and Secret; a missing ConfigMap means nothing is
/// configured, a missing Secret no `$key` values.
async fn watch_config(
    client: Client,
    source: ConfigSource,
    config: Arc<RwLock<Arc<NotificationConfig>>>,
    read: tokio::sync::oneshot::Sender<()>,
) {
    enum Change {
        Data(Option<BTreeMap<String, String>>),
        Secret(Option<BTreeMap<String, String>>),
        /// The ConfigMap's (true) or the Secret's (false) first list is complete.
        Listed(bool),
    }
    fn by_name(name: &str) -> watcher::Config {
        watcher::Config::default().fields(&format!("metadata.name={name}"))
    }
    // A watch that keeps failing (no RBAC, no such namespace) says so once, then quietly
    // retries with kube's backoff until it works again.
    fn report(failing: &AtomicBool, what: &str, error: &watcher::Error) {
        if failing.swap(true, Ordering::Relaxed) {
            tracing::debug!(%error, "watching the notification {what} still fails; retrying");
        } else {
            tracing::warn!(%error, "watching the notification {what} failed; retrying");
        }
    }
    let (configmap_failing, secret_failing) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &source.namespace);
    let secrets: Api<Secret> = Api::namespaced(client, &source.namespace);
    let configmap_changes = watcher(configmaps, by_name(&source.configmap))
        .default_backoff()
        .filter_map(move |event| {
            let failing = configmap_failing.clone();
            async move {
                // Each try starts with Init; only what follows it says the watch works.
                if matches!(&event, Ok(e) if !matches!(e, watcher::Event::Init)) {
                    failing.store(false, Ordering::Relaxed);
                }
                match event {
                    Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => {
                        Some(Change::Data(Some(cm.data.unwrap_or_default())))
                    }
                    Ok(watcher::Event::Delete(_) | watcher::Event::Init) => {
                        Some(Change::Data(None))
                    }
                    Ok(watcher::Event::InitDone) => Some(Change::Listed(true)),
                    Err(error) => {
                        report(&failing, "ConfigMap", &error);
                        None
                    }
                }
            }
        });
    let secret_changes = watcher(secrets, by_name(&source.secret))
        .default_backoff()
        .filter_map(move |event| {
            let failing = secret_failing.clone();
            async move {
                // Each try starts with Init; only what follows it says the watch works.
                if matches!(&event, Ok(e) if !matches!(e, watcher::Event::Init)) {
                    failing.store(false, Ordering::Relaxed);
                }
                match event {
                    Ok(watcher::Event::Apply(secret) | watcher::Event::InitApply(secret)) => {
                        Some(Change::Secret(Some(secret_values(secret))))
                    }
                    Ok(watcher::Event::Delete(_) | watcher::Event::Init) => {
                        Some(Change::Secret(None))
                    }
                    Ok(watcher::Event::InitDone) => Some(Change::Listed(false)),
                    Err(error) => {
                        report(&failing, "Secret", &error);
                        None
                    }
                }
            }
        });
    let mut changes = std::pin::pin!(futures::stream::select(configmap_changes, secret_changes));
    let (mut data, mut secret) = (None, BTreeMap::new());
    let (mut configmap_listed, mut secret_listed) = (false, false);
    let mut read = Some(read);
    while let Some(change) = changes.next().await {
        match change {
            Change::Data(value) => data = value,
            Change::Secret(value) => secret = value.unwrap_or_default(),
            Change::Listed(true) => configmap_listed = true,
            Change::Listed(false) => secret_listed = true,
        }
        let (parsed, errors) =
            NotificationConfig::parse(&data.clone().unwrap_or_default(), &secret);
        for error in &errors {
            tracing::warn!(namespace = %source.namespace, configmap = %source.configmap, "{error}");
        }
        if data.is_some() {
            tracing::info!(
                services = parsed.services.len(),
                templates = parsed.templates.len(),
                triggers = parsed.triggers.len(),
                unusable_keys = errors.len(),
                "notification configuration loaded"
            );
        }
        *config
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(parsed);
        // Both first lists are in: what was held can go out through this configuration.
        if configmap_listed
            && secret_listed
            && let Some(read) = read.take()
        {
            let _ = read.send(());
        }
    }
}

/// The self-service configurations, by namespace: shared by the notifier and the watch that
/// keeps them.
#[derive(Clone, Default)]
struct NamespacedConfigs(Arc<RwLock<HashMap<String, Arc<NotificationConfig>>>>);

impl NamespacedConfigs {
    fn get(&self, namespace: &str) -> Option<Arc<NotificationConfig>> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(namespace)
            .cloned()
    }

    fn set(&self, namespace: &str, config: Option<NotificationConfig>) {
        let mut configs = self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match config {
            Some(config) => configs.insert(namespace.to_string(), Arc::new(config)),
            None => configs.remove(namespace),
        };
    }
}

/// The ConfigMaps and Secrets of one name in every namespace, as the watches last listed them.
#[derive(Default)]
struct NamespacedSources {
    configmaps: HashMap<String, BTreeMap<String, String>>,
    secrets: HashMap<String, BTreeMap<String, String>>,
}

impl NamespacedSources {
    fn objects(&mut self, secret: bool) -> &mut HashMap<String, BTreeMap<String, String>> {
        if secret {
            &mut self.secrets
        } else {
            &mut self.configmaps
        }
    }

    /// Parses `namespace`'s configuration again into `configs`: none without its ConfigMap.
    fn reparse(&self, namespace: &str, source: &ConfigSource, configs: &NamespacedConfigs) {
        if namespace == source.namespace {
            // The controller's own namespace: its configuration is the controller's.
            return;
        }
        let Some(data) = self.configmaps.get(namespace) else {
            configs.set(namespace, None);
            return;
        };
        let secret = self.secrets.get(namespace).cloned().unwrap_or_default();
        let (parsed, errors) = NotificationConfig::parse(data, &secret);
        for error in &errors {
            tracing::warn!(%namespace, configmap = %source.configmap, "self-service notifications: {error}");
        }
        configs.set(namespace, Some(parsed));
    }
}

/// One change seen by the self-service watches.
enum NamespacedChange {
    /// A relist began: what follows until `Listed` replaces what was known.
    Relist {
        secret: bool,
    },
    Listed {
        secret: bool,
    },
    Apply {
        secret: bool,
        namespace: String,
        data: BTreeMap<String, String>,
    },
    Delete {
        secret: bool,
        namespace: String,
    },
}

/// A Secret's values as text: its `data` (decoded lossily as UTF-8), then its `stringData` on
/// top, as the notification configuration reads them.
pub fn secret_values(secret: Secret) -> BTreeMap<String, String> {
    let mut values: BTreeMap<String, String> = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
        .collect();
    values.extend(secret.string_data.unwrap_or_default());
    values
}

/// Keeps `configs` current from the ConfigMaps and Secrets named as `source` says in every
/// namespace but the controller's, as Argo's self-service notifications read them.
async fn watch_namespaced(client: Client, source: ConfigSource, configs: NamespacedConfigs) {
    fn by_name(name: &str) -> watcher::Config {
        watcher::Config::default().fields(&format!("metadata.name={name}"))
    }
    fn change<K: ResourceExt>(
        event: Result<watcher::Event<K>, watcher::Error>,
        secret: bool,
        data: fn(K) -> BTreeMap<String, String>,
        failing: &AtomicBool,
    ) -> Option<NamespacedChange> {
        if matches!(&event, Ok(e) if !matches!(e, watcher::Event::Init)) {
            failing.store(false, Ordering::Relaxed);
        }
        match event {
            Ok(watcher::Event::Init) => Some(NamespacedChange::Relist { secret }),
            Ok(watcher::Event::InitDone) => Some(NamespacedChange::Listed { secret }),
            Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                Some(NamespacedChange::Apply {
                    secret,
                    namespace: object.namespace().unwrap_or_default(),
                    data: data(object),
                })
            }
            Ok(watcher::Event::Delete(object)) => Some(NamespacedChange::Delete {
                secret,
                namespace: object.namespace().unwrap_or_default(),
            }),
            Err(error) => {
                let what = if secret { "Secrets" } else { "ConfigMaps" };
                if failing.swap(true, Ordering::Relaxed) {
                    tracing::debug!(%error, "watching the self-service notification {what} still fails; retrying");
                } else {
                    tracing::warn!(%error, "watching the self-service notification {what} in every namespace failed (the controller needs list and watch on them cluster-wide: docs/notifications.md); retrying");
                }
                None
            }
        }
    }
    let configmap_failing = Arc::new(AtomicBool::new(false));
    let secret_failing = Arc::new(AtomicBool::new(false));
    let configmaps = watcher(
        Api::<ConfigMap>::all(client.clone()),
        by_name(&source.configmap),
    )
    .default_backoff()
    .filter_map(move |event| {
        let failing = configmap_failing.clone();
        async move {
            change(
                event,
                false,
                |cm: ConfigMap| cm.data.unwrap_or_default(),
                &failing,
            )
        }
    });
    let secrets = watcher(Api::<Secret>::all(client), by_name(&source.secret))
        .default_backoff()
        .filter_map(move |event| {
            let failing = secret_failing.clone();
            async move { change(event, true, secret_values, &failing) }
        });
    let mut changes = std::pin::pin!(futures::stream::select(configmaps, secrets));
    let mut known = NamespacedSources::default();
    // A relist's objects, kept apart until it is complete.
    let mut relisted: [Option<HashMap<String, BTreeMap<String, String>>>; 2] = [None, None];
    while let Some(change) = changes.next().await {
        match change {
            NamespacedChange::Relist { secret } => {
                relisted[usize::from(secret)] = Some(HashMap::new())
            }
            NamespacedChange::Listed { secret } => {
                let listed = relisted[usize::from(secret)].take().unwrap_or_default();
                let before = std::mem::replace(known.objects(secret), listed);
                let mut namespaces: Vec<String> = before.into_keys().collect();
                namespaces.extend(known.objects(secret).keys().cloned());
                namespaces.sort();
                namespaces.dedup();
                for namespace in namespaces {
                    known.reparse(&namespace, &source, &configs);
                }
            }
            NamespacedChange::Apply {
                secret,
                namespace,
                data,
            } => {
                if let Some(pending) = relisted[usize::from(secret)].as_mut() {
                    pending.insert(namespace, data);
                } else {
                    known.objects(secret).insert(namespace.clone(), data);
                    known.reparse(&namespace, &source, &configs);
                }
            }
            NamespacedChange::Delete { secret, namespace } => {
                known.objects(secret).remove(&namespace);
                known.reparse(&namespace, &source, &configs);
            }
        }
    }
}

/// Routes jobs to one worker per Rollout and destination, started on demand; a worker ends
/// when it has nothing left to do.
async fn dispatch(mut jobs: mpsc::Receiver<Job>, shared: Arc<Shared>) {
    let mut workers: HashMap<String, mpsc::UnboundedSender<Job>> = HashMap::new();
    while let Some(job) = jobs.recv().await {
        let key = job.route();
        let job = match workers.get(&key) {
            Some(worker) => match worker.send(job) {
                Ok(()) => continue,
                Err(mpsc::error::SendError(job)) => job,
            },
            None => job,
        };
        workers.retain(|_, worker| !worker.is_closed());
        let (worker, queue) = mpsc::unbounded_channel();
        if worker.send(job).is_ok() {
            workers.insert(key, worker);
            tokio::spawn(work(queue, shared.clone()));
        }
    }
}

async fn work(mut queue: mpsc::UnboundedReceiver<Job>, shared: Arc<Shared>) {
    loop {
        match queue.try_recv() {
            Ok(job) => deliver(&shared, job).await,
            Err(mpsc::error::TryRecvError::Empty) => {
                // Refuse new jobs (the dispatcher starts a new worker), then finish those queued.
                queue.close();
                while let Ok(job) = queue.try_recv() {
                    deliver(&shared, job).await;
                }
                return;
            }
            Err(mpsc::error::TryRecvError::Disconnected) => return,
        }
    }
}

/// Evaluates the trigger's conditions and sends each that holds to the job's destination,
/// unless it was already notified of this occurrence (or, with `oncePer`, of this value).
async fn deliver(shared: &Shared, job: Job) {
    let Some(conditions) = trigger_conditions(&job.config, &job.trigger) else {
        return;
    };
    let key = job.key();
    for (index, condition) in conditions.iter().enumerate() {
        if !condition.when.is_empty() && !holds(shared, &job, &condition.when).await {
            continue;
        }
        let condition_key = format!("[{index}].{}", sha1_base64(&condition.when));
        let destination = &job.destination;
        let once = match condition.once_per.as_str() {
            "" => job.occurrence.clone(),
            once_per => once_per_value(shared, &job, once_per)
                .await
                .unwrap_or_else(|| job.occurrence.clone()),
        };
        // As Argo's engine: a self-service configuration's sends are keyed by its namespace.
        let config_namespace = job
            .config_namespace
            .as_ref()
            .map(|namespace| format!("{namespace}:"))
            .unwrap_or_default();
        let state_key = format!(
            "{once}:{config_namespace}{}:{condition_key}:{}:{}",
            job.trigger, destination.service, destination.recipient
        );
        if shared.already_notified(&key, &job.notified, &state_key) {
            continue;
        }
        let Some(service) = job.config.services.get(&destination.service) else {
            return;
        };
        let outcome = match render(shared, &job, &condition.send, destination).await {
            Ok(notification) => {
                send_with_retries(
                    shared,
                    &destination.service,
                    service,
                    &notification,
                    &destination.recipient,
                )
                .await
            }
            Err(reason) => Err(reason),
        };
        match outcome {
            Ok(()) => {
                shared.sends.count(&destination.service, "success");
                tracing::info!(namespace = %job.namespace, rollout = %job.name, trigger = %job.trigger, service = %destination.service, "notification sent");
                shared.record(&job, state_key).await;
            }
            Err(reason) => {
                shared.sends.count(&destination.service, "failure");
                let note = format!(
                    "{} notification to {}{} failed: {reason}",
                    job.trigger,
                    destination.service,
                    if destination.recipient.is_empty() {
                        String::new()
                    } else {
                        format!(":{}", destination.recipient)
                    }
                );
                tracing::warn!(namespace = %job.namespace, rollout = %job.name, "{note}");
                shared.warn(&job, note).await;
            }
        }
    }
}

/// Whether the condition's `when` holds for the Rollout; one that cannot be evaluated does not
/// (as in Argo's engine), and says why in the log.
async fn holds(shared: &Shared, job: &Job, when: &str) -> bool {
    let variables = condition_variables(shared, job, when).await;
    let expression = when.to_string();
    let evaluated = tokio::task::spawn_blocking(move || {
        let bound: Vec<(&str, _)> = variables
            .iter()
            .map(|(name, value)| (*name, rollouts_analysis::condition::from_json(value)))
            .collect();
        rollouts_analysis::condition::eval_condition_over(&bound, &expression)
    })
    .await;
    match evaluated {
        Ok(Ok(holds)) => holds,
        Ok(Err(error)) => {
            tracing::warn!(namespace = %job.namespace, rollout = %job.name, trigger = %job.trigger, %error, "a trigger condition could not be evaluated");
            false
        }
        Err(_) => false,
    }
}

/// What a trigger's `when` or `oncePer` sees: `rollout`, and `analysisRuns` (listed only when
/// the expression names them) as Argo Rollouts binds them.
async fn condition_variables(
    shared: &Shared,
    job: &Job,
    expression: &str,
) -> Vec<(&'static str, Arc<serde_json::Value>)> {
    let mut variables = vec![("rollout", job.rollout.clone())];
    if expression.contains("analysisRuns") {
        let runs = analysis_runs(&shared.client, &job.namespace, &job.rollout)
            .await
            .unwrap_or(serde_json::Value::Null);
        variables.push(("analysisRuns", Arc::new(runs)));
    }
    variables
}

/// The value of a condition's `oncePer` for the Rollout; `None` (the event's own occurrence
/// keys the send, as without `oncePer`) when it cannot be evaluated, as Argo's engine does.
async fn once_per_value(shared: &Shared, job: &Job, once_per: &str) -> Option<String> {
    let variables = condition_variables(shared, job, once_per).await;
    let expression = once_per.to_string();
    let evaluated = tokio::task::spawn_blocking(move || {
        let bound: Vec<(&str, _)> = variables
            .iter()
            .map(|(name, value)| (*name, rollouts_analysis::condition::from_json(value)))
            .collect();
        rollouts_analysis::condition::eval_text_over(&bound, &expression)
    })
    .await;
    match evaluated {
        Ok(Ok(value)) => Some(value),
        Ok(Err(error)) => {
            tracing::warn!(namespace = %job.namespace, rollout = %job.name, trigger = %job.trigger, %error, "a trigger's oncePer could not be evaluated; the event is sent as without it");
            None
        }
        Err(_) => None,
    }
}

async fn render(
    shared: &Shared,
    job: &Job,
    templates: &[String],
    destination: &Destination,
) -> Result<Notification, String> {
    let specs = templates
        .iter()
        .map(|name| {
            template(&job.config, name).map(|spec| (name, spec)).ok_or_else(|| {
                format!(
                    "template {name:?} named by trigger {:?} is not in the notification ConfigMap",
                    job.trigger
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let runs = if template::mentions_analysis_runs(specs.iter().map(|(_, spec)| spec)) {
        analysis_runs(&shared.client, &job.namespace, &job.rollout).await
    } else {
        None
    };
    let extra = ExtraVariables {
        service_type: &destination.service,
        secrets: Some(&job.config.secrets),
        analysis_runs: runs.as_ref(),
    };
    let vars = variables_with(&job.rollout, &destination.recipient, &extra);
    let mut notification = Notification::default();
    for (name, spec) in specs {
        spec.render_into(&vars, &mut notification)
            .map_err(|e| format!("template {name:?}: {e}"))?;
    }
    Ok(notification)
}

/// What templates see as `.analysisRuns`, as Argo Rollouts gives it: the Rollout's namespace's
/// AnalysisRuns of its current pod template hash and revision, newest first; `None` when there
/// are none (or they cannot be listed, which is logged).
pub async fn analysis_runs(
    client: &Client,
    namespace: &str,
    rollout: &serde_json::Value,
) -> Option<serde_json::Value> {
    let hash = rollout["status"]["currentPodHash"]
        .as_str()
        .filter(|h| !h.is_empty())?;
    let revision = rollout["metadata"]["annotations"][REVISION_ANNOTATION].as_str();
    let api: Api<AnalysisRun> = Api::namespaced(client.clone(), namespace);
    let selector = format!(
        "{}={hash}",
        rollouts_crds::rollout::DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY
    );
    let listed = match api.list(&ListParams::default().labels(&selector)).await {
        Ok(listed) => listed.items,
        Err(error) => {
            tracing::warn!(%namespace, %error, "the AnalysisRuns a notification template reads could not be listed");
            return None;
        }
    };
    let mut runs: Vec<AnalysisRun> = listed
        .into_iter()
        .filter(|run| {
            run.annotations()
                .get(REVISION_ANNOTATION)
                .map(String::as_str)
                == revision
        })
        .collect();
    if runs.is_empty() {
        return None;
    }
    runs.sort_by_key(|run| std::cmp::Reverse(run.creation_timestamp()));
    serde_json::to_value(runs).ok()
}

async fn send_with_retries(
    shared: &Shared,
    service_name: &str,
    service: &super::Service,
    notification: &Notification,
    recipient: &str,
) -> Result<(), String> {
    let policy = service.retry();
    let mut retry = 0;
    loop {
        let sent =
            services::send(&shared.http, service_name, service, notification, recipient).await;
        match sent {
            Ok(()) => return Ok(()),
            Err(error) if error.is_transient() && retry < policy.max_retries => {
                retry += 1;
                tracing::debug!(service = %service_name, %error, retry, "notification not delivered; trying again");
                tokio::time::sleep(policy.wait(retry)).await;
            }
            Err(error) => return Err(describe(&error, retry)),
        }
    }
}

fn describe(error: &SendError, retries: u32) -> String {
    if retries == 0 {
        error.to_string()
    } else {
        format!("{error} (after {} tries)", retries + 1)
    }
}

/// What was sent, per `namespace/name`, as this process knows it: the Rollout's annotation as
/// reconciles saw it, plus what we sent since (a reconcile's copy may predate our own write).
/// A Rollout not notified for [`LEDGER_TTL`] is forgotten: by then its copies carry our writes,
/// and a deleted Rollout leaves nothing behind.
#[derive(Debug, Default)]
struct SentLedger {
    rollouts: HashMap<String, (BTreeMap<String, i64>, Instant)>,
}

const LEDGER_TTL: Duration = Duration::from_secs(600);

impl SentLedger {
    fn entry(&mut self, key: &str, now: Instant) -> &mut BTreeMap<String, i64> {
        self.rollouts
            .retain(|_, (_, touched)| now.saturating_duration_since(*touched) < LEDGER_TTL);
        let (state, touched) = self
            .rollouts
            .entry(key.to_string())
            .or_insert_with(|| (BTreeMap::new(), now));
        *touched = now;
        state
    }

    /// Whether `state_key` was sent: in `seen` (the reconcile's copy) or by us since.
    fn sent(
        &mut self,
        key: &str,
        seen: &BTreeMap<String, i64>,
        state_key: &str,
        now: Instant,
    ) -> bool {
        let state = self.entry(key, now);
        for (k, v) in seen {
            state.entry(k.clone()).or_insert(*v);
        }
        state.contains_key(state_key)
    }

    /// Records `state_key` sent at `unix_second`; the state to write, the newest 100 kept.
    fn record(
        &mut self,
        key: &str,
        state_key: String,
        unix_second: i64,
        now: Instant,
    ) -> BTreeMap<String, i64> {
        let state = self.entry(key, now);
        state.insert(state_key, unix_second);
        while state.len() > NOTIFIED_HISTORY {
            let oldest = state
                .iter()
                .min_by_key(|(k, sent)| (**sent, (*k).clone()))
                .map(|(k, _)| k.clone());
            match oldest {
                Some(oldest) => state.remove(&oldest),
                None => break,
            };
        }
        state.clone()
    }
}

impl Shared {
    fn ledger(&self) -> std::sync::MutexGuard<'_, SentLedger> {
        self.notified
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether `state_key` was sent: in the reconcile's copy of the annotation or by us since.
    fn already_notified(&self, key: &str, seen: &BTreeMap<String, i64>, state_key: &str) -> bool {
        self.ledger().sent(key, seen, state_key, Instant::now())
    }

    /// Adds `state_key` to the Rollout's annotation (the newest 100 kept).
    async fn record(&self, job: &Job, state_key: String) {
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        let _recording = self.recording.lock().await;
        let state = self
            .ledger()
            .record(&job.key(), state_key, now, Instant::now());
        let value = serde_json::to_string(&state).unwrap_or_default();
        let patch = serde_json::json!({"metadata": {"annotations": {NOTIFIED_ANNOTATION: value}}});
        let api: Api<Rollout> = Api::namespaced(self.client.clone(), &job.namespace);
        if let Err(error) = api
            .patch(&job.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(namespace = %job.namespace, rollout = %job.name, %error, "could not record the notification sent in {NOTIFIED_ANNOTATION}; it may be sent again after a restart");
        }
    }

    /// A `NotificationFailed` warning on the Rollout, sent once for the Rollout version the
    /// event was decided at ([`crate::events`]).
    async fn warn(&self, job: &Job, note: String) {
        let once = crate::events::Once {
            regarding: job.reference.clone(),
            decided_at: job
                .reference
                .resource_version
                .as_deref()
                .unwrap_or_default(),
            warning: true,
            reason: NOTIFICATION_FAILED_REASON,
            note: &note,
            action: &note,
        };
        if let Err(error) = crate::events::send(&self.client, &self.reporter, &once).await {
            tracing::warn!(namespace = %job.namespace, rollout = %job.name, %error, "the notification failure event was not published");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::EventType as PlanEventType;

    fn event(reason: &str, message: &str) -> Event {
        Event {
            type_: PlanEventType::Warning,
            reason: reason.into(),
            message: message.into(),
        }
    }

    #[test]
    fn a_step_event_names_the_index_of_its_step() {
        let step = |message: &str| {
            completed_step_index(&event(
                rollouts_crds::conditions::ROLLOUT_STEP_COMPLETED_REASON,
                message,
            ))
        };
        assert_eq!(step("Rollout step 2/8 completed (setWeight: 20)"), Some(1));
        assert_eq!(step("Rollout step 1/1 completed (pause)"), Some(0));
        assert_eq!(step("something else"), None);
        assert_eq!(
            completed_step_index(&event("RolloutAborted", "Rollout step 2/8 completed")),
            None
        );
    }

    #[test]
    fn a_namespace_is_configured_by_its_own_configmap_and_secret_and_never_the_controllers() {
        let source = ConfigSource {
            namespace: "rollouts-system".into(),
            configmap: "argo-rollouts-notification-configmap".into(),
            secret: "argo-rollouts-notification-secret".into(),
        };
        let configs = NamespacedConfigs::default();
        let mut sources = NamespacedSources::default();
        let data: BTreeMap<String, String> = [(
            "service.webhook.team".to_string(),
            "url: https://hooks.example.com/$path\n".to_string(),
        )]
        .into_iter()
        .collect();
        sources.objects(false).insert("shop".into(), data.clone());
        sources
            .objects(false)
            .insert("rollouts-system".into(), data.clone());
        sources.objects(true).insert(
            "shop".into(),
            [("path".to_string(), "shop-hook".to_string())]
                .into_iter()
                .collect(),
        );
        for namespace in ["shop", "rollouts-system"] {
            sources.reparse(namespace, &source, &configs);
        }
        let Some(shop) = configs.get("shop") else {
            panic!("shop is configured");
        };
        let Some(super::super::Service::Webhook(team)) = shop.services.get("team") else {
            panic!("the team webhook: {:?}", shop.services);
        };
        assert_eq!(team.url.0, "https://hooks.example.com/shop-hook");
        assert!(
            configs.get("rollouts-system").is_none(),
            "the controller's namespace has the controller's configuration"
        );
        sources.objects(false).remove("shop");
        sources.reparse("shop", &source, &configs);
        assert!(
            configs.get("shop").is_none(),
            "no ConfigMap, no configuration"
        );
    }

    #[test]
    fn an_update_event_names_its_revision() {
        let update = |reason: &str, message: &str| {
            updated_revision(&event(reason, message)).map(str::to_string)
        };
        assert_eq!(
            update("RolloutUpdated", "Rollout updated to revision 3").as_deref(),
            Some("3")
        );
        assert_eq!(update("RolloutUpdated", "something else"), None);
        assert_eq!(
            update("RolloutAborted", "Rollout updated to revision 3"),
            None
        );
    }

    #[test]
    fn the_ledger_knows_what_was_seen_or_sent_keeps_the_newest_100_and_forgets_idle_rollouts() {
        let mut ledger = SentLedger::default();
        let start = Instant::now();
        let seen: BTreeMap<String, i64> = [("a".to_string(), 1)].into_iter().collect();
        assert!(ledger.sent("shop/web", &seen, "a", start));
        assert!(!ledger.sent("shop/web", &BTreeMap::new(), "b", start));
        ledger.record("shop/web", "b".into(), 2, start);
        assert!(
            ledger.sent("shop/web", &BTreeMap::new(), "b", start),
            "our own send counts before the annotation is seen"
        );
        for second in 3..200 {
            ledger.record("shop/web", format!("k{second}"), second, start);
        }
        let state = ledger.record("shop/web", "last".into(), 500, start);
        assert_eq!(state.len(), NOTIFIED_HISTORY);
        assert!(!state.contains_key("a") && state.contains_key("last"));
        let later = start + LEDGER_TTL + Duration::from_secs(1);
        assert!(
            !ledger.sent("shop/web", &BTreeMap::new(), "last", later),
            "forgotten once idle; the annotation then says it"
        );
        assert_eq!(ledger.rollouts.len(), 1);
    }

    #[test]
    fn condition_keys_hash_as_argos_engine_does() {
        // sha1("") in base64url: the key Argo's engine gives a condition without `when`.
        assert_eq!(sha1_base64(""), "2jmj7l5rSw0yVb_vlWAYkK_YBwk");
    }

    #[test]
    fn the_same_event_from_the_same_version_has_one_occurrence_and_a_newer_one_another() {
        let mut rollout = Rollout::new("web", Default::default());
        rollout.metadata.resource_version = Some("10".into());
        let aborted = event("RolloutAborted", "Rollout aborted update to revision 2");
        let first = occurrence(&aborted, &rollout);
        assert_eq!(first, occurrence(&aborted, &rollout));
        rollout.metadata.resource_version = Some("17".into());
        assert_ne!(first, occurrence(&aborted, &rollout));
        assert_ne!(
            occurrence(&event("RolloutStepCompleted", "step 1/3"), &rollout),
            occurrence(&event("RolloutStepCompleted", "step 2/3"), &rollout)
        );
    }
}
