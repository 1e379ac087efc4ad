"""The methods compared on a landscape, each spending its budget as real executions.

Every method returns its exploration executions in order, each
``{"status", "speedup", "knobs", "patches"}`` with ``speedup`` the measured one
(baseline median / step time, None unless ok), the shape of ``SearchOutcome.history``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

from infrarsi import run
from infrarsi._search import search
from infrarsi.examples.landscape import Landscape

__all__ = ["Arena", "ours", "random_search", "greedy", "tpe", "point_key"]


def point_key(knobs: dict, patches) -> tuple:
    return tuple(sorted(knobs.items())), frozenset(patches)


@dataclass
class Arena:
    """One (method, seed) run's workspace: a copy of the landscape's baselined template."""

    land: Landscape
    contract: Path
    base_step_s: float
    budget: int

    def baseline_knobs(self) -> dict:
        return {name: base for name, (_, base) in self.land.knobs.items()}

    def execute(self, knobs: dict, patches) -> dict:
        """One real execution through the runner, recorded in this workspace's ledger."""
        outcome = run(self.contract, sets=dict(knobs), patches=sorted(patches))
        ok = outcome.status == "ok" and outcome.step_time_s
        return {
            "status": outcome.status,
            "speedup": self.base_step_s / outcome.step_time_s if ok else None,
            "step_time_s": outcome.step_time_s if ok else None,
            "knobs": dict(knobs),
            "patches": sorted(patches),
        }


def ours(arena: Arena, seed: int, pack: Path | None = None) -> list[dict]:
    """infrarsi's search, exploration only."""
    outcome = search(arena.contract, budget=arena.budget, seed=seed, promote=False, pack=pack)
    return [{k: h[k] for k in ("status", "speedup", "knobs", "patches", "origin")} for h in outcome.history]


def random_search(arena: Arena, seed: int) -> list[dict]:
    """Distinct points drawn uniformly from the joint space (the baseline is already known)."""
    base = point_key(arena.baseline_knobs(), [])
    points = [(k, p) for k, p in arena.land.points() if point_key(k, p) != base]
    chosen = random.Random(seed).sample(points, min(arena.budget, len(points)))
    return [arena.execute(k, p) for k, p in chosen]


def _single_changes(land: Landscape, knobs: dict, patches: list[str]) -> list[tuple[dict, list[str]]]:
    out = [
        ({**knobs, name: value}, patches)
        for name, (choices, _) in land.knobs.items()
        for value in choices
        if value != knobs[name]
    ]
    return out + [(knobs, sorted(patches + [p])) for p in land.patches if p not in patches]


def greedy(arena: Arena, seed: int) -> list[dict]:
    """One knob (or one patch) at a time: sweep every single change, move to the best, repeat.

    The seed only orders each sweep, which matters when the budget ends mid-sweep.
    Failures (oom, crash) count as no improvement; a point is never run twice.
    """
    rng = random.Random(seed)
    history: list[dict] = []
    knobs, patches = arena.baseline_knobs(), []
    times = {point_key(knobs, patches): arena.base_step_s}
    while len(history) < arena.budget:
        moves = _single_changes(arena.land, knobs, patches)
        rng.shuffle(moves)
        best = None
        for move in moves:
            key = point_key(*move)
            if key not in times:
                if len(history) >= arena.budget:
                    break
                entry = arena.execute(*move)
                history.append(entry)
                times[key] = entry["step_time_s"] or math.inf
            if times[key] < (times[point_key(*best)] if best else times[point_key(knobs, patches)]):
                best = move
        if best is None:
            break
        knobs, patches = best
    return history


def tpe(arena: Arena, seed: int, joint: bool) -> tuple[list[dict], int]:
    """Optuna's TPE over the knobs (patches off), or over knobs and one boolean per patch.

    The baseline enters the study as a finished trial. Failures score ten baseline step
    times (TPE ranks trials, so the size only has to put them last). A suggestion already
    run is answered from its earlier measurement without spending an execution, which can
    only help TPE; returns the history and how many suggestions were answered so.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists = {
        name: optuna.distributions.CategoricalDistribution(list(choices))
        for name, (choices, _) in sorted(arena.land.knobs.items())
    }
    if joint:
        dists.update(
            {f"patch:{p}": optuna.distributions.CategoricalDistribution([False, True]) for p in arena.land.patches}
        )
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed))
    base_params = {**arena.baseline_knobs(), **{f"patch:{p}": False for p in arena.land.patches if joint}}
    study.add_trial(optuna.trial.create_trial(params=base_params, distributions=dists, value=arena.base_step_s))
    failed = 10 * arena.base_step_s
    seen = {point_key(arena.baseline_knobs(), []): arena.base_step_s}
    history: list[dict] = []
    repeats = 0
    for _ in range(20 * arena.budget):  # a bound on suggestions, should TPE keep repeating itself
        if len(history) >= arena.budget:
            break
        trial = study.ask(dists)
        knobs = {name: trial.params[name] for name in arena.land.knobs}
        patches = [p for p in arena.land.patches if trial.params.get(f"patch:{p}")]
        key = point_key(knobs, patches)
        if key in seen:
            repeats += 1
        else:
            entry = arena.execute(knobs, patches)
            history.append(entry)
            seen[key] = entry["step_time_s"] or failed
        study.tell(trial, seen[key])
    return history, repeats
