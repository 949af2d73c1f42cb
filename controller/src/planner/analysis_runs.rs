//! What both strategies do with the AnalysisRuns they start and read: one way to keep a status pointer in step with its run, with an event on
//! each phase change (Argo's `emitAnalysisRunStatusChanges`, for step, background, pre- and
//! post-promotion runs alike); and the spec of each run a plan creates, composed from the
//! templates observed for it.

use rollouts_analysis::compose;
use rollouts_crds::FieldError;
use rollouts_crds::analysis::AnalysisPhase;
use rollouts_crds::rollout::{
    AnalysisRunArgument, ROLLOUT_TYPE_BACKGROUND, ROLLOUT_TYPE_POST_PROMOTION,
    ROLLOUT_TYPE_PRE_PROMOTION, Rollout, RolloutAnalysisRunStatus, ValueFromPodTemplateHash,
};
use serde_json::Value;

use super::status::Outbox;
use super::{
    AnalysisRunToCreate, EventType, Observed, ObservedAnalysisRun, Plan, REVISION_ANNOTATION,
};

/// The status pointer of a run this plan creates.
pub(super) fn pending_pointer(name: &str) -> RolloutAnalysisRunStatus {
    RolloutAnalysisRunStatus {
        name: name.to_string(),
        status: AnalysisPhase::Pending.as_str().into(),
        message: String::new(),
    }
}

/// The status pointer for `run`, with an `AnalysisRun<Phase>` event when its phase differs
/// from what `before` recorded for it. `kind` names the run in the event as Argo does: `Step`,
/// `Background`, `PrePromotion`, `PostPromotion`.
pub(super) fn record_run_phase(
    out: &mut Outbox,
    kind: &str,
    before: Option<&RolloutAnalysisRunStatus>,
    run: &ObservedAnalysisRun,
) -> RolloutAnalysisRunStatus {
    let phase = run.phase.as_str();
    let previous = before
        .filter(|pointer| pointer.name == run.name)
        .map(|pointer| pointer.status.clone())
        .unwrap_or_default();
    if previous != phase {
        let type_ = match run.phase {
            AnalysisPhase::Failed | AnalysisPhase::Error => EventType::Warning,
            _ => EventType::Normal,
        };
        out.event(
            type_,
            &format!("AnalysisRun{phase}"),
            format!(
                "{kind} Analysis Run '{}' Status New: '{phase}' Previous: '{previous}'",
                run.name
            ),
        );
    }
    RolloutAnalysisRunStatus {
        name: run.name.clone(),
        status: phase.into(),
        message: run.message.clone(),
    }
}

/// Gives each run this plan creates its spec, composed from the templates observed for it (with
/// `Stable`/`Latest` hashes and field references turned into argument values), and the revision
/// it analyses. A template that does not exist, an argument that cannot be resolved or
/// templates that do not compose are the error, naming the Rollout field of the analysis.
/// Without observed templates (`Observed::analysis_templates` is `None`) runs keep no spec.
pub(super) fn complete_runs(
    rollout: &Rollout,
    observed: &Observed,
    plan: &mut Plan,
) -> Result<(), FieldError> {
    let revisions: Vec<Option<String>> = plan
        .create_analysis_runs
        .iter()
        .map(|run| run_revision(plan, observed, &run.pod_template_hash))
        .collect();
    for (run, revision) in plan.create_analysis_runs.iter_mut().zip(revisions) {
        run.revision = revision;
        let Some(templates) = observed.analysis_templates.as_ref() else {
            continue;
        };
        let field = run.field();
        let invalid = |reason: String| {
            FieldError::new(
                field.clone(),
                reason,
                "create the templates it names and give every argument a value",
            )
        };
        let gathered = compose::gather(run.analysis.templates(), |reference| {
            templates.lookup(reference)
        })
        .map_err(invalid)?;
        let args = resolve_rollout_args(rollout, run).map_err(invalid)?;
        let spec = compose::run_spec(
            &gathered,
            &args,
            run.analysis.dry_run.as_deref().unwrap_or_default(),
            run.analysis
                .measurement_retention
                .as_deref()
                .unwrap_or_default(),
        )
        .map_err(|error| invalid(error.to_string()))?;
        run.spec = Some(spec);
    }
    Ok(())
}

impl AnalysisRunToCreate {
    /// The Rollout field that asks for the run, for messages.
    pub fn field(&self) -> String {
        match self.rollout_type.as_str() {
            ROLLOUT_TYPE_PRE_PROMOTION => {
                "spec.strategy.blueGreen.prePromotionAnalysis".to_string()
            }
            ROLLOUT_TYPE_POST_PROMOTION => {
                "spec.strategy.blueGreen.postPromotionAnalysis".to_string()
            }
            ROLLOUT_TYPE_BACKGROUND => "spec.strategy.canary.analysis".to_string(),
            _ => format!("spec.strategy.canary.steps[{}].analysis", self.step_index),
        }
    }
}

/// The revision of the ReplicaSet a run analyses (the one this plan creates, revises, or an
/// existing one), which Argo writes on the run so tools group runs under their revision.
fn run_revision(plan: &Plan, observed: &Observed, hash: &str) -> Option<String> {
    if let Some(new) = plan
        .create_replica_set
        .as_ref()
        .filter(|new| new.pod_template_hash == hash)
    {
        return Some(new.revision.to_string());
    }
    let rs = observed
        .replica_sets
        .iter()
        .find(|rs| rs.pod_template_hash == hash)?;
    if let Some(revise) = plan
        .revise_replica_set
        .as_ref()
        .filter(|revise| revise.name == rs.name)
    {
        return Some(revise.revision.to_string());
    }
    rs.annotations.get(REVISION_ANNOTATION).cloned()
}

/// The step's arguments with `podTemplateHashValue` and `fieldRef` turned into values, as the
/// Rollout resolves them before a run exists.
fn resolve_rollout_args(
    rollout: &Rollout,
    run: &AnalysisRunToCreate,
) -> Result<Vec<AnalysisRunArgument>, String> {
    resolve_args(
        rollout,
        run.analysis.args.as_deref().unwrap_or_default(),
        &run.pod_template_hash,
        &run.stable_pod_template_hash,
    )
}

/// `args` with `podTemplateHashValue` (`Latest`: `latest`, `Stable`: `stable`) and `fieldRef`
/// turned into values (Argo's `BuildArgumentsForRolloutAnalysisRun`); other arguments as written.
pub(super) fn resolve_args(
    rollout: &Rollout,
    args: &[AnalysisRunArgument],
    latest: &str,
    stable: &str,
) -> Result<Vec<AnalysisRunArgument>, String> {
    let rollout_json = serde_json::to_value(rollout).map_err(|e| e.to_string())?;
    let mut resolved = Vec::new();
    for arg in args {
        let mut arg = arg.clone();
        if let Some(from) = arg.value_from.clone() {
            if let Some(which) = from.pod_template_hash_value {
                arg.value = Some(match which {
                    ValueFromPodTemplateHash::Stable => stable.to_string(),
                    ValueFromPodTemplateHash::Latest => latest.to_string(),
                });
                arg.value_from = None;
            } else if let Some(field_ref) = from.field_ref {
                let value = field_value(&rollout_json, &field_ref.field_path).ok_or_else(|| {
                    format!(
                        "args[{:?}].valueFrom.fieldRef.fieldPath {:?} does not name a field of the Rollout",
                        arg.name, field_ref.field_path
                    )
                })?;
                arg.value = Some(value);
                arg.value_from = None;
            }
        }
        resolved.push(arg);
    }
    Ok(resolved)
}

/// The value at a field path such as `metadata.name`, `spec.replicas` or
/// `metadata.labels['app.kubernetes.io/name']` (the key in brackets may hold dots and
/// slashes). A key missing from a map (or a Rollout without labels or annotations) is empty,
/// as Kubernetes' field paths read it and Argo passes it on; any other field that is not there
/// is None.
fn field_value(object: &Value, path: &str) -> Option<String> {
    let (fields, key) = match path.split_once("['") {
        Some((fields, rest)) => (fields, Some(rest.strip_suffix("']")?)),
        None => (path, None),
    };
    let mut current = object;
    for field in fields.split('.') {
        match current.get(field) {
            Some(next) => current = next,
            // A Rollout without labels or annotations has none of their keys.
            None if key.is_some()
                && matches!(fields, "metadata.labels" | "metadata.annotations") =>
            {
                return Some(String::new());
            }
            None => return None,
        }
    }
    if let Some(key) = key {
        return match current.get(key) {
            Some(Value::String(text)) => Some(text.clone()),
            Some(Value::Null) | None => current.is_object().then(String::new),
            Some(other) => Some(other.to_string()),
        };
    }
    match current {
        Value::String(text) => Some(text.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use rollouts_crds::rollout::{
        ArgumentValueFrom, CanaryStep, FieldRef, ROLLOUT_TYPE_STEP, RolloutAnalysis,
    };
    use serde_json::json;

    use super::*;

    #[test]
    fn hash_and_field_arguments_become_values() {
        let rollout = Rollout::test_canary("web", vec![CanaryStep::analysis("errors")]);
        let run = AnalysisRunToCreate {
            name: "web-abc-2-0".into(),
            step_index: 0,
            rollout_type: ROLLOUT_TYPE_STEP.into(),
            pod_template_hash: "abc".into(),
            stable_pod_template_hash: "xyz".into(),
            spec: None,
            revision: None,
            analysis: RolloutAnalysis {
                args: Some(vec![
                    AnalysisRunArgument {
                        name: "canary-hash".into(),
                        value: None,
                        value_from: Some(ArgumentValueFrom {
                            pod_template_hash_value: Some(ValueFromPodTemplateHash::Latest),
                            ..ArgumentValueFrom::default()
                        }),
                    },
                    AnalysisRunArgument {
                        name: "stable-hash".into(),
                        value: None,
                        value_from: Some(ArgumentValueFrom {
                            pod_template_hash_value: Some(ValueFromPodTemplateHash::Stable),
                            ..ArgumentValueFrom::default()
                        }),
                    },
                    AnalysisRunArgument {
                        name: "app".into(),
                        value: None,
                        value_from: Some(ArgumentValueFrom {
                            field_ref: Some(FieldRef {
                                field_path: "metadata.name".into(),
                            }),
                            ..ArgumentValueFrom::default()
                        }),
                    },
                ]),
                ..RolloutAnalysis::default()
            },
        };
        let args = resolve_rollout_args(&rollout, &run).expect("resolves");
        let values: Vec<(&str, Option<&str>)> = args
            .iter()
            .map(|a| (a.name.as_str(), a.value.as_deref()))
            .collect();
        assert_eq!(
            values,
            vec![
                ("canary-hash", Some("abc")),
                ("stable-hash", Some("xyz")),
                ("app", Some("web")),
            ]
        );
        assert!(args.iter().all(|a| a.value_from.is_none()));
    }

    #[test]
    fn field_paths_reach_into_label_maps() {
        let object = json!({"metadata": {"name": "web", "labels": {"team": "shop"}}, "spec": {"replicas": 4}});
        assert_eq!(
            field_value(&object, "metadata.labels['team']").as_deref(),
            Some("shop")
        );
        assert_eq!(field_value(&object, "spec.replicas").as_deref(), Some("4"));
        assert_eq!(
            field_value(&object, "metadata.labels['absent']").as_deref(),
            Some("")
        );
        assert_eq!(field_value(&object, "spec.absent"), None);
        assert_eq!(
            field_value(&object, "metadata.annotations['absent']").as_deref(),
            Some("")
        );
    }

    #[test]
    fn a_bracketed_key_may_hold_dots_and_slashes() {
        let object = json!({"metadata": {"labels": {"app.kubernetes.io/name": "checkout"}}});
        assert_eq!(
            field_value(&object, "metadata.labels['app.kubernetes.io/name']").as_deref(),
            Some("checkout")
        );
        assert_eq!(
            field_value(&object, "metadata.labels['app.kubernetes.io/part-of']").as_deref(),
            Some("")
        );
        assert_eq!(field_value(&object, "metadata.labels['unclosed"), None);
    }
}
