//! `notifications template get|notify` and `notifications trigger get|run`, as Argo's plugin
//! offers them (from its notifications engine): print the configured templates and triggers,
//! render a template against a live Rollout (or a Rollout file) and print it or send it to
//! recipients, and evaluate a trigger's conditions against a Rollout.
//!
//! The configuration is Argo's ConfigMap and Secret in the namespace (`-n`), or files
//! (`--config-map`, `--secret`, `--secret :empty`), read and rendered with the controller's own
//! notification code, so what is printed is what the controller would send.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use rollouts_controller::notify::{
    self, ExtraVariables, HttpClients, Notification, NotificationConfig, TemplateSpec,
    TriggerCondition,
};
use serde_json::Value;

use crate::args::{KubeFlags, ObjectFormat};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::verbs::render;

/// `notifications` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Notification templates: print them, or render one for a rollout and send it.
    #[command(subcommand)]
    Template(TemplateCommand),
    /// Notification triggers: print them, or evaluate one against a rollout.
    #[command(subcommand)]
    Trigger(TriggerCommand),
}

/// `notifications template` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum TemplateCommand {
    /// Print the configured templates (the ConfigMap's and the built-in ones).
    Get(GetArgs),
    /// Render template NAME for rollout ROLLOUT (a name, or a file) and send it to each
    /// recipient; `console:stdout` (the default) prints it.
    Notify(NotifyArgs),
}

/// `notifications trigger` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum TriggerCommand {
    /// Print the configured triggers (the ConfigMap's and the built-in ones).
    Get(GetArgs),
    /// Evaluate each condition of trigger NAME against rollout ROLLOUT (a name, or a file).
    Run(RunArgs),
}

/// Where the configuration is read from.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct Source {
    /// A file holding the notification ConfigMap, instead of the one in the namespace.
    #[arg(long = "config-map", global = true)]
    pub config_map: Option<PathBuf>,
    /// A file holding the notification Secret instead of the one in the namespace; `:empty`
    /// for none.
    #[arg(long, global = true)]
    pub secret: Option<String>,
}

/// How `get` prints.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GetFormat {
    /// A table.
    #[default]
    Wide,
    /// Names only.
    Name,
    Json,
    Yaml,
}

/// `get` arguments.
#[derive(Debug, clap::Args)]
pub struct GetArgs {
    /// Print only this one.
    pub name: Option<String>,
    #[arg(short = 'o', long, value_enum, default_value = "wide")]
    pub output: GetFormat,
    #[command(flatten)]
    pub source: Source,
}

/// `template notify` arguments.
#[derive(Debug, clap::Args)]
pub struct NotifyArgs {
    /// The template.
    pub template: String,
    /// The rollout: its name, or a file holding it.
    pub rollout: String,
    /// `<service>[:<recipient>]`, as often as needed; `console:stdout` prints the notification.
    #[arg(long = "recipient", default_value = "console:stdout")]
    pub recipients: Vec<String>,
    #[command(flatten)]
    pub source: Source,
}

/// `trigger run` arguments.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The trigger.
    pub trigger: String,
    /// The rollout: its name, or a file holding it.
    pub rollout: String,
    #[command(flatten)]
    pub source: Source,
}

/// Runs a `notifications` subcommand; connects to the cluster only when it reads from it.
pub async fn run(flags: &KubeFlags, command: &Command) -> Result<()> {
    let mut cluster = None;
    match command {
        Command::Template(TemplateCommand::Get(args)) => {
            let config = load_config(flags, &mut cluster, &args.source).await?;
            print!("{}", templates(&config, args.name.as_deref(), args.output)?);
        }
        Command::Trigger(TriggerCommand::Get(args)) => {
            let config = load_config(flags, &mut cluster, &args.source).await?;
            print!("{}", triggers(&config, args.name.as_deref(), args.output)?);
        }
        Command::Template(TemplateCommand::Notify(args)) => {
            let config = load_config(flags, &mut cluster, &args.source).await?;
            let rollout = load_rollout(flags, &mut cluster, &args.rollout).await?;
            let spec = notify::template(&config, &args.template).ok_or_else(|| {
                Error::Invalid(format!(
                    "template {:?} is not configured (fix: one of {})",
                    args.template,
                    notify::template_names(&config).join(", ")
                ))
            })?;
            let runs = if notify::mentions_analysis_runs([&spec]) {
                let cluster = connected(flags, &mut cluster).await?;
                notify::analysis_runs(&cluster.client, &cluster.namespace, &rollout).await
            } else {
                None
            };
            let mut http = None;
            for recipient in &args.recipients {
                let (service, to) = recipient.split_once(':').unwrap_or((recipient, ""));
                let notification = render_for(&config, &spec, &rollout, service, to, &runs)
                    .map_err(|e| Error::Invalid(format!("template {:?}: {e}", args.template)))?;
                if service == "console" {
                    print!("{}", render(&notification.document(), ObjectFormat::Yaml)?);
                    continue;
                }
                let configured = config.services.get(service).ok_or_else(|| {
                    Error::Invalid(format!(
                        "recipient {recipient:?}: service {service:?} is not configured (fix: one of console, {})",
                        config.services.keys().cloned().collect::<Vec<_>>().join(", ")
                    ))
                })?;
                if http.is_none() {
                    http = Some(HttpClients::new().map_err(|e| {
                        Error::Invalid(format!("no HTTP client to send with: {e}"))
                    })?);
                }
                if let Some(http) = &http {
                    notify::send(http, service, configured, &notification, to)
                        .await
                        .map_err(|e| {
                            Error::Invalid(format!("failed to notify {recipient:?}: {e}"))
                        })?;
                }
                println!("notification sent to {recipient}");
            }
        }
        Command::Trigger(TriggerCommand::Run(args)) => {
            let config = load_config(flags, &mut cluster, &args.source).await?;
            let rollout = load_rollout(flags, &mut cluster, &args.rollout).await?;
            let conditions =
                notify::trigger_conditions(&config, &args.trigger).ok_or_else(|| {
                    Error::Invalid(format!(
                        "trigger {:?} does not exist (found {})",
                        args.trigger,
                        notify::trigger_names(&config).join(", ")
                    ))
                })?;
            let runs = if conditions.iter().any(|c| c.when.contains("analysisRuns")) {
                let cluster = connected(flags, &mut cluster).await?;
                notify::analysis_runs(&cluster.client, &cluster.namespace, &rollout).await
            } else {
                None
            };
            print!("{}", trigger_results(&conditions, &rollout, runs.as_ref())?);
        }
    }
    Ok(())
}

async fn connected<'a>(flags: &KubeFlags, cluster: &'a mut Option<Cluster>) -> Result<&'a Cluster> {
    if cluster.is_none() {
        *cluster = Some(Cluster::connect(flags).await?);
    }
    cluster
        .as_ref()
        .ok_or_else(|| Error::Invalid("no cluster connection".to_string()))
}

/// The configuration from the files `source` names, else the namespace's ConfigMap and Secret.
/// A key that cannot be used is reported on stderr, as the controller logs it.
async fn load_config(
    flags: &KubeFlags,
    cluster: &mut Option<Cluster>,
    source: &Source,
) -> Result<NotificationConfig> {
    let data = match &source.config_map {
        Some(path) => document_data(path, "ConfigMap", notify::DEFAULT_CONFIGMAP)?,
        None => {
            let cluster = connected(flags, cluster).await?;
            let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
            match api.get_opt(notify::DEFAULT_CONFIGMAP).await {
                Ok(Some(configmap)) => configmap.data.unwrap_or_default(),
                Ok(None) => {
                    return Err(Error::Invalid(format!(
                        "ConfigMap {:?} not found in namespace {:?} (fix: -n the namespace that holds it, or --config-map FILE)",
                        notify::DEFAULT_CONFIGMAP,
                        cluster.namespace
                    )));
                }
                Err(e) => {
                    return Err(Error::Invalid(format!(
                        "cannot read ConfigMap {:?} in namespace {:?}: {e}",
                        notify::DEFAULT_CONFIGMAP,
                        cluster.namespace
                    )));
                }
            }
        }
    };
    let secret = match source.secret.as_deref() {
        Some(":empty") => BTreeMap::new(),
        Some(path) => document_data(Path::new(path), "Secret", notify::DEFAULT_SECRET)?,
        None => {
            let cluster = connected(flags, cluster).await?;
            let api: Api<Secret> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
            match api.get_opt(notify::DEFAULT_SECRET).await {
                Ok(found) => found.map(notify::secret_values).unwrap_or_default(),
                Err(e) => {
                    return Err(Error::Invalid(format!(
                        "cannot read Secret {:?} in namespace {:?}: {e} (fix: --secret FILE, or --secret :empty)",
                        notify::DEFAULT_SECRET,
                        cluster.namespace
                    )));
                }
            }
        }
    };
    let (config, errors) = NotificationConfig::parse(&data, &secret);
    for error in errors {
        eprintln!("warning: {error}");
    }
    Ok(config)
}

/// The `data` (and, for a Secret, `stringData`) of the `kind` called `name` in a YAML file of
/// one or more documents.
fn document_data(path: &Path, kind: &str, name: &str) -> Result<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::ReadFile {
        path: path.display().to_string(),
        source,
    })?;
    documents_data(&text, kind, name)
        .map_err(|reason| Error::Invalid(format!("{}: {reason}", path.display())))
}

fn documents_data(
    text: &str,
    kind: &str,
    name: &str,
) -> std::result::Result<BTreeMap<String, String>, String> {
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(text).map_err(|e| format!("not YAML: {e}"))?;
    let document = documents
        .iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .ok_or_else(|| format!("has no {kind} named {name:?}"))?;
    if kind == "Secret" {
        let secret: Secret = serde_json::from_value(document.clone())
            .map_err(|e| format!("the Secret {name:?} is not a Secret: {e}"))?;
        Ok(notify::secret_values(secret))
    } else {
        let configmap: ConfigMap = serde_json::from_value(document.clone())
            .map_err(|e| format!("the ConfigMap {name:?} is not a ConfigMap: {e}"))?;
        Ok(configmap.data.unwrap_or_default())
    }
}

/// The Rollout from the file `name` names, else the namespace's Rollout of that name, as JSON.
async fn load_rollout(
    flags: &KubeFlags,
    cluster: &mut Option<Cluster>,
    name: &str,
) -> Result<Value> {
    let path = Path::new(name);
    if path.is_file() {
        let text = std::fs::read_to_string(path).map_err(|source| Error::ReadFile {
            path: name.to_string(),
            source,
        })?;
        return serde_saphyr::from_str(&text)
            .map_err(|e| Error::Invalid(format!("{name}: not a Rollout in YAML or JSON: {e}")));
    }
    connected(flags, cluster).await?.rollout_json(name).await
}

fn render_for(
    config: &NotificationConfig,
    spec: &TemplateSpec,
    rollout: &Value,
    service: &str,
    recipient: &str,
    runs: &Option<Value>,
) -> std::result::Result<Notification, String> {
    let extra = ExtraVariables {
        service_type: service,
        secrets: Some(&config.secrets),
        analysis_runs: runs.as_ref(),
    };
    let vars = notify::variables_with(rollout, recipient, &extra);
    let mut notification = Notification::default();
    spec.render_into(&vars, &mut notification)?;
    Ok(notification)
}

/// `template get`'s output.
pub fn templates(
    config: &NotificationConfig,
    name: Option<&str>,
    format: GetFormat,
) -> Result<String> {
    let items: BTreeMap<String, TemplateSpec> = notify::template_names(config)
        .into_iter()
        .filter(|n| name.is_none_or(|wanted| wanted == n))
        .filter_map(|n| notify::template(config, &n).map(|spec| (n, spec)))
        .collect();
    if let Some(wanted) = name
        && items.is_empty()
    {
        return Err(Error::Invalid(format!(
            "template {wanted:?} is not configured"
        )));
    }
    let rows = items
        .iter()
        .map(|(name, spec)| vec![name.clone(), spec.preview()])
        .collect();
    print_items(&items, &["NAME", "PREVIEW"], rows, format)
}

/// `trigger get`'s output: one row per condition.
pub fn triggers(
    config: &NotificationConfig,
    name: Option<&str>,
    format: GetFormat,
) -> Result<String> {
    let items: BTreeMap<String, Vec<TriggerCondition>> = notify::trigger_names(config)
        .into_iter()
        .filter(|n| name.is_none_or(|wanted| wanted == n))
        .filter_map(|n| notify::trigger_conditions(config, &n).map(|c| (n, c)))
        .collect();
    if let Some(wanted) = name
        && items.is_empty()
    {
        return Err(Error::Invalid(format!(
            "trigger {wanted:?} is not configured"
        )));
    }
    let mut rows = Vec::new();
    for (trigger, conditions) in &items {
        for (index, condition) in conditions.iter().enumerate() {
            rows.push(vec![
                if index == 0 {
                    trigger.clone()
                } else {
                    String::new()
                },
                condition.send.join(", "),
                condition.when.clone(),
            ]);
        }
    }
    print_items(&items, &["NAME", "TEMPLATE", "CONDITION"], rows, format)
}

fn print_items<T: serde::Serialize>(
    items: &BTreeMap<String, T>,
    header: &[&str],
    rows: Vec<Vec<String>>,
    format: GetFormat,
) -> Result<String> {
    match format {
        GetFormat::Wide => Ok(table(header, rows)),
        GetFormat::Name => Ok(items.keys().map(|name| format!("{name}\n")).collect()),
        GetFormat::Json => render(items, ObjectFormat::Json),
        GetFormat::Yaml => render(items, ObjectFormat::Yaml),
    }
}

/// Columns padded to their widest cell plus two spaces, as Argo's tabwriter prints them.
fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut all = vec![header.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
    all.extend(rows);
    let columns = header.len();
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            all.iter()
                .map(|row| row[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in all {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == columns {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  ", width = widths[c]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `trigger run`'s output: each condition and whether it holds for `rollout` (with `runs` as
/// `analysisRuns`). A condition without `when` holds, as the controller sends it on every event
/// of its trigger.
pub fn trigger_results(
    conditions: &[TriggerCondition],
    rollout: &Value,
    runs: Option<&Value>,
) -> Result<String> {
    let bound = [
        ("rollout", rollouts_analysis::condition::from_json(rollout)),
        (
            "analysisRuns",
            rollouts_analysis::condition::from_json(runs.unwrap_or(&Value::Null)),
        ),
    ];
    let mut rows = Vec::new();
    for condition in conditions {
        let result = if condition.when.is_empty() {
            "true".to_string()
        } else {
            match rollouts_analysis::condition::eval_condition_over(&bound, &condition.when) {
                Ok(holds) => holds.to_string(),
                Err(error) => format!("false ({error})"),
            }
        };
        rows.push(vec![condition.when.clone(), result]);
    }
    Ok(table(&["CONDITION", "RESULT"], rows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config() -> NotificationConfig {
        let data: BTreeMap<String, String> = [
            (
                "template.my-purple-template",
                "message: |\n  Rollout {{.rollout.metadata.name}} has purple image\nslack:\n  attachments: '[{\"title\": \"{{.rollout.metadata.name}}\"}]'\n",
            ),
            (
                "trigger.on-purple",
                "- when: rollout.spec.template.spec.containers[0].image == 'argoproj/rollouts-demo:purple'\n  send: [my-purple-template]\n",
            ),
            ("service.webhook.ops", "url: http://127.0.0.1:9/\n"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let (config, errors) = NotificationConfig::parse(&data, &BTreeMap::new());
        assert!(errors.is_empty(), "{errors:?}");
        config
    }

    fn rollout(image: &str) -> Value {
        json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"template": {"spec": {"containers": [{"name": "web", "image": image}]}}},
            "status": {}
        })
    }

    #[test]
    fn template_get_lists_the_configmaps_and_the_built_in_templates() {
        let wide = templates(&config(), None, GetFormat::Wide).expect("prints");
        let lines: Vec<&str> = wide.lines().collect();
        assert!(
            lines[0].starts_with("NAME") && lines[0].ends_with("PREVIEW"),
            "{wide}"
        );
        assert!(
            lines.iter().any(|l| l.starts_with("my-purple-template")
                && l.ends_with("Rollout {{.rollout.metadata.name}} has purple image")),
            "{wide}"
        );
        assert!(
            lines.iter().any(|l| l.starts_with("rollout-aborted ")),
            "{wide}"
        );
        let one = templates(&config(), Some("my-purple-template"), GetFormat::Yaml).expect("yaml");
        let parsed: Value = serde_saphyr::from_str(&one).expect("YAML");
        assert_eq!(
            parsed["my-purple-template"]["slack"]["attachments"],
            "[{\"title\": \"{{.rollout.metadata.name}}\"}]"
        );
        assert_eq!(
            templates(&config(), Some("rollout-paused"), GetFormat::Name).expect("names"),
            "rollout-paused\n"
        );
        let error = templates(&config(), Some("nope"), GetFormat::Wide).expect_err("unknown");
        assert!(error.to_string().contains("nope"), "{error}");
    }

    #[test]
    fn trigger_get_prints_a_row_per_condition() {
        let wide = triggers(&config(), Some("on-purple"), GetFormat::Wide).expect("prints");
        assert_eq!(
            wide,
            "NAME       TEMPLATE            CONDITION\non-purple  my-purple-template  rollout.spec.template.spec.containers[0].image == 'argoproj/rollouts-demo:purple'\n"
        );
        let json = triggers(&config(), Some("on-rollout-aborted"), GetFormat::Json).expect("json");
        let parsed: Value = serde_json::from_str(&json).expect("JSON");
        assert_eq!(
            parsed,
            json!({"on-rollout-aborted": [{"send": ["rollout-aborted"]}]})
        );
    }

    #[test]
    fn trigger_run_says_which_conditions_hold_for_the_rollout() {
        let config = config();
        let conditions = notify::trigger_conditions(&config, "on-purple").expect("configured");
        let purple = trigger_results(&conditions, &rollout("argoproj/rollouts-demo:purple"), None)
            .expect("evaluates");
        assert!(
            purple.lines().nth(1).is_some_and(|l| l.ends_with("  true")),
            "{purple}"
        );
        let blue = trigger_results(&conditions, &rollout("argoproj/rollouts-demo:blue"), None)
            .expect("evaluates");
        assert!(
            blue.lines().nth(1).is_some_and(|l| l.ends_with("  false")),
            "{blue}"
        );
        let built_in = notify::trigger_conditions(&config, "on-rollout-aborted").expect("built in");
        assert_eq!(
            trigger_results(&built_in, &rollout("x"), None).expect("evaluates"),
            "CONDITION  RESULT\n           true\n"
        );
    }

    #[test]
    fn a_template_renders_for_a_console_recipient_as_argos_console_prints_it() {
        let config = config();
        let spec = notify::template(&config, "my-purple-template").expect("configured");
        let notification = render_for(
            &config,
            &spec,
            &rollout("argoproj/rollouts-demo:purple"),
            "console",
            "stdout",
            &None,
        )
        .expect("renders");
        assert_eq!(
            notification.document(),
            json!({
                "message": "Rollout web has purple image\n",
                "slack": {"attachments": "[{\"title\": \"web\"}]"}
            })
        );
    }

    #[test]
    fn configuration_files_are_read_by_kind_and_name_and_secret_data_decoded() {
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: other\ndata:\n  a: b\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: argo-rollouts-notification-configmap\ndata:\n  service.webhook.ops: 'url: http://x/'\n---\nkind: Secret\nmetadata:\n  name: argo-rollouts-notification-secret\ndata:\n  token: czNjcmV0\nstringData:\n  plain: text\n";
        let data = documents_data(text, "ConfigMap", notify::DEFAULT_CONFIGMAP).expect("found");
        assert_eq!(data["service.webhook.ops"], "url: http://x/");
        assert!(!data.contains_key("a"));
        let secret = documents_data(text, "Secret", notify::DEFAULT_SECRET).expect("found");
        assert_eq!(secret["token"], "s3cret");
        assert_eq!(secret["plain"], "text");
        let missing = documents_data("kind: Pod\n", "ConfigMap", notify::DEFAULT_CONFIGMAP)
            .expect_err("absent");
        assert!(
            missing.contains("argo-rollouts-notification-configmap"),
            "{missing}"
        );
    }
}
