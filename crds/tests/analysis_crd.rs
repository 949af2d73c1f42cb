//! The analysis CRDs have Argo's names, scopes, printer columns and subresources, and schemas the
//! API server accepts (structural: no `$ref`, preserved JSON where we do not model a provider).

use rollouts_crds::analysis;
use rollouts_crds::experiment;
use serde_json::Value;

fn crd_json(name: &str) -> Value {
    let crds = analysis::crds().into_iter().chain(experiment::crds());
    let crd = crds
        .into_iter()
        .find(|c| c.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no CRD {name}"));
    serde_json::to_value(crd).expect("a CRD serialises")
}

fn schema(crd: &Value) -> &Value {
    &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
}

fn contains_key(value: &Value, key: &str) -> bool {
    match value {
        Value::Object(map) => map.contains_key(key) || map.values().any(|v| contains_key(v, key)),
        Value::Array(items) => items.iter().any(|v| contains_key(v, key)),
        _ => false,
    }
}

#[test]
fn names_scopes_and_columns_match_argo() {
    let cases = [
        (
            "analysistemplates.argoproj.io",
            "AnalysisTemplate",
            "Namespaced",
            "at",
        ),
        (
            "clusteranalysistemplates.argoproj.io",
            "ClusterAnalysisTemplate",
            "Cluster",
            "cat",
        ),
        (
            "analysisruns.argoproj.io",
            "AnalysisRun",
            "Namespaced",
            "ar",
        ),
        ("experiments.argoproj.io", "Experiment", "Namespaced", "exp"),
    ];
    for (name, kind, scope, short) in cases {
        let crd = crd_json(name);
        assert_eq!(crd["spec"]["names"]["kind"], kind, "{name}");
        assert_eq!(crd["spec"]["scope"], scope, "{name}");
        assert_eq!(crd["spec"]["names"]["shortNames"][0], short, "{name}");
        assert_eq!(crd["spec"]["group"], "argoproj.io");
        assert_eq!(crd["spec"]["versions"][0]["name"], "v1alpha1");
        assert!(
            !contains_key(schema(&crd), "$ref"),
            "{name} schema has a $ref"
        );
    }

    let run = crd_json("analysisruns.argoproj.io");
    let version = &run["spec"]["versions"][0];
    assert!(version["subresources"]["status"].is_object());
    let columns: Vec<(&str, &str)> = version["additionalPrinterColumns"]
        .as_array()
        .expect("printer columns")
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["jsonPath"].as_str().unwrap()))
        .collect();
    assert_eq!(
        columns,
        [
            ("Status", ".status.phase"),
            ("Age", ".metadata.creationTimestamp")
        ]
    );
    let experiment = crd_json("experiments.argoproj.io");
    assert!(experiment["spec"]["versions"][0]["subresources"]["status"].is_object());
}

#[test]
fn cluster_template_spec_has_the_template_fields() {
    let crd = crd_json("clusteranalysistemplates.argoproj.io");
    let spec = &schema(&crd)["properties"]["spec"]["properties"];
    for field in [
        "metrics",
        "args",
        "dryRun",
        "measurementRetention",
        "templates",
    ] {
        assert!(spec[field].is_object(), "spec.{field} missing: {spec}");
    }
}

#[test]
fn unmodelled_providers_and_job_spec_are_preserved() {
    let crd = crd_json("analysistemplates.argoproj.io");
    let metric = &schema(&crd)["properties"]["spec"]["properties"]["metrics"]["items"];
    let provider = &metric["properties"]["provider"]["properties"];
    for name in [
        "kayenta",
        "datadog",
        "wavefront",
        "newRelic",
        "cloudWatch",
        "graphite",
        "influxdb",
        "skywalking",
        "plugin",
        "judge",
    ] {
        assert_eq!(
            provider[name]["x-kubernetes-preserve-unknown-fields"], true,
            "provider.{name} is not preserved: {}",
            provider[name]
        );
    }
    assert_eq!(
        provider["job"]["properties"]["spec"]["x-kubernetes-preserve-unknown-fields"],
        true
    );
    assert_eq!(
        metric["properties"]["count"]["x-kubernetes-int-or-string"],
        true
    );
    assert!(metric["properties"]["consecutiveFailureLimit"].is_object());
}

/// Fields of Argo's schema missing from ours, as dotted paths (`[]` for array items). A node of
/// ours that keeps unknown fields covers everything below it.
fn missing_fields(argo: &Value, ours: &Value, path: &str, out: &mut Vec<String>) {
    if ours["x-kubernetes-preserve-unknown-fields"] == true {
        return;
    }
    if let Some(properties) = argo["properties"].as_object() {
        for (name, argo_child) in properties {
            let child = format!("{path}.{name}");
            match ours["properties"].get(name) {
                Some(our_child) => missing_fields(argo_child, our_child, &child, out),
                None => out.push(child),
            }
        }
    }
    if !argo["items"].is_null() {
        if ours["items"].is_null() {
            out.push(format!("{path}[]"));
        } else {
            missing_fields(&argo["items"], &ours["items"], &format!("{path}[]"), out);
        }
    }
}

#[test]
fn every_argo_field_exists_in_our_schemas() {
    let Some(src) = std::env::var_os("ARGO_ROLLOUTS_SRC") else {
        eprintln!("skipped: set ARGO_ROLLOUTS_SRC to an Argo Rollouts checkout to run this test");
        return;
    };
    let dir = std::path::PathBuf::from(src).join("manifests/crds");
    let cases = [
        (
            "analysis-template-crd.yaml",
            "analysistemplates.argoproj.io",
        ),
        (
            "cluster-analysis-template-crd.yaml",
            "clusteranalysistemplates.argoproj.io",
        ),
        ("analysis-run-crd.yaml", "analysisruns.argoproj.io"),
        ("experiment-crd.yaml", "experiments.argoproj.io"),
    ];
    let mut missing = Vec::new();
    for (file, name) in cases {
        let text = std::fs::read_to_string(dir.join(file)).expect("Argo CRD file");
        let argo: Value = serde_saphyr::from_str(&text).expect("Argo CRD parses");
        let ours = crd_json(name);
        // apiVersion, kind and metadata are the API server's; compare what the kinds define.
        for part in ["spec", "status"] {
            missing_fields(
                &schema(&argo)["properties"][part],
                &schema(&ours)["properties"][part],
                &format!("{name}.{part}"),
                &mut missing,
            );
        }
    }
    assert!(
        missing.is_empty(),
        "missing in our schemas:\n{}",
        missing.join("\n")
    );
}
