"""The memory guard for a job of several ranks: each rank is held to the limit on its own.

A rank is a process the launcher started with ``RANK`` in its environment, and every process
below it (a data loader's workers, a child started with an empty environment). Once a process
is seen with a rank it keeps it, so a rank that execs itself without ``RANK`` stays that rank.

The launcher (the job's first process) and its own children that carry no rank are the
launcher's: torchrun itself, and its workers in the moment between fork and exec, when they
still show the launcher's memory. They are not held to the limit. A process below neither a
rank nor the launcher (one a rank detached from its tree, which the subreaper adopts) belongs
to a group of its own that is held to the limit: memory can't hide by leaving a rank's tree.
"""

from __future__ import annotations

__all__ = ["RankGuard", "NO_RANK", "LAUNCHER"]

NO_RANK = "none"
LAUNCHER = "launcher"


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _rank_variable(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            for entry in handle.read().split(b"\0"):
                if entry.startswith(b"RANK="):
                    value = entry[5:]
                    return int(value) if value.isdigit() else None
    except OSError:
        return None
    return None


def _memory(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes; zeros for a process that is gone."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            fields = dict(line.split(":", 1) for line in handle if line.startswith(("VmRSS", "VmHWM")))
        return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024
    except (OSError, IndexError, ValueError, KeyError):
        return 0, 0


class RankGuard:
    """Sorts the job's processes into ranks at each sample; ``peaks`` keeps each rank's highest RSS."""

    def __init__(self) -> None:
        self.launcher: int | None = None
        self._ranks: dict[int, int] = {}  # pid -> the rank it was seen with (kept)
        self.peaks: dict[int, int] = {}

    def _rank(self, pid: int) -> int | None:
        if pid not in self._ranks:
            rank = _rank_variable(pid)
            if rank is None:
                return None
            self._ranks[pid] = rank
        return self._ranks[pid]

    def _group(self, pid: int, alive: set[int]) -> int | str:
        for _ in range(64):
            rank = self._rank(pid)
            if rank is not None:
                return rank
            if pid == self.launcher:
                return LAUNCHER
            parent = _parent(pid)
            if parent == self.launcher:
                return LAUNCHER
            if parent not in alive:
                return NO_RANK
            pid = parent
        return NO_RANK

    def sample(self, pids: list[int]) -> tuple[int | str, int, int]:
        """Over the job's ``pids`` (InfraRSI's shim left out): the group held to the limit that
        uses the most memory, its RSS now and its summed high-water marks."""
        alive = set(pids)
        if self.launcher is None and pids:
            self.launcher = pids[0]  # the job's first process, sampled before it starts anything
        rss: dict[int | str, int] = {}
        high: dict[int | str, int] = {}
        for pid in pids:
            group = self._group(pid, alive)
            now, mark = _memory(pid)
            rss[group] = rss.get(group, 0) + now
            high[group] = high.get(group, 0) + mark
        for group, value in rss.items():
            if isinstance(group, int):
                self.peaks[group] = max(self.peaks.get(group, 0), value, high[group])
        held = [g for g in rss if g != LAUNCHER]
        if not held:
            return NO_RANK, 0, 0
        worst = max(held, key=lambda g: rss[g])
        return worst, rss[worst], high[worst]
