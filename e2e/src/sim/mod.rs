//! kube-sim: a Kubernetes API server and workload simulator on a loopback port.

pub mod patch;
pub mod selector;
pub mod table;
