"""A cgroup per execution, where the machine lets InfraRSI make one (v2, or v1's memory hierarchy):
a second net for the job's processes, and their memory high-water mark."""

from __future__ import annotations

import itertools
import os
import re
import time
from pathlib import Path

from infrarsi.runner._processes import LINUX, kill_until_gone

__all__ = ["Cgroup", "own_cgroup", "pid_namespace"]

_OURS = re.compile(r"infrarsi-(\d+)-(\d+)-\d+")
_cgroup_serial = itertools.count()


def pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def own_cgroup(kind: str) -> Path | None:
    """This process's folder in the v2 hierarchy or in the v1 memory one, or None."""
    try:
        with open("/proc/self/mounts") as handle:
            mounts = [line.split() for line in handle]
        with open("/proc/self/cgroup") as handle:
            own = [line.rstrip("\n").split(":", 2) for line in handle]
    except OSError:
        return None
    if kind == "v2":
        roots = [m[1] for m in mounts if len(m) > 3 and m[2] == "cgroup2"]
        rel = next((c[2] for c in own if len(c) == 3 and c[0] == "0" and not c[1]), None)
    else:
        roots = [m[1] for m in mounts if len(m) > 3 and m[2] == "cgroup" and "memory" in m[3].split(",")]
        rel = next((c[2] for c in own if len(c) == 3 and "memory" in c[1].split(",")), None)
    if not roots or rel is None or ".." in rel:
        return None
    root = Path(roots[0].replace("\\040", " "))
    mine = root / rel.lstrip("/")
    # A container that mounts its own cgroup as the hierarchy's root still shows the host's path.
    return mine if mine.is_dir() else root


class Cgroup:
    """A cgroup made for one execution: who is in it, kill them all, their memory high-water mark."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind, self.path = kind, path

    @classmethod
    def create(cls) -> Cgroup | None:
        """One under this process's own cgroup (its limits still hold): v2 with the memory
        controller, else v1 memory, else v2 for membership and kill alone; None where none is writable."""
        if not LINUX:
            return None
        tag = f"infrarsi-{pid_namespace()}-{os.getpid()}-{next(_cgroup_serial)}"
        v2 = cls._make("v2", tag)
        if v2 is not None and (v2.path / "memory.peak").exists():
            return v2
        v1 = cls._make("v1-memory", tag)
        if v1 is None:
            return v2
        if v2 is not None:
            v2.remove()
        return v1

    @classmethod
    def _make(cls, kind: str, tag: str) -> Cgroup | None:
        parent = own_cgroup(kind)
        if parent is None:
            return None
        cls._remove_stale(kind, parent)
        try:
            (parent / tag).mkdir()
        except OSError:
            return None
        return cls(kind, parent / tag)

    @classmethod
    def _remove_stale(cls, kind: str, parent: Path) -> None:
        """Cgroups of an infrarsi of this pid namespace that is gone (SIGKILLed): what they hold is killed."""
        try:
            names = os.listdir(parent)
        except OSError:
            return
        for name in names:
            match = _OURS.fullmatch(name)
            if match and int(match[1]) == pid_namespace() and not os.path.exists(f"/proc/{match[2]}"):
                cls(kind, parent / name).remove()

    def pids(self) -> set[int]:
        try:
            return {int(p) for p in (self.path / "cgroup.procs").read_text().split()}
        except (OSError, ValueError):
            return set()

    def peak_bytes(self) -> int | None:
        name = "memory.peak" if self.kind == "v2" else "memory.max_usage_in_bytes"
        try:
            return int((self.path / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def kill(self) -> None:
        """SIGKILL every process in it: at once through v2's cgroup.kill, else pid by pid until none is left."""
        if self.kind == "v2":
            try:
                (self.path / "cgroup.kill").write_text("1")
                return
            except OSError:
                pass
        kill_until_gone(self.pids)

    def remove(self) -> None:
        """Kill what is left and remove it; one that stays busy is left to the next launch's sweep."""
        deadline = time.monotonic() + 2.0
        while True:
            self.kill()
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.01)


# -- the shim and the subreapers ----------------------------------------------------------------
