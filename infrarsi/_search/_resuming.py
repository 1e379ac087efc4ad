"""Resume: rebuild a search's observations from its ledger rows, and record a cut execution.

The ledger is the search's memory. An execution a SIGKILL cut off is known from the
in-flight journal and recorded on resume as a `crash` with its device-seconds.
"""

from __future__ import annotations

from infrarsi._search._screening import failing_checks
from infrarsi._search._session import SearchSession
from infrarsi._search.strategy._state import INTERRUPTED, Observation
from infrarsi.contract import SEED_KNOB, Candidate
from infrarsi.runner import ExecutionResult, pre_images

__all__ = ["Resumption"]


class Resumption:
    """Rebuilds a session's observations from the ledger (a no-op for a new search)."""

    def __init__(self, session: SearchSession) -> None:
        self.session = session

    def replay(self) -> None:
        """Rebuild observations from this search's rows; record an execution a SIGKILL cut off."""
        session = self.session
        for journal in session.journals_on_disk():
            entry = journal.read()
            if entry is not None:
                self._settle(entry)
            journal.path.unlink(missing_ok=True)
        self._observe()

    def _settle(self, entry: dict) -> None:
        """One execution a kill left in flight: recorded already, re-attached (Slurm) or recorded cut."""
        session = self.session
        # Its row, if it was recorded: this batch, after the count when it began, this candidate
        # (with several in flight, another's row may come first).
        knobs = {k: v for k, v in entry["knobs"].items() if k != SEED_KNOB}  # a long run's seed is no knob
        recorded = any(
            r["id"] > entry["rows_before"]
            and r.get("batch") == entry["batch"]
            and (r.get("knobs") or {}) == knobs
            and [p["name"] for p in r.get("patches") or []] == entry["patches"]
            for r in session.rows()
        )
        slurm = getattr(getattr(session.ws.executor, "inner", session.ws.executor), "reattach", None)
        if not recorded and entry.get("slurm_job_id") and slurm is not None:
            self._reattach(entry)
        elif not recorded:
            device_s = max(0.0, entry["alive"] - entry["started"])
            patches = tuple(session.patches[p] for p in entry["patches"] if p in session.patches)
            cut = ExecutionResult(
                Candidate(knobs=knobs, patches=patches),
                "crash",
                detail=f"{INTERRUPTED}: the search was killed while this execution ran "
                f"(at least {device_s:.1f} s); recorded on resume",
                device_s=device_s,
                wall_s=device_s,
                sources=pre_images(session.ws.contract.workspace, patches),
            )
            session.ws.record(
                cut, kind=self._cut_kind(entry), batch=entry["batch"], seq=0, baseline_id=session.baseline_id
            )
            session.messages.append(f"recorded the execution the kill cut off ({device_s:.1f} s) as crash")

    def _observe(self) -> None:
        """The search's observations, from its exploration rows."""
        session = self.session
        for row in session.rows():
            if row.get("batch") != session.batch:
                continue
            point = session.space.point(row.get("knobs") or {}, [p["name"] for p in row.get("patches") or []])
            status = row["status"]
            if status == "crash" and str(row.get("detail", "")).startswith(INTERRUPTED):
                status = INTERRUPTED
            obs = Observation(
                point,
                status,
                row.get("step_time_s"),
                row.get("peak_mem_mb"),
                row["id"],
                "resumed",
                row.get("detail") or "",
                row.get("device_s") or 0.0,
            )
            session.state.add(obs, failing_checks(row))
            if status != INTERRUPTED:
                session.remember(obs, session.meta.get("origins", {}).get(str(row["id"]), "resumed"))
        session.state.rescued = list(session.meta.get("rescued", []))

    def _reattach(self, entry: dict) -> None:
        """A Slurm job the kill left in flight ran on without the driver: wait for it to end and
        record what it did (its result, or what Slurm says ended it), never a second run of it."""
        session = self.session
        patches = tuple(session.patches[p] for p in entry["patches"] if p in session.patches)
        candidate = Candidate(knobs=entry["knobs"], patches=patches)
        executor = getattr(session.ws.executor, "inner", session.ws.executor)
        result = executor.reattach(entry["slurm_job_id"], candidate, session.ws.contract)
        if not result.sources:
            result.sources = pre_images(session.ws.contract.workspace, patches)
        # Judged and recorded as any run is (its verdicts, `rejected` when a check fails), the
        # job's result standing in for the run a Verification would have launched.
        from infrarsi._verify import Verification

        session.ws.executor, inner = _Finished(result), session.ws.executor
        try:
            check = Verification(
                session.ws,
                candidate,
                {"summary": session.summary, "id": session.baseline_id},
                0,
                None,
                batch=entry["batch"],
                kind=self._cut_kind(entry),
            )
            check.seq = len(session.rows())
            check.run()
        finally:
            session.ws.executor = inner
        session.messages.append(
            f"recorded slurm job {entry['slurm_job_id']}, in flight when the search was killed, as {result.status}"
        )

    def _cut_kind(self, entry: dict) -> str:
        """What the cut execution was: an exploration run, or which run of a promotion."""
        session = self.session
        if entry["batch"] == session.batch:
            return "search"
        earlier = sum(1 for r in session.rows() if r.get("batch") == entry["batch"] and r["id"] <= entry["rows_before"])
        if earlier == 0:
            return "verify"
        baseline = entry["knobs"] == session.ws.contract.baseline_knobs() and not entry["patches"]
        return "ab-baseline" if baseline else "ab-candidate"


class _Finished:
    """An executor whose one run already happened: it hands back that run's result."""

    def __init__(self, result: ExecutionResult) -> None:
        self.result = result

    def run(self, contract, pinned, candidate, sample_all=False) -> ExecutionResult:
        return self.result
