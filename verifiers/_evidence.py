"""The evidence verifiers judge: plain data, as the ledger stores it."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field

__all__ = ["StepRecord", "RunEvidence", "BaselineReference", "steps_from_lines", "first_per_step", "step_ranges"]


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


def first_per_step(steps: list[StepRecord]) -> dict[int, StepRecord]:
    """Each step number's first record: the one every check judges (a repeat is timing.window's)."""
    by_step: dict[int, StepRecord] = {}
    for s in steps:
        by_step.setdefault(s.step, s)
    return by_step


@dataclass(frozen=True)
class RunEvidence:
    """What one execution left: its receipt lines, their arrival stamps, run-time hashes."""

    receipt_lines: list[str]
    arrivals_ns: list[int] | None = None
    started_ns: int | None = None
    ended_ns: int | None = None
    integrity: dict | None = None
    evidence_kind: str = "probe"
    sampled_steps: tuple[int, ...] | None = None  # the runner's plan; None: recorded before sampling existed

    @classmethod
    def from_stored(cls, receipt_lines: list[str], evidence: dict) -> "RunEvidence":
        """From receipt lines and the runner's evidence dict as the ledger keeps it."""
        sampled = evidence.get("sampled_steps")
        return cls(
            receipt_lines=receipt_lines,
            arrivals_ns=evidence.get("arrivals_ns"),
            started_ns=evidence.get("started_ns"),
            ended_ns=evidence.get("ended_ns"),
            integrity=evidence.get("integrity"),
            evidence_kind=evidence.get("evidence_kind", "probe"),
            sampled_steps=tuple(sampled) if isinstance(sampled, list) else None,
        )

    @functools.cached_property
    def steps(self) -> list[StepRecord]:
        """Parsed once: every check reads them."""
        return steps_from_lines(self.receipt_lines, self.arrivals_ns)


@dataclass(frozen=True)
class BaselineReference:
    """The baseline's per-step trajectories (index 0 is step 1) and tokens per step.

    ``param_grad_norms``, ``param_grad_min_rows`` and ``ops`` come from the baseline's reference
    run, observed at every step: step -> {parameter name: gradient norm, None where it had
    none}, step -> {parameter name: its smallest row's gradient norm} and step -> the
    ``op:dtype`` entries seen. Empty for baselines recorded before sampling existed.
    """

    loss: list[float | None] = field(default_factory=list)
    grad_norm: list[float | None] = field(default_factory=list)
    tokens_per_step: int | None = None
    param_grad_norms: dict[int, dict[str, float | None]] = field(default_factory=dict)
    param_grad_min_rows: dict[int, dict[str, float]] = field(default_factory=dict)
    ops: dict[int, list[str]] = field(default_factory=dict)
    observed: bool = False  # a reference run observed every step (empty maps then: a job torch doesn't run)

    @classmethod
    def from_summary(cls, summary: dict) -> "BaselineReference":
        reference = summary.get("reference") or {}
        return cls(
            loss=list(reference.get("loss") or []),
            grad_norm=list(reference.get("grad_norm") or []),
            # Tokens the contract stated were never counted in a run: nothing to hold a candidate to.
            tokens_per_step=summary.get("tokens_per_step") if summary.get("tokens_source") != "contract" else None,
            param_grad_norms=_by_step(reference.get("param_grad_norms"), dict),
            param_grad_min_rows=_by_step(reference.get("param_grad_min_rows"), dict),
            ops=_by_step(reference.get("ops"), list),
            observed=summary.get("reference_execution") is not None,
        )


def _by_step(stored, kind: type) -> dict:
    """{"3": value} as JSON keeps it -> {3: value}; entries of another shape are left out."""
    if not isinstance(stored, dict):
        return {}
    out = {}
    for key, value in stored.items():
        try:
            step = int(key)
        except (TypeError, ValueError):
            continue
        if isinstance(value, kind):
            out[step] = value
    return out


def step_ranges(numbers: list[int]) -> str:
    """Step numbers as ranges: 1, 2, 3, 7 -> '1..3, 7' (the first six runs of them, then '...')."""
    spans: list[list[int]] = []
    for n in sorted(set(numbers)):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    text = ", ".join(f"{a}..{b}" if a != b else str(a) for a, b in spans[:6])
    return text + (", ..." if len(spans) > 6 else "")
