//! Every `kind: Rollout` document we ship (examples/rollout-*.yaml, tests/fixtures/rollout-*.yaml)
//! and, when ARGO_ROLLOUTS_SRC points at an Argo Rollouts checkout, every one under its examples/
//! and test/e2e/, survives parse -> serialise as the same JSON value: nothing lost, nothing added.

use std::path::{Path, PathBuf};

use rollouts_crds::rollout::Rollout;
use rollouts_crds::validation::{unsupported_features, validate};
use serde_json::Value;

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

/// The `kind: Rollout` documents of a file; files that are not plain YAML (Helm templates) are
/// reported and give none.
fn rollout_documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let docs: Vec<Value> = match serde_saphyr::from_multiple(&text) {
        Ok(docs) => docs,
        Err(e) => {
            let first_line = e.to_string().lines().next().unwrap_or_default().to_string();
            eprintln!("skipped {}: not YAML: {first_line}", path.display());
            return Vec::new();
        }
    };
    docs.into_iter()
        .filter(|doc| {
            doc.get("kind").and_then(Value::as_str) == Some("Rollout")
                && doc
                    .get("apiVersion")
                    .and_then(Value::as_str)
                    .is_some_and(|v| v.starts_with("argoproj.io/"))
        })
        .collect()
}

/// JSON paths where `a` and `b` differ (`+` only in b, `-` only in a, `~` different values).
fn differences(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in x {
                match y.get(k) {
                    Some(w) => differences(v, w, &format!("{path}.{k}"), out),
                    None => out.push(format!("- {path}.{k}: {v}")),
                }
            }
            for (k, w) in y {
                if !x.contains_key(k) {
                    out.push(format!("+ {path}.{k}: {w}"));
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                differences(v, w, &format!("{path}[{i}]"), out);
            }
        }
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => {}
        _ if a == b => {}
        _ => out.push(format!("~ {path}: {a} -> {b}")),
    }
}

/// Parses and re-serialises one document; returns what changed (empty when nothing did).
fn round_trip(doc: &Value) -> Result<Vec<String>, String> {
    let rollout: Rollout = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&rollout).map_err(|e| e.to_string())?;
    let mut diffs = Vec::new();
    differences(doc, &back, "", &mut diffs);
    Ok(diffs)
}

/// Round-trips every Rollout document in `files` (and, with `also_validate`, requires it valid
/// and runnable by this controller), returning the number checked; panics listing every failure.
fn check_files(files: &[PathBuf], also_validate: bool) -> usize {
    let mut checked = 0;
    let mut failures = Vec::new();
    for path in files {
        for doc in rollout_documents(path) {
            checked += 1;
            let name = doc
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string();
            let where_ = format!("{} (Rollout {name})", path.display());
            match round_trip(&doc) {
                Err(e) => failures.push(format!("{where_}: does not parse: {e}")),
                Ok(diffs) if !diffs.is_empty() => failures.push(format!(
                    "{where_}: changed on round trip:\n  {}",
                    diffs.join("\n  ")
                )),
                Ok(_) => {}
            }
            if also_validate && let Ok(rollout) = serde_json::from_value::<Rollout>(doc) {
                let mut errors = validate(&rollout);
                errors.extend(unsupported_features(&rollout));
                if !errors.is_empty() {
                    let listed: Vec<String> = errors.iter().map(ToString::to_string).collect();
                    failures.push(format!("{where_}: invalid:\n  {}", listed.join("\n  ")));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
    checked
}

fn our_files(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    yaml_files(dir, &mut files);
    files.retain(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(prefix))
    });
    files
}

#[test]
fn our_examples_round_trip_and_validate() {
    let files = our_files(&manifest_dir().join("../examples"), "rollout-");
    let checked = check_files(&files, true);
    assert!(
        checked >= 10,
        "expected at least 10 example Rollouts, found {checked}"
    );
}

#[test]
fn our_fixtures_round_trip() {
    let files = our_files(&manifest_dir().join("tests/fixtures"), "rollout-");
    let checked = check_files(&files, false);
    assert!(
        checked >= 1,
        "expected Rollout fixtures in crds/tests/fixtures, found {checked}"
    );
}

#[test]
fn argo_rollouts_manifests_round_trip() {
    let Some(root) = std::env::var_os("ARGO_ROLLOUTS_SRC") else {
        eprintln!("skipped: set ARGO_ROLLOUTS_SRC to an Argo Rollouts checkout to run this test");
        return;
    };
    let root = PathBuf::from(root);
    let mut files = Vec::new();
    yaml_files(&root.join("examples"), &mut files);
    yaml_files(&root.join("test/e2e"), &mut files);
    let checked = check_files(&files, false);
    eprintln!("round-tripped {checked} Argo Rollouts Rollout documents");
    assert!(checked > 0, "no Rollout documents under {}", root.display());
}

/// Every field path (`spec.strategy.canary.steps[].setWeight`) used in the documents.
fn field_paths(value: &Value, path: &str, out: &mut std::collections::BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let child = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                out.insert(child.clone());
                field_paths(v, &child, out);
            }
        }
        Value::Array(items) => {
            for item in items {
                field_paths(item, &format!("{path}[]"), out);
            }
        }
        _ => {}
    }
}

/// The Rollout fields our examples (routers we act on) and fixtures (the rest, and status)
/// must show between them.
const COVERED_FIELDS: &[&str] = &[
    "spec.replicas",
    "spec.selector.matchLabels",
    "spec.template.spec.containers",
    "spec.workloadRef.scaleDown",
    "spec.minReadySeconds",
    "spec.revisionHistoryLimit",
    "spec.paused",
    "spec.progressDeadlineSeconds",
    "spec.progressDeadlineAbort",
    "spec.restartAt",
    "spec.rollbackWindow.revisions",
    "spec.analysis.successfulRunHistoryLimit",
    "spec.analysis.unsuccessfulRunHistoryLimit",
    "spec.strategy.canary.steps[].setWeight",
    "spec.strategy.canary.steps[].pause.duration",
    "spec.strategy.canary.steps[].setCanaryScale.replicas",
    "spec.strategy.canary.steps[].setCanaryScale.weight",
    "spec.strategy.canary.steps[].setCanaryScale.matchTrafficWeight",
    "spec.strategy.canary.steps[].analysis.templates[].templateName",
    "spec.strategy.canary.steps[].analysis.args[].valueFrom.podTemplateHashValue",
    "spec.strategy.canary.steps[].analysis.dryRun[].metricName",
    "spec.strategy.canary.steps[].analysis.measurementRetention[].limit",
    "spec.strategy.canary.steps[].analysis.analysisRunMetadata.labels",
    "spec.strategy.canary.steps[].experiment.templates[].specRef",
    "spec.strategy.canary.steps[].experiment.templates[].weight",
    "spec.strategy.canary.steps[].experiment.templates[].service.name",
    "spec.strategy.canary.steps[].experiment.analyses[].requiredForCompletion",
    "spec.strategy.canary.steps[].experiment.duration",
    "spec.strategy.canary.steps[].setHeaderRoute.match[].headerValue.exact",
    "spec.strategy.canary.steps[].setHeaderRoute.match[].headerValue.prefix",
    "spec.strategy.canary.steps[].setMirrorRoute.match[].method.exact",
    "spec.strategy.canary.steps[].setMirrorRoute.match[].path.prefix",
    "spec.strategy.canary.steps[].setMirrorRoute.match[].headers",
    "spec.strategy.canary.steps[].setMirrorRoute.percentage",
    "spec.strategy.canary.steps[].plugin.config",
    "spec.strategy.canary.maxSurge",
    "spec.strategy.canary.maxUnavailable",
    "spec.strategy.canary.canaryService",
    "spec.strategy.canary.stableService",
    "spec.strategy.canary.pingPong.pingService",
    "spec.strategy.canary.pingPong.pongService",
    "spec.strategy.canary.trafficRouting.nginx.stableIngress",
    "spec.strategy.canary.trafficRouting.nginx.stableIngresses",
    "spec.strategy.canary.trafficRouting.nginx.annotationPrefix",
    "spec.strategy.canary.trafficRouting.nginx.additionalIngressAnnotations",
    "spec.strategy.canary.trafficRouting.nginx.canaryIngressAnnotations",
    "spec.strategy.canary.trafficRouting.istio.virtualService.routes",
    "spec.strategy.canary.trafficRouting.istio.virtualServices[].tlsRoutes[].sniHosts",
    "spec.strategy.canary.trafficRouting.istio.virtualServices[].tcpRoutes[].port",
    "spec.strategy.canary.trafficRouting.istio.destinationRule.canarySubsetName",
    "spec.strategy.canary.trafficRouting.istio.destinationRule.additionalSubsetNames",
    "spec.strategy.canary.trafficRouting.smi.trafficSplitName",
    "spec.strategy.canary.trafficRouting.alb.servicePort",
    "spec.strategy.canary.trafficRouting.alb.rootService",
    "spec.strategy.canary.trafficRouting.alb.stickinessConfig.durationSeconds",
    "spec.strategy.canary.trafficRouting.ambassador.mappings",
    "spec.strategy.canary.trafficRouting.appMesh.virtualNodeGroup.canaryVirtualNodeRef.name",
    "spec.strategy.canary.trafficRouting.traefik.weightedTraefikServiceName",
    "spec.strategy.canary.trafficRouting.apisix.route.rules",
    "spec.strategy.canary.trafficRouting.plugins.argoproj-labs/gatewayAPI",
    "spec.strategy.canary.trafficRouting.managedRoutes[].name",
    "spec.strategy.canary.trafficRouting.maxTrafficWeight",
    "spec.strategy.canary.analysis.templates[].clusterScope",
    "spec.strategy.canary.analysis.args[].valueFrom.fieldRef.fieldPath",
    "spec.strategy.canary.analysis.startingStep",
    "spec.strategy.canary.antiAffinity.preferredDuringSchedulingIgnoredDuringExecution.weight",
    "spec.strategy.canary.canaryMetadata.labels",
    "spec.strategy.canary.stableMetadata.labels",
    "spec.strategy.canary.scaleDownDelaySeconds",
    "spec.strategy.canary.abortScaleDownDelaySeconds",
    "spec.strategy.canary.dynamicStableScale",
    "spec.strategy.canary.minPodsPerReplicaSet",
    "spec.strategy.blueGreen.activeService",
    "spec.strategy.blueGreen.previewService",
    "spec.strategy.blueGreen.previewReplicaCount",
    "spec.strategy.blueGreen.autoPromotionEnabled",
    "spec.strategy.blueGreen.autoPromotionSeconds",
    "spec.strategy.blueGreen.scaleDownDelaySeconds",
    "spec.strategy.blueGreen.scaleDownDelayRevisionLimit",
    "spec.strategy.blueGreen.prePromotionAnalysis.templates",
    "spec.strategy.blueGreen.postPromotionAnalysis.templates",
    "spec.strategy.blueGreen.antiAffinity.requiredDuringSchedulingIgnoredDuringExecution",
    "spec.strategy.blueGreen.activeMetadata.labels",
    "spec.strategy.blueGreen.previewMetadata.labels",
    "spec.strategy.blueGreen.abortScaleDownDelaySeconds",
    "status.phase",
    "status.message",
    "status.conditions[].type",
    "status.currentStepIndex",
    "status.currentStepHash",
    "status.currentPodHash",
    "status.stableRS",
    "status.pauseConditions[].reason",
    "status.controllerPause",
    "status.abort",
    "status.abortedAt",
    "status.promoteFull",
    "status.observedGeneration",
    "status.replicas",
    "status.updatedReplicas",
    "status.readyReplicas",
    "status.availableReplicas",
    "status.HPAReplicas",
    "status.selector",
    "status.collisionCount",
    "status.restartedAt",
    "status.canary.currentStepAnalysisRunStatus.status",
    "status.canary.currentBackgroundAnalysisRunStatus.name",
    "status.canary.currentExperiment",
    "status.canary.weights.canary.podTemplateHash",
    "status.canary.weights.stable.serviceName",
    "status.canary.weights.additional[].weight",
    "status.canary.weights.verified",
    "status.canary.stablePingPong",
    "status.blueGreen.activeSelector",
    "status.blueGreen.previewSelector",
    "status.blueGreen.scaleUpPreviewCheckPoint",
    "status.blueGreen.prePromotionAnalysisRunStatus.message",
    "status.blueGreen.postPromotionAnalysisRunStatus.status",
    "status.workloadObservedGeneration",
    "status.alb.loadBalancer.arn",
    "status.albs[].stableTargetGroup.fullName",
];

#[test]
fn examples_and_fixtures_cover_every_rollout_field() {
    let mut files = our_files(&manifest_dir().join("../examples"), "rollout-");
    files.extend(our_files(
        &manifest_dir().join("tests/fixtures"),
        "rollout-",
    ));
    let mut seen = std::collections::BTreeSet::new();
    for path in &files {
        for doc in rollout_documents(path) {
            field_paths(&doc, "", &mut seen);
        }
    }
    let missing: Vec<&str> = COVERED_FIELDS
        .iter()
        .copied()
        .filter(|f| !seen.contains(*f))
        .collect();
    assert!(
        missing.is_empty(),
        "no example or fixture shows: {missing:#?}"
    );
}

#[test]
fn status_conditions_are_written_even_when_empty() {
    let mut doc: Value = serde_json::json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": "web"},
        "spec": {},
        "status": {"phase": "Healthy"}
    });
    let rollout: Rollout = serde_json::from_value(doc.clone()).expect("parses");
    let back = serde_json::to_value(&rollout).expect("serialises");
    // Argo's controller always writes these three; so do we.
    doc["status"]["conditions"] = serde_json::json!([]);
    doc["status"]["canary"] = serde_json::json!({});
    doc["status"]["blueGreen"] = serde_json::json!({});
    assert_eq!(back, doc);
}
