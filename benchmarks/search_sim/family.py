"""Generated search landscapes shaped like real jobs (issue 31): a seeded family, each with its
exhaustive optimum, to judge the search on landscapes it was never tuned on.

``generate(seed)`` draws, reproducibly from the seed alone:

- 4 to 8 knobs of 2 to 4 choices (the baseline is each knob's first choice) and 2 to 6 patches,
  the joint space capped at ``MAX_POINTS`` (the draw is repeated until it fits);
- a speed effect for every change: most help a little (0.85-0.98), some do nothing, some hurt
  (1.03-1.25); 2 to 6 pairwise and 0 to 2 three-way interactions (0.80-1.20 on top);
- an out-of-memory cliff: one change that helps a lot (0.60-0.75) needs more memory than the
  limit leaves, and only one of 1 or 2 memory-saving partners (which cost some speed) gets it
  past; the other changes move the memory a little;
- 1 to 3 pairs and 0 or 1 triple of changes that crash together, and 0 to 2 pairs of patches
  whose diffs do not apply together;
- timing noise from 1% to 5%.

It keeps a draw only when the optimum needs 3 to 7 changes from the baseline (else it draws
again, from the same stream). The landscape runs as real executions of the landscape job
(``infrarsi.examples.landscape``), as the hand-made ``dense`` and ``moe`` do.

    python benchmarks/search_sim/family.py --seeds 0-9      # describe ten landscapes
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import infrarsi.examples.landscape as landscape  # noqa: E402
from infrarsi.examples.landscape import Landscape  # noqa: E402

__all__ = ["generate", "describe", "MAX_POINTS"]

MAX_POINTS = 2**16  # the joint space (knob values x patch subsets) of one landscape, at most
CHANGES = (3, 7)  # the optimum's distance from the baseline, in changes


def _draw_shape(rng: random.Random) -> tuple[dict[str, tuple[list[str], str]], list[str]]:
    while True:
        sizes = [rng.randint(2, 4) for _ in range(rng.randint(4, 8))]
        patches = [f"p{i}" for i in range(rng.randint(2, 6))]
        if math.prod(sizes) * 2 ** len(patches) <= MAX_POINTS:
            knobs = {f"k{i}": ([f"v{j}" for j in range(n)], "v0") for i, n in enumerate(sizes)}
            return knobs, patches


def _changes(knobs: dict, patches: list[str]) -> list[str]:
    """Every atom: a knob at one of its other values, or a patch on."""
    return [f"{k}={v}" for k, (choices, base) in knobs.items() for v in choices if v != base] + [
        f"+{p}" for p in patches
    ]


def _knob(atom: str) -> str:
    return atom.split("=", 1)[0] if "=" in atom else atom


def _compatible(atoms: tuple[str, ...]) -> bool:
    """Atoms that can hold together: no two values of one knob."""
    names = [_knob(a) for a in atoms]
    return len(set(names)) == len(names)


def _sets(rng: random.Random, atoms: list[str], size: int, count: int) -> list[tuple[str, ...]]:
    pool = [c for c in itertools.combinations(atoms, size) if _compatible(c)]
    return rng.sample(pool, min(count, len(pool)))


def _key(atoms) -> str:
    return "&".join(atoms)


def _one(rng: random.Random, seed: int) -> tuple[Landscape, str, str]:
    """A landscape, its big change and the partner meant to get it past the memory limit."""
    knobs, patches = _draw_shape(rng)
    atoms = _changes(knobs, patches)
    time: dict[str, float] = {}
    for atom in atoms:
        kind = rng.random()
        if kind < 0.55:
            time[atom] = rng.uniform(0.85, 0.98)
        elif kind < 0.8:
            time[atom] = rng.uniform(0.98, 1.02)
        else:
            time[atom] = rng.uniform(1.03, 1.25)
    for pair in _sets(rng, atoms, 2, rng.randint(2, 6)):
        time[_key(pair)] = rng.uniform(0.80, 1.20)
    for triple in _sets(rng, atoms, 3, rng.randint(0, 2)):
        time[_key(triple)] = rng.uniform(0.80, 1.20)

    base_mb = float(rng.randint(80, 120))
    memory = {a: float(rng.randint(-5, 8)) for a in atoms if rng.random() < 0.4}
    big = rng.choice(atoms)
    time[big] = rng.uniform(0.60, 0.75)
    big_mb = float(rng.randint(60, 90))
    memory[big] = big_mb
    others = [a for a in atoms if _knob(a) != _knob(big)]
    savers = rng.sample(others, min(len(others), rng.randint(1, 2)))
    for saver in savers:
        memory[saver] = -float(rng.randint(45, 70))
        time[saver] = rng.uniform(1.03, 1.15)
    # The cliff: the big change alone does not fit; with its first partner it does. The other
    # changes' few MB move the edge, so some combinations on either side still surprise.
    limit = base_mb + landscape.OVERHEAD_MB + big_mb - abs(memory[savers[0]]) / 2

    crash = [_key(pair) for pair in _sets(rng, atoms, 2, rng.randint(1, 3))]
    crash += [_key(triple) for triple in _sets(rng, atoms, 3, rng.randint(0, 1))]
    patch_atoms = [f"+{p}" for p in patches]
    conflicts = [_key(pair) for pair in _sets(rng, patch_atoms, 2, rng.randint(0, 2))]
    land = Landscape(
        name=f"gen-{seed}",
        knobs=knobs,
        patches=patches,
        base_ms=float(rng.randint(20, 40)),
        base_mb=base_mb,
        limit_mb=round(limit, 1),
        time={k: round(v, 4) for k, v in time.items()},
        memory=memory,
        crash=crash,
        conflicts=conflicts,
        noise=round(rng.uniform(0.01, 0.05), 4),
    )
    return land, big, savers[0]


def _cliff_holds(land: Landscape, big: str, saver: str) -> bool:
    """The big change alone runs out of memory, and with its partner it fits (the limit is
    placed in a gap of the memory totals by Landscape, which may move it)."""
    base = {name: b for name, (_, b) in land.knobs.items()}

    def point(atoms: list[str]) -> tuple[dict, list[str]]:
        knobs = dict(base)
        knobs.update(dict(a.split("=", 1) for a in atoms if "=" in a))
        return knobs, [a[1:] for a in atoms if a.startswith("+")]

    def fits(atoms: list[str]) -> bool:
        return land.memory_mb(*point(atoms)) + landscape.OVERHEAD_MB < land.limit_mb

    return not fits([big]) and fits([big, saver])


def generate(seed: int) -> Landscape:
    """The family's landscape number ``seed`` (the same every time)."""
    rng = random.Random(f"infrarsi-landscape-family-{seed}")
    while True:
        land, big, saver = _one(rng, seed)
        knobs, patches = land.best_point()
        needed = len(land.atoms(knobs, patches))
        if CHANGES[0] <= needed <= CHANGES[1] and land.optimum() > 1.0 and _cliff_holds(land, big, saver):
            return land


def describe(land: Landscape) -> dict:
    """What a table or a reader needs of one landscape: its size, optimum and traps."""
    grid = land.grid()
    knobs, patches = land.best_point()
    return {
        "name": land.name,
        "knobs": {k: len(c) for k, (c, _) in sorted(land.knobs.items())},
        "patches": len(land.patches),
        "points": int(grid.masks.size),
        "feasible": int(grid.feasible().sum()),
        "optimum": round(land.optimum(), 4),
        "optimum_changes": sorted(land.atoms(knobs, patches)),
        "crash": land.crash,
        "conflicts": land.conflicts,
        "noise": land.noise,
        "limit_mb": land.limit_mb,
    }


def _seeds(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0-9", help="a seed or a range FIRST-LAST")
    args = ap.parse_args(argv)
    for seed in _seeds(args.seeds):
        print(json.dumps(describe(generate(seed))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
