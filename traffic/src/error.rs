//! The one error type of the routers: what went wrong, on which object, and what to change.

/// A router failure. Every variant names the object (and, for spec problems, the field) involved.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Rollout's traffic routing configuration cannot be acted on.
    #[error("Rollout {rollout}: {field}: {reason}")]
    InvalidSpec {
        rollout: String,
        field: String,
        reason: String,
    },

    /// A router object (Ingress, VirtualService, DestinationRule, HTTPRoute) does not have the
    /// shape the Rollout's configuration expects.
    #[error("{kind} {object}: {reason}")]
    InvalidObject {
        kind: &'static str,
        object: String,
        reason: String,
    },

    /// A router object read from the API server cannot be turned into JSON.
    #[error("{kind} {object}: cannot be read as JSON: {source}")]
    Json {
        kind: &'static str,
        object: String,
        #[source]
        source: serde_json::Error,
    },

    /// A router object the Rollout names does not exist.
    #[error("{kind} {object} not found: create it, or fix {field} in Rollout {rollout}")]
    NotFound {
        kind: &'static str,
        object: String,
        rollout: String,
        field: String,
    },

    /// The canary Ingress this Rollout would write is controlled by another object.
    #[error(
        "Ingress {object} is controlled by {owner}, not by Rollout {rollout}: delete or rename it so the Rollout can own its canary Ingress"
    )]
    NotOwned {
        object: String,
        owner: String,
        rollout: String,
    },

    /// The API server refused or failed a read or a write.
    #[error("{action} {kind} {object}: {source}")]
    Kube {
        action: &'static str,
        kind: &'static str,
        object: String,
        #[source]
        source: Box<kube::Error>,
    },
}

impl Error {
    /// Whether the API server refused a write because the object changed since it was read.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube { source, .. } if matches!(source.as_ref(), kube::Error::Api(status) if status.is_conflict()))
    }

    /// A short, stable label for metrics (`error` label of the router write counters).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::InvalidSpec { .. } => "invalid_spec",
            Error::InvalidObject { .. } | Error::Json { .. } => "invalid_object",
            Error::NotFound { .. } => "not_found",
            Error::NotOwned { .. } => "not_owned",
            Error::Kube { .. } => "kube",
        }
    }
}

/// Result of router operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn refused(code: u16, reason: &str) -> Error {
        Error::Kube {
            action: "applying",
            kind: "VirtualService",
            object: "apps/reviews".to_string(),
            source: Box::new(kube::Error::Api(
                Status::failure("refused", reason).with_code(code).boxed(),
            )),
        }
    }

    #[test]
    fn only_a_409_is_a_conflict() {
        assert!(refused(409, "Conflict").is_conflict());
        assert!(!refused(422, "Invalid").is_conflict());
        assert_eq!(refused(409, "Conflict").metric_label(), "kube");
        assert!(
            refused(422, "Invalid")
                .to_string()
                .starts_with("applying VirtualService apps/reviews")
        );
    }
}
