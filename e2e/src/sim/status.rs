//! API errors and the `Status` objects they become on the wire.

use serde_json::{Value, json};

/// A failed API request: HTTP code, Kubernetes reason and message, with the object it concerns.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// `(name, group, resource)` for `Status.details`.
    pub details: Option<(String, String, String)>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, group: &str, resource: &str, name: &str) -> Self {
        self.details = Some((name.into(), group.into(), resource.into()));
        self
    }

    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(group, resource)),
        )
        .with_details(group, resource, name)
    }

    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(group, resource)),
        )
        .with_details(group, resource, name)
    }

    pub fn conflict(group: &str, resource: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(group, resource)
            ),
        )
        .with_details(group, resource, name)
    }

    /// A server-side apply conflict: the real API server sends the apply message as it is
    /// (`Apply failed with 1 conflict: ...`), not wrapped in `Operation cannot be fulfilled`.
    pub fn apply_conflict(message: impl Into<String>) -> Self {
        Self::new(409, "Conflict", message)
    }

    pub fn stale(group: &str, resource: &str, name: &str) -> Self {
        Self::conflict(
            group,
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn invalid(group: &str, resource: &str, name: &str, why: impl AsRef<str>) -> Self {
        Self::new(
            422,
            "Invalid",
            format!(
                "{} \"{name}\" is invalid: {}",
                qualified(group, resource),
                why.as_ref()
            ),
        )
        .with_details(group, resource, name)
    }

    pub fn forbidden(group: &str, resource: &str, name: &str, why: &str) -> Self {
        Self::new(
            403,
            "Forbidden",
            format!(
                "{} \"{name}\" is forbidden: {why}",
                qualified(group, resource)
            ),
        )
        .with_details(group, resource, name)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    pub fn path_not_found(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource (path {path})"),
        )
    }

    /// A resource path for a resource no group-version serves.
    pub fn unknown_resource(group: &str, version: &str, plural: &str) -> Self {
        let gv = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        Self::new(
            404,
            "NotFound",
            format!(
                "the server could not find the requested resource: {gv} does not serve \"{plural}\" (for a custom resource, create its CustomResourceDefinition first)"
            ),
        )
    }

    /// The `meta.k8s.io/v1` Status object.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some((name, group, kind)) = &self.details {
            status["details"] = json!({"name": name, "group": group, "kind": kind});
        }
        status
    }
}

/// `deployments.apps` style name used in messages; core resources have no suffix.
fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
