"""Promotion: the best explored candidates by posterior go through the full `verify`,
those that came within `MEMORY_MARGIN` of the memory limit after those with room.

Only a candidate with a receipt is promoted. Promotions begun before a resume are
settled from the ledger and the receipts: finished ones count again, a cut one whose
receipt was written is finished from it, any other is re-run whole.
"""

from __future__ import annotations

import json

from infrarsi.search._space import Point
from infrarsi.search._state import promotion_cost


class Promoting:
    """A mixin of the search driver (`_engine._Search`): it uses the driver's ws, meta,
    space, state, patches, origins, messages, batch, journal, executor and bookkeeping."""

    def ranked(self) -> list[Point]:
        """Candidates in promotion order (`SearchState.promotion_order`)."""
        return self.state.promotion_order(float(self.ws.contract.search.min_speedup))

    def promote(self, budget: int) -> None:
        """Verify the best-ranked candidates in turn until ``promote_top`` are accepted or the budget is spent."""
        from infrarsi._verify import _Verification

        contract = self.ws.contract
        cost = promotion_cost(contract.search.ab_pairs)
        done = self._settle_promotions()
        for point in self.ranked():
            if len([a for a in self.attempts if a["accepted"]]) >= contract.search.promote_top:
                break
            key = point.key()
            if key in done:
                continue
            if budget - self.launched() < cost:
                self.messages.append(f"budget left ({budget - self.launched()}) is less than one promotion ({cost})")
                break
            n = len(self.meta.setdefault("promotions", []))
            batch = f"{self.batch}-verify-{n}"
            entry = {"key": key, "batch": batch, "finished": False, **point.describe()}
            self.meta["promotions"].append(entry)
            self._save()
            self.executor.batch = batch
            self.ws.executor, inner = self.executor, self.ws.executor

            def tick(done_runs, total, result):
                self._tick("promote", f"verify {' '.join(point.describe()['patches']) or 'knobs'}: "
                                      f"{done_runs}/{total}")

            try:
                outcome = _Verification(self.ws, self._candidate(point), {"summary": self.summary,
                                        "id": self.baseline_id}, contract.search.ab_pairs, tick, batch=batch).run()
            finally:
                self.journal.clear()
                self.ws.executor = inner
            entry.update(finished=True, accepted=outcome.accepted, speedup=outcome.speedup,
                         receipt=str(outcome.receipt) if outcome.receipt else None,
                         failed=[c.id for c in outcome.checks if c.status in ("fail", "unchecked")])
            self._save()
            self.attempts.append(entry)
            done.add(key)

    def _settle_promotions(self) -> set[str]:
        """Promotions begun before a resume: finished ones count again (accepted only if their
        receipt still verifies); one a kill cut after its receipt was written is finished from it."""
        from infrarsi._receipt import verify_receipt

        done: set[str] = set()
        receipts = sorted((self.ws.contract.state_dir / "receipts").glob("*.json"))
        for entry in self.meta.get("promotions", []):
            if not entry.get("finished"):
                ids = {r["id"] for r in self._rows() if r.get("batch") == entry["batch"]}
                for path in receipts:
                    try:
                        body = json.loads(path.read_text())["receipt"]
                    except (OSError, ValueError, KeyError, TypeError):
                        continue
                    if ids and set(body.get("executions", [])) <= ids:
                        entry.update(finished=True, accepted=True, speedup=body.get("speedup"), receipt=str(path),
                                     failed=[])
                        break
                else:
                    entry["abandoned"] = True   # cut by a kill: re-run whole, in a new batch, if still ranked
                    continue
            if entry.get("accepted") and not (entry.get("receipt")
                                              and verify_receipt(entry["receipt"], self.ws.key.public_hex).ok):
                entry.update(accepted=False, failed=["receipt: missing or does not verify"])
            self.attempts.append(entry)
            done.add(entry["key"])
        self._save()
        return done
