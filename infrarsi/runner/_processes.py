"""The processes of one execution's tree, as /proc shows them: who descends from whom, who is alive,
their memory, and killing them until none is left."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterable

__all__ = ["LINUX", "children", "tree", "alive", "cmdline", "kill", "kill_until_gone", "tree_rss_bytes", "tree_memory"]

LINUX = sys.platform.startswith("linux")


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as handle:
                out.extend(int(c) for c in handle.read().split())
        except OSError:
            continue
    return out


def tree(pid: int) -> list[int]:
    seen, stack = [], [pid]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.append(current)
        stack.extend(children(current))
    return seen


def alive(pid: int) -> bool:
    """Running: not gone, and not a zombie waiting for its parent."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read(4096).rstrip(b"\0")
        if raw:
            return raw.replace(b"\0", b" ").decode("utf-8", "replace")[:300]
        with open(f"/proc/{pid}/comm") as handle:
            return f"[{handle.read().strip()}]"
    except OSError:
        return "?"


def kill(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def kill_until_gone(living: Callable[[], list[int]]) -> None:
    """SIGKILL what ``living()`` lists until it lists nothing (a killed process can't fork
    again, so this ends; 200 rounds bound it all the same)."""
    for _ in range(200):
        pids = living()
        if not pids:
            return
        kill(pids)
        time.sleep(0.002)


def tree_rss_bytes(pid: int) -> tuple[int, list[int]]:
    """Resident bytes of ``pid`` and all its descendants, and their pids."""
    rss, _, pids = tree_memory(pid)
    return rss, pids


def tree_memory(pid: int, include_root: bool = True) -> tuple[int, int, list[int]]:
    """(resident bytes now, sum of the high-water marks, pids) of ``pid`` and its descendants;
    ``include_root=False`` leaves ``pid`` itself out of the sums (the shim is InfraRSI's, not the job's).

    A process's ``VmHWM`` counts its own memory since exec, so a spike between two
    samples still shows; the kernel's ``ru_maxrss`` at exit would also count the
    driver's own size at fork (Linux keeps it across exec), so it is not used.
    """
    pids = tree(pid)
    total = high = 0
    for p in pids if include_root else pids[1:]:
        try:
            with open(f"/proc/{p}/status") as handle:
                fields = dict(line.split(":", 1) for line in handle if line.startswith(("VmRSS", "VmHWM")))
            total += int(fields["VmRSS"].split()[0]) * 1024
            high += int(fields["VmHWM"].split()[0]) * 1024
        except (OSError, IndexError, ValueError, KeyError):
            continue
    return total, high, pids
