use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// The CRDs this module defines.
pub fn crds() -> Vec<CustomResourceDefinition> {
    Vec::new()
}
