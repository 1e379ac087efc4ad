"""TinyGPT data-parallel on two ranks (torchrun, gloo), through the CLI as a user runs it:
baseline, an honest patch verified and accepted, one rank training differently rejected."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infrarsi._receipt import verify_receipt

# Alone, never beside another test: an honest patch on two ranks is accepted after its A/B.
pytestmark = pytest.mark.serial

TINYGPT = Path(__file__).resolve().parents[2] / "examples" / "tinygpt"
HERE = Path(__file__).parent
CLI = [sys.executable, "-m", "infrarsi.cli"]


def _cli(root: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    done = subprocess.run(
        [*CLI, *args, "--contract", "ddp.toml", "--json"], cwd=root, capture_output=True, text=True, timeout=600
    )
    return done, json.loads(done.stdout.splitlines()[-1]) if done.stdout.strip() else {}


@pytest.fixture(scope="module")
def ddp_workspace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ddp") / "tinygpt"
    shutil.copytree(TINYGPT, root, ignore=shutil.ignore_patterns(".infrarsi", "__pycache__"))
    for verb in (("init",), ("baseline", "--runs", "2")):
        done, _ = _cli(root, *verb)
        assert done.returncode == 0, done.stderr
    return root


def test_an_honest_patch_on_two_ranks_is_accepted(ddp_workspace):
    done, out = _cli(ddp_workspace, "verify", "--patch", "batched-heads", "--set", "attention=sdpa", "--pairs", "3")
    failing = [c for c in out.get("checks", []) if c["status"] != "pass"]
    assert done.returncode == 0 and out["accepted"], (failing, done.stderr)
    checks = {c["id"]: c for c in out["checks"]}
    for check in ("timing.window", "numerics.loss", "numerics.grad_norm", "numerics.precision"):
        assert checks[check]["detail"].startswith("every one of 2 ranks"), checks[check]
    receipt = Path(out["receipt"])
    assert verify_receipt(receipt).ok
    body = json.loads(receipt.read_text())["receipt"]
    assert "torchrun" in body["launch"]["argv"][0] and "--nproc_per_node=2" in body["launch"]["argv"]


def test_one_rank_training_on_less_data_is_rejected_on_that_rank(ddp_workspace):
    cheat = HERE / "cheats" / "one-rank-half-batch.diff"
    done, out = _cli(ddp_workspace, "verify", "--patch", str(cheat), "--pairs", "0")
    assert done.returncode == 1 and not out["accepted"], out
    loss = {c["id"]: c for c in out["checks"]}["numerics.loss"]
    # Rank 1 differs from its first step on; rank 0 follows once the shared weights have moved.
    assert loss["status"] == "fail" and "rank 1: step" in loss["detail"], loss
