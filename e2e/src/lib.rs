//! End-to-end support: `sim`, the Kubernetes API server simulator (binary `kube-sim`).
//! It works on plain JSON and depends on none of our other crates.

pub mod harness;
pub mod sim;
