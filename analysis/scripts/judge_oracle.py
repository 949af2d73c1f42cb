#!/usr/bin/env python3
"""Oracle for the baseline judge's statistics, computed with scipy and numpy.

Writes analysis/tests/fixtures/judge/mannwhitney.json: per case the canary (x) and baseline (y)
samples (NaN written as null), and what scipy.stats.mannwhitneyu (method="asymptotic",
use_continuity=True, two-sided, NaNs omitted) says about them:

  u        scipy's statistic, U1 = sum of x ranks - nx(nx+1)/2
  w        U1 - nx*ny/2 (the judge's W at shift 0)
  p        scipy's two-sided p-value
  z_abs    the |z| that p implies, norm.isf(p/2) (0 when p = 1: scipy's z is <= 0 there)
  fences   numpy type-7 outlier fences, min(P1, Q1 - 3 IQR) and max(P99, Q3 + 3 IQR), per side
  interval the exact roots of the inverted test, found by scanning the pairwise differences
           x_i - y_j (the only places z(m) jumps) with scipy's z at each trial shift m:
           for each target, the range [lo, hi] of shifts where z(m) - target changes sign
  verdict  the classification of JUDGE.md (confidence 0.98, direction either, allowed ratios 1),
           and `robust`: whether every estimate in its range and every bound within the judge's
           Brent tolerance gives the same verdict

Run from anywhere with scipy installed (`pip install scipy`); the output is committed so the Rust
tests need no Python.
"""

import json
import math
import pathlib

import numpy as np
from scipy import stats

SEED = 20240611
CONFIDENCE = 0.98
BRENT_RELATIVE_TOLERANCE = 1e-4
OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "judge" / "mannwhitney.json"


def cases(rng):
    """(name, x, y) sample pairs covering the shapes the judge meets."""
    out = []
    out.append(("normal-same", rng.normal(10, 2, 30), rng.normal(10, 2, 30)))
    out.append(("normal-shift-up", rng.normal(12, 2, 30), rng.normal(10, 2, 30)))
    out.append(("normal-shift-down", rng.normal(9, 2, 50), rng.normal(10, 2, 40)))
    out.append(("normal-small-shift", rng.normal(10.3, 2, 40), rng.normal(10, 2, 40)))
    out.append(("lognormal-same", rng.lognormal(0, 1, 60), rng.lognormal(0, 1, 60)))
    out.append(("lognormal-scaled", 1.3 * rng.lognormal(0, 1, 60), rng.lognormal(0, 1, 60)))
    out.append(("heavy-ties", rng.integers(0, 3, 40).astype(float), rng.integers(0, 3, 40).astype(float)))
    out.append(("heavy-ties-shifted", rng.integers(1, 4, 40).astype(float), rng.integers(0, 3, 40).astype(float)))
    out.append(("poisson", rng.poisson(7, 25).astype(float), rng.poisson(5, 25).astype(float)))
    out.append(("poisson-same", rng.poisson(5, 25).astype(float), rng.poisson(5, 25).astype(float)))
    same = rng.normal(0, 1, 20)
    out.append(("equal-arrays", same.copy(), same.copy()))
    out.append(("equal-permuted", rng.permutation(same), same.copy()))
    out.append(("small-3-4", rng.normal(0, 1, 3), rng.normal(0, 1, 4)))
    out.append(("small-5-5-shifted", rng.normal(5, 1, 5), rng.normal(0, 1, 5)))
    out.append(("small-1-2", rng.normal(0, 1, 1), rng.normal(0, 1, 2)))
    out.append(("unequal-10-200", rng.normal(1, 1, 10), rng.normal(0, 1, 200)))
    out.append(("unequal-200-10", rng.normal(0, 1, 200), rng.normal(0.5, 1, 10)))
    with_nan_x = rng.normal(0.02, 0.005, 40)
    with_nan_x[rng.choice(40, 6, replace=False)] = np.nan
    with_nan_y = rng.normal(0.01, 0.005, 40)
    with_nan_y[rng.choice(40, 3, replace=False)] = np.nan
    out.append(("with-nans", with_nan_x, with_nan_y))
    # Error ratios of an idle service: mostly exact zeros.
    err_x = np.where(rng.random(60) < 0.6, 0.0, rng.exponential(0.01, 60))
    err_y = np.where(rng.random(60) < 0.8, 0.0, rng.exponential(0.01, 60))
    out.append(("error-ratio-zeros", err_x, err_y))
    out.append(("heavy-tail", rng.standard_t(1.5, 80) + 0.2, rng.standard_t(1.5, 80)))
    out.append(("large-shifted", rng.normal(100.5, 5, 500), rng.normal(100, 5, 500)))
    out.append(("separated", rng.normal(50, 1, 30), rng.normal(10, 1, 30)))
    out.append(("constant-sides", np.full(10, 2.0), np.full(10, 1.0)))
    out.append(("one-side-constant", np.full(12, 0.0), rng.exponential(0.01, 12)))
    out.append(("latency-ms", rng.gamma(4, 25, 120), rng.gamma(4, 22, 120)))
    out.append(("tiny-values", rng.normal(3e-7, 1e-7, 30), rng.normal(2e-7, 1e-7, 30)))
    return out


def scipy_z(x, y, m, target):
    """z(m) as scipy's test sees x - m against y, with the sign of W; exact 0 when |W| <= 1/2."""
    xs = x - m
    res = stats.mannwhitneyu(xs, y, method="asymptotic", use_continuity=True, alternative="two-sided")
    w = res.statistic - len(x) * len(y) / 2
    if abs(w) <= 0.5:
        return 0.0
    return math.copysign(stats.norm.isf(res.pvalue / 2), w) if res.pvalue < 1 else 0.0


def root_range(x, y, target):
    """Where z(m) - target changes sign: a [lo, hi] range of shifts, clamped to the search range."""
    d = np.unique(np.subtract.outer(x, y).ravel())
    m_min, m_max = x.min() - y.max(), x.max() - y.min()
    f_min = scipy_z(x, y, m_min, target) - target
    f_max = scipy_z(x, y, m_max, target) - target
    if f_min <= 0:
        return [m_min, m_min]
    if f_max >= 0:
        return [m_max, m_max]
    # f on the open interval k: (-inf, d0), (d0, d1), ..., (d_{K-1}, inf); non-increasing in k.
    def f_interval(k):
        if k == 0:
            m = d[0] - 1.0
        elif k == len(d):
            m = d[-1] + 1.0
        else:
            m = 0.5 * (d[k - 1] + d[k])
        return scipy_z(x, y, m, target) - target

    def first(pred):
        lo, hi = 0, len(d)
        while lo < hi:
            mid = (lo + hi) // 2
            if pred(f_interval(mid)):
                hi = mid
            else:
                lo = mid + 1
        return lo

    k_first_nonpositive = first(lambda f: f <= 0)
    k_first_negative = first(lambda f: f < 0)
    lo = d[k_first_nonpositive - 1]
    hi = d[k_first_negative - 1]
    return [float(lo), float(hi)]


def classify(lower, upper, estimate, ratio):
    tol = 0.25 * abs(estimate)
    ratio_high = ratio is None or ratio >= 1.0
    ratio_low = ratio is None or ratio <= 1.0
    if lower > tol and ratio_high:
        return "High"
    if upper < -tol and ratio_low:
        return "Low"
    return "Pass"


def fences(v):
    if len(v) == 0:
        return None
    q1, q3, p1, p99 = np.percentile(v, [25, 75, 1, 99])
    iqr = q3 - q1
    return [float(min(p1, q1 - 3 * iqr)), float(max(p99, q3 + 3 * iqr))]


def case_record(name, x_raw, y_raw):
    x = x_raw[~np.isnan(x_raw)]
    y = y_raw[~np.isnan(y_raw)]
    res = stats.mannwhitneyu(x_raw, y_raw, method="asymptotic", use_continuity=True,
                             alternative="two-sided", nan_policy="omit")
    u = float(res.statistic)
    p = float(res.pvalue)
    w = u - len(x) * len(y) / 2
    pooled = np.concatenate([x, y])
    sigma_zero = len(np.unique(pooled)) == 1
    rec = {
        "name": name,
        "x": [None if math.isnan(v) else float(v) for v in x_raw],
        "y": [None if math.isnan(v) else float(v) for v in y_raw],
        "u": u,
        "w": w,
        "p": p,
        "z_abs": float(stats.norm.isf(p / 2)) if p < 1 else 0.0,
        "sigma_zero": bool(sigma_zero),
        "fences": {"x": fences(x), "y": fences(y)},
    }
    identical = len(x) == len(y) and np.array_equal(np.sort(x), np.sort(y))
    constant_sides = len(np.unique(x)) == 1 and len(np.unique(y)) == 1
    ratio = None if y.mean() == 0 else float(x.mean() / y.mean())
    if identical or sigma_zero:
        rec["interval"] = None
        rec["verdict"] = {"expected": "Pass", "robust": True}
        return rec
    if constant_sides or min(len(x), len(y)) < 2:
        # The judge adds seeded noise here (or may fail on all-tied ranks): no exact roots.
        rec["interval"] = None
        rec["verdict"] = None
        return rec
    z_crit = float(stats.norm.isf((1 - CONFIDENCE) / 2))
    lower = root_range(x, y, z_crit)
    upper = root_range(x, y, -z_crit)
    estimate = root_range(x, y, 0.0)
    rec["interval"] = {"confidence": CONFIDENCE, "z_critical": z_crit,
                       "lower": lower, "upper": upper, "estimate": estimate}
    slack = BRENT_RELATIVE_TOLERANCE * ((x.max() - y.min()) - (x.min() - y.max()))
    estimates = [estimate[0], estimate[1]] + ([0.0] if estimate[0] <= 0 <= estimate[1] else [])
    verdicts = {
        classify(lo, up, e, ratio)
        for lo in (lower[0] - slack, lower[1] + slack)
        for up in (upper[0] - slack, upper[1] + slack)
        for e in estimates
    }
    expected = classify(0.5 * (lower[0] + lower[1]), 0.5 * (upper[0] + upper[1]),
                        0.5 * (estimate[0] + estimate[1]), ratio)
    rec["verdict"] = {"expected": expected, "robust": len(verdicts) == 1}
    return rec


def main():
    rng = np.random.default_rng(SEED)
    records = [case_record(name, np.asarray(x, float), np.asarray(y, float)) for name, x, y in cases(rng)]
    z_critical = {str(c): float(stats.norm.isf((1 - c) / 2)) for c in (0.8, 0.9, 0.95, 0.98, 0.99, 0.999)}
    doc = {
        "generator": "analysis/scripts/judge_oracle.py",
        "seed": SEED,
        "scipy": __import__("scipy").__version__,
        "numpy": np.__version__,
        "z_critical": z_critical,
        "cases": records,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    print(f"wrote {len(records)} cases to {OUT}")


if __name__ == "__main__":
    main()
