//! `completion SHELL`: print a completion script (`source <(kubectl-rollouts completion bash)`).

use clap::CommandFactory;
use clap_complete::Shell;

use crate::args::Cli;
use crate::error::{Error, Result};

/// `completion` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The shell: bash, zsh, fish, powershell or elvish.
    pub shell: Shell,
}

/// The completion script for `shell`.
pub fn script(shell: Shell) -> Result<String> {
    let mut command = Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut command, "kubectl-rollouts", &mut out);
    String::from_utf8(out).map_err(|e| Error::Output(e.to_string()))
}

/// Prints the completion script.
pub fn run(args: &Args) -> Result<()> {
    print!("{}", script(args.shell)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bash_script_completes_the_verbs() {
        let script = script(Shell::Bash).unwrap();
        assert!(
            script.contains("complete -F _kubectl__rollouts")
                && script.contains("kubectl-rollouts"),
            "the script does not register a completion for kubectl-rollouts"
        );
        for verb in [
            "promote",
            "abort",
            "retry",
            "set",
            "undo",
            "lint",
            "terminate",
        ] {
            assert!(
                script.contains(verb),
                "{verb} missing from the bash completion"
            );
        }
    }
}
