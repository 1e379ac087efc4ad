"""Evidence as `infrarsi audit` reads it back from a ledger: blobs, contracts, baselines, sources.

Everything is parsed once and cached by content hash. The source checks (``scope.*``,
``audit.*``) of each distinct (patches, pre-images, contract scope) are judged once,
the misses of a chunk of rows in parallel worker processes, or taken as stored where
today's exact rule code gave them.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
from collections import OrderedDict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from infrarsi._policy import VERDICT_VERSION
from infrarsi.auditors import audit_check_ids, check_sources
from infrarsi.contract import Contract, PatchRef, parse_contract
from infrarsi.errors import ContractError, PatchRejected
from infrarsi.ledger import Ledger, LedgerError
from infrarsi.runner import apply_to
from infrarsi.verifiers import BaselineReference, CheckResult, RunEvidence, check_scope, receipt_lines

__all__ = ["Evidence", "SourceJudge", "RUN_IDS", "SCOPE_IDS", "missing", "run_evidence", "source_key", "stored_sources"]

SCOPE_IDS = ("scope.parse", "scope.binary", "scope.editable", "scope.created", "scope.protected")
RUN_IDS = (
    "integrity.protected",
    "integrity.framework",
    "integrity.containment",
    "timing.window",
    "timing.clock",
    "numerics.loss",
    "numerics.grad_norm",
    "numerics.precision",
)


class Evidence:
    """Blobs, contracts and baselines read from the ledger, each parsed once."""

    def __init__(self, ledger: Ledger, contract_override: Contract | None, workspace: Path) -> None:
        self.ledger, self.override, self.workspace = ledger, contract_override, workspace
        self.baselines = ledger.baseline_ids()
        self.contract = functools.lru_cache(maxsize=64)(self._contract)
        self.reference = functools.lru_cache(maxsize=64)(self._reference)
        self.summary = functools.lru_cache(maxsize=64)(self._summary)
        # A/B rows are read twice in a row (re-timed for their batch, then judged): parse once.
        self.run = functools.lru_cache(maxsize=4)(self._run)

    def blob(self, digest: str | None) -> bytes | None:
        if not digest:
            return None
        try:
            return self.ledger.get_blob(digest)
        except LedgerError:
            return None  # altered: reported once by the blob scan; as evidence it is missing

    def _contract(self, digest: str | None) -> Contract | str:
        if self.override is not None:
            return self.override
        data = self.blob(digest)
        if data is None:
            return f"the contract {str(digest)[:16]}... is not in the ledger"
        try:
            return parse_contract(data.decode("utf-8", "replace"), self.workspace / "infrarsi.toml", check_files=False)
        except ContractError as exc:
            return f"the stored contract does not parse under today's rules: {exc}"

    def baseline_for(self, row: dict) -> int | None:
        if row.get("baseline_id") is not None:
            return row["baseline_id"]
        if row.get("kind") in ("baseline", "calibration", "calibration-long"):  # judged against their own batch's
            return next((i for i, batch, _ in self.baselines if batch == row.get("batch")), None)
        # Written before rows named their baseline: the newest one recorded before the row.
        earlier = [i for i, _, created in self.baselines if created <= row.get("created_at", "")]
        return earlier[-1] if earlier else None

    def _summary(self, baseline_id: int | None) -> dict | None:
        """A stored baseline's summary, or None where it can't be read."""
        try:
            stored = self.ledger.baseline(baseline_id) if baseline_id is not None else None
        except LedgerError:
            return None
        return stored["summary"] if stored else None

    def _run(self, receipts_hash: str | None, evidence_hash: str | None) -> RunEvidence | str:
        """One execution's receipts and the runner's evidence, or why they can't be read."""
        receipts = self.blob(receipts_hash)
        if receipts is None:
            return "the receipts are not in the ledger" if receipts_hash else "no receipts were recorded"
        stored = self.blob(evidence_hash)
        if stored is None:
            return "the runner's evidence (clock stamps, integrity) is not in the ledger"
        return RunEvidence.from_stored(receipt_lines(receipts), json.loads(stored))

    def _reference(self, baseline_id: int | None) -> BaselineReference | str:
        if baseline_id is None:
            return "no baseline recorded before this execution"
        try:
            stored = self.ledger.baseline(baseline_id)
        except LedgerError as exc:
            return str(exc)
        if stored is None:
            return f"baseline {baseline_id} is not in the ledger"
        return BaselineReference.from_summary(stored["summary"])


def _source_checks(
    patches: tuple[tuple[str, str], ...],
    files: tuple[tuple[str, bytes], ...],
    editable: tuple[str, ...],
    protected: tuple[str, ...],
    precision: tuple[str, ...],
) -> tuple[CheckResult, ...]:
    """scope.* and audit.* of one (patches, pre-images, contract scope); runs in a worker process."""
    checks = check_scope(dict(patches), list(editable), list(protected))
    if any(c.id == "scope.parse" and not c.passed for c in checks):
        return tuple(checks) + tuple(
            CheckResult(cid, "unchecked", "the patch does not parse; nothing to audit") for cid in audit_check_ids()
        )
    refs = tuple(PatchRef(name, text) for name, text in patches)
    try:
        sources = apply_to(dict(files), refs)
    except PatchRejected as exc:
        return tuple(checks) + tuple(CheckResult(cid, "fail", f"cannot audit: {exc}") for cid in audit_check_ids())
    return tuple(checks) + tuple(check_sources(sources, list(precision), list(protected)))


def missing(ids, why: str) -> list[CheckResult]:
    return [CheckResult(cid, "unchecked", why) for cid in ids]


def run_evidence(ev: Evidence, row: dict) -> RunEvidence | str:
    return ev.run(row.get("receipts_hash"), row.get("evidence_hash"))


def source_key(row: dict, contract: Contract) -> tuple:
    """What the source checks of a row depend on, by content hash: judged once per distinct key."""
    patches = tuple((p.get("name", "?"), p.get("sha256")) for p in row.get("patches") or [])
    files = tuple(sorted((row.get("sources") or {}).items()))
    return (
        patches,
        files,
        tuple(contract.scope.editable),
        tuple(contract.protected_globs),
        tuple(contract.numerics.precision),
    )


def stored_sources(row: dict) -> tuple[CheckResult, ...] | None:
    """The row's own scope.* and audit.* verdicts, when today's exact rule code gave them.

    The version names the rule sets and the digest of their code, so an equal version means
    re-running them on this content gives these verdicts; the row (verdicts, patch and
    pre-image hashes) is covered by the verified chain.
    """
    if row.get("rule_version") != VERDICT_VERSION:
        return None
    stored = {v.get("id"): v for v in row.get("verdicts") or [] if isinstance(v, dict)}
    ids = SCOPE_IDS + audit_check_ids()
    if not all(i in stored and stored[i].get("status") in ("pass", "fail", "unchecked") for i in ids):
        return None
    return tuple(CheckResult(i, stored[i]["status"], stored[i].get("detail", "")) for i in ids)


class SourceJudge:
    """scope.* and audit.* by content, computed once per key, the misses of a chunk of rows in parallel."""

    LIMIT = 50_000  # results kept (an LRU): bounded memory however many distinct patches a ledger holds

    def __init__(self, ev: Evidence, workers: int) -> None:
        self.ev, self.workers = ev, workers
        self.reused = self.rejudged = 0
        self.results: OrderedDict[tuple, tuple[CheckResult, ...]] = OrderedDict()
        self._pool = None

    def _inputs(self, key: tuple) -> tuple[tuple | None, tuple[CheckResult, ...] | None]:
        """``(the worker's arguments, None)``, or ``(None, the verdicts)`` when evidence is missing."""
        (patches, files, editable, protected, precision) = key
        texts = []
        for name, digest in patches:
            data = self.ev.blob(digest)
            if data is None:
                return None, tuple(missing(SCOPE_IDS + audit_check_ids(), f"patch {name!r} is not in the ledger"))
            texts.append((name, data.decode("utf-8", "replace")))
        images = []
        for path, digest in files:
            data = self.ev.blob(digest)
            if data is None:
                return None, tuple(check_scope(dict(texts), list(editable), list(protected))) + tuple(
                    missing(audit_check_ids(), f"the pre-image of {path} is not in the ledger")
                )
            images.append((path, data))
        return (tuple(texts), tuple(images), editable, protected, precision), None

    def seed(self, key: tuple, stored: tuple[CheckResult, ...]) -> None:
        """Take a row's stored source verdicts for its content (see stored_sources)."""
        if key not in self.results:
            self._keep(key, stored)
            self.reused += 1

    def prefetch(self, keys: list[tuple]) -> None:
        todo = [k for k in dict.fromkeys(keys) if k not in self.results]
        self.rejudged += len(todo)
        jobs = {}
        for key in todo:
            job, verdicts = self._inputs(key)
            if job is None:
                self._keep(key, verdicts)
            else:
                jobs[key] = job
        if len(jobs) >= 8 and self.workers > 1:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("fork"))
            futures = {key: self._pool.submit(_source_checks, *job) for key, job in jobs.items()}
            for key, future in futures.items():
                self._keep(key, future.result())
        else:
            for key, job in jobs.items():
                self._keep(key, _source_checks(*job))

    def _keep(self, key: tuple, result: tuple[CheckResult, ...]) -> None:
        self.results[key] = result
        if len(self.results) > self.LIMIT:
            self.results.popitem(last=False)

    def get(self, key: tuple) -> list[CheckResult]:
        if key not in self.results:
            self.prefetch([key])
        self.results.move_to_end(key)
        return list(self.results[key])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
