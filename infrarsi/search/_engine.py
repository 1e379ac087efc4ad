"""`infrarsi search`: multi-start, model-guided exploration, then promotion through `verify`.

Exploration runs each candidate once, through the same cheap checks and run
judgement as `verify` (``--pairs 0``), so a cheating or numerics-changing candidate
is rejected before it can look fast. The models are refit after every execution.
Promotion sends the best candidates by posterior through the full `verify`
pipeline; only a candidate with a receipt is promoted, and the best promoted one
is the result.

The ledger is the search's memory: every execution is committed the moment it
ends, under the search's batch names, so ``--resume`` rebuilds the state from it.
"""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path
from typing import Callable

import numpy as np

from infrarsi._candidate import Candidate, PatchRef, UsageError
from infrarsi._patch import PatchParseError
from infrarsi._sandbox import PatchRejected
from infrarsi._sources import changed_sources
from infrarsi._workspace import Workspace, open_workspace
from infrarsi.search._journal import Journal, JournalledExecutor
from infrarsi.search._models import MemoryModel, SpeedModel, expected_improvement
from infrarsi.search._proposers import Proposer
from infrarsi.search._screening import failing_checks
from infrarsi.search._promoting import Promoting
from infrarsi.search._proposing import Proposing
from infrarsi.search._resuming import Resuming
from infrarsi.search._space import Point, Space
from infrarsi.search._state import (Observation, SearchOutcome, SearchState, exploration_budget,
                                    promotion_cost)

__all__ = ["search", "SearchOutcome", "Observation", "SearchState", "promotion_cost", "exploration_budget"]

META_KEY = "search:current"
RESCUE_MIN_FIT = 0.05        # a partner the memory model gives less chance of fitting than this is not tried
RESCUE_DEPTH = 1             # a partner that ran out of memory too gets one more try, then the search moves on


# -- the driver -----------------------------------------------------------------------------

class _Search(Proposing, Resuming, Promoting):
    """One search: starts, exploration and partner rescue here; proposals, resume and
    promotion in the mixins of `_proposing`, `_resuming` and `_promoting`."""

    def __init__(self, ws: Workspace, stored_baseline: dict, state_meta: dict, resumed: bool,
                 proposers: list[Proposer] | None, pack: dict | None,
                 progress: Callable[[str, int, int, str], None] | None) -> None:
        self.ws, self.meta, self.resumed, self.pack = ws, state_meta, resumed, pack
        self.progress = progress
        self.summary, self.baseline_id = stored_baseline["summary"], stored_baseline["id"]
        self.id = state_meta["id"]
        self.batch = f"search-{self.id}"
        self.rng = random.Random(state_meta["seed"])
        self.messages: list[str] = []
        self.patches: dict[str, PatchRef] = {}
        self.origins: dict[str, str] = {}
        contract = ws.contract
        knobs = {name: (k.choices, k.baseline) for name, k in contract.knobs.items()}
        self.space = Space(knobs, [])
        base_point = self.space.baseline()
        self.state = SearchState(self.space, Observation(base_point, "ok", self.summary["step_time_s"]["median"],
                                                         self.summary.get("peak_mem_mb"), None, "baseline"),
                                 float(contract.resources.memory_limit_mb))
        self.journal = Journal(contract.state_dir / "search" / f"{self.id}.inflight.json")
        self.executor = JournalledExecutor(ws.executor, self.journal, ws.ledger)
        self._proposers = proposers
        self.history: list[dict] = []
        self.attempts: list[dict] = []
        self._cache: tuple[int, list[dict]] = (-1, [])

    # -- bookkeeping ------------------------------------------------------------------------

    def _save(self) -> None:
        self.ws.ledger.set_meta(META_KEY, json.dumps(self.meta, sort_keys=True))

    def _rows(self) -> list[dict]:
        count = self.ws.ledger.count()
        if self._cache[0] != count:
            self._cache = (count, [r for r in self.ws.ledger.executions()
                                   if str(r.get("batch", "")).startswith(self.batch)])
        return self._cache[1]

    def launched(self) -> int:
        """Executions this search has launched so far (proposals recorded for their cost are not runs)."""
        return sum(1 for r in self._rows() if r.get("kind") != "proposal")

    def _candidate(self, point: Point) -> Candidate:
        return Candidate(knobs=point.knob_map, patches=tuple(self.patches[p] for p in sorted(point.patches)))

    def _tick(self, phase: str, last: str = "") -> None:
        if self.progress:
            self.progress(phase, self.launched(), self.meta["budget"], last)

    # -- choosing -------------------------------------------------------------------------------

    def _score(self, points: list[Point], speed: SpeedModel, memory: MemoryModel) -> np.ndarray:
        if not points:
            return np.zeros(0)
        mean, std = speed.predict(points)
        ei = expected_improvement(mean, std, self.state.best_log())
        return ei * memory.p_fit(points) * self.state.p_ok(points)

    def _fresh(self, points) -> list[Point]:
        tried = self.state.tried()
        return [p for p in dict.fromkeys(points) if p not in tried]

    def _applies(self, point: Point) -> bool:
        """Pre-flight: does the patch set apply together? A conflict is learned, not run."""
        if len(point.patches) < 2:
            return True
        if any(c <= point.patches for c in self.state.conflicts):
            return False
        try:
            changed_sources(self.ws.contract.workspace, self._candidate(point).patches)
        except (PatchRejected, PatchParseError):
            pair = self._conflict_pair(point)
            self.state.conflicts.add(pair)
            self.messages.append(f"patches {' + '.join(sorted(pair))} do not apply together: not run")
            return False
        return True

    def _conflict_pair(self, point: Point) -> frozenset[str]:
        names = sorted(point.patches)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                try:
                    changed_sources(self.ws.contract.workspace, (self.patches[a], self.patches[b]))
                except (PatchRejected, PatchParseError):
                    return frozenset([a, b])
        return frozenset(names)

    def _pick(self, points: list[Point], speed, memory) -> Point | None:
        fresh = self._fresh(points)
        if not fresh:
            return None
        scores = self._score(fresh, speed, memory)
        for index in np.argsort(-scores, kind="stable"):
            if scores[index] <= 0:
                return None
            if self._applies(fresh[index]):
                return fresh[index]
        return None

    def starts(self) -> list[tuple[Point, str]]:
        """Baseline, the pack's and the catalog's suggestions, then random points spread apart."""
        wanted = self.ws.contract.search.starts
        out: list[tuple[Point, str]] = [(self.state.baseline.point, "baseline")]
        if self.pack:
            from infrarsi.search._pack import suggestions

            for point in suggestions(self.pack, self.space, self.meta.get("pack_aliases"))[:max(1, wanted // 2)]:
                out.append((point, "pack"))
        catalog: list[str] = []
        for name in (n for n, o in self.origins.items() if o == "catalog"):
            # As many of the catalog's patches as apply together.
            if self._applies(self.space.point({}, catalog + [name])):
                catalog.append(name)
        if catalog:
            out.append((self.space.point({}, catalog), "catalog"))
        # Random starts change one or two things each: far apart from each other, but each
        # near enough to the original that it is likely to run (a start that fails teaches little).
        base = self.state.baseline.point
        pool = list(dict.fromkeys(self.space.with_atoms(base, self.rng.sample(self.space.atoms, k))
                                  for k in (1, 2) for _ in range(128) if len(self.space.atoms) >= k))
        pool = [p for p in pool if self.state.p_ok([p])[0] > 0]
        chosen = [p for p, _ in out]
        covered: set[str] = set()
        while len(out) < wanted and pool:
            # Farthest from everything chosen so far (in atoms changed); among those, the one
            # that tries the most changes no start has tried yet.
            far = max(pool, key=lambda p: (min(len(self.space.atoms_of(p) ^ self.space.atoms_of(c)) for c in chosen),
                                           len(self.space.atoms_of(p) - covered)))
            covered |= self.space.atoms_of(far)
            pool.remove(far)
            out.append((far, "random"))
            chosen.append(far)
        seen, unique = set(), []
        for point, origin in out:
            if point not in seen:
                seen.add(point)
                unique.append((point, origin))
        return unique[:max(wanted, 1 + bool(self.pack))]

    # -- running ------------------------------------------------------------------------------

    def explore_one(self, point: Point, origin: str) -> Observation:
        """Run ``point`` once against the stored baseline, record it, and learn from the outcome."""
        from infrarsi._verify import _Verification

        self.executor.batch = self.batch
        self.ws.executor, inner = self.executor, self.ws.executor
        try:
            stored = {"summary": self.summary, "id": self.baseline_id}
            check = _Verification(self.ws, self._candidate(point), stored, 0, None, batch=self.batch, kind="search")
            check.seq = len(self._rows())
            check.run()
        finally:  # recorded (or interrupted, and recorded as such): nothing is in flight
            self.journal.clear()
            self.ws.executor = inner
        row = self.ws.ledger.get_execution(check.executions[-1])
        obs = Observation(point, row["status"], row.get("step_time_s"), row.get("peak_mem_mb"), row["id"], origin,
                          row.get("detail") or "", row.get("device_s") or 0.0)
        self.state.add(obs, failing_checks(row))
        speedup = self._remember(obs, origin)
        self.meta.setdefault("origins", {})[str(row["id"])] = origin
        self._save()
        self._tick("explore", f"{origin}: {obs.status}" + (f" {speedup:.2f}x" if speedup else ""))
        return obs

    def _remember(self, obs: Observation, origin: str) -> float | None:
        speedup = (self.state.baseline.step_time_s / obs.step_time_s) if obs.status == "ok" and obs.step_time_s else None
        self.history.append({"execution": obs.execution, "origin": origin, "status": obs.status, "speedup": speedup,
                             **obs.point.describe()})
        return speedup

    def explore(self, exploration: int) -> None:
        """Explore until ``exploration`` executions are launched or nothing is left worth trying."""
        starts = self.starts()
        incumbents = [p for p, _ in starts]
        for point, origin in starts:
            if self.launched() >= exploration:
                return
            if point in self.state.tried() or self.state.p_ok([point])[0] == 0 or not self._applies(point):
                continue
            obs = self.explore_one(point, f"start:{origin}")
            if obs.status == "oom":
                self._rescue(obs, exploration)
        slot = 0
        stale = 0
        while self.launched() < exploration and stale < 3 * (len(incumbents) + 1):
            speed, memory = self.state.speed_model(), self.state.memory_model()
            if slot < len(incumbents):
                centre = self._incumbent(incumbents[slot])
                incumbents[slot] = centre
                near = self.space.neighbours(centre)
                near += [q for p in near for q in self.space.neighbours(p)]
                choice, origin = self._pick(near, speed, memory), f"local:{slot}"
            else:
                choice, origin = self._pick(self.space.pool(self.rng), speed, memory), "global"
            slot = (slot + 1) % (len(incumbents) + 1)
            if choice is None:
                stale += 1
                continue
            stale = 0
            obs = self.explore_one(choice, origin)
            if obs.status == "oom":
                self._rescue(obs, exploration)

    def _incumbent(self, centre: Point) -> Point:
        """The best ok point within two changes of ``centre``, else ``centre`` itself."""
        near = [o for o in self.state.ok()
                if len(self.space.atoms_of(o.point) ^ self.space.atoms_of(centre)) <= 2]
        return min(near, key=lambda o: o.step_time_s).point if near else centre

    def _keeps(self, oom: Point, point: Point) -> bool:
        """Does ``point`` keep what ``oom`` changed (its patches, and each changed knob off its baseline)?"""
        base = self.space.baseline().knob_map
        knobs = point.knob_map
        return oom.patches <= point.patches and all(
            knobs[k] != base[k] for k, v in oom.knobs if v != base[k])

    def _rescue(self, oom: Observation, exploration: int, depth: int = 0) -> None:
        """A promising candidate ran out of memory: try it with the changes the memory model says save memory."""
        speed, memory = self.state.speed_model(), self.state.memory_model()
        mean, std = speed.predict([oom.point])
        if mean[0] - std[0] > self.state.best_log():   # not promising: even optimistically no faster than the best
            return
        near = self.space.neighbours(oom.point)
        near += [q for p in near for q in self.space.neighbours(p)]
        partners = [p for p in self._fresh(near) if self._keeps(oom.point, p)]
        if not partners:
            return
        # Partners with a real chance to fit: ones the model knows cut memory, or has not seen
        # yet (uncertain); ranked below by expected gain times the chance of fitting.
        fits = memory.p_fit(partners)
        keep = [p for p, f in zip(partners, fits) if f > RESCUE_MIN_FIT]
        if not keep or self.launched() >= exploration:
            return
        choice = self._pick(keep, speed, memory)
        if choice is None:
            return
        obs = self.explore_one(choice, "partner")
        added = sorted(self.space.atoms_of(choice) - self.space.atoms_of(oom.point))
        if obs.status == "ok":
            self.state.rescued.append({"oom_execution": oom.execution, "rescued_by": added,
                                       "execution": obs.execution, **choice.describe()})
            self.meta["rescued"] = self.state.rescued
            self._save()
        elif obs.status == "oom" and depth < RESCUE_DEPTH and self.launched() < exploration:
            self._rescue(obs, exploration, depth + 1)

    # -- the whole search -------------------------------------------------------------------------

    def run(self, promote: bool = True) -> SearchOutcome:
        """The whole search: gather proposals, replay a resumed ledger, explore, then promote."""
        contract = self.ws.contract
        budget = self.meta["budget"]
        exploration = budget
        if promote:
            exploration, _ = exploration_budget(budget, contract.search.promote_top, contract.search.ab_pairs)
        self.gather()
        self.replay()
        self._tick("explore")
        if self.meta.get("phase") != "promote":   # a resume after promotion began does not explore again
            self.explore(exploration)
        if promote:
            self.meta["phase"] = "promote"
            self._save()
            self.promote(budget)
        self.meta["finished"] = True
        result = self.outcome(exploration)
        self.meta["incompatibilities"] = result.incompatibilities   # for `infrarsi report`
        self._save()
        return result

    def outcome(self, exploration: int) -> SearchOutcome:
        """What this search found and what it cost, from its ledger rows."""
        rows = self._rows()
        by_status: dict[str, int] = {}
        for r in rows:
            by_status[f"{r.get('kind')}:{r['status']}"] = by_status.get(f"{r.get('kind')}:{r['status']}", 0) + 1
        cost = {"device_s": round(sum(r.get("device_s") or 0.0 for r in rows), 3),
                "llm_tokens": int(sum(r.get("llm_tokens") or 0 for r in rows)),
                "llm_cost": round(sum(r.get("llm_cost") or 0.0 for r in rows), 6),
                "executions": sum(1 for r in rows if r.get("kind") != "proposal"),
                "by_status": dict(sorted(by_status.items()))}
        promoted = [{"knobs": a["knobs"], "patches": a["patches"], "speedup": a["speedup"], "receipt": a["receipt"]}
                    for a in self.attempts if a.get("accepted") and a.get("receipt")]
        best = max(promoted, key=lambda a: a["speedup"]["median"]) if promoted else None
        proposals = {name: self.origins[name] for name in self.patches}
        return SearchOutcome(self.id, best, promoted, self.attempts, cost["executions"],
                             sum(1 for r in rows if r.get("kind") == "search"), self.meta["budget"], cost,
                             self.state.failures.incompatibilities()
                             + [{"atoms": [f"+{p}" for p in sorted(c)], "learned": True,
                                 "why": "the patches do not apply together"} for c in self.state.conflicts],
                             self.state.rescued, proposals, self.resumed, self.messages, self.history)


def _check_workspace(ws: Workspace) -> None:
    """The workspace must be the one `init` pinned: otherwise every candidate would fail the same way."""
    from infrarsi._hashing import hash_protected
    from infrarsi.verifiers import check_manifest

    contract = ws.contract
    check = check_manifest(ws.manifest.body, ws.manifest.signature, contract.sha256, ws.ledger.public_key,
                           hash_protected(contract.workspace, contract.protected_globs))
    if not check.passed:
        raise UsageError(f"{contract.workspace}: {check.detail}; restore the protected files, or "
                         f"`infrarsi init --force` for a new ledger")


def search(contract_path: str | Path = "infrarsi.toml", budget: int | None = None, resume: bool = False,
           pack: str | Path | None = None, seed: int | None = None, proposers: list[Proposer] | None = None,
           progress: Callable[[str, int, int, str], None] | None = None, promote: bool = True) -> SearchOutcome:
    """Search knobs x patches under the contract; only candidates with receipts are promoted.

    ``promote=False`` spends the whole budget exploring and promotes nothing (so ``best``
    is None): for benchmarks that score exploration alone, never for a result.
    """
    with open_workspace(contract_path) as ws:
        stored = ws.ledger.latest_baseline()
        if stored is None:
            raise UsageError(f"{ws.contract.path}: no baseline recorded; run `infrarsi baseline` first")
        pack_data = None
        if pack is not None:
            from infrarsi.search._pack import load_pack

            pack_data = load_pack(pack)
        _check_workspace(ws)
        previous = ws.ledger.get_meta(META_KEY)
        if resume:
            if previous is None:
                raise UsageError(f"{ws.contract.path}: --resume: no search has been started in this workspace")
            meta = json.loads(previous)
            if meta.get("finished"):
                raise UsageError(f"--resume: the last search ({meta['id']}) finished; nothing to resume "
                                 f"(run `infrarsi search` for a new one)")
            if budget is not None:
                meta["budget"] = budget
            stored = ws.ledger.baseline(meta["baseline_id"]) if "baseline_id" in meta else stored
            if stored is None:
                raise UsageError(f"--resume: the baseline the search started with ({meta['baseline_id']}) is missing")
            if pack_data is None and meta.get("pack"):
                from infrarsi.search._pack import load_pack

                pack_data = load_pack(meta["pack"])
        else:
            meta = {"id": uuid.uuid4().hex[:12], "seed": ws.contract.search.seed if seed is None else seed,
                    "budget": ws.contract.search.budget_executions if budget is None else budget,
                    "pack": str(Path(pack).resolve()) if pack else None, "finished": False,
                    "baseline_id": stored["id"]}
        if promote:
            exploration_budget(meta["budget"], ws.contract.search.promote_top, ws.contract.search.ab_pairs)
        ws.ledger.set_meta(META_KEY, json.dumps(meta, sort_keys=True))
        return _Search(ws, stored, meta, resume, proposers, pack_data, progress).run(promote)
