//! Notification templates: Go template text (rendered with the gtmpl crate) in the fields
//! Argo's templates have (`message`, `email.subject`, `slack.attachments|blocks`,
//! `webhook.<service>.method|path|body`, `pagerdutyv2.*`), over Argo's variables: `.rollout` (the Rollout as
//! JSON), `.recipient` and `.time` (`.time.Now`), with the sprig functions Argo's built-in
//! templates use (`add`, `sub`, `mul`, `upper`, `lower`, `trim`, `quote`, `default`, `toJson`).

use std::collections::{BTreeMap, HashMap};

use gtmpl::{Context, Func, FuncError, Value};
use serde::Deserialize;

/// A template as written in `template.<name>`: every field Go template text.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct TemplateSpec {
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub email: Option<EmailSpec>,
    #[serde(default)]
    pub slack: Option<SlackSpec>,
    #[serde(default)]
    pub webhook: BTreeMap<String, WebhookSpec>,
    #[serde(default)]
    pub pagerdutyv2: Option<PagerDutySpec>,
}

/// `pagerdutyv2`: the Events API v2 payload fields Argo's template has.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PagerDutySpec {
    #[serde(default)]
    pub summary: String,
    #[serde(default)]
    pub severity: String,
    #[serde(default)]
    pub source: String,
    #[serde(default)]
    pub component: String,
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub class: String,
    #[serde(default)]
    pub url: String,
    #[serde(default)]
    pub dedup_key: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct EmailSpec {
    #[serde(default)]
    pub subject: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct SlackSpec {
    #[serde(default)]
    pub attachments: String,
    #[serde(default)]
    pub blocks: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct WebhookSpec {
    #[serde(default)]
    pub method: String,
    #[serde(default)]
    pub path: String,
    #[serde(default)]
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
}

impl TemplateSpec {
    /// Parses `template.<name>`'s YAML and checks every field parses as a Go template.
    pub fn parse(value: &str) -> Result<Self, String> {
        let spec: Self = serde_saphyr::from_str(value)
            .map_err(|e| format!("not a template (message, email, slack, webhook): {e}"))?;
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

/// The variables a template sees: `.rollout`, `.recipient` and `.time`.
pub fn variables(rollout: &serde_json::Value, recipient: &str) -> Value {
    let mut time = HashMap::new();
    time.insert(
        "Now".to_string(),
        Value::Function(gtmpl_value::Function { f: now }),
    );
    let mut vars = HashMap::new();
    vars.insert("rollout".to_string(), from_json(rollout));
    vars.insert("recipient".to_string(), Value::from(recipient));
    vars.insert("time".to_string(), Value::Map(time));
    Value::Map(vars)
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
}
