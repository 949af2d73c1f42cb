//! Response shapes chosen by the Accept header: full objects, PartialObjectMetadata, or Table.

use std::time::SystemTime;

use serde_json::{Value, json};

use super::registry::ResourceInfo;
use super::table;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Full,
    /// `as=PartialObjectMetadata` / `as=PartialObjectMetadataList` (kube-rs metadata watches).
    Metadata,
    /// `as=Table` (kubectl get).
    Table,
}

impl Output {
    /// The first media range of the Accept header that we serve decides.
    pub fn from_accept(accept: &str) -> Self {
        for range in accept.split(',') {
            let params: Vec<&str> = range.split(';').map(str::trim).collect();
            match params.iter().find_map(|p| p.strip_prefix("as=")) {
                Some("Table") => return Output::Table,
                Some("PartialObjectMetadata" | "PartialObjectMetadataList") => {
                    return Output::Metadata;
                }
                Some(_) => continue,
                None => return Output::Full,
            }
        }
        Output::Full
    }
}

pub fn partial_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj["metadata"],
    })
}

fn table_of(info: &ResourceInfo, objects: &[Value], rv: &str) -> Value {
    table::table(
        &info.plural,
        &info.group,
        info.printer_columns.as_deref(),
        objects,
        rv,
        SystemTime::now(),
    )
}

/// One object as the client asked for it.
pub fn render_object(info: &ResourceInfo, obj: &Value, output: Output) -> Value {
    match output {
        Output::Full => obj.clone(),
        Output::Metadata => partial_metadata(obj),
        Output::Table => table_of(
            info,
            std::slice::from_ref(obj),
            obj["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default(),
        ),
    }
}

/// A list as the client asked for it; `continue_token` and `remaining` page it.
pub fn render_list(
    info: &ResourceInfo,
    items: Vec<Value>,
    output: Output,
    rv: u64,
    continue_token: Option<String>,
    remaining: usize,
) -> Value {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some(token) = continue_token {
        metadata["continue"] = token.into();
        metadata["remainingItemCount"] = remaining.into();
    }
    match output {
        Output::Full => json!({
            "kind": format!("{}List", info.kind),
            "apiVersion": info.api_version(),
            "metadata": metadata,
            "items": items,
        }),
        Output::Metadata => json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": metadata,
            "items": items.iter().map(partial_metadata).collect::<Vec<_>>(),
        }),
        Output::Table => {
            let mut t = table_of(info, &items, &rv.to_string());
            t["metadata"] = metadata;
            t
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_headers_pick_the_shape() {
        let kubectl = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(Output::from_accept(kubectl), Output::Table);
        let kube_rs =
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
        assert_eq!(Output::from_accept(kube_rs), Output::Metadata);
        assert_eq!(Output::from_accept(""), Output::Full);
        assert_eq!(Output::from_accept("application/json"), Output::Full);
        assert_eq!(
            Output::from_accept(
                "application/json;as=APIGroupDiscoveryList;g=apidiscovery.k8s.io;v=v2,application/json"
            ),
            Output::Full
        );
    }
}
