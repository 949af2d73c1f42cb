//! Istio as the simulation routes it: a VirtualService's `http` routes in order, the first
//! whose match takes the request wins; its destinations (a Service host, optionally a
//! DestinationRule subset) share the requests by weight; `mirror` copies a percentage.

use serde_json::{Map, Value};

use super::cluster::{Cluster, RouterKind};
use super::routes::{
    Condition, Destination, Front, Precedence, Route, StringMatch, Subset, services_of,
};
use crate::sim::store::ObjectKey;

/// The Service a host names: `name`, `name.ns`, or `name.ns.svc[.cluster.local]`.
fn service_of_host(host: &str, namespace: &str) -> ObjectKey {
    let mut parts = host.split('.');
    let name = parts.next().unwrap_or_default();
    let ns = parts.next().unwrap_or(namespace);
    (ns.to_string(), name.to_string())
}

/// A destination (`{host, subset}`), its subset's labels looked up in the DestinationRules.
fn destination(cluster: &Cluster, namespace: &str, dest: &Value) -> Option<Destination> {
    let host = dest["host"].as_str()?;
    let service = service_of_host(host, namespace);
    let subset = dest["subset"].as_str().map(|name| Subset {
        name: name.to_string(),
        labels: subset_labels(cluster, &service, name),
    });
    Some(Destination { service, subset })
}

fn subset_labels(
    cluster: &Cluster,
    service: &ObjectKey,
    subset: &str,
) -> Option<Map<String, Value>> {
    cluster
        .routers_of(RouterKind::DestinationRule)
        .filter(|((ns, _), rule)| {
            rule["spec"]["host"]
                .as_str()
                .is_some_and(|h| service_of_host(h, ns) == *service)
        })
        .flat_map(|(_, rule)| rule["spec"]["subsets"].as_array().into_iter().flatten())
        .find(|s| s["name"] == subset)
        .map(|s| s["labels"].as_object().cloned().unwrap_or_default())
}

/// An Istio StringMatch (`exact`, `prefix` or `regex`); an empty one only asks for presence.
fn string_match(m: &Value, whose: &str) -> Option<StringMatch> {
    if let Some(v) = m["exact"].as_str() {
        Some(StringMatch::Exact(v.to_string()))
    } else if let Some(v) = m["prefix"].as_str() {
        Some(StringMatch::Prefix(v.to_string()))
    } else if let Some(v) = m["regex"].as_str() {
        StringMatch::regex(v, whose)
    } else {
        Some(StringMatch::Prefix(String::new()))
    }
}

/// One `match` entry: its header and uri conditions (others, such as method, always hold).
fn conditions(m: &Value, whose: &str) -> Vec<Condition> {
    let mut out: Vec<Condition> = m["headers"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, want)| match string_match(want, whose) {
            Some(sm) => Condition::Header(name.to_ascii_lowercase(), sm),
            None => Condition::Never,
        })
        .collect();
    if m["uri"].is_object() {
        out.push(string_match(&m["uri"], whose).map_or(Condition::Never, Condition::Path));
    }
    out
}

fn route(cluster: &Cluster, namespace: &str, http: &Value, whose: &str) -> Route {
    let matches = http["match"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| conditions(m, whose))
        .collect();
    let destinations: Vec<&Value> = http["route"].as_array().into_iter().flatten().collect();
    let single = destinations.len() == 1;
    let backends = destinations
        .iter()
        .filter_map(|d| {
            let weight = d["weight"].as_u64().unwrap_or(u64::from(single));
            // A lone destination takes everything whatever its weight says.
            let weight = if single { weight.max(1) } else { weight };
            destination(cluster, namespace, &d["destination"]).map(|dest| (dest, weight))
        })
        .collect();
    let mirror = destination(cluster, namespace, &http["mirror"]).map(|dest| {
        let percent = http["mirrorPercentage"]["value"]
            .as_f64()
            .or_else(|| http["mirrorPercent"].as_f64())
            .unwrap_or(100.0);
        (dest, percent.clamp(0.0, 100.0))
    });
    Route {
        matches,
        backends,
        mirror,
    }
}

pub fn fronts(cluster: &Cluster) -> Vec<Front> {
    cluster
        .routers_of(RouterKind::VirtualService)
        .filter_map(|((ns, name), vs)| {
            let whose = format!("virtualservice {ns}/{name}");
            let routes: Vec<Route> = vs["spec"]["http"]
                .as_array()?
                .iter()
                .map(|http| route(cluster, ns, http, &whose))
                .collect();
            Some(Front {
                id: format!("virtualservice/{ns}/{name}"),
                services: services_of(&routes),
                routes,
                precedence: Precedence::First,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hosts_name_services_in_any_form() {
        assert_eq!(service_of_host("web", "ns"), ("ns".into(), "web".into()));
        assert_eq!(
            service_of_host("web.other.svc.cluster.local", "ns"),
            ("other".into(), "web".into())
        );
    }

    #[test]
    fn routes_read_matches_weights_and_mirrors() {
        let cluster = Cluster::default();
        let http = json!({
            "match": [{"headers": {"X-Canary": {"exact": "yes"}}}, {"uri": {"prefix": "/"}}],
            "route": [
                {"destination": {"host": "stable"}, "weight": 70},
                {"destination": {"host": "canary"}, "weight": 30},
            ],
            "mirror": {"host": "canary"},
            "mirrorPercentage": {"value": 25.0},
        });
        let r = route(&cluster, "ns", &http, "test");
        assert_eq!(r.matches.len(), 2);
        let weights: Vec<u64> = r.backends.iter().map(|(_, w)| *w).collect();
        assert_eq!(weights, vec![70, 30]);
        let (mirror, percent) = r.mirror.expect("a mirror");
        assert_eq!((mirror.service.1.as_str(), percent), ("canary", 25.0));
    }
}
