//! `kubectl-rollouts lint` run as a process on the manifests in `tests/fixtures`, checking its
//! output and exit status. Set `UPDATE_EXPECTED=1` to rewrite the `.expected` files after an
//! intended change (then read the diff).

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Runs `lint -f FILE [extra]` from `dir`; returns stdout and whether the exit status was 0.
fn lint_in(dir: &Path, file: &str, extra: &[&str]) -> (String, bool) {
    let output = Command::new(env!("CARGO_BIN_EXE_kubectl-rollouts"))
        .current_dir(dir)
        .args(["lint", "-f", file])
        .args(extra)
        .output()
        .expect("the kubectl-rollouts binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.is_empty(), "lint wrote to stderr: {stderr}");
    (
        String::from_utf8(output.stdout).expect("lint prints UTF-8"),
        output.status.success(),
    )
}

fn lint(file: &str, extra: &[&str]) -> (String, bool) {
    lint_in(&fixtures(), file, extra)
}

/// Compares lint's output on `name.yaml` with `name.expected`.
fn assert_expected(name: &str) -> bool {
    let (stdout, success) = lint(&format!("{name}.yaml"), &[]);
    let expected_path = fixtures().join(format!("{name}.expected"));
    if std::env::var_os("UPDATE_EXPECTED").is_some() {
        std::fs::write(&expected_path, &stdout).expect("expected file is writable");
    }
    let expected = std::fs::read_to_string(&expected_path).expect("expected file exists");
    assert_eq!(stdout, expected, "lint output of {name}.yaml changed");
    success
}

#[test]
fn a_good_canary_has_nothing_to_report_and_exits_zero() {
    assert!(assert_expected("good-canary-nginx"));
}

#[test]
fn warnings_alone_exit_zero() {
    assert!(assert_expected("warnings-basic-canary"));
}

#[test]
fn a_syntax_error_is_an_error_with_its_position() {
    assert!(!assert_expected("not-yaml"));
}

#[test]
fn errors_name_document_field_and_fix_and_exit_non_zero() {
    let (stdout, success) = lint("errors-mixed.yaml", &[]);
    assert!(!success, "errors must fail the exit status:\n{stdout}");
    let rollout = "errors-mixed.yaml: Rollout 'checkout' (document 1): error: ";
    let template = "errors-mixed.yaml: AnalysisTemplate 'error-rate' (document 2): error: ";
    for expected_start in [
        format!(
            "{rollout}spec.strategy.canary.steps[2].pause.durration: unknown field \"durration\""
        ),
        format!("{rollout}spec.strategy.canary.steps[0].setWeight: "),
        format!(
            "{rollout}spec.strategy.canary.steps[1].setHeaderRoute.match: the nginx router matches canary requests on exactly one header, this step gives 2"
        ),
        format!("{template}spec.metrics[0].provider: "),
    ] {
        assert!(
            stdout.lines().any(|line| line.starts_with(&expected_start)),
            "no line starts with {expected_start:?} in:\n{stdout}"
        );
    }
    assert!(stdout.contains("did you mean \"duration\"?"), "{stdout}");
    assert!(
        stdout
            .lines()
            .all(|line| line.contains("(fix: ") || line.contains(" checked, "))
    );
    assert!(
        stdout.ends_with("errors-mixed.yaml: 2 objects checked, 6 errors, 0 warnings\n"),
        "{stdout}"
    );
}

#[test]
fn json_output_carries_every_finding() {
    let (stdout, success) = lint("warnings-basic-canary.yaml", &["-o", "json"]);
    assert!(success);
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("-o json prints JSON");
    assert_eq!(report["file"], "warnings-basic-canary.yaml");
    assert_eq!(report["checked"], 1);
    let findings = report["findings"].as_array().expect("findings is a list");
    assert_eq!(findings.len(), 5);
    let weight = findings
        .iter()
        .find(|f| f["path"] == "spec.strategy.canary.steps[0].setWeight")
        .expect("the 5% step is reported");
    assert_eq!(weight["severity"], "warning");
    assert_eq!(weight["kind"], "Rollout");
    assert_eq!(weight["name"], "shop");
    assert_eq!(weight["document"], 1);
    assert!(
        weight["reason"]
            .as_str()
            .unwrap()
            .contains("5% becomes 20% (1 canary and 4 stable pods")
    );
}

#[test]
fn a_missing_file_is_reported_on_stderr() {
    let output = Command::new(env!("CARGO_BIN_EXE_kubectl-rollouts"))
        .current_dir(fixtures())
        .args(["lint", "-f", "no-such-file.yaml"])
        .output()
        .expect("the kubectl-rollouts binary runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("error: cannot read no-such-file.yaml: "),
        "{stderr}"
    );
}

/// Argo Rollouts' own lint fixtures, when `ARGO_ROLLOUTS_SRC` points at its source tree.
/// Its valid manifests must have no error except routers this controller does not run; each of
/// its invalid ones must have an error of another kind.
#[test]
fn argo_lint_fixtures_agree_when_available() {
    let Some(argo) = std::env::var_os("ARGO_ROLLOUTS_SRC") else {
        eprintln!("ARGO_ROLLOUTS_SRC is not set; skipping Argo's lint fixtures");
        return;
    };
    let testdata = Path::new(&argo).join("pkg/kubectl-argo-rollouts/cmd/lint/testdata");
    let mut checked = 0;
    for entry in std::fs::read_dir(&testdata).expect("Argo's lint testdata is readable") {
        let file = entry
            .expect("directory entry")
            .file_name()
            .to_string_lossy()
            .to_string();
        let (stdout, success) = lint_in(&testdata, &file, &[]);
        let errors: Vec<&str> = stdout
            .lines()
            .filter(|line| line.contains(" error: "))
            .filter(|line| !line.contains("is not supported by this controller"))
            .collect();
        if file.starts_with("valid") {
            assert!(
                errors.is_empty(),
                "{file} is valid but lint says:\n{stdout}"
            );
        } else {
            assert!(
                !success && !errors.is_empty(),
                "{file} is invalid but lint says:\n{stdout}"
            );
        }
        checked += 1;
    }
    assert!(
        checked > 10,
        "only {checked} Argo fixtures found in {}",
        testdata.display()
    );
}
