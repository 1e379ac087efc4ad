"""Promotion: the best explored candidates by posterior go through the full `verify`,
those that came within `MEMORY_MARGIN` of the memory limit after those with room.

Only a candidate with a receipt is promoted. Promotions begun before a resume are
settled from the ledger and the receipts: finished ones count again, a cut one whose
receipt was written is finished from it, any other is re-run whole.
"""

from __future__ import annotations

import json

from infrarsi._search._pruning import prune
from infrarsi._search._session import SearchSession
from infrarsi._search.strategy._space import Point
from infrarsi._search.strategy._state import exploration_budget, long_runs, promotion_cost

__all__ = ["Promotion"]


class Promotion:
    """Sends the session's best candidates through the full `verify`; results land in ``session.attempts``."""

    def __init__(self, session: SearchSession) -> None:
        self.session = session

    def ranked(self) -> list[Point]:
        """Candidates in promotion order (`SearchState.promotion_order`)."""
        return self.session.state.promotion_order(float(self.session.ws.contract.search.min_speedup))

    def promote(self, budget: int) -> None:
        """Verify the best-ranked candidates in turn until ``promote_top`` are accepted or the budget is spent."""
        session = self.session
        contract = session.ws.contract
        extra = long_runs(contract)
        cost = promotion_cost(contract.search.ab_pairs, extra)
        done = self._settle()
        session.meta["promote_stop"] = "every candidate the models rank above min_speedup was verified"
        for point in self.ranked():
            if len([a for a in session.attempts if a["accepted"]]) >= contract.search.promote_top:
                session.meta["promote_stop"] = f"promote_top = {contract.search.promote_top} candidates were accepted"
                break
            original = point.key()
            if original in done:
                continue
            pruned = session.meta.setdefault("pruned", {})
            if original in pruned:  # pruned before a resume: the same answer, no second ablation
                point, dropped = session.space.point(**pruned[original]["point"]), pruned[original]["dropped"]
            else:
                room = budget - session.launched() - cost
                point, dropped = prune(session, point, room, self._ablate, float(contract.search.min_speedup))
                pruned[original] = {"point": point.describe(), "dropped": dropped}
                session.save()
            key = point.key()
            if key in done:
                continue
            if budget - session.launched() < cost:
                session.messages.append(
                    f"budget left ({budget - session.launched()}) is less than one promotion ({cost})"
                )
                session.meta["promote_stop"] = (
                    f"the budget left ({budget - session.launched()}) is less than one promotion ({cost})"
                )
                break
            n = len(session.meta.setdefault("promotions", []))
            batch = f"{session.batch}-verify-{n}"
            entry = {"key": key, "batch": batch, "finished": False, **point.describe(), "dropped": dropped}
            session.meta["promotions"].append(entry)
            session.save()

            def tick(done_runs, total, result, point=point):
                session.tick(
                    "promote", f"verify {' '.join(point.describe()['patches']) or 'knobs'}: {done_runs}/{total}"
                )

            # The sequential A/B may go on past ab_pairs while undecided, within the budget left
            # after the later promotions planned are reserved at their first look.
            _, planned = exploration_budget(
                budget, contract.search.promote_top, contract.search.ab_pairs, contract.ab_max_pairs, extra
            )
            reserved = max(0, planned - len(session.meta["promotions"])) * cost
            room = (budget - session.launched() - reserved - 1 - extra) // 2
            most = max(contract.search.ab_pairs, min(contract.ab_max_pairs, room))
            outcome = session.verify(session.candidate(point), batch, contract.search.ab_pairs, tick, max_pairs=most)
            entry.update(
                finished=True,
                accepted=outcome.accepted,
                speedup=outcome.speedup,
                receipt=str(outcome.receipt) if outcome.receipt else None,
                failed=[c.id for c in outcome.checks if c.status in ("fail", "unchecked")],
                why={c.id: c.detail for c in outcome.checks if c.status in ("fail", "unchecked")},
            )
            session.save()
            session.attempts.append(entry)
            done.add(key)

    def _ablate(self, point: Point) -> float | None:
        """One run of ``point`` (a candidate without one of its changes); its step time if it finished ok."""
        from infrarsi._search._exploring import Exploration

        obs = Exploration(self.session)._run(point, "ablation")
        return obs.step_time_s if obs.status == "ok" else None

    def _settle(self) -> set[str]:
        """Promotions begun before a resume: finished ones count again (accepted only if their
        receipt still verifies); one a kill cut after its receipt was written is finished from it."""
        from infrarsi._receipt import verify_receipt

        session = self.session
        done: set[str] = set()
        receipts = sorted((session.ws.contract.state_dir / "receipts").glob("*.json"))
        for entry in session.meta.get("promotions", []):
            if not entry.get("finished"):
                ids = {r["id"] for r in session.rows() if r.get("batch") == entry["batch"]}
                for path in receipts:
                    try:
                        body = json.loads(path.read_text())["receipt"]
                    except (OSError, ValueError, KeyError, TypeError):
                        continue
                    if ids and set(body.get("executions", [])) <= ids:
                        entry.update(
                            finished=True, accepted=True, speedup=body.get("speedup"), receipt=str(path), failed=[]
                        )
                        break
                else:
                    entry["abandoned"] = True  # cut by a kill: re-run whole, in a new batch, if still ranked
                    continue
            if entry.get("accepted") and not (
                entry.get("receipt") and verify_receipt(entry["receipt"], session.ws.key.public_hex).ok
            ):
                entry.update(accepted=False, failed=["receipt: missing or does not verify"])
            session.attempts.append(entry)
            done.add(entry["key"])
        session.save()
        return done
