"""Jobs of several ranks under torchrun, through the real runner: one receipt channel per rank,
the slowest rank's step time, each rank held to the memory limit, one failing rank ending all.

The ranks here are plain Python (torchrun's agent imports torch; the ranks need not), so each
run costs little more than the launcher's start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from processes import alive

from infrarsi._hashing import hash_protected
from infrarsi.contract._candidate import resolve_candidate
from infrarsi.contract._contract import load_contract
from infrarsi.runner._executor import LocalExecutor
from infrarsi.verifiers import RunEvidence

RANK_JOB = """\
import os, sys, time
from infrarsi import probe

PID_FILE = {pid_file!r}

rank = int(os.environ["RANK"])
behaviour = os.environ.get("RANK_JOB", "")
p = probe.from_env()
hog = []
for step in range(1, p.total_steps + 1):
    with p.step(step, tokens=100):
        time.sleep(0.02 if rank == 0 else 0.05)  # rank 1 is the slow one
        if behaviour == "grow" and rank == 1 and step >= 3:
            hog.append(bytearray(40 * 2**20))
            hog[-1][::4096] = b"x" * len(hog[-1][::4096])
        if behaviour == "even" and step == 3:
            ballast = bytearray(90 * 2**20)
            ballast[::4096] = b"x" * len(ballast[::4096])
            hog.append(ballast)
    p.log(step, loss=1.0 / step + rank, grad_norm=1.0)
    if behaviour == "die" and rank == 1 and step == 3:
        sys.exit(3)
    if behaviour == "die" and rank == 0 and step == 3:
        with open(PID_FILE, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(600)  # never finishes alone: torchrun must end it when rank 1 dies
p.close()
"""

CONTRACT = """\
[task]
name = "ranks"
command = ["python", "job.py"]
launcher = "torchrun"
nproc_per_node = 2
timeout_s = 120

[scope]
editable = ["job.py"]

[timing]
warmup_steps = 1
measure_steps = 5

[numerics]
require = ["loss", "grad_norm"]

[resources]
memory_limit_mb = 150

[knobs.behaviour]
env = "RANK_JOB"
choices = ["plain", "grow", "even", "die"]
baseline = "plain"
"""


@pytest.fixture(scope="module")
def ranks_job(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ranks")
    (root / "job.py").write_text(RANK_JOB.replace("{pid_file!r}", repr(str(root / "rank0.pid"))))
    (root / "infrarsi.toml").write_text(CONTRACT)
    return root


def _run(root: Path, behaviour: str):
    contract = load_contract(root / "infrarsi.toml")
    pinned = hash_protected(contract.workspace, contract.protected_globs)
    return LocalExecutor().run(contract, pinned, resolve_candidate(contract, {"behaviour": behaviour}, []))


def test_each_rank_reports_on_its_own_channel_and_the_slowest_rank_times_the_step(ranks_job):
    result = _run(ranks_job, "plain")
    assert result.status == "ok", (result.detail, result.stderr_tail)
    evidence = result.evidence
    assert evidence["ranks"] == 2 and sorted(set(evidence["line_ranks"])) == [0, 1]
    run = RunEvidence.from_stored(result.receipts.decode().splitlines(), json.loads(json.dumps(evidence)))
    losses = {r: [s.get("loss") for s in run.of_rank(r).steps] for r in (0, 1)}
    # Each rank's lines are its own (rank 1's loss is 1 higher), told apart by the channel.
    assert losses[0] == pytest.approx([1.0 / k for k in range(1, 7)])
    assert losses[1] == pytest.approx([1.0 + 1.0 / k for k in range(1, 7)])
    # The job's steps: tokens of both ranks, the period of the slower one (50 ms, not 20 ms).
    assert [s.get("tokens") for s in run.steps] == [200] * 6
    assert 0.045 < result.step_time_s < 0.5
    assert set(evidence["rank_peak_rss_bytes"]) == {"0", "1"}


def test_one_rank_over_the_limit_is_oom_and_the_limit_holds_per_rank(ranks_job):
    # Both ranks at ~100 MB: 200 MB together, over 150, but each rank is under it.
    even = _run(ranks_job, "even")
    assert even.status == "ok", (even.detail, even.stderr_tail)
    assert even.peak_mem_mb < 150
    grown = _run(ranks_job, "grow")
    assert grown.status == "oom", (grown.detail, grown.stderr_tail)
    assert "rank 1" in grown.detail


def test_one_rank_dying_ends_every_rank(ranks_job):
    """Rank 1 exits at step 3 while rank 0 sleeps for ten minutes: the job is a crash at once
    (not a timeout), and rank 0 is gone with it."""
    result = _run(ranks_job, "die")
    assert result.status == "crash", (result.status, result.detail)
    rank0 = int((ranks_job / "rank0.pid").read_text())
    assert not alive(rank0)
    assert not result.evidence["integrity"]["containment"].get("strays")


def test_a_launcher_of_one_rank_holds_the_rank_not_torchrun_to_the_limit(ranks_job):
    """torchrun's own process (torch imported: some 200 MB) is over this contract's 150 MB alone;
    with one rank the limit still holds for the rank, and its receipts come through the socket."""
    one = ranks_job / "one.toml"
    one.write_text(CONTRACT.replace("nproc_per_node = 2", "nproc_per_node = 1"))
    contract = load_contract(one)
    pinned = hash_protected(contract.workspace, contract.protected_globs)
    result = LocalExecutor().run(contract, pinned, resolve_candidate(contract, {"behaviour": "plain"}, []))
    assert result.status == "ok", (result.detail, result.stderr_tail)
    assert result.evidence["ranks"] == 1 and set(result.evidence["line_ranks"]) == {0}
    assert result.step_time_s is not None and result.peak_mem_mb < 150
