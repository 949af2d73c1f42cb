//! `rollouts-demo` (`make demo`): a canary the baseline judge promotes and one it rolls back,
//! on kube-sim with a real Prometheus, the controller and the kubectl plugin.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

#[path = "../demo/mod.rs"]
mod demo;

/// Runs a good and a bad canary release on the simulator and narrates what the controller does.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Never install Prometheus; fail saying what to install when it is missing.
    #[arg(long)]
    no_install: bool,
    /// Narration lines and plain pictures even on a terminal (as when the output is a log).
    #[arg(long)]
    plain: bool,
    /// The checkout holding examples/ and crds/yaml (default: found from the current folder).
    #[arg(long)]
    repo: Option<PathBuf>,
    /// Where logs, kubeconfig and Prometheus data go (default: target/demo); emptied first.
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// After the story, keep everything running (the dashboard stays browsable) until Ctrl-C.
    #[arg(long)]
    hold: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("rollouts-demo: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(demo::run(demo::Options {
        install_prometheus: !args.no_install,
        plain: args.plain,
        repo: args.repo,
        work_dir: args.work_dir,
        hold: args.hold,
    }))
}
