//! `make demo` (binary `rollouts-demo`): on kube-sim, with a real Prometheus and the built
//! controller and plugin, a canary the baseline judge promotes and one it rolls back, shown
//! live and narrated; everything it started is stopped on the way out, Ctrl-C included, and
//! the logs stay in `target/demo/`.
//!
//! `setup` finds the tools and starts the processes (`processes`), `story` drives the
//! releases through kubectl and waits on the state `cluster` reads, `narration` turns that
//! state into lines, and `screen` shows them.

mod cluster;
mod narration;
mod processes;
mod screen;
mod setup;
mod story;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};

use cluster::Cluster;
use processes::Processes;
use screen::Screen;
use setup::Paths;

const TITLE: &str = "rollouts demo: a canary judged against stable (Ctrl-C stops and cleans up)";

/// How the demo runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// Install the Debian package `prometheus` when it is missing (as root, with apt-get).
    pub install_prometheus: bool,
    /// Plain narration even on a terminal.
    pub plain: bool,
    /// The checkout to take manifests and CRDs from (default: found from the working
    /// directory or the binary's location).
    pub repo: Option<PathBuf>,
    /// Where logs, kubeconfig and Prometheus data go (default: `target/demo/`); emptied first.
    pub work_dir: Option<PathBuf>,
    /// After the story, keep everything running (the dashboard's pages stay browsable) until
    /// Ctrl-C.
    pub hold: bool,
}

/// Why the demo did not end as it should.
#[derive(Debug)]
pub enum Failure {
    /// A tool is missing or a process did not start.
    Setup(String),
    /// A wait ran out: what was expected, and where the Rollout was.
    Timeout {
        what: String,
        after: Duration,
        status: String,
        picture: Vec<String>,
    },
    /// The Rollout went where it should not have.
    Wrong {
        what: String,
        status: String,
        picture: Vec<String>,
    },
    /// A signal (Ctrl-C) stopped the demo.
    Interrupted(&'static str),
}

fn paths(options: &Options) -> Result<Paths, Failure> {
    let exe = std::env::current_exe()
        .map_err(|e| Failure::Setup(format!("cannot find the demo binary's own path: {e}")))?;
    let bin_dir = exe
        .parent()
        .ok_or_else(|| Failure::Setup(format!("{} has no folder", exe.display())))?
        .to_path_buf();
    let starts: Vec<PathBuf> = match &options.repo {
        Some(repo) => vec![repo.clone()],
        None => std::env::current_dir()
            .into_iter()
            .chain([bin_dir.clone()])
            .collect(),
    };
    let repo = setup::find_repo(&starts).ok_or_else(|| {
        Failure::Setup(
            "cannot find the checkout (a folder with examples/rollout-canary-judge.yaml and crds/yaml): run the demo from it, or pass --repo DIR".to_string(),
        )
    })?;
    // target/debug/rollouts-demo -> target/demo
    let work_dir = options
        .work_dir
        .clone()
        .unwrap_or_else(|| bin_dir.parent().unwrap_or(&bin_dir).join("demo"));
    // Logs of the previous run go; this run's stay after it for reading. Only a folder a demo
    // wrote (or an empty one) is emptied: --work-dir must never wipe anything else.
    if work_dir.exists() {
        let empty = std::fs::read_dir(&work_dir).is_ok_and(|mut entries| entries.next().is_none());
        if !empty && !work_dir.join("narration.log").is_file() {
            return Err(Failure::Setup(format!(
                "{} is not empty and holds no earlier demo's narration.log: pass another --work-dir",
                work_dir.display()
            )));
        }
        std::fs::remove_dir_all(&work_dir)
            .map_err(|e| Failure::Setup(format!("cannot clear {}: {e}", work_dir.display())))?;
    }
    std::fs::create_dir_all(&work_dir)
        .map_err(|e| Failure::Setup(format!("cannot create {}: {e}", work_dir.display())))?;
    Ok(Paths {
        repo,
        bin_dir,
        work_dir,
    })
}

/// Tells the story; returns the dashboard's URL once both releases ended as they should.
async fn demo(
    options: &Options,
    paths: &Paths,
    processes: &mut Processes,
    screen: &mut Screen,
) -> Result<String, Failure> {
    setup::check_tools(paths, options.install_prometheus, screen).await?;
    let started = setup::start(paths, processes, screen).await?;
    let cluster = Cluster {
        api: started.api,
        prometheus: started.prometheus,
        rollout: story::ROLLOUT.to_string(),
        selector: story::SELECTOR.to_string(),
    };
    story::Follow::new(paths, cluster, processes, screen)
        .tell()
        .await?;
    Ok(started.dashboard)
}

/// Runs the demo; exit 0 only when both releases ended as they should.
pub async fn run(options: Options) -> ExitCode {
    let paths = match paths(&options) {
        Ok(paths) => paths,
        Err(failure) => return report(Err(failure), None),
    };
    let live = !options.plain && std::io::stdout().is_terminal();
    let mut screen = Screen::new(live, TITLE, &paths.work_dir.join("narration.log"));
    let mut processes = Processes::default();
    let signals = [
        (SignalKind::interrupt(), "Ctrl-C (SIGINT)"),
        (SignalKind::terminate(), "SIGTERM"),
        (SignalKind::hangup(), "SIGHUP"),
    ];
    let mut listeners = Vec::new();
    for (kind, name) in signals {
        match signal(kind) {
            Ok(listener) => listeners.push((listener, name)),
            Err(e) => {
                screen.finish();
                return report(
                    Err(Failure::Setup(format!("cannot listen for {name}: {e}"))),
                    Some(&paths),
                );
            }
        }
    }
    let interrupted = async {
        let waits = listeners.iter_mut().map(|(listener, name)| {
            Box::pin(async move {
                listener.recv().await;
                *name
            })
        });
        futures::future::select_all(waits).await.0
    };
    tokio::pin!(interrupted);
    let outcome = tokio::select! {
        outcome = demo(&options, &paths, &mut processes, &mut screen) => outcome,
        name = &mut interrupted => Err(Failure::Interrupted(name)),
    };
    if let (Ok(dashboard), true) = (&outcome, options.hold) {
        screen.say(
            narration::Voice::Story,
            &format!("the story is over; everything keeps running for the dashboard at {dashboard} until Ctrl-C"),
        );
        (&mut interrupted).await;
    }
    let outcome = outcome.map(|_| ());
    // The live view first, so the screen is still when it is handed back.
    processes.stop("watch").await;
    screen.finish();
    processes.stop_all().await;
    report(outcome, Some(&paths))
}

fn report(outcome: Result<(), Failure>, paths: Option<&Paths>) -> ExitCode {
    let logs = paths.map_or(String::new(), |p| {
        // Relative to where the person stands, when it is below it (target/demo).
        let cwd = std::env::current_dir().unwrap_or_default();
        let shown = p.work_dir.strip_prefix(&cwd).unwrap_or(&p.work_dir);
        format!("logs and the full narration: {}", shown.display())
    });
    let print_picture = |picture: &[String]| {
        for line in picture {
            eprintln!("    │ {line}");
        }
    };
    let code = match outcome {
        Ok(()) => {
            println!();
            println!("demo finished: every process stopped; {logs}");
            return ExitCode::SUCCESS;
        }
        Err(Failure::Setup(why)) => {
            eprintln!("\ndemo failed: {why}");
            1
        }
        Err(Failure::Timeout {
            what,
            after,
            status,
            picture,
        }) => {
            eprintln!("\ndemo failed: timed out after {after:?} waiting for {what}");
            eprintln!("the Rollout now: {status}");
            print_picture(&picture);
            1
        }
        Err(Failure::Wrong {
            what,
            status,
            picture,
        }) => {
            eprintln!("\ndemo failed: {what}");
            eprintln!("the Rollout now: {status}");
            print_picture(&picture);
            1
        }
        Err(Failure::Interrupted(signal)) => {
            eprintln!("\ndemo stopped by {signal}; every process it started is stopped");
            130
        }
    };
    if !logs.is_empty() {
        eprintln!("{logs}");
    }
    ExitCode::from(code)
}
