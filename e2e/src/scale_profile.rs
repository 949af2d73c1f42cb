//! The realistic cluster of the scale benchmark and its smoke test, as plain JSON: Rollouts of
//! 3 to 10 replicas with full pod templates (two containers, env, probes, resources, volumes,
//! annotations of a typical size), a stable and a canary Service each, a router for a third of
//! them (nginx, Istio, Gateway API in turn), and a background or step analysis whose query
//! carries the Rollout's name and canary hash, so every Rollout queries differently. Ten
//! Rollouts share a namespace. Pods take 2 to 10 s to become Ready and one in twenty fails its
//! first start ([`pod_readiness`]). Needs the CRDs of crds/yaml and e2e/crds.

use std::time::Duration;

use serde_json::{Value, json};

use crate::sim::PodReadiness;

/// The ClusterAnalysisTemplate every Rollout's analysis uses.
pub const ANALYSIS_TEMPLATE: &str = "bench-success-rate";
/// Rollouts per namespace.
pub const PER_NAMESPACE: usize = 10;

/// The router a Rollout's traffic goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Router {
    Nginx,
    Istio,
    GatewayApi,
}

/// Rollout `i`'s name.
pub fn name(i: usize) -> String {
    format!("svc-{i:05}")
}

/// Rollout `i`'s namespace.
pub fn namespace(i: usize) -> String {
    format!("team-{:04}", i / PER_NAMESPACE)
}

/// Rollout `i`'s replicas: 3 to 10, spread evenly.
pub fn replicas(i: usize) -> i32 {
    3 + ((i * 5) % 8) as i32
}

/// A third of the Rollouts have a router, nginx, Istio and the Gateway API in turn.
pub fn router(i: usize) -> Option<Router> {
    let kind = match (i / 3) % 3 {
        0 => Router::Nginx,
        1 => Router::Istio,
        _ => Router::GatewayApi,
    };
    i.is_multiple_of(3).then_some(kind)
}

/// Readiness as the profile has it: 2 to 10 s per pod, 5% failing their first start.
pub fn pod_readiness(seed: u64) -> PodReadiness {
    PodReadiness {
        seed,
        min: Duration::from_secs(2),
        max: Duration::from_secs(10),
        fail_share: 0.05,
    }
}

/// The namespaces `n` Rollouts live in.
pub fn namespaces(n: usize) -> Vec<Value> {
    (0..n.div_ceil(PER_NAMESPACE))
        .map(|k| {
            json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": namespace(k * PER_NAMESPACE), "labels": {"team": format!("team-{k}")}}})
        })
        .collect()
}

/// The analysis template, measuring against the Prometheus at `prometheus`.
pub fn analysis_template(prometheus: &str) -> Value {
    let selector = r#"namespace="{{args.namespace}}",service="{{args.service-name}}",rollouts_pod_template_hash="{{args.canary-hash}}""#;
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "ClusterAnalysisTemplate",
        "metadata": {"name": ANALYSIS_TEMPLATE},
        "spec": {
            "args": [{"name": "service-name"}, {"name": "namespace"}, {"name": "canary-hash"}],
            "metrics": [{
                "name": "success-rate",
                "interval": "5s",
                "count": 2,
                "successCondition": "result[0] >= 0.95",
                "failureLimit": 1,
                "provider": {"prometheus": {
                    "address": prometheus,
                    "query": format!(
                        "sum(rate(http_requests_total{{{selector},code!~\"5..\"}}[1m])) / \
                         sum(rate(http_requests_total{{{selector}}}[1m]))"
                    )
                }}
            }]
        }
    })
}

/// Rollout `i` on `image` and the objects it refers to (Services, router object), each with
/// its namespace.
pub fn objects(i: usize, image: &str) -> Vec<(String, Value)> {
    let (name, namespace) = (name(i), namespace(i));
    let mut objects: Vec<Value> = ["stable", "canary"]
        .into_iter()
        .map(|role| {
            json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": format!("{name}-{role}"), "namespace": namespace,
                    "labels": {"app": name, "role": role}},
                "spec": {"selector": {"app": name},
                    "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
        })
        .collect();
    let traffic_routing = router(i).map(|router| {
        let (object, routing) = router_object(router, &name, &namespace);
        objects.push(object);
        routing
    });
    objects.push(rollout(i, image, traffic_routing));
    objects
        .into_iter()
        .map(|o| (namespace.clone(), o))
        .collect()
}

/// The router object a Rollout's trafficRouting names, and that trafficRouting.
fn router_object(router: Router, name: &str, namespace: &str) -> (Value, Value) {
    let meta = json!({"name": name, "namespace": namespace});
    let backend = |role: &str, weight: i64| (format!("{name}-{role}"), weight);
    match router {
        Router::Nginx => (
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": meta,
                "spec": {"ingressClassName": "nginx", "rules": [{"host": format!("{name}.example.com"),
                    "http": {"paths": [{"path": "/", "pathType": "Prefix",
                        "backend": {"service": {"name": format!("{name}-stable"), "port": {"number": 80}}}}]}}]}}),
            json!({"nginx": {"stableIngress": name}}),
        ),
        Router::Istio => {
            let route: Vec<Value> = [backend("stable", 100), backend("canary", 0)]
                .into_iter()
                .map(|(host, weight)| json!({"destination": {"host": host}, "weight": weight}))
                .collect();
            (
                json!({"apiVersion": "networking.istio.io/v1alpha3", "kind": "VirtualService",
                    "metadata": meta,
                    "spec": {"hosts": [format!("{name}.example.com")],
                        "http": [{"name": "primary", "route": route}]}}),
                json!({"istio": {"virtualService": {"name": name, "routes": ["primary"]}}}),
            )
        }
        Router::GatewayApi => {
            let refs: Vec<Value> = [backend("stable", 100), backend("canary", 0)]
                .into_iter()
                .map(|(service, weight)| json!({"name": service, "port": 80, "weight": weight}))
                .collect();
            (
                json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                    "metadata": meta,
                    "spec": {"parentRefs": [{"name": "public"}],
                        "rules": [{"name": "main", "backendRefs": refs}]}}),
                json!({"plugins": {"argoproj-labs/gatewayAPI": {"httpRoute": name}}}),
            )
        }
    }
}

/// Even Rollouts analyse in the background from step 1; odd ones in a step after the first
/// pause.
fn rollout(i: usize, image: &str, traffic_routing: Option<Value>) -> Value {
    let (name, namespace) = (name(i), namespace(i));
    let analysis = json!({
        "templates": [{"templateName": ANALYSIS_TEMPLATE, "clusterScope": true}],
        "args": [
            {"name": "service-name", "value": name},
            {"name": "namespace", "value": namespace},
            {"name": "canary-hash", "valueFrom": {"podTemplateHashValue": "Latest"}}
        ]
    });
    let mut steps = vec![
        json!({"setWeight": 20}),
        json!({"pause": {"duration": "5s"}}),
    ];
    let mut canary = json!({
        "stableService": format!("{name}-stable"),
        "canaryService": format!("{name}-canary"),
    });
    if i.is_multiple_of(2) {
        let mut background = analysis;
        background["startingStep"] = json!(1);
        canary["analysis"] = background;
    } else {
        steps.push(json!({"analysis": analysis}));
    }
    steps.extend([
        json!({"setWeight": 60}),
        json!({"pause": {"duration": "5s"}}),
    ]);
    canary["steps"] = Value::Array(steps);
    if let Some(routing) = traffic_routing {
        canary["trafficRouting"] = routing;
    }
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": name, "namespace": namespace,
            "labels": {"app": name, "team": namespace, "tier": "backend"},
            "annotations": {
                "owner": "payments-platform@example.com",
                "runbook": format!("https://runbooks.example.com/{namespace}/{name}")
            }},
        "spec": {
            "replicas": replicas(i),
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": 600,
            "selector": {"matchLabels": {"app": name}},
            "template": pod_template(&name, &namespace, image),
            "strategy": {"canary": canary}
        }
    })
}

/// A pod template of the size real services have: an app and a log shipper, env, probes,
/// resources, volumes, and the annotations tooling adds.
fn pod_template(name: &str, namespace: &str, image: &str) -> Value {
    let field = |path: &str| json!({"fieldRef": {"fieldPath": path}});
    json!({
        "metadata": {
            "labels": {"app": name, "team": namespace, "tier": "backend", "version": "stable"},
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "9090",
                "prometheus.io/path": "/metrics",
                "checksum/config": "9f2c4e7a1b3d5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8",
                "kubectl.kubernetes.io/default-container": "app",
                "cluster-autoscaler.kubernetes.io/safe-to-evict": "true"
            }
        },
        "spec": {
            "serviceAccountName": name,
            "terminationGracePeriodSeconds": 30,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 10001, "fsGroup": 10001},
            "containers": [
                {
                    "name": "app",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "args": ["--port=8080", "--metrics-port=9090", "--log-format=json"],
                    "ports": [
                        {"name": "http", "containerPort": 8080, "protocol": "TCP"},
                        {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}
                    ],
                    "env": [
                        {"name": "POD_NAME", "valueFrom": field("metadata.name")},
                        {"name": "POD_NAMESPACE", "valueFrom": field("metadata.namespace")},
                        {"name": "POD_IP", "valueFrom": field("status.podIP")},
                        {"name": "SERVICE_NAME", "value": name},
                        {"name": "LOG_LEVEL", "value": "info"},
                        {"name": "DATABASE_URL", "value": format!("postgres://{name}@db.{namespace}.svc:5432/{name}")},
                        {"name": "CACHE_URL", "value": format!("redis://cache.{namespace}.svc:6379/0")},
                        {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://otel-collector.observability.svc:4317"},
                        {"name": "GOMAXPROCS", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}
                    ],
                    "resources": {
                        "requests": {"cpu": "250m", "memory": "256Mi"},
                        "limits": {"cpu": "1", "memory": "512Mi"}
                    },
                    "readinessProbe": {
                        "httpGet": {"path": "/ready", "port": "http"},
                        "initialDelaySeconds": 2, "periodSeconds": 5, "failureThreshold": 3
                    },
                    "livenessProbe": {
                        "httpGet": {"path": "/healthz", "port": "http"},
                        "initialDelaySeconds": 10, "periodSeconds": 10, "failureThreshold": 3
                    },
                    "volumeMounts": [
                        {"name": "config", "mountPath": "/etc/app", "readOnly": true},
                        {"name": "tmp", "mountPath": "/tmp"}
                    ]
                },
                {
                    "name": "log-shipper",
                    "image": "fluent/fluent-bit:3.0.4",
                    "args": ["--config=/fluent-bit/etc/fluent-bit.conf"],
                    "env": [{"name": "POD_NAME", "valueFrom": field("metadata.name")}],
                    "resources": {
                        "requests": {"cpu": "20m", "memory": "32Mi"},
                        "limits": {"cpu": "100m", "memory": "64Mi"}
                    },
                    "volumeMounts": [{"name": "tmp", "mountPath": "/var/log/app", "readOnly": true}]
                }
            ],
            "volumes": [
                {"name": "config", "configMap": {"name": format!("{name}-config")}},
                {"name": "tmp", "emptyDir": {}}
            ]
        }
    })
}

/// A merge patch releasing `image` to Rollout `i` (its app container).
pub fn release(image: &str) -> Value {
    json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "image": image}]}}}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_spreads_replicas_routers_and_analysis() {
        let replicas: Vec<i32> = (0..8).map(replicas).collect();
        assert_eq!(replicas.iter().min(), Some(&3));
        assert_eq!(replicas.iter().max(), Some(&10));
        let routed: Vec<Router> = (0..90).filter_map(router).collect();
        assert_eq!(routed.len(), 30);
        for kind in [Router::Nginx, Router::Istio, Router::GatewayApi] {
            assert_eq!(routed.iter().filter(|r| **r == kind).count(), 10);
        }
        let objects = objects(0, "app:v1");
        let kinds: Vec<&str> = objects
            .iter()
            .filter_map(|(_, o)| o["kind"].as_str())
            .collect();
        assert_eq!(kinds, ["Service", "Service", "Ingress", "Rollout"]);
        let rollout = &objects[3].1;
        assert_eq!(
            rollout["spec"]["strategy"]["canary"]["analysis"]["args"][2]["valueFrom"],
            json!({"podTemplateHashValue": "Latest"})
        );
        let odd = &super::objects(1, "app:v1")[2].1;
        assert_eq!(
            odd["spec"]["strategy"]["canary"]["steps"][2]["analysis"]["templates"][0]["templateName"],
            ANALYSIS_TEMPLATE
        );
        assert_eq!(namespaces(25).len(), 3);
        assert_eq!(namespace(19), "team-0001");
    }
}
