//! The judge's statistics: Mann-Whitney ranks at a trial shift, the normal distribution, Brent's
//! root finder, R type-7 percentiles and the outlier fences. Pure functions over finite samples.

use super::JudgeError;

/// Samples of both sides, each sorted once, so the rank statistic at any trial shift is an O(n)
/// merge instead of a sort.
#[derive(Debug, Clone)]
pub(crate) struct ShiftedRanks {
    canary: Vec<f64>,
    baseline: Vec<f64>,
}

/// What one ranking of `canary - shift` together with `baseline` yields.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RankSums {
    /// Sum of the canary's ranks (ties get the average rank).
    pub canary_rank_sum: f64,
    /// Sum of t^3 - t over the tie groups of the pooled samples.
    pub tie_term: f64,
}

impl ShiftedRanks {
    /// Takes finite samples (callers reject NaN and infinities first).
    pub(crate) fn new(canary: &[f64], baseline: &[f64]) -> Self {
        let mut canary = canary.to_vec();
        let mut baseline = baseline.to_vec();
        canary.sort_by(f64::total_cmp);
        baseline.sort_by(f64::total_cmp);
        Self { canary, baseline }
    }

    /// The search range of the shift, [min x - max y, max x - min y]; None when a side is empty.
    pub(crate) fn shift_range(&self) -> Option<(f64, f64)> {
        let (x_min, x_max) = (self.canary.first()?, self.canary.last()?);
        let (y_min, y_max) = (self.baseline.first()?, self.baseline.last()?);
        Some((x_min - y_max, x_max - y_min))
    }

    /// Ranks `canary - shift` with `baseline` by merging the two sorted sides.
    pub(crate) fn rank_sums(&self, shift: f64) -> RankSums {
        let (x, y) = (&self.canary, &self.baseline);
        let (mut i, mut j) = (0usize, 0usize);
        let mut ranked = 0.0_f64;
        let mut canary_rank_sum = 0.0;
        let mut tie_term = 0.0;
        while i < x.len() || j < y.len() {
            let next_x = x.get(i).map(|v| v - shift);
            let next_y = y.get(j).copied();
            let value = match (next_x, next_y) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) => a,
                (None, Some(b)) => b,
                (None, None) => break,
            };
            let mut from_canary = 0.0_f64;
            while i < x.len() && x[i] - shift == value {
                from_canary += 1.0;
                i += 1;
            }
            let mut from_baseline = 0.0_f64;
            while j < y.len() && y[j] == value {
                from_baseline += 1.0;
                j += 1;
            }
            let tied = from_canary + from_baseline;
            // Ranks ranked+1 ..= ranked+tied share their average.
            canary_rank_sum += from_canary * (ranked + (tied + 1.0) / 2.0);
            tie_term += tied * tied * tied - tied;
            ranked += tied;
        }
        RankSums {
            canary_rank_sum,
            tie_term,
        }
    }

    /// W = sum of canary ranks - nx(nx+1)/2 - nx*ny/2: the Mann-Whitney U of the canary, centred.
    pub(crate) fn w(&self, shift: f64) -> f64 {
        let sums = self.rank_sums(shift);
        self.centred(sums.canary_rank_sum)
    }

    fn centred(&self, canary_rank_sum: f64) -> f64 {
        let nx = self.canary.len() as f64;
        let ny = self.baseline.len() as f64;
        canary_rank_sum - nx * (nx + 1.0) / 2.0 - nx * ny / 2.0
    }

    /// z(m) = (W - 0.5 sign(W)) / sigma with the tie-corrected sigma; sigma = 0 is an error.
    pub(crate) fn z(&self, shift: f64) -> Result<f64, JudgeError> {
        let sums = self.rank_sums(shift);
        let w = self.centred(sums.canary_rank_sum);
        let nx = self.canary.len() as f64;
        let ny = self.baseline.len() as f64;
        let n = nx + ny;
        let variance = nx * ny / 12.0 * ((n + 1.0) - sums.tie_term / (n * (n - 1.0)));
        if variance.is_nan() || variance <= 0.0 {
            return Err(JudgeError::AllTied {
                shift,
                canary_samples: self.canary.len(),
                baseline_samples: self.baseline.len(),
            });
        }
        let continuity = if w > 0.0 {
            0.5
        } else if w < 0.0 {
            -0.5
        } else {
            0.0
        };
        Ok((w - continuity) / variance.sqrt())
    }
}

/// Complementary error function, to about 1e-14 relative over the whole line.
pub fn erfc(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    if x < 0.0 {
        return 2.0 - erfc(-x);
    }
    if x < 2.0 {
        1.0 - erf_series(x)
    } else {
        erfc_continued_fraction(x)
    }
}

/// erf(x) = 2/sqrt(pi) exp(-x^2) sum 2^k x^(2k+1) / (1*3*...*(2k+1)): positive terms, no
/// cancellation, so full precision for the small x it is used for.
fn erf_series(x: f64) -> f64 {
    let two_x2 = 2.0 * x * x;
    let mut term = x;
    let mut sum = x;
    let mut k = 0.0;
    while term > sum * f64::EPSILON * 0.25 {
        k += 1.0;
        term *= two_x2 / (2.0 * k + 1.0);
        sum += term;
    }
    std::f64::consts::FRAC_2_SQRT_PI * (-x * x).exp() * sum
}

/// erfc(x) = exp(-x^2)/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))), evaluated with the
/// modified Lentz method; converges quickly for x >= 2.
fn erfc_continued_fraction(x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let mut f = x;
    let mut c = x;
    let mut d = 0.0;
    for k in 1..2000 {
        let a = k as f64 / 2.0;
        d = x + a * d;
        if d.abs() < TINY {
            d = TINY;
        }
        c = x + a / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        let delta = c * d;
        f *= delta;
        if (delta - 1.0).abs() < f64::EPSILON {
            break;
        }
    }
    (-x * x).exp() / std::f64::consts::PI.sqrt() / f
}

/// P(Z > z) for a standard normal Z.
pub fn normal_sf(z: f64) -> f64 {
    0.5 * erfc(z / std::f64::consts::SQRT_2)
}

/// The z with P(Z > z) = upper_tail, for upper_tail in (0, 1); found by bisection to the last
/// bit, which is exact enough and runs once per judgement.
pub fn normal_isf(upper_tail: f64) -> f64 {
    if upper_tail.is_nan() || upper_tail <= 0.0 || upper_tail >= 1.0 {
        return f64::NAN;
    }
    if upper_tail > 0.5 {
        return -normal_isf(1.0 - upper_tail);
    }
    let (mut low, mut high) = (0.0_f64, 40.0_f64);
    loop {
        let mid = 0.5 * (low + high);
        if mid <= low || mid >= high {
            return mid;
        }
        if normal_sf(mid) > upper_tail {
            low = mid;
        } else {
            high = mid;
        }
    }
}

/// Two-sided p-value of a z statistic: min(1, 2 P(Z > |z|)).
pub fn two_sided_p_value(z: f64) -> f64 {
    erfc(z.abs() / std::f64::consts::SQRT_2).min(1.0)
}

/// A root of f in [a, b] (f(a) and f(b) of opposite signs or zero) by Brent's method, to within
/// `tolerance`; f may be a step function, as z(m) is.
pub(crate) fn brent_root<F>(
    mut f: F,
    a: f64,
    b: f64,
    fa: f64,
    fb: f64,
    tolerance: f64,
) -> Result<f64, JudgeError>
where
    F: FnMut(f64) -> Result<f64, JudgeError>,
{
    if fa == 0.0 {
        return Ok(a);
    }
    if fb == 0.0 {
        return Ok(b);
    }
    // b is the best guess, a the previous one, c the point whose f has the sign opposite to f(b).
    let (mut a, mut b, mut c) = (a, b, a);
    let (mut fa, mut fb, mut fc) = (fa, fb, fa);
    for _ in 0..1000 {
        let previous_step = b - a;
        if fc.abs() < fb.abs() {
            a = b;
            b = c;
            c = a;
            fa = fb;
            fb = fc;
            fc = fa;
        }
        let step_tolerance = 2.0 * f64::EPSILON * b.abs() + tolerance / 2.0;
        let mut step = (c - b) / 2.0;
        if step.abs() <= step_tolerance || fb == 0.0 {
            return Ok(b);
        }
        if previous_step.abs() >= step_tolerance && fa.abs() > fb.abs() {
            let cb = c - b;
            let (mut p, mut q);
            if a == c {
                // Two points: secant.
                let t1 = fb / fa;
                p = cb * t1;
                q = 1.0 - t1;
            } else {
                // Three points: inverse quadratic interpolation.
                let qa = fa / fc;
                let t1 = fb / fc;
                let t2 = fb / fa;
                p = t2 * (cb * qa * (qa - t1) - (b - a) * (t1 - 1.0));
                q = (qa - 1.0) * (t1 - 1.0) * (t2 - 1.0);
            }
            if p > 0.0 {
                q = -q;
            } else {
                p = -p;
            }
            // Accept the interpolation only if it stays well inside [b, c] and shrinks fast.
            if p < 0.75 * cb * q - (step_tolerance * q).abs() / 2.0
                && p < (previous_step * q / 2.0).abs()
            {
                step = p / q;
            }
        }
        if step.abs() < step_tolerance {
            step = step_tolerance.copysign(step);
        }
        a = b;
        fa = fb;
        b += step;
        fb = f(b)?;
        if (fb > 0.0 && fc > 0.0) || (fb < 0.0 && fc < 0.0) {
            c = a;
            fc = fa;
        }
    }
    Ok(b)
}

/// Percentile p in [0, 1] of sorted samples by linear interpolation between order statistics
/// (R type 7, numpy's default); NaN for no samples.
pub fn percentile_type7(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let h = (n - 1) as f64 * p.clamp(0.0, 1.0);
            let low = h.floor() as usize;
            let high = (low + 1).min(n - 1);
            sorted[low] + (h - low as f64) * (sorted[high] - sorted[low])
        }
    }
}

/// Outlier fences (min(P1, Q1 - k IQR), max(P99, Q3 + k IQR)) with k = 3, as Kayenta's IQR
/// detector with reduced sensitivity; samples strictly outside are outliers.
pub fn outlier_fences(sorted: &[f64]) -> (f64, f64) {
    const K: f64 = 3.0;
    let q1 = percentile_type7(sorted, 0.25);
    let q3 = percentile_type7(sorted, 0.75);
    let iqr = q3 - q1;
    let lower = percentile_type7(sorted, 0.01).min(q1 - K * iqr);
    let upper = percentile_type7(sorted, 0.99).max(q3 + K * iqr);
    (lower, upper)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erfc_matches_reference_values_on_both_branches() {
        // Values from scipy.special.erfc.
        let reference = [
            (0.0, 1.0),
            (0.3, 0.6713732405408726),
            (1.0, 0.15729920705028516),
            (1.9999, 0.00467980209297061),
            (2.0, 0.004677734981047266),
            (2.5, 0.00040695201744495886),
            (5.0, 1.5374597944280347e-12),
            (10.0, 2.0884875837625446e-45),
            (-1.0, 1.8427007929497148),
        ];
        for (x, expected) in reference {
            let got = erfc(x);
            assert!(
                ((got - expected) / expected).abs() < 1e-13,
                "erfc({x}) = {got}, expected {expected}"
            );
        }
        assert!(erfc(27.0) < 1e-300);
        assert!(erfc(f64::NAN).is_nan());
    }

    #[test]
    fn normal_isf_inverts_normal_sf() {
        for tail in [1e-12, 1e-6, 0.001, 0.01, 0.025, 0.1, 0.3, 0.5, 0.7, 0.99] {
            let z = normal_isf(tail);
            assert!(
                ((normal_sf(z) - tail) / tail).abs() < 1e-13,
                "tail {tail}: z {z}"
            );
        }
        assert_eq!(normal_isf(0.5), 0.0);
        assert!(normal_isf(0.0).is_nan() && normal_isf(1.0).is_nan());
    }

    #[test]
    fn brent_finds_a_smooth_root_and_a_step() {
        let cube = brent_root(|x| Ok(x * x * x - 2.0), 0.0, 2.0, -2.0, 6.0, 1e-12).unwrap();
        assert!((cube - 2f64.cbrt()).abs() < 1e-11);
        // A step from +1 to -1 at 0.3: the root is the jump, within the tolerance.
        let step = |x: f64| Ok(if x < 0.3 { 1.0 } else { -1.0 });
        let jump = brent_root(step, 0.0, 1.0, 1.0, -1.0, 1e-4).unwrap();
        assert!((jump - 0.3).abs() <= 1e-4, "jump found at {jump}");
        assert_eq!(brent_root(step, 0.3, 1.0, 0.0, -1.0, 1e-4).unwrap(), 0.3);
    }

    #[test]
    fn percentiles_interpolate_between_order_statistics() {
        let sorted = [1.0, 2.0, 4.0, 8.0];
        assert_eq!(percentile_type7(&sorted, 0.0), 1.0);
        assert_eq!(percentile_type7(&sorted, 1.0), 8.0);
        // h = 3 * 0.5 = 1.5: halfway between 2 and 4.
        assert_eq!(percentile_type7(&sorted, 0.5), 3.0);
        assert_eq!(percentile_type7(&sorted, 0.25), 1.75);
        assert_eq!(percentile_type7(&[5.0], 0.99), 5.0);
        assert!(percentile_type7(&[], 0.5).is_nan());
    }

    #[test]
    fn rank_sums_average_tied_ranks() {
        // Pooled: 1 (y), 2 (x), 2 (y), 3 (x): ranks 1, 2.5, 2.5, 4; the tie group of 2 adds 6.
        let ranks = ShiftedRanks::new(&[2.0, 3.0], &[1.0, 2.0]);
        let sums = ranks.rank_sums(0.0);
        assert_eq!(sums.canary_rank_sum, 6.5);
        assert_eq!(sums.tie_term, 6.0);
        // W = 6.5 - 3 - 2 = 1.5; shifting the canary down by 2 puts it below: W = 3 - 3 - 2 = -2.
        assert_eq!(ranks.w(0.0), 1.5);
        assert_eq!(ranks.w(2.5), -2.0);
        assert_eq!(ranks.shift_range(), Some((0.0, 2.0)));
    }
}
