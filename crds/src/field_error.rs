//! A validation finding: which field, what is wrong with it, and how to fix it.

use std::fmt;

/// One problem found in a spec. `path` is the JSON path of the field as the user wrote it
/// (`spec.strategy.canary.steps[2].setWeight`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub path: String,
    pub reason: String,
    pub fix: String,
}

impl FieldError {
    pub fn new(path: impl Into<String>, reason: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            reason: reason.into(),
            fix: fix.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} (fix: {})", self.path, self.reason, self.fix)
    }
}
