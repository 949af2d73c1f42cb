//! `lint -f FILE`: check every document of a manifest file without a cluster.
//!
//! Rollouts get the crds validation (the checks the controller makes before acting), the
//! features this controller does not support, fields the API does not define, and advice:
//! unpinned images, a canary without analysis, header routes the router cannot do, and weights
//! a replica-count canary can only approximate. AnalysisTemplates, ClusterAnalysisTemplates and
//! AnalysisRuns get their validation, the unknown-field check and advice on judge metrics whose
//! samples overlap; other kinds are skipped.
//! The exit status is non-zero when there is an error; warnings alone leave it zero.

mod advice;
mod judge;
mod references;
mod unknown_fields;

use std::path::PathBuf;
use std::process::ExitCode;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use rollouts_crds::FieldError;
use rollouts_crds::analysis::{AnalysisRun, AnalysisTemplate, ClusterAnalysisTemplate};
use rollouts_crds::rollout::Rollout;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::args::ObjectFormat;
use crate::error::{Error, Result};
use crate::verbs::render;

/// `lint` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The manifest file (YAML, several documents allowed, or JSON).
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub file: PathBuf,
    /// Print the findings as JSON or YAML.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<ObjectFormat>,
}

/// How serious a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The controller would refuse the object or lose part of it.
    Error,
    /// Valid, but probably not what was meant.
    Warning,
}

/// One problem in one document.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finding {
    /// 1-based position of the document in the file; 0 when the file itself does not parse.
    pub document: usize,
    pub kind: String,
    pub name: String,
    pub severity: Severity,
    pub path: String,
    pub reason: String,
    pub fix: String,
}

impl Finding {
    /// A finding not yet placed in a document (the caller fills document, kind and name).
    pub fn new(
        severity: Severity,
        path: impl Into<String>,
        reason: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            document: 0,
            kind: String::new(),
            name: String::new(),
            severity,
            path: path.into(),
            reason: reason.into(),
            fix: fix.into(),
        }
    }

    fn from_field_error(severity: Severity, error: FieldError) -> Self {
        Self::new(severity, error.path, error.reason, error.fix)
    }
}

/// What linting one file found.
#[derive(Debug, PartialEq, Serialize)]
pub struct LintReport {
    pub file: String,
    /// Documents of a kind lint checks.
    pub checked: usize,
    pub findings: Vec<Finding>,
}

impl LintReport {
    fn count(&self, severity: Severity) -> usize {
        self.findings
            .iter()
            .filter(|f| f.severity == severity)
            .count()
    }

    /// Whether any finding is an error.
    pub fn has_errors(&self) -> bool {
        self.count(Severity::Error) > 0
    }

    /// The text form: one line per finding, then a summary line.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for f in &self.findings {
            let place = if f.document == 0 {
                String::new()
            } else {
                format!(" {} '{}' (document {}):", f.kind, f.name, f.document)
            };
            let severity = match f.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
            };
            let path = if f.path.is_empty() {
                String::new()
            } else {
                format!("{}: ", f.path)
            };
            out.push_str(&format!(
                "{}:{place} {severity}: {path}{} (fix: {})\n",
                self.file, f.reason, f.fix
            ));
        }
        let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
        out.push_str(&format!(
            "{}: {} checked, {}, {}\n",
            self.file,
            plural(self.checked, "object"),
            plural(self.count(Severity::Error), "error"),
            plural(self.count(Severity::Warning), "warning"),
        ));
        out
    }
}

/// Lints the text of a manifest file named `file`.
pub fn lint_text(file: &str, text: &str) -> LintReport {
    let mut report = LintReport {
        file: file.to_string(),
        checked: 0,
        findings: Vec::new(),
    };
    let documents: Vec<Value> = match serde_saphyr::from_multiple(text) {
        Ok(documents) => documents,
        Err(e) => {
            // The parser's first line has the position; the rest is a source snippet.
            let message = e.to_string();
            let first_line = message.lines().next().unwrap_or_default();
            report.findings.push(Finding::new(
                Severity::Error,
                "",
                format!(
                    "not valid YAML or JSON: {}",
                    first_line.trim_start_matches("error: ")
                ),
                "correct the syntax at the line and column given",
            ));
            return report;
        }
    };
    let crds = rollouts_crds::all_crds();
    let pod_template_schema = unknown_fields::pod_template_schema();
    let file_objects = references::FileObjects::collect(&documents);
    for (index, document) in documents.iter().enumerate() {
        if document.is_null() {
            continue;
        }
        let Some(mut findings) =
            lint_document(document, &crds, &pod_template_schema, &file_objects)
        else {
            continue;
        };
        report.checked += 1;
        let kind = document
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let name = document
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        for finding in &mut findings {
            finding.document = index + 1;
            finding.kind = kind.to_string();
            finding.name = name.to_string();
        }
        report.findings.extend(findings);
    }
    report
}

/// The findings of one document, or `None` for a kind lint does not check.
fn lint_document(
    document: &Value,
    crds: &[CustomResourceDefinition],
    pod_template_schema: &Value,
    file_objects: &references::FileObjects,
) -> Option<Vec<Finding>> {
    let kind = document.get("kind").and_then(Value::as_str)?;
    let api_version = document
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let expected_api_version = format!("{}/{}", rollouts_crds::GROUP, rollouts_crds::VERSION);
    let crd = crds.iter().find(|crd| crd.spec.names.kind == kind)?;
    if api_version.split('/').next() != Some(rollouts_crds::GROUP) {
        // Same kind name, another API group: not ours to judge.
        return None;
    }
    if api_version != expected_api_version {
        return Some(vec![Finding::new(
            Severity::Error,
            "apiVersion",
            format!("apiVersion {api_version:?} is not served for {kind}"),
            format!("set apiVersion: {expected_api_version}"),
        )]);
    }
    let mut findings = unknown_fields::unknown_spec_fields(document, &schema_of(crd));
    if kind == "Rollout" {
        findings.extend(unknown_fields::unknown_template_fields(
            document,
            pod_template_schema,
        ));
    }
    let checks = match kind {
        "Rollout" => typed(document, |rollout: Rollout| {
            let mut findings = errors(rollouts_crds::validation::validate(&rollout));
            findings.extend(errors(rollouts_crds::validation::unsupported_features(
                &rollout,
            )));
            findings.extend(references::check(&rollout, file_objects));
            findings.extend(advice::advise(&rollout));
            findings
        }),
        "AnalysisTemplate" => typed(document, |template: AnalysisTemplate| {
            errors(rollouts_crds::analysis::validate_template(&template))
        }),
        "ClusterAnalysisTemplate" => typed(document, |template: ClusterAnalysisTemplate| {
            errors(rollouts_crds::analysis::validate_cluster_template(
                &template,
            ))
        }),
        "AnalysisRun" => typed(document, |run: AnalysisRun| {
            errors(rollouts_crds::analysis::validate_run(&run))
        }),
        _ => Vec::new(),
    };
    findings.extend(checks);
    if matches!(
        kind,
        "AnalysisTemplate" | "ClusterAnalysisTemplate" | "AnalysisRun"
    ) {
        findings.extend(judge::advise(document));
    }
    Some(findings)
}

/// Deserializes `document` and runs `check`, or reports why it does not deserialize.
fn typed<T: DeserializeOwned>(
    document: &Value,
    check: impl FnOnce(T) -> Vec<Finding>,
) -> Vec<Finding> {
    match serde_json::from_value::<T>(document.clone()) {
        Ok(object) => check(object),
        Err(e) => vec![Finding::new(
            Severity::Error,
            "",
            format!("does not match the API: {e}"),
            "add the missing field or correct the value's type (number, string, list or object) as the API reference shows",
        )],
    }
}

fn errors(found: Vec<FieldError>) -> Vec<Finding> {
    found
        .into_iter()
        .map(|e| Finding::from_field_error(Severity::Error, e))
        .collect()
}

/// The first version's `openAPIV3Schema` as JSON (our CRDs serve one version).
fn schema_of(crd: &CustomResourceDefinition) -> Value {
    crd.spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or(Value::Null)
}

/// Lints the file and prints the findings; exit status 1 when there is an error.
pub fn run(args: &Args) -> Result<ExitCode> {
    let text = std::fs::read_to_string(&args.file).map_err(|source| Error::ReadFile {
        path: args.file.display().to_string(),
        source,
    })?;
    let report = lint_text(&args.file.display().to_string(), &text);
    match args.output {
        Some(format) => print!("{}", render(&report, format)?),
        None => print!("{}", report.text()),
    }
    Ok(if report.has_errors() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
