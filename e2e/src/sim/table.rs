//! Server-side `Table` responses for `kubectl get`: the API server's own columns for the built-in
//! kinds we serve, and a CRD's `additionalPrinterColumns` (paths evaluated by `jsonpath`) for
//! custom resources.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jiff::Timestamp;
use jiff::civil::Date;
use serde_json::{Map, Value, json};

use super::jsonpath::json_path;
use super::selector::LabelSelector;

/// One `additionalPrinterColumns` entry of a CRD version.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PrinterColumn {
    pub name: String,
    pub type_: String,
    pub format: String,
    pub description: String,
    pub priority: i64,
    pub json_path: String,
}

impl PrinterColumn {
    /// Columns from a CRD version's `additionalPrinterColumns` array.
    pub fn from_crd(columns: &Value) -> Vec<Self> {
        columns
            .as_array()
            .map(|cols| {
                cols.iter()
                    .map(|c| Self {
                        name: text(&c["name"]).to_string(),
                        type_: c["type"].as_str().unwrap_or("string").to_string(),
                        format: text(&c["format"]).to_string(),
                        description: text(&c["description"]).to_string(),
                        priority: c["priority"].as_i64().unwrap_or(0),
                        json_path: text(&c["jsonPath"]).to_string(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn definition(&self) -> Value {
        let description = if self.description.is_empty() {
            format!("Custom resource column at JSONPath {}", self.json_path)
        } else {
            self.description.clone()
        };
        json!({
            "name": self.name,
            "type": self.type_,
            "format": self.format,
            "description": description,
            "priority": self.priority,
        })
    }
}

/// A `meta.k8s.io/v1` Table for `objects` of resource `plural` in `group` (`""` for core).
/// `crd_columns` are the CRD's printer columns when the resource is a custom resource.
pub fn table(
    plural: &str,
    group: &str,
    crd_columns: Option<&[PrinterColumn]>,
    objects: &[Value],
    resource_version: &str,
    now: SystemTime,
) -> Value {
    let printer = match crd_columns {
        Some(columns) => Printer::Custom(custom_columns(columns)),
        None => Printer::builtin(group, plural),
    };
    let rows: Vec<Value> = objects
        .iter()
        .map(|object| {
            let mut row = Map::new();
            row.insert("cells".into(), Value::Array(printer.cells(object, now)));
            if let Some(conditions) = printer.row_conditions(object) {
                row.insert("conditions".into(), conditions);
            }
            row.insert("object".into(), partial_object_metadata(object));
            Value::Object(row)
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": printer.columns(),
        "rows": rows,
    })
}

/// The row's `object` as `kubectl get` asks for it by default (`includeObject=Metadata`).
fn partial_object_metadata(object: &Value) -> Value {
    let mut metadata = object["metadata"].as_object().cloned().unwrap_or_default();
    metadata.shift_remove("managedFields");
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
    })
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

fn int(value: &Value) -> i64 {
    value.as_i64().unwrap_or(0)
}

fn or_none(s: &str) -> String {
    if s.is_empty() {
        "<none>".to_string()
    } else {
        s.to_string()
    }
}

/// A column definition; `format` is `name` for the column kubectl uses as the object's name.
fn column(name: &str, type_: &str, format: &str, priority: i64, description: &str) -> Value {
    json!({
        "name": name,
        "type": type_,
        "format": format,
        "description": description,
        "priority": priority,
    })
}

const NAME_DOC: &str = "Name must be unique within a namespace.";
const AGE_DOC: &str = "Time since the object was created (creationTimestamp).";
const CONTAINERS_DOC: &str = "Names of each container in the template.";
const IMAGES_DOC: &str = "Images referenced by each container in the template.";

fn name_column() -> Value {
    column("Name", "string", "name", 0, NAME_DOC)
}

fn age_column() -> Value {
    column("Age", "string", "", 0, AGE_DOC)
}

/// Which printer renders a resource.
enum Printer {
    Pods,
    ReplicaSets,
    Deployments,
    Services,
    Namespaces,
    ConfigMaps,
    Jobs,
    Events,
    Leases,
    Ingresses,
    CustomResourceDefinitions,
    Custom(Vec<PrinterColumn>),
    Default,
}

/// A CRD's columns as the API server serves them: Age alone when the CRD declares none.
fn custom_columns(columns: &[PrinterColumn]) -> Vec<PrinterColumn> {
    if !columns.is_empty() {
        return columns.to_vec();
    }
    vec![PrinterColumn {
        name: "Age".into(),
        type_: "date".into(),
        description: AGE_DOC.into(),
        json_path: ".metadata.creationTimestamp".into(),
        ..Default::default()
    }]
}

impl Printer {
    fn builtin(group: &str, plural: &str) -> Self {
        match (group, plural) {
            ("", "pods") => Printer::Pods,
            ("apps", "replicasets") => Printer::ReplicaSets,
            ("apps", "deployments") => Printer::Deployments,
            ("", "services") => Printer::Services,
            ("", "namespaces") => Printer::Namespaces,
            ("", "configmaps") => Printer::ConfigMaps,
            ("batch", "jobs") => Printer::Jobs,
            ("" | "events.k8s.io", "events") => Printer::Events,
            ("coordination.k8s.io", "leases") => Printer::Leases,
            ("networking.k8s.io", "ingresses") => Printer::Ingresses,
            ("apiextensions.k8s.io", "customresourcedefinitions") => {
                Printer::CustomResourceDefinitions
            }
            _ => Printer::Default,
        }
    }

    fn columns(&self) -> Vec<Value> {
        match self {
            Printer::Pods => vec![
                name_column(),
                column(
                    "Ready",
                    "string",
                    "",
                    0,
                    "Ready containers of all containers in the pod.",
                ),
                column(
                    "Status",
                    "string",
                    "",
                    0,
                    "The aggregate status of the pod's containers.",
                ),
                column(
                    "Restarts",
                    "string",
                    "",
                    0,
                    "Container restarts, and how long ago the last one was.",
                ),
                age_column(),
                column("IP", "string", "", 1, "The pod's IP address."),
                column("Node", "string", "", 1, "The node the pod is scheduled on."),
                column(
                    "Nominated Node",
                    "string",
                    "",
                    1,
                    "The node the scheduler nominated for preemption.",
                ),
                column(
                    "Readiness Gates",
                    "string",
                    "",
                    1,
                    "True readiness gates of all readiness gates.",
                ),
            ],
            Printer::ReplicaSets => vec![
                name_column(),
                column("Desired", "integer", "", 0, "Replicas the spec asks for."),
                column("Current", "integer", "", 0, "Replicas that exist."),
                column("Ready", "integer", "", 0, "Replicas that are ready."),
                age_column(),
                column("Containers", "string", "", 1, CONTAINERS_DOC),
                column("Images", "string", "", 1, IMAGES_DOC),
                column(
                    "Selector",
                    "string",
                    "",
                    1,
                    "The label selector of the pods.",
                ),
            ],
            Printer::Deployments => vec![
                name_column(),
                column(
                    "Ready",
                    "string",
                    "",
                    0,
                    "Ready replicas of desired replicas.",
                ),
                column(
                    "Up-to-date",
                    "string",
                    "",
                    0,
                    "Replicas running the current pod template.",
                ),
                column("Available", "string", "", 0, "Replicas available to serve."),
                age_column(),
                column("Containers", "string", "", 1, CONTAINERS_DOC),
                column("Images", "string", "", 1, IMAGES_DOC),
                column(
                    "Selector",
                    "string",
                    "",
                    1,
                    "The label selector of the pods.",
                ),
            ],
            Printer::Services => vec![
                name_column(),
                column("Type", "string", "", 0, "How the service is exposed."),
                column(
                    "Cluster-IP",
                    "string",
                    "",
                    0,
                    "The service's cluster IP address.",
                ),
                column(
                    "External-IP",
                    "string",
                    "",
                    0,
                    "Addresses the service is reachable at from outside.",
                ),
                column("Port(s)", "string", "", 0, "The service's ports."),
                age_column(),
                column(
                    "Selector",
                    "string",
                    "",
                    1,
                    "The label selector of the backing pods.",
                ),
            ],
            Printer::Namespaces => vec![
                name_column(),
                column("Status", "string", "", 0, "The phase of the namespace."),
                age_column(),
            ],
            Printer::ConfigMaps => vec![
                name_column(),
                column(
                    "Data",
                    "string",
                    "",
                    0,
                    "Number of data and binaryData entries.",
                ),
                age_column(),
            ],
            Printer::Jobs => vec![
                name_column(),
                column("Status", "string", "", 0, "Status of the job."),
                column(
                    "Completions",
                    "string",
                    "",
                    0,
                    "Succeeded pods of required completions.",
                ),
                column(
                    "Duration",
                    "string",
                    "",
                    0,
                    "Time the job ran or has been running.",
                ),
                age_column(),
                column("Containers", "string", "", 1, CONTAINERS_DOC),
                column("Images", "string", "", 1, IMAGES_DOC),
                column(
                    "Selector",
                    "string",
                    "",
                    1,
                    "The label selector of the pods.",
                ),
            ],
            Printer::Events => vec![
                column(
                    "Last Seen",
                    "string",
                    "",
                    0,
                    "Time since the event was last observed.",
                ),
                column("Type", "string", "", 0, "Normal or Warning."),
                column(
                    "Reason",
                    "string",
                    "",
                    0,
                    "Why the event happened, in one word.",
                ),
                column("Object", "string", "", 0, "The object the event is about."),
                column(
                    "Subobject",
                    "string",
                    "",
                    1,
                    "The part of the object the event is about.",
                ),
                column(
                    "Source",
                    "string",
                    "",
                    1,
                    "The component that reported the event.",
                ),
                column("Message", "string", "", 0, "What happened."),
                column(
                    "First Seen",
                    "string",
                    "",
                    1,
                    "Time since the event was first observed.",
                ),
                column(
                    "Count",
                    "string",
                    "",
                    1,
                    "How often the event was observed.",
                ),
                column("Name", "string", "name", 1, NAME_DOC),
            ],
            Printer::Leases => vec![
                name_column(),
                column("Holder", "string", "", 0, "The identity holding the lease."),
                age_column(),
            ],
            Printer::Ingresses => vec![
                name_column(),
                column("Class", "string", "", 0, "The IngressClass of the ingress."),
                column("Hosts", "string", "", 0, "Hosts the rules match."),
                column(
                    "Address",
                    "string",
                    "",
                    0,
                    "Addresses of the load balancer.",
                ),
                column("Ports", "string", "", 0, "Ports the ingress opens."),
                age_column(),
            ],
            Printer::CustomResourceDefinitions => vec![
                name_column(),
                column(
                    "Created At",
                    "date",
                    "",
                    0,
                    "When the object was created (creationTimestamp).",
                ),
            ],
            Printer::Custom(columns) => std::iter::once(name_column())
                .chain(columns.iter().map(PrinterColumn::definition))
                .collect(),
            Printer::Default => vec![name_column(), age_column()],
        }
    }

    fn cells(&self, object: &Value, now: SystemTime) -> Vec<Value> {
        let metadata = &object["metadata"];
        let name = json!(text(&metadata["name"]));
        let age = json!(timestamp_since(&metadata["creationTimestamp"], now));
        let spec = &object["spec"];
        let status = &object["status"];
        match self {
            Printer::Pods => pod_cells(object, now),
            Printer::ReplicaSets => {
                let (names, images) = container_cells(&spec["template"]["spec"]["containers"]);
                vec![
                    name,
                    json!(spec["replicas"].as_i64().unwrap_or(1)),
                    json!(int(&status["replicas"])),
                    json!(int(&status["readyReplicas"])),
                    age,
                    json!(names),
                    json!(images),
                    json!(selector_text(&spec["selector"])),
                ]
            }
            Printer::Deployments => {
                let (names, images) = container_cells(&spec["template"]["spec"]["containers"]);
                vec![
                    name,
                    json!(format!(
                        "{}/{}",
                        int(&status["readyReplicas"]),
                        spec["replicas"].as_i64().unwrap_or(1)
                    )),
                    json!(int(&status["updatedReplicas"])),
                    json!(int(&status["availableReplicas"])),
                    age,
                    json!(names),
                    json!(images),
                    json!(selector_text(&spec["selector"])),
                ]
            }
            Printer::Services => {
                let cluster_ip = spec["clusterIPs"][0]
                    .as_str()
                    .or_else(|| spec["clusterIP"].as_str())
                    .unwrap_or_default();
                let selector = spec["selector"]
                    .as_object()
                    .map(format_labels)
                    .unwrap_or_else(|| "<none>".to_string());
                vec![
                    name,
                    json!(spec["type"].as_str().unwrap_or("ClusterIP")),
                    json!(or_none(cluster_ip)),
                    json!(service_external_ip(object)),
                    json!(or_none(&service_ports(&spec["ports"]))),
                    age,
                    json!(selector),
                ]
            }
            Printer::Namespaces => vec![name, json!(text(&status["phase"])), age],
            Printer::ConfigMaps => {
                let entries = |v: &Value| v.as_object().map_or(0, Map::len);
                let count = entries(&object["data"]) + entries(&object["binaryData"]);
                vec![name, json!(count), age]
            }
            Printer::Jobs => job_cells(object, now),
            Printer::Events => event_cells(object, now),
            Printer::Leases => vec![name, json!(text(&spec["holderIdentity"])), age],
            Printer::Ingresses => {
                let class = or_none(text(&spec["ingressClassName"]));
                let ports = if spec["tls"].as_array().is_some_and(|t| !t.is_empty()) {
                    "80, 443"
                } else {
                    "80"
                };
                vec![
                    name,
                    json!(class),
                    json!(ingress_hosts(&spec["rules"])),
                    json!(load_balancer_addresses(&status["loadBalancer"]["ingress"])),
                    json!(ports),
                    age,
                ]
            }
            Printer::CustomResourceDefinitions => {
                let created = parse_rfc3339(text(&metadata["creationTimestamp"]))
                    .map(format_rfc3339)
                    .unwrap_or_default();
                vec![name, json!(created)]
            }
            Printer::Custom(columns) => std::iter::once(name)
                .chain(columns.iter().map(|c| custom_cell(c, object, now)))
                .collect(),
            Printer::Default => vec![name, age],
        }
    }

    /// Row conditions: the API server marks finished pods `Completed`.
    fn row_conditions(&self, object: &Value) -> Option<Value> {
        if !matches!(self, Printer::Pods) {
            return None;
        }
        let (reason, message) = match text(&object["status"]["phase"]) {
            "Succeeded" => ("Succeeded", "The pod has completed successfully."),
            "Failed" => ("Failed", "The pod failed."),
            _ => return None,
        };
        Some(json!([{"type": "Completed", "status": "True", "reason": reason, "message": message}]))
    }
}

/// Names and images of a template's containers, comma separated.
fn container_cells(containers: &Value) -> (String, String) {
    let containers = containers.as_array().map(Vec::as_slice).unwrap_or_default();
    let names: Vec<&str> = containers.iter().map(|c| text(&c["name"])).collect();
    let images: Vec<&str> = containers.iter().map(|c| text(&c["image"])).collect();
    (names.join(","), images.join(","))
}

/// A structured label selector in query-string form, `<none>` when it selects everything.
fn selector_text(selector: &Value) -> String {
    match LabelSelector::from_json(selector) {
        Ok(s) if s.is_empty() => "<none>".to_string(),
        Ok(s) => {
            let printed = s.to_string();
            if printed.is_empty() {
                "<none>".to_string()
            } else {
                printed
            }
        }
        Err(_) => "<invalid>".to_string(),
    }
}

/// Labels as `a=b,c=d`, sorted by key.
fn format_labels(labels: &Map<String, Value>) -> String {
    if labels.is_empty() {
        return "<none>".to_string();
    }
    let mut pairs: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}={}", text(v)))
        .collect();
    pairs.sort();
    pairs.join(",")
}

fn condition_true(conditions: &Value, kind: &str) -> bool {
    conditions
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == kind))
        .is_some_and(|c| c["status"] == "True")
}

fn pod_cells(pod: &Value, now: SystemTime) -> Vec<Value> {
    let spec = &pod["spec"];
    let status = &pod["status"];
    let empty = Vec::new();
    let list = |v: &Value| v.as_array().unwrap_or(&empty).clone();
    let init_specs = list(&spec["initContainers"]);
    // Sidecars (init containers that restart always) count as containers.
    let is_sidecar = |name: &str| {
        init_specs
            .iter()
            .any(|c| c["name"] == name && c["restartPolicy"] == "Always")
    };
    let total = list(&spec["containers"]).len()
        + init_specs
            .iter()
            .filter(|c| c["restartPolicy"] == "Always")
            .count();
    let mut ready = 0;
    let mut restarts = 0;
    let mut sidecar_restarts = 0;
    let mut last_restart: Option<SystemTime> = None;
    let mut last_sidecar_restart: Option<SystemTime> = None;
    let later = |a: Option<SystemTime>, b: Option<SystemTime>| match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    };
    let finished_at = |c: &Value| parse_rfc3339(text(&c["lastState"]["terminated"]["finishedAt"]));

    let phase = text(&status["phase"]);
    let mut reason = if text(&status["reason"]).is_empty() {
        phase.to_string()
    } else {
        text(&status["reason"]).to_string()
    };
    let gated = status["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "PodScheduled" && c["reason"] == "SchedulingGated")
    });
    if gated {
        reason = "SchedulingGated".to_string();
    }

    let init_statuses = list(&status["initContainerStatuses"]);
    let mut initializing = false;
    for (i, container) in init_statuses.iter().enumerate() {
        restarts += int(&container["restartCount"]);
        last_restart = later(last_restart, finished_at(container));
        let sidecar = is_sidecar(text(&container["name"]));
        if sidecar {
            sidecar_restarts += int(&container["restartCount"]);
            last_sidecar_restart = later(last_sidecar_restart, finished_at(container));
        }
        let terminated = &container["state"]["terminated"];
        let waiting_reason = text(&container["state"]["waiting"]["reason"]);
        if terminated.is_object() && int(&terminated["exitCode"]) == 0 {
            continue;
        }
        if sidecar && container["started"] == true {
            if container["ready"] == true {
                ready += 1;
            }
            continue;
        }
        if terminated.is_object() {
            reason = match text(&terminated["reason"]) {
                "" if int(&terminated["signal"]) != 0 => {
                    format!("Init:Signal:{}", int(&terminated["signal"]))
                }
                "" => format!("Init:ExitCode:{}", int(&terminated["exitCode"])),
                r => format!("Init:{r}"),
            };
        } else if !waiting_reason.is_empty() && waiting_reason != "PodInitializing" {
            reason = format!("Init:{waiting_reason}");
        } else {
            reason = format!("Init:{i}/{}", init_specs.len());
        }
        initializing = true;
        break;
    }

    if !initializing || condition_true(&status["conditions"], "Initialized") {
        restarts = sidecar_restarts;
        last_restart = last_sidecar_restart;
        let mut has_running = false;
        for container in list(&status["containerStatuses"]).iter().rev() {
            restarts += int(&container["restartCount"]);
            last_restart = later(last_restart, finished_at(container));
            let state = &container["state"];
            let waiting = text(&state["waiting"]["reason"]);
            let terminated = &state["terminated"];
            if !waiting.is_empty() {
                reason = waiting.to_string();
            } else if terminated.is_object() && !text(&terminated["reason"]).is_empty() {
                reason = text(&terminated["reason"]).to_string();
            } else if terminated.is_object() {
                reason = if int(&terminated["signal"]) != 0 {
                    format!("Signal:{}", int(&terminated["signal"]))
                } else {
                    format!("ExitCode:{}", int(&terminated["exitCode"]))
                };
            } else if container["ready"] == true && state["running"].is_object() {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            reason = if condition_true(&status["conditions"], "Ready") {
                "Running".to_string()
            } else {
                "NotReady".to_string()
            };
        }
    }

    let deleting = !pod["metadata"]["deletionTimestamp"].is_null();
    if deleting && text(&status["reason"]) == "NodeLost" {
        reason = "Unknown".to_string();
    } else if deleting && phase != "Succeeded" && phase != "Failed" {
        reason = "Terminating".to_string();
    }

    let restarts_text = match last_restart {
        Some(at) if restarts != 0 => format!("{restarts} ({} ago)", since(at, now)),
        _ => restarts.to_string(),
    };
    let pod_ip = status["podIPs"][0]["ip"]
        .as_str()
        .or_else(|| status["podIP"].as_str())
        .unwrap_or_default();
    let gates = spec["readinessGates"].as_array().filter(|g| !g.is_empty());
    let readiness_gates = match gates {
        None => "<none>".to_string(),
        Some(gates) => {
            let passing = gates
                .iter()
                .filter(|g| condition_true(&status["conditions"], text(&g["conditionType"])))
                .count();
            format!("{passing}/{}", gates.len())
        }
    };
    vec![
        json!(text(&pod["metadata"]["name"])),
        json!(format!("{ready}/{total}")),
        json!(reason),
        json!(restarts_text),
        json!(timestamp_since(&pod["metadata"]["creationTimestamp"], now)),
        json!(or_none(pod_ip)),
        json!(or_none(text(&spec["nodeName"]))),
        json!(or_none(text(&status["nominatedNodeName"]))),
        json!(readiness_gates),
    ]
}

fn job_cells(job: &Value, now: SystemTime) -> Vec<Value> {
    let spec = &job["spec"];
    let status = &job["status"];
    let succeeded = int(&status["succeeded"]);
    let completions = match spec["completions"].as_i64() {
        Some(c) => format!("{succeeded}/{c}"),
        None => match int(&spec["parallelism"]) {
            p if p > 1 => format!("{succeeded}/1 of {p}"),
            _ => format!("{succeeded}/1"),
        },
    };
    let started = parse_rfc3339(text(&status["startTime"]));
    let completed = parse_rfc3339(text(&status["completionTime"]));
    let duration = match (started, completed) {
        (None, _) => String::new(),
        (Some(start), None) => since(start, now),
        (Some(start), Some(end)) => since(start, end),
    };
    let conditions = &status["conditions"];
    let state = if condition_true(conditions, "Complete") {
        "Complete"
    } else if condition_true(conditions, "Failed") {
        "Failed"
    } else if !job["metadata"]["deletionTimestamp"].is_null() {
        "Terminating"
    } else if condition_true(conditions, "Suspended") {
        "Suspended"
    } else if condition_true(conditions, "FailureTarget") {
        "FailureTarget"
    } else {
        "Running"
    };
    let (names, images) = container_cells(&spec["template"]["spec"]["containers"]);
    vec![
        json!(text(&job["metadata"]["name"])),
        json!(state),
        json!(completions),
        json!(duration),
        json!(timestamp_since(&job["metadata"]["creationTimestamp"], now)),
        json!(names),
        json!(images),
        json!(selector_text(&spec["selector"])),
    ]
}

/// Core `v1` events and `events.k8s.io/v1` events (whose fields have other names).
fn event_cells(event: &Value, now: SystemTime) -> Vec<Value> {
    let pick = |core: &str, events_api: &str| {
        let value = &event[core];
        if value.is_null() {
            &event[events_api]
        } else {
            value
        }
    };
    let involved = pick("involvedObject", "regarding");
    let source = pick("source", "deprecatedSource");
    let micro = |v: &Value| timestamp_since(v, now);
    let mut first_seen = micro(pick("firstTimestamp", "deprecatedFirstTimestamp"));
    if first_seen == "<unknown>" {
        first_seen = micro(&event["eventTime"]);
    }
    let mut last_seen = micro(pick("lastTimestamp", "deprecatedLastTimestamp"));
    if last_seen == "<unknown>" {
        last_seen = first_seen.clone();
    }
    let mut count = int(pick("count", "deprecatedCount"));
    if event["series"].is_object() {
        last_seen = micro(&event["series"]["lastObservedTime"]);
        count = int(&event["series"]["count"]);
    } else if count == 0 {
        count = 1;
    }
    let kind = text(&involved["kind"]).to_lowercase();
    let target = match text(&involved["name"]) {
        "" => kind,
        name => format!("{kind}/{name}"),
    };
    let component = match text(&source["component"]) {
        "" => text(&event["reportingController"]),
        c => c,
    };
    let host = match text(&source["host"]) {
        "" => text(&event["reportingInstance"]),
        h => h,
    };
    let source_text = match (component, host) {
        ("", "") => String::new(),
        (c, "") => c.to_string(),
        (c, h) => format!("{c}, {h}"),
    };
    vec![
        json!(last_seen),
        json!(text(&event["type"])),
        json!(text(&event["reason"])),
        json!(target),
        json!(text(&involved["fieldPath"])),
        json!(source_text),
        json!(text(pick("message", "note")).trim()),
        json!(first_seen),
        json!(count),
        json!(text(&event["metadata"]["name"])),
    ]
}

fn service_ports(ports: &Value) -> String {
    let pieces: Vec<String> = ports
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|p| {
            let protocol = p["protocol"].as_str().unwrap_or("TCP");
            match int(&p["nodePort"]) {
                0 => format!("{}/{protocol}", int(&p["port"])),
                node_port => format!("{}:{node_port}/{protocol}", int(&p["port"])),
            }
        })
        .collect();
    pieces.join(",")
}

/// Load balancer IPs (or hostnames), sorted and deduplicated.
fn load_balancer_addresses(ingress: &Value) -> String {
    let mut addresses: Vec<&str> = ingress
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|i| {
            i["ip"]
                .as_str()
                .filter(|s| !s.is_empty())
                .or_else(|| i["hostname"].as_str().filter(|s| !s.is_empty()))
        })
        .collect();
    addresses.sort_unstable();
    addresses.dedup();
    addresses.join(",")
}

fn service_external_ip(service: &Value) -> String {
    let spec = &service["spec"];
    let external: Vec<&str> = spec["externalIPs"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    match spec["type"].as_str().unwrap_or("ClusterIP") {
        "ClusterIP" | "NodePort" if external.is_empty() => "<none>".to_string(),
        "ClusterIP" | "NodePort" => external.join(","),
        "LoadBalancer" => {
            let balancer = load_balancer_addresses(&service["status"]["loadBalancer"]["ingress"]);
            let mut all: Vec<&str> = balancer.split(',').filter(|s| !s.is_empty()).collect();
            all.extend(external);
            if all.is_empty() {
                "<pending>".to_string()
            } else {
                all.join(",")
            }
        }
        "ExternalName" => text(&spec["externalName"]).to_string(),
        _ => "<unknown>".to_string(),
    }
}

/// Up to three rule hosts, `*` when no rule names one.
fn ingress_hosts(rules: &Value) -> String {
    let rules = rules.as_array().map(Vec::as_slice).unwrap_or_default();
    const SHOWN: usize = 3;
    let hosts: Vec<&str> = rules
        .iter()
        .take(SHOWN)
        .map(|r| text(&r["host"]))
        .filter(|h| !h.is_empty())
        .collect();
    if hosts.is_empty() {
        return "*".to_string();
    }
    let shown = hosts.join(",");
    if rules.len() > SHOWN {
        format!("{shown} + {} more...", rules.len() - SHOWN)
    } else {
        shown
    }
}

/// A CRD column's cell: the JSONPath's first match, typed as the column says; null when missing.
fn custom_cell(column: &PrinterColumn, object: &Value, now: SystemTime) -> Value {
    let Some(value) = json_path(object, &column.json_path) else {
        return Value::Null;
    };
    match column.type_.as_str() {
        "integer" => value
            .as_i64()
            .or_else(|| value.as_f64().map(|f| f as i64))
            .map_or(Value::Null, Value::from),
        "number" => value.as_f64().map_or(Value::Null, Value::from),
        "boolean" => value.as_bool().map_or(Value::Null, Value::from),
        "date" => match value.as_str() {
            Some(s) => match parse_rfc3339(s) {
                Some(at) => json!(since(at, now)),
                None => json!("<invalid>"),
            },
            None => Value::Null,
        },
        "string" => match value {
            Value::Null => Value::Null,
            Value::String(s) => json!(s),
            other => json!(other.to_string()),
        },
        _ => Value::Null,
    }
}

/// `translateTimestampSince`: the age of an RFC 3339 timestamp, `<unknown>` when absent.
fn timestamp_since(timestamp: &Value, now: SystemTime) -> String {
    match timestamp.as_str().and_then(parse_rfc3339) {
        Some(at) => since(at, now),
        None => "<unknown>".to_string(),
    }
}

fn since(at: SystemTime, now: SystemTime) -> String {
    let seconds = match now.duration_since(at) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    };
    human_duration(seconds)
}

/// kubectl's HumanDuration: two significant units at most, coarser as the age grows.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".to_string();
    }
    if seconds < 0 {
        return "0s".to_string();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        return match seconds % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        return match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        return match hours % 24 {
            0 => format!("{}d", hours / 24),
            h => format!("{}d{h}h", hours / 24),
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        return match (hours / 24) % 365 {
            0 => format!("{}y", hours / 24 / 365),
            d => format!("{}y{d}d", hours / 24 / 365),
        };
    }
    format!("{}y", hours / 24 / 365)
}

const UNIX_EPOCH_DATE: Date = jiff::civil::date(1970, 1, 1);

/// Parses an RFC 3339 timestamp (`2026-01-02T03:04:05Z`, fractions and offsets allowed).
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let bytes = s.as_bytes();
    if bytes.len() < 20 || !matches!(bytes[10], b'T' | b't' | b' ') {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(range)?;
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    if bytes[4] != b'-' || bytes[7] != b'-' || bytes[13] != b':' || bytes[16] != b':' {
        return None;
    }
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut rest = &s[19..];
    let mut nanos = 0u32;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let padded = format!("{:0<9}", &fraction[..digits.min(9)]);
        nanos = padded.parse().ok()?;
        rest = &fraction[digits..];
    }
    let offset_seconds = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let (h, m) = rest[1..].split_once(':')?;
            if h.len() != 2 || m.len() != 2 {
                return None;
            }
            sign * (h.parse::<i64>().ok()? * 3600 + m.parse::<i64>().ok()? * 60)
        }
    };
    // Only the month is checked: a day past its end rolls into the next month.
    let month_start = Date::new(year as i16, month as i8, 1)
        .ok()?
        .duration_since(UNIX_EPOCH_DATE)
        .as_secs();
    let seconds =
        month_start + (day - 1) * 86_400 + hour * 3600 + minute * 60 + second - offset_seconds;
    let whole = Duration::from_secs(seconds.unsigned_abs());
    let at = if seconds >= 0 {
        UNIX_EPOCH.checked_add(whole)?
    } else {
        UNIX_EPOCH.checked_sub(whole)?
    };
    at.checked_add(Duration::from_nanos(u64::from(nanos)))
}

/// Formats a time as RFC 3339 in UTC with whole seconds, as Kubernetes writes timestamps.
pub fn format_rfc3339(at: SystemTime) -> String {
    let seconds = match at.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs_f64().ceil() as i64),
    };
    // jiff spans years -9999 to 9999; a time beyond prints as its first or last second.
    let seconds = seconds.clamp(Timestamp::MIN.as_second(), Timestamp::MAX.as_second());
    Timestamp::from_second(seconds)
        .expect("clamped into jiff's range")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CREATED: &str = "2026-03-01T12:00:00Z";

    /// `CREATED` plus `seconds`.
    fn at(seconds: u64) -> SystemTime {
        parse_rfc3339(CREATED).unwrap() + Duration::from_secs(seconds)
    }

    fn meta(name: &str) -> Value {
        json!({"name": name, "namespace": "default", "creationTimestamp": CREATED,
            "resourceVersion": "5", "managedFields": [{"manager": "m"}], "labels": {"app": "web"}})
    }

    fn column_names(t: &Value) -> Vec<String> {
        t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect()
    }

    fn cells(t: &Value, row: usize) -> Vec<Value> {
        t["rows"][row]["cells"].as_array().unwrap().clone()
    }

    /// Every row has one cell per column, as kubectl requires.
    fn assert_shape(t: &Value) {
        let width = t["columnDefinitions"].as_array().unwrap().len();
        for row in t["rows"].as_array().unwrap() {
            assert_eq!(row["cells"].as_array().unwrap().len(), width, "{row}");
        }
        for column in t["columnDefinitions"].as_array().unwrap() {
            for field in ["name", "type", "format", "description", "priority"] {
                assert!(column.get(field).is_some(), "{column} lacks {field}");
            }
        }
    }

    #[test]
    fn human_duration_matches_kubectl() {
        for (seconds, expected) in [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (5, "5s"),
            (119, "119s"),
            (120, "2m"),
            (150, "2m30s"),
            (599, "9m59s"),
            (600, "10m"),
            (179 * 60, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 25 * 60, "3h25m"),
            (8 * 3600, "8h"),
            (47 * 3600, "47h"),
            (2 * 86_400, "2d"),
            (2 * 86_400 + 5 * 3600, "2d5h"),
            (8 * 86_400, "8d"),
            (729 * 86_400, "729d"),
            (730 * 86_400, "2y"),
            (800 * 86_400, "2y70d"),
            (9 * 365 * 86_400, "9y"),
        ] {
            assert_eq!(human_duration(seconds), expected, "{seconds}s");
        }
    }

    #[test]
    fn rfc3339_parsing_and_formatting() {
        let base = parse_rfc3339("2026-03-01T12:00:00Z").unwrap();
        assert_eq!(format_rfc3339(base), "2026-03-01T12:00:00Z");
        assert_eq!(parse_rfc3339("2026-03-01T13:30:00+01:30"), Some(base));
        assert_eq!(parse_rfc3339("2026-03-01T10:00:00-02:00"), Some(base));
        assert_eq!(
            parse_rfc3339("2026-03-01T12:00:00.250000Z"),
            Some(base + Duration::from_millis(250))
        );
        assert_eq!(
            format_rfc3339(parse_rfc3339("2024-02-29T23:59:59Z").unwrap()),
            "2024-02-29T23:59:59Z"
        );
        assert_eq!(format_rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        for bad in [
            "",
            "2026-03-01",
            "2026-13-01T00:00:00Z",
            "2026-03-01T12:00:00",
            "2026-03-01T12:00:00.Z",
            "yesterday at noon",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn printer_columns_from_crd_keep_every_field() {
        let columns = PrinterColumn::from_crd(&json!([
            {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas", "description": "Number of desired pods", "priority": 0},
            {"name": "Phase", "type": "string", "format": "byte", "jsonPath": ".status.phase", "priority": 1},
            {"name": "Untyped", "jsonPath": ".x"}
        ]));
        assert_eq!(
            columns[0],
            PrinterColumn {
                name: "Desired".into(),
                type_: "integer".into(),
                format: String::new(),
                description: "Number of desired pods".into(),
                priority: 0,
                json_path: ".spec.replicas".into(),
            }
        );
        assert_eq!(columns[1].format, "byte");
        assert_eq!(columns[1].priority, 1);
        assert_eq!(columns[2].type_, "string");
        assert!(PrinterColumn::from_crd(&Value::Null).is_empty());
    }

    fn rollout_columns() -> Vec<PrinterColumn> {
        PrinterColumn::from_crd(&json!([
            {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas", "description": "Number of desired pods"},
            {"name": "Current", "type": "integer", "jsonPath": ".status.replicas"},
            {"name": "Up-to-date", "type": "integer", "jsonPath": ".status.updatedReplicas"},
            {"name": "Available", "type": "integer", "jsonPath": ".status.availableReplicas"},
            {"name": "Image", "type": "string", "jsonPath": ".spec.template.spec.containers[0].image", "priority": 1},
            {"name": "Paused", "type": "boolean", "jsonPath": ".spec.paused"},
            {"name": "Weight", "type": "number", "jsonPath": ".status.canary.weights.canary.weight"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
        ]))
    }

    #[test]
    fn custom_resource_table_evaluates_printer_columns() {
        let rollout = json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "metadata": meta("web"),
            "spec": {"replicas": 5, "paused": true, "template": {"spec": {"containers": [{"name": "app", "image": "web:2"}]}}},
            "status": {"replicas": 5.0, "updatedReplicas": 2}
        });
        let columns = rollout_columns();
        let t = table(
            "rollouts",
            "argoproj.io",
            Some(&columns),
            &[rollout],
            "42",
            at(330),
        );
        assert_shape(&t);
        assert_eq!(t["kind"], "Table");
        assert_eq!(t["apiVersion"], "meta.k8s.io/v1");
        assert_eq!(t["metadata"]["resourceVersion"], "42");
        assert_eq!(
            column_names(&t),
            [
                "Name",
                "Desired",
                "Current",
                "Up-to-date",
                "Available",
                "Image",
                "Paused",
                "Weight",
                "Age"
            ]
        );
        assert_eq!(t["columnDefinitions"][0]["format"], "name");
        assert_eq!(
            t["columnDefinitions"][1]["description"],
            "Number of desired pods"
        );
        assert_eq!(t["columnDefinitions"][5]["priority"], 1);
        assert_eq!(
            cells(&t, 0),
            vec![
                json!("web"),
                json!(5),
                json!(5),
                json!(2),
                Value::Null,
                json!("web:2"),
                json!(true),
                Value::Null,
                json!("5m30s")
            ]
        );
        let object = &t["rows"][0]["object"];
        assert_eq!(object["kind"], "PartialObjectMetadata");
        assert_eq!(object["apiVersion"], "meta.k8s.io/v1");
        assert_eq!(object["metadata"]["name"], "web");
        assert_eq!(object["metadata"]["labels"]["app"], "web");
        assert!(object["metadata"].get("managedFields").is_none());
    }

    #[test]
    fn custom_resource_without_columns_gets_age() {
        let t = table(
            "widgets",
            "example.com",
            Some(&[]),
            &[json!({"metadata": meta("w")})],
            "1",
            at(7200),
        );
        assert_eq!(column_names(&t), ["Name", "Age"]);
        assert_eq!(t["columnDefinitions"][1]["type"], "date");
        assert_eq!(cells(&t, 0), vec![json!("w"), json!("120m")]);
    }

    #[test]
    fn custom_cells_follow_the_column_type() {
        let object = json!({"n": 3.7, "s": 4, "b": "yes", "d": "not a date", "m": {"k": 1}});
        let col = |t: &str, p: &str| PrinterColumn {
            type_: t.into(),
            json_path: p.into(),
            ..Default::default()
        };
        assert_eq!(custom_cell(&col("integer", ".n"), &object, at(0)), json!(3));
        assert_eq!(
            custom_cell(&col("number", ".n"), &object, at(0)),
            json!(3.7)
        );
        assert_eq!(
            custom_cell(&col("string", ".s"), &object, at(0)),
            json!("4")
        );
        assert_eq!(
            custom_cell(&col("string", ".m"), &object, at(0)),
            json!("{\"k\":1}")
        );
        assert_eq!(
            custom_cell(&col("boolean", ".b"), &object, at(0)),
            Value::Null
        );
        assert_eq!(
            custom_cell(&col("date", ".d"), &object, at(0)),
            json!("<invalid>")
        );
        assert_eq!(
            custom_cell(&col("integer", ".b"), &object, at(0)),
            Value::Null
        );
        assert_eq!(
            custom_cell(&col("string", ".none"), &object, at(0)),
            Value::Null
        );
    }

    fn pod(status: Value, extra_spec: Value) -> Value {
        let mut spec =
            json!({"containers": [{"name": "app", "image": "web:1"}], "nodeName": "node-1"});
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra_spec.as_object()) {
            s.extend(e.clone());
        }
        json!({"metadata": meta("web-abc"), "spec": spec, "status": status})
    }

    #[test]
    fn pods_running_and_ready() {
        let p = pod(
            json!({"phase": "Running", "podIP": "10.1.0.7", "podIPs": [{"ip": "10.1.0.7"}],
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0, "state": {"running": {"startedAt": CREATED}}}]}),
            json!({}),
        );
        let t = table("pods", "", None, &[p], "9", at(45));
        assert_shape(&t);
        assert_eq!(
            column_names(&t),
            [
                "Name",
                "Ready",
                "Status",
                "Restarts",
                "Age",
                "IP",
                "Node",
                "Nominated Node",
                "Readiness Gates"
            ]
        );
        let priorities: Vec<i64> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["priority"].as_i64().unwrap())
            .collect();
        assert_eq!(priorities, [0, 0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(
            cells(&t, 0),
            vec![
                json!("web-abc"),
                json!("1/1"),
                json!("Running"),
                json!("0"),
                json!("45s"),
                json!("10.1.0.7"),
                json!("node-1"),
                json!("<none>"),
                json!("<none>")
            ]
        );
        assert!(t["rows"][0].get("conditions").is_none());
    }

    #[test]
    fn pods_waiting_crashing_and_terminating() {
        let creating = pod(
            json!({"phase": "Pending", "containerStatuses": [{"name": "app", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ContainerCreating"}}}]}),
            json!({"nodeName": null}),
        );
        let crashing = pod(
            json!({"phase": "Running", "containerStatuses": [{"name": "app", "ready": false, "restartCount": 4,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2026-03-01T12:05:00Z"}}}]}),
            json!({}),
        );
        let mut terminating = pod(json!({"phase": "Running"}), json!({}));
        terminating["metadata"]["deletionTimestamp"] = json!("2026-03-01T12:09:00Z");
        let exited = pod(
            json!({"phase": "Running", "containerStatuses": [{"name": "app", "state": {"terminated": {"exitCode": 137}}}]}),
            json!({}),
        );
        let t = table(
            "pods",
            "",
            None,
            &[creating, crashing, terminating, exited],
            "9",
            at(600),
        );
        assert_eq!(
            cells(&t, 0)[1..4],
            [json!("0/1"), json!("ContainerCreating"), json!("0")]
        );
        assert_eq!(
            cells(&t, 0)[6],
            json!("<none>"),
            "unscheduled pod has no node"
        );
        assert_eq!(
            cells(&t, 1)[1..4],
            [json!("0/1"), json!("CrashLoopBackOff"), json!("4 (5m ago)")]
        );
        assert_eq!(cells(&t, 2)[2], json!("Terminating"));
        assert_eq!(cells(&t, 3)[2], json!("ExitCode:137"));
    }

    #[test]
    fn pods_initialising_with_sidecars_and_gates() {
        let initialising = pod(
            json!({"phase": "Pending", "initContainerStatuses": [
                {"name": "migrate", "state": {"terminated": {"exitCode": 0}}},
                {"name": "wait", "state": {"running": {}}}
            ]}),
            json!({"initContainers": [{"name": "migrate"}, {"name": "wait"}]}),
        );
        let failed_init = pod(
            json!({"phase": "Pending", "initContainerStatuses": [
                {"name": "migrate", "state": {"terminated": {"exitCode": 2, "reason": "Error"}}}
            ]}),
            json!({"initContainers": [{"name": "migrate"}]}),
        );
        let with_sidecar = pod(
            json!({"phase": "Running",
                "conditions": [{"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "True"}, {"type": "example.com/gate", "status": "False"}],
                "initContainerStatuses": [{"name": "proxy", "started": true, "ready": true, "restartCount": 1, "state": {"running": {}}}],
                "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0, "state": {"running": {}}}]}),
            json!({"initContainers": [{"name": "proxy", "restartPolicy": "Always"}],
                "readinessGates": [{"conditionType": "example.com/gate"}]}),
        );
        let done = pod(json!({"phase": "Succeeded"}), json!({}));
        let t = table(
            "pods",
            "",
            None,
            &[initialising, failed_init, with_sidecar, done],
            "9",
            at(60),
        );
        assert_eq!(cells(&t, 0)[2], json!("Init:1/2"));
        assert_eq!(cells(&t, 1)[2], json!("Init:Error"));
        assert_eq!(
            cells(&t, 2)[1..4],
            [json!("2/2"), json!("Running"), json!("1")]
        );
        assert_eq!(cells(&t, 2)[8], json!("0/1"));
        assert_eq!(
            t["rows"][3]["conditions"],
            json!([{"type": "Completed", "status": "True", "reason": "Succeeded", "message": "The pod has completed successfully."}])
        );
    }

    fn template() -> Value {
        json!({"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [
            {"name": "app", "image": "web:1"}, {"name": "proxy", "image": "envoy:1"}
        ]}})
    }

    #[test]
    fn replicasets_and_deployments() {
        let rs = json!({"metadata": meta("web-6d4f"), "spec": {"replicas": 3,
            "selector": {"matchLabels": {"app": "web", "rollouts-pod-template-hash": "6d4f"}}, "template": template()},
            "status": {"replicas": 3, "readyReplicas": 2}});
        let t = table("replicasets", "apps", None, &[rs], "1", at(3 * 86_400));
        assert_shape(&t);
        assert_eq!(
            column_names(&t),
            [
                "Name",
                "Desired",
                "Current",
                "Ready",
                "Age",
                "Containers",
                "Images",
                "Selector"
            ]
        );
        assert_eq!(
            cells(&t, 0),
            vec![
                json!("web-6d4f"),
                json!(3),
                json!(3),
                json!(2),
                json!("3d"),
                json!("app,proxy"),
                json!("web:1,envoy:1"),
                json!("app=web,rollouts-pod-template-hash=6d4f")
            ]
        );

        let deploy = json!({"metadata": meta("web"), "spec": {"replicas": 3,
            "selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]}, "template": template()},
            "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}});
        let t = table("deployments", "apps", None, &[deploy], "1", at(90));
        assert_shape(&t);
        assert_eq!(
            column_names(&t),
            [
                "Name",
                "Ready",
                "Up-to-date",
                "Available",
                "Age",
                "Containers",
                "Images",
                "Selector"
            ]
        );
        assert_eq!(
            cells(&t, 0),
            vec![
                json!("web"),
                json!("2/3"),
                json!(3),
                json!(2),
                json!("90s"),
                json!("app,proxy"),
                json!("web:1,envoy:1"),
                json!("app in (web)")
            ]
        );
        let bare = json!({"metadata": meta("new"), "spec": {"selector": {}}});
        let t = table("deployments", "apps", None, &[bare], "1", at(0));
        assert_eq!(cells(&t, 0)[1], json!("0/1"), "replicas default to 1");
        assert_eq!(cells(&t, 0)[7], json!("<none>"));
    }

    #[test]
    fn services() {
        let cluster_ip = json!({"metadata": meta("web"), "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.10",
            "clusterIPs": ["10.96.0.10"], "selector": {"app": "web", "tier": "front"},
            "ports": [{"port": 80, "protocol": "TCP", "targetPort": 8080}, {"port": 53, "protocol": "UDP"}]}});
        let balancer = json!({"metadata": meta("lb"), "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.11",
            "ports": [{"port": 443, "nodePort": 30443}]}});
        let ready_balancer = json!({"metadata": meta("lb2"), "spec": {"type": "LoadBalancer", "externalIPs": ["1.2.3.4"]},
            "status": {"loadBalancer": {"ingress": [{"ip": "5.6.7.8"}, {"hostname": "lb.example.com"}]}}});
        let external = json!({"metadata": meta("ext"), "spec": {"type": "ExternalName", "externalName": "db.example.com"}});
        let t = table(
            "services",
            "",
            None,
            &[cluster_ip, balancer, ready_balancer, external],
            "1",
            at(60),
        );
        assert_shape(&t);
        assert_eq!(
            column_names(&t),
            [
                "Name",
                "Type",
                "Cluster-IP",
                "External-IP",
                "Port(s)",
                "Age",
                "Selector"
            ]
        );
        assert_eq!(
            cells(&t, 0),
            vec![
                json!("web"),
                json!("ClusterIP"),
                json!("10.96.0.10"),
                json!("<none>"),
                json!("80/TCP,53/UDP"),
                json!("60s"),
                json!("app=web,tier=front")
            ]
        );
        assert_eq!(
            cells(&t, 1)[2..5],
            [
                json!("10.96.0.11"),
                json!("<pending>"),
                json!("443:30443/TCP")
            ]
        );
        assert_eq!(cells(&t, 1)[6], json!("<none>"));
        assert_eq!(
            cells(&t, 2)[2..5],
            [
                json!("<none>"),
                json!("5.6.7.8,lb.example.com,1.2.3.4"),
                json!("<none>")
            ]
        );
        assert_eq!(cells(&t, 3)[3], json!("db.example.com"));
    }

    #[test]
    fn namespaces_configmaps_and_leases() {
        let ns = json!({"metadata": meta("prod"), "status": {"phase": "Active"}});
        let t = table("namespaces", "", None, &[ns], "1", at(5));
        assert_eq!(column_names(&t), ["Name", "Status", "Age"]);
        assert_eq!(
            cells(&t, 0),
            vec![json!("prod"), json!("Active"), json!("5s")]
        );

        let cm = json!({"metadata": meta("cfg"), "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}});
        let empty = json!({"metadata": meta("empty")});
        let t = table("configmaps", "", None, &[cm, empty], "1", at(5));
        assert_eq!(column_names(&t), ["Name", "Data", "Age"]);
        assert_eq!(cells(&t, 0), vec![json!("cfg"), json!(3), json!("5s")]);
        assert_eq!(cells(&t, 1)[1], json!(0));

        let lease = json!({"metadata": meta("rollouts-controller"), "spec": {"holderIdentity": "pod-a_1234"}});
        let unheld = json!({"metadata": meta("free"), "spec": {}});
        let t = table(
            "leases",
            "coordination.k8s.io",
            None,
            &[lease, unheld],
            "1",
            at(5),
        );
        assert_eq!(column_names(&t), ["Name", "Holder", "Age"]);
        assert_eq!(
            cells(&t, 0),
            vec![
                json!("rollouts-controller"),
                json!("pod-a_1234"),
                json!("5s")
            ]
        );
        assert_eq!(cells(&t, 1)[1], json!(""));
    }

    #[test]
    fn jobs() {
        let done = json!({"metadata": meta("migrate"), "spec": {"completions": 1, "selector": {"matchLabels": {"job": "migrate"}}, "template": template()},
            "status": {"succeeded": 1, "startTime": "2026-03-01T12:00:10Z", "completionTime": "2026-03-01T12:00:40Z",
                "conditions": [{"type": "Complete", "status": "True"}]}});
        let running = json!({"metadata": meta("load"), "spec": {"parallelism": 3, "template": template()},
            "status": {"startTime": "2026-03-01T12:00:00Z"}});
        let failed = json!({"metadata": meta("bad"), "spec": {"template": template()},
            "status": {"conditions": [{"type": "Failed", "status": "True"}]}});
        let t = table(
            "jobs",
            "batch",
            None,
            &[done, running, failed],
            "1",
            at(200),
        );
        assert_shape(&t);
        assert_eq!(
            column_names(&t),
            [
                "Name",
                "Status",
                "Completions",
                "Duration",
                "Age",
                "Containers",
                "Images",
                "Selector"
            ]
        );
        assert_eq!(
            cells(&t, 0)[..5],
            [
                json!("migrate"),
                json!("Complete"),
                json!("1/1"),
                json!("30s"),
                json!("3m20s")
            ]
        );
        assert_eq!(cells(&t, 0)[7], json!("job=migrate"));
        assert_eq!(
            cells(&t, 1)[1..4],
            [json!("Running"), json!("0/1 of 3"), json!("3m20s")]
        );
        assert_eq!(
            cells(&t, 2)[1..4],
            [json!("Failed"), json!("0/1"), json!("")]
        );
    }

    #[test]
    fn events_core_and_events_api() {
        let core = json!({"metadata": meta("web.17a"), "type": "Warning", "reason": "BackOff",
            "involvedObject": {"kind": "Pod", "name": "web-abc", "fieldPath": "spec.containers{app}"},
            "source": {"component": "kubelet", "host": "node-1"},
            "message": "Back-off restarting failed container\n", "count": 7,
            "firstTimestamp": "2026-03-01T12:00:00Z", "lastTimestamp": "2026-03-01T12:04:00Z"});
        let events_api = json!({"metadata": meta("ro.1"), "type": "Normal", "reason": "RolloutUpdated",
            "regarding": {"kind": "Rollout", "name": "web"}, "note": "Rollout updated to revision 2",
            "reportingController": "rollouts-controller", "eventTime": "2026-03-01T12:03:00.000000Z"});
        let t = table("events", "", None, &[core, events_api], "1", at(300));
        assert_shape(&t);
        assert_eq!(
            column_names(&t),
            [
                "Last Seen",
                "Type",
                "Reason",
                "Object",
                "Subobject",
                "Source",
                "Message",
                "First Seen",
                "Count",
                "Name"
            ]
        );
        assert_eq!(t["columnDefinitions"][9]["format"], "name");
        assert_eq!(
            cells(&t, 0),
            vec![
                json!("60s"),
                json!("Warning"),
                json!("BackOff"),
                json!("pod/web-abc"),
                json!("spec.containers{app}"),
                json!("kubelet, node-1"),
                json!("Back-off restarting failed container"),
                json!("5m"),
                json!(7),
                json!("web.17a")
            ]
        );
        assert_eq!(
            cells(&t, 1),
            vec![
                json!("2m"),
                json!("Normal"),
                json!("RolloutUpdated"),
                json!("rollout/web"),
                json!(""),
                json!("rollouts-controller"),
                json!("Rollout updated to revision 2"),
                json!("2m"),
                json!(1),
                json!("ro.1")
            ]
        );
    }

    #[test]
    fn ingresses() {
        let ing = json!({"metadata": meta("web"), "spec": {"ingressClassName": "nginx", "tls": [{"hosts": ["a.example.com"]}],
            "rules": [{"host": "a.example.com"}, {"host": "b.example.com"}, {"host": "c.example.com"}, {"host": "d.example.com"}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.2"}, {"ip": "10.0.0.1"}]}}});
        let wildcard = json!({"metadata": meta("any"), "spec": {"rules": [{"http": {}}]}});
        let t = table(
            "ingresses",
            "networking.k8s.io",
            None,
            &[ing, wildcard],
            "1",
            at(5),
        );
        assert_shape(&t);
        assert_eq!(
            column_names(&t),
            ["Name", "Class", "Hosts", "Address", "Ports", "Age"]
        );
        assert_eq!(
            cells(&t, 0),
            vec![
                json!("web"),
                json!("nginx"),
                json!("a.example.com,b.example.com,c.example.com + 1 more..."),
                json!("10.0.0.1,10.0.0.2"),
                json!("80, 443"),
                json!("5s")
            ]
        );
        assert_eq!(
            cells(&t, 1)[1..5],
            [json!("<none>"), json!("*"), json!(""), json!("80")]
        );
    }

    #[test]
    fn custom_resource_definitions_show_creation_time() {
        let crd = json!({"metadata": {"name": "rollouts.argoproj.io", "creationTimestamp": "2026-03-01T12:00:00.000Z"}});
        let t = table(
            "customresourcedefinitions",
            "apiextensions.k8s.io",
            None,
            &[crd],
            "1",
            at(5),
        );
        assert_eq!(column_names(&t), ["Name", "Created At"]);
        assert_eq!(t["columnDefinitions"][1]["type"], "date");
        assert_eq!(
            cells(&t, 0),
            vec![json!("rollouts.argoproj.io"), json!("2026-03-01T12:00:00Z")]
        );
    }

    #[test]
    fn anything_else_gets_name_and_age() {
        let secret = json!({"metadata": {"name": "token"}});
        let t = table("secrets", "", None, &[secret], "3", at(5));
        assert_eq!(column_names(&t), ["Name", "Age"]);
        assert_eq!(cells(&t, 0), vec![json!("token"), json!("<unknown>")]);
        let empty = table("secrets", "", None, &[], "3", at(5));
        assert_eq!(empty["rows"], json!([]));
        assert_eq!(empty["metadata"]["resourceVersion"], "3");
    }
}
