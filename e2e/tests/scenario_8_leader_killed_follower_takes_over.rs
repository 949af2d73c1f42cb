//! Scenario 8: two controller replicas with leader election on. The one holding the Lease is
//! killed (SIGKILL: it neither releases the Lease nor finishes a write) in the middle of a
//! canary; the other, which stood by ready, takes the Lease over once it expires (the holder
//! changes, leaseTransitions goes up) and completes the rollout from the Rollout's status:
//! every step completed exactly once, the step index never going back, no third ReplicaSet.

use std::collections::BTreeSet;
use std::time::Duration;

use rollouts_e2e::harness::Scenario;
use rollouts_e2e::harness::leader_election::{LEASE_NAME, Replica, lease_holder};

/// Steps of s8-rollout-canary-steps.yaml.
const STEPS: u64 = 8;
/// The leader is killed once the canary has reached this step (the 2s pause at 40%).
const KILLED_AT_STEP: u64 = 3;
/// How long the Lease stays valid without renewal: the shortest the controller takes.
const LEASE_DURATION: &str = "3s";

fn the_follower_takes_over_and_completes_the_rollout(s: &Scenario) {
    let given = s.given();
    let then = s.then();
    let mut leader = Replica::start(s, "replica-a", LEASE_DURATION);
    then.eventually(
        &format!("{} to hold the Lease {LEASE_NAME}", leader.name()),
        Duration::from_secs(20),
        |_| (lease_holder(s)?.0 == leader.identity()).then_some(()),
    );
    let mut follower = Replica::start(s, "replica-b", LEASE_DURATION);
    given.manifest("s8-rollout-canary-steps.yaml", &[("VERSION", "1")]);
    let stable = given.rollout_is_healthy(Duration::from_secs(20));
    let (holder, transitions) = lease_holder(s).unwrap_or_default();
    then.holds(holder == leader.identity(), || {
        format!(
            "{} should still lead while {} stands by, but the Lease is held by {holder:?}",
            leader.name(),
            follower.name()
        )
    });

    s.when()
        .manifest("s8-rollout-canary-steps.yaml", &[("VERSION", "2")]);
    let mut seen_steps = Vec::new();
    let canary = then.eventually(
        &format!("the canary to reach step {KILLED_AT_STEP} (a pause)"),
        Duration::from_secs(20),
        |t| {
            let rollout = t.rollout();
            let step = rollout.current_step_index()?;
            seen_steps.push(step);
            let at = rollout.current_hash() != stable && (KILLED_AT_STEP..STEPS).contains(&step);
            at.then(|| rollout.current_hash().to_string())
        },
    );

    leader.kill();
    // Read after the kill: the leader may have moved on since the last look.
    let step_at_kill = then.rollout().current_step_index().unwrap_or_default();
    then.holds(step_at_kill < STEPS, || {
        format!(
            "the leader should be killed mid-rollout, but it was at step {step_at_kill} of {STEPS}"
        )
    });
    seen_steps.push(step_at_kill);
    let replica_sets_at_kill: BTreeSet<String> =
        then.replica_sets().into_iter().map(|rs| rs.name).collect();

    let taken_over = then.eventually(
        &format!(
            "{} to take the Lease over from the killed {}",
            follower.name(),
            leader.name()
        ),
        Duration::from_secs(20),
        |t| {
            let rollout = t.rollout();
            if let Some(step) = rollout.current_step_index() {
                seen_steps.push(step);
            }
            let (holder, now) = lease_holder(s)?;
            (holder == follower.identity()).then_some(now)
        },
    );
    then.holds(taken_over > transitions, || {
        format!(
            "leaseTransitions should go up with the new holder: {transitions} before, \
             {taken_over} after"
        )
    });

    then.eventually(
        &format!(
            "{} to complete the rollout: Healthy on the new revision",
            follower.name()
        ),
        Duration::from_secs(40),
        |t| {
            let rollout = t.rollout();
            if let Some(step) = rollout.current_step_index() {
                seen_steps.push(step);
            }
            (rollout.is_healthy() && rollout.stable_hash() == canary).then_some(())
        },
    );
    then.holds(follower.exited().is_none(), || {
        format!(
            "{} exited after taking over:\n{}",
            follower.name(),
            follower.log_tail(30)
        )
    });
    then.holds(seen_steps.windows(2).all(|w| w[0] <= w[1]), || {
        format!("the step index went back: {seen_steps:?} (leader killed at {step_at_kill})")
    });
    then.holds(then.rollout().current_step_index() == Some(STEPS), || {
        format!("want currentStepIndex {STEPS} at the end")
    });
    let sets = then.replica_sets();
    let names_now: BTreeSet<String> = sets.iter().map(|rs| rs.name.clone()).collect();
    then.holds(
        names_now == replica_sets_at_kill && names_now.len() == 2,
        || {
            format!(
                "want the same two ReplicaSets as when the leader was killed \
             ({replica_sets_at_kill:?}), have {sets:?}"
            )
        },
    );
    let events = then.events();
    for step in 1..=STEPS {
        let prefix = format!("Rollout step {step}/{STEPS} completed");
        let completed: Vec<_> = events
            .iter()
            .filter(|e| e.reason == "RolloutStepCompleted" && e.note.starts_with(&prefix))
            .collect();
        then.holds(completed.len() == 1 && completed[0].count == 1, || {
            format!(
                "step {step} should complete exactly once across both replicas, found \
                 {completed:?}\n{} log:\n{}\n{} log:\n{}",
                leader.name(),
                leader.log_tail(20),
                follower.name(),
                follower.log_tail(20)
            )
        });
    }
}

#[test]
fn scenario_8_on_kube_sim() {
    the_follower_takes_over_and_completes_the_rollout(&Scenario::on_sim(
        "scenario_8_leader_killed_follower_takes_over",
        "web",
    ));
}

#[test]
fn scenario_8_on_a_real_cluster() {
    if let Some(s) =
        Scenario::on_real_cluster("scenario_8_leader_killed_follower_takes_over", "web")
    {
        the_follower_takes_over_and_completes_the_rollout(&s);
    }
}
