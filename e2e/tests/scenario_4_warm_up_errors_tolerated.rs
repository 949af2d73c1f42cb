//! Scenario 4: a release whose pods err only while warming up (half their requests in their
//! first seconds after becoming ready, then 1%) is not rolled back: the analysis step's
//! `initialDelay` starts measuring after the warm-up, so the canary is promoted although
//! Prometheus did record its warm-up errors.

use std::time::Duration;

use rollouts_e2e::harness::Scenario;

const ERROR_RATE: &str = "0.01";
const WARMUP_SECONDS: &str = "8";
const WARMUP_ERROR_RATE: &str = "0.5";
/// Past the warm-up plus the query's 3s rate range and a scrape or two.
const INITIAL_DELAY: &str = "14s";
const RPS: &str = "400";

fn warm_up_errors_do_not_roll_back(s: &Scenario) {
    let given = s.given();
    given
        .controller_is_running()
        .manifest("service.yaml", &[("RPS", RPS)])
        .manifest(
            "canary-error-ratio.yaml",
            &[("INITIAL_DELAY", INITIAL_DELAY)],
        )
        .manifest(
            "rollout-canary-warm-up.yaml",
            &[
                ("VERSION", "1"),
                ("ERROR_RATE", ERROR_RATE),
                ("WARMUP_SECONDS", "0"),
                ("WARMUP_ERROR_RATE", ERROR_RATE),
            ],
        );
    let stable = given.rollout_is_healthy(Duration::from_secs(20));

    s.when().manifest(
        "rollout-canary-warm-up.yaml",
        &[
            ("VERSION", "2"),
            ("ERROR_RATE", ERROR_RATE),
            ("WARMUP_SECONDS", WARMUP_SECONDS),
            ("WARMUP_ERROR_RATE", WARMUP_ERROR_RATE),
        ],
    );

    let then = s.then();
    let canary = then.new_revision(&stable, Duration::from_secs(10));
    // The analysis's own query, evaluated every second of the last minute: had it measured
    // during the warm-up, it would have failed.
    let worst_ratio = format!(
        "max_over_time((sum(rate(http_requests_total{{code=\"500\",rollouts_pod_template_hash=\"{canary}\"}}[3s])) \
         / sum(rate(http_requests_total{{rollouts_pod_template_hash=\"{canary}\"}}[3s])))[1m:1s])"
    );
    then.eventually(
        "Prometheus to see the canary's error ratio above the analysis's 5% during its warm-up",
        Duration::from_secs(15),
        |t| {
            let worst = t.prometheus_values(&worst_ratio).ok()?;
            worst.first().is_some_and(|r| *r > 0.05).then_some(())
        },
    );
    let run = then.finished_run("the canary's AnalysisRun", &canary, Duration::from_secs(40));
    let phases = run.measurement_phases("canary-error-ratio");
    then.holds(
        run.phase() == "Successful" && phases == ["Successful"; 3],
        || {
            format!(
                "the run {} ended {} with measurements {phases:?}; the warm-up should have been skipped:\n{}",
                run.name(),
                run.phase(),
                serde_json::to_string_pretty(&run.0["status"]).unwrap_or_default()
            )
        },
    );
    then.eventually(
        "the canary to be promoted: stable at the new revision with all 4 pods",
        Duration::from_secs(20),
        |t| {
            let rollout = t.rollout();
            (rollout.is_healthy() && rollout.stable_hash() == canary).then_some(())
        },
    );
    then.holds(!then.rollout().aborted(), || {
        "the rollout was aborted".into()
    });
}

#[test]
fn scenario_4_on_kube_sim() {
    warm_up_errors_do_not_roll_back(&Scenario::on_sim(
        "scenario_4_warm_up_errors_tolerated",
        "web",
    ));
}

#[test]
fn scenario_4_on_a_real_cluster() {
    if let Some(s) = Scenario::on_real_cluster("scenario_4_warm_up_errors_tolerated", "web") {
        warm_up_errors_do_not_roll_back(&s);
    }
}
