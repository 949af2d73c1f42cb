//! The short fault soak of `make test`: ten Rollouts (two of each kind: basic canary, canary
//! behind nginx, canary with an analysis step, blue-green with pre-promotion analysis, canary
//! whose analysis fails) released at once while kube-sim injects 500s, 409s, 429s, cut watches,
//! forced relists and latency spikes from a fixed seed, and the controller is SIGKILLed and
//! restarted three times. Every release must reach its fault-free outcome, with no ReplicaSet,
//! step or AnalysisRun repeated and no step index going back. `make chaos` runs the long one.

use rollouts_e2e::chaos::{SoakConfig, run};

/// Change it to explore; a failure prints the seed that replays it.
const SEED: u64 = 17;

#[test]
fn ten_rollouts_converge_through_faults_and_kills() {
    let config = SoakConfig::new(SEED, 10).unwrap_or_else(|e| panic!("seed {SEED}: {e}"));
    let report = run(&config).unwrap_or_else(|e| panic!("{e}"));
    // Shown with --nocapture, and on failure.
    println!("{report}");
    assert!(report.passed(), "{report}");
    assert_eq!(report.converged, 10, "{report}");
    assert!(report.faults.total() > 0, "no fault was injected: {report}");
    assert_eq!(report.kills, config.kills, "{report}");
}
