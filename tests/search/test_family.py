"""The generated landscape family (benchmarks/search_sim/family.py, issue 31): reproducible from
the seed, within the sizes the issue names, its exhaustive optimum the same as a point-by-point
count, its out-of-memory cliff real, and patches that do not apply together really rejected."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "search_sim"))

import family  # noqa: E402

from infrarsi import init, run  # noqa: E402
from infrarsi.examples import landscape  # noqa: E402

SEEDS = range(40)


def test_a_seed_gives_the_same_landscape_every_time():
    assert family.describe(family.generate(7)) == family.describe(family.generate(7))
    assert family.describe(family.generate(7)) != family.describe(family.generate(8))


@pytest.mark.parametrize("seed", SEEDS)
def test_every_landscape_is_within_the_issues_shape(seed):
    land = family.generate(seed)
    facts = family.describe(land)
    assert 4 <= len(land.knobs) <= 8 and all(2 <= len(c) <= 4 for c, _ in land.knobs.values())
    assert 2 <= len(land.patches) <= 6 and facts["points"] <= family.MAX_POINTS
    assert 3 <= len(facts["optimum_changes"]) <= 7 and facts["optimum"] > 1.0
    assert 0.01 <= land.noise <= 0.05
    assert land.crash and all(1 < len(k.split("&")) <= 3 for k in land.crash)
    assert all(all(a.startswith("+") for a in k.split("&")) for k in land.conflicts)
    # Some points run out of memory, some crash: the landscape has both kinds of wall.
    grid = land.grid()
    assert (grid.memory_mb + landscape.OVERHEAD_MB >= land.limit_mb).any() and grid.broken.any()


@pytest.mark.parametrize("seed", [s for s in SEEDS if family.describe(family.generate(s))["points"] <= 3000][:6])
def test_the_exhaustive_optimum_is_the_best_point_counted_one_by_one(seed):
    land = family.generate(seed)
    by_hand = max(land.speedup(k, p) for k, p in land.points())
    assert land.optimum() == pytest.approx(by_hand)
    knobs, patches = land.best_point()
    assert land.feasible(knobs, patches) and land.speedup(knobs, patches) == pytest.approx(by_hand)


def test_patches_that_do_not_apply_together_are_rejected_by_git_apply(tmp_path):
    land = next(family.generate(s) for s in SEEDS if family.generate(s).conflicts)
    first, second = (a[1:] for a in land.conflicts[0].split("&"))
    root = landscape.make_workspace(tmp_path / land.name, land)
    init(root / "infrarsi.toml")
    both = run(root / "infrarsi.toml", patches=[first, second])
    assert both.status == "rejected", both
    alone = run(root / "infrarsi.toml", patches=[first])
    assert alone.status in ("ok", "oom", "crash") and alone.status != "rejected", alone
