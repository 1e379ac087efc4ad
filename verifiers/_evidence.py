"""The evidence verifiers judge: plain data, as the ledger stores it."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field

__all__ = ["StepRecord", "RunEvidence", "BaselineReference", "steps_from_lines"]


@dataclass(frozen=True)
class StepRecord:
    """One step receipt line, with the runner's arrival stamp (None where unknown)."""

    step: int
    record: dict
    arrival_ns: int | None

    def get(self, key: str):
        return self.record.get(key)


def steps_from_lines(lines: list[str], arrivals_ns: list[int] | None = None) -> list[StepRecord]:
    """Step records in arrival order; lines that are not step records are left out."""
    out: list[StepRecord] = []
    for index, line in enumerate(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("type") == "step" and type(rec.get("step")) is int:
            arrival = arrivals_ns[index] if arrivals_ns is not None and index < len(arrivals_ns) else None
            out.append(StepRecord(rec["step"], rec, arrival))
    return out


@dataclass(frozen=True)
class RunEvidence:
    """What one execution left: its receipt lines, their arrival stamps, run-time hashes."""

    receipt_lines: list[str]
    arrivals_ns: list[int] | None = None
    started_ns: int | None = None
    ended_ns: int | None = None
    integrity: dict | None = None
    evidence_kind: str = "probe"

    @functools.cached_property
    def steps(self) -> list[StepRecord]:
        """Parsed once: every check reads them."""
        return steps_from_lines(self.receipt_lines, self.arrivals_ns)


@dataclass(frozen=True)
class BaselineReference:
    """The baseline's per-step trajectories (index 0 is step 1) and tokens per step."""

    loss: list[float | None] = field(default_factory=list)
    grad_norm: list[float | None] = field(default_factory=list)
    tokens_per_step: int | None = None

    @classmethod
    def from_summary(cls, summary: dict) -> "BaselineReference":
        reference = summary.get("reference") or {}
        return cls(loss=list(reference.get("loss") or []), grad_norm=list(reference.get("grad_norm") or []),
                   tokens_per_step=summary.get("tokens_per_step"))
