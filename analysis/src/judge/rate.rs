//! The judge's test for rates (`kind: ratio`): canary errors out of canary requests against
//! baseline errors out of baseline requests, counted over the same window.
//!
//! Errors are taken as Poisson counts with the requests as exposure, and the rate ratio
//! R = (canary errors / canary requests) / (baseline errors / baseline requests) is tested
//! conditionally on the total number of errors k: the canary's share of them is binomial with
//! probability pi = nc R / (nc R + nb), so the exact (Clopper-Pearson) interval of pi becomes an
//! exact interval of R. That is R's `poisson.test(c(ec, eb), c(nc, nb))`; it stays valid for a
//! handful of errors and for a baseline without any, which is where rare errors live. For an
//! error ratio well above a few percent the binomial variance is smaller than Poisson's, so the
//! test is conservative there (fewer false alarms, slightly less power).

use serde::Serialize;

use super::{Direction, JudgeConfig, JudgeError, Unit, Verdict};

/// Errors and requests of one side over the window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Counts {
    pub errors: f64,
    pub total: f64,
}

/// The measurement value of a `kind: ratio` judge (serialised with serde_json; a number that is
/// undefined or infinite is null). `canaryMean`, `baselineMean` and `meanRatio` carry the same
/// names as the continuous kind's, so conditions and tools read either.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RateOutcome {
    pub verdict: Verdict,
    /// Canary errors / canary requests.
    pub canary_mean: Option<f64>,
    /// Baseline errors / baseline requests.
    pub baseline_mean: Option<f64>,
    /// canary rate / baseline rate; null when the baseline has no errors.
    pub mean_ratio: Option<f64>,
    /// Lower end of the rate ratio's exact confidence interval.
    pub lower: Option<f64>,
    /// Upper end; null when unbounded (the baseline has no errors).
    pub upper: Option<f64>,
    pub canary_errors: u64,
    pub canary_total: u64,
    pub baseline_errors: u64,
    pub baseline_total: u64,
    /// One sentence saying why.
    pub reason: String,
    /// Always `ratio`: the rates are fractions (written in percent), whatever `unit` says.
    pub unit: Unit,
}

/// Judges canary counts against baseline counts. Counts are rounded to whole requests
/// (Prometheus' `increase()` extrapolates to fractions); a side with fewer requests than
/// `minRequests` is NoData.
pub fn judge_rates(
    canary: Counts,
    baseline: Counts,
    cfg: &JudgeConfig,
) -> Result<RateOutcome, JudgeError> {
    cfg.validate()?;
    let (ec, nc) = whole_counts(canary, "canary")?;
    let (eb, nb) = whole_counts(baseline, "baseline")?;
    let rate = |e: u64, n: u64| (n > 0).then(|| e as f64 / n as f64);
    let canary_mean = rate(ec, nc);
    let baseline_mean = rate(eb, nb);
    let mean_ratio = canary_mean
        .zip(baseline_mean)
        .and_then(|(c, b)| super::mean_ratio(c, b));
    let mut outcome = RateOutcome {
        verdict: Verdict::Pass,
        canary_mean,
        baseline_mean,
        mean_ratio,
        lower: None,
        upper: None,
        canary_errors: ec,
        canary_total: nc,
        baseline_errors: eb,
        baseline_total: nb,
        reason: String::new(),
        unit: Unit::Ratio,
    };
    if nc < cfg.min_requests || nb < cfg.min_requests {
        outcome.verdict = Verdict::NoData;
        outcome.reason = format!(
            "{nc} canary and {nb} baseline requests, fewer than minRequests {} on a side",
            cfg.min_requests
        );
        return Ok(outcome);
    }
    if ec + eb == 0 {
        outcome.reason = format!("no errors in {nc} canary and {nb} baseline requests");
        return Ok(outcome);
    }
    let interval = rate_ratio_interval(ec, nc, eb, nb, cfg.confidence);
    outcome.lower = Some(interval.0).filter(|v| v.is_finite());
    outcome.upper = Some(interval.1).filter(|v| v.is_finite());
    let counts = format!(
        "canary {} of {nc} requests, baseline {} of {nb}",
        rate_text(ec, nc),
        rate_text(eb, nb)
    );
    let (verdict, reason) = classify(interval, mean_ratio, cfg, &counts);
    outcome.verdict = verdict;
    outcome.reason = reason;
    Ok(outcome)
}

fn whole_counts(counts: Counts, side: &str) -> Result<(u64, u64), JudgeError> {
    let bad = |what: &str, value: f64| JudgeError::InvalidCounts {
        side: side.to_owned(),
        detail: format!("{what} is {value}"),
    };
    // A query answering nothing (NaN) is no requests, not an error.
    let errors = if counts.errors.is_nan() {
        0.0
    } else {
        counts.errors
    };
    let total = if counts.total.is_nan() {
        0.0
    } else {
        counts.total
    };
    if !(errors.is_finite() && errors >= 0.0) {
        return Err(bad("errors", counts.errors));
    }
    if !(total.is_finite() && total >= 0.0) {
        return Err(bad("total", counts.total));
    }
    let (errors, total) = (errors.round(), total.round());
    if errors > total {
        return Err(JudgeError::InvalidCounts {
            side: side.to_owned(),
            detail: format!(
                "errors {errors} exceed total {total}: the errors query must count a subset of \
                 what the total query counts, over the same window"
            ),
        });
    }
    Ok((errors as u64, total as u64))
}

fn classify(
    (lower, upper): (f64, f64),
    ratio: Option<f64>,
    cfg: &JudgeConfig,
    counts: &str,
) -> (Verdict, String) {
    let ratio_text = ratio.map_or_else(|| "undefined".to_owned(), |r| format!("{r:.4}"));
    let reports_increase = matches!(cfg.direction, Direction::Increase | Direction::Either);
    let reports_decrease = matches!(cfg.direction, Direction::Decrease | Direction::Either);
    if reports_increase && lower > 1.0 && ratio.is_none_or(|r| r >= cfg.allowed_increase) {
        return (
            Verdict::High,
            format!(
                "rate ratio interval [{lower:.4}, {upper:.4}] lies above 1 and the rate ratio \
                 {ratio_text} reaches allowedIncrease {} ({counts})",
                cfg.allowed_increase
            ),
        );
    }
    if reports_decrease && upper < 1.0 && ratio.is_none_or(|r| r <= cfg.allowed_decrease) {
        return (
            Verdict::Low,
            format!(
                "rate ratio interval [{lower:.4}, {upper:.4}] lies below 1 and the rate ratio \
                 {ratio_text} reaches allowedDecrease {} ({counts})",
                cfg.allowed_decrease
            ),
        );
    }
    (
        Verdict::Pass,
        format!(
            "rate ratio interval [{lower:.4}, {upper:.4}] with rate ratio {ratio_text} shows no \
             reported change ({counts})"
        ),
    )
}

/// `errors` out of `total` in percent, with the count: `1.2% (36 errors)`.
fn rate_text(errors: u64, total: u64) -> String {
    let rate = Unit::Ratio.format(errors as f64 / total as f64);
    format!("{rate} ({errors} errors)")
}

/// Exact two-sided `confidence` interval of the rate ratio (ec / nc) / (eb / nb), conditional on
/// ec + eb errors (R's `poisson.test` with two counts). The upper end is infinite when eb = 0,
/// the lower end 0 when ec = 0. Needs nc, nb > 0 and ec + eb > 0.
pub fn rate_ratio_interval(ec: u64, nc: u64, eb: u64, nb: u64, confidence: f64) -> (f64, f64) {
    let (pi_lower, pi_upper) = clopper_pearson(ec, ec + eb, confidence);
    let scale = nb as f64 / nc as f64;
    let to_ratio = |pi: f64| {
        if pi >= 1.0 {
            f64::INFINITY
        } else {
            pi / (1.0 - pi) * scale
        }
    };
    (to_ratio(pi_lower), to_ratio(pi_upper))
}

/// Exact (Clopper-Pearson) two-sided `confidence` interval of a binomial probability from
/// `successes` out of `trials` (trials > 0).
pub fn clopper_pearson(successes: u64, trials: u64, confidence: f64) -> (f64, f64) {
    let alpha = 1.0 - confidence;
    let (k, n) = (successes as f64, trials as f64);
    let lower = if successes == 0 {
        0.0
    } else {
        beta_quantile(alpha / 2.0, k, n - k + 1.0)
    };
    let upper = if successes >= trials {
        1.0
    } else {
        beta_quantile(1.0 - alpha / 2.0, k + 1.0, n - k)
    };
    (lower, upper)
}

/// The x in [0, 1] with I_x(a, b) = p, by bisection to the last bit (I is increasing in x).
pub fn beta_quantile(p: f64, a: f64, b: f64) -> f64 {
    let (mut low, mut high) = (0.0_f64, 1.0_f64);
    loop {
        let mid = 0.5 * (low + high);
        if mid <= low || mid >= high {
            return mid;
        }
        if regularized_beta(mid, a, b) < p {
            low = mid;
        } else {
            high = mid;
        }
    }
}

/// The regularized incomplete beta function I_x(a, b) for a, b > 0, x in [0, 1]: its continued
/// fraction, evaluated with the modified Lentz method, on the side of the symmetry
/// I_x(a, b) = 1 - I_(1-x)(b, a) where it converges quickly.
pub fn regularized_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    if x > (a + 1.0) / (a + b + 2.0) {
        return 1.0 - regularized_beta(1.0 - x, b, a);
    }
    let log_front = a * x.ln() + b * (1.0 - x).ln() - ln_beta(a, b);
    log_front.exp() * beta_continued_fraction(x, a, b) / a
}

/// 1 / (1 + d1 / (1 + d2 / (1 + ...))) with d(2m+1) = -(a+m)(a+b+m)x / ((a+2m)(a+2m+1)) and
/// d(2m) = m(b-m)x / ((a+2m-1)(a+2m)).
fn beta_continued_fraction(x: f64, a: f64, b: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let guard = |v: f64| if v.abs() < TINY { TINY } else { v };
    let mut c = 1.0;
    let mut d = 1.0 / guard(1.0 - (a + b) * x / (a + 1.0));
    let mut f = d;
    for m in 1..10_000 {
        let m = m as f64;
        let even = m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m));
        d = 1.0 / guard(1.0 + even * d);
        c = guard(1.0 + even / c);
        f *= c * d;
        let odd = -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0));
        d = 1.0 / guard(1.0 + odd * d);
        c = guard(1.0 + odd / c);
        let delta = c * d;
        f *= delta;
        if (delta - 1.0).abs() < 4.0 * f64::EPSILON {
            break;
        }
    }
    f
}

/// ln B(a, b) = ln Gamma(a) + ln Gamma(b) - ln Gamma(a + b).
fn ln_beta(a: f64, b: f64) -> f64 {
    ln_gamma(a) + ln_gamma(b) - ln_gamma(a + b)
}

/// ln Gamma(x) for x > 0: Lanczos' approximation (g = 7, nine terms, about 1e-15 relative),
/// with the reflection formula below 0.5.
pub fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const COEFFICIENTS: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut sum = COEFFICIENTS[0];
    for (i, c) in COEFFICIENTS.iter().enumerate().skip(1) {
        sum += c / (x + i as f64);
    }
    let t = x + G + 0.5;
    0.5 * (std::f64::consts::TAU).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ln_gamma_matches_factorials() {
        let mut factorial = 1.0_f64;
        for n in 1..30 {
            assert!(
                (ln_gamma(n as f64) - factorial.ln()).abs() < 1e-12 * factorial.ln().max(1.0),
                "ln Gamma({n})"
            );
            factorial *= n as f64;
        }
        // Gamma(1/2) = sqrt(pi).
        assert!((ln_gamma(0.5) - std::f64::consts::PI.sqrt().ln()).abs() < 1e-14);
    }

    #[test]
    fn the_beta_function_has_closed_forms_to_check_against() {
        // I_x(1, 1) = x; I_x(a, 1) = x^a; I_x(1, b) = 1 - (1 - x)^b.
        for x in [0.001, 0.2, 0.5, 0.77, 0.999] {
            assert!((regularized_beta(x, 1.0, 1.0) - x).abs() < 1e-14);
            assert!((regularized_beta(x, 3.0, 1.0) - x.powi(3)).abs() < 1e-14);
            assert!((regularized_beta(x, 1.0, 4.0) - (1.0 - (1.0 - x).powi(4))).abs() < 1e-14);
        }
        assert_eq!(regularized_beta(0.0, 2.0, 3.0), 0.0);
        assert_eq!(regularized_beta(1.0, 2.0, 3.0), 1.0);
    }

    #[test]
    fn clopper_pearson_with_no_successes_has_a_closed_form() {
        // k = 0: the upper end solves (1 - p)^n = alpha / 2.
        let (lower, upper) = clopper_pearson(0, 50, 0.98);
        assert_eq!(lower, 0.0);
        assert!((upper - (1.0 - 0.01f64.powf(1.0 / 50.0))).abs() < 1e-12);
        let (lower, upper) = clopper_pearson(50, 50, 0.98);
        assert!((lower - 0.01f64.powf(1.0 / 50.0)).abs() < 1e-12);
        assert_eq!(upper, 1.0);
    }

    fn counts(errors: f64, total: f64) -> Counts {
        Counts { errors, total }
    }

    #[test]
    fn too_few_requests_no_errors_and_bad_counts_are_told_apart() {
        let cfg = JudgeConfig::default();
        let few = judge_rates(counts(5.0, 50.0), counts(0.0, 5000.0), &cfg).unwrap();
        assert_eq!(few.verdict, Verdict::NoData, "{}", few.reason);
        let clean = judge_rates(counts(0.0, 500.0), counts(0.0, 5000.0), &cfg).unwrap();
        assert_eq!(clean.verdict, Verdict::Pass);
        assert_eq!((clean.lower, clean.upper), (None, None));
        // No series yet (NaN) is no requests.
        let empty = judge_rates(counts(f64::NAN, f64::NAN), counts(1.0, 500.0), &cfg).unwrap();
        assert_eq!(empty.verdict, Verdict::NoData);
        let err = judge_rates(counts(20.0, 10.0), counts(1.0, 500.0), &cfg).unwrap_err();
        assert!(err.to_string().contains("canary"), "{err}");
        assert!(judge_rates(counts(-1.0, 10.0), counts(1.0, 500.0), &cfg).is_err());
    }

    #[test]
    fn the_effect_size_gate_and_the_direction_apply() {
        // 2x the baseline's rate, clearly significant.
        let (c, b) = (counts(600.0, 30_000.0), counts(1_200.0, 120_000.0));
        let high = judge_rates(c, b, &JudgeConfig::default()).unwrap();
        assert_eq!(high.verdict, Verdict::High, "{}", high.reason);
        assert_eq!(high.mean_ratio, Some(2.0));
        let gated = JudgeConfig {
            allowed_increase: 2.5,
            ..JudgeConfig::default()
        };
        assert_eq!(judge_rates(c, b, &gated).unwrap().verdict, Verdict::Pass);
        let only_decrease = JudgeConfig {
            direction: Direction::Decrease,
            ..JudgeConfig::default()
        };
        assert_eq!(
            judge_rates(c, b, &only_decrease).unwrap().verdict,
            Verdict::Pass
        );
        // Swapping the sides is Low.
        assert_eq!(
            judge_rates(b, c, &JudgeConfig::default()).unwrap().verdict,
            Verdict::Low
        );
        // A baseline without errors leaves the ratio and the upper end undefined (null).
        let rare = judge_rates(counts(60.0, 30_000.0), counts(0.0, 120_000.0), &gated).unwrap();
        assert_eq!(rare.verdict, Verdict::High, "{}", rare.reason);
        assert_eq!((rare.mean_ratio, rare.upper), (None, None));
    }
}
