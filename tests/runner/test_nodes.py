"""A job across nodes: the contract's rule, the launch each node gets, how the nodes meet, and
how their parts merge into one execution (runner/_nodes.py). End to end on two Slurm nodes:
tests/slurm/test_slurm_nodes.py."""

from __future__ import annotations

import json
import threading

import pytest

from infrarsi.contract import Candidate, parse_contract, with_executor_flags
from infrarsi.errors import ContractError, UsageError
from infrarsi.runner import build_argv
from infrarsi.runner._executor import ExecutionResult
from infrarsi.runner._nodemerge import merge_nodes
from infrarsi.runner._nodes import PEER_FAILED, NodePlace, RendezvousError, join_nodes, mark_failed
from infrarsi.verifiers import RunEvidence, check_clock, runner_step_time

CONTRACT = """\
[task]
name = "ddp"
command = ["python", "train.py"]
launcher = "torchrun"
nproc_per_node = 1
nnodes = 2
timeout_s = 60

[timing]
warmup_steps = 1
measure_steps = 3

[resources]
memory_limit_mb = 500

[executor]
kind = "{kind}"
"""


def _contract(tmp_path, kind: str = "slurm"):
    return parse_contract(CONTRACT.format(kind=kind), tmp_path / "infrarsi.toml", check_files=False)


def test_several_nodes_need_the_slurm_executor_in_the_contract_and_under_flags(tmp_path):
    with pytest.raises(ContractError, match='needs \\[executor\\] kind = "slurm"'):
        _contract(tmp_path, "local")
    contract = _contract(tmp_path)
    assert contract.ranks == 2
    with pytest.raises(UsageError, match="nnodes = 2"):
        with_executor_flags(contract, {"kind": "local"})


def test_each_node_starts_torchrun_at_node_zeros_rendezvous_instead_of_standalone(tmp_path):
    contract = _contract(tmp_path)
    alone, _ = build_argv(contract, Candidate(knobs={}))
    assert "--standalone" in alone
    place = NodePlace(1, 2, "host-a", 29411, tmp_path)
    argv, _ = build_argv(contract, Candidate(knobs={}), place)
    assert "--standalone" not in argv
    for word in ("--nnodes=2", "--nproc_per_node=1", "--node_rank=1", "--master_addr=host-a", "--master_port=29411"):
        assert word in argv, argv


def test_the_nodes_meet_at_the_address_node_zero_publishes_and_hear_of_a_peers_failure(tmp_path):
    folder = tmp_path / "meet"
    got = {}
    waiting = threading.Thread(target=lambda: got.setdefault("one", join_nodes(folder, 1, 2, patience_s=10)))
    waiting.start()
    zero = join_nodes(folder, 0, 2, patience_s=10)
    waiting.join()
    one = got["one"]
    assert (one.master_addr, one.master_port) == (zero.master_addr, zero.master_port) and one.rank == 1
    assert zero.stop_reason() is None and one.stop_reason() is None
    mark_failed(one.folder, one.rank)
    assert zero.stop_reason() == PEER_FAILED and one.stop_reason() is None  # its own marker is no peer's
    with pytest.raises(RendezvousError, match="node 0 published no address"):
        join_nodes(tmp_path / "nobody", 1, 2, patience_s=0.3)


def _step(step: int, t0: int, t1: int) -> str:
    return json.dumps({"type": "step", "step": step, "t0_ns": t0, "t1_ns": t1, "tokens": 8, "loss": 1.0})


def _part(rank: int, clock: int, period_ms: float, status: str = "ok", detail: str = "", strays=()) -> ExecutionResult:
    """Node ``rank``'s part, on a clock of its own that starts at ``clock`` ns."""
    period = int(period_ms * 1e6)
    lines = [_step(k, clock + (k - 1) * period + 1000, clock + k * period - 1000) for k in range(1, 5)]
    arrivals = [clock + k * period for k in range(1, 5)]
    integrity = {
        "protected_changed_before_run": [],
        "protected_changed_by_run": ["data/x.bin"] if rank == 1 and strays else [],
        "protected_after": {},
        "framework_changed": [],
        "containment": {"version": 1, "subreaper": True, "cgroup": None, "strays": list(strays), "killed": len(strays)},
        "environment": {"roots": [], "added": [], "changed": [], "deleted": [], "removed": []},
        "environment_changed": [],
    }
    evidence = {
        "version": 1,
        "ranks": 2,
        "line_ranks": [rank] * 4,
        "rank_peak_rss_bytes": {str(rank): 100 + rank},
        "started_ns": clock,
        "ended_ns": clock + 5 * period,
        "arrivals_ns": arrivals,
        "sampled_steps": [],
        "stdout_lines": 1,
        "evidence_kind": "probe",
        "guard": {"samples": 3, "max_gap_ms": 1.0, "peak_rss_bytes": 100 + rank, "censored": status == "oom"},
        "integrity": integrity,
        "fingerprint": {"host": f"h{rank}"},
        "node": {"rank": rank, "count": 2, "master": "h0:1"},
        "slurm": {"node": f"node{rank + 1}"},
    }
    return ExecutionResult(
        Candidate(knobs={}),
        status,
        detail=detail,
        exit_code=0 if status == "ok" else 1,
        wall_s=1.0,
        device_s=1.0,
        receipts=("\n".join(lines) + "\n").encode(),
        evidence=evidence,
    )


def test_merged_nodes_are_timed_by_the_slowest_rank_each_on_its_own_nodes_clock(tmp_path):
    contract = _contract(tmp_path)
    # Node 1's clock is two hours behind node 0's: no stamp is compared across them (its steps
    # would start "before the job did" against node 0's launch).
    merged = merge_nodes(contract, [_part(1, 10**9, 30.0), _part(0, 7_200 * 10**9, 20.0)], sample_all=False)
    assert merged.status == "ok", merged.detail
    assert merged.step_time_s == pytest.approx(0.030)
    ev = merged.evidence
    assert [n["rank"] for n in ev["nodes"]] == [0, 1] and ev["fingerprint"]["slurm_nodes"] == ["node1", "node2"]
    assert ev["rank_started_ns"] == {"0": 7_200 * 10**9, "1": 10**9}
    assert merged.device_s == 2.0 and merged.peak_mem_mb is not None
    run = RunEvidence.from_stored(merged.receipts.decode().splitlines(), ev)
    assert runner_step_time(run, 1, 3) == pytest.approx(0.030)
    for rank in (0, 1):
        assert check_clock(run.of_rank(rank), 1, 3).status == "pass"


def test_a_failure_on_any_node_is_the_jobs_and_a_node_stopped_for_it_is_never_the_cause(tmp_path):
    contract = _contract(tmp_path)
    died = _part(1, 0, 20.0, "crash", "exit code 1: rank died")
    stopped = _part(0, 0, 20.0, "crash", PEER_FAILED)
    merged = merge_nodes(contract, [stopped, died], sample_all=False)
    assert merged.status == "crash" and merged.detail == "node 1: exit code 1: rank died"
    oom = _part(0, 0, 20.0, "oom", "needs more than the limit")
    merged = merge_nodes(contract, [oom, died], sample_all=False)
    assert merged.status == "oom" and merged.peak_mem_mb is None
    assert merged.detail.startswith("node 0: needs more than the limit")


def test_what_any_node_saw_changed_or_left_behind_is_in_the_merged_integrity(tmp_path):
    contract = _contract(tmp_path)
    stray = {"pid": 4242, "cmd": "sleep 100", "first_seen_s": 1.0}
    merged = merge_nodes(contract, [_part(0, 0, 20.0), _part(1, 0, 20.0, strays=[stray])], sample_all=False)
    integrity = merged.evidence["integrity"]
    assert integrity["protected_changed_by_run"] == ["data/x.bin"]
    assert integrity["containment"]["strays"] == [{**stray, "node": 1}] and integrity["containment"]["killed"] == 1
    assert "changed at run time: data/x.bin" in merged.detail
