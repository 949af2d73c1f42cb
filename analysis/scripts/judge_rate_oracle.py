#!/usr/bin/env python3
"""Oracle for the judge's test for rates (`kind: ratio`), computed with scipy.

Writes analysis/tests/fixtures/judge/rates.json:

  betainc  scipy.special.betainc(a, b, x), the regularized incomplete beta I_x(a, b), on a grid
  cases    per case the canary errors/requests (ec, nc) and baseline errors/requests (eb, nb),
           the confidence, and what scipy says about them:
    pi       scipy.stats.binomtest(ec, ec + eb, nc / (nc + nb)).proportion_ci(confidence,
             method="exact"): the Clopper-Pearson interval of the canary's share of the errors
    ratio    that interval as a rate ratio, pi / (1 - pi) * nb / nc (None for infinity); the same
             numbers as R's poisson.test(c(ec, eb), c(nc, nb), conf.level = confidence)$conf.int
    p        the binomial test's two-sided p-value of a rate ratio of 1 (for reference)
    verdict  High when the lower end exceeds 1, Low when the upper end is below 1, else Pass
             (direction either, allowedIncrease = allowedDecrease = 1); Pass without errors

Run from anywhere with scipy installed (`pip install scipy`); the output is committed so the Rust
tests need no Python.
"""

import json
import math
import pathlib

from scipy import special, stats

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "judge" / "rates.json"

CASES = [
    # name, ec, nc, eb, nb, confidence
    ("aa-1-percent", 300, 30000, 1200, 120000, 0.98),
    ("double-1-percent", 600, 30000, 1200, 120000, 0.98),
    ("rare-0.1-vs-0.5", 150, 30000, 120, 120000, 0.98),
    ("zero-baseline", 60, 30000, 0, 120000, 0.98),
    ("zero-canary", 0, 30000, 240, 120000, 0.98),
    ("one-error-each", 1, 1000, 1, 4000, 0.98),
    ("few-errors", 3, 500, 2, 2000, 0.95),
    ("half-rate", 150, 30000, 1200, 120000, 0.98),
    ("all-errors-canary", 20, 20, 5, 1000, 0.99),
    ("close-call", 37, 10000, 110, 40000, 0.98),
    ("large", 20500, 1000000, 80000, 4000000, 0.999),
    ("tiny-confidence", 12, 1000, 40, 4000, 0.5),
]


def main():
    betainc = []
    for a, b in [(0.5, 0.5), (1, 1), (2, 3), (10, 2), (60, 121), (600, 1201), (5000, 300)]:
        for x in [1e-6, 0.01, 0.1, 0.33, 0.5, 0.9, 0.999]:
            betainc.append({"a": a, "b": b, "x": x, "value": float(special.betainc(a, b, x))})
    cases = []
    for name, ec, nc, eb, nb, confidence in CASES:
        k = ec + eb
        share = nc / (nc + nb)
        test = stats.binomtest(ec, k, share)
        ci = test.proportion_ci(confidence_level=confidence, method="exact")
        scale = nb / nc

        def to_ratio(pi):
            return None if pi >= 1.0 else pi / (1.0 - pi) * scale

        lower, upper = to_ratio(ci.low), to_ratio(ci.high)
        if lower is not None and lower > 1.0:
            verdict = "High"
        elif upper is not None and upper < 1.0:
            verdict = "Low"
        else:
            verdict = "Pass"
        cases.append({
            "name": name, "ec": ec, "nc": nc, "eb": eb, "nb": nb, "confidence": confidence,
            "pi": [float(ci.low), float(ci.high)],
            "ratio": [lower, upper],
            "p": float(test.pvalue),
            "verdict": verdict,
        })
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"betainc": betainc, "cases": cases}, indent=1) + "\n")
    print(f"wrote {len(cases)} cases and {len(betainc)} beta values to {OUT}")


if __name__ == "__main__":
    main()
