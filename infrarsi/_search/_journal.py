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

    def begin(self, entry: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        entry = {**entry, "started": time.time(), "alive": time.time()}
        self._write(entry)
        self._stop.clear()

        def beat() -> None:
            while not self._stop.wait(1.0):
                entry["alive"] = time.time()
                self._write(entry)

        self._thread = threading.Thread(target=beat, daemon=True)
        self._thread.start()

    def _write(self, entry: dict) -> None:
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
