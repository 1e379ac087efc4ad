"""The search's state: observations, what it learned, the budget split, and its outcome."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from infrarsi._search.strategy._models import Failures, MemoryModel, SpeedModel
from infrarsi._search.strategy._space import Point, Space
from infrarsi.errors import UsageError

__all__ = [
    "Observation",
    "SearchState",
    "SearchOutcome",
    "promotion_cost",
    "long_runs",
    "exploration_budget",
    "INTERRUPTED",
    "NOT_THE_CANDIDATES",
    "MEMORY_MARGIN",
    "PRIOR_WEIGHT",
]

# Checks whose failure says the workspace or the installed framework changed, not the candidate.
NOT_THE_CANDIDATES = {"integrity.manifest", "integrity.framework"}
INTERRUPTED = "interrupted"  # detail prefix of an execution cut short by our own stop: no evidence
# A candidate whose measured peak came within this fraction of memory_limit_mb is promoted
# only after every candidate with room: one run's peak is not the next one's (allocator
# and thread-pool noise moves a CPU job's high-water mark by 5-10%), and a `verify` that
# runs out of memory on its eighth run spends the whole promotion budget on nothing.
MEMORY_MARGIN = 0.10
PRIOR_WEIGHT = 0.3  # one pack run counts for this fraction of one of our own


def promotion_cost(ab_pairs: int, long_runs: int = 0) -> int:
    """Executions one `verify` of ``ab_pairs`` A/B pairs takes: the candidate run, then the pairs,
    then ``[numerics.convergence]``'s ``long_runs`` (2 x seeds; 0 without the table)."""
    return 1 + 2 * ab_pairs + long_runs


def long_runs(contract) -> int:
    """The long runs each promotion's verify takes (``[numerics.convergence]``: 2 x seeds), else 0."""
    return contract.convergence.runs if contract.convergence is not None else 0


def exploration_budget(
    budget: int, promote_top: int, ab_pairs: int, ab_max_pairs: int | None = None, long_runs: int = 0
) -> tuple[int, int]:
    """(exploration executions, promotions planned) for a total budget.

    Promotions are reserved first, but never more than half the budget, and at least one. The
    first may take its sequential A/B's extra pairs (to ``ab_max_pairs``), as far as half the
    budget allows; each later one is reserved at its first look (``ab_pairs``).
    """
    cost = promotion_cost(ab_pairs, long_runs)
    if budget < cost + 1:
        raise UsageError(
            f"--budget {budget}: too small; one promotion (`verify` with {ab_pairs} A/B pairs"
            + (f" and {long_runs} long runs" if long_runs else "")
            + ") "
            f"takes {cost} executions, plus at least one exploration run"
        )
    first = min(promotion_cost(max(ab_pairs, ab_max_pairs or ab_pairs), long_runs), max(cost, budget // 2))
    planned = min(promote_top, 1 + max(0, (budget // 2 - first) // cost))
    return budget - first - (planned - 1) * cost, planned


@dataclass
class Observation:
    point: Point
    status: str  # ok | oom | crash | timeout | rejected, or "interrupted" (no evidence)
    step_time_s: float | None
    peak_mem_mb: float | None
    execution: int | None
    origin: str
    detail: str = ""
    device_s: float = 0.0


@dataclass
class SearchState:
    """What the search knows: its observations, learned failures, and where it started."""

    space: Space
    baseline: Observation
    limit_mb: float
    observations: list[Observation] = field(default_factory=list)
    failures: Failures = field(default_factory=Failures)
    conflicts: set[frozenset[str]] = field(default_factory=set)
    rescued: list[dict] = field(default_factory=list)
    priors: list[tuple[Point, float]] = field(default_factory=list)  # a pack's pseudo-runs
    # Running now (search --workers): each believed to take the step time the speed model predicted
    # when it was sent (a "believer"), so the next picks look elsewhere instead of at its neighbours.
    pending: dict[Point, float] = field(default_factory=dict)

    def tried(self) -> set[Point]:
        done = {o.point for o in self.observations if o.status != INTERRUPTED}
        return done | {self.baseline.point} | set(self.pending)

    def add(self, obs: Observation, failed_checks: list[str] | None = None) -> None:
        """Record a finished execution. A rejection counts against its changes only when a
        failing check is about the candidate (not the workspace or the framework changing)."""
        self.observations.append(obs)
        atoms = self.space.atoms_of(obs.point)
        not_its_fault = bool(failed_checks) and set(failed_checks) <= NOT_THE_CANDIDATES
        if obs.status == "ok":
            self.failures.add_success(atoms)
        elif obs.status in ("crash", "rejected") and atoms and not not_its_fault:
            self.failures.add_failure(atoms, f"{obs.status}: {obs.detail[:160]}")

    def ok(self) -> list[Observation]:
        return [self.baseline] + [o for o in self.observations if o.status == "ok" and o.step_time_s]

    def speed_model(self) -> SpeedModel:
        ok = self.ok()
        points = [o.point for o in ok] + [p for p, _ in self.priors] + list(self.pending)
        times = [o.step_time_s for o in ok] + [t for _, t in self.priors] + list(self.pending.values())
        weights = [1.0] * len(ok) + [PRIOR_WEIGHT] * len(self.priors) + [1.0] * len(self.pending)
        return SpeedModel(self.space).fit(points, times, weights)

    def cost_model(self) -> SpeedModel:
        """log(device-seconds) of every run that cost any, out of memory or crashed too: what
        trying a point costs (a compile that runs out of memory after 27 s costs 27 s)."""
        runs = [o for o in self.observations if o.device_s and o.device_s > 0]
        return SpeedModel(self.space).fit([o.point for o in runs], [o.device_s for o in runs])

    def memory_model(self) -> MemoryModel:
        seen = [
            o for o in [self.baseline] + self.observations if (o.status == "ok" and o.peak_mem_mb) or o.status == "oom"
        ]
        return MemoryModel(self.space, self.limit_mb).fit(
            [o.point for o in seen],
            [o.peak_mem_mb if o.status == "ok" else None for o in seen],
            [o.status == "oom" for o in seen],
        )

    def p_ok(self, points: list[Point]) -> np.ndarray:
        judge = self.failures.judge()
        out = np.array([judge(self.space.atoms_of(p)) for p in points], dtype=float)
        for i, p in enumerate(points):
            if any(c <= p.patches for c in self.conflicts):
                out[i] = 0.0
        return out

    def promotion_order(self, min_speedup: float) -> list[Point]:
        """Candidates that ran and passed, each at least ``min_speedup`` faster than the baseline
        (measured) and faster by the model's posterior, best posterior first; those without
        `MEMORY_MARGIN` of room under the limit (or seen out of memory once) after the rest."""
        ok = [o for o in self.observations if o.status == "ok" and o.step_time_s]
        if not ok:
            return []
        points = list(dict.fromkeys(o.point for o in ok))
        mean, _ = self.speed_model().predict(points)
        measured = {o.point: o.step_time_s for o in ok}
        base = self.baseline.step_time_s
        ceiling = self.limit_mb * (1 - MEMORY_MARGIN)
        tight = {
            o.point
            for o in self.observations
            if o.status == "oom" or (o.status == "ok" and (o.peak_mem_mb or 0) > ceiling)
        }
        order = [
            points[i]
            for i in np.argsort(mean, kind="stable")
            if base / measured[points[i]] >= min_speedup and mean[i] < math.log(base)
        ]
        return [p for p in order if p not in tight] + [p for p in order if p in tight]

    def best_log(self) -> float:
        return min(math.log(o.step_time_s) for o in self.ok())


@dataclass
class SearchOutcome:
    search_id: str
    best: dict | None
    promoted: list[dict]
    attempts: list[dict]
    executions: int
    exploration: int
    budget: int
    cost: dict
    incompatibilities: list[dict]
    rescued: list[dict]
    proposals: dict
    resumed: bool
    messages: list[str]
    history: list[dict]
    catalog: list[dict] = field(default_factory=list)  # each codemod: applied, or why not
    coverage: dict = field(default_factory=dict)  # points tried and untried, and why the search stopped

    def to_json(self) -> dict:
        """The DESIGN.md shape of `search --json`, with the details after it."""
        return {
            "best": self.best,
            "executions": self.executions,
            "promoted": self.promoted,
            "cost": self.cost,
            "search": self.search_id,
            "budget": self.budget,
            "exploration": self.exploration,
            "attempts": self.attempts,
            "incompatibilities": self.incompatibilities,
            "rescued": self.rescued,
            "proposals": self.proposals,
            "resumed": self.resumed,
            "messages": self.messages,
            "history": self.history,
            "catalog": self.catalog,
            "coverage": self.coverage,
        }
