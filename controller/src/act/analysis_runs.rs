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

/// The AnalysisRun for `run` with its composed `spec`: labelled with the Rollout's selector
/// labels (as Argo's `newAnalysisRunFromRollout` does, so tools that select a workload's
/// objects by its selector find its runs too), its rollout type, step and revision hash (and
/// the Rollout's instance label), annotated with its revision, owned by the Rollout.
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
    // Argo lets the selector labels override `analysisRunMetadata`'s; the labels below, which
    // the next plan finds its runs by, override both.
    if let Some(selector) = rollout
        .spec
        .selector
        .as_ref()
        .and_then(|s| s.match_labels.as_ref())
    {
        labels.extend(selector.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rollouts_crds::rollout::{AnalysisRunMetadata, CanaryStep, RolloutAnalysis};

    use super::*;

    #[test]
    fn a_run_carries_the_rollout_selector_labels_under_its_own() {
        let mut rollout = Rollout::test_canary("web", vec![CanaryStep::analysis("rate")]);
        rollout.metadata.uid = Some("uid-1".into());
        let run = AnalysisRunToCreate {
            name: "web-abc-1-0".into(),
            step_index: 0,
            rollout_type: ROLLOUT_TYPE_STEP.into(),
            pod_template_hash: "abc".into(),
            stable_pod_template_hash: "def".into(),
            analysis: RolloutAnalysis {
                analysis_run_metadata: Some(AnalysisRunMetadata {
                    labels: Some(BTreeMap::from([
                        ("app".to_string(), "overridden".to_string()),
                        ("team".to_string(), "shop".to_string()),
                        (ROLLOUT_TYPE_LABEL.to_string(), "Mine".to_string()),
                    ])),
                    annotations: None,
                }),
                ..RolloutAnalysis::default()
            },
            spec: None,
            revision: Some("1".into()),
        };
        let target = Target::of(&rollout).unwrap();
        let made = analysis_run_for(&target, &rollout, &run, AnalysisRunSpec::default());
        let labels = made.metadata.labels.unwrap();
        // The selector (`app: web`) overrides analysisRunMetadata, as in Argo; the labels the
        // next plan finds the run by override both.
        assert_eq!(labels["app"], "web");
        assert_eq!(labels["team"], "shop");
        assert_eq!(labels[ROLLOUT_TYPE_LABEL], ROLLOUT_TYPE_STEP);
        assert_eq!(labels[ROLLOUT_CANARY_STEP_INDEX_LABEL], "0");
        assert_eq!(labels[DEFAULT_ROLLOUT_UNIQUE_LABEL_KEY], "abc");
    }
}
