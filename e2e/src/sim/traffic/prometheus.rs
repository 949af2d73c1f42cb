//! A real Prometheus (the `prometheus` binary on PATH, Debian package `prometheus`) run as a
//! child process on a loopback port, scraping kube-sim's pods through the file_sd file every
//! second, with its data in a temp dir; dropping it stops the process and removes the dir.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long Prometheus may take to answer `/-/ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A running Prometheus; stopped when dropped.
pub struct Prometheus {
    child: Child,
    dir: PathBuf,
    address: SocketAddr,
}

impl Prometheus {
    /// Starts Prometheus scraping the targets in `sd_file` (kube-sim's
    /// `--prometheus-sd-file`) every second, and waits until it is ready.
    pub fn start(sd_file: &Path) -> io::Result<Prometheus> {
        let binary = on_path("prometheus").ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "prometheus is not on PATH: install it with `apt-get install -y prometheus` \
                 (the Debian package; run no service, kube-sim's tests start the binary)",
            )
        })?;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let dir = std::env::temp_dir().join(format!(
            "kube-sim-prometheus-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir)?;
        let config = dir.join("prometheus.yml");
        std::fs::write(&config, config_yaml(sd_file))?;
        // Prometheus cannot bind port 0: take a free port and hand it over.
        let address = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let log = std::fs::File::create(dir.join("prometheus.log"))?;
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={address}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        let mut prometheus = Prometheus {
            child,
            dir,
            address,
        };
        prometheus.wait_ready()?;
        Ok(prometheus)
    }

    fn wait_ready(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(io::Error::other(format!(
                    "prometheus exited ({status}) before it was ready: {}",
                    self.log()
                )));
            }
            if matches!(self.get("/-/ready"), Ok((200, _))) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "prometheus on {} not ready after {READY_TIMEOUT:?}: {}",
                        self.address,
                        self.log()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Its log so far, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// GET a path of its HTTP API: (status, body).
    pub fn get(&self, path_and_query: &str) -> io::Result<(u16, String)> {
        let mut stream = TcpStream::connect_timeout(&self.address, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            stream,
            "GET {path_and_query} HTTP/1.0\r\nHost: {}\r\n\r\n",
            self.address
        )?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply)?;
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "a malformed HTTP reply");
        let (head, body) = reply.split_once("\r\n\r\n").ok_or_else(bad)?;
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(bad)?;
        Ok((status, body.to_string()))
    }

    /// An instant query (`/api/v1/query`): the JSON reply's `data.result`, or None when the
    /// query fails.
    pub fn query(&self, promql: &str) -> Option<serde_json::Value> {
        let (status, body) = self
            .get(&format!("/api/v1/query?query={}", percent_encode(promql)))
            .ok()?;
        let mut reply: serde_json::Value = serde_json::from_str(&body).ok()?;
        (status == 200 && reply["status"] == "success").then(|| reply["data"]["result"].take())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        // Already exited is fine: there is nothing left to stop.
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Best effort: a leftover temp dir harms nothing.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A configuration scraping the file_sd targets every second.
pub fn config_yaml(sd_file: &Path) -> String {
    let file = serde_json::Value::from(sd_file.display().to_string());
    format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: kube-sim\n    scrape_interval: 1s\n    file_sd_configs:\n      - files: [{file}]\n        refresh_interval: 1s\n"
    )
}

fn on_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(
            percent_encode("sum(rate(x{a=\"b\"}[5s]))"),
            "sum%28rate%28x%7Ba%3D%22b%22%7D%5B5s%5D%29%29"
        );
    }

    #[test]
    fn the_config_points_file_sd_at_the_targets() {
        let yaml = config_yaml(Path::new("dir/targets.json"));
        assert!(yaml.contains("files: [\"dir/targets.json\"]"), "{yaml}");
        assert!(yaml.contains("scrape_interval: 1s"));
    }
}
