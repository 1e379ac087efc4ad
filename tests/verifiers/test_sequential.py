"""The sequential A/B (verifiers/_sequential.py): error rates across looks on seeded simulated
runs, where it stops, and that pairs past a deciding look change nothing."""

from __future__ import annotations

import numpy as np
import pytest

from infrarsi.verifiers import SequentialPlan, ab_order, check_speedup, run_looks

MIN_SPEEDUP = 1.02
TRIALS = 2000


def _arms(rng, true_speedup: float, cv: float, pairs: int) -> tuple[list[float], list[float]]:
    sigma = np.sqrt(np.log1p(cv * cv))
    base = np.exp(rng.normal(np.log(0.1), sigma, pairs))
    cand = np.exp(rng.normal(np.log(0.1 / true_speedup), sigma, pairs))
    return list(base), list(cand)


def _rate(true_speedup: float, cv: float, plan: SequentialPlan, seed: int) -> tuple[float, float]:
    """(pass rate, mean pairs used) over TRIALS simulated A/Bs."""
    rng = np.random.default_rng(seed)
    passed = used = 0
    for _ in range(TRIALS):
        base, cand = _arms(rng, true_speedup, cv, plan.max_pairs)
        decision = run_looks(base, cand, MIN_SPEEDUP, plan)
        passed += decision.status == "pass"
        used += decision.pairs
    return passed / TRIALS, used / TRIALS


@pytest.mark.parametrize("plan", [SequentialPlan(5, 10), SequentialPlan(5, 8), SequentialPlan(3, 12)])
def test_an_a_a_comparison_rarely_passes_however_many_looks(plan):
    rate, _ = _rate(1.0, 0.03, plan, seed=11)
    assert rate <= 0.01, rate
    rate5, _ = _rate(1.0, 0.05, plan, seed=12)
    assert rate5 <= 0.02, rate5


def test_a_true_1_10x_passes_at_3_percent_noise_and_mostly_on_the_first_look():
    plan = SequentialPlan(5, 10)
    rate, pairs = _rate(1.10, 0.03, plan, seed=13)
    assert rate >= 0.95, rate
    assert pairs < 6.5, pairs  # the looks stop when they decide: not every A/B runs to 10


def test_the_looks_pass_what_one_look_at_the_minimum_misses():
    """At 5% noise a true 1.10x is near the fixed design's detection limit: the extra looks recover it."""
    fixed, _ = _rate(1.10, 0.05, SequentialPlan(5, 5), seed=14)
    looks, _ = _rate(1.10, 0.05, SequentialPlan(5, 12), seed=14)
    assert looks > fixed + 0.05, (fixed, looks)


def test_one_look_is_the_fixed_design_at_the_full_confidence():
    plan = SequentialPlan(5, 5)
    assert plan.looks == 1 and plan.look_confidence == pytest.approx(0.95)
    split = SequentialPlan(5, 8)
    assert split.looks == 4 and split.look_confidence == pytest.approx(1 - 0.05 / 4)


def test_a_clear_speedup_stops_at_the_first_look_and_a_slowdown_fails_there():
    base, cand = [0.2, 0.21, 0.2, 0.19, 0.2, 0.2, 0.2], [0.1, 0.1, 0.11, 0.1, 0.1, 0.1, 0.1]
    decision = run_looks(base, cand, MIN_SPEEDUP, SequentialPlan(5, 10))
    assert decision.status == "pass" and decision.pairs == 5 and len(decision.looks) == 1
    slower = run_looks(cand, base, MIN_SPEEDUP, SequentialPlan(5, 10))
    assert slower.status == "fail" and slower.pairs == 5  # the median is below the bar: no more pairs


def test_an_undecided_look_asks_for_more_pairs_and_the_last_look_fails():
    rng = np.random.default_rng(3)
    base = list(0.1 * np.exp(rng.normal(0, 0.08, 6)))
    cand = [b / 1.06 for b in base[:3]] + [b / 1.02 for b in base[3:]]
    plan = SequentialPlan(3, 6)
    partial = run_looks(base[:3], cand[:3], MIN_SPEEDUP, plan)
    if partial.status == "undecided":
        check, _ = check_speedup(base[:3], cand[:3], MIN_SPEEDUP, 3, max_pairs=6)
        assert check.status == "unchecked" and "undecided with 3 pairs" in check.detail
    final = run_looks(base, cand, MIN_SPEEDUP, plan)
    assert final.status in ("pass", "fail")
    assert final.looks[-1].decision == final.status
    assert all(look.decision == "continue" for look in final.looks[:-1])


def test_pairs_after_the_deciding_look_are_never_judged():
    """A verify that ran on past a pass (or a ledger that gained rows) can't turn the verdict."""
    base, cand = [0.2] * 5 + [0.1] * 5, [0.1] * 5 + [0.2] * 5
    base = [b * (1 + 0.01 * i) for i, b in enumerate(base)]
    check, est = check_speedup(base, cand, MIN_SPEEDUP, 5, max_pairs=10)
    assert check.status == "pass" and est.pairs == 5
    assert [look["pairs"] for look in check.evidence["looks"]] == [5]
    assert check.evidence["sequential"]["max_pairs"] == 10


def test_a_drifted_baseline_arm_stops_the_looks_unchecked():
    base, cand = [0.2, 0.21, 0.2, 0.19, 0.2], [0.1, 0.1, 0.11, 0.1, 0.1]
    check, _ = check_speedup(base, cand, MIN_SPEEDUP, 5, stored=(0.1, 0.01), max_pairs=10)
    assert check.status == "unchecked" and "not trusted" in check.detail


def test_the_plan_refuses_nonsense():
    with pytest.raises(ValueError, match="max_pairs"):
        SequentialPlan(5, 4)
    with pytest.raises(ValueError, match="min_pairs"):
        SequentialPlan(1, 4)


def test_heavy_tails_and_drift_do_not_buy_an_a_a_pass():
    """Outlier runs (Student t noise, 3 degrees of freedom) and a slow drift over the batch, laid
    on the runs in their real order (B A A B B A ...), so it favours one arm in each pair: the
    looks still pass an A/A comparison at most 1% of the time."""
    rng = np.random.default_rng(21)
    plan = SequentialPlan(5, 10)
    order = ab_order(plan.max_pairs)
    drift = np.arange(len(order)) * 0.01  # 1% slower with each run of the batch
    passed = 0
    for _ in range(TRIALS):
        times = np.exp(np.log(0.1) + rng.standard_t(3, len(order)) * 0.03 + drift)
        base = [t for t, role in zip(times, order) if role == "B"]
        cand = [t for t, role in zip(times, order) if role == "A"]
        passed += run_looks(base, cand, MIN_SPEEDUP, plan).status == "pass"
    assert passed / TRIALS <= 0.01, passed / TRIALS


@pytest.mark.parametrize("plan", [SequentialPlan(5, 5), SequentialPlan(5, 10)])
def test_a_true_speedup_at_the_bar_passes_at_most_the_overall_error(plan):
    """The guarantee itself: a candidate exactly min_speedup faster passes at most about 5% of the
    time, over all the looks together (the union bound), at 3% and at 5% noise."""
    for cv, seed in ((0.03, 31), (0.05, 32)):
        rate, _ = _rate(MIN_SPEEDUP, cv, plan, seed=seed)
        assert rate <= 0.06, (cv, rate)
