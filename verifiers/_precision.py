"""numerics.precision: the math ran in the precisions the contract allows, at every step (parameter
dtypes, autocast, the fp32 matmul mode) and, at the sampled steps, in every operator."""

from __future__ import annotations

from ._evidence import BaselineReference, StepRecord
from ._numerics import first_step_records
from ._result import CheckResult

__all__ = ["check_precision", "observed_precisions"]

_DTYPES = {
    "float32": "fp32",
    "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "float8_e4m3fnuz": "fp8",
    "float8_e5m2fnuz": "fp8",
    "float8_e8m0fnu": "fp8",
    "float4_e2m1fn_x2": "fp4",
    "float64": "fp64",
    "double": "fp64",
}
# torch.set_float32_matmul_precision: "high" lets matmuls use TF32, "medium" bf16.
_MATMUL = {"highest": "fp32", "high": "tf32", "medium": "bf16"}
# torch.backends.*.fp32_precision: "ieee" is plain fp32, "none" defers to the enclosing setting.
_FP32_PRECISION = {"ieee": None, "none": None, "tf32": "tf32", "bf16": "bf16"}


def observed_precisions(steps: list[StepRecord]) -> tuple[set[str], bool]:
    """Precisions the probe saw at every step (parameter dtypes, autocast, matmul mode), and whether it saw any."""
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


def _is_conv(op: str) -> bool:
    return "conv" in op and "convert" not in op


def _is_rnn(op: str) -> bool:
    return any(word in op for word in ("rnn", "lstm", "gru"))


def _sampled_precisions(record: dict) -> list[tuple[str, str]]:
    """``(what, precision)`` of one sampled step: each operator entry and each fp32_precision setting."""
    found = []
    ops = [str(entry) for entry in record.get("ops") or []]
    for entry in ops:
        name, _, dtype = entry.rpartition(":")
        found.append((f"{name} in {dtype}", _DTYPES.get(dtype, dtype)))
    settings = record.get("fp32_precision")
    if isinstance(settings, dict):
        names = [entry.rpartition(":")[0] for entry in ops]
        for key, value in sorted(settings.items()):
            # A convolution or RNN setting governs only those operators (CUDA's cudnn.conv is
            # "tf32" by default): it counts where one ran.
            if ("conv" in key and not any(map(_is_conv, names))) or ("rnn" in key and not any(map(_is_rnn, names))):
                continue
            precision = _MATMUL.get(value) if key == "legacy_matmul" else _FP32_PRECISION.get(value, str(value))
            if precision and precision != "fp32":
                found.append((f"fp32_precision {key} = {value!r}", precision))
    return sorted(found, key=lambda item: _telling(item[0]))


def _telling(what: str) -> int:
    """Order of mention: math operators, casts, settings, then the rest (views, detach ...)."""
    name = what.split(" in ", 1)[0].lstrip("_")
    if what.startswith("fp32_precision"):
        return 2
    if (
        name.endswith("mm")
        or _is_conv(name)
        or _is_rnn(name)
        or any(word in name for word in ("matmul", "linear", "attention", "einsum", "dot"))
    ):
        return 0
    return 1 if name in ("to_copy", "copy_", "convert_element_type") else 3


def check_precision(
    steps: list[StepRecord],
    allowed: list[str],
    required: bool,
    sampled_steps: tuple[int, ...] | None = None,
    reference: BaselineReference | None = None,
) -> CheckResult:
    """Observed dtypes, autocast and precision settings are all allowed; what the script declares counts for nothing.

    At every step: parameter dtypes, autocast, the legacy matmul mode. At the runner's sampled
    steps: the dtype every math operator ran in and every cast to a narrower float, and the
    ``fp32_precision`` settings; a sampled step whose record lacks them is ``unchecked``.
    ``sampled_steps`` None (evidence recorded before sampling) judges the first kind alone.
    """
    check = "numerics.precision"
    seen, evidence = observed_precisions(steps)
    by_step = first_step_records(steps)
    bad: list[str] = []
    missing: str | None = None
    notes = set()
    sampled = sorted({k for k in sampled_steps or () if k in by_step or k >= 1})
    for k in sampled:
        record = by_step.get(k)
        if record is None:
            continue  # a step that never came is timing.window's to fail
        if not isinstance(record.get("ops"), list):
            if not (reference is not None and reference.observed and not reference.ops):
                missing = missing or f"the job's receipts carry no operator dtypes for sampled step {k}"
            continue  # else: the reference run saw no operators either (a job torch doesn't run)
        evidence = True
        base_ops = reference.ops.get(k) if reference is not None else None
        if not record["ops"] and base_ops:
            missing = missing or (
                f"no operator was observed at sampled step {k}, where the baseline's reference "
                f"run saw {len(base_ops)} kinds: the work ran where the probe can't see it"
            )
        for what, precision in _sampled_precisions(record):
            seen.add(precision)
            if precision not in allowed:
                bad.append(f"step {k}: {what}")
        if isinstance(record.get("ops_note"), str):
            notes.add(record["ops_note"])
    if not evidence:
        if required:
            return CheckResult(
                check,
                "unchecked",
                "the probe observed no parameter dtypes (no p.watch(model)?); precision is required, so this fails",
            )
        return CheckResult(check, "skipped", "no precision evidence and not required")
    not_allowed = sorted(seen - set(allowed))
    if not_allowed:
        where = f" ({'; '.join(bad[:4])}{'; ...' if len(bad) > 4 else ''})" if bad else ""
        return CheckResult(
            check,
            "fail",
            f"observed {', '.join(not_allowed)}{where}; the contract allows only {', '.join(allowed)}",
            {"observed": sorted(seen), "where": bad[:20]},
        )
    if missing:
        return CheckResult(check, "unchecked", missing)
    ops_seen = f"; operators at sampled steps {', '.join(map(str, sampled))}" if sampled else ""
    note = f" ({'; '.join(sorted(notes))})" if notes else ""
    return CheckResult(
        check, "pass", f"observed {', '.join(sorted(seen))}, all allowed{ops_seen}{note}", {"observed": sorted(seen)}
    )
