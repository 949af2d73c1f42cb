//! Getting the demo's world up: the tools it needs (kubectl, Prometheus, installed from Debian
//! when possible), then kube-sim with our CRDs, a Prometheus scraping its pods, the controller
//! and the plugin's dashboard, each waited for with a deadline.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use super::Failure;
use super::cluster;
use super::narration::Voice;
use super::processes::{Process, Processes, free_loopback_address, on_path, run_logged};
use super::screen::Screen;

/// How long each program may take to come up.
const START_DEADLINE: Duration = Duration::from_secs(30);
/// How often a starting program is asked whether it is ready.
const READY_POLL: Duration = Duration::from_millis(200);
/// The dashboard's own default port, used when it is free (else any free one).
const DASHBOARD_PORT: u16 = 3100;

/// Where things are: the checkout, our built binaries, and the demo's own folder of logs.
#[derive(Clone, Debug)]
pub struct Paths {
    /// The checkout (holds examples/ and crds/yaml/).
    pub repo: PathBuf,
    /// Where kube-sim, rollouts-controller and kubectl-rollouts were built.
    pub bin_dir: PathBuf,
    /// `target/demo/`: logs, kubeconfig, Prometheus config and data.
    pub work_dir: PathBuf,
}

impl Paths {
    pub fn kubeconfig(&self) -> PathBuf {
        self.work_dir.join("kubeconfig")
    }

    /// PATH with our binaries first, so `kubectl rollouts` runs the plugin just built.
    pub fn search_path(&self) -> std::ffi::OsString {
        let inherited = std::env::var_os("PATH").unwrap_or_default();
        let dirs = std::iter::once(self.bin_dir.clone()).chain(std::env::split_paths(&inherited));
        std::env::join_paths(dirs).unwrap_or(inherited)
    }

    /// A command with the demo's kubeconfig, discovery cache and PATH, run from the checkout.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command
            .current_dir(&self.repo)
            .env("KUBECONFIG", self.kubeconfig())
            .env("KUBECACHEDIR", self.work_dir.join("kube-cache"))
            .env("PATH", self.search_path());
        command
    }
}

/// The addresses of what was started.
pub struct Started {
    pub api: SocketAddr,
    pub prometheus: SocketAddr,
    /// The dashboard's page (`http://127.0.0.1:3100/`).
    pub dashboard: String,
}

/// Fails with what to install when a tool the demo drives is missing.
pub async fn check_tools(
    paths: &Paths,
    install_prometheus: bool,
    screen: &mut Screen,
) -> Result<(), Failure> {
    for binary in ["kube-sim", "rollouts-controller", "kubectl-rollouts"] {
        if !paths.bin_dir.join(binary).is_file() {
            return Err(Failure::Setup(format!(
                "{binary} is not built in {}: run `cargo build -p rollouts-controller -p kubectl-rollouts -p rollouts-e2e --bins` (make demo does)",
                paths.bin_dir.display()
            )));
        }
    }
    if on_path("kubectl").is_none() {
        return Err(Failure::Setup(
            "kubectl is not on PATH: install kubectl 1.32 (for example the Debian package kubectl from the Kubernetes apt repository) and run the demo again".to_string(),
        ));
    }
    if on_path("prometheus").is_some() {
        return Ok(());
    }
    let how = "install the Debian package: `sudo apt-get install -y prometheus` (or put a Prometheus 2.x or 3.x binary named prometheus on PATH), then run `make demo` again";
    if !install_prometheus {
        return Err(Failure::Setup(format!("prometheus is not on PATH: {how}")));
    }
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0");
    if !root || on_path("apt-get").is_none() {
        return Err(Failure::Setup(format!(
            "prometheus is not on PATH, and the demo installs it only as root with apt-get: {how}"
        )));
    }
    let log = paths.work_dir.join("apt.log");
    screen.say(
        Voice::Story,
        "prometheus is not on PATH: installing the Debian package (apt-get install -y prometheus)",
    );
    for args in [
        &["update", "-qq"][..],
        &[
            "install",
            "-y",
            "-qq",
            "--no-install-recommends",
            "prometheus",
        ][..],
    ] {
        let mut apt = Command::new("apt-get");
        apt.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        run_logged(apt, &log).await.map_err(|e| {
            Failure::Setup(format!("installing prometheus failed: {e}. Instead, {how}"))
        })?;
    }
    // The package may start its own service on :9090; the demo runs its own Prometheus.
    if on_path("systemctl").is_some() {
        let mut stop = Command::new("systemctl");
        stop.args(["stop", "prometheus"]);
        // Best effort: no systemd (a container) means no service was started either.
        let _ = run_logged(stop, &log).await;
    }
    match on_path("prometheus") {
        Some(_) => Ok(()),
        None => Err(Failure::Setup(format!(
            "apt-get installed prometheus but it is still not on PATH (see {}): {how}",
            log.display()
        ))),
    }
}

/// Polls `ready` every [`READY_POLL`] until it holds, failing after [`START_DEADLINE`] with
/// the process's log.
async fn wait_ready<F, Fut>(
    processes: &mut Processes,
    name: &str,
    mut ready: F,
) -> Result<(), Failure>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + START_DEADLINE;
    loop {
        if ready().await {
            return Ok(());
        }
        if let Some(process) = processes.get_mut(name)
            && let Some(status) = process.exited()
        {
            return Err(Failure::Setup(format!(
                "{name} exited ({status}) while starting; the end of {}:\n{}",
                process.log.display(),
                process.log_tail(15)
            )));
        }
        if tokio::time::Instant::now() > deadline {
            let log = processes
                .get_mut(name)
                .map(|p| format!("; the end of {}:\n{}", p.log.display(), p.log_tail(15)))
                .unwrap_or_default();
            return Err(Failure::Setup(format!(
                "{name} was not ready after {START_DEADLINE:?}{log}"
            )));
        }
        tokio::time::sleep(READY_POLL).await;
    }
}

async fn answers_ok(address: SocketAddr, path: &str) -> bool {
    matches!(cluster::get(address, path).await, Ok((200, _)))
}

/// Starts kube-sim, Prometheus, the controller and the dashboard, in that order, each once
/// ready.
pub async fn start(
    paths: &Paths,
    processes: &mut Processes,
    screen: &mut Screen,
) -> Result<Started, Failure> {
    let setup = |e: std::io::Error| Failure::Setup(e.to_string());
    let work = &paths.work_dir;
    let sd_file = work.join("prometheus-targets.json");

    screen.say(
        Voice::Story,
        "starting kube-sim (the Kubernetes API simulator) with our CRDs",
    );
    let mut sim = paths.command(&paths.bin_dir.join("kube-sim").to_string_lossy());
    sim.arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--kubeconfig")
        .arg(paths.kubeconfig())
        .arg("--crds")
        .arg(paths.repo.join("crds/yaml"))
        .arg("--prometheus-sd-file")
        .arg(&sd_file);
    let sim = processes
        .add(Process::spawn("kube-sim", sim, &work.join("kube-sim.log"), true).map_err(setup)?);
    let stdout = sim
        .take_stdout()
        .ok_or_else(|| Failure::Setup("kube-sim's output was not captured".to_string()))?;
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(START_DEADLINE, lines.next_line()).await;
    let api: SocketAddr = match first {
        Ok(Ok(Some(line))) => line.trim().parse().map_err(|_| {
            Failure::Setup(format!("kube-sim printed {line:?} instead of its address"))
        })?,
        _ => {
            return Err(Failure::Setup(format!(
                "kube-sim did not print its address within {START_DEADLINE:?}; the end of its log:\n{}",
                sim.log_tail(15)
            )));
        }
    };
    // Keep reading, so kube-sim never writes into a closed pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    wait_ready(processes, "kube-sim", || answers_ok(api, "/version")).await?;

    screen.say(
        Voice::Story,
        "starting Prometheus, scraping every simulated pod once a second",
    );
    let config = work.join("prometheus.yml");
    std::fs::write(
        &config,
        rollouts_e2e::sim::traffic::prometheus::config_yaml(&sd_file),
    )
    .map_err(|e| Failure::Setup(format!("cannot write {}: {e}", config.display())))?;
    let prometheus = free_loopback_address().map_err(setup)?;
    let mut command = Command::new("prometheus");
    command
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            work.join("prometheus-data").display()
        ))
        .arg(format!("--web.listen-address={prometheus}"));
    processes.add(
        Process::spawn("prometheus", command, &work.join("prometheus.log"), false)
            .map_err(setup)?,
    );
    wait_ready(processes, "prometheus", || {
        answers_ok(prometheus, "/-/ready")
    })
    .await?;

    screen.say(
        Voice::Story,
        &format!("starting rollouts-controller (analysis queries Prometheus at {prometheus})"),
    );
    let health = free_loopback_address().map_err(setup)?;
    let metrics = free_loopback_address().map_err(setup)?;
    let mut controller =
        paths.command(&paths.bin_dir.join("rollouts-controller").to_string_lossy());
    controller
        .arg("--leader-elect=false")
        .arg(format!("--health-addr={health}"))
        .arg(format!("--metrics-addr={metrics}"))
        .arg(format!("--prometheus-address=http://{prometheus}"))
        .arg("--kubeconfig")
        .arg(paths.kubeconfig());
    processes.add(
        Process::spawn(
            "rollouts-controller",
            controller,
            &work.join("controller.log"),
            false,
        )
        .map_err(setup)?,
    );
    wait_ready(processes, "rollouts-controller", || {
        answers_ok(health, "/readyz")
    })
    .await?;
    let dashboard = start_dashboard(paths, processes, screen).await?;
    Ok(Started {
        api,
        prometheus,
        dashboard,
    })
}

/// Starts `kubectl rollouts dashboard` on port 3100 when it is free (else on any free port);
/// returns its page's URL once the page answers.
async fn start_dashboard(
    paths: &Paths,
    processes: &mut Processes,
    screen: &mut Screen,
) -> Result<String, Failure> {
    screen.say(
        Voice::Story,
        "starting the dashboard (kubectl rollouts dashboard) for the same story in a browser",
    );
    let port = if std::net::TcpListener::bind(("127.0.0.1", DASHBOARD_PORT)).is_ok() {
        DASHBOARD_PORT
    } else {
        0
    };
    match start_dashboard_on(paths, processes, port).await {
        // 3100 was taken between the check and the dashboard's bind (another demo starting
        // at the same moment): any free port then.
        Err(_) if port != 0 => {
            processes.remove("dashboard").await;
            start_dashboard_on(paths, processes, 0).await
        }
        started => started,
    }
    .map(|url| {
        screen.say(
            Voice::Story,
            &format!("dashboard: {url} (open it to watch the releases live in a browser)"),
        );
        url
    })
}

/// [`start_dashboard`] on `port` (0: any free one).
async fn start_dashboard_on(
    paths: &Paths,
    processes: &mut Processes,
    port: u16,
) -> Result<String, Failure> {
    let mut command = paths.command("kubectl");
    // --kubeconfig on the command line too, so the process names the demo's folder.
    command
        .args(["rollouts", "dashboard", "--port", &port.to_string()])
        .arg("--kubeconfig")
        .arg(paths.kubeconfig());
    let log = paths.work_dir.join("dashboard.log");
    let dashboard = processes.add(
        Process::spawn("dashboard", command, &log, true)
            .map_err(|e| Failure::Setup(e.to_string()))?,
    );
    let stdout = dashboard
        .take_stdout()
        .ok_or_else(|| Failure::Setup("the dashboard's output was not captured".to_string()))?;
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(START_DEADLINE, lines.next_line()).await;
    // "Dashboard of namespace default: http://127.0.0.1:3100/ (Ctrl-C to stop)"
    let url = match &first {
        Ok(Ok(Some(line))) => line
            .split_whitespace()
            .find(|word| word.starts_with("http://"))
            .map(str::to_string),
        _ => None,
    };
    let Some(url) = url else {
        return Err(Failure::Setup(format!(
            "the dashboard did not print its address within {START_DEADLINE:?} (it printed {first:?}); the end of {}:\n{}",
            log.display(),
            dashboard.log_tail(15)
        )));
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let address: SocketAddr = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .map_err(|_| Failure::Setup(format!("the dashboard printed a bad address: {url}")))?;
    wait_ready(processes, "dashboard", || answers_ok(address, "/")).await?;
    Ok(url)
}

/// The checkout: the first of `starts` (and their parents) holding the demo's manifests.
pub fn find_repo(starts: &[PathBuf]) -> Option<PathBuf> {
    starts
        .iter()
        .flat_map(|start| start.ancestors())
        .find(|dir| is_repo(dir))
        .map(Path::to_path_buf)
}

fn is_repo(dir: &Path) -> bool {
    dir.join("examples/rollout-canary-judge.yaml").is_file() && dir.join("crds/yaml").is_dir()
}
