//! Analysis: the AnalysisRun engine (pure), condition evaluation, metric providers and the
//! baseline judge.

pub mod args;
pub mod compose;
pub mod condition;
pub mod engine;
pub mod judge;
pub mod provider;
