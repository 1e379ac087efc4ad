"""integrity, timing and numerics verifiers on synthetic evidence."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st
from verifier_testing import (
    MEASURE,
    REFERENCE,
    RULES,
    SAMPLED,
    SAMPLED_REFERENCE,
    TOKENS,
    TOTAL,
    WARMUP,
    make_run,
    make_sampled_run,
    param_grads,
    param_rows,
)

from infrarsi.verifiers import (
    BaselineReference,
    CheckResult,
    RunEvidence,
    check_clock,
    check_precision,
    check_trajectory,
    check_window,
    judge_run,
)
from infrarsi.verifiers._numerics import GRAD_FLOOR, check_grad_norm, compare_param_grads


def _by_id(results):
    return {r.id: r for r in results}


def test_honest_run_passes_everything():
    results = judge_run(make_run(), REFERENCE, RULES)
    assert {r.id for r in results} == {
        "integrity.protected",
        "integrity.framework",
        "integrity.containment",
        "timing.window",
        "timing.clock",
        "numerics.loss",
        "numerics.grad_norm",
        "numerics.precision",
    }
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


@pytest.mark.parametrize(
    "observed",
    [
        {"param_dtypes": ["bfloat16"]},
        {"param_dtypes": ["float32", "float16"]},
        {"autocast": ["cpu:bfloat16"]},
        {"fp32_matmul": "high"},
    ],
)
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


@pytest.mark.parametrize(
    "steps, expect",
    [
        (list(range(1, TOTAL)), "missing"),
        (list(range(1, TOTAL + 2)), "outside"),
        ([1, 2, 3, 3, 4, 5, 6, 7, 8], "repeated"),
        ([2, 1, 3, 4, 5, 6, 7, 8], "out of order"),
    ],
)
def test_window_step_numbers(steps, expect):
    result = check_window(make_run(steps=steps), WARMUP, MEASURE, REFERENCE.tokens_per_step)
    assert result.status == "fail" and expect in result.detail


def test_window_smaller_batch_fails():
    run = make_run(mutate=lambda r: {**r, "tokens": 1024})
    result = check_window(run, WARMUP, MEASURE, REFERENCE.tokens_per_step)
    assert result.status == "fail" and "tokens" in result.detail


def test_window_uncounted_tokens_pass_only_in_a_warm_up_step():
    """An autoprobe can't count the first forward's keyword inputs (a Trainer's model(**inputs)):
    step 1's tokens are None. That is allowed in warm-up, as an untimed warm-up step is; a
    measured step without its tokens, or a warm-up step with fewer, still fails."""
    first = make_run(mutate=lambda r: {**r, "tokens": None} if r["step"] == 1 else r)
    assert check_window(first, WARMUP, MEASURE, REFERENCE.tokens_per_step).status == "pass"
    measured = make_run(mutate=lambda r: {**r, "tokens": None} if r["step"] == WARMUP + 1 else r)
    assert check_window(measured, WARMUP, MEASURE, REFERENCE.tokens_per_step).status == "fail"
    fewer = make_run(mutate=lambda r: {**r, "tokens": 1} if r["step"] == 1 else r)
    assert check_window(fewer, WARMUP, MEASURE, REFERENCE.tokens_per_step).status == "fail"


def test_window_untimed_measured_step_fails():
    run = make_run(mutate=lambda r: {**r, "t0_ns": None, "t1_ns": None} if r["step"] == WARMUP + 1 else r)
    assert check_window(run, WARMUP, MEASURE, REFERENCE.tokens_per_step).status == "fail"


def test_window_no_receipts_is_unchecked():
    assert check_window(RunEvidence([]), WARMUP, MEASURE, 2048).status == "unchecked"


def test_clock_slowed_by_the_job_fails():
    # The job's clock runs at half speed: every interval it reports is halved.
    origin = 1_000_000_000
    run = make_run(
        step_ms=80,
        mutate=lambda r: {
            **r,
            "t0_ns": origin + (r["t0_ns"] - origin) // 2,
            "t1_ns": origin + (r["t1_ns"] - origin) // 2,
        },
    )
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


@pytest.mark.parametrize(
    "integrity, failing",
    [
        (
            {"protected_changed_before_run": ["data/x"], "protected_changed_by_run": [], "framework_changed": []},
            "integrity.protected",
        ),
        (
            {"protected_changed_before_run": [], "protected_changed_by_run": ["data/x"], "framework_changed": []},
            "integrity.protected",
        ),
        (
            {"protected_changed_before_run": [], "protected_changed_by_run": [], "framework_changed": ["probe.py"]},
            "integrity.framework",
        ),
        (
            {
                "protected_changed_before_run": [],
                "protected_changed_by_run": [],
                "workspace_changed_by_run": ["model.py"],
                "framework_changed": [],
            },
            "integrity.protected",
        ),
    ],
)
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


# -- operator dtypes and per-parameter gradients at the runner's sampled steps --------------------


def _at(step, **fields):
    """A mutation of one sampled step's record."""

    def mutate(rec):
        if rec["step"] != step:
            return rec
        out = dict(rec)
        for key, value in fields.items():
            if value is _DROP:
                out.pop(key, None)
            else:
                out[key] = value(rec[key]) if callable(value) else value
        return out

    return mutate


_DROP = object()


def test_honest_sampled_run_passes_everything():
    results = _by_id(judge_run(make_sampled_run(), SAMPLED_REFERENCE, RULES))
    assert all(r.status == "pass" for r in results.values()), [r for r in results.values() if not r.passed]
    assert "sampled steps 3, 6" in results["numerics.grad_norm"].detail
    assert "operators at sampled steps 3, 6" in results["numerics.precision"].detail


@pytest.mark.parametrize(
    "ops, named",
    [
        (["mm:float32", "addmm:bfloat16"], "addmm in bfloat16"),
        (["mm:float32", "_to_copy:bfloat16"], "_to_copy in bfloat16"),
        (["bmm:float16"], "bmm in float16"),
        (["_scaled_mm:float8_e4m3fn"], "_scaled_mm in float8_e4m3fn"),
        (["mm:float64"], "mm in float64"),  # fp32 allows float32 only
    ],
)
def test_an_operator_outside_the_contracts_precision_fails(ops, named):
    run = make_sampled_run(mutate=_at(6, ops=ops))
    result = check_precision(run.steps, ["fp32"], True, run.sampled_steps, SAMPLED_REFERENCE)
    assert result.status == "fail" and f"step 6: {named}" in result.detail, result


def test_operators_the_contract_allows_pass():
    run = make_sampled_run(mutate=_at(3, ops=["mm:bfloat16", "_to_copy:bfloat16", "mm:float32"]))
    assert check_precision(run.steps, ["fp32", "bf16"], True, run.sampled_steps, SAMPLED_REFERENCE).passed


def test_a_sampled_step_without_operator_dtypes_is_unchecked():
    run = make_sampled_run(mutate=_at(6, ops=_DROP))
    result = check_precision(run.steps, ["fp32"], True, run.sampled_steps, SAMPLED_REFERENCE)
    assert result.status == "unchecked"
    assert result.detail == "the job's receipts carry no operator dtypes for sampled step 6"


def test_a_sampled_step_where_no_operator_was_seen_is_unchecked():
    # The matmuls ran somewhere the dispatch mode can't see (another thread, a CUDA graph).
    run = make_sampled_run(mutate=_at(3, ops=[]))
    result = check_precision(run.steps, ["fp32"], True, run.sampled_steps, SAMPLED_REFERENCE)
    assert result.status == "unchecked" and "no operator was observed at sampled step 3" in result.detail


def test_old_evidence_without_sampled_steps_is_judged_as_before():
    run = make_run()  # sampled_steps None: recorded before sampling existed
    assert run.sampled_steps is None
    assert check_precision(run.steps, ["fp32"], True, run.sampled_steps, SAMPLED_REFERENCE).passed
    assert check_grad_norm(run.steps, SAMPLED_REFERENCE, 1e-2, TOTAL, True, None).passed


@pytest.mark.parametrize(
    "settings, fails",
    [
        ({"backends": "tf32"}, "fp32_precision backends = 'tf32'"),
        ({"mkldnn.matmul": "bf16"}, "fp32_precision mkldnn.matmul = 'bf16'"),
        ({"cuda.matmul": "tf32"}, "fp32_precision cuda.matmul = 'tf32'"),
        ({"legacy_matmul": "medium"}, "fp32_precision legacy_matmul = 'medium'"),
        ({"backends": "ieee", "cuda.matmul": "ieee", "mkldnn.matmul": "none", "legacy_matmul": "highest"}, None),
        ({"cudnn.conv": "tf32", "cudnn.rnn": "tf32"}, None),  # CUDA's defaults, but no convolution or RNN ran
    ],
)
def test_fp32_precision_settings(settings, fails):
    run = make_sampled_run(mutate=_at(3, fp32_precision=settings))
    result = check_precision(run.steps, ["fp32"], True, run.sampled_steps, SAMPLED_REFERENCE)
    if fails:
        assert result.status == "fail" and fails in result.detail, result
    else:
        assert result.passed, result


def test_a_convolution_setting_counts_where_a_convolution_ran():
    run = make_sampled_run(
        mutate=_at(
            3, fp32_precision={"cudnn.conv": "tf32"}, ops=["convolution:float32", "convolution_backward:float32"]
        )
    )
    result = check_precision(run.steps, ["fp32"], True, run.sampled_steps, SAMPLED_REFERENCE)
    assert result.status == "fail" and "cudnn.conv" in result.detail
    assert check_precision(run.steps, ["fp32", "tf32"], True, run.sampled_steps, SAMPLED_REFERENCE).passed


def _grad_check(run):
    return check_grad_norm(run.steps, SAMPLED_REFERENCE, 1e-2, TOTAL, True, run.sampled_steps)


@pytest.mark.parametrize("value", [None, 0.0])
def test_a_parameter_that_lost_its_gradient_fails_with_its_name(value):
    grads = {**param_grads(6), "blocks.0.attn.heads.1.k.weight": value}
    result = _grad_check(make_sampled_run(mutate=_at(6, grads=grads)))
    assert result.status == "fail"
    assert result.detail.startswith("step 6: blocks.0.attn.heads.1.k.weight received a gradient in the baseline")


def test_a_gradient_where_the_baseline_had_none_fails():
    result = _grad_check(make_sampled_run(mutate=_at(3, grads={**param_grads(3), "frozen.weight": 0.01})))
    assert result.status == "fail" and "frozen.weight received a gradient" in result.detail


@pytest.mark.parametrize("factor, status", [(1.02, "fail"), (0.98, "fail"), (1.005, "pass"), (1 - 5e-6, "pass")])
def test_a_parameters_norm_beyond_the_tolerance_fails_with_its_name(factor, status):
    # A key gradient, 3e-5 of the model's: honest noise moves it by a few 1e-6 of itself.
    grads = param_grads(3)
    grads["blocks.0.attn.heads.1.k.weight"] *= factor
    result = _grad_check(make_sampled_run(mutate=_at(3, grads=grads)))
    assert result.status == status, result
    if status == "fail":
        assert "blocks.0.attn.heads.1.k.weight's gradient norm" in result.detail


def test_a_mathematically_zero_gradient_is_free_to_be_rounding_noise():
    total = math.sqrt(sum(v * v for v in param_grads(3).values() if v))
    reference = BaselineReference(
        loss=REFERENCE.loss,
        grad_norm=REFERENCE.grad_norm,
        tokens_per_step=TOKENS,
        param_grad_norms={3: {**param_grads(3), "frozen.weight": 1e-12}, 6: param_grads(6)},
    )
    noisy = {**param_grads(3), "frozen.weight": 0.5 * GRAD_FLOOR * 1e-2 * total}
    run = make_sampled_run(mutate=_at(3, grads=noisy, grad_min_rows=_DROP))
    assert check_grad_norm(run.steps, reference, 1e-2, TOTAL, True, run.sampled_steps).passed


def _fused(grads: dict, rows: dict, zero_qk: bool = False) -> tuple[dict, dict]:
    """The batched-heads layout: every head's q, k and v rows in one ``attn.qkv`` parameter."""
    parts = [n for n in grads if ".attn.heads." in n]
    kept = [n for n in parts if not (zero_qk and n.endswith((".q.weight", ".k.weight")))]
    fused = {n: v for n, v in grads.items() if n not in parts}
    fused["blocks.0.attn.qkv.weight"] = math.sqrt(sum(grads[n] ** 2 for n in kept))
    fused_rows = {n: v for n, v in rows.items() if n not in parts}
    fused_rows["blocks.0.attn.qkv.weight"] = 0.0 if zero_qk else min(rows[n] for n in parts)
    return fused, fused_rows


def test_fused_parameters_are_compared_by_module():
    grads, rows = _fused(param_grads(3), param_rows(3))
    result = _grad_check(make_sampled_run(mutate=_at(3, grads=grads, grad_min_rows=rows)))
    assert result.passed, result


def test_fused_parameters_whose_query_and_key_rows_lost_their_gradient_fail():
    # The whole norm is the values' (the queries' and keys' are a thousand times smaller):
    # only the smallest row shows that some rows got nothing.
    grads, rows = _fused(param_grads(3), param_rows(3), zero_qk=True)
    problem, _, _ = compare_param_grads(grads, param_grads(3), 1e-2)
    assert problem is None  # by norms alone this would pass
    result = _grad_check(make_sampled_run(mutate=_at(3, grads=grads, grad_min_rows=rows)))
    assert result.status == "fail" and "blocks.0.attn (by module" in result.detail and "smallest-row" in result.detail


def test_a_parameter_with_no_counterpart_fails():
    grads = {n: v for n, v in param_grads(6).items() if not n.startswith("blocks.0.attn.heads.1.")}
    result = _grad_check(make_sampled_run(mutate=_at(6, grads=grads)))
    assert result.status == "fail" and "blocks.0.attn.heads.1." in result.detail


def test_missing_per_parameter_evidence_is_unchecked():
    result = _grad_check(make_sampled_run(mutate=_at(6, grads=_DROP)))
    assert result.status == "unchecked"
    assert result.detail == "the job's receipts carry no per-parameter gradient norms for sampled step 6"
    no_reference = check_grad_norm(make_sampled_run().steps, REFERENCE, 1e-2, TOTAL, True, SAMPLED)
    assert no_reference.status == "unchecked" and "re-run `infrarsi baseline`" in no_reference.detail


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(sorted(n for n, v in param_grads(3).items() if v)), unique=True), st.floats(-3e-6, 3e-6)
)
def test_honest_noise_and_any_fusion_of_parameters_pass(fused_names, noise):
    """Norms moved by honest rounding, and any parameters merged into one (their norms by
    root-sum-square, their rows kept), pass."""
    grads = {n: (v * (1 + noise) if v else v) for n, v in param_grads(3).items()}
    rows = {n: v * (1 + noise) for n, v in param_rows(3).items()}
    if len(fused_names) > 1:
        merged = "blocks.0.merged.weight"
        grads[merged] = math.sqrt(sum(grads.pop(n) ** 2 for n in fused_names))
        kept = [rows.pop(n) for n in fused_names if n in rows]
        if kept:
            rows[merged] = min(kept)
    problem, _, _ = compare_param_grads(grads, param_grads(3), 1e-2, rows, param_rows(3))
    assert problem is None


def test_baseline_reference_from_old_and_new_summaries():
    old = BaselineReference.from_summary({"reference": {"loss": [1.0], "grad_norm": [2.0]}, "tokens_per_step": 8})
    assert old.param_grad_norms == {} and old.ops == {} and old.param_grad_min_rows == {}
    new = BaselineReference.from_summary(
        {
            "reference": {
                "loss": [1.0],
                "grad_norm": [2.0],
                "param_grad_norms": {"1": {"w": 0.5, "b": None}, "x": {}},
                "param_grad_min_rows": {"1": {"w": 0.1}},
                "ops": {"1": ["mm:float32"], "2": "junk"},
            }
        }
    )
    assert new.param_grad_norms == {1: {"w": 0.5, "b": None}}
    assert new.param_grad_min_rows == {1: {"w": 0.1}} and new.ops == {1: ["mm:float32"]}


@pytest.mark.parametrize("factor, status", [(1.1, "pass"), (0.9, "pass"), (1e-3, "fail"), (0.0, "fail")])
def test_a_smallest_row_may_be_noisy_but_not_lose_its_gradient(factor, status):
    rows = param_rows(6)
    rows["blocks.0.attn.heads.0.q.weight"] *= factor
    result = _grad_check(make_sampled_run(mutate=_at(6, grad_min_rows=rows)))
    assert result.status == status, result
    if status == "fail":
        assert "blocks.0.attn.heads.0.q.weight" in result.detail and "smallest-row" in result.detail
