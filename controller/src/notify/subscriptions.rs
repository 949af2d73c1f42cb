//! Who hears about what: subscriptions by annotation on a Rollout
//! (`notifications.argoproj.io/subscribe.<trigger>.<service>: <recipient>[;<recipient>]`,
//! `notifications.argoproj.io/subscribe.<service>` for the default triggers, and the YAML list
//! `notifications.argoproj.io/subscriptions`) and the ConfigMap's `subscriptions`, as Argo's
//! engine reads them.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::config::NotificationConfig;

const SUBSCRIBE_PREFIX: &str = "notifications.argoproj.io/subscribe.";
const SUBSCRIPTIONS_ANNOTATION: &str = "notifications.argoproj.io/subscriptions";

/// One service and recipient (a Slack channel; empty for a webhook).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Destination {
    pub service: String,
    pub recipient: String,
}

/// One entry of the ConfigMap's `subscriptions`: recipients as `<service>[:<recipient>]`,
/// for the Rollouts whose labels match `selector`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct GlobalSubscription {
    #[serde(default)]
    pub recipients: Vec<String>,
    #[serde(default)]
    pub triggers: Vec<String>,
    #[serde(default)]
    pub selector: String,
}

impl GlobalSubscription {
    pub fn parse_list(value: &str) -> Result<Vec<Self>, String> {
        let list: Vec<Self> = serde_saphyr::from_str(value)
            .map_err(|e| format!("not a list of {{recipients, triggers, selector}}: {e}"))?;
        for subscription in &list {
            parse_selector(&subscription.selector)?;
        }
        Ok(list)
    }

    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        parse_selector(&self.selector).is_ok_and(|pairs| {
            pairs
                .iter()
                .all(|(key, value)| labels.get(key) == Some(value))
        })
    }
}

/// A selector of `key=value` pairs, comma separated (the equality subset Argo's users write).
fn parse_selector(selector: &str) -> Result<Vec<(String, String)>, String> {
    selector
        .split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(|part| {
            let (key, value) = part
                .split_once("==")
                .or_else(|| part.split_once('='))
                .ok_or_else(|| {
                    format!(
                        "selector {selector:?}: only `key=value` pairs are supported, not {part:?}"
                    )
                })?;
            Ok((key.trim().to_string(), value.trim().to_string()))
        })
        .collect()
}

#[derive(Deserialize)]
struct AnnotationSubscription {
    #[serde(default)]
    trigger: Vec<String>,
    #[serde(default)]
    destinations: Vec<AnnotationDestination>,
}

#[derive(Deserialize)]
struct AnnotationDestination {
    service: String,
    #[serde(default)]
    recipients: Vec<String>,
}

/// `a;b; c` as recipients; none written means one empty recipient (a webhook's).
fn recipients(value: &str) -> Vec<String> {
    let list: Vec<String> = value
        .split([';', ','])
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(str::to_string)
        .collect();
    if list.is_empty() {
        vec![String::new()]
    } else {
        list
    }
}

/// The destinations subscribed to `trigger` for a Rollout with these annotations and labels.
/// Errors name the annotation that could not be read; the others still count.
pub fn destinations(
    config: &NotificationConfig,
    trigger: &str,
    annotations: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> (Vec<Destination>, Vec<String>) {
    let mut found = Vec::new();
    let mut errors = Vec::new();
    let wants = |subscribed: &[String], service: &str| {
        if subscribed.is_empty() {
            config
                .default_triggers_for(service)
                .iter()
                .any(|t| t == trigger)
        } else {
            subscribed.iter().any(|t| t == trigger)
        }
    };
    for (key, value) in annotations {
        if let Some(rest) = key.strip_prefix(SUBSCRIBE_PREFIX) {
            let (subscribed, service) = match rest.split_once('.') {
                Some((trigger, service)) => (vec![trigger.to_string()], service),
                None => (Vec::new(), rest),
            };
            let subscribed: Vec<String> =
                subscribed.into_iter().filter(|t| !t.is_empty()).collect();
            if !service.is_empty() && wants(&subscribed, service) {
                for recipient in recipients(value) {
                    found.push(Destination {
                        service: service.to_string(),
                        recipient,
                    });
                }
            }
        } else if key == SUBSCRIPTIONS_ANNOTATION {
            match serde_saphyr::from_str::<Vec<AnnotationSubscription>>(value) {
                Ok(list) => {
                    for subscription in list {
                        for destination in subscription.destinations {
                            if !wants(&subscription.trigger, &destination.service) {
                                continue;
                            }
                            let list = if destination.recipients.is_empty() {
                                vec![String::new()]
                            } else {
                                destination.recipients
                            };
                            for recipient in list {
                                found.push(Destination {
                                    service: destination.service.clone(),
                                    recipient,
                                });
                            }
                        }
                    }
                }
                Err(e) => errors.push(format!(
                    "annotation {SUBSCRIPTIONS_ANNOTATION}: not a list of {{trigger, destinations: [{{service, recipients}}]}}: {e}"
                )),
            }
        }
    }
    for subscription in &config.subscriptions {
        if !subscription.matches(labels) {
            continue;
        }
        for recipient in &subscription.recipients {
            let (service, recipient) = recipient.split_once(':').unwrap_or((recipient, ""));
            if wants(&subscription.triggers, service) {
                found.push(Destination {
                    service: service.to_string(),
                    recipient: recipient.to_string(),
                });
            }
        }
    }
    found.sort();
    found.dedup();
    (found, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn dest(service: &str, recipient: &str) -> Destination {
        Destination {
            service: service.into(),
            recipient: recipient.into(),
        }
    }

    #[test]
    fn annotations_subscribe_recipients_per_trigger_and_service() {
        let config = NotificationConfig::parse(&BTreeMap::new(), &BTreeMap::new()).0;
        let annotations = map(&[
            (
                "notifications.argoproj.io/subscribe.on-rollout-step-completed.slack",
                "my-channel1;my-channel2",
            ),
            (
                "notifications.argoproj.io/subscribe.on-rollout-aborted.ops-hook",
                "",
            ),
            ("notifications.argoproj.io/subscribe.pager", ""),
            ("unrelated", "x"),
        ]);
        let labels = BTreeMap::new();
        let (steps, errors) =
            destinations(&config, "on-rollout-step-completed", &annotations, &labels);
        assert!(errors.is_empty());
        assert_eq!(
            steps,
            [dest("slack", "my-channel1"), dest("slack", "my-channel2")]
        );
        // `subscribe.<service>` takes the default triggers: failures only.
        let (aborted, _) = destinations(&config, "on-rollout-aborted", &annotations, &labels);
        assert_eq!(aborted, [dest("ops-hook", ""), dest("pager", "")]);
        let (completed, _) = destinations(&config, "on-rollout-completed", &annotations, &labels);
        assert!(completed.is_empty());
    }

    #[test]
    fn the_subscriptions_annotation_and_configmap_subscriptions_count_too() {
        let data = map(&[(
            "subscriptions",
            "- recipients: [slack:ops, audit-hook]\n  triggers: [on-rollout-completed]\n  selector: team=shop\n",
        )]);
        let config = NotificationConfig::parse(&data, &BTreeMap::new()).0;
        let annotations = map(&[(
            "notifications.argoproj.io/subscriptions",
            "- trigger: [on-rollout-completed, on-rollout-aborted]\n  destinations:\n  - service: slack\n    recipients: [dev-1]\n",
        )]);
        let shop = map(&[("team", "shop")]);
        let (found, errors) = destinations(&config, "on-rollout-completed", &annotations, &shop);
        assert!(errors.is_empty());
        assert_eq!(
            found,
            [
                dest("audit-hook", ""),
                dest("slack", "dev-1"),
                dest("slack", "ops")
            ]
        );
        let (other_team, _) = destinations(
            &config,
            "on-rollout-completed",
            &annotations,
            &BTreeMap::new(),
        );
        assert_eq!(other_team, [dest("slack", "dev-1")]);
    }

    #[test]
    fn an_unreadable_subscriptions_annotation_is_named() {
        let config = NotificationConfig::parse(&BTreeMap::new(), &BTreeMap::new()).0;
        let annotations = map(&[("notifications.argoproj.io/subscriptions", "{not: [a list")]);
        let (found, errors) = destinations(
            &config,
            "on-rollout-aborted",
            &annotations,
            &BTreeMap::new(),
        );
        assert!(found.is_empty());
        assert!(
            errors[0].contains("notifications.argoproj.io/subscriptions"),
            "{errors:?}"
        );
    }
}
