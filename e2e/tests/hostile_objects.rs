//! Hostile objects: one team's bad manifest never stops the controller for the others.
//!
//! Given the real controller on kube-sim, a control Rollout and a control AnalysisRun, each
//! hostile object below is created one at a time. After each one: the controller process is
//! alive and Ready, its CPU over a short window stays low (no spin), the control AnalysisRun is
//! still measured, and the control Rollout still releases a new revision to Healthy. At the end,
//! every hostile object that the API server stored carries a verdict naming what is wrong (an
//! `InvalidSpec` condition on a Rollout, the `Error` phase on an AnalysisRun), or was served
//! when it is in fact usable. The figures (CPU with each object present) are printed.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rollouts_e2e::harness::Scenario;
use serde_json::{Value, json};

/// The image kube-sim's pods "run".
const IMAGE: &str = "rollouts-e2e/app:1";
/// Bytes of the oversized web response: above the default 10 MiB cap.
const HUGE_BODY: usize = 24 << 20;
/// How long each CPU reading lasts.
const CPU_WINDOW: Duration = Duration::from_secs(3);
/// A spinning task burns most of a core; the controller at rest burns next to nothing. The
/// line is far from both, so a loaded CI machine does not make it flaky.
const SPIN_SHARE: f64 = 0.35;

/// What the API server should make of a hostile object, and what the controller should.
#[derive(Clone, Copy, Debug)]
enum Verdict {
    /// A Rollout the controller must refuse with `InvalidSpec`.
    InvalidSpec,
    /// An AnalysisRun the controller must end in `Error`.
    Error,
    /// Refused or served, as long as it is one of the two and says so.
    RefusedOrServed,
}

struct Hostile {
    what: &'static str,
    object: Value,
    verdict: Verdict,
}

#[test]
fn hostile_objects_do_not_take_the_controller_down() {
    let s = Scenario::on_sim("hostile_objects", "control");
    let server = WebServer::start();
    let given = s.given();
    given.controller_is_running();
    create(&s, &services("control"));
    create(&s, &control_rollout(1));
    let mut hash = given.rollout_is_healthy(Duration::from_secs(30));
    create(&s, &control_run(&server.url("/ok")));

    let hostile = hostile_objects(&s, &server);
    let mut figures = Vec::new();
    let mut stored = Vec::new();
    for (i, h) in hostile.iter().enumerate() {
        let accepted = s.kubectl().ok(
            &["create", "--validate=false", "-f", "-"],
            Some(&h.object.to_string()),
        );
        let kind = h.object["kind"].as_str().unwrap_or_default();
        let name = h.object["metadata"]["name"].as_str().unwrap_or_default();
        match &accepted {
            Ok(_) => stored.push((h, kind, name)),
            Err(e) => println!(
                "hostile {:2} {:<44} refused by the API server: {}",
                i + 1,
                h.what,
                first_line(e)
            ),
        }
        if kind == "Rollout" && accepted.is_ok() {
            // A second revision makes the controller walk the steps, pauses included.
            let patch =
                json!({"spec": {"template": {"metadata": {"annotations": {"revision": "2"}}}}});
            let _ = s.kubectl().run(
                &[
                    "patch",
                    "rollout",
                    name,
                    "--type",
                    "merge",
                    "-p",
                    &patch.to_string(),
                ],
                None,
            );
        }

        let measured_before = measurement_count(&s);
        hash = release_control(&s, hash, i as u32 + 2, h.what);
        s.then().eventually(
            &format!(
                "the control AnalysisRun to be measured again after {}",
                h.what
            ),
            Duration::from_secs(20),
            |_| (measurement_count(&s) > measured_before).then_some(()),
        );
        let cpu = cpu_share(&s, h.what);
        let state = s.controller_state();
        s.then().holds(state.exited.is_none() && state.ready, || {
            format!(
                "after {}: the controller should be alive and Ready, is {state:?}",
                h.what
            )
        });
        s.then().holds(cpu < SPIN_SHARE, || {
            format!(
                "after {}: the controller burns {:.0}% of a core at rest",
                h.what,
                cpu * 100.0
            )
        });
        figures.push((h.what, accepted.is_ok(), cpu));
    }

    for (h, kind, name) in &stored {
        let verdict = s.then().eventually(
            &format!("a verdict on {kind} {name} ({})", h.what),
            Duration::from_secs(30),
            |_| verdict(&s, kind, name, h.verdict),
        );
        println!("verdict on {kind} {name}: {verdict}");
    }

    println!(
        "hostile inputs: {}, stored by the API server: {}, that took anything down: 0",
        hostile.len(),
        stored.len()
    );
    println!("{:<46} {:>8} {:>10}", "input", "stored", "CPU");
    for (what, accepted, cpu) in figures {
        println!(
            "{what:<46} {:>8} {:>9.1}%",
            if accepted { "yes" } else { "no" },
            cpu * 100.0
        );
    }
}

fn hostile_objects(s: &Scenario, server: &WebServer) -> Vec<Hostile> {
    let deep_condition = format!("{}result == 1{}", "(".repeat(50_000), ")".repeat(50_000));
    let deep_start = format!("{}now(){}", "(".repeat(50_000), ")".repeat(50_000));
    let mut deep_json = json!(1);
    for _ in 0..140 {
        deep_json = json!({ "a": deep_json });
    }
    let prometheus = s.prometheus_address().to_string();
    let web = |url: &str| json!({"web": {"url": url, "jsonPath": "{$.value}"}});
    vec![
        Hostile {
            what: "pause of 100000000000000000000s",
            object: rollout(
                "pause-overflow",
                json!([{"setWeight": 20}, {"pause": {"duration": "100000000000000000000s"}}]),
            ),
            verdict: Verdict::InvalidSpec,
        },
        Hostile {
            what: "setWeight 150",
            object: rollout("weight-150", json!([{"setWeight": 150}])),
            verdict: Verdict::InvalidSpec,
        },
        Hostile {
            what: "setWeight -5",
            object: rollout("weight-minus-5", json!([{"setWeight": -5}])),
            verdict: Verdict::InvalidSpec,
        },
        Hostile {
            what: "maxSurge 9223372036854775807%",
            object: with(
                rollout("surge-huge", json!([{"setWeight": 20}])),
                "/spec/strategy/canary/maxSurge",
                json!("9223372036854775807%"),
            ),
            verdict: Verdict::InvalidSpec,
        },
        Hostile {
            what: "a Rollout with no template",
            object: without(
                rollout("no-template", json!([{"setWeight": 20}])),
                "template",
            ),
            verdict: Verdict::InvalidSpec,
        },
        Hostile {
            what: "replicas 3000000000 (above int32)",
            object: with(
                rollout("replicas-overflow", json!([{"setWeight": 20}])),
                "/spec/replicas",
                json!(3_000_000_000u64),
            ),
            verdict: Verdict::InvalidSpec,
        },
        Hostile {
            what: "a pod template nested 140 deep",
            object: with(
                rollout("deep-template", json!([{"setWeight": 20}])),
                "/spec/template/spec/deep",
                deep_json.clone(),
            ),
            verdict: Verdict::RefusedOrServed,
        },
        Hostile {
            what: "a second Rollout on the control's Services",
            object: with(
                with(
                    rollout("service-thief", json!([{"setWeight": 20}])),
                    "/spec/strategy/canary/canaryService",
                    json!("control-canary"),
                ),
                "/spec/strategy/canary/stableService",
                json!("control-stable"),
            ),
            verdict: Verdict::InvalidSpec,
        },
        Hostile {
            what: "interval of 100000000000000000000s",
            object: run(
                "interval-overflow",
                json!({"interval": "100000000000000000000s", "provider": web(&server.url("/ok"))}),
            ),
            verdict: Verdict::Error,
        },
        Hostile {
            what: "interval 0s (web)",
            object: run(
                "interval-zero",
                json!({"interval": "0s", "count": 1000, "provider": web(&server.url("/ok"))}),
            ),
            verdict: Verdict::Error,
        },
        Hostile {
            what: "a condition nested 50,000 deep",
            object: run(
                "deep-condition",
                json!({"successCondition": deep_condition, "provider": web(&server.url("/ok"))}),
            ),
            verdict: Verdict::Error,
        },
        Hostile {
            what: "a rangeQuery.start nested 50,000 deep",
            object: run(
                "deep-range-start",
                json!({"successCondition": "true", "provider": {"prometheus": {
                "address": prometheus, "query": "up",
                "rangeQuery": {"start": deep_start, "end": "now()", "step": "1m"}}}}),
            ),
            verdict: Verdict::Error,
        },
        Hostile {
            what: "a condition that does not parse",
            object: run(
                "garbage-condition",
                json!({"successCondition": "result >>> ]] (", "provider": web(&server.url("/ok"))}),
            ),
            verdict: Verdict::Error,
        },
        Hostile {
            what: "an oversized web response (24 MiB)",
            object: run(
                "huge-response",
                json!({"interval": "1s", "consecutiveErrorLimit": 1, "successCondition": "true", "provider": web(&server.url("/huge"))}),
            ),
            verdict: Verdict::Error,
        },
        Hostile {
            what: "a web jsonBody nested 140 deep",
            object: run(
                "deep-json-body",
                json!({"successCondition": "true", "provider": {"web": {
                "url": server.url("/ok"), "method": "POST", "jsonPath": "{$.value}", "jsonBody": deep_json}}}),
            ),
            verdict: Verdict::RefusedOrServed,
        },
        Hostile {
            what: "count 3000000000 (above int32)",
            object: run(
                "count-overflow",
                json!({"interval": "1s", "count": 3_000_000_000u64, "provider": web(&server.url("/ok"))}),
            ),
            verdict: Verdict::Error,
        },
    ]
}

/// Releases the control Rollout's next revision and waits for it to be Healthy.
fn release_control(s: &Scenario, stable: String, version: u32, after: &str) -> String {
    s.kubectl()
        .ok(
            &["apply", "--validate=false", "-f", "-"],
            Some(&control_rollout(version).to_string()),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let then = s.then();
    let hash = then.new_revision(&stable, Duration::from_secs(20));
    then.eventually(
        &format!("the control Rollout to release revision {version} after {after}"),
        Duration::from_secs(40),
        |t| {
            let rollout = t.rollout();
            (rollout.is_healthy() && rollout.stable_hash() == hash).then_some(())
        },
    );
    hash
}

/// The controller's CPU use over [`CPU_WINDOW`], as a share of one core.
fn cpu_share(s: &Scenario, after: &str) -> f64 {
    let before = s.controller_state().cpu;
    let start = Instant::now();
    // A measurement window, not a wait for state: the figure is the CPU used within it.
    std::thread::sleep(CPU_WINDOW);
    let after_cpu = s.controller_state().cpu;
    match (before, after_cpu) {
        (Some(a), Some(b)) => b.saturating_sub(a).as_secs_f64() / start.elapsed().as_secs_f64(),
        _ => panic!("after {after}: cannot read the controller's CPU time from /proc"),
    }
}

fn verdict(s: &Scenario, kind: &str, name: &str, want: Verdict) -> Option<String> {
    // Only the status: the object itself may be deeper than a JSON reader here takes.
    let text = s
        .kubectl()
        .ok(&["get", kind, name, "-o", "jsonpath={.status}"], None)
        .ok()?;
    let status: Value = serde_json::from_str(&text).ok()?;
    let invalid = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "InvalidSpec" && c["status"] == "True")
        .map(|c| format!("InvalidSpec: {}", c["message"].as_str().unwrap_or_default()));
    let phase = status["phase"].as_str().unwrap_or_default();
    let message = status["message"].as_str().unwrap_or_default();
    match want {
        Verdict::InvalidSpec => invalid,
        Verdict::Error => (phase == "Error").then(|| format!("Error: {message}")),
        Verdict::RefusedOrServed => invalid.or_else(|| {
            matches!(
                phase,
                "Healthy"
                    | "Successful"
                    | "Running"
                    | "Error"
                    | "Failed"
                    | "Inconclusive"
                    | "Progressing"
                    | "Paused"
            )
            .then(|| format!("{phase}: {message}"))
        }),
    }
}

/// Measurements taken so far by the control AnalysisRun.
fn measurement_count(s: &Scenario) -> i64 {
    s.kubectl()
        .get_json(&["analysisrun", "control"])
        .ok()
        .and_then(|run| run["status"]["metricResults"][0]["count"].as_i64())
        .unwrap_or(0)
}

fn create(s: &Scenario, object: &Value) {
    s.kubectl()
        .ok(
            &["create", "--validate=false", "-f", "-"],
            Some(&object.to_string()),
        )
        .unwrap_or_else(|e| panic!("{e}"));
}

fn first_line(text: &str) -> &str {
    let line = text.lines().next().unwrap_or_default();
    &line[..line.len().min(160)]
}

fn services(name: &str) -> Value {
    let service = |suffix: &str| {
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": format!("{name}-{suffix}")},
               "spec": {"selector": {"app": name}, "ports": [{"port": 80, "targetPort": 8080}]}})
    };
    json!({"apiVersion": "v1", "kind": "List", "items": [service("canary"), service("stable")]})
}

fn control_rollout(version: u32) -> Value {
    let mut rollout = rollout(
        "control",
        json!([{"setWeight": 50}, {"pause": {"duration": "1s"}}]),
    );
    rollout["spec"]["template"]["spec"]["containers"][0]["env"] =
        json!([{"name": "APP_VERSION", "value": version.to_string()}]);
    rollout["spec"]["strategy"]["canary"]["canaryService"] = json!("control-canary");
    rollout["spec"]["strategy"]["canary"]["stableService"] = json!("control-stable");
    rollout
}

fn rollout(name: &str, steps: Value) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": name},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": IMAGE}]}
            },
            "strategy": {"canary": {"steps": steps}}
        }
    })
}

fn control_run(url: &str) -> Value {
    run(
        "control",
        json!({"interval": "1s", "count": 100_000, "successCondition": "result == 1",
                          "provider": {"web": {"url": url, "jsonPath": "{$.value}"}}}),
    )
}

fn run(name: &str, metric: Value) -> Value {
    let mut metric = metric;
    metric["name"] = json!("m");
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AnalysisRun",
        "metadata": {"name": name},
        "spec": {"metrics": [metric]}
    })
}

/// `object` with the JSON pointer `path` set to `value` (parents created).
fn with(mut object: Value, path: &str, value: Value) -> Value {
    let mut at = &mut object;
    for key in path.trim_start_matches('/').split('/') {
        at = &mut at[key];
    }
    *at = value;
    object
}

fn without(mut object: Value, spec_field: &str) -> Value {
    if let Some(spec) = object["spec"].as_object_mut() {
        spec.remove(spec_field);
    }
    object
}

/// A loopback web endpoint for the web provider: `/ok` answers `{"value": 1}`, `/huge` a
/// JSON document of [`HUGE_BODY`] bytes.
struct WebServer {
    address: String,
}

impl WebServer {
    fn start() -> WebServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
        let address = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("local_addr: {e}"))
            .to_string();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                std::thread::spawn(move || serve(stream));
            }
        });
        WebServer { address }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }
}

fn serve(mut stream: TcpStream) {
    let mut reader = BufReader::new(match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    });
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut content_length = 0usize;
    loop {
        let mut header = String::new();
        match reader.read_line(&mut header) {
            Ok(0) | Err(_) => return,
            Ok(_) if header == "\r\n" => break,
            Ok(_) => {
                if let Some((name, value)) = header.split_once(':')
                    && name.eq_ignore_ascii_case("content-length")
                {
                    content_length = value.trim().parse().unwrap_or(0);
                }
            }
        }
    }
    let mut body = vec![0u8; content_length.min(1 << 20)];
    let _ = reader.read_exact(&mut body);
    let huge = request_line.contains(" /huge ");
    let length = if huge { HUGE_BODY } else { 12 };
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
    );
    if stream.write_all(head.as_bytes()).is_err() {
        return;
    }
    if huge {
        // {"value":"xxxx...x"} filling HUGE_BODY bytes, written in chunks; a client that
        // stops reading at its cap closes the connection and the write fails, which is fine.
        let prefix = b"{\"value\":\"";
        let suffix = b"\"}";
        let filler = HUGE_BODY - prefix.len() - suffix.len();
        let chunk = vec![b'x'; 64 << 10];
        let _ = stream.write_all(prefix);
        let mut left = filler;
        while left > 0 {
            let n = left.min(chunk.len());
            if stream.write_all(&chunk[..n]).is_err() {
                return;
            }
            left -= n;
        }
        let _ = stream.write_all(suffix);
    } else {
        let _ = stream.write_all(br#"{"value": 1}"#);
    }
}
