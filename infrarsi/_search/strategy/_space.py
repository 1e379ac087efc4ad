"""The joint search space: every knob choice and every subset of the patches.

A point is a full knob assignment plus a set of patch names. Its *atoms* are what it
changes from the original setup (``knob=value`` for each non-baseline choice, ``+patch``
for each patch); the models see a point through those atoms and their pairwise
products, so an effect that only shows in a combination can be learned.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import numpy as np

__all__ = ["Point", "Space", "Atom", "atom_label"]

Atom = str  # "knob=value" or "+patch"


def atom_label(atom: Atom) -> str:
    """How an atom reads to a person: ``knob=value``, or the patch's name."""
    return atom[1:] if atom.startswith("+") else atom


@dataclass(frozen=True, order=True)
class Point:
    knobs: tuple[tuple[str, str], ...]  # sorted (name, value) pairs, every knob
    patches: frozenset[str] = frozenset()

    @property
    def knob_map(self) -> dict[str, str]:
        return dict(self.knobs)

    def key(self) -> str:
        """A stable text form, for dedup and the ledger: ``a=x,b=y|+p1+p2``."""
        return ",".join(f"{k}={v}" for k, v in self.knobs) + "|" + "".join(f"+{p}" for p in sorted(self.patches))

    def describe(self) -> dict:
        return {"knobs": self.knob_map, "patches": sorted(self.patches)}


class Space:
    """Knobs (name -> choices, baseline) and patch names; encodes points as features."""

    def __init__(self, knobs: dict[str, tuple[tuple[str, ...], str]], patches: list[str]) -> None:
        self.knobs = dict(sorted(knobs.items()))
        self.patches = list(patches)
        self.atoms: list[Atom] = [
            f"{k}={v}" for k, (choices, base) in self.knobs.items() for v in choices if v != base
        ] + [f"+{p}" for p in self.patches]
        self._index = {a: i for i, a in enumerate(self.atoms)}
        self._owner = {a: a.split("=", 1)[0] if "=" in a else a for a in self.atoms}
        # Pairs of atoms that can occur together (two values of one knob cannot).
        self.pairs = [
            (i, j)
            for i, j in itertools.combinations(range(len(self.atoms)), 2)
            if self._owner[self.atoms[i]] != self._owner[self.atoms[j]]
        ]

    def add_patch(self, name: str) -> None:
        if name not in self.patches:
            self.__init__(self.knobs, self.patches + [name])

    @property
    def size(self) -> int:
        n = 2 ** len(self.patches)
        for choices, _ in self.knobs.values():
            n *= len(choices)
        return n

    def baseline(self) -> Point:
        return Point(tuple((k, base) for k, (_, base) in self.knobs.items()))

    def point(self, knobs: dict[str, str], patches=()) -> Point:
        full = {k: base for k, (_, base) in self.knobs.items()}
        full.update({k: v for k, v in knobs.items() if k in self.knobs})
        return Point(tuple(sorted(full.items())), frozenset(p for p in patches if p in self.patches))

    def atoms_of(self, point: Point) -> frozenset[Atom]:
        base = {k: b for k, (_, b) in self.knobs.items()}
        out = {f"{k}={v}" for k, v in point.knobs if base.get(k) != v}
        return frozenset(out | {f"+{p}" for p in point.patches})

    def with_atoms(self, point: Point, atoms) -> Point:
        """``point`` changed by ``atoms`` (a knob value replaces that knob's value; a patch is added)."""
        knobs, patches = point.knob_map, set(point.patches)
        for atom in atoms:
            if atom.startswith("+"):
                patches.add(atom[1:])
            else:
                name, value = atom.split("=", 1)
                knobs[name] = value
        return self.point(knobs, patches)

    def encode(self, points: list[Point]) -> np.ndarray:
        """Main effects (one column per atom) then pairwise interactions."""
        main = np.zeros((len(points), len(self.atoms)))
        for row, point in enumerate(points):
            for atom in self.atoms_of(point):
                main[row, self._index[atom]] = 1.0
        if not self.pairs:
            return main
        left = np.array([i for i, _ in self.pairs])
        right = np.array([j for _, j in self.pairs])
        return np.hstack([main, main[:, left] * main[:, right]])

    @property
    def n_main(self) -> int:
        return len(self.atoms)

    def neighbours(self, point: Point) -> list[Point]:
        """Every point one change away: one knob to another value, or one patch in or out."""
        out = []
        for name, (choices, _) in self.knobs.items():
            for value in choices:
                if value != point.knob_map[name]:
                    out.append(self.with_atoms(point, [f"{name}={value}"]))
        for patch in self.patches:
            patches = set(point.patches) ^ {patch}
            out.append(self.point(point.knob_map, patches))
        return out

    def random_point(self, rng: random.Random) -> Point:
        knobs = {k: rng.choice(choices) for k, (choices, _) in self.knobs.items()}
        return self.point(knobs, [p for p in self.patches if rng.random() < 0.5])

    def pool(self, rng: random.Random, limit: int = 4096) -> list[Point]:
        """Every point when the space is small enough, else ``limit`` random ones."""
        if self.size <= limit:
            names = list(self.knobs)
            out = []
            for values in itertools.product(*(self.knobs[n][0] for n in names)):
                knobs = dict(zip(names, values))
                for r in range(len(self.patches) + 1):
                    for subset in itertools.combinations(self.patches, r):
                        out.append(self.point(knobs, subset))
            return out
        return list(dict.fromkeys(self.random_point(rng) for _ in range(limit)))
