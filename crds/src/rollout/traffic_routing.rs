//! `spec.strategy.canary.trafficRouting`: which router splits traffic, and how it is configured.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::preserve_unknown_object_schema;

/// The traffic routers a canary may use. Several may be set at once (Argo allows it).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutTrafficRouting {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub istio: Option<IstioTrafficRouting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nginx: Option<NginxTrafficRouting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alb: Option<AlbTrafficRouting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smi: Option<SmiTrafficRouting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ambassador: Option<AmbassadorTrafficRouting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_mesh: Option<AppMeshTrafficRouting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traefik: Option<TraefikTrafficRouting>,
    /// Header and mirror routes the controller may add, in precedence order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed_routes: Option<Vec<ManagedRoute>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apisix: Option<ApisixTrafficRouting>,
    /// Router plugins by name (`argoproj-labs/gatewayAPI`), each with its own configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object_schema")]
    pub plugins: Option<Map<String, Value>>,
    /// The total that weights are expressed against; defaults to 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_traffic_weight: Option<i32>,
}

impl RolloutTrafficRouting {
    /// The managed route names, in precedence order.
    pub fn managed_route_names(&self) -> Vec<&str> {
        self.managed_routes
            .iter()
            .flatten()
            .map(|r| r.name.as_str())
            .collect()
    }

    /// Configuration of a router plugin, by its registered name.
    pub fn plugin(&self, name: &str) -> Option<&Value> {
        self.plugins.as_ref().and_then(|p| p.get(name))
    }
}

/// Plugin name of the Gateway API router (as Argo's plugin registers it).
pub const GATEWAY_API_PLUGIN: &str = "argoproj-labs/gatewayAPI";

/// A route the controller manages (created by `setHeaderRoute` / `setMirrorRoute`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManagedRoute {
    pub name: String,
}

/// Traefik: a weighted TraefikService.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TraefikTrafficRouting {
    pub weighted_traefik_service_name: String,
}

/// Apache APISIX: an ApisixRoute.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApisixTrafficRouting {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<ApisixRoute>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApisixRoute {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<Vec<String>>,
}

/// Ambassador: Mappings to clone for the canary.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AmbassadorTrafficRouting {
    pub mappings: Vec<String>,
}

/// SMI: a TrafficSplit.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SmiTrafficRouting {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_service: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_split_name: Option<String>,
}

/// NGINX Ingress: a canary Ingress cloned from the stable one, weighted by annotations.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NginxTrafficRouting {
    /// Annotation prefix; defaults to `nginx.ingress.kubernetes.io`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotation_prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_ingress: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub additional_ingress_annotations: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_ingresses: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_ingress_annotations: Option<BTreeMap<String, String>>,
}

impl NginxTrafficRouting {
    /// Every stable Ingress named, `stableIngress` first.
    pub fn stable_ingress_names(&self) -> Vec<&str> {
        self.stable_ingress
            .iter()
            .chain(self.stable_ingresses.iter().flatten())
            .map(String::as_str)
            .collect()
    }
}

/// Istio: host-level (VirtualService routes between two services) or subset-level
/// (DestinationRule subsets) splitting.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IstioTrafficRouting {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_service: Option<IstioVirtualService>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_rule: Option<IstioDestinationRule>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_services: Option<Vec<IstioVirtualService>>,
}

impl IstioTrafficRouting {
    /// Every VirtualService named, `virtualService` first.
    pub fn all_virtual_services(&self) -> Vec<&IstioVirtualService> {
        self.virtual_service
            .iter()
            .chain(self.virtual_services.iter().flatten())
            .collect()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IstioVirtualService {
    /// `name` or `name.namespace`.
    pub name: String,
    /// HTTP route names to weight; may be omitted when the VirtualService has one route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routes: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_routes: Option<Vec<TlsRoute>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_routes: Option<Vec<TcpRoute>>,
}

/// A TLS route of a VirtualService, identified by port and SNI hosts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsRoute {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sni_hosts: Option<Vec<String>>,
}

/// A TCP route of a VirtualService, identified by port.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TcpRoute {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IstioDestinationRule {
    pub name: String,
    pub canary_subset_name: String,
    pub stable_subset_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub additional_subset_names: Option<Vec<String>>,
}

/// AWS App Mesh.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppMeshTrafficRouting {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_service: Option<AppMeshVirtualService>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_node_group: Option<AppMeshVirtualNodeGroup>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppMeshVirtualService {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routes: Option<Vec<String>>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppMeshVirtualNodeGroup {
    pub canary_virtual_node_ref: AppMeshVirtualNodeReference,
    pub stable_virtual_node_ref: AppMeshVirtualNodeReference,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppMeshVirtualNodeReference {
    pub name: String,
}

/// AWS Load Balancer Controller Ingress.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AlbTrafficRouting {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<String>,
    pub service_port: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_service: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotation_prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stickiness_config: Option<StickinessConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingresses: Option<Vec<String>>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StickinessConfig {
    pub enabled: bool,
    pub duration_seconds: i64,
}
