"""Containment of one execution's processes: the shim, the subreapers, the cgroup, strays.

The workload runs as the child of a small shim that is a child subreaper, so every
process the job starts stays in the tree rooted at the shim, double-forked daemons
included, until the runner ends it; a per-execution cgroup is a second net where the
machine offers one. A process still running once the job's main process has ended is a
stray: recorded, then killed. docs/runner.md says what this does not cover.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from infrarsi.runner._cgroup import Cgroup
from infrarsi.runner._processes import LINUX, alive, children, cmdline, kill, kill_until_gone, tree, tree_memory

__all__ = ["STRAY_GRACE_S", "Containment", "ShimReport", "shimmed", "adopting_orphans"]

STRAY_GRACE_S = 1.0  # after the job's main process ends, for workers already on their way out
_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37


# The root of the workload's tree (Linux). It dies with infrarsi (PDEATHSIG), is not dumpable (a
# job of another user than root can't ptrace it or open its fds through /proc), joins the cgroup
# before anything forks, ignores the polite signals (a job's `kill 0` ends the job, not its root),
# and becomes a child subreaper: orphans and double-forked daemons are reparented to it. Its child,
# which dies with it, execs the workload. On fd argv[2] it says "j" once in the cgroup, "s STATUS"
# when the workload ends and "e" just before it exits as the workload did; it reaps all in between.
_SHIM = """\
import ctypes, os, signal, sys
prctl = ctypes.CDLL(None, use_errno=True).prctl
prctl(1, 9, 0, 0, 0)
if os.getppid() != int(sys.argv[1]):
    os._exit(137)
prctl(4, 0, 0, 0, 0)
fd, me = int(sys.argv[2]), os.getpid()
def tell(message):
    try:
        os.write(fd, message)
    except OSError:
        pass
if sys.argv[3]:
    try:
        with open(sys.argv[3], "w") as procs:
            procs.write(str(me))
        tell(b"j\\n")
    except OSError:
        pass
prctl(36, 1, 0, 0, 0)
quiet = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
         signal.SIGALRM, signal.SIGPIPE, signal.SIGXFSZ)
for s in quiet:
    signal.signal(s, signal.SIG_IGN)
child = os.fork()
if child == 0:
    prctl(1, 9, 0, 0, 0)
    if os.getppid() != me:
        os._exit(137)
    os.close(fd)
    for s in quiet:
        signal.signal(s, signal.SIG_DFL)
    try:
        os.execv(sys.argv[4], sys.argv[5:])
    except OSError as exc:
        os.write(2, ("cannot run %s: %s\\n" % (sys.argv[4], exc)).encode())
        os._exit(127)
status = 0
while True:
    try:
        pid, st = os.wait()
    except ChildProcessError:
        break
    if pid == child:
        status = st
        tell(b"s %d\\n" % st)
tell(b"e\\n")
if os.WIFSIGNALED(status):
    try:
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
    except (OSError, ValueError):
        pass
    os.kill(me, os.WTERMSIG(status))
    os._exit(128 + os.WTERMSIG(status))
os._exit(os.WEXITSTATUS(status))
"""


def shimmed(argv: list[str], env: dict | None, report_fd: int, procs: Path | None) -> list[str] | None:
    """The workload's argv behind the shim on Linux; None elsewhere, or if the program is not found."""
    if not LINUX or not argv:
        return None
    exe = argv[0] if os.sep in argv[0] else shutil.which(argv[0], path=(env or os.environ).get("PATH"))
    if exe is None:
        return None  # let Popen report the missing program as before
    return [sys.executable, "-S", "-E", "-c", _SHIM, str(os.getpid()), str(report_fd), str(procs or ""), exe, *argv]


class ShimReport:
    """What the shim said on its pipe: in the cgroup, the workload's wait status, its own end."""

    def __init__(self, fd: int, pidfd: int | None) -> None:
        self.fd, self.pidfd, self.pending = fd, pidfd, b""
        self.joined = self.ended = self.closed = False
        self.status: int | None = None

    def wait(self, timeout_s: float) -> None:
        """Sleep ``timeout_s``, or less if the shim says something or ends: the job's end is
        stamped as it happens, not at the guard's next tick."""
        watched = ([] if self.closed else [self.fd]) + ([] if self.pidfd is None else [self.pidfd])
        if watched:
            select.select(watched, [], [], timeout_s)
        else:
            time.sleep(timeout_s)

    def read(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 4096)
            except OSError:  # BlockingIOError: nothing more for now
                return
            if not chunk:
                self.closed = True
                return
            *lines, self.pending = (self.pending + chunk).split(b"\n")
            for line in lines:
                if line == b"j":
                    self.joined = True
                elif line == b"e":
                    self.ended = True
                elif line.startswith(b"s ") and self.status is None and line[2:].isdigit():
                    self.status = int(line[2:])


_reaper_lock = threading.Lock()
_reaper_users = 0
_reaper_was = 0


def _prctl(option: int, arg) -> None:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)


@contextlib.contextmanager
def adopting_orphans() -> Iterator[None]:
    """This process is a child subreaper while launches run: should a job kill its shim, what the
    shim held is reparented here, not to init, and can still be found and killed."""
    global _reaper_users, _reaper_was
    if not LINUX:
        yield
        return
    import ctypes

    with _reaper_lock:
        if _reaper_users == 0:
            was = ctypes.c_int(0)
            _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(was))
            _reaper_was = was.value
            _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        _reaper_users += 1
    try:
        yield
    finally:
        with _reaper_lock:
            _reaper_users -= 1
            if _reaper_users == 0 and not _reaper_was:
                _prctl(_PR_SET_CHILD_SUBREAPER, 0)


class Containment:
    """Every process the job started: the shim's tree, the cgroup and, should the shim die before
    its time, what this process adopted from it."""

    def __init__(self, cgroup: Cgroup | None, started_ns: int) -> None:
        self.cgroup, self.started_ns = cgroup, started_ns
        self.root, self.shimmed = 0, False
        self.ours_before = set(children(os.getpid())) if LINUX else set()
        self.first_seen: dict[int, int] = {}
        self.strays: list[dict] = []
        self.killed = 0

    def sample(self) -> tuple[int, int, list[int]]:
        """The memory guard's reading of the job's tree, the shim left out."""
        rss, high, pids = tree_memory(self.root, include_root=not self.shimmed)
        now = time.monotonic_ns()
        for pid in pids:
            self.first_seen.setdefault(pid, now)
        return rss, high, pids

    def live(self) -> list[int]:
        """The job's processes still running, the shim aside."""
        found = set(tree(self.root)) | (self.cgroup.pids() if self.cgroup else set())
        found.discard(self.root)
        return sorted(pid for pid in found if alive(pid))

    def take_strays(self, pids: list[int]) -> None:
        """Record ``pids`` as left behind by the job, then kill them and all they start."""
        self.record_strays(pids)
        self.kill_descendants()

    def record_strays(self, pids: list[int]) -> None:
        now = time.monotonic_ns()
        for pid in pids:
            seen = self.first_seen.get(pid, now)
            self.strays.append(
                {"pid": pid, "cmd": cmdline(pid), "first_seen_s": round((seen - self.started_ns) / 1e9, 3)}
            )
        self.killed += len(pids)

    def kill_descendants(self) -> None:
        """SIGKILL everything under the shim, which stays (so nothing is reparented away), until none is left."""
        kill_until_gone(self.live)

    def kill_all(self) -> bool:
        """Timeout, memory limit, interrupt: the tree, the cgroup, then the shim. Whether the shim was still there."""
        if not self.shimmed:
            kill([self.root])
            return True
        self.kill_descendants()
        root_there = alive(self.root)
        if self.cgroup is not None:
            self.cgroup.kill()
        kill([self.root])
        return root_there

    def sweep(self, root_lost: bool) -> None:
        """Once the shim is reaped: the job's process group (its id stays taken while a member lives),
        the cgroup and, when the shim died before its time, the orphans it left to this process."""
        adopted = self._adopted() if root_lost else []
        if root_lost:
            in_cgroup = self.cgroup.pids() if self.cgroup is not None else set()
            self.record_strays(sorted(p for p in set(adopted) | in_cgroup if alive(p)))
        with contextlib.suppress(OSError):
            os.killpg(self.root, signal.SIGKILL)
        if self.cgroup is not None:
            self.cgroup.kill()
        for _ in range(200):  # adopted trees: killed whole, their roots reaped
            if not adopted:
                return
            kill(p for orphan in adopted if alive(orphan) for p in tree(orphan))
            for pid in adopted:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            time.sleep(0.002)
            adopted = self._adopted()

    def _adopted(self) -> list[int]:
        """This process's children that it did not start (the shim is not among them)."""
        if not LINUX:
            return []
        return [p for p in children(os.getpid()) if p not in self.ours_before and p != self.root]

    def record(self, joined: bool, root_lost: bool) -> dict:
        """The evidence that integrity.containment judges."""
        used = self.cgroup if joined else None
        return {
            "version": 1,
            "subreaper": self.shimmed,
            "cgroup": used.kind if used else None,
            "cgroup_peak_bytes": used.peak_bytes() if used else None,
            "grace_s": STRAY_GRACE_S,
            "strays": self.strays,
            "killed": self.killed,
            "root_lost": root_lost,
        }
