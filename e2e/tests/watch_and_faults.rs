//! Watch protocol details (streaming lists, metadata-only watches, bookmarks, timeouts) and
//! fault injection.

mod common;

use std::time::Duration;

use common::{client, sim, sim_with};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use rollouts_e2e::sim::{Faults, SimOptions};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(10);

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}})).expect("valid ConfigMap")
}

#[tokio::test]
async fn streaming_list_sends_every_object_then_the_initial_events_end_bookmark() {
    let sim = sim();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sim));
    for name in ["a", "b"] {
        cms.create(&PostParams::default(), &config_map(name))
            .await
            .expect("create");
    }
    let mut events = watcher(cms.clone(), watcher::Config::default().streaming_lists()).boxed();
    let mut initial = Vec::new();
    loop {
        match tokio::time::timeout(WAIT, events.try_next())
            .await
            .expect("event in time")
            .expect("no error")
            .expect("stream open")
        {
            watcher::Event::InitApply(cm) => initial.push(cm.metadata.name.unwrap_or_default()),
            watcher::Event::InitDone => break,
            _ => {}
        }
    }
    assert_eq!(initial, ["a", "b"]);
    let requests = sim.requests();
    assert!(
        requests.iter().all(|r| r.verb != "list"),
        "a streaming list needs no list request"
    );

    cms.create(&PostParams::default(), &config_map("c"))
        .await
        .expect("create");
    let later = tokio::time::timeout(WAIT, events.try_next())
        .await
        .expect("event in time")
        .expect("no error")
        .expect("stream open");
    assert!(matches!(later, watcher::Event::Apply(cm) if cm.metadata.name.as_deref() == Some("c")));
}

#[tokio::test]
async fn metadata_watches_get_partial_object_metadata() {
    let sim = sim();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sim));
    cms.create(&PostParams::default(), &config_map("meta"))
        .await
        .expect("create");
    let metadata: Api<PartialObjectMeta<ConfigMap>> = Api::default_namespaced(client(&sim));
    let mut events = watcher(metadata, watcher::Config::default()).boxed();
    let seen = loop {
        match tokio::time::timeout(WAIT, events.try_next())
            .await
            .expect("event in time")
            .expect("no error")
            .expect("stream open")
        {
            watcher::Event::InitApply(obj) => break obj,
            _ => continue,
        }
    };
    assert_eq!(seen.metadata.name.as_deref(), Some("meta"));
    assert_eq!(
        seen.types.map(|t| t.kind).as_deref(),
        Some("PartialObjectMetadata")
    );
}

#[tokio::test]
async fn watches_send_bookmarks_and_close_at_their_timeout() {
    let sim = sim_with(SimOptions {
        bookmark_interval: Duration::from_millis(100),
        ..SimOptions::default()
    });
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sim));
    let created = cms
        .create(&PostParams::default(), &config_map("marked"))
        .await
        .expect("create");
    let rv = created.metadata.resource_version.expect("resourceVersion");
    let stream = cms
        .watch(&WatchParams::default().timeout(1), &rv)
        .await
        .expect("watch");
    let events: Vec<WatchEvent<ConfigMap>> = tokio::time::timeout(WAIT, stream.try_collect())
        .await
        .expect("the stream ends at timeoutSeconds")
        .expect("no error");
    let bookmark = events.iter().find_map(|e| match e {
        WatchEvent::Bookmark(b) => Some(b.metadata.resource_version.clone()),
        _ => None,
    });
    assert_eq!(
        bookmark.as_deref(),
        Some(rv.as_str()),
        "a bookmark carries the latest resourceVersion"
    );
}

#[tokio::test]
async fn injected_faults_fail_requests_until_cleared() {
    let sim = sim();
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&sim));
    sim.set_faults(Faults {
        conflict_rate: 1.0,
        ..Faults::default()
    });
    let conflict = cms
        .create(&PostParams::default(), &config_map("x"))
        .await
        .expect_err("injected conflict");
    assert!(
        matches!(conflict, kube::Error::Api(ref s) if s.code == 409),
        "{conflict}"
    );
    assert!(
        cms.get_opt("x")
            .await
            .expect("reads are not conflicted")
            .is_none()
    );
    sim.set_faults(Faults {
        error_rate: 1.0,
        ..Faults::default()
    });
    let error = cms.get_opt("x").await.expect_err("injected error");
    assert!(
        matches!(error, kube::Error::Api(ref s) if s.code == 500),
        "{error}"
    );
    sim.set_faults(Faults::default());
    cms.create(&PostParams::default(), &config_map("x"))
        .await
        .expect("faults cleared");
    let codes: Vec<u16> = sim
        .requests()
        .iter()
        .filter(|r| r.resource == "configmaps")
        .map(|r| r.code)
        .collect();
    assert_eq!(codes, [409, 404, 500, 201]);
}
