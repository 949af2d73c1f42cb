//! Which observed ReplicaSet runs the Rollout's pod template, whatever hash it carries. Argo's
//! `FindNewReplicaSet` (utils/replicaset/replicaset.go) looks for its own hash, then its old
//! hash, then for a ReplicaSet whose template equals the Rollout's once the hash label and the
//! injected ephemeral metadata and anti-affinity are removed and the Rollout's template is given
//! the API server's defaults. We do the same: our hash first, then that equality. So a
//! ReplicaSet Argo created (under Argo's hash, which we do not compute) is the current revision,
//! and taking over from Argo re-deploys nothing.
//!
//! The equality is a digest of each side's [`comparable`] form. The ReplicaSet watch cache
//! keeps no pod templates, so it keeps this digest in their place ([`digest_holder`]).
//!
//! What "equal" ignores, on both sides alike: the `rollouts-pod-template-hash` label; labels and
//! annotations that the `rollout.argoproj.io/ephemeral-metadata` annotation records as injected
//! (live side only, as Argo does); pod anti-affinity terms that select on the hash label (the
//! one Argo and we inject); fields an API server defaults when they hold the default value
//! (`restartPolicy: Always`, `dnsPolicy: ClusterFirst`, `schedulerName: default-scheduler`,
//! `terminationGracePeriodSeconds: 30`, `enableServiceLinks: true`, per container
//! `terminationMessagePath`, `terminationMessagePolicy: File`, `imagePullPolicy` as defaulted
//! from the image tag, port `protocol: TCP`, probe timings and `scheme: HTTP`, `fieldRef`
//! `apiVersion: v1`, `resourceFieldRef` `divisor: "0"`, volume `defaultMode: 420`); the
//! deprecated `serviceAccount`; `false` in the bool fields Go omits when false; and empty
//! strings, lists and objects (the empty objects of a volume source, such as `emptyDir: {}`,
//! count). Quantities are compared by value: `cpu: 0.5` and `cpu: 500m` are equal.

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rollouts_crds::rollout::DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY;
use serde_json::{Map, Value};

use super::hash::{digest, pod_template_hash_of_value};
use super::{Observed, ObservedReplicaSet};

/// Annotation of the stand-in template the watch cache keeps for a ReplicaSet: the digest of
/// its real template. Never written to the API.
pub const TEMPLATE_DIGEST_KEY: &str = "rollouts.controller/template-digest";

/// Argo's record of the ephemeral metadata it injected into a ReplicaSet's pod template.
const EPHEMERAL_METADATA_ANNOTATION: &str = "rollout.argoproj.io/ephemeral-metadata";

/// The current revision: its hash and, when it exists, its ReplicaSet. Our hash of `template`
/// when a ReplicaSet carries it; else the oldest ReplicaSet whose template equals `template`
/// (Argo's order: by creation), keeping that ReplicaSet's hash; else our hash and none.
pub(super) fn current_revision<'a>(
    template: &Value,
    collision_count: Option<i32>,
    observed: &'a Observed,
) -> (String, Option<&'a ObservedReplicaSet>) {
    let ours = pod_template_hash_of_value(template, collision_count);
    if let Some(rs) = observed
        .replica_sets
        .iter()
        .find(|rs| rs.pod_template_hash == ours)
    {
        return (ours, Some(rs));
    }
    let Some(desired) = desired_digest(template) else {
        return (ours, None);
    };
    let same = observed
        .replica_sets
        .iter()
        .filter(|rs| !rs.pod_template_hash.is_empty())
        .filter(|rs| observed.template_digests.get(&rs.name) == Some(&desired))
        .min_by(|a, b| (a.created, &a.name).cmp(&(b.created, &b.name)));
    match same {
        Some(rs) => (rs.pod_template_hash.clone(), Some(rs)),
        None => (ours, None),
    }
}

/// The digest of the Rollout's pod template; `None` when it is not a pod template.
pub fn desired_digest(template: &Value) -> Option<String> {
    let typed: PodTemplateSpec = serde_json::from_value(template.clone()).ok()?;
    Some(digest(&comparable(&typed, None)))
}

/// The digest of a live ReplicaSet's pod template; `None` without one.
pub fn live_digest(rs: &ReplicaSet) -> Option<String> {
    let template = rs.spec.as_ref()?.template.as_ref()?;
    let injected = rs
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(EPHEMERAL_METADATA_ANNOTATION))
        .and_then(|recorded| serde_json::from_str::<Value>(recorded).ok());
    Some(digest(&comparable(template, injected.as_ref())))
}

/// The pod template the watch cache keeps in place of the real one: only the digest.
pub fn digest_holder(digest: String) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            annotations: Some([(TEMPLATE_DIGEST_KEY.to_string(), digest)].into()),
            ..ObjectMeta::default()
        }),
        spec: None,
    }
}

/// The digest a cached ReplicaSet's stand-in template holds.
pub fn cached_digest(rs: &ReplicaSet) -> Option<&String> {
    rs.spec
        .as_ref()?
        .template
        .as_ref()?
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(TEMPLATE_DIGEST_KEY)
}

/// `template` as compared: what the module doc lists removed. `injected` is the ReplicaSet's
/// ephemeral-metadata record (`{"labels": {..}, "annotations": {..}}`).
fn comparable(template: &PodTemplateSpec, injected: Option<&Value>) -> Value {
    // A PodTemplateSpec holds only string-keyed maps, so it always has a JSON form.
    let mut value = serde_json::to_value(template).unwrap_or(Value::Null);
    if let Some(metadata) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        remove_key(metadata, "labels", DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY);
        for kind in ["labels", "annotations"] {
            let keys = injected
                .and_then(|record| record.get(kind))
                .and_then(Value::as_object);
            for key in keys.into_iter().flat_map(Map::keys) {
                remove_key(metadata, kind, key);
            }
        }
    }
    if let Some(spec) = value.get_mut("spec").and_then(Value::as_object_mut) {
        without_injected_anti_affinity(spec);
        without_pod_defaults(spec);
    }
    with_canonical_quantities(&mut value);
    pruned(value, false).unwrap_or(Value::Null)
}

/// Rewrites every quantity (the values of `limits`, `requests` and `overhead`, and
/// `sizeLimit`) by its value, so the `0.5` a Rollout says and the `500m` an API server stores
/// compare equal, as Argo's semantic equality compares them.
fn with_canonical_quantities(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, member) in map.iter_mut() {
                match (key.as_str(), member) {
                    ("limits" | "requests" | "overhead", Value::Object(quantities)) => {
                        for quantity in quantities.values_mut() {
                            canonicalize(quantity);
                        }
                    }
                    ("sizeLimit", quantity @ Value::String(_)) => canonicalize(quantity),
                    (_, member) => with_canonical_quantities(member),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(with_canonical_quantities),
        _ => {}
    }
}

fn canonicalize(quantity: &mut Value) {
    if let Some(canonical) = quantity.as_str().and_then(quantity_value) {
        *quantity = Value::String(canonical);
    }
}

/// A Kubernetes quantity (`1.5Gi`, `500m`, `0.5`, `1e3`) as `<integer>e<power of ten>` with no
/// trailing zero in the integer, so equal values have one form; `None` when it does not parse
/// or does not fit (it is then compared as written).
fn quantity_value(text: &str) -> Option<String> {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let number_end = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits = format!("{whole}{fraction}");
    if digits.is_empty() || digits.len() > 30 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut mantissa: i128 = digits.parse().ok()?;
    let mut exponent = -i32::try_from(fraction.len()).ok()?;
    let (power_of_ten, power_of_two) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        scientific => (
            scientific
                .strip_prefix(['e', 'E'])?
                .parse::<i32>()
                .ok()
                .filter(|power| power.abs() <= 100)?,
            0,
        ),
    };
    exponent += power_of_ten;
    mantissa = mantissa.checked_mul(1i128.checked_shl(power_of_two)?)?;
    if mantissa == 0 {
        return Some("0".to_string());
    }
    while mantissa % 10 == 0 {
        mantissa /= 10;
        exponent += 1;
    }
    let sign = if negative { "-" } else { "" };
    Some(format!("{sign}{mantissa}e{exponent}"))
}

fn remove_key(metadata: &mut Map<String, Value>, map: &str, key: &str) {
    if let Some(entries) = metadata.get_mut(map).and_then(Value::as_object_mut) {
        entries.remove(key);
    }
}

/// Drops pod anti-affinity terms selecting on the hash label: the term Argo and we inject
/// against the stable revision.
fn without_injected_anti_affinity(spec: &mut Map<String, Value>) {
    let Some(anti) = spec
        .get_mut("affinity")
        .and_then(|affinity| affinity.get_mut("podAntiAffinity"))
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    let on_hash = |term: &Value| {
        term.pointer("/labelSelector/matchExpressions")
            .and_then(Value::as_array)
            .is_some_and(|expressions| {
                expressions
                    .iter()
                    .any(|e| e["key"] == DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY)
            })
    };
    if let Some(required) = anti
        .get_mut("requiredDuringSchedulingIgnoredDuringExecution")
        .and_then(Value::as_array_mut)
    {
        required.retain(|term| !on_hash(term));
    }
    if let Some(preferred) = anti
        .get_mut("preferredDuringSchedulingIgnoredDuringExecution")
        .and_then(Value::as_array_mut)
    {
        preferred.retain(|weighted| !on_hash(&weighted["podAffinityTerm"]));
    }
}

/// Removes `key` from `object` when it holds `default`.
fn drop_default(object: &mut Map<String, Value>, key: &str, default: Value) {
    if object.get(key) == Some(&default) {
        object.remove(key);
    }
}

/// Removes the fields a pod spec holds at their API-server default (k8s.io/kubernetes
/// pkg/apis/core/v1 defaults, which Argo applies to the desired side before comparing).
fn without_pod_defaults(spec: &mut Map<String, Value>) {
    drop_default(spec, "restartPolicy", "Always".into());
    drop_default(spec, "terminationGracePeriodSeconds", 30.into());
    drop_default(spec, "dnsPolicy", "ClusterFirst".into());
    drop_default(spec, "schedulerName", "default-scheduler".into());
    drop_default(spec, "enableServiceLinks", true.into());
    for flag in ["hostNetwork", "hostPID", "hostIPC"] {
        drop_default(spec, flag, false.into());
    }
    // Argo ignores the deprecated alias the API server fills in (argo-rollouts issue 1356).
    spec.remove("serviceAccount");
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        for container in objects_in(spec, list) {
            without_container_defaults(container);
        }
    }
    for volume in objects_in(spec, "volumes") {
        for source in ["secret", "configMap", "downwardAPI", "projected"] {
            if let Some(source) = volume.get_mut(source).and_then(Value::as_object_mut) {
                drop_default(source, "defaultMode", 420.into());
                for item in objects_in(source, "items") {
                    without_field_ref_default(item);
                }
            }
        }
    }
}

fn without_container_defaults(container: &mut Map<String, Value>) {
    drop_default(
        container,
        "terminationMessagePath",
        "/dev/termination-log".into(),
    );
    drop_default(container, "terminationMessagePolicy", "File".into());
    let pull_policy = default_pull_policy(container.get("image").and_then(Value::as_str));
    drop_default(container, "imagePullPolicy", pull_policy.into());
    for flag in ["stdin", "stdinOnce", "tty"] {
        drop_default(container, flag, false.into());
    }
    for port in objects_in(container, "ports") {
        drop_default(port, "protocol", "TCP".into());
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if let Some(probe) = container.get_mut(probe).and_then(Value::as_object_mut) {
            drop_default(probe, "timeoutSeconds", 1.into());
            drop_default(probe, "periodSeconds", 10.into());
            drop_default(probe, "successThreshold", 1.into());
            drop_default(probe, "failureThreshold", 3.into());
            without_http_get_default(probe);
        }
    }
    if let Some(lifecycle) = container
        .get_mut("lifecycle")
        .and_then(Value::as_object_mut)
    {
        for hook in ["postStart", "preStop"] {
            if let Some(hook) = lifecycle.get_mut(hook).and_then(Value::as_object_mut) {
                without_http_get_default(hook);
            }
        }
    }
    for env in objects_in(container, "env") {
        if let Some(from) = env.get_mut("valueFrom").and_then(Value::as_object_mut) {
            without_field_ref_default(from);
        }
    }
}

fn without_http_get_default(handler: &mut Map<String, Value>) {
    if let Some(get) = handler.get_mut("httpGet").and_then(Value::as_object_mut) {
        drop_default(get, "scheme", "HTTP".into());
    }
}

fn without_field_ref_default(holder: &mut Map<String, Value>) {
    if let Some(field_ref) = holder.get_mut("fieldRef").and_then(Value::as_object_mut) {
        drop_default(field_ref, "apiVersion", "v1".into());
    }
    if let Some(resource_ref) = holder
        .get_mut("resourceFieldRef")
        .and_then(Value::as_object_mut)
    {
        drop_default(resource_ref, "divisor", "0".into());
    }
}

/// The API server's `imagePullPolicy` default: `Always` for `:latest` or no tag (and no
/// digest), `IfNotPresent` otherwise.
fn default_pull_policy(image: Option<&str>) -> &'static str {
    let Some(image) = image else {
        return "IfNotPresent";
    };
    if image.contains('@') {
        return "IfNotPresent";
    }
    // A tag follows the last ':' after the last '/' (a ':' before it is a registry port).
    let name = image.rsplit('/').next().unwrap_or(image);
    match name.rsplit_once(':') {
        Some((_, tag)) if tag != "latest" => "IfNotPresent",
        _ => "Always",
    }
}

/// The objects of the list `key` of `object`.
fn objects_in<'a>(
    object: &'a mut Map<String, Value>,
    key: &str,
) -> impl Iterator<Item = &'a mut Map<String, Value>> {
    object
        .get_mut(key)
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

/// `value` without nulls, empty strings, empty lists and empty objects, at every depth; `None`
/// when nothing is left. `keep_empty_objects` keeps the empty objects directly under this
/// object, or under each object of this list (a volume's source, such as `emptyDir: {}`).
fn pruned(value: Value, keep_empty_objects: bool) -> Option<Value> {
    match value {
        Value::Null => None,
        Value::String(text) if text.is_empty() => None,
        Value::Array(items) => {
            let items: Vec<Value> = items
                .into_iter()
                .map(|item| pruned(item, keep_empty_objects).unwrap_or(Value::Null))
                .collect();
            (!items.is_empty()).then_some(Value::Array(items))
        }
        Value::Object(map) => {
            let mut kept = Map::new();
            for (key, member) in map {
                let empty_object = member.as_object().is_some_and(Map::is_empty);
                let volumes = key == "volumes";
                match pruned(member, volumes) {
                    Some(member) => {
                        kept.insert(key, member);
                    }
                    None if keep_empty_objects && empty_object => {
                        kept.insert(key, Value::Object(Map::new()));
                    }
                    None => {}
                }
            }
            (!kept.is_empty()).then_some(Value::Object(kept))
        }
        scalar => Some(scalar),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::ReplicaSetSpec;
    use k8s_openapi::jiff::Timestamp;
    use rollouts_crds::rollout::{CanaryStep, Rollout, RolloutStatus};
    use serde_json::json;

    use super::*;
    use crate::planner::hash::argo_steps_hash;
    use crate::planner::test_world::at;
    use crate::planner::{plan_once, steps_hash};

    /// The Rollout's template, as a user writes it.
    fn desired() -> Value {
        json!({
            "metadata": {"labels": {"app": "web"}},
            "spec": {
                "containers": [{
                    "name": "app",
                    "image": "registry.example.com/web:1.0",
                    "ports": [{"containerPort": 8080}],
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}},
                    "env": [
                        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}
                    ]
                }],
                "volumes": [{"name": "scratch", "emptyDir": {}}, {"name": "conf", "configMap": {"name": "web"}}]
            }
        })
    }

    /// The same template as an API server stores it in a ReplicaSet Argo created: hash label,
    /// injected canary label, every default filled in.
    fn live(template: Value) -> ReplicaSet {
        serde_json::from_value(json!({
            "metadata": {
                "name": "web-5d7c8f9b6",
                "annotations": {
                    "rollout.argoproj.io/ephemeral-metadata": "{\"labels\":{\"role\":\"canary\"}}"
                }
            },
            "spec": {"selector": {}, "template": template}
        }))
        .expect("a ReplicaSet")
    }

    fn defaulted() -> Value {
        json!({
            "metadata": {
                "creationTimestamp": null,
                "labels": {"app": "web", "rollouts-pod-template-hash": "5d7c8f9b6", "role": "canary"}
            },
            "spec": {
                "containers": [{
                    "name": "app",
                    "image": "registry.example.com/web:1.0",
                    "imagePullPolicy": "IfNotPresent",
                    "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                    "readinessProbe": {
                        "httpGet": {"path": "/ready", "port": 8080, "scheme": "HTTP"},
                        "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3
                    },
                    "env": [
                        {"name": "POD", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
                        {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "0"}}}
                    ],
                    "resources": {},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File"
                }],
                "volumes": [
                    {"name": "scratch", "emptyDir": {}},
                    {"name": "conf", "configMap": {"name": "web", "defaultMode": 420}}
                ],
                "restartPolicy": "Always",
                "terminationGracePeriodSeconds": 30,
                "dnsPolicy": "ClusterFirst",
                "securityContext": {},
                "schedulerName": "default-scheduler",
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                    "labelSelector": {"matchExpressions": [{"key": "rollouts-pod-template-hash", "operator": "In", "values": ["4b5c6d7f8"]}]},
                    "topologyKey": "kubernetes.io/hostname"
                }]}}
            }
        })
    }

    #[test]
    fn a_defaulted_live_template_equals_the_rollouts() {
        assert_eq!(live_digest(&live(defaulted())), desired_digest(&desired()));
    }

    #[test]
    fn a_real_difference_is_seen() {
        let changes: [(&str, Value); 6] = [
            (
                "/spec/containers/0/image",
                json!("registry.example.com/web:2.0"),
            ),
            ("/spec/containers/0/imagePullPolicy", json!("Always")),
            ("/spec/restartPolicy", json!("OnFailure")),
            ("/spec/containers/0/readinessProbe/periodSeconds", json!(5)),
            (
                "/spec/volumes/0",
                json!({"name": "scratch", "ephemeral": {}}),
            ),
            ("/metadata/labels/team", json!("payments")),
        ];
        for (pointer, changed) in changes {
            let mut template = defaulted();
            let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
            let parent = template.pointer_mut(parent).expect("the parent exists");
            match parent {
                Value::Array(items) => items[key.parse::<usize>().expect("an index")] = changed,
                other => other[key] = changed,
            }
            assert_ne!(
                live_digest(&live(template)),
                desired_digest(&desired()),
                "{pointer}"
            );
        }
    }

    #[test]
    fn quantities_compare_by_value() {
        let same = [
            ("0.5", "500m"),
            ("1", "1000m"),
            ("1.5Gi", "1536Mi"),
            ("1k", "1000"),
            ("1e3", "1k"),
            ("100M", "0.1G"),
            ("0", "0m"),
        ];
        for (a, b) in same {
            assert_eq!(quantity_value(a), quantity_value(b), "{a} = {b}");
        }
        assert_ne!(quantity_value("1Ki"), quantity_value("1k"));
        assert_ne!(quantity_value("-1"), quantity_value("1"));
        for unparsed in [
            "",
            "abc",
            "1.2.3",
            "1Xi",
            "1e1000",
            "999999999999999999999999999999Ei",
        ] {
            assert_eq!(quantity_value(unparsed), None, "{unparsed}");
        }

        let mut desired = desired();
        desired["spec"]["containers"][0]["resources"] =
            json!({"limits": {"cpu": 0.5, "memory": "1.5Gi"}, "requests": {"cpu": "0.25"}});
        let mut stored = defaulted();
        stored["spec"]["containers"][0]["resources"] =
            json!({"limits": {"cpu": "500m", "memory": "1536Mi"}, "requests": {"cpu": "250m"}});
        assert_eq!(live_digest(&live(stored)), desired_digest(&desired));
    }

    #[test]
    fn the_pull_policy_default_follows_the_tag() {
        assert_eq!(default_pull_policy(Some("nginx")), "Always");
        assert_eq!(default_pull_policy(Some("nginx:latest")), "Always");
        assert_eq!(default_pull_policy(Some("nginx:1.27")), "IfNotPresent");
        assert_eq!(default_pull_policy(Some("registry:5000/nginx")), "Always");
        assert_eq!(
            default_pull_policy(Some("nginx@sha256:abc")),
            "IfNotPresent"
        );
    }

    fn observed_rs(name: &str, hash: &str, created: i64) -> ObservedReplicaSet {
        ObservedReplicaSet {
            name: name.into(),
            pod_template_hash: hash.into(),
            replicas: 3,
            current_replicas: 3,
            ready_replicas: 3,
            available_replicas: 3,
            annotations: Default::default(),
            created: Timestamp::from_second(created).expect("a time"),
            min_ready_seconds: 0,
            replica_failure: None,
        }
    }

    #[test]
    fn our_hash_wins_then_the_oldest_equal_template() {
        let ours = pod_template_hash_of_value(&desired(), None);
        let equal = desired_digest(&desired()).expect("a digest");
        let mut observed = Observed {
            replica_sets: vec![
                observed_rs("web-newer", "6f7d8c9b5", 200),
                observed_rs("web-5d7c8f9b6", "5d7c8f9b6", 100),
                observed_rs("web-other", "4b5c6d7f8", 50),
            ],
            ..Observed::default()
        };
        for name in ["web-newer", "web-5d7c8f9b6"] {
            observed.template_digests.insert(name.into(), equal.clone());
        }
        observed
            .template_digests
            .insert("web-other".into(), "another".into());
        let (hash, rs) = current_revision(&desired(), None, &observed);
        assert_eq!(hash, "5d7c8f9b6");
        assert_eq!(rs.map(|rs| rs.name.as_str()), Some("web-5d7c8f9b6"));

        observed
            .replica_sets
            .push(observed_rs(&format!("web-{ours}"), &ours, 300));
        let (hash, rs) = current_revision(&desired(), None, &observed);
        assert_eq!(hash, ours);
        assert_eq!(rs.map(|rs| rs.name.clone()), Some(format!("web-{ours}")));
    }

    #[test]
    fn no_equal_template_means_our_hash_and_no_replica_set() {
        let observed = Observed {
            replica_sets: vec![observed_rs("web-5d7c8f9b6", "5d7c8f9b6", 100)],
            ..Observed::default()
        };
        let (hash, rs) = current_revision(&desired(), None, &observed);
        assert_eq!(hash, pod_template_hash_of_value(&desired(), None));
        assert!(rs.is_none());
    }

    #[test]
    fn the_cache_keeps_only_the_digest() {
        let mut rs = live(defaulted());
        let digest = live_digest(&rs).expect("a digest");
        rs.spec = Some(ReplicaSetSpec {
            template: Some(digest_holder(digest.clone())),
            ..ReplicaSetSpec::default()
        });
        assert_eq!(cached_digest(&rs), Some(&digest));
    }

    /// A canary Argo left at `status` (merged over Argo's hashes and generation 1): its canary
    /// `web-6c9f7d8b4` (the Rollout's template, revision 2) at 1 of 4 pods, its stable
    /// `web-5d7c8f9b6` (an older template) at 3.
    fn left_by_argo(steps: Vec<CanaryStep>, status: Value) -> (Rollout, Observed) {
        let mut full = json!({
            "currentPodHash": "6c9f7d8b4",
            "stableRS": "5d7c8f9b6",
            "observedGeneration": "1",
        });
        for (key, value) in status.as_object().into_iter().flatten() {
            full[key] = value.clone();
        }
        let status: RolloutStatus = serde_json::from_value(full).expect("a status");
        let rollout = Rollout::test_canary("web", steps)
            .with_replicas(4)
            .with_status(status);
        let template = Value::Object(rollout.spec.template.clone().expect("a template").0);
        let mut canary = observed_rs("web-6c9f7d8b4", "6c9f7d8b4", 200);
        (canary.replicas, canary.current_replicas) = (1, 1);
        (canary.ready_replicas, canary.available_replicas) = (1, 1);
        canary
            .annotations
            .insert(crate::planner::REVISION_ANNOTATION.into(), "2".into());
        let observed = Observed {
            replica_sets: vec![observed_rs("web-5d7c8f9b6", "5d7c8f9b6", 100), canary],
            template_digests: [
                (
                    "web-6c9f7d8b4".to_string(),
                    desired_digest(&template).expect("a digest"),
                ),
                ("web-5d7c8f9b6".to_string(), "an older template".to_string()),
            ]
            .into(),
            ..Observed::default()
        };
        (rollout, observed)
    }

    /// A canary Argo left paused at its indefinite pause after `setWeight: 25`.
    fn paused_by_argo(step_hash: &str, observed_generation: &str) -> (Rollout, Observed) {
        let steps = vec![CanaryStep::weight(25), CanaryStep::pause_indefinitely()];
        left_by_argo(
            steps,
            json!({
                "currentStepIndex": 1,
                "currentStepHash": step_hash,
                "pauseConditions": [{"reason": "CanaryPauseStep", "startTime": "2027-01-15T08:00:00Z"}],
                "controllerPause": true,
                "observedGeneration": observed_generation,
            }),
        )
    }

    fn argo_hash_of(rollout: &Rollout) -> String {
        let canary = rollout.spec.strategy.canary.as_ref().expect("a canary");
        argo_steps_hash(canary.steps.as_deref())
    }

    #[test]
    fn a_canary_argo_paused_stays_paused_on_argos_replica_sets() {
        let (rollout, _) = paused_by_argo("", "1");
        let (rollout, observed) = paused_by_argo(&argo_hash_of(&rollout), "1");
        let plan = plan_once(&rollout, &observed, at(10));
        assert_eq!(plan.create_replica_set, None);
        assert!(plan.scale_replica_sets.is_empty(), "{plan:?}");
        let previous = rollout.status.as_ref().expect("a status");
        assert_eq!(plan.status.current_pod_hash, "6c9f7d8b4");
        assert_eq!(plan.status.stable_rs, "5d7c8f9b6");
        assert_eq!(plan.status.current_step_index, Some(1));
        assert_eq!(plan.status.current_step_hash, previous.current_step_hash);
        assert_eq!(plan.status.pause_conditions, previous.pause_conditions);
        assert!(plan.create_analysis_runs.is_empty());
    }

    #[test]
    fn a_step_hash_we_cannot_compute_is_trusted_only_at_argos_generation() {
        let (rollout, observed) = paused_by_argo("unknown", "1");
        let plan = plan_once(&rollout, &observed, at(10));
        assert_eq!(plan.create_replica_set, None);
        assert_eq!(plan.status.current_step_index, Some(1));
        let canary = rollout.spec.strategy.canary.as_ref().expect("a canary");
        assert_eq!(plan.status.current_step_hash, steps_hash(canary.steps()));

        // The spec changed since Argo wrote its status: the steps start over on the same
        // ReplicaSets (step 0 holds at once, so the pause is entered anew).
        let (rollout, observed) = paused_by_argo("unknown", "0");
        let plan = plan_once(&rollout, &observed, at(10));
        assert_eq!(plan.create_replica_set, None);
        assert_eq!(plan.status.current_pod_hash, "6c9f7d8b4");
        let previous = rollout.status.as_ref().expect("a status");
        assert_ne!(plan.status.pause_conditions, previous.pause_conditions);
    }

    #[test]
    fn an_analysis_step_after_the_takeover_analyses_argos_revision() {
        let steps = vec![CanaryStep::weight(25), CanaryStep::analysis("success-rate")];
        let steps_hash = argo_steps_hash(Some(&steps));
        let (rollout, observed) = left_by_argo(
            steps,
            json!({"currentStepIndex": 1, "currentStepHash": steps_hash}),
        );
        let plan = plan_once(&rollout, &observed, at(10));
        assert_eq!(plan.create_replica_set, None);
        let [run] = plan.create_analysis_runs.as_slice() else {
            panic!("one run for the step: {:?}", plan.create_analysis_runs);
        };
        assert_eq!(run.pod_template_hash, "6c9f7d8b4");
        assert_eq!(run.stable_pod_template_hash, "5d7c8f9b6");
        assert_eq!(run.revision.as_deref(), Some("2"));
        assert!(run.name.starts_with("web-6c9f7d8b4-"), "{}", run.name);
    }

    #[test]
    fn a_canary_argo_aborted_stays_aborted() {
        let steps = vec![CanaryStep::weight(25), CanaryStep::pause_indefinitely()];
        let steps_hash = argo_steps_hash(Some(&steps));
        let (rollout, mut observed) = left_by_argo(
            steps,
            json!({
                "currentStepIndex": 0,
                "currentStepHash": steps_hash,
                "abort": true,
                "abortedAt": "2027-01-15T08:00:00Z",
                "pauseConditions": [],
            }),
        );
        // Argo scaled the canary to nothing and the stable back to all 4 pods.
        for rs in &mut observed.replica_sets {
            let pods = if rs.pod_template_hash == "6c9f7d8b4" {
                0
            } else {
                4
            };
            (rs.replicas, rs.current_replicas) = (pods, pods);
            (rs.ready_replicas, rs.available_replicas) = (pods, pods);
        }
        let plan = plan_once(&rollout, &observed, at(10));
        assert_eq!(plan.create_replica_set, None);
        assert!(plan.scale_replica_sets.is_empty(), "{plan:?}");
        assert!(plan.status.abort);
        assert_eq!(plan.status.current_pod_hash, "6c9f7d8b4");
        assert_eq!(plan.status.current_step_index, Some(0));
    }
}
