"""numerics.*: the candidate trains the same job as the baseline, step for step."""

from __future__ import annotations

import math

from ._evidence import BaselineReference, StepRecord, first_per_step
from ._result import CheckResult

__all__ = ["check_trajectory", "check_grad_norm", "check_precision", "compare_param_grads", "observed_precisions",
           "GRAD_FLOOR", "ROW_RTOL"]

_DTYPES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
           "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8",
           "float8_e8m0fnu": "fp8", "float4_e2m1fn_x2": "fp4", "float64": "fp64", "double": "fp64"}
# torch.set_float32_matmul_precision: "high" lets matmuls use TF32, "medium" bf16.
_MATMUL = {"highest": "fp32", "high": "tf32", "medium": "bf16"}
# torch.backends.*.fp32_precision: "ieee" is plain fp32, "none" defers to the enclosing setting.
_FP32_PRECISION = {"ieee": None, "none": None, "tf32": "tf32", "bf16": "bf16"}

# A parameter's gradient norm may differ from the baseline's by rtol of its own size, plus
# GRAD_FLOOR x rtol of the step's whole gradient norm (its root-sum-square over parameters):
# a gradient that is mathematically zero is rounding noise, free to be anything that small,
# and a norm below the floor counts as no gradient. On TinyGPT every honest knob and patch
# moved each parameter's norm by at most 4e-6 of itself, while the query/key gradients a
# class-3 cheat removes are 1e-6..2e-4 of the total (docs/verification.md).
GRAD_FLOOR = 1e-5
# A parameter's (or group's) smallest row may differ from the baseline's by this much of
# itself: it is there to see rows that lost their gradient (zero, or orders of magnitude
# less), and a small row is noisier than a whole norm (cancellation): honest runs of TinyGPT
# and its MoE moved it by up to 2.6e-3, a class-3 cheat by a factor of 1e3 or to zero.
ROW_RTOL = 0.5


def _first_per_step(steps: list[StepRecord]) -> dict[int, dict]:
    """Each step number's first record, as its plain dict."""
    return {step: s.record for step, s in first_per_step(steps).items()}


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


# -- per-parameter gradient norms at the sampled steps ---------------------------------------
def check_grad_norm(steps: list[StepRecord], reference: BaselineReference, rtol: float, total_steps: int,
                    required: bool, sampled_steps: tuple[int, ...] | None = None) -> CheckResult:
    """The grad-norm trajectory, then each parameter's gradient norm at the sampled steps.

    ``sampled_steps`` None (evidence recorded before sampling) judges the trajectory alone.
    """
    result = check_trajectory("grad_norm", steps, reference, rtol, total_steps, required)
    sampled = sorted({k for k in sampled_steps or () if 1 <= k <= total_steps})
    if result.status in ("fail", "unchecked") or not sampled:
        return result
    check = "numerics.grad_norm"
    by_step = _first_per_step(steps)
    missing = [k for k in sampled if not isinstance(by_step.get(k, {}).get("grads"), dict)]
    if result.status == "skipped" and len(missing) == len(sampled):
        return result  # not required, and nothing to judge
    if not reference.param_grad_norms and reference.observed:
        # The baseline's reference run saw every step and no parameter gradient (no torch
        # optimizer stepped: a job torch doesn't train): the trajectory is the evidence there is.
        return CheckResult(check, result.status, f"{result.detail}; no per-parameter gradients to compare (the "
                           "baseline's reference run recorded none either)", result.evidence)
    if missing:
        return CheckResult(check, "unchecked", f"the job's receipts carry no per-parameter gradient norms for "
                           f"sampled step {missing[0]}")
    if not reference.param_grad_norms:
        return CheckResult(check, "unchecked", "the baseline has no per-parameter gradient norms to compare the "
                           "sampled steps with (recorded before sampling existed): re-run `infrarsi baseline`")
    worst: tuple[float, int | None, str | None] = (0.0, None, None)
    for k in sampled:
        base = reference.param_grad_norms.get(k)
        if base is None:
            return CheckResult(check, "unchecked", f"the baseline's reference run has no per-parameter gradient "
                               f"norms at step {k}")
        problem, rel, name = compare_param_grads(by_step[k]["grads"], base, rtol, by_step[k].get("grad_min_rows"),
                                                 reference.param_grad_min_rows.get(k))
        if problem:
            return CheckResult(check, "fail", f"step {k}: {problem}", {"step": k, "parameter": name})
        if name is not None and rel >= worst[0]:
            worst = (rel, k, name)
    prefix = result.detail if result.status == "pass" else "no grad_norm logged"
    where = f"worst {worst[0]:.2e}: {worst[2]} at step {worst[1]}" if worst[2] else "identical to the baseline's"
    return CheckResult(check, "pass", f"{prefix}; per-parameter gradient norms within {rtol:g} at sampled steps "
                       f"{', '.join(map(str, sampled))} ({where})",
                       {**result.evidence, "sampled_steps": sampled, "worst_param_rel": worst[0],
                        "worst_param": worst[2]})


def _norm(value) -> float | None:
    """A gradient norm, or None for "no gradient" (null, zero or not a number at all)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value != 0 else None


def _prefixes(name: str) -> list[str]:
    """Module paths that hold ``name``, innermost first, ending with "" (the whole model)."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)] + [""]


def _groups(base_only: list[str], cand_only: list[str]) -> dict[str, tuple[list[str], list[str]]]:
    """Parameters only one side has, grouped by the innermost module that holds some of both sides'.

    A fused ``attn.qkv`` meets the baseline's ``attn.heads.*.{q,k,v}`` at ``attn``; a parameter
    with no counterpart anywhere falls to the whole model ("").
    """
    holders = {side: {p for n in names for p in _prefixes(n)} for side, names in (("b", base_only),
                                                                                   ("c", cand_only))}
    chosen = set()
    for side, names in (("b", base_only), ("c", cand_only)):
        other = holders["c" if side == "b" else "b"]
        for n in names:
            chosen.add(next((p for p in _prefixes(n) if p in other), ""))
    # A group inside another is part of it.
    outer = sorted(chosen, key=lambda p: (len(p), p))
    kept: list[str] = []
    for p in outer:
        if not any(q == "" or p == q or p.startswith(q + ".") for q in kept):
            kept.append(p)
    out: dict[str, tuple[list[str], list[str]]] = {p: ([], []) for p in kept}
    for index, names in ((0, base_only), (1, cand_only)):
        for n in names:  # kept groups don't nest: exactly one holds n
            out[next(p for p in _prefixes(n) if p in out)][index].append(n)
    return out


def compare_param_grads(candidate: dict, baseline: dict, rtol: float, candidate_rows: dict | None = None,
                        baseline_rows: dict | None = None) -> tuple[str | None, float, str | None]:
    """``(problem or None, worst relative difference, where)`` between two steps' per-parameter gradient norms.

    Parameters both sides name are compared one by one; the rest (a patch that fuses or splits
    parameters) by the root-sum-square of each group that holds some of both sides'. Where both
    sides give each parameter's smallest row norm (``*_rows``), the smallest row of each
    parameter or group must be within ``ROW_RTOL`` too: fused query/key/value rows keep their
    rows, a fused layout whose query and key rows get nothing does not, though its whole norm
    hardly moves. The worst difference reported is of whole norms.
    """
    base = {n: _norm(v) for n, v in baseline.items()}
    cand = {}
    for n, v in candidate.items():
        if isinstance(v, float) and not math.isfinite(v):
            return f"{n}'s gradient norm is {v!r}, not a finite number", math.inf, n
        cand[n] = _norm(v)
    rows = isinstance(candidate_rows, dict) and isinstance(baseline_rows, dict) and bool(baseline_rows)
    total = math.sqrt(sum(v * v for v in base.values() if v is not None))
    worst: tuple[float, str | None] = (0.0, None)

    def judge(label: str, b: float | None, c: float | None, scale: float, what: str = "gradient",
              tol: float = rtol) -> str | None:
        nonlocal worst
        floor = GRAD_FLOOR * rtol * scale
        if b and c and what == "gradient":
            rel = abs(c - b) / b
            if rel > worst[0]:
                worst = (rel, label)
        if abs((c or 0.0) - (b or 0.0)) <= tol * (b or 0.0) + floor:
            return None
        if c is None:
            return (f"{label} received a {what} in the baseline (norm {b:.4g}) but none (or exactly zero) in "
                    f"the candidate")
        if b is None:
            return f"{label} received a {what} (norm {c:.4g}) where the baseline's got none"
        direction = "lower" if c < b else "higher"
        return (f"{label}'s {what} norm {c:.6g} is {abs(c - b) / b:.2e} {direction} than the baseline's {b:.6g} "
                f"(tolerance {tol:g} + {floor:.2g}): a different model or precision")

    def least(side: dict, names: list[str]) -> float | None:
        found = [_norm(side[n]) or 0.0 for n in names if n in side]
        return (min(found) or None) if found else None

    for n in sorted(base.keys() & cand.keys()):
        if (problem := judge(n, base[n], cand[n], total)):
            return problem, math.inf, n
        if (rows and n in baseline_rows and n in candidate_rows and base[n]
                and (problem := judge(n, least(baseline_rows, [n]), least(candidate_rows, [n]), base[n],
                                      "smallest-row gradient", max(rtol, ROW_RTOL)))):
            return problem, math.inf, n
    base_only = sorted(base.keys() - cand.keys())
    cand_only = sorted(cand.keys() - base.keys())
    if base_only or cand_only:
        for holder, (bs, cs) in sorted(_groups(base_only, cand_only).items()):
            b = math.sqrt(sum(base[n] ** 2 for n in bs if base[n] is not None)) or None
            c = math.sqrt(sum(cand[n] ** 2 for n in cs if cand[n] is not None)) or None
            shown = bs[:3] + cs[:3]
            label = (f"{holder or 'the model'} (by module: {', '.join(shown)}"
                     f"{', ...' if len(bs) + len(cs) > len(shown) else ''})")
            if (problem := judge(label, b, c, total)):
                return problem, math.inf, holder or (bs + cs)[0]
            if (rows and b and any(n in baseline_rows for n in bs) and any(n in candidate_rows for n in cs)
                    and (problem := judge(label, least(baseline_rows, bs), least(candidate_rows, cs), b,
                                          "smallest-row gradient", max(rtol, ROW_RTOL)))):
                return problem, math.inf, holder or (bs + cs)[0]
    return None, worst[0], worst[1]


# -- precision ------------------------------------------------------------------------------
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
    if name.endswith("mm") or _is_conv(name) or _is_rnn(name) or any(
            word in name for word in ("matmul", "linear", "attention", "einsum", "dot")):
        return 0
    return 1 if name in ("to_copy", "copy_", "convert_element_type") else 3


def check_precision(steps: list[StepRecord], allowed: list[str], required: bool,
                    sampled_steps: tuple[int, ...] | None = None,
                    reference: BaselineReference | None = None) -> CheckResult:
    """Observed dtypes, autocast and precision settings are all allowed; what the script declares counts for nothing.

    At every step: parameter dtypes, autocast, the legacy matmul mode. At the runner's sampled
    steps: the dtype every math operator ran in and every cast to a narrower float, and the
    ``fp32_precision`` settings; a sampled step whose record lacks them is ``unchecked``.
    ``sampled_steps`` None (evidence recorded before sampling) judges the first kind alone.
    """
    check = "numerics.precision"
    seen, evidence = observed_precisions(steps)
    by_step = _first_per_step(steps)
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
            missing = missing or (f"no operator was observed at sampled step {k}, where the baseline's reference "
                                  f"run saw {len(base_ops)} kinds: the work ran where the probe can't see it")
        for what, precision in _sampled_precisions(record):
            seen.add(precision)
            if precision not in allowed:
                bad.append(f"step {k}: {what}")
        if isinstance(record.get("ops_note"), str):
            notes.add(record["ops_note"])
    if not evidence:
        if required:
            return CheckResult(check, "unchecked", "the probe observed no parameter dtypes (no p.watch(model)?); "
                               "precision is required, so this fails")
        return CheckResult(check, "skipped", "no precision evidence and not required")
    not_allowed = sorted(seen - set(allowed))
    if not_allowed:
        where = f" ({'; '.join(bad[:4])}{'; ...' if len(bad) > 4 else ''})" if bad else ""
        return CheckResult(check, "fail", f"observed {', '.join(not_allowed)}{where}; the contract allows only "
                           f"{', '.join(allowed)}", {"observed": sorted(seen), "where": bad[:20]})
    if missing:
        return CheckResult(check, "unchecked", missing)
    ops_seen = f"; operators at sampled steps {', '.join(map(str, sampled))}" if sampled else ""
    note = f" ({'; '.join(sorted(notes))})" if notes else ""
    return CheckResult(check, "pass", f"observed {', '.join(sorted(seen))}, all allowed{ops_seen}{note}",
                       {"observed": sorted(seen)})
