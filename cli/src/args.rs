//! The command line: kubectl's connection flags, the output flag, and one subcommand per verb.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use crate::verbs;

/// Manage Rollouts: get, list, status, plan, promote, abort, retry, pause, restart, set image,
/// undo, create analysisrun, lint, dashboard.
#[derive(Debug, Parser)]
#[command(name = "kubectl-rollouts", bin_name = "kubectl-rollouts", version)]
pub struct Cli {
    #[command(flatten)]
    pub kube: KubeFlags,
    #[command(subcommand)]
    pub command: Command,
}

/// The kubectl flags every verb that talks to a cluster understands.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct KubeFlags {
    /// Namespace of the objects; defaults to the kubeconfig context's namespace.
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// Name of the kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// Path to the kubeconfig file; defaults to $KUBECONFIG, then ~/.kube/config.
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
}

/// `-o`: print the changed object instead of a sentence.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct OutputFlag {
    /// Print the object as the server stored it after the change.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<ObjectFormat>,
}

/// How an object is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ObjectFormat {
    Json,
    Yaml,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show a rollout or an experiment as a tree of ReplicaSets, pods, Experiments and
    /// AnalysisRuns.
    #[command(subcommand)]
    Get(verbs::get::Kind),
    /// List rollouts or experiments.
    #[command(subcommand)]
    List(verbs::list::Kind),
    /// Show a rollout's health; by default watch it until it is Healthy or Degraded.
    Status(verbs::status::Args),
    /// Promote a rollout to its next step, or with --full to the end.
    Promote(verbs::promote::Args),
    /// Abort a rollout: go back to the stable version.
    Abort(verbs::abort::Args),
    /// Retry an aborted rollout.
    #[command(subcommand)]
    Retry(verbs::retry::Kind),
    /// Pause a rollout (sets spec.paused).
    Pause(verbs::pause::Args),
    /// Resume a rollout paused with `pause` (clears spec.paused).
    Resume(verbs::resume::Args),
    /// Restart the pods of a rollout.
    Restart(verbs::restart::Args),
    /// Set a field of a rollout.
    #[command(subcommand)]
    Set(verbs::set_image::SetKind),
    /// Roll back to an earlier revision.
    Undo(verbs::undo::Args),
    /// Create an AnalysisRun from an AnalysisTemplate or a ClusterAnalysisTemplate.
    #[command(subcommand)]
    Create(verbs::create::Kind),
    /// Terminate a running AnalysisRun or Experiment.
    #[command(subcommand)]
    Terminate(verbs::terminate::Kind),
    /// Notification templates and triggers: print them, preview a template against a rollout,
    /// send a test message, evaluate a trigger (as Argo's `notifications` commands).
    #[command(subcommand)]
    Notifications(verbs::notifications::Command),
    /// Serve a web dashboard of the rollouts (live, with charts and actions) on loopback.
    Dashboard(crate::dashboard::Args),
    /// Print, step by step, the replica counts and weights a rollout would go through.
    Plan(verbs::plan::Args),
    /// Lint and validate Rollout and AnalysisTemplate manifests in a file.
    Lint(verbs::lint::Args),
    /// Print the plugin's version.
    Version(verbs::version::Args),
    /// Print a shell completion script.
    Completion(verbs::completion::Args),
}
