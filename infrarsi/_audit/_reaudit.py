"""`infrarsi audit LEDGER.db`: re-verify every stored execution with today's rules.

From the ledger file alone (plus, beside it, the manifest for a trusted key and the
receipts): the chain, every blob and signature, then each execution re-judged by the
current verifiers and auditors over its stored evidence, against the contract stored
with it (or a newer one) and the baseline it was compared with. Missing evidence is a
finding (`unchecked`), never a silent pass. Rows are streamed; the source checks of each
distinct (patches, pre-images, contract scope) are computed once, by content hash.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from infrarsi._audit._batches import Batches
from infrarsi._audit._revisions import revision_problems
from infrarsi._audit._stored import (
    RUN_IDS,
    SCOPE_IDS,
    Evidence,
    SourceJudge,
    missing,
    run_evidence,
    source_key,
    stored_sources,
)
from infrarsi._longruns import LONG_KINDS
from infrarsi._manifest import trusted_key as trusted_key_of
from infrarsi._policy import VERDICT_VERSION
from infrarsi.auditors import audit_check_ids
from infrarsi.contract import Contract
from infrarsi.errors import UsageError
from infrarsi.ledger import Ledger, LedgerError
from infrarsi.verifiers import BaselineReference, CheckResult, Rules, judge_long_run, judge_run

__all__ = ["AuditReport", "audit_ledger"]

_JUDGED = ("ok", "rejected")  # oom / crash / timeout rows have no complete evidence by nature
_CHUNK = 2_000  # rows held at once: their distinct sources are judged together, in parallel


@dataclass
class AuditReport:
    executions: int = 0
    previously_accepted: int = 0
    still_rejected: int = 0
    now_rejected: int = 0
    rejected_only_by_numerics: int = 0
    chain_ok: bool = True
    chain: list[str] = field(default_factory=list)
    first_bad: int | None = None
    findings: list[dict] = field(default_factory=list)
    changed: list[dict] = field(default_factory=list)
    by_check: dict[str, Counter] = field(default_factory=dict)
    by_status: Counter = field(default_factory=Counter)
    receipts: dict = field(default_factory=lambda: {"checked": 0, "bad": []})
    trusted_key: str | None = None
    reused: int = 0  # source verdicts taken as stored: given by today's exact rule code
    rejudged: int = 0  # distinct sources judged afresh
    incomplete: list[dict] = field(default_factory=list)  # verify batches cut short: they claim nothing

    @property
    def clean(self) -> bool:
        return self.chain_ok and not self.findings

    def to_json(self) -> dict:
        """DESIGN.md's `audit --json` shape, plus what changed and the per-check tally."""
        return {
            "executions": self.executions,
            "previously_accepted": self.previously_accepted,
            "still_rejected": self.still_rejected,
            "now_rejected": self.now_rejected,
            "rejected_only_by_numerics": self.rejected_only_by_numerics,
            "chain_ok": self.chain_ok,
            "chain": self.chain,
            "first_bad": self.first_bad,
            "findings": self.findings,
            "changed": self.changed,
            "rule_version": VERDICT_VERSION,
            "by_check": {k: dict(v) for k, v in sorted(self.by_check.items())},
            "by_status": dict(self.by_status),
            "receipts": self.receipts,
            "trusted_key": self.trusted_key,
            "sources": {"reused": self.reused, "rejudged": self.rejudged},
            "incomplete_batches": self.incomplete,
        }


def _judge(ev: Evidence, sources: SourceJudge, row: dict) -> list[CheckResult]:
    """Every check today's rules make of one stored execution."""
    contract = ev.contract(row.get("contract_hash"))
    if isinstance(contract, str):
        return missing(SCOPE_IDS + audit_check_ids() + RUN_IDS, contract)
    checks = sources.get(source_key(row, contract))
    if row.get("kind") == "proposal":
        # A search screening a proposed patch (scope and audit only): a patch, never a run.
        return checks + [CheckResult(cid, "skipped", "a proposal: screened, never run itself") for cid in RUN_IDS]
    if row["status"] == "rejected" and not row.get("receipts_hash") and not row.get("evidence_hash"):
        # Stopped by a check before it ran (scope, manifest, audit): there is no run to judge.
        return checks + [CheckResult(cid, "skipped", "never ran: rejected before running") for cid in RUN_IDS]
    run = run_evidence(ev, row)
    if isinstance(run, str):
        return checks + missing(RUN_IDS, run)
    baseline_id = ev.baseline_for(row)
    reference = ev.reference(baseline_id)
    rules = Rules.from_contract(contract, (ev.summary(baseline_id) or {}).get("calibration"))
    if isinstance(reference, str):
        judged = judge_run(run, BaselineReference(loss=[], grad_norm=[], tokens_per_step=None), rules)
        return checks + [
            c
            if not c.id.startswith("numerics.") or c.status == "skipped"
            else CheckResult(c.id, "unchecked", reference)
            for c in judged
        ]
    if row.get("kind") in (*LONG_KINDS.values(), "calibration-long"):
        # A long run under its own seed: judged on its own, the pairs by their batch (Batches).
        if contract.convergence is None:
            return checks + missing(RUN_IDS, "a long run, and its contract has no [numerics.convergence]")
        return checks + judge_long_run(run, rules, contract.convergence.steps)
    return checks + judge_run(run, reference, rules)


def _failing(checks: list[CheckResult]) -> list[CheckResult]:
    return [c for c in checks if c.status in ("fail", "unchecked")]


def audit_ledger(
    ledger_path: str | Path,
    contract_path: str | Path | None = None,
    trusted_key: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    workers: int | None = None,
    reuse: bool = True,
) -> AuditReport:
    """Re-verify a ledger: chain, blobs, signatures, receipts, then every execution re-judged.

    ``workers`` processes judge the distinct sources of each chunk of rows (default: one per
    CPU). ``reuse=False`` re-judges every source even where today's exact rule code stored
    the verdict (see stored_sources); the verifiers re-judge every run either way.
    """
    path = Path(ledger_path)
    if not path.is_file():
        raise UsageError(f"{path}: no ledger there (expected a ledger.db written by infrarsi)")
    override = None
    if contract_path is not None:
        from infrarsi.contract import load_contract

        override = load_contract(contract_path)
    trusted = trusted_key_of(path.parent, trusted_key)
    key, problem = trusted.key, trusted.problem
    report = AuditReport(trusted_key=key)
    if problem:
        report.chain_ok = False
        report.chain.append(problem)
    with Ledger.open(path) as ledger:
        receipted = _check_chain(ledger, report, path)
        ev = Evidence(ledger, override, path.parent.parent)
        sources = SourceJudge(ev, workers if workers is not None else (os.cpu_count() or 1))
        total = ledger.count()
        batches = Batches(ev)
        try:
            for chunk in _chunks(ledger.executions(), _CHUNK):
                judged = [(row, ev.contract(row.get("contract_hash"))) for row in chunk]
                if reuse and override is None:
                    for row, contract in judged:
                        stored = stored_sources(row) if isinstance(contract, Contract) else None
                        if stored is not None:
                            sources.seed(source_key(row, contract), stored)
                sources.prefetch(
                    [source_key(row, c) for row, c in judged if row["status"] in _JUDGED and isinstance(c, Contract)]
                )
                for row, contract in judged:
                    report.executions += 1
                    report.by_status[row["status"]] += 1
                    if progress and (report.executions % 200 == 0 or report.executions == total):
                        progress(report.executions, total)
                    for anchor, check in batches.add(row, contract):
                        _record_batch(report, anchor, check, receipted)
                    if row["status"] in _JUDGED:
                        _record(report, row, _judge(ev, sources, row))
            for anchor, check in batches.flush():
                _record_batch(report, anchor, check, receipted)
        finally:
            sources.close()
            report.reused, report.rejudged = sources.reused, sources.rejudged
            report.incomplete = batches.incomplete
    return report


def _chunks(rows: Iterator[dict], size: int) -> Iterator[list[dict]]:
    chunk: list[dict] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _check_chain(ledger: Ledger, report: AuditReport, path: Path) -> set[int]:
    """Chain, blobs, baselines, receipts; returns the executions the valid-looking receipts cite."""
    chain = ledger.verify_chain(report.trusted_key)
    if not chain.ok:
        report.chain_ok, report.first_bad = False, chain.first_bad
        report.chain.append(chain.detail)
    if report.trusted_key is None:
        report.chain.append(
            "no trusted key outside the ledger (no manifest beside it, no --key): a swapped key cannot be detected"
        )
    for digest, kind in ledger.altered_blobs():
        report.chain_ok = False
        report.chain.append(f"blob {digest[:16]}... ({kind}) no longer matches its hash: altered")
    problems = revision_problems(ledger, report.trusted_key or ledger.public_key, path.parent)
    if problems:
        report.chain_ok = False
        report.chain += problems
    for baseline_id, _, _ in ledger.baseline_ids():
        try:
            ledger.baseline(baseline_id)
        except LedgerError as exc:
            report.chain_ok = False
            report.chain.append(str(exc))
    from infrarsi._receipt import verify_receipt

    key = report.trusted_key or ledger.public_key
    receipted: set[int] = set()
    for receipt in sorted((path.parent / "receipts").glob("*.json")):
        report.receipts["checked"] += 1
        check = verify_receipt(receipt, trusted_public_hex=key)
        try:
            receipted.update(json.loads(receipt.read_bytes())["receipt"]["executions"])
        except (ValueError, KeyError, TypeError):
            pass  # verify_receipt has said what is wrong with it
        if not check.ok:
            report.chain_ok = False
            report.receipts["bad"].append({"receipt": receipt.name, "problems": check.problems})
            report.chain.append(f"receipt {receipt.name}: {'; '.join(check.problems)}")
    return receipted


def _record(report: AuditReport, row: dict, checks: list[CheckResult]) -> None:
    stored = {v.get("id"): v for v in row.get("verdicts") or [] if isinstance(v, dict)}
    was_accepted = (
        bool(stored)
        and row["status"] == "ok"
        and not any(v.get("status") in ("fail", "unchecked") for v in stored.values())
    )
    failing = _failing(checks)
    for check in checks:
        report.by_check.setdefault(check.id, Counter())[check.status] += 1
        before = stored.get(check.id)
        if before is not None and before.get("status") != check.status:
            report.changed.append(
                {
                    "execution": row["id"],
                    "check": check.id,
                    "was": before.get("status"),
                    "now": check.status,
                    "stored_rule_version": row.get("rule_version"),
                    "detail": check.detail,
                }
            )
    if row["status"] == "rejected":  # rejected when stored: today's failures only confirm it
        if failing:
            report.still_rejected += 1
        return
    for check in failing:
        report.findings.append(
            {"execution": row["id"], "check": check.id, "status": check.status, "detail": check.detail}
        )
    if was_accepted:
        report.previously_accepted += 1
        if failing:
            report.now_rejected += 1
            if all(c.id.startswith("numerics.") for c in failing):
                report.rejected_only_by_numerics += 1


_CLAIMS = {"stats.speedup": "speedup", "numerics.convergence": "convergence"}


def _record_batch(report: AuditReport, anchor: int, check: CheckResult, receipted: set[int]) -> None:
    """A check of one verify batch (stats.speedup, numerics.convergence); a finding only where a receipt claimed it."""
    report.by_check.setdefault(check.id, Counter())[check.status] += 1
    if check.status in ("fail", "unchecked") and anchor in receipted:
        report.findings.append(
            {
                "execution": anchor,
                "check": check.id,
                "status": check.status,
                "detail": f"the receipt's {_CLAIMS.get(check.id, check.id)} no longer holds: {check.detail}",
            }
        )
