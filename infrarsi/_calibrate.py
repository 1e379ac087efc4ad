"""`infrarsi baseline --calibrate`: the numerics tolerances from the job's own noise, not a guess.

The original setup is run again under perturbations that must not change the job, and each
run's per-step loss and grad norm (and, at its sampled steps, each parameter's gradient norm)
are held against the baseline's reference trajectories:

- ``rerun``: the baseline's own timed runs, against their median (run-to-run nondeterminism);
- ``threads``: ``OMP_NUM_THREADS=1`` and ``MKL_NUM_THREADS=1``, another reduction order in the
  math libraries (a job that sets its own thread count ignores it, and shows no spread here);
- ``deterministic``: ``torch.use_deterministic_algorithms(True)``, set by the probe (or the
  autoprobe) when the runner asks, where torch offers a deterministic kernel beside the default.

A proposed tolerance is ``FACTOR`` x the largest relative difference seen, rounded up to 1, 2 or
5 x a power of ten, never above ``CEILING`` (the contract's defaults) and never below ``FLOOR``
(about 80 float32 ulps: an honest change of kernel or of summation order moves a loss by 1e-7
to 1e-6, and a job whose perturbations change nothing would otherwise get a tolerance of zero
that rejects every other kernel). With a
``[numerics.convergence]`` table, the baseline's long runs under each seed give the seed-to-seed
spread of the tail loss, proposed as the convergence ``margin`` (relative to the tail loss).

The contract uses a calibration where it says ``"calibrated"`` for ``loss_rtol``,
``grad_norm_rtol`` or the convergence ``margin``; the calibration is part of the stored
baseline, so a new baseline calibrates again (`baseline` does so by itself where the contract
asks for one).
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from infrarsi.contract import Candidate, Knob, KnobLaunch, long_run
from infrarsi.runner import ExecutionResult
from infrarsi.verifiers import RunEvidence, compare_param_grads, receipt_lines, run_losses

__all__ = ["FACTOR", "FLOOR", "CEILING", "PERTURBATIONS", "calibrate", "wants_calibration", "proposed_tolerance"]

FACTOR = 4.0
FLOOR = 1e-5
# Never above the contract's defaults: a calibration measures the code of the day, and a patch
# accepted earlier could make the original noisy under the perturbations alone (red-teamed:
# label smoothing only under deterministic kernels took the next calibration to 5e-2). A job
# whose honest noise is larger sets its tolerance by hand, with the calibration's figures.
CEILING = {"loss_rtol": 1e-3, "grad_norm_rtol": 1e-2}
PERTURBATIONS = (
    ("threads", "OMP_NUM_THREADS=1, MKL_NUM_THREADS=1", {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}),
    ("deterministic", "torch.use_deterministic_algorithms(True)", {"INFRARSI_DETERMINISTIC": "1"}),
)
_KNOB = "calibration.perturbation"


def wants_calibration(contract) -> bool:
    """Whether the contract says ``"calibrated"`` for any tolerance."""
    conv = contract.convergence
    return "calibrated" in (contract.numerics.loss_rtol, contract.numerics.grad_norm_rtol) or (
        conv is not None and conv.margin == "calibrated"
    )


def proposed_tolerance(observed: float | None) -> float:
    """``FACTOR`` x ``observed``, rounded up to 1, 2 or 5 x a power of ten; at least ``FLOOR``."""
    need = max(FACTOR * (observed or 0.0), FLOOR)
    power = 10.0 ** math.floor(math.log10(need))
    for step in (1.0, 2.0, 5.0, 10.0):
        if step * power >= need * (1 - 1e-9):
            return float(f"{step * power:.12g}")
    return float(f"{10 * power:.12g}")


def _perturbed(contract, env: dict[str, str]):
    """The contract with one more knob that sets ``env`` (its one choice, ``on``)."""
    launch = KnobLaunch("set", sets={"on": ((), tuple(env.items()))})
    knob = Knob(_KNOB, ("on",), "on", launch=launch)
    return dataclasses.replace(contract, knobs={**contract.knobs, _KNOB: knob})


def deviations(result: ExecutionResult, reference: dict) -> dict[str, float | None]:
    """The largest relative difference of one run from the baseline's reference, per trajectory:
    ``loss`` and ``grad_norm`` over every step, ``param_grad_norms`` at the run's sampled steps."""
    run = RunEvidence.from_stored(receipt_lines(result.receipts), result.evidence or {})
    by_step = {s.step: s for s in run.steps}
    out: dict[str, float | None] = {}
    for key in ("loss", "grad_norm"):
        worst = None
        for index, base in enumerate(reference.get(key) or []):
            record = by_step.get(index + 1)
            value = record.get(key) if record else None
            if isinstance(base, (int, float)) and isinstance(value, (int, float)) and base:
                rel = abs(value - base) / abs(base)
                worst = rel if worst is None else max(worst, rel)
        out[key] = worst
    worst = None
    norms = reference.get("param_grad_norms") or {}
    for step, record in by_step.items():
        grads = record.get("grads")
        if isinstance(grads, dict) and str(step) in norms:
            _, rel, _ = compare_param_grads(grads, norms[str(step)], rtol=1e9)  # judges nothing: the worst
            worst = rel if worst is None else max(worst, rel)
    out["param_grad_norms"] = worst
    return out


def _largest(*values: float | None) -> float | None:
    seen = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return max(seen) if seen else None


def calibrate(ws, summary, batch: str, first_seq: int, progress=None) -> dict:
    """Run the perturbations (and the long runs, with a convergence table) of the original setup,
    recording each (kind ``calibration``; ``calibration-long`` for a long run); the calibration
    the baseline summary stores."""
    contract = ws.contract
    baseline = Candidate(knobs=contract.baseline_knobs())
    reference = summary.reference
    spread = summary.reference_spread or {}
    seen = {"rerun": {k: spread.get(k) for k in ("loss", "grad_norm", "param_grad_norms")}}
    executions, seq = [], first_seq
    for name, what, env in PERTURBATIONS:
        perturbed = _perturbed(contract, env)
        result = ws.executor.run(perturbed, ws.manifest.files, Candidate({**baseline.knobs, _KNOB: "on"}))
        result.candidate = baseline
        if result.evidence:
            result.evidence = {**result.evidence, "calibration": {"perturbation": name, "env": env}}
        executions.append(ws.record(result, "calibration", batch, seq))
        seq += 1
        if progress:
            progress(result)
        seen[name] = (
            deviations(result, reference)
            if result.status == "ok"
            else {"skipped": f"{what}: the run is {result.status}: {result.detail or 'no detail'}"}
        )
    observed = {
        key: _largest(*(s.get(key) for s in seen.values())) for key in ("loss", "grad_norm", "param_grad_norms")
    }
    out = {
        "factor": FACTOR,
        "floor": FLOOR,
        "perturbations": seen,
        "observed": observed,
        "loss_rtol": min(proposed_tolerance(observed["loss"]), CEILING["loss_rtol"]),
        "grad_norm_rtol": min(
            proposed_tolerance(_largest(observed["grad_norm"], observed["param_grad_norms"])), CEILING["grad_norm_rtol"]
        ),
        "ceiling": CEILING,
        "executions": executions,
    }
    if contract.convergence is not None:
        out["convergence"] = _seed_spread(ws, baseline, batch, seq, executions, progress)
        spread_rel = out["convergence"].get("relative_spread")
        out["margin"] = spread_rel if spread_rel else None
    return out


def _seed_spread(ws, baseline: Candidate, batch: str, seq: int, executions: list[int], progress) -> dict:
    """The baseline's long runs under each seed: the spread of their tail loss."""
    conv = ws.contract.convergence
    tails, steps = [], conv.steps
    for seed in range(conv.seeds):
        contract, launched = long_run(ws.contract, baseline, seed)
        result = ws.executor.run(contract, ws.manifest.files, launched)
        result.candidate = baseline
        if result.evidence:
            result.evidence = {**result.evidence, "long_run": {"seed": seed, "steps": steps}}
        executions.append(ws.record(result, "calibration-long", batch, seq))
        seq += 1
        if progress:
            progress(result)
        if result.status != "ok":
            return {"skipped": f"the long run under seed {seed} is {result.status}: {result.detail or 'no detail'}"}
        losses = run_losses(RunEvidence.from_stored(receipt_lines(result.receipts), result.evidence or {}), steps)
        if isinstance(losses, str):
            return {"skipped": f"the long run under seed {seed}: {losses}"}
        tail = max(2, round(steps * conv.tail))
        tails.append(statistics.fmean(losses[-tail:]))
    level = abs(statistics.fmean(tails))
    sd = statistics.stdev(tails)
    return {"tails": tails, "sd": sd, "relative_spread": sd / level if level else None, "seeds": conv.seeds}
