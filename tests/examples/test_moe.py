"""The bundled mixture-of-experts variant (`moe.toml`, `train.py --arch moe`) through the CLI:
init, a one-run baseline, and its sorted-dispatch patch judged by `verify --pairs 0`. The
patch routes tokens differently but must train the same job."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def cli(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "infrarsi.cli", *args, "--contract", str(folder / "moe.toml"), "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=folder,
    )


def test_the_moe_workload_and_its_dispatch_patch_train_the_same_job(tmp_path):
    folder = tmp_path / "tinygpt"
    shutil.copytree(ROOT / "examples" / "tinygpt", folder, ignore=shutil.ignore_patterns(".infrarsi", "__pycache__"))
    contract = folder / "moe.toml"
    text = contract.read_text().replace("warmup_steps  = 5", "warmup_steps  = 1")
    contract.write_text(text.replace("measure_steps = 15", "measure_steps = 5"))
    assert cli(folder, "init").returncode == 0

    baseline = cli(folder, "baseline", "--runs", "1")
    assert baseline.returncode == 0, baseline.stderr[-2000:]
    assert json.loads(baseline.stdout)["peak_mem_mb"] > 0

    judged = cli(folder, "verify", "--patch", "moe-sorted-dispatch", "--pairs", "0")
    report = json.loads(judged.stdout)
    assert report["candidate"]["patches"] == ["moe-sorted-dispatch"]
    checks = {c["id"]: c for c in report["checks"]}
    for family in (
        "numerics.loss",
        "numerics.grad_norm",
        "numerics.precision",
        "timing.window",
        "integrity.protected",
        "integrity.framework",
    ):
        assert checks[family]["status"] == "pass", checks[family]
    # No A/B pairs were asked for, so the speedup has no evidence and the candidate is not accepted.
    assert checks["stats.speedup"]["status"] != "pass" and report["accepted"] is False
