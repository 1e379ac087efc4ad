"""`infrarsi audit` on a ledger recorded before the runner's clock: an acceptance it no longer gives."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ASSET = Path(__file__).parents[1] / "assets" / "pre_runner_clock"


def test_a_receipt_bought_with_a_lazy_backward_no_longer_holds(tmp_path):
    state = tmp_path / ".infrarsi"
    shutil.copytree(ASSET, state, ignore=shutil.ignore_patterns("README.md"))
    proc = subprocess.run(
        [sys.executable, "-m", "infrarsi.cli", "audit", str(state / "ledger.sqlite"), "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert out["chain_ok"] and out["receipts"] == {"checked": 1, "bad": []}
    receipt = json.loads(next((state / "receipts").glob("*.json")).read_text())["receipt"]
    assert receipt["speedup"]["ci_low"] > 3.0 and "clock" not in receipt["ab"]  # what was claimed then
    stats = [f for f in out["findings"] if f["check"] == "stats.speedup"]
    assert len(stats) == 1 and stats[0]["status"] == "fail", stats
    assert "no longer holds" in stats[0]["detail"]
    claimed_now = float(stats[0]["detail"].split("speedup ")[-1].split("x")[0])
    assert claimed_now < 1.6, stats  # re-timed on the runner's clock: nothing like 4.3x
    assert out["previously_accepted"] >= 1 and out["now_rejected"] >= 1
