"""`infrarsi verify`: the full check of one candidate, cheapest evidence first.

Order: scope, the manifest and the source audit (no run), then one candidate run judged for
integrity, timing and numerics against the stored baseline, then back-to-back
baseline/candidate pairs for ``stats.speedup``: ``ab_pairs`` of them, then one more at a time
while the speedup's interval straddles ``min_speedup``, up to ``ab_max_pairs`` (the sequential
A/B of ``verifiers/_sequential.py``). The first family that
fails stops the rest (their checks are reported ``skipped``). Every execution is
recorded with the verdicts it earned; an accepted candidate gets a signed receipt.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from infrarsi._hashing import hash_protected
from infrarsi._longruns import convergence_check
from infrarsi._next import next_steps
from infrarsi._policy import VERDICT_VERSION, required_checks
from infrarsi._revision import check_baseline_current
from infrarsi._workspace import Workspace, open_workspace
from infrarsi.auditors import audit_check_ids, check_sources
from infrarsi.contract import Candidate, parse_sets, resolve_candidate
from infrarsi.errors import ExecutionInterrupted, PatchParseError, PatchRejected, UsageError
from infrarsi.runner import ExecutionResult, changed_sources, pre_images
from infrarsi.verifiers import (
    BaselineReference,
    CheckResult,
    Rules,
    RunEvidence,
    SequentialPlan,
    ab_order,
    check_manifest,
    check_scope,
    check_speedup,
    judge_run,
    receipt_lines,
    run_looks,
)

__all__ = ["VerifyOutcome", "Verification", "verify", "stored_step_time", "rules_for"]


@dataclass
class VerifyOutcome:
    accepted: bool
    candidate: dict
    checks: list[CheckResult]
    speedup: dict | None
    receipt: Path | None
    executions: list[int]
    next: list[dict] = field(default_factory=list)  # {"check", "next"} for each check that failed

    def to_json(self) -> dict:
        """The DESIGN.md shape of `verify --json`, and the next step for each failed check."""
        return {
            "accepted": self.accepted,
            "candidate": self.candidate,
            "checks": [c.to_json() for c in self.checks],
            "speedup": self.speedup,
            "receipt": str(self.receipt) if self.receipt else None,
            "next": self.next,
        }


def _run_evidence(result: ExecutionResult) -> RunEvidence:
    return RunEvidence.from_stored(receipt_lines(result.receipts), result.evidence or {})


def stored_step_time(summary: dict) -> tuple[float, float | None] | None:
    """The stored baseline's (median step time, run-to-run CV) when it is on the runner's clock."""
    step = summary.get("step_time_s") or {}
    if summary.get("step_clock") != "runner" or not isinstance(step.get("median"), (int, float)):
        return None
    return float(step["median"]), step.get("cv")


def rules_for(contract, summary: dict) -> Rules:
    """The contract's rules, a ``"calibrated"`` tolerance taken from the stored baseline's calibration;
    a UsageError (exit 2) where the contract asks for one and the baseline holds none."""
    rules = Rules.from_contract(contract, summary.get("calibration"))
    missing = [key for key in ("loss_rtol", "grad_norm_rtol") if getattr(rules, key) is None]
    if missing:
        raise UsageError(
            f'{contract.path}: [numerics] {" and ".join(missing)} = "calibrated", and the stored baseline holds '
            "no calibration; run `infrarsi baseline --calibrate` (or give a number)"
        )
    return rules


def _status_check(result: ExecutionResult, role: str) -> CheckResult | None:
    if result.status == "ok" and result.step_time_s is not None:
        return None
    return CheckResult("timing.window", "fail", f"{role} run is {result.status}: {result.detail or 'no detail'}")


def _failed(checks: list[CheckResult]) -> bool:
    return any(c.status in ("fail", "unchecked") for c in checks)


def _skipped_rest(checks: list[CheckResult], reason: str, required: tuple[str, ...]) -> list[CheckResult]:
    seen = {c.id for c in checks}
    return checks + [CheckResult(cid, "skipped", reason) for cid in required if cid not in seen]


def verify(
    contract_path: str | Path = "infrarsi.toml",
    sets: list[str] | dict[str, str] | None = None,
    patches: list[str] | None = None,
    pairs: int | None = None,
    progress: Callable[[int, int, ExecutionResult | None], None] | None = None,
    keep_going: bool = False,
    max_pairs: int | None = None,
    executor_flags: dict | None = None,
) -> VerifyOutcome:
    """Check one candidate (knob settings + patches) fully; accepted only when every check passes.

    ``pairs`` A/B pairs come before the first look (default: the contract's ``ab_pairs``); more
    follow one at a time while undecided, up to ``max_pairs`` (default: the contract's
    ``ab_max_pairs``, and where it has none, ``pairs``: one look), never fewer than ``pairs``.

    ``keep_going`` runs the candidate even when a check before the run failed, so every
    layer's verdict is seen (diagnosis, and the corpus tests); it never accepts more.

    ``executor_flags``: [executor] keys replaced for this verify; those that decide the hardware
    must be the ones the stored baseline was measured with.
    """
    with open_workspace(contract_path, executor_flags=executor_flags) as ws:
        values = sets if isinstance(sets, dict) else parse_sets(sets)
        candidate = resolve_candidate(ws.contract, values, patches)
        stored = ws.ledger.latest_baseline()
        if stored is None:
            raise UsageError(f"{ws.contract.path}: no baseline recorded; run `infrarsi baseline` first")
        check_baseline_current(ws.ledger, ws.manifest, stored, ws.contract)
        pairs = ws.contract.search.ab_pairs if pairs is None else pairs
        if pairs < 0:
            raise UsageError(f"--pairs {pairs}: expected 0 (correctness checks only) or more")
        if max_pairs is not None and max_pairs < 2:
            raise UsageError(f"--max-pairs {max_pairs}: expected 2 or more")
        most = max(pairs, (ws.contract.search.ab_max_pairs or pairs) if max_pairs is None else max_pairs)
        return Verification(ws, candidate, stored, pairs, progress, keep_going, max_pairs=most, long_runs=True).run()


class Verification:
    """One candidate's checks against a stored baseline (``{"summary", "id"}``), each execution
    recorded as it ends: `verify` runs it whole; the search runs it with ``pairs=0`` to judge an
    exploration run and whole to promote (``batch`` and ``kind`` name the rows it writes).
    ``long_runs`` takes ``[numerics.convergence]``'s long runs where the contract has the table;
    unset, wherever there is an A/B (`verify` and promotion, never an exploration run)."""

    def __init__(
        self,
        ws: Workspace,
        candidate: Candidate,
        baseline: dict,
        pairs: int,
        progress,
        keep_going: bool = False,
        batch: str | None = None,
        kind: str = "verify",
        max_pairs: int | None = None,
        long_runs: bool | None = None,
    ) -> None:
        self.ws, self.candidate, self.pairs = ws, candidate, pairs
        conv = ws.contract.convergence
        wanted = pairs > 0 if long_runs is None else long_runs
        self.long_runs = conv.runs if wanted and conv is not None else 0
        self.required = required_checks(ws.contract.numerics.require, convergence=bool(self.long_runs))
        self.max_pairs = 0 if pairs == 0 else max(pairs, max_pairs or pairs)
        self.summary, self.baseline_id = baseline["summary"], baseline["id"]
        self.keep_going = keep_going
        self.progress = progress
        self.batch = batch or uuid.uuid4().hex
        self.kind = kind
        self.executions: list[int] = []
        self.candidate_result: ExecutionResult | None = None  # the candidate's own run, once it ran
        self.seq = 0
        self.total = 1 + 2 * self.max_pairs + self.long_runs
        self.done = 0

    def _tick(self, result: ExecutionResult | None) -> None:
        self.done += 1
        if self.progress:
            self.progress(self.done, self.total, result)

    def _record(self, result: ExecutionResult, kind: str, checks: list[CheckResult]) -> int:
        # The batch's plan, in the (chained) evidence of every row that ran: a batch cut short
        # (SIGKILL, a lost machine) then shows as fewer rows than planned, not as a finished
        # verify. A row stopped before running has no evidence, and ends its batch by verdict.
        if result.evidence:
            result.evidence = {
                **result.evidence,
                "plan": {
                    "runs": self.total,
                    "ab_pairs": self.pairs,
                    "ab_max_pairs": self.max_pairs,
                    "long_runs": self.long_runs,
                },
            }
        execution = self.ws.record(
            result,
            kind=kind,
            batch=self.batch,
            seq=self.seq,
            verdicts=[c.to_json() for c in checks],
            rule_version=VERDICT_VERSION,
            baseline_id=self.baseline_id,
        )
        self.seq += 1
        self.executions.append(execution)
        return execution

    def _finish(self, checks, speedup=None, receipt=None) -> VerifyOutcome:
        accepted = receipt is not None
        described = self.candidate.describe()
        received = None
        if self.candidate_result is not None:
            received = [s.step for s in _run_evidence(self.candidate_result).steps]
        steps = (
            [] if accepted else next_steps(checks, self.ws.contract, described["knobs"], described["patches"], received)
        )
        return VerifyOutcome(accepted, described, checks, speedup, receipt, self.executions, steps)

    def run(self) -> VerifyOutcome:
        contract, ws = self.ws.contract, self.ws
        if self.progress:
            self.progress(0, self.total, None)
        checks = self.before_run()
        if _failed(checks) and not self.keep_going:
            result = ExecutionResult(
                self.candidate,
                "rejected",
                detail="rejected before running: " + "; ".join(c.detail for c in checks if not c.passed),
                sources=pre_images(contract.workspace, self.candidate.patches),
            )
            self._record(result, self.kind, checks)
            return self._finish(_skipped_rest(checks, "not reached: an earlier check failed", self.required))

        rules = rules_for(contract, self.summary)
        reference = BaselineReference.from_summary(self.summary)
        with self._hold():
            result, run_checks = self._run_judged(
                self.candidate, self.kind, "the candidate", rules, reference, recorded_with=checks
            )
            self.candidate_result = result
            if _failed(run_checks) or (self.keep_going and _failed(checks)):
                return self._finish(_skipped_rest(checks, "not reached: an earlier check failed", self.required))
            if self.pairs == 0:  # correctness only: never a receipt
                if self.long_runs:
                    checks.append(convergence_check(self, rules))
                return self._finish(
                    _skipped_rest(checks, "not run: --pairs 0 asks for the correctness checks only", self.required)
                )
            base_times, cand_times = self._ab(rules, reference, checks)
        if base_times is None:
            return self._finish(_skipped_rest(checks, "not reached: an A/B run failed", self.required))
        stat, estimate = check_speedup(
            base_times,
            cand_times,
            float(contract.search.min_speedup),
            self.pairs,
            stored=stored_step_time(self.summary),
            drift_floor=float(contract.search.drift_tolerance),
            max_pairs=self.max_pairs,
        )
        checks.append(stat)
        speedup = estimate.to_json() if estimate else None
        if self.long_runs and stat.passed and not _failed(checks):
            with self._hold():
                checks.append(convergence_check(self, rules))
        if not stat.passed or not all(c.passed for c in checks if c.id in self.required):
            return self._finish(_skipped_rest(checks, "not reached: an earlier check failed", self.required), speedup)
        from infrarsi._receipt import write_receipt

        receipt = write_receipt(
            ws,
            self.candidate,
            checks,
            estimate,
            base_times,
            cand_times,
            self.executions,
            result.evidence.get("fingerprint", {}),
            self.summary,
        )
        return self._finish(checks, speedup, receipt)

    def before_run(self) -> list[CheckResult]:
        """The checks that need no run: scope, the manifest, then (unless those failed) the audit."""
        contract, ws = self.ws.contract, self.ws
        checks = check_scope(
            {p.name: p.text for p in self.candidate.patches},
            list(contract.scope.editable),
            list(contract.protected_globs),
        )
        checks.append(
            check_manifest(
                ws.manifest.body,
                ws.manifest.signature,
                contract.sha256,
                ws.ledger.public_key,
                hash_protected(contract.workspace, contract.protected_globs),
            )
        )
        if self.keep_going or not _failed(checks):
            checks += self._audit()
        return checks

    def _hold(self):
        """The batch's runs on one allocation where the executor holds them (Slurm: the candidate
        run and every A/B pair on one node); a run of correctness checks only needs none."""
        inner = getattr(self.ws.executor, "inner", self.ws.executor)
        hold = getattr(inner, "allocation", None)
        return hold(self.ws.contract) if hold and self.pairs > 0 else nullcontext()

    def _audit(self) -> list[CheckResult]:
        """audit.*: the source rules over the Python files the patches change (no run needed)."""
        contract = self.ws.contract
        try:
            sources = changed_sources(contract.workspace, self.candidate.patches)
        except (PatchRejected, PatchParseError) as exc:
            return [CheckResult(cid, "fail", f"cannot audit: {exc}") for cid in audit_check_ids()]
        return check_sources(sources, contract.numerics.precision, contract.protected_globs)

    def _ab(self, rules: Rules, reference: BaselineReference, checks: list[CheckResult]):
        """Interleaved pairs (B A A B ...): drift over the batch cancels within each pair. After
        ``pairs`` pairs, a look after each pair; the first look that decides ends the A/B."""
        ws = self.ws
        search = ws.contract.search
        plan = SequentialPlan(max(self.pairs, 2), max(self.pairs, self.max_pairs, 2))
        baseline = Candidate(knobs=ws.contract.baseline_knobs())
        times = {"B": [], "A": []}
        for index, role in enumerate(ab_order(self.max_pairs)):
            if index % 2 == 0 and len(times["B"]) >= plan.min_pairs:
                decided = run_looks(
                    times["B"],
                    times["A"],
                    float(search.min_speedup),
                    plan,
                    stored_step_time(self.summary),
                    float(search.drift_tolerance),
                )
                if decided.status != "undecided":
                    break
            who, name = (baseline, "baseline") if role == "B" else (self.candidate, "candidate")
            result, judged = self._run_judged(
                who, f"ab-{name}", f"A/B pair {index // 2 + 1}: the {name}", rules, reference
            )
            if _failed(judged):
                checks += [c for c in judged if not c.passed]
                return None, None
            times[role].append(result.step_time_s)
        return times["B"], times["A"]

    def _run_judged(
        self,
        who: Candidate,
        kind: str,
        role: str,
        rules: Rules,
        reference: BaselineReference,
        recorded_with: list[CheckResult] | None = None,
    ) -> tuple[ExecutionResult, list[CheckResult]]:
        """Run ``who`` once, judge it, and record it with its verdicts (``recorded_with`` + this run's).

        A run that finished but failed a check is recorded as ``rejected``.
        """
        ws = self.ws
        try:
            result = ws.executor.run(ws.contract, ws.manifest.files, who)
        except ExecutionInterrupted as stopped:
            self._record(stopped.result, kind, (recorded_with or []) + [_status_check(stopped.result, role)])
            raise
        self._tick(result)
        failed = _status_check(result, role)
        judged = [failed] if failed else judge_run(_run_evidence(result), reference, rules)
        if recorded_with is not None:
            recorded_with += judged
        if _failed(judged if recorded_with is None else recorded_with) and result.status == "ok":
            result.status = "rejected"
        self._record(result, kind, judged if recorded_with is None else recorded_with)
        return result, judged
