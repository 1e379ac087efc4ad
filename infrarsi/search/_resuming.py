"""Resume: rebuild a search's observations from its ledger rows, and record a cut execution.

The ledger is the search's memory. An execution a SIGKILL cut off is known from the
in-flight journal and recorded on resume as a `crash` with its device-seconds.
"""

from __future__ import annotations

from infrarsi._candidate import Candidate
from infrarsi._runner import ExecutionResult
from infrarsi._sources import pre_images
from infrarsi.search._screening import failing_checks
from infrarsi.search._state import INTERRUPTED, Observation


class Resuming:
    """A mixin of the search driver (`_engine._Search`): it uses the driver's ws, meta,
    space, state, patches, origins, messages, batch, journal, executor and bookkeeping."""

    def replay(self) -> None:
        """Rebuild observations from this search's rows; record an execution a SIGKILL cut off."""
        entry = self.journal.read()
        if entry is not None:
            recorded = any(r["id"] > entry["rows_before"] and r.get("batch") == entry["batch"] for r in self._rows())
            if not recorded:
                device_s = max(0.0, entry["alive"] - entry["started"])
                patches = tuple(self.patches[p] for p in entry["patches"] if p in self.patches)
                cut = ExecutionResult(Candidate(knobs=entry["knobs"], patches=patches), "crash",
                                      detail=f"{INTERRUPTED}: the search was killed while this execution ran "
                                             f"(at least {device_s:.1f} s); recorded on resume",
                                      device_s=device_s, wall_s=device_s,
                                      sources=pre_images(self.ws.contract.workspace, patches))
                self.ws.record(cut, kind=self._cut_kind(entry), batch=entry["batch"], seq=0,
                               baseline_id=self.baseline_id)
                self.messages.append(f"recorded the execution the kill cut off ({device_s:.1f} s) as crash")
            self.journal.path.unlink(missing_ok=True)
        for row in self._rows():
            if row.get("batch") != self.batch:
                continue
            point = self.space.point(row.get("knobs") or {}, [p["name"] for p in row.get("patches") or []])
            status = row["status"]
            if status == "crash" and str(row.get("detail", "")).startswith(INTERRUPTED):
                status = INTERRUPTED
            obs = Observation(point, status, row.get("step_time_s"), row.get("peak_mem_mb"), row["id"],
                              "resumed", row.get("detail") or "", row.get("device_s") or 0.0)
            self.state.add(obs, failing_checks(row))
            if status != INTERRUPTED:
                self._remember(obs, self.meta.get("origins", {}).get(str(row["id"]), "resumed"))
        self.state.rescued = list(self.meta.get("rescued", []))

    def _cut_kind(self, entry: dict) -> str:
        """What the cut execution was: an exploration run, or which run of a promotion."""
        if entry["batch"] == self.batch:
            return "search"
        earlier = sum(1 for r in self._rows() if r.get("batch") == entry["batch"] and r["id"] <= entry["rows_before"])
        if earlier == 0:
            return "verify"
        baseline = entry["knobs"] == self.ws.contract.baseline_knobs() and not entry["patches"]
        return "ab-baseline" if baseline else "ab-candidate"
