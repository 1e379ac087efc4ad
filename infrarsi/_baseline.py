"""`infrarsi baseline`: the original setup, measured N times, then observed at every step once."""

from __future__ import annotations

import statistics
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from infrarsi._calibrate import PERTURBATIONS, calibrate as measure_calibration, wants_calibration
from infrarsi._peaks import IMPLAUSIBLE_MFU, peak_for, training_precision
from infrarsi._selfcheck import self_check
from infrarsi._workspace import open_workspace
from infrarsi.contract import Candidate
from infrarsi.errors import BaselineFailed, BaselineRejected
from infrarsi.runner import ExecutionResult, parse_receipts
from infrarsi.verifiers import RunEvidence, compare_param_grads, observed_precisions, receipt_lines, steps_from_lines

__all__ = ["BaselineSummary", "baseline", "summarise"]


@dataclass(frozen=True)
class BaselineSummary:
    runs: int
    executions: list[int]
    step_time_s: dict  # median, cv, mad over the runs' median step times
    within_run_cv: float | None  # noise inside one run's measured window (median over runs)
    tokens_per_step: int | None
    tokens_per_s: float | None
    peak_mem_mb: float | None
    mfu: float | None
    run_step_times_s: list[float]
    reference: dict  # per-step loss / grad_norm trajectories (median over runs); from the
    # reference run: per-step param_grad_norms and ops, keyed by step ("3")
    reference_spread: dict  # the largest relative spread of each trajectory across runs
    knobs: dict
    reference_execution: int | None = None  # the run observed at every step (not timed)
    tokens_source: str | None = None  # "receipts" (counted in the job), "contract" (tokens_per_step), None
    self_check: dict | None = None  # SelfCheck.to_json(): the baseline judged against its contract
    mfu_peak: dict | None = None  # Peak.to_json(): what MFU was measured against; None: no MFU
    mfu_warning: str | None = None  # an MFU too high to believe, and what to check
    # A job of several ranks: each rank's reference (trajectories, observed steps, tokens per step),
    # in rank order; ``reference`` is then rank 0's and ``reference_spread`` the largest over ranks.
    reference_ranks: list[dict] | None = None
    # `baseline --calibrate` (or a contract that says "calibrated"): the tolerances measured from the
    # job's own noise, with the perturbations behind them (infrarsi/_calibrate.py)
    calibration: dict | None = None
    # [executor] keys the command line set for this baseline (--partition ...): where it was measured
    executor_flags: dict | None = None

    def to_json(self) -> dict:
        """The DESIGN.md shape of `baseline --json`."""
        return {
            "runs": self.runs,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "peak_mem_mb": self.peak_mem_mb,
            "mfu": self.mfu,
            "mfu_peak": self.mfu_peak,
            "mfu_warning": self.mfu_warning,
            **({"calibration": _shown_calibration(self.calibration)} if self.calibration else {}),
        }

    def as_record(self) -> dict:
        # step_clock: which clock the step times came from; a baseline stored before the runner's
        # clock took over ("probe" regions) is not compared with a later A/B's baseline arm.
        return {**asdict(self), "step_clock": "runner"}


def _shown_calibration(calibration: dict) -> dict:
    """What `baseline --json` shows of a calibration: the proposals and what they rest on."""
    keys = ("loss_rtol", "grad_norm_rtol", "margin", "observed", "factor", "floor", "perturbations")
    return {key: calibration.get(key) for key in keys if key in calibration}


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


def _run(result: ExecutionResult) -> RunEvidence:
    return RunEvidence.from_stored(receipt_lines(result.receipts), result.evidence or {})


def _rank_lines(result: ExecutionResult, rank: int) -> list[str]:
    """One rank's receipt lines (a one-process job's are all its lines)."""
    run = _run(result)
    return run.of_rank(rank).receipt_lines if run.line_ranks is not None else run.receipt_lines


def _counted(tokens: list) -> int | None:
    """The median token count, where every measured step counted its tokens."""
    if tokens and all(isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in tokens):
        return int(statistics.median(tokens))
    return None


def _trajectories(receipt_sets, steps: int) -> tuple[dict, dict]:
    reference, spread = {}, {}
    for key in ("loss", "grad_norm"):
        reference[key], spread[key] = _median_trajectory([rs.trajectory(key, steps) for rs in receipt_sets])
    return reference, spread


def _per_rank(results: list[ExecutionResult], ranks: int, warmup: int, measure: int, spread: dict) -> list[dict]:
    """Each rank's reference, from its own lines; ``spread`` takes the largest over ranks."""
    out = []
    for rank in range(ranks):
        sets = [parse_receipts(_rank_lines(r, rank)) for r in results]
        reference, rank_spread = _trajectories(sets, warmup + measure)
        reference["tokens_per_step"] = _counted(
            [rec.get("tokens") for rs in sets for rec in rs.measured(warmup, measure)]
        )
        for key, value in rank_spread.items():
            if value is not None:
                spread[key] = value if spread.get(key) is None else max(spread[key], value)
        out.append(reference)
    return out


def _mfu(results, warmup, measure, peak_tflops, flops, tokens_per_s, device):
    """MFU, the peak it is measured against, and a warning when it is too high to believe.

    No MFU without a peak: the contract's, or, for a job on ``cuda`` (or a device not said), the
    table's for the one kind of GPU the machine has. The peak is per device and a job of several
    ranks runs one device per rank (torchrun's convention), so its peak is the ranks' together."""
    if not isinstance(flops, (int, float)) or isinstance(flops, bool) or not tokens_per_s:
        return None, None, None
    gpus = ((results[0].evidence or {}).get("fingerprint") or {}).get("gpus") or []
    if device == "cpu":
        gpus = []  # a CPU job on a GPU machine: the GPU's peak says nothing about it
    steps = steps_from_lines(receipt_lines(results[0].receipts))
    seen, _ = observed_precisions([s for s in steps if warmup < s.step <= warmup + measure])
    peak = peak_for(peak_tflops, [str(g) for g in gpus], training_precision(seen))
    if peak is None:
        return None, None, None
    devices = _run(results[0]).ranks
    mfu = float(flops) * tokens_per_s / (peak.tflops * 1e12 * devices)
    warning = None
    if mfu > IMPLAUSIBLE_MFU:
        where = "[resources] peak_tflops" if peak.source == "contract" else f"the {peak.device} {peak.precision} peak"
        warning = (
            f"MFU {mfu:.0%} is implausibly high (above {IMPLAUSIBLE_MFU:.0%}): check {where} "
            f"({peak.tflops:g} TFLOPS) and the job's flops_per_token ({float(flops):g})"
        )
    return mfu, peak, warning


def summarise(
    results: list[ExecutionResult],
    executions: list[int],
    warmup: int,
    measure: int,
    peak_tflops: float | None,
    tokens_per_step: int | None = None,
    device: str | None = None,
) -> BaselineSummary:
    """Statistics of successful baseline runs (pure: evidence in, summary out)."""
    first = _run(results[0])
    ranks = first.ranks if first.line_ranks is not None else 0  # 0: one process, no launcher
    # Rank 0's receipts (a one-process job's: all of them) give the trajectories and what the job declared.
    receipt_sets = [parse_receipts(_rank_lines(r, 0)) for r in results]
    medians = [r.step_time_s for r in results]
    center = statistics.median(medians)
    # Step-to-step noise from the runner's clock: the periods between step ends (evidence["timing"]).
    within = [
        statistics.stdev(t) / statistics.fmean(t)
        for t in ((r.evidence.get("timing") or {}).get("periods_s") for r in results)
        if t and len(t) >= 2 and statistics.fmean(t) > 0  # steps the clock could not tell apart: no noise figure
    ]
    within_cv = statistics.median(within) if within else None
    # With one run, its own step-to-step noise is the best estimate there is.
    mean = statistics.fmean(medians)
    cv = statistics.stdev(medians) / mean if len(medians) >= 2 and mean > 0 else within_cv
    mad = statistics.median(abs(m - center) for m in medians)
    # Tokens: the receipts' own count (the probe's, or the autoprobe's inputs), else the contract's
    # `tokens_per_step`; which one is in `tokens_source`.
    # A job of several ranks trains on every rank's tokens: its steps sum them (`merged_steps`).
    if ranks:
        tokens = [s.get("tokens") for r in results for s in _run(r).steps if warmup < s.step <= warmup + measure]
    else:
        tokens = [rec.get("tokens") for rs in receipt_sets for rec in rs.measured(warmup, measure)]
    counted = _counted(tokens)
    source = "receipts" if counted else ("contract" if tokens_per_step else None)
    if counted:
        tokens_per_step = counted
    tokens_per_s = tokens_per_step / center if tokens_per_step and center > 0 else None
    declared = receipt_sets[0].declared()
    flops = declared.get("flops_per_token", declared.get("flops_per_token_estimate"))
    mfu, peak, warning = _mfu(results, warmup, measure, peak_tflops, flops, tokens_per_s, device)
    peaks = [r.peak_mem_mb for r in results if r.peak_mem_mb is not None]
    reference, spread = _trajectories(receipt_sets, warmup + measure)
    per_rank = _per_rank(results, ranks, warmup, measure, spread) if ranks else None
    return BaselineSummary(
        runs=len(results),
        executions=executions,
        step_time_s={"median": center, "cv": cv, "mad": mad},
        within_run_cv=within_cv,
        tokens_per_step=tokens_per_step,
        tokens_per_s=tokens_per_s,
        tokens_source=source,
        peak_mem_mb=max(peaks) if peaks else None,
        mfu=mfu,
        mfu_peak=peak.to_json() if peak else None,
        mfu_warning=warning,
        run_step_times_s=medians,
        reference=reference,
        reference_spread=spread,
        knobs=dict(results[0].candidate.knobs),
        reference_ranks=per_rank,
    )


def observed_reference(receipts: bytes | list[str]) -> dict:
    """Per-step per-parameter gradient norms and operator dtypes from a run observed at every step.

    ``{"param_grad_norms": {"3": {name: norm | None}}, "param_grad_min_rows": {"3": {name: norm}},
    "ops": {"3": ["mm:float32", ...]}}``; a step whose line lacks them is left out (the
    verifiers then can't judge it).
    """
    found: dict[str, dict[str, object]] = {"param_grad_norms": {}, "param_grad_min_rows": {}, "ops": {}}
    lines = receipts if isinstance(receipts, list) else receipt_lines(receipts)
    for step in steps_from_lines(lines):
        for key, field, kind in (
            ("param_grad_norms", "grads", dict),
            ("param_grad_min_rows", "grad_min_rows", dict),
            ("ops", "ops", list),
        ):
            if isinstance(step.get(field), kind):
                found[key].setdefault(str(step.step), step.get(field))
    return found


def _sampled_spread(results: list[ExecutionResult], reference: dict) -> float | None:
    """The largest relative difference of a parameter's gradient norm between the timed runs'
    sampled steps and the reference run at the same step: how reproducible the job is."""
    worst = None
    for result in results:
        observed = observed_reference(_rank_lines(result, 0))["param_grad_norms"]
        for step, grads in observed.items():
            if step in reference:
                _, rel, _ = compare_param_grads(grads, reference[step], rtol=1e9)  # judges nothing: the worst
                worst = rel if worst is None else max(worst, rel)
    return worst


def baseline(
    contract_path: str | Path = "infrarsi.toml",
    runs: int = 5,
    progress: Callable[[int, int, ExecutionResult], None] | None = None,
    force: bool = False,
    calibrate: bool = False,
    executor_flags: dict | None = None,
) -> BaselineSummary:
    """Run the original setup ``runs`` times, then once observed at every step; record every run, store the summary.

    The extra run (kind "baseline" in the same batch, its id in ``reference_execution``, not in
    ``executions``) gives each step's per-parameter gradient norms and operator dtypes, which
    the sampled steps of later runs are compared with. Jobs with ``log`` evidence have none.

    The summary is then judged against the contract (`infrarsi._selfcheck`): with a problem
    that would fail every candidate, it is not stored and ``BaselineRejected`` says what to
    change, unless ``force``, which stores it with the problems in ``self_check``.

    ``calibrate`` (and a contract that says ``"calibrated"`` for a tolerance) then runs the
    original setup under perturbations that must not change the job, and stores the tolerances
    they call for with the summary (`infrarsi._calibrate`); the self-check judges with them.

    ``executor_flags`` ([executor] keys replaced for this command) are stored with the summary:
    a verify or search compared with it must give the same hardware keys.
    """
    if runs < 1:
        from infrarsi.errors import UsageError

        raise UsageError(f"--runs {runs}: expected at least 1")
    with open_workspace(contract_path, executor_flags=executor_flags) as ws:
        candidate = Candidate(knobs=ws.contract.baseline_knobs())
        batch = uuid.uuid4().hex
        results, executions = [], []
        observed = ws.contract.task.evidence != "log"
        calibrating = calibrate or wants_calibration(ws.contract)
        conv = ws.contract.convergence
        planned = runs + observed + (len(PERTURBATIONS) + (conv.seeds if conv else 0) if calibrating else 0)
        if progress:
            progress(0, planned, None)
        for seq in range(runs):
            execution, result = ws.execute(candidate, kind="baseline", batch=batch, seq=seq)
            executions.append(execution)
            results.append(result)
            if progress:
                progress(seq + 1, planned, result)
            if result.status != "ok" or result.step_time_s is None:
                raise BaselineFailed(
                    f"baseline run {seq + 1}/{runs} (execution {execution}) is {result.status}: "
                    f"{result.detail or 'no detail'}"
                    + (f"\n--- stderr tail ---\n{result.stderr_tail[-1500:]}" if result.stderr_tail else "")
                )
        timing = ws.contract.timing
        summary = summarise(
            results,
            executions,
            timing.warmup_steps,
            timing.measure_steps,
            ws.contract.resources.peak_tflops,
            ws.contract.task.tokens_per_step,
            ws.contract.resources.device,
        )
        if observed:
            # The original setup once more, observed at every step (its time is not a measurement).
            execution, result = ws.execute(candidate, kind="baseline", batch=batch, seq=runs, sample_all=True)
            if progress:
                progress(planned, planned, result)
            if result.status != "ok":
                raise BaselineFailed(
                    f"the baseline's reference run (every step observed; execution {execution}) is "
                    f"{result.status}: {result.detail or 'no detail'}"
                    + (f"\n--- stderr tail ---\n{result.stderr_tail[-1500:]}" if result.stderr_tail else "")
                )
            found = observed_reference(_rank_lines(result, 0))
            ranks = summary.reference_ranks or []
            ranks = [{**ref, **observed_reference(_rank_lines(result, r))} for r, ref in enumerate(ranks)]
            spread = {
                **summary.reference_spread,
                "param_grad_norms": _sampled_spread(results, found["param_grad_norms"]),
            }
            summary = replace(
                summary,
                reference={**summary.reference, **found},
                reference_spread=spread,
                reference_execution=execution,
                reference_ranks=ranks or None,
            )
        if calibrating:
            done = runs + observed

            def tick(result, planned=planned):
                nonlocal done
                done += 1
                if progress:
                    progress(done, planned, result)

            summary = replace(summary, calibration=measure_calibration(ws, summary, batch, runs + observed, tick))
        observed_grads = [observed_reference(_rank_lines(r, 0)) for r in results] if observed else []
        checked = self_check(summary, results, ws.contract, observed_grads)
        checked.forced = force and not checked.ok
        summary = replace(summary, self_check=checked.to_json(), executor_flags=ws.contract.executor_flags or None)
        if not checked.ok and not force:
            raise BaselineRejected(summary, checked.problems)
        ws.ledger.append_baseline(batch, summary.as_record())
    return summary
