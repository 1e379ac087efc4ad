"""The execution in flight, on disk: what a SIGKILL of the search leaves for `--resume`."""

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


class JournalledExecutor:
    """An executor that journals each execution before it starts."""

    def __init__(self, inner, journal: Journal, ledger) -> None:
        self.inner, self.journal, self.ledger = inner, journal, ledger
        self.batch = ""
        if hasattr(inner, "on_submit"):  # a cluster executor: its job ids go in the journal
            inner.on_submit = lambda job_id: journal.note(slurm_job_id=str(job_id))

    def run(self, contract, pinned, candidate, sample_all=False):
        self.journal.begin(
            {
                "batch": self.batch,
                "rows_before": self.ledger.count(),
                "knobs": candidate.knobs,
                "patches": [p.name for p in candidate.patches],
            }
        )
        try:
            return self.inner.run(contract, pinned, candidate, sample_all)
        finally:
            self.journal.stop()
