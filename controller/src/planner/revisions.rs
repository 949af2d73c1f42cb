//! ReplicaSet housekeeping both strategies share: naming and numbering revisions, creating the
//! current revision's ReplicaSet (or noticing that another template holds its name), scaling
//! with Argo's event, reading `scale-down-deadline` annotations, and deleting empty revisions
//! beyond `revisionHistoryLimit`.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use rollouts_crds::conditions::{NEW_REPLICA_SET_REASON, SCALING_REPLICA_SET_REASON};
use rollouts_crds::rollout::{Rollout, SCALE_DOWN_DEADLINE_ANNOTATION_KEY};

use super::status::Outbox;
use super::{EventType, NewReplicaSet, Observed, ObservedReplicaSet, Plan, ReplicaSetScale};

/// One more than the newest revision any observed ReplicaSet carries.
pub(super) fn next_revision(observed: &Observed) -> i64 {
    observed
        .replica_sets
        .iter()
        .filter_map(ObservedReplicaSet::revision)
        .max()
        .unwrap_or_default()
        .saturating_add(1)
}

/// The current revision's ReplicaSet name: the existing one's, else `<rollout>-<hash>`.
pub(super) fn new_rs_name(
    rollout: &Rollout,
    new_rs: Option<&ObservedReplicaSet>,
    current_hash: &str,
) -> String {
    match new_rs {
        Some(rs) => rs.name.clone(),
        None => format!(
            "{}-{current_hash}",
            rollout.metadata.name.as_deref().unwrap_or_default()
        ),
    }
}

/// The ReplicaSet carries a non-empty `scale-down-deadline` annotation.
pub(super) fn has_scale_down_annotation(rs: &ObservedReplicaSet) -> bool {
    rs.annotations
        .get(SCALE_DOWN_DEADLINE_ANNOTATION_KEY)
        .is_some_and(|value| !value.is_empty())
}

/// The ReplicaSet's `scale-down-deadline`, when it carries one that parses.
pub(super) fn scale_down_deadline(rs: &ObservedReplicaSet) -> Option<Timestamp> {
    rs.annotations
        .get(SCALE_DOWN_DEADLINE_ANNOTATION_KEY)
        .filter(|value| !value.is_empty())
        .and_then(|value| value.parse().ok())
}

/// Annotation Argo puts on an Experiment's ReplicaSets; they never count as revisions.
const EXPERIMENT_NAME_ANNOTATION: &str = "experiment.argoproj.io/name";

/// `spec.rollbackWindow`: the current revision is older than the stable one, and fewer than
/// `rollbackWindow.revisions` ReplicaSets were created between the two, so going back to it
/// skips the steps (Argo's `isRollbackWithinWindow`).
pub(super) fn rollback_within_window(
    rollout: &Rollout,
    observed: &Observed,
    new_rs: Option<&ObservedReplicaSet>,
    stable_rs: Option<&ObservedReplicaSet>,
) -> bool {
    let (Some(new_rs), Some(stable_rs)) = (new_rs, stable_rs) else {
        return false;
    };
    let window = rollout
        .spec
        .rollback_window
        .as_ref()
        .and_then(|window| window.revisions)
        .unwrap_or_default();
    if window <= 0 || new_rs.created >= stable_rs.created {
        return false;
    }
    let between = observed
        .replica_sets
        .iter()
        .filter(|rs| {
            rs.annotations
                .get(EXPERIMENT_NAME_ANNOTATION)
                .is_none_or(String::is_empty)
        })
        .filter(|rs| new_rs.created < rs.created && rs.created < stable_rs.created)
        .count();
    i32::try_from(between).is_ok_and(|between| between < window)
}

/// Asks for `rs` at `to` replicas, with Argo's `ScalingReplicaSet` event.
pub(super) fn scale(plan: &mut Plan, out: &mut Outbox, rs: &ObservedReplicaSet, to: i32) {
    let direction = if to > rs.replicas { "up" } else { "down" };
    out.event(
        EventType::Normal,
        SCALING_REPLICA_SET_REASON,
        format!(
            "Scaled {direction} ReplicaSet {} (revision {}) from {} to {to}",
            rs.name,
            rs.revision().unwrap_or_default(),
            rs.replicas
        ),
    );
    plan.scale_replica_sets.push(ReplicaSetScale {
        name: rs.name.clone(),
        from: rs.replicas,
        to,
    });
}

/// Asks for the current revision's ReplicaSet `name` with Argo's `NewReplicaSetCreated` event.
/// Returns false, asking for nothing, when a ReplicaSet of another template already has the
/// name: the caller salts the hash (`collisionCount`) and plans again at once.
pub(super) fn create(
    plan: &mut Plan,
    out: &mut Outbox,
    observed: &Observed,
    name: String,
    pod_template_hash: &str,
    replicas: i32,
) -> bool {
    if observed.replica_sets.iter().any(|rs| rs.name == name) {
        out.requeue_in(Duration::ZERO);
        return false;
    }
    let revision = next_revision(observed);
    out.event(
        EventType::Normal,
        NEW_REPLICA_SET_REASON,
        format!("Created ReplicaSet {name} (revision {revision})"),
    );
    plan.create_replica_set = Some(NewReplicaSet {
        name,
        pod_template_hash: pod_template_hash.to_string(),
        replicas,
        revision,
    });
    true
}

/// The oldest empty `candidates` beyond `revisionHistoryLimit`; one whose scale-down deadline
/// is still ahead is kept.
pub(super) fn history_to_delete<'a>(
    rollout: &Rollout,
    candidates: impl IntoIterator<Item = &'a ObservedReplicaSet>,
    now: Timestamp,
) -> Vec<String> {
    let limit = usize::try_from(rollout.spec.effective_revision_history_limit()).unwrap_or(0);
    let mut cleanable: Vec<&ObservedReplicaSet> = candidates
        .into_iter()
        .filter(|rs| rs.replicas == 0 && rs.current_replicas == 0)
        .filter(|rs| scale_down_deadline(rs).is_none_or(|at| at <= now))
        .collect();
    if cleanable.len() <= limit {
        return Vec::new();
    }
    cleanable.sort_by_key(|rs| (rs.revision().unwrap_or_default(), rs.created));
    let excess = cleanable.len() - limit;
    cleanable[..excess]
        .iter()
        .map(|rs| rs.name.clone())
        .collect()
}
