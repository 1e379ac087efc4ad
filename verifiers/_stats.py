"""Speedup statistics for back-to-back A/B timing runs. Pure functions: no I/O, no clock.

Runs go in the order ``ab_order`` gives (B A A B B A ...; B is the baseline, A the
candidate). Pair ``i`` is baseline run ``i`` with candidate run ``i``. Its ratio is
baseline/candidate, so a value above 1 means the candidate is faster. Alternating the
order inside each pair cancels a slow linear drift over the whole sequence (the drift
favours A in one pair and B in the next).

Method: a Student-t lower bound on the mean log-ratio, using a pooled variance
------------------------------------------------------------------------------
With the default 5 pairs, the usual intervals don't meet both of the targets we need.
The targets are (a) an A/A comparison with 3% or 5% lognormal noise per run passes
``ci_low > 1.02`` at most 1% of the time, and (b) a real 1.10x speedup at 3% noise
passes at least 95% of the time. Measured over 200,000 simulated comparisons at 5 pairs
(A/A 3%, A/A 5%, pass rate at 1.10x):

* percentile bootstrap of the median: anti-conservative with 5 points (it has only
  126 distinct resamples and its interval is too narrow);
* exact sign-test or Wilcoxon interval: the only level reachable with n=5 is
  1 - 2/32, and its lower bound is the smallest ratio. That gives 0.3%, 0.9%, 82%:
  too little power;
* paired t-interval, two-sided 95% (t_4 = 2.776): 0.2%, 0.7%, 84%: too little power;
* paired t-bound, one-sided 95% (t_4 = 2.132): 0.5%, 1.5%, 94%. With 4 degrees of
  freedom the spread estimate is so noisy that a lucky small spread makes A/A pass.

This module uses a spread with more degrees of freedom. Under independent run noise,
the spread of the log-ratio ``d = log b - log a`` can also be read from the two arms
separately: ``var(d) = var(log b) + var(log a)``. That estimate has ``2n - 2`` degrees
of freedom where the paired one has ``n - 1``. The spread used is

    s = max(s_paired, sqrt(s_b**2 + s_a**2))

with critical value ``t = t_{2n-2, confidence}``, **one-sided**. ``confidence`` is the
coverage of each bound on its own, so ``[ci_low, ci_high]`` is a two-sided
``2*confidence - 1`` interval, which is 90% at the default. The test only looks at
``ci_low``, and ``ci_low`` is a one-sided 95% lower bound. Taking the max means the
spread is never smaller than the paired estimate. Drift, or any slowdown that hits both
runs of one pair, widens the within-arm spread, so such effects make the check stricter,
never looser. Measured rates: 0.3%, 1.1%, 96%. In A/A with 13.5% noise per run the
false-pass rate is 2.5%. That is about the best trade-off any "mean - k*s" rule gets
with 10 runs. Making it stricter loses power, and making it looser passes more A/A
comparisons: with k = 2.0, the rates are 0.25%, 0.8%, 95%.

Reported numbers: the point estimate is the median of the per-pair ratios. The
interval is ``exp(mean(d) -/+ t * s / sqrt(n))``, widened if needed so that it contains
the median. Widening only makes the check stricter.

Smallest detectable speedup, the one that passes about half the time: with ``cv``
noise per run, ``sigma = sqrt(log(1 + cv**2))`` (about cv), the log-ratio of two runs
has spread ``sqrt(2) * sigma``, and

    min_detectable = min_speedup * exp(t_{2n-2, confidence} * sqrt(2) * sigma / sqrt(n))

At 5 pairs and min_speedup 1.02 this is about 1.057 for cv = 3% and 1.19 for cv = 13.5%.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "METHOD",
    "SpeedupEstimate",
    "ab_order",
    "baseline_drift",
    "DRIFT_FLOOR",
    "DRIFT_CV_MULTIPLE",
    "estimate_speedup",
    "min_detectable_speedup",
    "pairs_to_resolve",
    "MAX_SUGGESTED_PAIRS",
    "t_quantile",
]

METHOD = "one-sided t bound on mean log-ratio, spread max(paired, pooled arms), df 2n-2"


def ab_order(pairs: int) -> list[str]:
    """The run order: pair i is ("B", "A") when i is even, else ("A", "B")."""
    if pairs < 0:
        raise ValueError(f"pairs must be >= 0, got {pairs}")
    order: list[str] = []
    for i in range(pairs):
        order.extend(("B", "A") if i % 2 == 0 else ("A", "B"))
    return order


def _t_cdf(t: float, df: int) -> float:
    """Student-t CDF for an integer df (closed-form series, Abramowitz & Stegun 26.7.3-4)."""
    theta = math.atan2(t, math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    c2 = c * c
    if df % 2 == 1:
        acc, term = 0.0, c
        for k in range(1, (df - 1) // 2 + 1):
            acc += term
            term *= c2 * (2 * k) / (2 * k + 1)
        a = (2.0 / math.pi) * (theta + s * acc) if df > 1 else (2.0 / math.pi) * theta
    else:
        acc, term = 0.0, 1.0
        for k in range(1, df // 2 + 1):
            acc += term
            term *= c2 * (2 * k - 1) / (2 * k)
        a = s * acc
    return 0.5 * (1.0 + a)


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with integer ``df`` >= 1 (solved by bisection)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if df < 1 or int(df) != df:
        raise ValueError(f"df must be a positive integer, got {df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class SpeedupEstimate:
    median: float
    ci_low: float
    ci_high: float
    pairs: int
    ratios: list[float] = field(default_factory=list)
    confidence: float = 0.95  # each bound's one-sided coverage

    def to_json(self) -> dict:
        """The DESIGN.md ``speedup`` shape, with the pairs it rests on and its bounds' confidence."""
        return {
            "median": self.median,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "pairs": self.pairs,
            "confidence": self.confidence,
        }


def _bad_times(name: str, xs: list[float]) -> str | None:
    for i, x in enumerate(xs):
        try:
            v = float(x)
        except (TypeError, ValueError):
            return f"{name}[{i}] is not a number ({x!r})"
        if not math.isfinite(v) or v <= 0.0:
            return f"{name}[{i}] is {v!r}; times must be finite and > 0"
    return None


def estimate_speedup(
    baseline_s: list[float],
    candidate_s: list[float],
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> SpeedupEstimate:
    """Per-pair ratio baseline/candidate, their median, and the interval from the module docstring.

    ``confidence`` is the one-sided coverage of each bound. ``resamples`` and ``seed`` are
    kept for API compatibility only: the interval has a closed form, so the result is
    deterministic and they change nothing. Raises ValueError if the lists differ in
    length, have fewer than 2 pairs, or hold a time that is non-finite or <= 0.
    """
    del resamples, seed  # closed-form interval; see docstring
    if not 0.5 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0.5, 1), got {confidence}")
    if len(baseline_s) != len(candidate_s):
        raise ValueError(f"{len(baseline_s)} baseline times but {len(candidate_s)} candidate times")
    n = len(baseline_s)
    if n < 2:
        raise ValueError(f"need at least 2 pairs, got {n}")
    for name, xs in (("baseline_s", baseline_s), ("candidate_s", candidate_s)):
        bad = _bad_times(name, xs)
        if bad:
            raise ValueError(bad)
    b = np.log(np.asarray(baseline_s, dtype=float))
    a = np.log(np.asarray(candidate_s, dtype=float))
    d = b - a
    ratios = np.exp(d)
    s_paired = float(np.std(d, ddof=1))
    s_pooled = math.sqrt(float(np.var(b, ddof=1)) + float(np.var(a, ddof=1)))
    s = max(s_paired, s_pooled)
    half = t_quantile(confidence, 2 * n - 2) * s / math.sqrt(n)
    mean = float(np.mean(d))
    median = float(np.median(ratios))
    ci_low = min(math.exp(mean - half), median)
    ci_high = max(math.exp(mean + half), median)
    return SpeedupEstimate(
        median=median,
        ci_low=ci_low,
        ci_high=ci_high,
        pairs=n,
        ratios=[float(r) for r in ratios],
        confidence=confidence,
    )


def min_detectable_speedup(cv: float, pairs: int, min_speedup: float, confidence: float = 0.95) -> float:
    """The true speedup that passes about half the time with ``cv`` noise per run and ``pairs`` pairs."""
    if cv < 0:
        raise ValueError(f"cv must be >= 0, got {cv}")
    if pairs < 2:
        raise ValueError(f"pairs must be >= 2, got {pairs}")
    sigma = math.sqrt(math.log1p(cv * cv))
    t = t_quantile(confidence, 2 * pairs - 2)
    return min_speedup * math.exp(t * math.sqrt(2.0) * sigma / math.sqrt(pairs))


MAX_SUGGESTED_PAIRS = 100
_POWER_Z = 0.8416  # the standard normal's 80% quantile: the suggestion resolves 4 times in 5


def pairs_to_resolve(
    baseline_s: list[float], candidate_s: list[float], min_speedup: float, confidence: float = 0.95
) -> int | None:
    """How many pairs would put the lower bound above ``min_speedup`` about 4 times in 5, if the
    effect and the noise are what these pairs measured: the smallest ``n`` with
    ``mean(d) - log(min_speedup) >= (t_{2n-2} + z_0.8) * s / sqrt(n)`` (``s`` as in the check).

    None when the measured speedup does not clear ``min_speedup`` at all (more pairs will not
    help) or would need more than ``MAX_SUGGESTED_PAIRS``."""
    if len(baseline_s) != len(candidate_s) or len(baseline_s) < 2:
        return None
    b = np.log(np.asarray(baseline_s, dtype=float))
    a = np.log(np.asarray(candidate_s, dtype=float))
    d = b - a
    margin = float(np.mean(d)) - math.log(min_speedup)
    if margin <= 0 or float(np.median(np.exp(d))) <= min_speedup:
        return None
    s = max(float(np.std(d, ddof=1)), math.sqrt(float(np.var(b, ddof=1)) + float(np.var(a, ddof=1))))
    for n in range(2, MAX_SUGGESTED_PAIRS + 1):
        if margin >= (t_quantile(confidence, 2 * n - 2) + _POWER_Z) * s / math.sqrt(n):
            return n
    return None


# The A/B's baseline arm may differ from the stored baseline by this much before the
# comparison is distrusted: the larger of a fixed floor (a machine's load changes between
# `infrarsi baseline` and a later verify) and a multiple of the stored run-to-run CV.
DRIFT_FLOOR = 0.15
DRIFT_CV_MULTIPLE = 5.0


def baseline_drift(
    baseline_s: list[float], stored_median_s: float, stored_cv: float | None, floor: float = DRIFT_FLOOR
) -> str | None:
    """Why the A/B's baseline arm can't be trusted against the stored baseline, or None.

    ``floor`` is the contract's ``[search] drift_tolerance``; the allowance is the larger of it
    and ``DRIFT_CV_MULTIPLE`` times the stored run-to-run CV.

    A job that slows the runs after it (a process left behind, a machine it loaded)
    makes the baseline arm slower than the baseline ever was, and its own arm look fast.
    """
    if not baseline_s or not stored_median_s or stored_median_s <= 0:
        return None
    arm = float(np.median(baseline_s))
    allowed = max(floor, DRIFT_CV_MULTIPLE * (stored_cv or 0.0))
    if abs(math.log(arm / stored_median_s)) <= math.log1p(allowed):
        return None
    return (
        f"the A/B's baseline runs took {arm:.4g} s a step (median), the stored baseline {stored_median_s:.4g} s: "
        f"a drift of {arm / stored_median_s - 1:+.0%}, beyond the {allowed:.0%} its noise allows; "
        "something changed the machine between runs (re-run `infrarsi baseline` on a quiet machine)"
    )
