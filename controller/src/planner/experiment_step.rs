//! The canary `experiment` step (Argo's `reconcileExperiments`). The current step's Experiment
//! is created from the step, each template running the pod template of the stable or canary
//! ReplicaSet its `specRef` names; its phase decides the step: Successful moves on, Failed or
//! Error aborts the update, Inconclusive pauses it for a person (who resumes it into a new
//! Experiment). Every other Experiment of the Rollout that still runs is terminated (a new
//! revision, an abort, a full promotion, steps moved on), and finished ones beyond the
//! `spec.analysis` history limits, or of revisions no longer kept, are deleted.
//! `status.canary.currentExperiment` names the step's Experiment while it runs, and is the
//! checkpoint that finds it again: it is written before the Experiment is created.

use std::cmp::Reverse;

use rollouts_crds::FieldError;
use rollouts_crds::analysis::AnalysisPhase;
use rollouts_crds::rollout::{Rollout, RolloutExperimentStep, RolloutStatus, WeightDestination};

use super::analysis_runs::resolve_args;
use super::run_history;
use super::status::Outbox;
use super::{
    EventType, ExperimentToCreate, Observed, ObservedExperiment, ObservedReplicaSet, Plan,
};

/// Event reason when the step creates its Experiment (Argo's).
pub(super) const EXPERIMENT_CREATED_REASON: &str = "ExperimentCreated";

/// What the canary planner knows that the step needs.
pub(super) struct StepInputs<'a> {
    pub rollout: &'a Rollout,
    pub observed: &'a Observed,
    /// The current step's index and experiment, when the current step is an experiment.
    pub step: Option<(i32, &'a RolloutExperimentStep)>,
    pub current_hash: &'a str,
    /// The current revision's number, which names the Experiment.
    pub revision: i64,
    pub new_rs: Option<&'a ObservedReplicaSet>,
    /// The stable ReplicaSet, when it is not the current revision's.
    pub stable_rs: Option<&'a ObservedReplicaSet>,
    /// Aborted, promoted in full, fully promoted or a first deploy: every Experiment stops.
    pub cancel_all: bool,
    /// The update is paused: no new Experiment starts until a person resumes it.
    pub paused: bool,
    /// An inconclusive analysis paused the update: Experiments are left as they are (Argo).
    pub inconclusive_analysis: bool,
    /// `status.canary.currentExperiment` as this plan found it.
    pub recorded: &'a str,
}

/// What the step's Experiment says of the step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) enum Outcome {
    /// No experiment step, or its Experiment is not finished (or not created yet).
    #[default]
    Waiting,
    Successful,
    /// Pause for a person (`InconclusiveExperiment`).
    Inconclusive,
    /// Abort the update, with this message.
    Failed(String),
}

/// The step's state for the rest of the canary plan.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct StepState {
    pub outcome: Outcome,
    /// The running Experiment's weighted templates: their share of traffic.
    pub destinations: Vec<WeightDestination>,
}

/// Plans the step's Experiment (create, read its phase) and the termination of every other
/// running one; `next.canary.currentExperiment` names the step's Experiment while it is not
/// finished, or finished successfully (the step moving on clears it). An argument that cannot
/// be resolved is the error, naming its field.
pub(super) fn reconcile(
    inputs: &StepInputs,
    plan: &mut Plan,
    next: &mut RolloutStatus,
    out: &mut Outbox,
) -> Result<StepState, FieldError> {
    let experiments = &inputs.observed.experiments;
    let running = |ex: &&ObservedExperiment| !ex.finished() && !ex.terminating;
    if inputs.cancel_all {
        next.canary.current_experiment.clear();
        plan.terminate_experiments = experiments
            .iter()
            .filter(running)
            .map(|ex| ex.name.clone())
            .collect();
        return Ok(StepState::default());
    }
    if inputs.inconclusive_analysis {
        return Ok(StepState::default());
    }
    let mut state = StepState::default();
    let mut current: Option<String> = None;
    next.canary.current_experiment.clear();
    if let Some((index, step)) = inputs.step {
        let base = base_name(inputs, index);
        let of_step = |ex: &&ObservedExperiment| {
            ex.pod_template_hash == inputs.current_hash && named_after(&ex.name, &base)
        };
        // A running one wins (it may have been created just before a restart), then the one
        // status names.
        let in_flight = experiments
            .iter()
            .filter(of_step)
            .filter(running)
            .max_by_key(|ex| (ex.created, ex.name.clone()));
        let recorded = experiments
            .iter()
            .filter(of_step)
            .find(|ex| !inputs.recorded.is_empty() && ex.name == inputs.recorded);
        match in_flight.or(recorded) {
            None if inputs.paused => {}
            None => {
                // Argo waits for the stable ReplicaSet too: the step copies both templates.
                if let (Some(new_rs), Some(stable_rs)) = (inputs.new_rs, inputs.stable_rs) {
                    let name = unused_name(inputs.observed, &base);
                    plan.create_experiments.push(experiment_to_create(
                        inputs, &name, index, step, new_rs, stable_rs,
                    )?);
                    next.canary.current_experiment = name.clone();
                    out.event(
                        EventType::Normal,
                        EXPERIMENT_CREATED_REASON,
                        format!("Created Experiment '{name}'"),
                    );
                    current = Some(name);
                }
            }
            Some(experiment) => {
                current = Some(experiment.name.clone());
                match experiment.phase {
                    Some(AnalysisPhase::Inconclusive) => state.outcome = Outcome::Inconclusive,
                    Some(AnalysisPhase::Failed | AnalysisPhase::Error) => {
                        let mut message = String::from("Experiment analysis phase is error/failed");
                        if !experiment.message.is_empty() {
                            message = format!("{message}: {}", experiment.message);
                        }
                        state.outcome = Outcome::Failed(message);
                    }
                    Some(AnalysisPhase::Successful) => {
                        state.outcome = Outcome::Successful;
                        next.canary.current_experiment = experiment.name.clone();
                    }
                    phase => {
                        next.canary.current_experiment = experiment.name.clone();
                        if phase == Some(AnalysisPhase::Running) {
                            state.destinations = destinations(step, experiment);
                        }
                    }
                }
            }
        }
    }
    plan.terminate_experiments = experiments
        .iter()
        .filter(running)
        .filter(|ex| current.as_deref() != Some(ex.name.as_str()))
        .map(|ex| ex.name.clone())
        .collect();
    Ok(state)
}

/// `<rollout>-<hash>-<revision>-<step>`, as Argo names a step's Experiment.
fn base_name(inputs: &StepInputs, index: i32) -> String {
    format!(
        "{}-{}-{}-{index}",
        inputs.rollout.metadata.name.as_deref().unwrap_or_default(),
        inputs.current_hash,
        inputs.revision
    )
}

/// `name` is `base`, or `base-N` (Argo's name for the next Experiment of the same step).
fn named_after(name: &str, base: &str) -> bool {
    match name.strip_prefix(base) {
        Some("") => true,
        Some(rest) => rest
            .strip_prefix('-')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())),
        None => false,
    }
}

/// `base`, or `base-N` with the first N no observed Experiment is named.
fn unused_name(observed: &Observed, base: &str) -> String {
    let taken = |name: &str| observed.experiments.iter().any(|ex| ex.name == name);
    if !taken(base) {
        return base.to_string();
    }
    (1..)
        .map(|n| format!("{base}-{n}"))
        .find(|name| !taken(name))
        .unwrap_or_else(|| base.to_string())
}

/// The Experiment for the step, its analyses' hash and field arguments resolved.
fn experiment_to_create(
    inputs: &StepInputs,
    name: &str,
    index: i32,
    step: &RolloutExperimentStep,
    new_rs: &ObservedReplicaSet,
    stable_rs: &ObservedReplicaSet,
) -> Result<ExperimentToCreate, FieldError> {
    let mut step = step.clone();
    for (a, analysis) in step.analyses.iter_mut().flatten().enumerate() {
        if let Some(args) = analysis.args.as_mut() {
            *args = resolve_args(
                inputs.rollout,
                args,
                inputs.current_hash,
                &stable_rs.pod_template_hash,
            )
            .map_err(|reason| {
                FieldError::new(
                    format!("spec.strategy.canary.steps[{index}].experiment.analyses[{a}].args"),
                    reason,
                    "give every argument a value the Rollout can resolve",
                )
            })?;
        }
    }
    Ok(ExperimentToCreate {
        name: name.to_string(),
        step_index: index,
        pod_template_hash: inputs.current_hash.to_string(),
        revision: inputs.revision.to_string(),
        canary_replica_set: new_rs.name.clone(),
        stable_replica_set: stable_rs.name.clone(),
        step,
    })
}

/// Argo's `calculateWeightDestinationsFromExperiment`: each template of the step with a
/// `weight`, at the Service and pod-template hash its status reports; one whose Service the
/// status does not report yet gets no traffic until it does.
fn destinations(
    step: &RolloutExperimentStep,
    experiment: &ObservedExperiment,
) -> Vec<WeightDestination> {
    experiment
        .templates
        .iter()
        .filter_map(|template| {
            let weight = step
                .templates
                .iter()
                .find(|t| t.name == template.name)?
                .weight?;
            if template.service_name.is_empty() {
                return None;
            }
            Some(WeightDestination {
                weight,
                service_name: template.service_name.clone(),
                pod_template_hash: template.pod_template_hash.clone(),
            })
        })
        .collect()
}

/// Argo's `FilterExperimentsToDelete`: of the Experiments other than the current one, those
/// without a revision label or whose revision's ReplicaSet is gone, and the finished ones beyond
/// `successfulRunHistoryLimit` (Successful) or `unsuccessfulRunHistoryLimit` (Failed, Error,
/// Inconclusive), newest kept.
pub(super) fn experiments_to_delete(
    rollout: &Rollout,
    observed: &Observed,
    plan: &Plan,
) -> Vec<String> {
    let current = plan.status.canary.current_experiment.as_str();
    let mut others: Vec<&ObservedExperiment> = observed
        .experiments
        .iter()
        .filter(|ex| ex.name != current)
        .collect();
    others.sort_by_key(|ex| Reverse((ex.created, ex.name.clone())));
    let (successful_limit, unsuccessful_limit) = run_history::history_limits(rollout);
    let (mut successful, mut unsuccessful) = (0, 0);
    let mut delete = Vec::new();
    for ex in others {
        let beyond_limit = match ex.phase {
            _ if !run_history::revision_kept(observed, plan, &ex.pod_template_hash) => true,
            Some(AnalysisPhase::Successful) => {
                successful += 1;
                successful > successful_limit
            }
            Some(AnalysisPhase::Failed | AnalysisPhase::Error | AnalysisPhase::Inconclusive) => {
                unsuccessful += 1;
                unsuccessful > unsuccessful_limit
            }
            _ => false,
        };
        if beyond_limit {
            delete.push(ex.name.clone());
        }
    }
    delete
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::jiff::Timestamp;
    use rollouts_crds::conditions::PAUSE_REASON_INCONCLUSIVE_EXPERIMENT;
    use rollouts_crds::rollout::{
        AnalysisRunStrategy, ArgumentValueFrom, CanaryStep, IstioTrafficRouting,
        IstioVirtualService, RolloutExperimentStepAnalysisTemplateRef, RolloutExperimentTemplate,
        RolloutTrafficRouting, ValueFromPodTemplateHash,
    };

    use super::*;
    use crate::planner::ObservedExperimentTemplate;
    use crate::planner::test_world::{apply_to_rollout, apply_writes, at};

    /// `experiment` step: a baseline of the stable template and a canary of the canary
    /// template, one pod each, judged by `judge` with both revisions' hashes.
    fn experiment_step(weight: Option<i32>) -> CanaryStep {
        let template = |name: &str, spec_ref: &str| RolloutExperimentTemplate {
            name: name.into(),
            spec_ref: spec_ref.into(),
            replicas: Some(1),
            weight,
            ..RolloutExperimentTemplate::default()
        };
        let hash_arg = |name: &str, which| rollouts_crds::rollout::AnalysisRunArgument {
            name: name.into(),
            value: None,
            value_from: Some(ArgumentValueFrom {
                pod_template_hash_value: Some(which),
                ..ArgumentValueFrom::default()
            }),
        };
        CanaryStep {
            experiment: Some(RolloutExperimentStep {
                templates: vec![template("baseline", "stable"), template("canary", "canary")],
                duration: Some("5m".into()),
                analyses: Some(vec![RolloutExperimentStepAnalysisTemplateRef {
                    name: "judge".into(),
                    template_name: "judge-error-rate".into(),
                    args: Some(vec![
                        hash_arg("canary-hash", ValueFromPodTemplateHash::Latest),
                        hash_arg("stable-hash", ValueFromPodTemplateHash::Stable),
                    ]),
                    ..RolloutExperimentStepAnalysisTemplateRef::default()
                }]),
                ..RolloutExperimentStep::default()
            }),
            ..CanaryStep::default()
        }
    }

    fn rollout() -> Rollout {
        Rollout::test_canary(
            "web",
            vec![
                CanaryStep::weight(20),
                experiment_step(None),
                CanaryStep::weight(60),
            ],
        )
        .with_replicas(4)
    }

    struct World {
        rollout: Rollout,
        observed: Observed,
        now: Timestamp,
    }

    impl World {
        /// The first revision deployed, and the second one's experiment step created.
        fn at_experiment(rollout: Rollout) -> (Self, String, String) {
            let mut world = Self {
                rollout,
                observed: Observed::default(),
                now: at(0),
            };
            world.settle();
            let stable = world.status().stable_rs.clone();
            world.update_image("web:2");
            world.settle();
            let current = world.status().current_pod_hash.clone();
            assert_ne!(stable, current);
            (world, stable, current)
        }

        fn plan(&self) -> Plan {
            let first = super::super::plan(&self.rollout, &self.observed, self.now).1;
            assert_eq!(
                first,
                super::super::plan(&self.rollout, &self.observed, self.now).1,
                "a plan is a pure function"
            );
            first
        }

        fn step(&mut self) -> Plan {
            let plan = self.plan();
            apply_writes(&mut self.observed, &plan, self.now, true);
            apply_to_rollout(&mut self.rollout, &plan);
            self.now += std::time::Duration::from_secs(1);
            plan
        }

        /// Plans and applies until a plan changes nothing; returns every plan.
        fn settle(&mut self) -> Vec<Plan> {
            let mut plans = Vec::new();
            for _ in 0..40 {
                let plan = self.step();
                let done = plan.is_noop();
                plans.push(plan);
                if done {
                    return plans;
                }
            }
            panic!("no steady state; last plan: {:#?}", plans.last());
        }

        fn status(&self) -> &RolloutStatus {
            self.rollout.status.as_ref().expect("status written")
        }

        fn update_image(&mut self, image: &str) {
            let generation = self.rollout.metadata.generation.unwrap_or(1) + 1;
            self.rollout = self
                .rollout
                .clone()
                .with_image(image)
                .with_generation(generation);
        }

        fn experiment(&mut self, name: &str) -> &mut ObservedExperiment {
            self.observed
                .experiments
                .iter_mut()
                .find(|ex| ex.name == name)
                .expect("Experiment exists")
        }

        fn set_phase(&mut self, name: &str, phase: AnalysisPhase, message: &str) {
            let experiment = self.experiment(name);
            experiment.phase = Some(phase);
            experiment.message = message.into();
        }

        fn created(plans: &[Plan]) -> Vec<ExperimentToCreate> {
            plans
                .iter()
                .flat_map(|plan| plan.create_experiments.clone())
                .collect()
        }
    }

    #[test]
    fn the_step_creates_its_experiment_from_both_revisions_and_waits_for_it() {
        let mut world = World {
            rollout: rollout(),
            observed: Observed::default(),
            now: at(0),
        };
        let first = world.settle();
        assert!(
            World::created(&first).is_empty(),
            "a first deploy skips the steps"
        );
        let stable = world.status().stable_rs.clone();
        world.update_image("web:2");
        let plans = world.settle();
        let current = world.status().current_pod_hash.clone();
        let created = World::created(&plans);
        let [experiment] = created.as_slice() else {
            panic!("one Experiment: {created:?}");
        };
        assert_eq!(experiment.name, format!("web-{current}-2-1"));
        assert_eq!(experiment.step_index, 1);
        assert_eq!(experiment.pod_template_hash, current);
        assert_eq!(experiment.revision, "2");
        assert_eq!(experiment.canary_replica_set, format!("web-{current}"));
        assert_eq!(experiment.stable_replica_set, format!("web-{stable}"));
        let args: Vec<_> = experiment.step.analyses.as_ref().unwrap()[0]
            .args
            .iter()
            .flatten()
            .map(|arg| {
                (
                    arg.name.as_str(),
                    arg.value.clone(),
                    arg.value_from.is_some(),
                )
            })
            .collect();
        assert_eq!(
            args,
            vec![
                ("canary-hash", Some(current.clone()), false),
                ("stable-hash", Some(stable.clone()), false)
            ]
        );
        let created_plan = plans
            .iter()
            .find(|plan| !plan.create_experiments.is_empty())
            .unwrap();
        assert!(
            created_plan
                .events
                .iter()
                .any(|e| e.reason == EXPERIMENT_CREATED_REASON)
        );
        assert_eq!(world.status().canary.current_experiment, experiment.name);
        assert_eq!(world.status().current_step_index, Some(1));
        // Waiting: nothing moves, however long the Experiment takes (no progress deadline).
        world.now += std::time::Duration::from_secs(3600);
        world.set_phase(&experiment.name, AnalysisPhase::Running, "");
        let plan = world.step();
        assert!(plan.create_experiments.is_empty());
        assert!(plan.terminate_experiments.is_empty());
        assert!(!world.status().abort);
        assert_eq!(world.status().current_step_index, Some(1));
        assert_eq!(world.status().canary.current_experiment, experiment.name);
    }

    #[test]
    fn a_successful_experiment_moves_the_steps_on_and_the_update_completes() {
        let (mut world, _, current) = World::at_experiment(rollout());
        let name = world.status().canary.current_experiment.clone();
        world.set_phase(&name, AnalysisPhase::Successful, "");
        let plans = world.settle();
        assert!(World::created(&plans).is_empty(), "no second Experiment");
        assert!(
            plans
                .iter()
                .all(|plan| plan.terminate_experiments.is_empty())
        );
        assert_eq!(world.status().stable_rs, current, "promoted");
        assert_eq!(world.status().canary.current_experiment, "");
        assert!(world.observed.experiments.iter().any(|ex| ex.name == name));
    }

    #[test]
    fn a_failed_experiment_aborts_the_update() {
        let (mut world, stable, current) = World::at_experiment(rollout());
        let name = world.status().canary.current_experiment.clone();
        world.set_phase(
            &name,
            AnalysisPhase::Failed,
            "Metric \"judge\" assessed Failed",
        );
        world.settle();
        let status = world.status();
        assert!(status.abort);
        assert_eq!(status.stable_rs, stable);
        assert_eq!(status.canary.current_experiment, "");
        let progressing = status.condition("Progressing").unwrap();
        assert_eq!(progressing.reason, "RolloutAborted");
        assert!(
            progressing.message.contains(
                "Experiment analysis phase is error/failed: Metric \"judge\" assessed Failed"
            ),
            "{}",
            progressing.message
        );
        let canary = world
            .observed
            .replica_sets
            .iter()
            .find(|rs| rs.pod_template_hash == current)
            .unwrap();
        assert_eq!(canary.replicas, 0, "the canary is scaled down");
    }

    #[test]
    fn an_abort_terminates_the_running_experiment() {
        let (mut world, _, _) = World::at_experiment(rollout());
        let name = world.status().canary.current_experiment.clone();
        world.set_phase(&name, AnalysisPhase::Running, "");
        world.rollout.status.as_mut().unwrap().abort = true;
        let plan = world.step();
        assert_eq!(plan.terminate_experiments, vec![name.clone()]);
        assert_eq!(world.status().canary.current_experiment, "");
        let again = world.step();
        assert!(
            again.terminate_experiments.is_empty(),
            "terminated once: {again:?}"
        );
    }

    #[test]
    fn a_full_promotion_terminates_the_running_experiment_and_promotes() {
        let (mut world, _, current) = World::at_experiment(rollout());
        let name = world.status().canary.current_experiment.clone();
        world.set_phase(&name, AnalysisPhase::Running, "");
        // `kubectl rollouts promote --full`.
        world.rollout.status.as_mut().unwrap().promote_full = true;
        let plans = world.settle();
        let terminated: Vec<&String> = plans
            .iter()
            .flat_map(|plan| &plan.terminate_experiments)
            .collect();
        assert_eq!(terminated, vec![&name]);
        assert!(World::created(&plans).is_empty());
        assert_eq!(world.status().stable_rs, current);
        assert_eq!(world.status().canary.current_experiment, "");
    }

    #[test]
    fn a_new_revision_terminates_the_experiment_of_the_old_one() {
        let (mut world, _, _) = World::at_experiment(rollout());
        let old = world.status().canary.current_experiment.clone();
        world.set_phase(&old, AnalysisPhase::Running, "");
        world.update_image("web:3");
        let plans = world.settle();
        let terminated: Vec<&String> = plans
            .iter()
            .flat_map(|plan| &plan.terminate_experiments)
            .collect();
        assert_eq!(terminated, vec![&old]);
        let created = World::created(&plans);
        let newest = world.status().current_pod_hash.clone();
        assert_eq!(created.len(), 1, "{created:?}");
        assert!(created[0].name.starts_with(&format!("web-{newest}-3-1")));
    }

    #[test]
    fn an_inconclusive_experiment_pauses_and_a_resume_starts_another() {
        let (mut world, _, current) = World::at_experiment(rollout());
        let first = world.status().canary.current_experiment.clone();
        world.set_phase(&first, AnalysisPhase::Inconclusive, "");
        let plans = world.settle();
        assert!(World::created(&plans).is_empty(), "none while paused");
        assert_eq!(
            world
                .status()
                .pause_conditions
                .iter()
                .map(|c| c.reason.as_str())
                .collect::<Vec<_>>(),
            vec![PAUSE_REASON_INCONCLUSIVE_EXPERIMENT]
        );
        assert_eq!(world.status().current_step_index, Some(1));
        // `kubectl rollouts promote` clears the pause conditions.
        world
            .rollout
            .status
            .as_mut()
            .unwrap()
            .pause_conditions
            .clear();
        let plans = world.settle();
        let created = World::created(&plans);
        assert_eq!(created.len(), 1);
        assert_eq!(created[0].name, format!("web-{current}-2-1-1"));
        assert_eq!(world.status().canary.current_experiment, created[0].name);
    }

    #[test]
    fn a_lost_status_write_finds_the_running_experiment_again() {
        let (mut world, _, _) = World::at_experiment(rollout());
        let name = world.status().canary.current_experiment.clone();
        world.set_phase(&name, AnalysisPhase::Running, "");
        world
            .rollout
            .status
            .as_mut()
            .unwrap()
            .canary
            .current_experiment
            .clear();
        let plan = world.step();
        assert!(plan.create_experiments.is_empty());
        assert!(plan.terminate_experiments.is_empty());
        assert_eq!(world.status().canary.current_experiment, name);
    }

    #[test]
    fn weighted_templates_of_a_running_experiment_get_their_share_of_traffic() {
        let routed = Rollout::test_canary(
            "web",
            vec![CanaryStep::weight(20), experiment_step(Some(10))],
        )
        .with_replicas(4)
        .with_traffic_routing(RolloutTrafficRouting {
            istio: Some(IstioTrafficRouting {
                virtual_service: Some(IstioVirtualService {
                    name: "web".into(),
                    routes: Some(vec!["primary".into()]),
                    ..IstioVirtualService::default()
                }),
                ..IstioTrafficRouting::default()
            }),
            ..RolloutTrafficRouting::default()
        });
        let (mut world, _, _) = World::at_experiment(routed);
        let name = world.status().canary.current_experiment.clone();
        let plan = world.plan();
        assert_eq!(plan.traffic.as_ref().unwrap().additional, Vec::new());
        let experiment = world.experiment(&name);
        experiment.phase = Some(AnalysisPhase::Running);
        experiment.templates = ["baseline", "canary"]
            .into_iter()
            .map(|template| ObservedExperimentTemplate {
                name: template.into(),
                service_name: format!("{name}-{template}"),
                pod_template_hash: format!("{template}-hash"),
            })
            .collect();
        let plan = world.step();
        let traffic = plan.traffic.as_ref().unwrap();
        assert_eq!(traffic.desired_weight, 20);
        let additional: Vec<(String, i32)> = traffic
            .additional
            .iter()
            .map(|d| (d.pod_template_hash.clone(), d.weight))
            .collect();
        assert_eq!(
            additional,
            vec![
                ("baseline-hash".to_string(), 10),
                ("canary-hash".to_string(), 10)
            ]
        );
        assert_eq!(
            world.status().canary.weights.as_ref().unwrap().additional,
            traffic.additional
        );
        // A template whose Service the status does not report yet gets no traffic.
        world.experiment(&name).templates[1].service_name.clear();
        let plan = world.step();
        let services: Vec<&str> = plan
            .traffic
            .as_ref()
            .unwrap()
            .additional
            .iter()
            .map(|d| d.service_name.as_str())
            .collect();
        assert_eq!(services, vec![format!("{name}-baseline").as_str()]);
        // Finished: the experiment templates lose their traffic.
        world.set_phase(&name, AnalysisPhase::Successful, "");
        let plan = world.step();
        assert_eq!(plan.traffic.as_ref().unwrap().additional, Vec::new());
    }

    fn finished(name: &str, hash: &str, phase: AnalysisPhase, second: i64) -> ObservedExperiment {
        ObservedExperiment {
            name: name.into(),
            pod_template_hash: hash.into(),
            phase: Some(phase),
            message: String::new(),
            terminating: false,
            created: at(second),
            templates: Vec::new(),
        }
    }

    #[test]
    fn finished_experiments_beyond_the_history_limits_are_deleted() {
        let mut rollout = rollout();
        rollout.spec.analysis = Some(AnalysisRunStrategy {
            successful_run_history_limit: Some(1),
            unsuccessful_run_history_limit: Some(2),
        });
        let rs = |hash: &str| ObservedReplicaSet {
            name: format!("web-{hash}"),
            pod_template_hash: hash.into(),
            replicas: 0,
            current_replicas: 0,
            ready_replicas: 0,
            available_replicas: 0,
            annotations: BTreeMap::new(),
            created: at(0),
            min_ready_seconds: 0,
            replica_failure: None,
        };
        let mut running = finished("running", "a", AnalysisPhase::Running, 9);
        running.phase = None;
        let observed = Observed {
            replica_sets: vec![rs("a")],
            experiments: vec![
                finished("ok-1", "a", AnalysisPhase::Successful, 1),
                finished("ok-2", "a", AnalysisPhase::Successful, 2),
                finished("failed-1", "a", AnalysisPhase::Failed, 3),
                finished("error-2", "a", AnalysisPhase::Error, 4),
                finished("inconclusive-3", "a", AnalysisPhase::Inconclusive, 5),
                finished("gone", "b", AnalysisPhase::Successful, 6),
                finished("unlabelled", "", AnalysisPhase::Successful, 7),
                finished("current", "a", AnalysisPhase::Successful, 8),
                running,
            ],
            ..Observed::default()
        };
        let mut plan = Plan::unchanged(&rollout);
        plan.status.canary.current_experiment = "current".into();
        let mut deleted = experiments_to_delete(&rollout, &observed, &plan);
        deleted.sort();
        assert_eq!(deleted, ["failed-1", "gone", "ok-1", "unlabelled"]);
    }

    #[test]
    fn names_follow_argo() {
        assert!(named_after("web-abc-2-1", "web-abc-2-1"));
        assert!(named_after("web-abc-2-1-3", "web-abc-2-1"));
        assert!(!named_after("web-abc-2-11", "web-abc-2-1"));
        assert!(!named_after("web-abc-2-1-x", "web-abc-2-1"));
        assert!(!named_after("web-abc-2-1-", "web-abc-2-1"));
    }
}
