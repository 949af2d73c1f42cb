//! The simulated cluster: what kube-controller-manager and the kubelets would do, reacting to
//! store events (not polling) and writing through the same store so watches see every change.
//! Jobs run for a while and complete (or fail). Garbage collection of dependents happens in
//! the store itself, at deletion time.

mod deployment;
mod job;
mod kubelet;
mod replicaset;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{broadcast, mpsc};

use super::meta::{meta_str, owner_refs};
use super::registry::ResourceKey;
use super::server::Sim;
use super::store::{EventType, State, WatchEvent};

pub use job::{FAILS_ANNOTATION, RUN_FOR_ANNOTATION};
pub use kubelet::{
    CRASH_LOOP_ANNOTATION, NEVER_READY_ANNOTATION, PodReadiness, READY_AFTER_ANNOTATION,
};

/// One unit of work, keyed by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Work {
    Deployment(String, String),
    ReplicaSet(String, String),
    /// A new pod to start (schedule its readiness).
    PodCreated(String, String),
    /// A Job to start.
    Job(String, String),
    /// A Job whose run time has passed: the uid guards against a recreated namesake.
    JobFinished(String, String, String),
    /// A pod whose start-up delay has passed: the uid guards against a recreated namesake.
    PodStarted(String, String, String),
}

/// Settings of the simulated cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// How long a pod takes to become Ready unless its template says otherwise.
    pub pod_ready_after: Duration,
    /// Per-pod random readiness instead of `pod_ready_after`.
    pub pod_readiness: Option<kubelet::PodReadiness>,
}

/// Hands work back to the loop after a delay (pod start-up, minReadySeconds).
#[derive(Clone)]
pub struct Scheduler {
    tx: mpsc::UnboundedSender<Work>,
}

impl Scheduler {
    pub fn after(&self, delay: Duration, work: Work) {
        let tx = self.tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            // The loop has stopped when the server shuts down: nothing left to do.
            let _ = tx.send(work);
        });
    }
}

fn apps(plural: &str) -> ResourceKey {
    ResourceKey {
        group: "apps".into(),
        plural: plural.into(),
    }
}

fn pods() -> ResourceKey {
    ResourceKey {
        group: String::new(),
        plural: "pods".into(),
    }
}

/// Work that a store event causes.
fn work_for(event: &WatchEvent, queue: &mut BTreeSet<Work>, kubelet: &mut kubelet::Kubelet) {
    if event.event_type == EventType::Deleted && event.resource == pods() {
        kubelet.forget(meta_str(&event.object, "uid"));
    }
    let obj = &event.object;
    let (ns, name) = (
        meta_str(obj, "namespace").to_string(),
        meta_str(obj, "name").to_string(),
    );
    let owner = |kind: &str| {
        owner_refs(obj)
            .iter()
            .find(|r| r["controller"].as_bool() == Some(true) && r["kind"] == kind)
            .and_then(|r| r["name"].as_str())
            .map(str::to_string)
    };
    if event.resource == apps("deployments") {
        queue.insert(Work::Deployment(ns, name));
    } else if event.resource == apps("replicasets") {
        if let Some(d) = owner("Deployment") {
            queue.insert(Work::Deployment(ns.clone(), d));
        }
        queue.insert(Work::ReplicaSet(ns, name));
    } else if event.resource == job::jobs() {
        queue.insert(Work::Job(ns, name));
    } else if event.resource == pods() {
        if let Some(rs) = owner("ReplicaSet") {
            queue.insert(Work::ReplicaSet(ns.clone(), rs));
        }
        if event.event_type == EventType::Added {
            queue.insert(Work::PodCreated(ns, name));
        }
    }
}

/// Everything already stored at start-up, as if just created.
fn resync(state: &State, queue: &mut BTreeSet<Work>) {
    let keyed = |obj: &Value| {
        (
            meta_str(obj, "namespace").to_string(),
            meta_str(obj, "name").to_string(),
        )
    };
    for (_, d) in state.list(&apps("deployments"), None, None) {
        let (ns, name) = keyed(d);
        queue.insert(Work::Deployment(ns, name));
    }
    for (_, rs) in state.list(&apps("replicasets"), None, None) {
        let (ns, name) = keyed(rs);
        queue.insert(Work::ReplicaSet(ns, name));
    }
    for (_, j) in state.list(&job::jobs(), None, None) {
        let (ns, name) = keyed(j);
        queue.insert(Work::Job(ns, name));
    }
    for (_, pod) in state.list(&pods(), None, None) {
        let (ns, name) = keyed(pod);
        queue.insert(Work::PodCreated(ns, name));
    }
}

/// Runs the simulated controllers until shutdown.
pub async fn run(sim: Arc<Sim>, config: ClusterConfig) {
    let (tx, mut delayed) = mpsc::unbounded_channel();
    let scheduler = Scheduler { tx };
    let mut queue = BTreeSet::new();
    let mut events = {
        let state = sim.store.lock();
        resync(&state, &mut queue);
        sim.store.subscribe()
    };
    let mut kubelet = kubelet::Kubelet::new(config.pod_ready_after, config.pod_readiness.clone());
    let mut shutdown = sim.shutdown.clone();
    loop {
        while let Some(work) = queue.pop_first() {
            {
                let mut state = sim.store.lock();
                match &work {
                    Work::Deployment(ns, name) => deployment::reconcile(&mut state, ns, name),
                    Work::ReplicaSet(ns, name) => {
                        replicaset::reconcile(&mut state, ns, name, &scheduler)
                    }
                    Work::Job(ns, name) => {
                        job::reconcile(&mut state, ns, name, config.pod_ready_after, &scheduler)
                    }
                    Work::JobFinished(ns, name, uid) => job::finish(&mut state, ns, name, uid),
                    Work::PodCreated(ns, name) => kubelet.pod_created(&state, ns, name, &scheduler),
                    Work::PodStarted(ns, name, uid) => {
                        kubelet.pod_started(&mut state, ns, name, uid, &scheduler)
                    }
                }
            }
            // A storm of work must not starve the HTTP server on the same runtime.
            tokio::task::yield_now().await;
            // Fold in what that write caused before taking the next item.
            loop {
                match events.try_recv() {
                    Ok(event) => work_for(&event, &mut queue, &mut kubelet),
                    Err(broadcast::error::TryRecvError::Lagged(_)) => {
                        resync(&sim.store.lock(), &mut queue)
                    }
                    Err(_) => break,
                }
            }
        }
        tokio::select! {
            received = events.recv() => match received {
                Ok(event) => work_for(&event, &mut queue, &mut kubelet),
                Err(broadcast::error::RecvError::Lagged(_)) => resync(&sim.store.lock(), &mut queue),
                Err(broadcast::error::RecvError::Closed) => return,
            },
            Some(work) = delayed.recv() => {
                queue.insert(work);
            }
            _ = shutdown.changed() => return,
        }
    }
}
