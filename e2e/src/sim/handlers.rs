//! The verbs on resources: get, list, watch, create, update, patch, delete, deletecollection,
//! and the `/status`, `/scale` and `pods/eviction` subresources.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use hyper::Method;
use serde_json::Value;

use super::body::parse_json;
use super::meta::{meta_str, rfc3339};
use super::output::{Output, render_list, render_object};
use super::patch::{self, PatchError};
use super::registry::ResourceInfo;
use super::scale::{scale_of, with_scale};
use super::selector::{FieldSelector, LabelSelector};
use super::server::{ResourcePath, Sim};
use super::status::{ApiError, ApiResult};
use super::store::{DeleteOptions, FieldManager, ObjectKey, Propagation, State, Target};
use super::watch::{self, Body, WatchRequest};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
    Unsupported,
}

impl Verb {
    pub fn of(method: &Method, named: bool, query: &HashMap<String, String>) -> Self {
        let watch = query.get("watch").is_some_and(|w| w == "true" || w == "1");
        match (method.as_str(), named) {
            ("GET", true) => Verb::Get,
            ("GET", false) if watch => Verb::Watch,
            ("GET", false) => Verb::List,
            // A named POST is a subresource create (`pods/NAME/eviction`).
            ("POST", _) => Verb::Create,
            ("PUT", true) => Verb::Update,
            ("PATCH", true) => Verb::Patch,
            ("DELETE", true) => Verb::Delete,
            ("DELETE", false) => Verb::DeleteCollection,
            _ => Verb::Unsupported,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
            Verb::Unsupported => "unsupported",
        }
    }

    pub fn is_write(self) -> bool {
        matches!(
            self,
            Verb::Create | Verb::Update | Verb::Patch | Verb::Delete | Verb::DeleteCollection
        )
    }
}

pub struct ApiRequest {
    pub verb: Verb,
    pub path: ResourcePath,
    pub query: HashMap<String, String>,
    pub output: Output,
    pub content_type: String,
    /// The `User-Agent` header: names the field manager when `fieldManager` is not given.
    pub user_agent: String,
    pub body: Bytes,
}

pub enum Reply {
    Json(Value),
    Stream(Body),
}

/// Which subresource a request addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sub {
    None,
    Status,
    Scale,
}

/// Serves one resource request; the HTTP code comes with the reply.
pub fn serve(sim: &Arc<Sim>, req: ApiRequest) -> ApiResult<(u16, Reply)> {
    let p = &req.path;
    let info = sim
        .store
        .lock()
        .registry
        .get(&p.group, &p.version, &p.plural)
        .ok_or_else(|| ApiError::unknown_resource(&p.group, &p.version, &p.plural))?;
    if p.namespace.is_some() && !info.namespaced {
        return Err(ApiError::path_not_found(&format!(
            "{} is cluster-scoped",
            info.plural
        )));
    }
    if info.namespaced && p.namespace.is_none() && p.name.is_some() {
        return Err(ApiError::path_not_found(&format!(
            "{} is namespaced: use /namespaces/NS/{}/NAME",
            info.plural, info.plural
        )));
    }
    if p.subresource.as_deref() == Some("eviction")
        && info.builtin
        && info.group.is_empty()
        && info.plural == "pods"
    {
        let (namespace, name) = (p.namespace.as_deref(), p.name.as_deref());
        return match req.verb {
            Verb::Create => evict(
                sim,
                &info,
                namespace.unwrap_or_default(),
                name.unwrap_or_default(),
                &req,
            )
            .map(|v| (201, Reply::Json(v))),
            other => Err(ApiError::method_not_allowed(format!(
                "{} is not supported on pods/eviction: POST a policy/v1 Eviction",
                other.as_str()
            ))),
        };
    }
    let sub = match p.subresource.as_deref() {
        None => Sub::None,
        Some("status") if info.status => Sub::Status,
        Some("scale") if info.scale.is_some() => Sub::Scale,
        Some(other) => {
            return Err(ApiError::path_not_found(&format!(
                "{}/{other}",
                info.plural
            )));
        }
    };
    let namespace = p.namespace.clone().unwrap_or_default();
    let name = p.name.clone().unwrap_or_default();
    let json = |v: Value| Reply::Json(v);
    let media = req
        .content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim();
    if matches!(req.verb, Verb::Create | Verb::Update)
        && !matches!(media, "" | "application/json" | "*/*")
    {
        return Err(ApiError::unsupported_media_type(format!(
            "the body Content-Type {media:?} is not supported by kube-sim: send application/json"
        )));
    }
    match req.verb {
        Verb::Get => get(sim, &info, &namespace, &name, sub, req.output).map(|v| (200, json(v))),
        Verb::List => list(sim, &info, p.namespace.as_deref(), &req).map(|v| (200, json(v))),
        Verb::Watch => watch_request(sim, &info, &req).map(|b| (200, Reply::Stream(b))),
        Verb::Create if sub == Sub::None && p.name.is_none() => {
            let body = parse_body(&req.body)?;
            let manager = field_manager(&req);
            let created = sim.store.lock_for_writes(dry_run(&req)?).create_by(
                &info,
                &namespace,
                body,
                recorded(&manager, None),
            )?;
            Ok((201, json(render_object(&info, &created, req.output))))
        }
        Verb::Update => update(sim, &info, &namespace, &name, sub, &req).map(|v| (200, json(v))),
        Verb::Patch => patch(sim, &info, &namespace, &name, sub, &req).map(|(c, v)| (c, json(v))),
        Verb::Delete if sub == Sub::None => {
            let opts = delete_options(&req)?;
            let deleted = sim
                .store
                .lock_for_writes(dry_run(&req)?)
                .delete(&info, &namespace, &name, &opts)?;
            Ok((200, json(render_object(&info, &deleted, req.output))))
        }
        Verb::DeleteCollection if sub == Sub::None => {
            delete_collection(sim, &info, p.namespace.as_deref(), &req).map(|v| (200, json(v)))
        }
        _ => Err(ApiError::method_not_allowed(format!(
            "{} is not supported on {}{}",
            req.verb.as_str(),
            info.plural,
            p.subresource
                .as_deref()
                .map(|s| format!("/{s}"))
                .unwrap_or_default()
        ))),
    }
}

/// `dryRun=All` asks for the result of a write without making it.
fn dry_run(req: &ApiRequest) -> ApiResult<bool> {
    match req.query.get("dryRun").map(String::as_str) {
        None | Some("") => Ok(false),
        Some("All") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "dryRun: Unsupported value {other:?}: the only supported value is All"
        ))),
    }
}

/// The manager a write is recorded under: `fieldManager`, else the user agent up to its first
/// '/' (`kubectl/v1.32.0 ...` -> `kubectl`), as the API server does.
fn field_manager(req: &ApiRequest) -> String {
    match req.query.get("fieldManager").filter(|m| !m.is_empty()) {
        Some(manager) => manager.clone(),
        None => req
            .user_agent
            .split('/')
            .next()
            .unwrap_or_default()
            .to_string(),
    }
}

/// The ownership record of a non-apply write; a request with neither a field manager nor a
/// user agent records nothing.
fn recorded<'a>(manager: &'a str, subresource: Option<&'a str>) -> Option<FieldManager<'a>> {
    (!manager.is_empty()).then_some(FieldManager {
        name: manager,
        subresource,
    })
}

fn parse_body(body: &Bytes) -> ApiResult<Value> {
    parse_json(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

fn existing(state: &State, info: &ResourceInfo, namespace: &str, name: &str) -> ApiResult<Value> {
    state
        .get(&info.key(), namespace, name)
        .map(|o| (**o).clone())
        .ok_or_else(|| ApiError::not_found(&info.group, &info.plural, name))
}

fn get(
    sim: &Sim,
    info: &ResourceInfo,
    namespace: &str,
    name: &str,
    sub: Sub,
    output: Output,
) -> ApiResult<Value> {
    let obj = existing(&sim.store.lock(), info, namespace, name)?;
    Ok(match sub {
        Sub::Scale => scale_of(info, &obj),
        Sub::Status => obj,
        Sub::None => render_object(info, &obj, output),
    })
}

fn selectors(req: &ApiRequest) -> ApiResult<(LabelSelector, FieldSelector)> {
    let labels = LabelSelector::parse(
        req.query
            .get("labelSelector")
            .map(String::as_str)
            .unwrap_or_default(),
    )
    .map_err(|e| ApiError::bad_request(format!("labelSelector: {e}")))?;
    let fields = FieldSelector::parse(
        req.query
            .get("fieldSelector")
            .map(String::as_str)
            .unwrap_or_default(),
    )
    .map_err(|e| ApiError::bad_request(format!("fieldSelector: {e}")))?;
    Ok((labels, fields))
}

fn encode_continue(key: &ObjectKey) -> String {
    format!("{}\0{}", key.0, key.1)
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode_continue(token: &str) -> ApiResult<ObjectKey> {
    let bad = || {
        ApiError::bad_request(format!(
            "continue: invalid token {token:?}: start the list again without it"
        ))
    };
    let bytes: Vec<u8> = (0..token.len())
        .step_by(2)
        .map(|i| {
            token
                .get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        })
        .collect::<Option<_>>()
        .ok_or_else(bad)?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    let (ns, name) = text.split_once('\0').ok_or_else(bad)?;
    Ok((ns.to_string(), name.to_string()))
}

fn list(
    sim: &Sim,
    info: &ResourceInfo,
    namespace: Option<&str>,
    req: &ApiRequest,
) -> ApiResult<Value> {
    let (labels, fields) = selectors(req)?;
    let limit: usize = match req.query.get("limit").filter(|l| !l.is_empty()) {
        Some(l) => l
            .parse()
            .map_err(|_| ApiError::bad_request(format!("limit: {l:?} is not a number")))?,
        None => 0,
    };
    let after = match req.query.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => Some(decode_continue(token)?),
        None => None,
    };
    let state = sim.store.lock();
    let mut items = Vec::new();
    let mut last = None;
    let mut remaining = 0;
    for (key, obj) in state.list(&info.key(), namespace, after.as_ref()) {
        if !labels.matches(obj["metadata"]["labels"].as_object()) || !fields.matches(obj) {
            continue;
        }
        if limit > 0 && items.len() == limit {
            remaining += 1;
            continue;
        }
        items.push((**obj).clone());
        last = Some(key.clone());
    }
    let token = (remaining > 0)
        .then(|| last.as_ref().map(encode_continue))
        .flatten();
    Ok(render_list(
        info,
        items,
        req.output,
        state.resource_version(),
        token,
        remaining,
    ))
}

fn watch_request(sim: &Arc<Sim>, info: &Arc<ResourceInfo>, req: &ApiRequest) -> ApiResult<Body> {
    let (labels, fields) = selectors(req)?;
    let q = |k: &str| req.query.get(k).map(String::as_str).unwrap_or_default();
    let resource_version = match q("resourceVersion") {
        "" | "0" => None,
        rv => Some(rv.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!(
                "resourceVersion: {rv:?} is not a resourceVersion this server issued"
            ))
        })?),
    };
    let timeout = match q("timeoutSeconds") {
        "" => None,
        t => Some(Duration::from_secs(t.parse().map_err(|_| {
            ApiError::bad_request(format!("timeoutSeconds: {t:?} is not a number"))
        })?)),
    };
    Ok(watch::start(
        sim,
        WatchRequest {
            info: info.clone(),
            namespace: req.path.namespace.clone(),
            labels,
            fields,
            resource_version,
            send_initial_events: q("sendInitialEvents") == "true",
            bookmarks: q("allowWatchBookmarks") == "true",
            timeout,
            output: req.output,
        },
    ))
}

fn update(
    sim: &Sim,
    info: &ResourceInfo,
    namespace: &str,
    name: &str,
    sub: Sub,
    req: &ApiRequest,
) -> ApiResult<Value> {
    let body = parse_body(&req.body)?;
    let manager = field_manager(req);
    let mut state = sim.store.lock_for_writes(dry_run(req)?);
    match sub {
        Sub::Scale => {
            let current = existing(&state, info, namespace, name)?;
            let next = with_scale(info, current, &body)?;
            let by = recorded(&manager, Some("scale"));
            let stored = state.update_by(info, namespace, name, next, Target::Main, by)?;
            Ok(scale_of(info, &stored))
        }
        Sub::Status => {
            let by = recorded(&manager, Some("status"));
            let stored = state.update_by(info, namespace, name, body, Target::Status, by)?;
            Ok((*stored).clone())
        }
        Sub::None => {
            let by = recorded(&manager, None);
            let stored = state.update_by(info, namespace, name, body, Target::Main, by)?;
            Ok(render_object(info, &stored, req.output))
        }
    }
}

fn patch_error(info: &ResourceInfo, name: &str, err: PatchError) -> ApiError {
    match err {
        PatchError::BadRequest(m) => ApiError::bad_request(m),
        PatchError::Conflict(m) => ApiError::apply_conflict(m),
        PatchError::Invalid(m) => ApiError::invalid(&info.group, &info.plural, name, m),
    }
}

/// Body of an apply patch: JSON (what kubectl and kube-rs send) or YAML.
fn parse_apply_body(body: &Bytes) -> ApiResult<Value> {
    parse_json(body).or_else(|_| {
        let text = std::str::from_utf8(body)
            .map_err(|_| ApiError::bad_request("the apply body is neither JSON nor UTF-8 YAML"))?;
        serde_saphyr::from_str::<Value>(text).map_err(|e| {
            ApiError::bad_request(format!("the apply body is neither JSON nor YAML: {e}"))
        })
    })
}

fn patch(
    sim: &Sim,
    info: &ResourceInfo,
    namespace: &str,
    name: &str,
    sub: Sub,
    req: &ApiRequest,
) -> ApiResult<(u16, Value)> {
    let media = req
        .content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim();
    const PATCH_TYPES: [&str; 4] = [
        "application/json-patch+json",
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
        "application/apply-patch+yaml",
    ];
    if !PATCH_TYPES.contains(&media) {
        return Err(ApiError::unsupported_media_type(format!(
            "the patch Content-Type {media:?} is not supported: use one of {}",
            PATCH_TYPES.join(", ")
        )));
    }
    let apply = media == "application/apply-patch+yaml";
    let mut body = if apply {
        parse_apply_body(&req.body)?
    } else {
        parse_body(&req.body)?
    };
    // The store keeps `.status` out of main-resource writes; ownership of it must not be recorded.
    if apply
        && sub == Sub::None
        && info.status
        && let Some(root) = body.as_object_mut()
    {
        root.shift_remove("status");
    }
    let manager = if apply {
        req.query.get("fieldManager").cloned().unwrap_or_default()
    } else {
        field_manager(req)
    };
    if apply && manager.is_empty() {
        return Err(ApiError::bad_request(
            "PATCH with application/apply-patch+yaml: the fieldManager query parameter is required for apply requests",
        ));
    }
    let force = req.query.get("force").is_some_and(|f| f == "true");
    let now = rfc3339(SystemTime::now());
    let perr = |e| patch_error(info, name, e);
    let mut state = sim.store.lock_for_writes(dry_run(req)?);
    let Some(current) = state
        .get(&info.key(), namespace, name)
        .map(|o| (**o).clone())
    else {
        if apply && sub == Sub::None {
            if !meta_str(&body, "name").is_empty() && meta_str(&body, "name") != name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({}) does not match the name on the URL ({name})",
                    meta_str(&body, "name")
                )));
            }
            let mut created =
                patch::server_side_apply(None, &body, &manager, force, &now).map_err(perr)?;
            super::meta::metadata_mut(&mut created).insert("name".into(), name.into());
            let stored = state.create(info, namespace, created)?;
            return Ok((201, render_object(info, &stored, req.output)));
        }
        return Err(ApiError::not_found(&info.group, &info.plural, name));
    };
    let base = if sub == Sub::Scale {
        scale_of(info, &current)
    } else {
        current.clone()
    };
    let patched = match media {
        "application/json-patch+json" => patch::json_patch(&base, &body).map_err(perr)?,
        "application/merge-patch+json" => patch::merge_patch(&base, &body),
        "application/strategic-merge-patch+json" if info.builtin || sub == Sub::Scale => {
            patch::strategic_merge_patch(&base, &body).map_err(perr)?
        }
        "application/strategic-merge-patch+json" => {
            return Err(ApiError::unsupported_media_type(format!(
                "{}.{} is a custom resource: strategic merge patch is not supported for custom resources; use a merge patch (kubectl patch --type merge) or a JSON patch",
                info.plural, info.group
            )));
        }
        // What is left is apply; a Scale has no field ownership worth tracking.
        _ if sub == Sub::Scale => patch::merge_patch(&base, &body),
        _ => {
            let subresource = (sub == Sub::Status).then_some("status");
            patch::server_side_apply_subresource(
                Some(&base),
                &body,
                &manager,
                subresource,
                force,
                &now,
            )
            .map_err(perr)?
        }
    };
    // An apply recorded its own ownership; other patches are recorded as updates.
    let by = |subresource| (!apply).then(|| recorded(&manager, subresource)).flatten();
    match sub {
        Sub::Scale => {
            let next = with_scale(info, current, &patched)?;
            let stored =
                state.update_by(info, namespace, name, next, Target::Main, by(Some("scale")))?;
            Ok((200, scale_of(info, &stored)))
        }
        Sub::Status => {
            let stored = state.update_by(
                info,
                namespace,
                name,
                patched,
                Target::Status,
                by(Some("status")),
            )?;
            Ok((200, (*stored).clone()))
        }
        Sub::None => {
            let stored = state.update_by(info, namespace, name, patched, Target::Main, by(None))?;
            Ok((200, render_object(info, &stored, req.output)))
        }
    }
}

fn delete_options(req: &ApiRequest) -> ApiResult<DeleteOptions> {
    let body: Value = if req.body.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        parse_body(&req.body)?
    };
    delete_options_of(&req.query, &body)
}

/// DeleteOptions from the query and a DeleteOptions body (the query wins, as in Kubernetes).
fn delete_options_of(query: &HashMap<String, String>, body: &Value) -> ApiResult<DeleteOptions> {
    let policy = query
        .get("propagationPolicy")
        .map(String::as_str)
        .or_else(|| body["propagationPolicy"].as_str());
    let orphan = body["orphanDependents"].as_bool() == Some(true)
        || query.get("orphanDependents").is_some_and(|o| o == "true");
    let propagation = match policy {
        Some("Foreground") => Propagation::Foreground,
        Some("Orphan") => Propagation::Orphan,
        Some("Background") | None if !orphan => Propagation::Background,
        None => Propagation::Orphan,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "propagationPolicy: Unsupported value {other:?}: use Background, Foreground or Orphan"
            )));
        }
    };
    Ok(DeleteOptions {
        propagation,
        precondition_uid: body["preconditions"]["uid"].as_str().map(str::to_string),
        precondition_rv: body["preconditions"]["resourceVersion"]
            .as_str()
            .map(str::to_string),
    })
}

/// `POST pods/NAME/eviction`: deletes the pod with the Eviction's deleteOptions. Disruption
/// budgets are not consulted (no disruption controller keeps their status).
fn evict(
    sim: &Sim,
    info: &ResourceInfo,
    namespace: &str,
    name: &str,
    req: &ApiRequest,
) -> ApiResult<Value> {
    let eviction = parse_body(&req.body)?;
    if let Some(kind) = eviction["kind"].as_str().filter(|k| *k != "Eviction") {
        return Err(ApiError::bad_request(format!(
            "pods/eviction: the body is a {kind}: send a policy/v1 Eviction"
        )));
    }
    let body_name = meta_str(&eviction, "name");
    if !body_name.is_empty() && body_name != name {
        return Err(ApiError::bad_request(format!(
            "name in URL does not match name in Eviction object: {name} vs {body_name}"
        )));
    }
    let options = &eviction["deleteOptions"];
    let dry_run_in_body = options["dryRun"]
        .as_array()
        .is_some_and(|d| d.iter().any(|v| v == "All"));
    let opts = delete_options_of(&HashMap::new(), options)?;
    sim.store
        .lock_for_writes(dry_run(req)? || dry_run_in_body)
        .delete(info, namespace, name, &opts)?;
    Ok(serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": 201,
    }))
}

fn delete_collection(
    sim: &Sim,
    info: &ResourceInfo,
    namespace: Option<&str>,
    req: &ApiRequest,
) -> ApiResult<Value> {
    let (labels, fields) = selectors(req)?;
    let opts = delete_options(req)?;
    let mut state = sim.store.lock_for_writes(dry_run(req)?);
    let targets: Vec<ObjectKey> = state
        .list(&info.key(), namespace, None)
        .filter(|(_, o)| labels.matches(o["metadata"]["labels"].as_object()) && fields.matches(o))
        .map(|(k, _)| k.clone())
        .collect();
    let mut deleted = Vec::new();
    for (ns, name) in targets {
        // Garbage collection of an earlier item may already have removed this one.
        if let Ok(obj) = state.delete(info, &ns, &name, &opts) {
            deleted.push((*obj).clone());
        }
    }
    let rv = state.resource_version();
    Ok(render_list(info, deleted, Output::Full, rv, None, 0))
}
