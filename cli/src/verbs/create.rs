//! `create analysisrun`: start an AnalysisRun by hand from an AnalysisTemplate or a
//! ClusterAnalysisTemplate, in the cluster or in a file, as Argo's plugin does.
//!
//! The run gets the template's metrics, arguments (with the `-a` values put in), dry-run and
//! retention rules, and the template's labels and annotations; `--instance-id` replaces those
//! labels with the controller-instance label, as Argo's plugin does. Templates the template
//! composes (`spec.templates`) are fetched and combined the way the controller combines them for
//! a Rollout step, so the run measures every metric the template stands for.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use rollouts_analysis::compose::{self, Templates};
use rollouts_crds::analysis::{
    AnalysisRun, AnalysisRunArgument, AnalysisTemplate, AnalysisTemplateSpec,
    ClusterAnalysisTemplate, RolloutAnalysisTemplate,
};
use rollouts_crds::rollout::CONTROLLER_INSTANCE_ID_LABEL_KEY;
use serde_json::Value;

use crate::args::OutputFlag;
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::patch::TargetKind;
use crate::verbs::{kind_word, report};

/// The annotation `kubectl apply` keeps on the template; it describes the template, not the run.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What to create.
#[derive(Debug, clap::Subcommand)]
pub enum Kind {
    /// Create an AnalysisRun from an AnalysisTemplate or a ClusterAnalysisTemplate.
    #[command(name = "analysisrun", visible_aliases = ["ar"])]
    AnalysisRun(AnalysisRunArgs),
}

/// `create analysisrun` arguments.
#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("template").required(true).args(["from", "from_cluster_template", "from_file"]))]
pub struct AnalysisRunArgs {
    /// Name of the AnalysisTemplate, in the namespace, to run.
    #[arg(long, value_name = "TEMPLATE")]
    pub from: Option<String>,
    /// Name of the ClusterAnalysisTemplate to run.
    #[arg(long, value_name = "TEMPLATE")]
    pub from_cluster_template: Option<String>,
    /// A file holding one AnalysisTemplate or ClusterAnalysisTemplate to run; templates it
    /// composes are read from the cluster.
    #[arg(long, value_name = "FILE")]
    pub from_file: Option<PathBuf>,
    /// Read --from as a ClusterAnalysisTemplate (Argo's spelling of --from-cluster-template).
    #[arg(long, conflicts_with = "from_cluster_template")]
    pub global: bool,
    /// Name of the run.
    #[arg(long, conflicts_with = "generate_name")]
    pub name: Option<String>,
    /// Prefix of a generated run name (default: the template's name and a dash).
    #[arg(long, value_name = "PREFIX")]
    pub generate_name: Option<String>,
    /// A value for one of the template's arguments; repeat for more.
    #[arg(short = 'a', long = "argument", value_name = "NAME=VALUE", value_parser = parse_argument)]
    pub arguments: Vec<(String, String)>,
    /// Label the run for the controller started with this --instance-id.
    #[arg(long, value_name = "ID")]
    pub instance_id: Option<String>,
    #[command(flatten)]
    pub output: OutputFlag,
}

impl AnalysisRunArgs {
    /// The template in the cluster the run is made from; `None` with `--from-file`.
    pub fn template(&self) -> Option<RolloutAnalysisTemplate> {
        let (name, cluster_scope) = match (&self.from_cluster_template, &self.from) {
            (Some(name), _) => (name.clone(), true),
            (None, Some(name)) => (name.clone(), self.global),
            (None, None) => return None,
        };
        Some(RolloutAnalysisTemplate {
            template_name: name,
            cluster_scope: cluster_scope.then_some(true),
        })
    }
}

/// The one AnalysisTemplate or ClusterAnalysisTemplate in a manifest (`file` names it in
/// errors): how it is referred to, its metadata and its spec.
pub fn template_in_file(
    file: &str,
    text: &str,
) -> Result<(RolloutAnalysisTemplate, ObjectMeta, AnalysisTemplateSpec)> {
    let documents: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| {
        Error::Invalid(format!(
            "{file}: not valid YAML: {e} (fix: run `kubectl rollouts lint -f {file}`)"
        ))
    })?;
    let templates: Vec<Value> = documents
        .into_iter()
        .filter(|d| {
            matches!(
                d.get("kind").and_then(Value::as_str),
                Some("AnalysisTemplate" | "ClusterAnalysisTemplate")
            )
        })
        .collect();
    let [document] = templates.as_slice() else {
        return Err(Error::Invalid(format!(
            "{file}: holds {} AnalysisTemplates or ClusterAnalysisTemplates, not one (fix: pass a file holding exactly one)",
            templates.len()
        )));
    };
    let cluster_scope =
        document.get("kind").and_then(Value::as_str) == Some("ClusterAnalysisTemplate");
    let not_a_template = |e: serde_json::Error| {
        Error::Invalid(format!(
            "{file}: not a valid template: {e} (fix: run `kubectl rollouts lint -f {file}`)"
        ))
    };
    let (metadata, spec) = if cluster_scope {
        let template: ClusterAnalysisTemplate =
            serde_json::from_value(document.clone()).map_err(not_a_template)?;
        (template.metadata, template.spec.0)
    } else {
        let template: AnalysisTemplate =
            serde_json::from_value(document.clone()).map_err(not_a_template)?;
        (template.metadata, template.spec)
    };
    let reference = RolloutAnalysisTemplate {
        template_name: metadata.name.clone().unwrap_or_default(),
        cluster_scope: cluster_scope.then_some(true),
    };
    Ok((reference, metadata, spec))
}

/// An `-a` value without a name before its `=`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not NAME=VALUE (fix: write the argument as -a NAME=VALUE)")]
pub struct ArgumentError {
    text: String,
}

/// `-a NAME=VALUE`, split at the first `=` (a value may hold more).
fn parse_argument(text: &str) -> std::result::Result<(String, String), ArgumentError> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_string(), value.to_string())),
        _ => Err(ArgumentError {
            text: text.to_string(),
        }),
    }
}

/// Refuses an instance id that cannot be a label value, before anything is read.
pub fn check_instance_id(instance_id: Option<&str>) -> Result<()> {
    let Some(id) = instance_id else {
        return Ok(());
    };
    let valid_chars = id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let valid_ends = id.starts_with(|c: char| c.is_ascii_alphanumeric())
        && id.ends_with(|c: char| c.is_ascii_alphanumeric());
    if id.len() <= 63 && valid_chars && valid_ends {
        return Ok(());
    }
    Err(Error::Invalid(format!(
        "--instance-id {id:?} is not a valid label value (fix: use at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"
    )))
}

/// How `template` is named in messages: `analysistemplate "web-check"`.
fn described(template: &RolloutAnalysisTemplate) -> String {
    let kind = if template.cluster_scope == Some(true) {
        TargetKind::ClusterAnalysisTemplate
    } else {
        TargetKind::AnalysisTemplate
    };
    format!("{} \"{}\"", kind_word(kind), template.template_name)
}

/// The AnalysisRun `create analysisrun` sends: `root` is the template asked for, `metadata` its
/// metadata, `templates` every template it stands for (itself and those it composes).
pub fn analysis_run(
    root: &RolloutAnalysisTemplate,
    metadata: &ObjectMeta,
    templates: &Templates,
    args: &AnalysisRunArgs,
    namespace: &str,
) -> Result<AnalysisRun> {
    let about = described(root);
    let declared = declared_arguments(templates);

    let unknown: Vec<&str> = args
        .arguments
        .iter()
        .map(|(name, _)| name.as_str())
        .filter(|name| !declared.contains_key(*name))
        .collect();
    if let Some(name) = unknown.first() {
        let fix = if declared.is_empty() {
            format!("it takes no arguments: remove -a {name}=...")
        } else {
            format!(
                "use one of its arguments: {}",
                declared.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        };
        return Err(Error::Invalid(format!(
            "{about} has no argument \"{name}\" (fix: {fix})"
        )));
    }

    let given: BTreeSet<&str> = args.arguments.iter().map(|(n, _)| n.as_str()).collect();
    let missing: Vec<&str> = declared
        .iter()
        .filter(|(name, has_value)| !**has_value && !given.contains(name.as_str()))
        .map(|(name, _)| name.as_str())
        .collect();
    if !missing.is_empty() {
        let names = missing
            .iter()
            .map(|name| format!("\"{name}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let flags = missing
            .iter()
            .map(|name| format!("-a {name}=VALUE"))
            .collect::<Vec<_>>()
            .join(" ");
        let noun = if missing.len() == 1 {
            "argument"
        } else {
            "arguments"
        };
        return Err(Error::Invalid(format!(
            "{about}: {noun} {names} must be given a value (fix: pass {flags})"
        )));
    }

    let incoming: Vec<AnalysisRunArgument> = args
        .arguments
        .iter()
        .map(|(name, value)| AnalysisRunArgument {
            name: name.clone(),
            value: Some(value.clone()),
            value_from: None,
        })
        .collect();
    let spec = compose::run_spec(templates, &incoming, &[], &[]).map_err(|reason| {
        Error::Invalid(format!(
            "{about} cannot be run: {reason} (fix: correct the templates it is composed of)"
        ))
    })?;
    if spec.metrics.is_empty() {
        return Err(Error::Invalid(format!(
            "{about} has no metrics to measure (fix: add spec.metrics, or spec.templates naming templates that have some)"
        )));
    }

    let labels = match &args.instance_id {
        Some(id) => BTreeMap::from([(CONTROLLER_INSTANCE_ID_LABEL_KEY.to_string(), id.clone())]),
        None => metadata.labels.clone().unwrap_or_default(),
    };
    let mut annotations = metadata.annotations.clone().unwrap_or_default();
    annotations.remove(LAST_APPLIED);
    let (name, generate_name) = match (&args.name, &args.generate_name) {
        (Some(name), _) => (Some(name.clone()), None),
        (None, Some(prefix)) => (None, Some(prefix.clone())),
        (None, None) if root.template_name.is_empty() => {
            return Err(Error::Invalid(
                "the template has no metadata.name to name the run after (fix: pass --name or --generate-name)".to_string(),
            ));
        }
        (None, None) => (None, Some(format!("{}-", root.template_name))),
    };
    let mut run = AnalysisRun::new("", spec);
    run.metadata = ObjectMeta {
        name,
        generate_name,
        namespace: Some(namespace.to_string()),
        labels: (!labels.is_empty()).then_some(labels),
        annotations: (!annotations.is_empty()).then_some(annotations),
        ..ObjectMeta::default()
    };
    Ok(run)
}

/// Every argument the templates declare, and whether one of them gives it a value (or a
/// `valueFrom`), in name order.
fn declared_arguments(templates: &Templates) -> BTreeMap<String, bool> {
    let mut declared = BTreeMap::new();
    for arg in templates
        .namespaced
        .iter()
        .chain(&templates.cluster)
        .flat_map(|t| &t.spec.args)
    {
        let has_value = arg.value.is_some() || arg.value_from.is_some();
        *declared.entry(arg.name.clone()).or_insert(false) |= has_value;
    }
    declared
}

/// Reads every template `root` (whose spec is `root_spec`) composes, following
/// `spec.templates`, and gathers them with the root.
async fn composed_templates(
    cluster: &Cluster,
    root: &RolloutAnalysisTemplate,
    root_spec: AnalysisTemplateSpec,
) -> Result<Templates> {
    let key =
        |r: &RolloutAnalysisTemplate| (r.cluster_scope == Some(true), r.template_name.clone());
    let mut fetched: BTreeMap<(bool, String), AnalysisTemplateSpec> = BTreeMap::new();
    let mut pending: Vec<RolloutAnalysisTemplate> = root_spec.templates.clone();
    fetched.insert(key(root), root_spec);
    while let Some(reference) = pending.pop() {
        if fetched.contains_key(&key(&reference)) {
            continue;
        }
        let (_, spec) = cluster
            .analysis_template(
                &reference.template_name,
                reference.cluster_scope == Some(true),
            )
            .await?;
        pending.extend(spec.templates.iter().cloned());
        fetched.insert(key(&reference), spec);
    }
    compose::gather(std::slice::from_ref(root), |reference| {
        fetched
            .get(&key(reference))
            .cloned()
            .ok_or_else(|| format!("{} was not read", described(reference)))
    })
    .map_err(Error::Invalid)
}

/// Reads the template, builds the run and creates it.
pub async fn run(cluster: &Cluster, kind: &Kind) -> Result<()> {
    let Kind::AnalysisRun(args) = kind;
    check_instance_id(args.instance_id.as_deref())?;
    let (root, metadata, root_spec) = match (&args.from_file, args.template()) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path).map_err(|source| Error::ReadFile {
                path: path.display().to_string(),
                source,
            })?;
            template_in_file(&path.display().to_string(), &text)?
        }
        (None, Some(root)) => {
            let (metadata, spec) = cluster
                .analysis_template(&root.template_name, root.cluster_scope == Some(true))
                .await?;
            (root, metadata, spec)
        }
        (None, None) => {
            return Err(Error::Invalid(
                "create analysisrun needs a template (fix: pass --from, --from-cluster-template or --from-file)".to_string(),
            ));
        }
    };
    let templates = composed_templates(cluster, &root, root_spec).await?;
    let run = analysis_run(&root, &metadata, &templates, args, &cluster.namespace)?;
    let shown_name = run
        .metadata
        .name
        .clone()
        .or_else(|| run.metadata.generate_name.clone())
        .unwrap_or_default();
    let body = serde_json::to_value(&run).map_err(|e| Error::Output(e.to_string()))?;
    let created = cluster
        .create(TargetKind::AnalysisRun, &shown_name, &body)
        .await?;
    report(
        &format!("analysisrun.argoproj.io/{} created", created.name_any()),
        &created,
        args.output.output,
    )
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use rollouts_analysis::compose::FoundTemplate;
    use serde_json::{Value, json};

    use super::*;
    use crate::args::{Cli, Command};

    fn parse(flags: &[&str]) -> AnalysisRunArgs {
        let line = ["kubectl-rollouts", "create", "analysisrun"]
            .into_iter()
            .chain(flags.iter().copied());
        match Cli::try_parse_from(line)
            .expect("the command line parses")
            .command
        {
            Command::Create(Kind::AnalysisRun(args)) => args,
            other => panic!("parsed as {other:?}"),
        }
    }

    fn spec(value: Value) -> AnalysisTemplateSpec {
        serde_json::from_value(value).expect("a valid template spec")
    }

    fn success_rate() -> AnalysisTemplateSpec {
        spec(json!({
            "args": [{"name": "service"}, {"name": "threshold", "value": "0.95"}],
            "metrics": [{
                "name": "success-rate",
                "interval": "10s",
                "successCondition": "result >= {{args.threshold}}",
                "provider": {"web": {"url": "http://127.0.0.1:9/{{args.service}}"}}
            }],
            "dryRun": [{"metricName": "success-rate"}]
        }))
    }

    fn only(name: &str, template: AnalysisTemplateSpec) -> Templates {
        Templates {
            namespaced: vec![FoundTemplate {
                name: name.into(),
                spec: template,
            }],
            cluster: vec![],
        }
    }

    fn metadata() -> ObjectMeta {
        ObjectMeta {
            name: Some("success-rate".into()),
            namespace: Some("shop".into()),
            uid: Some("uid-1".into()),
            resource_version: Some("42".into()),
            labels: Some(BTreeMap::from([("team".into(), "checkout".into())])),
            annotations: Some(BTreeMap::from([
                ("owner".into(), "sre".into()),
                (LAST_APPLIED.into(), "{}".into()),
            ])),
            ..ObjectMeta::default()
        }
    }

    fn build(flags: &[&str]) -> Result<Value> {
        let args = parse(flags);
        let run = analysis_run(
            &args.template().expect("a template in the cluster"),
            &metadata(),
            &only("success-rate", success_rate()),
            &args,
            "shop",
        )?;
        Ok(serde_json::to_value(run).expect("JSON"))
    }

    #[test]
    fn the_run_carries_the_template_with_the_argument_values_put_in() {
        let run = build(&["--from", "success-rate", "-a", "service=checkout"]).expect("builds");
        assert_eq!(
            run,
            json!({
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "AnalysisRun",
                "metadata": {
                    "generateName": "success-rate-",
                    "namespace": "shop",
                    "labels": {"team": "checkout"},
                    "annotations": {"owner": "sre"}
                },
                "spec": {
                    "args": [
                        {"name": "service", "value": "checkout"},
                        {"name": "threshold", "value": "0.95"}
                    ],
                    "metrics": [{
                        "name": "success-rate",
                        "interval": "10s",
                        "successCondition": "result >= {{args.threshold}}",
                        "provider": {"web": {"url": "http://127.0.0.1:9/{{args.service}}"}}
                    }],
                    "dryRun": [{"metricName": "success-rate"}]
                }
            })
        );
    }

    #[test]
    fn a_given_value_replaces_the_template_default() {
        let run = build(&[
            "--from",
            "success-rate",
            "-a",
            "service=checkout",
            "-a",
            "threshold=0.99",
        ])
        .expect("builds");
        assert_eq!(
            run["spec"]["args"][1],
            json!({"name": "threshold", "value": "0.99"})
        );
    }

    #[test]
    fn name_and_generate_name_are_used_as_given() {
        let named = build(&[
            "--from",
            "success-rate",
            "-a",
            "service=a",
            "--name",
            "by-hand",
        ])
        .expect("builds");
        assert_eq!(named["metadata"]["name"], "by-hand");
        assert!(named["metadata"].get("generateName").is_none());
        let generated = build(&[
            "--from",
            "success-rate",
            "-a",
            "service=a",
            "--generate-name",
            "check-",
        ])
        .expect("builds");
        assert_eq!(generated["metadata"]["generateName"], "check-");
        assert!(generated["metadata"].get("name").is_none());
    }

    #[test]
    fn instance_id_replaces_the_labels_as_argo_does() {
        let run = build(&[
            "--from",
            "success-rate",
            "-a",
            "service=a",
            "--instance-id",
            "team-a",
        ])
        .expect("builds");
        assert_eq!(
            run["metadata"]["labels"],
            json!({"argo-rollouts.argoproj.io/controller-instance-id": "team-a"})
        );
        assert!(check_instance_id(Some("team-a")).is_ok());
        let bad = check_instance_id(Some("team a")).expect_err("a space is not a label value");
        assert!(
            bad.to_string().contains("--instance-id \"team a\""),
            "{bad}"
        );
    }

    #[test]
    fn a_missing_argument_is_named_with_the_flag_that_fixes_it() {
        let err = build(&["--from", "success-rate"]).expect_err("service has no value");
        assert_eq!(
            err.to_string(),
            "error: analysistemplate \"success-rate\": argument \"service\" must be given a value (fix: pass -a service=VALUE)"
        );
    }

    #[test]
    fn an_unknown_argument_is_refused_listing_the_known_ones() {
        let err = build(&[
            "--from",
            "success-rate",
            "-a",
            "service=a",
            "-a",
            "color=red",
        ])
        .expect_err("color is not declared");
        assert_eq!(
            err.to_string(),
            "error: analysistemplate \"success-rate\" has no argument \"color\" (fix: use one of its arguments: service, threshold)"
        );
        let args = parse(&["--from-cluster-template", "plain", "-a", "x=1"]);
        let plain = spec(
            json!({"metrics": [{"name": "m", "provider": {"web": {"url": "http://127.0.0.1:9/"}}}]}),
        );
        let err = analysis_run(
            &args.template().expect("a template in the cluster"),
            &ObjectMeta::default(),
            &Templates {
                namespaced: vec![],
                cluster: vec![FoundTemplate {
                    name: "plain".into(),
                    spec: plain,
                }],
            },
            &args,
            "shop",
        )
        .expect_err("plain takes no arguments");
        assert_eq!(
            err.to_string(),
            "error: clusteranalysistemplate \"plain\" has no argument \"x\" (fix: it takes no arguments: remove -a x=...)"
        );
    }

    #[test]
    fn composed_templates_give_their_metrics_and_arguments() {
        let args = parse(&["--from", "checks", "-a", "service=a"]);
        let latency = spec(json!({
            "args": [{"name": "service"}],
            "metrics": [{"name": "latency", "provider": {"web": {"url": "http://127.0.0.1:9/{{args.service}}"}}}]
        }));
        let checks = spec(json!({"templates": [{"templateName": "latency"}]}));
        let templates = Templates {
            namespaced: vec![
                FoundTemplate {
                    name: "checks".into(),
                    spec: checks,
                },
                FoundTemplate {
                    name: "latency".into(),
                    spec: latency,
                },
            ],
            cluster: vec![],
        };
        let run = analysis_run(
            &args.template().expect("a template in the cluster"),
            &metadata(),
            &templates,
            &args,
            "shop",
        )
        .expect("builds");
        assert_eq!(run.spec.metrics.len(), 1);
        assert_eq!(run.spec.metrics[0].name, "latency");
        assert_eq!(run.spec.args[0].value.as_deref(), Some("a"));
        assert_eq!(run.metadata.generate_name.as_deref(), Some("checks-"));
    }

    #[test]
    fn a_template_without_metrics_is_refused() {
        let args = parse(&["--from", "empty"]);
        let err = analysis_run(
            &args.template().expect("a template in the cluster"),
            &ObjectMeta::default(),
            &only("empty", AnalysisTemplateSpec::default()),
            &args,
            "shop",
        )
        .expect_err("nothing to measure");
        assert!(
            err.to_string()
                .contains("analysistemplate \"empty\" has no metrics"),
            "{err}"
        );
    }

    #[test]
    fn a_file_gives_its_one_template_and_its_kind() {
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: other\n---\napiVersion: argoproj.io/v1alpha1\nkind: ClusterAnalysisTemplate\nmetadata:\n  name: slo\n  labels:\n    team: sre\nspec:\n  args:\n  - name: service\n  metrics:\n  - name: up\n    provider:\n      web:\n        url: http://127.0.0.1:9/{{args.service}}\n";
        let (reference, metadata, spec) = template_in_file("slo.yaml", text).expect("one template");
        assert_eq!(
            (reference.template_name.as_str(), reference.cluster_scope),
            ("slo", Some(true))
        );
        assert_eq!(metadata.labels.expect("labels")["team"], "sre");
        assert_eq!(spec.args[0].name, "service");

        let none = template_in_file("cm.yaml", "kind: ConfigMap\nmetadata:\n  name: x\n")
            .expect_err("no template");
        assert_eq!(
            none.to_string(),
            "error: cm.yaml: holds 0 AnalysisTemplates or ClusterAnalysisTemplates, not one (fix: pass a file holding exactly one)"
        );
        let two = "kind: AnalysisTemplate\nmetadata:\n  name: a\n---\nkind: AnalysisTemplate\nmetadata:\n  name: b\n";
        assert!(template_in_file("two.yaml", two).is_err());
        let bad = template_in_file(
            "bad.yaml",
            "kind: AnalysisTemplate\nmetadata:\n  name: bad\nspec:\n  metrics: 3\n",
        )
        .expect_err("metrics is a list");
        assert!(
            bad.to_string()
                .starts_with("error: bad.yaml: not a valid template"),
            "{bad}"
        );
    }

    #[test]
    fn an_unnamed_template_needs_a_run_name() {
        let args = parse(&["--from-file", "t.yaml"]);
        assert!(args.template().is_none());
        let (reference, metadata, template) = template_in_file(
            "t.yaml",
            "kind: AnalysisTemplate\nmetadata: {}\nspec:\n  metrics:\n  - name: up\n    provider:\n      web:\n        url: http://127.0.0.1:9/\n",
        )
        .expect("a template without a name");
        let templates = only("", template);
        let err = analysis_run(&reference, &metadata, &templates, &args, "shop")
            .expect_err("nothing to name the run after");
        assert!(
            err.to_string()
                .contains("fix: pass --name or --generate-name"),
            "{err}"
        );
        let named = parse(&["--from-file", "t.yaml", "--name", "by-hand"]);
        let run = analysis_run(&reference, &metadata, &templates, &named, "shop").expect("builds");
        assert_eq!(run.metadata.name.as_deref(), Some("by-hand"));
    }

    #[test]
    fn the_command_line_picks_the_template_kind() {
        let namespaced = parse(&["--from", "a"]).template().expect("--from");
        assert_eq!(
            (namespaced.template_name.as_str(), namespaced.cluster_scope),
            ("a", None)
        );
        let cluster = parse(&["--from-cluster-template", "b"])
            .template()
            .expect("--from-cluster-template");
        assert_eq!(
            (cluster.template_name.as_str(), cluster.cluster_scope),
            ("b", Some(true))
        );
        let global = parse(&["--global", "--from", "c"])
            .template()
            .expect("--global --from");
        assert_eq!(
            (global.template_name.as_str(), global.cluster_scope),
            ("c", Some(true))
        );
        let line = |flags: &[&str]| {
            Cli::try_parse_from(
                ["kubectl-rollouts", "create", "analysisrun"]
                    .into_iter()
                    .chain(flags.iter().copied()),
            )
        };
        assert!(line(&[]).is_err(), "a template is required");
        assert!(line(&["--from", "a", "--from-cluster-template", "b"]).is_err());
        assert!(line(&["--from", "a", "--from-file", "t.yaml"]).is_err());
        assert!(line(&["--from", "a", "--name", "x", "--generate-name", "y-"]).is_err());
        let bad = line(&["--from", "a", "-a", "novalue"]).expect_err("not NAME=VALUE");
        assert!(bad.to_string().contains("-a NAME=VALUE"), "{bad}");
        let kept = parse(&["--from", "a", "-a", "q=x=y"]);
        assert_eq!(kept.arguments, [("q".to_string(), "x=y".to_string())]);
    }
}
