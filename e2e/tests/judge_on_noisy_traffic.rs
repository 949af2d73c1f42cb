//! The judge counting errors (`kind: ratio`) on noisy traffic: kube-sim draws arrivals and errors
//! at random from a fixed seed (Service annotation `sim.rollouts.dev/traffic-seed`). A release
//! erring twice as often as stable (2% against 1%) is rolled back; a release erring as often as
//! stable is promoted. (The [judge-noise] issue's tests on kube-sim.)

use std::time::Duration;

use rollouts_e2e::harness::{AnalysisRunView, Scenario};

const STABLE_ERROR_RATE: &str = "0.01";
/// Requests per second: the one canary pod of five gets 800, about 80 errors in a 10s window.
const RPS: &str = "4000";

/// Deploys stable at 1% behind noisy traffic from `seed`, then releases a version erring
/// `canary_error_rate`; returns (stable hash, canary hash, the judge's finished run).
fn release(s: &Scenario, seed: &str, canary_error_rate: &str) -> (String, String, AnalysisRunView) {
    let given = s.given();
    given
        .controller_is_running()
        .manifest("noisy-service.yaml", &[("RPS", RPS), ("SEED", seed)])
        .manifest("errors-vs-stable-ratio.yaml", &[])
        .manifest(
            "rollout-canary-judge.yaml",
            &[("VERSION", "1"), ("ERROR_RATE", STABLE_ERROR_RATE)],
        );
    let stable = given.rollout_is_healthy(Duration::from_secs(20));
    given.prometheus_has_seen_requests(&stable, 2, Duration::from_secs(20));
    s.when().manifest(
        "rollout-canary-judge.yaml",
        &[("VERSION", "2"), ("ERROR_RATE", canary_error_rate)],
    );
    let then = s.then();
    let canary = then.new_revision(&stable, Duration::from_secs(10));
    let run = then.finished_run(
        "the judge's AnalysisRun of the canary",
        &canary,
        Duration::from_secs(45),
    );
    (stable, canary, run)
}

fn values(run: &AnalysisRunView) -> Vec<String> {
    run.metric("errors-vs-stable")
        .and_then(|m| m["measurements"].as_array())
        .into_iter()
        .flatten()
        .map(|m| m["value"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn a_release_erring_twice_as_often_is_rolled_back() {
    let s = Scenario::on_sim("judge_noisy_twice_the_errors", "web");
    let (stable, canary, run) = release(&s, "11", "0.02");
    let then = s.then();
    let phases = run.measurement_phases("errors-vs-stable");
    then.holds(run.phase() == "Failed" && phases == ["Failed"; 2], || {
        format!(
            "the judge's run {} ended {} with measurements {phases:?}; want Failed after two \
                 Failed measurements in a row: {:?}",
            run.name(),
            run.phase(),
            values(&run)
        )
    });
    let counted = values(&run);
    then.holds(
        counted
            .iter()
            .all(|v| v.contains("\"verdict\":\"High\"") && v.contains("canaryErrors")),
        || format!("every failed measurement should be a High on counts: {counted:?}"),
    );
    then.eventually(
        "the abort back to stable: all 5 pods on the old revision, none on the new",
        Duration::from_secs(20),
        |t| {
            let replicas = t.replicas_by_hash();
            (t.rollout().aborted()
                && replicas.get(&stable) == Some(&(5, 5))
                && replicas.get(&canary) == Some(&(0, 0)))
            .then_some(())
        },
    );
}

#[test]
fn a_release_erring_as_often_as_stable_is_promoted() {
    let s = Scenario::on_sim("judge_noisy_same_errors", "web");
    let (_, canary, run) = release(&s, "12", STABLE_ERROR_RATE);
    let then = s.then();
    let phases = run.measurement_phases("errors-vs-stable");
    // At confidence 0.99 a release as good as stable is still judged High now and then (about one
    // measurement in a few hundred, more with Prometheus' extrapolated increase()); that is what
    // consecutiveFailureLimit 2 absorbs. So: three measurements, a run that ends Successful, and
    // never two High verdicts in a row.
    let lone_failures = !phases
        .windows(2)
        .any(|w| w[0] == "Failed" && w[1] == "Failed");
    then.holds(
        run.phase() == "Successful" && phases.len() == 3 && lone_failures,
        || {
            format!(
                "the judge's run {} ended {} with measurements {phases:?}; want a Successful \
                 run of three measurements with no two Failed in a row: {:?}",
                run.name(),
                run.phase(),
                values(&run)
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
}
