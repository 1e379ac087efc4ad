"""The long runs of ``[numerics.convergence]``: the baseline and the candidate trained for the
table's ``steps`` under each seed, seed by seed, each run recorded as it ends.

A verify takes them once the short window and the A/B have passed (a candidate that is not
faster needs no long runs), or after the short window alone with ``--pairs 0``. The pairs are
judged by ``verifiers/_convergence.py``; each run is judged on its own first (integrity, the
precision at the steps the runner sampled across the whole run, a loss at every step), and the
first run that fails ends them.
"""

from __future__ import annotations

from infrarsi.contract import Candidate, long_run
from infrarsi.errors import ExecutionInterrupted
from infrarsi.verifiers import CheckResult, RunEvidence, check_convergence, judge_long_run, receipt_lines, run_losses

__all__ = ["LONG_KINDS", "convergence_check", "calibrated_margin", "margin_source"]

LONG_KINDS = {"baseline": "long-baseline", "candidate": "long-candidate"}
CHECK = "numerics.convergence"


def convergence_check(verification, rules) -> CheckResult:
    """Run the long runs for ``verification`` (a `Verification`), recording each; the check's verdict."""
    ws = verification.ws
    conv = ws.contract.convergence
    roles = (("baseline", Candidate(knobs=ws.contract.baseline_knobs())), ("candidate", verification.candidate))
    curves: dict[str, list[list[float]]] = {"baseline": [], "candidate": []}
    for seed in range(conv.seeds):
        for name, who in roles:
            contract, launched = long_run(ws.contract, who, seed)
            kind = LONG_KINDS[name]
            # A baseline that can't finish its long run leaves nothing to compare with: unchecked.
            failing = "fail" if name == "candidate" else "unchecked"
            try:
                result = ws.executor.run(contract, ws.manifest.files, launched)
            except ExecutionInterrupted as stopped:
                stopped.result.candidate = who
                verification._record(stopped.result, kind, [CheckResult(CHECK, failing, "interrupted")])
                raise
            result.candidate = who  # the seed is in the evidence's argv or knob_env, not a knob of the contract
            if result.evidence:
                result.evidence = {**result.evidence, "long_run": {"seed": seed, "steps": conv.steps}}
            verification._tick(result)
            role = f"the {name}'s long run under seed {seed}"
            if result.status != "ok":
                check = CheckResult(CHECK, failing, f"{role} is {result.status}: {result.detail or 'no detail'}")
                verification._record(result, kind, [check])
                return check
            run = RunEvidence.from_stored(receipt_lines(result.receipts), result.evidence or {})
            judged = judge_long_run(run, rules, conv.steps)
            wrong = [c for c in judged if c.status in ("fail", "unchecked")]
            if wrong:
                result.status = "rejected"
                verification._record(result, kind, judged)
                first = wrong[0]
                return CheckResult(CHECK, failing, f"{role}: {first.id} {first.status}: {first.detail}")
            verification._record(result, kind, judged)
            curves[name].append(run_losses(run, conv.steps))
    margin = calibrated_margin(conv.margin, verification.summary.get("calibration"))
    return check_convergence(
        curves["baseline"], curves["candidate"], conv.tail, rules.loss_rtol, margin, margin_source(conv.margin)
    )


def margin_source(margin) -> str:
    """How the detail names where a margin came from."""
    return (
        "the calibrated margin (the seeds' spread at `baseline`)" if margin == "calibrated" else "the contract's margin"
    )


def calibrated_margin(margin, calibration: dict | None) -> float | None:
    """The table's margin as a number: itself, the calibration's for ``"calibrated"``, or None (the
    seeds' spread at verify time) where the calibration found none."""
    if margin != "calibrated":
        return margin
    found = (calibration or {}).get("margin")
    return float(found) if isinstance(found, (int, float)) and not isinstance(found, bool) and found > 0 else None
