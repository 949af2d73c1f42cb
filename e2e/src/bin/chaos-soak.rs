//! `chaos-soak` (`make chaos`): N Rollouts released at once on kube-sim under seeded faults,
//! the controller SIGKILLed and restarted at seeded moments; prints the figures and exits
//! non-zero (naming the seed) when a release did not converge or a step, ReplicaSet or
//! AnalysisRun was repeated.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use rollouts_e2e::chaos::{SoakConfig, run};

/// The fault soak of the rollouts controller on kube-sim.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Seed of the faults and of the kill moments; random (and printed) when absent.
    #[arg(long)]
    seed: Option<u64>,
    /// Rollouts released at once.
    #[arg(long, default_value_t = 100)]
    rollouts: usize,
    /// How many times the controller is SIGKILLed and restarted during the release.
    #[arg(long, default_value_t = 3)]
    kills: u32,
    /// Seconds after the release starts within which the kills fall.
    #[arg(long, default_value_t = 12)]
    kill_window: u64,
    /// Seconds the releases may take to settle; by default 90 + 2 per Rollout.
    #[arg(long)]
    duration: Option<u64>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(rand::random);
    let mut config = match SoakConfig::new(seed, args.rollouts) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("chaos-soak (seed {seed}): {e}");
            return ExitCode::FAILURE;
        }
    };
    config.kills = args.kills;
    config.kill_window = Duration::from_secs(args.kill_window);
    if let Some(seconds) = args.duration {
        config.deadline = Duration::from_secs(seconds);
    }
    println!(
        "chaos-soak: seed {seed}, {} Rollouts, {} kills within {}s, settle deadline {}s",
        config.rollouts,
        config.kills,
        config.kill_window.as_secs(),
        config.deadline.as_secs()
    );
    match run(&config) {
        Ok(report) => {
            print!("{report}");
            if report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("chaos-soak: {e}");
            ExitCode::FAILURE
        }
    }
}
