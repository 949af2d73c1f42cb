//! Argument substitution: `{{args.name}}` in a metric (query, address, headers, limits...) is
//! replaced by the run's argument values, as Argo does. Tags that are not `args.*` (such as the
//! judge's `{{hash}}`) are left for their owner to replace.

use std::collections::BTreeMap;

use rollouts_crds::analysis::{AnalysisRunArgument, Metric, SecretKeyRef};

/// Argument values by name.
pub type ArgValues = BTreeMap<String, String>;

/// Stands in for a secret's value where only the shape of the metric matters (scheduling,
/// validation), so the secret is not read.
pub const SECRET_PLACEHOLDER: &str = "temp-for-secret";

/// Why arguments could not be resolved. Each names the argument.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    #[error(
        "argument {name:?} has no value: set spec.args[].value, or valueFrom.secretKeyRef, for {name:?}"
    )]
    NoValue { name: String },
    #[error(
        "{{{{args.{name}}}}} is used but no argument {name:?} is given: declare it under spec.args with a value"
    )]
    Missing { name: String },
    #[error("argument {name:?}: secret {secret:?} key {key:?}: {reason}")]
    Secret {
        name: String,
        secret: String,
        key: String,
        reason: String,
    },
    #[error("{{{{ is not closed by }}}} in {text:?}")]
    Unclosed { text: String },
    #[error("metric {metric:?} is not valid after substituting arguments: {reason}")]
    Metric { metric: String, reason: String },
}

/// The value of every argument. Secret references are read through `read_secret`; an argument
/// with neither a value nor a secret is an error, as in Argo (the Rollout resolves `fieldRef`
/// and pod-template hashes into values before the run is created).
pub fn values(
    args: &[AnalysisRunArgument],
    mut read_secret: impl FnMut(&SecretKeyRef) -> Result<String, String>,
) -> Result<ArgValues, ArgError> {
    let mut values = ArgValues::new();
    for arg in args {
        let secret = arg
            .value_from
            .as_ref()
            .and_then(|f| f.secret_key_ref.as_ref());
        let value = match (secret, &arg.value) {
            (Some(secret), _) => read_secret(secret).map_err(|reason| ArgError::Secret {
                name: arg.name.clone(),
                secret: secret.name.clone(),
                key: secret.key.clone(),
                reason,
            })?,
            (None, Some(value)) => value.clone(),
            (None, None) => {
                return Err(ArgError::NoValue {
                    name: arg.name.clone(),
                });
            }
        };
        values.insert(arg.name.clone(), value);
    }
    Ok(values)
}

/// Argument values with every secret replaced by [`SECRET_PLACEHOLDER`].
pub fn values_without_secrets(args: &[AnalysisRunArgument]) -> Result<ArgValues, ArgError> {
    values(args, |_| Ok(SECRET_PLACEHOLDER.to_string()))
}

/// Replaces every `{{args.name}}` (spaces inside the braces allowed) in `template`, escaping
/// each value with `escape`.
fn substitute(
    template: &str,
    values: &ArgValues,
    escape: impl Fn(&str) -> String,
) -> Result<String, ArgError> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let Some(close) = after.find("}}") else {
            return Err(ArgError::Unclosed {
                text: template.to_string(),
            });
        };
        let tag = after[..close].trim();
        match tag.strip_prefix("args.") {
            Some(name) => match values.get(name) {
                Some(value) => out.push_str(&escape(value)),
                None => {
                    return Err(ArgError::Missing {
                        name: name.to_string(),
                    });
                }
            },
            None => out.push_str(&rest[open..open + 2 + close + 2]),
        }
        rest = &after[close + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Replaces `{{args.name}}` in a text with the argument's value.
pub fn resolve(template: &str, values: &ArgValues) -> Result<String, ArgError> {
    substitute(template, values, str::to_string)
}

/// The metric with `{{args.name}}` replaced everywhere in it (query, address, headers, limits,
/// conditions...). Values are JSON-escaped, so quotes and newlines in them stay inside strings.
pub fn resolve_metric(metric: &Metric, values: &ArgValues) -> Result<Metric, ArgError> {
    let invalid = |reason: String| ArgError::Metric {
        metric: metric.name.clone(),
        reason,
    };
    let text = serde_json::to_string(metric).map_err(|e| invalid(e.to_string()))?;
    let resolved = substitute(&text, values, |value| {
        let quoted = serde_json::Value::String(value.to_string()).to_string();
        quoted[1..quoted.len() - 1].to_string()
    })?;
    serde_json::from_str(&resolved).map_err(|e| invalid(e.to_string()))
}

/// Every metric resolved with `values`.
pub fn resolve_metrics(metrics: &[Metric], values: &ArgValues) -> Result<Vec<Metric>, ArgError> {
    metrics.iter().map(|m| resolve_metric(m, values)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use rollouts_crds::analysis::{ArgumentValueFrom, MetricProvider, PrometheusMetric};

    fn arg(name: &str, value: Option<&str>) -> AnalysisRunArgument {
        AnalysisRunArgument {
            name: name.into(),
            value: value.map(Into::into),
            value_from: None,
        }
    }

    fn secret_arg(name: &str, secret: &str, key: &str) -> AnalysisRunArgument {
        AnalysisRunArgument {
            name: name.into(),
            value: None,
            value_from: Some(ArgumentValueFrom {
                secret_key_ref: Some(SecretKeyRef {
                    name: secret.into(),
                    key: key.into(),
                }),
                ..Default::default()
            }),
        }
    }

    fn vals(pairs: &[(&str, &str)]) -> ArgValues {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn resolves_args_and_keeps_other_tags() {
        let values = vals(&[("service", "checkout"), ("hash", "abc")]);
        assert_eq!(
            resolve(
                "x{svc=\"{{args.service}}\",h=\"{{ args.hash }}\",p=\"{{hash}}\"}",
                &values
            ),
            Ok("x{svc=\"checkout\",h=\"abc\",p=\"{{hash}}\"}".to_string())
        );
    }

    #[test]
    fn a_missing_arg_is_named() {
        let err = resolve("{{args.service}}", &vals(&[])).unwrap_err();
        assert_eq!(
            err,
            ArgError::Missing {
                name: "service".into()
            }
        );
        assert!(err.to_string().contains("\"service\""));
    }

    #[test]
    fn an_unclosed_tag_is_an_error() {
        assert!(matches!(
            resolve("test-{{args.var", &vals(&[("var", "x")])),
            Err(ArgError::Unclosed { .. })
        ));
    }

    #[test]
    fn values_need_a_value_or_a_secret() {
        let err = values(
            &[arg("a", Some("1")), arg("b", None)],
            |_| Ok(String::new()),
        )
        .unwrap_err();
        assert_eq!(err, ArgError::NoValue { name: "b".into() });
        assert!(err.to_string().contains("\"b\""));
    }

    #[test]
    fn secrets_are_read_or_replaced_by_the_placeholder() {
        let args = [arg("a", Some("1")), secret_arg("token", "creds", "api")];
        let read = values(&args, |s| Ok(format!("{}/{}", s.name, s.key))).unwrap();
        assert_eq!(read, vals(&[("a", "1"), ("token", "creds/api")]));
        let placeholder = values_without_secrets(&args).unwrap();
        assert_eq!(placeholder["token"], SECRET_PLACEHOLDER);
        let err = values(&args, |_| Err("not found".into())).unwrap_err();
        assert!(
            err.to_string()
                .contains("secret \"creds\" key \"api\": not found")
        );
    }

    #[test]
    fn metric_substitution_escapes_values_and_reaches_every_field() {
        let metric = Metric {
            name: "m".into(),
            count: Some(IntOrString::String("{{args.count}}".into())),
            success_condition: Some("result[0] < {{args.threshold}}".into()),
            provider: MetricProvider {
                prometheus: Some(PrometheusMetric {
                    address: Some("http://{{args.host}}:9090".into()),
                    query: Some("up{job=\"{{args.job}}\"}".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let values = vals(&[
            ("count", "3"),
            ("threshold", "0.5"),
            ("host", "prom"),
            ("job", "a\"b\nc"),
        ]);
        let resolved = resolve_metric(&metric, &values).unwrap();
        let prometheus = resolved.provider.prometheus.unwrap();
        assert_eq!(resolved.count, Some(IntOrString::String("3".into())));
        assert_eq!(
            resolved.success_condition.as_deref(),
            Some("result[0] < 0.5")
        );
        assert_eq!(prometheus.address.as_deref(), Some("http://prom:9090"));
        assert_eq!(prometheus.query.as_deref(), Some("up{job=\"a\"b\nc\"}"));
    }
}
