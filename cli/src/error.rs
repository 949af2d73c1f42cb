//! The plugin's errors, worded as kubectl words them so scripts and people read them the same way.

use kube::core::Status;
use rollouts_controller::decode::DecodeError;

use crate::patch::TargetKind;

/// Everything a verb can fail with. `Display` is the whole line printed on stderr.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server answered with a failure `Status`.
    #[error("Error from server ({reason}): {message}", reason = reason(status), message = server_message(status, *kind, name))]
    Api {
        kind: TargetKind,
        name: String,
        #[source]
        status: Box<Status>,
    },
    /// No API server answered at the configured address.
    #[error(
        "Unable to connect to the server {server} ({action} {object}): {cause} - is a cluster running there? (fix: point --context or --kubeconfig at a reachable cluster)",
        object = object(*kind, name)
    )]
    Unreachable {
        server: String,
        action: &'static str,
        kind: TargetKind,
        name: String,
        /// The innermost cause ("Connection refused (os error 111)").
        cause: String,
        #[source]
        source: Box<kube::Error>,
    },
    /// No usable kubeconfig.
    #[error(
        "error: cannot load a kubeconfig: {0} (fix: pass --kubeconfig FILE, set KUBECONFIG, or create ~/.kube/config)"
    )]
    Kubeconfig(String),
    /// Any other client failure talking to the server (bad response, TLS, auth plugin).
    #[error("error: {action} {object}: {source}", object = object(*kind, name))]
    Client {
        action: &'static str,
        kind: TargetKind,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    /// The object does not fit this plugin's types (the controller reports it `InvalidSpec` for
    /// the same reason); the error names the field, the value and the fix.
    #[error("error: {object} cannot be decoded: {error}", object = object(*kind, name))]
    Undecodable {
        kind: TargetKind,
        name: String,
        error: DecodeError,
    },
    /// The request cannot be carried out as asked; the message names the object, field and fix.
    #[error("error: {0}")]
    Invalid(String),
    /// A local file could not be read.
    #[error("error: cannot read {path}: {source}")]
    ReadFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The Rollout ended Degraded, or did not finish in time (`status`).
    #[error("error: {0}")]
    Unhealthy(String),
    /// Writing output failed (a closed pipe, a bad encoder).
    #[error("error: cannot write output: {0}")]
    Output(String),
}

/// `Result` with the plugin's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn reason(status: &Status) -> String {
    if !status.reason.is_empty() {
        return status.reason.clone();
    }
    match status.code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        422 => "Invalid",
        _ => "InternalError",
    }
    .to_string()
}

/// `rollouts.argoproj.io "web"`, or the bare resource for a request about no one object
/// (a listing, named `*` or nothing).
fn object(kind: TargetKind, name: &str) -> String {
    match name {
        "" | "*" => kind.resource().to_string(),
        _ => format!("{} \"{name}\"", kind.resource()),
    }
}

/// The server's message, or kubectl's wording for the reason when the server sent none.
fn server_message(status: &Status, kind: TargetKind, name: &str) -> String {
    if !status.message.is_empty() {
        return status.message.clone();
    }
    let resource = kind.resource();
    match reason(status).as_str() {
        "NotFound" => format!("{} not found", object(kind, name)),
        "Forbidden" => format!("{} is forbidden", object(kind, name)),
        "Conflict" => format!(
            "Operation cannot be fulfilled on {resource} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
        ),
        other => format!("{}: {other} (HTTP {})", object(kind, name), status.code),
    }
}

impl Error {
    /// Classifies a kube error from an action on one object.
    pub fn from_kube(
        err: kube::Error,
        action: &'static str,
        kind: TargetKind,
        name: &str,
        server: &str,
    ) -> Self {
        match err {
            kube::Error::Api(status) => Error::Api {
                kind,
                name: name.to_string(),
                status,
            },
            kube::Error::HyperError(_) | kube::Error::Service(_) => Error::Unreachable {
                server: server.to_string(),
                action,
                kind,
                name: name.to_string(),
                cause: root_cause(&err),
                source: Box::new(err),
            },
            other => Error::Client {
                action,
                kind,
                name: name.to_string(),
                source: Box::new(other),
            },
        }
    }

    /// Whether the server said the object changed under us (worth a fresh read and a retry):
    /// a 409 Conflict, or a 422 from a JSON patch whose `test` operation no longer holds
    /// (the API server words it "testing value /path failed").
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Api { status, .. }
            if status.is_conflict() || (status.code == 422 && status.message.contains("test")))
    }
}

/// The last error of a source chain: the one that says what actually happened.
fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut current = err;
    while let Some(next) = current.source() {
        current = next;
    }
    current.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(status: Status) -> Error {
        Error::Api {
            kind: TargetKind::Rollout,
            name: "web".into(),
            status: Box::new(status),
        }
    }

    #[test]
    fn not_found_reads_like_kubectl() {
        let server =
            Status::failure("rollouts.argoproj.io \"web\" not found", "NotFound").with_code(404);
        assert_eq!(
            api_error(server).to_string(),
            "Error from server (NotFound): rollouts.argoproj.io \"web\" not found"
        );
        let bare = Status::failure("", "").with_code(404);
        assert_eq!(
            api_error(bare).to_string(),
            "Error from server (NotFound): rollouts.argoproj.io \"web\" not found"
        );
    }

    #[test]
    fn forbidden_without_a_message_names_the_object() {
        let bare = Status::failure("", "Forbidden").with_code(403);
        assert_eq!(
            api_error(bare).to_string(),
            "Error from server (Forbidden): rollouts.argoproj.io \"web\" is forbidden"
        );
    }

    #[test]
    fn conflicts_are_retryable() {
        assert!(api_error(Status::failure("modified", "Conflict").with_code(409)).is_conflict());
        assert!(!api_error(Status::failure("nope", "NotFound").with_code(404)).is_conflict());
        let failed_test = Status::failure(
            "testing value /spec/template/spec/containers/0/name failed: test failed",
            "",
        )
        .with_code(422);
        assert!(api_error(failed_test).is_conflict());
    }
}
