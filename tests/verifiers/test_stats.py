"""Tests for verifiers._stats: A/B order, the speedup interval, and its error rates on seeded synthetic runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from infrarsi.verifiers import check_speedup
from infrarsi.verifiers._stats import (
    SpeedupEstimate,
    ab_order,
    estimate_speedup,
    min_detectable_speedup,
    t_quantile,
)

MIN_SPEEDUP = 1.02
PAIRS = 5
TRIALS = 200


def _runs(
    rng: np.random.Generator, speedup: float, cv: float, pairs: int = PAIRS, drift_per_run: float = 0.0
) -> tuple[list[float], list[float]]:
    """Times in ab_order with lognormal noise (CV ``cv``) per run and an optional multiplicative drift per run."""
    sigma = math.sqrt(math.log1p(cv * cv))
    base, cand = [], []
    for slot, arm in enumerate(ab_order(pairs)):
        t = 1.0 if arm == "B" else 1.0 / speedup
        t *= math.exp(rng.normal(0.0, sigma)) * (1.0 + drift_per_run) ** slot
        (base if arm == "B" else cand).append(t)
    return base, cand


def _pass_rate(seed: int, speedup: float, cv: float, drift_per_run: float = 0.0) -> tuple[int, int]:
    rng = np.random.default_rng(seed)
    passes = 0
    for _ in range(TRIALS):
        b, a = _runs(rng, speedup, cv, drift_per_run=drift_per_run)
        res, est = check_speedup(b, a, MIN_SPEEDUP, PAIRS)
        assert res.status in ("pass", "fail") and est is not None
        passes += res.status == "pass"
    return passes, TRIALS


# ---- ab_order ---------------------------------------------------------------


@pytest.mark.parametrize("pairs", [0, 1, 2, 5, 8])
def test_ab_order_shape_and_balance(pairs):
    order = ab_order(pairs)
    assert len(order) == 2 * pairs
    assert order.count("A") == order.count("B") == pairs
    for i in range(pairs):
        assert tuple(order[2 * i : 2 * i + 2]) == (("B", "A") if i % 2 == 0 else ("A", "B"))


def test_ab_order_prefix():
    assert ab_order(4) == ["B", "A", "A", "B", "B", "A", "A", "B"]


# ---- estimate ---------------------------------------------------------------


def test_t_quantile_matches_tables():
    assert t_quantile(0.975, 4) == pytest.approx(2.7764, abs=1e-4)
    assert t_quantile(0.95, 8) == pytest.approx(1.8595, abs=1e-4)
    assert t_quantile(0.95, 1) == pytest.approx(6.3138, abs=1e-4)
    assert t_quantile(0.975, 3) == pytest.approx(3.1824, abs=1e-4)
    assert t_quantile(0.05, 8) == pytest.approx(-1.8595, abs=1e-4)


def test_estimate_is_deterministic_and_ratios_paired_by_index():
    b = [1.00, 1.02, 0.99, 1.01, 1.03]
    a = [0.90, 0.93, 0.91, 0.90, 0.94]
    e1 = estimate_speedup(b, a)
    e2 = estimate_speedup(b, a, seed=123, resamples=10)
    assert e1 == e2
    assert isinstance(e1, SpeedupEstimate)
    assert e1.pairs == 5
    assert e1.ratios == pytest.approx([x / y for x, y in zip(b, a)])
    assert e1.median == pytest.approx(float(np.median([x / y for x, y in zip(b, a)])))
    assert set(e1.to_json()) == {"median", "ci_low", "ci_high", "pairs", "confidence"}
    assert e1.to_json()["pairs"] == 5 and e1.to_json()["confidence"] == 0.95


_pos = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=2, max_value=20).flatmap(
        lambda n: st.tuples(st.lists(_pos, min_size=n, max_size=n), st.lists(_pos, min_size=n, max_size=n))
    )
)
def test_interval_contains_median(lists):
    b, a = lists
    e = estimate_speedup(b, a)
    assert e.ci_low <= e.median <= e.ci_high
    assert e.ci_low > 0 and math.isfinite(e.ci_high)


def test_estimate_rejects_bad_input():
    with pytest.raises(ValueError):
        estimate_speedup([1.0, 1.0], [1.0])
    with pytest.raises(ValueError):
        estimate_speedup([1.0], [1.0])
    with pytest.raises(ValueError):
        estimate_speedup([1.0, float("nan")], [1.0, 1.0])


# ---- check_speedup: missing evidence ----------------------------------------

GOOD_B = [1.0, 1.01, 0.99, 1.0, 1.02]
GOOD_A = [0.80, 0.81, 0.79, 0.80, 0.815]


def test_clear_speedup_passes_with_evidence():
    res, est = check_speedup(GOOD_B, GOOD_A, MIN_SPEEDUP, PAIRS)
    assert res.status == "pass" and res.id == "stats.speedup"
    assert est is not None and est.ci_low > MIN_SPEEDUP
    for key in ("baseline_s", "candidate_s", "ratios", "median", "ci_low", "ci_high", "method"):
        assert key in res.evidence
    assert res.to_json()["status"] == "pass"


def test_no_speedup_fails_with_readable_detail():
    res, est = check_speedup(GOOD_B, GOOD_B[::-1], MIN_SPEEDUP, PAIRS)
    assert res.status == "fail" and est is not None
    assert "over 5 pairs" in res.detail and "must clear 1.02" in res.detail


@pytest.mark.parametrize(
    "b,a,why",
    [
        (GOOD_B[:4], GOOD_A[:4], "4 complete A/B pairs, 5 required"),
        (GOOD_B, GOOD_A[:4], "candidate times"),
        (GOOD_B[:-1] + [float("nan")], GOOD_A, "baseline_s[4]"),
        (GOOD_B, [0.0] + GOOD_A[1:], "candidate_s[0]"),
        (GOOD_B, [-1.0] + GOOD_A[1:], "candidate_s[0]"),
        (GOOD_B, GOOD_A[:-1] + [float("inf")], "candidate_s[4]"),
        ([], [], "0 complete A/B pairs"),
    ],
)
def test_unchecked_on_missing_or_bad_times(b, a, why):
    res, est = check_speedup(b, a, MIN_SPEEDUP, PAIRS)
    assert res.status == "unchecked" and est is None
    assert not res.passed
    assert why in res.detail


def test_one_pair_is_never_enough():
    res, est = check_speedup([1.0], [0.5], MIN_SPEEDUP, 1)
    assert res.status == "unchecked" and est is None


# ---- seeded synthetic error rates -------------------------------------------


# Bound on the count out of 200, per noise level. At 3% the true false-pass rate is about
# 0.35%. At 5% it is about 1.0-1.06% (measured over 20,000 and 200,000 trials), right on
# the 1% target. With 5 pairs, no rule of the form "mean - k*s" can push it lower without
# dropping the 1.10x pass rate below 95% (see the module docstring). A 200-trial count
# of <= 2 would hold for only about two seeds in three, so the 5% bound is 2%, not 1%.
@pytest.mark.parametrize("cv,max_rate", [(0.03, 0.01), (0.05, 0.02)])
def test_aa_false_pass_rate(cv, max_rate):
    passes, n = _pass_rate(seed=1000 + int(cv * 1000), speedup=1.0, cv=cv)
    print(f"\nA/A cv={cv:.0%}: false pass {passes}/{n} = {passes / n:.1%}")
    assert passes <= max_rate * n


def test_true_ten_percent_speedup_is_detected():
    passes, n = _pass_rate(seed=2000, speedup=1.10, cv=0.03)
    print(f"\n1.10x cv=3%: pass {passes}/{n} = {passes / n:.1%}")
    assert passes >= 0.95 * n


def test_linear_drift_cancels_in_ab_order():
    # Each run 1% faster than the one before (10% over the sequence): in plain B A B A
    # order the candidate would always look faster; B A A B cancels it.
    passes, n = _pass_rate(seed=3000, speedup=1.0, cv=0.03, drift_per_run=-0.01)
    print(f"\nA/A cv=3% with -1%/run drift: false pass {passes}/{n} = {passes / n:.1%}")
    assert passes <= 0.01 * n
    # Noise-free drift alone: the ratios alternate around 1 and never pass.
    b, a = _runs(np.random.default_rng(0), 1.0, 0.0, drift_per_run=-0.01)
    res, est = check_speedup(b, a, MIN_SPEEDUP, PAIRS)
    assert res.status == "fail" and est is not None
    assert abs(math.log(est.median)) < 0.02


def test_min_detectable_speedup_passes_about_half_the_time():
    target = min_detectable_speedup(0.03, PAIRS, MIN_SPEEDUP)
    passes, n = _pass_rate(seed=4000, speedup=target, cv=0.03)
    print(f"\nat min detectable {target:.3f}x cv=3%: pass {passes}/{n} = {passes / n:.1%}")
    assert 0.25 * n <= passes <= 0.75 * n


# ---- min_detectable_speedup -------------------------------------------------


def test_min_detectable_speedup_monotone():
    cvs = [0.0, 0.01, 0.03, 0.05, 0.135, 0.3]
    vals = [min_detectable_speedup(cv, PAIRS, MIN_SPEEDUP) for cv in cvs]
    assert vals[0] == pytest.approx(MIN_SPEEDUP)
    assert all(x < y for x, y in zip(vals, vals[1:]))
    by_pairs = [min_detectable_speedup(0.03, p, MIN_SPEEDUP) for p in range(2, 30)]
    assert all(x > y for x, y in zip(by_pairs, by_pairs[1:]))
    assert min_detectable_speedup(0.03, 5, MIN_SPEEDUP) == pytest.approx(1.0566, abs=1e-3)
    assert min_detectable_speedup(0.135, 5, MIN_SPEEDUP) == pytest.approx(1.195, abs=2e-3)


# ---- the runner's clock ------------------------------------------------------

STEP_JITTER = 0.02  # per-step noise inside a run (lognormal sigma of one period)


def _timed_run(rng: np.random.Generator, step_s: float, cv: float, warmup: int = 2, measure: int = 8) -> float:
    """One run as the runner times it: arrival stamps of every step line, then the mean period.

    Per-step jitter (``STEP_JITTER``) plus a per-run factor (the machine's state) sized so
    the run's time has CV ``cv`` in all, with two random steps sampled (and so left out),
    as in every execution.
    """
    from infrarsi.verifiers import RunEvidence, runner_step_time

    kept = measure - 2
    run_sigma = math.sqrt(math.log1p(cv * cv) - STEP_JITTER**2 / kept)
    run_factor = math.exp(rng.normal(0.0, run_sigma))
    t, lines, arrivals = 10**9, ['{"type":"meta"}'], [10**9]
    for step in range(1, warmup + measure + 1):
        t += int(step_s * run_factor * math.exp(rng.normal(0.0, STEP_JITTER)) * 1e9)
        lines.append(f'{{"type":"step","step":{step}}}')
        arrivals.append(t)
    sampled = tuple(sorted(rng.choice(np.arange(warmup + 1, warmup + measure + 1), 2, replace=False).tolist()))
    return runner_step_time(RunEvidence(lines, arrivals, 10**9, t, sampled_steps=sampled), warmup, measure)


@pytest.mark.parametrize(("speedup", "cv", "bound"), [(1.0, 0.03, 0.01), (1.0, 0.05, 0.02), (1.10, 0.03, 0.95)])
def test_error_rates_hold_with_step_times_from_the_runners_clock(speedup, cv, bound):
    """The same bounds as above (A/A false passes at most 1% at 3% run noise and 2% at 5%; a
    real 1.10x passes at least 95% at 3%), when each run's time is the mean of its measured
    periods as the runner takes it. 1,000 trials: 0.5%, 1.3% and 96.2% on this seed."""
    rng = np.random.default_rng(20261206)
    trials, passes = 1000, 0
    for _ in range(trials):
        times = {"B": [], "A": []}
        for arm in ab_order(PAIRS):
            times[arm].append(_timed_run(rng, 1.0 if arm == "B" else 1.0 / speedup, cv))
        result, _ = check_speedup(times["B"], times["A"], MIN_SPEEDUP, PAIRS)
        passes += result.status == "pass"
    rate = passes / trials
    assert (rate <= bound) if speedup == 1.0 else (rate >= bound), (speedup, cv, rate)
