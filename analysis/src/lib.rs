//! Analysis: the AnalysisRun engine (pure), condition evaluation, metric providers and the
//! baseline judge.

pub mod judge;
