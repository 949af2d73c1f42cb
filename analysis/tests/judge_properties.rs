//! Properties the judge's verdict must have, checked over seeded random samples.
//!
//! The interval's ends come from Brent's method with a tolerance of 1e-4 of the search range, so
//! a verdict whose deciding bound lies within that tolerance of its threshold may legitimately go
//! either way; such knife-edge cases are counted and left out, every other case must hold exactly.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rollouts_analysis::judge::{JudgeConfig, JudgeOutcome, NanHandling, Verdict, judge};

fn normal(rng: &mut StdRng, mean: f64, sd: f64, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let u1 = 1.0 - rng.random::<f64>();
            let u2 = rng.random::<f64>();
            mean + sd * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
        })
        .collect()
}

fn search_width(canary: &[f64], baseline: &[f64]) -> f64 {
    let range = |v: &[f64]| {
        v.iter().copied().fold(f64::MIN, f64::max) - v.iter().copied().fold(f64::MAX, f64::min)
    };
    range(canary) + range(baseline)
}

/// True when a bound lies so close to its threshold that Brent's tolerance decides the verdict.
fn knife_edge(outcome: &JudgeOutcome, width: f64) -> bool {
    let (Some(lower), Some(upper), Some(shift)) = (outcome.lower, outcome.upper, outcome.shift)
    else {
        return false;
    };
    let tolerance = 0.25 * shift.abs();
    let slack = 3e-4 * width;
    (lower - tolerance).abs() <= slack || (upper + tolerance).abs() <= slack
}

fn mirrored(verdict: Verdict) -> Verdict {
    match verdict {
        Verdict::High => Verdict::Low,
        Verdict::Low => Verdict::High,
        other => other,
    }
}

/// Sample pairs around 100 with the canary moved by a multiple of the spread, both positive.
fn random_pairs(count: u64) -> impl Iterator<Item = (u64, Vec<f64>, Vec<f64>)> {
    const MOVES: [f64; 9] = [-4.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 4.0];
    (0..count).map(|seed| {
        let mut rng = StdRng::seed_from_u64(seed);
        let canary_n = rng.random_range(8..60);
        let baseline_n = rng.random_range(8..60);
        let moved = MOVES[rng.random_range(0..MOVES.len())];
        let canary = normal(&mut rng, 100.0 + 5.0 * moved, 5.0, canary_n);
        let baseline = normal(&mut rng, 100.0, 5.0, baseline_n);
        (seed, canary, baseline)
    })
}

#[test]
fn swapping_sides_flips_high_and_low() {
    let cfg = JudgeConfig::default();
    let (mut checked, mut seen_high) = (0, 0);
    for (seed, canary, baseline) in random_pairs(120) {
        let forward = judge(&canary, &baseline, &cfg).unwrap();
        let swapped = judge(&baseline, &canary, &cfg).unwrap();
        let width = search_width(&canary, &baseline);
        // The interval of baseline - canary is the mirror image of canary - baseline.
        let slack = 3e-4 * width;
        assert!(
            (forward.lower.unwrap() + swapped.upper.unwrap()).abs() <= slack,
            "seed {seed}"
        );
        assert!(
            (forward.upper.unwrap() + swapped.lower.unwrap()).abs() <= slack,
            "seed {seed}"
        );
        if knife_edge(&forward, width) || knife_edge(&swapped, width) {
            continue;
        }
        assert_eq!(
            swapped.verdict,
            mirrored(forward.verdict),
            "seed {seed}: {} / swapped: {}",
            forward.reason,
            swapped.reason
        );
        checked += 1;
        seen_high += usize::from(forward.verdict == Verdict::High);
    }
    assert!(
        checked >= 100,
        "only {checked} of 120 cases were clear of the threshold"
    );
    assert!(seen_high > 0, "the generated cases never produced a High");
}

#[test]
fn shifting_both_sides_changes_nothing() {
    let cfg = JudgeConfig::default();
    let mut checked = 0;
    for (seed, canary, baseline) in random_pairs(120) {
        let before = judge(&canary, &baseline, &cfg).unwrap();
        let moved = |v: &[f64]| v.iter().map(|s| s + 37.5).collect::<Vec<_>>();
        let after = judge(&moved(&canary), &moved(&baseline), &cfg).unwrap();
        let width = search_width(&canary, &baseline);
        let slack = 3e-4 * width;
        for (name, a, b) in [
            ("shift", before.shift, after.shift),
            ("lower", before.lower, after.lower),
            ("upper", before.upper, after.upper),
        ] {
            let (a, b) = (a.unwrap(), b.unwrap());
            assert!((a - b).abs() <= slack, "seed {seed}: {name} {a} became {b}");
        }
        if knife_edge(&before, width) || knife_edge(&after, width) {
            continue;
        }
        assert_eq!(before.verdict, after.verdict, "seed {seed}");
        checked += 1;
    }
    assert!(
        checked >= 100,
        "only {checked} of 120 cases were clear of the threshold"
    );
}

#[test]
fn scaling_both_sides_changes_no_verdict() {
    let cfg = JudgeConfig::default();
    let mut checked = 0;
    for (seed, canary, baseline) in random_pairs(60) {
        let before = judge(&canary, &baseline, &cfg).unwrap();
        for factor in [1e-6, 0.37, 1e6] {
            let scaled = |v: &[f64]| v.iter().map(|s| s * factor).collect::<Vec<_>>();
            let after = judge(&scaled(&canary), &scaled(&baseline), &cfg).unwrap();
            let width = search_width(&canary, &baseline);
            let slack = 3e-4 * width * factor;
            let (a, b) = (before.lower.unwrap() * factor, after.lower.unwrap());
            assert!(
                (a - b).abs() <= slack,
                "seed {seed} x{factor}: lower {a} became {b}"
            );
            if knife_edge(&before, width) {
                continue;
            }
            assert_eq!(before.verdict, after.verdict, "seed {seed} x{factor}");
            checked += 1;
        }
    }
    assert!(
        checked >= 150,
        "only {checked} of 180 cases were clear of the threshold"
    );
}

#[test]
fn more_samples_from_the_same_distributions_keep_a_clear_verdict() {
    let cfg = JudgeConfig::default();
    let mut checked = 0;
    for seed in 0..40u64 {
        let mut rng = StdRng::seed_from_u64(1000 + seed);
        // A clear regression: the canary is two spreads above, or below, the baseline.
        let moved = if seed % 2 == 0 { 10.0 } else { -10.0 };
        let expected = if moved > 0.0 {
            Verdict::High
        } else {
            Verdict::Low
        };
        let mut canary = normal(&mut rng, 100.0 + moved, 5.0, 20);
        let mut baseline = normal(&mut rng, 100.0, 5.0, 20);
        let first = judge(&canary, &baseline, &cfg).unwrap();
        assert_eq!(first.verdict, expected, "seed {seed}: {}", first.reason);
        for _ in 0..4 {
            let (canary_extra, baseline_extra) = (rng.random_range(1..30), rng.random_range(1..30));
            canary.extend(normal(&mut rng, 100.0 + moved, 5.0, canary_extra));
            baseline.extend(normal(&mut rng, 100.0, 5.0, baseline_extra));
            let later = judge(&canary, &baseline, &cfg).unwrap();
            assert_eq!(later.verdict, expected, "seed {seed}: {}", later.reason);
            checked += 1;
        }
    }
    assert_eq!(checked, 160);
}

#[test]
fn a_side_of_only_nan_is_no_data() {
    let cfg = JudgeConfig::default();
    for seed in 0..20u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let n = rng.random_range(1..40);
        let samples = normal(&mut rng, 0.01, 0.002, n);
        let nans = vec![f64::NAN; rng.random_range(0..40)];
        let canary_blind = judge(&nans, &samples, &cfg).unwrap();
        let baseline_blind = judge(&samples, &nans, &cfg).unwrap();
        for outcome in [&canary_blind, &baseline_blind] {
            assert_eq!(
                outcome.verdict,
                Verdict::NoData,
                "seed {seed}: {}",
                outcome.reason
            );
            assert_eq!(outcome.mean_ratio, None);
        }
        assert_eq!(canary_blind.canary_samples, 0);
        assert_eq!(canary_blind.baseline_samples, n);
    }
}

#[test]
fn nan_as_zero_counts_the_samples() {
    let cfg = JudgeConfig {
        nan_handling: NanHandling::Zero,
        ..JudgeConfig::default()
    };
    let outcome = judge(&[f64::NAN; 10], &[0.0; 10], &cfg).unwrap();
    assert_eq!(outcome.verdict, Verdict::Pass, "{}", outcome.reason);
    assert_eq!(outcome.canary_samples, 10);
}

#[test]
fn identical_samples_pass_in_any_order() {
    let cfg = JudgeConfig::default();
    for seed in 0..20u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let n = rng.random_range(5..80);
        let baseline = normal(&mut rng, 50.0, 20.0, n);
        let mut canary = baseline.clone();
        canary.reverse();
        let outcome = judge(&canary, &baseline, &cfg).unwrap();
        assert_eq!(outcome.verdict, Verdict::Pass, "seed {seed}");
        assert_eq!(outcome.shift, Some(0.0));
        let ratio = outcome.mean_ratio.unwrap();
        assert!((ratio - 1.0).abs() < 1e-12, "seed {seed}: ratio {ratio}");
    }
}

#[test]
fn a_single_distinct_value_passes() {
    let cfg = JudgeConfig::default();
    for (value, canary_n, baseline_n) in [(0.0, 5, 9), (0.25, 12, 5), (-3.0, 30, 31)] {
        let outcome = judge(&vec![value; canary_n], &vec![value; baseline_n], &cfg).unwrap();
        assert_eq!(outcome.verdict, Verdict::Pass, "value {value}");
        assert_eq!(outcome.canary_samples, canary_n);
        assert_eq!((outcome.lower, outcome.upper), (Some(0.0), Some(0.0)));
    }
}
