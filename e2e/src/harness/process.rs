//! A child process whose output goes to a log file in the scenario's directory, killed
//! (SIGKILL) and reaped when dropped, so a failing or panicking scenario leaves nothing running.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// A running child process.
pub struct Process {
    name: String,
    child: Child,
    log: PathBuf,
    /// Kept open so the child never writes to a closed pipe.
    _stdout: Option<BufReader<ChildStdout>>,
}

impl Process {
    /// Starts `command` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut command: Command, log: &Path) -> Result<Process, String> {
        let file = open_log(log)?;
        let err = file
            .try_clone()
            .map_err(|e| format!("{name}: cloning the log handle: {e}"))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("{name} did not start ({:?}): {e}", command.get_program()))?;
        Ok(Process {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
            _stdout: None,
        })
    }

    /// Starts `command` with stderr to `log` and returns its first stdout line (for a
    /// program that prints the address it bound).
    pub fn spawn_reading_first_line(
        name: &str,
        mut command: Command,
        log: &Path,
    ) -> Result<(Process, String), String> {
        let file = open_log(log)?;
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(file)
            .spawn()
            .map_err(|e| format!("{name} did not start ({:?}): {e}", command.get_program()))?;
        let mut stdout = BufReader::new(child.stdout.take().ok_or("no stdout pipe")?);
        let mut line = String::new();
        let read = stdout.read_line(&mut line);
        let mut process = Process {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
            _stdout: Some(stdout),
        };
        match read {
            Ok(n) if n > 0 => Ok((process, line.trim().to_string())),
            _ => {
                let status = process
                    .child
                    .wait()
                    .map(|s| s.to_string())
                    .unwrap_or_default();
                Err(format!(
                    "{name} exited ({status}) without printing its address; its log {}:\n{}",
                    process.log.display(),
                    process.log_tail(40)
                ))
            }
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Exited already? Returns how.
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(e) => Some(format!("unknown ({e})")),
        }
    }

    /// SIGKILL, then waits for it to be gone.
    pub fn kill(&mut self) {
        // An already exited child is fine: it is gone either way.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

fn open_log(path: &Path) -> Result<File, String> {
    File::options()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("cannot open the log {}: {e}", path.display()))
}

/// User + system CPU time of process `pid` so far, from `/proc/<pid>/stat` (Linux); None
/// when it cannot be read.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 and 15 of the file (utime, stime) are the 12th and 13th after the name.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let ticks = clock_ticks_per_second()?;
    Some(Duration::from_secs_f64(
        (utime.saturating_add(stime)) as f64 / ticks as f64,
    ))
}

/// `getconf CLK_TCK` (100 on every Linux this runs on, asked rather than assumed).
fn clock_ticks_per_second() -> Option<u64> {
    static TICKS: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        let out = Command::new("getconf").arg("CLK_TCK").output().ok()?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .ok()
            .filter(|t| *t > 0)
    })
}

/// The last `lines` lines of a file ("" when it cannot be read).
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Polls `check` every 100 ms until it gives a value or `timeout` passes.
pub fn poll<T>(timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_goes_to_the_log_and_drop_kills() {
        let dir = std::env::temp_dir().join(format!("harness-process-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let log = dir.join("sh.log");
        let mut command = Command::new("sh");
        command.args(["-c", "echo first; echo to-stderr >&2; exec sleep 600"]);
        let process = Process::spawn("sh", command, &log).expect("sh starts");
        let pid = process.id().to_string();
        let logged = poll(Duration::from_secs(10), || {
            let text = std::fs::read_to_string(&log).ok()?;
            (text.contains("first") && text.contains("to-stderr")).then_some(text)
        });
        assert!(logged.is_some(), "log: {}", tail(&log, 10));
        drop(process);
        // Dropped means killed and reaped: no process with that id is left to signal.
        let alive = Command::new("kill")
            .args(["-0", &pid])
            .stderr(Stdio::null())
            .status();
        assert!(
            !alive.expect("kill runs").success(),
            "process {pid} survived its drop"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_first_line_is_read_and_the_rest_is_kept_running() {
        let dir = std::env::temp_dir().join(format!("harness-first-line-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let mut command = Command::new("sh");
        command.args(["-c", "echo 127.0.0.1:1234; exec sleep 600"]);
        let (mut process, line) =
            Process::spawn_reading_first_line("sh", command, &dir.join("sh.log")).expect("starts");
        assert_eq!(line, "127.0.0.1:1234");
        assert_eq!(process.exited(), None);
        process.kill();
        assert!(process.exited().is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
