//! The Gateway API router, configured as Argo Rollouts' `argoproj-labs/gatewayAPI` plugin is:
//! weights of the canary and stable Services' backendRefs in an HTTPRoute's rules, header routes
//! as added rules that send matching requests to the canary only, mirror routes as added rules with
//! a `RequestMirror` filter (the plugin cannot mirror; this router can), the removal of those
//! added rules, and experiment Services' backendRefs while an experiment takes traffic.
//!
//! Our additions to the plugin's configuration: `httpRoutes[].rules`, the names of the rules to
//! weight (all rules when absent).

use rollouts_crds::rollout::{
    GATEWAY_API_PLUGIN, Rollout, RouteMatch, SetHeaderRoute, SetMirrorRoute, StringMatch,
    WeightDestination,
};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::object::{self, apply_body, regex_escape, with_resource_version};
use crate::shell::{self, HTTP_ROUTE, SERVICE};
use crate::{
    Error, Result, RolloutServices, RouterFuture, RouterKind, TrafficRouter, Written, invalid_spec,
    managed_route_name, managed_route_names, max_traffic_weight, rollout_services,
};

/// Label the plugin puts on an HTTPRoute while a canary receives traffic.
pub const IN_PROGRESS_LABEL_KEY: &str = "rollouts.argoproj.io/gatewayapi-canary";
/// Value of [`IN_PROGRESS_LABEL_KEY`] unless configured.
pub const IN_PROGRESS_LABEL_VALUE: &str = "in-progress";

const CONFIG_FIELD: &str = "spec.strategy.canary.trafficRouting.plugins.argoproj-labs/gatewayAPI";

/// `plugins["argoproj-labs/gatewayAPI"]`, as the plugin reads it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayApiConfig {
    #[serde(default)]
    pub http_route: Option<String>,
    #[serde(default)]
    pub http_routes: Vec<HttpRouteRef>,
    /// Namespace of the routes; the Rollout's when absent.
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub disable_in_progress_label: bool,
    #[serde(default)]
    pub in_progress_label_key: Option<String>,
    #[serde(default)]
    pub in_progress_label_value: Option<String>,
    // Route kinds and discovery the plugin has and this router does not (refused, never ignored).
    #[serde(default)]
    grpc_route: Option<Value>,
    #[serde(default)]
    grpc_routes: Option<Value>,
    #[serde(default)]
    tcp_route: Option<Value>,
    #[serde(default)]
    tcp_routes: Option<Value>,
    #[serde(default)]
    tls_route: Option<Value>,
    #[serde(default)]
    tls_routes: Option<Value>,
    #[serde(default)]
    http_route_selector: Option<Value>,
    #[serde(default)]
    grpc_route_selector: Option<Value>,
    #[serde(default)]
    tcp_route_selector: Option<Value>,
    #[serde(default)]
    tls_route_selector: Option<Value>,
}

/// One HTTPRoute the Rollout routes through.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteRef {
    pub name: String,
    /// Whether header (and mirror) routes are added to this HTTPRoute.
    #[serde(default)]
    pub use_header_routes: bool,
    /// Our addition: names of the rules to weight; every rule when absent.
    #[serde(default)]
    pub rules: Option<Vec<String>>,
}

impl GatewayApiConfig {
    /// The plugin configuration of `rollout`, refusing what this router does not implement.
    pub fn of(rollout: &Rollout) -> Result<GatewayApiConfig> {
        let raw = crate::traffic_routing(rollout)?
            .plugin(GATEWAY_API_PLUGIN)
            .ok_or_else(|| {
                invalid_spec(
                    rollout,
                    CONFIG_FIELD,
                    "the Gateway API plugin is not configured",
                )
            })?;
        let config: GatewayApiConfig = serde_json::from_value(raw.clone()).map_err(|err| {
            invalid_spec(rollout, CONFIG_FIELD, &format!("cannot be read: {err}"))
        })?;
        let unsupported = [
            ("grpcRoute", config.grpc_route.is_some()),
            ("grpcRoutes", config.grpc_routes.is_some()),
            ("tcpRoute", config.tcp_route.is_some()),
            ("tcpRoutes", config.tcp_routes.is_some()),
            ("tlsRoute", config.tls_route.is_some()),
            ("tlsRoutes", config.tls_routes.is_some()),
            ("httpRouteSelector", config.http_route_selector.is_some()),
            ("grpcRouteSelector", config.grpc_route_selector.is_some()),
            ("tcpRouteSelector", config.tcp_route_selector.is_some()),
            ("tlsRouteSelector", config.tls_route_selector.is_some()),
        ];
        if let Some((field, _)) = unsupported.iter().find(|(_, set)| *set) {
            return Err(invalid_spec(
                rollout,
                &format!("{CONFIG_FIELD}.{field}"),
                "this controller routes HTTPRoutes named in httpRoute / httpRoutes only; name them there",
            ));
        }
        if config.routes().is_empty() {
            return Err(invalid_spec(
                rollout,
                CONFIG_FIELD,
                "name at least one HTTPRoute in httpRoute or httpRoutes",
            ));
        }
        Ok(config)
    }

    /// Every HTTPRoute named: `httpRoutes`, then `httpRoute` (which always takes header routes).
    pub fn routes(&self) -> Vec<HttpRouteRef> {
        let mut routes = self.http_routes.clone();
        if let Some(name) = self.http_route.as_ref().filter(|n| !n.is_empty()) {
            routes.push(HttpRouteRef {
                name: name.clone(),
                use_header_routes: true,
                rules: None,
            });
        }
        routes
    }

    fn in_progress_label(&self) -> Option<(String, String)> {
        (!self.disable_in_progress_label).then(|| {
            (
                self.in_progress_label_key
                    .clone()
                    .filter(|k| !k.is_empty())
                    .unwrap_or_else(|| IN_PROGRESS_LABEL_KEY.to_string()),
                self.in_progress_label_value
                    .clone()
                    .filter(|v| !v.is_empty())
                    .unwrap_or_else(|| IN_PROGRESS_LABEL_VALUE.to_string()),
            )
        })
    }
}

fn route_error(route: &Value, reason: String) -> Error {
    Error::InvalidObject {
        kind: "HTTPRoute",
        object: object::reference(route),
        reason,
    }
}

fn rules(route: &Value) -> &[Value] {
    route
        .pointer("/spec/rules")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// Whether a backendRef is the Service `service` (core group, kind Service by default).
fn is_service(backend_ref: &Value, service: &str) -> bool {
    backend_ref["name"].as_str() == Some(service)
        && backend_ref["kind"].as_str().is_none_or(|k| k == "Service")
        && backend_ref["group"].as_str().is_none_or(str::is_empty)
}

fn has_service(rule: &Value, service: &str) -> bool {
    rule["backendRefs"]
        .as_array()
        .is_some_and(|refs| refs.iter().any(|r| is_service(r, service)))
}

/// The managed route a rule was added for: its name is the route's, or the route's followed by
/// `-<n>` (one added rule per source rule, names unique within the HTTPRoute).
fn managed_base<'a>(rule: &Value, managed: &'a [String]) -> Option<&'a String> {
    let name = rule["name"].as_str()?;
    managed.iter().find(|base| {
        name == base.as_str()
            || name
                .strip_prefix(base.as_str())
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// Whether a rule takes part in weighting: selected by `rules` (or all), and not a header rule
/// this router added (those send to the canary only).
fn is_weighted_rule(
    rule: &Value,
    route_ref: &HttpRouteRef,
    managed: &[String],
    services: &RolloutServices,
) -> bool {
    if managed_base(rule, managed).is_some() {
        return has_service(rule, &services.stable);
    }
    match &route_ref.rules {
        Some(names) => rule["name"]
            .as_str()
            .is_some_and(|n| names.iter().any(|w| w == n)),
        None => true,
    }
}

/// Source rules for header and mirror rules: selected, not added by this router, and reaching both
/// the canary and the stable.
fn source_rules<'a>(
    route: &'a Value,
    route_ref: &HttpRouteRef,
    managed: &[String],
    services: &RolloutServices,
) -> Result<Vec<&'a Value>> {
    let sources: Vec<&Value> = rules(route)
        .iter()
        .filter(|rule| managed_base(rule, managed).is_none())
        .filter(|rule| is_weighted_rule(rule, route_ref, managed, services))
        .filter(|rule| has_service(rule, &services.canary) && has_service(rule, &services.stable))
        .collect();
    if sources.is_empty() {
        return Err(route_error(
            route,
            format!(
                "no rule has backendRefs to both Service {:?} and Service {:?}; add them",
                services.canary, services.stable
            ),
        ));
    }
    Ok(sources)
}

/// An experiment Service that takes a share of the traffic (an `additional` destination), with
/// the port its backendRef uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExperimentBackend {
    pub service_name: String,
    pub weight: i32,
    pub port: i64,
}

/// Experiment Services the router added at the last weight change (`status.canary.weights`):
/// the only backendRefs besides the canary and stable it may remove.
fn previous_experiment_services(rollout: &Rollout) -> Vec<&str> {
    rollout
        .status
        .as_ref()
        .and_then(|status| status.canary.weights.as_ref())
        .map(|weights| {
            weights
                .additional
                .iter()
                .map(|d| d.service_name.as_str())
                .collect()
        })
        .unwrap_or_default()
}

/// The HTTPRoute with the weights set: canary, experiments, and the rest to the stable, in every
/// weighted rule; experiment backendRefs added to the rules that reach the stable, and those of
/// a finished experiment removed. Nothing else changes.
fn apply_weights(
    route: &Value,
    rollout: &Rollout,
    route_ref: &HttpRouteRef,
    canary_weight: i32,
    experiments: &[ExperimentBackend],
) -> Result<Value> {
    let services = rollout_services(rollout)?;
    let managed = managed_route_names(rollout);
    let previous = previous_experiment_services(rollout);
    let experiment_weight: i32 = experiments.iter().map(|e| e.weight).sum();
    let stable_weight = (max_traffic_weight(rollout) - canary_weight - experiment_weight).max(0);
    // Experiment Services live with the Rollout; a route elsewhere must say so.
    let experiment_namespace = rollout
        .metadata
        .namespace
        .as_deref()
        .filter(|ns| !object::namespace(route).is_empty() && *ns != object::namespace(route));
    let mut desired = route.clone();
    let (mut canary_found, mut stable_found) = (false, false);
    if let Some(rules) = desired
        .pointer_mut("/spec/rules")
        .and_then(Value::as_array_mut)
    {
        for rule in rules.iter_mut() {
            if !is_weighted_rule(rule, route_ref, &managed, &services) {
                continue;
            }
            let reaches_stable = has_service(rule, &services.stable);
            let Some(backend_refs) = rule["backendRefs"].as_array_mut() else {
                continue;
            };
            if reaches_stable {
                backend_refs.retain(|backend_ref| {
                    let finished = |name: &&str| {
                        is_service(backend_ref, name)
                            && !experiments.iter().any(|e| e.service_name == **name)
                    };
                    !previous.iter().any(finished)
                });
            }
            for backend_ref in backend_refs.iter_mut() {
                if is_service(backend_ref, &services.canary) {
                    backend_ref["weight"] = json!(canary_weight);
                    canary_found = true;
                } else if is_service(backend_ref, &services.stable) {
                    backend_ref["weight"] = json!(stable_weight);
                    stable_found = true;
                } else if let Some(experiment) = experiments
                    .iter()
                    .find(|e| is_service(backend_ref, &e.service_name))
                {
                    backend_ref["weight"] = json!(experiment.weight);
                }
            }
            if !reaches_stable {
                continue;
            }
            for experiment in experiments {
                if backend_refs
                    .iter()
                    .any(|r| is_service(r, &experiment.service_name))
                {
                    continue;
                }
                let mut backend_ref = json!({
                    "group": "",
                    "kind": "Service",
                    "name": experiment.service_name,
                    "port": experiment.port,
                    "weight": experiment.weight,
                });
                if let Some(namespace) = experiment_namespace {
                    backend_ref["namespace"] = json!(namespace);
                }
                backend_refs.push(backend_ref);
            }
        }
    }
    for (found, service) in [
        (canary_found, &services.canary),
        (stable_found, &services.stable),
    ] {
        if !found {
            return Err(route_error(
                route,
                format!(
                    "no weighted rule has a backendRef to Service {service:?}; add one, or fix the Rollout's services"
                ),
            ));
        }
    }
    Ok(desired)
}

/// Puts the rules this router added first, in `managedRoutes` order (so they win ties of
/// specificity), and the others after them as found.
fn order_rules(route: &mut Value, managed: &[String]) {
    let Some(rules) = route
        .pointer_mut("/spec/rules")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    rules.sort_by_key(|rule| {
        managed_base(rule, managed)
            .and_then(|base| managed.iter().position(|m| m == base))
            .unwrap_or(usize::MAX)
    });
}

/// The HTTPRoute wanted for `canary_weight` out of `maxTrafficWeight`: the canary, experiment and
/// stable backendRefs of every weighted rule at their weights, and the plugin's in-progress label
/// while the canary receives traffic.
pub fn desired_http_route(
    route: &Value,
    rollout: &Rollout,
    config: &GatewayApiConfig,
    route_ref: &HttpRouteRef,
    canary_weight: i32,
    experiments: &[ExperimentBackend],
) -> Result<Value> {
    let mut desired = apply_weights(route, rollout, route_ref, canary_weight, experiments)?;
    if let (Some((key, value)), Some(root)) = (config.in_progress_label(), desired.as_object_mut())
    {
        let labels = object::object_entry(object::object_entry(root, "metadata"), "labels");
        if canary_weight > 0 {
            labels.insert(key, json!(value));
        } else {
            labels.remove(&key);
        }
    }
    Ok(desired)
}

/// Whether the HTTPRoute holds `canary_weight`: the weighted rules carry it, and no Gateway that
/// reports on the route has left the current generation unaccepted.
pub fn verify_weight(
    route: &Value,
    rollout: &Rollout,
    route_ref: &HttpRouteRef,
    canary_weight: i32,
    experiments: &[ExperimentBackend],
) -> Result<bool> {
    let weighted = apply_weights(route, rollout, route_ref, canary_weight, experiments)?;
    if weighted.pointer("/spec/rules") != route.pointer("/spec/rules") {
        return Ok(false);
    }
    let generation = route
        .pointer("/metadata/generation")
        .and_then(Value::as_i64);
    let parents = route
        .pointer("/status/parents")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    Ok(parents.iter().all(|parent| {
        let accepted = parent["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"].as_str() == Some("Accepted"));
        accepted.is_none_or(|condition| {
            let current = match (condition["observedGeneration"].as_i64(), generation) {
                (Some(observed), Some(generation)) => observed >= generation,
                _ => true,
            };
            condition["status"].as_str() == Some("True") && current
        })
    }))
}

/// The labels of an object; an empty map is no labels (the API server does not keep one, so an
/// empty map wanted must not read as a change at every reconcile).
fn labels_of(object: &Value) -> Option<&Value> {
    object
        .pointer("/metadata/labels")
        .filter(|labels| !labels.as_object().is_some_and(|map| map.is_empty()))
}

fn without_rules_of(route: &Value, name: &str) -> Value {
    let mut desired = route.clone();
    let only = [name.to_string()];
    if let Some(rules) = desired
        .pointer_mut("/spec/rules")
        .and_then(Value::as_array_mut)
    {
        rules.retain(|rule| managed_base(rule, &only).is_none());
    }
    desired
}

fn added_rule_name(name: &str, index: usize) -> String {
    match index {
        0 => name.to_string(),
        n => format!("{name}-{n}"),
    }
}

/// A header condition in Gateway API form; a prefix becomes an anchored regular expression.
fn header_match(name: &str, value: &StringMatch, rollout: &Rollout, field: &str) -> Result<Value> {
    let (kind, text) = match (&value.exact, &value.prefix, &value.regex) {
        (Some(exact), None, None) => ("Exact", exact.clone()),
        (None, Some(prefix), None) => ("RegularExpression", format!("{}.*", regex_escape(prefix))),
        (None, None, Some(regex)) => ("RegularExpression", regex.clone()),
        _ => {
            return Err(invalid_spec(
                rollout,
                field,
                "set exactly one of exact, prefix and regex",
            ));
        }
    };
    Ok(json!({"name": name, "type": kind, "value": text}))
}

/// A source match that also requires `headers`, or `None` when it already tests one of those
/// header names differently: the Gateway API reads only the first condition on a name, so adding
/// ours would be ignored and the rule would send the source's traffic to the canary.
fn with_headers(source_match: &Value, headers: &[Value]) -> Option<Value> {
    let mut all = source_match["headers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for header in headers {
        let name = header["name"].as_str().unwrap_or_default();
        match all.iter().find(|h| {
            h["name"]
                .as_str()
                .is_some_and(|n| n.eq_ignore_ascii_case(name))
        }) {
            Some(found) if object::holds(found, header) => {}
            Some(_) => return None,
            None => all.push(header.clone()),
        }
    }
    let mut merged = source_match.clone();
    merged["headers"] = Value::Array(all);
    Some(merged)
}

fn replace_rules(route: &mut Value, added: Vec<Value>, managed: &[String]) -> Result<()> {
    let reference = object::reference(route);
    let rules = route
        .pointer_mut("/spec/rules")
        .and_then(Value::as_array_mut)
        .ok_or_else(|| Error::InvalidObject {
            kind: "HTTPRoute",
            object: reference,
            reason: "spec.rules is not a list".to_string(),
        })?;
    rules.extend(added);
    order_rules(route, managed);
    Ok(())
}

/// The HTTPRoute with the header route of `step` (replacing the rules of the same name): for each
/// weighted rule, a rule with the same matches plus every header of the step, sending to the
/// canary only. Without `match`, the route's rules are removed. HTTPRoutes that do not take header
/// routes (`useHeaderRoutes`) are returned as found.
pub fn with_header_route(
    route: &Value,
    rollout: &Rollout,
    route_ref: &HttpRouteRef,
    step: &SetHeaderRoute,
) -> Result<Value> {
    let name = managed_route_name(rollout, step.name.as_deref(), "setHeaderRoute")?;
    if !route_ref.use_header_routes {
        return Ok(route.clone());
    }
    let mut desired = without_rules_of(route, name);
    let Some(matches) = &step.match_ else {
        return Ok(desired);
    };
    let services = rollout_services(rollout)?;
    let managed = managed_route_names(rollout);
    let headers: Vec<Value> = matches
        .iter()
        .enumerate()
        .map(|(i, m)| {
            header_match(
                &m.header_name,
                &m.header_value,
                rollout,
                &format!("setHeaderRoute.match[{i}].headerValue"),
            )
        })
        .collect::<Result<_>>()?;
    let mut added = Vec::new();
    for source in source_rules(route, route_ref, &managed, &services)? {
        let canary_ref = source["backendRefs"]
            .as_array()
            .and_then(|refs| refs.iter().find(|r| is_service(r, &services.canary)))
            .cloned()
            .unwrap_or_default();
        let source_matches = source["matches"].as_array().cloned().unwrap_or_default();
        let merged: Vec<Value> = if source_matches.is_empty() {
            vec![json!({"headers": headers})]
        } else {
            source_matches
                .iter()
                .filter_map(|m| with_headers(m, &headers))
                .collect()
        };
        if merged.is_empty() {
            continue;
        }
        let mut backend = json!({"group": "", "kind": "Service", "name": services.canary});
        if let Some(port) = canary_ref.get("port") {
            backend["port"] = port.clone();
        }
        let mut rule = Map::new();
        rule.insert("name".into(), json!(added_rule_name(name, added.len())));
        rule.insert("matches".into(), Value::Array(merged));
        if let Some(filters) = source.get("filters") {
            rule.insert("filters".into(), filters.clone());
        }
        rule.insert("backendRefs".into(), json!([backend]));
        added.push(Value::Object(rule));
    }
    replace_rules(&mut desired, added, &managed)?;
    Ok(desired)
}

/// A mirror route's path in Gateway API form.
fn path_match(path: &StringMatch, rollout: &Rollout, field: &str) -> Result<Value> {
    match (&path.exact, &path.prefix, &path.regex) {
        (Some(exact), None, None) => Ok(json!({"type": "Exact", "value": exact})),
        (None, Some(prefix), None) => Ok(json!({"type": "PathPrefix", "value": prefix})),
        (None, None, Some(regex)) => Ok(json!({"type": "RegularExpression", "value": regex})),
        _ => Err(invalid_spec(
            rollout,
            field,
            "set exactly one of exact, prefix and regex",
        )),
    }
}

/// Whether path `inner` only matches requests path `outer` matches.
fn path_within(outer: &Value, inner: &Value) -> bool {
    if outer == inner {
        return true;
    }
    let (Some("PathPrefix"), Some(prefix)) = (outer["type"].as_str(), outer["value"].as_str())
    else {
        return false;
    };
    let Some(("Exact" | "PathPrefix", value)) = inner["type"].as_str().zip(inner["value"].as_str())
    else {
        return false;
    };
    let base = prefix.trim_end_matches('/');
    base.is_empty() || value == base || value.starts_with(&format!("{base}/"))
}

/// The conditions of a source rule's match and a mirror match together, so that the mirror rule
/// never catches a request the source rule would not: `None` when they cannot both hold.
fn intersect(
    source: &Value,
    mirror: &RouteMatch,
    rollout: &Rollout,
    field: &str,
) -> Result<Option<Value>> {
    let mut merged = source.as_object().cloned().unwrap_or_default();
    if let Some(path) = &mirror.path {
        let wanted = path_match(path, rollout, &format!("{field}.path"))?;
        match merged.get("path") {
            Some(found) if !path_within(found, &wanted) => {
                return Err(invalid_spec(
                    rollout,
                    &format!("{field}.path"),
                    &format!(
                        "path {wanted} is not within the rule's path {found}; mirror a path the rule serves"
                    ),
                ));
            }
            _ => {
                merged.insert("path".into(), wanted);
            }
        }
    }
    if let Some(method) = &mirror.method {
        let wanted = match (&method.exact, &method.prefix, &method.regex) {
            (Some(exact), None, None) => exact.to_ascii_uppercase(),
            _ => {
                return Err(invalid_spec(
                    rollout,
                    &format!("{field}.method"),
                    "the Gateway API matches methods exactly; use exact",
                ));
            }
        };
        match merged.get("method").and_then(Value::as_str) {
            Some(found) if found != wanted => return Ok(None),
            _ => {
                merged.insert("method".into(), json!(wanted));
            }
        }
    }
    let mut headers = merged
        .get("headers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for (name, value) in mirror.headers.iter().flatten() {
        let wanted = header_match(name, value, rollout, &format!("{field}.headers.{name}"))?;
        // The Gateway API reads only the first condition on a header name.
        match headers.iter().find(|h| {
            h["name"]
                .as_str()
                .is_some_and(|n| n.eq_ignore_ascii_case(name))
        }) {
            Some(found) if object::holds(found, &wanted) => {}
            Some(found) => {
                return Err(invalid_spec(
                    rollout,
                    &format!("{field}.headers.{name}"),
                    &format!(
                        "the rule already matches header {name} as {found}; mirror on another header"
                    ),
                ));
            }
            None => headers.push(wanted),
        }
    }
    if !headers.is_empty() {
        merged.insert("headers".into(), Value::Array(headers));
    }
    Ok(Some(Value::Object(merged)))
}

/// The HTTPRoute with the mirror route of `step` (replacing the rules of the same name): for each
/// weighted rule, a rule matching what both the rule and the step match, keeping the rule's
/// backendRefs and filters and adding a `RequestMirror` filter to the canary. Without `match`, the
/// route's rules are removed. HTTPRoutes that do not take header routes are returned as found.
pub fn with_mirror_route(
    route: &Value,
    rollout: &Rollout,
    route_ref: &HttpRouteRef,
    step: &SetMirrorRoute,
) -> Result<Value> {
    let name = managed_route_name(rollout, Some(step.name.as_str()), "setMirrorRoute")?;
    if !route_ref.use_header_routes {
        return Ok(route.clone());
    }
    let mut desired = without_rules_of(route, name);
    let Some(mirror_matches) = &step.match_ else {
        return Ok(desired);
    };
    let services = rollout_services(rollout)?;
    let managed = managed_route_names(rollout);
    let mut added = Vec::new();
    for source in source_rules(route, route_ref, &managed, &services)? {
        let source_matches = source["matches"]
            .as_array()
            .cloned()
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| vec![json!({})]);
        let mut matches = Vec::new();
        for source_match in &source_matches {
            if mirror_matches.is_empty() {
                matches.push(source_match.clone());
            }
            for (i, mirror) in mirror_matches.iter().enumerate() {
                let field = format!("setMirrorRoute.match[{i}]");
                matches.extend(intersect(source_match, mirror, rollout, &field)?);
            }
        }
        if matches.is_empty() {
            continue;
        }
        let canary_ref = source["backendRefs"]
            .as_array()
            .and_then(|refs| refs.iter().find(|r| is_service(r, &services.canary)))
            .cloned()
            .unwrap_or_default();
        let mut mirror_backend = json!({"group": "", "kind": "Service", "name": services.canary});
        if let Some(port) = canary_ref.get("port") {
            mirror_backend["port"] = port.clone();
        }
        let mut request_mirror = json!({"backendRef": mirror_backend});
        // Without `percent` everything is mirrored; leaving it out keeps older Gateway APIs happy.
        if let Some(percent) = step.percentage.filter(|p| *p != 100) {
            request_mirror["percent"] = json!(percent);
        }
        let mut filters = source["filters"].as_array().cloned().unwrap_or_default();
        filters.push(json!({"type": "RequestMirror", "requestMirror": request_mirror}));
        let mut rule = Map::new();
        rule.insert("name".into(), json!(added_rule_name(name, added.len())));
        rule.insert("matches".into(), Value::Array(matches));
        rule.insert("filters".into(), Value::Array(filters));
        rule.insert("backendRefs".into(), source["backendRefs"].clone());
        added.push(Value::Object(rule));
    }
    if added.is_empty() {
        return Err(invalid_spec(
            rollout,
            "setMirrorRoute.match",
            "no request can match both a weighted rule and the mirror route; fix the match",
        ));
    }
    replace_rules(&mut desired, added, &managed)?;
    Ok(desired)
}

/// The HTTPRoute without the rules this router added for any managed route.
pub fn without_managed_routes(route: &Value, rollout: &Rollout) -> Value {
    let managed = managed_route_names(rollout);
    let mut desired = route.clone();
    if let Some(rules) = desired
        .pointer_mut("/spec/rules")
        .and_then(Value::as_array_mut)
    {
        rules.retain(|rule| managed_base(rule, &managed).is_none());
    }
    desired
}

/// The Gateway API router of one Rollout.
pub struct GatewayApiRouter {
    client: kube::Client,
    rollout: Rollout,
    config: GatewayApiConfig,
}

impl GatewayApiRouter {
    pub fn new(client: kube::Client, rollout: Rollout) -> Result<Self> {
        let config = GatewayApiConfig::of(&rollout)?;
        rollout_services(&rollout)?;
        Ok(GatewayApiRouter {
            client,
            rollout,
            config,
        })
    }

    fn namespace(&self) -> String {
        self.config
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .or_else(|| self.rollout.metadata.namespace.clone())
            .unwrap_or_else(|| "default".to_string())
    }

    /// The experiment backends of `additional`, each with its Service's port (the one named
    /// `http`, else the first), as the plugin picks it.
    async fn experiments(
        &self,
        additional: &[WeightDestination],
    ) -> Result<Vec<ExperimentBackend>> {
        let namespace = self
            .rollout
            .metadata
            .namespace
            .as_deref()
            .unwrap_or("default");
        let mut experiments = Vec::with_capacity(additional.len());
        for destination in additional {
            let name = &destination.service_name;
            let service = shell::get(&self.client, SERVICE, namespace, name)
                .await?
                .ok_or_else(|| Error::NotFound {
                    kind: "Service",
                    object: format!("{namespace}/{name}"),
                    rollout: crate::rollout_reference(&self.rollout),
                    field: "spec.strategy.canary.steps[].experiment.templates[].service"
                        .to_string(),
                })?;
            let ports = service
                .pointer("/spec/ports")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let port = ports
                .iter()
                .find(|p| p["name"].as_str() == Some("http"))
                .or_else(|| ports.first())
                .and_then(|p| p["port"].as_i64())
                .ok_or_else(|| Error::InvalidObject {
                    kind: "Service",
                    object: format!("{namespace}/{name}"),
                    reason: "has no port for the HTTPRoute to send experiment traffic to; add one"
                        .to_string(),
                })?;
            experiments.push(ExperimentBackend {
                service_name: name.clone(),
                weight: destination.weight,
                port,
            });
        }
        Ok(experiments)
    }

    async fn http_route(&self, name: &str) -> Result<Option<Value>> {
        shell::get(&self.client, HTTP_ROUTE, &self.namespace(), name).await
    }

    /// Rewrites every HTTPRoute with `transform`, writing only those that change. Missing
    /// HTTPRoutes are an error unless `skip_missing`.
    async fn rewrite(
        &self,
        skip_missing: bool,
        transform: impl Fn(&Value, &HttpRouteRef) -> Result<Value>,
    ) -> Result<Written> {
        let label_keys: Vec<String> = self
            .config
            .in_progress_label()
            .map(|(key, _)| key)
            .into_iter()
            .collect();
        let label_keys: Vec<&str> = label_keys.iter().map(String::as_str).collect();
        let namespace = self.namespace();
        let mut written = Vec::new();
        for route_ref in self.config.routes() {
            let plan = |found: Option<&Value>| {
                let Some(found) = found else {
                    if skip_missing {
                        return Ok(None);
                    }
                    return Err(Error::NotFound {
                        kind: "HTTPRoute",
                        object: format!("{namespace}/{}", route_ref.name),
                        rollout: crate::rollout_reference(&self.rollout),
                        field: format!("{CONFIG_FIELD}.httpRoutes"),
                    });
                };
                let desired = transform(found, &route_ref)?;
                if desired.get("spec") == found.get("spec")
                    && labels_of(&desired) == labels_of(found)
                {
                    return Ok(None);
                }
                // The label travels with every apply, or the apply would release (and drop) it.
                let body = apply_body(&desired, &["rules"], &[], &label_keys);
                Ok(Some(with_resource_version(body, found)))
            };
            written.extend(
                shell::update(&self.client, HTTP_ROUTE, &namespace, &route_ref.name, plan).await?,
            );
        }
        Ok(written)
    }
}

impl TrafficRouter for GatewayApiRouter {
    fn kind(&self) -> RouterKind {
        RouterKind::GatewayApi
    }

    fn set_weight<'a>(
        &'a self,
        desired_weight: i32,
        additional: &'a [WeightDestination],
    ) -> RouterFuture<'a, Written> {
        Box::pin(async move {
            crate::check_weight(&self.rollout, desired_weight)?;
            let experiments = self.experiments(additional).await?;
            self.rewrite(false, |route, route_ref| {
                desired_http_route(
                    route,
                    &self.rollout,
                    &self.config,
                    route_ref,
                    desired_weight,
                    &experiments,
                )
            })
            .await
        })
    }

    fn update_hash<'a>(
        &'a self,
        _canary_hash: &'a str,
        _stable_hash: &'a str,
        _additional: &'a [WeightDestination],
    ) -> RouterFuture<'a, Written> {
        // backendRefs name Services, whose selectors the controller keeps on the hashes.
        Box::pin(async { Ok(Vec::new()) })
    }

    fn set_header_route<'a>(
        &'a self,
        header_route: &'a SetHeaderRoute,
    ) -> RouterFuture<'a, Written> {
        Box::pin(async move {
            self.rewrite(false, |route, route_ref| {
                with_header_route(route, &self.rollout, route_ref, header_route)
            })
            .await
        })
    }

    fn set_mirror_route<'a>(
        &'a self,
        mirror_route: &'a SetMirrorRoute,
    ) -> RouterFuture<'a, Written> {
        Box::pin(async move {
            self.rewrite(false, |route, route_ref| {
                with_mirror_route(route, &self.rollout, route_ref, mirror_route)
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
            let experiments = self.experiments(additional).await?;
            for route_ref in self.config.routes() {
                let Some(found) = self.http_route(&route_ref.name).await? else {
                    return Ok(Some(false));
                };
                if !verify_weight(
                    &found,
                    &self.rollout,
                    &route_ref,
                    desired_weight,
                    &experiments,
                )? {
                    return Ok(Some(false));
                }
            }
            Ok(Some(true))
        })
    }

    fn remove_managed_routes(&self) -> RouterFuture<'_, Written> {
        Box::pin(async move {
            self.rewrite(true, |route, _| {
                Ok(without_managed_routes(route, &self.rollout))
            })
            .await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_label_map_is_no_labels() {
        let bare = json!({"metadata": {"name": "shop"}});
        let empty = json!({"metadata": {"name": "shop", "labels": {}}});
        let labelled = json!({"metadata": {"name": "shop", "labels": {"team": "web"}}});
        assert_eq!(labels_of(&bare), labels_of(&empty));
        assert_ne!(labels_of(&bare), labels_of(&labelled));
    }
}
