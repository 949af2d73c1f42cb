//! `rollouts-controller`: parses flags, installs logging and runs the controller until a
//! signal (exit 0) or a fatal error such as a missing CRD or a lost leader lease (exit 1).

use std::process::ExitCode;

use clap::Parser;
use rollouts_controller::cli::Flags;
use rollouts_controller::startup;

#[tokio::main]
async fn main() -> ExitCode {
    let flags = Flags::parse();
    if let Err(error) = startup::init_logging(&flags) {
        eprintln!("rollouts-controller: {error}");
        return ExitCode::FAILURE;
    }
    match startup::run(flags).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error_kind = error.metric_label(), "{error}");
            eprintln!("rollouts-controller: {error}");
            ExitCode::FAILURE
        }
    }
}
