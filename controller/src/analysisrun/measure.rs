//! Taking the measurements that are due: secrets read first, each metric measured by its one
//! provider, provider failures turned into Error measurements, measurements counted.

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use rollouts_analysis::args;
use rollouts_analysis::engine::{self, MeasurementTask, Outcome, Schedule, TakenMeasurement};
use rollouts_analysis::provider::{
    self, BaselineJudgeProvider, MAX_TIMEOUT, MetricProvider, Redactor, RunContext,
};
use rollouts_crds::analysis::{AnalysisRun, AnalysisRunSpec, AnalysisRunStatus, Metric};
use serde_json::Value;

use super::arguments::{SecretError, read_secrets};
use super::bounds::MEASUREMENT_GRACE;
use super::context::AnalysisContext;
use super::{Result, budget};

/// Takes the measurements of `schedule` (secrets read first, only when one is due) and
/// concludes. A provider failure is an Error measurement; a secret that does not exist ends
/// the run in Error, as in Argo; an API failure reading one is retried.
pub(super) async fn measure(
    run: &AnalysisRun,
    namespace: &str,
    spec: &AnalysisRunSpec,
    status: &AnalysisRunStatus,
    schedule: &Schedule,
    now: Timestamp,
    ctx: &AnalysisContext,
) -> Result<Outcome> {
    if schedule.tasks.is_empty() {
        return Ok(engine::conclude(spec, status, schedule, Vec::new(), now));
    }
    let secrets = read_secrets(run, namespace, spec, ctx).await?;
    let values = match args::values(&spec.args, |secret| {
        secrets
            .get(&(secret.name.clone(), secret.key.clone()))
            .cloned()
            .unwrap_or(Err(SecretError::NotRead))
            .map_err(|e| e.to_string())
    }) {
        Ok(values) => values,
        Err(e) => {
            let message = format!("Unable to resolve metric arguments: {e}");
            return Ok(engine::invalid(status, &message, now));
        }
    };
    let redactor = Redactor::new(secrets.values().filter_map(|v| v.as_ref().ok()));
    let name = run.name_any();
    let uid = run.uid().unwrap_or_default();
    let context = RunContext {
        namespace,
        run_name: &name,
        run_uid: &uid,
        measurement_number: 1,
        now,
    };
    // A run's measurements go at most `per_run` at a time, each holding one of the
    // controller's measurement slots while its provider works.
    let measurements: Vec<_> = schedule
        .tasks
        .iter()
        .map(|task| Box::pin(take(ctx, context, task, &values, &redactor)))
        .collect();
    let taken: Vec<TakenMeasurement> = futures::stream::iter(measurements)
        .buffered(ctx.limits.per_run())
        .collect()
        .await;
    let mut outcome = engine::conclude(spec, status, schedule, taken, now);
    redactor.outcome(&mut outcome);
    Ok(outcome)
}

/// Takes one measurement with the metric's provider; never fails (see [`provider::take`]).
async fn take(
    ctx: &AnalysisContext,
    run: RunContext<'_>,
    task: &MeasurementTask,
    values: &args::ArgValues,
    redactor: &Redactor,
) -> TakenMeasurement {
    let mut taken = match args::resolve_metric(&task.metric, values) {
        Err(e) => {
            ctx.metrics.measured("Unknown", "Error");
            provider::provider_failed(task, e.to_string(), run.now)
        }
        Ok(metric) => match provider_kind(&metric) {
            Ok(ProviderKind::Prometheus) => {
                let address = metric
                    .provider
                    .prometheus
                    .as_ref()
                    .and_then(|p| p.address.as_deref());
                let prometheus = ctx.prometheus_for(address);
                take_with(ctx, &prometheus, run, task, &metric).await
            }
            Ok(ProviderKind::Web) => take_with(ctx, &ctx.web, run, task, &metric).await,
            Ok(ProviderKind::Job) => take_with(ctx, &ctx.job, run, task, &metric).await,
            Ok(ProviderKind::Judge) => {
                let address = metric
                    .provider
                    .judge
                    .as_ref()
                    .and_then(|j| j.pointer("/prometheus/address"))
                    .and_then(Value::as_str);
                let judge = BaselineJudgeProvider::new(ctx.prometheus_for(address));
                take_with(ctx, &judge, run, task, &metric).await
            }
            Err(e) => {
                ctx.metrics.measured("Unknown", "Error");
                provider::provider_failed(task, e.to_string(), run.now)
            }
        },
    };
    // Cut before redacting, so that a secret cut in two here is cut off whole later.
    budget::precut(&mut taken.measurement);
    for value in taken.metadata.values_mut() {
        budget::truncate(value, budget::MAX_TEXT.saturating_mul(2));
    }
    redactor.taken(&mut taken);
    taken
}

async fn take_with(
    ctx: &AnalysisContext,
    provider: &dyn MetricProvider,
    run: RunContext<'_>,
    task: &MeasurementTask,
    metric: &Metric,
) -> TakenMeasurement {
    // The semaphore is never closed; were it, measuring without a slot is still bounded.
    let _slot = ctx.measurement_slots.acquire().await.ok();
    let limit = MAX_TIMEOUT.saturating_add(MEASUREMENT_GRACE);
    let taken = match tokio::time::timeout(limit, provider::take(provider, run, task, metric)).await
    {
        Ok(taken) => taken,
        Err(_) => provider::provider_failed(
            task,
            format!(
                "the {} provider gave no answer within {}s, the most a measurement may take: check that it is reachable and answers faster, or lower the metric's timeout",
                provider.kind(),
                limit.as_secs()
            ),
            run.now,
        ),
    };
    ctx.metrics
        .measured(provider.kind(), taken.measurement.phase.as_str());
    taken
}

/// The providers this controller runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderKind {
    Prometheus,
    Web,
    Job,
    Judge,
}

/// Why no provider of this controller can measure a metric; the run records it as an Error
/// measurement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderChoiceError {
    #[error(
        "metric {metric:?}: provider.{provider} is not supported by this controller: measure it with provider.prometheus, web, job or judge"
    )]
    Unsupported { metric: String, provider: String },
    #[error("metric {metric:?} has no provider: set one of provider.prometheus, web, job or judge")]
    NoProvider { metric: String },
    #[error("metric {metric:?} sets several providers ({}): keep exactly one", .providers.join(", "))]
    SeveralProviders {
        metric: String,
        providers: Vec<String>,
    },
}

/// Which provider measures `metric`, or why none can.
pub fn provider_kind(metric: &Metric) -> Result<ProviderKind, ProviderChoiceError> {
    let configured = metric.provider.configured();
    match configured.as_slice() {
        [one] => match one.as_str() {
            "prometheus" => Ok(ProviderKind::Prometheus),
            "web" => Ok(ProviderKind::Web),
            "job" => Ok(ProviderKind::Job),
            "judge" => Ok(ProviderKind::Judge),
            other => Err(ProviderChoiceError::Unsupported {
                metric: metric.name.clone(),
                provider: other.to_string(),
            }),
        },
        [] => Err(ProviderChoiceError::NoProvider {
            metric: metric.name.clone(),
        }),
        many => Err(ProviderChoiceError::SeveralProviders {
            metric: metric.name.clone(),
            providers: many.to_vec(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use rollouts_crds::analysis::{MetricProvider as Providers, PrometheusMetric, WebMetric};

    use super::*;

    #[test]
    fn a_metric_is_measured_by_its_one_provider() {
        let metric = |provider: Providers| Metric {
            name: "m".into(),
            provider,
            ..Metric::default()
        };
        let prometheus = Providers {
            prometheus: Some(PrometheusMetric::default()),
            ..Providers::default()
        };
        assert_eq!(
            provider_kind(&metric(prometheus.clone())),
            Ok(ProviderKind::Prometheus)
        );
        let web = Providers {
            web: Some(WebMetric::default()),
            ..Providers::default()
        };
        assert_eq!(provider_kind(&metric(web)), Ok(ProviderKind::Web));
        let judge = Providers {
            judge: Some(serde_json::json!({})),
            ..Providers::default()
        };
        assert_eq!(provider_kind(&metric(judge)), Ok(ProviderKind::Judge));
        let datadog = Providers {
            datadog: Some(serde_json::json!({})),
            ..Providers::default()
        };
        let message = provider_kind(&metric(datadog))
            .expect_err("not implemented here")
            .to_string();
        assert!(
            message.contains("provider.datadog is not supported"),
            "{message}"
        );
        let message = provider_kind(&metric(Providers::default()))
            .expect_err("none set")
            .to_string();
        assert!(message.contains("has no provider"), "{message}");
        let both = Providers {
            web: Some(WebMetric::default()),
            ..prometheus
        };
        let message = provider_kind(&metric(both))
            .expect_err("two set")
            .to_string();
        assert!(message.contains("prometheus, web"), "{message}");
    }
}
