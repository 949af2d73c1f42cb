//! Containment and supervision, so one object or one task never takes the process down
//! silently: [`contain`] turns a panic inside one object's reconcile into an error for that
//! object (logged with the object, counted, backed off), and [`supervise`] runs a long-lived
//! task, restarting it with a backoff when it ends or panics (`/readyz` fails meanwhile) or
//! giving up after too many failures in a row, so the process exits non-zero.
//!
//! A stack overflow aborts the process and cannot be caught here; nesting limits on the
//! inputs keep it out of reach.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;

use crate::health::Diagnostics;
use crate::metrics::ReconcilePanics;

/// The message of a panic payload (`panic!` with a literal, or with a formatted message).
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(message) = payload.downcast_ref::<&str>() {
        (*message).to_string()
    } else if let Some(message) = payload.downcast_ref::<String>() {
        message.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// A reconcile that panicked, with the panic's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Panicked {
    pub message: String,
}

/// Runs the reconcile of `namespace/name` by `controller` (`rollout`, `analysisrun`) so that a
/// panic inside it is that object's error: it is logged with the object and the message and
/// counted in `rollouts_controller_reconcile_panics_total`; the caller's error policy backs the
/// object off, and every other object is still served.
pub async fn contain<T>(
    controller: &'static str,
    namespace: &str,
    name: &str,
    panics: &ReconcilePanics,
    reconcile: impl Future<Output = T>,
) -> Result<T, Panicked> {
    // Unwind safety: what a reconcile shares (caches, bookkeeping maps) sits behind mutexes
    // whose users recover from poisoning, and the object is read again on its next reconcile.
    match AssertUnwindSafe(reconcile).catch_unwind().await {
        Ok(outcome) => Ok(outcome),
        Err(payload) => {
            let message = panic_message(&*payload);
            panics.count(controller);
            tracing::error!(
                controller,
                %namespace,
                %name,
                panic = %message,
                "reconcile panicked; this object backs off, the others are still served"
            );
            Err(Panicked { message })
        }
    }
}

/// How a supervised task is restarted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestartPolicy {
    /// The wait before the first restart, doubled for each further failure in a row.
    pub first_backoff: Duration,
    /// The longest wait before a restart.
    pub max_backoff: Duration,
    /// A run that lasted this long was healthy: the next failure counts as the first.
    pub healthy_after: Duration,
    /// After this many failures in a row the supervisor gives up (the process then exits
    /// non-zero); `None` restarts forever.
    pub give_up_after: Option<u32>,
}

impl RestartPolicy {
    /// 1s, 2s, 4s, 8s between restarts; the fifth quick failure in a row is final.
    pub const DEFAULT: Self = Self {
        first_backoff: Duration::from_secs(1),
        max_backoff: Duration::from_secs(30),
        healthy_after: Duration::from_secs(60),
        give_up_after: Some(5),
    };

    /// Restarts forever, 1s to 30s apart: for tasks whose loss takes nothing else down.
    pub const FOREVER: Self = Self {
        give_up_after: None,
        ..Self::DEFAULT
    };

    /// The wait before the restart that follows failure number `failures` in a row.
    pub fn backoff(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(16);
        self.first_backoff
            .saturating_mul(1u32 << doublings)
            .min(self.max_backoff)
    }
}

/// A supervised task that failed too often in a row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GaveUp {
    pub task: &'static str,
    /// What happened to its last run: ended, failed (with the error) or panicked.
    pub reason: String,
    pub failures: u32,
}

/// Runs `task` (started anew by `start` each time) until it ends while `stopping()` says the
/// controller is stopping: then `Ok`. Each other end (it returned, failed or panicked) marks the
/// task down in `diagnostics`, so `/readyz` fails and names it, and restarts it after the
/// policy's backoff; once the policy gives up, the task stays down and [`GaveUp`] says why.
pub async fn supervise<F, Fut>(
    task: &'static str,
    diagnostics: &Diagnostics,
    policy: RestartPolicy,
    stopping: impl Fn() -> bool,
    mut start: F,
) -> Result<(), GaveUp>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let mut failures: u32 = 0;
    loop {
        diagnostics.task_up(task);
        let started = tokio::time::Instant::now();
        let outcome = AssertUnwindSafe(start()).catch_unwind().await;
        if stopping() {
            diagnostics.task_stopped(task);
            if let Ok(Err(error)) = &outcome {
                tracing::warn!(task, %error, "failed while stopping");
            }
            return Ok(());
        }
        let reason = match outcome {
            Ok(Ok(())) => "ended".to_string(),
            Ok(Err(error)) => format!("failed: {error}"),
            Err(payload) => format!("panicked: {}", panic_message(&*payload)),
        };
        diagnostics.task_down(task, &reason);
        failures = if started.elapsed() >= policy.healthy_after {
            1
        } else {
            failures.saturating_add(1)
        };
        if policy.give_up_after.is_some_and(|limit| failures >= limit) {
            tracing::error!(task, %reason, failures, "stopped too often in a row; giving up");
            return Err(GaveUp {
                task,
                reason,
                failures,
            });
        }
        let retry_in = policy.backoff(failures);
        tracing::error!(
            task,
            %reason,
            failures,
            ?retry_in,
            "stopped unexpectedly; restarting it (/readyz fails until it runs again)"
        );
        tokio::time::sleep(retry_in).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    use crate::health::Leadership;
    use crate::metrics::Metrics;

    use super::*;

    /// What a panicking dependency would say: a message built from data at run time.
    fn explode(value: &str) -> u32 {
        panic!("cannot handle {value:?}")
    }

    #[tokio::test]
    async fn a_panicking_reconcile_is_an_error_for_its_object_and_is_counted() {
        let metrics =
            Metrics::new(kube::runtime::reflector::store::<crate::packed::PackedRollout>().0);
        let panics = &metrics.reconcile_panics;
        let outcome = contain("analysisrun", "shop", "bad", panics, async {
            tokio::task::yield_now().await;
            explode("100000000000000000000s")
        })
        .await;
        assert_eq!(
            outcome,
            Err(Panicked {
                message: "cannot handle \"100000000000000000000s\"".to_string()
            })
        );
        let fine = contain("analysisrun", "shop", "good", panics, async { 7 }).await;
        assert_eq!(fine, Ok(7));
        let text = metrics.render();
        assert!(
            text.contains(
                r#"rollouts_controller_reconcile_panics_total{controller="analysisrun"} 1"#
            ),
            "{text}"
        );
    }

    #[test]
    fn panic_messages_are_read_from_literals_and_formatted_panics() {
        let literal = std::panic::catch_unwind(|| panic!("literal")).expect_err("panics");
        assert_eq!(panic_message(&*literal), "literal");
        let formatted =
            std::panic::catch_unwind(|| explode("x")).expect_err("panics with a String");
        assert_eq!(panic_message(&*formatted), "cannot handle \"x\"");
        let other = std::panic::catch_unwind(|| std::panic::panic_any(7u8)).expect_err("panics");
        assert_eq!(panic_message(&*other), "a panic without a message");
    }

    #[test]
    fn backoff_doubles_up_to_its_maximum() {
        let policy = RestartPolicy::DEFAULT;
        assert_eq!(policy.backoff(1), Duration::from_secs(1));
        assert_eq!(policy.backoff(2), Duration::from_secs(2));
        assert_eq!(policy.backoff(4), Duration::from_secs(8));
        assert_eq!(policy.backoff(6), Duration::from_secs(30));
        assert_eq!(policy.backoff(u32::MAX), Duration::from_secs(30));
        assert_eq!(policy.backoff(0), Duration::from_secs(1));
    }

    /// A policy that restarts at once: the tests count runs, never time.
    const QUICK: RestartPolicy = RestartPolicy {
        first_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(1),
        healthy_after: Duration::from_secs(3600),
        give_up_after: Some(5),
    };

    #[tokio::test]
    async fn a_task_that_panics_takes_readiness_down_naming_why_until_it_runs_again() {
        let diagnostics = Arc::new(Diagnostics::new(Leadership::Leader));
        let supervisor = tokio::spawn({
            let diagnostics = diagnostics.clone();
            async move {
                let policy = RestartPolicy {
                    first_backoff: Duration::from_secs(3600),
                    ..QUICK
                };
                supervise(
                    "AnalysisRun controller",
                    &diagnostics,
                    policy,
                    || false,
                    || async { panic!("reconcile state broken") },
                )
                .await
            }
        });
        wait_until(|| !diagnostics.tasks_down().is_empty()).await;
        assert_eq!(
            diagnostics.tasks_down(),
            vec![(
                "AnalysisRun controller",
                "panicked: reconcile state broken".to_string()
            )]
        );
        supervisor.abort();
    }

    /// A task that panics on its first run, ends on its second and then runs until stopped:
    /// it is restarted each time, and is up again once it runs.
    #[tokio::test]
    async fn a_task_that_panics_or_ends_is_restarted() {
        let diagnostics = Arc::new(Diagnostics::new(Leadership::Leader));
        let runs = Arc::new(AtomicU32::new(0));
        let stop = Arc::new(tokio::sync::Notify::new());
        let stopping = Arc::new(AtomicBool::new(false));
        let supervisor = tokio::spawn({
            let (diagnostics, runs, stop, stopping) = (
                diagnostics.clone(),
                runs.clone(),
                stop.clone(),
                stopping.clone(),
            );
            async move {
                supervise(
                    "AnalysisRun controller",
                    &diagnostics,
                    QUICK,
                    || stopping.load(Ordering::SeqCst),
                    || {
                        let run = runs.fetch_add(1, Ordering::SeqCst);
                        let stop = stop.clone();
                        async move {
                            match run {
                                0 => panic!("reconcile state broken"),
                                1 => Ok(()),
                                _ => {
                                    stop.notified().await;
                                    Ok(())
                                }
                            }
                        }
                    },
                )
                .await
            }
        });
        wait_until(|| runs.load(Ordering::SeqCst) == 3 && diagnostics.tasks_down().is_empty())
            .await;
        stopping.store(true, Ordering::SeqCst);
        stop.notify_one();
        assert_eq!(supervisor.await.expect("the supervisor ran"), Ok(()));
        assert!(diagnostics.tasks_down().is_empty());
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_task_that_keeps_failing_is_given_up_and_stays_down() {
        let diagnostics = Diagnostics::new(Leadership::Disabled);
        let runs = AtomicU32::new(0);
        let gave_up = supervise(
            "AnalysisRun controller",
            &diagnostics,
            QUICK,
            || false,
            || {
                runs.fetch_add(1, Ordering::SeqCst);
                async { Err("cannot build the providers".to_string()) }
            },
        )
        .await;
        assert_eq!(
            gave_up,
            Err(GaveUp {
                task: "AnalysisRun controller",
                reason: "failed: cannot build the providers".to_string(),
                failures: 5,
            })
        );
        assert_eq!(runs.load(Ordering::SeqCst), 5);
        assert_eq!(diagnostics.tasks_down().len(), 1);
    }

    #[tokio::test]
    async fn a_run_that_was_healthy_long_enough_resets_the_count() {
        let diagnostics = Diagnostics::new(Leadership::Disabled);
        let runs = AtomicU32::new(0);
        let policy = RestartPolicy {
            healthy_after: Duration::from_millis(20),
            give_up_after: Some(2),
            ..QUICK
        };
        let gave_up = supervise(
            "metrics server",
            &diagnostics,
            policy,
            || false,
            || {
                let run = runs.fetch_add(1, Ordering::SeqCst);
                async move {
                    // Run 1 lasts long enough to count as healthy; the others end at once.
                    if run == 1 {
                        tokio::time::sleep(policy.healthy_after).await;
                    }
                    Ok(())
                }
            },
        )
        .await
        .expect_err("gives up");
        // Without the reset, the second run would have been the last.
        assert_eq!(gave_up.failures, 2);
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }

    /// The real AnalysisRun controller against kube-sim, its first run cut short from outside
    /// (no test-only code in it): it is marked down and restarted, and the new one lists
    /// AnalysisRuns again.
    #[tokio::test]
    async fn the_analysis_run_controller_is_restarted_after_it_ends() {
        use rollouts_e2e::sim::{SimOptions, start};

        use crate::analysisrun::{self, Options};
        use crate::cli::rollout_label_selector;

        let crds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds/yaml");
        let sim = start(SimOptions {
            crd_dirs: vec![crds],
            ..SimOptions::default()
        })
        .expect("kube-sim starts");
        let config = kube::Config::new(sim.url().parse().expect("a URI"));
        let client = kube::Client::try_from(config).expect("a client");
        let lists = || {
            sim.requests()
                .iter()
                .filter(|r| r.resource == "analysisruns" && r.verb == "list")
                .count()
        };
        let diagnostics = Arc::new(Diagnostics::new(Leadership::Disabled));
        let end_first_run = Arc::new(tokio::sync::Notify::new());
        let runs = Arc::new(AtomicU32::new(0));
        let supervisor = tokio::spawn({
            let (diagnostics, end_first_run, runs) =
                (diagnostics.clone(), end_first_run.clone(), runs.clone());
            async move {
                // Down long enough for the test to see it.
                let policy = RestartPolicy {
                    first_backoff: Duration::from_millis(500),
                    max_backoff: Duration::from_millis(500),
                    ..QUICK
                };
                supervise(
                    "AnalysisRun controller",
                    &diagnostics,
                    policy,
                    || false,
                    || {
                        let first = runs.fetch_add(1, Ordering::SeqCst) == 0;
                        let end_first_run = end_first_run.clone();
                        let run = analysisrun::run(
                            client.clone(),
                            Options {
                                label_selector: rollout_label_selector(None),
                                concurrency: 1,
                                ..Options::default()
                            },
                            analysisrun::AnalysisRunMetrics::default(),
                            ReconcilePanics::default(),
                            std::future::pending::<()>(),
                        );
                        async move {
                            // The first run ends when told, as if its streams had ended.
                            let cut = async {
                                if first {
                                    end_first_run.notified().await;
                                } else {
                                    std::future::pending::<()>().await;
                                }
                            };
                            tokio::select! {
                                outcome = run => outcome.map_err(|error| error.to_string()),
                                () = cut => Ok(()),
                            }
                        }
                    },
                )
                .await
            }
        });
        wait_until(|| lists() >= 1).await;
        end_first_run.notify_one();
        wait_until(|| !diagnostics.tasks_down().is_empty()).await;
        assert_eq!(
            diagnostics.tasks_down(),
            vec![("AnalysisRun controller", "ended".to_string())]
        );
        wait_until(|| {
            runs.load(Ordering::SeqCst) == 2 && diagnostics.tasks_down().is_empty() && lists() >= 2
        })
        .await;
        assert!(!supervisor.is_finished());
        supervisor.abort();
    }

    /// Polls `condition` until it holds, failing after a generous deadline.
    async fn wait_until(condition: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !condition() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "condition not reached"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
