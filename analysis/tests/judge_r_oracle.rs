//! The judge's statistics against a second oracle, R, run live: `wilcox.test(x, y, conf.int =
//! TRUE, exact = FALSE, correct = TRUE)` for the Mann-Whitney statistic, its p-value, the
//! shift's interval and estimate on every case of `tests/fixtures/judge/mannwhitney.json`, and
//! `poisson.test` for the rate ratio's interval on every case of `rates.json`. The fixtures'
//! samples are the inputs; the numbers compared are R's, not the fixtures' (which are scipy's).
//!
//! Needs `Rscript` (Debian's `r-base-core`, which `.ci/run` installs).

use std::fmt::Write as _;
use std::process::Command;

use rollouts_analysis::judge::{
    mann_whitney_u, rate_ratio_interval, shift_interval, two_sided_p_value, z_statistic,
};
use serde::Deserialize;

const CONFIDENCE: f64 = 0.98;
/// `wilcox.test` finds its interval's bounds and estimate with `uniroot(..., tol = 1e-4)`.
const R_UNIROOT_TOLERANCE: f64 = 1e-4;

#[derive(Deserialize)]
struct RankCases {
    cases: Vec<RankCase>,
}

#[derive(Deserialize)]
struct RankCase {
    name: String,
    x: Vec<Option<f64>>,
    y: Vec<Option<f64>>,
}

#[derive(Deserialize)]
struct RateCases {
    cases: Vec<RateCase>,
}

#[derive(Deserialize)]
struct RateCase {
    name: String,
    ec: u64,
    nc: u64,
    eb: u64,
    nb: u64,
    confidence: f64,
}

fn fixture<T: serde::de::DeserializeOwned>(name: &str) -> T {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/judge")
        .join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Runs `script` with Rscript (from a file: `-e` takes at most 10,000 bytes); its standard
/// output, split into words, one line per case.
fn r(script: &str) -> Vec<Vec<String>> {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let file = std::env::temp_dir().join(format!(
        "rollouts-judge-r-oracle-{}-{}.R",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::write(&file, script).unwrap_or_else(|e| panic!("writing {}: {e}", file.display()));
    let output = Command::new("Rscript").arg("--vanilla").arg(&file).output();
    let _ = std::fs::remove_file(&file);
    let output = output.unwrap_or_else(|e| {
        panic!(
            "Rscript did not run ({e}): install R (`apt-get install -y --no-install-recommends \
                 r-base-core`; .ci/run does)"
        )
    });
    assert!(
        output.status.success(),
        "Rscript failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| line.split_whitespace().map(str::to_string).collect())
        .collect()
}

/// An R vector of the finite samples (the judge and scipy omit NaN; R is given none).
fn r_vector(samples: &[f64]) -> String {
    let values: Vec<String> = samples.iter().map(|v| format!("{v:?}")).collect();
    format!("c({})", values.join(","))
}

fn number(text: &str) -> Option<f64> {
    match text {
        "NA" | "NaN" => None,
        "Inf" => Some(f64::INFINITY),
        other => other.parse().ok(),
    }
}

fn close(ours: f64, theirs: f64, relative: f64, absolute: f64) -> bool {
    if ours.is_infinite() || theirs.is_infinite() {
        return ours == theirs;
    }
    (ours - theirs).abs() <= absolute.max(relative * theirs.abs())
}

#[test]
fn the_rank_test_and_its_interval_match_rs_wilcox_test() {
    let cases: RankCases = fixture("mannwhitney.json");
    let finite = |samples: &[Option<f64>]| -> Vec<f64> {
        samples
            .iter()
            .flatten()
            .copied()
            .filter(|v| v.is_finite())
            .collect()
    };
    let mut script = String::from("options(digits = 17, warn = -1)\n");
    for case in &cases.cases {
        let _ = writeln!(
            script,
            "x <- {}; y <- {}\n\
             r <- tryCatch(wilcox.test(x, y, conf.int = TRUE, conf.level = {CONFIDENCE}, \
             exact = FALSE, correct = TRUE), error = function(e) \
             wilcox.test(x, y, exact = FALSE, correct = TRUE))\n\
             ci <- if (is.null(r$conf.int)) c(NA, NA) else r$conf.int\n\
             est <- if (is.null(r$estimate)) NA else r$estimate\n\
             cat({:?}, format(r$statistic, digits = 17), format(r$p.value, digits = 17), \
             format(ci[1], digits = 17), format(ci[2], digits = 17), format(est, digits = 17), \"\\n\")",
            r_vector(&finite(&case.x)),
            r_vector(&finite(&case.y)),
            case.name,
        );
    }
    let lines = r(&script);
    assert_eq!(
        lines.len(),
        cases.cases.len(),
        "one line per case: {lines:?}"
    );
    let (mut intervals, mut p_values) = (0, 0);
    for (case, line) in cases.cases.iter().zip(&lines) {
        assert_eq!(line.first().map(String::as_str), Some(case.name.as_str()));
        let [w, p, lower, upper, estimate] =
            [1, 2, 3, 4, 5].map(|i| line.get(i).and_then(|t| number(t)));
        let (x, y) = (finite(&case.x), finite(&case.y));
        let name = &case.name;

        let u = mann_whitney_u(&x, &y).expect("finite samples");
        let w = w.unwrap_or_else(|| panic!("{name}: R gave no statistic: {line:?}"));
        assert!(close(u, w, 1e-12, 1e-9), "{name}: U {u}, R's W {w}");

        // R answers NaN where the statistic's variance is 0 (every value tied); the judge
        // refuses those samples instead of judging them.
        match (z_statistic(&x, &y, 0.0), p) {
            (Ok(z), Some(p)) => {
                let ours = two_sided_p_value(z);
                assert!(close(ours, p, 1e-9, 1e-15), "{name}: p {ours}, R {p}");
                p_values += 1;
            }
            (Err(_), None) => {}
            (ours, theirs) => panic!("{name}: the judge's z {ours:?}, R's p {theirs:?}"),
        }

        let (Some(lower), Some(upper), Some(estimate)) = (lower, upper, estimate) else {
            continue;
        };
        let interval = shift_interval(&x, &y, CONFIDENCE)
            .unwrap_or_else(|e| panic!("{name}: R has an interval, the judge says {e}"));
        // Both find the roots numerically, on a statistic that moves in steps: Brent's method
        // to 1e-4 of the shifts' range here, R's uniroot to 1e-4 absolute (wilcox.test's
        // `tol`). Within a thousandth of the range, or R's own tolerance where that is wider.
        let range = x.iter().chain(&y).fold(f64::NEG_INFINITY, |m, v| m.max(*v))
            - x.iter().chain(&y).fold(f64::INFINITY, |m, v| m.min(*v));
        let slack = (1e-3 * range).max(R_UNIROOT_TOLERANCE);
        // The statistic is a step function of the shift, so where it is 0 over a whole
        // interval of shifts any point of it is the estimate: there, the two agree when the
        // test says the same at both.
        let same_step = |a: f64, b: f64| {
            matches!(
                (z_statistic(&x, &y, a), z_statistic(&x, &y, b)),
                (Ok(za), Ok(zb)) if (za - zb).abs() <= 1e-12
            )
        };
        for (what, ours, theirs) in [
            ("lower bound", interval.lower, lower),
            ("upper bound", interval.upper, upper),
            ("estimate", interval.estimate, estimate),
        ] {
            assert!(
                (ours - theirs).abs() <= slack || same_step(ours, theirs),
                "{name}: {what} {ours}, R {theirs} (slack {slack})"
            );
        }
        intervals += 1;
    }
    println!(
        "R's wilcox.test: {} cases, {p_values} p-values and {intervals} intervals compared",
        cases.cases.len()
    );
    assert!(intervals >= 20, "only {intervals} intervals compared");
}

#[test]
fn the_rate_ratio_interval_matches_rs_poisson_test() {
    let cases: RateCases = fixture("rates.json");
    let mut script = String::from("options(digits = 17)\n");
    for case in &cases.cases {
        let _ = writeln!(
            script,
            "r <- poisson.test(c({}, {}), c({}, {}), conf.level = {})\n\
             cat({:?}, format(r$conf.int[1], digits = 17), format(r$conf.int[2], digits = 17), \"\\n\")",
            case.ec, case.eb, case.nc, case.nb, case.confidence, case.name,
        );
    }
    let lines = r(&script);
    assert_eq!(
        lines.len(),
        cases.cases.len(),
        "one line per case: {lines:?}"
    );
    for (case, line) in cases.cases.iter().zip(&lines) {
        let name = &case.name;
        assert_eq!(line.first().map(String::as_str), Some(name.as_str()));
        let lower = line.get(1).and_then(|t| number(t));
        let upper = line.get(2).and_then(|t| number(t));
        let (ours_lower, ours_upper) =
            rate_ratio_interval(case.ec, case.nc, case.eb, case.nb, case.confidence);
        for (what, ours, theirs) in [("lower", ours_lower, lower), ("upper", ours_upper, upper)] {
            let theirs = theirs.unwrap_or_else(|| panic!("{name}: R gave no {what}: {line:?}"));
            assert!(
                close(ours, theirs, 1e-7, 1e-12),
                "{name}: rate ratio {what} {ours}, R's poisson.test {theirs}"
            );
        }
    }
}
