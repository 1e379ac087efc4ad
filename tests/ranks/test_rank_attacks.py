"""Red-team corpus for jobs of several ranks: a job (plain Python ranks under the real torchrun,
through the real LocalExecutor) that tries to look faster than it is, to escape the per-rank
memory limit, to outlive its execution, or to break the runner.

Each test asserts the SAFE outcome. Four attacks beat the first version of these checks (ranks
taking turns to hide the slow one, one rank writing another's receipts, helpers claiming ranks of
their own, memory parked in torchrun's store); the comment above each says how, and what fixed it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
from processes import alive, gone_within

from infrarsi._baseline import summarise
from infrarsi._hashing import hash_protected
from infrarsi.contract._candidate import resolve_candidate
from infrarsi.contract._contract import load_contract
from infrarsi.runner._executor import LocalExecutor
from infrarsi.verifiers import BaselineReference, Rules, RunEvidence, judge_run, runner_step_time

RANK_JOB = """\
import os, signal, socket, struct, subprocess, sys, time

if os.environ.get("RANK_JOB") == "reexec" and os.environ.get("RANK") == "1":
    # Rank 1 starts over as itself without RANK in its environment (/proc/PID/environ no longer
    # names a rank); it puts RANK back in os.environ only, which /proc does not show.
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    os.execve(sys.executable, [sys.executable, sys.argv[0]], {**env, "WAS_RANK": "1"})
if "WAS_RANK" in os.environ:
    os.environ["RANK"] = os.environ["WAS_RANK"]

from infrarsi import probe

OUT = {out!r}

rank = int(os.environ["RANK"])
behaviour = os.environ.get("RANK_JOB", "")


def touch(size_mb):
    block = bytearray(size_mb * 2**20)
    block[::4096] = b"x" * len(block[::4096])
    return block


def pid_file(name, pid):
    with open(os.path.join(OUT, name), "w") as f:
        f.write(str(pid))


def park(megabytes):
    # Park bytes in the TCPStore torchrun's agent hosts (--standalone: MASTER_ADDR/PORT), in
    # torch's own wire protocol (no torch needed): VALIDATE, SETs of 4 MB, then a GET, answered
    # once every SET before it is done.
    conn = socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))
    conn.sendall(struct.pack("=BI", 0, 0x3C85F7CE))
    chunk = b"x" * (4 * 2**20)
    for i in range(megabytes // 4):
        key = b"park%d" % i
        conn.sendall(struct.pack("=BQ", 1, len(key)) + key + struct.pack("=Q", len(chunk)))
        conn.sendall(chunk)
    conn.sendall(struct.pack("=BQ", 3, 5) + b"park0")
    size, got = struct.unpack("=Q", conn.recv(8, socket.MSG_WAITALL))[0], 0
    while got < size:
        got += len(conn.recv(size - got))
    with open(f"/proc/{os.getppid()}/status") as f:
        agent = [int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS")][0]
    pid_file("agent_rss", agent)
    return conn


HOG = "import sys, time; b = bytearray(int(sys.argv[1]) * 2**20); b[::4096] = b'x' * len(b[::4096]); time.sleep(0.5)"
SPAWN = "import subprocess, sys; subprocess.run([sys.executable, '-c', sys.argv[1], '100'])"
hold, kids = [], []

if behaviour == "fake-rank" and rank == 1:
    # Two helpers of rank 1, each told it is a rank of its own (RANK=7, RANK=8): 2 x 100 MB + 60 MB here.
    # Each starts its hog itself, so that the guard never sees the hog between fork and exec with
    # rank 1's environment (it would keep rank 1 for it).
    kids = [
        subprocess.Popen([sys.executable, "-c", SPAWN, HOG], env={**os.environ, "RANK": str(7 + i)}) for i in range(2)
    ]
    hold.append(touch(60))
if behaviour == "same-rank" and rank == 1:
    # The control: the same helpers, left with rank 1's own RANK.
    kids = [subprocess.Popen([sys.executable, "-c", HOG, "100"]) for i in range(2)]
    hold.append(touch(60))
if behaviour == "daemon" and rank == 1 and os.fork() == 0:
    os.setsid()
    if os.fork() == 0:  # detached from rank 1's tree, still sleeping long after the job
        pid_file("daemon.pid", os.getpid())
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)"])
    os._exit(0)

if behaviour == "reexec" and rank == 1:
    hold.append(touch(250))  # rank 1's own work, over the 150 MB limit
if behaviour == "park" and rank == 0:
    store = park(300)  # 300 MB of rank 0's, twice the limit, held by the agent for it

if behaviour == "silent" and rank == 1:
    time.sleep(0.3)  # trains, but never opens its receipt channel
    sys.exit(0)

p = probe.from_env()
forged = None
if behaviour == "forge":
    if rank == 0:
        # Rank 0 opens rank 1's channel as its own (no INFRARSI_* name in sight: RANK picks the channel).
        os.environ["RANK"] = "1"
        forged = probe.from_env()
        os.environ["RANK"] = "0"
    else:
        p = None  # rank 1 writes nothing: rank 0 speaks for it

for step in range(1, p.total_steps + 1 if p else 7):
    if behaviour == "plain":
        pace = 0.05
    elif behaviour == "stagger":
        # Rank 0 got faster (10 ms) but rank 1 still takes 50 ms a step. Rank 0 lingers in its
        # warm-up step so that its lines of the window all arrive after rank 1's.
        pace = (0.4 if step == 1 else 0.01) if rank == 0 else 0.05
    elif behaviour == "forge":
        pace = 0.01 if rank == 0 else 0.1  # rank 1 is ten times slower, and silent
    else:
        pace = 0.02
    if p is None:
        time.sleep(pace)
        continue
    with p.step(step, tokens=100):
        time.sleep(pace)
    p.log(step, loss=1.0 / step + rank, grad_norm=1.0)
    if forged is not None:
        with forged.step(step, tokens=100):
            pass
        forged.log(step, loss=1.0 / step + 1, grad_norm=1.0)
    if behaviour == "kill-agent" and step == 3:
        if rank == 1:
            os.kill(os.getppid(), signal.SIGKILL)  # torchrun's agent
        else:
            pid_file("rank0.pid", os.getpid())
            time.sleep(600)
if forged is not None:
    forged.close()
if p is not None:
    p.close()
for kid in kids:
    kid.wait()  # nothing of the job outlives it
"""

CONTRACT = """\
[task]
name = "rank-attacks"
command = ["python", "job.py"]
launcher = "torchrun"
nproc_per_node = 2
timeout_s = 60

[scope]
editable = ["job.py"]

[timing]
warmup_steps = 1
measure_steps = 5

[numerics]
require = ["loss"]

[resources]
memory_limit_mb = 150

[knobs.behaviour]
env = "RANK_JOB"
choices = ["plain", "stagger", "forge", "fake-rank", "same-rank", "reexec", "park", "daemon", "silent", "kill-agent"]
baseline = "plain"
"""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("rank-attacks")
    out = root.parent / (root.name + "-out")
    out.mkdir()
    (root / "job.py").write_text(RANK_JOB.replace("{out!r}", repr(str(out))))
    (root / "infrarsi.toml").write_text(CONTRACT)
    return root


def _out(root: Path) -> Path:
    return root.parent / (root.name + "-out")


def _run(root: Path, behaviour: str, sample_all: bool = False):
    contract = load_contract(root / "infrarsi.toml")
    pinned = hash_protected(contract.workspace, contract.protected_globs)
    candidate = resolve_candidate(contract, {"behaviour": behaviour}, [])
    return contract, LocalExecutor().run(contract, pinned, candidate, sample_all=sample_all)


@pytest.fixture(scope="module")
def reference(workspace) -> BaselineReference:
    """The honest job's baseline, as `infrarsi baseline` sums it up (one timed run)."""
    contract, result = _run(workspace, "plain")
    assert result.status == "ok", (result.detail, result.stderr_tail)
    warmup, measure = contract.timing.warmup_steps, contract.timing.measure_steps
    summary = summarise([result], [1], warmup, measure, None)
    assert summary.reference_ranks and len(summary.reference_ranks) == 2
    return BaselineReference.from_summary(json.loads(json.dumps(dataclasses.asdict(summary))))


def _judge(root: Path, behaviour: str, reference: BaselineReference):
    contract, result = _run(root, behaviour)
    run = RunEvidence.from_stored(result.receipts.decode().splitlines(), json.loads(json.dumps(result.evidence)))
    checks = {c.id: c for c in judge_run(run, reference, Rules.from_contract(contract))}
    return result, checks


# Torch-free ranks carry no per-parameter gradient norms, so numerics.grad_norm is unchecked for
# the honest job too; every other check is one a cheat must pass.
_TORCH_ONLY = {"numerics.grad_norm"}


def _beaten(checks) -> bool:
    """Every check the honest job passes passed: the run would earn a receipt."""
    return all(c.status in ("pass", "skipped") for k, c in checks.items() if k not in _TORCH_ONLY)


def _summary(checks) -> dict:
    return {k: (c.status, c.detail[:160]) for k, c in checks.items()}


def test_the_honest_job_passes_every_check(workspace, reference):
    result, checks = _judge(workspace, "plain", reference)
    assert result.status == "ok", result.detail
    assert _beaten(checks), _summary(checks)
    assert 0.045 < result.step_time_s < 0.5


# -- timing: the job's step time is its slowest rank's --------------------------------------------


@pytest.mark.serial
# Beaten once (the attack, as first found): merged_steps anchors the job's window at the LATEST
# arrival of the warm-up step over ranks: rank 0 lingers 400 ms in its warm-up step, then runs its
# window at 10 ms a step and ends after rank 1, so every merged arrival is rank 0's; rank 1 still
# takes 50 ms a step, yet the job is timed at ~10 ms and each rank's own
# timing.window/timing.clock pass. Fixed: the job's step time should be the largest of each rank's
# own mean measured period (runner_step_time per rank), not the mean period of the merged
# arrivals.
def test_staggered_ranks_cannot_hide_the_slow_rank(workspace, reference):
    result, checks = _judge(workspace, "stagger", reference)
    if result.status != "ok" or result.step_time_s is None:
        pytest.fail(f"the job itself did not run: {result.status} {result.detail}")
    slow = RunEvidence.from_stored(result.receipts.decode().splitlines(), result.evidence).of_rank(1)
    if not 0.045 < runner_step_time(slow, 1, 5) < 0.5:
        pytest.fail("rank 1 was meant to take 50 ms a step")
    # Safe: the job is timed at its slowest rank's pace (50 ms a step), or some check fails.
    assert not _beaten(checks) or result.step_time_s > 0.045, (result.step_time_s, _summary(checks))


@pytest.mark.serial
# Beaten once (the attack, as first found): a rank's channel is only a FIFO path any process of
# the job can open: rank 0 sets RANK=1 and calls probe.from_env() again to write rank 1's receipts
# (its losses, its tokens) at its own 10 ms pace while rank 1 runs at 100 ms and writes nothing;
# line_ranks tags the lines as rank 1's, every per-rank check passes and the job is timed at 10
# ms. Fixed: bind a channel to the process that writes it (e.g. one unix socket per job whose
# SO_PEERCRED pid is mapped to its rank through the process tree below torchrun, as RankGuard
# does), not to the path the job chose to open.
def test_one_rank_cannot_speak_for_another(workspace, reference):
    result, checks = _judge(workspace, "forge", reference)
    assert result.status == "ok", (result.status, result.detail)
    # The kernel names the writer: every line rank 0 wrote as "rank 1" is rank 0's, and rank 1,
    # which wrote nothing, has no window, so the job has no step time and its checks fail.
    run = RunEvidence.from_stored(result.receipts.decode().splitlines(), result.evidence)
    assert run.of_rank(1).steps == [] and len(run.of_rank(0).steps) == 2 * 6
    assert result.step_time_s is None
    assert not _beaten(checks), _summary(checks)
    assert "rank 1" in checks["timing.window"].detail


def test_a_rank_that_never_reports_leaves_no_step_time(workspace, reference):
    result, checks = _judge(workspace, "silent", reference)
    assert result.step_time_s is None
    assert not _beaten(checks)
    assert checks["timing.window"].status != "pass" and "rank 1" in checks["timing.window"].detail


def _synthetic(per_rank: dict[int, list[tuple[int, int]]]) -> RunEvidence:
    """Receipt lines as the runner would have stamped them: rank -> [(step, tokens)] in the order
    the rank wrote them, one step every 50 ms on every rank."""
    start = 10**12
    lines, arrivals, tags = [], [], []
    for rank, steps in per_rank.items():
        for i, (step, tokens) in enumerate(steps, start=1):
            t1 = start + i * 50_000_000
            record = {"type": "step", "step": step, "t0_ns": t1 - 45_000_000, "t1_ns": t1, "tokens": tokens}
            record.update({"loss": 1.0 / step + rank, "grad_norm": 1.0, "peak_mem_bytes": None})
            lines.append(json.dumps(record))
            arrivals.append(t1 + 1_000_000)
            tags.append(rank)
    order = sorted(range(len(lines)), key=lambda i: (arrivals[i], tags[i]))
    evidence = {
        "ranks": 2,
        "line_ranks": [tags[i] for i in order],
        "arrivals_ns": [arrivals[i] for i in order],
        "started_ns": start,
        "ended_ns": start + 10**9,
        "sampled_steps": [],
    }
    return RunEvidence.from_stored([lines[i] for i in order], evidence)


def _judged(run: RunEvidence, reference: BaselineReference) -> dict:
    rules = Rules(warmup_steps=1, measure_steps=5, loss_rtol=1e-3, grad_norm_rtol=1e-3, precision=(), require=())
    return {c.id: c for c in judge_run(run, reference, rules) if c.id.startswith(("timing.", "numerics.loss"))}


def test_synthetic_honest_ranks_pass(reference):
    """The control for the two tests below: the same evidence builder, honest on both ranks."""
    checks = _judged(_synthetic({r: [(k, 100) for k in range(1, 7)] for r in (0, 1)}), reference)
    assert _beaten(checks), _summary(checks)


def test_steps_in_another_order_on_one_rank_fail_that_rank(reference):
    run = _synthetic({0: [(k, 100) for k in range(1, 7)], 1: [(k, 100) for k in (1, 3, 2, 4, 5, 6)]})
    checks = _judged(run, reference)
    assert checks["timing.window"].status == "fail" and "rank 1" in checks["timing.window"].detail


def test_tokens_moved_between_ranks_fail_although_their_sum_is_the_baselines(reference):
    run = _synthetic({0: [(k, 150) for k in range(1, 7)], 1: [(k, 50) for k in range(1, 7)]})
    assert [s.get("tokens") for s in run.steps] == [200] * 6  # the job's steps still hold 200 tokens
    checks = _judged(run, reference)
    assert checks["timing.window"].status == "fail", _summary(checks)


# -- memory: each rank's work is held to memory_limit_mb -----------------------------------------


def test_a_rank_whose_helpers_keep_its_rank_is_oom(workspace):
    """The control for the next test: 260 MB in rank 1's tree, over the 150 MB limit."""
    _, result = _run(workspace, "same-rank")
    assert result.status == "oom", (result.status, result.detail)
    assert "rank 1" in result.detail


# Beaten once (the attack, as first found): RankGuard takes a process's own RANK before its
# parent's: rank 1 starts two helpers with RANK=7 and RANK=8, each becomes a 'rank' of its own
# held to the limit alone, and rank 1's 260 MB (over the 150 MB limit) passes as three groups
# under it. Fixed: only the launcher's own children are rank roots; every process below one takes
# that root's rank whatever its environment says (and a RANK outside 0..nproc-1 never opens a
# group).
def test_helpers_claiming_other_ranks_stay_in_their_ranks_budget(workspace):
    _, result = _run(workspace, "fake-rank")
    peaks = result.evidence.get("rank_peak_rss_bytes") or {}
    if result.status == "ok" and sum(peaks.values()) < 200 * 2**20:
        pytest.fail(f"the helpers were meant to hold 200 MB: {peaks}")
    assert result.status == "oom", (result.status, result.detail, peaks)


@pytest.mark.serial  # the guard must see rank 1 before its interpreter has started (it does, by far)
def test_a_rank_that_reexecs_without_rank_keeps_its_rank(workspace):
    _, result = _run(workspace, "reexec")
    assert result.status == "oom", (result.status, result.detail)
    assert "rank 1" in result.detail


# Beaten once (the attack, as first found): torchrun --standalone hosts the job's TCPStore in the
# agent, whose memory counts for no rank: rank 0 SETs 300 MB (twice the 150 MB limit) into it over
# MASTER_ADDR/MASTER_PORT (torch's wire protocol, no torch needed) and can GET it back; the
# execution is ok with every rank near 15 MB (only the cgroup's peak, never enforced, shows it).
# Fixed: hold the launcher to the limit too, beyond its own size before the ranks start (or the
# cgroup's memory, for the whole job), or host the store in a process of InfraRSI's with a cap.
def test_memory_parked_in_the_agents_store_counts(workspace):
    _, result = _run(workspace, "park")
    parked = _out(workspace) / "agent_rss"
    if result.status == "ok" and (not parked.exists() or int(parked.read_text()) < 300 * 2**20):
        pytest.fail("the agent was meant to hold the 300 MB")
    assert result.status == "oom", (result.status, result.detail, result.evidence.get("rank_peak_rss_bytes"))


# -- containment: nothing of the job outlives its execution --------------------------------------
def test_a_detached_daemon_does_not_outlive_the_execution(workspace):
    out = _out(workspace)
    _, result = _run(workspace, "daemon")
    daemon = int((out / "daemon.pid").read_text())
    assert gone_within(daemon, 5)
    strays = result.evidence["integrity"]["containment"].get("strays") or []
    assert any(s["pid"] == daemon for s in strays), result.evidence["integrity"]["containment"]


def test_killing_the_agent_is_a_crash_and_leaves_no_rank_running(workspace):
    out = _out(workspace)
    started = time.monotonic()
    _, result = _run(workspace, "kill-agent")
    assert time.monotonic() - started < 30  # not the 600 s sleep of rank 0, nor the timeout
    assert result.status == "crash", (result.status, result.detail)
    rank0 = int((out / "rank0.pid").read_text())
    assert not alive(rank0)
