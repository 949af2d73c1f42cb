//! ingress-nginx as the simulation routes it: a canary Ingress (`<prefix>/canary: "true"`,
//! any annotation prefix) sharing a host with a main Ingress takes the requests its
//! `canary-by-header` rules select, then `canary-weight` out of `canary-weight-total` of the rest.

use serde_json::Value;

use super::cluster::{Cluster, RouterKind};
use super::routes::{Condition, Destination, Front, Precedence, Route, StringMatch, services_of};
use crate::sim::store::ObjectKey;

/// A backend position in an Ingress: (rule, path), or None for the default backend.
type Position = Option<(usize, usize)>;

/// The canary annotations of an Ingress; None when it is not a canary.
#[derive(Debug, Clone, PartialEq)]
struct Canary {
    weight: u64,
    weight_total: u64,
    by_header: Option<String>,
    by_header_value: Option<String>,
    by_header_pattern: Option<String>,
}

fn canary_of(ingress: &Value) -> Option<Canary> {
    let annotations = ingress["metadata"]["annotations"].as_object()?;
    let prefix = annotations.iter().find_map(|(key, value)| {
        let prefix = key.strip_suffix("/canary")?;
        (value.as_str().map(str::trim) == Some("true")).then_some(prefix)
    })?;
    let get = |name: &str| {
        annotations
            .get(&format!("{prefix}/{name}"))
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    let number =
        |name: &str, default: u64| get(name).and_then(|v| v.parse().ok()).unwrap_or(default);
    Some(Canary {
        weight: number("canary-weight", 0),
        weight_total: number("canary-weight-total", 100).max(1),
        by_header: get("canary-by-header"),
        by_header_value: get("canary-by-header-value"),
        by_header_pattern: get("canary-by-header-pattern"),
    })
}

fn hosts(ingress: &Value) -> Vec<&str> {
    let mut hosts: Vec<&str> = ingress["spec"]["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| r["host"].as_str().unwrap_or_default())
        .collect();
    if hosts.is_empty() {
        hosts.push("");
    }
    hosts
}

/// The Service named by an Ingress backend (networking.k8s.io/v1 or the older v1beta1 shape).
fn backend_service(backend: &Value) -> Option<&str> {
    backend["service"]["name"]
        .as_str()
        .or_else(|| backend["serviceName"].as_str())
}

/// Every Service backend of an Ingress with its position.
fn backends(ingress: &Value) -> Vec<(Position, &str)> {
    let spec = &ingress["spec"];
    let mut out = Vec::new();
    for (ri, rule) in spec["rules"].as_array().into_iter().flatten().enumerate() {
        for (pi, path) in rule["http"]["paths"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            if let Some(service) = backend_service(&path["backend"]) {
                out.push((Some((ri, pi)), service));
            }
        }
    }
    let default = spec.get("defaultBackend").or_else(|| spec.get("backend"));
    if let Some(service) = default.and_then(backend_service) {
        out.push((None, service));
    }
    out
}

/// The canary's backend for a main Ingress position: the same position, else its first.
fn canary_backend(canary: &Value, position: Position) -> Option<&str> {
    let all = backends(canary);
    all.iter()
        .find(|(p, _)| *p == position)
        .or_else(|| all.first())
        .map(|(_, s)| *s)
}

pub fn fronts(cluster: &Cluster) -> Vec<Front> {
    let ingresses: Vec<(&ObjectKey, &Value, Option<Canary>)> = cluster
        .routers_of(RouterKind::Ingress)
        .map(|(key, obj)| (key, obj, canary_of(obj)))
        .collect();
    let mut fronts = Vec::new();
    for (key, main, _) in ingresses.iter().filter(|(_, _, c)| c.is_none()) {
        let (ns, name) = key;
        let main_hosts = hosts(main);
        // ingress-nginx honours one canary per host; the first by name here.
        let canary = ingresses.iter().find_map(|(ckey, obj, canary)| {
            let canary = canary.as_ref()?;
            let shares_host = hosts(obj).iter().any(|h| main_hosts.contains(h));
            (ckey.0 == *ns && shares_host).then_some((*ckey, *obj, canary))
        });
        for (position, main_service) in backends(main) {
            let stable = Destination::service(ns, main_service);
            let routes = match canary
                .and_then(|(ckey, obj, c)| canary_backend(obj, position).map(|s| (ckey, s, c)))
            {
                Some((ckey, canary_service, canary)) => canary_routes(
                    &ckey.1,
                    stable,
                    Destination::service(ns, canary_service),
                    canary,
                ),
                None => vec![Route::to(vec![(stable, 1)])],
            };
            let at = match position {
                Some((r, p)) => format!("rules/{r}/paths/{p}"),
                None => "defaultBackend".to_string(),
            };
            fronts.push(Front {
                id: format!("ingress/{ns}/{name}/{at}"),
                services: services_of(&routes),
                routes,
                precedence: Precedence::First,
            });
        }
    }
    fronts
}

/// Header rules first (a value, a pattern, or `always`/`never`), then the weighted split.
fn canary_routes(
    canary_name: &str,
    stable: Destination,
    canary_dest: Destination,
    canary: &Canary,
) -> Vec<Route> {
    let header_route = |value: StringMatch, to: &Destination| Route {
        matches: vec![vec![Condition::Header(
            canary
                .by_header
                .clone()
                .unwrap_or_default()
                .to_ascii_lowercase(),
            value,
        )]],
        backends: vec![(to.clone(), 1)],
        mirror: None,
    };
    let mut routes = Vec::new();
    if canary.by_header.is_some() {
        if let Some(value) = &canary.by_header_value {
            routes.push(header_route(
                StringMatch::Exact(value.clone()),
                &canary_dest,
            ));
        } else if let Some(pattern) = &canary.by_header_pattern {
            let whose = format!("ingress {canary_name} annotation canary-by-header-pattern");
            if let Some(m) = StringMatch::regex(pattern, &whose) {
                routes.push(header_route(m, &canary_dest));
            }
        } else {
            routes.push(header_route(
                StringMatch::Exact("always".into()),
                &canary_dest,
            ));
            routes.push(header_route(StringMatch::Exact("never".into()), &stable));
        }
    }
    let weight = canary.weight.min(canary.weight_total);
    routes.push(Route::to(vec![
        (stable, canary.weight_total - weight),
        (canary_dest, weight),
    ]));
    routes
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ingress(annotations: Value, service: &str) -> Value {
        json!({
            "metadata": {"annotations": annotations},
            "spec": {"rules": [{"host": "web.example", "http": {"paths": [
                {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": service, "port": {"number": 80}}}}
            ]}}]},
        })
    }

    #[test]
    fn canary_annotations_are_read_under_any_prefix() {
        let c = canary_of(&ingress(
            json!({"custom.ingress/canary": "true", "custom.ingress/canary-weight": "20", "custom.ingress/canary-weight-total": "200"}),
            "canary",
        ))
        .expect("a canary ingress");
        assert_eq!((c.weight, c.weight_total), (20, 200));
        assert!(canary_of(&ingress(json!({"x/canary": "false"}), "stable")).is_none());
    }

    #[test]
    fn header_routes_come_before_the_weighted_split() {
        let canary = Canary {
            weight: 20,
            weight_total: 100,
            by_header: Some("X-Canary".into()),
            by_header_value: None,
            by_header_pattern: None,
        };
        let routes = canary_routes(
            "web-canary",
            Destination::service("ns", "stable"),
            Destination::service("ns", "canary"),
            &canary,
        );
        let front = Front {
            id: "f".into(),
            services: services_of(&routes),
            routes,
            precedence: Precedence::First,
        };
        let to = |header| {
            let route = &front.routes[front.route_for(header).expect("a route")];
            route
                .backends
                .iter()
                .map(|(d, w)| (d.service.1.clone(), *w))
                .collect::<Vec<_>>()
        };
        assert_eq!(to(Some(("x-canary", "always"))), vec![("canary".into(), 1)]);
        assert_eq!(to(Some(("x-canary", "never"))), vec![("stable".into(), 1)]);
        assert_eq!(to(None), vec![("stable".into(), 80), ("canary".into(), 20)]);
    }
}
