"""Containment with real processes: every process a job starts ends with its execution.

The jobs are small Python scripts. A daemon is made the classic way (fork, setsid, fork
again, the middle process exits), so it is an orphan in its own session, outside the
job's process group; it writes its pid to ``daemon.pid`` once it runs.
"""

from __future__ import annotations

import difflib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processes import alive, gone_within

from infrarsi._hashing import hash_protected
from infrarsi.contract._candidate import resolve_candidate
from infrarsi.contract._contract import load_contract
from infrarsi.runner._cgroup import Cgroup, own_cgroup, pid_namespace
from infrarsi.runner._containment import STRAY_GRACE_S
from infrarsi.runner._executor import LocalExecutor
from infrarsi.runner._launch import LaunchSpec, launch
from infrarsi.verifiers import check_run_integrity

DAEMON = '''
import os, signal, sys, time


def daemon(body, pidfile="daemon.pid"):
    """Fork, setsid, fork: the grandchild is orphaned, in a session of its own."""
    ready_r, ready_w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            with open(pidfile + ".tmp", "w") as handle:
                handle.write(str(os.getpid()))
            os.rename(pidfile + ".tmp", pidfile)
            os.write(ready_w, b"x")
            body()
            os._exit(0)
        os._exit(0)
    os.read(ready_r, 1)
    os.wait()


def sleep():
    time.sleep(30)
'''

MB = 2**20


@pytest.fixture(params=[True, False], ids=["cgroup", "subreaper-only"])
def cgroups(request) -> bool:
    return request.param


@pytest.fixture
def job(tmp_path):
    """Writes a job script into ``tmp_path``; any daemon it leaves is killed by pid at the end."""

    def write(body: str) -> list[str]:
        (tmp_path / "job.py").write_text(DAEMON + body)
        return [sys.executable, "job.py"]

    yield write
    pid = daemon_pid(tmp_path, wait_s=0)
    if pid is not None and alive(pid):
        os.kill(pid, signal.SIGKILL)


def daemon_pid(folder: Path, wait_s: float = 5.0) -> int | None:
    deadline = time.monotonic() + wait_s
    while True:
        path = folder / "daemon.pid"
        if path.exists():
            return int(path.read_text())
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


def run(argv, folder, timeout_s=20.0, limit_mb=400, cgroups=True):
    return launch(
        LaunchSpec(
            argv=argv,
            cwd=folder,
            env=dict(os.environ),
            timeout_s=timeout_s,
            memory_limit_bytes=limit_mb * MB,
            cgroups=cgroups,
        )
    )


def containment_check(containment: dict):
    integrity = {
        "protected_changed_before_run": [],
        "protected_changed_by_run": [],
        "framework_changed": [],
        "containment": containment,
    }
    return {r.id: r for r in check_run_integrity(integrity)}["integrity.containment"]


def test_a_double_forked_daemon_is_a_stray_killed_and_failed(job, tmp_path, cgroups):
    seen = run(job("daemon(sleep)\ntime.sleep(0.2)\nprint('done')\n"), tmp_path, cgroups=cgroups)
    pid = daemon_pid(tmp_path)
    assert seen.status == "ok", seen.detail + seen.stderr_tail
    assert pid is not None and gone_within(pid, 5.0), f"daemon {pid} outlived the execution"
    record = seen.containment
    assert record["subreaper"] is True and record["root_lost"] is False
    assert [s["pid"] for s in record["strays"]] == [pid] and record["killed"] == 1
    assert "job.py" in record["strays"][0]["cmd"] and 0 < record["strays"][0]["first_seen_s"] < 1.0
    # The grace given to strays is not the job's time.
    assert seen.wall_s < STRAY_GRACE_S
    check = containment_check(record)
    assert check.status == "fail" and f"pid {pid}" in check.detail and "job.py" in check.detail


HONEST = """
import multiprocessing as mp
import subprocess


def square(x):
    return x * x


if __name__ == "__main__":
    subprocess.run([sys.executable, "-c", "print('child')"], check=True)
    with mp.Pool(2) as pool:
        assert pool.map(square, range(8))[-1] == 49
    worker = mp.Process(target=square, args=(3,))
    worker.start()
    worker.join()
    mp.Process(target=time.sleep, args=(30,), daemon=True).start()  # multiprocessing ends it at exit
    # Still tearing down when the job ends, as DataLoader workers can be: inside the grace.
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    print("done")
"""


def test_an_honest_job_with_workers_passes(job, tmp_path, cgroups):
    started = time.monotonic()
    seen = run(job(HONEST), tmp_path, cgroups=cgroups)
    elapsed = time.monotonic() - started
    assert seen.status == "ok", seen.detail + seen.stderr_tail
    assert seen.containment["strays"] == [] and seen.containment["killed"] == 0
    assert not seen.containment["root_lost"]
    check = containment_check(seen.containment)
    assert check.status == "pass", check.detail
    # Only the late worker was waited for, not the whole grace.
    assert elapsed - seen.wall_s < STRAY_GRACE_S


HOG = """
def hog():
    hoard = []
    for _ in range(8):
        hoard.append(bytearray(64 * 2**20))
        for i in range(0, len(hoard[-1]), 4096):
            hoard[-1][i] = 1
        time.sleep(0.05)
    time.sleep(30)


daemon(hog)
time.sleep(30)
"""


def test_a_daemon_s_memory_counts_for_the_memory_guard(job, tmp_path, cgroups):
    seen = run(job(HOG), tmp_path, limit_mb=300, cgroups=cgroups)
    pid = daemon_pid(tmp_path)
    assert seen.status == "oom", seen.detail + seen.stderr_tail
    assert "needs more than the limit of 300 MB" in seen.detail
    assert seen.peak_rss_bytes > 300 * MB
    assert seen.wall_s < 15
    assert gone_within(pid, 5.0)


def test_timeout_kills_a_reparented_daemon(job, tmp_path, cgroups):
    seen = run(job("daemon(sleep)\ntime.sleep(60)\n"), tmp_path, timeout_s=1.5, cgroups=cgroups)
    pid = daemon_pid(tmp_path)
    assert seen.status == "timeout"
    assert 1.5 <= seen.wall_s < 10
    assert gone_within(pid, 5.0)


def test_a_job_that_kills_the_shim_leaves_nothing_alive(job, tmp_path, cgroups):
    # The job's parent is the shim: killing it orphans the daemon a second time.
    seen = run(job("daemon(sleep)\nos.kill(os.getppid(), signal.SIGKILL)\ntime.sleep(30)\n"), tmp_path, cgroups=cgroups)
    pid = daemon_pid(tmp_path)
    assert seen.status == "crash" and seen.exit_code == -signal.SIGKILL
    assert gone_within(pid, 5.0), f"daemon {pid} outlived the execution"
    record = seen.containment
    assert record["root_lost"] is True
    assert pid in [s["pid"] for s in record["strays"]]
    check = containment_check(record)
    assert check.status == "fail" and "shim" in check.detail


ASSASSIN = """
def assassin():
    time.sleep(0.3)
    os.kill(os.getppid(), signal.SIGKILL)  # by now the daemon's parent is the shim
    time.sleep(30)


daemon(assassin)
"""


def test_a_daemon_that_kills_the_shim_after_the_job_ended_is_still_killed(job, tmp_path, cgroups):
    seen = run(job(ASSASSIN), tmp_path, cgroups=cgroups)
    pid = daemon_pid(tmp_path)
    assert seen.status == "ok" and seen.exit_code == 0  # the job's own status, from the shim's report
    assert gone_within(pid, 5.0)
    record = seen.containment
    assert record["root_lost"] is True and pid in [s["pid"] for s in record["strays"]]
    assert containment_check(record).status == "fail"


def test_a_job_that_signals_its_own_group_does_not_take_the_shim_with_it(job, tmp_path):
    seen = run(
        job(
            "subprocess = __import__('subprocess')\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
            "os.killpg(0, signal.SIGTERM)\ntime.sleep(30)\n"
        ),
        tmp_path,
    )
    assert seen.status == "crash" and seen.exit_code == -signal.SIGTERM
    assert "signal 15" in seen.detail
    assert seen.containment["strays"] == [] and not seen.containment["root_lost"]


@pytest.mark.parametrize(
    "how, code, detail",
    [
        ("raise SystemExit(3)", 3, "exit code 3"),
        ("os.kill(os.getpid(), signal.SIGABRT)", -signal.SIGABRT, "signal 6"),
    ],
)
def test_the_job_s_own_exit_status_comes_through_the_shim(job, tmp_path, how, code, detail):
    seen = run(job(how + "\n"), tmp_path)
    assert seen.status == "crash" and seen.exit_code == code and detail in seen.detail
    assert containment_check(seen.containment).status == "pass"


DRIVER = """
import os, signal, sys
from pathlib import Path
from infrarsi.runner._launch import LaunchSpec, launch

def stop(signum, frame):
    raise KeyboardInterrupt
signal.signal(signal.SIGTERM, stop)
launch(LaunchSpec(argv=[sys.executable, "job.py"], cwd=Path.cwd(), env=dict(os.environ), timeout_s=60,
                  memory_limit_bytes=2**30))
"""


def drive(job, tmp_path) -> tuple[subprocess.Popen, int]:
    """A second infrarsi process running the daemon job; returns it and the daemon's pid."""
    argv = job("daemon(sleep)\ntime.sleep(60)\n")
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, *argv], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    pid = daemon_pid(tmp_path, wait_s=20)
    assert pid is not None, driver.stderr.read() if driver.poll() is not None else "no daemon"
    return driver, pid


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_stopping_infrarsi_kills_a_reparented_daemon(job, tmp_path, sig):
    driver, pid = drive(job, tmp_path)
    driver.send_signal(sig)
    _, err = driver.communicate(timeout=20)
    assert b"KeyboardInterrupt" in err
    assert gone_within(pid, 5.0)


def _our_cgroups() -> list[Path]:
    out = []
    for kind in ("v2", "v1-memory"):
        parent = own_cgroup(kind)
        if parent is not None and parent.is_dir():
            out += [p for p in parent.iterdir() if p.name.startswith(f"infrarsi-{pid_namespace()}-")]
    return out


def _cgroup_available() -> bool:
    cgroup = Cgroup.create()
    if cgroup is None:
        return False
    cgroup.remove()
    return True


needs_cgroup = pytest.mark.skipif(not _cgroup_available(), reason="no writable cgroup on this machine")


@needs_cgroup
def test_the_cgroup_gives_a_memory_high_water_mark_and_is_removed(job, tmp_path):
    seen = run(job("x = bytearray(80 * 2**20)\nfor i in range(0, len(x), 4096): x[i] = 1\n"), tmp_path)
    assert seen.status == "ok", seen.detail + seen.stderr_tail
    record = seen.containment
    assert record["cgroup"] in ("v1-memory", "v2")
    if record["cgroup_peak_bytes"] is not None:  # v2 without its memory controller has none
        assert record["cgroup_peak_bytes"] > 80 * MB
    assert not [p for p in _our_cgroups() if p.name.startswith(f"infrarsi-{pid_namespace()}-{os.getpid()}-")]
    assert containment_check(record).detail.endswith(f"(subreaper and cgroup {record['cgroup']})")


@needs_cgroup
def test_the_cgroup_of_a_sigkilled_infrarsi_is_swept_by_the_next_launch(job, tmp_path):
    # SIGKILL can't be caught: the shim and the job die with infrarsi, but the daemon, in
    # the dead infrarsi's cgroup, is left to the next launch on this machine.
    driver, pid = drive(job, tmp_path)
    driver.kill()
    driver.communicate(timeout=20)
    assert any(p.name.split("-")[2] == str(driver.pid) for p in _our_cgroups())
    other = tmp_path / "other"
    other.mkdir()
    (other / "job.py").write_text("print('hello')\n")
    assert run([sys.executable, "job.py"], other).status == "ok"
    assert gone_within(pid, 5.0)
    assert not any(p.name.split("-")[2] == str(driver.pid) for p in _our_cgroups())


DAEMON_PATCH_AFTER = "p = probe.from_env()\n"


def test_a_candidate_patch_that_leaves_a_daemon_gets_a_failed_containment_check(toyjob, tmp_path):
    # End to end through the executor: the daemon comes in a patch, as a cheat would.
    train = (toyjob / "train.py").read_text()
    daemon = (
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        time.sleep(30)\n        os._exit(0)\n    os._exit(0)\nos.wait()\n"
    )
    patched = train.replace(DAEMON_PATCH_AFTER, DAEMON_PATCH_AFTER + daemon, 1)
    diff = "".join(difflib.unified_diff(train.splitlines(True), patched.splitlines(True), "a/train.py", "b/train.py"))
    (tmp_path / "daemon.diff").write_text(diff)
    contract = load_contract(toyjob / "infrarsi.toml")
    pinned = hash_protected(contract.workspace, contract.protected_globs)
    result = LocalExecutor().run(contract, pinned, resolve_candidate(contract, {}, [str(tmp_path / "daemon.diff")]))
    assert result.status == "ok", result.detail + result.stderr_tail
    record = result.evidence["integrity"]["containment"]
    assert len(record["strays"]) == 1 and "train.py" in record["strays"][0]["cmd"]
    assert gone_within(record["strays"][0]["pid"], 5.0)
    check = {r.id: r for r in check_run_integrity(result.evidence["integrity"])}["integrity.containment"]
    assert check.status == "fail"
