//! The rollout controller: the observe phase that reads what a Rollout's plan needs, the pure
//! planner that decides its next move, the act phase that applies it, and the runtime shell
//! around them (flags, watches, leader election, metrics, health).

pub mod act;
pub mod analysisrun;
pub mod claims;
pub mod cli;
pub mod context;
pub mod decode;
pub mod error;
pub mod events;
pub mod experiment;
pub mod health;
pub mod leader;
pub mod metrics;
pub mod notify;
pub mod observe;
pub mod owned_cache;
pub mod packed;
pub mod planner;
pub mod reconcile;
pub mod startup;
pub mod status_patch;
pub mod supervise;
pub mod throttle;
