//! Store semantics without HTTP: resourceVersions, no-op writes, generation, status,
//! finalizers, garbage collection, CRDs and the event log.

use serde_json::json;

use super::*;

fn store() -> Store {
    let store = Store::new(100);
    {
        let mut state = store.lock();
        let ns = state
            .registry
            .get("", "v1", "namespaces")
            .expect("built in");
        state
            .create(&ns, "", json!({"metadata": {"name": "default"}}))
            .expect("namespace");
    }
    store
}

fn info(state: &State, group: &str, version: &str, plural: &str) -> Arc<ResourceInfo> {
    state
        .registry
        .get(group, version, plural)
        .expect("registered resource")
}

fn rs(name: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {"replicas": 1, "template": {}}})
}

#[test]
fn writes_bump_one_global_resource_version_and_no_ops_bump_nothing() {
    let store = store();
    let mut events = store.subscribe();
    let mut state = store.lock();
    let cms = info(&state, "", "v1", "configmaps");
    let a = state
        .create(
            &cms,
            "default",
            json!({"metadata": {"name": "a"}, "data": {"k": "1"}}),
        )
        .expect("create");
    let rv = state.resource_version();
    assert_eq!(meta_str(&a, "resourceVersion"), rv.to_string());
    let same = state
        .update(&cms, "default", "a", (*a).clone(), Target::Main)
        .expect("no-op update");
    assert_eq!(state.resource_version(), rv);
    assert!(
        Arc::ptr_eq(&same, &a),
        "the stored object is returned unchanged"
    );
    let mut changed = (*a).clone();
    changed["data"]["k"] = "2".into();
    state
        .update(&cms, "default", "a", changed, Target::Main)
        .expect("update");
    assert_eq!(state.resource_version(), rv + 1);
    let kinds: Vec<EventType> = std::iter::from_fn(|| events.try_recv().ok())
        .map(|e| e.event_type)
        .collect();
    assert_eq!(kinds, [EventType::Added, EventType::Modified]);
}

#[test]
fn a_write_that_changes_only_ownership_is_stored_and_announced() {
    let store = store();
    let mut events = store.subscribe();
    let mut state = store.lock();
    let cms = info(&state, "", "v1", "configmaps");
    let by = |name| {
        Some(FieldManager {
            name,
            subresource: None,
        })
    };
    let a = state
        .create_by(
            &cms,
            "default",
            json!({"metadata": {"name": "a"}, "data": {"k": "1"}}),
            by("creator"),
        )
        .expect("create");
    assert_eq!(a["metadata"]["managedFields"][0]["manager"], "creator");
    let rv = state.resource_version();
    let same = state
        .update_by(
            &cms,
            "default",
            "a",
            (*a).clone(),
            Target::Main,
            by("other"),
        )
        .expect("no-op update by another manager");
    assert!(
        Arc::ptr_eq(&same, &a),
        "changing nothing records no ownership"
    );
    let mut handed_over = (*a).clone();
    handed_over["metadata"]["managedFields"][0]["manager"] = "new-owner".into();
    let stored = state
        .update(&cms, "default", "a", handed_over, Target::Main)
        .expect("ownership-only update");
    assert_eq!(state.resource_version(), rv + 1);
    assert_eq!(
        stored["metadata"]["managedFields"][0]["manager"],
        "new-owner"
    );
    let kinds: Vec<EventType> = std::iter::from_fn(|| events.try_recv().ok())
        .map(|e| e.event_type)
        .collect();
    assert_eq!(kinds, [EventType::Added, EventType::Modified]);
}

#[test]
fn generation_follows_spec_and_status_stays_apart() {
    let store = store();
    let mut state = store.lock();
    let rss = info(&state, "apps", "v1", "replicasets");
    let mut created = (*state.create(&rss, "default", rs("web")).expect("create")).clone();
    assert_eq!(created["metadata"]["generation"], 1);
    created["status"] = json!({"replicas": 9});
    created["metadata"]["labels"] = json!({"a": "b"});
    let main = state
        .update(&rss, "default", "web", created, Target::Main)
        .expect("main");
    assert_eq!(
        main["metadata"]["generation"], 1,
        "metadata changes keep the generation"
    );
    assert!(main.get("status").is_none(), "main writes ignore .status");
    let mut with_status = (*main).clone();
    with_status["status"] = json!({"replicas": 9});
    with_status["spec"]["replicas"] = 7.into();
    let status = state
        .update(&rss, "default", "web", with_status, Target::Status)
        .expect("status");
    assert_eq!(status["spec"]["replicas"], 1, "status writes ignore .spec");
    assert_eq!(status["status"]["replicas"], 9);
    assert_eq!(status["metadata"]["generation"], 1);
    let mut spec = (*status).clone();
    spec["spec"]["replicas"] = 3.into();
    let bumped = state
        .update(&rss, "default", "web", spec, Target::Main)
        .expect("spec");
    assert_eq!(bumped["metadata"]["generation"], 2);
    assert_eq!(bumped["status"]["replicas"], 9);
}

#[test]
fn stale_resource_versions_conflict() {
    let store = store();
    let mut state = store.lock();
    let cms = info(&state, "", "v1", "configmaps");
    let a = (*state
        .create(&cms, "default", json!({"metadata": {"name": "a"}}))
        .expect("create"))
    .clone();
    let mut first = a.clone();
    first["data"] = json!({"x": "1"});
    state
        .update(&cms, "default", "a", first, Target::Main)
        .expect("first writer");
    let mut second = a;
    second["data"] = json!({"x": "2"});
    let err = state
        .update(&cms, "default", "a", second, Target::Main)
        .expect_err("stale");
    assert_eq!((err.code, err.reason), (409, "Conflict"));
}

#[test]
fn finalizers_hold_deletion_until_removed() {
    let store = store();
    let mut state = store.lock();
    let cms = info(&state, "", "v1", "configmaps");
    state
        .create(
            &cms,
            "default",
            json!({"metadata": {"name": "held", "finalizers": ["x/y"]}}),
        )
        .expect("create");
    let deleting = state
        .delete(&cms, "default", "held", &DeleteOptions::default())
        .expect("delete");
    assert!(deleting["metadata"]["deletionTimestamp"].is_string());
    let mut released = (*deleting).clone();
    released["metadata"]["finalizers"] = json!([]);
    state
        .update(&cms, "default", "held", released, Target::Main)
        .expect("release");
    assert!(state.get(&cms.key(), "default", "held").is_none());
}

fn owned_by(name: &str, owner: &Value) -> Value {
    json!({"metadata": {"name": name, "ownerReferences": [{
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": meta_str(owner, "name"),
        "uid": meta_str(owner, "uid"), "controller": true,
    }]}})
}

#[test]
fn garbage_collection_follows_the_propagation_policy() {
    let store = store();
    let mut state = store.lock();
    let (rss, pods) = (
        info(&state, "apps", "v1", "replicasets"),
        info(&state, "", "v1", "pods"),
    );
    for (owner, policy) in [
        ("bg", Propagation::Background),
        ("orphan", Propagation::Orphan),
    ] {
        let rs_obj = state.create(&rss, "default", rs(owner)).expect("owner");
        state
            .create(&pods, "default", owned_by(&format!("{owner}-pod"), &rs_obj))
            .expect("dependent");
        state
            .delete(
                &rss,
                "default",
                owner,
                &DeleteOptions {
                    propagation: policy,
                    ..DeleteOptions::default()
                },
            )
            .expect("delete");
    }
    assert!(
        state.get(&pods.key(), "default", "bg-pod").is_none(),
        "background deletes dependents"
    );
    let orphan = state
        .get(&pods.key(), "default", "orphan-pod")
        .expect("orphan stays");
    assert!(
        owner_refs(orphan).is_empty(),
        "the orphan loses its owner reference"
    );
}

#[test]
fn crds_register_resources_and_take_their_objects_along_when_deleted() {
    let store = store();
    let mut state = store.lock();
    let crds = info(
        &state,
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
    );
    let crd = json!({
        "metadata": {"name": "gadgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced", "names": {"plural": "gadgets", "kind": "Gadget"},
                 "versions": [{"name": "v1", "served": true, "storage": true}]},
    });
    let stored = state.create(&crds, "", crd).expect("create CRD");
    assert_eq!(stored["status"]["conditions"][1]["type"], "Established");
    let gadgets = info(&state, "example.com", "v1", "gadgets");
    assert_eq!(
        (
            gadgets.kind.as_str(),
            gadgets.singular.as_str(),
            gadgets.status
        ),
        ("Gadget", "gadget", false)
    );
    state
        .create(&gadgets, "default", json!({"metadata": {"name": "g"}}))
        .expect("custom resource");
    state
        .delete(&crds, "", "gadgets.example.com", &DeleteOptions::default())
        .expect("delete CRD");
    assert!(state.registry.get("example.com", "v1", "gadgets").is_none());
    assert_eq!(state.list(&gadgets.key(), None, None).count(), 0);

    let bad = json!({"metadata": {"name": "wrong.example.com"}, "spec": {"group": "example.com", "scope": "Namespaced",
                     "names": {"plural": "things", "kind": "Thing"}, "versions": [{"name": "v1", "served": true}]}});
    let err = state
        .create(&crds, "", bad)
        .expect_err("name must be plural.group");
    assert_eq!(err.reason, "Invalid");
    assert!(err.message.contains("metadata.name"), "{}", err.message);
}

#[test]
fn the_event_log_forgets_old_events_and_expiry_moves_past_everything() {
    let store = Store::new(3);
    let mut state = store.lock();
    let ns = info(&state, "", "v1", "namespaces");
    for i in 0..5 {
        state
            .create(&ns, "", json!({"metadata": {"name": format!("ns-{i}")}}))
            .expect("create");
    }
    assert_eq!(state.log_start(), 2);
    assert_eq!(
        state.events_after(2).map(|e| e.rv).collect::<Vec<_>>(),
        [3, 4, 5]
    );
    drop(state);
    store.expire_watches();
    let state = store.lock();
    assert!(state.log_start() > 5);
    assert_eq!(state.events_after(0).count(), 0);
}

#[test]
fn dry_runs_change_nothing() {
    let store = store();
    let rv = store.lock().resource_version();
    {
        let mut state = store.lock_for_writes(true);
        let cms = info(&state, "", "v1", "configmaps");
        let preview = state
            .create(&cms, "default", json!({"metadata": {"name": "p"}}))
            .expect("dry-run create");
        assert_eq!(meta_str(&preview, "name"), "p");
    }
    let state = store.lock();
    assert_eq!(state.resource_version(), rv);
    assert_eq!(state.object_count(), 1, "only the namespace is stored");
}

#[test]
fn deleting_a_namespace_deletes_its_contents_but_default_stays() {
    let store = store();
    let mut state = store.lock();
    let (ns, cms) = (
        info(&state, "", "v1", "namespaces"),
        info(&state, "", "v1", "configmaps"),
    );
    let err = state
        .delete(&ns, "", "default", &DeleteOptions::default())
        .expect_err("default is protected");
    assert_eq!((err.code, err.reason), (403, "Forbidden"));
    state
        .create(&ns, "", json!({"metadata": {"name": "team"}}))
        .expect("namespace");
    state
        .create(&cms, "team", json!({"metadata": {"name": "c"}}))
        .expect("configmap");
    state
        .delete(&ns, "", "team", &DeleteOptions::default())
        .expect("delete namespace");
    assert!(state.get(&cms.key(), "team", "c").is_none());
    let err = state
        .create(&cms, "team", json!({"metadata": {"name": "d"}}))
        .expect_err("namespace gone");
    assert_eq!(
        (err.code, err.message.as_str()),
        (404, "namespaces \"team\" not found")
    );
}
