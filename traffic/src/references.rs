//! The router objects a Rollout names: the ones that must exist before it is acted on, and the
//! ones a change to which must bring the Rollout's routers back (watches map events through
//! [`router_objects`]).

use rollouts_crds::rollout::{GATEWAY_API_PLUGIN, Rollout};

use crate::gatewayapi::GatewayApiConfig;
use crate::nginx::canary_ingress_name;
use crate::object::split_reference;
use crate::shell::{
    self, DESTINATION_RULE, HTTP_ROUTE, INGRESS, RouterObjectKind, VIRTUAL_SERVICE,
};
use crate::{Error, Result, rollout_reference};

/// One router object of a Rollout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouterObject {
    pub kind: RouterObjectKind,
    pub namespace: String,
    pub name: String,
    /// The Rollout field naming it; `None` for objects the router creates (the canary Ingress).
    pub field: Option<&'static str>,
}

impl RouterObject {
    /// Whether a watch event about `kind` `namespace/name` concerns this object.
    pub fn is(&self, kind: &str, namespace: &str, name: &str) -> bool {
        self.kind.kind == kind && self.namespace == namespace && self.name == name
    }
}

const NGINX_FIELD: &str = "spec.strategy.canary.trafficRouting.nginx.stableIngress";
const VIRTUAL_SERVICE_FIELD: &str = "spec.strategy.canary.trafficRouting.istio.virtualService.name";
const DESTINATION_RULE_FIELD: &str =
    "spec.strategy.canary.trafficRouting.istio.destinationRule.name";
const HTTP_ROUTE_FIELD: &str =
    "spec.strategy.canary.trafficRouting.plugins.argoproj-labs/gatewayAPI.httpRoutes";

/// Every router object `rollout` names or makes: stable and canary Ingresses, VirtualServices,
/// the DestinationRule, HTTPRoutes. Empty without `trafficRouting`; a plugin configuration that
/// cannot be read names nothing (the routers refuse it with the field).
pub fn router_objects(rollout: &Rollout) -> Vec<RouterObject> {
    let Some(routing) = rollout
        .canary()
        .and_then(|canary| canary.traffic_routing.as_ref())
    else {
        return Vec::new();
    };
    let namespace = rollout.metadata.namespace.as_deref().unwrap_or("default");
    let rollout_name = rollout.metadata.name.as_deref().unwrap_or_default();
    let mut objects = Vec::new();
    for stable in routing
        .nginx
        .iter()
        .flat_map(|nginx| nginx.stable_ingress_names())
    {
        objects.push(RouterObject {
            kind: INGRESS,
            namespace: namespace.to_string(),
            name: stable.to_string(),
            field: Some(NGINX_FIELD),
        });
        objects.push(RouterObject {
            kind: INGRESS,
            namespace: namespace.to_string(),
            name: canary_ingress_name(rollout_name, stable),
            field: None,
        });
    }
    if let Some(istio) = routing.istio.as_ref() {
        for vs in istio.all_virtual_services() {
            let (vs_namespace, name) = split_reference(&vs.name, namespace);
            objects.push(RouterObject {
                kind: VIRTUAL_SERVICE,
                namespace: vs_namespace,
                name,
                field: Some(VIRTUAL_SERVICE_FIELD),
            });
        }
        if let Some(rule) = istio.destination_rule.as_ref() {
            objects.push(RouterObject {
                kind: DESTINATION_RULE,
                namespace: namespace.to_string(),
                name: rule.name.clone(),
                field: Some(DESTINATION_RULE_FIELD),
            });
        }
    }
    if routing.plugin(GATEWAY_API_PLUGIN).is_some()
        && let Ok(config) = GatewayApiConfig::of(rollout)
    {
        let route_namespace = config
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| namespace.to_string());
        for route in config.routes() {
            objects.push(RouterObject {
                kind: HTTP_ROUTE,
                namespace: route_namespace.clone(),
                name: route.name,
                field: Some(HTTP_ROUTE_FIELD),
            });
        }
    }
    objects
}

/// Checks that every router object the Rollout names exists; the first missing one is an
/// [`Error::NotFound`] naming it and the field. A kind whose CRD is not installed reads as missing.
pub async fn check_router_objects(client: &kube::Client, rollout: &Rollout) -> Result<()> {
    for object in router_objects(rollout) {
        let Some(field) = object.field else {
            continue;
        };
        if shell::get(client, object.kind, &object.namespace, &object.name)
            .await?
            .is_none()
        {
            return Err(Error::NotFound {
                kind: object.kind.kind,
                object: format!("{}/{}", object.namespace, object.name),
                rollout: rollout_reference(rollout),
                field: field.to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rollout(routing: serde_json::Value) -> Rollout {
        serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Rollout",
            "metadata": {"name": "shop", "namespace": "apps"},
            "spec": {"strategy": {"canary": {
                "stableService": "shop-stable",
                "canaryService": "shop-canary",
                "trafficRouting": routing
            }}}
        }))
        .expect("a Rollout")
    }

    fn names(objects: &[RouterObject]) -> Vec<(&str, String, bool)> {
        objects
            .iter()
            .map(|o| {
                (
                    o.kind.kind,
                    format!("{}/{}", o.namespace, o.name),
                    o.field.is_some(),
                )
            })
            .collect()
    }

    #[test]
    fn nginx_names_the_stable_ingress_and_makes_the_canary_one() {
        let objects = router_objects(&rollout(json!({"nginx": {"stableIngress": "shop"}})));
        assert_eq!(
            names(&objects),
            vec![
                ("Ingress", "apps/shop".to_string(), true),
                ("Ingress", "apps/shop-shop-canary".to_string(), false),
            ]
        );
        assert!(objects[1].is("Ingress", "apps", "shop-shop-canary"));
        assert!(!objects[1].is("Ingress", "default", "shop-shop-canary"));
    }

    #[test]
    fn istio_names_virtual_services_in_their_namespace_and_the_destination_rule() {
        let objects = router_objects(&rollout(json!({"istio": {
            "virtualServices": [{"name": "front"}, {"name": "edge.gateways"}],
            "destinationRule": {"name": "shop", "canarySubsetName": "canary", "stableSubsetName": "stable"}
        }})));
        assert_eq!(
            names(&objects),
            vec![
                ("VirtualService", "apps/front".to_string(), true),
                ("VirtualService", "gateways/edge".to_string(), true),
                ("DestinationRule", "apps/shop".to_string(), true),
            ]
        );
    }

    #[test]
    fn the_gateway_api_plugin_names_its_http_routes() {
        let objects = router_objects(&rollout(json!({"plugins": {
            "argoproj-labs/gatewayAPI": {"httpRoute": "shop", "namespace": "edge"}
        }})));
        assert_eq!(
            names(&objects),
            vec![("HTTPRoute", "edge/shop".to_string(), true)]
        );
    }
}
