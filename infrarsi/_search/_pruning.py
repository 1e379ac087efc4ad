"""Before a candidate is promoted, the changes in it that do not pay are dropped: a patch that is
dead code once a knob is on, a knob setting that buys nothing. A receipt then vouches only for
what earns the speedup, and `apply` commits nothing that does no work.

A change is dropped when the candidate without it was observed no slower, within the noise
(the baseline's run-to-run CV, held between 1% and 3%). Where the candidate without a change was
never run, one ablation run is spent on the change the speed model rates least useful, when the
budget still holds it beside the promotion; a change is never dropped on the model's word alone.
"""

from __future__ import annotations

from infrarsi._search._session import SearchSession
from infrarsi._search.strategy._space import Atom, Point, atom_label

__all__ = ["prune", "NOISE_FLOOR", "NOISE_CAP"]

NOISE_FLOOR, NOISE_CAP = 0.01, 0.03


def _without(session: SearchSession, point: Point, atom: Atom) -> Point:
    knobs, patches = point.knob_map, set(point.patches)
    if atom.startswith("+"):
        patches.discard(atom[1:])
    else:
        name = atom.split("=", 1)[0]
        knobs[name] = session.space.knobs[name][1]
    return session.space.point(knobs, patches)


def _tolerance(session: SearchSession) -> float:
    cv = (session.summary.get("step_time_s") or {}).get("cv")
    cv = float(cv) if isinstance(cv, (int, float)) else NOISE_FLOOR
    return min(max(cv, NOISE_FLOOR), NOISE_CAP)


def prune(session: SearchSession, point: Point, room: int, run, min_speedup: float = 1.0) -> tuple[Point, list[dict]]:
    """``point`` without its changes that do not pay, and what was dropped with the evidence.

    ``room`` is how many executions may go to an ablation run (0: none); ``run(point)`` runs one
    and returns its step time (None when it did not finish ok). A smaller candidate is taken
    only where its own run still beat the baseline by ``min_speedup``: a drop within the noise
    must not turn a candidate that clears the bar into one that does not."""
    base = session.state.baseline.step_time_s
    times = {o.point: o.step_time_s for o in session.state.ok()}
    time = times.get(point)
    if time is None:
        return point, []
    tol = _tolerance(session)
    dropped: list[dict] = []
    ablated = False
    while True:
        atoms = sorted(session.space.atoms_of(point), key=lambda a: (not a.startswith("+"), a))  # patches first
        if len(atoms) < 2:
            return point, dropped  # the last change is what the candidate is
        smaller = {atom: _without(session, point, atom) for atom in atoms}
        drop = next(
            (
                a
                for a in atoms
                if times.get(smaller[a]) is not None
                and times[smaller[a]] <= time * (1 + tol)
                and base / times[smaller[a]] > min_speedup
            ),
            None,
        )
        if drop is not None:
            without = times[smaller[drop]]
            dropped.append(
                {
                    "dropped": atom_label(drop),
                    "why": f"without it a run took {without * 1e3:.2f} ms against {time * 1e3:.2f} ms with it "
                    f"(within the {tol:.0%} noise): it does not pay",
                }
            )
            point, time = smaller[drop], without
            continue
        unseen = [
            a
            for a in atoms
            if times.get(smaller[a]) is None
            and smaller[a] not in session.state.tried()
            and session.state.p_ok([smaller[a]])[0] > 0
        ]
        if ablated or room <= 0 or not unseen:
            return point, dropped
        mean, _ = session.state.speed_model().predict([smaller[a] for a in unseen])
        atom = unseen[int(mean.argmin())]  # the change whose loss the model expects to hurt least
        ablated = True
        measured = run(smaller[atom])
        if measured is None:
            return point, dropped
        times[smaller[atom]] = measured
