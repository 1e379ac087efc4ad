"""One search's shared state and bookkeeping: what proposals, resume, exploration and promotion all use.

The session holds the workspace, the search's meta (saved to the ledger with `save`),
the stored baseline, the space and the state, the patches and where they came from,
and the journal. It is also the one place an execution is started (`verify`): in this
search's batches, through the journalled executor, so a SIGKILL leaves a trace.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from infrarsi._search._journal import Journal, JournalledExecutor
from infrarsi._search.strategy._space import Point, Space
from infrarsi._search.strategy._state import Observation, SearchState
from infrarsi._workspace import Workspace
from infrarsi.contract import Candidate, PatchRef

__all__ = ["META_KEY", "SearchSession"]

META_KEY = "search:current"


class SearchSession:
    """One search's shared state: workspace, meta, baseline, space, state, patches, journal and bookkeeping."""

    def __init__(
        self,
        ws: Workspace,
        stored_baseline: dict,
        meta: dict,
        progress: Callable[[str, int, int, str], None] | None = None,
    ) -> None:
        self.ws, self.meta, self.progress = ws, meta, progress
        self.summary, self.baseline_id = stored_baseline["summary"], stored_baseline["id"]
        self.id = meta["id"]
        self.batch = f"search-{self.id}"
        self.messages: list[str] = []
        self.patches: dict[str, PatchRef] = {}
        self.origins: dict[str, str] = {}
        self.history: list[dict] = []
        self.attempts: list[dict] = []
        contract = ws.contract
        knobs = {name: (k.choices, k.baseline) for name, k in contract.knobs.items()}
        self.space = Space(knobs, [])
        self.state = SearchState(
            self.space,
            Observation(
                self.space.baseline(),
                "ok",
                self.summary["step_time_s"]["median"],
                self.summary.get("peak_mem_mb"),
                None,
                "baseline",
            ),
            float(contract.resources.memory_limit_mb),
        )
        self.journal = Journal(contract.state_dir / "search" / f"{self.id}.inflight.json")
        self.executor = JournalledExecutor(ws.executor, self.journal, ws.ledger)
        self._cache: tuple[int, list[dict]] = (-1, [])

    # -- bookkeeping ------------------------------------------------------------------------

    def journals_on_disk(self) -> list[Journal]:
        """Every journal of this search a kill may have left: its own and each worker's."""
        folder = self.journal.path.parent
        return [Journal(path) for path in sorted(folder.glob(f"{self.id}.inflight*.json"))]

    def worker(self, slot: int, rows_before: int) -> JournalledExecutor:
        """The journalled executor worker ``slot`` runs one exploration execution through, with a
        journal of its own (the search's own may be cleared meanwhile by a `verify` that never ran
        anything); ``rows_before`` is the ledger's count now."""
        path = self.journal.path.with_name(f"{self.id}.inflight.{slot + 1}.json")
        executor = JournalledExecutor(self.ws.executor, Journal(path), self.ws.ledger, rows_before)
        executor.batch = self.batch
        return executor

    def save(self) -> None:
        """Write the meta to the ledger: what `--resume` starts from."""
        self.ws.ledger.set_meta(META_KEY, json.dumps(self.meta, sort_keys=True))

    def rows(self) -> list[dict]:
        """This search's ledger rows (all its batches), in ledger order."""
        count = self.ws.ledger.count()
        # Rows are only ever appended: the count tells whether the cached list is stale.
        if self._cache[0] != count:
            self._cache = (
                count,
                [r for r in self.ws.ledger.executions() if str(r.get("batch", "")).startswith(self.batch)],
            )
        return self._cache[1]

    def launched(self) -> int:
        """Executions this search has launched so far (proposals recorded for their cost are not runs)."""
        return sum(1 for r in self.rows() if r.get("kind") != "proposal")

    def candidate(self, point: Point) -> Candidate:
        """The candidate a point of the space stands for."""
        return Candidate(knobs=point.knob_map, patches=tuple(self.patches[p] for p in sorted(point.patches)))

    def tick(self, phase: str, last: str = "") -> None:
        """Report progress (executions launched of the budget), if anyone listens."""
        if self.progress:
            self.progress(phase, self.launched(), self.meta["budget"], last)

    def remember(self, obs: Observation, origin: str) -> float | None:
        """Add an observation to the history; its speedup over the baseline, if it ran ok."""
        ok = obs.status == "ok" and obs.step_time_s
        speedup = self.state.baseline.step_time_s / obs.step_time_s if ok else None
        self.history.append(
            {
                "execution": obs.execution,
                "origin": origin,
                "status": obs.status,
                "speedup": speedup,
                **obs.point.describe(),
            }
        )
        return speedup

    # -- running ----------------------------------------------------------------------------

    def verify(
        self,
        candidate: Candidate,
        batch: str,
        pairs: int,
        progress=None,
        kind: str = "verify",
        seq: int = 0,
        max_pairs: int | None = None,
    ):
        """Run one `Verification` against the stored baseline in ``batch``, journalled; its `VerifyOutcome`.
        Its A/B looks after ``pairs`` pairs and may go on to ``max_pairs``."""
        from infrarsi._verify import Verification

        self.executor.batch = batch
        self.ws.executor, inner = self.executor, self.ws.executor
        try:
            check = Verification(
                self.ws,
                candidate,
                {"summary": self.summary, "id": self.baseline_id},
                pairs,
                progress,
                batch=batch,
                kind=kind,
                max_pairs=max_pairs,
            )
            check.seq = seq
            return check.run()
        finally:  # recorded (or interrupted, and recorded as such): nothing is in flight
            self.journal.clear()
            self.ws.executor = inner
