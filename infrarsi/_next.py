"""The next step for every check a candidate failed: what to run or change, named concretely
(``verify``'s ``next`` in the human output and in ``--json``).

Each entry is ``{"check": id, "next": text}``; a check that passed or was skipped has none.
"""

from __future__ import annotations

import shlex

from infrarsi.contract import DEFAULT_CONTRACT, Contract
from infrarsi.verifiers import CheckResult, pairs_to_resolve, step_ranges

__all__ = ["next_steps", "verify_command"]


def verify_command(contract: Contract, knobs: dict, patches: list[str], pairs: int | None = None) -> str:
    """The `infrarsi verify` line that measures this candidate again."""
    parts = ["infrarsi", "verify"]
    if contract.path.name != DEFAULT_CONTRACT:
        parts += ["--contract", str(contract.path)]
    for name, value in knobs.items():
        knob = contract.knobs.get(name)
        if knob is None or str(value) != str(knob.baseline):
            parts += ["--set", f"{name}={value}"]
    for patch in patches:
        parts += ["--patch", patch]
    if pairs is not None:
        parts += ["--pairs", str(pairs)]
    return shlex.join(parts)


def next_steps(
    checks: list[CheckResult],
    contract: Contract,
    knobs: dict,
    patches: list[str],
    received_steps: list[int] | None = None,
) -> list[dict]:
    """One next step for each check that failed or had no evidence."""
    out = []
    for check in checks:
        if check.status not in ("fail", "unchecked"):
            continue
        family = check.id.split(".", 1)[0]
        if check.id == "stats.speedup":
            text = _speedup(check, contract, knobs, patches)
        elif check.id in ("numerics.loss", "numerics.grad_norm"):
            text = _trajectory(check, contract)
        elif check.id == "numerics.precision":
            text = (
                f"the run trained in a precision [numerics] precision = {list(contract.numerics.precision)} does "
                f"not allow: take the dtype change out of the patch or knob, or, if that precision is acceptable "
                f"for this job, add it to [numerics] precision in {contract.path.name}"
            )
        elif check.id == "timing.window":
            text = _window(check, contract, received_steps)
        elif family == "scope":
            text = (
                f"keep the patch to files [scope] editable = {list(contract.scope.editable)} allows and away from "
                f"[scope] protected, or widen [scope] editable in {contract.path.name}"
            )
        elif family == "audit":
            text = (
                "the source audit flagged the patch (the detail names file:line:col); "
                f"see the rule in docs/audit-rules.md#{check.id.split('.', 1)[1]} and rewrite the change "
                "so the timed step still does all its work, or drop it"
            )
        elif check.id == "integrity.manifest":
            text = (
                "the protected files or the contract differ from what `infrarsi init` pinned: restore them, or pin "
                "them as they are with `infrarsi init --update` (a new baseline where they change what it measured)"
            )
        elif family == "integrity":
            text = (
                "the run changed what it must not (protected files, InfraRSI's own code, processes left behind); "
                "find the write or the stray process in the detail and take it out of the job or the patch"
            )
        else:
            text = f"see docs/verification.md for what {check.id} needs, and the detail above for what was seen"
        out.append({"check": check.id, "next": text})
    return out


def _speedup(check: CheckResult, contract: Contract, knobs: dict, patches: list[str]) -> str:
    evidence = check.evidence or {}
    base, cand = evidence.get("baseline_s") or [], evidence.get("candidate_s") or []
    search = contract.search
    if "not trusted" in check.detail:
        return (
            "the A/B's baseline runs drifted from the stored baseline: re-run `infrarsi baseline` on a quieter "
            f"machine, or raise [search] drift_tolerance (now {search.drift_tolerance:g}) where the machine is "
            "shared with other work"
        )
    if check.status == "unchecked":
        return f"measure the A/B in full: `{verify_command(contract, knobs, patches, max(search.ab_pairs, 2))}`"
    median = evidence.get("median")
    need = pairs_to_resolve(base, cand, search.min_speedup)
    if need is None:
        measured = f"{median:.3f}x" if isinstance(median, (int, float)) else "the measured speedup"
        return (
            f"{measured} does not clear [search] min_speedup = {search.min_speedup:g} by enough for "
            f"this machine's noise to resolve within 100 pairs: more pairs are unlikely to help; "
            f"the candidate is not faster by a margin this machine can show"
        )
    need = max(need, len(base) + 1)
    # With the sequential A/B on, its last look is the setting that buys more pairs when needed.
    key, now = ("ab_max_pairs", search.ab_max_pairs) if search.ab_max_pairs else ("ab_pairs", search.ab_pairs)
    return (
        f"{need} pairs would resolve the measured {median:.3f}x at the measured noise (4 times in 5): "
        f"`{verify_command(contract, knobs, patches, need)}`, or set [search] {key} = {need} "
        f"(now {now}; then `infrarsi init --update`, which keeps the baseline)"
    )


def _shown(value) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else f"{value!r}"


def _trajectory(check: CheckResult, contract: Contract) -> str:
    key = check.id.split(".", 1)[1]
    rtol_key = "loss_rtol" if key == "loss" else "grad_norm_rtol"
    rtol = getattr(contract.numerics, rtol_key)
    ev = check.evidence or {}
    if check.status == "unchecked":
        return (
            f"log the {key} at every step (the probe's p.log(step, {key}=...), or the log regex) so it can be "
            f"compared, or take {key!r} out of [numerics] require if this job cannot report it"
        )
    if {"step", "value", "baseline", "rel"} <= set(ev):
        return (
            f"step {ev['step']}: {key} {ev['value']:.6g} against the baseline's {ev['baseline']:.6g}, "
            f"{ev['rel']:.2e} apart, over [numerics] {rtol_key} = {_shown(rtol)}: the candidate trains a different "
            f"job; find what changed the math, or, if this difference is acceptable, raise {rtol_key} above "
            f"{ev['rel']:.2e} in {contract.path.name}"
        )
    return (
        f"every step must log a finite {key} within [numerics] {rtol_key} = {_shown(rtol)} of the baseline's: "
        "the detail names the step that did not"
    )


def _window(check: CheckResult, contract: Contract, received: list[int] | None) -> str:
    timing = contract.timing
    total = timing.warmup_steps + timing.measure_steps
    got = step_ranges(received) if received else "none"
    if check.detail.startswith("candidate run is") or check.detail.startswith("baseline run is"):
        return (
            "the run did not finish cleanly (the detail says how): read its stderr tail in `infrarsi report` or "
            "with `infrarsi run --json` for these settings; an oom run needs less memory or a higher "
            "[resources] memory_limit_mb"
        )
    return (
        f"the job must report steps 1..{total} ([timing] warmup_steps {timing.warmup_steps} + measure_steps "
        f"{timing.measure_steps}) once each, in order; steps received: {got}. Check that the loop runs at "
        f"least {total} optimizer steps (the probe's total_steps, INFRARSI_STEPS) and numbers them from 0 or 1"
    )
