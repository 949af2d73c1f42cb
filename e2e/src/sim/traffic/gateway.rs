//! Gateway API as the simulation routes it: of an HTTPRoute's rules that take a request, the
//! one with the most header matches wins (then the first); its Service backendRefs share the
//! requests by weight (default 1); a `RequestMirror` filter copies a percentage.

use serde_json::Value;

use super::cluster::{Cluster, RouterKind};
use super::routes::{Condition, Destination, Front, Precedence, Route, StringMatch, services_of};

/// A backendRef to a Service (kind Service in the core group, the default).
fn service_ref(backend: &Value, namespace: &str) -> Option<Destination> {
    let core = backend["group"].as_str().is_none_or(str::is_empty);
    let service = backend["kind"].as_str().is_none_or(|k| k == "Service");
    if !(core && service) {
        return None;
    }
    let ns = backend["namespace"].as_str().unwrap_or(namespace);
    Some(Destination::service(ns, backend["name"].as_str()?))
}

fn string_match(kind: Option<&str>, value: &str, whose: &str) -> Option<StringMatch> {
    match kind.unwrap_or("Exact") {
        "Exact" => Some(StringMatch::Exact(value.to_string())),
        "PathPrefix" => Some(StringMatch::Prefix(value.to_string())),
        "RegularExpression" => StringMatch::regex(value, whose),
        _ => None,
    }
}

fn conditions(m: &Value, whose: &str) -> Vec<Condition> {
    let mut out: Vec<Condition> = m["headers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|h| {
            let name = h["name"].as_str().unwrap_or_default().to_ascii_lowercase();
            let value = h["value"].as_str().unwrap_or_default();
            string_match(h["type"].as_str(), value, whose)
                .map_or(Condition::Never, |sm| Condition::Header(name, sm))
        })
        .collect();
    if let Some(value) = m["path"]["value"].as_str() {
        let kind = m["path"]["type"].as_str().or(Some("PathPrefix"));
        out.push(string_match(kind, value, whose).map_or(Condition::Never, Condition::Path));
    }
    out
}

fn mirror(rule: &Value, namespace: &str) -> Option<(Destination, f64)> {
    let filter = rule["filters"]
        .as_array()?
        .iter()
        .find(|f| f["type"] == "RequestMirror")?;
    let mirror = &filter["requestMirror"];
    let percent = mirror["percent"].as_f64().or_else(|| {
        let f = &mirror["fraction"];
        let numerator = f["numerator"].as_f64()?;
        Some(100.0 * numerator / f["denominator"].as_f64().unwrap_or(100.0).max(1.0))
    });
    Some((
        service_ref(&mirror["backendRef"], namespace)?,
        percent.unwrap_or(100.0).clamp(0.0, 100.0),
    ))
}

pub fn fronts(cluster: &Cluster) -> Vec<Front> {
    cluster
        .routers_of(RouterKind::HttpRoute)
        .filter_map(|((ns, name), http_route)| {
            let whose = format!("httproute {ns}/{name}");
            let routes: Vec<Route> = http_route["spec"]["rules"]
                .as_array()?
                .iter()
                .map(|rule| Route {
                    matches: rule["matches"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|m| conditions(m, &whose))
                        .collect(),
                    backends: rule["backendRefs"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|b| {
                            Some((service_ref(b, ns)?, b["weight"].as_u64().unwrap_or(1)))
                        })
                        .collect(),
                    mirror: mirror(rule, ns),
                })
                .collect();
            Some(Front {
                id: format!("httproute/{ns}/{name}"),
                services: services_of(&routes),
                routes,
                precedence: Precedence::MostHeaders,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rules_read_header_matches_and_weights() {
        let mut cluster = Cluster::default();
        cluster.routers.insert(
            (RouterKind::HttpRoute, ("ns".into(), "web".into())),
            std::sync::Arc::new(json!({"spec": {"rules": [
                {"backendRefs": [{"name": "stable", "port": 80, "weight": 90}, {"name": "canary", "port": 80, "weight": 10}]},
                {"matches": [{"headers": [{"name": "X-Canary", "value": "yes"}]}],
                 "backendRefs": [{"name": "canary", "port": 80}]},
            ]}})),
        );
        let front = fronts(&cluster).pop().expect("one front");
        assert_eq!(front.route_for(Some(("x-canary", "yes"))), Some(1));
        assert_eq!(front.route_for(None), Some(0));
        let weights: Vec<u64> = front.routes[0].backends.iter().map(|(_, w)| *w).collect();
        assert_eq!(weights, vec![90, 10]);
        assert_eq!(front.routes[1].backends[0].1, 1);
    }
}
