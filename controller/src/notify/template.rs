//! Notification templates: Go template text (rendered with the gtmpl crate) in the fields
//! Argo's templates have (`message`, `email.subject`, `slack.attachments|blocks`,
//! `webhook.<service>.method|path|body`, `pagerdutyv2.*`, `teams.*`), over Argo's variables:
//! `.rollout` (the Rollout as JSON), `.recipient`, `.serviceType`, `.time` (`.time.Now`),
//! `.secrets` (the notification Secret) and `.analysisRuns` (the current revision's runs), with the sprig functions Argo's built-in
//! templates use (`add`, `sub`, `mul`, `upper`, `lower`, `trim`, `quote`, `default`, `toJson`).

use std::collections::{BTreeMap, HashMap};

use gtmpl::{Context, Func, FuncError, Value};
use serde::{Deserialize, Serialize};

/// A template as written in `template.<name>`: every field Go template text.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct TemplateSpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<EmailSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slack: Option<SlackSpec>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub webhook: BTreeMap<String, WebhookSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pagerdutyv2: Option<PagerDutySpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teams: Option<TeamsSpec>,
    #[serde(
        default,
        rename = "teams-workflows",
        skip_serializing_if = "Option::is_none"
    )]
    pub teams_workflows: Option<TeamsSpec>,
}

/// `teams`: Argo's Microsoft Teams fields. `template` is a whole message (sent as written);
/// otherwise a MessageCard is built from the others (`facts`, `sections` and
/// `potentialAction` are JSON lists).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TeamsSpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub template: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub title: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub summary: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub text: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub theme_color: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub facts: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sections: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub potential_action: String,
    /// `teams-workflows` only: a whole Adaptive Card, sent as written in Teams' message
    /// envelope.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub adaptive_card: String,
}

impl TeamsSpec {
    fn fields(&self) -> [(&'static str, &String); 9] {
        [
            ("template", &self.template),
            ("title", &self.title),
            ("summary", &self.summary),
            ("text", &self.text),
            ("themeColor", &self.theme_color),
            ("facts", &self.facts),
            ("sections", &self.sections),
            ("potentialAction", &self.potential_action),
            ("adaptiveCard", &self.adaptive_card),
        ]
    }

    fn fields_mut(&mut self) -> [&mut String; 9] {
        [
            &mut self.template,
            &mut self.title,
            &mut self.summary,
            &mut self.text,
            &mut self.theme_color,
            &mut self.facts,
            &mut self.sections,
            &mut self.potential_action,
            &mut self.adaptive_card,
        ]
    }
}

/// `pagerdutyv2`: the Events API v2 payload fields Argo's template has.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PagerDutySpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub summary: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub severity: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub component: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub class: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub url: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub dedup_key: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct EmailSpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subject: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct SlackSpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub attachments: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub blocks: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct WebhookSpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub method: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub body: String,
}

/// A rendered notification: what the services send. Several templates of one trigger
/// condition render into one, a later template's non-empty fields winning.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Notification {
    pub message: String,
    pub email_subject: String,
    pub slack_attachments: String,
    pub slack_blocks: String,
    pub webhook: BTreeMap<String, WebhookSpec>,
    pub pagerduty: Option<PagerDutySpec>,
    pub teams: Option<TeamsSpec>,
    pub teams_workflows: Option<TeamsSpec>,
}

impl Notification {
    /// The notification as Argo's engine prints it (its console service): the message and each
    /// service's fields under Argo's names, empty ones left out.
    pub fn document(&self) -> serde_json::Value {
        let spec = TemplateSpec {
            message: self.message.clone(),
            email: (!self.email_subject.is_empty()).then(|| EmailSpec {
                subject: self.email_subject.clone(),
            }),
            slack: (!self.slack_attachments.is_empty() || !self.slack_blocks.is_empty()).then(
                || SlackSpec {
                    attachments: self.slack_attachments.clone(),
                    blocks: self.slack_blocks.clone(),
                },
            ),
            webhook: self.webhook.clone(),
            pagerdutyv2: self.pagerduty.clone(),
            teams: self.teams.clone(),
            teams_workflows: self.teams_workflows.clone(),
        };
        serde_json::to_value(spec).unwrap_or_default()
    }
}

impl TemplateSpec {
    /// The first line of the message (at most 100 characters), or of the template as JSON when
    /// it has no message: what Argo's `template get` shows.
    pub fn preview(&self) -> String {
        let text = if self.message.is_empty() {
            serde_json::to_string(self).unwrap_or_default()
        } else {
            self.message.clone()
        };
        let line = text.lines().next().unwrap_or_default();
        if line.chars().count() > 100 {
            format!("{}...", line.chars().take(99).collect::<String>())
        } else {
            line.to_string()
        }
    }

    /// Parses `template.<name>`'s YAML and checks every field parses as a Go template.
    pub fn parse(value: &str) -> Result<Self, String> {
        let spec: Self = serde_saphyr::from_str(value).map_err(|e| {
            format!("not a template (message, email, slack, teams, pagerdutyv2, webhook): {e}")
        })?;
        for (field, text) in spec.fields() {
            parse_template(&text).map_err(|e| format!("`{field}` is not a Go template: {e}"))?;
        }
        Ok(spec)
    }

    fn fields(&self) -> Vec<(String, String)> {
        let mut fields = vec![("message".to_string(), self.message.clone())];
        if let Some(email) = &self.email {
            fields.push(("email.subject".into(), email.subject.clone()));
        }
        if let Some(slack) = &self.slack {
            fields.push(("slack.attachments".into(), slack.attachments.clone()));
            fields.push(("slack.blocks".into(), slack.blocks.clone()));
        }
        for (service, webhook) in &self.webhook {
            fields.push((format!("webhook.{service}.path"), webhook.path.clone()));
            fields.push((format!("webhook.{service}.body"), webhook.body.clone()));
        }
        if let Some(pagerduty) = &self.pagerdutyv2 {
            for (field, text) in pagerduty.fields() {
                fields.push((format!("pagerdutyv2.{field}"), text.clone()));
            }
        }
        for (section, teams) in [
            ("teams", &self.teams),
            ("teams-workflows", &self.teams_workflows),
        ] {
            if let Some(teams) = teams {
                for (field, text) in teams.fields() {
                    fields.push((format!("{section}.{field}"), text.clone()));
                }
            }
        }
        fields
    }

    /// Renders every field into `into` over `vars`.
    pub fn render_into(&self, vars: &Value, into: &mut Notification) -> Result<(), String> {
        let render =
            |field: &str, text: &str| render(text, vars).map_err(|e| format!("`{field}`: {e}"));
        let set = |target: &mut String, value: String| {
            if !value.is_empty() {
                *target = value;
            }
        };
        set(&mut into.message, render("message", &self.message)?);
        if let Some(email) = &self.email {
            set(
                &mut into.email_subject,
                render("email.subject", &email.subject)?,
            );
        }
        if let Some(slack) = &self.slack {
            set(
                &mut into.slack_attachments,
                render("slack.attachments", &slack.attachments)?,
            );
            set(
                &mut into.slack_blocks,
                render("slack.blocks", &slack.blocks)?,
            );
        }
        if let Some(pagerduty) = &self.pagerdutyv2 {
            let mut rendered = PagerDutySpec::default();
            for ((field, text), target) in pagerduty.fields().into_iter().zip(rendered.fields_mut())
            {
                *target = render(&format!("pagerdutyv2.{field}"), text)?;
            }
            into.pagerduty = Some(rendered);
        }
        for (section, teams, rendered) in [
            ("teams", &self.teams, &mut into.teams),
            (
                "teams-workflows",
                &self.teams_workflows,
                &mut into.teams_workflows,
            ),
        ] {
            let Some(teams) = teams else {
                continue;
            };
            // As Argo's engine: a later template's non-empty field wins, field by field.
            let rendered = rendered.get_or_insert_with(TeamsSpec::default);
            for ((field, text), target) in teams.fields().into_iter().zip(rendered.fields_mut()) {
                set(target, render(&format!("{section}.{field}"), text)?);
            }
        }
        for (service, webhook) in &self.webhook {
            into.webhook.insert(
                service.clone(),
                WebhookSpec {
                    method: webhook.method.clone(),
                    path: render(&format!("webhook.{service}.path"), &webhook.path)?,
                    body: render(&format!("webhook.{service}.body"), &webhook.body)?,
                },
            );
        }
        Ok(())
    }
}

impl PagerDutySpec {
    fn fields(&self) -> [(&'static str, &String); 8] {
        [
            ("summary", &self.summary),
            ("severity", &self.severity),
            ("source", &self.source),
            ("component", &self.component),
            ("group", &self.group),
            ("class", &self.class),
            ("url", &self.url),
            ("dedupKey", &self.dedup_key),
        ]
    }

    fn fields_mut(&mut self) -> [&mut String; 8] {
        [
            &mut self.summary,
            &mut self.severity,
            &mut self.source,
            &mut self.component,
            &mut self.group,
            &mut self.class,
            &mut self.url,
            &mut self.dedup_key,
        ]
    }
}

/// The variables a template sees besides `.rollout` and `.recipient`, as Argo Rollouts gives
/// them: `.serviceType` (the service's name), `.secrets` (the notification Secret's values)
/// and `.analysisRuns` (the AnalysisRuns of the Rollout's current revision, newest first; nil
/// when it has none).
#[derive(Clone, Debug, Default)]
pub struct ExtraVariables<'a> {
    pub service_type: &'a str,
    pub secrets: Option<&'a BTreeMap<String, super::config::Sensitive>>,
    pub analysis_runs: Option<&'a serde_json::Value>,
}

/// The variables a template sees: `.rollout`, `.recipient` and `.time`.
pub fn variables(rollout: &serde_json::Value, recipient: &str) -> Value {
    variables_with(rollout, recipient, &ExtraVariables::default())
}

/// The variables a template sees: `.rollout`, `.recipient`, `.time`, and `extra`'s.
pub fn variables_with(
    rollout: &serde_json::Value,
    recipient: &str,
    extra: &ExtraVariables<'_>,
) -> Value {
    let mut time = HashMap::new();
    time.insert(
        "Now".to_string(),
        Value::Function(gtmpl_value::Function { f: now }),
    );
    let mut vars = HashMap::new();
    vars.insert("rollout".to_string(), from_json(rollout));
    vars.insert("recipient".to_string(), Value::from(recipient));
    vars.insert("serviceType".to_string(), Value::from(extra.service_type));
    vars.insert("time".to_string(), Value::Map(time));
    let secrets = extra
        .secrets
        .into_iter()
        .flatten()
        .map(|(key, value)| (key.clone(), Value::from(value.0.as_str())))
        .collect();
    vars.insert("secrets".to_string(), Value::Map(secrets));
    vars.insert(
        "analysisRuns".to_string(),
        extra.analysis_runs.map_or(Value::Nil, from_json),
    );
    Value::Map(vars)
}

/// Whether any field of `specs` mentions `.analysisRuns` (only then are the runs
/// read for it).
pub fn mentions_analysis_runs<'a>(specs: impl IntoIterator<Item = &'a TemplateSpec>) -> bool {
    specs.into_iter().any(|spec| {
        spec.fields()
            .iter()
            .any(|(_, text)| text.contains("analysisRuns"))
    })
}

/// A JSON value as a template sees it: objects are maps (a missing key is `<no value>`, as
/// in Go), numbers keep integer or float.
pub fn from_json(value: &serde_json::Value) -> Value {
    match value {
        serde_json::Value::Null => Value::Nil,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(items) => Value::Array(items.iter().map(from_json).collect()),
        serde_json::Value::Object(map) => {
            Value::Map(map.iter().map(|(k, v)| (k.clone(), from_json(v))).collect())
        }
    }
}

fn to_json(value: &Value) -> serde_json::Value {
    match value {
        Value::NoValue | Value::Nil | Value::Function(_) => serde_json::Value::Null,
        Value::Bool(b) => serde_json::Value::Bool(*b),
        Value::String(s) => serde_json::Value::String(s.clone()),
        Value::Number(n) => n
            .as_i64()
            .map(serde_json::Value::from)
            .or_else(|| n.as_u64().map(serde_json::Value::from))
            .or_else(|| n.as_f64().map(serde_json::Value::from))
            .unwrap_or(serde_json::Value::Null),
        Value::Array(items) => serde_json::Value::Array(items.iter().map(to_json).collect()),
        Value::Object(map) | Value::Map(map) => {
            let sorted: BTreeMap<&String, serde_json::Value> =
                map.iter().map(|(k, v)| (k, to_json(v))).collect();
            serde_json::Value::Object(sorted.into_iter().map(|(k, v)| (k.clone(), v)).collect())
        }
    }
}

const FUNCTIONS: &[(&str, Func)] = &[
    ("add", add as Func),
    ("sub", sub as Func),
    ("mul", mul as Func),
    ("upper", upper as Func),
    ("lower", lower as Func),
    ("trim", trim as Func),
    ("quote", quote as Func),
    ("default", default as Func),
    ("toJson", to_json_func as Func),
];

fn parse_template(text: &str) -> Result<gtmpl::Template, String> {
    let mut template = gtmpl::Template::default();
    template.add_funcs(FUNCTIONS);
    template.parse(text).map_err(|e| e.to_string())?;
    Ok(template)
}

/// Renders one Go template over `vars`.
pub fn render(text: &str, vars: &Value) -> Result<String, String> {
    if text.is_empty() {
        return Ok(String::new());
    }
    let template = parse_template(text)?;
    template
        .render(&Context::from(vars.clone()))
        .map_err(|e| e.to_string())
}

fn now(_: &[Value]) -> Result<Value, FuncError> {
    Ok(Value::from(k8s_openapi::jiff::Timestamp::now().to_string()))
}

fn integer(value: &Value, function: &str) -> Result<i64, FuncError> {
    match value {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_f64().map(|f| f as i64))
            .ok_or_else(|| FuncError::Generic(format!("{function}: {n} is not a number"))),
        Value::String(s) => s
            .trim()
            .parse()
            .map_err(|_| FuncError::Generic(format!("{function}: {s:?} is not a number"))),
        Value::NoValue | Value::Nil => Ok(0),
        other => Err(FuncError::Generic(format!(
            "{function}: {other} is not a number"
        ))),
    }
}

fn fold(
    args: &[Value],
    function: &str,
    op: fn(i64, i64) -> Option<i64>,
) -> Result<Value, FuncError> {
    let (first, rest) = args
        .split_first()
        .ok_or_else(|| FuncError::AtLeastXArgs(function.to_string(), 1))?;
    let mut total = integer(first, function)?;
    for arg in rest {
        total = op(total, integer(arg, function)?)
            .ok_or_else(|| FuncError::Generic(format!("{function}: overflow")))?;
    }
    Ok(Value::from(total))
}

fn add(args: &[Value]) -> Result<Value, FuncError> {
    fold(args, "add", i64::checked_add)
}

fn sub(args: &[Value]) -> Result<Value, FuncError> {
    fold(args, "sub", i64::checked_sub)
}

fn mul(args: &[Value]) -> Result<Value, FuncError> {
    fold(args, "mul", i64::checked_mul)
}

fn one_string(args: &[Value], function: &str) -> Result<String, FuncError> {
    match args {
        [Value::NoValue | Value::Nil] => Ok(String::new()),
        [value] => Ok(value.to_string()),
        _ => Err(FuncError::ExactlyXArgs(function.to_string(), 1)),
    }
}

fn upper(args: &[Value]) -> Result<Value, FuncError> {
    Ok(Value::from(one_string(args, "upper")?.to_uppercase()))
}

fn lower(args: &[Value]) -> Result<Value, FuncError> {
    Ok(Value::from(one_string(args, "lower")?.to_lowercase()))
}

fn trim(args: &[Value]) -> Result<Value, FuncError> {
    Ok(Value::from(one_string(args, "trim")?.trim().to_string()))
}

fn quote(args: &[Value]) -> Result<Value, FuncError> {
    let text = one_string(args, "quote")?;
    Ok(Value::from(serde_json::Value::String(text).to_string()))
}

/// sprig's `default DEFAULT VALUE`: VALUE unless it is empty.
fn default(args: &[Value]) -> Result<Value, FuncError> {
    match args {
        [fallback, value] => Ok(if gtmpl_truthy(value) {
            value.clone()
        } else {
            fallback.clone()
        }),
        _ => Err(FuncError::ExactlyXArgs("default".to_string(), 2)),
    }
}

fn gtmpl_truthy(value: &Value) -> bool {
    match value {
        Value::Bool(b) => *b,
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) | Value::Map(o) => !o.is_empty(),
        Value::Function(_) => true,
        Value::NoValue | Value::Nil => false,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
    }
}

fn to_json_func(args: &[Value]) -> Result<Value, FuncError> {
    match args {
        [value] => Ok(Value::from(to_json(value).to_string())),
        _ => Err(FuncError::ExactlyXArgs("toJson".to_string(), 1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rollout() -> serde_json::Value {
        json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {
                "replicas": 4,
                "strategy": {"canary": {"steps": [{"setWeight": 25}, {"pause": {}}, {"setWeight": 50}]}},
                "template": {"spec": {"containers": [
                    {"name": "web", "image": "registry.example.com/web:1.1.0"},
                    {"name": "sidecar", "image": "envoy:1.30"}
                ]}}
            },
            "status": {"currentStepIndex": 1, "phase": "Paused"}
        })
    }

    fn rendered(text: &str) -> String {
        render(text, &variables(&rollout(), "my-channel")).expect("renders")
    }

    // The constructs of Argo's built-in templates (argo-rollouts manifests/notifications):
    // field paths, `add`, `len`, `if` on a missing strategy, and `range $index, $c`.
    #[test]
    fn argo_builtin_template_constructs_render() {
        assert_eq!(
            rendered("Rollout {{.rollout.metadata.name}} has been aborted."),
            "Rollout web has been aborted."
        );
        assert_eq!(
            rendered(
                "step number {{ add .rollout.status.currentStepIndex 1}}/{{len .rollout.spec.strategy.canary.steps}} has been completed."
            ),
            "step number 2/3 has been completed."
        );
        assert_eq!(
            rendered(
                "{{if .rollout.spec.strategy.blueGreen}}BlueGreen{{end}}{{if .rollout.spec.strategy.canary}}Canary{{end}}"
            ),
            "Canary"
        );
        let fields = rendered(
            "[{{range $index, $c := .rollout.spec.template.spec.containers}}{{if $index}},{{end}}{\"title\": \"{{$c.name}}\", \"value\": \"{{$c.image}}\"}{{end}}]",
        );
        let parsed: serde_json::Value = serde_json::from_str(&fields).expect("JSON");
        assert_eq!(
            parsed,
            json!([
                {"title": "web", "value": "registry.example.com/web:1.1.0"},
                {"title": "sidecar", "value": "envoy:1.30"}
            ])
        );
        assert_eq!(
            rendered(
                "Scaling Rollout {{.rollout.metadata.name}}'s replicaset to {{.rollout.spec.replicas}}."
            ),
            "Scaling Rollout web's replicaset to 4."
        );
        assert_eq!(rendered("to {{.recipient}}"), "to my-channel");
    }

    #[test]
    fn time_now_and_sprig_functions_render() {
        let now = rendered("{{.time.Now}}");
        assert!(now.parse::<k8s_openapi::jiff::Timestamp>().is_ok(), "{now}");
        assert_eq!(rendered("{{upper .rollout.metadata.name}}"), "WEB");
        assert_eq!(
            rendered("{{.rollout.status.phase | lower | quote}}"),
            "\"paused\""
        );
        assert_eq!(
            rendered("{{default \"none\" .rollout.status.message}}"),
            "none"
        );
        assert_eq!(rendered("{{sub 10 .rollout.spec.replicas}}"), "6");
        assert_eq!(
            rendered("{{toJson .rollout.metadata}}"),
            r#"{"name":"web","namespace":"shop"}"#
        );
    }

    #[test]
    fn a_whole_template_renders_into_one_notification() {
        let spec = TemplateSpec::parse(
            "message: Rollout {{.rollout.metadata.name}} has been aborted.\nemail:\n  subject: Aborted {{.rollout.metadata.name}}\nslack:\n  attachments: '[{\"title\": \"{{ .rollout.metadata.name}}\"}]'\nwebhook:\n  ops:\n    method: POST\n    path: /rollouts/{{.rollout.metadata.namespace}}\n    body: '{\"rollout\": \"{{.rollout.metadata.name}}\"}'\n",
        )
        .expect("parses");
        let mut notification = Notification::default();
        spec.render_into(&variables(&rollout(), ""), &mut notification)
            .expect("renders");
        assert_eq!(notification.message, "Rollout web has been aborted.");
        assert_eq!(notification.email_subject, "Aborted web");
        assert_eq!(notification.slack_attachments, r#"[{"title": "web"}]"#);
        let ops = &notification.webhook["ops"];
        assert_eq!(
            (ops.method.as_str(), ops.path.as_str()),
            ("POST", "/rollouts/shop")
        );
        assert_eq!(ops.body, r#"{"rollout": "web"}"#);
    }

    #[test]
    fn a_pagerduty_section_renders_every_field() {
        let spec = TemplateSpec::parse(
            "message: m\npagerdutyv2:\n  summary: Rollout {{.rollout.metadata.name}} is aborted.\n  severity: critical\n  source: '{{.rollout.metadata.namespace}}/{{.rollout.metadata.name}}'\n  dedupKey: '{{.rollout.metadata.name}}-abort'\n",
        )
        .expect("parses");
        let mut notification = Notification::default();
        spec.render_into(&variables(&rollout(), ""), &mut notification)
            .expect("renders");
        let pagerduty = notification.pagerduty.expect("a pagerdutyv2 section");
        assert_eq!(pagerduty.summary, "Rollout web is aborted.");
        assert_eq!(pagerduty.severity, "critical");
        assert_eq!(pagerduty.source, "shop/web");
        assert_eq!(pagerduty.dedup_key, "web-abort");
        assert_eq!(pagerduty.component, "");
    }

    #[test]
    fn a_template_that_does_not_parse_names_its_field() {
        let error = TemplateSpec::parse("message: ok\nslack:\n  blocks: '{{ .rollout'\n")
            .expect_err("refused");
        assert!(error.contains("slack.blocks"), "{error}");
    }

    #[test]
    fn a_function_given_bad_input_is_an_error_not_a_panic() {
        let error = render(
            "{{add .rollout.metadata.name 1}}",
            &variables(&rollout(), ""),
        )
        .expect_err("refused");
        assert!(error.contains("add"), "{error}");
    }

    #[test]
    fn a_teams_section_renders_each_field_and_a_later_template_wins_field_by_field() {
        let first = TemplateSpec::parse(
            "message: m\nteams:\n  title: Rollout {{.rollout.metadata.name}} aborted\n  themeColor: '#FF0000'\n  facts: '[{\"name\": \"namespace\", \"value\": \"{{.rollout.metadata.namespace}}\"}]'\n",
        )
        .expect("parses");
        let second = TemplateSpec::parse("teams:\n  summary: '{{.rollout.metadata.name}}'\n")
            .expect("parses");
        let mut notification = Notification::default();
        for spec in [&first, &second] {
            spec.render_into(&variables(&rollout(), ""), &mut notification)
                .expect("renders");
        }
        let teams = notification.teams.expect("a teams section");
        assert_eq!(teams.title, "Rollout web aborted");
        assert_eq!(teams.theme_color, "#FF0000");
        assert_eq!(teams.summary, "web");
        assert_eq!(teams.facts, r#"[{"name": "namespace", "value": "shop"}]"#);
        let workflows = TemplateSpec::parse(
            "teams-workflows:\n  title: '{{.rollout.metadata.name}}'\n  adaptiveCard: '{\"n\": \"{{.rollout.metadata.name}}\"}'\n",
        )
        .expect("parses");
        let mut rendered = Notification::default();
        workflows
            .render_into(&variables(&rollout(), ""), &mut rendered)
            .expect("renders");
        let flows = rendered.teams_workflows.expect("a teams-workflows section");
        assert_eq!(flows.title, "web");
        assert_eq!(flows.adaptive_card, r#"{"n": "web"}"#);
        let error =
            TemplateSpec::parse("teams:\n  sections: '{{ .rollout'\n").expect_err("refused");
        assert!(error.contains("teams.sections"), "{error}");
    }

    #[test]
    fn templates_see_the_service_type_secrets_and_analysis_runs_as_in_argo() {
        let secrets: BTreeMap<String, super::super::config::Sensitive> = [(
            "grafana-url".to_string(),
            super::super::config::Sensitive("https://grafana.example.com".into()),
        )]
        .into_iter()
        .collect();
        let runs = json!([
            {"metadata": {"name": "web-2-1"}, "status": {"phase": "Failed", "message": "error rate 7%"}},
            {"metadata": {"name": "web-2-0"}, "status": {"phase": "Successful"}}
        ]);
        let extra = ExtraVariables {
            service_type: "slack",
            secrets: Some(&secrets),
            analysis_runs: Some(&runs),
        };
        let vars = variables_with(&rollout(), "dev", &extra);
        assert_eq!(
            render("{{.serviceType}}:{{.recipient}}", &vars).expect("renders"),
            "slack:dev"
        );
        assert_eq!(
            render("{{index .secrets \"grafana-url\"}}/d/web", &vars).expect("renders"),
            "https://grafana.example.com/d/web"
        );
        assert_eq!(
            render(
                "{{range .analysisRuns}}{{.metadata.name}}={{.status.phase}};{{end}}",
                &vars
            )
            .expect("renders"),
            "web-2-1=Failed;web-2-0=Successful;"
        );
        assert_eq!(
            render(
                "{{if .analysisRuns}}runs{{else}}none{{end}}",
                &variables(&rollout(), "")
            )
            .expect("renders"),
            "none"
        );
    }

    #[test]
    fn a_notification_prints_under_argos_field_names_and_a_template_previews_its_first_line() {
        let spec = TemplateSpec::parse(
            "message: |\n  Rollout {{.rollout.metadata.name}} aborted.\n  Second line.\nemail:\n  subject: S\nteams:\n  themeColor: '#FF0000'\n",
        )
        .expect("parses");
        assert_eq!(
            spec.preview(),
            "Rollout {{.rollout.metadata.name}} aborted."
        );
        let mut notification = Notification::default();
        spec.render_into(&variables(&rollout(), ""), &mut notification)
            .expect("renders");
        assert_eq!(
            notification.document(),
            json!({
                "message": "Rollout web aborted.\nSecond line.\n",
                "email": {"subject": "S"},
                "teams": {"themeColor": "#FF0000"}
            })
        );
        let no_message = TemplateSpec::parse("email:\n  subject: only\n").expect("parses");
        assert_eq!(no_message.preview(), r#"{"email":{"subject":"only"}}"#);
    }
}
