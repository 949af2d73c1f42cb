//! Kill at every write: a routed canary with an analysis step, and a blue-green with
//! pre-promotion analysis, are released once cleanly to count the controller's writes (W);
//! then, for N in a seeded sample of 1..=W (every N with `ROLLOUTS_CHAOS_ALL_WRITES=1`, one
//! with `ROLLOUTS_CHAOS_N`), the controller is SIGKILLed right after its Nth write (kube-sim's
//! write-cut rule refuses it everything after) and restarted. Each release must converge as
//! the clean one did: no duplicate ReplicaSet, every step's RolloutStepCompleted event once,
//! one AnalysisRun, status never going back, traffic never to pods that are not available.

use rollouts_e2e::harness::kill_at_write::{
    ALL_WRITES_ENV, ONLY_N_ENV, Outcome, Release, Run, SEED_ENV, kill_points, seed,
};

/// N killed at per release in `make test` (1 and W always among them).
const SAMPLE: usize = 8;

fn kill_at_every_write(release: Release) {
    let seed = seed();
    let name = release.name();
    let mut clean_run = Run::start(release, "clean").unwrap_or_else(|e| panic!("{name}: {e}"));
    let clean = clean_run
        .release(None)
        .unwrap_or_else(|e| panic!("{name}, clean release: {e}"));
    assert!(
        clean.converged && clean.violations.is_empty(),
        "{name}: the release without faults should converge cleanly: {clean:?} (logs in {})",
        clean_run.dir().display()
    );
    clean_run.remove_logs();
    let writes = clean.writes;
    let points = kill_points(writes, SAMPLE, seed);
    let mut failures = Vec::new();
    let (mut cut, mut converged, mut duplicates, mut repeated, mut skipped) = (0, 0, 0, 0, 0);
    for &n in &points {
        let reproduce = format!("reproduce with {ONLY_N_ENV}={n} (sample seed {SEED_ENV}={seed})");
        let result = Run::start(release, &format!("n{n}")).and_then(|mut run| {
            let outcome = run.release(Some(n))?;
            Ok((run, outcome))
        });
        let (run, outcome) = match result {
            Ok(done) => done,
            Err(e) => {
                failures.push(format!("{name}, killed after write {n}: {e}; {reproduce}"));
                continue;
            }
        };
        cut += u32::from(outcome.cut);
        converged += u32::from(outcome.converged);
        let problems = compare(&clean, &outcome);
        duplicates += outcome.replica_sets.saturating_sub(clean.replica_sets);
        for (note, count) in &clean.step_events {
            let seen = outcome.step_events.get(note).copied().unwrap_or(0);
            repeated += usize::from(seen > *count);
            skipped += usize::from(seen < *count);
        }
        if problems.is_empty() {
            run.remove_logs();
        } else {
            failures.push(format!(
                "{name}, killed after write {n} of {writes}: {}; logs in {}; {reproduce}",
                problems.join("; "),
                run.dir().display()
            ));
        }
    }
    println!(
        "kill at every write, {name}: W = {writes} writes; killed at {cut} of {} N ({}; seed {seed}); \
         converged {converged}/{}; duplicate ReplicaSets {duplicates}; \
         step events repeated {repeated}; step events missing {skipped}",
        points.len(),
        if std::env::var_os(ONLY_N_ENV).is_some() {
            format!("only the N of {ONLY_N_ENV}")
        } else if points.len() as u64 == writes {
            "every N".to_string()
        } else {
            format!("a sample, {ALL_WRITES_ENV}=1 for every N")
        },
        points.len(),
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// What differs from the clean release.
fn compare(clean: &Outcome, killed: &Outcome) -> Vec<String> {
    let mut problems = killed.violations.clone();
    if !killed.converged {
        problems.push("did not converge".to_string());
    }
    if killed.phase != clean.phase {
        problems.push(format!(
            "ended {:?}, the clean release ended {:?}",
            killed.phase, clean.phase
        ));
    }
    if killed.replica_sets != clean.replica_sets {
        problems.push(format!(
            "{} ReplicaSets, the clean release has {}",
            killed.replica_sets, clean.replica_sets
        ));
    }
    if killed.analysis_runs != clean.analysis_runs {
        problems.push(format!(
            "{} AnalysisRuns, the clean release has {}",
            killed.analysis_runs, clean.analysis_runs
        ));
    }
    if killed.step_events != clean.step_events {
        problems.push(format!(
            "step events {:?}, the clean release has {:?}",
            killed.step_events, clean.step_events
        ));
    }
    problems
}

#[test]
fn kill_at_every_write_of_a_routed_canary_with_analysis() {
    kill_at_every_write(Release::RoutedCanary);
}

#[test]
fn kill_at_every_write_of_a_blue_green_with_pre_promotion_analysis() {
    kill_at_every_write(Release::BlueGreen);
}
