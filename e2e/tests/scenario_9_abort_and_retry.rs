//! Scenario 9: a person aborts a canary paused at 20% with `kubectl rollouts abort`: the Rollout
//! goes back to stable (all pods on the old revision), Degraded, with a message saying the
//! update was aborted; `kubectl rollouts retry rollout` starts the update again from its first
//! step, and `kubectl rollouts promote` takes it to the end.

use std::time::Duration;

use rollouts_e2e::harness::Scenario;

fn abort_then_retry_completes(s: &Scenario) {
    let given = s.given();
    given
        .controller_is_running()
        .manifest("service.yaml", &[("RPS", "100")])
        .manifest("rollout-canary-pause.yaml", &[("VERSION", "1")]);
    let stable = given.rollout_is_healthy(Duration::from_secs(20));

    s.when()
        .manifest("rollout-canary-pause.yaml", &[("VERSION", "2")]);
    let then = s.then();
    let paused_at_20 = |t: &rollouts_e2e::harness::Then<'_>| {
        let rollout = t.rollout();
        let canary = rollout.current_hash().to_string();
        let replicas = t.replicas_by_hash();
        let paused = canary != stable
            && rollout.current_step_index() == Some(1)
            && rollout.pause_reasons() == ["CanaryPauseStep"]
            && replicas.get(&canary) == Some(&(1, 1))
            && replicas.get(&stable) == Some(&(4, 4));
        paused.then_some(canary)
    };
    let canary = then.eventually(
        "the canary paused at 20% (1 of 5 pods)",
        Duration::from_secs(20),
        paused_at_20,
    );

    s.when().plugin(["abort", "web"]);
    let aborted = then.eventually(
        "the abort: stable back at 5 pods, the canary at 0, Degraded",
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
    let progressing = aborted.condition("Progressing");
    then.holds(
        aborted.message().contains("aborted update to revision 2")
            && progressing.as_ref().is_some_and(|(reason, message)| {
                reason == "RolloutAborted" && message.contains("aborted update to revision 2")
            }),
        || {
            format!(
                "the status should say clearly that the update was aborted: message {:?}, Progressing {progressing:?}",
                aborted.message()
            )
        },
    );

    s.when().plugin(["retry", "rollout", "web"]);
    then.eventually(
        "the retry: the same canary paused at 20% again",
        Duration::from_secs(20),
        |t| {
            let rollout = t.rollout();
            (!rollout.aborted()).then_some(())?;
            paused_at_20(t).filter(|hash| *hash == canary)
        },
    );

    s.when().plugin(["promote", "web"]);
    then.eventually(
        "the update to complete: Healthy on the new revision",
        Duration::from_secs(30),
        |t| {
            let rollout = t.rollout();
            (rollout.is_healthy() && rollout.stable_hash() == canary).then_some(())
        },
    );
    let replicas = then.replicas_by_hash();
    then.holds(
        replicas.get(&canary) == Some(&(5, 5))
            && replicas.get(&stable) == Some(&(0, 0))
            && replicas.len() == 2,
        || format!("want the new revision at 5/5 and the old one at 0, have {replicas:?}"),
    );
}

#[test]
fn scenario_9_on_kube_sim() {
    abort_then_retry_completes(&Scenario::on_sim("scenario_9_abort_and_retry", "web"));
}

#[test]
fn scenario_9_on_a_real_cluster() {
    if let Some(s) = Scenario::on_real_cluster("scenario_9_abort_and_retry", "web") {
        abort_then_retry_completes(&s);
    }
}
