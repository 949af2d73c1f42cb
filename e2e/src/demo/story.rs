//! The story the demo tells, through the real kubectl and plugin: the canary Rollout of
//! `examples/rollout-canary-judge.yaml` under load; a good release the judge passes and the
//! Rollout promotes by itself; a bad one the judge calls High, so the analysis fails and the
//! Rollout returns to stable by itself. Every wait polls the state with a deadline and narrates
//! what it sees on the way.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;

use super::Failure;
use super::cluster::{Cluster, Snapshot, VersionTraffic};
use super::narration::{Narrator, Voice};
use super::processes::{Process, Processes};
use super::screen::{FrameParser, Screen, strip_escapes};
use super::setup::Paths;

/// The Rollout of examples/rollout-canary-judge.yaml, and its pod selector.
pub const ROLLOUT: &str = "web";
pub const SELECTOR: &str = "app=web";
/// Applied in this order: the templates before the Rollout that names them.
const MANIFESTS: [&str; 3] = [
    "examples/analysis-judge-error-rate.yaml",
    "examples/analysis-judge-latency-p99.yaml",
    "examples/rollout-canary-judge.yaml",
];
/// Requests per second kube-sim's load generator sends through the Service.
const REQUESTS_PER_SECOND: u32 = 500;
/// The env var that makes a simulated pod fail a share of its requests, and the bad share.
const ERROR_RATE_ENV: &str = "SIM_ERROR_RATE";
const BAD_ERROR_RATE: &str = "0.2";
/// The analysis argument that carries the canary's pod-template hash.
const CANARY_HASH_ARG: &str = "canary-hash";
const GOOD_TAG: &str = "2.0.0";
const BAD_TAG: &str = "3.0.0";

const POLL: Duration = Duration::from_millis(500);
const HEALTHY_DEADLINE: Duration = Duration::from_secs(60);
/// A release: 20 s pause, 20 s of analysis, promotion or rollback, with room to spare.
const RELEASE_DEADLINE: Duration = Duration::from_secs(150);
const TRAFFIC_DEADLINE: Duration = Duration::from_secs(30);
/// Share of the load a version must be measured receiving to count as serving it all
/// (the measured rate wobbles by a request or two per scrape).
const LOADED_SHARE: f64 = 0.9;
const KUBECTL_DEADLINE: Duration = Duration::from_secs(60);

/// What a look at the state says about the wait.
enum Check {
    Waiting,
    Done,
    /// The Rollout went somewhere it should not have: why.
    Wrong(String),
}

/// What happens between two polls.
enum Wake {
    Poll,
    Picture(Vec<String>),
    /// The live view's output ended.
    PictureGone,
}

/// Follows the Rollout: runs kubectl, polls, narrates, shows the pictures.
pub struct Follow<'a> {
    paths: &'a Paths,
    cluster: Cluster,
    processes: &'a mut Processes,
    screen: &'a mut Screen,
    narrator: Narrator,
    pictures: Option<mpsc::Receiver<Vec<String>>>,
    last: Snapshot,
}

impl<'a> Follow<'a> {
    pub fn new(
        paths: &'a Paths,
        cluster: Cluster,
        processes: &'a mut Processes,
        screen: &'a mut Screen,
    ) -> Self {
        Follow {
            paths,
            cluster,
            processes,
            screen,
            narrator: Narrator::default(),
            pictures: None,
            last: Snapshot::default(),
        }
    }

    fn say(&mut self, text: &str) {
        self.screen.say(Voice::Story, text);
    }

    /// Runs kubectl from the checkout, saying the command first; its stdout on success.
    async fn kubectl(&mut self, args: &[&str]) -> Result<String, Failure> {
        let shown = format!("kubectl {}", shell_words(args));
        self.say(&format!("$ {shown}"));
        self.kubectl_quietly(args)
            .await
            .map_err(|e| Failure::Setup(format!("`{shown}` failed: {e}")))
    }

    async fn kubectl_quietly(&self, args: &[&str]) -> Result<String, String> {
        let mut command = self.paths.command("kubectl");
        command.args(args).stdin(Stdio::null()).kill_on_drop(true);
        let output = tokio::time::timeout(KUBECTL_DEADLINE, command.output())
            .await
            .map_err(|_| format!("no answer within {KUBECTL_DEADLINE:?}"))?
            .map_err(|e| e.to_string())?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }

    /// `kubectl rollouts get rollout` once, as plain lines.
    pub async fn picture(&self) -> Vec<String> {
        match self
            .kubectl_quietly(&["rollouts", "get", "rollout", ROLLOUT])
            .await
        {
            Ok(text) => strip_escapes(&text).lines().map(str::to_string).collect(),
            Err(e) => vec![format!("(kubectl rollouts get rollout {ROLLOUT}: {e})")],
        }
    }

    /// On a terminal: `kubectl rollouts get rollout NAME --watch` in the top of the screen.
    fn start_live_view(&mut self) -> Result<(), Failure> {
        if !self.screen.is_live() {
            return Ok(());
        }
        let mut command = self.paths.command("kubectl");
        command.args(["rollouts", "get", "rollout", ROLLOUT, "--watch"]);
        let log = self.paths.work_dir.join("watch.log");
        let process = Process::spawn("watch", command, &log, true)
            .map_err(|e| Failure::Setup(e.to_string()))?;
        let process = self.processes.add(process);
        let mut stdout = process
            .take_stdout()
            .ok_or_else(|| Failure::Setup("the watch view's output was not captured".into()))?;
        let (sender, receiver) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut parser = FrameParser::default();
            let mut chunk = vec![0u8; 16 * 1024];
            while let Ok(read) = stdout.read(&mut chunk).await {
                if read == 0 {
                    break;
                }
                if let Some(lines) = parser.push(&chunk[..read])
                    && sender.send(lines).await.is_err()
                {
                    break;
                }
            }
        });
        self.pictures = Some(receiver);
        Ok(())
    }

    async fn next_wake(
        pictures: &mut Option<mpsc::Receiver<Vec<String>>>,
        ticker: &mut tokio::time::Interval,
    ) -> Wake {
        match pictures {
            Some(receiver) => tokio::select! {
                _ = ticker.tick() => Wake::Poll,
                picture = receiver.recv() => picture.map_or(Wake::PictureGone, Wake::Picture),
            },
            None => {
                ticker.tick().await;
                Wake::Poll
            }
        }
    }

    /// Fails if kube-sim, Prometheus or the controller has stopped; a stopped live view is
    /// only said (the narration goes on without it).
    async fn check_processes(&mut self) -> Result<(), Failure> {
        let Some((process, status)) = self.processes.first_exited() else {
            return Ok(());
        };
        let (name, log, tail) = (process.name, process.log.clone(), process.log_tail(15));
        if name != "watch" {
            return Err(Failure::Setup(format!(
                "{name} exited ({status}); the end of {}:\n{tail}",
                log.display()
            )));
        }
        self.processes.stop(name).await;
        self.pictures = None;
        self.say(&format!(
            "the live view stopped ({status}; see {}): narrating without it",
            log.display()
        ));
        Ok(())
    }

    /// Polls until `check` says Done (Ok) or Wrong, or `deadline` passes; narrates each poll.
    async fn wait_until(
        &mut self,
        what: &str,
        deadline: Duration,
        mut check: impl FnMut(&Snapshot) -> Check,
    ) -> Result<Snapshot, Failure> {
        let give_up = tokio::time::Instant::now() + deadline;
        let mut ticker = tokio::time::interval(POLL);
        loop {
            match Self::next_wake(&mut self.pictures, &mut ticker).await {
                Wake::Picture(lines) => {
                    let title = format!("kubectl rollouts get rollout {ROLLOUT} --watch");
                    self.screen.show_picture(&title, lines);
                    continue;
                }
                Wake::PictureGone => {
                    self.pictures = None;
                    continue;
                }
                Wake::Poll => {}
            }
            self.check_processes().await?;
            let read_error = match self.cluster.snapshot().await {
                Ok(snapshot) => {
                    self.narrate(&snapshot).await;
                    let verdict = check(&snapshot);
                    self.last = snapshot;
                    match verdict {
                        Check::Done => return Ok(self.last.clone()),
                        Check::Wrong(why) => {
                            return Err(Failure::Wrong {
                                what: why,
                                status: self.last.summary(),
                                picture: self.picture().await,
                            });
                        }
                        Check::Waiting => None,
                    }
                }
                Err(e) => Some(e),
            };
            if tokio::time::Instant::now() > give_up {
                let mut status = self.last.summary();
                if let Some(e) = read_error {
                    status.push_str(&format!("; the last read failed: {e}"));
                }
                return Err(Failure::Timeout {
                    what: what.to_string(),
                    after: deadline,
                    status,
                    picture: self.picture().await,
                });
            }
        }
    }

    async fn narrate(&mut self, snapshot: &Snapshot) {
        let notes = self.narrator.observe(snapshot);
        let milestone = notes.iter().any(|n| n.milestone);
        for note in notes {
            self.screen.say(note.voice, &note.text);
        }
        if milestone && !self.screen.is_live() {
            let picture = self.picture().await;
            self.screen.print_picture(&picture);
        }
    }

    /// Waits until Prometheus measures the load reaching one version alone: the release that
    /// follows is judged against a baseline with traffic.
    async fn wait_for_load_on(&mut self, hash: &str, tag: &str) -> Result<(), Failure> {
        let wanted = LOADED_SHARE * f64::from(REQUESTS_PER_SECOND);
        self.wait_until(
            &format!(
                "Prometheus to measure the load ({REQUESTS_PER_SECOND} req/s) reaching {tag} alone"
            ),
            TRAFFIC_DEADLINE,
            |s| {
                let Some(traffic) = &s.traffic else {
                    return Check::Waiting;
                };
                let total: f64 = traffic.iter().map(|t| t.rps).sum();
                if rps(traffic, hash) >= wanted && rps(traffic, hash) >= total {
                    Check::Done
                } else {
                    Check::Waiting
                }
            },
        )
        .await
        .map(drop)
    }

    /// The whole story; Ok once both releases ended as they should.
    pub async fn tell(&mut self) -> Result<(), Failure> {
        self.say("applying the judge's AnalysisTemplates, the Service and the canary Rollout");
        let mut apply = vec!["apply"];
        for manifest in MANIFESTS {
            apply.extend(["-f", manifest]);
        }
        self.kubectl(&apply).await?;
        self.start_live_view()?;
        self.say(&format!(
            "putting load on the app: {REQUESTS_PER_SECOND} requests a second through Service {ROLLOUT} (kube-sim's load generator)"
        ));
        let load = format!("sim.rollouts.dev/rps={REQUESTS_PER_SECOND}");
        self.kubectl(&["annotate", "--overwrite", "service", ROLLOUT, &load])
            .await?;
        let first = self
            .wait_until(
                "the Rollout to become Healthy with every pod on the first version",
                HEALTHY_DEADLINE,
                |s| {
                    let current = s.current_hash();
                    let healthy = s.phase() == "Healthy"
                        && !current.is_empty()
                        && s.stable_hash() == current
                        && s.available(current) >= s.desired_replicas();
                    if healthy { Check::Done } else { Check::Waiting }
                },
            )
            .await?;
        let first_hash = first.current_hash().to_string();
        let (container, repository) = container_image(&first.rollout)?;
        self.wait_for_load_on(&first_hash, &first.version(&first_hash))
            .await?;

        self.say(&format!(
            "releasing {GOOD_TAG}, a good release: it fails as few requests as {} does ({ERROR_RATE_ENV} unchanged)",
            first.version(&first_hash)
        ));
        let image = format!("{container}={repository}:{GOOD_TAG}");
        self.kubectl(&["rollouts", "set", "image", ROLLOUT, &image])
            .await?;
        let promoted = self
            .wait_until(
                &format!("{GOOD_TAG} to be promoted: the judge passes it and the Rollout goes to 100% by itself"),
                RELEASE_DEADLINE,
                |s| {
                    let current = s.current_hash();
                    if current.is_empty() || current == first_hash {
                        Check::Waiting
                    } else if s.aborted() {
                        Check::Wrong(format!("the good release {GOOD_TAG} was aborted"))
                    } else if s.phase() == "Healthy"
                        && s.stable_hash() == current
                        && s.available(current) >= s.desired_replicas()
                    {
                        Check::Done
                    } else {
                        Check::Waiting
                    }
                },
            )
            .await?;
        let good_hash = promoted.current_hash().to_string();
        self.wait_for_load_on(&good_hash, GOOD_TAG).await?;

        self.say(&format!(
            "releasing {BAD_TAG}, a bad release: it fails {} of its requests ({ERROR_RATE_ENV} {BAD_ERROR_RATE}) where {GOOD_TAG} fails {}",
            percent(BAD_ERROR_RATE),
            percent(&error_rate(&promoted.rollout).unwrap_or_default())
        ));
        let patch = bad_release_patch(&promoted.rollout, &repository)?;
        self.kubectl(&["patch", "rollout", ROLLOUT, "--type", "json", "-p", &patch])
            .await?;
        self.wait_until(
            &format!("{BAD_TAG} to be rolled back: the judge says High, the analysis fails and every pod is back on {GOOD_TAG} by itself"),
            RELEASE_DEADLINE,
            |s| {
                let current = s.current_hash();
                if current.is_empty() || current == good_hash {
                    return Check::Waiting;
                }
                if s.stable_hash() == current {
                    return Check::Wrong(format!("the bad release {BAD_TAG} was promoted to stable"));
                }
                let back = s.aborted()
                    && s.stable_hash() == good_hash
                    && s.wanted(current) == 0
                    && s.available(current) == 0
                    && s.available(&good_hash) >= s.desired_replicas()
                    && s.canary_weight().unwrap_or(0) == 0;
                if !back {
                    Check::Waiting
                } else if judged_high(s, current) {
                    Check::Done
                } else {
                    Check::Wrong(format!(
                        "{BAD_TAG} was rolled back, but no judge measurement of its analysis said High"
                    ))
                }
            },
        )
        .await?;
        let measured = self
            .wait_until(
                &format!(
                    "Prometheus to measure every request going to {GOOD_TAG} and none to {BAD_TAG}"
                ),
                TRAFFIC_DEADLINE,
                |s| {
                    let Some(traffic) = &s.traffic else {
                        return Check::Waiting;
                    };
                    if rps(traffic, &good_hash) > 0.0 && rps(traffic, s.current_hash()) == 0.0 {
                        Check::Done
                    } else {
                        Check::Waiting
                    }
                },
            )
            .await?;
        let total: f64 = measured.traffic.iter().flatten().map(|t| t.rps).sum();
        self.screen.say(
            Voice::Traffic,
            &format!("{total:.0} req/s: 100% to {GOOD_TAG} (stable), none to {BAD_TAG}"),
        );
        self.say(&format!(
            "both releases ended as they should: {GOOD_TAG} promoted and {BAD_TAG} rolled back, each by the judge's verdict"
        ));
        Ok(())
    }
}

/// Requests per second Prometheus measured going to one version.
fn rps(traffic: &[VersionTraffic], hash: &str) -> f64 {
    traffic
        .iter()
        .filter(|t| t.hash == hash)
        .map(|t| t.rps)
        .sum()
}

/// The first container's name and image repository (the image without its tag).
fn container_image(rollout: &Value) -> Result<(String, String), Failure> {
    let container = rollout.pointer("/spec/template/spec/containers/0");
    let field = |name: &str| {
        container
            .and_then(|c| c.get(name))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    match (field("name"), field("image")) {
        (Some(name), Some(image)) => {
            let repository = match image.rsplit_once(':') {
                Some((repository, tag)) if !tag.contains('/') => repository.to_string(),
                _ => image,
            };
            Ok((name, repository))
        }
        _ => Err(Failure::Setup(format!(
            "Rollout {ROLLOUT}: spec.template.spec.containers[0] needs a name and an image (see examples/rollout-canary-judge.yaml)"
        ))),
    }
}

/// Where SIM_ERROR_RATE is in the first container's env.
fn error_rate_index(rollout: &Value) -> Option<usize> {
    rollout
        .pointer("/spec/template/spec/containers/0/env")
        .and_then(Value::as_array)?
        .iter()
        .position(|var| var.get("name").and_then(Value::as_str) == Some(ERROR_RATE_ENV))
}

/// The first container's SIM_ERROR_RATE.
fn error_rate(rollout: &Value) -> Option<String> {
    let index = error_rate_index(rollout)?;
    let path = format!("/spec/template/spec/containers/0/env/{index}/value");
    Some(rollout.pointer(&path)?.as_str()?.to_string())
}

/// "0.2" -> "20%"; a value that is not a number is shown as it is.
fn percent(share: &str) -> String {
    match share.parse::<f64>() {
        // Rounded to a tenth of a percent, so float noise never shows.
        Ok(share) => format!("{}%", (share * 1000.0).round() / 10.0),
        Err(_) => share.to_string(),
    }
}

/// A JSON patch giving the first container the bad image tag and the bad error rate.
fn bad_release_patch(rollout: &Value, repository: &str) -> Result<String, Failure> {
    let env = error_rate_index(rollout).ok_or_else(|| {
            Failure::Setup(format!(
                "Rollout {ROLLOUT}: spec.template.spec.containers[0].env has no {ERROR_RATE_ENV}: add it (see examples/rollout-canary-judge.yaml)"
            ))
        })?;
    Ok(json!([
        {"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": format!("{repository}:{BAD_TAG}")},
        {"op": "replace", "path": format!("/spec/template/spec/containers/0/env/{env}/value"), "value": BAD_ERROR_RATE},
    ])
    .to_string())
}

/// Whether a judge measurement of the analysis of `canary_hash` said High.
fn judged_high(snapshot: &Snapshot, canary_hash: &str) -> bool {
    snapshot
        .analysis_runs
        .iter()
        .filter(|run| {
            run.pointer("/spec/args")
                .and_then(Value::as_array)
                .is_some_and(|args| {
                    args.iter().any(|arg| {
                        arg.get("name").and_then(Value::as_str) == Some(CANARY_HASH_ARG)
                            && arg.get("value").and_then(Value::as_str) == Some(canary_hash)
                    })
                })
        })
        .flat_map(|run| {
            run.pointer("/status/metricResults")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
        })
        .flat_map(|result| {
            result
                .pointer("/measurements")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
        })
        .filter_map(|m| serde_json::from_str::<Value>(m.get("value")?.as_str()?).ok())
        .any(|value| value.get("verdict").and_then(Value::as_str) == Some("High"))
}

/// Arguments as a person would type them: quoted when they hold spaces or quotes.
fn shell_words(args: &[&str]) -> String {
    args.iter()
        .map(|arg| {
            if arg
                .chars()
                .any(|c| c.is_whitespace() || "'\"{}[]$".contains(c))
            {
                format!("'{}'", arg.replace('\'', r"'\''"))
            } else {
                arg.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rollout() -> Value {
        json!({"spec": {"template": {"spec": {"containers": [{
            "name": "web",
            "image": "registry.example.com:5000/web:1.0.0",
            "env": [{"name": "SIM_LATENCY_MS", "value": "40"}, {"name": "SIM_ERROR_RATE", "value": "0.01"}],
        }]}}}})
    }

    #[test]
    fn the_image_repository_keeps_a_registry_port() {
        let (container, repository) = container_image(&rollout()).expect("a container");
        assert_eq!(container, "web");
        assert_eq!(repository, "registry.example.com:5000/web");
    }

    #[test]
    fn the_bad_release_patches_the_error_rate_where_it_is() {
        let patch: Value = serde_json::from_str(
            &bad_release_patch(&rollout(), "registry.example.com/web").expect("a patch"),
        )
        .expect("JSON");
        assert_eq!(patch[0]["value"], "registry.example.com/web:3.0.0");
        assert_eq!(
            patch[1]["path"],
            "/spec/template/spec/containers/0/env/1/value"
        );
        assert_eq!(patch[1]["value"], BAD_ERROR_RATE);
        assert_eq!(error_rate(&rollout()).as_deref(), Some("0.01"));
        assert_eq!(percent("0.01"), "1%");
        assert_eq!(percent("0.2"), "20%");
    }

    #[test]
    fn a_high_verdict_counts_only_for_the_canary_it_judged() {
        let run = json!({
            "spec": {"args": [{"name": "canary-hash", "value": "bad"}]},
            "status": {"metricResults": [{"measurements": [
                {"value": "{\"verdict\":\"Pass\"}"}, {"value": "{\"verdict\":\"High\"}"},
            ]}]},
        });
        let snapshot = Snapshot {
            analysis_runs: vec![run],
            ..Snapshot::default()
        };
        assert!(judged_high(&snapshot, "bad"));
        assert!(!judged_high(&snapshot, "good"));
    }

    #[test]
    fn commands_are_shown_quoted_as_typed() {
        assert_eq!(
            shell_words(&["patch", "-p", "[{\"op\": 1}]"]),
            "patch -p '[{\"op\": 1}]'"
        );
    }
}
