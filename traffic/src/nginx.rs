//! The nginx Ingress router: a canary Ingress `<rollout>-<stableIngress>-canary`, cloned from each
//! stable Ingress with its backends switched to the canary Service, weighted and header-routed by
//! ingress-nginx's canary annotations, and owned by the Rollout.

use std::collections::BTreeMap;

use rollouts_crds::rollout::{Rollout, SetHeaderRoute, SetMirrorRoute, WeightDestination};
use serde_json::{Map, Value, json};

use crate::object::{self, applied_annotation_keys, holds, regex_escape};
use crate::shell::{self, INGRESS};
use crate::{
    Error, FIELD_MANAGER, Result, RolloutServices, RouterFuture, RouterKind, TrafficRouter,
    Written, check_weight, invalid_spec, managed_route_name, rollout_services,
};

/// Annotation prefix when `nginx.annotationPrefix` is not set.
pub const DEFAULT_ANNOTATION_PREFIX: &str = "nginx.ingress.kubernetes.io";
/// Suffix of every canary Ingress name.
pub const CANARY_INGRESS_SUFFIX: &str = "-canary";
/// The legacy ingress class annotation, the only stable annotation the canary must share.
const INGRESS_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";
/// Longest object name Kubernetes accepts for an Ingress.
const MAX_NAME_LENGTH: usize = 253;

/// The canary annotations this router writes (after the prefix and a `/`).
const CANARY_KEYS: [&str; 6] = [
    "canary",
    "canary-weight",
    "canary-weight-total",
    "canary-by-header",
    "canary-by-header-value",
    "canary-by-header-pattern",
];

/// The annotation prefix of `rollout`: `nginx.annotationPrefix`, else ingress-nginx's own.
pub fn annotation_prefix(rollout: &Rollout) -> String {
    rollout
        .canary()
        .and_then(|canary| canary.traffic_routing.as_ref())
        .and_then(|routing| routing.nginx.as_ref())
        .and_then(|nginx| nginx.annotation_prefix.clone())
        .filter(|prefix| !prefix.is_empty())
        .unwrap_or_else(|| DEFAULT_ANNOTATION_PREFIX.to_string())
}

/// Name of the canary Ingress of `stable_ingress`, cut so that it stays a valid object name.
pub fn canary_ingress_name(rollout_name: &str, stable_ingress: &str) -> String {
    let mut prefix = format!("{rollout_name}-{stable_ingress}");
    let limit = MAX_NAME_LENGTH - CANARY_INGRESS_SUFFIX.len();
    if prefix.len() > limit {
        let mut cut = limit;
        while !prefix.is_char_boundary(cut) {
            cut -= 1;
        }
        prefix.truncate(cut);
    }
    format!("{prefix}{CANARY_INGRESS_SUFFIX}")
}

/// The one header condition ingress-nginx can route a canary on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NginxHeaderRoute {
    pub header_name: String,
    pub value: NginxHeaderValue,
}

/// How the header's value is matched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NginxHeaderValue {
    /// `canary-by-header` alone: ingress-nginx's `always` / `never` values.
    Switch,
    /// `canary-by-header-value`.
    Exact(String),
    /// `canary-by-header-pattern` (a regular expression).
    Pattern(String),
}

impl NginxHeaderRoute {
    /// The header route a `setHeaderRoute` step asks for; `None` when it removes the route.
    /// ingress-nginx matches one header per canary, so a step with several is refused.
    pub fn from_step(rollout: &Rollout, step: &SetHeaderRoute) -> Result<Option<Self>> {
        let Some(matches) = &step.match_ else {
            return Ok(None);
        };
        let [header] = matches.as_slice() else {
            return Err(invalid_spec(
                rollout,
                "setHeaderRoute.match",
                &format!(
                    "nginx routes a canary on exactly one header, {} given; keep one",
                    matches.len()
                ),
            ));
        };
        let value = &header.header_value;
        let value = match (&value.exact, &value.prefix, &value.regex) {
            (Some(exact), None, None) => NginxHeaderValue::Exact(exact.clone()),
            (None, Some(prefix), None) => {
                NginxHeaderValue::Pattern(format!("^{}.*", regex_escape(prefix)))
            }
            (None, None, Some(regex)) => NginxHeaderValue::Pattern(regex.clone()),
            _ => {
                return Err(invalid_spec(
                    rollout,
                    "setHeaderRoute.match[0].headerValue",
                    "set exactly one of exact, prefix and regex",
                ));
            }
        };
        Ok(Some(NginxHeaderRoute {
            header_name: header.header_name.clone(),
            value,
        }))
    }

    /// The header route a canary Ingress carries, read back from its annotations.
    pub fn of_canary_ingress(canary_ingress: &Value, prefix: &str) -> Option<Self> {
        let annotation = |key: &str| {
            canary_ingress
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(format!("{prefix}/{key}")))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let header_name = annotation("canary-by-header").filter(|h| !h.is_empty())?;
        let value = match (
            annotation("canary-by-header-value"),
            annotation("canary-by-header-pattern"),
        ) {
            (Some(exact), _) => NginxHeaderValue::Exact(exact),
            (None, Some(pattern)) => NginxHeaderValue::Pattern(pattern),
            (None, None) => NginxHeaderValue::Switch,
        };
        Some(NginxHeaderRoute { header_name, value })
    }
}

/// The canary weight a canary Ingress carries, read back from `canary-weight`.
pub fn canary_weight(canary_ingress: &Value, prefix: &str) -> Option<i32> {
    canary_ingress
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(format!("{prefix}/canary-weight")))
        .and_then(Value::as_str)
        .and_then(|w| w.trim().parse().ok())
}

/// The canary Ingress wanted for `stable_ingress`: its rules that reach the stable Service, with
/// those backends switched to the canary Service; its TLS, `ingressClassName` and ingress class
/// annotation; the Rollout's additional and canary annotations; the canary, weight and header
/// annotations; and a controller reference to the Rollout.
pub fn desired_canary_ingress(
    stable_ingress: &Value,
    rollout: &Rollout,
    services: &RolloutServices,
    weight: i32,
    header_route: Option<&NginxHeaderRoute>,
) -> Result<Value> {
    let stable_name = object::name(stable_ingress);
    let rules: Vec<Value> = stable_ingress
        .pointer("/spec/rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|rule| canary_rule(rule, services))
        .collect();
    if rules.is_empty() {
        return Err(Error::InvalidObject {
            kind: "Ingress",
            object: object::reference(stable_ingress),
            reason: format!(
                "no rule has a backend on Service {:?}; route a path to it, or fix stableService / nginx.stableIngress in Rollout {}",
                services.stable,
                crate::rollout_reference(rollout)
            ),
        });
    }

    let prefix = annotation_prefix(rollout);
    let nginx = rollout
        .canary()
        .and_then(|canary| canary.traffic_routing.as_ref())
        .and_then(|routing| routing.nginx.as_ref());
    let mut annotations: BTreeMap<String, String> = BTreeMap::new();
    if let Some(class) = stable_ingress
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(INGRESS_CLASS_ANNOTATION))
        .and_then(Value::as_str)
    {
        annotations.insert(INGRESS_CLASS_ANNOTATION.to_string(), class.to_string());
    }
    for (key, value) in nginx
        .and_then(|n| n.additional_ingress_annotations.as_ref())
        .into_iter()
        .flatten()
    {
        let key = if key.starts_with(&prefix) {
            key.clone()
        } else {
            format!("{prefix}/{key}")
        };
        annotations.insert(key, value.clone());
    }
    for (key, value) in nginx
        .and_then(|n| n.canary_ingress_annotations.as_ref())
        .into_iter()
        .flatten()
    {
        annotations.insert(key.clone(), value.clone());
    }
    if let Some(route) = header_route {
        for key in [
            "canary-by-header",
            "canary-by-header-value",
            "canary-by-header-pattern",
        ] {
            annotations.remove(&format!("{prefix}/{key}"));
        }
        annotations.insert(
            format!("{prefix}/canary-by-header"),
            route.header_name.clone(),
        );
        match &route.value {
            NginxHeaderValue::Switch => {}
            NginxHeaderValue::Exact(value) => {
                annotations.insert(format!("{prefix}/canary-by-header-value"), value.clone());
            }
            NginxHeaderValue::Pattern(pattern) => {
                annotations.insert(
                    format!("{prefix}/canary-by-header-pattern"),
                    pattern.clone(),
                );
            }
        }
    }
    annotations.insert(format!("{prefix}/canary"), "true".to_string());
    annotations.insert(format!("{prefix}/canary-weight"), weight.to_string());
    if let Some(total) = rollout
        .canary()
        .and_then(|canary| canary.traffic_routing.as_ref())
        .and_then(|routing| routing.max_traffic_weight)
    {
        annotations.insert(format!("{prefix}/canary-weight-total"), total.to_string());
    }

    let mut spec = Map::new();
    if let Some(class) = stable_ingress.pointer("/spec/ingressClassName") {
        spec.insert("ingressClassName".into(), class.clone());
    }
    if let Some(tls) = stable_ingress.pointer("/spec/tls") {
        spec.insert("tls".into(), tls.clone());
    }
    spec.insert("rules".into(), Value::Array(rules));

    let rollout_name = rollout.metadata.name.as_deref().unwrap_or_default();
    let mut metadata = json!({
        "name": canary_ingress_name(rollout_name, stable_name),
        "annotations": annotations,
        "ownerReferences": [owner_reference(rollout)],
    });
    if !object::namespace(stable_ingress).is_empty() {
        metadata["namespace"] = json!(object::namespace(stable_ingress));
    }
    Ok(json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": metadata,
        "spec": spec,
    }))
}

/// `rule` with every path on the stable Service switched to the canary, or `None` when no path
/// reaches the stable Service.
fn canary_rule(rule: &Value, services: &RolloutServices) -> Option<Value> {
    let mut rule = rule.clone();
    let mut reaches_stable = false;
    let paths = rule
        .pointer_mut("/http/paths")
        .and_then(Value::as_array_mut)?;
    for path in paths {
        if let Some(service) = path.pointer_mut("/backend/service/name")
            && service.as_str() == Some(services.stable.as_str())
        {
            *service = json!(services.canary);
            reaches_stable = true;
        }
    }
    reaches_stable.then_some(rule)
}

/// The controller reference from a canary Ingress to its Rollout.
fn owner_reference(rollout: &Rollout) -> Value {
    json!({
        "apiVersion": format!("{}/{}", rollouts_crds::GROUP, rollouts_crds::VERSION),
        "kind": "Rollout",
        "name": rollout.metadata.name.as_deref().unwrap_or_default(),
        "uid": rollout.metadata.uid.as_deref().unwrap_or_default(),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

/// Refuse a canary Ingress that is not controlled by `rollout` (it is someone else's object).
pub fn check_controlled_by(canary_ingress: &Value, rollout: &Rollout) -> Result<()> {
    let controller = canary_ingress
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|owner| owner["controller"].as_bool() == Some(true));
    let is_ours = controller.is_some_and(|owner| {
        owner["kind"].as_str() == Some("Rollout")
            && match rollout.metadata.uid.as_deref() {
                Some(uid) => owner["uid"].as_str() == Some(uid),
                None => owner["name"].as_str() == rollout.metadata.name.as_deref(),
            }
    });
    if is_ours {
        return Ok(());
    }
    Err(Error::NotOwned {
        object: object::reference(canary_ingress),
        owner: controller
            .map(|owner| {
                format!(
                    "{} {}",
                    owner["kind"].as_str().unwrap_or_default(),
                    owner["name"].as_str().unwrap_or_default()
                )
            })
            .unwrap_or_else(|| "no controller".to_string()),
        rollout: crate::rollout_reference(rollout),
    })
}

/// Whether `found` (the canary Ingress in the cluster) differs from `desired` in a field this
/// router writes, so that an apply is needed.
pub fn needs_write(found: Option<&Value>, desired: &Value, prefix: &str) -> bool {
    let Some(found) = found else {
        return true;
    };
    // The spec is all ours: a field we stopped writing (TLS removed from the stable) must go.
    let spec_keys_wanted = |key: &String| desired["spec"].get(key).is_some();
    let extra_spec = found["spec"]
        .as_object()
        .is_some_and(|spec| !spec.keys().all(spec_keys_wanted));
    if extra_spec
        || !holds(&found["spec"], &desired["spec"])
        || !holds(
            &found["metadata"]["ownerReferences"],
            &desired["metadata"]["ownerReferences"],
        )
    {
        return true;
    }
    // Annotations this router wrote before and no longer wants must go too.
    let mut keys: Vec<String> = applied_annotation_keys(found, FIELD_MANAGER);
    keys.extend(CANARY_KEYS.iter().map(|key| format!("{prefix}/{key}")));
    if let Some(wanted) = desired
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
    {
        keys.extend(wanted.keys().cloned());
    }
    keys.iter().any(|key| {
        found
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(key))
            != desired
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(key))
    })
}

/// Whether a canary Ingress holds `weight` (and the Rollout's weight total).
pub fn verify_weight(canary_ingress: &Value, rollout: &Rollout, weight: i32) -> bool {
    let prefix = annotation_prefix(rollout);
    let annotation = |key: &str| {
        canary_ingress
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(format!("{prefix}/{key}")))
            .and_then(Value::as_str)
    };
    let total_holds = match rollout
        .canary()
        .and_then(|canary| canary.traffic_routing.as_ref())
        .and_then(|routing| routing.max_traffic_weight)
    {
        Some(total) => annotation("canary-weight-total") == Some(total.to_string().as_str()),
        None => annotation("canary-weight-total").is_none_or(|t| t == "100"),
    };
    annotation("canary") == Some("true")
        && canary_weight(canary_ingress, &prefix) == Some(weight)
        && total_holds
}

/// What a write changes on each canary Ingress; the rest is kept as found.
enum CanaryChange {
    Weight(i32),
    HeaderRoute(Option<NginxHeaderRoute>),
    RemoveHeaderRoute,
}

/// The nginx router of one Rollout.
pub struct NginxRouter {
    client: kube::Client,
    rollout: Rollout,
    services: RolloutServices,
}

impl NginxRouter {
    pub fn new(client: kube::Client, rollout: Rollout) -> Result<Self> {
        let services = rollout_services(&rollout)?;
        Ok(NginxRouter {
            client,
            rollout,
            services,
        })
    }

    fn namespace(&self) -> &str {
        self.rollout
            .metadata
            .namespace
            .as_deref()
            .unwrap_or("default")
    }

    fn stable_ingresses(&self) -> Result<Vec<String>> {
        let names: Vec<String> = self
            .rollout
            .canary()
            .and_then(|canary| canary.traffic_routing.as_ref())
            .and_then(|routing| routing.nginx.as_ref())
            .map(|nginx| {
                nginx
                    .stable_ingress_names()
                    .into_iter()
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        if names.is_empty() {
            return Err(invalid_spec(
                &self.rollout,
                "spec.strategy.canary.trafficRouting.nginx.stableIngress",
                "name the stable Ingress (stableIngress or stableIngresses)",
            ));
        }
        Ok(names)
    }

    async fn stable_ingress(&self, name: &str) -> Result<Value> {
        shell::get(&self.client, INGRESS, self.namespace(), name)
            .await?
            .ok_or_else(|| Error::NotFound {
                kind: "Ingress",
                object: format!("{}/{name}", self.namespace()),
                rollout: crate::rollout_reference(&self.rollout),
                field: "spec.strategy.canary.trafficRouting.nginx.stableIngress".to_string(),
            })
    }

    async fn change(&self, change: CanaryChange) -> Result<Written> {
        let prefix = annotation_prefix(&self.rollout);
        let rollout_name = self.rollout.metadata.name.as_deref().unwrap_or_default();
        let mut written = Vec::new();
        for stable_name in self.stable_ingresses()? {
            let stable = self.stable_ingress(&stable_name).await?;
            let canary_name = canary_ingress_name(rollout_name, &stable_name);
            let plan = |found: Option<&Value>| {
                if let Some(found) = found {
                    check_controlled_by(found, &self.rollout)?;
                }
                let (weight, header) = match &change {
                    CanaryChange::Weight(weight) => (
                        *weight,
                        found.and_then(|f| NginxHeaderRoute::of_canary_ingress(f, &prefix)),
                    ),
                    CanaryChange::HeaderRoute(header) => (
                        found.and_then(|f| canary_weight(f, &prefix)).unwrap_or(0),
                        header.clone(),
                    ),
                    CanaryChange::RemoveHeaderRoute => match found {
                        Some(found) => (canary_weight(found, &prefix).unwrap_or(0), None),
                        // Removal never creates a canary Ingress.
                        None => return Ok(None),
                    },
                };
                let desired = desired_canary_ingress(
                    &stable,
                    &self.rollout,
                    &self.services,
                    weight,
                    header.as_ref(),
                )?;
                Ok(needs_write(found, &desired, &prefix).then_some(desired))
            };
            written.extend(
                shell::update(&self.client, INGRESS, self.namespace(), &canary_name, plan).await?,
            );
        }
        Ok(written)
    }
}

impl TrafficRouter for NginxRouter {
    fn kind(&self) -> RouterKind {
        RouterKind::Nginx
    }

    fn set_weight<'a>(
        &'a self,
        desired_weight: i32,
        _additional: &'a [WeightDestination],
    ) -> RouterFuture<'a, Written> {
        Box::pin(async move {
            check_weight(&self.rollout, desired_weight)?;
            self.change(CanaryChange::Weight(desired_weight)).await
        })
    }

    fn update_hash<'a>(
        &'a self,
        _canary_hash: &'a str,
        _stable_hash: &'a str,
        _additional: &'a [WeightDestination],
    ) -> RouterFuture<'a, Written> {
        // The canary Ingress routes to Services, whose selectors the controller keeps on the hashes.
        Box::pin(async { Ok(Vec::new()) })
    }

    fn set_header_route<'a>(
        &'a self,
        header_route: &'a SetHeaderRoute,
    ) -> RouterFuture<'a, Written> {
        Box::pin(async move {
            managed_route_name(
                &self.rollout,
                header_route.name.as_deref(),
                "setHeaderRoute",
            )?;
            let header = NginxHeaderRoute::from_step(&self.rollout, header_route)?;
            self.change(CanaryChange::HeaderRoute(header)).await
        })
    }

    fn set_mirror_route<'a>(
        &'a self,
        mirror_route: &'a SetMirrorRoute,
    ) -> RouterFuture<'a, Written> {
        Box::pin(async move {
            // ingress-nginx has no per-canary mirroring; Argo Rollouts skips the step the same way.
            tracing::warn!(
                rollout = %crate::rollout_reference(&self.rollout),
                route = %mirror_route.name,
                "nginx cannot mirror traffic to a canary: setMirrorRoute is skipped"
            );
            Ok(Vec::new())
        })
    }

    fn verify_weight<'a>(
        &'a self,
        desired_weight: i32,
        _additional: &'a [WeightDestination],
    ) -> RouterFuture<'a, Option<bool>> {
        Box::pin(async move {
            let rollout_name = self.rollout.metadata.name.as_deref().unwrap_or_default();
            for stable_name in self.stable_ingresses()? {
                let canary_name = canary_ingress_name(rollout_name, &stable_name);
                let found =
                    shell::get(&self.client, INGRESS, self.namespace(), &canary_name).await?;
                if !found
                    .is_some_and(|canary| verify_weight(&canary, &self.rollout, desired_weight))
                {
                    return Ok(Some(false));
                }
            }
            Ok(Some(true))
        })
    }

    fn remove_managed_routes(&self) -> RouterFuture<'_, Written> {
        Box::pin(async move { self.change(CanaryChange::RemoveHeaderRoute).await })
    }
}
