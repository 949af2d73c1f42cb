//! End-to-end support: `sim`, the Kubernetes API server simulator (binary `kube-sim`), and
//! `fake_prometheus`, the Prometheus stand-in of every test and bench. It works on plain JSON
//! and depends on none of our other crates.

pub mod chaos;
pub mod fake_prometheus;
pub mod harness;
pub mod scale_profile;
pub mod sim;
