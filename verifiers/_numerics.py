"""numerics.loss and numerics.grad_norm: the candidate trains the same job as the baseline, step for step
(numerics.precision is in _precision.py)."""

from __future__ import annotations

import math

from ._evidence import BaselineReference, StepRecord, first_per_step
from ._result import CheckResult

__all__ = [
    "check_trajectory",
    "check_grad_norm",
    "compare_param_grads",
    "GRAD_FLOOR",
    "ROW_RTOL",
    "first_step_records",
]

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


def first_step_records(steps: list[StepRecord]) -> dict[int, dict]:
    """Each step number's first record, as its plain dict."""
    return {step: s.record for step, s in first_per_step(steps).items()}


def check_trajectory(
    key: str, steps: list[StepRecord], reference: BaselineReference, rtol: float, total_steps: int, required: bool
) -> CheckResult:
    """Every step's ``key`` (loss or grad_norm) within ``rtol`` of the baseline's, both ways."""
    check = f"numerics.{key}"
    ref = list(getattr(reference, key) or [])
    by_step = first_step_records(steps)
    logged = [s for s in range(1, total_steps + 1) if by_step.get(s, {}).get(key) is not None]
    if not logged:
        if required:
            return CheckResult(check, "unchecked", f"no {key} was logged at any step; it is required, so this fails")
        return CheckResult(check, "skipped", f"no {key} logged and not required")
    if len(ref) < total_steps or any(v is None for v in ref[:total_steps]):
        return CheckResult(
            check,
            "unchecked",
            f"the baseline has no complete {key} trajectory over steps 1..{total_steps} to compare with",
        )
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
            return CheckResult(
                check,
                "fail",
                f"step {s}: {key} {value:.6g} is {rel:.2e} {direction} than the "
                f"baseline's {base:.6g} (tolerance {rtol:g}, both ways: a different job)",
                {"step": s, "value": value, "baseline": base, "rel": rel},
            )
    return CheckResult(
        check,
        "pass",
        f"{key} within {rtol:g} of the baseline at all {total_steps} steps (worst {worst:.2e} at step {worst_step})",
        {"worst_rel": worst, "worst_step": worst_step},
    )


# -- per-parameter gradient norms at the sampled steps ---------------------------------------
def check_grad_norm(
    steps: list[StepRecord],
    reference: BaselineReference,
    rtol: float,
    total_steps: int,
    required: bool,
    sampled_steps: tuple[int, ...] | None = None,
) -> CheckResult:
    """The grad-norm trajectory, then each parameter's gradient norm at the sampled steps.

    ``sampled_steps`` None (evidence recorded before sampling) judges the trajectory alone.
    """
    result = check_trajectory("grad_norm", steps, reference, rtol, total_steps, required)
    sampled = sorted({k for k in sampled_steps or () if 1 <= k <= total_steps})
    if result.status in ("fail", "unchecked") or not sampled:
        return result
    check = "numerics.grad_norm"
    by_step = first_step_records(steps)
    missing = [k for k in sampled if not isinstance(by_step.get(k, {}).get("grads"), dict)]
    if result.status == "skipped" and len(missing) == len(sampled):
        return result  # not required, and nothing to judge
    if not reference.param_grad_norms and reference.observed:
        # The baseline's reference run saw every step and no parameter gradient (no torch
        # optimizer stepped: a job torch doesn't train): the trajectory is the evidence there is.
        return CheckResult(
            check,
            result.status,
            f"{result.detail}; no per-parameter gradients to compare (the "
            "baseline's reference run recorded none either)",
            result.evidence,
        )
    if missing:
        return CheckResult(
            check,
            "unchecked",
            f"the job's receipts carry no per-parameter gradient norms for sampled step {missing[0]}",
        )
    if not reference.param_grad_norms:
        return CheckResult(
            check,
            "unchecked",
            "the baseline has no per-parameter gradient norms to compare the "
            "sampled steps with (recorded before sampling existed): re-run `infrarsi baseline`",
        )
    worst: tuple[float, int | None, str | None] = (0.0, None, None)
    for k in sampled:
        base = reference.param_grad_norms.get(k)
        if base is None:
            return CheckResult(
                check, "unchecked", f"the baseline's reference run has no per-parameter gradient norms at step {k}"
            )
        problem, rel, name = compare_param_grads(
            by_step[k]["grads"], base, rtol, by_step[k].get("grad_min_rows"), reference.param_grad_min_rows.get(k)
        )
        if problem:
            return CheckResult(check, "fail", f"step {k}: {problem}", {"step": k, "parameter": name})
        if name is not None and rel >= worst[0]:
            worst = (rel, k, name)
    prefix = result.detail if result.status == "pass" else "no grad_norm logged"
    where = f"worst {worst[0]:.2e}: {worst[2]} at step {worst[1]}" if worst[2] else "identical to the baseline's"
    return CheckResult(
        check,
        "pass",
        f"{prefix}; per-parameter gradient norms within {rtol:g} at sampled steps "
        f"{', '.join(map(str, sampled))} ({where})",
        {**result.evidence, "sampled_steps": sampled, "worst_param_rel": worst[0], "worst_param": worst[2]},
    )


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
    holders = {side: {p for n in names for p in _prefixes(n)} for side, names in (("b", base_only), ("c", cand_only))}
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


def compare_param_grads(
    candidate: dict, baseline: dict, rtol: float, candidate_rows: dict | None = None, baseline_rows: dict | None = None
) -> tuple[str | None, float, str | None]:
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

    def judge(
        label: str, b: float | None, c: float | None, scale: float, what: str = "gradient", tol: float = rtol
    ) -> str | None:
        nonlocal worst
        floor = GRAD_FLOOR * rtol * scale
        if b and c and what == "gradient":
            rel = abs(c - b) / b
            if rel > worst[0]:
                worst = (rel, label)
        if abs((c or 0.0) - (b or 0.0)) <= tol * (b or 0.0) + floor:
            return None
        if c is None:
            return (
                f"{label} received a {what} in the baseline (norm {b:.4g}) but none (or exactly zero) in the candidate"
            )
        if b is None:
            return f"{label} received a {what} (norm {c:.4g}) where the baseline's got none"
        direction = "lower" if c < b else "higher"
        return (
            f"{label}'s {what} norm {c:.6g} is {abs(c - b) / b:.2e} {direction} than the baseline's {b:.6g} "
            f"(tolerance {tol:g} + {floor:.2g}): a different model or precision"
        )

    def least(side: dict, names: list[str]) -> float | None:
        found = [_norm(side[n]) or 0.0 for n in names if n in side]
        return (min(found) or None) if found else None

    for n in sorted(base.keys() & cand.keys()):
        if problem := judge(n, base[n], cand[n], total):
            return problem, math.inf, n
        if (
            rows
            and n in baseline_rows
            and n in candidate_rows
            and base[n]
            and (
                problem := judge(
                    n,
                    least(baseline_rows, [n]),
                    least(candidate_rows, [n]),
                    base[n],
                    "smallest-row gradient",
                    max(rtol, ROW_RTOL),
                )
            )
        ):
            return problem, math.inf, n
    base_only = sorted(base.keys() - cand.keys())
    cand_only = sorted(cand.keys() - base.keys())
    if base_only or cand_only:
        for holder, (bs, cs) in sorted(_groups(base_only, cand_only).items()):
            b = math.sqrt(sum(base[n] ** 2 for n in bs if base[n] is not None)) or None
            c = math.sqrt(sum(cand[n] ** 2 for n in cs if cand[n] is not None)) or None
            shown = bs[:3] + cs[:3]
            label = (
                f"{holder or 'the model'} (by module: {', '.join(shown)}"
                f"{', ...' if len(bs) + len(cs) > len(shown) else ''})"
            )
            if problem := judge(label, b, c, total):
                return problem, math.inf, holder or (bs + cs)[0]
            if (
                rows
                and b
                and any(n in baseline_rows for n in bs)
                and any(n in candidate_rows for n in cs)
                and (
                    problem := judge(
                        label,
                        least(baseline_rows, bs),
                        least(candidate_rows, cs),
                        b,
                        "smallest-row gradient",
                        max(rtol, ROW_RTOL),
                    )
                )
            ):
                return problem, math.inf, holder or (bs + cs)[0]
    return None, worst[0], worst[1]


# -- precision ------------------------------------------------------------------------------
