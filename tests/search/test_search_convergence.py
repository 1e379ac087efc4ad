"""A search whose contract has `[numerics.convergence]`: long runs only for the candidates it
promotes, paid from the budget, and a candidate that drifts after the short window is not promoted.

Real executions of the cheap synthetic job: `faster` is the fastest setting and the same job over
the 5-step window, but its loss drifts from step 11 on (``late``); `fast` is honest.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from infrarsi._receipt import verify_receipt
from infrarsi.examples.landscape import Landscape, make_workspace

CLI = [sys.executable, "-m", "infrarsi.cli"]


def _cli(root: Path, *args: str):
    done = subprocess.run(CLI + list(args), cwd=root, capture_output=True, text=True, timeout=300, env=os.environ)
    return done, (json.loads(done.stdout.splitlines()[-1]) if done.stdout.strip() else None)


def test_promotion_takes_the_long_runs_and_a_late_drift_is_not_promoted(tmp_path):
    land = Landscape(
        name="late",
        patches=[],
        knobs={"speed": (["same", "fast", "faster"], "same")},
        base_ms=40.0,
        base_mb=60.0,
        limit_mb=400.0,
        noise=0.01,
        time={"speed=fast": 0.5, "speed=faster": 0.3},
        late={"speed=faster": 1.1},
        budget=40,
    )
    root = make_workspace(tmp_path / "late", land, ab_pairs=3, convergence="steps = 20\nseeds = 2\n")
    for verb in (["init"], ["baseline", "--runs", "3"]):
        done, _ = _cli(root, *verb, "--json")
        assert done.returncode == 0, done.stderr
    done, out = _cli(root, "search", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    attempts = [(a["knobs"], a["accepted"], a.get("failed")) for a in out["attempts"]]
    assert attempts[0] == ({"speed": "faster"}, False, ["numerics.convergence"]), attempts
    assert "trains measurably worse" in out["attempts"][0]["why"]["numerics.convergence"]
    assert out["best"]["knobs"] == {"speed": "fast"}, attempts
    receipt = json.loads(Path(out["best"]["receipt"]).read_text())["receipt"]
    assert verify_receipt(out["best"]["receipt"]).ok
    assert receipt["convergence"]["steps"] == 20 and receipt["convergence"]["seeds"] == 2

    with sqlite3.connect(root / ".infrarsi" / "ledger.db") as db:
        rows = db.execute("select kind, batch from executions where kind != 'baseline'").fetchall()
    long_rows = [batch for kind, batch in rows if kind.startswith("long-")]
    # 2 seeds x (baseline, candidate) for each of the two promotions, and never while exploring
    assert len(long_rows) == 8 and all("-verify-" in batch for batch in long_rows), rows
    assert out["cost"]["executions"] == len(rows) <= 40
