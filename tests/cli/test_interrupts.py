"""Killing `infrarsi run` at any moment leaves a ledger whose chain verifies, with nothing committed lost.

The kills land at moments chosen by what the process is doing (its workload is
running, it is inside the ledger's write transaction, it has just committed), or
after a fixed delay; the delays only spread the kills, nothing asserts on time.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_testing import PATIENCE_S, alive, argv, cli_env, executions, gone_soon, ledger_state, wait_for_workload

from infrarsi import run as run_in_process

# Runs the real CLI main() after arranging for a signal to arrive at one moment inside
# the ledger write: after the row and head are written but before COMMIT, or just after it.
_AT_LEDGER_MOMENT = """
import os, signal, sys
from infrarsi.ledger import _ledger

moment, sig = sys.argv[1], getattr(signal, sys.argv[2])
if moment == "in-transaction":
    original = _ledger.Ledger._set_head
    def _set_head(self, *args, **kwargs):
        original(self, *args, **kwargs)
        os.kill(os.getpid(), sig)
    _ledger.Ledger._set_head = _set_head
else:
    original = _ledger.Ledger.append_execution
    def append_execution(self, *args, **kwargs):
        execution = original(self, *args, **kwargs)
        os.kill(os.getpid(), sig)
        return execution
    _ledger.Ledger.append_execution = append_execution
from infrarsi.cli import main
sys.argv = ["infrarsi"] + sys.argv[3:]
sys.exit(main())
"""

SEEDED = 2


@pytest.fixture
def seeded(workspace: Path) -> Path:
    """An initialised workspace with two committed executions."""
    for _ in range(SEEDED):
        run_in_process(workspace / "infrarsi.toml")
    return workspace


def spawn(cmd: list[str], workspace: Path, sandbox_tmp: Path) -> subprocess.Popen:
    return subprocess.Popen(
        cmd,
        cwd=workspace,
        env=cli_env(sandbox_tmp),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=PATIENCE_S)
    return proc.returncode, out, err


def assert_ledger_intact(workspace: Path, before, added: set[int]) -> None:
    """The chain verifies, every earlier row is there unchanged, and ``added`` says how many new rows may be."""
    after = ledger_state(workspace)
    assert after.chain_ok, after.chain_detail
    assert after.rows[: len(before.rows)] == before.rows
    assert len(after.rows) - len(before.rows) in added, after.rows
    # The ledger still takes writes: the head matches the chain.
    run_in_process(workspace / "infrarsi.toml")
    final = ledger_state(workspace)
    assert final.chain_ok and len(final.rows) == len(after.rows) + 1, final.chain_detail


def interrupt_hanging_run(
    workspace: Path, sandbox_tmp: Path, workloads: list[int], sig: int, mode: str = "hang", running: bool = True
):
    """Start `infrarsi run --set mode=MODE`, wait for its workload (started, or running its
    script), send ``sig`` to infrarsi."""
    proc = spawn(argv("run", "--json", "--set", f"mode={mode}"), workspace, sandbox_tmp)
    try:
        workload = wait_for_workload(proc, running=running)
        workloads.append(workload)
        proc.send_signal(sig)
        return finish(proc), workload
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- SIGKILL ---------------------------------------------------------------------------------


@pytest.mark.parametrize("delay_s", [0.0, 0.1, 0.25, 0.4])
def test_sigkill_after_a_delay(seeded, sandbox_tmp, workloads, delay_s):
    before = ledger_state(seeded)
    proc = spawn(argv("run", "--json"), seeded, sandbox_tmp)
    time.sleep(delay_s)
    proc.kill()
    rc, _, _ = finish(proc)
    assert rc in (-signal.SIGKILL, 0)  # a fast machine may finish first; either way the ledger holds
    assert_ledger_intact(seeded, before, added={0, 1})


def test_sigkill_while_the_workload_runs(seeded, sandbox_tmp, workloads):
    before = ledger_state(seeded)
    (rc, _, _), _ = interrupt_hanging_run(seeded, sandbox_tmp, workloads, signal.SIGKILL)
    assert rc == -signal.SIGKILL
    assert_ledger_intact(seeded, before, added={0})


@pytest.mark.parametrize("moment, added", [("in-transaction", 0), ("after-commit", 1)])
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGINT"])
def test_signal_inside_the_ledger_write(seeded, sandbox_tmp, moment, added, sig):
    before = ledger_state(seeded)
    proc = spawn([sys.executable, "-c", _AT_LEDGER_MOMENT, moment, sig, "run", "--json"], seeded, sandbox_tmp)
    rc, out, err = finish(proc)
    if sig == "SIGKILL":
        assert rc == -signal.SIGKILL, (rc, out, err)
    else:
        assert rc == 130 and "interrupted" in err and "Traceback" not in err, (rc, out, err)
    assert_ledger_intact(seeded, before, added={added})


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux-only")
@pytest.mark.parametrize("mode, running", [("hang", True), ("ok", False)], ids=["running", "starting"])
def test_sigkill_of_infrarsi_leaves_no_workload_behind(seeded, sandbox_tmp, workloads, mode, running):
    """SIGKILL can't be caught: the kernel ends the workload (PR_SET_PDEATHSIG, set before it starts).

    Its sandbox copy stays in TMPDIR (nothing of infrarsi runs to remove it); the ledger is intact.
    """
    (rc, _, _), workload = interrupt_hanging_run(seeded, sandbox_tmp, workloads, signal.SIGKILL, mode, running)
    assert rc == -signal.SIGKILL
    assert gone_soon(workload), f"workload {workload} still running after infrarsi was SIGKILLed"


# -- SIGINT / SIGTERM ------------------------------------------------------------------------


def test_sigint_while_the_workload_runs_keeps_the_ledger_and_exits_130(seeded, sandbox_tmp, workloads):
    before = ledger_state(seeded)
    (rc, out, err), _ = interrupt_hanging_run(seeded, sandbox_tmp, workloads, signal.SIGINT)
    assert rc == 130, (rc, out, err)
    assert "interrupted" in err and "Traceback" not in err
    assert list(sandbox_tmp.glob("infrarsi-run-*")) == []  # the sandbox copy is removed
    # The interrupted execution is a row too, with the device time it used.
    last = executions(seeded)[-1]
    assert last["status"] == "crash" and last["detail"].startswith("interrupted after") and last["device_s"] > 0
    assert_ledger_intact(seeded, before, added={1})


def test_sigint_kills_the_workload(seeded, sandbox_tmp, workloads):
    (rc, _, _), workload = interrupt_hanging_run(seeded, sandbox_tmp, workloads, signal.SIGINT)
    assert rc == 130
    assert not alive(workload) or gone_soon(workload), f"workload {workload} orphaned by SIGINT"


def test_sigterm_kills_the_workload_and_removes_the_sandbox(seeded, sandbox_tmp, workloads):
    before = ledger_state(seeded)
    (rc, _, _), workload = interrupt_hanging_run(seeded, sandbox_tmp, workloads, signal.SIGTERM)
    assert executions(seeded)[-1]["detail"].startswith("interrupted after")
    assert_ledger_intact(seeded, before, added={1})
    assert gone_soon(workload), f"workload {workload} orphaned by SIGTERM (infrarsi rc={rc})"
    assert list(sandbox_tmp.glob("infrarsi-run-*")) == []
