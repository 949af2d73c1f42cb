//! Where the workspace's binaries are: next to the running test executable, in
//! `target/<profile>/`, where `cargo build --workspace` (and `cargo test --workspace`) put them.

use std::path::{Path, PathBuf};

/// The built binaries a scenario starts.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub kube_sim: PathBuf,
    pub controller: PathBuf,
    /// The `kubectl-rollouts` plugin; its directory goes first on kubectl's PATH.
    pub plugin: PathBuf,
}

impl Binaries {
    /// Finds every binary, or says which is missing and how to build it.
    pub fn find() -> Result<Binaries, String> {
        let dir = profile_dir()?;
        let find = |name: &str| {
            let path = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
            if path.is_file() {
                Ok(path)
            } else {
                Err(format!(
                    "{name} is not built: {} does not exist; run `cargo build --workspace` \
                     (or `make test`, which builds every binary) before the scenarios",
                    path.display()
                ))
            }
        };
        Ok(Binaries {
            kube_sim: find("kube-sim")?,
            controller: find("rollouts-controller")?,
            plugin: find("kubectl-rollouts")?,
        })
    }

    /// The plugin's directory.
    pub fn plugin_dir(&self) -> &Path {
        self.plugin.parent().unwrap_or(Path::new("."))
    }
}

/// `target/<profile>/`: the test executable lives in its `deps/` folder.
pub fn profile_dir() -> Result<PathBuf, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot tell where the test executable is: {e}"))?;
    let dir = exe
        .parent()
        .ok_or_else(|| format!("{} has no parent directory", exe.display()))?;
    Ok(if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().unwrap_or(dir).to_path_buf()
    } else {
        dir.to_path_buf()
    })
}

/// `target/`: the parent of the profile directory.
pub fn target_dir() -> Result<PathBuf, String> {
    let profile = profile_dir()?;
    Ok(profile.parent().unwrap_or(&profile).to_path_buf())
}

/// A program on PATH.
pub fn on_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_dir_holds_the_deps_dir_of_this_test() {
        let profile = profile_dir().expect("a profile dir");
        let exe = std::env::current_exe().expect("the test executable");
        assert!(
            exe.starts_with(&profile),
            "{} not under {}",
            exe.display(),
            profile.display()
        );
        assert_eq!(
            target_dir().expect("a target dir"),
            profile.parent().expect("a parent")
        );
    }
}
