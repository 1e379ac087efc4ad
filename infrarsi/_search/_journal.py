"""The executions in flight, on disk: what a SIGKILL of the search leaves for `--resume`."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

__all__ = ["Journal", "JournalledExecutor"]


class Journal:
    """The execution in flight, on disk, with a heartbeat: what a SIGKILL leaves behind."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._entry: dict = {}
        self._lock = threading.Lock()

    def begin(self, entry: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        entry = {**entry, "started": time.time(), "alive": time.time()}
        self._entry = entry
        self._write(entry)
        self._stop.clear()

        def beat() -> None:
            while not self._stop.wait(1.0):
                entry["alive"] = time.time()
                self._write(entry)

        self._thread = threading.Thread(target=beat, daemon=True)
        self._thread.start()

    def note(self, **fields) -> None:
        """Add to the entry in flight (a Slurm job id, once Slurm gives it), on disk at once."""
        self._entry.update(fields)
        self._write(self._entry)

    def _write(self, entry: dict) -> None:
        with self._lock:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(entry))
            os.replace(tmp, self.path)

    def stop(self) -> None:
        """The execution returned: stop the heartbeat (the file stays until its row is recorded)."""
        self._stop.set()
        if self._thread:
            self._thread.join()

    def clear(self) -> None:
        """Its row is in the ledger: nothing is in flight."""
        self.stop()
        self.path.unlink(missing_ok=True)

    def read(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None


_CURRENT = threading.local()  # the journal of the execution this thread runs (several at once: --workers)


def _note_job(job_id) -> None:
    journal = getattr(_CURRENT, "journal", None)
    if journal is not None:
        journal.note(slurm_job_id=str(job_id))


class JournalledExecutor:
    """An executor that journals each execution before it starts (one journal per execution in
    flight: the search's own, and one per further worker)."""

    def __init__(self, inner, journal: Journal, ledger, rows_before: int | None = None) -> None:
        self.inner, self.journal, self.ledger = inner, journal, ledger
        self.batch = ""
        self.rows_before = rows_before  # set by a worker, whose thread must not read the ledger
        if hasattr(inner, "on_submit"):  # a cluster executor: its job ids go in the submitting thread's journal
            inner.on_submit = _note_job

    def begin(self, candidate) -> None:
        """Journal ``candidate`` as in flight (for a run this thread does not start itself)."""
        self.journal.begin(
            {
                "batch": self.batch,
                "rows_before": self.ledger.count() if self.rows_before is None else self.rows_before,
                "knobs": candidate.knobs,
                "patches": [p.name for p in candidate.patches],
            }
        )

    def run(self, contract, pinned, candidate, sample_all=False):
        self.begin(candidate)
        _CURRENT.journal = self.journal
        try:
            return self.inner.run(contract, pinned, candidate, sample_all)
        finally:
            _CURRENT.journal = None
            self.journal.stop()
