"""A job of several ranks: which rank a process is, each rank held to the memory limit on its
own, and the receipt socket on which the kernel, not the job, says which rank wrote a line.

**A rank** is a process the launcher (the job's first process: torchrun) started, with the
``RANK`` it had when InfraRSI first saw it (kept: a rank that execs itself under another
``RANK`` stays what it was), and every process below it, whatever its own environment says.
A ``RANK`` outside this node's ranks (``0..ranks-1``, or its share of a job across nodes)
makes no rank. The launcher's children that show no
``RANK`` yet are workers between fork and exec (they still show the launcher's memory) and
count as the launcher's, for ``EXEC_GRACE_S`` at most: one still without a rank after that (a
rank's child made the launcher's with ``clone(CLONE_PARENT)``, say) is no rank's.

**Memory.** Each rank is held to the limit; so is every process below no rank (one a rank
detached from its tree, which the subreaper adopts). The launcher is held to the limit on
what it *grew* by once the first rank appeared: torchrun's own size is InfraRSI's choice, not
the job's, but the store it hosts for the job is the job's memory.

**Receipts.** The ranks connect to one Unix socket; each connection's peer pid comes from the
kernel (``SO_PEERCRED``) and its rank from the process tree, so one rank can't write for
another by naming its channel. Every line is stamped on arrival with the runner's clock.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time

__all__ = ["RankMap", "RankGuard", "SocketReceipts", "NO_RANK", "LAUNCHER"]

NO_RANK = "none"
LAUNCHER = "launcher"
_MAX_LINE = 1 << 22  # a receipt line past 4 MB without a newline is not a receipt line
EXEC_GRACE_S = 1.0  # how long a launcher's child may show no RANK (fork to exec takes milliseconds)


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


class RankMap:
    """The rank of each process of one job (thread-safe: the guard and the socket reader share it)."""

    def __init__(self, ranks: int, first: int = 0) -> None:
        self.ranks = ranks
        self.first = first  # one node of several: its ranks are first..first+ranks-1
        self.launcher: int | None = None
        self._roots: dict[int, int | str] = {}  # a launcher's child -> its rank (or NO_RANK), first seen
        self._unranked: dict[int, float] = {}  # a launcher's child seen without RANK -> when first seen
        self._lock = threading.Lock()

    def _root_rank(self, pid: int) -> int | str | None:
        if pid not in self._roots:
            rank = _rank_variable(pid)
            if rank is None:
                first = self._unranked.setdefault(pid, time.monotonic())
                if time.monotonic() - first < EXEC_GRACE_S:
                    return None  # between fork and exec: not decided yet
                self._roots[pid] = NO_RANK
            else:
                self._roots[pid] = rank if self.first <= rank < self.first + self.ranks else NO_RANK
        return self._roots[pid]

    def rank_of(self, pid: int) -> int | str:
        """``pid``'s rank, or LAUNCHER, or NO_RANK (below neither a rank nor the launcher)."""
        with self._lock:
            if self.launcher is None:
                return NO_RANK
            for _ in range(64):
                if pid == self.launcher:
                    return LAUNCHER
                parent = _parent(pid)
                if parent is None:
                    return NO_RANK
                if parent == self.launcher:
                    rank = self._root_rank(pid)
                    return LAUNCHER if rank is None else rank
                pid = parent
            return NO_RANK


class RankGuard:
    """Sorts the job's processes into ranks at each sample; ``peaks`` keeps each rank's highest RSS."""

    def __init__(self, ranks: RankMap) -> None:
        self.map = ranks
        self.peaks: dict[int, int] = {}
        self._launcher_base: int | None = None  # the launcher's RSS when the first rank appeared

    def sample(self, pids: list[int]) -> tuple[int | str, int, int]:
        """Over the job's ``pids`` (InfraRSI's shim left out): the group held to the limit that
        uses the most memory, its RSS now and its summed high-water marks."""
        if self.map.launcher is None and pids:
            self.map.launcher = pids[0]  # the job's first process, sampled before it starts anything
        rss: dict[int | str, int] = {}
        high: dict[int | str, int] = {}
        launcher_now = 0
        for pid in pids:
            group = self.map.rank_of(pid)
            now, mark = _memory(pid)
            if pid == self.map.launcher:
                launcher_now = now
            if group == LAUNCHER:
                continue
            rss[group] = rss.get(group, 0) + now
            high[group] = high.get(group, 0) + mark
        if self._launcher_base is None and any(isinstance(g, int) for g in rss):
            self._launcher_base = launcher_now
        if self._launcher_base is not None:
            grown = max(0, launcher_now - self._launcher_base)
            rss[LAUNCHER], high[LAUNCHER] = grown, grown
        for group, value in rss.items():
            if isinstance(group, int):
                self.peaks[group] = max(self.peaks.get(group, 0), value, high[group])
        if not rss:
            return NO_RANK, 0, 0
        worst = max(rss, key=lambda g: rss[g])
        return worst, rss[worst], high[worst]


def describe(group: int | str) -> str:
    """A guard group as the oom detail names it."""
    if isinstance(group, int):
        return f"rank {group}"
    if group == LAUNCHER:
        return "the launcher's growth since it started the ranks (the store it hosts for the job)"
    return "the processes below no rank"


class SocketReceipts(threading.Thread):
    """Accepts the ranks' connections on ``path`` and reads their lines: ``lines`` holds
    (arrival stamp, rank, text), the rank the kernel's peer pid gives (-1 for no rank)."""

    def __init__(self, path, ranks: RankMap) -> None:
        super().__init__(daemon=True)
        self.map = ranks
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.server.bind(str(path))
            self.server.listen(64)
        except OSError:
            self.server.close()
            raise
        self.server.setblocking(False)
        self.lines: list[tuple[int, int, str]] = []
        self.stop = threading.Event()
        self._open: dict[socket.socket, list] = {}  # connection -> [rank, pending bytes, skipping]

    def _accept(self) -> None:
        try:
            conn, _ = self.server.accept()
        except OSError:
            return
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid = struct.unpack("3i", creds)[0]
        rank = self.map.rank_of(pid)
        conn.setblocking(False)
        self._open[conn] = [rank if isinstance(rank, int) else -1, bytearray(), False]

    def _read(self, conn: socket.socket) -> None:
        rank, pending, skipping = self._open[conn]
        try:
            chunk = conn.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        stamp = time.monotonic_ns()
        if not chunk:
            conn.close()
            del self._open[conn]
            return
        start = len(pending)
        pending += chunk
        cut = pending.rfind(b"\n", start)
        if cut < 0:
            if len(pending) > _MAX_LINE:  # no receipt line is this long: dropped whole, never buffered
                pending.clear()
                self._open[conn][2] = True
            return
        parts = bytes(pending[:cut]).split(b"\n")
        if skipping:  # the end of a dropped line
            parts = parts[1:]
            self._open[conn][2] = False
        for raw in parts:
            self.lines.append((stamp, rank, raw.decode("utf-8", "replace")))
        del pending[: cut + 1]

    def run(self) -> None:
        while True:
            ready, _, _ = select.select([self.server, *self._open], [], [], 0.05)
            if not ready and self.stop.is_set():
                break
            for item in ready:
                if item is self.server:
                    self._accept()
                else:
                    self._read(item)
        for conn in self._open:
            conn.close()
        self.server.close()

    def finish(self) -> None:
        """Read what is left and close (once; a reader never started just closes its socket)."""
        self.stop.set()
        if self.is_alive():
            self.join(timeout=5)
        elif self.ident is None:
            self.server.close()
