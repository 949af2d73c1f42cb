//! Checks on a Rollout's spec (canary or blue-green) that the planner relies on, with errors
//! that name the field and the fix. Argo's controller rejects the same specs.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use rollouts_crds::FieldError;
use rollouts_crds::rollout::{
    BlueGreenStrategy, CanaryStep, CanaryStrategy, GATEWAY_API_PLUGIN, Rollout, RolloutAnalysis,
    RolloutTrafficRouting, StringMatch,
};

use super::replicas::{Fenceposts, MAX_WEIGHT, resolve_fenceposts};

/// What validation resolved for planning.
pub(super) struct ValidSpec {
    pub template: serde_json::Value,
    pub fenceposts: Fenceposts,
    /// Per step: the pause length of a timed pause step, `None` otherwise.
    pub pause_durations: Vec<Option<Duration>>,
}

/// Checks what the planner relies on; Argo rejects the same specs. A spec with `trafficRouting`
/// is then refused as a whole until the act phase calls the routers.
pub(super) fn validate(
    rollout: &Rollout,
    canary: &CanaryStrategy,
) -> Result<ValidSpec, FieldError> {
    let valid = validate_canary(rollout, canary)?;
    if !TRAFFIC_ROUTING_APPLIED {
        refuse_traffic_routing_until_applied(canary)?;
    }
    Ok(valid)
}

/// The gate: `true` since the act phase applies [`super::TrafficPlan`] to the routers (and
/// re-asserts it on every reconcile), so routed canaries are planned instead of refused.
pub(super) const TRAFFIC_ROUTING_APPLIED: bool = true;

/// Refuses `trafficRouting`: the planner sizes ReplicaSets and status weights for it, but this
/// controller version does not yet send those weights to any router, so status would claim
/// weights that no router holds.
fn refuse_traffic_routing_until_applied(canary: &CanaryStrategy) -> Result<(), FieldError> {
    if canary.traffic_routing.is_none() {
        return Ok(());
    }
    Err(FieldError::new(
        TRAFFIC_ROUTING,
        "trafficRouting is planned but not yet applied by this controller version, so no router would receive the canary weight",
        "remove trafficRouting to run a basic canary (weights approximated by pod counts), or use a controller version that applies traffic routing",
    ))
}

const TRAFFIC_ROUTING: &str = "spec.strategy.canary.trafficRouting";

/// Every check of a canary spec, `trafficRouting` included, without the gate.
pub(super) fn validate_canary(
    rollout: &Rollout,
    canary: &CanaryStrategy,
) -> Result<ValidSpec, FieldError> {
    let template = validate_template(rollout)?;
    let replicas = rollout.spec.effective_replicas();
    if is_zero(canary.max_surge.as_ref()) && is_zero(canary.max_unavailable.as_ref()) {
        return Err(FieldError::new(
            "spec.strategy.canary.maxSurge",
            "maxSurge and maxUnavailable are both zero, so no pod could ever be replaced",
            "set maxSurge or maxUnavailable above zero",
        ));
    }
    let fenceposts = resolve_fenceposts(
        canary.max_surge.as_ref(),
        canary.max_unavailable.as_ref(),
        replicas,
    )?;
    if canary.canary_service.is_some() && canary.canary_service == canary.stable_service {
        return Err(FieldError::new(
            "spec.strategy.canary.canaryService",
            "the stable and canary services are the same Service, but two are required",
            "name a different Service in canaryService or stableService",
        ));
    }
    let max_weight = match canary.traffic_routing.as_ref() {
        Some(routing) => validate_traffic_routing(canary, routing)?,
        None => {
            validate_basic_canary(canary)?;
            MAX_WEIGHT
        }
    };
    let mut pause_durations = Vec::new();
    for (index, step) in canary.steps().iter().enumerate() {
        let path = format!("spec.strategy.canary.steps[{index}]");
        let kinds = step.kinds();
        if kinds.len() != 1 {
            return Err(FieldError::new(
                &path,
                format!(
                    "a step sets exactly one kind, this one sets {}",
                    kinds.len()
                ),
                "split it into one step per setWeight, pause or analysis",
            ));
        }
        let mut pause_duration = None;
        match kinds[0] {
            "setWeight" => {
                let weight = step.set_weight.unwrap_or_default();
                if !(0..=max_weight).contains(&weight) {
                    return Err(FieldError::new(
                        format!("{path}.setWeight"),
                        format!("{weight} is outside 0..={max_weight}"),
                        format!("use a weight between 0 and {max_weight}"),
                    ));
                }
            }
            "pause" => {
                let pause = step.pause.as_ref().map(|pause| pause.duration());
                pause_duration = match pause {
                    Some(Ok(duration)) => duration,
                    Some(Err(reason)) => {
                        return Err(FieldError::new(
                            format!("{path}.pause.duration"),
                            reason,
                            "write seconds (30) or a duration (\"30s\", \"5m\", \"1h\")",
                        ));
                    }
                    None => None,
                };
            }
            "analysis" => {
                let templates = step.analysis.as_ref().map_or(0, |a| a.templates().len());
                if templates == 0 {
                    return Err(FieldError::new(
                        format!("{path}.analysis.templates"),
                        "an analysis step needs at least one template",
                        "list the AnalysisTemplate(s) to run under templates",
                    ));
                }
            }
            "setCanaryScale" | "setHeaderRoute" | "setMirrorRoute"
                if canary.traffic_routing.is_none() =>
            {
                return Err(FieldError::new(
                    format!("{path}.{}", kinds[0]),
                    format!("{} requires trafficRouting", kinds[0]),
                    "configure spec.strategy.canary.trafficRouting or remove the step",
                ));
            }
            "setCanaryScale" => validate_set_canary_scale(step, &path, max_weight)?,
            "setHeaderRoute" => validate_set_header_route(canary, step, &path)?,
            "setMirrorRoute" => validate_set_mirror_route(canary, step, &path)?,
            other => {
                return Err(FieldError::new(
                    format!("{path}.{other}"),
                    format!("{other} steps are not supported by this controller yet"),
                    "remove the step",
                ));
            }
        }
        pause_durations.push(pause_duration);
    }
    Ok(ValidSpec {
        template,
        fenceposts,
        pause_durations,
    })
}

/// Fields that only mean something with a traffic router.
fn validate_basic_canary(canary: &CanaryStrategy) -> Result<(), FieldError> {
    for (field, present) in [
        (
            "scaleDownDelaySeconds",
            canary.scale_down_delay_seconds.is_some(),
        ),
        (
            "dynamicStableScale",
            canary.dynamic_stable_scale == Some(true),
        ),
    ] {
        if present {
            return Err(FieldError::new(
                format!("spec.strategy.canary.{field}"),
                "only takes effect with spec.strategy.canary.trafficRouting",
                format!("remove {field} or configure trafficRouting"),
            ));
        }
    }
    Ok(())
}

/// Checks a canary's `trafficRouting`; returns the weight total (`maxTrafficWeight`).
fn validate_traffic_routing(
    canary: &CanaryStrategy,
    routing: &RolloutTrafficRouting,
) -> Result<i32, FieldError> {
    let unsupported = [
        ("alb", routing.alb.is_some()),
        ("smi", routing.smi.is_some()),
        ("ambassador", routing.ambassador.is_some()),
        ("appMesh", routing.app_mesh.is_some()),
        ("traefik", routing.traefik.is_some()),
        ("apisix", routing.apisix.is_some()),
    ];
    if let Some((field, _)) = unsupported.iter().find(|(_, set)| *set) {
        return Err(FieldError::new(
            format!("{TRAFFIC_ROUTING}.{field}"),
            "this controller routes traffic through nginx, istio or the argoproj-labs/gatewayAPI plugin only",
            "configure one of those routers instead",
        ));
    }
    if let Some(name) = routing
        .plugins
        .iter()
        .flat_map(|plugins| plugins.keys())
        .find(|name| name.as_str() != GATEWAY_API_PLUGIN)
    {
        return Err(FieldError::new(
            format!("{TRAFFIC_ROUTING}.plugins.{name}"),
            "unknown traffic router plugin",
            format!("use the {GATEWAY_API_PLUGIN} plugin, nginx or istio"),
        ));
    }
    if routing.nginx.is_none()
        && routing.istio.is_none()
        && routing.plugin(GATEWAY_API_PLUGIN).is_none()
    {
        return Err(FieldError::new(
            TRAFFIC_ROUTING,
            "no traffic router is configured",
            format!("configure nginx, istio or the {GATEWAY_API_PLUGIN} plugin"),
        ));
    }
    if let Some(nginx) = routing.nginx.as_ref() {
        let named = nginx
            .stable_ingress
            .as_deref()
            .is_some_and(|name| !name.is_empty())
            || nginx
                .stable_ingresses
                .as_ref()
                .is_some_and(|names| !names.is_empty());
        if !named {
            return Err(FieldError::new(
                format!("{TRAFFIC_ROUTING}.nginx.stableIngress"),
                "nginx routing needs the Ingress that serves the stable Service",
                "name it in stableIngress (or list several in stableIngresses)",
            ));
        }
    }
    if let Some(istio) = routing.istio.as_ref()
        && istio.all_virtual_services().is_empty()
    {
        return Err(FieldError::new(
            format!("{TRAFFIC_ROUTING}.istio.virtualService"),
            "istio routing needs the VirtualService whose routes carry the weights",
            "name it in virtualService (or list several in virtualServices)",
        ));
    }
    if routing.max_traffic_weight.is_some() && routing.istio.is_some() {
        return Err(FieldError::new(
            format!("{TRAFFIC_ROUTING}.maxTrafficWeight"),
            "maxTrafficWeight is supported with nginx and plugin routers only (Istio weights are percentages)",
            "remove maxTrafficWeight, or route through nginx or the gatewayAPI plugin",
        ));
    }
    let max_weight = routing.max_traffic_weight.unwrap_or(MAX_WEIGHT);
    if max_weight <= 0 {
        return Err(FieldError::new(
            format!("{TRAFFIC_ROUTING}.maxTrafficWeight"),
            format!("{max_weight} is not a positive weight total"),
            "set maxTrafficWeight above zero, or leave it out for 100",
        ));
    }
    if canary.ping_pong.is_some() {
        return Err(FieldError::new(
            "spec.strategy.canary.pingPong",
            "ping-pong services are not supported by this controller yet",
            "name the Services in stableService and canaryService instead",
        ));
    }
    for (field, service) in [
        ("stableService", &canary.stable_service),
        ("canaryService", &canary.canary_service),
    ] {
        if service.as_deref().unwrap_or_default().is_empty() {
            return Err(FieldError::new(
                format!("spec.strategy.canary.{field}"),
                "traffic routing splits traffic between a stable and a canary Service",
                format!("name an existing Service in {field}"),
            ));
        }
    }
    if canary.dynamic_stable_scale == Some(true) && canary.scale_down_delay_seconds.is_some() {
        return Err(FieldError::new(
            "spec.strategy.canary.dynamicStableScale",
            "dynamicStableScale cannot be used with scaleDownDelaySeconds",
            "remove one of dynamicStableScale or scaleDownDelaySeconds",
        ));
    }
    if let Some(seconds) = canary.scale_down_delay_seconds
        && seconds < 0
    {
        return Err(FieldError::new(
            "spec.strategy.canary.scaleDownDelaySeconds",
            format!("{seconds} is negative"),
            "set scaleDownDelaySeconds to 0 or more",
        ));
    }
    for (field, present) in [
        (
            "abortScaleDownDelaySeconds",
            canary.abort_scale_down_delay_seconds.is_some(),
        ),
        (
            "scaleDownDelayRevisionLimit",
            canary.scale_down_delay_revision_limit.is_some(),
        ),
    ] {
        if present {
            return Err(FieldError::new(
                format!("spec.strategy.canary.{field}"),
                "is not supported with trafficRouting by this controller yet (an aborted canary is scaled down once its weight is 0)",
                format!("remove {field}"),
            ));
        }
    }
    if let Some(min_pods) = canary.min_pods_per_replica_set
        && min_pods < 1
    {
        return Err(FieldError::new(
            "spec.strategy.canary.minPodsPerReplicaSet",
            format!("{min_pods} is below 1"),
            "set minPodsPerReplicaSet to 1 or more, or leave it out",
        ));
    }
    Ok(max_weight)
}

/// `setCanaryScale` sets exactly one of `replicas`, `weight` and `matchTrafficWeight: true`.
fn validate_set_canary_scale(
    step: &CanaryStep,
    path: &str,
    max_weight: i32,
) -> Result<(), FieldError> {
    let Some(scale) = step.set_canary_scale.as_ref() else {
        return Ok(());
    };
    let path = format!("{path}.setCanaryScale");
    let set = [
        scale.replicas.is_some(),
        scale.weight.is_some(),
        scale.match_traffic_weight == Some(true),
    ];
    if set.iter().filter(|set| **set).count() != 1 {
        return Err(FieldError::new(
            &path,
            "setCanaryScale sets exactly one of replicas, weight and matchTrafficWeight",
            "keep one of replicas, weight or matchTrafficWeight: true",
        ));
    }
    if let Some(replicas) = scale.replicas
        && replicas < 0
    {
        return Err(FieldError::new(
            format!("{path}.replicas"),
            format!("{replicas} is negative"),
            "set replicas to 0 or more",
        ));
    }
    if let Some(weight) = scale.weight
        && !(0..=max_weight).contains(&weight)
    {
        return Err(FieldError::new(
            format!("{path}.weight"),
            format!("{weight} is outside 0..={max_weight}"),
            format!("use a weight between 0 and {max_weight}"),
        ));
    }
    Ok(())
}

fn validate_set_header_route(
    canary: &CanaryStrategy,
    step: &CanaryStep,
    path: &str,
) -> Result<(), FieldError> {
    let Some(route) = step.set_header_route.as_ref() else {
        return Ok(());
    };
    let path = format!("{path}.setHeaderRoute");
    managed_route(canary, route.name.as_deref(), &path)?;
    for (index, header) in route.match_.iter().flatten().enumerate() {
        string_match(
            &header.header_value,
            &format!("{path}.match[{index}].headerValue"),
        )?;
    }
    Ok(())
}

fn validate_set_mirror_route(
    canary: &CanaryStrategy,
    step: &CanaryStep,
    path: &str,
) -> Result<(), FieldError> {
    let Some(route) = step.set_mirror_route.as_ref() else {
        return Ok(());
    };
    let path = format!("{path}.setMirrorRoute");
    managed_route(canary, Some(route.name.as_str()), &path)?;
    if let Some(percentage) = route.percentage
        && !(0..=100).contains(&percentage)
    {
        return Err(FieldError::new(
            format!("{path}.percentage"),
            format!("{percentage} is outside 0..=100"),
            "mirror a percentage of the matching requests between 0 and 100",
        ));
    }
    for (index, route_match) in route.match_.iter().flatten().enumerate() {
        let at = format!("{path}.match[{index}]");
        for (field, value) in [("method", &route_match.method), ("path", &route_match.path)] {
            if let Some(value) = value {
                string_match(value, &format!("{at}.{field}"))?;
            }
        }
        for (name, value) in route_match.headers.iter().flatten() {
            string_match(value, &format!("{at}.headers.{name}"))?;
        }
    }
    Ok(())
}

/// A step's route name must be listed in `managedRoutes`, or it would never be removed.
fn managed_route(
    canary: &CanaryStrategy,
    name: Option<&str>,
    path: &str,
) -> Result<(), FieldError> {
    let Some(name) = name.filter(|name| !name.is_empty()) else {
        return Err(FieldError::new(
            format!("{path}.name"),
            "a route step needs the name of the route it adds or removes",
            "name the route, and list the name under trafficRouting.managedRoutes",
        ));
    };
    let listed = canary
        .traffic_routing
        .as_ref()
        .is_some_and(|routing| routing.managed_route_names().contains(&name));
    if !listed {
        return Err(FieldError::new(
            format!("{path}.name"),
            format!("route {name:?} is not listed in {TRAFFIC_ROUTING}.managedRoutes"),
            format!("add {{name: {name}}} to {TRAFFIC_ROUTING}.managedRoutes"),
        ));
    }
    Ok(())
}

/// A string match sets exactly one of `exact`, `prefix` and `regex`.
fn string_match(value: &StringMatch, path: &str) -> Result<(), FieldError> {
    let set = [&value.exact, &value.prefix, &value.regex]
        .iter()
        .filter(|value| value.is_some())
        .count();
    if set != 1 {
        return Err(FieldError::new(
            path,
            format!("sets {set} of exact, prefix and regex"),
            "set exactly one of exact, prefix or regex",
        ));
    }
    Ok(())
}

/// The pod template and replica count every strategy needs.
fn validate_template(rollout: &Rollout) -> Result<serde_json::Value, FieldError> {
    let spec = &rollout.spec;
    let Some(template) = spec.template.as_ref() else {
        return Err(FieldError::new(
            "spec.template",
            "the Rollout has no pod template",
            "add spec.template with the pods to run",
        ));
    };
    let replicas = spec.effective_replicas();
    if replicas < 0 {
        return Err(FieldError::new(
            "spec.replicas",
            format!("{replicas} is negative"),
            "set spec.replicas to 0 or more",
        ));
    }
    Ok(serde_json::Value::Object(template.0.clone()))
}

/// Checks a blue-green spec; returns the pod template.
pub(super) fn validate_blue_green(
    rollout: &Rollout,
    blue_green: &BlueGreenStrategy,
) -> Result<serde_json::Value, FieldError> {
    let template = validate_template(rollout)?;
    let path = "spec.strategy.blueGreen";
    if rollout.spec.strategy.canary.is_some() {
        return Err(FieldError::new(
            "spec.strategy",
            "both blueGreen and canary are set, but a Rollout follows one strategy",
            "keep either spec.strategy.blueGreen or spec.strategy.canary",
        ));
    }
    let active = blue_green.active_service.as_deref().unwrap_or_default();
    if active.is_empty() {
        return Err(FieldError::new(
            format!("{path}.activeService"),
            "a blue-green rollout needs the Service that receives production traffic",
            "name an existing Service in activeService",
        ));
    }
    if blue_green.preview_service.as_deref() == Some(active) {
        return Err(FieldError::new(
            format!("{path}.activeService"),
            "the active and preview services are the same Service, but two are required",
            "name a different Service in previewService or activeService",
        ));
    }
    let replicas = rollout.spec.effective_replicas();
    if let Some(count) = blue_green.preview_replica_count
        && !(0..=replicas).contains(&count)
    {
        return Err(FieldError::new(
            format!("{path}.previewReplicaCount"),
            format!("{count} is outside 0..={replicas} (spec.replicas)"),
            "set previewReplicaCount between 0 and spec.replicas",
        ));
    }
    for (field, seconds) in [
        ("autoPromotionSeconds", blue_green.auto_promotion_seconds),
        ("scaleDownDelaySeconds", blue_green.scale_down_delay_seconds),
        (
            "scaleDownDelayRevisionLimit",
            blue_green.scale_down_delay_revision_limit,
        ),
        (
            "abortScaleDownDelaySeconds",
            blue_green.abort_scale_down_delay_seconds,
        ),
    ] {
        if let Some(value) = seconds
            && value < 0
        {
            return Err(FieldError::new(
                format!("{path}.{field}"),
                format!("{value} is negative"),
                format!("set {field} to 0 or more"),
            ));
        }
    }
    for (field, analysis) in [
        ("prePromotionAnalysis", &blue_green.pre_promotion_analysis),
        ("postPromotionAnalysis", &blue_green.post_promotion_analysis),
    ] {
        if analysis.as_ref().is_some_and(|a| a.templates().is_empty()) {
            return Err(no_templates(format!("{path}.{field}.templates")));
        }
    }
    Ok(template)
}

fn no_templates(path: String) -> FieldError {
    FieldError::new(
        path,
        "an analysis needs at least one template",
        "list the AnalysisTemplate(s) to run under templates",
    )
}

/// Whether `analysis` has templates to run.
pub(super) fn has_templates(analysis: Option<&RolloutAnalysis>) -> bool {
    analysis.is_some_and(|a| !a.templates().is_empty())
}

fn is_zero(value: Option<&IntOrString>) -> bool {
    match value {
        Some(IntOrString::Int(0)) => true,
        Some(IntOrString::String(text)) => text.trim_end_matches('%').trim() == "0",
        _ => false,
    }
}
