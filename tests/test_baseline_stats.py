"""`baseline`'s statistics from known receipts: median step time, CV and MAD across runs,
tokens/s, MFU, peak memory and the reference trajectories."""

from __future__ import annotations

import json

import pytest

from infrarsi._baseline import summarise
from infrarsi.contract._candidate import Candidate
from infrarsi.runner._executor import ExecutionResult

WARMUP, MEASURE = 1, 3


def run(
    step_ms: list[float],
    losses: list[float],
    peak_mb: float,
    gpus: list[str] = (),
    dtypes: tuple[str, ...] = ("float32",),
    autocast: tuple[str, ...] = (),
    flops: float = 1000,
) -> ExecutionResult:
    """One baseline run's result whose receipts time each step as given (in ms), on ``gpus`` (as
    nvidia-smi names them), with ``dtypes`` parameters and ``autocast`` entries seen at each step."""
    lines = [json.dumps({"type": "meta", "declared": {"flops_per_token": flops}})]
    t = 10**9
    for step, (ms, loss) in enumerate(zip(step_ms, losses), start=1):
        t1 = t + int(ms * 1e6)
        lines.append(
            json.dumps(
                {
                    "type": "step",
                    "step": step,
                    "t0_ns": t,
                    "t1_ns": t1,
                    "tokens": 64,
                    "loss": loss,
                    "grad_norm": 1.0 + step,
                    "peak_mem_bytes": 1,
                    "param_dtypes": list(dtypes),
                    "autocast": list(autocast),
                }
            )
        )
        t = t1 + 1000
    lines.append(json.dumps({"type": "end", "t_ns": t}))
    measured = sorted(step_ms[WARMUP : WARMUP + MEASURE])[MEASURE // 2] / 1000
    periods = [ms / 1000 for ms in step_ms[WARMUP : WARMUP + MEASURE]]  # the runner's periods, as it records them
    return ExecutionResult(
        Candidate(knobs={"mode": "ok"}),
        "ok",
        step_time_s=measured,
        peak_mem_mb=peak_mb,
        receipts=("\n".join(lines) + "\n").encode(),
        evidence={"timing": {"clock": "runner", "periods_s": periods}, "fingerprint": {"gpus": list(gpus)}},
    )


def test_baseline_statistics_from_known_step_times():
    results = [
        run([500, 99, 100, 101], [4.0, 3.0, 2.0, 1.0], 300.0),
        run([500, 120, 120, 121], [4.0, 3.2, 2.0, 1.0], 310.0),
        run([500, 110, 109, 111], [4.0, 3.1, 2.0, 1.5], 305.0),
    ]
    summary = summarise(results, [1, 2, 3], WARMUP, MEASURE, peak_tflops=0.1)
    # Run medians 0.100, 0.120, 0.110 s: the warm-up step (500 ms) is outside the window.
    assert summary.run_step_times_s == pytest.approx([0.100, 0.120, 0.110])
    assert summary.step_time_s["median"] == pytest.approx(0.110)
    assert summary.step_time_s["cv"] == pytest.approx(0.010 / 0.110)
    assert summary.step_time_s["mad"] == pytest.approx(0.010)
    assert summary.tokens_per_step == 64
    assert summary.tokens_per_s == pytest.approx(64 / 0.110)
    assert summary.mfu == pytest.approx(1000 * (64 / 0.110) / 0.1e12)
    assert summary.peak_mem_mb == 310.0
    # The reference is the per-step median over runs; the spread is the widest relative range.
    assert summary.reference["loss"] == pytest.approx([4.0, 3.1, 2.0, 1.0])
    assert summary.reference["grad_norm"] == pytest.approx([2.0, 3.0, 4.0, 5.0])
    assert summary.reference_spread["loss"] == pytest.approx(0.5 / 1.0)


@pytest.mark.parametrize(
    ("gpus", "dtypes", "autocast", "expected"),
    [
        (["NVIDIA H100 80GB HBM3"], ("float32",), ("cpu:bfloat16",), ("bf16", 989.4)),  # autocast's dtype
        (["NVIDIA H100 PCIe"], ("bfloat16",), (), ("bf16", 756.0)),
        (["NVIDIA A100-SXM4-80GB"] * 2, ("float32",), (), ("fp32", 19.5)),
        (["NVIDIA L4"], ("float16",), (), ("fp16", 121.0)),
        (["NVIDIA L40"], ("float32",), (), None),  # not an L4: no row, no MFU
        (["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"], ("float32",), (), None),  # mixed GPUs
        (["Tesla V100-SXM2-16GB"], ("bfloat16",), (), None),  # a precision the card has no figure for
        ([], ("float32",), (), None),  # the CPU
    ],
)
def test_without_peak_tflops_the_peak_comes_from_the_gpu_table_or_there_is_no_mfu(gpus, dtypes, autocast, expected):
    summary = summarise(
        [run([500, 100, 100, 100], [4.0, 3.0, 2.0, 1.0], 300.0, gpus, dtypes, autocast, flops=1e9)],
        [1],
        WARMUP,
        MEASURE,
        None,
    )
    if expected is None:
        assert summary.mfu is None and summary.mfu_peak is None and summary.mfu_warning is None
        return
    precision, tflops = expected
    assert summary.mfu_peak == {"tflops": tflops, "source": "table", "device": gpus[0], "precision": precision}
    assert summary.mfu == pytest.approx(1e9 * 640 / (tflops * 1e12))
    assert summary.mfu_warning is None


def test_the_contract_peak_wins_and_an_implausible_mfu_comes_with_a_warning():
    h100 = run([500, 100, 100, 100], [4.0, 3.0, 2.0, 1.0], 300.0, ["NVIDIA H100 80GB HBM3"], flops=1e9)
    summary = summarise([h100], [1], WARMUP, MEASURE, 0.5)
    assert summary.mfu_peak == {"tflops": 0.5, "source": "contract", "device": None, "precision": None}
    assert summary.mfu == pytest.approx(1e9 * 640 / 0.5e12) and summary.mfu > 1
    assert "implausibly high" in summary.mfu_warning and "[resources] peak_tflops" in summary.mfu_warning
    assert summarise([h100], [1], WARMUP, MEASURE, 1000.0).mfu_warning is None


def test_one_run_takes_its_own_step_to_step_noise():
    summary = summarise([run([500, 90, 100, 110], [4.0, 3.0, 2.0, 1.0], 300.0)], [1], WARMUP, MEASURE, 0.1)
    assert summary.step_time_s["median"] == pytest.approx(0.100)
    assert summary.step_time_s["mad"] == 0
    assert summary.step_time_s["cv"] == pytest.approx(0.010 / 0.100)  # stdev of 90/100/110 ms over their mean


def test_the_reference_run_gives_each_steps_parameter_gradients_and_operators():
    from infrarsi._baseline import _sampled_spread, observed_reference
    from infrarsi.verifiers import BaselineReference

    lines = [
        json.dumps({"type": "meta"}),
        json.dumps(
            {
                "type": "step",
                "step": 1,
                "loss": 2.0,
                "ops": ["mm:float32"],
                "grads": {"w": 0.5, "b": None},
                "grad_min_rows": {"w": 0.1},
            }
        ),
        json.dumps({"type": "step", "step": 2, "loss": 1.9}),  # a step without observations
        json.dumps({"type": "step", "step": 3, "ops": ["addmm:float32"], "grads": {"w": 0.25}}),
    ]
    found = observed_reference(("\n".join(lines) + "\n").encode())
    assert found == {
        "param_grad_norms": {"1": {"w": 0.5, "b": None}, "3": {"w": 0.25}},
        "param_grad_min_rows": {"1": {"w": 0.1}},
        "ops": {"1": ["mm:float32"], "3": ["addmm:float32"]},
    }
    # As the ledger stores it (JSON keys), as the verifiers read it (step numbers).
    reference = BaselineReference.from_summary({"reference": json.loads(json.dumps(found))})
    assert reference.param_grad_norms == {1: {"w": 0.5, "b": None}, 3: {"w": 0.25}}
    # The timed runs' own sampled steps against the reference: how reproducible the job is.
    timed = run([500, 100, 100, 100], [4.0, 3.0, 2.0, 1.0], 300.0)
    sampled_line = json.dumps({"type": "step", "step": 3, "grads": {"w": 0.2525}})
    timed = ExecutionResult(timed.candidate, "ok", receipts=timed.receipts + (sampled_line + "\n").encode())
    assert _sampled_spread([timed], found["param_grad_norms"]) == pytest.approx(0.01)


def test_a_summary_without_a_reference_run_still_loads():
    from infrarsi.verifiers import BaselineReference

    summary = summarise([run([500, 99, 100, 101], [4.0, 3.0, 2.0, 1.0], 300.0)], [1], WARMUP, MEASURE, 0.1)
    assert summary.reference_execution is None
    stored = json.loads(json.dumps(summary.as_record()))
    reference = BaselineReference.from_summary(stored)
    assert reference.loss == pytest.approx([4.0, 3.0, 2.0, 1.0]) and reference.param_grad_norms == {}


def test_a_cpu_job_on_a_gpu_machine_gets_no_gpu_peak():
    h100 = run([500, 100, 100, 100], [4.0, 3.0, 2.0, 1.0], 300.0, ["NVIDIA H100 80GB HBM3"], flops=1e9)
    assert summarise([h100], [1], WARMUP, MEASURE, None, device="cpu").mfu is None
    assert summarise([h100], [1], WARMUP, MEASURE, None, device="cuda").mfu_peak["device"] == "NVIDIA H100 80GB HBM3"


def two_ranks(result: ExecutionResult, loss_shift: float = 0.5) -> ExecutionResult:
    """``result`` as two ranks: rank 1's lines the same steps with its own loss, tagged by the runner."""
    lines = result.receipts.decode().splitlines()
    tagged = [(line, 0) for line in lines]
    for line in lines:
        record = json.loads(line)
        if record.get("type") == "step":
            record["loss"] += loss_shift
        tagged.append((json.dumps(record), 1))
    evidence = {
        **result.evidence,
        "ranks": 2,
        "line_ranks": [rank for _, rank in tagged],
        "arrivals_ns": [10**9 + i for i in range(len(tagged))],
    }
    return ExecutionResult(
        result.candidate,
        "ok",
        step_time_s=result.step_time_s,
        peak_mem_mb=result.peak_mem_mb,
        receipts=("\n".join(line for line, _ in tagged) + "\n").encode(),
        evidence=evidence,
    )


def test_two_ranks_keep_a_reference_each_count_both_ranks_tokens_and_two_devices_for_mfu():
    one = run([100, 100, 100, 100], [4.0, 3.0, 2.0, 1.0], 10, gpus=["NVIDIA H100 80GB HBM3"], flops=1e9)
    single = summarise([one], [1], WARMUP, MEASURE, None, device="cuda")
    both = summarise([two_ranks(one)], [1], WARMUP, MEASURE, None, device="cuda")
    assert both.tokens_per_step == 2 * single.tokens_per_step == 128
    # Twice the tokens on twice the devices: the same utilisation.
    assert both.mfu == pytest.approx(single.mfu)
    assert [r["loss"] for r in both.reference_ranks] == [[4.0, 3.0, 2.0, 1.0], [4.5, 3.5, 2.5, 1.5]]
    assert [r["tokens_per_step"] for r in both.reference_ranks] == [64, 64]
    assert both.reference["loss"] == [4.0, 3.0, 2.0, 1.0]  # rank 0's
