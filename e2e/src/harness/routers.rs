//! What routed scenarios read back: the canary weight and header routes the router object
//! (nginx canary Ingress, Istio VirtualService, Gateway API HTTPRoute) carries, and the share of
//! requests each revision's pods really received, from Prometheus, over a window that starts
//! after a given moment.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use super::{BaseUrl, Scenario};

/// The Service the Rollout's stable pods are reached through (the routers' stable backend).
pub const STABLE_SERVICE: &str = "web-stable";
/// The Service the Rollout's canary pods are reached through.
pub const CANARY_SERVICE: &str = "web-canary";
/// The nginx canary Ingress the controller clones from the stable Ingress `web` of Rollout `web`.
const CANARY_INGRESS: &str = "web-web-canary";
/// The Istio VirtualService and the Gateway API HTTPRoute of the routed scenarios.
const ROUTE_OBJECT: &str = "web";
/// The VirtualService's route whose weights the controller sets.
const PRIMARY_ROUTE: &str = "primary";
const NGINX_WEIGHT_ANNOTATION: &str = "nginx.ingress.kubernetes.io/canary-weight";

/// A traffic router a scenario routes its canary through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Router {
    Nginx,
    Istio,
    GatewayApi,
}

impl Router {
    /// `kubectl get` resource and name of the object holding the canary's weight.
    pub fn weight_object(self) -> (&'static str, &'static str) {
        match self {
            Router::Nginx => ("ingresses.networking.k8s.io", CANARY_INGRESS),
            Router::Istio => ("virtualservices.networking.istio.io", ROUTE_OBJECT),
            Router::GatewayApi => ("httproutes.gateway.networking.k8s.io", ROUTE_OBJECT),
        }
    }

    /// The canary's weight as the router object holds it; None while it holds none.
    pub fn canary_weight(self, object: &Value) -> Option<i64> {
        match self {
            Router::Nginx => object["metadata"]["annotations"][NGINX_WEIGHT_ANNOTATION]
                .as_str()?
                .parse()
                .ok(),
            Router::Istio => object["spec"]["http"]
                .as_array()?
                .iter()
                .find(|route| route["name"] == PRIMARY_ROUTE)?["route"]
                .as_array()?
                .iter()
                .find(|d| d["destination"]["host"] == CANARY_SERVICE)
                // Istio reads an absent weight of a destination among several as 0.
                .map(|d| d["weight"].as_i64().unwrap_or(0)),
            Router::GatewayApi => object["spec"]["rules"]
                .as_array()?
                .iter()
                .filter(|rule| {
                    rule["matches"]
                        .as_array()
                        .is_none_or(|m| m.iter().all(no_headers))
                })
                .flat_map(|rule| rule["backendRefs"].as_array().into_iter().flatten())
                .find(|b| b["name"] == CANARY_SERVICE)
                // The Gateway API's default weight is 1.
                .map(|b| b["weight"].as_i64().unwrap_or(1)),
        }
    }

    /// The header route named `name` the router object carries: the header it matches on
    /// (lower-case) and the Service it sends matching requests to. Istio and Gateway API only.
    pub fn header_route(self, object: &Value, name: &str) -> Option<(String, String)> {
        match self {
            Router::Nginx => None,
            Router::Istio => {
                let route = object["spec"]["http"]
                    .as_array()?
                    .iter()
                    .find(|route| route["name"] == name)?;
                let header = route["match"][0]["headers"].as_object()?.keys().next()?;
                let host = route["route"][0]["destination"]["host"].as_str()?;
                Some((header.to_ascii_lowercase(), host.to_string()))
            }
            Router::GatewayApi => {
                let rule = object["spec"]["rules"]
                    .as_array()?
                    .iter()
                    .find(|rule| rule["name"] == name)?;
                let header = rule["matches"][0]["headers"][0]["name"].as_str()?;
                let service = rule["backendRefs"][0]["name"].as_str()?;
                Some((header.to_ascii_lowercase(), service.to_string()))
            }
        }
    }
}

fn no_headers(m: &Value) -> bool {
    m["headers"].as_array().is_none_or(Vec::is_empty)
}

/// The router object holding the canary's weight, as kubectl reads it now.
pub fn router_object(s: &Scenario, router: Router) -> Result<Value, String> {
    let (resource, name) = router.weight_object();
    s.kubectl().get_json(&[resource, name])
}

/// The canary's weight in the router object now; None while there is none (or no object).
pub fn router_weight(s: &Scenario, router: Router) -> Option<i64> {
    router.canary_weight(&router_object(s, router).ok()?)
}

/// `status.canary.weights` of the Rollout: the canary's weight and whether the router
/// confirmed it.
pub fn recorded_weight(rollout: &Value) -> Option<(i64, bool)> {
    let weights = &rollout["status"]["canary"]["weights"];
    Some((
        weights["canary"]["weight"].as_i64()?,
        weights["verified"].as_bool().unwrap_or(false),
    ))
}

/// Requests per second each revision's pods received after `since`, by pod template hash:
/// each pod series' increase between its first and last sample scraped after `since`, over
/// the time between them. Read from the raw samples, because `rate()` extrapolates a young
/// series (a canary pod started moments ago) well past what it received.
pub fn requests_by_hash_since(
    s: &Scenario,
    since: SystemTime,
) -> Result<BTreeMap<String, f64>, String> {
    let since = unix_seconds(since);
    let lookback = (unix_seconds(SystemTime::now()) - since).ceil() as u64 + 1;
    let prometheus = BaseUrl::parse(s.prometheus_address())?;
    let result = prometheus.query(&format!("http_requests_total[{lookback}s]"))?;
    Ok(rates_by_hash(&result, since))
}

/// Summed per-series rates, by pod template hash, of a range query's matrix, counting only
/// the samples taken after `since` (unix seconds).
fn rates_by_hash(matrix: &Value, since: f64) -> BTreeMap<String, f64> {
    let mut rates = BTreeMap::new();
    for series in matrix.as_array().into_iter().flatten() {
        let Some(hash) = series["metric"]["rollouts_pod_template_hash"].as_str() else {
            continue;
        };
        let samples: Vec<(f64, f64)> = series["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| Some((v[0].as_f64()?, v[1].as_str()?.parse().ok()?)))
            .filter(|(at, _)| *at > since)
            .collect();
        let (Some((first_at, first)), Some((last_at, last))) = (samples.first(), samples.last())
        else {
            continue;
        };
        if last_at > first_at {
            *rates.entry(hash.to_string()).or_insert(0.0) += (last - first) / (last_at - first_at);
        }
    }
    rates
}

/// Each revision's share (0..1) of the requests routed after `since`, over `window`. On
/// kube-sim, exactly: every pod's counters are read at one instant now and again `window`
/// later, so the shares are the requests really delivered in between, whatever the machine's
/// load (Prometheus scrapes each pod at its own moment, and a stalled load generator catching
/// up between two scrapes of one pod but not of another skews per-series rates by several
/// percent). On a real cluster, from Prometheus once every scraped pod series holds samples
/// spanning at least `window` after `since`, failing the scenario at `deadline`. Fails the
/// scenario when no request was seen at all.
pub fn traffic_shares_since(
    s: &Scenario,
    since: SystemTime,
    window: Duration,
    deadline: Duration,
) -> BTreeMap<String, f64> {
    if let Some(metrics) = s.sim_metrics() {
        let counts = || {
            sim_requests_by_hash(metrics).unwrap_or_else(|e| panic!("scenario {}: {e}", s.name()))
        };
        let before = counts();
        // The measurement window itself: the counters are compared across it.
        std::thread::sleep(window);
        let after = counts();
        let delivered: BTreeMap<String, f64> = after
            .into_iter()
            .map(|(hash, count)| {
                let earlier = before.get(&hash).copied().unwrap_or(0);
                (hash, count.saturating_sub(earlier) as f64)
            })
            .filter(|(_, count)| *count > 0.0)
            .collect();
        return shares(s, delivered);
    }
    // The first sample after `since` comes at most one scrape later.
    let needed = unix_seconds(since) + window.as_secs_f64() + SCRAPE_INTERVAL.as_secs_f64();
    let prometheus = BaseUrl::parse(s.prometheus_address())
        .unwrap_or_else(|e| panic!("scenario {}: {e}", s.name()));
    let then = s.then();
    then.eventually(
        &format!("Prometheus to hold {window:?} of requests routed after the change"),
        deadline,
        |_| {
            let oldest_latest = prometheus
                .values("min(timestamp(http_requests_total))")
                .ok()?
                .first()
                .copied()?;
            (oldest_latest >= needed).then_some(())
        },
    );
    let rates =
        requests_by_hash_since(s, since).unwrap_or_else(|e| panic!("scenario {}: {e}", s.name()));
    shares(s, rates)
}

/// Each hash's share of `amounts`; fails the scenario when there is nothing to share.
fn shares(s: &Scenario, amounts: BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    let total: f64 = amounts.values().sum();
    s.then().holds(total > 0.0, || {
        format!("no requests at all reached the pods after the change: {amounts:?}")
    });
    amounts
        .into_iter()
        .map(|(hash, amount)| (hash, amount / total))
        .collect()
}

/// Requests every simulated pod has received so far, summed by pod template hash, from
/// kube-sim's `/metrics` (one consistent snapshot of every pod's counters).
fn sim_requests_by_hash(metrics: &str) -> Result<BTreeMap<String, u64>, String> {
    let (status, body) = super::http::get(metrics, "/metrics")?;
    if status != 200 {
        return Err(format!("GET http://{metrics}/metrics answered {status}"));
    }
    Ok(requests_by_hash_in(&body))
}

/// `http_requests_total` of a Prometheus text exposition, summed by its
/// `rollouts_pod_template_hash` label.
fn requests_by_hash_in(text: &str) -> BTreeMap<String, u64> {
    const HASH_LABEL: &str = "rollouts_pod_template_hash=\"";
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("http_requests_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let Some(hash) = labels
            .split_once(HASH_LABEL)
            .and_then(|(_, tail)| tail.split_once('"'))
            .map(|(hash, _)| hash)
        else {
            continue;
        };
        if let Ok(count) = value.trim().parse::<u64>() {
            *counts.entry(hash.to_string()).or_insert(0) += count;
        }
    }
    counts
}

fn unix_seconds(at: SystemTime) -> f64 {
    at.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// How often the scenarios' Prometheus scrapes the simulated pods.
const SCRAPE_INTERVAL: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sim_counters_are_summed_by_hash_over_codes_and_pods() {
        let text = "# TYPE http_requests_total counter\n\
            http_requests_total{namespace=\"default\",pod=\"a-1\",rollouts_pod_template_hash=\"a\",code=\"200\"} 7\n\
            http_requests_total{namespace=\"default\",pod=\"a-1\",rollouts_pod_template_hash=\"a\",code=\"500\"} 3\n\
            http_requests_total{namespace=\"default\",pod=\"a-2\",rollouts_pod_template_hash=\"a\",code=\"200\"} 5\n\
            http_requests_total{namespace=\"default\",pod=\"b-1\",rollouts_pod_template_hash=\"b\",code=\"200\"} 4\n\
            http_request_duration_seconds_count{namespace=\"default\",pod=\"b-1\",rollouts_pod_template_hash=\"b\"} 4\n";
        let counts = requests_by_hash_in(text);
        assert_eq!(
            counts,
            BTreeMap::from([("a".to_string(), 15), ("b".to_string(), 4)])
        );
    }

    #[test]
    fn each_router_object_gives_the_canary_weight() {
        let ingress = json!({"metadata": {"annotations": {NGINX_WEIGHT_ANNOTATION: "20"}}});
        assert_eq!(Router::Nginx.canary_weight(&ingress), Some(20));
        assert_eq!(Router::Nginx.canary_weight(&json!({"metadata": {}})), None);

        let vs = json!({"spec": {"http": [
            {"name": "canary-header", "match": [{"headers": {"x-canary": {"exact": "always"}}}],
             "route": [{"destination": {"host": CANARY_SERVICE}}]},
            {"name": PRIMARY_ROUTE, "route": [
                {"destination": {"host": STABLE_SERVICE}, "weight": 50},
                {"destination": {"host": CANARY_SERVICE}, "weight": 50}]},
        ]}});
        assert_eq!(Router::Istio.canary_weight(&vs), Some(50));
        assert_eq!(
            Router::Istio.header_route(&vs, "canary-header"),
            Some(("x-canary".into(), CANARY_SERVICE.into()))
        );
        assert_eq!(Router::Istio.header_route(&vs, "absent"), None);

        let route = json!({"spec": {"rules": [
            {"name": "canary-header",
             "matches": [{"headers": [{"name": "X-Canary", "value": "always"}]}],
             "backendRefs": [{"name": CANARY_SERVICE, "port": 80}]},
            {"backendRefs": [{"name": STABLE_SERVICE, "port": 80, "weight": 80},
                             {"name": CANARY_SERVICE, "port": 80, "weight": 20}]},
        ]}});
        assert_eq!(Router::GatewayApi.canary_weight(&route), Some(20));
        assert_eq!(
            Router::GatewayApi.header_route(&route, "canary-header"),
            Some(("x-canary".into(), CANARY_SERVICE.into()))
        );
    }

    #[test]
    fn rates_count_only_samples_after_the_change_and_add_up_by_revision() {
        let series = |pod: &str, hash: &str, values: Value| json!({"metric": {"pod": pod, "rollouts_pod_template_hash": hash}, "values": values});
        let matrix = json!([
            // Before the change at t=100 this pod took 100 requests a second, after it 20.
            series(
                "canary-1",
                "new",
                json!([[99.5, "0"], [100.5, "70"], [101.5, "90"], [102.5, "110"]])
            ),
            series(
                "stable-1",
                "old",
                json!([[100.2, "500"], [101.2, "540"], [102.2, "580"]])
            ),
            series(
                "stable-2",
                "old",
                json!([[100.7, "300"], [101.7, "340"], [102.7, "380"]])
            ),
            // One sample after the change gives no rate.
            series("gone", "old", json!([[99.0, "5"], [100.1, "9"]])),
            json!({"metric": {"pod": "unlabelled"}, "values": [[101.0, "1"], [102.0, "9"]]}),
        ]);
        let rates = rates_by_hash(&matrix, 100.0);
        assert_eq!(
            rates,
            BTreeMap::from([("new".into(), 20.0), ("old".into(), 80.0)])
        );
    }

    #[test]
    fn the_recorded_weight_says_whether_it_was_verified() {
        let rollout = json!({"status": {"canary": {"weights": {
            "canary": {"weight": 20}, "stable": {"weight": 80}, "verified": true}}}});
        assert_eq!(recorded_weight(&rollout), Some((20, true)));
        assert_eq!(recorded_weight(&json!({"status": {}})), None);
    }
}
