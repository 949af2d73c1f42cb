//! The notification configuration, read from the ConfigMap and Secret as Argo's notifications
//! engine reads them: `service.<type>[.<name>]`, `template.<name>`, `trigger.<name>`,
//! `defaultTriggers[.<service>]` and `subscriptions`, with `$key` references into the Secret.
//! A key that cannot be used is reported (naming the key and the fix) and the others are kept.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use super::subscriptions::{Destination, GlobalSubscription};
use super::template::TemplateSpec;

/// What `defaultTriggers` is when the ConfigMap does not set it: failures only, so a
/// subscription without a trigger hears about releases that went wrong and nothing else.
pub const FAILURE_TRIGGERS: [&str; 3] = [
    "on-rollout-aborted",
    "on-analysis-run-failed",
    "on-analysis-run-error",
];

/// A value that came from the Secret (or may have): shown as `***` in debug output.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Sensitive(pub String);

impl fmt::Debug for Sensitive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// How often and how long a failed send is tried again (webhook's `retryMax`,
/// `retryWaitMin`, `retryWaitMax`; Argo's defaults 3, 1s, 5s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    pub max_retries: u32,
    pub wait_min: Duration,
    pub wait_max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 3,
            wait_min: Duration::from_secs(1),
            wait_max: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// The wait before try number `retry` (1 for the first retry): `wait_min`, doubling, at
    /// most `wait_max`.
    pub fn wait(&self, retry: u32) -> Duration {
        let doublings = retry.saturating_sub(1).min(16);
        self.wait_min
            .saturating_mul(1 << doublings)
            .min(self.wait_max)
    }
}

/// `service.webhook.<name>`: a generic HTTP request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookService {
    pub url: Sensitive,
    pub headers: Vec<(String, Sensitive)>,
    pub basic_auth: Option<(Sensitive, Sensitive)>,
    pub insecure_skip_verify: bool,
    pub retry: RetryPolicy,
}

/// `service.slack[.<name>]`: Slack's `chat.postMessage` with a bot token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlackService {
    pub token: Sensitive,
    /// Base of Slack's Web API (`https://slack.com/api/` unless `apiURL` says otherwise).
    pub api_url: String,
    pub username: Option<String>,
    pub icon: Option<String>,
    pub insecure_skip_verify: bool,
    pub retry: RetryPolicy,
}

/// `service.pagerdutyv2[.<name>]`: PagerDuty's Events API v2; each recipient names an entry of
/// `serviceKeys` (its integration key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PagerDutyService {
    pub service_keys: BTreeMap<String, Sensitive>,
    /// The events endpoint: PagerDuty's unless `apiURL` (our addition, for a proxy) says otherwise.
    pub api_url: String,
    pub retry: RetryPolicy,
}

/// `service.email[.<name>]`: mail over SMTP to each recipient (an address); STARTTLS when the
/// server offers it, TLS from the start on port 465, as Argo's engine does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmailService {
    pub host: String,
    pub port: u16,
    pub from: String,
    pub username: Sensitive,
    pub password: Sensitive,
    pub html: bool,
    pub insecure_skip_verify: bool,
    pub retry: RetryPolicy,
}

/// `service.teams[.<name>]`: Microsoft Teams incoming webhooks (Office 365 connectors); each
/// recipient names an entry of `recipientUrls` (its webhook URL).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TeamsService {
    pub recipient_urls: BTreeMap<String, Sensitive>,
    pub insecure_skip_verify: bool,
    pub retry: RetryPolicy,
}

/// PagerDuty's Events API v2 endpoint.
pub const PAGERDUTY_EVENTS_URL: &str = "https://events.pagerduty.com/v2/enqueue";

/// One configured service, by the name subscriptions use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Service {
    Webhook(WebhookService),
    Slack(SlackService),
    PagerDutyV2(PagerDutyService),
    Email(EmailService),
    Teams(TeamsService),
    /// `service.teams-workflows[.<name>]`: Teams Workflows (Power Automate) webhooks, with the
    /// same settings as `teams`.
    TeamsWorkflows(TeamsService),
}

impl Service {
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Webhook(_) => "webhook",
            Self::Slack(_) => "slack",
            Self::PagerDutyV2(_) => "pagerdutyv2",
            Self::Email(_) => "email",
            Self::Teams(_) => "teams",
            Self::TeamsWorkflows(_) => "teams-workflows",
        }
    }

    pub fn retry(&self) -> RetryPolicy {
        match self {
            Self::Webhook(webhook) => webhook.retry,
            Self::Slack(slack) => slack.retry,
            Self::PagerDutyV2(pagerduty) => pagerduty.retry,
            Self::Email(email) => email.retry,
            Self::Teams(teams) | Self::TeamsWorkflows(teams) => teams.retry,
        }
    }
}

/// One condition of a trigger: `when` (an expr-lang expression over `rollout`; empty: always),
/// the templates to `send`, and `oncePer` (an expression: the condition sends once per distinct
/// value of it, as Argo's notifications engine does).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TriggerCondition {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub when: String,
    #[serde(default)]
    pub send: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub once_per: String,
}

/// The whole configuration, as parsed from one ConfigMap and its Secret.
#[derive(Clone, Debug, Default)]
pub struct NotificationConfig {
    pub services: BTreeMap<String, Service>,
    pub templates: BTreeMap<String, TemplateSpec>,
    pub triggers: BTreeMap<String, Vec<TriggerCondition>>,
    /// `defaultTriggers`, or [`FAILURE_TRIGGERS`] when the ConfigMap does not set it.
    pub default_triggers: Vec<String>,
    /// `defaultTriggers.<service>`: the default triggers of one service.
    pub service_default_triggers: BTreeMap<String, Vec<String>>,
    pub subscriptions: Vec<GlobalSubscription>,
    /// The Secret's values, which templates see as `.secrets` (as in Argo).
    pub secrets: BTreeMap<String, Sensitive>,
}

/// A ConfigMap key that could not be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("notification ConfigMap key {key:?}: {reason}")]
pub struct ConfigError {
    pub key: String,
    pub reason: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WebhookSpec {
    #[serde(default)]
    url: String,
    #[serde(default)]
    headers: Vec<HeaderSpec>,
    basic_auth: Option<BasicAuthSpec>,
    #[serde(default)]
    insecure_skip_verify: bool,
    retry_max: Option<u32>,
    retry_wait_min: Option<String>,
    retry_wait_max: Option<String>,
}

#[derive(Deserialize)]
struct HeaderSpec {
    name: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
struct BasicAuthSpec {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlackSpec {
    #[serde(default)]
    token: String,
    #[serde(rename = "apiURL")]
    api_url: Option<String>,
    username: Option<String>,
    icon: Option<String>,
    #[serde(default)]
    insecure_skip_verify: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PagerDutySpec {
    #[serde(default)]
    service_keys: BTreeMap<String, String>,
    #[serde(rename = "apiURL")]
    api_url: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TeamsSpec {
    #[serde(default)]
    recipient_urls: BTreeMap<String, String>,
    #[serde(default)]
    insecure_skip_verify: bool,
}

#[derive(Deserialize)]
struct EmailSpec {
    #[serde(default)]
    host: String,
    port: Option<u16>,
    #[serde(default)]
    from: String,
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    html: bool,
    #[serde(default)]
    insecure_skip_verify: bool,
}

/// The most retries a service may ask for, and the longest wait between two tries: a send is
/// bounded whatever the ConfigMap says.
const MAX_RETRIES: u32 = 10;
const MAX_RETRY_WAIT: Duration = Duration::from_secs(60);

impl NotificationConfig {
    /// Parses the ConfigMap's `data` with the Secret's values (`secret` maps key to value).
    /// Keys that cannot be used are returned as errors; everything else is kept.
    pub fn parse(
        data: &BTreeMap<String, String>,
        secret: &BTreeMap<String, String>,
    ) -> (Self, Vec<ConfigError>) {
        let mut config = Self {
            default_triggers: FAILURE_TRIGGERS.iter().map(|t| t.to_string()).collect(),
            secrets: secret
                .iter()
                .map(|(key, value)| (key.clone(), Sensitive(value.clone())))
                .collect(),
            ..Self::default()
        };
        let mut errors = Vec::new();
        for (key, value) in data {
            let error = |reason: String| ConfigError {
                key: key.clone(),
                reason,
            };
            let outcome = if let Some(rest) = key.strip_prefix("service.") {
                parse_service(rest, value, secret).map(|(name, service)| {
                    config.services.insert(name, service);
                })
            } else if let Some(name) = key.strip_prefix("template.") {
                TemplateSpec::parse(value).map(|template| {
                    config.templates.insert(name.to_string(), template);
                })
            } else if let Some(name) = key.strip_prefix("trigger.") {
                serde_saphyr::from_str::<Vec<TriggerCondition>>(value)
                    .map_err(|e| {
                        format!(
                            "not a list of conditions (`- when: ...` / `send: [template]`): {e}"
                        )
                    })
                    .and_then(|conditions| check_conditions(&conditions).map(|()| conditions))
                    .map(|conditions| {
                        config.triggers.insert(name.to_string(), conditions);
                    })
            } else if key == "defaultTriggers" {
                string_list(value).map(|triggers| config.default_triggers = triggers)
            } else if let Some(service) = key.strip_prefix("defaultTriggers.") {
                string_list(value).map(|triggers| {
                    config
                        .service_default_triggers
                        .insert(service.to_string(), triggers);
                })
            } else if key == "subscriptions" {
                GlobalSubscription::parse_list(value).map(|list| config.subscriptions = list)
            } else {
                // Argo's engine ignores keys it does not know (`context`, comments); so do we.
                Ok(())
            };
            if let Err(reason) = outcome {
                errors.push(error(reason));
            }
        }
        (config, errors)
    }

    /// The default triggers for subscriptions to `service` that name no trigger.
    pub fn default_triggers_for(&self, service: &str) -> &[String] {
        self.service_default_triggers
            .get(service)
            .unwrap_or(&self.default_triggers)
    }

    /// Keeps only the destinations whose service is configured.
    pub fn configured(&self, destinations: Vec<Destination>) -> Vec<Destination> {
        destinations
            .into_iter()
            .filter(|d| self.services.contains_key(&d.service))
            .collect()
    }
}

fn check_conditions(conditions: &[TriggerCondition]) -> Result<(), String> {
    for (index, condition) in conditions.iter().enumerate() {
        if condition.send.is_empty() {
            return Err(format!(
                "condition {index} sends no template: add `send: [<template name>]`"
            ));
        }
        if !condition.when.is_empty() {
            rollouts_analysis::condition::check_parses(&condition.when).map_err(|e| {
                format!("condition {index}: `when` is not an expr-lang expression: {e}")
            })?;
        }
        if !condition.once_per.is_empty() {
            rollouts_analysis::condition::check_parses(&condition.once_per).map_err(|e| {
                format!("condition {index}: `oncePer` is not an expr-lang expression: {e}")
            })?;
        }
    }
    Ok(())
}

fn string_list(value: &str) -> Result<Vec<String>, String> {
    serde_saphyr::from_str::<Vec<String>>(value)
        .map_err(|e| format!("not a list of trigger names: {e}"))
}

/// `service.<type>` or `service.<type>.<name>`: the name subscriptions use and the service.
fn parse_service(
    rest: &str,
    value: &str,
    secret: &BTreeMap<String, String>,
) -> Result<(String, Service), String> {
    let (type_, name) = match rest.split_once('.') {
        Some((type_, name)) => (type_, name),
        None => (rest, rest),
    };
    if name.is_empty() {
        return Err("the service has no name after its type".to_string());
    }
    let service = match type_ {
        "webhook" => {
            let spec: WebhookSpec = serde_saphyr::from_str(value)
                .map_err(|e| format!("not a webhook service (url, headers, basicAuth): {e}"))?;
            let url = expand(&spec.url, secret);
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err("`url` must be an http:// or https:// URL".to_string());
            }
            Service::Webhook(WebhookService {
                url: Sensitive(url),
                headers: spec
                    .headers
                    .into_iter()
                    .map(|h| (h.name, Sensitive(expand(&h.value, secret))))
                    .collect(),
                basic_auth: spec.basic_auth.map(|auth| {
                    (
                        Sensitive(expand(&auth.username, secret)),
                        Sensitive(expand(&auth.password, secret)),
                    )
                }),
                insecure_skip_verify: spec.insecure_skip_verify,
                retry: retry_policy(
                    spec.retry_max,
                    spec.retry_wait_min.as_deref(),
                    spec.retry_wait_max.as_deref(),
                )?,
            })
        }
        "slack" => {
            let spec: SlackSpec = serde_saphyr::from_str(value)
                .map_err(|e| format!("not a slack service (token, apiURL, username): {e}"))?;
            let token = expand(&spec.token, secret);
            if token.is_empty() || token.starts_with('$') {
                return Err(format!(
                    "`token` is empty or names a Secret key that is not there ({:?}): put the bot token in the notification Secret and write `token: $<key>`",
                    spec.token
                ));
            }
            let mut api_url = spec
                .api_url
                .filter(|url| !url.is_empty())
                .unwrap_or_else(|| "https://slack.com/api/".to_string());
            if !api_url.ends_with('/') {
                api_url.push('/');
            }
            Service::Slack(SlackService {
                token: Sensitive(token),
                api_url,
                username: spec.username.filter(|u| !u.is_empty()),
                icon: spec.icon.filter(|i| !i.is_empty()),
                insecure_skip_verify: spec.insecure_skip_verify,
                retry: RetryPolicy::default(),
            })
        }
        "pagerdutyv2" => {
            let spec: PagerDutySpec = serde_saphyr::from_str(value)
                .map_err(|e| format!("not a pagerdutyv2 service (serviceKeys): {e}"))?;
            if spec.service_keys.is_empty() {
                return Err(
                    "`serviceKeys` is empty: map each PagerDuty service to `$<secret key>` of its integration key"
                        .to_string(),
                );
            }
            Service::PagerDutyV2(PagerDutyService {
                service_keys: spec
                    .service_keys
                    .into_iter()
                    .map(|(service, key)| (service, Sensitive(expand(&key, secret))))
                    .collect(),
                api_url: spec
                    .api_url
                    .filter(|url| !url.is_empty())
                    .unwrap_or_else(|| PAGERDUTY_EVENTS_URL.to_string()),
                retry: RetryPolicy::default(),
            })
        }
        "email" => {
            let spec: EmailSpec = serde_saphyr::from_str(value).map_err(|e| {
                format!("not an email service (host, port, from, username, password): {e}")
            })?;
            let host = expand(&spec.host, secret);
            let from = expand(&spec.from, secret);
            if host.is_empty() || from.is_empty() {
                return Err(
                    "`host` and `from` are needed: the SMTP server and the sender's address"
                        .to_string(),
                );
            }
            Service::Email(EmailService {
                host,
                port: spec.port.unwrap_or(587),
                from,
                username: Sensitive(expand(&spec.username, secret)),
                password: Sensitive(expand(&spec.password, secret)),
                html: spec.html,
                insecure_skip_verify: spec.insecure_skip_verify,
                retry: RetryPolicy::default(),
            })
        }
        "teams" | "teams-workflows" => {
            let spec: TeamsSpec = serde_saphyr::from_str(value).map_err(|e| {
                format!("not a {type_} service (recipientUrls, insecureSkipVerify): {e}")
            })?;
            let teams = TeamsService {
                recipient_urls: spec
                    .recipient_urls
                    .into_iter()
                    .map(|(recipient, url)| (recipient, Sensitive(expand(&url, secret))))
                    .collect(),
                insecure_skip_verify: spec.insecure_skip_verify,
                retry: RetryPolicy::default(),
            };
            if type_ == "teams" {
                Service::Teams(teams)
            } else {
                Service::TeamsWorkflows(teams)
            }
        }
        other => {
            return Err(format!(
                "service type {other:?} is not supported yet (webhook, slack, teams, \
                 teams-workflows, pagerdutyv2 and email are; a Slack incoming webhook can be sent \
                 with `service.webhook.<name>`)"
            ));
        }
    };
    Ok((name.to_string(), service))
}

fn retry_policy(
    max: Option<u32>,
    wait_min: Option<&str>,
    wait_max: Option<&str>,
) -> Result<RetryPolicy, String> {
    let default = RetryPolicy::default();
    let duration = |field: &str, text: Option<&str>, fallback: Duration| match text {
        None | Some("") => Ok(fallback),
        Some(text) => rollouts_crds::duration::parse(text)
            .map(|d| d.min(MAX_RETRY_WAIT))
            .map_err(|e| format!("`{field}` {text:?} is not a duration such as 1s: {e}")),
    };
    let policy = RetryPolicy {
        max_retries: max.unwrap_or(default.max_retries).min(MAX_RETRIES),
        wait_min: duration("retryWaitMin", wait_min, default.wait_min)?,
        wait_max: duration("retryWaitMax", wait_max, default.wait_max)?,
    };
    Ok(RetryPolicy {
        wait_max: policy.wait_max.max(policy.wait_min),
        ..policy
    })
}

/// Replaces each `$key` naming a key of the Secret with its value, as Argo's engine does;
/// `$` followed by anything else is left as written.
pub fn expand(text: &str, secret: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let end = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
            .unwrap_or(after.len());
        let key = &after[..end];
        match secret.get(key) {
            Some(value) if !key.is_empty() => out.push_str(value),
            _ => {
                out.push('$');
                out.push_str(key);
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
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

    #[test]
    fn secret_references_are_replaced_and_unknown_ones_kept() {
        let secret = map(&[("slack-token", "xoxb-1"), ("pass", "p4ss")]);
        assert_eq!(expand("$slack-token", &secret), "xoxb-1");
        assert_eq!(expand("token $pass!", &secret), "token p4ss!");
        assert_eq!(expand("$missing and $", &secret), "$missing and $");
    }

    #[test]
    fn argo_style_configmap_parses_services_templates_triggers_and_defaults() {
        let data = map(&[
            (
                "service.webhook.ops",
                "url: https://hooks.example.com/x\nheaders:\n- name: Authorization\n  value: Bearer $hook-token\nbasicAuth:\n  username: ops\n  password: $hook-pass\nretryMax: 2\nretryWaitMin: 100ms\n",
            ),
            (
                "service.slack",
                "token: $slack-token\napiURL: http://127.0.0.1:9/api\nusername: rollouts\n",
            ),
            (
                "service.pagerdutyv2",
                "serviceKeys:\n  checkout: $pd-checkout\n",
            ),
            (
                "service.email.gmail",
                "host: smtp.example.com\nport: 465\nfrom: $mail-from\nusername: $mail-user\npassword: $mail-pass\n",
            ),
            (
                "service.teams",
                "recipientUrls:\n  ops-channel: $teams-ops\n",
            ),
            (
                "service.teams-workflows.flows",
                "recipientUrls:\n  ops-channel: $teams-ops\n",
            ),
            (
                "template.rollout-aborted",
                "message: Rollout {{.rollout.metadata.name}} has been aborted.\n",
            ),
            ("trigger.on-rollout-aborted", "- send: [rollout-aborted]\n"),
            (
                "trigger.on-purple",
                "- when: rollout.spec.replicas > 3\n  send: [rollout-aborted]\n",
            ),
            (
                "defaultTriggers",
                "- on-rollout-aborted\n- on-rollout-completed\n",
            ),
            ("defaultTriggers.slack", "- on-rollout-paused\n"),
            ("context", "argocdUrl: x\n"),
        ]);
        let secret = map(&[
            ("hook-token", "t0k"),
            ("hook-pass", "pw"),
            ("slack-token", "xoxb"),
            ("pd-checkout", "R0UTING"),
            ("mail-from", "rollouts@example.com"),
            ("mail-user", "bot"),
            ("mail-pass", "pw"),
            (
                "teams-ops",
                "https://example.webhook.office.com/webhookb2/x",
            ),
        ]);
        let (config, errors) = NotificationConfig::parse(&data, &secret);
        assert_eq!(errors, vec![]);
        let Some(Service::Teams(teams)) = config.services.get("teams") else {
            panic!("teams: {:?}", config.services);
        };
        assert_eq!(
            teams.recipient_urls["ops-channel"].0,
            "https://example.webhook.office.com/webhookb2/x"
        );
        assert_eq!(config.secrets["mail-user"].0, "bot");
        assert!(
            matches!(config.services.get("flows"), Some(Service::TeamsWorkflows(flows)) if flows.recipient_urls.contains_key("ops-channel")),
            "teams-workflows flows: {:?}",
            config.services
        );
        let Some(Service::Webhook(ops)) = config.services.get("ops") else {
            panic!("webhook ops: {:?}", config.services);
        };
        assert_eq!(ops.url.0, "https://hooks.example.com/x");
        assert_eq!(ops.headers[0].1.0, "Bearer t0k");
        assert_eq!(
            ops.basic_auth,
            Some((Sensitive("ops".into()), Sensitive("pw".into())))
        );
        assert_eq!(ops.retry.max_retries, 2);
        assert_eq!(ops.retry.wait_min, Duration::from_millis(100));
        let Some(Service::Slack(slack)) = config.services.get("slack") else {
            panic!("slack: {:?}", config.services);
        };
        assert_eq!(slack.token.0, "xoxb");
        assert_eq!(slack.api_url, "http://127.0.0.1:9/api/");
        let Some(Service::PagerDutyV2(pagerduty)) = config.services.get("pagerdutyv2") else {
            panic!("pagerdutyv2: {:?}", config.services);
        };
        assert_eq!(pagerduty.service_keys["checkout"].0, "R0UTING");
        assert_eq!(pagerduty.api_url, PAGERDUTY_EVENTS_URL);
        let Some(Service::Email(gmail)) = config.services.get("gmail") else {
            panic!("email gmail: {:?}", config.services);
        };
        assert_eq!(
            (gmail.host.as_str(), gmail.port, gmail.from.as_str()),
            ("smtp.example.com", 465, "rollouts@example.com")
        );
        assert_eq!(
            (gmail.username.0.as_str(), gmail.password.0.as_str()),
            ("bot", "pw")
        );
        assert_eq!(
            config.triggers["on-purple"][0].when,
            "rollout.spec.replicas > 3"
        );
        assert_eq!(
            config.default_triggers_for("ops"),
            ["on-rollout-aborted", "on-rollout-completed"]
        );
        assert_eq!(config.default_triggers_for("slack"), ["on-rollout-paused"]);
        assert!(config.templates.contains_key("rollout-aborted"));
    }

    #[test]
    fn secrets_never_show_in_debug_output() {
        let data = map(&[("service.webhook.ops", "url: https://x.example/$hook\n")]);
        let secret = map(&[("hook", "very-secret-path")]);
        let (config, _) = NotificationConfig::parse(&data, &secret);
        let debug = format!("{config:?}");
        assert!(!debug.contains("very-secret-path"), "{debug}");
    }

    #[test]
    fn without_default_triggers_the_defaults_are_failures_only() {
        let (config, errors) = NotificationConfig::parse(&BTreeMap::new(), &BTreeMap::new());
        assert!(errors.is_empty());
        assert_eq!(config.default_triggers, FAILURE_TRIGGERS);
    }

    #[test]
    fn unusable_keys_are_reported_by_name_and_the_rest_kept() {
        let data = map(&[
            ("service.opsgenie", "apiKeys: {}\n"),
            ("service.webhook.bad", "url: ftp://x\n"),
            ("service.slack", "token: $absent\n"),
            (
                "trigger.on-x",
                "- when: rollout.spec.replicas >\n  send: [t]\n",
            ),
            ("trigger.on-y", "- when: 'true'\n"),
            ("template.t", "message: '{{.rollout.metadata.name'\n"),
            ("service.webhook.good", "url: http://127.0.0.1:1/\n"),
        ]);
        let (config, errors) = NotificationConfig::parse(&data, &BTreeMap::new());
        let keys: Vec<&str> = errors.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "service.opsgenie",
                "service.slack",
                "service.webhook.bad",
                "template.t",
                "trigger.on-x",
                "trigger.on-y"
            ]
        );
        assert!(errors[0].reason.contains("not supported"), "{}", errors[0]);
        assert!(errors[1].reason.contains("Secret"), "{}", errors[1]);
        assert!(config.services.contains_key("good"));
    }

    #[test]
    fn retries_are_bounded_whatever_the_configmap_says() {
        let policy = retry_policy(Some(1000), Some("1h"), Some("1ms")).expect("valid");
        assert_eq!(policy.max_retries, MAX_RETRIES);
        assert_eq!(policy.wait_min, MAX_RETRY_WAIT);
        assert_eq!(policy.wait_max, MAX_RETRY_WAIT);
        let default = RetryPolicy::default();
        let waits: Vec<u128> = (1..=4).map(|n| default.wait(n).as_millis()).collect();
        assert_eq!(waits, [1000, 2000, 4000, 5000]);
    }
}
