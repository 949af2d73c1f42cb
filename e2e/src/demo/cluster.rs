//! What the demo reads to narrate and to decide it is done: the Rollout, its ReplicaSets,
//! AnalysisRuns and events straight from kube-sim's API, and the request rate each version
//! receives from Prometheus. Plain HTTP/1.0 GETs on loopback: nothing here writes.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The namespace the demo's objects live in.
pub const NAMESPACE: &str = "default";
/// How long one read may take before the poll counts as failed.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// GET `path` on `address`: (status code, body).
pub async fn get(address: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let exchange = async {
        let mut stream = TcpStream::connect(address).await?;
        let request =
            format!("GET {path} HTTP/1.0\r\nHost: {address}\r\nAccept: application/json\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut reply = Vec::new();
        stream.read_to_end(&mut reply).await?;
        Ok::<_, std::io::Error>(reply)
    };
    let reply = tokio::time::timeout(READ_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("GET http://{address}{path}: no answer within {READ_TIMEOUT:?}"))?
        .map_err(|e| format!("GET http://{address}{path}: {e}"))?;
    let reply = String::from_utf8_lossy(&reply);
    let (head, body) = reply
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("GET http://{address}{path}: a malformed HTTP reply"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("GET http://{address}{path}: a reply without a status code"))?;
    Ok((code, body.to_string()))
}

async fn get_json(address: SocketAddr, path: &str) -> Result<Value, String> {
    let (code, body) = get(address, path).await?;
    if code != 200 {
        return Err(format!("GET {path}: HTTP {code}: {}", body.trim()));
    }
    serde_json::from_str(&body).map_err(|e| format!("GET {path}: not JSON: {e}"))
}

fn items(list: Value) -> Vec<Value> {
    match list {
        Value::Object(mut list) => match list.remove("items") {
            Some(Value::Array(items)) => items,
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

/// Requests per second one version (pod-template hash) receives.
#[derive(Clone, Debug, PartialEq)]
pub struct VersionTraffic {
    pub hash: String,
    pub rps: f64,
}

/// Everything the narration looks at, read at one moment.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// The Rollout (Value::Null before it exists).
    pub rollout: Value,
    pub replica_sets: Vec<Value>,
    pub analysis_runs: Vec<Value>,
    /// events.k8s.io/v1 Events of the namespace.
    pub events: Vec<Value>,
    /// Request rates by version, when Prometheus answered.
    pub traffic: Option<Vec<VersionTraffic>>,
}

/// The label every ReplicaSet of a Rollout carries with its pod-template hash.
pub const POD_TEMPLATE_HASH_LABEL: &str = "rollouts-pod-template-hash";

fn text<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn number(value: &Value, pointer: &str) -> i64 {
    value
        .pointer(pointer)
        .and_then(Value::as_i64)
        .unwrap_or_default()
}

impl Snapshot {
    pub fn exists(&self) -> bool {
        !self.rollout.is_null()
    }

    /// A string field of the Rollout's status ("" when absent).
    pub fn status(&self, field: &str) -> &str {
        text(&self.rollout, &format!("/status/{field}"))
    }

    pub fn phase(&self) -> &str {
        self.status("phase")
    }

    pub fn current_hash(&self) -> &str {
        self.status("currentPodHash")
    }

    pub fn stable_hash(&self) -> &str {
        self.status("stableRS")
    }

    pub fn aborted(&self) -> bool {
        self.rollout
            .pointer("/status/abort")
            .and_then(Value::as_bool)
            == Some(true)
    }

    pub fn desired_replicas(&self) -> i64 {
        self.rollout
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(1)
    }

    pub fn step_index(&self) -> Option<i64> {
        self.rollout
            .pointer("/status/currentStepIndex")
            .and_then(Value::as_i64)
    }

    pub fn steps(&self) -> &[Value] {
        self.rollout
            .pointer("/spec/strategy/canary/steps")
            .and_then(Value::as_array)
            .map_or(&[], Vec::as_slice)
    }

    /// The canary's weight: what the routers hold (`status.canary.weights`), else, for a canary
    /// without a router (whose status records none, as Argo's), the share of available pods
    /// the current revision has (rounded down), during an update only.
    pub fn canary_weight(&self) -> Option<i64> {
        if let Some(weight) = self
            .rollout
            .pointer("/status/canary/weights/canary/weight")
            .and_then(Value::as_i64)
        {
            return Some(weight);
        }
        let current = self.current_hash();
        if current.is_empty() || current == self.stable_hash() {
            return None;
        }
        let total: i64 = self
            .replica_sets
            .iter()
            .map(|rs| number(rs, "/status/availableReplicas"))
            .sum();
        (total > 0).then(|| self.available(current).saturating_mul(100) / total)
    }

    /// The step analysis the Rollout points at: (run name, status).
    pub fn step_analysis(&self) -> Option<(&str, &str)> {
        let run = self
            .rollout
            .pointer("/status/canary/currentStepAnalysisRunStatus")?;
        Some((text(run, "/name"), text(run, "/status")))
    }

    pub fn replica_set(&self, hash: &str) -> Option<&Value> {
        (!hash.is_empty()).then_some(())?;
        self.replica_sets
            .iter()
            .find(|rs| text(rs, &format!("/metadata/labels/{POD_TEMPLATE_HASH_LABEL}")) == hash)
    }

    /// Available pods of a version (0 when it has no ReplicaSet).
    pub fn available(&self, hash: &str) -> i64 {
        self.replica_set(hash)
            .map_or(0, |rs| number(rs, "/status/availableReplicas"))
    }

    /// Pods a version's ReplicaSet is asked for.
    pub fn wanted(&self, hash: &str) -> i64 {
        self.replica_set(hash)
            .map_or(0, |rs| number(rs, "/spec/replicas"))
    }

    /// A version's name for people: its image tag (`web:2.0.0` -> `2.0.0`), else its hash.
    pub fn version(&self, hash: &str) -> String {
        let image = self
            .replica_set(hash)
            .map(|rs| text(rs, "/spec/template/spec/containers/0/image"))
            .unwrap_or_default();
        match image.rsplit_once(':') {
            Some((_, tag)) if !tag.contains('/') && !tag.is_empty() => tag.to_string(),
            _ if hash.is_empty() => "(none)".to_string(),
            _ => hash.to_string(),
        }
    }

    /// The AnalysisRun with this name, if it exists.
    pub fn analysis_run(&self, name: &str) -> Option<&Value> {
        self.analysis_runs
            .iter()
            .find(|run| text(run, "/metadata/name") == name)
    }

    /// One line on where the Rollout is, for a message after a timeout.
    pub fn summary(&self) -> String {
        if !self.exists() {
            return "the Rollout does not exist".to_string();
        }
        let step = match self.step_index() {
            Some(index) => format!("step {index}/{}", self.steps().len()),
            None => "no step".to_string(),
        };
        let analysis = match self.step_analysis() {
            Some((name, status)) => format!(", step analysis {name} {status}"),
            None => String::new(),
        };
        let message = match self.status("message") {
            "" => String::new(),
            message => format!(", message {message:?}"),
        };
        format!(
            "phase {:?}, {step}, stable {} ({} available), current {} ({} available){analysis}{message}",
            self.phase(),
            self.version(self.stable_hash()),
            self.available(self.stable_hash()),
            self.version(self.current_hash()),
            self.available(self.current_hash()),
        )
    }
}

/// Where the simulated cluster and Prometheus answer, and which Rollout the demo follows.
#[derive(Clone, Debug)]
pub struct Cluster {
    pub api: SocketAddr,
    pub prometheus: SocketAddr,
    pub rollout: String,
    /// The Rollout's pod selector, `key=value` (its ReplicaSets are found by it).
    pub selector: String,
}

impl Cluster {
    pub async fn snapshot(&self) -> Result<Snapshot, String> {
        let rollouts = format!("/apis/argoproj.io/v1alpha1/namespaces/{NAMESPACE}");
        let rollout = match get(self.api, &format!("{rollouts}/rollouts/{}", self.rollout)).await? {
            (200, body) => serde_json::from_str(&body).map_err(|e| format!("the Rollout: {e}"))?,
            (404, _) => Value::Null,
            (code, body) => return Err(format!("GET the Rollout: HTTP {code}: {}", body.trim())),
        };
        let replica_sets = items(
            get_json(
                self.api,
                &format!(
                    "/apis/apps/v1/namespaces/{NAMESPACE}/replicasets?labelSelector={}",
                    percent_encode(&self.selector)
                ),
            )
            .await?,
        );
        let analysis_runs = items(get_json(self.api, &format!("{rollouts}/analysisruns")).await?);
        let events = items(
            get_json(
                self.api,
                &format!("/apis/events.k8s.io/v1/namespaces/{NAMESPACE}/events"),
            )
            .await?,
        );
        Ok(Snapshot {
            rollout,
            replica_sets,
            analysis_runs,
            events,
            traffic: self.traffic().await,
        })
    }

    /// Requests per second by pod-template hash, from the last two scrapes (one second apart).
    async fn traffic(&self) -> Option<Vec<VersionTraffic>> {
        let query = format!(
            "sum by (rollouts_pod_template_hash) (irate(http_requests_total{{namespace=\"{NAMESPACE}\"}}[3s]))"
        );
        let reply = get_json(
            self.prometheus,
            &format!("/api/v1/query?query={}", percent_encode(&query)),
        )
        .await
        .ok()?;
        let result = reply.pointer("/data/result")?.as_array()?;
        let mut traffic: Vec<VersionTraffic> = result
            .iter()
            .filter_map(|series| {
                Some(VersionTraffic {
                    hash: series
                        .pointer("/metric/rollouts_pod_template_hash")?
                        .as_str()?
                        .to_string(),
                    rps: series.pointer("/value/1")?.as_str()?.parse().ok()?,
                })
            })
            .collect();
        traffic.sort_by(|a, b| a.hash.cmp(&b.hash));
        Some(traffic)
    }
}

pub fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selectors_and_queries_are_percent_encoded() {
        assert_eq!(percent_encode("app=web"), "app%3Dweb");
        assert_eq!(percent_encode("rate(x[3s])"), "rate%28x%5B3s%5D%29");
    }

    #[test]
    fn a_list_without_items_is_empty() {
        assert_eq!(items(json!({"kind": "List"})), Vec::<Value>::new());
        assert_eq!(items(json!({"items": [{"a": 1}]})), vec![json!({"a": 1})]);
    }
}
