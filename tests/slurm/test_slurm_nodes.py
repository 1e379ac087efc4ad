"""A job across two nodes (`nnodes = 2`, one rank a node) through the Slurm executor, on the
test cluster's two slurmds (conftest.py): TinyGPT data-parallel under torchrun's static
rendezvous, each node's runner timing and guarding its own rank. An honest patch is accepted
with every node's part in the evidence; the rank on the second node training on less data is
rejected on that rank; that rank dying ends the whole job, the other node's rank stopped, no
process left behind."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ledger_rows import evidence, rows

from infrarsi._receipt import verify_receipt

pytestmark = pytest.mark.serial  # beside the other Slurm tests, never beside the containment cheats

ROOT = Path(__file__).resolve().parents[2]
TINYGPT = ROOT / "examples" / "tinygpt"
CLI = [sys.executable, "-m", "infrarsi.cli"]
EXECUTOR = '\n[executor]\nkind = "slurm"\ntime_limit_min = 10\n'


def _cli(root: Path, *args: str):
    done = subprocess.run(
        [*CLI, *args, "--contract", "nodes.toml", "--json"], cwd=root, capture_output=True, text=True, timeout=600
    )
    out = json.loads(done.stdout.splitlines()[-1]) if done.stdout.strip().startswith("{") else {}
    return done, out


@pytest.fixture(scope="module")
def two_nodes(slurm, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("nodes") / "tinygpt"
    shutil.copytree(TINYGPT, root, ignore=shutil.ignore_patterns(".infrarsi", "__pycache__"))
    text = (root / "ddp.toml").read_text()
    assert "nproc_per_node = 2" in text
    text = text.replace("nproc_per_node = 2", "nproc_per_node = 1\nnnodes = 2") + EXECUTOR
    # A shorter window than ddp.toml's 10 steps: the batched-heads patch is ~1.7x, which 6 resolve.
    assert "measure_steps = 10" in text
    text = text.replace("measure_steps = 10", "measure_steps = 6")
    (root / "nodes.toml").write_text(text)
    for verb in (("init",), ("baseline", "--runs", "1")):
        done, _ = _cli(root, *verb)
        assert done.returncode == 0, done.stderr[-3000:]
    return root


def _nodes_of(root: Path, row: dict) -> list[dict]:
    return evidence(root, row, "nodes")["nodes"]


def test_an_honest_patch_across_two_nodes_is_accepted_with_each_nodes_part(two_nodes, slurm):
    done, out = _cli(two_nodes, "verify", "--patch", "batched-heads", "--set", "attention=sdpa", "--pairs", "3")
    failing = [c for c in out.get("checks", []) if c["status"] != "pass"]
    assert done.returncode == 0 and out["accepted"], (failing, done.stderr[-3000:])
    checks = {c["id"]: c for c in out["checks"]}
    for check in ("timing.window", "numerics.loss", "numerics.grad_norm"):
        assert checks[check]["detail"].startswith("every one of 2 ranks"), checks[check]
    assert verify_receipt(Path(out["receipt"])).ok
    body = json.loads(Path(out["receipt"]).read_text())["receipt"]
    row = next(r for r in rows(two_nodes, "nodes") if r["id"] == body["executions"][0])
    seen = evidence(two_nodes, row, "nodes")
    nodes = seen["nodes"]
    # One part a node, on the cluster's two slurmds, node 0's torchrun hosting the rendezvous.
    assert [n["rank"] for n in nodes] == [0, 1] and {n["slurm_node"] for n in nodes} == set(slurm.nodes), nodes
    assert nodes[0]["master"] == nodes[1]["master"] and all(n["status"] == "ok" for n in nodes)
    assert sorted(set(seen["line_ranks"])) == [0, 1] and set(seen["rank_peak_rss_bytes"]) == {"0", "1"}
    assert sorted(seen["fingerprint"]["slurm_nodes"]) == sorted(slurm.nodes)
    argv = body["launch"]["argv"]
    assert "--nnodes=2" in argv and "--nproc_per_node=1" in argv, argv


def test_the_rank_on_the_second_node_training_on_less_data_is_rejected_on_that_rank(two_nodes):
    cheat = ROOT / "tests" / "ranks" / "cheats" / "one-rank-half-batch.diff"
    done, out = _cli(two_nodes, "verify", "--patch", str(cheat), "--pairs", "0")
    assert done.returncode == 1 and not out["accepted"], (out, done.stderr[-2000:])
    loss = {c["id"]: c for c in out["checks"]}["numerics.loss"]
    assert loss["status"] == "fail" and "rank 1: step" in loss["detail"], loss


def test_a_rank_dying_on_one_node_ends_the_job_on_every_node(two_nodes):
    patch = Path(__file__).parent / "patches" / "last-rank-dies.diff"
    done, out = _cli(two_nodes, "run", "--patch", str(patch))
    assert done.returncode == 1 and out["status"] == "crash", (out, done.stderr[-2000:])
    row = next(r for r in rows(two_nodes, "nodes") if r["id"] == out["execution"])
    # The cause is node 1's (torchrun ends with exit code 1 when its rank does); node 0's rank
    # was stopped for it, or failed on the lost peer, never the cause.
    assert row["status"] == "crash" and row["detail"].startswith("node 1: exit code 1"), row["detail"]
    nodes = _nodes_of(two_nodes, row)
    assert nodes[1]["status"] == "crash" and nodes[0]["status"] != "ok", nodes
    left = subprocess.run(["pgrep", "-f", "train_ddp.py"], capture_output=True, text=True)
    assert left.stdout.strip() == "", left.stdout
