"""`[executor] kind = "slurm"` end to end on the real test Slurm cluster (conftest.py): every execution
is a Slurm job submitted through submitit, running InfraRSI's runner on the node; `scancel`
mid-job is recorded with Slurm's state and run time; a promotion's `verify` holds one allocation
for its candidate run and all its A/B pairs; a driver SIGKILLed with a job in flight
resumes with that job's own result, neither lost nor run twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ledger_rows import evidence, rows

from infrarsi._receipt import verify_receipt
from infrarsi.examples.landscape import Landscape, make_workspace

# Beside other tests (the parallel pass): the jobs sleep (landscapes, `timing_sensitive = false`).
# Never beside the containment cheats, which SIGSTOP every train.py on the machine
# (tests/cheats/containment/): those run in the serial pass. Each xdist worker that runs one of
# these tests starts a cluster of its own (conftest.py; free ports, its own folder).

CLI = [sys.executable, "-m", "infrarsi.cli"]
PATIENCE_S = 300  # a safety net against a hang, never a performance assertion
EXECUTOR = '\n[executor]\nkind = "slurm"\ntime_limit_min = 10\nsbatch = ["--comment=infrarsi-test"]\n'


def _cli(root: Path, *args: str):
    done = subprocess.run(CLI + list(args), cwd=root, capture_output=True, text=True, timeout=PATIENCE_S)
    out = json.loads(done.stdout.splitlines()[-1]) if done.stdout.strip().startswith("{") else None
    return done, out


def _workspace(tmp_path: Path, land: Landscape, **kw) -> Path:
    root = make_workspace(tmp_path / land.name, land, **kw)
    contract = root / "infrarsi.toml"
    contract.write_text(contract.read_text() + EXECUTOR)
    for verb in (["init"], ["baseline", "--runs", "2"]):
        done, _ = _cli(root, *verb, "--json")
        assert done.returncode == 0, done.stderr
    return root


def _running_job(cluster, deadline: float) -> str:
    while time.monotonic() < deadline:
        done = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i"], capture_output=True, text=True)
        jobs = done.stdout.split()
        if jobs:
            return jobs[0]
        time.sleep(0.2)
    raise AssertionError(f"no Slurm job started running; {cluster.logs()}")


def test_a_search_runs_each_execution_as_a_slurm_job_and_promotes_with_a_receipt(slurm, tmp_path):
    """With --workers 2: each exploration is still a job of its own, journalled apart."""
    land = Landscape(
        name="cluster",
        patches=["tidy"],
        knobs={"fast": (["0", "1"], "0")},
        base_ms=40.0,
        base_mb=40.0,
        limit_mb=400.0,
        noise=0.01,
        time={"fast=1": 0.4, "+tidy": 0.97},
    )
    root = _workspace(tmp_path, land, ab_pairs=2)
    # Two explorations in flight (a job each, a journal each); the promotion still one allocation.
    done, out = _cli(root, "search", "--budget", "9", "--workers", "2", "--json")
    assert done.returncode == 0, done.stderr
    assert not list((root / ".infrarsi" / "search").glob("*.inflight*.json"))
    best = out["best"]
    assert best is not None and best["knobs"]["fast"] == "1", out["attempts"]
    assert verify_receipt(best["receipt"]).ok

    runs = [r for r in rows(root) if r["kind"] != "proposal" and r["status"] != "rejected"]
    jobs: dict[str, set[str]] = {}  # job id -> the batches its executions belong to
    alone = 0
    for row in runs:
        seen = evidence(root, row)
        slurm_ev = seen.get("slurm") or {}
        assert slurm_ev.get("job_id") and slurm_ev.get("node") in slurm.nodes, (row["id"], seen.keys())
        assert seen["fingerprint"]["slurm_node"] in slurm.nodes
        jobs.setdefault(slurm_ev["job_id"], set()).add(row["batch"])
        alone += row["kind"] in ("baseline", "search")
    # The promotion's verify (its candidate run and every A/B pair) held one allocation, one job;
    # the baseline's and the exploration's runs were a job each.
    [promotion] = {a["batch"] for a in out["attempts"]}
    held = [job for job, batches in jobs.items() if promotion in batches]
    assert len(held) == 1 and jobs[held[0]] == {promotion}, jobs
    verify_rows = [r for r in runs if r["batch"] == promotion]
    assert len(verify_rows) >= 1 + 2 * 2 and len(jobs) == alone + 1
    # submitit's folders (the pickled call, the result, the job's own stdout/stderr) per job id.
    assert {p.name for p in (root / ".infrarsi" / "slurm").iterdir()} >= set(jobs)
    # The job script carried the contract's #SBATCH options.
    script = next((root / ".infrarsi" / "slurm").glob("*/*submission.sh")).read_text()
    assert "#SBATCH --comment=infrarsi-test" in script and "#SBATCH --time=10" in script


def test_a_job_cancelled_mid_run_is_recorded_with_slurms_state_and_run_time(slurm, tmp_path):
    land = Landscape(
        name="cancelled",
        patches=[],
        knobs={"slow": (["0", "1"], "0")},
        base_ms=30.0,
        base_mb=40.0,
        limit_mb=400.0,
        noise=0.01,
        time={"slow=1": 150.0},  # 4.5 s a step: long enough to cancel mid-run
    )
    root = _workspace(tmp_path, land)
    proc = subprocess.Popen(
        CLI + ["run", "--set", "slow=1", "--json"], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    job = _running_job(slurm, time.monotonic() + PATIENCE_S)
    time.sleep(2.0)  # the job runs a while: its run time is Slurm's, not zero
    subprocess.run(["scancel", job], check=True)
    stdout, stderr = proc.communicate(timeout=PATIENCE_S)
    row = rows(root)[-1]
    assert row["status"] == "crash", (row, stderr)
    assert row["detail"].startswith(f"interrupted: slurm job {job} CANCELLED"), row["detail"]
    assert row["device_s"] >= 1.0, row
    assert evidence(root, row)["slurm"]["state"] == "CANCELLED"


def test_a_driver_killed_with_a_job_in_flight_resumes_with_that_jobs_own_result(slurm, tmp_path):
    land = Landscape(
        name="orphan",
        patches=[],
        knobs={"x": (["0", "1", "2"], "0")},
        base_ms=400.0,  # 2 s a run: the kill lands while a job runs
        base_mb=40.0,
        limit_mb=400.0,
        noise=0.01,
        time={"x=1": 0.5, "x=2": 0.8},
    )
    root = _workspace(tmp_path, land, ab_pairs=2)
    proc = subprocess.Popen(
        CLI + ["search", "--budget", "8", "--json"],
        cwd=root,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    journal_dir = root / ".infrarsi" / "search"
    deadline = time.monotonic() + PATIENCE_S
    job = None
    while job is None:
        assert proc.poll() is None and time.monotonic() < deadline, "the search ended before a job was in flight"
        for path in journal_dir.glob("*.inflight.json") if journal_dir.exists() else ():
            try:
                job = json.loads(path.read_text()).get("slurm_job_id")
            except ValueError:
                pass
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = rows(root)
    assert not any((evidence(root, r).get("slurm") or {}).get("job_id") == job for r in before)

    done, out = _cli(root, "search", "--resume", "--json")
    assert done.returncode == 0, done.stderr
    after = rows(root)
    assert after[: len(before)] == before
    mine = [r for r in after if (evidence(root, r).get("slurm") or {}).get("job_id") == job]
    assert len(mine) == 1, [(r["id"], r["status"], r["detail"]) for r in mine]  # recorded once, never re-run
    assert mine[0]["status"] == "ok" and not mine[0]["detail"].startswith("interrupted"), mine[0]
    # Judged as any run is (its verdicts and rule version recorded), and that point never run again.
    assert json.loads(mine[0]["verdicts"]) and mine[0]["rule_version"], mine[0]
    again = [r for r in after if r["kind"] == "search" and r["knobs"] == mine[0]["knobs"]]
    assert len(again) == 1, [(r["id"], r["status"]) for r in again]
    assert any(f"recorded slurm job {job}" in m for m in out.get("messages", [])), out.get("messages")


def test_flags_send_a_local_contracts_runs_to_slurm_and_the_baselines_hardware_must_match(slurm, tmp_path):
    """`--executor slurm --sbatch=... --time-limit-min N` on a contract that says nothing of Slurm."""
    land = Landscape(
        name="flags",
        patches=[],
        knobs={"fast": (["0", "1"], "0")},
        base_ms=30.0,
        base_mb=40.0,
        limit_mb=400.0,
        noise=0.01,
        time={"fast=1": 0.5},
    )
    root = make_workspace(tmp_path / land.name, land, ab_pairs=2)
    flags = ["--executor", "slurm", "--sbatch=--comment=from-flags", "--time-limit-min", "7"]
    assert _cli(root, "init", "--json")[0].returncode == 0
    done, _ = _cli(root, "baseline", "--runs", "1", *flags, "--json")
    assert done.returncode == 0, done.stderr
    done, out = _cli(root, "run", "--set", "fast=1", *flags, "--account", "anyone", "--json")
    assert done.returncode == 0, done.stderr
    row = rows(root)[-1]
    seen = evidence(root, row)
    assert seen["slurm"]["node"] in slurm.nodes and row["id"] == out["execution"]
    assert seen["executor_flags"] == {
        "kind": "slurm",
        "sbatch": ["--comment=from-flags"],
        "time_limit_min": 7,
        "account": "anyone",
    }
    script = (root / ".infrarsi" / "slurm" / seen["slurm"]["job_id"]).glob("*submission.sh")
    text = next(script).read_text()
    assert "#SBATCH --comment=from-flags" in text and "#SBATCH --time=7" in text and "--account=anyone" in text
    # The baseline ran on Slurm: a verify on this machine (the contract's own executor) is refused.
    done, out = _cli(root, "verify", "--set", "fast=1", "--json")
    assert done.returncode == 2 and "--executor: 'slurm' -> 'local'" in out["error"], done.stderr
    done, out = _cli(root, "run", *flags, "--sbatch=qos", "--json")
    assert done.returncode == 2 and out["error"].startswith('--sbatch: expected options of the form "--key=value"')
