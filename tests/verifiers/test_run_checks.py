"""integrity, timing and numerics verifiers on synthetic evidence."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infrarsi.verifiers import (BaselineReference, CheckResult, RunEvidence, check_clock, check_precision,
                                check_trajectory, check_window, judge_run)
from verifier_testing import MEASURE, REFERENCE, RULES, TOTAL, WARMUP, make_run


def _by_id(results):
    return {r.id: r for r in results}


def test_honest_run_passes_everything():
    results = judge_run(make_run(), REFERENCE, RULES)
    assert {r.id for r in results} == {"integrity.protected", "integrity.framework", "timing.window",
                                       "timing.clock", "numerics.loss", "numerics.grad_norm",
                                       "numerics.precision"}
    assert all(r.status == "pass" for r in results), [r for r in results if not r.passed]


def test_check_result_rejects_unknown_status_and_family():
    with pytest.raises(ValueError):
        CheckResult("numerics.loss", "ok", "")
    with pytest.raises(ValueError):
        CheckResult("speed.x", "pass", "")


@pytest.mark.parametrize("factor", [1 - 2e-3, 1 + 2e-3])
def test_loss_off_either_way_fails(factor):
    run = make_run(mutate=lambda r: {**r, "loss": r["loss"] * (factor if r["step"] == 5 else 1)})
    result = _by_id(judge_run(run, REFERENCE, RULES))["numerics.loss"]
    assert result.status == "fail" and "step 5" in result.detail


def test_loss_within_tolerance_passes():
    run = make_run(mutate=lambda r: {**r, "loss": r["loss"] * (1 + 5e-4)})
    assert _by_id(judge_run(run, REFERENCE, RULES))["numerics.loss"].status == "pass"


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_loss_fails(bad):
    run = make_run(mutate=lambda r: {**r, "loss": bad if r["step"] == 3 else r["loss"]})
    result = check_trajectory("loss", run.steps, REFERENCE, 1e-3, TOTAL, True)
    assert result.status == "fail"


def test_grad_norm_never_logged_is_unchecked_when_required_and_skipped_otherwise():
    run = make_run(mutate=lambda r: {**r, "grad_norm": None})
    assert check_trajectory("grad_norm", run.steps, REFERENCE, 1e-2, TOTAL, True).status == "unchecked"
    assert check_trajectory("grad_norm", run.steps, REFERENCE, 1e-2, TOTAL, False).status == "skipped"


def test_grad_norm_missing_at_one_step_fails():
    run = make_run(mutate=lambda r: {**r, "grad_norm": None if r["step"] == 4 else r["grad_norm"]})
    assert check_trajectory("grad_norm", run.steps, REFERENCE, 1e-2, TOTAL, True).status == "fail"


def test_no_baseline_trajectory_is_unchecked():
    empty = BaselineReference(loss=[], grad_norm=[], tokens_per_step=2048)
    assert check_trajectory("loss", make_run().steps, empty, 1e-3, TOTAL, True).status == "unchecked"


@pytest.mark.parametrize("observed", [
    {"param_dtypes": ["bfloat16"]},
    {"param_dtypes": ["float32", "float16"]},
    {"autocast": ["cpu:bfloat16"]},
    {"fp32_matmul": "high"},
])
def test_precision_observed_downgrade_fails(observed):
    run = make_run(mutate=lambda r: {**r, **observed} if r["step"] == TOTAL else r)
    result = check_precision(run.steps, ["fp32"], True)
    assert result.status == "fail"


def test_precision_allowed_when_contract_allows_it():
    run = make_run(mutate=lambda r: {**r, "autocast": ["cpu:bfloat16"]})
    assert check_precision(run.steps, ["fp32", "bf16"], True).status == "pass"


def test_precision_without_observation_is_unchecked_even_if_declared():
    run = make_run(mutate=lambda r: {k: v for k, v in r.items() if k != "param_dtypes"})
    assert check_precision(run.steps, ["fp32"], True).status == "unchecked"


@pytest.mark.parametrize("steps, expect", [
    (list(range(1, TOTAL)), "missing"),
    (list(range(1, TOTAL + 2)), "outside"),
    ([1, 2, 3, 3, 4, 5, 6, 7, 8], "repeated"),
    ([2, 1, 3, 4, 5, 6, 7, 8], "out of order"),
])
def test_window_step_numbers(steps, expect):
    result = check_window(make_run(steps=steps), WARMUP, MEASURE, REFERENCE.tokens_per_step)
    assert result.status == "fail" and expect in result.detail


def test_window_smaller_batch_fails():
    run = make_run(mutate=lambda r: {**r, "tokens": 1024})
    result = check_window(run, WARMUP, MEASURE, REFERENCE.tokens_per_step)
    assert result.status == "fail" and "tokens" in result.detail


def test_window_untimed_measured_step_fails():
    run = make_run(mutate=lambda r: {**r, "t0_ns": None, "t1_ns": None} if r["step"] == WARMUP + 1 else r)
    assert check_window(run, WARMUP, MEASURE, REFERENCE.tokens_per_step).status == "fail"


def test_window_no_receipts_is_unchecked():
    assert check_window(RunEvidence([]), WARMUP, MEASURE, 2048).status == "unchecked"


def test_clock_slowed_by_the_job_fails():
    # The job's clock runs at half speed: every interval it reports is halved.
    origin = 1_000_000_000
    run = make_run(step_ms=80, mutate=lambda r: {**r, "t0_ns": origin + (r["t0_ns"] - origin) // 2,
                                                    "t1_ns": origin + (r["t1_ns"] - origin) // 2})
    result = check_clock(run, WARMUP, MEASURE)
    assert result.status == "fail", result


def test_clock_lines_written_after_the_fact_fail():
    # Receipts claiming 50 ms steps, but all lines arrive within a millisecond at the end.
    run = make_run()
    burst = [run.arrivals_ns[-1] + i * 1000 for i in range(len(run.arrivals_ns))]
    forged = RunEvidence(run.receipt_lines, burst, run.started_ns, run.ended_ns, run.integrity)
    assert check_clock(forged, WARMUP, MEASURE).status == "fail"


def test_clock_claiming_to_end_after_arrival_fails():
    run = make_run(latency_ms=-1.0)
    assert check_clock(run, WARMUP, MEASURE).status == "fail"


def test_clock_without_arrivals_is_unchecked():
    run = make_run()
    stripped = RunEvidence(run.receipt_lines, None, run.started_ns, run.ended_ns, run.integrity)
    assert check_clock(stripped, WARMUP, MEASURE).status == "unchecked"


@settings(max_examples=60, deadline=None)
@given(step_ms=st.floats(1, 500), latency_ms=st.floats(0.01, 20))
def test_clock_honest_runs_pass_at_any_speed_and_latency(step_ms, latency_ms):
    assert check_clock(make_run(step_ms=step_ms, latency_ms=latency_ms), WARMUP, MEASURE).status == "pass"


@pytest.mark.parametrize("integrity, failing", [
    ({"protected_changed_before_run": ["data/x"], "protected_changed_by_run": [], "framework_changed": []},
     "integrity.protected"),
    ({"protected_changed_before_run": [], "protected_changed_by_run": ["data/x"], "framework_changed": []},
     "integrity.protected"),
    ({"protected_changed_before_run": [], "protected_changed_by_run": [], "framework_changed": ["probe.py"]},
     "integrity.framework"),
])
def test_run_integrity_failures(integrity, failing):
    results = _by_id(judge_run(make_run(integrity=integrity), REFERENCE, RULES))
    assert results[failing].status == "fail"


def test_run_integrity_missing_is_unchecked():
    results = _by_id(judge_run(make_run(integrity={}), REFERENCE, RULES))
    assert results["integrity.protected"].status == "unchecked"
    assert results["integrity.framework"].status == "unchecked"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=80), max_size=20))
def test_garbage_receipt_lines_never_raise_and_never_pass(lines):
    results = judge_run(RunEvidence(lines, None), REFERENCE, RULES)
    assert not any(r.id.startswith(("timing", "numerics")) and r.passed for r in results)


def test_precision_default_matmul_mode_is_not_charged_to_a_bf16_job():
    run = make_run(mutate=lambda r: {**r, "param_dtypes": ["bfloat16"]})
    assert check_precision(run.steps, ["bf16"], True).status == "pass"
