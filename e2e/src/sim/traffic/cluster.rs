//! What the traffic simulation knows of the cluster: pods (readiness, template hash, simulated
//! error rate and latency), Services (selector, load annotations) and router objects, kept up to
//! date from store events, plus each Service's ready pods.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::{Map, Value};

use super::{
    HEADER_ANNOTATION, HEADER_SHARE_ANNOTATION, RPS_ANNOTATION, SIM_ERROR_RATE, SIM_LATENCY_MS,
    SIM_LATENCY_SPREAD, SIM_SLOW_FACTOR, SIM_SLOW_SHARE, SIM_WARMUP_ERROR_RATE, SIM_WARMUP_SECONDS,
    TRAFFIC_POD_SPREAD_ANNOTATION, TRAFFIC_SEED_ANNOTATION,
};
use crate::sim::meta::{meta_str, parse_rfc3339};
use crate::sim::registry::ResourceKey;
use crate::sim::store::{EventType, ObjectKey, State, WatchEvent};

/// Label Argo Rollouts puts on every pod of a Rollout's ReplicaSet.
pub const POD_TEMPLATE_HASH_LABEL: &str = "rollouts-pod-template-hash";

/// The resources the simulation follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watched {
    Pods,
    Services,
    Ingresses,
    VirtualServices,
    DestinationRules,
    HttpRoutes,
}

impl Watched {
    pub const ALL: [Watched; 6] = [
        Watched::Pods,
        Watched::Services,
        Watched::Ingresses,
        Watched::VirtualServices,
        Watched::DestinationRules,
        Watched::HttpRoutes,
    ];

    pub fn key(self) -> ResourceKey {
        let (group, plural) = match self {
            Watched::Pods => ("", "pods"),
            Watched::Services => ("", "services"),
            Watched::Ingresses => ("networking.k8s.io", "ingresses"),
            Watched::VirtualServices => ("networking.istio.io", "virtualservices"),
            Watched::DestinationRules => ("networking.istio.io", "destinationrules"),
            Watched::HttpRoutes => ("gateway.networking.k8s.io", "httproutes"),
        };
        ResourceKey {
            group: group.into(),
            plural: plural.into(),
        }
    }

    fn of(key: &ResourceKey) -> Option<Watched> {
        Watched::ALL.into_iter().find(|w| w.key() == *key)
    }
}

/// A pod as the load generator and the metrics see it.
#[derive(Debug, Clone, PartialEq)]
pub struct Pod {
    pub labels: Map<String, Value>,
    /// Its `rollouts-pod-template-hash` label ("" when it has none).
    pub template_hash: String,
    pub ready: bool,
    /// Share of requests answered 500 (`SIM_ERROR_RATE` of its first container).
    pub error_rate: f64,
    /// Latency of every request in seconds (`SIM_LATENCY_MS` of its first container); the
    /// median of the log-normal its latencies are drawn from when traffic is noisy.
    pub latency_seconds: f64,
    /// Noisy traffic only: sigma of ln(latency) (`SIM_LATENCY_SPREAD`, default 0.3).
    pub latency_spread: f64,
    /// Noisy traffic only: share of requests in the slow tail (`SIM_SLOW_SHARE`, default 0).
    pub slow_share: f64,
    /// Noisy traffic only: how many times slower a slow request is (`SIM_SLOW_FACTOR`, default 10).
    pub slow_factor: f64,
    /// Until when, and at which error rate, it answers while warming up (`SIM_WARMUP_SECONDS`
    /// after its Ready condition's transition time, at `SIM_WARMUP_ERROR_RATE`).
    pub warm_up: Option<(SystemTime, f64)>,
}

impl Pod {
    /// The share of requests it answers 500 at `now`: the warm-up's rate until the warm-up
    /// ends, then `SIM_ERROR_RATE`.
    pub fn error_rate_at(&self, now: SystemTime) -> f64 {
        match self.warm_up {
            Some((until, rate)) if now < until => rate,
            _ => self.error_rate,
        }
    }
}

/// A Service: which pods it selects and the load it asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Service {
    /// `spec.selector`; None (no selector) selects no pods, as in Kubernetes.
    pub selector: Option<Map<String, Value>>,
    pub load: ServiceLoad,
}

/// The load annotations of a Service.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ServiceLoad {
    /// `sim.rollouts.dev/rps`.
    pub rps: Option<f64>,
    /// `sim.rollouts.dev/header`: (lower-case name, value).
    pub header: Option<(String, String)>,
    /// `sim.rollouts.dev/header-share`: the share of requests carrying the header.
    pub header_share: f64,
    /// `sim.rollouts.dev/traffic-seed`: noisy traffic from this seed.
    pub noise_seed: Option<u64>,
    /// `sim.rollouts.dev/traffic-pod-spread`: the pod factors' sigma for that noise.
    pub noise_pod_spread: Option<f64>,
}

/// What changed with one event, so the caller knows what to recompute.
#[derive(Debug, Default, PartialEq)]
pub struct Changed {
    /// A Service or router object changed: the fronts must be rebuilt.
    pub topology: bool,
    /// A pod came, went or changed template hash: metrics series and the file_sd file follow.
    pub pod_set: bool,
}

/// The followed objects, by resource and (namespace, name).
#[derive(Default)]
pub struct Cluster {
    pub pods: BTreeMap<ObjectKey, Pod>,
    pub services: BTreeMap<ObjectKey, Service>,
    pub routers: BTreeMap<(RouterKind, ObjectKey), Arc<Value>>,
    /// (namespace, service) -> its ready pods' names, computed on demand.
    endpoints: BTreeMap<ObjectKey, Vec<String>>,
    /// Namespaces whose pods or Services changed since their `endpoints` were computed.
    stale_namespaces: BTreeSet<String>,
}

/// Router objects kept as JSON: the fronts are built from them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RouterKind {
    Ingress,
    VirtualService,
    DestinationRule,
    HttpRoute,
}

impl Cluster {
    /// Everything the store holds now.
    pub fn from_state(state: &State) -> Self {
        let mut cluster = Cluster::default();
        for watched in Watched::ALL {
            for (_, obj) in state.list(&watched.key(), None, None) {
                cluster.apply(watched, EventType::Added, obj);
            }
        }
        cluster
    }

    /// Folds in one store event; events of other resources change nothing.
    pub fn apply_event(&mut self, event: &WatchEvent) -> Changed {
        match Watched::of(&event.resource) {
            Some(watched) => self.apply(watched, event.event_type, &event.object),
            None => Changed::default(),
        }
    }

    fn apply(&mut self, watched: Watched, event_type: EventType, obj: &Arc<Value>) -> Changed {
        let key = (
            meta_str(obj, "namespace").to_string(),
            meta_str(obj, "name").to_string(),
        );
        let deleted = event_type == EventType::Deleted;
        match watched {
            Watched::Pods => {
                let old = if deleted {
                    self.pods.remove(&key)
                } else {
                    self.pods.insert(key.clone(), pod_of(obj, &key))
                };
                let new = self.pods.get(&key);
                let pod_set =
                    old.as_ref().map(|p| &p.template_hash) != new.map(|p| &p.template_hash);
                let routing_changed = match (&old, new) {
                    (Some(a), Some(b)) => a.ready != b.ready || a.labels != b.labels,
                    _ => true,
                };
                if routing_changed {
                    self.stale_namespaces.insert(key.0);
                }
                Changed {
                    topology: false,
                    pod_set,
                }
            }
            Watched::Services => {
                let changed = if deleted {
                    self.services.remove(&key).is_some()
                } else {
                    let service = service_of(obj, &key);
                    self.services.insert(key.clone(), service.clone()) != Some(service)
                };
                if changed {
                    self.stale_namespaces.insert(key.0);
                }
                Changed {
                    topology: changed,
                    pod_set: false,
                }
            }
            Watched::Ingresses
            | Watched::VirtualServices
            | Watched::DestinationRules
            | Watched::HttpRoutes => {
                let kind = match watched {
                    Watched::Ingresses => RouterKind::Ingress,
                    Watched::VirtualServices => RouterKind::VirtualService,
                    Watched::DestinationRules => RouterKind::DestinationRule,
                    _ => RouterKind::HttpRoute,
                };
                if deleted {
                    self.routers.remove(&(kind, key));
                } else {
                    self.routers.insert((kind, key), obj.clone());
                }
                Changed {
                    topology: true,
                    pod_set: false,
                }
            }
        }
    }

    /// Router objects of one kind, in (namespace, name) order.
    pub fn routers_of(&self, kind: RouterKind) -> impl Iterator<Item = (&ObjectKey, &Value)> {
        self.routers
            .range((kind, (String::new(), String::new()))..)
            .take_while(move |((k, _), _)| *k == kind)
            .map(|((_, key), obj)| (key, obj.as_ref()))
    }

    /// The ready pods a Service sends traffic to, narrowed to those carrying `subset` labels.
    /// Computed when first asked for and kept until a pod or Service of its namespace changes,
    /// so a cluster with no load does no work here.
    pub fn ready_pods(
        &mut self,
        service: &ObjectKey,
        subset: Option<&Map<String, Value>>,
    ) -> Vec<String> {
        if self.stale_namespaces.remove(&service.0) {
            self.endpoints.retain(|key, _| key.0 != service.0);
        }
        if !self.endpoints.contains_key(service) {
            let selected = self.services.get(service).and_then(|s| s.selector.as_ref());
            let ready = match selected {
                None => Vec::new(),
                Some(selector) => self
                    .pods
                    .range((service.0.clone(), String::new())..)
                    .take_while(|(k, _)| k.0 == service.0)
                    .filter(|(_, pod)| pod.ready && labels_match(selector, &pod.labels))
                    .map(|(k, _)| k.1.clone())
                    .collect(),
            };
            self.endpoints.insert(service.clone(), ready);
        }
        let all = self.endpoints.get(service).into_iter().flatten();
        match subset {
            None => all.cloned().collect(),
            Some(labels) => all
                .filter(|name| {
                    self.pods
                        .get(&(service.0.clone(), (*name).clone()))
                        .is_some_and(|pod| labels_match(labels, &pod.labels))
                })
                .cloned()
                .collect(),
        }
    }
}

/// Every `selector` label is on the pod with the same value.
pub fn labels_match(selector: &Map<String, Value>, labels: &Map<String, Value>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn pod_of(obj: &Value, key: &ObjectKey) -> Pod {
    let labels = obj["metadata"]["labels"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let template_hash = labels
        .get(POD_TEMPLATE_HASH_LABEL)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let deleting = obj["metadata"]
        .get("deletionTimestamp")
        .is_some_and(|t| !t.is_null());
    let ready = !deleting
        && obj["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
    let env = |name: &str| {
        obj["spec"]["containers"][0]["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == name)
            .and_then(|e| e["value"].as_str())
            .map(str::trim)
    };
    let error_rate = env(SIM_ERROR_RATE).map_or(0.0, |v| match v.parse::<f64>() {
        Ok(rate) if (0.0..=1.0).contains(&rate) => rate,
        _ => {
            eprintln!(
                "kube-sim: pod {}/{}: env {SIM_ERROR_RATE}={v:?} of its first container is not a number between 0 and 1; \
                 treating it as 0 (set e.g. \"0.5\")",
                key.0, key.1
            );
            0.0
        }
    });
    let warm_up_seconds = env(SIM_WARMUP_SECONDS).and_then(|v| match v.parse::<f64>() {
        Ok(seconds) if seconds >= 0.0 && seconds.is_finite() => Some(seconds),
        _ => {
            eprintln!(
                "kube-sim: pod {}/{}: env {SIM_WARMUP_SECONDS}={v:?} of its first container is not a non-negative number of seconds; \
                 ignoring the warm-up (set e.g. \"10\")",
                key.0, key.1
            );
            None
        }
    });
    let warm_up_rate = env(SIM_WARMUP_ERROR_RATE).map_or(error_rate, |v| match v.parse::<f64>() {
        Ok(rate) if (0.0..=1.0).contains(&rate) => rate,
        _ => {
            eprintln!(
                "kube-sim: pod {}/{}: env {SIM_WARMUP_ERROR_RATE}={v:?} of its first container is not a number between 0 and 1; \
                 using {SIM_ERROR_RATE} during the warm-up (set e.g. \"0.5\")",
                key.0, key.1
            );
            error_rate
        }
    });
    let ready_since = obj["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready" && c["status"] == "True")
        .and_then(|c| parse_rfc3339(c["lastTransitionTime"].as_str()?));
    // A warm-up too long for the clock to add is one that never ends.
    let warm_up = match (ready_since, warm_up_seconds) {
        (Some(since), Some(seconds)) => Some((
            Duration::try_from_secs_f64(seconds)
                .ok()
                .and_then(|d| since.checked_add(d))
                .unwrap_or(since + Duration::from_secs(100 * 365 * 86_400)),
            warm_up_rate,
        )),
        _ => None,
    };
    let latency_seconds = env(SIM_LATENCY_MS).map_or(0.0, |v| match v.parse::<f64>() {
        Ok(ms) if ms >= 0.0 && ms.is_finite() => ms / 1000.0,
        _ => {
            eprintln!(
                "kube-sim: pod {}/{}: env {SIM_LATENCY_MS}={v:?} of its first container is not a non-negative number of milliseconds; \
                 treating it as 0 (set e.g. \"120\")",
                key.0, key.1
            );
            0.0
        }
    });
    let number = |name: &str, default: f64, valid: fn(f64) -> bool, example: &str| {
        env(name).map_or(default, |v| match v.parse::<f64>() {
            Ok(n) if valid(n) => n,
            _ => {
                eprintln!(
                    "kube-sim: pod {}/{}: env {name}={v:?} of its first container is not valid; \
                     using {default} (set e.g. \"{example}\")",
                    key.0, key.1
                );
                default
            }
        })
    };
    let latency_spread = number(
        SIM_LATENCY_SPREAD,
        0.3,
        |n| n >= 0.0 && n.is_finite(),
        "0.3",
    );
    let slow_share = number(SIM_SLOW_SHARE, 0.0, |n| (0.0..=1.0).contains(&n), "0.01");
    let slow_factor = number(SIM_SLOW_FACTOR, 10.0, |n| n >= 1.0 && n.is_finite(), "10");
    Pod {
        labels,
        template_hash,
        ready,
        error_rate,
        latency_seconds,
        latency_spread,
        slow_share,
        slow_factor,
        warm_up,
    }
}

fn service_of(obj: &Value, key: &ObjectKey) -> Service {
    let annotations = &obj["metadata"]["annotations"];
    let annotation = |name: &str| annotations[name].as_str().map(str::trim);
    let warn = |name: &str, value: &str, fix: &str| {
        eprintln!(
            "kube-sim: service {}/{}: annotation {name}={value:?} is not valid and is ignored ({fix})",
            key.0, key.1
        );
    };
    let rps = annotation(RPS_ANNOTATION).and_then(|v| match v.parse::<f64>() {
        Ok(rps) if rps >= 0.0 && rps.is_finite() => Some(rps),
        _ => {
            warn(RPS_ANNOTATION, v, "give requests per second, e.g. \"50\"");
            None
        }
    });
    let header = annotation(HEADER_ANNOTATION).and_then(|v| match v.split_once(':') {
        Some((name, value)) if !name.trim().is_empty() => {
            Some((name.trim().to_ascii_lowercase(), value.trim().to_string()))
        }
        _ => {
            warn(
                HEADER_ANNOTATION,
                v,
                "write \"Name: value\", e.g. \"X-Canary: always\"",
            );
            None
        }
    });
    let header_share =
        annotation(HEADER_SHARE_ANNOTATION).map_or(1.0, |v| match v.parse::<f64>() {
            Ok(share) if (0.0..=1.0).contains(&share) => share,
            _ => {
                warn(
                    HEADER_SHARE_ANNOTATION,
                    v,
                    "give a share between 0 and 1, e.g. \"0.1\"",
                );
                1.0
            }
        });
    let noise_seed = annotation(TRAFFIC_SEED_ANNOTATION).and_then(|v| match v.parse::<u64>() {
        Ok(seed) => Some(seed),
        _ => {
            warn(
                TRAFFIC_SEED_ANNOTATION,
                v,
                "give a non-negative whole number, e.g. \"7\"",
            );
            None
        }
    });
    let noise_pod_spread =
        annotation(TRAFFIC_POD_SPREAD_ANNOTATION).and_then(|v| match v.parse::<f64>() {
            Ok(spread) if spread >= 0.0 && spread.is_finite() => Some(spread),
            _ => {
                warn(
                    TRAFFIC_POD_SPREAD_ANNOTATION,
                    v,
                    "give a non-negative sigma, e.g. \"0.1\"",
                );
                None
            }
        });
    Service {
        selector: obj["spec"]["selector"]
            .as_object()
            .filter(|s| !s.is_empty())
            .cloned(),
        load: ServiceLoad {
            rps,
            header,
            header_share,
            noise_seed,
            noise_pod_spread,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ready_pod(env: Value, ready_at: &str) -> Pod {
        let obj = json!({
            "metadata": {"namespace": "ns", "name": "web-1", "labels": {POD_TEMPLATE_HASH_LABEL: "abc"}},
            "spec": {"containers": [{"name": "app", "env": env}]},
            "status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": ready_at}]},
        });
        pod_of(&obj, &("ns".into(), "web-1".into()))
    }

    #[test]
    fn a_warming_up_pod_errs_at_its_warm_up_rate_until_the_warm_up_ends() {
        let pod = ready_pod(
            json!([
                {"name": SIM_ERROR_RATE, "value": "0.01"},
                {"name": SIM_WARMUP_SECONDS, "value": "8"},
                {"name": SIM_WARMUP_ERROR_RATE, "value": "0.5"},
            ]),
            "2026-01-01T00:00:10Z",
        );
        let ready = parse_rfc3339("2026-01-01T00:00:10Z").expect("a timestamp");
        assert_eq!(pod.error_rate_at(ready + Duration::from_secs(1)), 0.5);
        assert_eq!(pod.error_rate_at(ready + Duration::from_millis(7_900)), 0.5);
        assert_eq!(pod.error_rate_at(ready + Duration::from_secs(8)), 0.01);
        assert_eq!(pod.error_rate_at(ready + Duration::from_secs(60)), 0.01);
    }

    #[test]
    fn without_a_warm_up_the_error_rate_never_changes() {
        let at = parse_rfc3339("2026-01-01T00:00:10Z").expect("a timestamp");
        let plain = ready_pod(
            json!([{"name": SIM_ERROR_RATE, "value": "0.2"}]),
            "2026-01-01T00:00:10Z",
        );
        assert_eq!(plain.warm_up, None);
        assert_eq!(plain.error_rate_at(at), 0.2);
        // A warm-up without its own rate keeps SIM_ERROR_RATE; a bad value is ignored.
        let same_rate = ready_pod(
            json!([{"name": SIM_ERROR_RATE, "value": "0.2"}, {"name": SIM_WARMUP_SECONDS, "value": "5"}]),
            "2026-01-01T00:00:10Z",
        );
        assert_eq!(same_rate.error_rate_at(at), 0.2);
        let bad = ready_pod(
            json!([{"name": SIM_WARMUP_SECONDS, "value": "soon"}, {"name": SIM_WARMUP_ERROR_RATE, "value": "1"}]),
            "2026-01-01T00:00:10Z",
        );
        assert_eq!(bad.warm_up, None);
        let endless = ready_pod(
            json!([{"name": SIM_WARMUP_SECONDS, "value": "1e300"}, {"name": SIM_WARMUP_ERROR_RATE, "value": "1"}]),
            "2026-01-01T00:00:10Z",
        );
        assert_eq!(endless.error_rate_at(at + Duration::from_secs(86_400)), 1.0);
    }

    #[test]
    fn an_unready_pod_has_not_started_its_warm_up() {
        let obj = json!({
            "metadata": {"namespace": "ns", "name": "web-1"},
            "spec": {"containers": [{"name": "app", "env": [
                {"name": SIM_WARMUP_SECONDS, "value": "8"},
                {"name": SIM_WARMUP_ERROR_RATE, "value": "0.5"},
            ]}]},
            "status": {"conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": "2026-01-01T00:00:10Z"}]},
        });
        let pod = pod_of(&obj, &("ns".into(), "web-1".into()));
        assert!(!pod.ready);
        assert_eq!(pod.warm_up, None);
    }
}
