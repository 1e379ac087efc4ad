"""The baseline judged against its own contract, before it becomes the reference.

A baseline that can't support verification fails every candidate later, honest ones
included: the script enables TF32 under an fp32 contract, its evidence lacks a check the
contract requires, its window is incomplete, or its loss differs between runs by more than
``loss_rtol``. Each timed run is judged with the verifiers a candidate meets (numerics
tolerances aside), and the run-to-run spread of each trajectory is held to its tolerance.
Every problem names the contract key to change. Pure: evidence and contract in, verdicts out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from infrarsi._policy import required_checks
from infrarsi.runner import ExecutionResult
from infrarsi.verifiers import (
    BaselineReference,
    CheckResult,
    Rules,
    RunEvidence,
    compare_param_grads,
    judge_run,
    receipt_lines,
    resolve_tolerance,
)

__all__ = ["Problem", "SelfCheck", "self_check", "tolerance_that_holds"]


@dataclass(frozen=True)
class Problem:
    """One reason the baseline can't support verification: the check, the key to change, why."""

    check: str
    key: str | None
    message: str

    def to_json(self) -> dict:
        return {"check": self.check, "key": self.key, "message": self.message}


@dataclass
class SelfCheck:
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    forced: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "forced": self.forced,
            "problems": [p.to_json() for p in self.problems],
            "notes": list(self.notes),
        }


def tolerance_that_holds(spread: float) -> float:
    """A round tolerance (1, 2 or 5 x a power of ten) at least twice ``spread``: a candidate's run
    differs from the baseline's median by its own noise plus the median's."""
    need = max(2.0 * spread, 1e-12)  # finite: callers say so first
    power = 10.0 ** math.floor(math.log10(need))
    for step in (1.0, 2.0, 5.0, 10.0):
        if step * power >= need * (1 - 1e-9):
            return step * power
    return 10.0 * power


# What to change for each check the original setup fails: the contract key, and how.
_ADVICE: dict[str, tuple[str | None, str]] = {
    "integrity.protected": (
        "[scope] protected",
        "the original job changes a protected file as it runs; protect only inputs it never writes",
    ),
    "integrity.framework": (
        None,
        "the original job writes into InfraRSI's files or the Python environment; every candidate would fail too",
    ),
    "integrity.containment": (
        None,
        "the original job leaves processes running after it ends; make it wait for them (or stop starting them)",
    ),
    "timing.window": (
        "[timing] warmup_steps, measure_steps",
        "the window must fit in the steps the job runs, each step reported once, in order: lower them, "
        "or make the script run at least warmup_steps + measure_steps steps",
    ),
    "timing.clock": (
        "[task] evidence",
        "the job's own step timings disagree with InfraRSI's clock; `auto` evidence times steps without the job",
    ),
}


def _missing_evidence(check: CheckResult) -> tuple[str, str]:
    what = check.id.removeprefix("numerics.")
    how = {
        "loss": "report the loss every step (probe: p.step(loss=...); log: a [log] loss regex; auto: a "
        "loss.backward() the autoprobe sees)",
        "grad_norm": "report the gradient norm every step (probe: p.step(grad_norm=...); log: a [log] "
        "grad_norm regex); auto evidence and the probe's optimizer hook give per-parameter norms",
        "precision": "precision is seen by the probe or the autoprobe once the job steps a torch optimizer; "
        "`log` evidence can't see it",
    }[what]
    return "[numerics] require", f"no {what} evidence ({check.detail}): {how}, or drop {what!r} from the list"


def _advice(check: CheckResult) -> tuple[str | None, str]:
    if check.id.startswith("numerics.") and check.status == "unchecked":
        return _missing_evidence(check)
    if check.id == "numerics.precision":
        return (
            "[numerics] precision",
            f"the original setup itself runs below what the contract allows ({check.detail}); allow it there if "
            "the baseline is meant to run so, or stop the script enabling it (for TF32: "
            "torch.backends.cuda.matmul.allow_tf32, torch.set_float32_matmul_precision)",
        )
    if check.id.startswith("numerics."):  # tolerances aside (judged on the spread), what fails is the evidence
        what = check.id.removeprefix("numerics.")
        return "[numerics] require", (
            f"{check.detail}: the job must report {what} at every step of the window as a finite number, "
            f"or drop {what!r} from the list"
        )
    key, how = _ADVICE.get(check.id, (None, "every candidate would fail it too"))
    return key, f"{check.detail}: {how}"


def _spread_problem(check: str, key: str, rtol: float, value: float, what: str) -> Problem:
    if not math.isfinite(value):
        return Problem(
            check, key, f"the baseline's own runs give a {what} that is not a finite number: no tolerance would hold"
        )
    return Problem(
        check,
        key,
        f"the baseline's own runs differ by {value:.2e} in their {what} (relative), above the tolerance "
        f"{rtol:g}: honest candidates would fail {check}. {key.split()[-1]} = {tolerance_that_holds(value):g} "
        "would hold; or make the job deterministic (seeds, deterministic kernels, a fixed data order)",
    )


def _trajectory_problems(summary, contract) -> list[Problem]:
    problems = []
    spread = summary.reference_spread or {}
    numerics = contract.numerics
    calibration = getattr(summary, "calibration", None)
    for need, rtol, what in (("loss", numerics.loss_rtol, "loss"), ("grad_norm", numerics.grad_norm_rtol, "grad-norm")):
        rtol = resolve_tolerance(rtol, f"{need}_rtol", calibration)
        value = spread.get(need)
        if value is None or rtol is None or need not in numerics.require or value <= rtol:
            continue
        key = "[numerics] loss_rtol" if need == "loss" else "[numerics] grad_norm_rtol"
        problems.append(_spread_problem(f"numerics.{need}", key, float(rtol), value, what))
    return problems


def _grads_hold(observed: list[dict], reference: dict, rtol: float) -> bool:
    """Every timed run's sampled per-parameter gradient norms within ``rtol`` of the reference
    run's, judged exactly as a candidate's are (with the same floor for near-zero gradients)."""
    norms, rows = reference.get("param_grad_norms") or {}, reference.get("param_grad_min_rows") or {}
    for run in observed:
        for step, grads in (run.get("param_grad_norms") or {}).items():
            if step in norms:
                mins = (run.get("param_grad_min_rows") or {}).get(step)
                problem, _, _ = compare_param_grads(grads, norms[step], rtol, mins, rows.get(step))
                if problem:
                    return False
    return True


def _param_grad_problem(summary, contract, observed: list[dict]) -> Problem | None:
    rtol = resolve_tolerance(contract.numerics.grad_norm_rtol, "grad_norm_rtol", getattr(summary, "calibration", None))
    if rtol is None or "grad_norm" not in contract.numerics.require or _grads_hold(observed, summary.reference, rtol):
        return None
    key = "[numerics] grad_norm_rtol"
    for tolerance in (tolerance_that_holds(rtol * f / 2) for f in (2, 5, 10, 20, 50, 100, 200, 500, 1000)):
        if tolerance > rtol and _grads_hold(observed, summary.reference, tolerance):
            return Problem(
                "numerics.grad_norm",
                key,
                f"the baseline's own runs differ in their per-parameter gradient norms at sampled steps beyond "
                f"the tolerance {rtol:g}: honest candidates would fail numerics.grad_norm. grad_norm_rtol = "
                f"{tolerance:g} would hold; or make the job deterministic (seeds, deterministic kernels)",
            )
    return Problem(
        "numerics.grad_norm",
        key,
        f"the baseline's own runs differ in their per-parameter gradient norms at sampled steps by more than "
        f"any tolerance up to {tolerance_that_holds(rtol * 500):g}: the job is not reproducible run to run",
    )


def self_check(summary, results: list[ExecutionResult], contract, observed: list[dict] = ()) -> SelfCheck:
    """Judge the baseline's timed runs as candidates against the reference they make.

    ``observed``: each timed run's sampled per-parameter gradients (`observed_reference`), held
    against the reference run's.

    Required checks that fail or lack evidence are problems; others are notes, as is a missing
    token count (tokens/s and MFU are lost, not the verification).
    """
    rules = Rules.from_contract(contract, getattr(summary, "calibration", None))
    # Tolerances are judged on the spread across runs below, not per run against their own median.
    structural = replace(rules, loss_rtol=1e9, grad_norm_rtol=1e9)
    reference = BaselineReference.from_summary(summary.as_record())
    required = set(required_checks(contract.numerics.require))
    found = SelfCheck()
    seen: set[str] = set()
    for result in results:
        evidence = RunEvidence.from_stored(receipt_lines(result.receipts), result.evidence or {})
        for check in judge_run(evidence, reference, structural):
            if check.status in ("pass", "skipped") or check.id in seen:
                continue
            seen.add(check.id)
            key, message = _advice(check)
            if check.id in required:
                found.problems.append(Problem(check.id, key, message))
            else:
                found.notes.append(f"{check.id} ({check.status}, not required): {message}")
    problems = _trajectory_problems(summary, contract)
    grads = _param_grad_problem(summary, contract, list(observed))
    problems += [grads] if grads and not any(p.check == grads.check for p in problems) else []
    found.problems += [p for p in problems if p.check not in seen]
    if summary.runs < 2:
        found.notes.append("one timed run shows no run-to-run spread: the loss tolerance is unchecked against noise")
    if summary.tokens_per_step is None:
        found.notes.append(
            "no token count: tokens/s and MFU are not reported (set [task] tokens_per_step, or let the job's "
            "inputs be one integer tensor for auto evidence)"
        )
    return found
