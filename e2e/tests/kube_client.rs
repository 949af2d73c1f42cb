//! kube-rs against kube-sim: CRUD, conflicts, every patch type, status subresource semantics,
//! a Controller that owns ReplicaSets, and watchers that resume or relist.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{client, eventually, replica_set, sim, sim_with, widget_crd};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use kube::runtime::{Controller, controller::Action, watcher};
use rollouts_e2e::sim::{Faults, SimOptions};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(10);

fn config_map(name: &str, data: Value) -> ConfigMap {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": {"app": "demo"}}, "data": data}),
    )
    .expect("valid ConfigMap")
}

fn api_error(err: kube::Error) -> (u16, String) {
    match err {
        kube::Error::Api(status) => (status.code, status.reason.clone()),
        other => panic!("expected an API error Status, got {other}"),
    }
}

#[tokio::test]
async fn config_maps_crud_and_stale_replace_conflicts() {
    let sim = sim();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sim));
    let created = cms
        .create(
            &PostParams::default(),
            &config_map("settings", json!({"a": "1"})),
        )
        .await
        .expect("create");
    let meta = &created.metadata;
    assert!(meta.uid.is_some() && meta.creation_timestamp.is_some());
    let rv = meta.resource_version.clone().expect("resourceVersion set");

    let dup = cms
        .create(&PostParams::default(), &config_map("settings", json!({})))
        .await
        .expect_err("duplicate name");
    assert_eq!(api_error(dup), (409, "AlreadyExists".into()));

    let listed = cms
        .list(&ListParams::default().labels("app=demo"))
        .await
        .expect("list");
    assert_eq!(listed.items.len(), 1);
    assert!(
        listed
            .metadata
            .resource_version
            .is_some_and(|rv| !rv.is_empty())
    );
    assert!(
        cms.list(&ListParams::default().labels("app!=demo"))
            .await
            .expect("list")
            .items
            .is_empty()
    );

    let mut fresh = cms.get("settings").await.expect("get");
    fresh.data = Some([("a".to_string(), "2".to_string())].into());
    let replaced = cms
        .replace("settings", &PostParams::default(), &fresh)
        .await
        .expect("replace with the current resourceVersion");
    assert_ne!(
        replaced.metadata.resource_version.as_deref(),
        Some(rv.as_str())
    );

    let mut stale = created.clone();
    stale.data = Some([("a".to_string(), "3".to_string())].into());
    let conflict = cms
        .replace("settings", &PostParams::default(), &stale)
        .await
        .expect_err("stale resourceVersion");
    assert_eq!(api_error(conflict), (409, "Conflict".into()));

    cms.delete("settings", &DeleteParams::default())
        .await
        .expect("delete");
    let gone = cms.get("settings").await.expect_err("deleted");
    assert_eq!(api_error(gone), (404, "NotFound".into()));
}

#[tokio::test]
async fn dry_runs_and_invalid_names_store_nothing() {
    let sim = sim();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sim));
    let rv_before = cms
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version;
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let preview = cms
        .create(&dry, &config_map("preview", json!({"a": "1"})))
        .await
        .expect("dry-run create");
    assert_eq!(preview.metadata.name.as_deref(), Some("preview"));
    assert!(
        cms.get_opt("preview").await.expect("get_opt").is_none(),
        "a dry run stores nothing"
    );

    let invalid = cms
        .create(&PostParams::default(), &config_map("Not_Valid", json!({})))
        .await
        .expect_err("invalid name");
    match invalid {
        kube::Error::Api(status) => {
            assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
            assert!(
                status.message.contains("metadata.name"),
                "{}",
                status.message
            );
        }
        other => panic!("expected a Status, got {other}"),
    }
    let missing_ns: Api<ConfigMap> = Api::namespaced(client(&sim), "nowhere");
    let err = missing_ns
        .create(&PostParams::default(), &config_map("x", json!({})))
        .await
        .expect_err("no namespace");
    assert_eq!(api_error(err), (404, "NotFound".into()));
    let rv_after = cms
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version;
    assert_eq!(
        rv_before, rv_after,
        "neither the dry run nor the refused writes advanced the resourceVersion"
    );
}

#[tokio::test]
async fn list_pages_with_limit_and_continue() {
    let sim = sim();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sim));
    for i in 0..5 {
        cms.create(
            &PostParams::default(),
            &config_map(&format!("page-{i}"), json!({})),
        )
        .await
        .expect("create");
    }
    let first = cms
        .list(&ListParams::default().limit(2))
        .await
        .expect("first page");
    assert_eq!(first.items.len(), 2);
    let token = first.metadata.continue_.clone().expect("a continue token");
    let second = cms
        .list(&ListParams::default().limit(10).continue_token(&token))
        .await
        .expect("second page");
    let names: Vec<String> = first
        .items
        .iter()
        .chain(&second.items)
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    assert_eq!(
        names,
        (0..5).map(|i| format!("page-{i}")).collect::<Vec<_>>()
    );
    assert!(second.metadata.continue_.is_none_or(|c| c.is_empty()));
}

async fn widgets(sim: &rollouts_e2e::sim::SimHandle) -> Api<DynamicObject> {
    let client = client(sim);
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(widget_crd()).expect("valid CRD");
    let created = crds
        .create(&PostParams::default(), &crd)
        .await
        .expect("create CRD");
    let established = created
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default();
    assert!(
        established
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
    );
    let gvk = GroupVersionKind::gvk("example.com", "v1", "Widget");
    Api::default_namespaced_with(client, &ApiResource::from_gvk_with_plural(&gvk, "widgets"))
}

fn widget(name: &str, size: i64) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": name}, "spec": {"size": size, "replicas": 1}, "status": {"phase": "Ignored"},
    }))
    .expect("valid object")
}

#[tokio::test]
async fn custom_resources_follow_status_subresource_semantics() {
    let sim = sim();
    let api = widgets(&sim).await;
    let created = api
        .create(&PostParams::default(), &widget("w1", 1))
        .await
        .expect("create widget");
    assert_eq!(created.metadata.generation, Some(1));
    assert!(
        created.data.get("status").is_none(),
        "status is not set on create when the status subresource exists"
    );

    let with_status = api
        .patch_status(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Ready"}, "spec": {"size": 99}})),
        )
        .await
        .expect("status patch");
    assert_eq!(with_status.data["status"]["phase"], "Ready");
    assert_eq!(
        with_status.data["spec"]["size"], 1,
        "a status write changes only .status"
    );
    assert_eq!(
        with_status.metadata.generation,
        Some(1),
        "status writes never bump generation"
    );

    let main = api
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 2}, "status": {"phase": "Overwritten"}})),
        )
        .await
        .expect("main patch");
    assert_eq!(main.metadata.generation, Some(2));
    assert_eq!(
        main.data["status"]["phase"], "Ready",
        "main writes never change .status"
    );

    let rv = main.metadata.resource_version.clone();
    let same = api
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 2}})),
        )
        .await
        .expect("no-op patch");
    assert_eq!(
        same.metadata.resource_version, rv,
        "a write that changes nothing bumps nothing"
    );

    let meta_only = api
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .expect("label patch");
    assert_eq!(
        meta_only.metadata.generation,
        Some(2),
        "metadata changes do not bump generation"
    );

    let scaled = api
        .patch_scale(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 4}})),
        )
        .await
        .expect("scale patch");
    assert_eq!(scaled.spec.and_then(|s| s.replicas), Some(4));
    assert_eq!(
        api.get("w1").await.expect("get").data["spec"]["replicas"],
        4
    );

    api.delete("w1", &DeleteParams::default())
        .await
        .expect("delete widget");
    assert!(api.get_opt("w1").await.expect("get_opt").is_none());
}

fn deployment() -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [
                    {"name": "main", "image": "nginx:1", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
                    {"name": "side", "image": "busybox:1"},
                ]},
            },
        },
    }))
    .expect("valid Deployment")
}

fn containers(d: &Deployment) -> Value {
    serde_json::to_value(
        &d.spec
            .as_ref()
            .expect("spec")
            .template
            .spec
            .as_ref()
            .expect("pod spec")
            .containers,
    )
    .expect("serializable")
}

#[tokio::test]
async fn every_patch_type_applies() {
    let sim = sim();
    let client = client(&sim);
    let deployments: Api<Deployment> = Api::default_namespaced(client.clone());
    deployments
        .create(&PostParams::default(), &deployment())
        .await
        .expect("create");

    let merged = deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"team": "blue"}}})),
        )
        .await
        .expect("merge patch");
    assert_eq!(
        merged
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("team"))
            .map(String::as_str),
        Some("blue")
    );

    let strategic = deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [{"name": "main", "image": "nginx:2", "env": [{"name": "C", "value": "3"}]}]}}}})),
        )
        .await
        .expect("strategic merge patch");
    let c = containers(&strategic);
    assert_eq!(
        c.as_array().map(Vec::len),
        Some(2),
        "merge key `name` keeps the other container"
    );
    assert_eq!(c[0]["image"], "nginx:2");
    let env_names: Vec<&str> = c[0]["env"]
        .as_array()
        .expect("env")
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(
        ["A", "B", "C"].iter().all(|n| env_names.contains(n)),
        "env merged by name: {env_names:?}"
    );

    let request = hyper::Request::patch("/apis/apps/v1/namespaces/default/deployments/web")
        .header("Content-Type", "application/json-patch+json")
        .body(
            serde_json::to_vec(&json!([{"op": "replace", "path": "/spec/replicas", "value": 3}]))
                .expect("json"),
        )
        .expect("request");
    let patched: Value = client.request(request).await.expect("JSON patch");
    assert_eq!(patched["spec"]["replicas"], 3);

    let applied = deployments
        .patch(
            "web",
            &PatchParams::apply("e2e-test").force(),
            &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "labels": {"owner": "e2e"}}})),
        )
        .await
        .expect("server-side apply");
    assert_eq!(
        applied
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("owner"))
            .map(String::as_str),
        Some("e2e")
    );
    assert_eq!(
        containers(&applied).as_array().map(Vec::len),
        Some(2),
        "apply deep-merges instead of replacing"
    );

    let created = deployments
        .patch(
            "api",
            &PatchParams::apply("e2e-test"),
            &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "api"}, "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "api"}}, "template": {"metadata": {"labels": {"app": "api"}}, "spec": {"containers": [{"name": "api", "image": "api:1"}]}}}})),
        )
        .await
        .expect("apply creates when missing");
    assert_eq!(created.metadata.generation, Some(1));
}

#[tokio::test]
async fn controller_owning_replica_sets_sees_their_events() {
    let sim = sim();
    let client = client(&sim);
    let owners: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let owner = owners
        .create(&PostParams::default(), &config_map("owner", json!({})))
        .await
        .expect("owner");
    let mut rs = replica_set("owned", 1);
    rs["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid, "controller": true}]);
    let replica_sets: Api<ReplicaSet> = Api::default_namespaced(client.clone());

    let reconciles = Arc::new(AtomicUsize::new(0));
    let controller = Controller::new(owners.clone(), watcher::Config::default())
        .owns(replica_sets.clone(), watcher::Config::default())
        .run(
            |_cm: Arc<ConfigMap>, count: Arc<AtomicUsize>| async move {
                count.fetch_add(1, Ordering::SeqCst);
                Ok::<_, kube::Error>(Action::await_change())
            },
            |_cm, _err, _count| Action::await_change(),
            reconciles.clone(),
        )
        .for_each(|_| futures::future::ready(()));
    let running = tokio::spawn(controller);

    eventually("the first reconcile", WAIT, || async {
        (reconciles.load(Ordering::SeqCst) > 0).then_some(())
    })
    .await;
    replica_sets
        .create(
            &PostParams::default(),
            &serde_json::from_value(rs).expect("valid ReplicaSet"),
        )
        .await
        .expect("create rs");
    eventually(
        "ready pods reported on the owned ReplicaSet",
        WAIT,
        || async {
            let rs = replica_sets.get("owned").await.ok()?;
            (rs.status?.ready_replicas == Some(1)).then_some(())
        },
    )
    .await;
    let before = reconciles.load(Ordering::SeqCst);
    replica_sets
        .patch_scale(
            "owned",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .expect("scale");
    eventually(
        "a reconcile of the owner caused by the ReplicaSet",
        WAIT,
        || async { (reconciles.load(Ordering::SeqCst) > before).then_some(()) },
    )
    .await;
    running.abort();
}

type Events =
    futures::stream::BoxStream<'static, Result<watcher::Event<ConfigMap>, watcher::Error>>;

async fn next_result(stream: &mut Events) -> Result<watcher::Event<ConfigMap>, watcher::Error> {
    tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("a watch event within the deadline")
        .expect("the watch stream does not end")
}

async fn next_event(stream: &mut Events) -> watcher::Event<ConfigMap> {
    next_result(stream).await.expect("no watch error")
}

fn name_of(cm: &ConfigMap) -> String {
    cm.metadata.name.clone().unwrap_or_default()
}

#[tokio::test]
async fn watcher_resumes_after_a_dropped_stream() {
    let sim = sim_with(SimOptions {
        faults: Faults {
            watch_cut_after: Some(2),
            ..Faults::default()
        },
        ..SimOptions::default()
    });
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sim));
    let mut events = watcher(cms.clone(), watcher::Config::default()).boxed();
    while !matches!(next_event(&mut events).await, watcher::Event::InitDone) {}
    for i in 0..6 {
        cms.create(
            &PostParams::default(),
            &config_map(&format!("cm-{i}"), json!({})),
        )
        .await
        .expect("create");
    }
    let mut seen = Vec::new();
    while seen.len() < 6 {
        match next_event(&mut events).await {
            watcher::Event::Apply(cm) => seen.push(name_of(&cm)),
            watcher::Event::Init | watcher::Event::InitApply(_) => {
                panic!("the watcher relisted instead of resuming")
            }
            _ => {}
        }
    }
    assert_eq!(seen, (0..6).map(|i| format!("cm-{i}")).collect::<Vec<_>>());
    let requests = sim.requests();
    let count = |verb: &str| {
        requests
            .iter()
            .filter(|r| r.resource == "configmaps" && r.verb == verb)
            .count()
    };
    assert_eq!(count("list"), 1);
    assert!(
        count("watch") >= 3,
        "each cut stream was resumed with a new watch"
    );
}

#[tokio::test]
async fn watcher_relists_after_410_expired() {
    let sim = sim();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sim));
    cms.create(&PostParams::default(), &config_map("before", json!({})))
        .await
        .expect("create");
    let mut events = watcher(cms.clone(), watcher::Config::default()).boxed();
    while !matches!(next_event(&mut events).await, watcher::Event::InitDone) {}
    sim.expire_watches();
    cms.create(&PostParams::default(), &config_map("after", json!({})))
        .await
        .expect("create");
    let expired = next_result(&mut events)
        .await
        .expect_err("the resumed watch is refused");
    assert!(
        matches!(&expired, watcher::Error::WatchError(s) if s.code == 410 && s.reason == "Expired"),
        "got {expired}"
    );
    let mut relisted = Vec::new();
    loop {
        match next_event(&mut events).await {
            watcher::Event::InitApply(cm) => relisted.push(name_of(&cm)),
            watcher::Event::InitDone => break,
            watcher::Event::Apply(cm) => panic!(
                "{} arrived on a resumed watch although its resourceVersion expired",
                name_of(&cm)
            ),
            _ => {}
        }
    }
    relisted.sort();
    assert_eq!(relisted, ["after", "before"]);
    let lists = sim
        .requests()
        .iter()
        .filter(|r| r.resource == "configmaps" && r.verb == "list")
        .count();
    assert_eq!(lists, 2);
}

#[tokio::test]
async fn bundled_router_crds_and_the_project_crds_load_at_start() {
    let manifest_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let sim = sim_with(SimOptions {
        crd_dirs: vec![manifest_dir.join("crds"), manifest_dir.join("../crds/yaml")],
        ..SimOptions::default()
    });
    let client = client(&sim);
    let api = |group: &str, version: &str, kind: &str, plural: &str| -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk(group, version, kind);
        Api::default_namespaced_with(
            client.clone(),
            &ApiResource::from_gvk_with_plural(&gvk, plural),
        )
    };
    let beta = api(
        "networking.istio.io",
        "v1beta1",
        "VirtualService",
        "virtualservices",
    );
    let vs: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "networking.istio.io/v1beta1", "kind": "VirtualService",
        "metadata": {"name": "reviews"}, "spec": {"http": [{"route": [{"destination": {"host": "stable"}, "weight": 100}]}]},
    }))
    .expect("valid object");
    beta.create(&PostParams::default(), &vs)
        .await
        .expect("create at v1beta1");
    let v1 = api(
        "networking.istio.io",
        "v1",
        "VirtualService",
        "virtualservices",
    )
    .get("reviews")
    .await
    .expect("read at v1");
    assert_eq!(
        v1.data["spec"]["http"][0]["route"][0]["weight"], 100,
        "all served versions share one storage"
    );
    api("gateway.networking.k8s.io", "v1", "HTTPRoute", "httproutes")
        .list(&ListParams::default())
        .await
        .expect("HTTPRoutes served");
    api("argoproj.io", "v1alpha1", "Rollout", "rollouts")
        .list(&ListParams::default())
        .await
        .expect("Rollouts served");
}

/// `(manager, operation, subresource)` of every managedFields entry, and the entries' fields.
fn owners(meta: &kube::api::ObjectMeta) -> Vec<(String, String, String, Value)> {
    meta.managed_fields
        .iter()
        .flatten()
        .map(|e| {
            (
                e.manager.clone().unwrap_or_default(),
                e.operation.clone().unwrap_or_default(),
                e.subresource.clone().unwrap_or_default(),
                e.fields_v1
                    .as_ref()
                    .map(|f| f.0.clone())
                    .unwrap_or_default(),
            )
        })
        .collect()
}

fn owns(meta: &kube::api::ObjectMeta, manager: &str, field: &str, key: &str) -> bool {
    owners(meta)
        .iter()
        .any(|(m, _, _, fields)| m == manager && fields[field].get(key).is_some())
}

fn mode_config_map(mode: &str) -> Patch<Value> {
    Patch::Apply(
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "mode"}, "data": {"mode": mode}}),
    )
}

fn managed_by(manager: &str) -> PatchParams {
    PatchParams {
        field_manager: Some(manager.into()),
        ..PatchParams::default()
    }
}

#[tokio::test]
async fn apply_conflicts_with_a_field_merge_patched_by_another_manager_until_forced() {
    let sim = sim();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sim));
    cms.patch(
        "mode",
        &PatchParams::apply("deployer"),
        &mode_config_map("a"),
    )
    .await
    .expect("apply creates");
    let patched = cms
        .patch(
            "mode",
            &managed_by("operator"),
            &Patch::Merge(json!({"data": {"mode": "b"}})),
        )
        .await
        .expect("merge patch");
    assert!(
        owns(&patched.metadata, "operator", "f:data", "f:mode"),
        "the merge patch is recorded as an Update by its field manager: {:?}",
        owners(&patched.metadata)
    );
    assert!(!owns(&patched.metadata, "deployer", "f:data", "f:mode"));

    let err = cms
        .patch(
            "mode",
            &PatchParams::apply("deployer"),
            &mode_config_map("c"),
        )
        .await
        .expect_err("applying a value another manager set conflicts");
    let kube::Error::Api(status) = err else {
        panic!("expected an API error Status, got {err}");
    };
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert!(
        status
            .message
            .starts_with("Apply failed with 1 conflict: conflict with \"operator\" using v1 at ")
            && status.message.ends_with(": .data.mode"),
        "the apply message as the API server sends it: {}",
        status.message
    );
    assert_eq!(
        cms.get("mode").await.expect("get").data.expect("data")["mode"],
        "b"
    );

    let forced = cms
        .patch(
            "mode",
            &PatchParams::apply("deployer").force(),
            &mode_config_map("c"),
        )
        .await
        .expect("a forced apply takes the field over");
    assert_eq!(forced.data.as_ref().expect("data")["mode"], "c");
    assert!(owns(&forced.metadata, "deployer", "f:data", "f:mode"));
    assert!(
        !owns(&forced.metadata, "operator", "f:data", "f:mode"),
        "the forced apply took the field from the merge patcher: {:?}",
        owners(&forced.metadata)
    );
}

#[tokio::test]
async fn creates_puts_and_status_writes_record_their_field_managers() {
    let sim = sim();
    let client = client(&sim);
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let created = cms
        .create(
            &PostParams {
                field_manager: Some("creator".into()),
                ..PostParams::default()
            },
            &config_map("owned", json!({"a": "1"})),
        )
        .await
        .expect("create");
    assert!(owns(&created.metadata, "creator", "f:data", "f:a"));
    let mut changed = created.clone();
    changed.data = Some([("a".to_string(), "2".to_string())].into());
    let replaced = cms
        .replace(
            "owned",
            &PostParams {
                field_manager: Some("replacer".into()),
                ..PostParams::default()
            },
            &changed,
        )
        .await
        .expect("replace");
    assert!(owns(&replaced.metadata, "replacer", "f:data", "f:a"));
    assert!(!owns(&replaced.metadata, "creator", "f:data", "f:a"));

    let deployments: Api<Deployment> = Api::default_namespaced(client);
    deployments
        .create(&PostParams::default(), &deployment())
        .await
        .expect("create deployment");
    let status_written = deployments
        .patch_status(
            "web",
            &managed_by("status-writer"),
            &Patch::Merge(json!({"status": {"observedGeneration": 7}})),
        )
        .await
        .expect("status patch");
    assert!(
        owners(&status_written.metadata)
            .iter()
            .any(|(m, op, sub, fields)| m == "status-writer"
                && op == "Update"
                && sub == "status"
                && fields["f:status"].get("f:observedGeneration").is_some()),
        "a /status write is recorded with its subresource: {:?}",
        owners(&status_written.metadata)
    );
    let applied = deployments
        .patch(
            "web",
            &PatchParams::apply("deployer"),
            &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "labels": {"tier": "web"}}, "status": {"replicas": 9}})),
        )
        .await
        .expect("apply to the main resource");
    assert!(
        owners(&applied.metadata)
            .iter()
            .filter(|(m, ..)| m == "deployer")
            .all(|(.., fields)| fields.get("f:status").is_none()),
        "status sent to the main resource is not owned: {:?}",
        owners(&applied.metadata)
    );
    let status_applied = deployments
        .patch_status(
            "web",
            &PatchParams::apply("status-applier").force(),
            &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "status": {"observedGeneration": 8}})),
        )
        .await
        .expect("apply to /status");
    assert!(
        owners(&status_applied.metadata)
            .iter()
            .any(|(m, op, sub, _)| m == "status-applier" && op == "Apply" && sub == "status"),
        "{:?}",
        owners(&status_applied.metadata)
    );
}

#[tokio::test]
async fn no_op_writes_bump_no_resource_version_and_announce_nothing() {
    let sim = sim();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sim));
    let applied = cms
        .patch(
            "mode",
            &PatchParams::apply("deployer"),
            &mode_config_map("a"),
        )
        .await
        .expect("apply creates");
    let rv = applied.metadata.resource_version.clone().expect("rv");

    let replaced = cms
        .replace("mode", &PostParams::default(), &applied)
        .await
        .expect("no-op replace");
    let merged = cms
        .patch(
            "mode",
            &managed_by("operator"),
            &Patch::Merge(json!({"data": {"mode": "a"}})),
        )
        .await
        .expect("no-op merge patch");
    let reapplied = cms
        .patch(
            "mode",
            &PatchParams::apply("deployer"),
            &mode_config_map("a"),
        )
        .await
        .expect("no-op apply");
    for (write, object) in [
        ("replace", &replaced),
        ("merge patch", &merged),
        ("apply", &reapplied),
    ] {
        assert_eq!(
            object.metadata.resource_version.as_deref(),
            Some(rv.as_str()),
            "a no-op {write} keeps the resourceVersion"
        );
        assert_eq!(
            object.metadata.managed_fields,
            applied.metadata.managed_fields
        );
    }

    let mut events = cms
        .watch(&kube::api::WatchParams::default(), &rv)
        .await
        .expect("watch from the first resourceVersion")
        .boxed();
    cms.patch(
        "mode",
        &managed_by("operator"),
        &Patch::Merge(json!({"data": {"mode": "b"}})),
    )
    .await
    .expect("a real change");
    let first = tokio::time::timeout(WAIT, events.next())
        .await
        .expect("an event within the deadline")
        .expect("the stream is open")
        .expect("a watch event");
    match first {
        kube::api::WatchEvent::Modified(cm) => assert_eq!(
            cm.data.expect("data")["mode"],
            "b",
            "the first event after the no-op writes is the real change"
        ),
        other => panic!("expected MODIFIED for the real change, got {other:?}"),
    }
}

#[tokio::test]
async fn eviction_deletes_the_pod_and_newer_kinds_are_served() {
    use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
    use k8s_openapi::api::core::v1::{Endpoints, Pod, ServiceAccount};
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};

    let sim = sim();
    let client = client(&sim);
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "evictee"}, "spec": {"containers": [{"name": "main", "image": "nginx:1"}]}}))
            .expect("valid Pod"),
    )
    .await
    .expect("create pod");
    let status = pods
        .evict("evictee", &kube::api::EvictParams::default())
        .await
        .expect("evict");
    assert_eq!(
        status.status,
        Some(kube::core::response::StatusSummary::Success)
    );
    eventually("the evicted pod is gone", WAIT, || async {
        pods.get_opt("evictee").await.ok()?.is_none().then_some(())
    })
    .await;
    let missing = pods
        .evict("evictee", &kube::api::EvictParams::default())
        .await
        .expect_err("evicting a missing pod");
    assert_eq!(api_error(missing), (404, "NotFound".to_string()));

    async fn round_trip<K>(api: Api<K>, object: Value)
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + std::fmt::Debug
            + serde::Serialize
            + serde::de::DeserializeOwned,
    {
        let name = object["metadata"]["name"]
            .as_str()
            .expect("name")
            .to_string();
        let typed: K = serde_json::from_value(object).expect("valid object");
        api.create(&PostParams::default(), &typed)
            .await
            .unwrap_or_else(|e| panic!("create {} {name}: {e}", K::kind(&())));
        let listed = api.list(&ListParams::default()).await.expect("list");
        assert_eq!(listed.items.len(), 1, "{} is stored", K::kind(&()));
    }

    let named = |name: &str| json!({"metadata": {"name": name}});
    let selector = json!({"matchLabels": {"app": "web"}});
    round_trip::<PodDisruptionBudget>(
        Api::default_namespaced(client.clone()),
        json!({"metadata": {"name": "web"}, "spec": {"minAvailable": 1, "selector": selector}}),
    )
    .await;
    round_trip::<HorizontalPodAutoscaler>(Api::default_namespaced(client.clone()), json!({"metadata": {"name": "web"}, "spec": {"maxReplicas": 3, "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}}})).await;
    round_trip::<Endpoints>(Api::default_namespaced(client.clone()), named("web")).await;
    round_trip::<EndpointSlice>(
        Api::default_namespaced(client.clone()),
        json!({"metadata": {"name": "web-1"}, "addressType": "IPv4", "endpoints": []}),
    )
    .await;
    round_trip::<ServiceAccount>(Api::default_namespaced(client.clone()), named("web")).await;
    round_trip::<Role>(Api::default_namespaced(client.clone()), named("web")).await;
    round_trip::<RoleBinding>(Api::default_namespaced(client.clone()), json!({"metadata": {"name": "web"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "web"}})).await;
    round_trip::<ClusterRole>(Api::all(client.clone()), named("web")).await;
    round_trip::<ClusterRoleBinding>(Api::all(client.clone()), json!({"metadata": {"name": "web"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "web"}})).await;
}
