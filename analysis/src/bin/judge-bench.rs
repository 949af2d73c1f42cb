//! `judge-bench`: how often is the judge wrong on noisy traffic? Seeded trials of kube-sim's
//! noisy traffic model (Poisson arrivals at a load swinging +-20% over 2 minutes, errors drawn
//! with each pod's rate, log-normal latencies, a log-normal factor per pod), judged the ways a
//! template can judge it, and a table of how often each says High. It asserts nothing and is no
//! part of `make test`:
//!
//! ```text
//! cargo run -p rollouts-analysis --bin judge-bench -- [--trials 1000] [--seed 1]
//! ```
//!
//! Traffic: 500 requests/s (50 in the rows marked 50/s) split 80/20 over 4 stable pods and 1 canary pod; latency median
//! 100 ms, sigma of ln(latency) 0.3. A trial is one 5-minute canary: measured every minute
//! (windows of the last min(t, 5) minutes); "High at 5m" is the share of trials whose 5-minute
//! measurement is High, "first" the median minute of the first High among those that had one.
//! Samples are computed as Prometheus would from per-second counters: `rate(..[range])` ratios
//! and `histogram_quantile(0.99, ..)` over the default client buckets, every `step`.

use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rollouts_analysis::judge::{
    Counts, Direction, JudgeConfig, JudgeKind, Verdict, judge, judge_rates, normal_sf,
};

const RPS: f64 = 500.0;
/// The low-traffic rows' rate, where sampled error ratios are mostly zeros.
const LOW_RPS: f64 = 50.0;
const CANARY_SHARE: f64 = 0.2;
const STABLE_PODS: usize = 4;
const SECONDS: usize = 300;
const SWING: f64 = 0.2;
const SWING_PERIOD: f64 = 120.0;
const LATENCY_MEDIAN: f64 = 0.1;
const LATENCY_SPREAD: f64 = 0.3;
const BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// One side's per-second counters.
#[derive(Clone)]
struct Side {
    errors: Vec<f64>,
    total: Vec<f64>,
    /// Per second, requests per bucket (not cumulative), the last past every bound.
    buckets: Vec<[f64; BUCKETS.len() + 1]>,
}

/// What differs between the two sides in a row.
#[derive(Clone, Copy)]
struct Scenario {
    name: &'static str,
    stable_error_rate: f64,
    canary_error_rate: f64,
    /// Canary latency = stable latency x this (every quantile, p99 included).
    canary_latency_factor: f64,
    pod_spread: f64,
    latency: bool,
    /// Requests per second to the app (both sides together).
    rps: f64,
}

/// One way of judging a trial: a judge kind with its settings, or a fixed threshold.
#[derive(Clone, Copy)]
enum Method {
    /// `rate(..[range])` error ratio (or p99 over [range]) sampled every `step`, by ranks.
    Continuous {
        range: usize,
        step: usize,
        allowed_increase: f64,
    },
    /// Error counts over the window; `allowed_increase` gates the rate ratio.
    Ratio { allowed_increase: f64 },
    /// Argo's usual template: the canary's error rate over the window below `limit`.
    ErrorThreshold { limit: f64 },
    /// The canary's p99 over the window below `limit` seconds.
    LatencyThreshold { limit: f64 },
}

impl Method {
    fn label(self) -> String {
        match self {
            Method::Continuous {
                range,
                step,
                allowed_increase,
            } if allowed_increase > 1.0 => format!("ranks [{range}s]@{step}s x{allowed_increase}"),
            Method::Continuous { range, step, .. } => format!("ranks [{range}s]@{step}s"),
            Method::Ratio { allowed_increase } if allowed_increase > 1.0 => {
                format!("ratio x{allowed_increase}")
            }
            Method::Ratio { .. } => "ratio".to_owned(),
            Method::ErrorThreshold { limit } => format!("errors < {}%", limit * 100.0),
            Method::LatencyThreshold { limit } => format!("p99 < {}ms", limit * 1000.0),
        }
    }
}

fn main() {
    let mut trials = 1000usize;
    let mut seed = 1u64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().and_then(|v| v.parse::<u64>().ok());
        match (arg.as_str(), value) {
            ("--trials", Some(n)) if n > 0 => trials = n as usize,
            ("--seed", Some(s)) => seed = s,
            _ => {
                eprintln!("usage: judge-bench [--trials N (> 0)] [--seed S]");
                std::process::exit(2);
            }
        }
    }
    let errors_at = |rps, name, stable, canary, spread| Scenario {
        name,
        stable_error_rate: stable,
        canary_error_rate: canary,
        canary_latency_factor: 1.0,
        pod_spread: spread,
        latency: false,
        rps,
    };
    let errors = |name, stable, canary, spread| errors_at(RPS, name, stable, canary, spread);
    let latency = |name, factor, spread| Scenario {
        name,
        stable_error_rate: 0.0,
        canary_error_rate: 0.0,
        canary_latency_factor: factor,
        pod_spread: spread,
        latency: true,
        rps: RPS,
    };
    let error_rows = [
        errors("A/A 1%, pods alike", 0.01, 0.01, 0.0),
        errors("A/A 1%, pod spread 0.1", 0.01, 0.01, 0.1),
        errors("A/A 0.1%, pod spread 0.1", 0.001, 0.001, 0.1),
        errors("1% vs 2%", 0.01, 0.02, 0.1),
        errors("0.1% vs 0.5%", 0.001, 0.005, 0.1),
        errors("0% vs 0.2%", 0.0, 0.002, 0.1),
        errors_at(LOW_RPS, "50/s: A/A 0.1%, pods alike", 0.001, 0.001, 0.0),
        errors_at(LOW_RPS, "50/s: 1% vs 2%", 0.01, 0.02, 0.1),
        errors_at(LOW_RPS, "50/s: 0.1% vs 0.5%", 0.001, 0.005, 0.1),
        errors_at(LOW_RPS, "50/s: 0% vs 0.2%", 0.0, 0.002, 0.1),
    ];
    let latency_rows = [
        latency("A/A latency, pods alike", 1.0, 0.0),
        latency("A/A latency, pod spread 0.1", 1.0, 0.1),
        latency("p99 +20%", 1.2, 0.1),
        latency("p99 +50%", 1.5, 0.1),
    ];
    let ranks = |range, step, allowed_increase| Method::Continuous {
        range,
        step,
        allowed_increase,
    };
    let error_methods = [
        ranks(60, 15, 1.0),
        ranks(15, 15, 1.0),
        ranks(15, 15, 1.2),
        Method::Ratio {
            allowed_increase: 1.0,
        },
        Method::Ratio {
            allowed_increase: 1.2,
        },
        Method::ErrorThreshold { limit: 0.05 },
    ];
    let latency_methods = [
        ranks(60, 15, 1.0),
        ranks(15, 15, 1.0),
        ranks(60, 60, 1.0),
        ranks(15, 15, 1.1),
        Method::LatencyThreshold { limit: 0.25 },
    ];
    println!(
        "judge-bench: {trials} trials per row, seed {seed}; {RPS} requests/s ({LOW_RPS} in rows \
         marked 50/s) split 80/20 \
         ({STABLE_PODS} stable pods, 1 canary pod), 5-minute canary measured every minute; \
         judge confidence 0.98, direction increase, minSamples 5, minRequests 100"
    );
    println!("cell: share of trials High at 5m / median minute of the first High\n");
    let started = Instant::now();
    table(&error_rows, &error_methods, trials, seed);
    println!();
    table(&latency_rows, &latency_methods, trials, seed);
    println!("\n({:.1}s)", started.elapsed().as_secs_f64());
}

fn table(rows: &[Scenario], methods: &[Method], trials: usize, seed: u64) {
    let mut header = format!("{:<28}", "");
    for method in methods {
        header.push_str(&format!("{:>22}", method.label()));
    }
    println!("{header}");
    for (row, scenario) in rows.iter().enumerate() {
        let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(1_000).wrapping_add(row as u64));
        let mut high_at_end = vec![0usize; methods.len()];
        let mut first_high: Vec<Vec<usize>> = vec![Vec::new(); methods.len()];
        for _ in 0..trials {
            let (canary, stable) = simulate(&mut rng, scenario);
            for (m, method) in methods.iter().enumerate() {
                let verdicts: Vec<Verdict> = (1..=SECONDS / 60)
                    .map(|minute| measure(*method, &canary, &stable, minute * 60))
                    .collect();
                if verdicts.last() == Some(&Verdict::High) {
                    high_at_end[m] += 1;
                }
                if let Some(first) = verdicts.iter().position(|v| *v == Verdict::High) {
                    first_high[m].push(first + 1);
                }
            }
        }
        let mut line = format!("{:<28}", scenario.name);
        for m in 0..methods.len() {
            let share = 100.0 * high_at_end[m] as f64 / trials as f64;
            let first = &mut first_high[m];
            first.sort_unstable();
            let minute = first
                .get(first.len() / 2)
                .map_or_else(|| "-".to_owned(), |f| format!("{f}m"));
            line.push_str(&format!("{:>22}", format!("{share:.1}% / {minute}")));
        }
        println!("{line}");
    }
}

/// The verdict of a measurement at `now` seconds over the last min(now, 300) seconds.
fn measure(method: Method, canary: &Side, stable: &Side, now: usize) -> Verdict {
    let start = now.saturating_sub(SECONDS);
    let cfg = JudgeConfig {
        direction: Direction::Increase,
        ..JudgeConfig::default()
    };
    match method {
        Method::Continuous {
            range,
            step,
            allowed_increase,
        } => {
            let latency = !canary.buckets.is_empty();
            let samples = |side: &Side| sampled(side, start, now, range, step, latency);
            let cfg = JudgeConfig {
                allowed_increase,
                ..cfg
            };
            match judge(&samples(canary), &samples(stable), &cfg) {
                Ok(outcome) => outcome.verdict,
                Err(_) => Verdict::Pass,
            }
        }
        Method::Ratio { allowed_increase } => {
            let counts = |side: &Side| Counts {
                errors: side.errors[start..now].iter().sum(),
                total: side.total[start..now].iter().sum(),
            };
            let cfg = JudgeConfig {
                kind: JudgeKind::Ratio,
                allowed_increase,
                ..cfg
            };
            judge_rates(counts(canary), counts(stable), &cfg).map_or(Verdict::Pass, |o| o.verdict)
        }
        Method::ErrorThreshold { limit } => {
            let errors: f64 = canary.errors[start..now].iter().sum();
            let total: f64 = canary.total[start..now].iter().sum();
            threshold(total > 0.0 && errors / total >= limit)
        }
        Method::LatencyThreshold { limit } => {
            threshold(p99(&canary.buckets[start..now]).is_some_and(|p| p >= limit))
        }
    }
}

fn threshold(failed: bool) -> Verdict {
    if failed { Verdict::High } else { Verdict::Pass }
}

/// Samples of a range query over [start, now] at `step`: each the error ratio (or p99) of the
/// `range` seconds before it; NaN when there were no requests, none before a full range exists.
fn sampled(
    side: &Side,
    start: usize,
    now: usize,
    range: usize,
    step: usize,
    latency: bool,
) -> Vec<f64> {
    let mut samples = Vec::new();
    let mut t = start;
    while t <= now {
        if t >= range {
            let span = t - range..t;
            samples.push(if latency {
                p99(&side.buckets[span]).unwrap_or(f64::NAN)
            } else {
                let errors: f64 = side.errors[span.clone()].iter().sum();
                let total: f64 = side.total[span].iter().sum();
                errors / total
            });
        }
        t += step;
    }
    samples
}

/// `histogram_quantile(0.99, ..)` of summed per-second buckets: linear within the bucket the
/// rank falls in, the highest finite bound when it falls past them; None without requests.
fn p99(seconds: &[[f64; BUCKETS.len() + 1]]) -> Option<f64> {
    let mut counts = [0.0; BUCKETS.len() + 1];
    for second in seconds {
        for (sum, c) in counts.iter_mut().zip(second) {
            *sum += c;
        }
    }
    let total: f64 = counts.iter().sum();
    if total == 0.0 {
        return None;
    }
    let rank = 0.99 * total;
    let mut cumulative = 0.0;
    for (i, count) in counts.iter().enumerate() {
        if cumulative + count >= rank {
            if i == BUCKETS.len() {
                return Some(BUCKETS[BUCKETS.len() - 1]);
            }
            let lower = if i == 0 { 0.0 } else { BUCKETS[i - 1] };
            let within = if *count > 0.0 {
                (rank - cumulative) / count
            } else {
                0.0
            };
            return Some(lower + (BUCKETS[i] - lower) * within);
        }
        cumulative += count;
    }
    Some(BUCKETS[BUCKETS.len() - 1])
}

/// Five minutes of one trial: (canary, stable) counters. A Poisson process thinned by
/// independent outcomes gives independent Poisson counts per outcome, so each second's errors,
/// successes and latency buckets are drawn as Poisson counts per pod.
fn simulate(rng: &mut StdRng, scenario: &Scenario) -> (Side, Side) {
    let phase = rng.random::<f64>() * std::f64::consts::TAU;
    let factor = |rng: &mut StdRng| (scenario.pod_spread * standard_normal(rng)).exp();
    let canary_pods = vec![factor(rng)];
    let stable_pods: Vec<f64> = (0..STABLE_PODS).map(|_| factor(rng)).collect();
    let side = |rng: &mut StdRng, pods: &[f64], share: f64, error_rate: f64, latency: f64| {
        let mut out = Side {
            errors: vec![0.0; SECONDS],
            total: vec![0.0; SECONDS],
            buckets: if scenario.latency {
                vec![[0.0; BUCKETS.len() + 1]; SECONDS]
            } else {
                Vec::new()
            },
        };
        for second in 0..SECONDS {
            let load = scenario.rps
                * (1.0
                    + SWING * (std::f64::consts::TAU * second as f64 / SWING_PERIOD + phase).sin());
            let per_pod = load * share / pods.len() as f64;
            for pod in pods {
                let p = (error_rate * pod).min(1.0);
                let errors = poisson(rng, per_pod * p) as f64;
                let ok = poisson(rng, per_pod * (1.0 - p)) as f64;
                out.errors[second] += errors;
                out.total[second] += errors + ok;
                if scenario.latency {
                    let median = latency * pod;
                    let mut below = 0.0;
                    for (i, bound) in BUCKETS.iter().enumerate() {
                        let cdf = normal_sf(-((bound / median).ln() / LATENCY_SPREAD));
                        out.buckets[second][i] += poisson(rng, per_pod * (cdf - below)) as f64;
                        below = cdf;
                    }
                    out.buckets[second][BUCKETS.len()] +=
                        poisson(rng, per_pod * (1.0 - below)) as f64;
                }
            }
        }
        out
    };
    let canary = side(
        rng,
        &canary_pods,
        CANARY_SHARE,
        scenario.canary_error_rate,
        LATENCY_MEDIAN * scenario.canary_latency_factor,
    );
    let stable = side(
        rng,
        &stable_pods,
        1.0 - CANARY_SHARE,
        scenario.stable_error_rate,
        LATENCY_MEDIAN,
    );
    (canary, stable)
}

fn standard_normal(rng: &mut StdRng) -> f64 {
    let u1 = 1.0 - rng.random::<f64>();
    let u2 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// A Poisson draw: Knuth's product of uniforms for small means, a rounded normal (mean and
/// variance `mean`) from 50 up, where the two differ by less than the trial-to-trial noise.
fn poisson(rng: &mut StdRng, mean: f64) -> u64 {
    if mean.is_nan() || mean <= 0.0 {
        return 0;
    }
    if mean >= 50.0 {
        return (mean + mean.sqrt() * standard_normal(rng)).round().max(0.0) as u64;
    }
    let limit = (-mean).exp();
    let mut count = 0;
    let mut product = rng.random::<f64>();
    while product > limit {
        count += 1;
        product *= rng.random::<f64>();
    }
    count
}
