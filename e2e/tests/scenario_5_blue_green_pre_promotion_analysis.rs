//! Scenario 5: blue-green with a pre-promotion analysis that measures the preview's own error
//! ratio in Prometheus. A good release (the same SIM_ERROR_RATE as stable) passes every
//! measurement and the active Service switches to it; a bad one (SIM_ERROR_RATE 0.2) fails
//! its analysis, the active Service never leaves the old revision, and the Rollout is
//! Degraded.

use std::collections::BTreeSet;
use std::time::Duration;

use rollouts_e2e::harness::{AnalysisRunView, REAL_LOAD_IMAGE_ENV, Scenario};

const RPS: &str = "200";
const STABLE_ERROR_RATE: &str = "0.01";
const BAD_ERROR_RATE: &str = "0.2";
/// The metric of s5-preview-error-ratio.yaml, its `count` and its `failureLimit`.
const METRIC: &str = "preview-error-ratio";
const COUNT: usize = 3;
const FAILURE_LIMIT: usize = 1;
const HASH_LABEL: &str = "rollouts-pod-template-hash";
/// The load generator's image on a real cluster unless REAL_LOAD_IMAGE_ENV names another.
const DEFAULT_LOAD_IMAGE: &str = "busybox:1.36";

/// The pod template hash a Service's selector names ("" when none).
fn selected_hash(s: &Scenario, service: &str) -> String {
    s.kubectl()
        .get_json(&["service", service])
        .map(|svc| {
            svc["spec"]["selector"][HASH_LABEL]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .unwrap_or_else(|e| panic!("scenario {}: {e}", s.name()))
}

/// The release of `error_rate` comes up behind the preview Service; returns (stable hash, new
/// hash, the finished pre-promotion run, every hash the active Service selected before the run
/// finished).
fn a_release_is_analysed_in_preview(
    s: &Scenario,
    error_rate: &str,
) -> (String, String, AnalysisRunView, BTreeSet<String>) {
    let given = s.given();
    given
        .controller_is_running()
        .manifest("s5-services.yaml", &[("RPS", RPS)])
        .manifest("s5-preview-error-ratio.yaml", &[]);
    if s.is_real_cluster() {
        // A real Service gets no load from an annotation: a client per Service sends it.
        let image =
            std::env::var(REAL_LOAD_IMAGE_ENV).unwrap_or_else(|_| DEFAULT_LOAD_IMAGE.into());
        given.manifest("s5-real-cluster-load.yaml", &[("LOAD_IMAGE", &image)]);
    }
    given.manifest(
        "s5-rollout-blue-green.yaml",
        &[("VERSION", "1"), ("ERROR_RATE", STABLE_ERROR_RATE)],
    );
    let stable = given.rollout_is_healthy(Duration::from_secs(20));

    s.when().manifest(
        "s5-rollout-blue-green.yaml",
        &[("VERSION", "2"), ("ERROR_RATE", error_rate)],
    );
    let then = s.then();
    let mut active_selected = BTreeSet::new();
    let new = then.eventually(
        "the new revision behind the preview Service",
        Duration::from_secs(15),
        |t| {
            active_selected.insert(selected_hash(s, "web"));
            let hash = t.rollout().current_hash().to_string();
            let previewed = hash != stable && selected_hash(s, "web-preview") == hash;
            previewed.then_some(hash)
        },
    );
    let run = then.eventually(
        "the pre-promotion AnalysisRun of the new revision to finish",
        Duration::from_secs(40),
        |t| {
            // Read before the runs: if the run is still going after, the switch had not come.
            let active = selected_hash(s, "web");
            let finished = t.analysis_runs().into_iter().find(|run| {
                run.hash() == new
                    && matches!(
                        run.phase(),
                        "Successful" | "Failed" | "Error" | "Inconclusive"
                    )
            });
            if finished.is_none() {
                active_selected.insert(active);
            }
            finished
        },
    );
    (stable, new, run, active_selected)
}

fn run_text(run: &AnalysisRunView) -> String {
    serde_json::to_string_pretty(&run.0["status"]).unwrap_or_default()
}

fn a_good_release_is_switched_to(s: &Scenario) {
    let (stable, new, run, active_selected) =
        a_release_is_analysed_in_preview(s, STABLE_ERROR_RATE);
    let then = s.then();
    let phases = run.measurement_phases(METRIC);
    then.holds(
        run.phase() == "Successful" && phases == ["Successful"; COUNT],
        || {
            format!(
                "the pre-promotion run {} ended {} with measurements {phases:?}; want Successful \
             after {COUNT} Successful measurements:\n{}",
                run.name(),
                run.phase(),
                run_text(&run)
            )
        },
    );
    then.holds(active_selected == BTreeSet::from([stable.clone()]), || {
        format!(
            "the active Service should stay on {stable} until the analysis passed; it selected \
             {active_selected:?}"
        )
    });
    then.eventually(
        "the active Service switched to the new revision and the Rollout Healthy on it",
        Duration::from_secs(20),
        |t| {
            let rollout = t.rollout();
            let switched = rollout.is_healthy()
                && rollout.stable_hash() == new
                && rollout.0["status"]["blueGreen"]["activeSelector"] == new.as_str()
                && selected_hash(s, "web") == new;
            switched.then_some(())
        },
    );
    then.holds(!then.rollout().aborted(), || {
        "the rollout was aborted".into()
    });
}

fn a_bad_release_fails_its_analysis_and_stays_out(s: &Scenario) {
    let (stable, new, run, mut active_selected) =
        a_release_is_analysed_in_preview(s, BAD_ERROR_RATE);
    let then = s.then();
    let phases = run.measurement_phases(METRIC);
    then.holds(
        run.phase() == "Failed" && phases == ["Failed"; FAILURE_LIMIT + 1],
        || {
            format!(
                "the pre-promotion run {} ended {} with measurements {phases:?}; want Failed \
                 after {} Failed measurements (failureLimit {FAILURE_LIMIT}):\n{}",
                run.name(),
                run.phase(),
                FAILURE_LIMIT + 1,
                run_text(&run)
            )
        },
    );
    let rollout = then.eventually(
        "the update aborted: the Rollout Degraded with the active Service on the old revision",
        Duration::from_secs(20),
        |t| {
            active_selected.insert(selected_hash(s, "web"));
            let rollout = t.rollout();
            let held_back = rollout.aborted()
                && rollout.phase() == "Degraded"
                && rollout.stable_hash() == stable
                && rollout.0["status"]["blueGreen"]["activeSelector"] == stable.as_str();
            held_back.then_some(rollout)
        },
    );
    then.holds(active_selected == BTreeSet::from([stable.clone()]), || {
        format!(
            "the active Service should never leave {stable} for the failed {new}; it selected \
             {active_selected:?}"
        )
    });
    then.holds(rollout.message().contains("RolloutAborted"), || {
        format!(
            "the status message should say the rollout aborted: {:?}",
            rollout.message()
        )
    });
}

#[test]
fn scenario_5_a_good_release_is_switched_to() {
    a_good_release_is_switched_to(&Scenario::on_sim(
        "scenario_5_blue_green_good_release",
        "web",
    ));
}

#[test]
fn scenario_5_a_bad_release_fails_its_analysis() {
    a_bad_release_fails_its_analysis_and_stays_out(&Scenario::on_sim(
        "scenario_5_blue_green_bad_release",
        "web",
    ));
}

#[test]
fn scenario_5_a_good_release_on_a_real_cluster() {
    if let Some(s) = Scenario::on_real_cluster("scenario_5_blue_green_good_release", "web") {
        a_good_release_is_switched_to(&s);
    }
}

#[test]
fn scenario_5_a_bad_release_on_a_real_cluster() {
    if let Some(s) = Scenario::on_real_cluster("scenario_5_blue_green_bad_release", "web") {
        a_bad_release_fails_its_analysis_and_stays_out(&s);
    }
}
