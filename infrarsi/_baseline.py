"""`infrarsi baseline`: the original setup, measured N times."""

from __future__ import annotations

import statistics
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from infrarsi._candidate import Candidate
from infrarsi._receipts import parse_receipts
from infrarsi._runner import ExecutionResult
from infrarsi._workspace import open_workspace

__all__ = ["BaselineSummary", "BaselineFailed", "baseline", "summarise"]


class BaselineFailed(Exception):
    """A baseline run did not finish with a complete measured window: nothing to compare against."""


@dataclass(frozen=True)
class BaselineSummary:
    runs: int
    executions: list[int]
    step_time_s: dict          # median, cv, mad over the runs' median step times
    within_run_cv: float | None  # noise inside one run's measured window (median over runs)
    tokens_per_step: int | None
    tokens_per_s: float | None
    peak_mem_mb: float | None
    mfu: float | None
    run_step_times_s: list[float]
    reference: dict            # per-step loss / grad_norm trajectories (median over runs)
    reference_spread: dict     # the largest relative spread of each trajectory across runs
    knobs: dict

    def to_json(self) -> dict:
        """The DESIGN.md shape of `baseline --json`."""
        return {"runs": self.runs, "step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s,
                "peak_mem_mb": self.peak_mem_mb, "mfu": self.mfu}

    def as_record(self) -> dict:
        return asdict(self)


def _median_trajectory(trajectories: list[list[float | None]]) -> tuple[list[float | None], float | None]:
    merged: list[float | None] = []
    spread = 0.0
    seen_any = False
    for values in zip(*trajectories):
        present = [v for v in values if v is not None]
        if len(present) != len(values):
            merged.append(None)
            continue
        seen_any = True
        mid = statistics.median(present)
        merged.append(mid)
        if mid:
            spread = max(spread, (max(present) - min(present)) / abs(mid))
    return merged, (spread if seen_any else None)


def summarise(results: list[ExecutionResult], executions: list[int], warmup: int, measure: int,
              peak_tflops: float) -> BaselineSummary:
    """Statistics of successful baseline runs (pure: evidence in, summary out)."""
    receipt_sets = [parse_receipts(r.receipts.decode("utf-8", "replace").splitlines()) for r in results]
    medians = [r.step_time_s for r in results]
    center = statistics.median(medians)
    within = [statistics.stdev(t) / statistics.fmean(t)
              for t in (rs.step_times(warmup, measure) for rs in receipt_sets) if t and len(t) >= 2]
    within_cv = statistics.median(within) if within else None
    # With one run, its own step-to-step noise is the best estimate there is.
    cv = statistics.stdev(medians) / statistics.fmean(medians) if len(medians) >= 2 else within_cv
    mad = statistics.median(abs(m - center) for m in medians)
    tokens = [rec.get("tokens") for rs in receipt_sets for rec in rs.measured(warmup, measure)]
    tokens_per_step = int(statistics.median(tokens)) if tokens and all(isinstance(t, int) for t in tokens) else None
    tokens_per_s = tokens_per_step / center if tokens_per_step and center > 0 else None
    flops = receipt_sets[0].declared().get("flops_per_token")
    mfu = (float(flops) * tokens_per_s / (peak_tflops * 1e12)
           if isinstance(flops, (int, float)) and tokens_per_s else None)
    peaks = [r.peak_mem_mb for r in results if r.peak_mem_mb is not None]
    steps = warmup + measure
    reference, spread = {}, {}
    for key in ("loss", "grad_norm"):
        reference[key], spread[key] = _median_trajectory([rs.trajectory(key, steps) for rs in receipt_sets])
    return BaselineSummary(
        runs=len(results), executions=executions,
        step_time_s={"median": center, "cv": cv, "mad": mad}, within_run_cv=within_cv,
        tokens_per_step=tokens_per_step, tokens_per_s=tokens_per_s,
        peak_mem_mb=max(peaks) if peaks else None, mfu=mfu, run_step_times_s=medians,
        reference=reference, reference_spread=spread, knobs=dict(results[0].candidate.knobs))


def baseline(contract_path: str | Path = "infrarsi.toml", runs: int = 5,
             progress: Callable[[int, int, ExecutionResult], None] | None = None) -> BaselineSummary:
    """Run the original setup ``runs`` times, record every run, and store the summary."""
    if runs < 1:
        from infrarsi._candidate import UsageError

        raise UsageError(f"--runs {runs}: expected at least 1")
    with open_workspace(contract_path) as ws:
        candidate = Candidate(knobs=ws.contract.baseline_knobs())
        batch = uuid.uuid4().hex
        results, executions = [], []
        if progress:
            progress(0, runs, None)
        for seq in range(runs):
            execution, result = ws.execute(candidate, kind="baseline", batch=batch, seq=seq)
            executions.append(execution)
            results.append(result)
            if progress:
                progress(seq + 1, runs, result)
            if result.status != "ok" or result.step_time_s is None:
                raise BaselineFailed(
                    f"baseline run {seq + 1}/{runs} (execution {execution}) is {result.status}: "
                    f"{result.detail or 'no detail'}"
                    + (f"\n--- stderr tail ---\n{result.stderr_tail[-1500:]}" if result.stderr_tail else ""))
        timing = ws.contract.timing
        summary = summarise(results, executions, timing.warmup_steps, timing.measure_steps,
                            ws.contract.resources.peak_tflops)
        ws.ledger.append_baseline(batch, summary.as_record())
    return summary
