"""The sequential A/B through `infrarsi verify` and `infrarsi audit`, on real runs of the cheap
synthetic job: a look after `ab_pairs` that decides ends the A/B there, the plan and every look
are kept, and the audit re-takes the same looks without calling the short batch cut."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from infrarsi.examples.landscape import Landscape, make_workspace

CLI = [sys.executable, "-m", "infrarsi.cli"]


def _cli(root: Path, *args: str):
    done = subprocess.run(CLI + list(args), cwd=root, capture_output=True, text=True, timeout=300, env=os.environ)
    return done, (json.loads(done.stdout) if done.stdout.strip().startswith("{") else None)


def _workspace(tmp_path: Path) -> Path:
    land = Landscape(
        name="looks",
        patches=[],
        knobs={"speed": (["same", "fast", "slow"], "same")},
        base_ms=40.0,
        base_mb=60.0,
        limit_mb=400.0,
        noise=0.01,
        time={"speed=fast": 0.25, "speed=slow": 1.5},
    )
    root = make_workspace(tmp_path / "looks", land, ab_pairs=3, extra_search="ab_max_pairs = 6\n")
    for verb in (["init"], ["baseline", "--runs", "3"]):
        done, _ = _cli(root, *verb, "--json")
        assert done.returncode == 0, done.stderr
    return root


def _verify_rows(root: Path) -> list[dict]:
    with sqlite3.connect(root / ".infrarsi" / "ledger.db") as db:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute("select * from executions where kind != 'baseline' order by id")]


def test_a_deciding_first_look_ends_the_a_b_and_the_audit_takes_the_same_looks(tmp_path):
    root = _workspace(tmp_path)

    done, out = _cli(root, "verify", "--set", "speed=fast", "--json")
    failed = [c for c in (out or {}).get("checks", []) if c["status"] not in ("pass", "skipped")]
    assert done.returncode == 0 and out["accepted"], (done.stderr[-2000:], failed)
    assert out["speedup"]["pairs"] == 3 and out["speedup"]["confidence"] == pytest.approx(1 - 0.05 / 4)  # 4 looks
    assert len(_verify_rows(root)) == 1 + 2 * 3  # not the 13 that 6 pairs would take
    body = json.loads(Path(out["receipt"]).read_text())["receipt"]
    assert body["ab"]["sequential"]["min_pairs"] == 3 and body["ab"]["sequential"]["max_pairs"] == 6
    assert [look["decision"] for look in body["ab"]["looks"]] == ["pass"]

    # A slowdown fails at its first look too: its median is below the bar, more pairs can't help.
    done, out = _cli(root, "verify", "--set", "speed=slow", "--json")
    assert done.returncode == 1 and not out["accepted"]
    stat = next(c for c in out["checks"] if c["id"] == "stats.speedup")
    assert stat["status"] == "fail" and "more pairs would not help" in stat["detail"], stat
    assert len(_verify_rows(root)) == 2 * (1 + 2 * 3)

    # `--max-pairs` below 2 is bad input, not a traceback (one below `--pairs` is raised to it).
    done, _ = _cli(root, "verify", "--set", "speed=fast", "--max-pairs", "1")
    assert done.returncode == 2 and "--max-pairs 1" in done.stderr and "Traceback" not in done.stderr

    done, audited = _cli(root, "audit", str(root / ".infrarsi" / "ledger.db"), "--json")
    assert done.returncode == 0, (done.stderr, audited)
    assert audited["chain_ok"] and audited["findings"] == [] and audited["incomplete_batches"] == [], audited
