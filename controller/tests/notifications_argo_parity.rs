//! Argo's own notification catalog renders unchanged: when ARGO_ROLLOUTS_SRC points at an Argo
//! Rollouts checkout, every ConfigMap of its `manifests/notifications` parses without an
//! unusable key, and every trigger's templates render against a canary Rollout into a message
//! naming it, an email subject, and Slack attachments that are JSON.

use std::collections::BTreeMap;
use std::path::PathBuf;

use rollouts_controller::notify::{
    Notification, NotificationConfig, template, trigger_conditions, variables,
};
use serde_json::{Value, json};

fn canary() -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": "checkout", "namespace": "shop"},
        "spec": {
            "replicas": 4,
            "strategy": {"canary": {"steps": [{"setWeight": 25}, {"pause": {}}, {"setWeight": 75}]}},
            "template": {"spec": {"containers": [
                {"name": "checkout", "image": "registry.example.com/checkout:2.0"},
                {"name": "proxy", "image": "envoy:1.30"}
            ]}}
        },
        "status": {"currentStepIndex": 1, "phase": "Paused"}
    })
}

#[test]
fn argos_notification_catalog_parses_and_renders() {
    let Some(root) = std::env::var_os("ARGO_ROLLOUTS_SRC") else {
        eprintln!("skipped: set ARGO_ROLLOUTS_SRC to an Argo Rollouts checkout to run this test");
        return;
    };
    let dir = PathBuf::from(root).join("manifests/notifications");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("on-") && n.ends_with(".yaml"))
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} has Argo's on-*.yaml", dir.display());
    let rollout = canary();
    let mut rendered = 0;
    for path in &files {
        let text =
            std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let configmap: Value =
            serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let data: BTreeMap<String, String> = serde_json::from_value(configmap["data"].clone())
            .unwrap_or_else(|e| panic!("{}: data: {e}", path.display()));
        let (config, errors) = NotificationConfig::parse(&data, &BTreeMap::new());
        assert!(errors.is_empty(), "{}: {errors:?}", path.display());
        for trigger in config.triggers.keys() {
            let conditions = trigger_conditions(&config, trigger).expect("defined");
            for condition in conditions {
                let mut notification = Notification::default();
                for name in &condition.send {
                    let spec = template(&config, name)
                        .unwrap_or_else(|| panic!("{}: template {name}", path.display()));
                    spec.render_into(&variables(&rollout, "my-channel"), &mut notification)
                        .unwrap_or_else(|e| panic!("{}: {name}: {e}", path.display()));
                }
                let what = format!("{} {trigger}", path.display());
                assert!(
                    notification.message.contains("checkout"),
                    "{what}: {notification:?}"
                );
                assert!(notification.email_subject.contains("checkout"), "{what}");
                assert!(
                    !notification.message.contains("<no value>"),
                    "{what}: {notification:?}"
                );
                let attachments: Value = serde_json::from_str(&notification.slack_attachments)
                    .unwrap_or_else(|e| {
                        panic!(
                            "{what}: attachments are not JSON ({e}): {}",
                            notification.slack_attachments
                        )
                    });
                assert_eq!(attachments[0]["title"], "checkout", "{what}");
                let images: Vec<&Value> = attachments[0]["fields"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|field| &field["value"])
                    .collect();
                assert!(
                    images.contains(&&json!("registry.example.com/checkout:2.0"))
                        && images.contains(&&json!("envoy:1.30")),
                    "{what}: every container's image is listed: {attachments}"
                );
                rendered += 1;
            }
        }
    }
    eprintln!("rendered {rendered} of Argo's trigger conditions");
    assert_eq!(rendered, files.len(), "one trigger condition per file");
}
