//! Time of one judgement for 1,000 and 10,000 samples per side (target: well under 1 ms per
//! thousand samples). Run with `cargo bench -p rollouts-analysis --bench judge`.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rollouts_analysis::judge::{JudgeConfig, judge};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Latency-like samples: lognormal around `median` milliseconds.
fn latencies(rng: &mut StdRng, median: f64, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let u1 = 1.0 - rng.random::<f64>();
            let u2 = rng.random::<f64>();
            let standard = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            median * (0.4 * standard).exp()
        })
        .collect()
}

fn main() {
    let cfg = JudgeConfig::default();
    let mut rng = StdRng::seed_from_u64(42);
    println!("judge: samples per side, verdict, median and best time per judgement");
    for n in [1_000usize, 10_000] {
        for (label, canary_median) in [("same", 100.0), ("shifted", 103.0)] {
            let canary = latencies(&mut rng, canary_median, n);
            let baseline = latencies(&mut rng, 100.0, n);
            let verdict = judge(&canary, &baseline, &cfg).expect("judge runs").verdict;
            let rounds = if n <= 1_000 { 200 } else { 30 };
            let mut times: Vec<Duration> = (0..rounds)
                .map(|_| {
                    let start = Instant::now();
                    black_box(judge(black_box(&canary), black_box(&baseline), &cfg).unwrap());
                    start.elapsed()
                })
                .collect();
            times.sort();
            let median = times[times.len() / 2];
            let per_thousand = median.as_secs_f64() * 1e3 / (n as f64 / 1_000.0);
            println!(
                "{n:>6} per side, {label:<7} -> {verdict:?}: median {median:?}, best {:?}, {per_thousand:.3} ms per thousand samples",
                times[0]
            );
        }
    }
}
