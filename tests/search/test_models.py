"""The search's models on synthetic data: censored memory fit, speed model, learned failures."""

from __future__ import annotations

import math
import random

import numpy as np
from hypothesis import given, settings, strategies as st

from infrarsi._search.strategy._models import Failures, MemoryModel, SpeedModel, expected_improvement
from infrarsi._search.strategy._space import Space


def _space() -> Space:
    return Space(
        {"a": (("0", "1"), "0"), "b": (("0", "1", "2"), "0"), "c": (("0", "1"), "0"), "d": (("0", "1"), "0")},
        ["p", "q"],
    )


TRUE_LOG_MB = {"a=1": 0.45, "b=1": -0.10, "b=2": -0.25, "c=1": 0.05, "d=1": 0.0, "+p": 0.35, "+q": -0.05}
BASE_MB = 400.0


def _true_mb(space: Space, point) -> float:
    return BASE_MB * math.exp(sum(TRUE_LOG_MB[a] for a in space.atoms_of(point)))


def _observations(space: Space, limit: float, rng: random.Random, n: int = 40):
    points = [space.random_point(rng) for _ in range(n)] + [space.baseline()]
    peaks = [_true_mb(space, p) * math.exp(rng.gauss(0, 0.01)) for p in points]
    return points, peaks, [v > limit for v in peaks]


def test_censored_fit_recovers_memory_from_oom_evidence_better_than_dropping_ooms():
    space, limit = _space(), 560.0
    everything = space.pool(random.Random(0))
    truth = np.log([_true_mb(space, p) for p in everything])
    fits = np.array([_true_mb(space, p) < limit for p in everything])
    errors, wrong = {"tobit": [], "dropped": []}, {"tobit": [], "dropped": []}
    for seed in range(6):
        points, peaks, oom = _observations(space, limit, random.Random(seed))
        assert sum(oom) >= 10, "the landscape must put a good share of runs past the limit"
        kept = [i for i, o in enumerate(oom) if not o]
        models = {
            "tobit": MemoryModel(space, limit).fit(points, [None if o else v for v, o in zip(peaks, oom)], oom),
            "dropped": MemoryModel(space, limit).fit(
                [points[i] for i in kept], [peaks[i] for i in kept], [False] * len(kept)
            ),
        }
        for name, model in models.items():
            errors[name].append(np.sqrt(np.mean((model.predict(everything)[0] - truth) ** 2)))
            wrong[name].append(np.mean((model.p_fit(everything) > 0.5) != fits))
    assert np.mean(errors["tobit"]) < 0.75 * np.mean(errors["dropped"]), errors
    # The fit-or-not calls: censoring knows the memory-hungry combinations do not fit.
    assert np.mean(wrong["tobit"]) < 0.7 * np.mean(wrong["dropped"]), wrong
    assert max(wrong["tobit"]) < 0.1, wrong


def test_an_atom_seen_only_in_ooms_is_learned_to_cost_memory():
    """OOM-only evidence: `+p` never ran to completion, yet the fit says it needs memory."""
    space, limit = _space(), 500.0
    base = space.baseline()
    points = [
        base,
        space.with_atoms(base, ["b=1"]),
        space.with_atoms(base, ["c=1"]),
        space.with_atoms(base, ["+p"]),
        space.with_atoms(base, ["+p", "c=1"]),
        space.with_atoms(base, ["+p", "b=1"]),
    ]
    peaks = [400.0, 362.0, 421.0, None, None, None]
    oom = [False, False, False, True, True, True]
    tobit = MemoryModel(space, limit).fit(points, peaks, oom)
    assert tobit.predict_mb([space.with_atoms(base, ["+p"])])[0] > limit
    assert tobit.p_fit([space.with_atoms(base, ["+p"])])[0] < 0.2
    kept = [i for i, o in enumerate(oom) if not o]
    dropped = MemoryModel(space, limit).fit([points[i] for i in kept], [peaks[i] for i in kept], [False] * 3)
    assert dropped.p_fit([space.with_atoms(base, ["+p"])])[0] > 0.5  # dropping OOMs: "it fits"


def test_an_atom_that_only_ever_ran_out_of_memory_is_not_tried_again_at_the_limits_edge():
    """The demo's trap: `+p` beside a memory-hungry but fitting `a=1` runs out of memory with
    every partner; the fit puts `+p` just over the limit each time, so without the OOMs' blame
    the next combination is a coin toss, however many came before."""
    space, limit = _space(), 500.0
    base = space.baseline()
    fits = [(base, 400.0), (space.with_atoms(base, ["a=1"]), 490.0), (space.with_atoms(base, ["b=1"]), 362.0)]
    tried = [["a=1", "+p"], ["a=1", "+p", "b=1"], ["a=1", "+p", "c=1"], ["a=1", "+p", "b=2"]]
    points = [p for p, _ in fits] + [space.with_atoms(base, t) for t in tried]
    peaks = [v for _, v in fits] + [None] * len(tried)
    oom = [False] * len(fits) + [True] * len(tried)
    model = MemoryModel(space, limit).fit(points, peaks, oom)
    untried = space.with_atoms(base, ["a=1", "+p", "b=2", "d=1"])
    assert model.unescaped_["+p"] > 2 and "a=1" not in model.unescaped_  # a=1 fitted: never blamed
    assert model.p_fit([untried])[0] < 0.1
    without = MemoryModel(space, limit).fit(points, peaks, oom)
    without.unescaped_ = {}
    assert without.p_fit([untried])[0] > 0.3  # the fit alone: near the edge
    # The first run in which `+p` fits clears its share.
    cleared = MemoryModel(space, limit).fit(
        points + [space.with_atoms(base, ["+p", "b=2"])], peaks + [430.0], oom + [False]
    )
    assert "+p" not in cleared.unescaped_
    assert cleared.p_fit([space.with_atoms(base, ["+p", "b=1"])])[0] > 0.5


def test_speed_model_learns_an_interaction_and_is_unsure_where_it_has_no_data():
    space = _space()
    rng = random.Random(1)
    base = space.baseline()

    def true_time(point):
        atoms = space.atoms_of(point)
        t = 100.0 * (0.8 if "a=1" in atoms else 1.0) * (0.9 if "+p" in atoms else 1.0)
        return t * (0.7 if {"a=1", "+p"} <= atoms else 1.0)

    seen = [p for p in space.pool(rng) if "d=1" not in space.atoms_of(p)]
    rng.shuffle(seen)
    train = seen[:40]
    model = SpeedModel(space).fit(train, [true_time(p) * math.exp(rng.gauss(0, 0.01)) for p in train])
    both = space.with_atoms(base, ["a=1", "+p"])
    mean, std = model.predict([both, space.with_atoms(base, ["a=1"]), space.with_atoms(base, ["d=1"])])
    assert abs(math.exp(mean[0]) - true_time(both)) / true_time(both) < 0.05
    assert std[2] > 2 * std[0]  # never saw d=1: more uncertain there


def test_expected_improvement_prefers_lower_mean_and_more_uncertainty():
    ei = expected_improvement(np.array([0.0, -0.1, 0.0]), np.array([0.05, 0.05, 0.2]), best=0.0)
    assert ei[1] > ei[0] and ei[2] > ei[0]


def test_a_failure_that_a_passing_run_contains_is_a_flake():
    f = Failures()
    f.add_failure(frozenset({"a"}), "crash: flaky")
    f.add_success(frozenset({"a", "b"}))
    assert f.p_ok(frozenset({"a", "c"})) == 1.0 and f.incompatibilities() == []


def test_failures_learn_a_crashing_pair_and_stop_trying_it():
    f = Failures()
    f.add_failure(frozenset({"compile=1", "kernel=triton", "+x"}), "crash: cannot be combined")
    assert 0 < f.p_ok(frozenset({"kernel=triton"})) < 1  # suspect, not yet condemned
    for ok in ({"compile=1", "+x"}, {"kernel=triton"}, {"kernel=triton", "+x"}):
        f.add_success(frozenset(ok))
    learned = f.incompatibilities()
    assert learned == [{"atoms": ["compile=1", "kernel=triton"], "learned": True, "why": "crash: cannot be combined"}]
    assert f.p_ok(frozenset({"compile=1", "kernel=triton", "threads=2"})) == 0.0
    assert f.p_ok(frozenset({"kernel=triton", "threads=2"})) == 1.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sets(st.sampled_from(["a", "b", "c", "d", "e"]), min_size=1), st.booleans()), max_size=12))
def test_failures_never_clear_a_set_that_failed(events):
    """A failed set is never tried again, unless a passing run contains it (then it was a flake)."""
    f = Failures()
    failed_sets, passed = [], []
    for atoms, ok in events:
        atoms = frozenset(atoms)
        if ok:
            f.add_success(atoms)
            passed.append(atoms)
        else:
            f.add_failure(atoms, "crash")
            failed_sets.append(atoms)
    for atoms in failed_sets:
        if any(atoms <= ok for ok in passed):
            assert atoms not in [frozenset(i["atoms"]) for i in f.incompatibilities()]
            continue
        assert f.p_ok(atoms) == 0.0
        assert f.p_ok(atoms | {"z"}) == 0.0
    for found in f.incompatibilities():
        assert found["atoms"]


def test_promotion_puts_a_candidate_near_the_memory_limit_after_those_with_room():
    from infrarsi._search.strategy._state import MEMORY_MARGIN, Observation, SearchState

    space = _space()
    limit = 560.0
    base = Observation(space.baseline(), "ok", 0.300, 470.0, 1, "baseline")
    tight = space.point({"a": "1"}, ["p"])  # the fastest, but at 96% of the limit
    roomy = space.point({"b": "1"})  # slower, with room
    flaky = space.point({"c": "1"})  # fast once, out of memory once
    too_slow = space.point({"d": "1"})  # under min_speedup
    state = SearchState(
        space,
        base,
        limit,
        observations=[
            Observation(tight, "ok", 0.120, limit * 0.96, 2, "explore"),
            Observation(roomy, "ok", 0.200, limit * (1 - MEMORY_MARGIN) - 1, 3, "explore"),
            Observation(flaky, "ok", 0.150, 400.0, 4, "explore"),
            Observation(flaky, "oom", None, None, 5, "explore"),
            Observation(too_slow, "ok", 0.299, 400.0, 6, "explore"),
        ],
    )
    order = state.promotion_order(1.02)
    assert order[0] == roomy and set(order[1:]) == {tight, flaky}
    assert too_slow not in order
    # Without the memory evidence the same measurements rank by speed alone.
    free = SearchState(space, base, limit * 10, observations=[o for o in state.observations if o.status == "ok"])
    assert free.promotion_order(1.02)[0] == tight
