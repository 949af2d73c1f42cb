//! The judge's test for rates against scipy, as recorded by `scripts/judge_rate_oracle.py` in
//! `tests/fixtures/judge/rates.json`: the regularized incomplete beta, the exact (Clopper-Pearson)
//! interval of the canary's share of the errors, the rate ratio's interval and the verdict.

use rollouts_analysis::judge::{
    Counts, JudgeConfig, JudgeKind, Verdict, clopper_pearson, judge_rates, rate_ratio_interval,
    regularized_beta,
};
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    betainc: Vec<Beta>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Beta {
    a: f64,
    b: f64,
    x: f64,
    value: f64,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    ec: u64,
    nc: u64,
    eb: u64,
    nb: u64,
    confidence: f64,
    pi: [f64; 2],
    ratio: [Option<f64>; 2],
    verdict: String,
}

fn fixture() -> Fixture {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/judge/rates.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).expect("rates.json parses")
}

fn close(got: f64, expected: f64, relative: f64) -> bool {
    (got - expected).abs() <= relative * expected.abs().max(1e-300)
}

#[test]
fn the_incomplete_beta_matches_scipy() {
    for beta in fixture().betainc {
        let got = regularized_beta(beta.x, beta.a, beta.b);
        // Absolute 1e-13 for values near 1, relative 1e-9 for the tiny tails.
        assert!(
            (got - beta.value).abs() < 1e-13 || close(got, beta.value, 1e-9),
            "I_{}({}, {}) = {got}, scipy {}",
            beta.x,
            beta.a,
            beta.b,
            beta.value
        );
    }
}

#[test]
fn the_share_and_rate_ratio_intervals_match_scipy() {
    for case in fixture().cases {
        let (low, high) = clopper_pearson(case.ec, case.ec + case.eb, case.confidence);
        assert!(
            close(low, case.pi[0], 1e-9) && close(high, case.pi[1], 1e-9),
            "{}: share interval [{low}, {high}], scipy {:?}",
            case.name,
            case.pi
        );
        let (lower, upper) =
            rate_ratio_interval(case.ec, case.nc, case.eb, case.nb, case.confidence);
        let expect = |got: f64, expected: Option<f64>| match expected {
            Some(e) => close(got, e, 1e-8),
            None => got.is_infinite(),
        };
        assert!(
            expect(lower, case.ratio[0]) && expect(upper, case.ratio[1]),
            "{}: ratio interval [{lower}, {upper}], scipy {:?}",
            case.name,
            case.ratio
        );
    }
}

#[test]
fn the_verdicts_match_scipys_intervals() {
    for case in fixture().cases {
        let cfg = JudgeConfig {
            kind: JudgeKind::Ratio,
            confidence: case.confidence,
            min_requests: 1,
            ..JudgeConfig::default()
        };
        let counts = |errors: u64, total: u64| Counts {
            errors: errors as f64,
            total: total as f64,
        };
        let outcome = judge_rates(counts(case.ec, case.nc), counts(case.eb, case.nb), &cfg)
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let expected = match case.verdict.as_str() {
            "High" => Verdict::High,
            "Low" => Verdict::Low,
            _ => Verdict::Pass,
        };
        assert_eq!(
            outcome.verdict, expected,
            "{}: {}",
            case.name, outcome.reason
        );
    }
}
