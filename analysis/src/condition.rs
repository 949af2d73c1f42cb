//! Condition evaluation: a metric's `successCondition` / `failureCondition` are expr-lang
//! expressions over `result`, with Argo's helper functions (`asInt`, `asFloat`, `isNaN`,
//! `isInf`, `isNil`, `default`) and Argo's rules for turning the two answers into a phase.
//! Errors become the message of an Error measurement; evaluation never panics.

use expr::{Context, Environment, Value};
use k8s_openapi::jiff::Timestamp;
use rollouts_crds::analysis::{AnalysisPhase, Metric};

/// Why an expression gave no answer of the type asked for.
#[derive(Debug, thiserror::Error)]
pub enum ExpressionError {
    /// Not valid expr-lang, or it failed while running (a wrong type, a missing field).
    #[error("{0}")]
    Eval(#[source] expr::Error),
    #[error("expected bool, but got {type_name} ({value})")]
    NotBool {
        type_name: &'static str,
        value: String,
    },
    #[error("expected a time, but got {type_name} ({value})")]
    NotTime {
        type_name: &'static str,
        value: String,
    },
    #[error("{0}")]
    TimeOutOfRange(#[source] k8s_openapi::jiff::Error),
    /// Over [`MAX_EXPRESSION_LENGTH`] or [`MAX_EXPRESSION_NESTING`]; refused before parsing.
    #[error(transparent)]
    Bounds(#[from] rollouts_crds::expression::BoundError),
    /// The expression engine failed on this expression (a fault of the engine, contained).
    #[error("the expression could not be evaluated: {message}")]
    EngineFault { message: String },
}

/// The longest expression (a condition, a range query's start or end) evaluated, in bytes.
pub const MAX_EXPRESSION_LENGTH: usize = rollouts_crds::expression::MAX_LENGTH;

/// The deepest nesting of `(`, `[` and `{` (outside string literals) an expression may have.
/// Checked before parsing: the parser and the evaluator recurse once per level.
pub const MAX_EXPRESSION_NESTING: usize = rollouts_crds::expression::MAX_NESTING;

/// The stack of the thread an expression is parsed and evaluated on. The expression engine
/// recurses once per operator of a chain (`1+1+...`), so within [`MAX_EXPRESSION_LENGTH`] it
/// needs far more than an async worker's 2 MiB: the worst shapes tested fit in 48 MiB and not
/// in 32 MiB in a debug build (less in release). Only the pages used are allocated.
const EXPRESSION_STACK: usize = 128 << 20;

/// Refuses an expression over [`MAX_EXPRESSION_LENGTH`] or nested deeper than
/// [`MAX_EXPRESSION_NESTING`], before any parsing.
pub fn check_bounds(expression: &str) -> Result<(), ExpressionError> {
    Ok(rollouts_crds::expression::check_bounds(expression)?)
}

/// Runs `work` (parse and evaluate one expression) after [`check_bounds`], on a thread with a
/// stack large enough for any expression within the bounds. A panic inside the expression
/// engine becomes [`ExpressionError::EngineFault`] instead of reaching the caller.
fn guarded<T: Send>(
    expression: &str,
    work: impl FnOnce() -> Result<T, ExpressionError> + Send,
) -> Result<T, ExpressionError> {
    check_bounds(expression)?;
    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("expression".into())
            .stack_size(EXPRESSION_STACK)
            .spawn_scoped(scope, work)
            .map_err(|e| ExpressionError::EngineFault {
                message: format!("no thread to evaluate it on: {e}"),
            })?;
        worker.join().unwrap_or_else(|panic| {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "the expression engine panicked".to_string());
            Err(ExpressionError::EngineFault { message })
        })
    })
}

/// Why a metric's condition could not decide a measurement's phase.
#[derive(Debug, thiserror::Error)]
pub enum ConditionError {
    #[error(
        "could not evaluate {field} \"{expression}\": metric result is nil or empty: no data returned from the metric provider"
    )]
    NoData {
        /// `successCondition` or `failureCondition`.
        field: &'static str,
        expression: String,
    },
    #[error("could not evaluate {field} \"{expression}\": {source}")]
    Expression {
        field: &'static str,
        expression: String,
        #[source]
        source: ExpressionError,
    },
}

/// The phase of a measurement whose value is `result`, by Argo's rules:
/// - no conditions: Successful;
/// - only a success condition: Successful when it holds, else Failed;
/// - only a failure condition: Failed when it holds, else Successful;
/// - both: Failed when the failure condition holds, Successful when only the success
///   condition holds, Inconclusive when neither does.
///
/// A condition that cannot be evaluated, or does not give a boolean, is an `Err` whose text is
/// the message for an Error measurement.
pub fn evaluate(
    result: &Value,
    success_condition: Option<&str>,
    failure_condition: Option<&str>,
) -> Result<AnalysisPhase, ConditionError> {
    let success_condition = success_condition.filter(|c| !c.is_empty());
    let failure_condition = failure_condition.filter(|c| !c.is_empty());
    let mut success = false;
    let mut failure = false;
    if let Some(condition) = success_condition {
        success = eval_condition(result, condition)
            .map_err(|e| eval_error(e, "successCondition", condition, result))?;
    }
    if let Some(condition) = failure_condition {
        failure = eval_condition(result, condition)
            .map_err(|e| eval_error(e, "failureCondition", condition, result))?;
    }
    match (success_condition, failure_condition) {
        (None, None) => return Ok(AnalysisPhase::Successful),
        (Some(_), None) => failure = !success,
        (None, Some(_)) => success = !failure,
        (Some(_), Some(_)) => {}
    }
    Ok(if failure {
        AnalysisPhase::Failed
    } else if !success {
        AnalysisPhase::Inconclusive
    } else {
        AnalysisPhase::Successful
    })
}

/// [`evaluate`] with the metric's conditions.
pub fn evaluate_metric(result: &Value, metric: &Metric) -> Result<AnalysisPhase, ConditionError> {
    evaluate(
        result,
        metric.success_condition.as_deref(),
        metric.failure_condition.as_deref(),
    )
}

fn eval_error(
    source: ExpressionError,
    field: &'static str,
    expression: &str,
    result: &Value,
) -> ConditionError {
    let expression = shortened(expression);
    if is_nil_or_empty(result) {
        return ConditionError::NoData { field, expression };
    }
    ConditionError::Expression {
        field,
        expression,
        source,
    }
}

/// The expression as an error message quotes it: at most 200 characters, so a huge one does
/// not end up whole in a status.
fn shortened(expression: &str) -> String {
    const QUOTED: usize = 200;
    match expression.char_indices().nth(QUOTED) {
        None => expression.to_string(),
        Some((cut, _)) => format!(
            "{}... ({} bytes)",
            expression.get(..cut).unwrap_or_default(),
            expression.len()
        ),
    }
}

fn is_nil_or_empty(result: &Value) -> bool {
    match result {
        Value::Nil => true,
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

/// Parses `expression` without evaluating it: a condition or time expression that cannot
/// parse is known before any measurement. Bounded as [`eval_condition`] is.
pub fn check_parses(expression: &str) -> Result<(), ExpressionError> {
    guarded(expression, || {
        expr::compile(expression)
            .map(|_| ())
            .map_err(ExpressionError::Eval)
    })
}

/// Evaluates one condition with `result` bound; it must give a boolean. Conditions over
/// [`MAX_EXPRESSION_LENGTH`] or [`MAX_EXPRESSION_NESTING`] are refused before parsing.
pub fn eval_condition(result: &Value, condition: &str) -> Result<bool, ExpressionError> {
    guarded(condition, || {
        let env = environment(result);
        let mut ctx = Context::default();
        ctx.insert("result", result.clone());
        let program = expr::compile(condition).map_err(ExpressionError::Eval)?;
        match env.run(&program, &ctx).map_err(ExpressionError::Eval)? {
            Value::Bool(b) => Ok(b),
            other => Err(ExpressionError::NotBool {
                type_name: type_name(&other),
                value: other.to_string(),
            }),
        }
    })
}

/// Evaluates `condition` with each of `variables` bound by name (a notification trigger's
/// `when` over `rollout`); it must give a boolean. Bounded as [`eval_condition`] is.
pub fn eval_condition_over(
    variables: &[(&str, Value)],
    condition: &str,
) -> Result<bool, ExpressionError> {
    guarded(condition, || {
        let env = environment(&Value::Nil);
        let mut ctx = Context::default();
        for (name, value) in variables {
            ctx.insert(*name, value.clone());
        }
        let program = expr::compile(condition).map_err(ExpressionError::Eval)?;
        match env.run(&program, &ctx).map_err(ExpressionError::Eval)? {
            Value::Bool(b) => Ok(b),
            other => Err(ExpressionError::NotBool {
                type_name: type_name(&other),
                value: other.to_string(),
            }),
        }
    })
}

/// Evaluates `expression` with each of `variables` bound by name and gives its value as text
/// (a notification trigger's `oncePer`: one message per distinct value). A string gives itself,
/// nil gives an empty text. Bounded as [`eval_condition`] is.
pub fn eval_text_over(
    variables: &[(&str, Value)],
    expression: &str,
) -> Result<String, ExpressionError> {
    guarded(expression, || {
        let env = environment(&Value::Nil);
        let mut ctx = Context::default();
        for (name, value) in variables {
            ctx.insert(*name, value.clone());
        }
        let program = expr::compile(expression).map_err(ExpressionError::Eval)?;
        Ok(
            match env.run(&program, &ctx).map_err(ExpressionError::Eval)? {
                Value::String(text) => text,
                Value::Nil => String::new(),
                other => other.to_string(),
            },
        )
    })
}

/// Evaluates a time expression such as `now() - duration("5m")` (a range query's start or
/// end), with `now()` fixed to `now` so the answer is reproducible.
/// Bounded as [`eval_condition`] is.
pub fn eval_time(expression: &str, now: Timestamp) -> Result<Timestamp, ExpressionError> {
    guarded(expression, || eval_time_unguarded(expression, now))
}

fn eval_time_unguarded(expression: &str, now: Timestamp) -> Result<Timestamp, ExpressionError> {
    let mut env = Environment::new();
    let now_text = now.to_string();
    env.add_function("now", move |call| {
        call.env.eval_func(
            call.ctx,
            "date",
            vec![Value::String(now_text.clone())],
            None,
        )
    });
    let program = expr::compile(expression).map_err(ExpressionError::Eval)?;
    let value = env
        .run(&program, &Context::default())
        .map_err(ExpressionError::Eval)?;
    let Some(datetime) = value.as_datetime() else {
        return Err(ExpressionError::NotTime {
            type_name: type_name(&value),
            value: value.to_string(),
        });
    };
    Timestamp::new(
        datetime.timestamp(),
        datetime.timestamp_subsec_nanos() as i32,
    )
    .map_err(ExpressionError::TimeOutOfRange)
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Integer(_) => "int",
        Value::Bool(_) => "bool",
        Value::Float(_) => "float",
        Value::Nil => "nil",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Bytes(_) => "bytes",
        Value::Map(_) | Value::KeyedMap(_) => "map",
        _ => "time",
    }
}

fn one_arg(args: &[Value], name: &str) -> expr::Result<Value> {
    match args {
        [value] => Ok(value.clone()),
        args => Err(expr::Error::ExprError(format!(
            "{name}() takes 1 argument, got {}",
            args.len()
        ))),
    }
}

fn unsupported(name: &str, value: &Value) -> expr::Error {
    expr::Error::ExprError(format!(
        "{name}() not supported on {} {value}",
        type_name(value)
    ))
}

/// The functions Argo adds to every condition. `isNil` and `default` look at the measured
/// result whatever their first argument is, as Argo's do.
fn environment(result: &Value) -> Environment<'static> {
    let mut env = Environment::new();
    env.add_function("asInt", |call| {
        let value = one_arg(&call.args, "asInt")?;
        match &value {
            Value::Integer(i) => Ok(Value::Integer(*i)),
            Value::Float(f) => Ok(Value::Integer(*f as i64)),
            Value::String(s) => s
                .trim()
                .parse::<i64>()
                .map(Value::Integer)
                .map_err(|e| expr::Error::ExprError(format!("asInt({s:?}): {e}"))),
            other => Err(unsupported("asInt", other)),
        }
    });
    env.add_function("asFloat", |call| {
        let value = one_arg(&call.args, "asFloat")?;
        match &value {
            Value::Integer(i) => Ok(Value::Float(*i as f64)),
            Value::Float(f) => Ok(Value::Float(*f)),
            Value::String(s) => s
                .trim()
                .parse::<f64>()
                .map(Value::Float)
                .map_err(|e| expr::Error::ExprError(format!("asFloat({s:?}): {e}"))),
            other => Err(unsupported("asFloat", other)),
        }
    });
    env.add_function("isNaN", |call| match one_arg(&call.args, "isNaN")? {
        Value::Float(f) => Ok(Value::Bool(f.is_nan())),
        Value::Integer(_) => Ok(Value::Bool(false)),
        other => Err(unsupported("isNaN", &other)),
    });
    env.add_function("isInf", |call| match one_arg(&call.args, "isInf")? {
        Value::Float(f) => Ok(Value::Bool(f.is_infinite())),
        Value::Integer(_) => Ok(Value::Bool(false)),
        other => Err(unsupported("isInf", &other)),
    });
    let result_is_nil = result.is_nil();
    env.add_function("isNil", move |_| Ok(Value::Bool(result_is_nil)));
    let measured = result.clone();
    env.add_function("default", move |call| match call.args.as_slice() {
        [_, fallback] => Ok(if measured.is_nil() {
            fallback.clone()
        } else {
            measured.clone()
        }),
        args => Err(expr::Error::ExprError(format!(
            "default() takes 2 arguments, got {}",
            args.len()
        ))),
    });
    env
}

/// A JSON document as a condition sees it. Numbers become floats, as Go's JSON decoding makes
/// them.
pub fn from_json(value: &serde_json::Value) -> Value {
    match value {
        serde_json::Value::Null => Value::Nil,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        serde_json::Value::String(s) => Value::String(s.clone()),
        serde_json::Value::Array(items) => Value::Array(items.iter().map(from_json).collect()),
        serde_json::Value::Object(map) => {
            Value::Map(map.iter().map(|(k, v)| (k.clone(), from_json(v))).collect())
        }
    }
}

/// A list of samples as a condition sees it (`result[0]`).
pub fn from_samples(samples: &[f64]) -> Value {
    Value::Array(samples.iter().map(|s| Value::Float(*s)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use AnalysisPhase::*;

    fn map(pairs: &[(&str, Value)]) -> Value {
        Value::Map(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        )
    }

    #[test]
    fn conditions_over_named_variables_see_an_object_by_path() {
        let rollout = from_json(&serde_json::json!({
            "spec": {"replicas": 4, "template": {"spec": {"containers": [{"image": "web:purple"}]}}}
        }));
        let variables = [("rollout", rollout)];
        assert!(eval_condition_over(&variables, "rollout.spec.replicas > 3").expect("evaluates"));
        assert!(
            eval_condition_over(
                &variables,
                "rollout.spec.template.spec.containers[0].image == 'web:purple'"
            )
            .expect("evaluates")
        );
        assert!(eval_condition_over(&variables, "rollout.spec.replicas").is_err());
    }

    // The tests check errors by their text, the message an Error measurement carries.
    fn holds(result: &Value, condition: &str) -> Result<bool, String> {
        eval_condition(result, condition).map_err(|e| e.to_string())
    }

    #[test]
    fn a_once_per_expression_gives_its_value_as_text() {
        let rollout = from_json(&serde_json::json!({
            "status": {"currentPodHash": "5d8f7c", "currentStepIndex": 2},
            "spec": {"template": {"spec": {"containers": [{"image": "web:2"}]}}}
        }));
        let variables = [("rollout", rollout)];
        let text = |expression: &str| eval_text_over(&variables, expression).expect("evaluates");
        assert_eq!(text("rollout.status.currentPodHash"), "5d8f7c");
        assert_eq!(
            text("rollout.spec.template.spec.containers[0].image"),
            "web:2"
        );
        assert_eq!(text("rollout.status.missing"), "");
        assert_ne!(text("rollout.status.currentStepIndex"), "");
        assert!(eval_text_over(&variables, "rollout.status.(").is_err());
    }

    fn phase(
        result: &Value,
        success_condition: Option<&str>,
        failure_condition: Option<&str>,
    ) -> Result<AnalysisPhase, String> {
        evaluate(result, success_condition, failure_condition).map_err(|e| e.to_string())
    }

    fn time(expression: &str, now: Timestamp) -> Result<Timestamp, String> {
        eval_time(expression, now).map_err(|e| e.to_string())
    }

    #[test]
    fn argo_condition_examples() {
        let good = from_samples(&[0.99]);
        let bad = from_samples(&[0.5]);
        assert_eq!(holds(&good, "result[0] >= 0.95"), Ok(true));
        assert_eq!(holds(&bad, "result[0] >= 0.95"), Ok(false));
        assert_eq!(
            holds(&from_samples(&[3.0]), "len(result) > 0 && result[0] < 10"),
            Ok(true)
        );
        assert_eq!(
            holds(&from_samples(&[]), "len(result) > 0 && result[0] < 10"),
            Ok(false)
        );
        assert_eq!(
            holds(&from_samples(&[0.1, 0.2]), "all(result, {# < 0.3})"),
            Ok(true)
        );
        assert_eq!(
            holds(&from_samples(&[0.1, 0.5]), "all(result, {# < 0.3})"),
            Ok(false)
        );
        let status = map(&[("status", Value::from("ok"))]);
        assert_eq!(holds(&status, "result.status == \"ok\""), Ok(true));
        assert_eq!(holds(&Value::Float(12.0), "result > 10"), Ok(true));
    }

    #[test]
    fn nan_compares_false_and_is_detectable() {
        let nan = from_samples(&[f64::NAN]);
        assert_eq!(holds(&nan, "result[0] >= 0.95"), Ok(false));
        assert_eq!(holds(&nan, "isNaN(result[0])"), Ok(true));
        assert_eq!(holds(&from_samples(&[0.5]), "isNaN(result[0])"), Ok(false));
        assert_eq!(phase(&nan, Some("result[0] >= 0.95"), None), Ok(Failed));
        assert_eq!(
            phase(&nan, Some("result[0] >= 0.95"), Some("result[0] < 0.9")),
            Ok(Inconclusive)
        );
        assert_eq!(
            holds(&from_samples(&[f64::INFINITY]), "isInf(result[0])"),
            Ok(true)
        );
    }

    #[test]
    fn an_empty_vector_is_an_error_that_says_no_data() {
        let err = phase(&from_samples(&[]), Some("result[0] >= 0.95"), None).unwrap_err();
        assert!(err.starts_with("could not evaluate successCondition \"result[0] >= 0.95\""));
        assert!(
            err.contains("no data returned from the metric provider"),
            "{err}"
        );
        let err = phase(&Value::Nil, None, Some("result > 1")).unwrap_err();
        assert!(
            err.starts_with("could not evaluate failureCondition"),
            "{err}"
        );
        assert!(err.contains("nil or empty"));
    }

    #[test]
    fn a_wrong_type_is_an_error_with_the_reason() {
        let err = phase(&Value::from("abc"), Some("result > 1"), None).unwrap_err();
        assert!(err.starts_with("could not evaluate successCondition \"result > 1\": "));
        assert!(!err.contains("nil or empty"));
        let err = holds(&Value::Float(1.0), "result + 1").unwrap_err();
        assert_eq!(err, "expected bool, but got float (2)");
    }

    #[test]
    fn argo_conditions_parse_and_garbage_does_not() {
        for condition in [
            "result[0] >= 0.95",
            "len(result) > 0 && result[0] < 10",
            "all(result, {# < 0.3})",
            "isNaN(result[0]) || asFloat(result) > 1",
            "default(result, 0) == 0",
        ] {
            assert!(check_parses(condition).is_ok(), "{condition}");
        }
        assert!(check_parses("result >>> ]] (").is_err());
        assert!(check_parses(&"(".repeat(10_000)).is_err());
    }

    #[test]
    fn a_syntax_error_is_an_error_not_a_panic() {
        let err = phase(&from_samples(&[1.0]), Some("result[0] >"), None).unwrap_err();
        assert!(
            err.starts_with("could not evaluate successCondition \"result[0] >\""),
            "{err}"
        );
    }

    #[test]
    fn phases_from_the_two_conditions() {
        let r = Value::Float(5.0);
        assert_eq!(phase(&r, None, None), Ok(Successful));
        assert_eq!(phase(&r, Some(""), Some("")), Ok(Successful));
        assert_eq!(phase(&r, Some("result > 1"), None), Ok(Successful));
        assert_eq!(phase(&r, Some("result > 9"), None), Ok(Failed));
        assert_eq!(phase(&r, None, Some("result > 9")), Ok(Successful));
        assert_eq!(phase(&r, None, Some("result > 1")), Ok(Failed));
        assert_eq!(
            phase(&r, Some("result > 1"), Some("result > 9")),
            Ok(Successful)
        );
        assert_eq!(
            phase(&r, Some("result > 9"), Some("result > 1")),
            Ok(Failed)
        );
        assert_eq!(
            phase(&r, Some("result > 1"), Some("result > 1")),
            Ok(Failed)
        );
        assert_eq!(
            phase(&r, Some("result > 9"), Some("result > 9")),
            Ok(Inconclusive)
        );
    }

    #[test]
    fn conversions_follow_argo() {
        assert_eq!(holds(&Value::from("42"), "asInt(result) == 42"), Ok(true));
        assert_eq!(holds(&Value::Float(4.9), "asInt(result) == 4"), Ok(true));
        assert_eq!(
            holds(&Value::from("0.5"), "asFloat(result) == 0.5"),
            Ok(true)
        );
        assert_eq!(
            holds(&Value::Integer(2), "asFloat(result) == 2.0"),
            Ok(true)
        );
        let err = holds(&Value::from("x"), "asInt(result) == 1").unwrap_err();
        assert!(err.contains("asInt(\"x\")"), "{err}");
        let err = holds(&from_samples(&[1.0]), "asFloat(result) == 1").unwrap_err();
        assert!(err.contains("asFloat() not supported on array"), "{err}");
    }

    #[test]
    fn is_nil_and_default_look_at_the_result() {
        assert_eq!(holds(&Value::Nil, "isNil(result)"), Ok(true));
        assert_eq!(holds(&Value::Float(1.0), "isNil(result)"), Ok(false));
        assert_eq!(holds(&Value::Nil, "default(result, 0) < 1"), Ok(true));
        assert_eq!(
            holds(&Value::Float(5.0), "default(result, 0) < 1"),
            Ok(false)
        );
    }

    #[test]
    fn json_numbers_become_floats() {
        let v = from_json(&serde_json::json!({"count": 3, "ok": true, "items": [1, "a", null]}));
        assert_eq!(holds(&v, "result.count == 3 && result.ok"), Ok(true));
        assert_eq!(
            holds(&v, "len(result.items) == 3 && result.items[2] == nil"),
            Ok(true)
        );
        assert!(matches!(
            v.as_map().and_then(|m| m.get("count")),
            Some(Value::Float(_))
        ));
    }

    #[test]
    fn time_expressions_use_the_injected_now() {
        let now: Timestamp = "2024-05-01T10:00:00Z".parse().unwrap();
        assert_eq!(time("now()", now), Ok(now));
        assert_eq!(
            time("now() - duration(\"5m\")", now),
            Ok("2024-05-01T09:55:00Z".parse().unwrap())
        );
        assert!(time("1 + 1", now).unwrap_err().contains("expected a time"));
        assert!(time("now(", now).is_err());
    }

    #[test]
    fn deep_nesting_is_refused_before_parsing() {
        let deep = format!("{}result{} > 0", "(".repeat(50_000), ")".repeat(50_000));
        let err = holds(&Value::Float(1.0), &deep).unwrap_err();
        assert!(err.contains("over the limit of 4096"), "{err}");
        let deep = format!("{}1{} > 0", "(".repeat(1000), ")".repeat(1000));
        let err = holds(&Value::Float(1.0), &deep).unwrap_err();
        assert!(
            err.contains("nests brackets 1000 deep, over the limit of 64"),
            "{err}"
        );
        let now: Timestamp = "2024-05-01T10:00:00Z".parse().unwrap();
        let deep = format!("{}now(){}", "(".repeat(50_000), ")".repeat(50_000));
        assert!(time(&deep, now).unwrap_err().contains("over the limit"));
        let deep = format!("{}now(){}", "[".repeat(100), "]".repeat(100));
        assert!(time(&deep, now).unwrap_err().contains("limit of 64"));
        // Brackets inside string literals do not count.
        let quoted = format!("result == \"{}\"", "(".repeat(100));
        assert_eq!(holds(&Value::from("x"), &quoted), Ok(false));
    }

    #[test]
    fn long_operator_chains_within_the_length_limit_evaluate() {
        // Each operator of a chain is a level of recursion in the engine.
        let chain = vec!["1"; MAX_EXPRESSION_LENGTH / 2].join("+");
        assert!(chain.len() <= MAX_EXPRESSION_LENGTH);
        assert_eq!(
            holds(
                &Value::Float(1.0),
                &format!("{} > 0", &chain[..chain.len() - 6])
            ),
            Ok(true)
        );
        let members = format!("result{}", "[0]".repeat(1300));
        assert!(holds(&from_samples(&[1.0]), &members).is_err());
        // The other shapes that recurse per operator, each filling the length limit.
        let fill = |unit: &str, head: &str, tail: &str| {
            let room = MAX_EXPRESSION_LENGTH - head.len() - tail.len();
            format!("{head}{}{tail}", unit.repeat(room / unit.len()))
        };
        for expression in [
            fill("1*", "", "1"),
            fill("1**", "", "1"),
            fill(".a", "result", ""),
            fill("!", "", "true"),
            fill("-", "", "1"),
            fill("true && ", "", "true"),
            fill("true ? 1 : ", "", "2"),
            fill("result ?? ", "", "1"),
            fill(" | len()", "[1]", ""),
        ] {
            assert!(expression.len() <= MAX_EXPRESSION_LENGTH);
            let _ = holds(&Value::Float(1.0), &expression);
        }
    }

    #[test]
    fn an_engine_panic_is_an_error() {
        // expr-lang 2.1 reaches `unreachable!` on a map literal nested in a map literal.
        let err = holds(&Value::Float(1.0), "{a: {b: 1}} == nil").unwrap_err();
        assert!(
            err.starts_with("the expression could not be evaluated"),
            "{err}"
        );
    }

    #[test]
    fn a_huge_expression_is_quoted_shortened_in_the_message() {
        let long = format!("result > {}", "1".repeat(5000));
        let err = phase(&Value::Float(1.0), Some(&long), None).unwrap_err();
        assert!(err.len() < 500, "{err}");
        assert!(err.contains("(5009 bytes)"), "{err}");
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn any_result() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Nil),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(Value::Integer),
                any::<f64>().prop_map(Value::Float),
                "\\PC{0,8}".prop_map(Value::String),
            ];
            leaf.prop_recursive(3, 16, 4, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                    proptest::collection::vec(("[a-z]{1,3}", inner), 0..4)
                        .prop_map(|pairs| Value::Map(pairs.into_iter().collect())),
                ]
            })
        }

        /// Tokens of expr-lang, so generated text often parses and reaches evaluation.
        fn expression_text() -> impl Strategy<Value = String> {
            let token = prop_oneof![
                Just("result"),
                Just("result[0]"),
                Just("result.a"),
                Just("("),
                Just(")"),
                Just("["),
                Just("]"),
                Just("{"),
                Just("}"),
                Just(","),
                Just(":"),
                Just("+"),
                Just("-"),
                Just("*"),
                Just("/"),
                Just("%"),
                Just("**"),
                Just("=="),
                Just("<"),
                Just(">="),
                Just("&&"),
                Just("||"),
                Just("!"),
                Just("not"),
                Just("?"),
                Just("??"),
                Just("|"),
                Just("."),
                Just("0"),
                Just("1"),
                Just("9223372036854775807"),
                Just("-9223372036854775808"),
                Just("1.5"),
                Just("1e308"),
                Just("\"s\""),
                Just("nil"),
                Just("true"),
                Just("len("),
                Just("asInt("),
                Just("asFloat("),
                Just("isNaN("),
                Just("isInf("),
                Just("isNil("),
                Just("default("),
                Just("all("),
                Just("#"),
                Just("in"),
                Just("matches"),
                Just("now()"),
                Just("duration(\"5m\")"),
                Just("date("),
                Just(".."),
                Just("abs("),
                Just("max("),
                Just("filter("),
                Just("map("),
            ];
            proptest::collection::vec(token, 0..24).prop_map(|tokens| tokens.join(" "))
        }

        // Modest counts: an engine panic caught on the way prints a backtrace.
        proptest! {
            #![proptest_config(ProptestConfig::with_cases(200))]

            /// Any text, any result: an answer or an error, never a panic.
            #[test]
            fn any_condition_on_any_result_answers_or_errs(
                condition in "\\PC{0,60}",
                result in any_result(),
            ) {
                let _ = evaluate(&result, Some(&condition), Some(&condition));
            }

            #[test]
            fn token_soup_on_any_result_answers_or_errs(
                condition in expression_text(),
                result in any_result(),
            ) {
                let _ = evaluate(&result, Some(&condition), None);
            }

            #[test]
            fn any_time_expression_answers_or_errs(
                expression in prop_oneof![expression_text(), "\\PC{0,40}".boxed()],
                seconds in -1_000_000_000_000i64..1_000_000_000_000,
            ) {
                let now = Timestamp::from_second(seconds).unwrap_or(Timestamp::UNIX_EPOCH);
                let _ = eval_time(&expression, now);
            }

            /// Brackets beyond the limit are refused whatever surrounds them.
            #[test]
            fn nesting_over_the_limit_is_refused(
                depth in (MAX_EXPRESSION_NESTING + 1)..2000,
                open in prop_oneof![Just('('), Just('['), Just('{')],
            ) {
                let text: String = std::iter::repeat_n(open, depth).collect();
                let refused = matches!(
                    eval_condition(&Value::Nil, &text),
                    Err(ExpressionError::Bounds(
                        rollouts_crds::expression::BoundError::TooDeep { .. }
                    ))
                );
                prop_assert!(refused);
            }
        }
    }
}
