//! `kubectl rollouts`: the kubectl plugin for Rollouts.
//!
//! Each verb lives in its own module under [`verbs`] and is split in two: a pure function that
//! decides which [`patch::PatchRequest`]s to send (unit-tested on exact JSON), and a thin async
//! function that sends them through [`cluster::Cluster`] and prints what it did. The read-only
//! verbs (get, list, status) draw with pure functions in [`view`]; `plan` sizes steps with the
//! controller's own replica arithmetic.

pub mod args;
pub mod cluster;
pub mod dashboard;
pub mod error;
pub mod patch;
pub mod verbs;
pub mod view;

use std::process::ExitCode;

use args::{Cli, Command};
use cluster::Cluster;
use error::Result;

/// Runs one command line; the exit code is non-zero when lint found errors. Verbs that talk to
/// a cluster connect first; lint, version, completion and `plan -f` never do.
pub async fn run(cli: Cli) -> Result<ExitCode> {
    let flags = &cli.kube;
    match cli.command {
        Command::Lint(args) => return verbs::lint::run(&args),
        Command::Version(args) => verbs::version::run(&args)?,
        Command::Completion(args) => verbs::completion::run(&args)?,
        Command::Plan(args) => {
            verbs::plan::run(&args, async || Cluster::connect(flags).await).await?
        }
        Command::Get(kind) => verbs::get::run(&Cluster::connect(flags).await?, &kind).await?,
        Command::List(kind) => verbs::list::run(&Cluster::connect(flags).await?, &kind).await?,
        Command::Status(args) => verbs::status::run(&Cluster::connect(flags).await?, &args).await?,
        Command::Promote(args) => {
            verbs::promote::run(&Cluster::connect(flags).await?, &args).await?
        }
        Command::Abort(args) => verbs::abort::run(&Cluster::connect(flags).await?, &args).await?,
        Command::Retry(kind) => verbs::retry::run(&Cluster::connect(flags).await?, &kind).await?,
        Command::Pause(args) => verbs::pause::run(&Cluster::connect(flags).await?, &args).await?,
        Command::Resume(args) => verbs::resume::run(&Cluster::connect(flags).await?, &args).await?,
        Command::Restart(args) => {
            verbs::restart::run(&Cluster::connect(flags).await?, &args).await?
        }
        Command::Set(kind) => verbs::set_image::run(&Cluster::connect(flags).await?, &kind).await?,
        Command::Undo(args) => verbs::undo::run(&Cluster::connect(flags).await?, &args).await?,
        Command::Create(kind) => verbs::create::run(&Cluster::connect(flags).await?, &kind).await?,
        Command::Notifications(command) => verbs::notifications::run(flags, &command).await?,
        Command::Dashboard(args) => dashboard::run(Cluster::connect(flags).await?, &args).await?,
        Command::Terminate(kind) => {
            verbs::terminate::run(&Cluster::connect(flags).await?, &kind).await?
        }
    }
    Ok(ExitCode::SUCCESS)
}
