//! Spec validation of a Rollout, the one place its rules live: Argo Rollouts' checks plus ours
//! ([`validate`]), the routers this controller lacks ([`unsupported_features`]) and what its
//! planner does not plan yet ([`planning_limits`]). Each finding names the field, what is wrong
//! and how to fix it. A Rollout with findings gets an `InvalidSpec` condition and is not acted on.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::FieldError;
use crate::defaults::parse_percent;
use crate::rollout::{
    AnalysisRunArgument, AntiAffinity, BlueGreenStrategy, CanaryStep, CanaryStrategy,
    GATEWAY_API_PLUGIN, Rollout, RolloutAnalysis, RolloutPause, RolloutSpec, RolloutTrafficRouting,
    SCALE_DOWN_NEVER, SCALE_DOWN_ON_SUCCESS, SCALE_DOWN_PROGRESSIVELY, StringMatch,
};

/// The most pods any count of a Rollout may come to: `spec.replicas`, maxSurge and
/// maxUnavailable once resolved, `setCanaryScale.replicas`, `minPodsPerReplicaSet`. Far above
/// what one cluster runs (Kubernetes supports 150,000 pods per cluster); it keeps every sum of
/// pod counts the planner makes within `i32`.
pub const MAX_REPLICAS: i32 = 1_000_000;

/// The largest `trafficRouting.maxTrafficWeight`.
pub const MAX_TRAFFIC_WEIGHT: i32 = 1_000_000;

/// The longest a `...Seconds` field may be: one year, as every duration
/// ([`crate::duration::MAX`]).
pub const MAX_SECONDS: i32 = 365 * 24 * 3600;

/// Every problem found in the Rollout's spec; empty when it can be acted on.
pub fn validate(rollout: &Rollout) -> Vec<FieldError> {
    let mut errors = Vec::new();
    validate_spec(rollout, &mut errors);
    errors.extend(validate_strategy(rollout));
    validate_route_support(rollout, &mut errors);
    errors
}

/// The findings of [`validate`] under `spec.strategy` that the planner relies on: all but which
/// router supports a route step. They do not depend on where the pod template comes from, so
/// the planner checks them on a Rollout resolved from `workloadRef`.
pub fn validate_strategy(rollout: &Rollout) -> Vec<FieldError> {
    let mut errors = Vec::new();
    match (
        &rollout.spec.strategy.canary,
        &rollout.spec.strategy.blue_green,
    ) {
        (None, None) => errors.push(FieldError::new(
            "spec.strategy",
            "no strategy is set",
            "set exactly one of spec.strategy.canary or spec.strategy.blueGreen",
        )),
        (Some(_), Some(_)) => errors.push(FieldError::new(
            "spec.strategy",
            "both canary and blueGreen are set",
            "keep exactly one of spec.strategy.canary or spec.strategy.blueGreen",
        )),
        (Some(canary), None) => validate_canary(rollout, canary, &mut errors),
        (None, Some(blue_green)) => validate_blue_green(rollout, blue_green, &mut errors),
    }
    validate_bounds(rollout, &mut errors);
    errors
}

/// Counts, weights and seconds within [`MAX_REPLICAS`], [`MAX_TRAFFIC_WEIGHT`] and
/// [`MAX_SECONDS`], so no arithmetic on them can overflow. Negative values are findings of
/// their own rules.
fn validate_bounds(rollout: &Rollout, errors: &mut Vec<FieldError>) {
    let spec = &rollout.spec;
    let replicas = spec.replicas;
    at_most(replicas, MAX_REPLICAS, "spec.replicas", "pods", errors);
    at_most(
        spec.min_ready_seconds,
        MAX_SECONDS,
        "spec.minReadySeconds",
        "seconds",
        errors,
    );
    at_most(
        spec.progress_deadline_seconds,
        MAX_SECONDS,
        "spec.progressDeadlineSeconds",
        "seconds",
        errors,
    );
    let total = spec.effective_replicas().clamp(0, MAX_REPLICAS);
    if let Some(canary) = &spec.strategy.canary {
        let path = "spec.strategy.canary";
        let resolved = [
            ("maxSurge", canary.max_surge.as_ref(), true),
            ("maxUnavailable", canary.max_unavailable.as_ref(), false),
        ];
        for (field, value, round_up) in resolved {
            if let Some(value) = value {
                pod_count_bound(value, total, round_up, &format!("{path}.{field}"), errors);
            }
        }
        for (field, value) in [
            ("scaleDownDelaySeconds", canary.scale_down_delay_seconds),
            (
                "abortScaleDownDelaySeconds",
                canary.abort_scale_down_delay_seconds,
            ),
        ] {
            at_most(
                value,
                MAX_SECONDS,
                &format!("{path}.{field}"),
                "seconds",
                errors,
            );
        }
        at_most(
            canary.min_pods_per_replica_set,
            MAX_REPLICAS,
            &format!("{path}.minPodsPerReplicaSet"),
            "pods",
            errors,
        );
        at_most(
            canary
                .traffic_routing
                .as_ref()
                .and_then(|r| r.max_traffic_weight),
            MAX_TRAFFIC_WEIGHT,
            &format!("{path}.trafficRouting.maxTrafficWeight"),
            "",
            errors,
        );
        for (i, step) in canary.steps().iter().enumerate() {
            at_most(
                step.set_canary_scale.as_ref().and_then(|s| s.replicas),
                MAX_REPLICAS,
                &format!("{path}.steps[{i}].setCanaryScale.replicas"),
                "pods",
                errors,
            );
        }
    }
    if let Some(blue_green) = &spec.strategy.blue_green {
        let path = "spec.strategy.blueGreen";
        if let Some(value) = &blue_green.max_unavailable {
            pod_count_bound(
                value,
                total,
                false,
                &format!("{path}.maxUnavailable"),
                errors,
            );
        }
        for (field, value) in [
            ("scaleDownDelaySeconds", blue_green.scale_down_delay_seconds),
            (
                "abortScaleDownDelaySeconds",
                blue_green.abort_scale_down_delay_seconds,
            ),
            ("autoPromotionSeconds", blue_green.auto_promotion_seconds),
        ] {
            at_most(
                value,
                MAX_SECONDS,
                &format!("{path}.{field}"),
                "seconds",
                errors,
            );
        }
    }
}

/// `value` (when set) at most `max`.
fn at_most(value: Option<i32>, max: i32, path: &str, unit: &str, errors: &mut Vec<FieldError>) {
    if let Some(v) = value.filter(|v| *v > max) {
        let max_text = if unit.is_empty() {
            max.to_string()
        } else {
            format!("{max} {unit}")
        };
        errors.push(FieldError::new(
            path,
            format!("{v} is over the limit of {max_text}"),
            format!("set {path} to at most {max_text}"),
        ));
    }
}

/// maxSurge / maxUnavailable resolved against `total` pods: at most [`MAX_REPLICAS`], and a
/// percentage of maxUnavailable at most 100%. A value that does not parse or is negative is
/// reported by `validate_int_or_percent`.
fn pod_count_bound(
    value: &IntOrString,
    total: i32,
    round_up: bool,
    path: &str,
    errors: &mut Vec<FieldError>,
) {
    let fix = format!("set {path} to at most {MAX_REPLICAS} pods, or a percentage like \"25%\"");
    match crate::defaults::scaled_value(value, total, round_up) {
        Ok(count) if count > MAX_REPLICAS => errors.push(FieldError::new(
            path,
            format!(
                "{} comes to {count} pods, over the limit of {MAX_REPLICAS}",
                match value {
                    IntOrString::Int(n) => n.to_string(),
                    IntOrString::String(text) => format!("{text:?}"),
                }
            ),
            fix,
        )),
        Err(reason @ crate::defaults::IntOrPercentError::OutOfRange { .. }) => {
            errors.push(FieldError::new(path, reason.to_string(), fix));
        }
        _ => {}
    }
    if !round_up
        && let IntOrString::String(text) = value
        && parse_percent(text).is_ok_and(|p| p > 100)
    {
        errors.push(FieldError::new(
            path,
            format!("{text:?} is over 100%"),
            format!("set {path} to at most \"100%\""),
        ));
    }
}

/// Features Argo accepts but this controller cannot act on: traffic routers other than nginx,
/// Istio and the Gateway API plugin. Kept apart from [`validate`] so callers choose whether an
/// unsupported router is an `InvalidSpec`.
pub fn unsupported_features(rollout: &Rollout) -> Vec<FieldError> {
    let Some(routing) = rollout
        .spec
        .strategy
        .canary
        .as_ref()
        .and_then(|c| c.traffic_routing.as_ref())
    else {
        return Vec::new();
    };
    let path = "spec.strategy.canary.trafficRouting";
    let fix = "use nginx, istio or plugins.\"argoproj-labs/gatewayAPI\", or no trafficRouting for a replica-count canary";
    let mut errors = Vec::new();
    let unsupported = [
        ("alb", routing.alb.is_some()),
        ("smi", routing.smi.is_some()),
        ("ambassador", routing.ambassador.is_some()),
        ("appMesh", routing.app_mesh.is_some()),
        ("traefik", routing.traefik.is_some()),
        ("apisix", routing.apisix.is_some()),
    ];
    for (router, present) in unsupported {
        if present {
            errors.push(FieldError::new(
                format!("{path}.{router}"),
                format!("the {router} router is not supported by this controller"),
                fix,
            ));
        }
    }
    for name in routing.plugins.iter().flat_map(|p| p.keys()) {
        if name != GATEWAY_API_PLUGIN {
            errors.push(FieldError::new(
                format!("{path}.plugins.{name}"),
                format!("traffic router plugin {name:?} is not supported by this controller"),
                fix,
            ));
        }
    }
    errors
}

/// What this controller's planner refuses although [`validate`] and [`unsupported_features`]
/// accept it: step kinds and router settings it does not plan yet, and bounds it relies on.
/// Kept apart because Argo accepts these specs (some examples show them); the planner reports
/// them as `InvalidSpec` when it plans the Rollout.
pub fn planning_limits(rollout: &Rollout) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if let Some(canary) = &rollout.spec.strategy.canary {
        if let Some(routing) = &canary.traffic_routing {
            traffic_routing_limits(canary, routing, &mut errors);
        }
        for (index, step) in canary.steps().iter().enumerate() {
            step_limits(
                step,
                &format!("spec.strategy.canary.steps[{index}]"),
                &mut errors,
            );
        }
    }
    if let Some(blue_green) = &rollout.spec.strategy.blue_green {
        blue_green_limits(rollout, blue_green, &mut errors);
    }
    errors
}

fn traffic_routing_limits(
    canary: &CanaryStrategy,
    routing: &RolloutTrafficRouting,
    errors: &mut Vec<FieldError>,
) {
    let path = "spec.strategy.canary.trafficRouting";
    let supported = routing.nginx.is_some()
        || routing.istio.is_some()
        || routing.plugin(GATEWAY_API_PLUGIN).is_some();
    // Any other router is already a finding of unsupported_features.
    let unsupported = routing.alb.is_some()
        || routing.smi.is_some()
        || routing.ambassador.is_some()
        || routing.app_mesh.is_some()
        || routing.traefik.is_some()
        || routing.apisix.is_some()
        || routing.plugins.as_ref().is_some_and(|p| !p.is_empty());
    if !supported && !unsupported {
        errors.push(FieldError::new(
            path,
            "no traffic router is configured",
            format!("configure nginx, istio or the {GATEWAY_API_PLUGIN} plugin"),
        ));
    }
    if let Some(nginx) = &routing.nginx {
        let named = nginx
            .stable_ingress
            .as_deref()
            .is_some_and(|name| !name.is_empty())
            || nginx
                .stable_ingresses
                .as_ref()
                .is_some_and(|names| !names.is_empty());
        if !named {
            errors.push(FieldError::new(
                format!("{path}.nginx.stableIngress"),
                "nginx routing needs the Ingress that serves the stable Service",
                "name it in stableIngress (or list several in stableIngresses)",
            ));
        }
    }
    if let Some(istio) = &routing.istio {
        if istio.all_virtual_services().is_empty() {
            errors.push(FieldError::new(
                format!("{path}.istio.virtualService"),
                "istio routing needs the VirtualService whose routes carry the weights",
                "name it in virtualService (or list several in virtualServices)",
            ));
        }
        // Without nginx or a plugin this is already Argo's finding, made by validate.
        let argo_accepts =
            routing.nginx.is_some() || routing.plugins.as_ref().is_some_and(|p| !p.is_empty());
        if routing.max_traffic_weight.is_some() && argo_accepts {
            errors.push(FieldError::new(
                format!("{path}.maxTrafficWeight"),
                "maxTrafficWeight is supported with nginx and plugin routers only (Istio weights are percentages)",
                "remove maxTrafficWeight, or route through nginx or the gatewayAPI plugin",
            ));
        }
    }
    if canary.ping_pong.is_some() {
        errors.push(FieldError::new(
            "spec.strategy.canary.pingPong",
            "ping-pong services are not supported by this controller yet",
            "name the Services in stableService and canaryService instead",
        ));
    }
}

fn step_limits(step: &CanaryStep, path: &str, errors: &mut Vec<FieldError>) {
    let kinds = step.kinds();
    if kinds.len() > 1 {
        errors.push(FieldError::new(
            path,
            format!(
                "this controller plans one kind per step, this one sets {} ({})",
                kinds.len(),
                kinds.join(", ")
            ),
            "split it into one step per kind, in the order they should run",
        ));
    }
    for kind in kinds {
        if kind == "plugin" {
            errors.push(FieldError::new(
                format!("{path}.{kind}"),
                format!("{kind} steps are not supported by this controller yet"),
                "remove the step",
            ));
        }
    }
    if let Some(scale) = &step.set_canary_scale {
        let set = [
            scale.replicas.is_some(),
            scale.weight.is_some(),
            scale.match_traffic_weight == Some(true),
        ];
        if set.iter().filter(|set| **set).count() != 1 {
            errors.push(FieldError::new(
                format!("{path}.setCanaryScale"),
                "setCanaryScale sets exactly one of replicas, weight and matchTrafficWeight",
                "keep one of replicas, weight or matchTrafficWeight: true",
            ));
        }
    }
}

fn blue_green_limits(
    rollout: &Rollout,
    blue_green: &BlueGreenStrategy,
    errors: &mut Vec<FieldError>,
) {
    let path = "spec.strategy.blueGreen";
    let replicas = rollout.spec.effective_replicas();
    // A negative count is a finding of validate.
    if let Some(count) = blue_green
        .preview_replica_count
        .filter(|count| *count > replicas)
    {
        errors.push(FieldError::new(
            format!("{path}.previewReplicaCount"),
            format!("{count} is outside 0..={replicas} (spec.replicas)"),
            "set previewReplicaCount between 0 and spec.replicas",
        ));
    }
    if let Some(limit) = blue_green
        .scale_down_delay_revision_limit
        .filter(|limit| *limit < 0)
    {
        errors.push(FieldError::new(
            format!("{path}.scaleDownDelayRevisionLimit"),
            format!("{limit} is negative"),
            "set scaleDownDelayRevisionLimit to 0 or more",
        ));
    }
}

fn validate_spec(rollout: &Rollout, errors: &mut Vec<FieldError>) {
    let spec = &rollout.spec;
    errors.extend(negative_replicas(spec));
    non_negative(spec.min_ready_seconds, "spec.minReadySeconds", errors);
    non_negative(
        spec.revision_history_limit,
        "spec.revisionHistoryLimit",
        errors,
    );
    non_negative(
        spec.progress_deadline_seconds,
        "spec.progressDeadlineSeconds",
        errors,
    );
    if spec.effective_progress_deadline_seconds() <= spec.effective_min_ready_seconds() {
        errors.push(FieldError::new(
            "spec.progressDeadlineSeconds",
            format!(
                "progressDeadlineSeconds ({}) must be greater than minReadySeconds ({})",
                spec.effective_progress_deadline_seconds(),
                spec.effective_min_ready_seconds()
            ),
            "raise spec.progressDeadlineSeconds above spec.minReadySeconds",
        ));
    }

    if let Some(workload_ref) = &spec.workload_ref {
        if workload_ref.name.as_deref().unwrap_or_default().is_empty() {
            errors.push(FieldError::new(
                "spec.workloadRef.name",
                "workloadRef has no name",
                "set spec.workloadRef.name to the Deployment to take the pod template from",
            ));
        }
        if let Some(scale_down) = &workload_ref.scale_down {
            let allowed = [
                SCALE_DOWN_NEVER,
                SCALE_DOWN_ON_SUCCESS,
                SCALE_DOWN_PROGRESSIVELY,
            ];
            if !allowed.contains(&scale_down.as_str()) {
                errors.push(FieldError::new(
                    "spec.workloadRef.scaleDown",
                    format!("scaleDown {scale_down:?} is not a known mode"),
                    "use never, onsuccess or progressively",
                ));
            }
        }
        if spec
            .template
            .as_ref()
            .is_some_and(|t| !t.is_empty_template())
        {
            errors.push(FieldError::new(
                "spec.template",
                "a template is set together with workloadRef",
                "remove spec.template (the Deployment named in spec.workloadRef supplies it) or remove spec.workloadRef",
            ));
        }
        if let Some(selector) = &spec.selector {
            validate_selector_syntax(selector, errors);
        }
        return;
    }

    let Some(selector) = &spec.selector else {
        errors.push(FieldError::new(
            "spec.selector",
            "selector is missing",
            "set spec.selector.matchLabels to the labels of spec.template.metadata.labels",
        ));
        return;
    };
    let empty = selector
        .match_labels
        .as_ref()
        .is_none_or(BTreeMap::is_empty)
        && selector
            .match_expressions
            .as_ref()
            .is_none_or(Vec::is_empty);
    if empty {
        errors.push(FieldError::new(
            "spec.selector",
            "the selector is empty and would select every pod in the namespace",
            "set spec.selector.matchLabels to the labels of spec.template.metadata.labels",
        ));
    }
    let selector_ok = validate_selector_syntax(selector, errors);

    let Some(template) = &spec.template else {
        errors.push(missing_template());
        return;
    };
    match template.to_spec() {
        Err(err) => errors.push(FieldError::new(
            "spec.template",
            format!("the template is not a valid pod template: {err}"),
            "write spec.template as a Deployment's spec.template",
        )),
        Ok(pod_template) => {
            let containers = pod_template.spec.map(|s| s.containers).unwrap_or_default();
            if containers.is_empty() {
                errors.push(FieldError::new(
                    "spec.template.spec.containers",
                    "the pod template has no containers",
                    "add at least one container to spec.template.spec.containers",
                ));
            }
        }
    }
    if selector_ok && !empty && !selector_matches(selector, &template.labels()) {
        errors.push(FieldError::new(
            "spec.template.metadata.labels",
            "the selector does not match the template's labels, so the rollout would never see its own pods",
            "make spec.template.metadata.labels include every label in spec.selector",
        ));
    }
}

/// `spec.replicas` below zero.
pub fn negative_replicas(spec: &RolloutSpec) -> Option<FieldError> {
    let replicas = spec.effective_replicas();
    (replicas < 0).then(|| {
        FieldError::new(
            "spec.replicas",
            format!("replicas is {replicas}, which is negative"),
            "set spec.replicas to 0 or more",
        )
    })
}

/// A Rollout with neither `spec.template` nor `spec.workloadRef`.
pub fn missing_template() -> FieldError {
    FieldError::new(
        "spec.template",
        "template is missing",
        "set spec.template (a pod template, as in a Deployment) or spec.workloadRef",
    )
}

/// The length of a pause step (`None`: until promoted), or the finding at `step_path` when its
/// duration is malformed or negative.
pub fn pause_duration(
    pause: &RolloutPause,
    step_path: &str,
) -> Result<Option<Duration>, FieldError> {
    pause.duration().map_err(|reason| {
        FieldError::new(
            format!("{step_path}.pause.duration"),
            reason.to_string(),
            "write a number of seconds (30) or a duration with a unit (\"30s\", \"5m\", \"1h\"), at most one year (8760h); leave duration out to pause until promoted",
        )
    })
}

fn non_negative(value: Option<i32>, path: &str, errors: &mut Vec<FieldError>) {
    if let Some(v) = value.filter(|v| *v < 0) {
        errors.push(FieldError::new(
            path,
            format!("{v} is negative"),
            format!("set {path} to 0 or more"),
        ));
    }
}

/// Checks operators and values of `matchExpressions`; returns whether the selector is usable.
fn validate_selector_syntax(selector: &LabelSelector, errors: &mut Vec<FieldError>) -> bool {
    let mut ok = true;
    for (i, expr) in selector.match_expressions.iter().flatten().enumerate() {
        let path = format!("spec.selector.matchExpressions[{i}]");
        let has_values = expr.values.as_ref().is_some_and(|v| !v.is_empty());
        let problem = match expr.operator.as_str() {
            "In" | "NotIn" if !has_values => Some("In and NotIn need at least one value"),
            "Exists" | "DoesNotExist" if has_values => {
                Some("Exists and DoesNotExist take no values")
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => None,
            _ => Some("unknown operator"),
        };
        if let Some(problem) = problem {
            ok = false;
            errors.push(FieldError::new(
                format!("{path}.operator"),
                format!("operator {:?}: {problem}", expr.operator),
                "use In or NotIn with values, or Exists or DoesNotExist without values",
            ));
        }
    }
    ok
}

/// Whether a label selector selects a pod with these labels (Kubernetes' semantics).
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_match = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let expressions_match = selector.match_expressions.iter().flatten().all(|expr| {
        let value = labels.get(&expr.key);
        let values = expr.values.as_deref().unwrap_or_default();
        match expr.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    labels_match && expressions_match
}

fn validate_blue_green(
    rollout: &Rollout,
    blue_green: &BlueGreenStrategy,
    errors: &mut Vec<FieldError>,
) {
    let path = "spec.strategy.blueGreen";
    let active = blue_green.active_service.as_deref().unwrap_or_default();
    if active.is_empty() {
        errors.push(FieldError::new(
            format!("{path}.activeService"),
            "activeService is missing",
            "set spec.strategy.blueGreen.activeService to the Service that receives production traffic",
        ));
    } else if blue_green.preview_service.as_deref() == Some(active) {
        // At activeService, as Argo reports it (ValidateRolloutStrategyBlueGreen).
        errors.push(FieldError::new(
            format!("{path}.activeService"),
            format!("activeService and previewService are the same Service ({active:?}), but two are required"),
            "use two different Services for activeService and previewService",
        ));
    }
    non_negative(
        blue_green.preview_replica_count,
        &format!("{path}.previewReplicaCount"),
        errors,
    );
    non_negative(
        blue_green.auto_promotion_seconds,
        &format!("{path}.autoPromotionSeconds"),
        errors,
    );
    non_negative(
        blue_green.scale_down_delay_seconds,
        &format!("{path}.scaleDownDelaySeconds"),
        errors,
    );
    non_negative(
        blue_green.abort_scale_down_delay_seconds,
        &format!("{path}.abortScaleDownDelaySeconds"),
        errors,
    );
    if let Some(limit) = blue_green.scale_down_delay_revision_limit {
        let history = rollout.spec.effective_revision_history_limit();
        if history < limit {
            errors.push(FieldError::new(
                format!("{path}.scaleDownDelayRevisionLimit"),
                format!("scaleDownDelayRevisionLimit ({limit}) is larger than revisionHistoryLimit ({history})"),
                "lower scaleDownDelayRevisionLimit or raise spec.revisionHistoryLimit",
            ));
        }
    }
    if let Some(max_unavailable) = &blue_green.max_unavailable {
        validate_int_or_percent(max_unavailable, &format!("{path}.maxUnavailable"), errors);
    }
    validate_anti_affinity(
        blue_green.anti_affinity.as_ref(),
        &format!("{path}.antiAffinity"),
        errors,
    );
    for (field, analysis) in [
        ("prePromotionAnalysis", &blue_green.pre_promotion_analysis),
        ("postPromotionAnalysis", &blue_green.post_promotion_analysis),
    ] {
        if let Some(analysis) = analysis {
            validate_analysis(analysis, &format!("{path}.{field}"), errors);
        }
    }
}

/// Whether a router that can carry them is configured for the header and mirror route steps.
/// Not part of [`validate_strategy`]: the planner plans routes alike for every router.
fn validate_route_support(rollout: &Rollout, errors: &mut Vec<FieldError>) {
    let strategy = &rollout.spec.strategy;
    let Some(canary) = strategy
        .canary
        .as_ref()
        .filter(|_| strategy.blue_green.is_none())
    else {
        return;
    };
    let routing = canary.traffic_routing.as_ref();
    for (i, step) in canary.steps().iter().enumerate() {
        let path = format!("spec.strategy.canary.steps[{i}]");
        if step.set_header_route.is_some() && !routing.is_some_and(header_route_supported) {
            errors.push(FieldError::new(
                format!("{path}.setHeaderRoute"),
                "setHeaderRoute needs a router that supports header routes",
                "configure trafficRouting.istio, trafficRouting.nginx or plugins.\"argoproj-labs/gatewayAPI\"",
            ));
        }
        if step.set_mirror_route.is_some() && !routing.is_some_and(mirror_route_supported) {
            errors.push(FieldError::new(
                format!("{path}.setMirrorRoute"),
                "setMirrorRoute needs a router that supports mirroring",
                "configure trafficRouting.istio or plugins.\"argoproj-labs/gatewayAPI\"",
            ));
        }
    }
}

/// Which routers can act on a step kind in this controller.
fn header_route_supported(routing: &RolloutTrafficRouting) -> bool {
    routing.istio.is_some()
        || routing.nginx.is_some()
        || routing.plugin(GATEWAY_API_PLUGIN).is_some()
}

fn mirror_route_supported(routing: &RolloutTrafficRouting) -> bool {
    routing.istio.is_some() || routing.plugin(GATEWAY_API_PLUGIN).is_some()
}

/// Routers that need `canaryService` and `stableService` (Istio subset-level splitting and
/// ping-pong name their destinations otherwise).
fn requires_canary_and_stable_services(
    canary: &CanaryStrategy,
    routing: &RolloutTrafficRouting,
) -> bool {
    let ping_pong = canary.ping_pong.is_some();
    (routing.alb.is_some() && !ping_pong)
        || routing
            .istio
            .as_ref()
            .is_some_and(|i| i.destination_rule.is_none() && !ping_pong)
        || routing.smi.is_some()
        || routing.apisix.is_some()
        || routing.ambassador.is_some()
        || routing.nginx.is_some()
        || routing.app_mesh.is_some()
        || routing.traefik.is_some()
        || (routing.plugin(GATEWAY_API_PLUGIN).is_some() && !ping_pong)
}

fn validate_canary(rollout: &Rollout, canary: &CanaryStrategy, errors: &mut Vec<FieldError>) {
    let path = "spec.strategy.canary";
    let max_surge = canary.max_surge.as_ref();
    let max_unavailable = canary.max_unavailable.as_ref();
    if let Some(v) = max_surge {
        validate_int_or_percent(v, &format!("{path}.maxSurge"), errors);
    }
    if let Some(v) = max_unavailable {
        validate_int_or_percent(v, &format!("{path}.maxUnavailable"), errors);
    }
    let spec = &rollout.spec;
    if int_or_percent_is_zero(&spec.effective_max_surge())
        && int_or_percent_is_zero(&spec.effective_max_unavailable())
    {
        errors.push(FieldError::new(
            format!("{path}.maxSurge"),
            "maxSurge and maxUnavailable are both zero, so no pod could ever be replaced",
            "set maxSurge or maxUnavailable (or both) above zero",
        ));
    }

    let canary_service = canary.canary_service.as_deref().unwrap_or_default();
    let stable_service = canary.stable_service.as_deref().unwrap_or_default();
    if !canary_service.is_empty() && canary_service == stable_service {
        // At stableService, as Argo reports it (ValidateRolloutStrategyCanary).
        errors.push(FieldError::new(
            format!("{path}.stableService"),
            format!("stableService is the same Service as canaryService ({stable_service:?})"),
            "use two different Services for canaryService and stableService",
        ));
    }

    if let Some(ping_pong) = &canary.ping_pong {
        let routing = canary.traffic_routing.as_ref();
        if routing.is_some_and(|r| {
            r.alb.is_none() && r.istio.is_none() && r.plugins.as_ref().is_none_or(|p| p.is_empty())
        }) {
            errors.push(FieldError::new(
                format!("{path}.pingPong"),
                "ping-pong works only with the ALB, Istio and plugin traffic routers",
                "use trafficRouting.istio or a plugin with pingPong, or use canaryService and stableService",
            ));
        }
        for (field, value) in [
            ("pingService", &ping_pong.ping_service),
            ("pongService", &ping_pong.pong_service),
        ] {
            if value.is_empty() {
                errors.push(FieldError::new(
                    format!("{path}.pingPong.{field}"),
                    format!("{field} is empty"),
                    "set both pingPong.pingService and pingPong.pongService",
                ));
            }
        }
        if !ping_pong.ping_service.is_empty() && ping_pong.ping_service == ping_pong.pong_service {
            errors.push(FieldError::new(
                format!("{path}.pingPong.pongService"),
                "pingService and pongService are the same Service",
                "use two different Services for pingService and pongService",
            ));
        }
        if let Some(alb) = routing.and_then(|r| r.alb.as_ref())
            && alb.root_service.as_deref().unwrap_or_default().is_empty()
        {
            errors.push(FieldError::new(
                format!("{path}.trafficRouting.alb.rootService"),
                "ALB with ping-pong needs a root service",
                "set trafficRouting.alb.rootService",
            ));
        }
    }

    match &canary.traffic_routing {
        Some(routing) => {
            if requires_canary_and_stable_services(canary, routing) {
                for (field, value) in [
                    ("canaryService", canary_service),
                    ("stableService", stable_service),
                ] {
                    if value.is_empty() {
                        errors.push(FieldError::new(
                            format!("{path}.{field}"),
                            format!("trafficRouting is set but {field} is missing"),
                            "set both canaryService and stableService: the router splits traffic between these two Services",
                        ));
                    }
                }
            }
            if canary.scale_down_delay_seconds.is_some() && canary.effective_dynamic_stable_scale()
            {
                errors.push(FieldError::new(
                    format!("{path}.dynamicStableScale"),
                    "dynamicStableScale cannot be used with scaleDownDelaySeconds",
                    "remove scaleDownDelaySeconds or dynamicStableScale",
                ));
            }
            if let Some(max) = routing.max_traffic_weight {
                if routing.nginx.is_none() && routing.plugins.as_ref().is_none_or(|p| p.is_empty())
                {
                    errors.push(FieldError::new(
                        format!("{path}.trafficRouting.maxTrafficWeight"),
                        "maxTrafficWeight is supported only with nginx and plugin routers",
                        "remove maxTrafficWeight",
                    ));
                }
                if max < 1 {
                    errors.push(FieldError::new(
                        format!("{path}.trafficRouting.maxTrafficWeight"),
                        format!("maxTrafficWeight {max} is not positive"),
                        "set maxTrafficWeight to 1 or more (the default is 100)",
                    ));
                }
            }
        }
        None => {
            if canary.scale_down_delay_seconds.is_some() {
                errors.push(FieldError::new(
                    format!("{path}.scaleDownDelaySeconds"),
                    "scaleDownDelaySeconds needs trafficRouting",
                    "remove scaleDownDelaySeconds or configure trafficRouting",
                ));
            }
            if canary.effective_dynamic_stable_scale() {
                errors.push(FieldError::new(
                    format!("{path}.dynamicStableScale"),
                    "dynamicStableScale needs trafficRouting",
                    "remove dynamicStableScale or configure trafficRouting",
                ));
            }
        }
    }
    non_negative(
        canary.scale_down_delay_seconds,
        &format!("{path}.scaleDownDelaySeconds"),
        errors,
    );
    non_negative(
        canary.abort_scale_down_delay_seconds,
        &format!("{path}.abortScaleDownDelaySeconds"),
        errors,
    );
    non_negative(
        canary.min_pods_per_replica_set,
        &format!("{path}.minPodsPerReplicaSet"),
        errors,
    );

    for (i, step) in canary.steps().iter().enumerate() {
        validate_step(rollout, canary, step, &format!("{path}.steps[{i}]"), errors);
    }

    if let Some(background) = &canary.analysis {
        let background_path = format!("{path}.analysis");
        validate_analysis(&background.analysis, &background_path, errors);
        if let Some(start) = background.starting_step {
            let steps = canary.steps().len();
            if start < 0 || usize::try_from(start).is_ok_and(|s| s > steps) {
                errors.push(FieldError::new(
                    format!("{background_path}.startingStep"),
                    format!("startingStep {start} is outside the {steps} steps"),
                    format!("set startingStep between 0 and {steps}"),
                ));
            }
        }
    }
    validate_anti_affinity(
        canary.anti_affinity.as_ref(),
        &format!("{path}.antiAffinity"),
        errors,
    );
}

fn validate_step(
    rollout: &Rollout,
    canary: &CanaryStrategy,
    step: &CanaryStep,
    path: &str,
    errors: &mut Vec<FieldError>,
) {
    let kinds = step.kinds();
    // As Argo: setWeight, pause, experiment and analysis exclude each other; setCanaryScale,
    // setHeaderRoute, setMirrorRoute and plugin may accompany one of them in the same step.
    let exclusive: Vec<&str> = kinds
        .iter()
        .copied()
        .filter(|k| matches!(*k, "setWeight" | "pause" | "experiment" | "analysis"))
        .collect();
    if kinds.is_empty() {
        errors.push(FieldError::new(
            path,
            "the step sets nothing",
            "set one of setWeight, pause, analysis, experiment, setCanaryScale, setHeaderRoute, setMirrorRoute or plugin",
        ));
    } else if exclusive.len() > 1 {
        errors.push(FieldError::new(
            path,
            format!(
                "the step sets several of setWeight, pause, experiment and analysis at once ({})",
                exclusive.join(", ")
            ),
            "split it into one step per kind, in the order they should run",
        ));
    }
    let routing = canary.traffic_routing.as_ref();

    if let Some(weight) = step.set_weight {
        let max = rollout.spec.effective_max_traffic_weight();
        if !(0..=max).contains(&weight) {
            errors.push(FieldError::new(
                format!("{path}.setWeight"),
                format!("setWeight {weight} is outside 0..={max}"),
                format!("set setWeight between 0 and {max}"),
            ));
        }
    }
    if let Some(pause) = &step.pause
        && let Err(error) = pause_duration(pause, path)
    {
        errors.push(error);
    }
    if let Some(scale) = &step.set_canary_scale {
        if routing.is_none() {
            errors.push(FieldError::new(
                format!("{path}.setCanaryScale"),
                "setCanaryScale needs trafficRouting (without a router the canary's size is its weight)",
                "configure spec.strategy.canary.trafficRouting or remove the step",
            ));
        }
        // Argo sizes the canary as weight / maxTrafficWeight of spec.replicas.
        let max = rollout.spec.effective_max_traffic_weight();
        if let Some(weight) = scale.weight.filter(|w| !(0..=max).contains(w)) {
            errors.push(FieldError::new(
                format!("{path}.setCanaryScale.weight"),
                format!("weight {weight} is outside 0..={max}"),
                format!("set setCanaryScale.weight between 0 and {max}"),
            ));
        }
        non_negative(
            scale.replicas,
            &format!("{path}.setCanaryScale.replicas"),
            errors,
        );
    }
    if let Some(header_route) = &step.set_header_route {
        let step_path = format!("{path}.setHeaderRoute");
        for (j, m) in header_route.match_.iter().flatten().enumerate() {
            validate_string_match(
                Some(&m.header_value),
                &format!("{step_path}.match[{j}].headerValue"),
                errors,
            );
        }
        validate_managed_route(
            routing,
            header_route.name.as_deref().unwrap_or_default(),
            &step_path,
            errors,
        );
    }
    if let Some(mirror_route) = &step.set_mirror_route {
        let step_path = format!("{path}.setMirrorRoute");
        for (j, m) in mirror_route.match_.iter().flatten().enumerate() {
            let match_path = format!("{step_path}.match[{j}]");
            if let Some(method) = &m.method {
                validate_string_match(Some(method), &format!("{match_path}.method"), errors);
            }
            if let Some(p) = &m.path {
                validate_string_match(Some(p), &format!("{match_path}.path"), errors);
            }
            for (header, value) in m.headers.iter().flatten() {
                validate_string_match(
                    Some(value),
                    &format!("{match_path}.headers.{header}"),
                    errors,
                );
            }
        }
        if let Some(percentage) = mirror_route.percentage.filter(|p| !(0..=100).contains(p)) {
            errors.push(FieldError::new(
                format!("{step_path}.percentage"),
                format!("percentage {percentage} is outside 0..=100"),
                "set percentage between 0 and 100 (the default is 100)",
            ));
        }
        validate_managed_route(routing, &mirror_route.name, &step_path, errors);
    }
    if let Some(analysis) = &step.analysis {
        validate_analysis(analysis, &format!("{path}.analysis"), errors);
    }
    if let Some(experiment) = &step.experiment {
        let experiment_path = format!("{path}.experiment");
        if experiment.templates.is_empty() {
            errors.push(FieldError::new(
                format!("{experiment_path}.templates"),
                "the experiment has no templates",
                "add at least one template with name and specRef (canary or stable)",
            ));
        }
        if let Some(duration) = &experiment.duration
            && let Err(reason) = crate::duration::parse(duration)
        {
            errors.push(FieldError::new(
                format!("{experiment_path}.duration"),
                reason.to_string(),
                "write a duration with a unit (\"30s\", \"5m\", \"1h\"), at most one year (8760h)",
            ));
        }
        for (t, template) in experiment.templates.iter().enumerate() {
            let template_path = format!("{experiment_path}.templates[{t}]");
            if template.spec_ref != "canary" && template.spec_ref != "stable" {
                errors.push(FieldError::new(
                    format!("{template_path}.specRef"),
                    format!(
                        "specRef {:?} is neither canary nor stable",
                        template.spec_ref
                    ),
                    "set specRef to canary or stable",
                ));
            }
            if template.weight.is_some() {
                let weighted_router = routing.is_some_and(|r| {
                    r.alb.is_some()
                        || r.smi.is_some()
                        || r.istio.is_some()
                        || r.plugins.as_ref().is_some_and(|p| !p.is_empty())
                });
                if !weighted_router {
                    errors.push(FieldError::new(
                        format!("{template_path}.weight"),
                        "an experiment template weight needs a router that can weight several services (SMI, ALB, Istio or a plugin)",
                        "remove the weight or configure such a trafficRouting",
                    ));
                }
            }
        }
        for (a, analysis) in experiment.analyses.iter().flatten().enumerate() {
            validate_args(
                analysis.args.as_deref().unwrap_or_default(),
                &format!("{experiment_path}.analyses[{a}].args"),
                errors,
            );
        }
    }
}

/// As Argo's `ValidateStepRouteFoundInManagedRoute`: a step's route (an empty name included)
/// must be listed in `managedRoutes`, or it would never be removed.
fn validate_managed_route(
    routing: Option<&RolloutTrafficRouting>,
    name: &str,
    step_path: &str,
    errors: &mut Vec<FieldError>,
) {
    let Some(routing) = routing else { return };
    match &routing.managed_routes {
        None => errors.push(FieldError::new(
            "spec.strategy.canary.trafficRouting.managedRoutes",
            "header and mirror route steps need managedRoutes",
            format!(
                "list the route {name:?} under spec.strategy.canary.trafficRouting.managedRoutes"
            ),
        )),
        Some(_) if !routing.managed_route_names().contains(&name) => errors.push(FieldError::new(
            format!("{step_path}.name"),
            format!("route {name:?} is not listed in trafficRouting.managedRoutes"),
            format!("add {{name: {name}}} to spec.strategy.canary.trafficRouting.managedRoutes"),
        )),
        Some(_) => {}
    }
}

/// Exactly one of `exact`, `prefix` and `regex`; an empty string counts as unset, as in Argo's
/// `hasMultipleMatchValues`.
fn validate_string_match(value: Option<&StringMatch>, path: &str, errors: &mut Vec<FieldError>) {
    let set = value.map_or(0, |m| {
        [&m.exact, &m.prefix, &m.regex]
            .iter()
            .filter(|v| v.as_deref().is_some_and(|s| !s.is_empty()))
            .count()
    });
    if set != 1 {
        errors.push(FieldError::new(
            path,
            format!("{set} of exact, prefix and regex are set"),
            "set exactly one of exact, prefix or regex",
        ));
    }
}

fn validate_analysis(analysis: &RolloutAnalysis, path: &str, errors: &mut Vec<FieldError>) {
    if analysis.templates().is_empty() {
        errors.push(FieldError::new(
            format!("{path}.templates"),
            "no analysis templates are listed",
            "add at least one {templateName: <AnalysisTemplate name>}",
        ));
    }
    for (i, template) in analysis.templates().iter().enumerate() {
        if template.template_name.is_empty() {
            errors.push(FieldError::new(
                format!("{path}.templates[{i}].templateName"),
                "templateName is empty",
                "set templateName to the name of an AnalysisTemplate (or ClusterAnalysisTemplate with clusterScope: true)",
            ));
        }
    }
    validate_args(analysis.args(), &format!("{path}.args"), errors);
}

fn validate_args(args: &[AnalysisRunArgument], path: &str, errors: &mut Vec<FieldError>) {
    for (i, arg) in args.iter().enumerate() {
        let arg_path = format!("{path}[{i}]");
        if arg.value.is_some() && arg.value_from.is_some() {
            errors.push(FieldError::new(
                &arg_path,
                format!("argument {:?} sets both value and valueFrom", arg.name),
                "keep either value or valueFrom",
            ));
        }
        let Some(value_from) = &arg.value_from else {
            continue;
        };
        let sources = [
            value_from.pod_template_hash_value.is_some(),
            value_from.field_ref.is_some(),
            value_from.secret_key_ref.is_some(),
        ];
        if sources.iter().filter(|s| **s).count() != 1 {
            errors.push(FieldError::new(
                format!("{arg_path}.valueFrom"),
                format!("argument {:?} needs exactly one valueFrom source", arg.name),
                "set one of podTemplateHashValue (Stable or Latest) or fieldRef",
            ));
        }
        if value_from.secret_key_ref.is_some() {
            errors.push(FieldError::new(
                format!("{arg_path}.valueFrom.secretKeyRef"),
                "a Rollout cannot pass secrets as arguments",
                "read the secret in the AnalysisTemplate's own args (valueFrom.secretKeyRef there)",
            ));
        }
        if let Some(field_ref) = &value_from.field_ref
            && field_ref.field_path.starts_with("metadata")
            && !metadata_field_path_resolves(&field_ref.field_path)
        {
            errors.push(FieldError::new(
                format!("{arg_path}.valueFrom.fieldRef.fieldPath"),
                format!("fieldPath {:?} is not a supported metadata field of this Rollout", field_ref.field_path),
                "use metadata.name, metadata.namespace, metadata.uid, metadata.labels['<key>'] or metadata.annotations['<key>']",
            ));
        }
    }
}

/// Downward-API style metadata paths Argo resolves against the Rollout (a missing label or
/// annotation key resolves to an empty string, as in Kubernetes).
fn metadata_field_path_resolves(path: &str) -> bool {
    match path {
        "metadata.name"
        | "metadata.namespace"
        | "metadata.uid"
        | "metadata.labels"
        | "metadata.annotations" => true,
        _ => ["metadata.labels", "metadata.annotations"]
            .iter()
            .any(|prefix| {
                path.strip_prefix(prefix)
                    .and_then(|rest| rest.strip_prefix("['"))
                    .and_then(|rest| rest.strip_suffix("']"))
                    .is_some_and(|key| !key.is_empty())
            }),
    }
}

fn validate_int_or_percent(value: &IntOrString, path: &str, errors: &mut Vec<FieldError>) {
    let problem = match value {
        IntOrString::Int(n) if *n < 0 => Some(format!("{n} is negative")),
        IntOrString::Int(_) => None,
        IntOrString::String(text) => match parse_percent(text) {
            Err(reason) => Some(reason.to_string()),
            Ok(p) if p < 0 => Some(format!("{text:?} is negative")),
            Ok(_) => None,
        },
    };
    if let Some(problem) = problem {
        errors.push(FieldError::new(
            path,
            problem,
            format!("set {path} to a non-negative integer or a percentage like \"25%\""),
        ));
    }
}

fn int_or_percent_is_zero(value: &IntOrString) -> bool {
    match value {
        IntOrString::Int(n) => *n == 0,
        IntOrString::String(text) => parse_percent(text) == Ok(0),
    }
}

fn validate_anti_affinity(
    anti_affinity: Option<&AntiAffinity>,
    path: &str,
    errors: &mut Vec<FieldError>,
) {
    let Some(anti_affinity) = anti_affinity else {
        return;
    };
    let preferred = &anti_affinity.preferred_during_scheduling_ignored_during_execution;
    let required = &anti_affinity.required_during_scheduling_ignored_during_execution;
    if preferred.is_some() == required.is_some() {
        errors.push(FieldError::new(
            path,
            "antiAffinity must set exactly one strategy",
            "set either preferredDuringSchedulingIgnoredDuringExecution (with weight) or requiredDuringSchedulingIgnoredDuringExecution: {}",
        ));
    }
    if let Some(weight) = preferred
        .as_ref()
        .map(|p| p.weight)
        .filter(|w| !(1..=100).contains(w))
    {
        errors.push(FieldError::new(
            format!("{path}.preferredDuringSchedulingIgnoredDuringExecution.weight"),
            format!("weight {weight} is outside 1..=100"),
            "set the anti-affinity weight between 1 and 100",
        ));
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use serde_json::json;

    use super::*;
    use crate::rollout::{
        AnalysisRunArgument, ArgumentValueFrom, FieldRef, HeaderRoutingMatch, IstioTrafficRouting,
        IstioVirtualService, ManagedRoute, NginxTrafficRouting, ObjectRef, PingPongSpec,
        PreferredDuringSchedulingIgnoredDuringExecution, RolloutAnalysisBackground, RolloutPause,
        RolloutTrafficRouting, SecretKeyRef, SetCanaryScale, SetHeaderRoute, SetMirrorRoute,
        ValueFromPodTemplateHash,
    };

    fn paths(rollout: &Rollout) -> Vec<String> {
        validate(rollout).into_iter().map(|e| e.path).collect()
    }

    /// Asserts exactly one finding, at `path`, with a reason and a fix.
    fn assert_only_error(rollout: &Rollout, path: &str) {
        let errors = validate(rollout);
        assert_eq!(
            errors.len(),
            1,
            "expected one error at {path}, got {errors:#?}"
        );
        assert_eq!(errors[0].path, path);
        assert!(!errors[0].reason.is_empty() && !errors[0].fix.is_empty());
    }

    fn istio() -> RolloutTrafficRouting {
        RolloutTrafficRouting {
            istio: Some(IstioTrafficRouting {
                virtual_service: Some(IstioVirtualService {
                    name: "web".into(),
                    ..IstioVirtualService::default()
                }),
                ..IstioTrafficRouting::default()
            }),
            managed_routes: Some(vec![
                ManagedRoute {
                    name: "header".into(),
                },
                ManagedRoute {
                    name: "mirror".into(),
                },
            ]),
            ..RolloutTrafficRouting::default()
        }
    }

    fn nginx() -> RolloutTrafficRouting {
        RolloutTrafficRouting {
            nginx: Some(NginxTrafficRouting {
                stable_ingress: Some("web".into()),
                ..NginxTrafficRouting::default()
            }),
            managed_routes: Some(vec![
                ManagedRoute {
                    name: "header".into(),
                },
                ManagedRoute {
                    name: "mirror".into(),
                },
            ]),
            ..RolloutTrafficRouting::default()
        }
    }

    fn gateway_api() -> RolloutTrafficRouting {
        let plugins = json!({GATEWAY_API_PLUGIN: {"httpRoute": "web", "namespace": "default"}});
        RolloutTrafficRouting {
            plugins: plugins.as_object().cloned(),
            managed_routes: Some(vec![
                ManagedRoute {
                    name: "header".into(),
                },
                ManagedRoute {
                    name: "mirror".into(),
                },
            ]),
            ..RolloutTrafficRouting::default()
        }
    }

    fn header_step() -> CanaryStep {
        CanaryStep {
            set_header_route: Some(SetHeaderRoute {
                name: Some("header".into()),
                match_: Some(vec![HeaderRoutingMatch {
                    header_name: "x-canary".into(),
                    header_value: StringMatch {
                        exact: Some("yes".into()),
                        ..StringMatch::default()
                    },
                }]),
            }),
            ..CanaryStep::default()
        }
    }

    fn mirror_step() -> CanaryStep {
        CanaryStep {
            set_mirror_route: Some(SetMirrorRoute {
                name: "mirror".into(),
                percentage: Some(50),
                ..SetMirrorRoute::default()
            }),
            ..CanaryStep::default()
        }
    }

    fn canary_mut(rollout: &mut Rollout) -> &mut CanaryStrategy {
        rollout
            .spec
            .strategy
            .canary
            .as_mut()
            .expect("canary fixture")
    }

    #[test]
    fn fixtures_are_valid() {
        let canary = Rollout::test_canary(
            "web",
            vec![
                CanaryStep::weight(20),
                CanaryStep::pause_seconds(30),
                CanaryStep::analysis("rate"),
                CanaryStep::pause_indefinitely(),
            ],
        );
        assert_eq!(validate(&canary), vec![]);
        assert_eq!(validate(&Rollout::test_blue_green("web")), vec![]);
        let routed = Rollout::test_canary("web", vec![header_step(), mirror_step()])
            .with_traffic_routing(istio());
        assert_eq!(validate(&routed), vec![]);
    }

    #[test]
    fn set_weight_outside_range() {
        assert_only_error(
            &Rollout::test_canary("web", vec![CanaryStep::weight(101)]),
            "spec.strategy.canary.steps[0].setWeight",
        );
        assert_only_error(
            &Rollout::test_canary("web", vec![CanaryStep::weight(-1)]),
            "spec.strategy.canary.steps[0].setWeight",
        );
        assert_eq!(
            validate(&Rollout::test_canary(
                "web",
                vec![CanaryStep::weight(0), CanaryStep::weight(100)]
            )),
            vec![]
        );
    }

    #[test]
    fn set_weight_range_follows_max_traffic_weight() {
        let mut routing = nginx();
        routing.max_traffic_weight = Some(1000);
        let rollout = Rollout::test_canary("web", vec![CanaryStep::weight(500)])
            .with_traffic_routing(routing);
        assert_eq!(validate(&rollout), vec![]);
        let mut routing = istio();
        routing.max_traffic_weight = Some(1000);
        let rollout =
            Rollout::test_canary("web", vec![CanaryStep::weight(50)]).with_traffic_routing(routing);
        assert_only_error(
            &rollout,
            "spec.strategy.canary.trafficRouting.maxTrafficWeight",
        );
    }

    #[test]
    fn max_surge_and_max_unavailable_both_zero() {
        let mut rollout = Rollout::test_canary("web", vec![]);
        canary_mut(&mut rollout).max_surge = Some(IntOrString::Int(0));
        canary_mut(&mut rollout).max_unavailable = Some(IntOrString::String("0%".into()));
        assert_only_error(&rollout, "spec.strategy.canary.maxSurge");
        canary_mut(&mut rollout).max_unavailable = Some(IntOrString::Int(1));
        assert_eq!(validate(&rollout), vec![]);
    }

    #[test]
    fn malformed_int_or_percent() {
        let mut rollout = Rollout::test_canary("web", vec![]);
        canary_mut(&mut rollout).max_surge = Some(IntOrString::String("25".into()));
        assert_only_error(&rollout, "spec.strategy.canary.maxSurge");
    }

    #[test]
    fn canary_service_equal_to_stable_service() {
        let mut rollout = Rollout::test_canary("web", vec![]).with_traffic_routing(nginx());
        canary_mut(&mut rollout).stable_service = Some("web-canary".into());
        assert_only_error(&rollout, "spec.strategy.canary.stableService");
    }

    #[test]
    fn traffic_routing_without_services() {
        for routing in [nginx(), istio(), gateway_api()] {
            let mut rollout = Rollout::test_canary("web", vec![]).with_traffic_routing(routing);
            canary_mut(&mut rollout).canary_service = None;
            assert_only_error(&rollout, "spec.strategy.canary.canaryService");
            canary_mut(&mut rollout).stable_service = None;
            assert_eq!(
                paths(&rollout),
                [
                    "spec.strategy.canary.canaryService",
                    "spec.strategy.canary.stableService"
                ]
            );
        }
    }

    #[test]
    fn istio_subset_level_needs_no_services() {
        let mut routing = istio();
        routing.istio.as_mut().expect("istio").destination_rule =
            Some(crate::rollout::IstioDestinationRule {
                name: "web".into(),
                canary_subset_name: "canary".into(),
                stable_subset_name: "stable".into(),
                additional_subset_names: None,
            });
        let mut rollout = Rollout::test_canary("web", vec![]).with_traffic_routing(routing);
        canary_mut(&mut rollout).canary_service = None;
        canary_mut(&mut rollout).stable_service = None;
        assert_eq!(validate(&rollout), vec![]);
        // The router splits between the DestinationRule's subsets, so nothing else needs them.
        assert_eq!(planning_limits(&rollout), vec![]);
    }

    #[test]
    fn header_route_needs_a_supporting_router() {
        assert_only_error(
            &Rollout::test_canary("web", vec![header_step()]),
            "spec.strategy.canary.steps[0].setHeaderRoute",
        );
        for routing in [nginx(), istio(), gateway_api()] {
            let rollout =
                Rollout::test_canary("web", vec![header_step()]).with_traffic_routing(routing);
            assert_eq!(validate(&rollout), vec![]);
        }
        let smi = RolloutTrafficRouting {
            smi: Some(crate::rollout::SmiTrafficRouting::default()),
            managed_routes: Some(vec![ManagedRoute {
                name: "header".into(),
            }]),
            ..RolloutTrafficRouting::default()
        };
        let rollout = Rollout::test_canary("web", vec![header_step()]).with_traffic_routing(smi);
        assert_only_error(&rollout, "spec.strategy.canary.steps[0].setHeaderRoute");
    }

    #[test]
    fn mirror_route_needs_istio_or_gateway_api() {
        assert_only_error(
            &Rollout::test_canary("web", vec![mirror_step()]),
            "spec.strategy.canary.steps[0].setMirrorRoute",
        );
        let rollout =
            Rollout::test_canary("web", vec![mirror_step()]).with_traffic_routing(nginx());
        assert_only_error(&rollout, "spec.strategy.canary.steps[0].setMirrorRoute");
        for routing in [istio(), gateway_api()] {
            let rollout =
                Rollout::test_canary("web", vec![mirror_step()]).with_traffic_routing(routing);
            assert_eq!(validate(&rollout), vec![]);
        }
    }

    #[test]
    fn routes_must_be_managed() {
        let mut routing = istio();
        routing.managed_routes = None;
        let rollout =
            Rollout::test_canary("web", vec![header_step()]).with_traffic_routing(routing);
        assert_only_error(
            &rollout,
            "spec.strategy.canary.trafficRouting.managedRoutes",
        );
        let mut routing = istio();
        routing.managed_routes = Some(vec![ManagedRoute {
            name: "other".into(),
        }]);
        let rollout =
            Rollout::test_canary("web", vec![mirror_step()]).with_traffic_routing(routing);
        assert_only_error(
            &rollout,
            "spec.strategy.canary.steps[0].setMirrorRoute.name",
        );
    }

    #[test]
    fn header_match_needs_exactly_one_value() {
        let mut step = header_step();
        let m = &mut step
            .set_header_route
            .as_mut()
            .expect("header route")
            .match_
            .as_mut()
            .expect("match")[0];
        m.header_value.prefix = Some("y".into());
        let rollout = Rollout::test_canary("web", vec![step.clone()]).with_traffic_routing(istio());
        assert_only_error(
            &rollout,
            "spec.strategy.canary.steps[0].setHeaderRoute.match[0].headerValue",
        );
        let m = &mut step
            .set_header_route
            .as_mut()
            .expect("header route")
            .match_
            .as_mut()
            .expect("match")[0];
        m.header_value = StringMatch::default();
        let rollout = Rollout::test_canary("web", vec![step]).with_traffic_routing(istio());
        assert_only_error(
            &rollout,
            "spec.strategy.canary.steps[0].setHeaderRoute.match[0].headerValue",
        );
    }

    #[test]
    fn blue_green_active_service_missing_or_equal_to_preview() {
        let mut rollout = Rollout::test_blue_green("web");
        rollout
            .spec
            .strategy
            .blue_green
            .as_mut()
            .expect("bg")
            .active_service = None;
        assert_only_error(&rollout, "spec.strategy.blueGreen.activeService");
        let mut rollout = Rollout::test_blue_green("web");
        rollout
            .spec
            .strategy
            .blue_green
            .as_mut()
            .expect("bg")
            .preview_service = Some("web-active".into());
        assert_only_error(&rollout, "spec.strategy.blueGreen.activeService");
    }

    #[test]
    fn blue_green_scale_down_revision_limit_above_history() {
        let mut rollout = Rollout::test_blue_green("web");
        rollout.spec.revision_history_limit = Some(2);
        rollout
            .spec
            .strategy
            .blue_green
            .as_mut()
            .expect("bg")
            .scale_down_delay_revision_limit = Some(3);
        assert_only_error(
            &rollout,
            "spec.strategy.blueGreen.scaleDownDelayRevisionLimit",
        );
    }

    #[test]
    fn both_strategies_or_neither() {
        let mut rollout = Rollout::test_canary("web", vec![]);
        rollout.spec.strategy.blue_green = Rollout::test_blue_green("web").spec.strategy.blue_green;
        assert_only_error(&rollout, "spec.strategy");
        rollout.spec.strategy = Default::default();
        assert_only_error(&rollout, "spec.strategy");
    }

    #[test]
    fn selector_must_match_template_labels() {
        let mut rollout = Rollout::test_canary("web", vec![]);
        rollout.spec.selector = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([("app".into(), "api".into())])),
            ..LabelSelector::default()
        });
        assert_only_error(&rollout, "spec.template.metadata.labels");
        rollout.spec.selector = Some(LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "app".into(),
                operator: "In".into(),
                values: Some(vec!["web".into(), "api".into()]),
            }]),
            ..LabelSelector::default()
        });
        assert_eq!(validate(&rollout), vec![]);
    }

    #[test]
    fn selector_missing_empty_or_malformed() {
        let mut rollout = Rollout::test_canary("web", vec![]);
        rollout.spec.selector = None;
        assert_only_error(&rollout, "spec.selector");
        rollout.spec.selector = Some(LabelSelector::default());
        assert_only_error(&rollout, "spec.selector");
        rollout.spec.selector = Some(LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "app".into(),
                operator: "In".into(),
                values: None,
            }]),
            ..LabelSelector::default()
        });
        assert_only_error(&rollout, "spec.selector.matchExpressions[0].operator");
    }

    #[test]
    fn selector_matching_semantics() {
        let labels = BTreeMap::from([("app".to_string(), "web".to_string())]);
        let expr = |operator: &str, values: Option<Vec<String>>| LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: operator.into(),
                values,
            }]),
            ..LabelSelector::default()
        };
        assert!(selector_matches(&expr("DoesNotExist", None), &labels));
        assert!(!selector_matches(&expr("Exists", None), &labels));
        assert!(selector_matches(
            &expr("NotIn", Some(vec!["db".into()])),
            &labels
        ));
        assert!(!selector_matches(
            &expr("In", Some(vec!["db".into()])),
            &labels
        ));
    }

    #[test]
    fn template_missing_or_without_containers() {
        let mut rollout = Rollout::test_canary("web", vec![]);
        rollout.spec.template = None;
        assert_only_error(&rollout, "spec.template");
        let mut rollout = Rollout::test_canary("web", vec![]);
        let template = rollout.spec.template.as_mut().expect("template");
        template.0.insert("spec".into(), json!({"containers": []}));
        assert_only_error(&rollout, "spec.template.spec.containers");
    }

    #[test]
    fn workload_ref_excludes_template() {
        let mut rollout = Rollout::test_canary("web", vec![]);
        rollout.spec.workload_ref = Some(ObjectRef {
            api_version: Some("apps/v1".into()),
            kind: Some("Deployment".into()),
            name: Some("web".into()),
            scale_down: Some("progressively".into()),
        });
        assert_only_error(&rollout, "spec.template");
        rollout.spec.template = None;
        rollout.spec.selector = None;
        assert_eq!(validate(&rollout), vec![]);
        rollout.spec.workload_ref.as_mut().expect("ref").scale_down = Some("sometimes".into());
        assert_only_error(&rollout, "spec.workloadRef.scaleDown");
    }

    #[test]
    fn pause_duration_must_parse_and_not_be_negative() {
        let step = |d: IntOrString| CanaryStep {
            pause: Some(RolloutPause { duration: Some(d) }),
            ..CanaryStep::default()
        };
        let rollout =
            Rollout::test_canary("web", vec![step(IntOrString::String("ten minutes".into()))]);
        assert_only_error(&rollout, "spec.strategy.canary.steps[0].pause.duration");
        let rollout = Rollout::test_canary("web", vec![step(IntOrString::Int(-5))]);
        assert_only_error(&rollout, "spec.strategy.canary.steps[0].pause.duration");
        let rollout = Rollout::test_canary(
            "web",
            vec![
                step(IntOrString::String("1h30m".into())),
                step(IntOrString::String("45".into())),
            ],
        );
        assert_eq!(validate(&rollout), vec![]);
    }

    #[test]
    fn steps_with_several_kinds_or_none() {
        let mut both = CanaryStep::weight(10);
        both.pause = Some(RolloutPause::default());
        let rollout = Rollout::test_canary("web", vec![both, CanaryStep::default()]);
        assert_eq!(
            paths(&rollout),
            [
                "spec.strategy.canary.steps[0]",
                "spec.strategy.canary.steps[1]"
            ]
        );
        assert!(validate(&rollout)[0].reason.contains("setWeight, pause"));
    }

    #[test]
    fn companion_step_kinds_may_share_a_step_as_in_argo() {
        let mut step = CanaryStep::weight(20);
        step.set_canary_scale = Some(SetCanaryScale {
            replicas: Some(1),
            ..SetCanaryScale::default()
        });
        let rollout = Rollout::test_canary("web", vec![step]).with_traffic_routing(nginx());
        assert_eq!(validate(&rollout), vec![]);
    }

    #[test]
    fn set_canary_scale_needs_traffic_routing() {
        let step = CanaryStep {
            set_canary_scale: Some(SetCanaryScale {
                weight: Some(20),
                ..SetCanaryScale::default()
            }),
            ..CanaryStep::default()
        };
        assert_only_error(
            &Rollout::test_canary("web", vec![step.clone()]),
            "spec.strategy.canary.steps[0].setCanaryScale",
        );
        assert_eq!(
            validate(&Rollout::test_canary("web", vec![step]).with_traffic_routing(nginx())),
            vec![]
        );
    }

    #[test]
    fn scale_down_delay_and_dynamic_stable_scale_need_traffic_routing() {
        let mut rollout = Rollout::test_canary("web", vec![]);
        canary_mut(&mut rollout).scale_down_delay_seconds = Some(10);
        assert_only_error(&rollout, "spec.strategy.canary.scaleDownDelaySeconds");
        let mut rollout = Rollout::test_canary("web", vec![]);
        canary_mut(&mut rollout).dynamic_stable_scale = Some(true);
        assert_only_error(&rollout, "spec.strategy.canary.dynamicStableScale");
        let mut rollout = Rollout::test_canary("web", vec![]).with_traffic_routing(nginx());
        canary_mut(&mut rollout).dynamic_stable_scale = Some(true);
        canary_mut(&mut rollout).scale_down_delay_seconds = Some(10);
        assert_only_error(&rollout, "spec.strategy.canary.dynamicStableScale");
    }

    #[test]
    fn ping_pong_rules() {
        let mut rollout = Rollout::test_canary("web", vec![]).with_traffic_routing(nginx());
        canary_mut(&mut rollout).ping_pong = Some(PingPongSpec {
            ping_service: "a".into(),
            pong_service: "a".into(),
        });
        assert_eq!(
            paths(&rollout),
            [
                "spec.strategy.canary.pingPong",
                "spec.strategy.canary.pingPong.pongService"
            ]
        );
    }

    #[test]
    fn anti_affinity_needs_one_strategy_with_valid_weight() {
        let mut rollout = Rollout::test_canary("web", vec![]);
        canary_mut(&mut rollout).anti_affinity = Some(AntiAffinity::default());
        assert_only_error(&rollout, "spec.strategy.canary.antiAffinity");
        canary_mut(&mut rollout).anti_affinity = Some(AntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(
                PreferredDuringSchedulingIgnoredDuringExecution { weight: 0 },
            ),
            required_during_scheduling_ignored_during_execution: None,
        });
        assert_only_error(
            &rollout,
            "spec.strategy.canary.antiAffinity.preferredDuringSchedulingIgnoredDuringExecution.weight",
        );
    }

    #[test]
    fn analysis_needs_templates_and_well_formed_args() {
        let mut step = CanaryStep::analysis("rate");
        let analysis = step.analysis.as_mut().expect("analysis");
        analysis.args = Some(vec![
            AnalysisRunArgument {
                name: "hash".into(),
                value: None,
                value_from: Some(ArgumentValueFrom {
                    pod_template_hash_value: Some(ValueFromPodTemplateHash::Latest),
                    ..ArgumentValueFrom::default()
                }),
            },
            AnalysisRunArgument {
                name: "app".into(),
                value: None,
                value_from: Some(ArgumentValueFrom {
                    field_ref: Some(FieldRef {
                        field_path: "metadata.labels['app']".into(),
                    }),
                    ..ArgumentValueFrom::default()
                }),
            },
        ]);
        assert_eq!(
            validate(&Rollout::test_canary("web", vec![step.clone()])),
            vec![]
        );

        let args = step
            .analysis
            .as_mut()
            .expect("analysis")
            .args
            .as_mut()
            .expect("args");
        args[1].value_from = Some(ArgumentValueFrom {
            field_ref: Some(FieldRef {
                field_path: "metadata.owner".into(),
            }),
            ..ArgumentValueFrom::default()
        });
        assert_only_error(
            &Rollout::test_canary("web", vec![step.clone()]),
            "spec.strategy.canary.steps[0].analysis.args[1].valueFrom.fieldRef.fieldPath",
        );

        let args = step
            .analysis
            .as_mut()
            .expect("analysis")
            .args
            .as_mut()
            .expect("args");
        args[1].value_from = Some(ArgumentValueFrom {
            secret_key_ref: Some(SecretKeyRef {
                name: "s".into(),
                key: "k".into(),
            }),
            ..ArgumentValueFrom::default()
        });
        assert_only_error(
            &Rollout::test_canary("web", vec![step]),
            "spec.strategy.canary.steps[0].analysis.args[1].valueFrom.secretKeyRef",
        );

        let empty = CanaryStep {
            analysis: Some(RolloutAnalysis::default()),
            ..CanaryStep::default()
        };
        assert_only_error(
            &Rollout::test_canary("web", vec![empty]),
            "spec.strategy.canary.steps[0].analysis.templates",
        );
    }

    #[test]
    fn background_analysis_starting_step_within_steps() {
        let mut rollout = Rollout::test_canary("web", vec![CanaryStep::weight(50)]);
        canary_mut(&mut rollout).analysis = Some(RolloutAnalysisBackground {
            analysis: CanaryStep::analysis("rate").analysis.expect("analysis"),
            starting_step: Some(2),
        });
        assert_only_error(&rollout, "spec.strategy.canary.analysis.startingStep");
    }

    #[test]
    fn progress_deadline_must_exceed_min_ready_seconds() {
        let mut rollout = Rollout::test_canary("web", vec![]);
        rollout.spec.min_ready_seconds = Some(600);
        assert_only_error(&rollout, "spec.progressDeadlineSeconds");
        rollout.spec.min_ready_seconds = Some(-1);
        assert_only_error(&rollout, "spec.minReadySeconds");
    }

    #[test]
    fn unsupported_routers_are_reported_separately() {
        let mut routing = gateway_api();
        routing.alb = Some(crate::rollout::AlbTrafficRouting {
            ingress: Some("web".into()),
            service_port: 80,
            ..Default::default()
        });
        routing
            .plugins
            .as_mut()
            .expect("plugins")
            .insert("acme/router".into(), json!({}));
        let rollout = Rollout::test_canary("web", vec![]).with_traffic_routing(routing);
        let found: Vec<_> = unsupported_features(&rollout)
            .into_iter()
            .map(|e| e.path)
            .collect();
        assert_eq!(
            found,
            [
                "spec.strategy.canary.trafficRouting.alb",
                "spec.strategy.canary.trafficRouting.plugins.acme/router"
            ]
        );
        let supported = Rollout::test_canary("web", vec![]).with_traffic_routing(istio());
        assert_eq!(unsupported_features(&supported), vec![]);
    }

    fn limit_paths(rollout: &Rollout) -> Vec<String> {
        planning_limits(rollout)
            .into_iter()
            .map(|e| e.path)
            .collect()
    }

    #[test]
    fn valid_fixtures_are_within_the_planning_limits() {
        let routed = Rollout::test_canary("web", vec![CanaryStep::weight(20), header_step()])
            .with_traffic_routing(nginx());
        assert_eq!(planning_limits(&routed), vec![]);
        assert_eq!(planning_limits(&Rollout::test_blue_green("web")), vec![]);
    }

    #[test]
    fn steps_the_planner_does_not_plan_are_limits_not_findings() {
        let mut companion = CanaryStep::weight(20);
        companion.set_canary_scale = Some(SetCanaryScale {
            replicas: Some(1),
            weight: Some(10),
            ..SetCanaryScale::default()
        });
        let rollout = Rollout::test_canary("web", vec![companion]).with_traffic_routing(nginx());
        assert_eq!(validate(&rollout), vec![]);
        assert_eq!(
            limit_paths(&rollout),
            [
                "spec.strategy.canary.steps[0]",
                "spec.strategy.canary.steps[0].setCanaryScale"
            ]
        );
    }

    #[test]
    fn routed_settings_the_planner_does_not_plan() {
        let rollout = Rollout::test_canary("web", vec![])
            .with_traffic_routing(nginx())
            .with_canary(|canary| {
                canary.abort_scale_down_delay_seconds = Some(10);
                canary.scale_down_delay_revision_limit = Some(1);
                canary.traffic_routing.as_mut().expect("routing").nginx =
                    Some(NginxTrafficRouting::default());
            });
        assert_eq!(validate(&rollout), vec![]);
        assert_eq!(
            limit_paths(&rollout),
            ["spec.strategy.canary.trafficRouting.nginx.stableIngress"]
        );
        let dynamic = Rollout::test_canary("web", vec![])
            .with_traffic_routing(nginx())
            .with_canary(|canary| {
                canary.abort_scale_down_delay_seconds = Some(10);
                canary.dynamic_stable_scale = Some(true);
            });
        // Planned since the abort steps back through the weights as Argo's does.
        assert!(limit_paths(&dynamic).is_empty());
        let no_router = Rollout::test_canary("web", vec![])
            .with_traffic_routing(RolloutTrafficRouting::default());
        assert_eq!(
            limit_paths(&no_router),
            ["spec.strategy.canary.trafficRouting"]
        );
    }

    #[test]
    fn preview_replica_count_above_replicas_is_a_limit() {
        let rollout = Rollout::test_blue_green("web")
            .with_replicas(2)
            .with_blue_green(|bg| bg.preview_replica_count = Some(3));
        assert_eq!(validate(&rollout), vec![]);
        assert_eq!(
            limit_paths(&rollout),
            ["spec.strategy.blueGreen.previewReplicaCount"]
        );
    }

    #[test]
    fn set_canary_scale_weight_is_against_max_traffic_weight() {
        let step = CanaryStep {
            set_canary_scale: Some(SetCanaryScale {
                weight: Some(500),
                ..SetCanaryScale::default()
            }),
            ..CanaryStep::default()
        };
        let mut routing = nginx();
        routing.max_traffic_weight = Some(1000);
        let rollout = Rollout::test_canary("web", vec![step.clone()]).with_traffic_routing(routing);
        assert_eq!(validate(&rollout), vec![]);
        let rollout = Rollout::test_canary("web", vec![step]).with_traffic_routing(nginx());
        assert_only_error(
            &rollout,
            "spec.strategy.canary.steps[0].setCanaryScale.weight",
        );
    }

    #[test]
    fn absurd_counts_weights_and_seconds_are_refused() {
        let rollout = Rollout::test_canary("web", vec![]).with_replicas(i32::MAX);
        assert_only_error(&rollout, "spec.replicas");
        let rollout = Rollout::test_canary("web", vec![])
            .with_canary(|c| c.max_surge = Some(IntOrString::Int(i32::MAX)));
        assert_only_error(&rollout, "spec.strategy.canary.maxSurge");
        let rollout = Rollout::test_canary("web", vec![])
            .with_replicas(MAX_REPLICAS)
            .with_canary(|c| c.max_surge = Some(IntOrString::String("2147483647%".into())));
        assert_only_error(&rollout, "spec.strategy.canary.maxSurge");
        let rollout = Rollout::test_canary("web", vec![]).with_canary(|c| {
            c.max_unavailable = Some(IntOrString::String("9223372036854775807%".into()))
        });
        let errors = validate(&rollout);
        assert_eq!(errors.len(), 1, "{errors:#?}");
        assert!(
            errors[0].reason.contains("too large a percentage"),
            "{errors:#?}"
        );
        let rollout = Rollout::test_canary("web", vec![])
            .with_canary(|c| c.max_unavailable = Some(IntOrString::String("150%".into())));
        assert_only_error(&rollout, "spec.strategy.canary.maxUnavailable");
        let rollout = Rollout::test_canary("web", vec![])
            .with_canary(|c| c.max_unavailable = Some(IntOrString::String("-5%".into())));
        assert_only_error(&rollout, "spec.strategy.canary.maxUnavailable");

        let mut routing = nginx();
        routing.max_traffic_weight = Some(i32::MAX);
        let rollout = Rollout::test_canary("web", vec![]).with_traffic_routing(routing);
        assert_only_error(
            &rollout,
            "spec.strategy.canary.trafficRouting.maxTrafficWeight",
        );
        let weight = |w: i32| CanaryStep {
            set_weight: Some(w),
            ..CanaryStep::default()
        };
        assert_only_error(
            &Rollout::test_canary("web", vec![weight(150)]),
            "spec.strategy.canary.steps[0].setWeight",
        );
        assert_only_error(
            &Rollout::test_canary("web", vec![weight(-5)]),
            "spec.strategy.canary.steps[0].setWeight",
        );
        let scale = CanaryStep {
            set_canary_scale: Some(SetCanaryScale {
                replicas: Some(i32::MAX),
                ..SetCanaryScale::default()
            }),
            ..CanaryStep::default()
        };
        let rollout = Rollout::test_canary("web", vec![scale]).with_traffic_routing(nginx());
        assert_only_error(
            &rollout,
            "spec.strategy.canary.steps[0].setCanaryScale.replicas",
        );

        let mut rollout = Rollout::test_canary("web", vec![]);
        rollout.spec.progress_deadline_seconds = Some(i32::MAX);
        assert_only_error(&rollout, "spec.progressDeadlineSeconds");
        let rollout = Rollout::test_blue_green("web")
            .with_blue_green(|bg| bg.auto_promotion_seconds = Some(MAX_SECONDS + 1));
        assert_only_error(&rollout, "spec.strategy.blueGreen.autoPromotionSeconds");
        let rollout = Rollout::test_blue_green("web")
            .with_blue_green(|bg| bg.scale_down_delay_seconds = Some(MAX_SECONDS));
        assert_eq!(validate(&rollout), vec![]);
    }

    #[test]
    fn pause_durations_over_a_year_are_refused() {
        let step = |d: IntOrString| CanaryStep {
            pause: Some(RolloutPause { duration: Some(d) }),
            ..CanaryStep::default()
        };
        for duration in [
            IntOrString::String("100000000000000000000s".into()),
            IntOrString::String("8761h".into()),
            IntOrString::Int(i32::MAX),
        ] {
            let rollout = Rollout::test_canary("web", vec![step(duration)]);
            let errors = validate(&rollout);
            assert_eq!(errors.len(), 1, "{errors:#?}");
            assert_eq!(
                errors[0].path,
                "spec.strategy.canary.steps[0].pause.duration"
            );
            assert!(errors[0].fix.contains("at most one year"), "{errors:#?}");
        }
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn int_or_percent() -> impl Strategy<Value = Option<IntOrString>> {
            proptest::option::of(prop_oneof![
                any::<i32>().prop_map(IntOrString::Int),
                any::<i64>().prop_map(|n| IntOrString::String(format!("{n}%"))),
                "\\PC{0,8}".prop_map(IntOrString::String),
            ])
        }

        fn step() -> impl Strategy<Value = CanaryStep> {
            prop_oneof![
                any::<i32>().prop_map(|w| CanaryStep {
                    set_weight: Some(w),
                    ..CanaryStep::default()
                }),
                prop_oneof![
                    any::<i32>().prop_map(IntOrString::Int),
                    "\\PC{0,16}".prop_map(IntOrString::String),
                    "[0-9]{1,22}(s|m|h|ms)".prop_map(IntOrString::String),
                ]
                .prop_map(|d| CanaryStep {
                    pause: Some(RolloutPause { duration: Some(d) }),
                    ..CanaryStep::default()
                }),
                (any::<Option<i32>>(), any::<Option<i32>>()).prop_map(|(weight, replicas)| {
                    CanaryStep {
                        set_canary_scale: Some(SetCanaryScale {
                            weight,
                            replicas,
                            ..SetCanaryScale::default()
                        }),
                        ..CanaryStep::default()
                    }
                }),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(500))]

            /// Any numbers anywhere in a canary: findings or none, never a panic.
            #[test]
            fn any_canary_numbers_validate(
                replicas in any::<Option<i32>>(),
                surge in int_or_percent(),
                unavailable in int_or_percent(),
                max_weight in any::<Option<i32>>(),
                seconds in any::<(Option<i32>, Option<i32>, Option<i32>)>(),
                steps in proptest::collection::vec(step(), 0..4),
                routed in any::<bool>(),
            ) {
                let mut rollout = Rollout::test_canary("web", steps);
                if routed {
                    let mut routing = nginx();
                    routing.max_traffic_weight = max_weight;
                    rollout = rollout.with_traffic_routing(routing);
                }
                rollout.spec.replicas = replicas;
                rollout.spec.progress_deadline_seconds = seconds.0;
                rollout.spec.min_ready_seconds = seconds.1;
                let rollout = rollout.with_canary(|c| {
                    c.max_surge = surge;
                    c.max_unavailable = unavailable;
                    c.scale_down_delay_seconds = seconds.2;
                });
                let _ = validate(&rollout);
                let _ = planning_limits(&rollout);
            }

            /// Any selector against any labels: matches or not, never a panic.
            #[test]
            fn any_selector_validates_and_matches(
                match_labels in proptest::collection::btree_map("\\PC{0,6}", "\\PC{0,6}", 0..3),
                expressions in proptest::collection::vec(
                    (
                        "\\PC{0,6}",
                        prop_oneof![
                            Just("In".to_string()),
                            Just("NotIn".to_string()),
                            Just("Exists".to_string()),
                            Just("DoesNotExist".to_string()),
                            "\\PC{0,8}",
                        ],
                        proptest::option::of(proptest::collection::vec("\\PC{0,6}", 0..3)),
                    ),
                    0..3,
                ),
                labels in proptest::collection::btree_map("\\PC{0,6}", "\\PC{0,6}", 0..4),
            ) {
                let selector = LabelSelector {
                    match_labels: Some(match_labels),
                    match_expressions: Some(
                        expressions
                            .into_iter()
                            .map(|(key, operator, values)| LabelSelectorRequirement {
                                key,
                                operator,
                                values,
                            })
                            .collect(),
                    ),
                };
                let mut errors = Vec::new();
                let _ = validate_selector_syntax(&selector, &mut errors);
                let _ = selector_matches(&selector, &labels);
                let mut rollout = Rollout::test_canary("web", vec![]);
                rollout.spec.selector = Some(selector);
                let _ = validate(&rollout);
            }
        }
    }
}
