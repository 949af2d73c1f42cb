//! Scenario 3: a bad release (SIM_ERROR_RATE 0.2 against stable's 0.01) is rolled back
//! automatically: the baseline judge finds the canary's error ratio higher than stable's in
//! the same window, the AnalysisRun fails after exactly `consecutiveFailureLimit` (2) failed
//! measurements, and the Rollout aborts to stable, which then gets all the traffic. (The
//! [judge] issue's "rolls back one that is worse".)

use std::time::Duration;

use rollouts_e2e::harness::Scenario;

const STABLE_ERROR_RATE: &str = "0.01";
const CANARY_ERROR_RATE: &str = "0.2";
const RPS: &str = "1000";
/// `consecutiveFailureLimit` of errors-vs-stable.yaml.
const CONSECUTIVE_FAILURE_LIMIT: usize = 2;

fn a_worse_release_is_rolled_back(s: &Scenario) {
    let given = s.given();
    given
        .controller_is_running()
        .manifest("service.yaml", &[("RPS", RPS)])
        .manifest("errors-vs-stable.yaml", &[])
        .manifest(
            "rollout-canary-judge.yaml",
            &[("VERSION", "1"), ("ERROR_RATE", STABLE_ERROR_RATE)],
        );
    let stable = given.rollout_is_healthy(Duration::from_secs(20));
    given.prometheus_has_seen_requests(&stable, 2, Duration::from_secs(20));

    s.when().manifest(
        "rollout-canary-judge.yaml",
        &[("VERSION", "2"), ("ERROR_RATE", CANARY_ERROR_RATE)],
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
        run.phase() == "Failed" && phases == ["Failed"; CONSECUTIVE_FAILURE_LIMIT],
        || {
            format!(
                "the judge's run {} ended {} with measurements {phases:?}; want Failed after exactly \
                 {CONSECUTIVE_FAILURE_LIMIT} Failed measurements:\n{}",
                run.name(),
                run.phase(),
                serde_json::to_string_pretty(&run.0["status"]).unwrap_or_default()
            )
        },
    );
    let verdicts: Vec<String> = run
        .metric("errors-vs-stable")
        .and_then(|m| m["measurements"].as_array())
        .into_iter()
        .flatten()
        .map(|m| m["value"].as_str().unwrap_or_default().to_string())
        .collect();
    then.holds(verdicts.iter().all(|v| v.contains("High")), || {
        format!("every failed measurement should be the judge's High verdict: {verdicts:?}")
    });

    let rollout = then.eventually(
        "the abort back to stable: all 5 pods on the old revision, none on the new",
        Duration::from_secs(20),
        |t| {
            let rollout = t.rollout();
            let replicas = t.replicas_by_hash();
            let back = rollout.aborted()
                && rollout.phase() == "Degraded"
                && rollout.stable_hash() == stable
                && replicas.get(&stable) == Some(&(5, 5))
                && replicas.get(&canary) == Some(&(0, 0));
            back.then_some(rollout)
        },
    );
    then.holds(rollout.message().contains("RolloutAborted"), || {
        format!(
            "the status message should say the rollout aborted: {:?}",
            rollout.message()
        )
    });
    let canary_requests =
        format!("sum(rate(http_requests_total{{rollouts_pod_template_hash=\"{canary}\"}}[2s]))");
    let stable_requests =
        format!("sum(rate(http_requests_total{{rollouts_pod_template_hash=\"{stable}\"}}[2s]))");
    then.eventually(
        "traffic at 100% stable: Prometheus sees requests to stable and none to the canary",
        Duration::from_secs(15),
        |t| {
            let to_canary = t.prometheus_values(&canary_requests).ok()?;
            let to_stable = t.prometheus_values(&stable_requests).ok()?;
            (to_canary.iter().all(|rate| *rate == 0.0)
                && to_stable.first().is_some_and(|r| *r > 0.0))
            .then_some(())
        },
    );
}

#[test]
fn scenario_3_on_kube_sim() {
    a_worse_release_is_rolled_back(&Scenario::on_sim(
        "scenario_3_bad_release_rolled_back",
        "web",
    ));
}

#[test]
fn scenario_3_on_a_real_cluster() {
    if let Some(s) = Scenario::on_real_cluster("scenario_3_bad_release_rolled_back", "web") {
        a_worse_release_is_rolled_back(&s);
    }
}
