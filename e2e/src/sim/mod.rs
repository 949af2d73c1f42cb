//! kube-sim: a Kubernetes API server and workload simulator on a loopback port, speaking
//! plain JSON so kube-rs and the real kubectl work against it unchanged.
//!
//! `server` routes HTTP to `discovery` (discovery and OpenAPI) and `handlers` (the verbs),
//! which read and write the `store` (objects, resourceVersions, event log, garbage
//! collection) and stream `watch`es from it; `controllers` simulate the ReplicaSet and
//! Deployment controllers and the kubelet; `handle` starts it all (`start`).

pub mod body;
pub mod controllers;
pub mod discovery;
pub mod faults;
mod handle;
pub mod handlers;
pub mod jsonpath;
pub mod meta;
pub mod output;
pub mod patch;
pub mod registry;
pub mod request_log;
pub mod scale;
pub mod selector;
pub mod server;
pub mod status;
pub mod store;
pub mod table;
pub mod traffic;
pub mod watch;

pub use controllers::PodReadiness;
pub use faults::Faults;
pub use handle::{SimHandle, SimOptions, start};
pub use request_log::RequestRecord;
