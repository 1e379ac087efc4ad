"""Apply only what pays: before promotion, a change the candidate does not need is dropped, on
observed evidence (a run without it, or one ablation run), never on the model's word alone."""

from __future__ import annotations

from types import SimpleNamespace

from infrarsi._search._pruning import prune
from infrarsi._search.strategy._space import Space
from infrarsi._search.strategy._state import Observation, SearchState


def _session(cv: float = 0.02):
    space = Space({"attn": (("manual", "sdpa"), "manual")}, ["mask-cache", "fused-adam"])
    base = Observation(space.baseline(), "ok", 0.100, 100.0, 1, "baseline")
    state = SearchState(space, base, limit_mb=1000.0)
    return SimpleNamespace(space=space, state=state, summary={"step_time_s": {"median": 0.1, "cv": cv}})


def _observe(session, knobs: dict, patches: list[str], step_s: float) -> None:
    point = session.space.point(knobs, patches)
    session.state.add(Observation(point, "ok", step_s, 100.0, len(session.state.observations) + 2, "test"))


def _no_runs(point):
    raise AssertionError(f"no ablation run expected, got {point}")


def test_a_patch_that_is_dead_code_once_the_knob_is_on_is_dropped_on_observed_runs():
    session = _session()
    _observe(session, {"attn": "sdpa"}, [], 0.050)
    _observe(session, {"attn": "sdpa"}, ["mask-cache"], 0.0505)  # within the 2% noise: it does nothing
    best = session.space.point({"attn": "sdpa"}, ["mask-cache"])
    pruned, dropped = prune(session, best, room=0, run=_no_runs)
    assert pruned == session.space.point({"attn": "sdpa"}, [])
    assert [d["dropped"] for d in dropped] == ["mask-cache"] and "does not pay" in dropped[0]["why"]


def test_a_change_that_pays_is_kept_and_the_last_change_is_never_dropped():
    session = _session()
    _observe(session, {"attn": "sdpa"}, [], 0.050)
    _observe(session, {"attn": "sdpa"}, ["fused-adam"], 0.045)  # 10% faster with it: it pays
    _observe(session, {}, ["fused-adam"], 0.090)
    best = session.space.point({"attn": "sdpa"}, ["fused-adam"])
    assert prune(session, best, room=0, run=_no_runs) == (best, [])
    only = session.space.point({"attn": "sdpa"}, [])
    assert prune(session, only, room=5, run=_no_runs) == (only, [])


def test_without_evidence_one_ablation_run_decides_and_only_with_room_for_it():
    session = _session()
    _observe(session, {"attn": "sdpa"}, ["mask-cache"], 0.050)
    _observe(session, {}, ["mask-cache"], 0.100)  # the knob pays (seen); the patch alone does nothing
    best = session.space.point({"attn": "sdpa"}, ["mask-cache"])
    assert prune(session, best, room=0, run=_no_runs) == (best, [])  # no room: nothing dropped on the model
    ran = []

    def run(point):
        ran.append(point)
        return 0.0502

    pruned, dropped = prune(session, best, room=1, run=run)
    assert ran == [session.space.point({"attn": "sdpa"}, [])]  # one ablation run, of the patch
    assert pruned == ran[0] and [d["dropped"] for d in dropped] == ["mask-cache"]
    # An ablation that shows the change pays keeps it.
    assert prune(session, best, room=1, run=lambda point: 0.060) == (best, [])


def test_a_drop_that_would_fall_below_min_speedup_is_not_taken():
    session = _session(cv=0.03)  # 3% noise: 99.5 ms is "within the noise" of 97 ms
    _observe(session, {"attn": "sdpa"}, [], 0.0995)  # 1.005x alone: below min_speedup
    _observe(session, {"attn": "sdpa"}, ["mask-cache"], 0.097)  # 1.031x: clears 1.02
    best = session.space.point({"attn": "sdpa"}, ["mask-cache"])
    assert prune(session, best, room=0, run=_no_runs, min_speedup=1.02) == (best, [])
    pruned, dropped = prune(session, best, room=0, run=_no_runs, min_speedup=1.0)
    assert pruned != best and "99.50 ms against 97.00 ms" in dropped[0]["why"]
