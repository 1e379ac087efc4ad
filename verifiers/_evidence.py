"""The evidence verifiers judge: plain data, as the ledger stores it."""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field

__all__ = [
    "StepRecord",
    "RunEvidence",
    "BaselineReference",
    "steps_from_lines",
    "first_per_step",
    "merged_steps",
    "receipt_lines",
    "step_ranges",
]


@dataclass(frozen=True)
class StepRecord:
    """One step receipt line, with the runner's arrival stamp (None where unknown)."""

    step: int
    record: dict
    arrival_ns: int | None

    def get(self, key: str):
        return self.record.get(key)


def receipt_lines(stored: bytes | str) -> list[str]:
    """Stored receipts as the runner read them: split at ``\n`` only, as its readers split them.
    (``str.splitlines`` also splits at ``\r``, ``\u2028`` and more: one such character inside a
    line would shift every later line off its arrival stamp and its rank.)"""
    text = stored.decode("utf-8", "replace") if isinstance(stored, bytes) else stored
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


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


def merged_steps(per_rank: list[list[StepRecord]]) -> list[StepRecord]:
    """A job of several ranks as one: a step counts once every rank has reported it, at the
    latest of their arrivals, with the tokens summed and the largest peak memory. A step some
    rank never reported is not a step of the job. In arrival order. (The job's step *time* is
    not taken from these arrivals but from each rank's own window: `window_periods`.)"""
    firsts = [first_per_step(steps) for steps in per_rank]
    if not firsts:
        return []
    out = []
    for number in sorted(set.intersection(*(set(f) for f in firsts))):
        records = [f[number] for f in firsts]
        arrivals = [r.arrival_ns for r in records]
        slowest = max(records, key=lambda r: -1 if r.arrival_ns is None else r.arrival_ns)
        merged = dict(slowest.record)
        tokens = [r.get("tokens") for r in records]
        merged["tokens"] = sum(tokens) if all(type(t) is int for t in tokens) else None
        peaks = [r.get("peak_mem_bytes") for r in records if type(r.get("peak_mem_bytes")) is int]
        merged["peak_mem_bytes"] = max(peaks) if peaks else None
        arrival = None if None in arrivals else max(arrivals)
        out.append(StepRecord(number, merged, arrival))
    return sorted(out, key=lambda s: (s.arrival_ns is None, s.arrival_ns or 0, s.step))


@dataclass(frozen=True)
class RunEvidence:
    """What one execution left: its receipt lines, their arrival stamps, run-time hashes.

    A job under a launcher (torchrun: ``ranks`` of them, one or more) has ``line_ranks``, the
    runner's note of which rank's process wrote each line, as the kernel named it (the job's
    own claims about its rank count for nothing). Its ``steps`` are then the job's
    steps (:func:`merged_steps`), and :meth:`of_rank` is one rank's evidence.
    """

    receipt_lines: list[str]
    arrivals_ns: list[int] | None = None
    started_ns: int | None = None
    ended_ns: int | None = None
    integrity: dict | None = None
    evidence_kind: str = "probe"
    sampled_steps: tuple[int, ...] | None = None  # the runner's plan; None: recorded before sampling existed
    ranks: int = 1
    line_ranks: tuple[int, ...] | None = None
    # A job across nodes: each rank's own node's launch, on that node's clock (its lines'
    # arrivals are on it too); None: every rank's is ``started_ns``.
    rank_started_ns: dict[int, int] | None = None

    @classmethod
    def from_stored(cls, receipt_lines: list[str], evidence: dict) -> "RunEvidence":
        """From receipt lines and the runner's evidence dict as the ledger keeps it."""
        sampled = evidence.get("sampled_steps")
        ranks = evidence.get("ranks")
        tags = evidence.get("line_ranks")
        starts = evidence.get("rank_started_ns")
        return cls(
            receipt_lines=receipt_lines,
            arrivals_ns=evidence.get("arrivals_ns"),
            started_ns=evidence.get("started_ns"),
            ended_ns=evidence.get("ended_ns"),
            integrity=evidence.get("integrity"),
            evidence_kind=evidence.get("evidence_kind", "probe"),
            sampled_steps=tuple(sampled) if isinstance(sampled, list) else None,
            ranks=ranks if type(ranks) is int and ranks >= 1 else 1,
            # A tag that is not a rank number puts its line in no rank.
            line_ranks=tuple(t if type(t) is int else -1 for t in tags) if isinstance(tags, list) else None,
            rank_started_ns={int(k): v for k, v in starts.items() if str(k).isdigit() and type(v) is int}
            if isinstance(starts, dict)
            else None,
        )

    def of_rank(self, rank: int) -> "RunEvidence":
        """One rank's lines and arrivals, as a run of its own."""
        tags = self.line_ranks or ()
        keep = [i for i in range(len(self.receipt_lines)) if i < len(tags) and tags[i] == rank]
        arrivals = self.arrivals_ns
        return dataclasses.replace(
            self,
            started_ns=(self.rank_started_ns or {}).get(rank, self.started_ns),
            rank_started_ns=None,
            receipt_lines=[self.receipt_lines[i] for i in keep],
            arrivals_ns=None if arrivals is None else [arrivals[i] if i < len(arrivals) else None for i in keep],
            ranks=1,
            line_ranks=None,
        )

    @functools.cached_property
    def steps(self) -> list[StepRecord]:
        """Parsed once: every check reads them. Several ranks: the job's steps, as :func:`merged_steps`."""
        if self.line_ranks is not None:
            return merged_steps([self.of_rank(r).steps for r in range(self.ranks)])
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
    per_rank: tuple["BaselineReference", ...] = ()  # a job of several ranks: each rank's own

    @classmethod
    def from_summary(cls, summary: dict) -> "BaselineReference":
        """The baseline summary's reference; a job of several ranks keeps each rank's in
        ``reference_ranks`` (the top-level ``reference`` is then rank 0's)."""
        observed = summary.get("reference_execution") is not None
        # Tokens the contract stated were never counted in a run: nothing to hold a candidate to.
        counted = summary.get("tokens_source") != "contract"
        ranks = summary.get("reference_ranks")
        per_rank = tuple(
            cls._from_reference(r, r.get("tokens_per_step") if counted else None, observed)
            for r in (ranks if isinstance(ranks, list) else [])
            if isinstance(r, dict)
        )
        top = cls._from_reference(
            summary.get("reference") or {}, summary.get("tokens_per_step") if counted else None, observed
        )
        return dataclasses.replace(top, per_rank=per_rank)

    @classmethod
    def _from_reference(cls, reference: dict, tokens, observed: bool) -> "BaselineReference":
        return cls(
            loss=list(reference.get("loss") or []),
            grad_norm=list(reference.get("grad_norm") or []),
            tokens_per_step=tokens,
            param_grad_norms=_by_step(reference.get("param_grad_norms"), dict),
            param_grad_min_rows=_by_step(reference.get("param_grad_min_rows"), dict),
            ops=_by_step(reference.get("ops"), list),
            observed=observed,
        )

    def rank(self, rank: int) -> "BaselineReference":
        """Rank ``rank``'s reference; an empty one (nothing to compare with) where the baseline had no such rank."""
        if rank < len(self.per_rank):
            return self.per_rank[rank]
        return BaselineReference(observed=self.observed)


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
