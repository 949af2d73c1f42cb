//! The Istio router: weights of the canary and stable destinations in a VirtualService's http, tls
//! and tcp routes (host-level by Service, or subset-level by DestinationRule subsets), header and
//! mirror routes placed first in the http list in `managedRoutes` order, and the DestinationRule
//! subsets' `rollouts-pod-template-hash` labels.

use rollouts_crds::rollout::{
    DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY, IstioDestinationRule, IstioVirtualService,
    MANAGED_BY_ROLLOUTS_KEY, Rollout, SetHeaderRoute, SetMirrorRoute, StringMatch,
    WeightDestination,
};
use serde_json::{Map, Value, json};

use crate::object::{self, apply_body, object_entry, split_reference, with_resource_version};
use crate::shell::{self, DESTINATION_RULE, VIRTUAL_SERVICE};
use crate::{
    Error, Result, RolloutServices, RouterFuture, RouterKind, TrafficRouter, Written, invalid_spec,
    managed_route_name, managed_route_names, max_traffic_weight, rollout_services,
};

/// The route lists of a VirtualService this router may rewrite.
const ROUTE_LISTS: [&str; 3] = ["http", "tls", "tcp"];

/// Who receives a share of the traffic, as the Rollout describes it.
struct Split {
    services: Option<RolloutServices>,
    destination_rule: Option<IstioDestinationRule>,
    managed_routes: Vec<String>,
    total: i32,
}

impl Split {
    fn of(rollout: &Rollout) -> Result<Split> {
        let routing = crate::traffic_routing(rollout)?;
        let destination_rule = routing
            .istio
            .as_ref()
            .and_then(|istio| istio.destination_rule.clone());
        // Subset-level splitting needs no Services; host-level splitting needs both.
        let services = match &destination_rule {
            Some(_) => rollout_services(rollout).ok(),
            None => Some(rollout_services(rollout)?),
        };
        Ok(Split {
            services,
            destination_rule,
            managed_routes: routing
                .managed_route_names()
                .into_iter()
                .map(str::to_string)
                .collect(),
            total: max_traffic_weight(rollout),
        })
    }

    fn is_canary(&self, destination: &Value) -> bool {
        let (host, subset) = host_and_subset(destination);
        self.services
            .as_ref()
            .is_some_and(|s| !host.is_empty() && host == s.canary)
            || self
                .destination_rule
                .as_ref()
                .is_some_and(|dr| !subset.is_empty() && subset == dr.canary_subset_name)
    }

    fn is_stable(&self, destination: &Value) -> bool {
        let (host, subset) = host_and_subset(destination);
        self.services
            .as_ref()
            .is_some_and(|s| !host.is_empty() && host == s.stable)
            || self
                .destination_rule
                .as_ref()
                .is_some_and(|dr| !subset.is_empty() && subset == dr.stable_subset_name)
    }

    fn is_additional_subset(&self, destination: &Value) -> bool {
        let (_, subset) = host_and_subset(destination);
        !subset.is_empty()
            && self
                .destination_rule
                .as_ref()
                .and_then(|dr| dr.additional_subset_names.as_ref())
                .is_some_and(|names| names.iter().any(|name| name == subset))
    }

    fn is_managed(&self, route: &Value) -> bool {
        route["name"]
            .as_str()
            .is_some_and(|name| self.managed_routes.iter().any(|m| m == name))
    }
}

/// The Service name of a destination host (`svc`, `svc.ns`, `svc.ns.svc.cluster.local` all give
/// `svc`) and its subset.
fn host_and_subset(route_destination: &Value) -> (&str, &str) {
    let host = route_destination
        .pointer("/destination/host")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let short = host.split('.').next().unwrap_or_default();
    let subset = route_destination
        .pointer("/destination/subset")
        .and_then(Value::as_str)
        .unwrap_or_default();
    (short, subset)
}

fn vs_error(vs: &Value, reason: String) -> Error {
    Error::InvalidObject {
        kind: "VirtualService",
        object: object::reference(vs),
        reason,
    }
}

fn routes<'a>(vs: &'a Value, list: &str) -> &'a [Value] {
    vs.pointer(&format!("/spec/{list}"))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// Indexes of the http routes whose weights the Rollout sets: the named ones (or the only route
/// that is not a managed route), plus managed mirror routes (they copy the weighted route).
fn http_route_indexes(
    vs: &Value,
    vs_ref: &IstioVirtualService,
    split: &Split,
) -> Result<Vec<usize>> {
    let http = routes(vs, "http");
    let mut indexes = Vec::new();
    // Route names only select among http routes that exist (a tls-only VirtualService has none).
    if http.is_empty() {
        return Ok(indexes);
    }
    match vs_ref.routes.as_deref().filter(|names| !names.is_empty()) {
        Some(names) => {
            for name in names {
                let index = http
                    .iter()
                    .position(|route| route["name"].as_str() == Some(name))
                    .ok_or_else(|| {
                        vs_error(vs, format!("has no http route named {name:?}; add it, or fix istio.virtualService.routes"))
                    })?;
                indexes.push(index);
            }
        }
        None => {
            let unmanaged: Vec<usize> = (0..http.len())
                .filter(|i| !split.is_managed(&http[*i]))
                .collect();
            if unmanaged.len() > 1 {
                return Err(vs_error(
                    vs,
                    format!(
                        "has {} http routes; name the ones to weight in istio.virtualService.routes",
                        unmanaged.len()
                    ),
                ));
            }
            indexes.extend(unmanaged);
        }
    }
    let weighted = indexes.len();
    for (index, route) in http.iter().enumerate() {
        if route.get("mirror").is_some() && split.is_managed(route) && !indexes.contains(&index) {
            indexes.push(index);
        }
    }
    for index in &indexes[..weighted] {
        check_destinations(vs, "http", *index, &http[*index], split)?;
    }
    Ok(indexes)
}

/// Indexes of the tls or tcp routes the Rollout weights: those matching the listed port (and SNI
/// hosts), or the only one when none are listed.
fn l4_route_indexes(
    vs: &Value,
    list: &str,
    wanted: &[(i64, Vec<String>)],
    split: &Split,
) -> Result<Vec<usize>> {
    let found = routes(vs, list);
    if found.is_empty() {
        return Ok(Vec::new());
    }
    let mut indexes = Vec::new();
    if wanted.is_empty() {
        if found.len() > 1 {
            return Err(vs_error(
                vs,
                format!(
                    "has {} {list} routes; name the ones to weight in istio.virtualService.{list}Routes",
                    found.len()
                ),
            ));
        }
        indexes.push(0);
    }
    for (port, sni_hosts) in wanted {
        let matching: Vec<usize> = (0..found.len())
            .filter(|i| l4_route_matches(&found[*i], *port, sni_hosts))
            .collect();
        if matching.is_empty() {
            return Err(vs_error(
                vs,
                format!(
                    "has no {list} route for port {port} and SNI hosts {sni_hosts:?}; fix istio.virtualService.{list}Routes"
                ),
            ));
        }
        indexes.extend(matching);
    }
    for index in &indexes {
        check_destinations(vs, list, *index, &found[*index], split)?;
    }
    Ok(indexes)
}

/// A tls/tcp route matches when all its match blocks name one port, equal to `port`, and its SNI
/// hosts are exactly `sni_hosts` (as sets).
fn l4_route_matches(route: &Value, port: i64, sni_hosts: &[String]) -> bool {
    let matches = route["match"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut ports: Vec<i64> = matches
        .iter()
        .map(|m| m["port"].as_i64().unwrap_or(0))
        .collect();
    ports.sort_unstable();
    ports.dedup();
    if ports.len() > 1 || ports.first().copied().unwrap_or(0) != port {
        return false;
    }
    let mut found: Vec<&str> = matches
        .iter()
        .flat_map(|m| {
            m["sniHosts"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
        })
        .filter_map(Value::as_str)
        .collect();
    found.sort_unstable();
    found.dedup();
    let mut wanted: Vec<&str> = sni_hosts.iter().map(String::as_str).collect();
    wanted.sort_unstable();
    wanted.dedup();
    found == wanted
}

/// A weighted route must reach both the canary and the stable, or the weights mean nothing.
fn check_destinations(
    vs: &Value,
    list: &str,
    index: usize,
    route: &Value,
    split: &Split,
) -> Result<()> {
    let destinations = route["route"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let label = route["name"]
        .as_str()
        .map(|name| format!("{list} route {name:?}"))
        .unwrap_or_else(|| format!("{list}[{index}]"));
    let (canary, stable) = match (&split.destination_rule, &split.services) {
        (Some(dr), _) => (
            format!("subset {:?}", dr.canary_subset_name),
            format!("subset {:?}", dr.stable_subset_name),
        ),
        (None, Some(services)) => (
            format!("Service {:?}", services.canary),
            format!("Service {:?}", services.stable),
        ),
        (None, None) => (String::new(), String::new()),
    };
    if !destinations.iter().any(|d| split.is_canary(d)) {
        return Err(vs_error(
            vs,
            format!("{label} has no destination for the canary {canary}; add one"),
        ));
    }
    if !destinations.iter().any(|d| split.is_stable(d)) {
        return Err(vs_error(
            vs,
            format!("{label} has no destination for the stable {stable}; add one"),
        ));
    }
    Ok(())
}

/// `destinations` with the canary at `canary_weight`, each additional destination at its weight
/// (added when missing), additional DestinationRule subsets kept, the stable at the rest, and any
/// other destination that still takes traffic removed (left over from an earlier experiment).
/// An additional destination without a Service name has nowhere to go and is left out (added,
/// it would be added again on every write).
fn weighted_destinations(
    destinations: &[Value],
    split: &Split,
    canary_weight: i32,
    additional: &[WeightDestination],
) -> Vec<Value> {
    let additional: Vec<&WeightDestination> = additional
        .iter()
        .filter(|d| !d.service_name.is_empty())
        .collect();
    let additional_weight: i64 = additional.iter().map(|d| i64::from(d.weight)).sum();
    let subset_weight: i64 = destinations
        .iter()
        .filter(|d| split.is_additional_subset(d))
        .map(|d| d["weight"].as_i64().unwrap_or(0))
        .sum();
    let stable_weight =
        (i64::from(split.total) - i64::from(canary_weight) - additional_weight - subset_weight)
            .max(0);
    let mut missing: Vec<&WeightDestination> = additional;
    let mut weighted = Vec::with_capacity(destinations.len());
    for destination in destinations {
        let (host, _) = host_and_subset(destination);
        let weight = if split.is_canary(destination) {
            i64::from(canary_weight)
        } else if split.is_stable(destination) {
            stable_weight
        } else if let Some(position) = missing
            .iter()
            .position(|d| !host.is_empty() && d.service_name == host)
        {
            i64::from(missing.remove(position).weight)
        } else if split.is_additional_subset(destination)
            || host.is_empty()
            || destination["weight"].as_i64().unwrap_or(0) == 0
        {
            // Kept as found: extra subsets, and (as Argo Rollouts does) unweighted destinations.
            weighted.push(destination.clone());
            continue;
        } else {
            continue;
        };
        let mut destination = destination.clone();
        destination["weight"] = json!(weight);
        weighted.push(destination);
    }
    missing.sort_by(|a, b| a.service_name.cmp(&b.service_name));
    for destination in missing {
        weighted.push(json!({
            "destination": {"host": destination.service_name},
            "weight": destination.weight,
        }));
    }
    weighted
}

/// The VirtualService with the Rollout's weights on its selected routes, routes otherwise as found.
fn apply_weights(
    vs: &Value,
    rollout: &Rollout,
    vs_ref: &IstioVirtualService,
    canary_weight: i32,
    additional: &[WeightDestination],
) -> Result<Value> {
    let split = Split::of(rollout)?;
    let tls: Vec<(i64, Vec<String>)> = vs_ref
        .tls_routes
        .iter()
        .flatten()
        .map(|r| (r.port.unwrap_or(0), r.sni_hosts.clone().unwrap_or_default()))
        .collect();
    let tcp: Vec<(i64, Vec<String>)> = vs_ref
        .tcp_routes
        .iter()
        .flatten()
        .map(|r| (r.port.unwrap_or(0), Vec::new()))
        .collect();
    let selected = [
        ("http", http_route_indexes(vs, vs_ref, &split)?),
        ("tls", l4_route_indexes(vs, "tls", &tls, &split)?),
        ("tcp", l4_route_indexes(vs, "tcp", &tcp, &split)?),
    ];
    let mut desired = vs.clone();
    for (list, indexes) in selected {
        for index in indexes {
            let Some(route) = desired.pointer_mut(&format!("/spec/{list}/{index}")) else {
                continue;
            };
            let destinations = route["route"].as_array().cloned().unwrap_or_default();
            route["route"] = Value::Array(weighted_destinations(
                &destinations,
                &split,
                canary_weight,
                additional,
            ));
        }
    }
    Ok(desired)
}

/// Puts the managed routes first, in `managedRoutes` order, and the others after them as found.
fn order_routes(vs: &mut Value, split: &Split) {
    if split.managed_routes.is_empty() {
        return;
    }
    let Some(http) = vs.pointer_mut("/spec/http").and_then(Value::as_array_mut) else {
        return;
    };
    let rank = |route: &Value| {
        route["name"]
            .as_str()
            .and_then(|name| split.managed_routes.iter().position(|m| m == name))
            .unwrap_or(usize::MAX)
    };
    // A stable sort keeps the routes that are not managed in their original order.
    http.sort_by_key(rank);
}

/// The VirtualService wanted for `canary_weight` out of `maxTrafficWeight`: the selected http,
/// tls and tcp routes weighted, the managed routes first in `managedRoutes` order, everything
/// else as found.
pub fn desired_virtual_service(
    vs: &Value,
    rollout: &Rollout,
    vs_ref: &IstioVirtualService,
    canary_weight: i32,
    additional: &[WeightDestination],
) -> Result<Value> {
    let mut desired = apply_weights(vs, rollout, vs_ref, canary_weight, additional)?;
    order_routes(&mut desired, &Split::of(rollout)?);
    Ok(desired)
}

/// Whether the VirtualService's selected routes hold `canary_weight` (and the matching stable and
/// additional weights).
pub fn verify_weight(
    vs: &Value,
    rollout: &Rollout,
    vs_ref: &IstioVirtualService,
    canary_weight: i32,
    additional: &[WeightDestination],
) -> Result<bool> {
    let weighted = apply_weights(vs, rollout, vs_ref, canary_weight, additional)?;
    Ok(ROUTE_LISTS.iter().all(|list| {
        vs.pointer(&format!("/spec/{list}")) == weighted.pointer(&format!("/spec/{list}"))
    }))
}

/// Where header and mirror routes send the canary's traffic: the DestinationRule's host with the
/// canary subset (subset-level), or the canary Service (host-level).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CanaryDestination {
    pub host: String,
    pub subset: Option<String>,
}

impl CanaryDestination {
    /// The canary destination of `rollout`, given its DestinationRule when it names one.
    pub fn of(rollout: &Rollout, destination_rule: Option<&Value>) -> Result<CanaryDestination> {
        let split = Split::of(rollout)?;
        match (&split.destination_rule, destination_rule) {
            (Some(dr), Some(found)) => Ok(CanaryDestination {
                host: found
                    .pointer("/spec/host")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                subset: Some(dr.canary_subset_name.clone()),
            }),
            _ => Ok(CanaryDestination {
                host: split.services.map(|s| s.canary).unwrap_or_default(),
                subset: split.destination_rule.map(|dr| dr.canary_subset_name),
            }),
        }
    }

    fn to_json(&self, port: Option<&Value>) -> Value {
        let mut destination = json!({"host": self.host});
        if let Some(subset) = &self.subset {
            destination["subset"] = json!(subset);
        }
        if let Some(port) = port {
            destination["port"] = port.clone();
        }
        destination
    }
}

fn string_match(value: &StringMatch) -> Value {
    let mut matched = Map::new();
    for (key, field) in [
        ("exact", &value.exact),
        ("prefix", &value.prefix),
        ("regex", &value.regex),
    ] {
        if let Some(text) = field {
            matched.insert(key.into(), json!(text));
        }
    }
    Value::Object(matched)
}

fn without_route(vs: &Value, name: &str) -> Value {
    let mut desired = vs.clone();
    if let Some(http) = desired
        .pointer_mut("/spec/http")
        .and_then(Value::as_array_mut)
    {
        http.retain(|route| route["name"].as_str() != Some(name));
    }
    desired
}

/// The destinations of the first weighted http route, which header and mirror routes take their
/// port (and mirror routes their weights) from.
fn weighted_route_destinations(
    vs: &Value,
    vs_ref: &IstioVirtualService,
    split: &Split,
) -> Result<Vec<Value>> {
    let indexes = http_route_indexes(vs, vs_ref, split)?;
    Ok(indexes
        .first()
        .and_then(|index| routes(vs, "http")[*index]["route"].as_array().cloned())
        .unwrap_or_default())
}

fn http_list(vs: &mut Value) -> Result<&mut Vec<Value>> {
    let reference = object::reference(vs);
    let spec = vs
        .as_object_mut()
        .map(|root| object_entry(root, "spec"))
        .ok_or_else(|| Error::InvalidObject {
            kind: "VirtualService",
            object: reference.clone(),
            reason: "is not a JSON object".to_string(),
        })?;
    let http = spec
        .entry("http")
        .or_insert_with(|| Value::Array(Vec::new()));
    http.as_array_mut().ok_or_else(|| Error::InvalidObject {
        kind: "VirtualService",
        object: reference,
        reason: "spec.http is not a list".to_string(),
    })
}

/// The VirtualService with the header route of `step` (replacing one of the same name): requests
/// matching any of the headers go to the canary. Without `match`, the route is removed.
pub fn with_header_route(
    vs: &Value,
    rollout: &Rollout,
    vs_ref: &IstioVirtualService,
    step: &SetHeaderRoute,
    canary: &CanaryDestination,
) -> Result<Value> {
    let name = managed_route_name(rollout, step.name.as_deref(), "setHeaderRoute")?;
    let split = Split::of(rollout)?;
    let mut desired = without_route(vs, name);
    if let Some(matches) = &step.match_ {
        let port = weighted_route_destinations(vs, vs_ref, &split)?
            .first()
            .and_then(|d| d.pointer("/destination/port").cloned());
        // One match block per header: Istio ORs match blocks, as Argo Rollouts writes them.
        let match_blocks: Vec<Value> = matches
            .iter()
            .map(|m| json!({"headers": {m.header_name.clone(): string_match(&m.header_value)}}))
            .collect();
        http_list(&mut desired)?.push(json!({
            "name": name,
            "match": match_blocks,
            "route": [{"destination": canary.to_json(port.as_ref()), "weight": split.total}],
        }));
    }
    order_routes(&mut desired, &split);
    Ok(desired)
}

/// The VirtualService with the mirror route of `step` (replacing one of the same name): matching
/// requests keep their weighted destinations and are copied to the canary. Without `match`, the
/// route is removed.
pub fn with_mirror_route(
    vs: &Value,
    rollout: &Rollout,
    vs_ref: &IstioVirtualService,
    step: &SetMirrorRoute,
    canary: &CanaryDestination,
) -> Result<Value> {
    let name = managed_route_name(rollout, Some(step.name.as_str()), "setMirrorRoute")?;
    let split = Split::of(rollout)?;
    let mut desired = without_route(vs, name);
    if let Some(matches) = &step.match_ {
        let destinations = weighted_route_destinations(&desired, vs_ref, &split)?;
        let port = destinations
            .first()
            .and_then(|d| d.pointer("/destination/port").cloned());
        let match_blocks: Vec<Value> = matches
            .iter()
            .map(|m| {
                let mut block = Map::new();
                if let Some(method) = &m.method {
                    block.insert("method".into(), string_match(method));
                }
                if let Some(path) = &m.path {
                    block.insert("uri".into(), string_match(path));
                }
                if let Some(headers) = &m.headers {
                    let headers: Map<String, Value> = headers
                        .iter()
                        .map(|(k, v)| (k.clone(), string_match(v)))
                        .collect();
                    block.insert("headers".into(), Value::Object(headers));
                }
                Value::Object(block)
            })
            .collect();
        http_list(&mut desired)?.insert(
            0,
            json!({
                "name": name,
                "match": match_blocks,
                "route": destinations,
                "mirror": canary.to_json(port.as_ref()),
                "mirrorPercentage": {"value": step.percentage.unwrap_or(100)},
            }),
        );
    }
    order_routes(&mut desired, &split);
    Ok(desired)
}

/// The VirtualService without any route the Rollout manages (`managedRoutes` and the names its
/// header and mirror steps use).
pub fn without_managed_routes(vs: &Value, rollout: &Rollout) -> Value {
    let names = managed_route_names(rollout);
    let mut desired = vs.clone();
    if let Some(http) = desired
        .pointer_mut("/spec/http")
        .and_then(Value::as_array_mut)
    {
        http.retain(|route| {
            route["name"]
                .as_str()
                .is_none_or(|name| !names.iter().any(|n| n == name))
        });
    }
    desired
}

/// The DestinationRule wanted: the canary and stable subsets (and experiment subsets of
/// `additional`) labelled with their pod-template hash, other subsets as found, and the
/// managed-by annotation naming the Rollout.
pub fn desired_destination_rule(
    dr: &Value,
    rollout: &Rollout,
    canary_hash: &str,
    stable_hash: &str,
    additional: &[WeightDestination],
) -> Result<Value> {
    let config = crate::traffic_routing(rollout)?
        .istio
        .as_ref()
        .and_then(|istio| istio.destination_rule.as_ref())
        .ok_or_else(|| {
            invalid_spec(
                rollout,
                "spec.strategy.canary.trafficRouting.istio.destinationRule",
                "no DestinationRule is configured",
            )
        })?;
    let mut desired = dr.clone();
    let reference = object::reference(dr);
    let root = desired
        .as_object_mut()
        .ok_or_else(|| Error::InvalidObject {
            kind: "DestinationRule",
            object: reference.clone(),
            reason: "is not a JSON object".to_string(),
        })?;
    let annotations = object_entry(object_entry(root, "metadata"), "annotations");
    annotations.insert(
        MANAGED_BY_ROLLOUTS_KEY.to_string(),
        json!(rollout.metadata.name.as_deref().unwrap_or_default()),
    );
    let subsets = object_entry(root, "spec")
        .entry("subsets")
        .or_insert_with(|| Value::Array(Vec::new()));
    let subsets = subsets.as_array_mut().ok_or_else(|| Error::InvalidObject {
        kind: "DestinationRule",
        object: reference.clone(),
        reason: "spec.subsets is not a list".to_string(),
    })?;
    for wanted in [&config.canary_subset_name, &config.stable_subset_name] {
        if !subsets.iter().any(|s| s["name"].as_str() == Some(wanted)) {
            return Err(Error::InvalidObject {
                kind: "DestinationRule",
                object: reference,
                reason: format!(
                    "has no subset named {wanted:?}; add it, or fix istio.destinationRule in the Rollout"
                ),
            });
        }
    }
    let mut missing: Vec<&WeightDestination> = additional.iter().collect();
    for subset in subsets.iter_mut() {
        let name = subset["name"].as_str().unwrap_or_default().to_string();
        let hash = if name == config.canary_subset_name {
            canary_hash.to_string()
        } else if name == config.stable_subset_name {
            stable_hash.to_string()
        } else if let Some(position) = missing.iter().position(|d| d.service_name == name) {
            missing.remove(position).pod_template_hash.clone()
        } else {
            continue;
        };
        let Some(subset) = subset.as_object_mut() else {
            continue;
        };
        let labels = object_entry(subset, "labels");
        if hash.is_empty() {
            labels.remove(DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY);
        } else {
            labels.insert(DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY.to_string(), json!(hash));
        }
    }
    missing.sort_by(|a, b| a.service_name.cmp(&b.service_name));
    for destination in missing {
        subsets.push(json!({
            "name": destination.service_name,
            "labels": {DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY: destination.pod_template_hash},
        }));
    }
    Ok(desired)
}

/// The Istio router of one Rollout.
pub struct IstioRouter {
    client: kube::Client,
    rollout: Rollout,
}

impl IstioRouter {
    pub fn new(client: kube::Client, rollout: Rollout) -> Result<Self> {
        Split::of(&rollout)?;
        Ok(IstioRouter { client, rollout })
    }

    fn namespace(&self) -> &str {
        self.rollout
            .metadata
            .namespace
            .as_deref()
            .unwrap_or("default")
    }

    fn virtual_services(&self) -> Result<Vec<IstioVirtualService>> {
        let refs: Vec<IstioVirtualService> = crate::traffic_routing(&self.rollout)?
            .istio
            .as_ref()
            .map(|istio| istio.all_virtual_services().into_iter().cloned().collect())
            .unwrap_or_default();
        if refs.is_empty() {
            return Err(invalid_spec(
                &self.rollout,
                "spec.strategy.canary.trafficRouting.istio.virtualService",
                "name the VirtualService (virtualService or virtualServices)",
            ));
        }
        Ok(refs)
    }

    async fn virtual_service(&self, vs_ref: &IstioVirtualService) -> Result<Option<Value>> {
        let (namespace, name) = split_reference(&vs_ref.name, self.namespace());
        shell::get(&self.client, VIRTUAL_SERVICE, &namespace, &name).await
    }

    fn not_found(&self, kind: &'static str, name: &str, field: &str) -> Error {
        Error::NotFound {
            kind,
            object: name.to_string(),
            rollout: crate::rollout_reference(&self.rollout),
            field: field.to_string(),
        }
    }

    async fn destination_rule(&self) -> Result<Option<Value>> {
        let Some(config) = crate::traffic_routing(&self.rollout)?
            .istio
            .as_ref()
            .and_then(|istio| istio.destination_rule.as_ref())
        else {
            return Ok(None);
        };
        let found = shell::get(
            &self.client,
            DESTINATION_RULE,
            self.namespace(),
            &config.name,
        )
        .await?;
        found.map(Some).ok_or_else(|| {
            self.not_found(
                "DestinationRule",
                &format!("{}/{}", self.namespace(), config.name),
                "spec.strategy.canary.trafficRouting.istio.destinationRule.name",
            )
        })
    }

    /// Rewrites every VirtualService with `transform`, writing only those that change. Missing
    /// VirtualServices are an error unless `skip_missing`.
    async fn rewrite(
        &self,
        skip_missing: bool,
        transform: impl Fn(&Value, &IstioVirtualService) -> Result<Value>,
    ) -> Result<Written> {
        let mut written = Vec::new();
        for vs_ref in self.virtual_services()? {
            let (namespace, name) = split_reference(&vs_ref.name, self.namespace());
            let plan = |found: Option<&Value>| {
                let Some(found) = found else {
                    if skip_missing {
                        return Ok(None);
                    }
                    return Err(self.not_found(
                        "VirtualService",
                        &format!("{namespace}/{name}"),
                        "spec.strategy.canary.trafficRouting.istio.virtualService.name",
                    ));
                };
                let desired = transform(found, &vs_ref)?;
                if desired.get("spec") == found.get("spec") {
                    return Ok(None);
                }
                let body = apply_body(&desired, &ROUTE_LISTS, &[], &[]);
                Ok(Some(with_resource_version(body, found)))
            };
            written.extend(
                shell::update(&self.client, VIRTUAL_SERVICE, &namespace, &name, plan).await?,
            );
        }
        Ok(written)
    }
}

impl TrafficRouter for IstioRouter {
    fn kind(&self) -> RouterKind {
        RouterKind::Istio
    }

    fn set_weight<'a>(
        &'a self,
        desired_weight: i32,
        additional: &'a [WeightDestination],
    ) -> RouterFuture<'a, Written> {
        Box::pin(async move {
            crate::check_weight(&self.rollout, desired_weight)?;
            self.rewrite(false, |vs, vs_ref| {
                desired_virtual_service(vs, &self.rollout, vs_ref, desired_weight, additional)
            })
            .await
        })
    }

    fn update_hash<'a>(
        &'a self,
        canary_hash: &'a str,
        stable_hash: &'a str,
        additional: &'a [WeightDestination],
    ) -> RouterFuture<'a, Written> {
        Box::pin(async move {
            let Some(config) = crate::traffic_routing(&self.rollout)?
                .istio
                .as_ref()
                .and_then(|istio| istio.destination_rule.as_ref())
            else {
                return Ok(Vec::new());
            };
            let plan = |found: Option<&Value>| {
                let found = found.ok_or_else(|| {
                    self.not_found(
                        "DestinationRule",
                        &format!("{}/{}", self.namespace(), config.name),
                        "spec.strategy.canary.trafficRouting.istio.destinationRule.name",
                    )
                })?;
                let desired = desired_destination_rule(
                    found,
                    &self.rollout,
                    canary_hash,
                    stable_hash,
                    additional,
                )?;
                if &desired == found {
                    return Ok(None);
                }
                let body = apply_body(&desired, &["subsets"], &[MANAGED_BY_ROLLOUTS_KEY], &[]);
                Ok(Some(with_resource_version(body, found)))
            };
            let written = shell::update(
                &self.client,
                DESTINATION_RULE,
                self.namespace(),
                &config.name,
                plan,
            )
            .await?;
            Ok(written.into_iter().collect())
        })
    }

    fn set_header_route<'a>(
        &'a self,
        header_route: &'a SetHeaderRoute,
    ) -> RouterFuture<'a, Written> {
        Box::pin(async move {
            let canary =
                CanaryDestination::of(&self.rollout, self.destination_rule().await?.as_ref())?;
            self.rewrite(false, |vs, vs_ref| {
                with_header_route(vs, &self.rollout, vs_ref, header_route, &canary)
            })
            .await
        })
    }

    fn set_mirror_route<'a>(
        &'a self,
        mirror_route: &'a SetMirrorRoute,
    ) -> RouterFuture<'a, Written> {
        Box::pin(async move {
            let canary =
                CanaryDestination::of(&self.rollout, self.destination_rule().await?.as_ref())?;
            self.rewrite(false, |vs, vs_ref| {
                with_mirror_route(vs, &self.rollout, vs_ref, mirror_route, &canary)
            })
            .await
        })
    }

    fn verify_weight<'a>(
        &'a self,
        desired_weight: i32,
        additional: &'a [WeightDestination],
    ) -> RouterFuture<'a, Option<bool>> {
        Box::pin(async move {
            for vs_ref in self.virtual_services()? {
                let Some(found) = self.virtual_service(&vs_ref).await? else {
                    return Ok(Some(false));
                };
                if !verify_weight(&found, &self.rollout, &vs_ref, desired_weight, additional)? {
                    return Ok(Some(false));
                }
            }
            Ok(Some(true))
        })
    }

    fn remove_managed_routes(&self) -> RouterFuture<'_, Written> {
        Box::pin(async move {
            self.rewrite(true, |vs, _| Ok(without_managed_routes(vs, &self.rollout)))
                .await
        })
    }
}
