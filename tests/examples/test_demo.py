"""`infrarsi demo` end to end: the bundled TinyGPT through init, baseline, search, audit, report and apply.

Real training runs in subprocesses. Single runs are noisy, so the test holds the demo
to its rules (a best only with a verifying receipt, a clean audit), not to one winner.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infrarsi.ledger import Ledger

# Alone, never beside another test: the demo promotes only what its A/B resolves.
pytestmark = pytest.mark.serial


def test_demo_takes_tinygpt_through_every_stage(tmp_path):
    folder = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "infrarsi.cli", "demo", "--dir", str(folder), "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["ok"] is True
    assert report["baseline"]["runs"] == 3
    assert report["baseline"]["step_time_s"]["median"] > 0
    assert report["baseline"]["peak_mem_mb"] < 560

    searched = report["search"]
    assert searched["executions"] <= 34
    assert len(searched["history"]) == searched["exploration"] >= 17 - 1  # one may be a pre-flight conflict
    # The best is only ever a promoted candidate with a receipt that verifies.
    best = searched["best"]
    assert best is not None, json.dumps(searched["attempts"])
    assert best in searched["promoted"] and best["speedup"]["ci_low"] > 1.02
    receipt = subprocess.run(
        [sys.executable, "-m", "infrarsi.cli", "receipt", "verify", best["receipt"]],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert receipt.returncode == 0, receipt.stdout
    body = json.loads(open(best["receipt"]).read())["receipt"]
    assert body["candidate"] == {"knobs": best["knobs"], "patches": best["patches"]}
    # The sequential A/B: 5 pairs before the first look, then up to 8 as the budget left allows
    # (an ablation run before the promotion may take one pair's room); the last look passed.
    assert body["ab"]["sequential"]["min_pairs"] == 5 and 6 <= body["ab"]["sequential"]["max_pairs"] <= 8
    assert body["ab"]["looks"][-1]["decision"] == "pass" and len(body["ab"]["baseline_s"]) == best["speedup"]["pairs"]
    assert searched["proposals"].get("catalog:no-checkpoint") == "catalog"

    audited = report["audit"]
    assert audited["chain_ok"] is True and audited["findings"] == [], audited
    assert audited["now_rejected"] == 0

    # Stage 4: the report, from the ledger alone, names the promoted receipt.
    assert [p["receipt"] for p in report["report"]["promoted"]][0] == Path(best["receipt"]).stem
    html = Path(report["report"]["html"]).read_text()
    assert html.count("<svg") == 3 and Path(best["receipt"]).stem in html  # the search's two, the A/B's one
    # Stage 5: the winner as one commit on a branch of the demo's own repository.
    applied = report["apply"]
    rid = Path(best["receipt"]).stem
    assert applied["receipt"] == rid and applied["branch"] == f"infrarsi/{rid}"
    git = ["git", "-C", str(folder)]
    count = subprocess.run(git + ["rev-list", "--count", f"HEAD..{applied['branch']}"], capture_output=True, text=True)
    assert count.stdout.strip() == "1", count.stderr
    message = subprocess.run(git + ["log", "-1", "--format=%B", applied["branch"]], capture_output=True, text=True)
    assert f"InfraRSI-Receipt: {rid}" in message.stdout
    status = subprocess.run(git + ["status", "--porcelain"], capture_output=True, text=True)
    assert status.stdout.strip() == "", status.stdout  # the demo's checkout itself is untouched

    manifest = json.loads((folder / ".infrarsi" / "manifest.json").read_text())
    with Ledger.open(folder / ".infrarsi" / "ledger.db") as ledger:
        rows = list(ledger.executions())
        assert (
            len(rows)
            == audited["executions"]
            == 4 + searched["executions"] + sum(1 for r in rows if r["kind"] == "proposal")
        )
        assert ledger.verify_chain(trusted_public_hex=manifest["manifest"]["public_key"]).ok
