"""numerics.convergence on synthetic long runs: the equivalence test of the tails, the curves, the margin."""

from __future__ import annotations

import json
import math
import random

from hypothesis import given, settings, strategies as st

from infrarsi.verifiers import RunEvidence, check_convergence, run_losses

STEPS = 150


def _run(seed: int, drift: float = 0.0, start: int = 40, noise: float = 0.02) -> list[float]:
    """A decaying loss with per-step noise that depends on the seed; ``drift`` adds a slope after ``start``."""
    rng = random.Random(seed)
    return [
        2 + 3 * math.exp(-i / 30) + noise * rng.random() + (drift * (i - start) / 100 if i > start else 0.0)
        for i in range(STEPS)
    ]


def _pairs(seeds: int, **candidate) -> tuple[list[list[float]], list[list[float]]]:
    return [_run(s) for s in range(seeds)], [_run(s, **candidate) for s in range(seeds)]


def test_runs_that_differ_by_rounding_are_equivalent():
    base = [_run(s) for s in range(3)]
    cand = [[x * (1 + 1e-7) for x in run] for run in base]
    check = check_convergence(base, cand, tail=0.2, loss_rtol=1e-3)
    assert check.status == "pass", check.detail
    assert check.evidence["seeds"] == 3 and check.evidence["tail_steps"] == 30
    assert check.evidence["parted_at"] is None


def test_a_late_drift_fails_with_the_step_where_the_curves_part():
    base, cand = _pairs(3, drift=0.1)
    check = check_convergence(base, cand, tail=0.2, loss_rtol=1e-3)
    assert check.status == "fail"
    assert "trains measurably worse" in check.detail
    assert 40 < check.evidence["parted_at"] < STEPS
    assert check.evidence["ci90"][0] > check.evidence["margin"]


def test_training_measurably_better_fails_too():
    base, cand = _pairs(3, drift=-0.1)
    check = check_convergence(base, cand, tail=0.2, loss_rtol=1e-3)
    assert check.status == "fail" and "trains measurably better" in check.detail


def test_curves_that_part_mid_run_fail_even_where_the_tails_meet():
    base = [_run(s) for s in range(3)]
    cand = [[x + (0.5 if 40 < i < 90 else 0.0) for i, x in enumerate(run)] for run in base]
    check = check_convergence(base, cand, tail=0.2, loss_rtol=1e-3)
    assert check.status == "fail" and "the tails meet" in check.detail
    assert 40 < check.evidence["max_gap_step"] < 100


def test_detours_the_other_way_under_another_seed_do_not_cancel():
    """Red-teamed: the gap is judged seed by seed, never averaged over seeds."""
    base = [_run(s) for s in range(2)]
    cand = [
        [x + (0.3 if 40 < i < 90 else 0.0) for i, x in enumerate(base[0])],
        [x - (0.3 if 40 < i < 90 else 0.0) for i, x in enumerate(base[1])],
    ]
    check = check_convergence(base, cand, tail=0.2, loss_rtol=1e-3)
    assert check.status == "fail" and "the tails meet" in check.detail, check.detail
    assert check.evidence["max_gap_seed"] in (0, 1) and abs(check.evidence["max_gap"]) > 0.25


def test_a_change_under_one_seed_only_is_not_shown_equivalent():
    """A job that behaves differently without a seed argument (seed 0's launch) than with one."""
    base = [_run(s) for s in range(2)]
    cand = [_run(0, drift=0.1), list(base[1])]
    check = check_convergence(base, cand, tail=0.2, loss_rtol=1e-3)
    assert check.status == "fail", check.detail


def test_the_margin_is_the_seeds_spread_unless_the_contract_sets_one():
    base, cand = _pairs(4)
    spread = check_convergence(base, cand, tail=0.2, loss_rtol=1e-6)
    assert spread.evidence["margin"] == spread.evidence["spread"] > 0
    assert "seed-to-seed" in spread.evidence["margin_from"]
    given_margin = check_convergence(base, cand, tail=0.2, loss_rtol=1e-6, margin=0.05)
    level = sum(given_margin.evidence["baseline_tail"]) / 4
    assert math.isclose(given_margin.evidence["margin"], 0.05 * level)


def test_seeds_with_no_spread_fall_back_to_loss_rtol():
    """A job whose seed is not wired in has no spread: the margin is loss_rtol, not zero."""
    one = _run(0)
    base = [list(one), list(one)]
    cand = [[x * (1 + 5e-4) for x in one], [x * (1 + 5e-4) for x in one]]
    check = check_convergence(base, cand, tail=0.2, loss_rtol=1e-3)
    assert check.status == "pass" and "loss_rtol" in check.evidence["margin_from"]
    worse = [[x * 1.01 for x in one], [x * 1.01 for x in one]]
    assert check_convergence(base, worse, tail=0.2, loss_rtol=1e-3).status == "fail"


def test_wrong_shapes_are_unchecked():
    base = [_run(0), _run(1)]
    assert check_convergence(base, base[:1], tail=0.2, loss_rtol=1e-3).status == "unchecked"
    assert check_convergence(base[:1], base[:1], tail=0.2, loss_rtol=1e-3).status == "unchecked"
    assert check_convergence(base, [_run(0), _run(1)[:-1]], tail=0.2, loss_rtol=1e-3).status == "unchecked"


def test_the_evidence_keeps_thinned_curves_with_their_seed_band():
    base, cand = _pairs(3)
    curves = check_convergence(base, cand, tail=0.2, loss_rtol=1e-3).evidence["curves"]
    for arm in ("baseline", "candidate"):
        mean, low, high = (curves[arm][k] for k in ("mean", "low", "high"))
        assert mean[-1][0] == STEPS and len(mean) <= 61
        assert all(lo[1] <= m[1] <= hi[1] for lo, m, hi in zip(low, mean, high))


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 5), st.integers(0, 10_000), st.floats(0.05, 1.0))
def test_a_candidate_identical_to_the_baseline_always_passes(seeds, salt, tail):
    base = [_run(s + salt) for s in range(seeds)]
    check = check_convergence(base, [list(r) for r in base], tail=tail, loss_rtol=1e-3)
    assert check.status == "pass", check.detail


def _evidence(lines: list[dict]) -> RunEvidence:
    return RunEvidence.from_stored([json.dumps(line) for line in lines], {})


def test_run_losses_needs_a_finite_loss_at_every_step():
    steps = [{"type": "step", "step": k, "loss": 1.0 / k} for k in range(1, 6)]
    assert run_losses(_evidence(steps), 5) == [1.0 / k for k in range(1, 6)]
    assert "no receipt for step 5" in run_losses(_evidence(steps[:4]), 5)
    bad = steps[:2] + [{"type": "step", "step": 3, "loss": float("nan")}] + steps[3:]
    assert "step 3 has no finite loss" in run_losses(_evidence(bad), 5)
