//! Every AnalysisTemplate, ClusterAnalysisTemplate, AnalysisRun and Experiment document we ship
//! (examples/analysis-*.yaml, tests/fixtures/analysis/) and, when ARGO_ROLLOUTS_SRC points at an
//! Argo Rollouts checkout, every such document under its examples/ and test/e2e/, survives
//! parse -> serialise unchanged (as a JSON value).

use std::path::{Path, PathBuf};

use rollouts_crds::analysis::{
    AnalysisRun, AnalysisTemplate, ClusterAnalysisTemplate, validate_cluster_template,
    validate_run, validate_template,
};
use rollouts_crds::experiment::Experiment;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

const KINDS: [&str; 4] = [
    "AnalysisTemplate",
    "ClusterAnalysisTemplate",
    "AnalysisRun",
    "Experiment",
];

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            yaml_files(&path, out);
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        ) {
            out.push(path);
        }
    }
}

/// The documents of our kinds in `path`, with their kind.
fn documents(path: &Path) -> Vec<(String, Value)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let docs: Vec<Value> = match serde_saphyr::from_multiple(&text) {
        Ok(docs) => docs,
        // Helm templates and unquoted `{{args.x}}` values are not YAML the API server accepts
        // either; such files are reported and left out.
        Err(e) => {
            let first_line = e.to_string().lines().next().unwrap_or_default().to_string();
            eprintln!("skipped {}: not YAML: {first_line}", path.display());
            return Vec::new();
        }
    };
    docs.into_iter()
        .filter_map(|doc| {
            let kind = doc.get("kind")?.as_str()?.to_string();
            let api_version = doc.get("apiVersion")?.as_str()?;
            (api_version == "argoproj.io/v1alpha1" && KINDS.contains(&kind.as_str()))
                .then_some((kind, doc))
        })
        .collect()
}

fn round_trip<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<T, String> {
    let typed: T = serde_json::from_value(doc.clone()).map_err(|e| format!("parse: {e}"))?;
    let back = serde_json::to_value(&typed).map_err(|e| format!("serialise: {e}"))?;
    if &back != doc {
        return Err(format!(
            "changed on round trip\n  read:  {doc}\n  wrote: {back}"
        ));
    }
    Ok(typed)
}

/// Round-trips every document of `files`; with `validate`, also requires no validation finding.
/// Returns how many documents were checked, and the failures.
fn check(files: &[PathBuf], validate: bool) -> (usize, Vec<String>) {
    let mut checked = 0;
    let mut failures = Vec::new();
    for path in files {
        for (kind, doc) in documents(path) {
            checked += 1;
            let findings = match kind.as_str() {
                "AnalysisTemplate" => {
                    round_trip::<AnalysisTemplate>(&doc).map(|t| validate_template(&t))
                }
                "ClusterAnalysisTemplate" => round_trip::<ClusterAnalysisTemplate>(&doc)
                    .map(|t| validate_cluster_template(&t)),
                "AnalysisRun" => round_trip::<AnalysisRun>(&doc).map(|r| validate_run(&r)),
                _ => round_trip::<Experiment>(&doc).map(|_| Vec::new()),
            };
            let name = doc["metadata"]["name"].as_str().unwrap_or("?").to_string();
            match findings {
                Err(e) => failures.push(format!("{} {kind}/{name}: {e}", path.display())),
                Ok(findings) if validate && !findings.is_empty() => failures.push(format!(
                    "{} {kind}/{name}: validation: {}",
                    path.display(),
                    findings
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                )),
                Ok(_) => {}
            }
        }
    }
    (checked, failures)
}

#[test]
fn our_examples_and_fixtures_round_trip_and_validate() {
    let mut files = Vec::new();
    yaml_files(&manifest_dir().join("../examples"), &mut files);
    files.retain(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("analysis-"))
    });
    let examples = files.len();
    yaml_files(&manifest_dir().join("tests/fixtures/analysis"), &mut files);
    assert!(
        examples >= 5,
        "expected the analysis-*.yaml examples, found {examples}"
    );

    let (checked, failures) = check(&files, true);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(checked >= 10, "only {checked} documents found in {files:?}");
}

#[test]
fn argo_rollouts_manifests_round_trip() {
    let Some(src) = std::env::var_os("ARGO_ROLLOUTS_SRC") else {
        eprintln!("skipped: set ARGO_ROLLOUTS_SRC to an Argo Rollouts checkout to run this test");
        return;
    };
    let src = PathBuf::from(src);
    let mut files = Vec::new();
    yaml_files(&src.join("examples"), &mut files);
    yaml_files(&src.join("test/e2e"), &mut files);

    let (checked, failures) = check(&files, false);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(checked > 0, "no analysis documents under {}", src.display());
    eprintln!("{checked} Argo Rollouts documents round-tripped");
}
