"""A workspace: its contract, manifest, keys and ledger, open for the stages to record executions.

Only a workspace writes the ledger; each execution is recorded the moment it ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infrarsi._manifest import MANIFEST_NAME, Manifest, load_manifest
from infrarsi.contract import Candidate, Contract, load_contract, with_executor_flags
from infrarsi.errors import ExecutionInterrupted, ManifestError, UsageError
from infrarsi.ledger import KeyPair, Ledger, canonical_json, sha256_hex
from infrarsi.runner import ExecutionResult, Executor, executor_for

__all__ = ["Workspace", "open_workspace", "LEDGER_NAME", "KEYS_DIR", "RECEIPTS_DIR", "STATE_ENTRIES"]

LEDGER_NAME = "ledger.db"
KEYS_DIR = "keys"
RECEIPTS_DIR = "receipts"
STATE_ENTRIES = (LEDGER_NAME, LEDGER_NAME + "-wal", LEDGER_NAME + "-shm", MANIFEST_NAME, KEYS_DIR, RECEIPTS_DIR)


@dataclass
class Workspace:
    """An initialised workspace, open for recording executions."""

    contract: Contract
    manifest: Manifest
    key: KeyPair
    ledger: Ledger
    executor: Executor

    def close(self) -> None:
        self.ledger.close()

    def __enter__(self) -> "Workspace":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def execute(
        self, candidate: Candidate, kind: str, batch: str, seq: int = 0, sample_all: bool = False
    ) -> tuple[int, ExecutionResult]:
        """Run one execution and commit it to the ledger before returning (interrupted ones too).

        ``sample_all`` observes every step closely (the baseline's reference run)."""
        try:
            result = self.executor.run(self.contract, self.manifest.files, candidate, sample_all=sample_all)
        except ExecutionInterrupted as stopped:
            self.record(stopped.result, kind, batch, seq)
            raise
        return self.record(result, kind, batch, seq), result

    def record(
        self,
        result: ExecutionResult,
        kind: str,
        batch: str,
        seq: int = 0,
        verdicts: list[dict] | None = None,
        rule_version: str | None = None,
        baseline_id: int | None = None,
        llm_tokens: int = 0,
        llm_cost: float = 0.0,
    ) -> int:
        blobs: dict[str, tuple[bytes, str]] = {}
        patches = []
        for patch in result.candidate.patches:
            blobs[f"patch:{patch.name}"] = (patch.text.encode(), "patch")
            patches.append({"name": patch.name, "sha256": patch.sha256})
        sources = {}
        for path, data in result.sources.items():
            blobs[f"source:{path}"] = (data, "source")
            sources[path] = sha256_hex(data)
        receipts_hash = evidence_hash = None
        if result.receipts:
            blobs["receipts"] = (result.receipts, "receipts")
            receipts_hash = sha256_hex(result.receipts)
        evidence = result.evidence
        if evidence and self.contract.executor_flags:  # where it ran, when flags moved it from the contract's
            evidence = {**evidence, "executor_flags": self.contract.executor_flags}
        if evidence:
            data = canonical_json(evidence)
            blobs["evidence"] = (data, "evidence")
            evidence_hash = sha256_hex(data)
        return self.ledger.append_execution(
            {
                "batch": batch,
                "kind": kind,
                "seq": seq,
                "contract_hash": self.contract.sha256,
                "manifest_hash": self.manifest.sha256,
                "knobs": result.candidate.knobs,
                "patches": patches,
                "sources": sources,
                "status": result.status,
                "detail": result.detail,
                "exit_code": result.exit_code,
                "step_time_s": result.step_time_s,
                "peak_mem_mb": result.peak_mem_mb,
                "device_s": result.device_s,
                "wall_s": result.wall_s,
                "receipts_hash": receipts_hash,
                "evidence_hash": evidence_hash,
                "stderr_tail": result.stderr_tail[-4000:],
                "verdicts": verdicts,
                "rule_version": rule_version,
                "baseline_id": baseline_id,
                "llm_tokens": int(llm_tokens),
                "llm_cost": float(llm_cost),
            },
            blobs=blobs,
        )


def open_workspace(
    contract_path: str | Path = "infrarsi.toml",
    executor: Executor | None = None,
    executor_flags: Mapping[str, Any] | None = None,
) -> Workspace:
    """Open an initialised workspace; the contract must be the one pinned at init.

    ``executor_flags`` ({[executor] key: value}, the CLI's ``--partition`` and friends) replace
    those keys of the contract's ``[executor]`` table for as long as it is open."""
    contract = load_contract(contract_path)
    state = contract.state_dir
    ledger_path = state / LEDGER_NAME
    if not ledger_path.exists():
        raise UsageError(
            f"{contract.workspace}: not initialised (no {ledger_path.relative_to(contract.workspace)}); "
            f"run `infrarsi init` first"
        )
    try:
        manifest = load_manifest(state / MANIFEST_NAME)
    except ManifestError as exc:
        raise UsageError(str(exc)) from None
    if manifest.body["contract_sha256"] != contract.sha256:
        raise UsageError(
            f"{contract.path}: the contract changed since `infrarsi init` pinned it: run "
            f"`infrarsi init --update` to pin it as the next revision of this ledger (same key; the stored "
            f"baseline stays the reference unless the change alters what it measured), or restore it"
        )
    key = KeyPair.load(state / KEYS_DIR)
    if key.public_hex != manifest.public_key:
        raise UsageError(f"{state / KEYS_DIR}: the signing key is not the one the manifest was signed with")
    contract = with_executor_flags(contract, executor_flags or {})
    ledger = Ledger.open(ledger_path, key=key)
    return Workspace(contract, manifest, key, ledger, executor or executor_for(contract))
