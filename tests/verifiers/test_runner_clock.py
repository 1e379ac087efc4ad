"""The step time on the runner's clock: periods between step ends, whatever the job's regions say."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings, strategies as st
from verifier_testing import MEASURE, TOTAL, WARMUP, make_run

from infrarsi.verifiers import (
    RunEvidence,
    baseline_drift,
    check_clock,
    check_speedup,
    region_share,
    runner_step_time,
    window_periods,
)


def _with_arrivals(run: RunEvidence, arrivals: list[int]) -> RunEvidence:
    return dataclasses.replace(run, arrivals_ns=arrivals)


def test_step_time_is_the_mean_period_between_line_arrivals():
    run = make_run(step_ms=50.0)
    # make_run spaces steps 51 ms apart (1 ms of data loading outside the region).
    assert runner_step_time(run, WARMUP, MEASURE) == pytest.approx(0.051, rel=1e-6)
    assert region_share(run, WARMUP, MEASURE) == pytest.approx(50 / 51, rel=1e-3)


def test_work_moved_out_of_the_region_is_still_paid_for():
    """The region shrinks to 5 ms, the step still takes 51 ms between its line and the last."""
    honest = make_run(step_ms=50.0)
    moved = make_run(step_ms=50.0, mutate=lambda r: {**r, "t1_ns": r["t0_ns"] + 5_000_000})
    assert runner_step_time(moved, WARMUP, MEASURE) == pytest.approx(runner_step_time(honest, WARMUP, MEASURE))
    assert region_share(moved, WARMUP, MEASURE) < 0.15
    assert check_clock(moved, WARMUP, MEASURE).status == "pass"


def test_sampled_steps_are_left_out_of_the_step_time():
    run = make_run(step_ms=50.0)
    arrivals = list(run.arrivals_ns)
    slow_step = WARMUP + 2
    for i in range(slow_step, len(arrivals)):  # arrivals[0] is the meta line: step k is index k
        arrivals[i] += 200_000_000  # the sampled step took 200 ms longer
    slowed = _with_arrivals(run, arrivals)
    assert runner_step_time(slowed, WARMUP, MEASURE) > 0.07
    sampled = dataclasses.replace(slowed, sampled_steps=(slow_step,))
    steps, _ = window_periods(sampled, WARMUP, MEASURE)
    assert slow_step not in steps and len(steps) == MEASURE - 1
    assert runner_step_time(sampled, WARMUP, MEASURE) == pytest.approx(0.051, rel=1e-6)


def test_a_missing_arrival_means_no_step_time_and_says_which():
    run = make_run()
    cut = dataclasses.replace(run, arrivals_ns=run.arrivals_ns[: TOTAL - 1])
    assert runner_step_time(cut, WARMUP, MEASURE) is None
    assert "step" in window_periods(cut, WARMUP, MEASURE)


def test_lines_held_back_and_released_together_fail_the_clock():
    """The job computes ahead and lets its lines go in a burst: the window looks short."""
    run = make_run(step_ms=200.0)
    arrivals = list(run.arrivals_ns)
    release = arrivals[WARMUP + 3]
    for k in range(WARMUP, WARMUP + 3):  # lines of steps WARMUP..WARMUP+2 held until step WARMUP+3's
        arrivals[k] = release - (WARMUP + 3 - k) * 1000
    held = _with_arrivals(run, arrivals)
    assert runner_step_time(held, WARMUP, MEASURE) < runner_step_time(run, WARMUP, MEASURE) * 0.7
    result = check_clock(held, WARMUP, MEASURE)
    assert result.status == "fail" and "burst" in result.detail, result


def test_very_short_steps_may_share_a_read_and_are_not_called_bursts():
    run = make_run(step_ms=2.0, latency_ms=0.1)
    arrivals = list(run.arrivals_ns)
    arrivals[WARMUP + 2] = arrivals[WARMUP + 3]  # two lines in one read of the pipe
    assert check_clock(_with_arrivals(run, arrivals), WARMUP, MEASURE).status == "pass"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=30_000_000), min_size=MEASURE, max_size=MEASURE))
def test_no_release_schedule_beats_the_total(delays):
    """Whatever the job does with its lines after they are ready, the window can't shrink
    below the true work unless the start is held back, and holding it back is a burst."""
    run = make_run(step_ms=50.0)
    arrivals = list(run.arrivals_ns)
    # Delays applied to the measured lines only (the start, step WARMUP's line, is honest):
    for i, delay in enumerate(delays):
        arrivals[WARMUP + 1 + i] += delay
    for i in range(WARMUP + 2, len(arrivals)):  # lines go out in order
        arrivals[i] = max(arrivals[i], arrivals[i - 1])
    late = _with_arrivals(run, arrivals)
    assert runner_step_time(late, WARMUP, MEASURE) >= runner_step_time(run, WARMUP, MEASURE) - 1e-9


def test_stored_baseline_drift_makes_the_speedup_unchecked():
    """A stray process slowed the baseline arm to 2x: the 'speedup' is not trusted."""
    base, cand = [0.20, 0.21, 0.20, 0.20, 0.21], [0.10, 0.10, 0.11, 0.10, 0.10]
    assert baseline_drift(base, 0.10, 0.02) is not None
    result, estimate = check_speedup(base, cand, 1.02, 5, stored=(0.10, 0.02))
    assert result.status == "unchecked" and "drift" in result.detail and estimate.median > 1.9
    ok, _ = check_speedup(base, cand, 1.02, 5, stored=(0.19, 0.02))
    assert ok.status == "pass"
    assert baseline_drift([0.105] * 5, 0.10, 0.01) is None  # 5%: inside the floor
    assert baseline_drift([0.14] * 5, 0.10, 0.10) is None  # noisy baseline: 5 x CV allows it
    # The contract's [search] drift_tolerance is the floor: 25% passes at 0.3, not at the default.
    assert baseline_drift([0.125] * 5, 0.10, 0.01) is not None
    assert baseline_drift([0.125] * 5, 0.10, 0.01, floor=0.3) is None
    wide, _ = check_speedup([0.125] * 5, [0.06] * 5, 1.02, 5, stored=(0.10, 0.01), drift_floor=0.3)
    assert wide.status == "pass"


def test_timing_evidence_round_trips_through_stored_json():
    run = make_run()
    stored = {
        "arrivals_ns": run.arrivals_ns,
        "started_ns": run.started_ns,
        "ended_ns": run.ended_ns,
        "sampled_steps": [WARMUP + 1],
        "evidence_kind": "probe",
    }
    again = RunEvidence.from_stored(run.receipt_lines, json.loads(json.dumps(stored)))
    assert again.sampled_steps == (WARMUP + 1,)
    assert len(window_periods(again, WARMUP, MEASURE)[0]) == MEASURE - 1
