//! The judge's statistics against an oracle nobody here wrote: scipy's `mannwhitneyu` and numpy's
//! percentiles, as recorded by `scripts/judge_oracle.py` in `tests/fixtures/judge/mannwhitney.json`.

use rollouts_analysis::judge::{
    JudgeConfig, JudgeError, Verdict, judge, mann_whitney_u, normal_isf, outlier_fences,
    rank_sum_w, shift_interval, two_sided_p_value, z_statistic,
};
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Deserialize)]
struct Fixture {
    z_critical: BTreeMap<String, f64>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    x: Vec<Option<f64>>,
    y: Vec<Option<f64>>,
    u: f64,
    w: f64,
    p: f64,
    z_abs: f64,
    sigma_zero: bool,
    fences: Fences,
    interval: Option<Interval>,
    verdict: Option<ExpectedVerdict>,
}

#[derive(Deserialize)]
struct Fences {
    x: Option<[f64; 2]>,
    y: Option<[f64; 2]>,
}

#[derive(Deserialize)]
struct Interval {
    confidence: f64,
    z_critical: f64,
    lower: [f64; 2],
    upper: [f64; 2],
    estimate: [f64; 2],
}

#[derive(Deserialize)]
struct ExpectedVerdict {
    expected: String,
    robust: bool,
}

fn fixture() -> Fixture {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/judge/mannwhitney.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).expect("mannwhitney.json parses")
}

/// The fixture writes NaN as null.
fn raw(samples: &[Option<f64>]) -> Vec<f64> {
    samples.iter().map(|v| v.unwrap_or(f64::NAN)).collect()
}

/// scipy is called with nan_policy="omit", which is the judge's default NaN handling.
fn finite(samples: &[Option<f64>]) -> Vec<f64> {
    samples.iter().flatten().copied().collect()
}

fn assert_relative(case: &str, what: &str, ours: f64, oracle: f64, relative: f64) {
    let scale = oracle.abs().max(f64::MIN_POSITIVE);
    assert!(
        (ours - oracle).abs() <= relative * scale,
        "{case}: {what} is {ours}, scipy says {oracle} (relative error {:e})",
        (ours - oracle).abs() / scale
    );
}

#[test]
fn u_statistic_matches_scipy() {
    for case in fixture().cases {
        let (x, y) = (finite(&case.x), finite(&case.y));
        let u = mann_whitney_u(&x, &y).unwrap();
        assert_relative(&case.name, "U", u, case.u, 1e-9);
        let w = rank_sum_w(&x, &y, 0.0).unwrap();
        assert_relative(&case.name, "W", w, case.w, 1e-9);
        let nx_ny = (x.len() * y.len()) as f64;
        assert_eq!(w, u - nx_ny / 2.0, "{}: W = U1 - nx*ny/2", case.name);
    }
}

#[test]
fn z_and_p_value_match_scipy() {
    let mut compared = 0;
    for case in fixture().cases {
        let (x, y) = (finite(&case.x), finite(&case.y));
        let z = z_statistic(&x, &y, 0.0);
        if case.sigma_zero {
            assert!(
                matches!(z, Err(JudgeError::AllTied { .. })),
                "{}: every sample ties, sigma = 0 must be an error, got {z:?}",
                case.name
            );
            continue;
        }
        let z = z.unwrap();
        // scipy's two-sided z is |z| when W != 0 and <= 0 (so p = 1) when W = 0.
        if case.z_abs == 0.0 {
            assert_eq!(z, 0.0, "{}: scipy's p is 1, so |W| <= 1/2", case.name);
        } else {
            assert_relative(&case.name, "|z|", z.abs(), case.z_abs, 1e-9);
            assert_eq!(
                z.signum(),
                case.w.signum(),
                "{}: z has the sign of W",
                case.name
            );
        }
        assert_relative(&case.name, "p", two_sided_p_value(z), case.p, 1e-9);
        compared += 1;
    }
    assert!(compared >= 20, "only {compared} cases compared");
}

#[test]
fn critical_values_match_scipy() {
    let fixture = fixture();
    assert!(!fixture.z_critical.is_empty());
    for (confidence, z) in &fixture.z_critical {
        let level: f64 = confidence.parse().unwrap();
        assert_relative(
            confidence,
            "z(1 - alpha/2)",
            normal_isf((1.0 - level) / 2.0),
            *z,
            1e-12,
        );
    }
}

#[test]
fn outlier_fences_match_numpy() {
    for case in fixture().cases {
        for (side, samples, expected) in [
            ("canary", finite(&case.x), case.fences.x),
            ("baseline", finite(&case.y), case.fences.y),
        ] {
            let Some([lower, upper]) = expected else {
                continue;
            };
            let mut sorted = samples;
            sorted.sort_by(f64::total_cmp);
            let (ours_lower, ours_upper) = outlier_fences(&sorted);
            let scale = lower.abs().max(upper.abs()).max(1e-300);
            assert!(
                (ours_lower - lower).abs() <= 1e-12 * scale
                    && (ours_upper - upper).abs() <= 1e-12 * scale,
                "{} {side}: fences ({ours_lower}, {ours_upper}), numpy ({lower}, {upper})",
                case.name
            );
        }
    }
}

/// Brent stops within its tolerance, 1e-4 of the search range's width, of where z(m) crosses.
fn assert_within(case: &str, what: &str, ours: f64, range: [f64; 2], width: f64) {
    let slack = 1e-4 * width * (1.0 + 1e-9) + 4.0 * f64::EPSILON * ours.abs();
    assert!(
        ours >= range[0] - slack && ours <= range[1] + slack,
        "{case}: {what} is {ours}, the exact root lies in [{}, {}] (slack {slack:e})",
        range[0],
        range[1]
    );
}

#[test]
fn shift_interval_brackets_the_exact_roots() {
    let mut compared = 0;
    for case in fixture().cases {
        let Some(interval) = &case.interval else {
            continue;
        };
        let (x, y) = (finite(&case.x), finite(&case.y));
        let width = (x.iter().copied().fold(f64::MIN, f64::max)
            - y.iter().copied().fold(f64::MAX, f64::min))
            - (x.iter().copied().fold(f64::MAX, f64::min)
                - y.iter().copied().fold(f64::MIN, f64::max));
        let ours = shift_interval(&x, &y, interval.confidence).unwrap();
        assert_relative(
            &case.name,
            "z critical",
            normal_isf((1.0 - interval.confidence) / 2.0),
            interval.z_critical,
            1e-12,
        );
        assert_within(&case.name, "lower", ours.lower, interval.lower, width);
        assert_within(&case.name, "upper", ours.upper, interval.upper, width);
        assert_within(
            &case.name,
            "estimate",
            ours.estimate,
            interval.estimate,
            width,
        );
        assert!(ours.lower <= ours.estimate && ours.estimate <= ours.upper);
        compared += 1;
    }
    assert!(compared >= 15, "only {compared} intervals compared");
}

#[test]
fn verdicts_match_the_oracle_where_robust() {
    let cfg = JudgeConfig {
        min_samples: 1,
        ..JudgeConfig::default()
    };
    let mut compared = 0;
    for case in fixture().cases {
        let Some(expected) = &case.verdict else {
            continue;
        };
        if !expected.robust {
            continue;
        }
        let outcome = judge(&raw(&case.x), &raw(&case.y), &cfg).unwrap();
        let verdict = match expected.expected.as_str() {
            "High" => Verdict::High,
            "Low" => Verdict::Low,
            "Pass" => Verdict::Pass,
            other => panic!("{}: unknown verdict {other}", case.name),
        };
        assert_eq!(
            outcome.verdict, verdict,
            "{}: {}",
            case.name, outcome.reason
        );
        assert_eq!(outcome.canary_samples, finite(&case.x).len());
        compared += 1;
    }
    assert!(compared >= 15, "only {compared} verdicts compared");
}
