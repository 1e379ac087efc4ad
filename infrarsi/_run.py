"""`infrarsi run`: one execution of the job with knob settings and patches, recorded whatever its fate."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from infrarsi._workspace import open_workspace
from infrarsi.contract import parse_sets, resolve_candidate

__all__ = ["RunOutcome", "run"]


@dataclass(frozen=True)
class RunOutcome:
    execution: int
    status: str
    step_time_s: float | None
    peak_mem_mb: float | None
    detail: str
    candidate: dict

    def to_json(self) -> dict:
        """The DESIGN.md shape of `run --json`."""
        return {
            "execution": self.execution,
            "status": self.status,
            "step_time_s": self.step_time_s,
            "peak_mem_mb": self.peak_mem_mb,
        }


def run(
    contract_path: str | Path = "infrarsi.toml",
    sets: list[str] | dict[str, str] | None = None,
    patches: list[str] | None = None,
    executor_flags: dict | None = None,
) -> RunOutcome:
    """One execution of the contract's job with knob settings and patches, recorded in the ledger.

    ``executor_flags``: [executor] keys replaced for this run (`infrarsi.contract.with_executor_flags`)."""
    with open_workspace(contract_path, executor_flags=executor_flags) as ws:
        values = sets if isinstance(sets, dict) else parse_sets(sets)
        candidate = resolve_candidate(ws.contract, values, patches)
        execution, result = ws.execute(candidate, kind="run", batch=uuid.uuid4().hex)
    return RunOutcome(
        execution, result.status, result.step_time_s, result.peak_mem_mb, result.detail, candidate.describe()
    )
