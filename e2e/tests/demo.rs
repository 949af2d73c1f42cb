//! `make demo` end to end: the `rollouts-demo` binary run as CI would (output not a terminal),
//! against kube-sim, a real Prometheus, the built controller and the kubectl plugin. It must exit
//! 0 having narrated both outcomes (the judge passing the good release, which is promoted; the
//! judge calling the bad one High, which is rolled back), with the dashboard's URL printed and
//! its pages showing the Rollout while the story runs, and leave no process behind; stopped by
//! Ctrl-C half way, it must stop everything it started too.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The demo's own waits add up to about 6 minutes at worst; it takes about 80 s.
const DEMO_DEADLINE: Duration = Duration::from_secs(420);
const POLL: Duration = Duration::from_millis(200);

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ sits in the workspace")
        .to_path_buf()
}

/// The demo drives the controller and the plugin from the folder it was built in: build them
/// there with the same profile (nothing to do when they are fresh).
fn build_controller_and_plugin(demo: &Path) {
    let profile = match demo.parent().and_then(Path::file_name) {
        Some(dir) if dir == "debug" => "dev".to_string(),
        Some(dir) => dir.to_string_lossy().into_owned(),
        None => "dev".to_string(),
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--profile", &profile, "-p", "rollouts-controller"])
        .args(["-p", "kubectl-rollouts", "--bins"])
        .current_dir(workspace())
        .status()
        .expect("cargo runs");
    assert!(
        status.success(),
        "building the controller and the plugin failed"
    );
}

fn tools_present() -> bool {
    for tool in ["kubectl", "prometheus"] {
        let found = std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()));
        if !found {
            // CI installs both (.ci/run); a developer without them is told what is missing.
            eprintln!(
                "skipping the demo test: {tool} is not on PATH (apt-get install -y prometheus; kubectl 1.32)"
            );
            return false;
        }
    }
    true
}

/// A fresh folder for one run's logs.
fn work_dir(name: &str) -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    std::env::temp_dir().join(format!(
        "rollouts-demo-test-{name}-{}-{nanos}",
        std::process::id()
    ))
}

/// A running demo with its output collected line by line.
struct Demo {
    child: Child,
    output: Arc<Mutex<Vec<String>>>,
    work_dir: PathBuf,
}

impl Demo {
    fn start(name: &str) -> Demo {
        let binary = PathBuf::from(env!("CARGO_BIN_EXE_rollouts-demo"));
        build_controller_and_plugin(&binary);
        let work_dir = work_dir(name);
        let mut child = Command::new(&binary)
            .arg("--no-install")
            .arg("--work-dir")
            .arg(&work_dir)
            .current_dir(workspace())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the demo starts");
        let output = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().expect("stdout piped");
        let stderr = child.stderr.take().expect("stderr piped");
        for stream in [
            Box::new(stdout) as Box<dyn Read + Send>,
            Box::new(stderr) as Box<dyn Read + Send>,
        ] {
            let output = output.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    output.lock().expect("lock").push(line);
                }
            });
        }
        Demo {
            child,
            output,
            work_dir,
        }
    }

    fn output(&self) -> String {
        self.output.lock().expect("lock").join("\n")
    }

    fn signal(&self, signal: &str) {
        let _ = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status();
    }

    /// Waits for the demo to exit; past `deadline` it is stopped with SIGTERM (so that it still
    /// stops what it started) and the test fails with its output.
    fn wait(&mut self, deadline: Duration) -> ExitStatus {
        let give_up = Instant::now() + deadline;
        loop {
            if let Some(status) = self.child.try_wait().expect("the demo can be waited for") {
                // Let the readers take the last lines.
                let drained = Instant::now() + Duration::from_secs(5);
                while Instant::now() < drained && Arc::strong_count(&self.output) > 1 {
                    std::thread::sleep(POLL);
                }
                return status;
            }
            if Instant::now() > give_up {
                self.signal("-TERM");
                let _ = self.child.wait();
                panic!(
                    "the demo did not finish within {deadline:?}; its output:\n{}",
                    self.output()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits until a line of output contains `text`.
    fn wait_for_line(&mut self, text: &str, deadline: Duration) {
        let give_up = Instant::now() + deadline;
        while !self.output().contains(text) {
            if let Some(status) = self.child.try_wait().expect("waitable") {
                panic!(
                    "the demo exited ({status}) before saying {text:?}:\n{}",
                    self.output()
                );
            }
            if Instant::now() > give_up {
                self.signal("-TERM");
                let _ = self.child.wait();
                panic!(
                    "the demo did not say {text:?} within {deadline:?}:\n{}",
                    self.output()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Processes still running whose command line names this run's folder (kube-sim, Prometheus
    /// and the controller all do).
    fn leftovers(&self) -> Vec<String> {
        let needle = self.work_dir.to_string_lossy().into_owned();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
            .filter(|cmdline| cmdline.contains(&needle))
            .collect()
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        // A test that failed half way still stops the demo (which stops the rest).
        if matches!(self.child.try_wait(), Ok(None)) {
            self.signal("-TERM");
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.work_dir);
    }
}

/// `GET url` (an `http://host:port/path` URL) with HTTP/1.0: the status and the body.
fn http_get(url: &str) -> (u16, String) {
    let rest = url.trim_start_matches("http://");
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut stream = TcpStream::connect(authority).expect("the dashboard answers");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("a read timeout");
    write!(stream, "GET /{path} HTTP/1.0\r\nHost: {authority}\r\n\r\n").expect("send");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).expect("a reply");
    let status = reply
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {reply:?}"));
    let body = reply
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    (status, body)
}

#[test]
fn the_demo_promotes_the_good_release_and_rolls_back_the_bad_one() {
    if !tools_present() {
        return;
    }
    let mut demo = Demo::start("full");
    // The dashboard's URL is printed before the releases, and its pages show the Rollout while
    // the story runs.
    demo.wait_for_line("releasing 2.0.0", DEMO_DEADLINE);
    let output = demo.output();
    let url = output
        .lines()
        .find_map(|line| line.split("dashboard: ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("the demo printed no dashboard URL:\n{output}"))
        .to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let (status, overview) = http_get(&url);
    assert_eq!(status, 200, "{overview}");
    assert!(
        overview.contains("href=\"/rollouts/default/web\""),
        "the overview does not list web:\n{overview}"
    );
    let (status, page) = http_get(&format!("{url}rollouts/default/web"));
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("⟳ web"),
        "the Rollout page has no tree:\n{page}"
    );
    let status = demo.wait(DEMO_DEADLINE);
    let output = demo.output();
    assert!(status.success(), "the demo failed ({status}):\n{output}");
    for said in [
        // The good release: judged Pass against stable, then promoted by itself.
        "on errors-vs-stable — judge: Pass",
        "analysis running",
        "web is Healthy: 5 of 5 pods run 2.0.0 (stable)",
        // The bad release: judged High, aborted, back on stable by itself.
        "judge: High at 98% confidence",
        "analysis web-",
        ": Failed — rolling back",
        "Rollout aborted: canary 3.0.0 goes back to stable 2.0.0 by itself",
        "back at 100% stable: 5 of 5 pods run 2.0.0, canary 3.0.0 scaled to 0",
        "100% to 2.0.0 (stable), none to 3.0.0",
        "both releases ended as they should",
    ] {
        assert!(
            output.contains(said),
            "the demo never said {said:?}:\n{output}"
        );
    }
    // Without a terminal there are plain pictures instead of redraws.
    assert!(output.contains("│ Name:            web"), "{output}");
    assert!(
        !output.contains("\x1b["),
        "no terminal control sequences in a log"
    );
    let left = demo.leftovers();
    assert!(left.is_empty(), "processes left running: {left:#?}");
}

#[test]
fn ctrl_c_stops_every_process_the_demo_started() {
    if !tools_present() {
        return;
    }
    let mut demo = Demo::start("interrupted");
    demo.wait_for_line("pausing 20s", DEMO_DEADLINE);
    assert!(!demo.leftovers().is_empty(), "the demo's processes run");
    demo.signal("-INT");
    let status = demo.wait(Duration::from_secs(30));
    let output = demo.output();
    assert_eq!(status.code(), Some(130), "{output}");
    assert!(output.contains("demo stopped by Ctrl-C"), "{output}");
    let left = demo.leftovers();
    assert!(left.is_empty(), "processes left running: {left:#?}");
}
