"""Process-state helpers shared by the tests (tests/ is on sys.path through its conftest)."""

from __future__ import annotations

import time


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def gone_within(pid: int, seconds: float) -> bool:
    """Whether ``pid`` ends within ``seconds`` (SIGKILL is delivered, and a big process torn
    down, asynchronously)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)
