"""examples/single-file-gpt: an unmodified `--key=value` single-file trainer (config file exec'd,
no probe) taken through init, baseline, verify and a search, for real."""

from __future__ import annotations

from pathlib import Path

import pytest
from unmodified import baselined_workspace, cheat, cli, failing

# Alone, never beside another test: an honest patch is accepted after its A/B.
pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    root, out = baselined_workspace(tmp_path_factory.mktemp("sfg"), "single-file-gpt")
    assert out["tokens_per_s"], "tokens counted by the autoprobe from model(x, y)'s input"
    assert out["mfu"] is None and out["mfu_peak"] is None  # the CPU: no known peak, so no MFU
    return root


def test_the_honest_patch_is_accepted_with_every_correctness_check_passing(workspace):
    proc, out = cli("verify", "--patch", "batched-heads", "--pairs", "3", cwd=workspace)
    assert proc.returncode == 0 and out["accepted"], failing(out)
    assert all(c["status"] == "pass" for c in out["checks"]), failing(out)
    assert out["speedup"]["ci_low"] > 1.02 and Path(out["receipt"]).is_file()


def test_bf16_autocast_in_the_step_is_rejected_by_the_audit_and_by_what_the_run_shows(workspace):
    patch = cheat(
        workspace,
        "autocast",
        "        loss = model(x, y) / gradient_accumulation_steps\n",
        '        with torch.autocast("cpu", dtype=torch.bfloat16):\n'
        "            loss = model(x, y) / gradient_accumulation_steps\n",
    )
    proc, out = cli("verify", "--patch", str(patch), "--pairs", "0", "--keep-going", cwd=workspace)
    assert proc.returncode == 1 and not out["accepted"]
    found = failing(out)
    assert found.get("audit.precision_downgrade") == "fail", found
    assert found.get("numerics.precision") == "fail", found  # seen in the run, not only in the source


def test_removing_the_clip_is_rejected_by_the_numerics(workspace):
    patch = cheat(
        workspace,
        "no-clip",
        "clip_grad_norm_(model.parameters(), grad_clip)",
        'clip_grad_norm_(model.parameters(), float("inf"))',
    )
    proc, out = cli("verify", "--patch", str(patch), "--pairs", "0", cwd=workspace)
    assert proc.returncode == 1 and not out["accepted"]
    found = failing(out)
    assert found and all(check.startswith("numerics.") for check in found), found


def test_micro_batch_by_accumulation_sets_two_arguments_and_trains_the_same_job(workspace):
    proc, out = cli("verify", "--set", "micro_batch=4x4", "--pairs", "0", cwd=workspace)
    checks = {c["id"]: c["status"] for c in out["checks"]}
    assert all(checks[c] == "pass" for c in ("timing.window", "numerics.loss", "numerics.grad_norm")), checks


def test_a_search_drives_the_script_through_its_knobs(workspace):
    proc, out = cli("search", "--budget", "6", cwd=workspace)  # a promotion takes 5 (2 A/B pairs)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    assert 0 < out["executions"] <= 6
    if out["best"]:
        assert Path(out["best"]["receipt"]).is_file()
    # Every execution ran the script to its window: each --key=value it was given was one the
    # script knows (it exits on anything else).
    assert out["history"] and all(h["status"] == "ok" for h in out["history"]), out["history"]
