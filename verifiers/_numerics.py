"""numerics.*: the candidate trains the same job as the baseline, step for step."""

from __future__ import annotations

import math

from ._evidence import BaselineReference, StepRecord
from ._result import CheckResult

__all__ = ["check_trajectory", "check_precision", "observed_precisions"]

_DTYPES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
           "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8",
           "float64": "fp64", "double": "fp64"}
# torch.set_float32_matmul_precision: "high" lets matmuls use TF32, "medium" bf16.
_MATMUL = {"highest": "fp32", "high": "tf32", "medium": "bf16"}


def _first_per_step(steps: list[StepRecord]) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for s in steps:
        out.setdefault(s.step, s.record)
    return out


def check_trajectory(key: str, steps: list[StepRecord], reference: BaselineReference, rtol: float,
                     total_steps: int, required: bool) -> CheckResult:
    """Every step's ``key`` (loss or grad_norm) within ``rtol`` of the baseline's, both ways."""
    check = f"numerics.{key}"
    ref = list(getattr(reference, key) or [])
    by_step = _first_per_step(steps)
    logged = [s for s in range(1, total_steps + 1) if by_step.get(s, {}).get(key) is not None]
    if not logged:
        if required:
            return CheckResult(check, "unchecked", f"no {key} was logged at any step; "
                               f"it is required, so this fails")
        return CheckResult(check, "skipped", f"no {key} logged and not required")
    if len(ref) < total_steps or any(v is None for v in ref[:total_steps]):
        return CheckResult(check, "unchecked", f"the baseline has no complete {key} trajectory "
                           f"over steps 1..{total_steps} to compare with")
    worst_step, worst = None, 0.0
    for s in range(1, total_steps + 1):
        value = by_step.get(s, {}).get(key)
        if value is None:
            return CheckResult(check, "fail", f"step {s}: no {key} logged (steps 1..{total_steps} all need one)")
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return CheckResult(check, "fail", f"step {s}: {key} is {value!r}, not a finite number")
        base = float(ref[s - 1])
        rel = abs(value - base) / abs(base) if base else abs(value)
        if rel > worst:
            worst_step, worst = s, rel
        if rel > rtol:
            direction = "lower" if value < base else "higher"
            return CheckResult(check, "fail", f"step {s}: {key} {value:.6g} is {rel:.2e} {direction} than the "
                               f"baseline's {base:.6g} (tolerance {rtol:g}, both ways: a different job)",
                               {"step": s, "value": value, "baseline": base, "rel": rel})
    return CheckResult(check, "pass", f"{key} within {rtol:g} of the baseline at all {total_steps} steps "
                       f"(worst {worst:.2e} at step {worst_step})", {"worst_rel": worst, "worst_step": worst_step})


def observed_precisions(steps: list[StepRecord]) -> tuple[set[str], bool]:
    """Precisions the probe saw (parameter dtypes, autocast, matmul mode), and whether it saw any."""
    seen: set[str] = set()
    evidence = False
    for s in steps:
        dtypes = s.get("param_dtypes")
        if isinstance(dtypes, list):
            evidence = True
            for name in dtypes:
                if str(name).startswith(("int", "uint", "bool", "complex")):
                    continue  # not a training precision
                seen.add(_DTYPES.get(str(name), str(name)))
        autocast = s.get("autocast")
        if isinstance(autocast, list):
            for entry in autocast:
                dtype = str(entry).rsplit(":", 1)[-1]
                seen.add(_DTYPES.get(dtype, dtype))
        matmul = s.get("fp32_matmul")
        if isinstance(matmul, str) and matmul != "highest":
            # Only a lowered mode says something: "highest" is plain fp32 math, which the
            # dtypes already show (a pure-bf16 job must not be charged with fp32 for it).
            seen.add(_MATMUL.get(matmul, matmul))
    return seen, evidence


def check_precision(steps: list[StepRecord], allowed: list[str], required: bool) -> CheckResult:
    """Observed dtypes and autocast are all allowed; what the script declares counts for nothing."""
    seen, evidence = observed_precisions(steps)
    if not evidence:
        if required:
            return CheckResult("numerics.precision", "unchecked",
                               "the probe observed no parameter dtypes (no p.watch(model)?); precision is "
                               "required, so this fails")
        return CheckResult("numerics.precision", "skipped", "no precision evidence and not required")
    bad = sorted(seen - set(allowed))
    if bad:
        return CheckResult("numerics.precision", "fail", f"observed {', '.join(bad)}; the contract allows only "
                           f"{', '.join(allowed)}", {"observed": sorted(seen)})
    return CheckResult("numerics.precision", "pass", f"observed {', '.join(sorted(seen))}, all allowed",
                       {"observed": sorted(seen)})
