"""examples/hf-trainer: a plain Hugging Face Trainer script, unmodified (auto evidence), taken
through draft, init, a self-checked baseline, verify and a search, for real. Needs the `hf`
extra (transformers, accelerate), which the suite's install command includes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from unmodified import baselined_workspace, cheat, cli, failing

# Alone, never beside another test: an honest patch is accepted after its A/B.
pytestmark = pytest.mark.serial

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf-trainer"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    root, out = baselined_workspace(tmp_path_factory.mktemp("hf"), "hf-trainer")
    assert out["tokens_per_s"], "tokens counted from input_ids by the autoprobe"
    assert out["mfu"] is None and out["mfu_peak"] is None  # the CPU: no known peak, so no MFU
    return root


def test_draft_reads_the_trainer_script_and_init_accepts_it(tmp_path):
    folder = tmp_path / "fresh"
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns(".infrarsi", "__pycache__", "out"))
    (folder / "infrarsi.toml").unlink()
    args = ["--output_dir", "out", "--per_device_train_batch_size", "16", "--use_cpu", "True"]
    proc = subprocess.run(
        [sys.executable, "-m", "infrarsi.cli", "draft", "--json", "--", "python", "train.py", *args],
        capture_output=True,
        text=True,
        cwd=folder,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["style"] == "hf"
    assert out["knobs"]["attention"]["choices"] == ["eager", "sdpa"]
    assert out["knobs"]["micro_batch"]["baseline"] == "16x1"
    assert {"checkpointing", "compile", "optimizer"} <= set(out["knobs"])
    assert not out["knobs"]["tf32"]["enabled"] and not out["knobs"]["liger"]["enabled"]
    assert out["command"] == ["python", "train.py", "--output_dir", "out", "--use_cpu", "True"]
    assert out["protected"] == ["data/**"]
    init = subprocess.run(
        [sys.executable, "-m", "infrarsi.cli", "init"], capture_output=True, text=True, cwd=folder, timeout=120
    )
    assert init.returncode == 0, init.stderr


def test_the_honest_patch_is_accepted_with_every_correctness_check_passing(workspace):
    proc, out = cli("verify", "--patch", "accuracy-from-logits", "--pairs", "4", cwd=workspace)
    assert proc.returncode == 0 and out["accepted"], failing(out)
    assert all(c["status"] == "pass" for c in out["checks"]), failing(out)
    assert out["speedup"]["ci_low"] > 1.02 and Path(out["receipt"]).is_file()


def test_bf16_autocast_in_the_step_is_rejected_by_the_audit_and_by_what_the_run_shows(workspace):
    patch = cheat(
        workspace,
        "autocast",
        "        outputs = model(**inputs, num_items_in_batch=num_items_in_batch)\n",
        '        with torch.autocast("cpu", dtype=torch.bfloat16):\n'
        "            outputs = model(**inputs, num_items_in_batch=num_items_in_batch)\n",
    )
    proc, out = cli("verify", "--patch", str(patch), "--pairs", "0", "--keep-going", cwd=workspace)
    assert proc.returncode == 1 and not out["accepted"]
    found = failing(out)
    assert found.get("audit.precision_downgrade") == "fail", found
    assert found.get("numerics.precision") == "fail", found


def test_removing_the_clip_is_rejected_by_the_numerics(workspace):
    patch = cheat(
        workspace,
        "no-clip",
        "    model_args, training_args = parser.parse_args_into_dataclasses()\n",
        "    model_args, training_args = parser.parse_args_into_dataclasses()\n    training_args.max_grad_norm = 0.0\n",
    )
    proc, out = cli("verify", "--patch", str(patch), "--pairs", "0", cwd=workspace)
    assert proc.returncode == 1 and not out["accepted"]
    found = failing(out)
    assert found and all(check.startswith("numerics.") for check in found), found


def test_a_search_drives_the_trainer_through_its_knobs(workspace):
    proc, out = cli("search", "--budget", "6", cwd=workspace)  # a promotion takes 5 (2 A/B pairs)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    assert 0 < out["executions"] <= 6
    if out["best"]:
        assert Path(out["best"]["receipt"]).is_file()
    assert out["history"] and all(h["status"] == "ok" for h in out["history"]), out["history"]
