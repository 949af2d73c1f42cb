//! Fronts: where generated requests enter (an nginx Ingress path, a VirtualService, an
//! HTTPRoute, or a Service no router points at) and the ordered routes that decide, per
//! request, which Service (or subset of its pods) takes it. Built from the router objects as
//! the routers themselves read them; the per-router parsing lives in `nginx`, `istio` and
//! `gateway`.

use std::collections::BTreeSet;

use regex::Regex;
use serde_json::{Map, Value};

use super::cluster::{Cluster, ServiceLoad};
use super::{gateway, istio, nginx};
use crate::sim::store::ObjectKey;

/// The path every generated request asks for.
pub const REQUEST_PATH: &str = "/";

/// Where requests land: a Service's ready pods, or those of them carrying a subset's labels.
#[derive(Debug, Clone, PartialEq)]
pub struct Destination {
    pub service: ObjectKey,
    /// An Istio DestinationRule subset.
    pub subset: Option<Subset>,
}

/// A named subset of a Service's pods.
#[derive(Debug, Clone, PartialEq)]
pub struct Subset {
    pub name: String,
    /// The subset's labels; None when no DestinationRule defines it (no pod takes requests).
    pub labels: Option<Map<String, Value>>,
}

impl Destination {
    pub fn service(namespace: &str, name: &str) -> Self {
        Destination {
            service: (namespace.to_string(), name.to_string()),
            subset: None,
        }
    }
}

/// How a string in a request is compared.
#[derive(Debug, Clone)]
pub enum StringMatch {
    Exact(String),
    Prefix(String),
    /// Anchored: the whole value must match, as Istio and Gateway API do.
    Regex(Regex),
}

impl StringMatch {
    pub fn matches(&self, value: &str) -> bool {
        match self {
            StringMatch::Exact(want) => value == want,
            StringMatch::Prefix(prefix) => value.starts_with(prefix.as_str()),
            StringMatch::Regex(re) => re.is_match(value),
        }
    }

    /// An anchored regular expression; None (with a warning naming `whose`) when invalid.
    pub fn regex(pattern: &str, whose: &str) -> Option<Self> {
        match Regex::new(&format!("^(?:{pattern})$")) {
            Ok(re) => Some(StringMatch::Regex(re)),
            Err(e) => {
                eprintln!(
                    "kube-sim: {whose}: regular expression {pattern:?} does not compile ({e}); the match never matches"
                );
                None
            }
        }
    }
}

/// One condition of a match: all of a match's conditions must hold.
#[derive(Debug, Clone)]
pub enum Condition {
    /// A header (lower-case name) compared with the request's header of that name.
    Header(String, StringMatch),
    Path(StringMatch),
    /// A condition the simulation cannot meet (an invalid regex, a header it never sends).
    Never,
}

impl Condition {
    fn holds(&self, header: Option<(&str, &str)>) -> bool {
        match self {
            Condition::Header(name, want) => {
                header.is_some_and(|(n, v)| n == name && want.matches(v))
            }
            Condition::Path(want) => want.matches(REQUEST_PATH),
            Condition::Never => false,
        }
    }

    fn is_header(&self) -> bool {
        matches!(self, Condition::Header(..))
    }
}

/// A route: which requests it takes and the weighted destinations it spreads them over.
#[derive(Debug, Clone)]
pub struct Route {
    /// Any one match suffices; each match needs all its conditions. No matches: every request.
    pub matches: Vec<Vec<Condition>>,
    pub backends: Vec<(Destination, u64)>,
    /// Istio mirroring: a copy of the given percentage of requests goes there too.
    pub mirror: Option<(Destination, f64)>,
}

impl Route {
    pub fn to(backends: Vec<(Destination, u64)>) -> Self {
        Route {
            matches: Vec::new(),
            backends,
            mirror: None,
        }
    }

    fn takes(&self, header: Option<(&str, &str)>) -> bool {
        self.matches.is_empty()
            || self
                .matches
                .iter()
                .any(|m| m.iter().all(|c| c.holds(header)))
    }

    /// The most header conditions of a match this request meets (Gateway API precedence).
    fn header_specificity(&self, header: Option<(&str, &str)>) -> usize {
        self.matches
            .iter()
            .filter(|m| m.iter().all(|c| c.holds(header)))
            .map(|m| m.iter().filter(|c| c.is_header()).count())
            .max()
            .unwrap_or(0)
    }
}

/// How a front picks among routes that take a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Precedence {
    /// The first in order (nginx canary rules, Istio http routes).
    First,
    /// The one with the most header matches, then the first (Gateway API rules).
    MostHeaders,
}

/// A place requests enter, with its routes.
#[derive(Debug, Clone)]
pub struct Front {
    /// Stable across rebuilds while the object stays: keys the generator's state.
    pub id: String,
    /// The Services it reaches, in the router's order: their annotations set its load.
    pub services: Vec<ObjectKey>,
    pub routes: Vec<Route>,
    pub precedence: Precedence,
}

impl Front {
    /// The index of the route that takes a request carrying `header`, if any.
    pub fn route_for(&self, header: Option<(&str, &str)>) -> Option<usize> {
        let taking = self
            .routes
            .iter()
            .enumerate()
            .filter(|(_, r)| r.takes(header));
        match self.precedence {
            Precedence::First => taking.map(|(i, _)| i).next(),
            // max_by_key keeps the last of equals: compare reversed indexes to keep the first.
            Precedence::MostHeaders => taking
                .max_by_key(|(i, r)| (r.header_specificity(header), std::cmp::Reverse(*i)))
                .map(|(i, _)| i),
        }
    }

    /// The load its Services ask for: the first Service with an rps annotation decides;
    /// without one, `default_rps` and the first header annotation.
    pub fn load(&self, cluster: &Cluster, default_rps: f64) -> ServiceLoad {
        let loads: Vec<&ServiceLoad> = self
            .services
            .iter()
            .filter_map(|key| cluster.services.get(key).map(|s| &s.load))
            .collect();
        let noise_seed = loads.iter().find_map(|l| l.noise_seed);
        let noise_pod_spread = loads.iter().find_map(|l| l.noise_pod_spread);
        if let Some(load) = loads.iter().find(|l| l.rps.is_some()) {
            return ServiceLoad {
                noise_seed,
                noise_pod_spread,
                ..(*load).clone()
            };
        }
        let header = loads.iter().find(|l| l.header.is_some());
        ServiceLoad {
            rps: Some(default_rps),
            header: header.and_then(|l| l.header.clone()),
            header_share: header.map_or(0.0, |l| l.header_share),
            noise_seed,
            noise_pod_spread,
        }
    }
}

/// Every front of the cluster: router fronts first, then a direct front for each Service no
/// router reaches.
pub fn fronts(cluster: &Cluster) -> Vec<Front> {
    let mut fronts = nginx::fronts(cluster);
    fronts.extend(istio::fronts(cluster));
    fronts.extend(gateway::fronts(cluster));
    let routed: BTreeSet<&ObjectKey> = fronts.iter().flat_map(|f| &f.services).collect();
    let direct: Vec<Front> = cluster
        .services
        .keys()
        .filter(|key| !routed.contains(key))
        .map(|(ns, name)| Front {
            id: format!("service/{ns}/{name}"),
            services: vec![(ns.clone(), name.clone())],
            routes: vec![Route::to(vec![(Destination::service(ns, name), 1)])],
            precedence: Precedence::First,
        })
        .collect();
    fronts.extend(direct);
    fronts
}

/// The Services of a front's routes, in order, without repeats.
pub fn services_of(routes: &[Route]) -> Vec<ObjectKey> {
    let mut seen = Vec::new();
    for route in routes {
        let mirrored = route.mirror.iter().map(|(d, _)| d);
        for destination in route.backends.iter().map(|(d, _)| d).chain(mirrored) {
            if !seen.contains(&destination.service) {
                seen.push(destination.service.clone());
            }
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header_route(name: &str, value: &str, to: &str) -> Route {
        Route {
            matches: vec![vec![Condition::Header(
                name.into(),
                StringMatch::Exact(value.into()),
            )]],
            backends: vec![(Destination::service("ns", to), 1)],
            mirror: None,
        }
    }

    #[test]
    fn first_precedence_takes_the_first_matching_route() {
        let front = Front {
            id: "f".into(),
            services: vec![],
            routes: vec![
                header_route("x-canary", "yes", "canary"),
                Route::to(vec![(Destination::service("ns", "stable"), 1)]),
            ],
            precedence: Precedence::First,
        };
        assert_eq!(front.route_for(Some(("x-canary", "yes"))), Some(0));
        assert_eq!(front.route_for(Some(("x-canary", "no"))), Some(1));
        assert_eq!(front.route_for(None), Some(1));
    }

    #[test]
    fn most_headers_precedence_prefers_header_rules_wherever_they_are() {
        let front = Front {
            id: "f".into(),
            services: vec![],
            routes: vec![
                Route::to(vec![(Destination::service("ns", "stable"), 1)]),
                header_route("x-canary", "yes", "canary"),
            ],
            precedence: Precedence::MostHeaders,
        };
        assert_eq!(front.route_for(Some(("x-canary", "yes"))), Some(1));
        assert_eq!(front.route_for(None), Some(0));
    }

    #[test]
    fn regex_matches_are_anchored() {
        let m = StringMatch::regex("ab+", "test").expect("a valid pattern");
        assert!(m.matches("abbb"));
        assert!(!m.matches("xabb"));
        assert!(StringMatch::regex("(", "test").is_none());
    }
}
