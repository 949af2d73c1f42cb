//! Traffic routers: how a canary's share of traffic reaches nginx Ingress, Istio and the Gateway
//! API.
//!
//! Each router module owns one pure transform per operation, from the router object found in the
//! cluster to the object wanted (JSON in, JSON out, so fields the router does not own survive), a
//! pure `verify_weight` that reads an object back, and a thin shell that reads the objects and
//! writes them with server-side apply under the field manager [`FIELD_MANAGER`]. The
//! [`TrafficRouter`] trait is what the controller calls; [`routers`] builds the routers a Rollout
//! configures.

pub mod error;
pub mod gatewayapi;
pub mod istio;
pub mod nginx;
pub mod object;
pub mod references;
mod shell;

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use rollouts_crds::rollout::{
    GATEWAY_API_PLUGIN, PING_PONG_PING, Rollout, RolloutTrafficRouting, SetHeaderRoute,
    SetMirrorRoute, WeightDestination,
};

pub use error::{Error, Result};
pub use references::{RouterObject, check_router_objects, router_objects};
pub use shell::{DESTINATION_RULE, HTTP_ROUTE, INGRESS, RouterObjectKind, VIRTUAL_SERVICE};

/// The field manager of every server-side apply the routers make.
pub const FIELD_MANAGER: &str = "rollouts-controller";

/// Weight total when `trafficRouting.maxTrafficWeight` is not set.
pub const DEFAULT_MAX_TRAFFIC_WEIGHT: i32 = 100;

/// The future a [`TrafficRouter`] method returns (boxed, so routers can sit behind `dyn`).
pub type RouterFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// Objects a write operation changed, as `Kind namespace/name`; empty when everything already
/// held the wanted state and nothing was written.
pub type Written = Vec<String>;

/// Which router a [`TrafficRouter`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouterKind {
    Nginx,
    Istio,
    GatewayApi,
}

impl fmt::Display for RouterKind {
    /// The names Argo Rollouts gives its routers (`Type()`), used in events and metrics.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RouterKind::Nginx => "Nginx",
            RouterKind::Istio => "Istio",
            RouterKind::GatewayApi => "GatewayAPI",
        })
    }
}

/// A traffic router, as the rollout reconciler drives it. Write operations are idempotent and make
/// no API write when the objects already hold the wanted state.
pub trait TrafficRouter: Send + Sync {
    /// Which router this is.
    fn kind(&self) -> RouterKind;

    /// Send `desired_weight` (out of `maxTrafficWeight`) to the canary, each `additional`
    /// destination (experiment services) its weight, and the rest to the stable.
    fn set_weight<'a>(
        &'a self,
        desired_weight: i32,
        additional: &'a [WeightDestination],
    ) -> RouterFuture<'a, Written>;

    /// Point the router's canary and stable subsets at these pod-template hashes (Istio
    /// DestinationRule); a no-op for routers that split by Service.
    fn update_hash<'a>(
        &'a self,
        canary_hash: &'a str,
        stable_hash: &'a str,
        additional: &'a [WeightDestination],
    ) -> RouterFuture<'a, Written>;

    /// Add (or, without `match`, remove) a route that sends matching requests to the canary.
    fn set_header_route<'a>(
        &'a self,
        header_route: &'a SetHeaderRoute,
    ) -> RouterFuture<'a, Written>;

    /// Add (or, without `match`, remove) a route that copies matching requests to the canary.
    fn set_mirror_route<'a>(
        &'a self,
        mirror_route: &'a SetMirrorRoute,
    ) -> RouterFuture<'a, Written>;

    /// Whether the router objects hold `desired_weight`: `None` when this router cannot tell.
    fn verify_weight<'a>(
        &'a self,
        desired_weight: i32,
        additional: &'a [WeightDestination],
    ) -> RouterFuture<'a, Option<bool>>;

    /// Remove every header and mirror route the Rollout added (end of the update, abort).
    fn remove_managed_routes(&self) -> RouterFuture<'_, Written>;
}

/// The routers `rollout` configures, each reading and writing through `client`. Routers this
/// controller does not implement are an [`Error::InvalidSpec`] naming the field.
pub fn routers(client: kube::Client, rollout: &Rollout) -> Result<Vec<Box<dyn TrafficRouter>>> {
    let routing = traffic_routing(rollout)?;
    let unsupported = [
        ("alb", routing.alb.is_some()),
        ("smi", routing.smi.is_some()),
        ("ambassador", routing.ambassador.is_some()),
        ("appMesh", routing.app_mesh.is_some()),
        ("traefik", routing.traefik.is_some()),
        ("apisix", routing.apisix.is_some()),
    ];
    if let Some((field, _)) = unsupported.iter().find(|(_, set)| *set) {
        return Err(invalid_spec(
            rollout,
            &format!("spec.strategy.canary.trafficRouting.{field}"),
            "this controller routes traffic through nginx, istio or the argoproj-labs/gatewayAPI plugin only; use one of those",
        ));
    }
    if let Some(name) = routing
        .plugins
        .iter()
        .flat_map(|plugins| plugins.keys())
        .find(|name| name.as_str() != GATEWAY_API_PLUGIN)
    {
        return Err(invalid_spec(
            rollout,
            &format!("spec.strategy.canary.trafficRouting.plugins.{name}"),
            &format!(
                "unknown traffic router plugin; the only plugin supported is {GATEWAY_API_PLUGIN}"
            ),
        ));
    }
    let mut routers: Vec<Box<dyn TrafficRouter>> = Vec::new();
    if routing.nginx.is_some() {
        routers.push(Box::new(nginx::NginxRouter::new(
            client.clone(),
            rollout.clone(),
        )?));
    }
    if routing.istio.is_some() {
        routers.push(Box::new(istio::IstioRouter::new(
            client.clone(),
            rollout.clone(),
        )?));
    }
    if routing.plugin(GATEWAY_API_PLUGIN).is_some() {
        routers.push(Box::new(gatewayapi::GatewayApiRouter::new(
            client,
            rollout.clone(),
        )?));
    }
    Ok(routers)
}

/// The Services a router splits traffic between.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutServices {
    pub stable: String,
    pub canary: String,
}

/// The stable and canary Services of `rollout`: `stableService` / `canaryService`, or, with
/// `pingPong` and neither set, the ping and pong Services in the roles `status.canary.stablePingPong`
/// gives them (as Argo Rollouts does for every router but ALB).
pub fn rollout_services(rollout: &Rollout) -> Result<RolloutServices> {
    let canary = rollout.canary().ok_or_else(|| {
        invalid_spec(
            rollout,
            "spec.strategy.canary",
            "traffic routing needs the canary strategy",
        )
    })?;
    let stable = canary.stable_service.clone().unwrap_or_default();
    let canary_service = canary.canary_service.clone().unwrap_or_default();
    if let (Some(ping_pong), true, true) = (
        &canary.ping_pong,
        stable.is_empty(),
        canary_service.is_empty(),
    ) {
        let stable_is_ping = rollout
            .status
            .as_ref()
            .is_some_and(|status| status.canary.stable_ping_pong == PING_PONG_PING);
        let (stable, canary) = if stable_is_ping {
            (&ping_pong.ping_service, &ping_pong.pong_service)
        } else {
            (&ping_pong.pong_service, &ping_pong.ping_service)
        };
        return Ok(RolloutServices {
            stable: stable.clone(),
            canary: canary.clone(),
        });
    }
    if stable.is_empty() || canary_service.is_empty() {
        return Err(invalid_spec(
            rollout,
            "spec.strategy.canary.stableService",
            "traffic routing needs both stableService and canaryService (or pingPong); set them",
        ));
    }
    Ok(RolloutServices {
        stable,
        canary: canary_service,
    })
}

/// The total weights are expressed against: `maxTrafficWeight`, else 100.
pub fn max_traffic_weight(rollout: &Rollout) -> i32 {
    rollout
        .canary()
        .and_then(|canary| canary.traffic_routing.as_ref())
        .and_then(|routing| routing.max_traffic_weight)
        .unwrap_or(DEFAULT_MAX_TRAFFIC_WEIGHT)
}

/// `spec.strategy.canary.trafficRouting`, or an error saying it is missing.
pub fn traffic_routing(rollout: &Rollout) -> Result<&RolloutTrafficRouting> {
    rollout
        .canary()
        .and_then(|canary| canary.traffic_routing.as_ref())
        .ok_or_else(|| {
            invalid_spec(
                rollout,
                "spec.strategy.canary.trafficRouting",
                "no traffic router is configured",
            )
        })
}

/// Names of every route the Rollout may add: `managedRoutes`, plus the names its
/// `setHeaderRoute` / `setMirrorRoute` steps use (Argo removes both at the end of an update).
pub fn managed_route_names(rollout: &Rollout) -> Vec<String> {
    let mut names: Vec<String> = rollout
        .canary()
        .and_then(|canary| canary.traffic_routing.as_ref())
        .map(|routing| {
            routing
                .managed_route_names()
                .into_iter()
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    for step in rollout.canary().map(|c| c.steps()).unwrap_or_default() {
        let step_names = [
            step.set_header_route.as_ref().and_then(|r| r.name.clone()),
            step.set_mirror_route.as_ref().map(|r| r.name.clone()),
        ];
        for name in step_names.into_iter().flatten() {
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names
}

/// `namespace/name` of a Rollout, for messages.
pub fn rollout_reference(rollout: &Rollout) -> String {
    format!(
        "{}/{}",
        rollout.metadata.namespace.as_deref().unwrap_or_default(),
        rollout.metadata.name.as_deref().unwrap_or_default()
    )
}

/// An [`Error::InvalidSpec`] about `rollout`.
pub(crate) fn invalid_spec(rollout: &Rollout, field: &str, reason: &str) -> Error {
    Error::InvalidSpec {
        rollout: rollout_reference(rollout),
        field: field.to_string(),
        reason: reason.to_string(),
    }
}

/// Refuse a weight outside `0..=maxTrafficWeight` (it would give the stable a negative share).
pub(crate) fn check_weight(rollout: &Rollout, desired_weight: i32) -> Result<()> {
    let total = max_traffic_weight(rollout);
    if (0..=total).contains(&desired_weight) {
        return Ok(());
    }
    Err(invalid_spec(
        rollout,
        "spec.strategy.canary.steps[].setWeight",
        &format!(
            "weight {desired_weight} is outside 0..={total}; set a weight within maxTrafficWeight"
        ),
    ))
}

/// The name of a header or mirror route, checked against `managedRoutes` (a route the Rollout
/// does not list would never be removed).
pub(crate) fn managed_route_name<'a>(
    rollout: &Rollout,
    name: Option<&'a str>,
    step_field: &str,
) -> Result<&'a str> {
    let name = name.filter(|n| !n.is_empty()).ok_or_else(|| {
        invalid_spec(
            rollout,
            &format!("{step_field}.name"),
            "a route name is required",
        )
    })?;
    let listed = rollout
        .canary()
        .and_then(|canary| canary.traffic_routing.as_ref())
        .is_some_and(|routing| routing.managed_route_names().contains(&name));
    if !listed {
        return Err(invalid_spec(
            rollout,
            &format!("{step_field}.name"),
            &format!(
                "route {name:?} is not listed in spec.strategy.canary.trafficRouting.managedRoutes; add it there"
            ),
        ));
    }
    Ok(name)
}
