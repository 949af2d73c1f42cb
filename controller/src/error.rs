//! The controller's one error type: every failure the runtime shell can meet, each carrying its
//! cause (`#[source]`) and a short `metric_label()` for the `rollout_reconcile_error` counter.

use std::net::SocketAddr;

/// Everything that can go wrong in the runtime shell.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot build a Kubernetes client from the kubeconfig ({context}): {source}")]
    Kubeconfig {
        context: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    #[error(
        "the Rollout CRD is not installed: kubectl apply --server-side -f crds/yaml/ ({source})"
    )]
    CrdNotInstalled {
        #[source]
        source: Box<kube::Error>,
    },

    #[error("cannot list Rollouts {scope} at startup: {source}")]
    StartupList {
        scope: String,
        #[source]
        source: Box<kube::Error>,
    },

    #[error(
        "the API server refused {request} at startup ({code} {reason}: {message}): check the RBAC of the controller's service account, or its credentials"
    )]
    StartupRefused {
        /// The request, as `list rollouts.argoproj.io in all namespaces`.
        request: String,
        code: u16,
        reason: String,
        message: String,
    },

    #[error(
        "reconcile of Rollout {namespace}/{name} panicked: {message}; it is retried with backoff, other Rollouts are not affected"
    )]
    ReconcilePanicked {
        namespace: String,
        name: String,
        message: String,
    },

    #[error("the {task} stopped: {reason}; exiting so the Deployment restarts this replica")]
    TaskFailed { task: &'static str, reason: String },

    #[error(
        "{operation} of Lease {namespace}/{name} for leader election took longer than {timeout:?}"
    )]
    LeaseTimeout {
        operation: &'static str,
        namespace: String,
        name: String,
        timeout: std::time::Duration,
    },

    #[error("cannot read Rollout {namespace}/{name}: {source}")]
    GetRollout {
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },

    #[error(
        "the watch cache's copy of Rollout {namespace}/{name} does not decode ({reason}); the next change to the Rollout replaces it"
    )]
    CachedRollout {
        namespace: String,
        name: String,
        reason: String,
    },

    #[error("cannot {verb} {kind} {namespace}/{object} for Rollout {rollout}: {source}")]
    Write {
        verb: &'static str,
        kind: &'static str,
        namespace: String,
        object: String,
        rollout: String,
        #[source]
        source: Box<kube::Error>,
    },

    #[error("cannot read {kind} {namespace}/{object} for Rollout {rollout}: {source}")]
    Read {
        kind: &'static str,
        namespace: String,
        object: String,
        rollout: String,
        #[source]
        source: Box<kube::Error>,
    },

    #[error(
        "Service {namespace}/{service} named in {field} of Rollout {rollout} does not exist: create the Service or fix {field}"
    )]
    ServiceNotFound {
        namespace: String,
        rollout: String,
        service: String,
        field: &'static str,
    },

    #[error(
        "spec.template of Rollout {namespace}/{name} is not a valid pod template ({source}): fix spec.template"
    )]
    InvalidTemplate {
        namespace: String,
        name: String,
        #[source]
        source: serde_json::Error,
    },

    #[error("{field} of Rollout {namespace}/{rollout} cannot start an AnalysisRun: {reason}")]
    InvalidAnalysis {
        namespace: String,
        rollout: String,
        field: String,
        reason: String,
    },

    #[error("cannot {operation} on the {router} router of Rollout {namespace}/{rollout}: {source}")]
    Traffic {
        operation: &'static str,
        router: String,
        namespace: String,
        rollout: String,
        #[source]
        source: Box<rollouts_traffic::Error>,
    },

    #[error("cannot patch status of Rollout {namespace}/{name}: {source}")]
    PatchStatus {
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },

    #[error("cannot publish event {reason} for Rollout {namespace}/{name}: {source}")]
    PublishEvent {
        namespace: String,
        name: String,
        reason: String,
        #[source]
        source: Box<kube::Error>,
    },

    #[error("Rollout {0} has no namespace or name; it cannot be reconciled")]
    MissingObjectKey(String),

    #[error("cannot encode the status of Rollout {namespace}/{name}: {source}")]
    EncodeStatus {
        namespace: String,
        name: String,
        #[source]
        source: serde_json::Error,
    },

    #[error("cannot read or write Lease {namespace}/{name} for leader election: {source}")]
    Lease {
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },

    #[error(
        "lost the leader lease {namespace}/{name}: {reason}; exiting so the Deployment restarts this replica"
    )]
    LeaseLost {
        namespace: String,
        name: String,
        reason: String,
    },

    #[error("cannot listen on {addr} (change --{flag}): {source}")]
    Bind {
        addr: SocketAddr,
        flag: &'static str,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot install the {format} log subscriber: {source}")]
    Logging {
        format: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// `Result` with the controller's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Short, stable name of the failure, used as the `error` label of metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kubeconfig { .. } => "kubeconfig",
            Error::CrdNotInstalled { .. } => "crd_not_installed",
            Error::StartupList { .. } => "startup_list",
            Error::StartupRefused { .. } => "startup_refused",
            Error::ReconcilePanicked { .. } => "panic",
            Error::TaskFailed { .. } => "task_failed",
            Error::LeaseTimeout { .. } => "lease_timeout",
            Error::PatchStatus { .. } => "patch_status",
            Error::GetRollout { .. } => "get_rollout",
            Error::CachedRollout { .. } => "cached_rollout",
            Error::Write { .. } => "write",
            Error::Read { .. } => "read",
            Error::ServiceNotFound { .. } => "service_not_found",
            Error::InvalidTemplate { .. } => "invalid_template",
            Error::InvalidAnalysis { .. } => "invalid_analysis",
            Error::Traffic { .. } => "traffic",
            Error::PublishEvent { .. } => "publish_event",
            Error::MissingObjectKey(_) => "missing_object_key",
            Error::EncodeStatus { .. } => "encode_status",
            Error::Lease { .. } => "lease",
            Error::LeaseLost { .. } => "lease_lost",
            Error::Bind { .. } => "bind",
            Error::Logging { .. } => "logging",
        }
    }
}

/// Whether a failed API request may succeed if sent again: a server error (but 501 Not
/// Implemented), a throttle (429), a request timeout (408), or no answer at all.
pub fn is_transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => {
            matches!(status.code, 408 | 429) || (status.code >= 500 && status.code != 501)
        }
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crd_missing_message_names_the_fix() {
        let source = kube::Error::Api(
            kube::core::Status::failure(
                "the server could not find the requested resource",
                "NotFound",
            )
            .with_code(404)
            .boxed(),
        );
        let error = Error::CrdNotInstalled {
            source: Box::new(source),
        };
        assert!(error.to_string().starts_with(
            "the Rollout CRD is not installed: kubectl apply --server-side -f crds/yaml/"
        ));
        assert_eq!(error.metric_label(), "crd_not_installed");
    }
}
