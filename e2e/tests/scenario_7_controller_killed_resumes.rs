//! Scenario 7: the controller is killed (SIGKILL: no shutdown, no last write) in the middle of
//! a canary and a new process is started: it resumes from the Rollout's status, so every step
//! is completed exactly once (one RolloutStepCompleted event each, never folded into a
//! repeat), the step index never goes back, no third ReplicaSet appears, and the Rollout
//! reaches Healthy.

use std::collections::BTreeSet;
use std::time::Duration;

use rollouts_e2e::harness::Scenario;

/// Steps of rollout-canary-steps.yaml.
const STEPS: u64 = 8;
/// The step the controller is killed in: the 2s pause at 40%.
const KILLED_AT_STEP: u64 = 3;

fn a_restarted_controller_resumes(s: &Scenario) {
    let given = s.given();
    given
        .controller_is_running()
        .manifest("service.yaml", &[("RPS", "100")])
        .manifest("rollout-canary-steps.yaml", &[("VERSION", "1")]);
    let stable = given.rollout_is_healthy(Duration::from_secs(20));

    s.when()
        .manifest("rollout-canary-steps.yaml", &[("VERSION", "2")]);
    let then = s.then();
    let mut seen_steps = Vec::new();
    // Killed once the last completed step's event is out: an event in flight at the kill
    // would be lost whatever the controller did, and this scenario is about the restart.
    let canary = then.eventually(
        &format!("the canary to reach step {KILLED_AT_STEP} (a pause), its step event recorded"),
        Duration::from_secs(20),
        |t| {
            let rollout = t.rollout();
            let step = rollout.current_step_index()?;
            seen_steps.push(step);
            let mid_rollout = (KILLED_AT_STEP..STEPS).contains(&step);
            if rollout.current_hash() == stable || !mid_rollout {
                return None;
            }
            let completed = format!("Rollout step {step}/{STEPS} completed");
            let recorded = t.events().iter().any(|e| e.note.starts_with(&completed));
            recorded.then(|| rollout.current_hash().to_string())
        },
    );

    s.when().controller_is_killed();
    // Read after the kill: the controller may have moved on since the last look.
    let step_at_kill = then.rollout().current_step_index().unwrap_or_default();
    then.holds(step_at_kill < STEPS, || {
        format!("the controller should be killed mid-rollout, but it was at step {step_at_kill} of {STEPS}")
    });
    seen_steps.push(step_at_kill);
    let replica_sets_at_kill = then.replica_sets();
    s.when().controller_restarts();

    then.eventually(
        "the Rollout to be Healthy on the new revision",
        Duration::from_secs(40),
        |t| {
            let rollout = t.rollout();
            if let Some(step) = rollout.current_step_index() {
                seen_steps.push(step);
            }
            (rollout.is_healthy() && rollout.stable_hash() == canary).then_some(())
        },
    );

    then.holds(seen_steps.windows(2).all(|w| w[0] <= w[1]), || {
        format!("the step index went back: {seen_steps:?} (killed at {step_at_kill})")
    });
    then.holds(then.rollout().current_step_index() == Some(STEPS), || {
        format!("want currentStepIndex {STEPS} at the end")
    });
    let names_at_kill: BTreeSet<String> =
        replica_sets_at_kill.into_iter().map(|rs| rs.name).collect();
    let sets = then.replica_sets();
    let names_now: BTreeSet<String> = sets.iter().map(|rs| rs.name.clone()).collect();
    then.holds(names_now == names_at_kill && names_now.len() == 2, || {
        format!(
            "want the same two ReplicaSets as before the kill ({names_at_kill:?}), have {sets:?}"
        )
    });
    let events = then.events();
    for step in 1..=STEPS {
        let prefix = format!("Rollout step {step}/{STEPS} completed");
        let completed: Vec<_> = events
            .iter()
            .filter(|e| e.reason == "RolloutStepCompleted" && e.note.starts_with(&prefix))
            .collect();
        then.holds(completed.len() == 1 && completed[0].count == 1, || {
            format!("step {step} should complete exactly once, found {completed:?}")
        });
    }
}

#[test]
fn scenario_7_on_kube_sim() {
    a_restarted_controller_resumes(&Scenario::on_sim(
        "scenario_7_controller_killed_resumes",
        "web",
    ));
}

#[test]
fn scenario_7_on_a_real_cluster() {
    if let Some(s) = Scenario::on_real_cluster("scenario_7_controller_killed_resumes", "web") {
        a_restarted_controller_resumes(&s);
    }
}
