//! Writes to the Rollout's AnalysisRuns: create each run the plan composed (labelled so the
//! next plan finds it again), stop runs (`spec.terminate`), delete runs beyond the history
//! limits.

use kube::ResourceExt;
use rollouts_crds::analysis::{AnalysisRun, AnalysisRunSpec};
use rollouts_crds::rollout::{
    CONTROLLER_INSTANCE_ID_LABEL_KEY, DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY,
    ROLLOUT_CANARY_STEP_INDEX_LABEL, ROLLOUT_TYPE_LABEL, ROLLOUT_TYPE_STEP, Rollout,
};
use serde_json::json;

use super::Target;
use super::writer::{Created, Writer};
use crate::error::{Error, Result};
use crate::planner::{AnalysisRunToCreate, REVISION_ANNOTATION};

/// The AnalysisRun for `run` with its composed `spec`: labelled with its rollout type, step
/// and revision hash (and the Rollout's instance label), annotated with its revision, owned by
/// the Rollout.
pub fn analysis_run_for(
    target: &Target,
    rollout: &Rollout,
    run: &AnalysisRunToCreate,
    spec: AnalysisRunSpec,
) -> AnalysisRun {
    let mut analysis_run = AnalysisRun::new(&run.name, spec);
    let metadata = run
        .analysis
        .analysis_run_metadata
        .clone()
        .unwrap_or_default();
    let mut labels = metadata.labels.unwrap_or_default();
    labels.insert(ROLLOUT_TYPE_LABEL.into(), run.rollout_type.clone());
    if run.rollout_type == ROLLOUT_TYPE_STEP {
        labels.insert(
            ROLLOUT_CANARY_STEP_INDEX_LABEL.into(),
            run.step_index.to_string(),
        );
    }
    labels.insert(
        DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY.into(),
        run.pod_template_hash.clone(),
    );
    // As Argo: the run carries its Rollout's instance label, so the AnalysisRun controller of
    // the same `--instance-id` (and only that one) measures it.
    if let Some(instance) = rollout.labels().get(CONTROLLER_INSTANCE_ID_LABEL_KEY) {
        labels.insert(CONTROLLER_INSTANCE_ID_LABEL_KEY.into(), instance.clone());
    }
    analysis_run.metadata.namespace = Some(target.namespace.clone());
    analysis_run.metadata.labels = Some(labels);
    let mut annotations = metadata.annotations.unwrap_or_default();
    if let Some(revision) = &run.revision {
        annotations.insert(REVISION_ANNOTATION.into(), revision.clone());
    }
    analysis_run.metadata.annotations = (!annotations.is_empty()).then_some(annotations);
    analysis_run.metadata.owner_references = Some(vec![target.owner.clone()]);
    analysis_run
}

/// Creates the run; one created by an earlier attempt whose status write was lost is left as
/// it is (the next plan finds it).
pub(super) async fn create(
    writer: &Writer<'_>,
    rollout: &Rollout,
    run: &AnalysisRunToCreate,
) -> Result<()> {
    let target = writer.target;
    let Some(spec) = run.spec.clone() else {
        // The planner composes every run whose templates were observed; observe reads them
        // whenever the spec names any.
        return Err(Error::InvalidAnalysis {
            namespace: target.namespace.clone(),
            rollout: target.name.clone(),
            field: run.field(),
            reason: format!(
                "the templates of AnalysisRun {} were not read before planning",
                run.name
            ),
        });
    };
    let analysis_run = analysis_run_for(target, rollout, run, spec);
    if let Created::Created(_) = writer.create(&analysis_run).await? {
        tracing::info!(analysis_run = %run.name, step = run.step_index, "created AnalysisRun");
    }
    Ok(())
}

pub(super) async fn terminate(writer: &Writer<'_>, name: &str) -> Result<()> {
    let patch = json!({ "spec": { "terminate": true } });
    if writer
        .patch_if_present::<AnalysisRun>("terminate", name, &patch)
        .await?
        .is_some()
    {
        tracing::info!(analysis_run = %name, "terminated AnalysisRun");
    }
    Ok(())
}

/// Deletes a finished run beyond the Rollout's run history limits; one already gone is fine.
pub(super) async fn delete(writer: &Writer<'_>, name: &str) -> Result<()> {
    writer.delete::<AnalysisRun>(name).await?;
    tracing::info!(analysis_run = %name, "deleted AnalysisRun beyond the run history limits");
    Ok(())
}
