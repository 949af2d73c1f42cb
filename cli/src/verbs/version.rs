//! `version [--short]`: the plugin's version and what it was built for.

use serde::Serialize;

use crate::args::ObjectFormat;
use crate::error::Result;
use crate::verbs::render;

/// `version` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print only the version number.
    #[arg(long)]
    pub short: bool,
    /// Print the version information as JSON or YAML.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<ObjectFormat>,
}

/// What `version` reports.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VersionInfo {
    pub version: String,
    /// The API this plugin reads and writes.
    pub api_version: String,
    /// `os/arch`, as Go names them.
    pub platform: String,
}

impl VersionInfo {
    /// The running binary's version information.
    pub fn current() -> Self {
        Self {
            version: format!("v{}", env!("CARGO_PKG_VERSION")),
            api_version: format!("{}/{}", rollouts_crds::GROUP, rollouts_crds::VERSION),
            platform: format!(
                "{}/{}",
                std::env::consts::OS,
                go_arch(std::env::consts::ARCH)
            ),
        }
    }

    /// The text form, as Argo's plugin prints it.
    pub fn text(&self, short: bool) -> String {
        let mut text = format!("kubectl-rollouts: {}\n", self.version);
        if !short {
            text.push_str(&format!("  APIVersion: {}\n", self.api_version));
            text.push_str(&format!("  Platform: {}\n", self.platform));
        }
        text
    }
}

fn go_arch(arch: &str) -> &str {
    match arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// Prints the version.
pub fn run(args: &Args) -> Result<()> {
    let info = VersionInfo::current();
    match args.output {
        Some(format) => print!("{}", render(&info, format)?),
        None => print!("{}", info.text(args.short)),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_prints_only_the_version_line() {
        let info = VersionInfo {
            version: "v1.2.3".into(),
            api_version: "argoproj.io/v1alpha1".into(),
            platform: "linux/amd64".into(),
        };
        assert_eq!(info.text(true), "kubectl-rollouts: v1.2.3\n");
        assert_eq!(
            info.text(false),
            "kubectl-rollouts: v1.2.3\n  APIVersion: argoproj.io/v1alpha1\n  Platform: linux/amd64\n"
        );
        assert_eq!(
            render(&info, ObjectFormat::Json).unwrap(),
            "{\n  \"version\": \"v1.2.3\",\n  \"apiVersion\": \"argoproj.io/v1alpha1\",\n  \"platform\": \"linux/amd64\"\n}\n"
        );
    }

    #[test]
    fn current_uses_the_crate_version() {
        assert_eq!(
            VersionInfo::current().version,
            format!("v{}", env!("CARGO_PKG_VERSION"))
        );
    }
}
