//! The rollout controller: the pure planner that decides each Rollout's next move, and the
//! runtime shell around it (flags, watches, status writes, leader election, metrics, health).

pub mod cli;
pub mod context;
pub mod error;
pub mod health;
pub mod leader;
pub mod metrics;
pub mod planner;
pub mod reconcile;
pub mod startup;
pub mod status_patch;
