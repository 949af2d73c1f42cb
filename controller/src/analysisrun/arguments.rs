//! The run's arguments that are not plain values: `fieldRef`s read from the run's own metadata,
//! `secretKeyRef`s read from Secrets in its namespace.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;
use rollouts_crds::analysis::{AnalysisRun, AnalysisRunSpec};

use super::context::AnalysisContext;
use super::{Error, Result};

/// A `fieldRef` argument whose path is not one of the run's metadata fields; the run ends in
/// Error with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Unable to resolve metric arguments: spec.args[{index}].valueFrom.fieldRef.fieldPath {path:?} (argument {argument:?}) is not a field of the AnalysisRun's metadata: use metadata.name, metadata.namespace, metadata.uid, metadata.labels['<key>'] or metadata.annotations['<key>']"
)]
pub struct UnsupportedFieldRef {
    /// The argument's index in `spec.args`.
    pub index: usize,
    pub path: String,
    pub argument: String,
}

/// Why a `secretKeyRef` argument has no value; the run ends in Error with this reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error(
        "secret {secret:?} not found in namespace {namespace}: create it or fix valueFrom.secretKeyRef.name"
    )]
    NotFound { secret: String, namespace: String },
    #[error(
        "key '{key}' does not exist in secret '{secret}': add it or fix valueFrom.secretKeyRef.key"
    )]
    MissingKey { secret: String, key: String },
    /// A refusal no retry mends (403 Forbidden, 401, a malformed answer): the run ends in
    /// Error saying so, instead of retrying forever with the run Running.
    #[error(
        "secret {secret:?} in namespace {namespace} cannot be read: {reason}: grant the controller get on secrets there, or fix valueFrom.secretKeyRef.name"
    )]
    Unreadable {
        secret: String,
        namespace: String,
        reason: String,
    },
    /// Never seen: every secretKeyRef of the spec is read before arguments are resolved.
    #[error("not read")]
    NotRead,
}

/// The run's spec with `fieldRef` arguments turned into values read from the run's own
/// metadata, as Kubernetes' downward API reads them; an unsupported path ends the run in Error.
pub fn field_refs_resolved(run: &AnalysisRun) -> Result<AnalysisRunSpec, UnsupportedFieldRef> {
    let mut spec = run.spec.clone();
    for (index, arg) in spec.args.iter_mut().enumerate() {
        let Some(field_ref) = arg.value_from.as_ref().and_then(|f| f.field_ref.as_ref()) else {
            continue;
        };
        let path = field_ref.field_path.clone();
        let value = metadata_field(run, &path).ok_or_else(|| UnsupportedFieldRef {
            index,
            path: path.clone(),
            argument: arg.name.clone(),
        })?;
        arg.value = Some(value);
        arg.value_from = None;
    }
    Ok(spec)
}

/// A downward-API metadata path of the run: a missing label or annotation is empty, whole
/// label and annotation maps are `key="value"` lines in key order.
fn metadata_field(run: &AnalysisRun, path: &str) -> Option<String> {
    let format_map = |map: &BTreeMap<String, String>| {
        map.iter()
            .map(|(k, v)| format!("{k}={v:?}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let keyed = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix("['"))
            .and_then(|rest| rest.strip_suffix("']"))
            .filter(|key| !key.is_empty())
    };
    match path {
        "metadata.name" => Some(run.name_any()),
        "metadata.namespace" => Some(run.namespace().unwrap_or_default()),
        "metadata.uid" => Some(run.uid().unwrap_or_default()),
        "metadata.labels" => Some(format_map(run.labels())),
        "metadata.annotations" => Some(format_map(run.annotations())),
        _ => {
            if let Some(key) = keyed("metadata.labels") {
                return Some(run.labels().get(key).cloned().unwrap_or_default());
            }
            keyed("metadata.annotations")
                .map(|key| run.annotations().get(key).cloned().unwrap_or_default())
        }
    }
}

/// Reads every Secret key the arguments name: the value, or why it cannot be had (missing
/// Secret or key, or a refusal no retry mends, such as 403), by (secret, key). A passing
/// failure (5xx, 429, no answer) is the reconcile's error: it backs off and reads again.
pub(super) async fn read_secrets(
    run: &AnalysisRun,
    namespace: &str,
    spec: &AnalysisRunSpec,
    ctx: &AnalysisContext,
) -> Result<BTreeMap<(String, String), Result<String, SecretError>>> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    // By Secret name: the Secret, none, or why it could not be read.
    let mut read: BTreeMap<String, std::result::Result<Option<Secret>, String>> = BTreeMap::new();
    let mut values = BTreeMap::new();
    for arg in &spec.args {
        let Some(reference) = arg
            .value_from
            .as_ref()
            .and_then(|f| f.secret_key_ref.as_ref())
        else {
            continue;
        };
        if !read.contains_key(&reference.name) {
            let secret = match api.get_opt(&reference.name).await {
                Ok(secret) => Ok(secret),
                // A passing failure: the reconcile backs off and reads again.
                Err(source) if crate::error::is_transient(&source) => {
                    return Err(Error::ReadSecret {
                        namespace: namespace.to_string(),
                        secret: reference.name.clone(),
                        argument: arg.name.clone(),
                        run: run.name_any(),
                        source: Box::new(source),
                    });
                }
                Err(source) => Err(unreadable_reason(&source)),
            };
            read.insert(reference.name.clone(), secret);
        }
        let value = match read.get(&reference.name) {
            Some(Err(reason)) => Err(SecretError::Unreadable {
                secret: reference.name.clone(),
                namespace: namespace.to_string(),
                reason: reason.clone(),
            }),
            Some(Ok(None)) | None => Err(SecretError::NotFound {
                secret: reference.name.clone(),
                namespace: namespace.to_string(),
            }),
            Some(Ok(Some(secret))) => secret
                .data
                .as_ref()
                .and_then(|data| data.get(&reference.key))
                .map(|bytes| String::from_utf8_lossy(&bytes.0).into_owned())
                .ok_or_else(|| SecretError::MissingKey {
                    secret: reference.name.clone(),
                    key: reference.key.clone(),
                }),
        };
        values.insert((reference.name.clone(), reference.key.clone()), value);
    }
    Ok(values)
}

/// What the API server said when refusing a Secret read, without anything the Secret holds.
fn unreadable_reason(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => {
            format!("{} {}: {}", status.code, status.reason, status.message)
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use rollouts_crds::rollout::{AnalysisRunArgument, ArgumentValueFrom, FieldRef};

    use super::super::fixtures::run_with_args;
    use super::*;

    fn field_arg(name: &str, path: &str) -> AnalysisRunArgument {
        AnalysisRunArgument {
            name: name.into(),
            value: None,
            value_from: Some(ArgumentValueFrom {
                field_ref: Some(FieldRef {
                    field_path: path.into(),
                }),
                ..ArgumentValueFrom::default()
            }),
        }
    }

    #[test]
    fn field_refs_read_the_runs_own_metadata() {
        let run = run_with_args(vec![
            field_arg("name", "metadata.name"),
            field_arg("namespace", "metadata.namespace"),
            field_arg("uid", "metadata.uid"),
            field_arg("app", "metadata.labels['app']"),
            field_arg("missing", "metadata.annotations['owner']"),
            field_arg("labels", "metadata.labels"),
            AnalysisRunArgument {
                name: "plain".into(),
                value: Some("kept".into()),
                value_from: None,
            },
        ]);
        let spec = field_refs_resolved(&run).expect("every path resolves");
        let values: Vec<(&str, Option<&str>)> = spec
            .args
            .iter()
            .map(|a| (a.name.as_str(), a.value.as_deref()))
            .collect();
        assert_eq!(
            values,
            [
                ("name", Some("checkout-abc-1")),
                ("namespace", Some("shop")),
                ("uid", Some("6c1c0a52")),
                ("app", Some("checkout")),
                ("missing", Some("")),
                ("labels", Some("app=\"checkout\"\ntier=\"web\"")),
                ("plain", Some("kept")),
            ]
        );
        assert!(spec.args.iter().all(|a| a.value_from.is_none()));
    }

    #[test]
    fn an_unsupported_field_path_names_the_argument_and_the_fix() {
        let run = run_with_args(vec![
            field_arg("ok", "metadata.name"),
            field_arg("replicas", "spec.replicas"),
        ]);
        let message = field_refs_resolved(&run)
            .expect_err("spec paths are not metadata")
            .to_string();
        assert!(
            message.contains("spec.args[1].valueFrom.fieldRef.fieldPath \"spec.replicas\""),
            "{message}"
        );
        assert!(message.contains("argument \"replicas\""), "{message}");
        assert!(message.contains("use metadata.name"), "{message}");
    }
}
