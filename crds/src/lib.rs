//! `argoproj.io/v1alpha1` API types, field for field as Argo Rollouts defines them, plus our
//! additions as new optional fields. Also defaults, validation and condition constants.
//!
//! Each module that defines kinds exposes `crds()`; [`all_crds`] is what `crdgen` writes.

pub mod analysis;
pub mod conditions;
pub mod crdgen;
pub mod defaults;
pub mod duration;
pub mod experiment;
pub mod expression;
pub mod field_error;
pub mod rollout;
pub mod validation;

pub use field_error::FieldError;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// API group of every kind in this crate.
pub const GROUP: &str = "argoproj.io";
/// API version of every kind in this crate.
pub const VERSION: &str = "v1alpha1";

/// Every CustomResourceDefinition this project installs, in a stable order.
pub fn all_crds() -> Vec<CustomResourceDefinition> {
    let mut crds = rollout::crds();
    crds.extend(analysis::crds());
    crds.extend(experiment::crds());
    crds
}
