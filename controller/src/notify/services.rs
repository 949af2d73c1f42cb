//! Sending a rendered notification: the generic webhook (method, URL plus the template's path,
//! headers, basic auth, body), Slack's `chat.postMessage`, a Microsoft Teams webhook's
//! MessageCard, a Teams workflow's Adaptive Card, PagerDuty's Events API v2 and email over SMTP. [`SendError::is_transient`] says whether trying again may help.
//! Error texts never hold a URL, header or token: they can end up in events and logs.

use std::time::Duration;

use base64::Engine;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};

use super::config::{
    EmailService, PagerDutyService, Service, SlackService, TeamsService, WebhookService,
};
use super::template::Notification;

/// How long one request may take before it counts as a timeout.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of a receiver's answer read at most (Slack's `{"ok": ...}` is small).
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// Why one send failed.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("the receiver answered HTTP {code}")]
    Status { code: u16 },
    #[error("the request timed out after {}s", REQUEST_TIMEOUT.as_secs())]
    Timeout,
    #[error("the receiver could not be reached: {0}")]
    Connect(String),
    #[error("Slack refused the message: {0}")]
    Slack(String),
    #[error("Teams refused the message: {0}")]
    Teams(String),
    #[error("the mail server refused the message: {message}")]
    Smtp { message: String, transient: bool },
    #[error("the request could not be built: {0}")]
    Request(String),
}

impl SendError {
    /// A 5xx, a 429, a timeout or a connection failure may pass; anything else will not.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Status { code } => *code >= 500 || *code == 429 || *code == 408,
            Self::Timeout | Self::Connect(_) => true,
            Self::Slack(error) => error == "ratelimited",
            Self::Teams(_) => false,
            Self::Smtp { transient, .. } => *transient,
            Self::Request(_) => false,
        }
    }
}

fn classify(error: reqwest::Error) -> SendError {
    let error = error.without_url();
    if error.is_timeout() {
        SendError::Timeout
    } else if error.is_connect() || error.is_request() || error.is_body() {
        SendError::Connect(error.to_string())
    } else {
        SendError::Request(error.to_string())
    }
}

/// Sends `request` once; an answer outside 2xx is [`SendError::Status`].
async fn send_checked(request: reqwest::RequestBuilder) -> Result<reqwest::Response, SendError> {
    let response = request.send().await.map_err(classify)?;
    let status = response.status();
    if !status.is_success() {
        return Err(SendError::Status {
            code: status.as_u16(),
        });
    }
    Ok(response)
}

/// POSTs `body` as `application/json` to `url` through `client`, as [`send_checked`] does.
async fn post_json(
    client: &reqwest::Client,
    url: &str,
    body: String,
) -> Result<reqwest::Response, SendError> {
    send_checked(
        client
            .post(url)
            .header(CONTENT_TYPE, "application/json")
            .body(body),
    )
    .await
}

/// A receiver's answer, read up to [`MAX_ANSWER_BYTES`] (a longer one is an error).
async fn read_answer(response: reqwest::Response) -> Result<Vec<u8>, SendError> {
    rollouts_analysis::provider::body::read_capped(response, MAX_ANSWER_BYTES)
        .await
        .map_err(|e| SendError::Connect(e.to_string()))
}

/// The two HTTP clients: one that verifies TLS and one for `insecureSkipVerify`.
#[derive(Clone)]
pub struct HttpClients {
    secure: reqwest::Client,
    insecure: reqwest::Client,
}

impl HttpClients {
    pub fn new() -> Result<Self, reqwest::Error> {
        rollouts_analysis::provider::install_crypto_provider();
        Ok(Self {
            secure: reqwest::Client::builder()
                .timeout(REQUEST_TIMEOUT)
                .build()?,
            insecure: reqwest::Client::builder()
                .timeout(REQUEST_TIMEOUT)
                .danger_accept_invalid_certs(true)
                .build()?,
        })
    }

    fn pick(&self, insecure: bool) -> &reqwest::Client {
        if insecure {
            &self.insecure
        } else {
            &self.secure
        }
    }
}

/// Sends `notification` to `recipient` through `service` (named `service_name`), once.
pub async fn send(
    http: &HttpClients,
    service_name: &str,
    service: &Service,
    notification: &Notification,
    recipient: &str,
) -> Result<(), SendError> {
    match service {
        Service::Webhook(webhook) => send_webhook(http, service_name, webhook, notification).await,
        Service::Slack(slack) => send_slack(http, slack, notification, recipient).await,
        Service::PagerDutyV2(pagerduty) => {
            send_pagerduty(http, pagerduty, notification, recipient).await
        }
        Service::Email(email) => send_email(email, notification, recipient).await,
        Service::Teams(teams) => send_teams(http, teams, notification, recipient).await,
        Service::TeamsWorkflows(teams) => {
            send_teams_workflows(http, teams, notification, recipient).await
        }
    }
}

/// The body Argo's engine posts to a Teams Workflows webhook: a `message` whose one attachment
/// is an Adaptive Card, the template's `teams-workflows.adaptiveCard` as written, else one
/// built from `title` (coloured by `themeColor`), the text (`text`, else the message), `facts`
/// and the facts of `sections` as fact sets, and `potentialAction`'s OpenUri actions as links.
pub fn teams_workflows_message(notification: &Notification) -> Result<String, SendError> {
    let teams = notification.teams_workflows.clone().unwrap_or_default();
    let card = if teams.adaptive_card.trim().is_empty() {
        adaptive_card(notification, &teams)?
    } else {
        serde_json::from_str(&teams.adaptive_card).map_err(|e| {
            SendError::Request(format!(
                "the template's teams-workflows.adaptiveCard is not JSON after rendering: {e}"
            ))
        })?
    };
    let message = serde_json::json!({
        "type": "message",
        "attachments": [{
            "contentType": "application/vnd.microsoft.card.adaptive",
            "content": card,
        }],
    });
    Ok(message.to_string())
}

fn adaptive_card(
    notification: &Notification,
    teams: &super::template::TeamsSpec,
) -> Result<serde_json::Value, SendError> {
    use serde_json::{Value, json};
    let list = |field: &str, text: &str| -> Result<Vec<Value>, SendError> {
        if text.is_empty() {
            return Ok(Vec::new());
        }
        serde_json::from_str(text).map_err(|e| {
            SendError::Request(format!(
                "the template's teams-workflows.{field} is not a JSON list after rendering: {e}"
            ))
        })
    };
    // A fact is `{"name", "value"}`; a value that is not text is written as JSON.
    let fact_set = |facts: &[Value]| {
        let facts: Vec<Value> = facts
            .iter()
            .filter_map(|fact| {
                let name = fact["name"].as_str()?;
                let value = match &fact["value"] {
                    Value::String(text) => text.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                };
                Some(json!({"title": name, "value": value}))
            })
            .collect();
        (!facts.is_empty()).then(|| json!({"type": "FactSet", "facts": facts}))
    };
    let mut body = Vec::new();
    if !teams.title.is_empty() {
        let mut title = json!({
            "type": "TextBlock", "text": teams.title, "size": "Large", "weight": "Bolder", "wrap": true
        });
        if !teams.theme_color.is_empty() {
            title["color"] = teams.theme_color.clone().into();
        }
        body.push(title);
    }
    let text = if teams.text.is_empty() {
        &notification.message
    } else {
        &teams.text
    };
    if !text.is_empty() {
        body.push(json!({"type": "TextBlock", "text": text, "wrap": true}));
    }
    body.extend(fact_set(&list("facts", &teams.facts)?));
    for section in list("sections", &teams.sections)? {
        if let Some(facts) = section["facts"].as_array() {
            body.extend(fact_set(facts));
        }
    }
    let mut card = json!({"type": "AdaptiveCard", "version": "1.4", "body": body});
    let actions: Vec<Value> = list("potentialAction", &teams.potential_action)?
        .iter()
        .filter(|action| action["@type"] == "OpenUri")
        .filter_map(|action| {
            let url = action["targets"][0]["uri"]
                .as_str()
                .filter(|u| !u.is_empty())?;
            let mut link = json!({"type": "Action.OpenUrl", "url": url});
            if let Some(name) = action["name"].as_str() {
                link["title"] = name.into();
            }
            Some(link)
        })
        .collect();
    if !actions.is_empty() {
        card["actions"] = actions.into();
    }
    Ok(card)
}

/// Argo's check of a Teams Workflows URL: HTTPS (HTTP only to a loopback host) and a Power
/// Automate address (`api.powerautomate.com`, `api.powerplatform.com`, `flow.microsoft.com`,
/// `webhook.office.com/workflows`, or `/powerautomate/` in the path).
fn check_workflows_url(url: &str) -> Result<(), SendError> {
    let parsed = reqwest::Url::parse(url)
        .map_err(|e| SendError::Request(format!("the recipient's URL does not parse: {e}")))?;
    let host = parsed.host_str().unwrap_or_default();
    let loopback = host == "localhost" || host.starts_with("127.");
    if !(parsed.scheme() == "https" || (parsed.scheme() == "http" && loopback)) {
        return Err(SendError::Request(
            "a Teams Workflows URL must use https".to_string(),
        ));
    }
    let lower = url.to_ascii_lowercase();
    let workflows = [
        "api.powerautomate.com",
        "api.powerplatform.com",
        "flow.microsoft.com",
        "webhook.office.com/workflows",
        "/powerautomate/",
    ]
    .iter()
    .any(|pattern| lower.contains(pattern));
    if !workflows {
        return Err(SendError::Request(
            "the recipient's URL is not a Teams Workflows (Power Automate) URL: expected api.powerautomate.com, api.powerplatform.com, flow.microsoft.com or webhook.office.com/workflows (a classic connector URL belongs to service.teams)".to_string(),
        ));
    }
    Ok(())
}

/// A Teams Workflows webhook: POSTs [`teams_workflows_message`] to the URL `recipientUrls` has
/// for `recipient`; any 2xx is a success.
async fn send_teams_workflows(
    http: &HttpClients,
    teams: &TeamsService,
    notification: &Notification,
    recipient: &str,
) -> Result<(), SendError> {
    let url = teams.recipient_urls.get(recipient).ok_or_else(|| {
        SendError::Request(format!(
            "recipient {recipient:?} is not in the teams-workflows service's recipientUrls"
        ))
    })?;
    check_workflows_url(&url.0)?;
    let body = teams_workflows_message(notification)?;
    post_json(http.pick(teams.insecure_skip_verify), url.0.as_str(), body).await?;
    Ok(())
}

/// The body Argo's engine posts to a Teams webhook: the template's `teams.template` as written,
/// else a MessageCard with the message as its text, `title`, `summary`, `themeColor`,
/// `sections` (with `facts` as one more section) and `potentialAction`.
pub fn teams_message(notification: &Notification) -> Result<String, SendError> {
    let teams = notification.teams.clone().unwrap_or_default();
    if !teams.template.is_empty() {
        return Ok(teams.template);
    }
    let list = |field: &str, text: &str| -> Result<Vec<serde_json::Value>, SendError> {
        serde_json::from_str(text).map_err(|e| {
            SendError::Request(format!(
                "the template's teams.{field} is not a JSON list after rendering: {e}"
            ))
        })
    };
    let text = if teams.text.is_empty() {
        &notification.message
    } else {
        &teams.text
    };
    // Field names as Argo's engine writes them (`context` without its `@` included).
    let mut card = serde_json::json!({
        "@type": "MessageCard",
        "context": "https://schema.org/extensions",
        "title": teams.title,
        "summary": teams.summary,
        "text": text,
    });
    if !teams.theme_color.is_empty() {
        card["themeColor"] = teams.theme_color.clone().into();
    }
    let mut sections = if teams.sections.is_empty() {
        Vec::new()
    } else {
        list("sections", &teams.sections)?
    };
    if !teams.facts.is_empty() {
        sections.push(serde_json::json!({"facts": list("facts", &teams.facts)?}));
    }
    if !teams.potential_action.is_empty() {
        card["potentialAction"] = list("potentialAction", &teams.potential_action)?.into();
    }
    if !sections.is_empty() {
        card["sections"] = sections.into();
    }
    Ok(card.to_string())
}

/// A Teams incoming webhook: POSTs [`teams_message`] to the URL `recipientUrls` has for
/// `recipient`. As with Argo's engine, only an answer of `1` is a success.
async fn send_teams(
    http: &HttpClients,
    teams: &TeamsService,
    notification: &Notification,
    recipient: &str,
) -> Result<(), SendError> {
    let url = teams.recipient_urls.get(recipient).ok_or_else(|| {
        SendError::Request(format!(
            "recipient {recipient:?} is not in the teams service's recipientUrls"
        ))
    })?;
    let body = teams_message(notification)?;
    let response = post_json(http.pick(teams.insecure_skip_verify), url.0.as_str(), body).await?;
    let answer = read_answer(response).await?;
    let answer = String::from_utf8_lossy(&answer);
    if answer.trim() == "1" {
        Ok(())
    } else {
        let mut said: String = answer.chars().take(200).collect();
        if said.is_empty() {
            said = "an empty answer (a Teams webhook answers 1)".to_string();
        }
        Err(SendError::Teams(said))
    }
}

/// One mail to `recipient`: the template's `email.subject` and its `message` as the body (HTML
/// with `html: true`). STARTTLS when the server offers it; TLS from the start on port 465.
async fn send_email(
    email: &EmailService,
    notification: &Notification,
    recipient: &str,
) -> Result<(), SendError> {
    use lettre::message::header::ContentType;
    use lettre::transport::smtp::authentication::Credentials;
    use lettre::transport::smtp::client::{Tls, TlsParameters};
    use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

    let address = |text: &str, what: &str| {
        text.parse::<lettre::message::Mailbox>().map_err(|e| {
            SendError::Request(format!("{what} {text:?} is not an email address: {e}"))
        })
    };
    let message = Message::builder()
        .from(address(&email.from, "the service's `from`")?)
        .to(address(recipient, "the recipient")?)
        .subject(notification.email_subject.clone())
        .header(if email.html {
            ContentType::TEXT_HTML
        } else {
            ContentType::TEXT_PLAIN
        })
        .body(notification.message.clone())
        .map_err(|e| SendError::Request(format!("the mail could not be built: {e}")))?;
    let tls_parameters = TlsParameters::builder(email.host.clone())
        .dangerous_accept_invalid_certs(email.insecure_skip_verify)
        .build()
        .map_err(|e| SendError::Request(format!("TLS settings for the mail server: {e}")))?;
    let tls = if email.port == 465 {
        Tls::Wrapper(tls_parameters)
    } else {
        Tls::Opportunistic(tls_parameters)
    };
    let mut transport = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(email.host.clone())
        .port(email.port)
        .tls(tls)
        .timeout(Some(REQUEST_TIMEOUT));
    if !email.username.0.is_empty() {
        transport = transport.credentials(Credentials::new(
            email.username.0.clone(),
            email.password.0.clone(),
        ));
    }
    transport
        .build()
        .send(message)
        .await
        .map(|_| ())
        .map_err(|error| SendError::Smtp {
            // A 4xx answer, a timeout or a lost connection may pass; a 5xx or our own mistake
            // will not.
            transient: !error.is_permanent() && !error.is_client(),
            message: error.to_string(),
        })
}

/// PagerDuty's Events API v2: a `trigger` event for the service `recipient` names in
/// `serviceKeys`, with the template's `pagerdutyv2` payload.
async fn send_pagerduty(
    http: &HttpClients,
    pagerduty: &PagerDutyService,
    notification: &Notification,
    recipient: &str,
) -> Result<(), SendError> {
    let routing_key = pagerduty.service_keys.get(recipient).ok_or_else(|| {
        SendError::Request(format!(
            "recipient {recipient:?} is not in the pagerdutyv2 service's serviceKeys"
        ))
    })?;
    let fields = notification.pagerduty.as_ref().ok_or_else(|| {
        SendError::Request(
            "the template has no pagerdutyv2 section (summary, severity, source)".to_string(),
        )
    })?;
    let mut payload = serde_json::json!({
        "summary": fields.summary,
        "severity": fields.severity,
        "source": fields.source,
    });
    for (key, value) in [
        ("component", &fields.component),
        ("group", &fields.group),
        ("class", &fields.class),
    ] {
        if !value.is_empty() {
            payload[key] = value.clone().into();
        }
    }
    let mut event = serde_json::json!({
        "routing_key": routing_key.0,
        "event_action": "trigger",
        "payload": payload,
    });
    if !fields.dedup_key.is_empty() {
        event["dedup_key"] = fields.dedup_key.clone().into();
    }
    if !fields.url.is_empty() {
        event["links"] = serde_json::json!([{"href": fields.url}]);
    }
    post_json(http.pick(false), &pagerduty.api_url, event.to_string()).await?;
    Ok(())
}

/// As Argo's webhook service: the template's `webhook.<service>` section gives method (GET
/// unless said), path (appended to the URL) and body; without one, a GET of the URL.
async fn send_webhook(
    http: &HttpClients,
    service_name: &str,
    webhook: &WebhookService,
    notification: &Notification,
) -> Result<(), SendError> {
    let section = notification.webhook.get(service_name);
    let method = section
        .map(|s| s.method.trim())
        .filter(|m| !m.is_empty())
        .unwrap_or("GET");
    let method = reqwest::Method::from_bytes(method.to_ascii_uppercase().as_bytes())
        .map_err(|_| SendError::Request(format!("{method:?} is not an HTTP method")))?;
    let url = format!(
        "{}{}",
        webhook.url.0,
        section.map(|s| s.path.as_str()).unwrap_or_default()
    );
    let mut request = http.pick(webhook.insecure_skip_verify).request(method, url);
    for (name, value) in &webhook.headers {
        request = request.header(name.as_str(), value.0.as_str());
    }
    if let Some((username, password)) = &webhook.basic_auth {
        let token = base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{}", username.0, password.0));
        request = request.header(AUTHORIZATION, format!("Basic {token}"));
    }
    if let Some(section) = section.filter(|s| !s.body.is_empty()) {
        request = request.body(section.body.clone());
    }
    send_checked(request).await?;
    Ok(())
}

/// Slack's `chat.postMessage` to the channel `recipient`, with the template's attachments and
/// blocks (JSON text) when it has them.
async fn send_slack(
    http: &HttpClients,
    slack: &SlackService,
    notification: &Notification,
    recipient: &str,
) -> Result<(), SendError> {
    let mut message = serde_json::json!({
        "channel": recipient,
        "text": notification.message,
    });
    for (field, text) in [
        ("attachments", &notification.slack_attachments),
        ("blocks", &notification.slack_blocks),
    ] {
        if text.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
            SendError::Request(format!(
                "the template's slack.{field} is not JSON after rendering: {e}"
            ))
        })?;
        message[field] = value;
    }
    if let Some(username) = &slack.username {
        message["username"] = username.clone().into();
    }
    if let Some(icon) = &slack.icon {
        let key = if icon.starts_with(':') {
            "icon_emoji"
        } else {
            "icon_url"
        };
        message[key] = icon.clone().into();
    }
    let request = http
        .pick(slack.insecure_skip_verify)
        .post(format!("{}chat.postMessage", slack.api_url))
        .header(AUTHORIZATION, format!("Bearer {}", slack.token.0))
        .header(CONTENT_TYPE, "application/json; charset=utf-8")
        .body(message.to_string());
    let answer = read_answer(send_checked(request).await?).await?;
    let answer: serde_json::Value = serde_json::from_slice(&answer)
        .map_err(|_| SendError::Slack("an answer that is not JSON".to_string()))?;
    if answer["ok"] == serde_json::Value::Bool(true) {
        Ok(())
    } else {
        Err(SendError::Slack(
            answer["error"]
                .as_str()
                .unwrap_or("unknown_error")
                .to_string(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_throttles_and_timeouts_are_worth_trying_again() {
        for code in [500, 502, 503, 504, 429, 408] {
            assert!(SendError::Status { code }.is_transient(), "{code}");
        }
        for code in [400, 401, 403, 404, 410] {
            assert!(!SendError::Status { code }.is_transient(), "{code}");
        }
        assert!(SendError::Timeout.is_transient());
        assert!(SendError::Slack("ratelimited".into()).is_transient());
        assert!(!SendError::Slack("channel_not_found".into()).is_transient());
    }

    #[test]
    fn a_teams_workflows_message_is_argos_adaptive_card_or_the_card_as_written() {
        use super::super::template::TeamsSpec;
        let mut notification = Notification {
            message: "Rollout web has been aborted.".into(),
            teams_workflows: Some(TeamsSpec {
                title: "Aborted".into(),
                theme_color: "Attention".into(),
                facts: r#"[{"name": "namespace", "value": "shop"}, {"name": "replicas", "value": 4}]"#.into(),
                sections: r#"[{"facts": [{"name": "revision", "value": "2"}]}, {"text": "no facts"}]"#.into(),
                potential_action: r#"[{"@type": "OpenUri", "name": "Open", "targets": [{"os": "default", "uri": "https://argo.example.com/web"}]}, {"@type": "HttpPOST"}]"#.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let message: serde_json::Value =
            serde_json::from_str(&teams_workflows_message(&notification).expect("a card"))
                .expect("JSON");
        assert_eq!(message["type"], "message");
        let attachment = &message["attachments"][0];
        assert_eq!(
            attachment["contentType"],
            "application/vnd.microsoft.card.adaptive"
        );
        assert_eq!(
            attachment["content"],
            serde_json::json!({
                "type": "AdaptiveCard",
                "version": "1.4",
                "body": [
                    {"type": "TextBlock", "text": "Aborted", "size": "Large", "weight": "Bolder", "color": "Attention", "wrap": true},
                    {"type": "TextBlock", "text": "Rollout web has been aborted.", "wrap": true},
                    {"type": "FactSet", "facts": [{"title": "namespace", "value": "shop"}, {"title": "replicas", "value": "4"}]},
                    {"type": "FactSet", "facts": [{"title": "revision", "value": "2"}]}
                ],
                "actions": [{"type": "Action.OpenUrl", "title": "Open", "url": "https://argo.example.com/web"}]
            })
        );
        notification
            .teams_workflows
            .as_mut()
            .expect("set")
            .adaptive_card = r#"{"type": "AdaptiveCard", "version": "1.5", "body": []}"#.into();
        let message: serde_json::Value =
            serde_json::from_str(&teams_workflows_message(&notification).expect("as written"))
                .expect("JSON");
        assert_eq!(message["attachments"][0]["content"]["version"], "1.5");
    }

    #[test]
    fn a_teams_workflows_url_must_be_power_automates_over_https() {
        for good in [
            "https://prod-1.westus.logic.azure.com.api.powerautomate.com/workflows/x",
            "https://x.webhook.office.com/workflows/abc",
            "http://127.0.0.1:8080/powerautomate/hook",
        ] {
            assert!(check_workflows_url(good).is_ok(), "{good}");
        }
        for bad in [
            "http://api.powerautomate.com/x",
            "https://x.webhook.office.com/webhookb2/abc",
            "not a url",
        ] {
            assert!(check_workflows_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_teams_message_is_argos_message_card_or_the_template_as_written() {
        use super::super::template::TeamsSpec;
        let mut notification = Notification {
            message: "Rollout web has been aborted.".into(),
            ..Default::default()
        };
        let card: serde_json::Value =
            serde_json::from_str(&teams_message(&notification).expect("a card")).expect("JSON");
        assert_eq!(
            card,
            serde_json::json!({
                "@type": "MessageCard",
                "context": "https://schema.org/extensions",
                "title": "",
                "summary": "",
                "text": "Rollout web has been aborted."
            })
        );
        notification.teams = Some(TeamsSpec {
            title: "Aborted".into(),
            theme_color: "#FF0000".into(),
            sections: r#"[{"activityTitle": "web"}]"#.into(),
            facts: r#"[{"name": "namespace", "value": "shop"}]"#.into(),
            potential_action: r#"[{"@type": "OpenUri", "name": "Open"}]"#.into(),
            ..Default::default()
        });
        let card: serde_json::Value =
            serde_json::from_str(&teams_message(&notification).expect("a card")).expect("JSON");
        assert_eq!(card["title"], "Aborted");
        assert_eq!(card["themeColor"], "#FF0000");
        assert_eq!(
            card["sections"],
            serde_json::json!([
                {"activityTitle": "web"},
                {"facts": [{"name": "namespace", "value": "shop"}]}
            ])
        );
        assert_eq!(card["potentialAction"][0]["name"], "Open");
        notification.teams.as_mut().expect("set").facts = "{not json".into();
        let error = teams_message(&notification).expect_err("refused");
        assert!(error.to_string().contains("teams.facts"), "{error}");
        notification.teams.as_mut().expect("set").template = r#"{"type": "message"}"#.into();
        assert_eq!(
            teams_message(&notification).expect("as written"),
            r#"{"type": "message"}"#
        );
    }
}
