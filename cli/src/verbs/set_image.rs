//! `set image NAME CONTAINER=IMAGE`: change a container's image in a rollout's pod template, or
//! in the Deployment its `spec.workloadRef` names.
//!
//! Argo's plugin rewrites the whole object (PUT). We send a JSON patch (RFC 6902) that changes
//! only the image fields, each guarded by a `test` of the container's name at that index, so a
//! concurrent change to the container list fails the patch instead of hitting the wrong
//! container; the verb then reads again and retries.

use serde_json::{Value, json};

use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::patch::{PatchRequest, PatchType, TargetKind};
use crate::verbs::{kind_word, template_holder};

/// Container lists of a pod spec that carry images, in the order Argo's plugin visits them.
const CONTAINER_LISTS: [&str; 3] = ["initContainers", "containers", "ephemeralContainers"];

/// How many times a patch that lost a race is recomputed and sent again.
const MAX_ATTEMPTS: usize = 5;

/// What to set.
#[derive(Debug, clap::Subcommand)]
pub enum SetKind {
    /// Update the image of a rollout's container (`*=IMAGE` sets every container).
    Image(Args),
}

/// `set image` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Name of the rollout.
    pub name: String,
    /// CONTAINER=IMAGE, or *=IMAGE for every container.
    #[arg(value_name = "CONTAINER=IMAGE")]
    pub assignment: String,
}

/// Splits `CONTAINER=IMAGE`.
pub fn parse_assignment(text: &str) -> Result<(&str, &str)> {
    match text.split_once('=') {
        Some((container, image))
            if !container.is_empty() && !image.is_empty() && !image.contains('=') =>
        {
            Ok((container, image))
        }
        _ => Err(Error::Invalid(format!(
            "{text:?} is not CONTAINER=IMAGE (fix: write e.g. app=registry.example/app:1.2.3, or *=IMAGE for every container)"
        ))),
    }
}

/// The JSON patch that sets `image` on the container(s) named `container` (`*` for all) in
/// `object`'s `spec.template`.
pub fn set_image_patch(
    target: TargetKind,
    name: &str,
    object: &Value,
    container: &str,
    image: &str,
) -> Result<PatchRequest> {
    let mut operations = Vec::new();
    let mut seen = Vec::new();
    for list in CONTAINER_LISTS {
        let containers = object
            .pointer(&format!("/spec/template/spec/{list}"))
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        for (index, entry) in containers.iter().enumerate() {
            let entry_name = entry
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            seen.push(entry_name.to_string());
            if container != "*" && entry_name != container {
                continue;
            }
            let base = format!("/spec/template/spec/{list}/{index}");
            operations
                .push(json!({"op": "test", "path": format!("{base}/name"), "value": entry_name}));
            let op = if entry.get("image").is_some() {
                "replace"
            } else {
                "add"
            };
            operations.push(json!({"op": op, "path": format!("{base}/image"), "value": image}));
        }
    }
    if operations.is_empty() {
        let kind = kind_word(target);
        let known = if seen.is_empty() {
            "it has none".to_string()
        } else {
            format!("it has {}", seen.join(", "))
        };
        return Err(Error::Invalid(format!(
            "unable to find container named \"{container}\" in {kind} '{name}' spec.template.spec ({known}) (fix: name one of its containers, or use *=IMAGE for all)"
        )));
    }
    Ok(PatchRequest {
        target,
        name: name.to_string(),
        subresource: None,
        patch_type: PatchType::Json,
        body: Value::Array(operations),
    })
}

/// Sets `image` on `container` of rollout `rollout`'s template (in the Deployment it names,
/// with `workloadRef`); retries when the object changed meanwhile. The sentence to print.
pub async fn set_image(
    cluster: &Cluster,
    rollout: &str,
    container: &str,
    image: &str,
) -> Result<String> {
    let mut attempt = 1;
    loop {
        let object = crate::verbs::to_json(cluster.object(TargetKind::Rollout, rollout).await?)?;
        let (target, name) = template_holder(rollout, &object)?;
        let holder = match target {
            TargetKind::Rollout => object,
            _ => crate::verbs::to_json(cluster.object(target, &name).await?)?,
        };
        let patch = set_image_patch(target, &name, &holder, container, image)?;
        match cluster.apply(&patch).await {
            Ok(_) => return Ok(format!("{} \"{name}\" image updated", kind_word(target))),
            Err(err) if err.is_conflict() && attempt < MAX_ATTEMPTS => attempt += 1,
            Err(err) => return Err(err),
        }
    }
}

/// Parses the assignment, sets the image, prints what was updated.
pub async fn run(cluster: &Cluster, kind: &SetKind) -> Result<()> {
    let SetKind::Image(args) = kind;
    let (container, image) = parse_assignment(&args.assignment)?;
    println!(
        "{}",
        set_image(cluster, &args.name, container, image).await?
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rollout() -> Value {
        json!({
            "metadata": {"name": "web"},
            "spec": {"template": {"spec": {
                "initContainers": [{"name": "migrate", "image": "web:1"}],
                "containers": [
                    {"name": "sidecar", "image": "proxy:2"},
                    {"name": "web", "image": "web:1"}
                ]
            }}}
        })
    }

    #[test]
    fn one_container_gets_a_guarded_replace() {
        let patch =
            set_image_patch(TargetKind::Rollout, "web", &rollout(), "web", "web:2").unwrap();
        assert_eq!(patch.target, TargetKind::Rollout);
        assert_eq!(patch.subresource, None);
        assert_eq!(patch.patch_type, PatchType::Json);
        assert_eq!(
            patch.body,
            json!([
                {"op": "test", "path": "/spec/template/spec/containers/1/name", "value": "web"},
                {"op": "replace", "path": "/spec/template/spec/containers/1/image", "value": "web:2"}
            ])
        );
    }

    #[test]
    fn star_sets_every_container_including_init_containers() {
        let patch = set_image_patch(TargetKind::Rollout, "web", &rollout(), "*", "web:3").unwrap();
        let paths: Vec<&str> = patch
            .body
            .as_array()
            .unwrap()
            .iter()
            .filter(|op| op["op"] == "replace")
            .map(|op| op["path"].as_str().unwrap())
            .collect();
        assert_eq!(
            paths,
            vec![
                "/spec/template/spec/initContainers/0/image",
                "/spec/template/spec/containers/0/image",
                "/spec/template/spec/containers/1/image",
            ]
        );
    }

    #[test]
    fn an_unknown_container_lists_the_ones_there() {
        let err = set_image_patch(TargetKind::Rollout, "web", &rollout(), "api", "api:1")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "error: unable to find container named \"api\" in rollout 'web' spec.template.spec (it has migrate, sidecar, web) (fix: name one of its containers, or use *=IMAGE for all)"
        );
    }

    #[test]
    fn a_workload_ref_sends_the_patch_to_the_deployment() {
        let with_ref = json!({"spec": {"workloadRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web-deploy"}}});
        assert_eq!(
            template_holder("web", &with_ref).unwrap(),
            (TargetKind::Deployment, "web-deploy".to_string())
        );
        assert_eq!(
            template_holder("web", &rollout()).unwrap(),
            (TargetKind::Rollout, "web".to_string())
        );
        let other = json!({"spec": {"workloadRef": {"kind": "ReplicaSet", "name": "x"}}});
        assert!(
            template_holder("web", &other)
                .unwrap_err()
                .to_string()
                .contains("spec.workloadRef.kind")
        );
    }

    #[test]
    fn assignments_must_be_container_equals_image() {
        assert_eq!(parse_assignment("web=web:2").unwrap(), ("web", "web:2"));
        assert_eq!(parse_assignment("*=web:2").unwrap(), ("*", "web:2"));
        assert!(parse_assignment("web:2").is_err());
        assert!(parse_assignment("=web:2").is_err());
        assert!(parse_assignment("web=").is_err());
    }
}
