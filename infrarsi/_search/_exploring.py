"""Exploration: multi-start, model-guided runs of single candidates, and the rescue of promising ones
that ran out of memory.

Each candidate runs once, through the same cheap checks and run judgement as `verify`
(``--pairs 0``); the models are refit after every execution.
"""

from __future__ import annotations

import random

import numpy as np

from infrarsi._search._screening import failing_checks
from infrarsi._search._session import SearchSession
from infrarsi._search.strategy._models import MemoryModel, SpeedModel, expected_improvement
from infrarsi._search.strategy._space import Point
from infrarsi._search.strategy._state import Observation
from infrarsi.errors import PatchParseError, PatchRejected
from infrarsi.runner import changed_sources

__all__ = ["Exploration", "RESCUE_MIN_FIT", "RESCUE_DEPTH"]

RESCUE_MIN_FIT = 0.05  # a partner the memory model gives less chance of fitting than this is not tried
RESCUE_DEPTH = 1  # a partner that ran out of memory too gets one more try, then the search moves on


class Exploration:
    """Starts, local and global model-guided steps, and partner rescue, within an exploration budget."""

    def __init__(self, session: SearchSession, pack: dict | None = None) -> None:
        self.session, self.pack = session, pack
        self.space, self.state = session.space, session.state
        self.rng = random.Random(session.meta["seed"])

    # -- choosing -------------------------------------------------------------------------------

    def _score(self, points: list[Point], speed: SpeedModel, memory: MemoryModel) -> np.ndarray:
        if not points:
            return np.zeros(0)
        mean, std = speed.predict(points)
        ei = expected_improvement(mean, std, self.state.best_log())
        # Per second it costs to try (Snoek et al., 2012, "EI per second"), relative to the
        # cheapest here: a point whose runs take 3x as long must promise 3x as much.
        cost, _ = self.state.cost_model().predict(points)
        return ei * memory.p_fit(points) * self.state.p_ok(points) / np.exp(cost - cost.min())

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
            changed_sources(self.session.ws.contract.workspace, self.session.candidate(point).patches)
        except (PatchRejected, PatchParseError):
            pair = self._conflict_pair(point)
            self.state.conflicts.add(pair)
            self.session.messages.append(f"patches {' + '.join(sorted(pair))} do not apply together: not run")
            return False
        return True

    def _conflict_pair(self, point: Point) -> frozenset[str]:
        names = sorted(point.patches)
        patches = self.session.patches
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                try:
                    changed_sources(self.session.ws.contract.workspace, (patches[a], patches[b]))
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
        wanted = self.session.ws.contract.search.starts
        out: list[tuple[Point, str]] = [(self.state.baseline.point, "baseline")]
        if self.pack:
            from infrarsi._search._pack import suggestions

            for point in suggestions(self.pack, self.space, self.session.meta.get("pack_aliases"))[
                : max(1, wanted // 2)
            ]:
                out.append((point, "pack"))
        catalog: list[str] = []
        for name in (n for n, o in self.session.origins.items() if o == "catalog"):
            # As many of the catalog's patches as apply together.
            if self._applies(self.space.point({}, catalog + [name])):
                catalog.append(name)
        if catalog:
            out.append((self.space.point({}, catalog), "catalog"))
        # Random starts change one or two things each: far apart from each other, but each
        # near enough to the original that it is likely to run (a start that fails teaches little).
        base = self.state.baseline.point
        pool = list(
            dict.fromkeys(
                self.space.with_atoms(base, self.rng.sample(self.space.atoms, k))
                for k in (1, 2)
                for _ in range(128)
                if len(self.space.atoms) >= k
            )
        )
        pool = [p for p in pool if self.state.p_ok([p])[0] > 0]
        chosen = [p for p, _ in out]
        covered: set[str] = set()
        while len(out) < wanted and pool:
            # Farthest from everything chosen so far (in atoms changed); among those, the one
            # that tries the most changes no start has tried yet.
            far = max(
                pool,
                key=lambda p: (
                    min(len(self.space.atoms_of(p) ^ self.space.atoms_of(c)) for c in chosen),
                    len(self.space.atoms_of(p) - covered),
                ),
            )
            covered |= self.space.atoms_of(far)
            pool.remove(far)
            out.append((far, "random"))
            chosen.append(far)
        seen, unique = set(), []
        for point, origin in out:
            if point not in seen:
                seen.add(point)
                unique.append((point, origin))
        return unique[: max(wanted, 1 + bool(self.pack))]

    # -- running ------------------------------------------------------------------------------

    def _run(self, point: Point, origin: str) -> Observation:
        """Run ``point`` once against the stored baseline, record it, and learn from the outcome."""
        session = self.session
        outcome = session.verify(session.candidate(point), session.batch, 0, kind="search", seq=len(session.rows()))
        return self._observe(point, origin, outcome)

    def _observe(self, point: Point, origin: str, outcome) -> Observation:
        """Learn from a recorded run (its `VerifyOutcome`): the state, the history, the meta."""
        session = self.session
        row = session.ws.ledger.get_execution(outcome.executions[-1])
        obs = Observation(
            point,
            row["status"],
            row.get("step_time_s"),
            row.get("peak_mem_mb"),
            row["id"],
            origin,
            row.get("detail") or "",
            row.get("device_s") or 0.0,
        )
        self.state.add(obs, failing_checks(row))
        speedup = session.remember(obs, origin)
        session.meta.setdefault("origins", {})[str(row["id"])] = origin
        session.save()
        session.tick("explore", f"{origin}: {obs.status}" + (f" {speedup:.2f}x" if speedup else ""))
        return obs

    def explore(self, exploration: int) -> None:
        """Explore until ``exploration`` executions are launched or nothing is left worth trying."""
        launched = self.session.launched
        starts = self.starts()
        incumbents = [p for p, _ in starts]
        self.session.meta["explore_stop"] = "the exploration budget was spent"
        for point, origin in starts:
            if launched() >= exploration:
                return
            if point in self.state.tried() or self.state.p_ok([point])[0] == 0 or not self._applies(point):
                continue
            obs = self._run(point, f"start:{origin}")
            if obs.status == "oom":
                self._rescue(obs, exploration)
        slot = 0
        stale = 0
        while launched() < exploration and stale < 3 * (len(incumbents) + 1):
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
            obs = self._run(choice, origin)
            if obs.status == "oom":
                self._rescue(obs, exploration)
        if launched() < exploration:
            self.session.meta["explore_stop"] = (
                f"no untried point was worth a run after {stale} empty picks: the models predict each one left "
                "crashes, runs out of memory, does not apply, or is no faster than the best found"
            )

    def _incumbent(self, centre: Point) -> Point:
        """The best ok point within two changes of ``centre``, else ``centre`` itself."""
        near = [o for o in self.state.ok() if len(self.space.atoms_of(o.point) ^ self.space.atoms_of(centre)) <= 2]
        return min(near, key=lambda o: o.step_time_s).point if near else centre

    def _keeps(self, oom: Point, point: Point) -> bool:
        """Does ``point`` keep what ``oom`` changed (its patches, and each changed knob off its baseline)?"""
        base = self.space.baseline().knob_map
        knobs = point.knob_map
        return oom.patches <= point.patches and all(knobs[k] != base[k] for k, v in oom.knobs if v != base[k])

    def _rescue(self, oom: Observation, exploration: int, depth: int = 0) -> None:
        """A promising candidate ran out of memory: try it with the changes the memory model says save memory."""
        speed, memory = self.state.speed_model(), self.state.memory_model()
        mean, std = speed.predict([oom.point])
        if mean[0] - std[0] > self.state.best_log():  # not promising: even optimistically no faster than the best
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
        if not keep or self.session.launched() >= exploration:
            return
        choice = self._pick(keep, speed, memory)
        if choice is None:
            return
        obs = self._run(choice, "partner")
        added = sorted(self.space.atoms_of(choice) - self.space.atoms_of(oom.point))
        if obs.status == "ok":
            self.state.rescued.append(
                {"oom_execution": oom.execution, "rescued_by": added, "execution": obs.execution, **choice.describe()}
            )
            self.session.meta["rescued"] = self.state.rescued
            self.session.save()
        elif obs.status == "oom" and depth < RESCUE_DEPTH and self.session.launched() < exploration:
            self._rescue(obs, exploration, depth + 1)
