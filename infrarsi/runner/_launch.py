"""Starting one workload process: containment, memory guard, timeout, external clock.

Everything here observes from outside the workload. Receipt lines arrive through
a FIFO the runner owns and are stamped with the runner's monotonic clock the
moment they are read; stdout lines are stamped the same way.

Containment (the shim, the subreapers, the cgroup, strays) lives in ``_containment``.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from infrarsi.runner._cgroup import Cgroup
from infrarsi.runner._containment import STRAY_GRACE_S, Containment, ShimReport, adopting_orphans, shimmed
from infrarsi.runner._processes import tree_memory, tree_rss_bytes
from infrarsi.runner._ranks import RankGuard, RankMap, SocketReceipts, describe

__all__ = ["GUARD_INTERVAL_S", "STRAY_GRACE_S", "LaunchResult", "LaunchSpec", "launch", "tree_memory", "tree_rss_bytes"]

GUARD_INTERVAL_S = 0.010  # the issue asks for at least every 20 ms
_ROOT_PATIENCE_S = 5.0  # then the shim must have reaped its killed strays, or it is killed too
_OOM_MARKERS = (
    "torch.OutOfMemoryError",
    "CUDA out of memory",
    "torch.cuda.OutOfMemoryError",
    "DefaultCPUAllocator: can't allocate memory",
)
_STDERR_TAIL = 8000
_STOP_LOOK_S = 0.5
_MAX_LINE = 1 << 22  # a line past 4 MB without a newline is dropped: reading stays linear


@dataclass(frozen=True)
class LaunchSpec:
    argv: list[str]
    cwd: Path
    env: dict[str, str]
    timeout_s: float
    memory_limit_bytes: int
    receipts_fifo: Path | None = None
    # A job under a launcher: its ranks' receipts arrive on this socket instead, and the memory
    # limit holds for each rank on its own (see _ranks). None: one process, no launcher.
    receipts_socket: Path | None = None
    ranks: int | None = None
    first_rank: int = 0  # one node of a job across nodes: its ranks are first_rank..first_rank+ranks-1
    # Asked twice a second while the job runs: a reason to kill it now (another node of the
    # job failed), or None.
    stop_when: Callable[[], str | None] | None = None
    cgroups: bool = True  # False: the subreaper alone (tests; machines whose cgroups misbehave)


@dataclass
class LaunchResult:
    status: str  # ok | oom | crash | timeout
    detail: str
    exit_code: int | None
    started_ns: int
    ended_ns: int  # when the job's main process ended (strays are not timed)
    peak_rss_bytes: int  # highest tree RSS seen, or the kernel's high-water mark
    guard_samples: int
    guard_max_gap_ns: int = 0  # the longest time between two memory samples
    receipt_lines: list[tuple[int, str]] = field(default_factory=list)
    receipt_ranks: list[int] = field(default_factory=list)  # several ranks: whose each line is (-1: no rank's)
    rank_peaks_bytes: dict[int, int] = field(default_factory=dict)  # several ranks: each one's highest RSS
    stdout_lines: list[tuple[int, str]] = field(default_factory=list)
    stderr_tail: str = ""
    containment: dict = field(default_factory=dict)  # see Containment.record

    @property
    def wall_s(self) -> float:
        return (self.ended_ns - self.started_ns) / 1e9


class _LineReader(threading.Thread):
    """Reads a byte stream and stamps each complete line's arrival."""

    def __init__(self, fd: int, keep_lines: bool, keep_tail: int = 0) -> None:
        super().__init__(daemon=True)
        self.fd, self.keep_lines = fd, keep_lines
        self.lines: list[tuple[int, str]] = []
        self.tail: deque[str] = deque(maxlen=max(1, keep_tail // 80))
        self.keep_tail = keep_tail
        self.stop = threading.Event()

    def run(self) -> None:
        pending = bytearray()
        skipping = False  # inside a line too long to keep, until its newline
        while True:
            ready, _, _ = select.select([self.fd], [], [], 0.05)
            if not ready:
                if self.stop.is_set():
                    break
                continue
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                if self.stop.is_set():
                    break
                continue
            except OSError:
                break
            stamp = time.monotonic_ns()
            if not chunk:
                break
            start = len(pending)
            pending += chunk
            cut = pending.rfind(b"\n", start)
            if cut < 0:
                if len(pending) > _MAX_LINE:  # no line is this long: dropped whole, never buffered
                    pending.clear()
                    skipping = True
                continue
            parts = bytes(pending[:cut]).split(b"\n")
            if skipping:  # the end of a dropped line
                parts, skipping = parts[1:], False
            for raw in parts:
                text = raw.decode("utf-8", "replace")
                if self.keep_lines:
                    self.lines.append((stamp, text))
                if self.keep_tail:
                    self.tail.append(text)
            del pending[: cut + 1]
        if pending and self.keep_tail and not skipping:
            self.tail.append(pending.decode("utf-8", "replace"))

    def tail_text(self) -> str:
        return "\n".join(self.tail)[-self.keep_tail :]


def launch(spec: LaunchSpec) -> LaunchResult:
    """Run one workload to its end, and return what was seen from outside."""
    fds: dict[str, int] = {}
    cgroup = None
    channel = None
    try:
        if spec.receipts_socket is not None:
            # Listening before the job starts, as the FIFO is opened before it: no rank can be early.
            channel = SocketReceipts(spec.receipts_socket, RankMap(spec.ranks or 1, spec.first_rank))
        if spec.receipts_fifo is not None:
            os.mkfifo(spec.receipts_fifo, 0o600)
            fds["fifo"] = os.open(spec.receipts_fifo, os.O_RDONLY | os.O_NONBLOCK)
            # Holding a write end ourselves means the reader never sees EOF before the
            # workload opens the FIFO, or between its opens.
            fds["keepalive"] = os.open(spec.receipts_fifo, os.O_WRONLY)
        fds["report"], fds["report_w"] = os.pipe()
        os.set_blocking(fds["report"], False)
        cgroup = Cgroup.create() if spec.cgroups else None
        with adopting_orphans():
            return _launch(spec, cgroup, fds, channel)
    finally:
        if channel is not None:
            channel.finish()
        for name in list(fds):
            _close(fds, name)
        if cgroup is not None:
            cgroup.remove()


def _close(fds: dict[str, int], name: str) -> None:
    fd = fds.pop(name, None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def _launch(
    spec: LaunchSpec, cgroup: Cgroup | None, fds: dict[str, int], channel: SocketReceipts | None
) -> LaunchResult:
    started = time.monotonic_ns()
    box = Containment(cgroup, started)
    argv = shimmed(spec.argv, spec.env, fds["report_w"], cgroup.path / "cgroup.procs" if cgroup else None)
    proc = subprocess.Popen(
        argv or spec.argv,
        cwd=spec.cwd,
        env=spec.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(fds["report_w"],) if argv else (),
        start_new_session=True,
    )
    _close(fds, "report_w")  # the shim holds the only write end now
    box.root, box.shimmed = proc.pid, argv is not None
    with contextlib.suppress(AttributeError, OSError):  # Linux 5.3 and later: readable once it ends
        fds["pidfd"] = os.pidfd_open(proc.pid)
    report = ShimReport(fds["report"], fds.get("pidfd"))
    readers = {
        "out": _LineReader(proc.stdout.fileno(), keep_lines=True),
        "err": _LineReader(proc.stderr.fileno(), keep_lines=False, keep_tail=_STDERR_TAIL),
    }
    if "fifo" in fds:
        readers["receipts"] = _LineReader(fds["fifo"], keep_lines=True)
    ranks = RankGuard(channel.map if channel else RankMap(spec.ranks, spec.first_rank)) if spec.ranks else None
    for reader in [*readers.values(), *([channel] if channel else [])]:
        reader.start()

    deadline = started + int(spec.timeout_s * 1e9)
    peak, samples, status, detail = 0, 0, None, ""
    last_sample, max_gap = 0, 0
    main_ended = None  # when the shim said the workload ended
    root_lost = False  # the shim ended without saying it did: killed, or stopped
    next_stop_look = started
    try:
        while True:
            pid, wait_status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            report.read()
            now = time.monotonic_ns()
            if main_ended is None and report.status is not None:
                main_ended = now
            rss, high, pids = box.sample()
            if samples:
                max_gap = max(max_gap, now - last_sample)
            last_sample = now
            samples += 1
            where = "the process tree's RSS"
            if ranks is not None:  # each rank on its own (_ranks)
                group, rss, high = ranks.sample(pids[1:] if box.shimmed else pids)
                where = f"the RSS of {describe(group)}"
            peak = max(peak, rss, high)
            if rss > spec.memory_limit_bytes:
                status = "oom"
                detail = (
                    f"needs more than the limit of {spec.memory_limit_bytes / 2**20:.0f} MB "
                    f"(killed when {where} reached {rss / 2**20:.0f} MB)"
                )
            elif main_ended is None and now > deadline:
                status, detail = "timeout", f"killed after the timeout of {spec.timeout_s:g} s"
            elif spec.stop_when is not None and main_ended is None and now >= next_stop_look:
                next_stop_look = now + int(_STOP_LOOK_S * 1e9)
                reason = spec.stop_when()
                if reason:
                    status, detail = "crash", reason
            elif main_ended is not None and now - main_ended > (STRAY_GRACE_S + _ROOT_PATIENCE_S) * 1e9:
                root_lost = True  # the shim did not end once its strays were killed
            if status or root_lost:
                root_lost = not box.kill_all() or root_lost
                _, wait_status, usage = os.wait4(proc.pid, 0)
                break
            if main_ended is not None and not box.killed and now - main_ended >= STRAY_GRACE_S * 1e9:
                strays = box.live()
                if strays:
                    box.take_strays(strays)  # the shim reaps them, then ends as the workload did
            report.wait(GUARD_INTERVAL_S)
    except BaseException:
        # ^C or SIGTERM while the job runs: the job is in its own session, so it
        # never saw the signal. Take the whole tree down before going.
        root_lost = not box.kill_all()
        os.wait4(proc.pid, 0)
        box.sweep(root_lost)
        _stop(readers, proc)
        raise
    ended = main_ended or time.monotonic_ns()
    report.read()
    if box.shimmed and not status and not report.ended:
        root_lost = True
    box.sweep(root_lost)  # nothing the job started outlives it
    exit_code = os.waitstatus_to_exitcode(wait_status)
    if root_lost and not status and report.status is not None:
        with contextlib.suppress(ValueError):
            exit_code = os.waitstatus_to_exitcode(report.status)  # the workload's own, not the killed shim's
    proc.returncode = exit_code
    _close(fds, "keepalive")
    _stop(readers, proc)
    if channel:
        channel.finish()
    lines = readers["receipts"].lines if "receipts" in readers else []
    arrived = list(channel.lines) if channel else []  # a copy: a reader cut short by its join may still append
    if channel:
        lines = [(stamp, text) for stamp, _, text in arrived]

    stderr_tail = readers["err"].tail_text()
    if status is None:
        if exit_code == 0:
            status = "ok"  # a job that caught an out-of-memory error and went on finished
        elif any(marker in stderr_tail for marker in _OOM_MARKERS):
            status, detail = "oom", "the job reported out of memory: " + _last_line(stderr_tail)
        else:
            how = f"signal {-exit_code}" if exit_code < 0 else f"exit code {exit_code}"
            status, detail = "crash", f"{how}: {_last_line(stderr_tail) or 'no stderr'}"
    return LaunchResult(
        status=status,
        detail=detail,
        exit_code=exit_code,
        started_ns=started,
        ended_ns=ended,
        # The kernel's figure only when no sample was taken (it also counts our own size).
        peak_rss_bytes=peak if status == "oom" or samples else usage.ru_maxrss * 1024,
        guard_samples=samples,
        guard_max_gap_ns=max_gap,
        receipt_lines=lines,
        receipt_ranks=[rank for _, rank, _ in arrived],
        rank_peaks_bytes=dict(ranks.peaks) if ranks else {},
        stdout_lines=readers["out"].lines,
        stderr_tail=stderr_tail,
        containment=box.record(report.joined, root_lost),
    )


def _stop(readers: dict[str, _LineReader], proc: subprocess.Popen) -> None:
    for reader in readers.values():
        reader.stop.set()
        reader.join(timeout=5)
    proc.stdout.close()
    proc.stderr.close()


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
