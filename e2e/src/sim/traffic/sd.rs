//! The Prometheus `file_sd` target file: one target per pod, all on the metrics listener,
//! each with `__metrics_path__` pointing at the pod's own page and the labels Kubernetes
//! service discovery would give it. Written atomically (temp file and rename) as pods come
//! and go, so Prometheus never reads half a file.

use std::io;
use std::net::SocketAddr;
use std::path::Path;

use serde_json::{Value, json};

use crate::sim::store::ObjectKey;

/// The target groups for these pods, given as (key, template hash).
pub fn targets<'a>(
    address: SocketAddr,
    pods: impl Iterator<Item = (&'a ObjectKey, &'a str)>,
) -> Value {
    let groups: Vec<Value> = pods
        .map(|((ns, name), hash)| {
            let mut labels = json!({
                "__metrics_path__": format!("/metrics/pods/{ns}/{name}"),
                "namespace": ns,
                "pod": name,
            });
            if !hash.is_empty() {
                labels["rollouts_pod_template_hash"] = hash.into();
            }
            json!({"targets": [address.to_string()], "labels": labels})
        })
        .collect();
    Value::Array(groups)
}

pub fn write(path: &Path, targets: &Value) -> io::Result<()> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("--prometheus-sd-file {}: give a file path", path.display()),
        )
    })?;
    let mut temp_name = name.to_os_string();
    temp_name.push(".tmp");
    let temp = path.with_file_name(temp_name);
    let body = serde_json::to_vec_pretty(targets).expect("JSON values always serialize");
    std::fs::write(&temp, body)?;
    std::fs::rename(&temp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_pod_is_a_target_with_its_own_path_and_labels() {
        let key = ("ns".to_string(), "web-1".to_string());
        let plain = ("ns".to_string(), "tool".to_string());
        let address: SocketAddr = "127.0.0.1:9100".parse().expect("an address");
        let value = targets(address, [(&key, "abc"), (&plain, "")].into_iter());
        assert_eq!(value[0]["targets"][0], "127.0.0.1:9100");
        assert_eq!(
            value[0]["labels"]["__metrics_path__"],
            "/metrics/pods/ns/web-1"
        );
        assert_eq!(value[0]["labels"]["rollouts_pod_template_hash"], "abc");
        assert!(
            value[1]["labels"]
                .get("rollouts_pod_template_hash")
                .is_none()
        );
    }
}
