//! Writes to the Services the spec names: each is pointed at a revision by merge-patching its
//! selector and its `managed-by-rollouts` annotation, only when it selects another revision or
//! the annotation names another Rollout.

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use rollouts_crds::rollout::{DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY, MANAGED_BY_ROLLOUTS_KEY, Rollout};
use serde_json::json;

use super::writer::Writer;
use crate::error::{Error, Result};
use crate::observe::{LiveServices, service_field};
use crate::planner::ServiceSelector;

/// Points a Service at a revision: merge-patches its selector (and the annotation naming this
/// Rollout) only when it selects another revision or the annotation names another Rollout.
pub(super) async fn point(
    writer: &Writer<'_>,
    rollout: &Rollout,
    services: &LiveServices,
    selector: &ServiceSelector,
) -> Result<()> {
    let target = writer.target;
    let Some(service) = services.get(&selector.service) else {
        return Err(Error::ServiceNotFound {
            namespace: target.namespace.clone(),
            rollout: target.name.clone(),
            service: selector.service.clone(),
            field: service_field(rollout, &selector.service),
        });
    };
    let live = service
        .spec
        .as_ref()
        .and_then(|spec| spec.selector.as_ref())
        .and_then(|labels| labels.get(DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY));
    // The annotation names the Rollout that drives the Service (Argo's rule, which the
    // planner applies): written with the selector, and again should it name another Rollout.
    let annotated = service.annotations().get(MANAGED_BY_ROLLOUTS_KEY) == Some(&target.name);
    if live == Some(&selector.pod_template_hash) && annotated {
        return Ok(());
    }
    let patch = json!({
        "metadata": { "annotations": { MANAGED_BY_ROLLOUTS_KEY: target.name } },
        "spec": { "selector": { DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY: selector.pod_template_hash } },
    });
    writer
        .patch::<Service>("patch selector of", &selector.service, &patch)
        .await?;
    tracing::info!(service = %selector.service, hash = %selector.pod_template_hash, "pointed Service");
    Ok(())
}
