//! The dashboard's HTML, as pure functions of the watched objects: the overview's rows, a
//! Rollout's page (the `get rollout` tree, its steps, conditions and events, the action buttons)
//! and its analysis page (one chart per metric). Each page's changing part is rendered by one
//! function, used both for the first load and for the live stream.

use std::fmt::Write;

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::actions::Action;
use super::chart::{metric_charts, render_svg};
use super::store::RolloutObjects;
use crate::view::health::{HealthStatus, rollout_health};
use crate::view::list_row;
use crate::view::tree::{Observed, rollout_tree, weights};

/// Text made safe for HTML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            other => out.push(other),
        }
    }
    out
}

fn text<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn array<'a>(value: &'a Value, pointer: &str) -> &'a [Value] {
    value
        .pointer(pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// The CSS class for a health state.
fn health_class(status: HealthStatus) -> &'static str {
    match status {
        HealthStatus::Healthy => "healthy",
        HealthStatus::Progressing => "progressing",
        HealthStatus::Suspended => "paused",
        HealthStatus::Degraded => "degraded",
    }
}

/// The page around `main`: `stream` is the live stream the page's script listens to.
pub fn layout(title: &str, stream: &str, main: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
<title>{title} - rollouts</title><link rel=\"stylesheet\" href=\"/assets/style.css\"></head>\
<body data-stream=\"{stream}\"><header><a class=\"home\" href=\"/\">rollouts</a>\
<span id=\"connection\" class=\"connection\">connecting</span></header>\
<main>{main}</main><div id=\"toast\" class=\"toast\" role=\"status\" hidden></div>\
<script src=\"/assets/app.js\"></script></body></html>\n",
        title = escape(title),
        stream = escape(stream),
    )
}

fn watch_errors_html(errors: &[String]) -> String {
    errors
        .iter()
        .map(|e| format!("<p class=\"error\">{}</p>", escape(e)))
        .collect()
}

/// The images of a Rollout's pod template, or where its template lives.
fn images(rollout: &Value) -> String {
    if let Some(reference) = rollout.pointer("/spec/workloadRef") {
        return format!(
            "from {} {}",
            text(reference, "/kind"),
            text(reference, "/name")
        );
    }
    array(rollout, "/spec/template/spec/containers")
        .iter()
        .map(|c| text(c, "/image"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `id` of a Rollout's overview row.
pub fn row_id(namespace: &str, name: &str) -> String {
    format!("row:{namespace}:{name}")
}

/// One overview row. It holds no time-dependent text (the age is drawn by the page from
/// `data-created`), so a row is sent again only when the Rollout really changed.
pub fn overview_row(rollout: &Value, owned_sets: &[&Value]) -> String {
    let row = list_row(rollout);
    let health = rollout_health(rollout);
    let weight = if row.strategy == "Canary" {
        let (asked, actual) = weights(rollout, owned_sets);
        format!("{asked}% / {actual}%")
    } else {
        "-".to_string()
    };
    let images = images(rollout);
    let search = format!("{}/{} {} {}", row.namespace, row.name, images, row.status).to_lowercase();
    format!(
        "<tr id=\"{id}\" class=\"{class}\" data-namespace=\"{ns}\" data-search=\"{search}\">\
<td>{ns}</td><td><a href=\"/rollouts/{ns}/{name}\">{name}</a></td>\
<td class=\"phase\" title=\"{message}\">{icon} {phase}</td><td>{strategy}</td><td>{step}</td>\
<td>{weight}</td><td class=\"images\">{images}</td>\
<td class=\"age\" data-created=\"{created}\"></td></tr>",
        id = escape(&row_id(&row.namespace, &row.name)),
        class = health_class(health.status),
        ns = escape(&row.namespace),
        name = escape(&row.name),
        search = escape(&search),
        message = escape(&health.message),
        icon = health.status.icon(),
        phase = row.status,
        strategy = row.strategy,
        step = escape(&row.step),
        weight = escape(&weight),
        images = escape(&images),
        created = escape(text(rollout, "/metadata/creationTimestamp")),
    )
}

/// The overview: a filter by namespace, a search box, and one row per Rollout.
pub fn overview_page(
    rows: &[String],
    namespaces: &[String],
    errors: &[String],
    stream: &str,
) -> String {
    let mut options = String::from("<option value=\"\">all namespaces</option>");
    for namespace in namespaces {
        let _ = write!(
            options,
            "<option value=\"{ns}\">{ns}</option>",
            ns = escape(namespace)
        );
    }
    let main = format!(
        "<h1>Rollouts</h1>{errors}<div class=\"filters\"><label>Namespace \
<select id=\"namespace-filter\">{options}</select></label> \
<label>Search <input id=\"search\" type=\"search\" placeholder=\"name, image, phase\"></label>\
<span id=\"count\"></span></div>\
<table class=\"overview\"><thead><tr><th>Namespace</th><th>Name</th><th>Phase</th>\
<th>Strategy</th><th>Step</th><th>Weight asked / actual</th><th>Images</th><th>Age</th></tr></thead>\
<tbody id=\"rows\">{rows}</tbody></table>",
        errors = watch_errors_html(errors),
        rows = rows.concat(),
    );
    layout("Rollouts", stream, &main)
}

/// A canary step in words.
pub fn step_words(step: &Value) -> String {
    if let Some(weight) = step.get("setWeight") {
        return format!("set weight {weight}%");
    }
    if let Some(pause) = step.get("pause") {
        return match pause.get("duration") {
            Some(Value::String(d)) => format!("pause {d}"),
            Some(Value::Number(n)) => format!("pause {n}s"),
            _ => "pause until promoted".to_string(),
        };
    }
    if let Some(analysis) = step.get("analysis") {
        let names: Vec<&str> = array(analysis, "/templates")
            .iter()
            .map(|t| text(t, "/templateName"))
            .collect();
        return format!("analysis {}", names.join(", "));
    }
    if step.get("experiment").is_some() {
        return "experiment".to_string();
    }
    if let Some(scale) = step.get("setCanaryScale") {
        return format!("set canary scale {scale}");
    }
    if let Some(route) = step.get("setHeaderRoute") {
        return format!("header route {}", text(route, "/name"));
    }
    if let Some(route) = step.get("setMirrorRoute") {
        return format!("mirror route {}", text(route, "/name"));
    }
    step.as_object()
        .and_then(|o| o.keys().next())
        .map_or_else(|| "step".to_string(), String::clone)
}

/// The canary steps as a timeline: done, the current one (marked, with why it waits), to come.
pub fn steps_html(rollout: &Value) -> String {
    let steps = array(rollout, "/spec/strategy/canary/steps");
    if rollout.pointer("/spec/strategy/blueGreen").is_some() {
        return format!(
            "<p>Blue-green: active <code>{}</code>, preview <code>{}</code></p>",
            escape(text(rollout, "/status/blueGreen/activeSelector")),
            escape(text(rollout, "/status/blueGreen/previewSelector"))
        );
    }
    if steps.is_empty() {
        return "<p>No steps: the new version replaces the old one at once.</p>".to_string();
    }
    let current = rollout
        .pointer("/status/currentStepIndex")
        .and_then(Value::as_i64)
        .unwrap_or(0)
        .max(0) as usize;
    let aborted = rollout.pointer("/status/abort").and_then(Value::as_bool) == Some(true);
    let paused = !array(rollout, "/status/pauseConditions").is_empty()
        || rollout.pointer("/spec/paused").and_then(Value::as_bool) == Some(true);
    let mut html = String::from("<ol class=\"steps\">");
    for (i, step) in steps.iter().enumerate() {
        let (class, note) = match i.cmp(&current) {
            std::cmp::Ordering::Less => ("done", String::new()),
            std::cmp::Ordering::Equal => (
                "current",
                format!(
                    " <strong>◀ current{}</strong>",
                    if aborted {
                        ", aborted"
                    } else if paused {
                        ", paused"
                    } else {
                        ""
                    }
                ),
            ),
            std::cmp::Ordering::Greater => ("pending", String::new()),
        };
        let _ = write!(
            html,
            "<li class=\"{class}\">{}{note}</li>",
            escape(&step_words(step))
        );
    }
    html.push_str("</ol>");
    if current >= steps.len() {
        html.push_str("<p class=\"done\">All steps done.</p>");
    }
    html
}

fn conditions_html(rollout: &Value) -> String {
    let conditions = array(rollout, "/status/conditions");
    if conditions.is_empty() {
        return "<p>No conditions.</p>".to_string();
    }
    let mut html = String::from(
        "<table><thead><tr><th>Type</th><th>Status</th><th>Reason</th><th>Message</th>\
<th>Since</th></tr></thead><tbody>",
    );
    for c in conditions {
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(text(c, "/type")),
            escape(text(c, "/status")),
            escape(text(c, "/reason")),
            escape(text(c, "/message")),
            escape(text(c, "/lastTransitionTime")),
        );
    }
    html.push_str("</tbody></table>");
    html
}

/// When an event last happened, as the API gives it (events.k8s.io fields or core fields).
fn event_time(event: &Value) -> &str {
    [
        "/lastTimestamp",
        "/eventTime",
        "/metadata/creationTimestamp",
    ]
    .iter()
    .map(|p| text(event, p))
    .find(|t| !t.is_empty())
    .unwrap_or_default()
}

/// Events newest first, at most `limit`; or the error that kept them from being read.
fn events_html(events: &Result<Vec<Value>, String>, limit: usize) -> String {
    let events = match events {
        Ok(events) => events,
        Err(error) => return format!("<p class=\"error\">{}</p>", escape(error)),
    };
    if events.is_empty() {
        return "<p>No events.</p>".to_string();
    }
    let mut sorted: Vec<&Value> = events.iter().collect();
    sorted.sort_by(|a, b| event_time(b).cmp(event_time(a)));
    let mut html = String::from(
        "<table><thead><tr><th>Last seen</th><th>Type</th><th>Reason</th><th>Message</th>\
</tr></thead><tbody>",
    );
    for event in sorted.into_iter().take(limit) {
        let kind = text(event, "/type");
        let _ = write!(
            html,
            "<tr class=\"{class}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(event_time(event)),
            escape(kind),
            escape(text(event, "/reason")),
            escape(text(event, "/message")),
            class = if kind == "Warning" { "warning" } else { "" },
        );
    }
    html.push_str("</tbody></table>");
    html
}

/// The live part of a Rollout's page.
pub fn detail_live(
    objects: &RolloutObjects,
    events: &Result<Vec<Value>, String>,
    errors: &[String],
    now: Timestamp,
) -> String {
    let rollout = &objects.rollout;
    let health = rollout_health(rollout);
    let tree = rollout_tree(
        Observed {
            rollout,
            replica_sets: &objects.replica_sets,
            pods: &objects.pods,
            analysis_runs: &objects.analysis_runs,
            experiments: &objects.experiments,
        },
        now,
        false,
    );
    let namespace = text(rollout, "/metadata/namespace");
    let name = text(rollout, "/metadata/name");
    let runs = if objects.analysis_runs.is_empty() {
        String::new()
    } else {
        format!(
            "<p><a href=\"/rollouts/{}/{}/analysis\">Analysis: {} run(s), measurements plotted</a></p>",
            escape(namespace),
            escape(name),
            objects.analysis_runs.len()
        )
    };
    format!(
        "{errors}<p class=\"health {class}\">{icon} {line}</p>\
<section><h2>Steps</h2>{steps}</section>{runs}\
<section><h2>Revisions</h2><pre class=\"tree\">{tree}</pre></section>\
<section><h2>Conditions</h2>{conditions}</section>\
<section><h2>Events</h2>{events}</section>",
        errors = watch_errors_html(errors),
        class = health_class(health.status),
        icon = health.status.icon(),
        line = escape(&health.line()),
        steps = steps_html(rollout),
        tree = escape(&tree.join("\n")),
        conditions = conditions_html(rollout),
        events = events_html(events, 20),
    )
}

/// The action buttons; each asks `confirmation` before it posts.
fn actions_html(namespace: &str, name: &str, first_assignment: &str) -> String {
    let mut html = String::from("<div class=\"actions\">");
    for action in Action::ALL {
        // Set image asks for CONTAINER=IMAGE first, offering the first container's.
        let prompt = match action {
            Action::SetImage => format!(
                " data-prompt=\"CONTAINER=IMAGE\" data-value=\"{}\"",
                escape(first_assignment)
            ),
            Action::Rollback => {
                " data-prompt=\"REVISION (0: the one before the newest)\" data-value=\"0\""
                    .to_string()
            }
            _ => String::new(),
        };
        let _ = write!(
            html,
            "<button type=\"button\" data-action=\"{slug}\" data-url=\"/api/rollouts/{ns}/{name}/{slug}\" \
data-confirm=\"{confirm}\"{prompt}>{label}</button>",
            slug = action.slug(),
            ns = escape(namespace),
            name = escape(name),
            confirm = escape(&action.confirmation(name)),
            label = action.label(),
        );
    }
    html.push_str("</div>");
    html
}

/// A Rollout's page around its live part.
pub fn detail_page(rollout: &Value, live: &str, stream: &str) -> String {
    let namespace = text(rollout, "/metadata/namespace");
    let name = text(rollout, "/metadata/name");
    let first_assignment = array(rollout, "/spec/template/spec/containers")
        .first()
        .map(|c| format!("{}={}", text(c, "/name"), text(c, "/image")))
        .unwrap_or_default();
    let main = format!(
        "<h1>{ns} / {name}</h1>{actions}<div id=\"live\">{live}</div>",
        ns = escape(namespace),
        name = escape(name),
        actions = actions_html(namespace, name, &first_assignment),
    );
    layout(name, stream, &main)
}

/// The live part of the analysis page: per run, per metric, its chart and verdict.
pub fn analysis_live(objects: &RolloutObjects) -> String {
    let mut runs: Vec<&Value> = objects.analysis_runs.iter().collect();
    // Newest run first.
    runs.sort_by(|a, b| {
        text(b, "/metadata/creationTimestamp").cmp(text(a, "/metadata/creationTimestamp"))
    });
    if runs.is_empty() {
        return "<p>This rollout has no AnalysisRun.</p>".to_string();
    }
    let mut html = String::new();
    for run in runs {
        let phase = text(run, "/status/phase");
        let _ = write!(
            html,
            "<section class=\"run\"><h2>{name} <span class=\"phase-{phase_class}\">{phase}</span></h2>",
            name = escape(text(run, "/metadata/name")),
            phase_class = escape(&phase.to_lowercase()),
            phase = escape(if phase.is_empty() { "Pending" } else { phase }),
        );
        let message = text(run, "/status/message");
        if !message.is_empty() {
            let _ = write!(html, "<p>{}</p>", escape(message));
        }
        for chart in metric_charts(run) {
            let _ = write!(
                html,
                "<figure class=\"metric\"><figcaption>{metric}: {phase}{verdict}</figcaption>",
                metric = escape(&chart.metric),
                phase = escape(&chart.phase),
                verdict = chart
                    .verdict
                    .as_deref()
                    .map(|v| format!(" - {}", escape(v)))
                    .unwrap_or_default(),
            );
            match render_svg(&chart) {
                Ok(Some(svg)) => html.push_str(&svg),
                Ok(None) => html.push_str("<p>No measurement yet.</p>"),
                Err(error) => {
                    let _ = write!(html, "<p class=\"error\">{}</p>", escape(&error));
                }
            }
            html.push_str("</figure>");
        }
        html.push_str("</section>");
    }
    html
}

/// The analysis page around its live part.
pub fn analysis_page(namespace: &str, name: &str, live: &str, stream: &str) -> String {
    let main = format!(
        "<h1>{ns} / <a href=\"/rollouts/{ns}/{name}\">{name}</a>: analysis</h1><div id=\"live\">{live}</div>",
        ns = escape(namespace),
        name = escape(name),
    );
    layout(&format!("{name} analysis"), stream, &main)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rollout() -> Value {
        json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": "web", "namespace": "shop", "uid": "r1", "generation": 1,
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {
                "replicas": 4,
                "template": {"spec": {"containers": [{"name": "web", "image": "web:<2>"}]}},
                "strategy": {"canary": {"steps": [
                    {"setWeight": 25}, {"pause": {}}, {"analysis": {"templates": [{"templateName": "errors"}]}},
                    {"pause": {"duration": "30s"}}
                ]}}
            },
            "status": {
                "observedGeneration": "1", "currentStepIndex": 1, "currentPodHash": "new",
                "stableRS": "old", "conditions": [],
                "pauseConditions": [{"reason": "CanaryPauseStep", "startTime": "2026-01-01T00:01:00Z"}],
                "replicas": 4, "updatedReplicas": 1, "availableReplicas": 4, "readyReplicas": 4
            }
        })
    }

    #[test]
    fn escape_covers_markup_and_quotes() {
        assert_eq!(
            escape("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn an_overview_row_shows_phase_step_weights_and_escaped_images() {
        let row = overview_row(&rollout(), &[]);
        assert!(
            row.starts_with("<tr id=\"row:shop:web\" class=\"paused\""),
            "{row}"
        );
        assert!(row.contains("data-namespace=\"shop\""), "{row}");
        assert!(
            row.contains("<a href=\"/rollouts/shop/web\">web</a>"),
            "{row}"
        );
        assert!(row.contains("॥ Paused"), "{row}");
        assert!(row.contains("<td>Canary</td><td>1/4</td>"), "{row}");
        assert!(row.contains("<td>25% / "), "{row}");
        assert!(row.contains("web:&lt;2&gt;"), "{row}");
        assert!(!row.contains("web:<2>"), "{row}");
        assert!(
            row.contains("data-created=\"2026-01-01T00:00:00Z\""),
            "{row}"
        );
    }

    #[test]
    fn an_overview_row_does_not_change_with_the_clock() {
        assert_eq!(overview_row(&rollout(), &[]), overview_row(&rollout(), &[]));
    }

    #[test]
    fn the_steps_mark_the_current_one_and_why_it_waits() {
        let html = steps_html(&rollout());
        assert_eq!(
            html,
            "<ol class=\"steps\"><li class=\"done\">set weight 25%</li>\
<li class=\"current\">pause until promoted <strong>◀ current, paused</strong></li>\
<li class=\"pending\">analysis errors</li><li class=\"pending\">pause 30s</li></ol>"
        );
        let mut aborted = rollout();
        aborted["status"]["abort"] = json!(true);
        assert!(steps_html(&aborted).contains("◀ current, aborted"));
    }

    #[test]
    fn the_detail_page_draws_the_plugin_tree_conditions_events_and_buttons() {
        let objects = RolloutObjects {
            rollout: rollout(),
            ..Default::default()
        };
        let events = Ok(vec![
            json!({"type": "Normal", "reason": "RolloutUpdated", "message": "older", "lastTimestamp": "2026-01-01T00:00:01Z"}),
            json!({"type": "Warning", "reason": "RolloutPaused", "message": "newer <b>", "lastTimestamp": "2026-01-01T00:00:02Z"}),
        ]);
        let now: Timestamp = "2026-01-01T00:02:00Z".parse().expect("time");
        let live = detail_live(&objects, &events, &[], now);
        let tree = rollout_tree(
            Observed {
                rollout: &objects.rollout,
                replica_sets: &[],
                pods: &[],
                analysis_runs: &[],
                experiments: &[],
            },
            now,
            false,
        );
        assert!(live.contains(&escape(&tree.join("\n"))), "{live}");
        assert!(live.contains("Name:"), "{live}");
        let newer = live.find("newer &lt;b&gt;").expect("newest event shown");
        let older = live.find("older").expect("older event shown");
        assert!(newer < older, "newest first: {live}");
        assert!(live.contains("<p>No conditions.</p>"));

        let page = detail_page(
            &objects.rollout,
            &live,
            "/events/rollouts/shop/web?page=detail",
        );
        for action in Action::ALL {
            assert!(
                page.contains(&format!(
                    "data-url=\"/api/rollouts/shop/web/{}\"",
                    action.slug()
                )),
                "{action:?}"
            );
        }
        assert!(
            page.contains("data-confirm=\"Abort rollout &#39;web&#39;"),
            "{page}"
        );
        assert!(page.contains("data-stream=\"/events/rollouts/shop/web?page=detail\""));
        assert!(
            page.contains("data-prompt=\"CONTAINER=IMAGE\" data-value=\"web=web:&lt;2&gt;\""),
            "{page}"
        );
        assert!(
            !page.contains("http://") && !page.contains("https://"),
            "no CDN: {page}"
        );
    }

    #[test]
    fn events_that_cannot_be_read_say_why() {
        let html = events_html(&Err("events is forbidden".into()), 20);
        assert_eq!(html, "<p class=\"error\">events is forbidden</p>");
    }

    #[test]
    fn the_analysis_page_plots_each_metric() {
        let run = json!({
            "metadata": {"name": "web-run", "namespace": "shop",
                         "creationTimestamp": "2026-01-01T00:00:00Z",
                         "ownerReferences": [{"uid": "r1", "name": "web"}]},
            "spec": {"metrics": [{"name": "errors", "successCondition": "result[0] < 0.05"}]},
            "status": {"phase": "Running", "metricResults": [{"name": "errors", "phase": "Running",
                "measurements": [
                    {"phase": "Successful", "finishedAt": "2026-01-01T00:00:00Z", "value": "[0.01]"},
                    {"phase": "Successful", "finishedAt": "2026-01-01T00:00:30Z", "value": "[0.02]"}
                ]}]}
        });
        let objects = RolloutObjects {
            rollout: rollout(),
            analysis_runs: vec![run],
            ..Default::default()
        };
        let live = analysis_live(&objects);
        assert!(
            live.contains("<h2>web-run <span class=\"phase-running\">Running</span></h2>"),
            "{live}"
        );
        assert!(
            live.contains("<figcaption>errors: Running</figcaption><svg"),
            "{live}"
        );
        assert_eq!(live.matches("<circle").count(), 2, "{live}");
        assert_eq!(
            analysis_live(&RolloutObjects::default()),
            "<p>This rollout has no AnalysisRun.</p>"
        );
    }
}
