//! Scenario 1: a basic canary of a release as good as stable (the same SIM_ERROR_RATE) is
//! promoted to 100% by an analysis step whose baseline judge compares the canary's error ratio
//! with stable's in the same window. (The [judge] issue's "promotes a release equal to stable".)

use std::time::Duration;

use rollouts_e2e::harness::Scenario;

/// Both versions fail 1% of their requests.
const ERROR_RATE: &str = "0.01";
/// Requests per second to the app: the one canary pod of five gets 200, two of them errors.
const RPS: &str = "1000";

fn a_release_as_good_as_stable_is_promoted(s: &Scenario) {
    let given = s.given();
    given
        .controller_is_running()
        .manifest("service.yaml", &[("RPS", RPS)])
        .manifest("errors-vs-stable.yaml", &[])
        .manifest(
            "rollout-canary-judge.yaml",
            &[("VERSION", "1"), ("ERROR_RATE", ERROR_RATE)],
        );
    let stable = given.rollout_is_healthy(Duration::from_secs(20));
    given.prometheus_has_seen_requests(&stable, 2, Duration::from_secs(20));

    s.when().manifest(
        "rollout-canary-judge.yaml",
        &[("VERSION", "2"), ("ERROR_RATE", ERROR_RATE)],
    );

    let then = s.then();
    let canary = then.new_revision(&stable, Duration::from_secs(10));
    let run = then.finished_run(
        "the judge's AnalysisRun of the canary",
        &canary,
        Duration::from_secs(40),
    );
    let phases = run.measurement_phases("errors-vs-stable");
    then.holds(
        run.phase() == "Successful" && phases == ["Successful"; 3],
        || {
            format!(
                "the judge's run {} ended {} with measurements {phases:?}; want Successful after 3 \
                 Successful measurements:\n{}",
                run.name(),
                run.phase(),
                serde_json::to_string_pretty(&run.0["status"]).unwrap_or_default()
            )
        },
    );
    then.eventually(
        "the canary to be promoted: stable at the new revision with all 5 pods",
        Duration::from_secs(20),
        |t| {
            let rollout = t.rollout();
            (rollout.is_healthy() && rollout.stable_hash() == canary).then_some(())
        },
    );
    let replicas = then.replicas_by_hash();
    then.holds(
        replicas.get(&canary) == Some(&(5, 5)) && replicas.get(&stable) == Some(&(0, 0)),
        || format!("want the new revision at 5/5 pods and the old one at 0, have {replicas:?}"),
    );
    then.holds(!then.rollout().aborted(), || {
        "the rollout was aborted".into()
    });
}

#[test]
fn scenario_1_on_kube_sim() {
    a_release_as_good_as_stable_is_promoted(&Scenario::on_sim(
        "scenario_1_good_release_promoted",
        "web",
    ));
}

#[test]
fn scenario_1_on_a_real_cluster() {
    if let Some(s) = Scenario::on_real_cluster("scenario_1_good_release_promoted", "web") {
        a_release_as_good_as_stable_is_promoted(&s);
    }
}
