//! Validation of analysis templates and runs: Argo's metric rules (providers, limits, count,
//! durations) plus checks Argo only reports once a run fails (unknown `{{args.x}}`, duplicate
//! dry-run and retention rules). Each finding names the field and the fix.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{
    AnalysisRun, AnalysisRunArgument, AnalysisTemplate, AnalysisTemplateSpec,
    ClusterAnalysisTemplate, DryRun, MeasurementRetention, Metric,
};
use crate::FieldError;
use crate::duration;
use crate::expression;

/// The integer an `IntOrString` limit holds. A string must be a base-10 integer (after
/// `{{args.x}}` substitution).
pub fn int_or_string_value(value: &IntOrString) -> Result<i64, NotAnInteger> {
    match value {
        IntOrString::Int(i) => Ok(i64::from(*i)),
        IntOrString::String(s) => s.trim().parse::<i64>().map_err(|source| NotAnInteger {
            text: s.clone(),
            source,
        }),
    }
}

/// A limit written as a string that is not a base-10 integer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not an integer")]
pub struct NotAnInteger {
    pub text: String,
    #[source]
    pub source: std::num::ParseIntError,
}

/// Names of the arguments referenced as `{{args.name}}` (spaces inside the braces allowed) in
/// `text`, in order of first appearance.
pub fn arg_references(text: &str) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("{{") {
        let after = &rest[open + 2..];
        let Some(close) = after.find("}}") else { break };
        let tag = after[..close].trim();
        if let Some(name) = tag.strip_prefix("args.")
            && !names.iter().any(|n| n == name)
        {
            names.push(name.to_string());
        }
        rest = &after[close + 2..];
    }
    names
}

fn is_templated(text: &str) -> bool {
    text.contains("{{")
}

/// Validates an AnalysisTemplate.
pub fn validate_template(template: &AnalysisTemplate) -> Vec<FieldError> {
    validate_template_spec(&template.spec, "spec")
}

/// Validates a ClusterAnalysisTemplate.
pub fn validate_cluster_template(template: &ClusterAnalysisTemplate) -> Vec<FieldError> {
    validate_template_spec(&template.spec, "spec")
}

/// Validates a template spec found at `path`. A template may have no metrics of its own when it
/// composes other templates.
pub fn validate_template_spec(spec: &AnalysisTemplateSpec, path: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if spec.metrics.is_empty() && spec.templates.is_empty() {
        errors.push(FieldError::new(
            format!("{path}.metrics"),
            "the template has no metrics and references no templates",
            "add at least one metric, or list other templates under spec.templates",
        ));
    }
    for (i, reference) in spec.templates.iter().enumerate() {
        if reference.template_name.is_empty() {
            errors.push(FieldError::new(
                format!("{path}.templates[{i}].templateName"),
                "templateName is empty",
                "set templateName to the name of an AnalysisTemplate or ClusterAnalysisTemplate",
            ));
        }
    }
    errors.extend(validate_args(&spec.args, path));
    errors.extend(validate_metrics(&spec.metrics, &spec.args, path));
    errors.extend(validate_rules(
        &spec.dry_run,
        &spec.measurement_retention,
        path,
    ));
    errors
}

/// Validates an AnalysisRun spec.
pub fn validate_run(run: &AnalysisRun) -> Vec<FieldError> {
    let spec = &run.spec;
    let mut errors = Vec::new();
    if spec.metrics.is_empty() {
        errors.push(FieldError::new(
            "spec.metrics",
            "the run has no metrics",
            "add at least one metric to spec.metrics",
        ));
    }
    errors.extend(validate_args(&spec.args, "spec"));
    errors.extend(validate_metrics(&spec.metrics, &spec.args, "spec"));
    errors.extend(validate_rules(
        &spec.dry_run,
        &spec.measurement_retention,
        "spec",
    ));
    errors
}

fn validate_args(args: &[AnalysisRunArgument], path: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, arg) in args.iter().enumerate() {
        let at = format!("{path}.args[{i}]");
        if arg.name.is_empty() {
            errors.push(FieldError::new(
                format!("{at}.name"),
                "argument name is empty",
                "give the argument a name, referenced as {{args.<name>}}",
            ));
        } else if !seen.insert(arg.name.as_str()) {
            errors.push(FieldError::new(
                format!("{at}.name"),
                format!("argument {:?} is declared twice", arg.name),
                "remove the duplicate argument",
            ));
        }
        if let Some(from) = &arg.value_from {
            if arg.value.is_some() {
                errors.push(FieldError::new(
                    at.clone(),
                    format!("argument {:?} sets both value and valueFrom", arg.name),
                    "keep either value or valueFrom",
                ));
            }
            if from.pod_template_hash_value.is_some() {
                errors.push(FieldError::new(
                    format!("{at}.valueFrom.podTemplateHashValue"),
                    format!(
                        "argument {:?} uses podTemplateHashValue, which only a Rollout can resolve",
                        arg.name
                    ),
                    "pass the hash from the Rollout's analysis args, and declare the argument here without a value",
                ));
            } else if from.secret_key_ref.is_some() == from.field_ref.is_some() {
                errors.push(FieldError::new(
                    format!("{at}.valueFrom"),
                    format!(
                        "argument {:?} must take its value from exactly one of secretKeyRef or fieldRef",
                        arg.name
                    ),
                    "set exactly one of valueFrom.secretKeyRef or valueFrom.fieldRef",
                ));
            }
        }
    }
    errors
}

/// Validates metrics as Argo does before a run, plus the arguments they reference. `path` is
/// the path of the spec holding them.
pub fn validate_metrics(
    metrics: &[Metric],
    args: &[AnalysisRunArgument],
    path: &str,
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut names = BTreeSet::new();
    for (i, metric) in metrics.iter().enumerate() {
        let at = format!("{path}.metrics[{i}]");
        if metric.name.is_empty() {
            errors.push(FieldError::new(
                format!("{at}.name"),
                "metric name is empty",
                "give the metric a name unique within the template",
            ));
        } else if !names.insert(metric.name.as_str()) {
            errors.push(FieldError::new(
                format!("{at}.name"),
                format!("duplicate metric name {:?}", metric.name),
                "rename one of the metrics so names are unique",
            ));
        }
        errors.extend(validate_metric(metric, &at));
        errors.extend(validate_arg_references(metric, args, &at));
    }
    errors
}

/// A limit's value, or `None` when it is templated (checked after substitution) or invalid (an
/// error is recorded).
fn limit(
    value: Option<&IntOrString>,
    field: &str,
    at: &str,
    errors: &mut Vec<FieldError>,
) -> Option<i64> {
    let value = value?;
    if let IntOrString::String(s) = value
        && is_templated(s)
    {
        return None;
    }
    match int_or_string_value(value) {
        Ok(v) => Some(v),
        Err(reason) => {
            errors.push(FieldError::new(
                format!("{at}.{field}"),
                reason.to_string(),
                format!("set {field} to an integer or to {{{{args.<name>}}}}"),
            ));
            None
        }
    }
}

fn validate_duration(value: Option<&str>, field: &str, at: &str, errors: &mut Vec<FieldError>) {
    let Some(text) = value else { return };
    if text.is_empty() || is_templated(text) {
        return;
    }
    if let Err(reason) = duration::parse(text) {
        errors.push(FieldError::new(
            format!("{at}.{field}"),
            reason.to_string(),
            format!(
                "write {field} as a Go duration such as 30s, 5m or 1h, at most 8760h (one year)"
            ),
        ));
    }
}

/// An expression within [`expression::MAX_LENGTH`] and [`expression::MAX_NESTING`]; one with
/// `{{args.x}}` in it is checked as written too (an argument rarely adds brackets, and the
/// evaluator checks again after substitution).
fn validate_expression(value: Option<&str>, field: &str, at: &str, errors: &mut Vec<FieldError>) {
    let Some(text) = value else { return };
    if let Err(reason) = expression::check_bounds(text) {
        errors.push(FieldError::new(
            format!("{at}.{field}"),
            reason.to_string(),
            format!(
                "write {field} as an expression of at most {} bytes with brackets nested at most {} deep",
                expression::MAX_LENGTH,
                expression::MAX_NESTING
            ),
        ));
    }
}

fn validate_metric(metric: &Metric, at: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    validate_expression(
        metric.success_condition.as_deref(),
        "successCondition",
        at,
        &mut errors,
    );
    validate_expression(
        metric.failure_condition.as_deref(),
        "failureCondition",
        at,
        &mut errors,
    );
    let count = limit(metric.count.as_ref(), "count", at, &mut errors);
    let failure = limit(
        metric.failure_limit.as_ref(),
        "failureLimit",
        at,
        &mut errors,
    );
    let success = limit(
        metric.consecutive_success_limit.as_ref(),
        "consecutiveSuccessLimit",
        at,
        &mut errors,
    );
    let inconclusive = limit(
        metric.inconclusive_limit.as_ref(),
        "inconclusiveLimit",
        at,
        &mut errors,
    );
    let consecutive_error = limit(
        metric.consecutive_error_limit.as_ref(),
        "consecutiveErrorLimit",
        at,
        &mut errors,
    );
    let consecutive_failure = limit(
        metric.consecutive_failure_limit.as_ref(),
        "consecutiveFailureLimit",
        at,
        &mut errors,
    );

    let mut negative = |value: Option<i64>, field: &str, floor: i64, fix: &str| {
        if let Some(v) = value
            && v < floor
        {
            errors.push(FieldError::new(
                format!("{at}.{field}"),
                format!("{field} is {v}, below {floor}"),
                fix.to_string(),
            ));
        }
    };
    negative(count, "count", 0, "set count to 1 or more, or leave it out");
    negative(
        failure,
        "failureLimit",
        -1,
        "set failureLimit to 0 or more, or -1 to disable it",
    );
    negative(
        success,
        "consecutiveSuccessLimit",
        0,
        "set consecutiveSuccessLimit to 0 (disabled) or more",
    );
    negative(
        inconclusive,
        "inconclusiveLimit",
        0,
        "set inconclusiveLimit to 0 or more",
    );
    negative(
        consecutive_error,
        "consecutiveErrorLimit",
        0,
        "set consecutiveErrorLimit to 0 or more",
    );
    negative(
        consecutive_failure,
        "consecutiveFailureLimit",
        0,
        "set consecutiveFailureLimit to 0 (disabled) or more",
    );

    // Unset limits take Argo's defaults; templated ones are checked after substitution.
    let templated =
        |v: &Option<IntOrString>| matches!(v, Some(IntOrString::String(s)) if is_templated(s));
    // With consecutiveFailureLimit and no failureLimit, failures count only in a row.
    let counts_failures_in_a_row =
        consecutive_failure.is_some_and(|l| l > 0) || templated(&metric.consecutive_failure_limit);
    let failure_value = match failure {
        Some(v) => v,
        None if metric.failure_limit.is_none() && counts_failures_in_a_row => -1,
        None => 0,
    };
    let success_value = success.unwrap_or(0);
    if !templated(&metric.failure_limit)
        && !templated(&metric.consecutive_success_limit)
        && !counts_failures_in_a_row
        && failure_value == -1
        && success_value == 0
    {
        errors.push(FieldError::new(
            format!("{at}.failureLimit"),
            "failureLimit is disabled (-1) and consecutiveSuccessLimit is 0, so nothing can decide the metric",
            "set consecutiveSuccessLimit above 0, consecutiveFailureLimit above 0, or failureLimit to 0 or more",
        ));
    }
    if let Some(count) = count.filter(|c| *c > 0) {
        if failure_value >= 0 && success_value >= 0 && count < failure_value + success_value {
            errors.push(FieldError::new(
                format!("{at}.count"),
                format!(
                    "count ({count}) is below failureLimit + consecutiveSuccessLimit ({failure_value} + {success_value})"
                ),
                "raise count, or lower failureLimit or consecutiveSuccessLimit",
            ));
        } else if failure_value < 0 && count < success_value {
            errors.push(FieldError::new(
                format!("{at}.count"),
                format!("count ({count}) is below consecutiveSuccessLimit ({success_value})"),
                "raise count or lower consecutiveSuccessLimit",
            ));
        }
        if let Some(inconclusive) = inconclusive
            && count < inconclusive
        {
            errors.push(FieldError::new(
                format!("{at}.count"),
                format!("count ({count}) is below inconclusiveLimit ({inconclusive})"),
                "raise count or lower inconclusiveLimit",
            ));
        }
        if count > 1 && metric.interval.as_deref().unwrap_or("").is_empty() {
            errors.push(FieldError::new(
                format!("{at}.interval"),
                format!("count is {count} but no interval is set"),
                "set interval (e.g. 1m) to space the measurements",
            ));
        }
    }
    validate_duration(metric.interval.as_deref(), "interval", at, &mut errors);
    validate_duration(
        metric.initial_delay.as_deref(),
        "initialDelay",
        at,
        &mut errors,
    );

    let providers = metric.provider.configured();
    match providers.len() {
        0 => errors.push(FieldError::new(
            format!("{at}.provider"),
            "no provider is set",
            "set exactly one provider, e.g. provider.prometheus or provider.web",
        )),
        1 => {}
        _ => errors.push(FieldError::new(
            format!("{at}.provider"),
            format!("several providers are set: {}", providers.join(", ")),
            "keep exactly one provider per metric",
        )),
    }
    errors.extend(validate_provider(metric, at));
    errors
}

fn validate_provider(metric: &Metric, at: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if let Some(prometheus) = &metric.provider.prometheus {
        let at = format!("{at}.provider.prometheus");
        if prometheus.query.as_deref().unwrap_or("").trim().is_empty() {
            errors.push(FieldError::new(
                format!("{at}.query"),
                "query is empty",
                "write the PromQL query to run",
            ));
        }
        if let Some(timeout) = prometheus.timeout
            && timeout < 0
        {
            errors.push(FieldError::new(
                format!("{at}.timeout"),
                format!("timeout is {timeout}, below 0"),
                "set timeout to a number of seconds, or leave it out for 30",
            ));
        }
        if let Some(range) = &prometheus.range_query {
            let range_at = format!("{at}.rangeQuery");
            validate_duration(range.step.as_deref(), "step", &range_at, &mut errors);
            validate_expression(range.start.as_deref(), "start", &range_at, &mut errors);
            validate_expression(range.end.as_deref(), "end", &range_at, &mut errors);
        }
    }
    if let Some(web) = &metric.provider.web {
        let at = format!("{at}.provider.web");
        if web.url.trim().is_empty() {
            errors.push(FieldError::new(
                format!("{at}.url"),
                "url is empty",
                "set url to the address to query",
            ));
        }
        let method = web.method.as_deref().unwrap_or("GET");
        if !matches!(method, "GET" | "POST" | "PUT" | "") {
            errors.push(FieldError::new(
                format!("{at}.method"),
                format!("method {method:?} is not supported"),
                "use GET, POST or PUT",
            ));
        }
        let has_body =
            web.body.as_deref().is_some_and(|b| !b.is_empty()) || web.json_body.is_some();
        if has_body && matches!(method, "GET" | "") {
            errors.push(FieldError::new(
                format!("{at}.body"),
                "a request body is set on a GET request",
                "set method to POST or PUT, or remove the body",
            ));
        }
        if web.body.as_deref().is_some_and(|b| !b.is_empty()) && web.json_body.is_some() {
            errors.push(FieldError::new(
                format!("{at}.jsonBody"),
                "both body and jsonBody are set",
                "keep either body or jsonBody",
            ));
        }
        if let Some(timeout) = web.timeout_seconds
            && timeout < 0
        {
            errors.push(FieldError::new(
                format!("{at}.timeoutSeconds"),
                format!("timeoutSeconds is {timeout}, below 0"),
                "set timeoutSeconds to a number of seconds, or leave it out for 10",
            ));
        }
    }
    errors
}

fn validate_arg_references(
    metric: &Metric,
    args: &[AnalysisRunArgument],
    at: &str,
) -> Vec<FieldError> {
    let text = serde_json::to_string(metric).unwrap_or_default();
    arg_references(&text)
        .into_iter()
        .filter(|name| !args.iter().any(|a| &a.name == name))
        .map(|name| {
            FieldError::new(
                at.to_string(),
                format!(
                    "metric {:?} references {{{{args.{name}}}}} but no argument {name:?} is declared",
                    metric.name
                ),
                format!("declare it under spec.args (- name: {name}), or fix the reference"),
            )
        })
        .collect()
}

fn validate_rules(
    dry_run: &[DryRun],
    retention: &[MeasurementRetention],
    path: &str,
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, rule) in dry_run.iter().enumerate() {
        if rule.metric_name.is_empty() {
            errors.push(FieldError::new(
                format!("{path}.dryRun[{i}].metricName"),
                "metricName is empty",
                "set metricName to a metric name or a regular expression such as .*",
            ));
        } else if !seen.insert(rule.metric_name.as_str()) {
            errors.push(FieldError::new(
                format!("{path}.dryRun[{i}].metricName"),
                format!(
                    "two dry-run rules have the same metricName {:?}",
                    rule.metric_name
                ),
                "remove the duplicate rule",
            ));
        }
    }
    let mut seen = BTreeSet::new();
    for (i, rule) in retention.iter().enumerate() {
        if rule.metric_name.is_empty() {
            errors.push(FieldError::new(
                format!("{path}.measurementRetention[{i}].metricName"),
                "metricName is empty",
                "set metricName to a metric name or a regular expression such as .*",
            ));
        } else if !seen.insert(rule.metric_name.as_str()) {
            errors.push(FieldError::new(
                format!("{path}.measurementRetention[{i}].metricName"),
                format!(
                    "two measurement retention rules have the same metricName {:?}",
                    rule.metric_name
                ),
                "remove the duplicate rule",
            ));
        }
        if rule.limit < 0 {
            errors.push(FieldError::new(
                format!("{path}.measurementRetention[{i}].limit"),
                format!("limit is {}, below 0", rule.limit),
                "set limit to the number of measurements to keep (0 keeps the default 10)",
            ));
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::{MetricProvider, PrometheusMetric, WebMetric};
    use crate::rollout::{ArgumentValueFrom, FieldRef, SecretKeyRef, ValueFromPodTemplateHash};

    fn prometheus(query: &str) -> MetricProvider {
        MetricProvider {
            prometheus: Some(PrometheusMetric {
                address: Some("http://prometheus:9090".into()),
                query: Some(query.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn metric(name: &str) -> Metric {
        Metric {
            name: name.into(),
            success_condition: Some("result[0] > 0".into()),
            provider: prometheus("up"),
            ..Default::default()
        }
    }

    fn arg(name: &str, value: Option<&str>) -> AnalysisRunArgument {
        AnalysisRunArgument {
            name: name.into(),
            value: value.map(Into::into),
            value_from: None,
        }
    }

    fn spec(metrics: Vec<Metric>) -> AnalysisTemplateSpec {
        AnalysisTemplateSpec {
            metrics,
            ..Default::default()
        }
    }

    fn paths(errors: &[FieldError]) -> Vec<&str> {
        errors.iter().map(|e| e.path.as_str()).collect()
    }

    fn int(v: i32) -> Option<IntOrString> {
        Some(IntOrString::Int(v))
    }

    #[test]
    fn a_plain_metric_is_valid() {
        assert_eq!(
            validate_template_spec(&spec(vec![metric("ok")]), "spec"),
            vec![]
        );
    }

    #[test]
    fn expressions_past_the_bounds_are_refused_before_parsing() {
        let deep = format!("{}result{} > 0", "(".repeat(50_000), ")".repeat(50_000));
        let mut m = metric("deep");
        m.success_condition = Some(deep.clone());
        m.failure_condition = Some(format!("{}1{}", "[".repeat(100), "]".repeat(100)));
        let mut range = PrometheusMetric {
            address: Some("http://prometheus:9090".into()),
            query: Some("up".into()),
            ..Default::default()
        };
        range.range_query = Some(crate::analysis::PrometheusRangeQueryArgs {
            start: Some(deep),
            end: Some("now()".into()),
            step: Some("1m".into()),
        });
        m.provider.prometheus = Some(range);
        let errors = validate_template_spec(&spec(vec![m]), "spec");
        assert_eq!(
            paths(&errors),
            [
                "spec.metrics[0].successCondition",
                "spec.metrics[0].failureCondition",
                "spec.metrics[0].provider.prometheus.rangeQuery.start",
            ]
        );
        assert!(
            errors[0].reason.contains("over the limit of 4096"),
            "{errors:#?}"
        );
        assert!(errors[1].reason.contains("100 deep"), "{errors:#?}");
    }

    #[test]
    fn conditions_may_both_be_empty() {
        let mut m = metric("no-conditions");
        m.success_condition = None;
        assert_eq!(validate_template_spec(&spec(vec![m]), "spec"), vec![]);
    }

    #[test]
    fn a_template_needs_metrics_or_templates() {
        let errors = validate_template_spec(&spec(vec![]), "spec");
        assert_eq!(paths(&errors), ["spec.metrics"]);
        let composed = AnalysisTemplateSpec {
            templates: vec![crate::rollout::RolloutAnalysisTemplate {
                template_name: "base".into(),
                cluster_scope: None,
            }],
            ..Default::default()
        };
        assert_eq!(validate_template_spec(&composed, "spec"), vec![]);
    }

    #[test]
    fn duplicate_metric_names_are_reported_at_the_second() {
        let errors = validate_template_spec(&spec(vec![metric("a"), metric("a")]), "spec");
        assert_eq!(paths(&errors), ["spec.metrics[1].name"]);
        assert!(errors[0].reason.contains("duplicate metric name \"a\""));
    }

    #[test]
    fn a_metric_needs_exactly_one_provider() {
        let mut none = metric("none");
        none.provider = MetricProvider::default();
        let mut two = metric("two");
        two.provider.web = Some(WebMetric {
            url: "http://x".into(),
            ..Default::default()
        });
        let errors = validate_template_spec(&spec(vec![none, two]), "spec");
        assert_eq!(
            paths(&errors),
            ["spec.metrics[0].provider", "spec.metrics[1].provider"]
        );
        assert!(errors[0].reason.contains("no provider"));
        assert!(errors[1].reason.contains("prometheus, web"));
    }

    #[test]
    fn plugin_entries_count_as_providers() {
        let mut m = metric("plugin");
        m.provider.prometheus = None;
        m.provider.plugin = Some(serde_json::json!({"a/one": {}, "b/two": {}}));
        let errors = validate_template_spec(&spec(vec![m]), "spec");
        assert!(errors[0].reason.contains("plugin.a/one, plugin.b/two"));
    }

    #[test]
    fn unparsable_durations_are_reported() {
        let mut m = metric("d");
        m.interval = Some("5x".into());
        m.initial_delay = Some("soon".into());
        let errors = validate_template_spec(&spec(vec![m]), "spec");
        assert_eq!(
            paths(&errors),
            ["spec.metrics[0].interval", "spec.metrics[0].initialDelay"]
        );
        assert!(errors[0].fix.contains("Go duration"));
    }

    #[test]
    fn templated_durations_and_limits_wait_for_substitution() {
        let mut m = metric("t");
        m.interval = Some("{{args.interval}}".into());
        m.count = Some(IntOrString::String("{{args.count}}".into()));
        m.failure_limit = Some(IntOrString::String("{{ args.limit }}".into()));
        let mut s = spec(vec![m]);
        s.args = vec![
            arg("interval", None),
            arg("count", None),
            arg("limit", None),
        ];
        assert_eq!(validate_template_spec(&s, "spec"), vec![]);
    }

    #[test]
    fn count_above_one_needs_an_interval() {
        let mut m = metric("c");
        m.count = int(3);
        let errors = validate_template_spec(&spec(vec![m.clone()]), "spec");
        assert_eq!(paths(&errors), ["spec.metrics[0].interval"]);
        m.interval = Some("1m".into());
        assert_eq!(validate_template_spec(&spec(vec![m]), "spec"), vec![]);
    }

    #[test]
    fn negative_limits_are_reported() {
        let mut m = metric("n");
        m.count = int(-1);
        m.failure_limit = int(-2);
        m.consecutive_success_limit = int(-1);
        m.inconclusive_limit = int(-1);
        m.consecutive_error_limit = int(-1);
        m.consecutive_failure_limit = int(-1);
        let errors = validate_template_spec(&spec(vec![m]), "spec");
        let p = paths(&errors);
        for field in [
            "count",
            "failureLimit",
            "consecutiveSuccessLimit",
            "inconclusiveLimit",
            "consecutiveErrorLimit",
            "consecutiveFailureLimit",
        ] {
            assert!(
                p.contains(&format!("spec.metrics[0].{field}").as_str()),
                "{field} not reported: {p:?}"
            );
        }
    }

    #[test]
    fn a_limit_that_is_not_a_number_is_reported() {
        let mut m = metric("s");
        m.failure_limit = Some(IntOrString::String("three".into()));
        let errors = validate_template_spec(&spec(vec![m]), "spec");
        assert_eq!(paths(&errors), ["spec.metrics[0].failureLimit"]);
        assert!(errors[0].reason.contains("not an integer"));
    }

    #[test]
    fn failure_limit_and_success_limit_cannot_both_be_disabled() {
        let mut m = metric("off");
        m.failure_limit = int(-1);
        let errors = validate_template_spec(&spec(vec![m.clone()]), "spec");
        assert_eq!(paths(&errors), ["spec.metrics[0].failureLimit"]);
        m.consecutive_success_limit = int(2);
        assert_eq!(validate_template_spec(&spec(vec![m]), "spec"), vec![]);
    }

    #[test]
    fn consecutive_failure_limit_alone_can_decide_a_metric() {
        let mut m = metric("in-a-row");
        m.failure_limit = int(-1);
        m.consecutive_failure_limit = int(3);
        assert_eq!(
            validate_template_spec(&spec(vec![m.clone()]), "spec"),
            vec![]
        );
        m.failure_limit = None;
        m.interval = Some("1m".into());
        m.count = int(2);
        m.consecutive_success_limit = int(2);
        assert_eq!(validate_template_spec(&spec(vec![m]), "spec"), vec![]);
    }

    #[test]
    fn count_must_cover_the_limits_as_argo_requires() {
        let mut m = metric("cover");
        m.interval = Some("1m".into());
        m.count = int(3);
        m.failure_limit = int(2);
        m.consecutive_success_limit = int(2);
        let errors = validate_template_spec(&spec(vec![m.clone()]), "spec");
        assert_eq!(paths(&errors), ["spec.metrics[0].count"]);
        assert!(errors[0].reason.contains("(2 + 2)"));
        m.failure_limit = int(-1);
        m.consecutive_success_limit = int(4);
        let errors = validate_template_spec(&spec(vec![m.clone()]), "spec");
        assert!(errors[0].reason.contains("consecutiveSuccessLimit (4)"));
        m.consecutive_success_limit = int(1);
        m.inconclusive_limit = int(5);
        let errors = validate_template_spec(&spec(vec![m]), "spec");
        assert!(errors[0].reason.contains("inconclusiveLimit (5)"));
    }

    #[test]
    fn unknown_args_in_a_query_are_reported_with_their_name() {
        let mut m = metric("q");
        m.provider = prometheus("rate(x{svc=\"{{args.service}}\",hash=\"{{args.hash}}\"}[1m])");
        let mut s = spec(vec![m]);
        s.args = vec![arg("service", None)];
        let errors = validate_template_spec(&s, "spec");
        assert_eq!(errors.len(), 1);
        assert!(errors[0].reason.contains("{{args.hash}}"));
        assert!(errors[0].fix.contains("- name: hash"));
    }

    #[test]
    fn other_template_tags_are_not_args() {
        let m = Metric {
            provider: prometheus("x{hash=\"{{hash}}\"}"),
            ..metric("judge")
        };
        assert_eq!(validate_template_spec(&spec(vec![m]), "spec"), vec![]);
    }

    #[test]
    fn arg_references_finds_each_name_once() {
        assert_eq!(
            arg_references("{{args.a}} {{ args.b }} {{args.a}} {{hash}} {{args.c"),
            ["a", "b"]
        );
    }

    #[test]
    fn argument_sources_are_checked() {
        let both = AnalysisRunArgument {
            name: "both".into(),
            value: Some("x".into()),
            value_from: Some(ArgumentValueFrom {
                secret_key_ref: Some(SecretKeyRef {
                    name: "s".into(),
                    key: "k".into(),
                }),
                field_ref: Some(FieldRef {
                    field_path: "metadata.name".into(),
                }),
                pod_template_hash_value: None,
            }),
        };
        let hash = AnalysisRunArgument {
            name: "hash".into(),
            value: None,
            value_from: Some(ArgumentValueFrom {
                pod_template_hash_value: Some(ValueFromPodTemplateHash::Latest),
                ..Default::default()
            }),
        };
        let mut s = spec(vec![metric("m")]);
        s.args = vec![both, hash, arg("both", None)];
        let errors = validate_template_spec(&s, "spec");
        assert_eq!(
            paths(&errors),
            [
                "spec.args[0]",
                "spec.args[0].valueFrom",
                "spec.args[1].valueFrom.podTemplateHashValue",
                "spec.args[2].name"
            ]
        );
    }

    #[test]
    fn web_method_and_body_are_checked() {
        let mut m = metric("web");
        m.provider = MetricProvider {
            web: Some(WebMetric {
                url: "http://x".into(),
                method: Some("DELETE".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let errors = validate_template_spec(&spec(vec![m.clone()]), "spec");
        assert_eq!(paths(&errors), ["spec.metrics[0].provider.web.method"]);
        if let Some(web) = m.provider.web.as_mut() {
            web.method = None;
            web.body = Some("{}".into());
            web.json_body = Some(serde_json::json!({"a": 1}));
        }
        let errors = validate_template_spec(&spec(vec![m]), "spec");
        assert_eq!(
            paths(&errors),
            [
                "spec.metrics[0].provider.web.body",
                "spec.metrics[0].provider.web.jsonBody"
            ]
        );
    }

    #[test]
    fn duplicate_rules_and_negative_retention_are_reported() {
        let mut s = spec(vec![metric("m")]);
        s.dry_run = vec![
            DryRun {
                metric_name: ".*".into(),
            },
            DryRun {
                metric_name: ".*".into(),
            },
        ];
        s.measurement_retention = vec![MeasurementRetention {
            metric_name: "m".into(),
            limit: -1,
        }];
        let errors = validate_template_spec(&s, "spec");
        assert_eq!(
            paths(&errors),
            [
                "spec.dryRun[1].metricName",
                "spec.measurementRetention[0].limit"
            ]
        );
    }

    #[test]
    fn a_run_needs_metrics() {
        let run = AnalysisRun::new("r", Default::default());
        assert_eq!(paths(&validate_run(&run)), ["spec.metrics"]);
    }

    #[test]
    fn int_or_string_values() {
        assert_eq!(int_or_string_value(&IntOrString::Int(3)), Ok(3));
        assert_eq!(
            int_or_string_value(&IntOrString::String(" 7 ".into())),
            Ok(7)
        );
        assert!(int_or_string_value(&IntOrString::String("x".into())).is_err());
    }

    #[test]
    fn effective_count_follows_argo() {
        let mut m = metric("e");
        assert_eq!(m.effective_count(), Some(1));
        m.interval = Some("1m".into());
        assert_eq!(m.effective_count(), None);
        m.count = int(0);
        assert_eq!(m.effective_count(), None);
        m.count = Some(IntOrString::String("4".into()));
        assert_eq!(m.effective_count(), Some(4));
    }
}
