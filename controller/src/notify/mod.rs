//! Notifications, configured and subscribed to as with Argo Rollouts' notifications engine:
//! the ConfigMap `argo-rollouts-notification-configmap` and Secret
//! `argo-rollouts-notification-secret` in the controller's namespace, watched (with
//! `--self-service-notification-enabled`, the same pair in each Rollout's namespace too),
//! subscriptions by annotation on each Rollout, triggers named after the Rollout's events
//! (`RolloutAborted` fires `on-rollout-aborted`), Go templates, and webhook, Slack, Teams,
//! Teams Workflows, PagerDuty v2 and email services.
//!
//! A reconcile only hands its events to [`Notifier::notify`], which never waits: conditions,
//! rendering and sending happen on a task of their own, one Rollout's notifications in order,
//! retried on 5xx and timeouts within bounds. What was sent is recorded on the Rollout in the
//! engine's annotation `notified.notifications.argoproj.io`, so a restarted controller or a new
//! leader does not send it again.

mod config;
mod delivery;
mod services;
mod subscriptions;
mod template;

pub use config::{
    ConfigError, FAILURE_TRIGGERS, NotificationConfig, RetryPolicy, Service, TriggerCondition,
};
pub use delivery::{ConfigSource, Notifier, analysis_runs, secret_values};
pub use services::{HttpClients, SendError, send, teams_message};
pub use subscriptions::{Destination, destinations};
pub use template::{
    ExtraVariables, Notification, TemplateSpec, mentions_analysis_runs, render, variables,
    variables_with,
};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// Argo's default name of the notification ConfigMap.
pub const DEFAULT_CONFIGMAP: &str = "argo-rollouts-notification-configmap";
/// Argo's default name of the notification Secret.
pub const DEFAULT_SECRET: &str = "argo-rollouts-notification-secret";
/// The annotation Argo's engine records sent notifications in: a JSON object from
/// `[<once per>:]<trigger>:[<condition index>].<condition hash>:<service>:<recipient>` to the
/// Unix second it was sent.
pub const NOTIFIED_ANNOTATION: &str = "notified.notifications.argoproj.io";
/// Reason of the warning event recorded on a Rollout when a notification could not be sent.
pub const NOTIFICATION_FAILED_REASON: &str = "NotificationFailed";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SendLabels {
    service: String,
    result: String,
}

/// `notification_send_total{service,result}`: notifications by service name and outcome
/// (`success`, `failure`, or `dropped` when the queue was full). Clones share their values.
#[derive(Clone, Debug, Default)]
pub struct NotificationSends(Family<SendLabels, Counter>);

impl NotificationSends {
    pub fn count(&self, service: &str, result: &str) {
        self.0
            .get_or_create(&SendLabels {
                service: service.to_string(),
                result: result.to_string(),
            })
            .inc();
    }

    /// Registers the family as `notification_send` (scraped as `notification_send_total`).
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "notification_send",
            "Notifications sent, by service and result (success, failure, dropped)",
            self.0.clone(),
        );
    }
}

/// The trigger an event reason fires, as Argo names it: `RolloutStepCompleted` ->
/// `on-rollout-step-completed`, `AnalysisRunFailed` -> `on-analysis-run-failed`.
pub fn trigger_for_reason(reason: &str) -> String {
    let chars: Vec<char> = reason.chars().collect();
    let mut trigger = String::from("on-");
    for (index, &c) in chars.iter().enumerate() {
        if c.is_ascii_uppercase() && index > 0 {
            let previous = chars[index - 1];
            let next_lower = chars.get(index + 1).is_some_and(char::is_ascii_lowercase);
            if previous.is_ascii_lowercase()
                || previous.is_ascii_digit()
                || (previous.is_ascii_uppercase() && next_lower)
            {
                trigger.push('-');
            }
        }
        trigger.push(c.to_ascii_lowercase());
    }
    trigger
}

/// The built-in triggers: each sends one template of the same name less `on-`, used when the
/// ConfigMap does not define the trigger (or the template) itself.
const BUILT_IN: &[(&str, &str, &str)] = &[
    (
        "on-rollout-aborted",
        "rollout-aborted",
        "Rollout {{.rollout.metadata.name}} has been aborted.",
    ),
    (
        "on-rollout-completed",
        "rollout-completed",
        "Rollout {{.rollout.metadata.name}} has been completed.",
    ),
    (
        "on-rollout-step-completed",
        "rollout-step-completed",
        "Rollout {{.rollout.metadata.name}} step number {{add .rollout.status.currentStepIndex 1}}/{{len .rollout.spec.strategy.canary.steps}} has been completed.",
    ),
    (
        "on-rollout-updated",
        "rollout-updated",
        "Rollout {{.rollout.metadata.name}} has been updated.",
    ),
    (
        "on-rollout-paused",
        "rollout-paused",
        "Rollout {{.rollout.metadata.name}} has been paused.",
    ),
    (
        "on-scaling-replica-set",
        "scaling-replicaset",
        "Scaling Rollout {{.rollout.metadata.name}}'s replicaset to {{.rollout.spec.replicas}}.",
    ),
    (
        "on-analysis-run-running",
        "analysis-run-running",
        "Rollout {{.rollout.metadata.name}}'s analysis run is running.",
    ),
    (
        "on-analysis-run-error",
        "analysis-run-error",
        "Rollout {{.rollout.metadata.name}}'s analysis run is in error state.",
    ),
    (
        "on-analysis-run-failed",
        "analysis-run-failed",
        "Rollout {{.rollout.metadata.name}}'s analysis run failed.",
    ),
];

/// The conditions of `trigger`: the ConfigMap's, else the built-in one.
pub fn trigger_conditions(
    config: &NotificationConfig,
    trigger: &str,
) -> Option<Vec<config::TriggerCondition>> {
    if let Some(conditions) = config.triggers.get(trigger) {
        return Some(conditions.clone());
    }
    BUILT_IN
        .iter()
        .find(|(name, _, _)| *name == trigger)
        .map(|(_, template, _)| {
            vec![config::TriggerCondition {
                send: vec![(*template).to_string()],
                ..Default::default()
            }]
        })
}

/// Every trigger `config` knows: the ConfigMap's and the built-in ones, by name.
pub fn trigger_names(config: &NotificationConfig) -> Vec<String> {
    let mut names: Vec<String> = config.triggers.keys().cloned().collect();
    names.extend(BUILT_IN.iter().map(|(trigger, _, _)| trigger.to_string()));
    names.sort();
    names.dedup();
    names
}

/// Every template `config` knows: the ConfigMap's and the built-in ones, by name.
pub fn template_names(config: &NotificationConfig) -> Vec<String> {
    let mut names: Vec<String> = config.templates.keys().cloned().collect();
    names.extend(BUILT_IN.iter().map(|(_, template, _)| template.to_string()));
    names.sort();
    names.dedup();
    names
}

/// The template `name`: the ConfigMap's, else the built-in one.
pub fn template(config: &NotificationConfig, name: &str) -> Option<TemplateSpec> {
    if let Some(template) = config.templates.get(name) {
        return Some(template.clone());
    }
    BUILT_IN
        .iter()
        .find(|(_, template, _)| *template == name)
        .map(|(_, _, message)| TemplateSpec {
            message: (*message).to_string(),
            ..Default::default()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_reasons_name_argo_triggers() {
        for (reason, trigger) in [
            ("RolloutAborted", "on-rollout-aborted"),
            ("RolloutCompleted", "on-rollout-completed"),
            ("RolloutStepCompleted", "on-rollout-step-completed"),
            ("RolloutUpdated", "on-rollout-updated"),
            ("RolloutPaused", "on-rollout-paused"),
            ("ScalingReplicaSet", "on-scaling-replica-set"),
            ("AnalysisRunRunning", "on-analysis-run-running"),
            ("AnalysisRunError", "on-analysis-run-error"),
            ("AnalysisRunFailed", "on-analysis-run-failed"),
        ] {
            assert_eq!(trigger_for_reason(reason), trigger);
        }
    }

    #[test]
    fn every_built_in_trigger_sends_a_template_that_renders() {
        let config = NotificationConfig::default();
        let rollout = serde_json::json!({
            "metadata": {"name": "web"},
            "spec": {"replicas": 3, "strategy": {"canary": {"steps": [{"setWeight": 10}]}}},
            "status": {"currentStepIndex": 0}
        });
        for (trigger, _, _) in BUILT_IN {
            let conditions = trigger_conditions(&config, trigger).expect("built in");
            let spec = template(&config, &conditions[0].send[0]).expect("its template");
            let mut notification = Notification::default();
            spec.render_into(&variables(&rollout, ""), &mut notification)
                .expect("renders");
            assert!(
                notification.message.contains("web"),
                "{trigger}: {notification:?}"
            );
        }
    }

    #[test]
    fn the_configmap_overrides_built_in_triggers_and_templates() {
        let data = [
            (
                "trigger.on-rollout-aborted".to_string(),
                "- send: [mine]\n".to_string(),
            ),
            (
                "template.rollout-completed".to_string(),
                "message: done\n".to_string(),
            ),
        ]
        .into_iter()
        .collect();
        let (config, errors) = NotificationConfig::parse(&data, &Default::default());
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            trigger_conditions(&config, "on-rollout-aborted").expect("set")[0].send,
            ["mine"]
        );
        assert_eq!(
            template(&config, "rollout-completed").expect("set").message,
            "done"
        );
        assert!(trigger_conditions(&config, "on-new-replica-set-created").is_none());
    }
}
