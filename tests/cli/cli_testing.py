"""Helpers for the CLI tests: the real `infrarsi` in a subprocess, and what it leaves behind."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from processes import alive, gone_within

from infrarsi.ledger import Ledger
from infrarsi.runner._processes import (  # the runner's own /proc walk: leftovers are looked for as it kills them
    tree,
)

# The console script lives next to the interpreter; `-m infrarsi.cli` is the same main().
SCRIPT = Path(sys.executable).with_name("infrarsi")
MODULE = [sys.executable, "-m", "infrarsi.cli"]
# A safety net so a broken product cannot hang the suite; never a performance assertion.
PATIENCE_S = 60


@dataclass(frozen=True)
class Done:
    """A finished `infrarsi` process."""

    rc: int
    stdout: str
    stderr: str

    def json(self) -> dict:
        """The one JSON object that `--json` promises on stdout."""
        lines = self.stdout.splitlines()
        assert len(lines) == 1, f"expected one line of JSON on stdout, got {self.stdout!r}"
        payload = json.loads(lines[0])
        assert isinstance(payload, dict), payload
        return payload

    def __str__(self) -> str:  # shown in assertion messages
        return f"rc={self.rc}\n--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"


def cli_env(sandbox_tmp: Path) -> dict[str, str]:
    """The environment for `infrarsi`: sandboxes go under ``sandbox_tmp`` so leftovers are visible."""
    env = dict(os.environ)
    env["TMPDIR"] = str(sandbox_tmp)
    env.pop("PYTHONPROFILEIMPORTTIME", None)
    return env


def argv(*args: str, script: bool = False) -> list[str]:
    return ([str(SCRIPT)] if script else list(MODULE)) + list(args)


def file_sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def trusted_key(workspace: Path) -> str:
    """The public key from the signed manifest, trusted independently of the ledger."""
    return json.loads((workspace / ".infrarsi" / "manifest.json").read_text())["manifest"]["public_key"]


@dataclass(frozen=True)
class LedgerState:
    """What a ledger holds: rows as (id, row_hash), its chain verdict, and the file's bytes."""

    rows: tuple[tuple[int, str], ...]
    chain_ok: bool
    chain_detail: str
    file_sha256: str | None


def ledger_state(workspace: Path) -> LedgerState:
    path = workspace / ".infrarsi" / "ledger.db"
    digest = file_sha256(path)  # before opening: the file as the CLI left it
    with Ledger.open(path) as ledger:
        rows = tuple((row["id"], row["row_hash"]) for row in ledger.executions())
        report = ledger.verify_chain(trusted_public_hex=trusted_key(workspace))
    return LedgerState(rows, report.ok and report.rows == len(rows), report.detail, digest)


def edit_contract(workspace: Path, old: str, new: str) -> None:
    """The workspace's infrarsi.toml with ``old`` (found exactly once) replaced by ``new``."""
    path = workspace / "infrarsi.toml"
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))


def executions(workspace: Path) -> list[dict]:
    with Ledger.open(workspace / ".infrarsi" / "ledger.db") as ledger:
        return list(ledger.executions())


# -- processes -------------------------------------------------------------------------------


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def is_workload(pid: int) -> bool:
    # The runner's shim (python -S -E -c ...) carries the workload's argv too: it is not the workload.
    line = cmdline(pid)
    return "train.py" in line and " -S -E -c " not in line


def has_receipts_open(pid: int) -> bool:
    """Whether the workload's probe has opened its receipts FIFO: train.py itself is running."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").endswith("receipts.fifo"):
                return True
        except OSError:
            continue
    return False


def wait_for_workload(proc: subprocess.Popen, running: bool = True) -> int:
    """The pid of the toy workload that ``proc`` (an `infrarsi run`) started; with ``running``,
    only once its script runs (its probe has the receipts FIFO open).

    Waiting past interpreter start matters: a workload still starting up when its
    sandbox is removed dies of the missing script, which would hide an orphan.
    """
    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"infrarsi ended before its workload was seen: rc={proc.returncode}\n{out}\n{err}")
        for pid in tree(proc.pid)[1:]:  # under the runner's shim, which stays the tree's root
            if is_workload(pid) and (has_receipts_open(pid) or not running):
                return pid
        time.sleep(0.02)
    raise AssertionError("the workload never started")


def gone_soon(pid: int) -> bool:
    """Whether ``pid`` ends within a moment: a killed workload ends at once, a leftover one sleeps an hour."""
    return gone_within(pid, 1.0)


def kill_workload(pid: int) -> None:
    """Clean up a workload the product left behind: its own process group, by id."""
    if alive(pid) and is_workload(pid):
        try:
            os.killpg(pid, signal.SIGKILL)  # the runner starts it as a session (and group) leader
        except OSError:
            pass
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def processes_under(folder: Path) -> list[int]:
    """Pids of running processes whose working directory is inside ``folder`` (a test's own TMPDIR)."""
    root = str(folder.resolve())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        cwd = cwd.removesuffix(" (deleted)")
        if (cwd == root or cwd.startswith(root + os.sep)) and alive(int(entry)):
            found.append(int(entry))
    return found
