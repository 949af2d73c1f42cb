//! The demo's child processes: each in its own process group with its output in a log file
//! under `target/demo/`, stopped group and all (SIGTERM, then SIGKILL) on the way out.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::process::{Child, ChildStdout, Command};

/// How long a process may take to exit after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// A running child process and the log its output goes to.
pub struct Process {
    pub name: &'static str,
    child: Child,
    pub log: PathBuf,
    stopped: bool,
}

impl Process {
    /// Starts `command` in a new process group, stdin closed, stderr (and stdout unless
    /// `capture_stdout`) appended to `log`.
    pub fn spawn(
        name: &'static str,
        mut command: Command,
        log: &Path,
        capture_stdout: bool,
    ) -> io::Result<Process> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let stdout = if capture_stdout {
            Stdio::piped()
        } else {
            Stdio::from(file.try_clone()?)
        };
        // Its own group: Ctrl-C reaches only the demo, which then stops everything in order.
        command
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(Stdio::from(file));
        let child = command.spawn().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot start {name} ({:?}): {e}", command.as_std()),
            )
        })?;
        Ok(Process {
            name,
            child,
            log: log.to_path_buf(),
            stopped: false,
        })
    }

    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    /// The exit status if the process has ended.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The last lines of its log, for a message saying why it stopped.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn signal_group(&self, signal: &str) {
        if let Some(pid) = self.child.id() {
            // Best effort: the group may already be gone.
            let _ = std::process::Command::new("kill")
                .args([signal, "--", &format!("-{pid}")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }

    /// SIGTERM to the whole group, then SIGKILL if it has not exited within the grace time.
    pub async fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        if self.exited().is_none() {
            self.signal_group("-TERM");
            if tokio::time::timeout(STOP_GRACE, self.child.wait())
                .await
                .is_err()
            {
                self.signal_group("-KILL");
                let _ = self.child.wait().await;
            }
        }
        // Children it left behind in its group go too.
        self.signal_group("-KILL");
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // Only on an unexpected path (a panic): the normal one has called `stop`.
        if !self.stopped {
            self.signal_group("-KILL");
        }
    }
}

/// Every process the demo started, stopped in reverse order of starting.
#[derive(Default)]
pub struct Processes {
    running: Vec<Process>,
}

impl Processes {
    pub fn add(&mut self, process: Process) -> &mut Process {
        self.running.push(process);
        self.running.last_mut().expect("just pushed")
    }

    /// Stops and forgets `name` (a start that failed and is tried again).
    pub async fn remove(&mut self, name: &str) {
        self.stop(name).await;
        self.running.retain(|p| p.name != name);
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut Process> {
        self.running.iter_mut().find(|p| p.name == name)
    }

    /// The first process that has exited, with its status.
    pub fn first_exited(&mut self) -> Option<(&Process, ExitStatus)> {
        let index = self
            .running
            .iter_mut()
            .position(|p| !p.stopped && p.exited().is_some())?;
        let process = &mut self.running[index];
        let status = process.exited()?;
        Some((&self.running[index], status))
    }

    /// Stops one process by name (the watch view, before the final summary is printed).
    pub async fn stop(&mut self, name: &str) {
        if let Some(process) = self.get_mut(name) {
            process.stop().await;
        }
    }

    pub async fn stop_all(&mut self) {
        for process in self.running.iter_mut().rev() {
            process.stop().await;
        }
    }
}

/// A free loopback port, for programs that cannot be told to pick one themselves.
pub fn free_loopback_address() -> io::Result<SocketAddr> {
    TcpListener::bind("127.0.0.1:0")?.local_addr()
}

/// The program's path if it is on PATH.
pub fn on_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
}

/// Runs a short command to completion, its output appended to `log`; Err names the command.
pub async fn run_logged(mut command: Command, log: &Path) -> Result<(), String> {
    let shown = format!("{:?}", command.as_std());
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("cannot open {}: {e}", log.display()))?;
    let stderr = file
        .try_clone()
        .map_err(|e| format!("cannot open {}: {e}", log.display()))?;
    let status = command
        .stdin(Stdio::null())
        .stdout(Stdio::from(file))
        .stderr(Stdio::from(stderr))
        .status()
        .await
        .map_err(|e| format!("cannot run {shown}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "{shown} failed ({status}); its output is in {}",
            log.display()
        ))
    }
}
