"""Calibrated tolerances on real TinyGPT runs (`benchmarks/calibration.py`): the contract says
``"calibrated"``, `infrarsi baseline` measures the job's own noise under perturbations that must
not change it, and under the tolerances it picks the honest changes pass and the numerics cheats
fail. The full table (every honest patch, knob value and numerics cheat) is in docs/benchmarks.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
SUBSET = ["batched-heads + sdpa", "micro_batch=8", "cheat/higher-lr", "cheat/uniform-attention"]


def test_calibrated_tolerances_keep_honest_changes_and_reject_the_numerics_cheats():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "calibration.py"), "--only", *SUBSET, "--json"],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    report = json.loads(proc.stdout)
    calibration = report["calibration"]
    # What the perturbations showed on this CPU job (no spread: the floor), well under the
    # contract's hand-set 1e-3 and 1e-2.
    assert 0 < calibration["loss_rtol"] <= 1e-4 and 0 < calibration["grad_norm_rtol"] <= 1e-3, calibration
    assert {r["name"] for r in report["rows"]} == set(SUBSET)
    wrong = [r for r in report["rows"] if not r["ok"]]
    assert not wrong and proc.returncode == 0, (wrong, proc.stderr[-2000:])
    assert report["honest"] == 2 and report["cheats"] == 2
