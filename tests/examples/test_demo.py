"""`infrarsi demo` end to end: the bundled TinyGPT through init, baseline, search and audit.

Real training runs in subprocesses. Single runs are noisy, so the test holds the demo
to its rules (a best only with a verifying receipt, a clean audit), not to one winner.
"""

from __future__ import annotations

import json
import subprocess
import sys

from infrarsi.ledger import Ledger


def test_demo_takes_tinygpt_through_every_stage(tmp_path):
    folder = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "infrarsi.cli", "demo", "--dir", str(folder), "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["ok"] is True
    assert report["baseline"]["runs"] == 3
    assert report["baseline"]["step_time_s"]["median"] > 0
    assert report["baseline"]["peak_mem_mb"] < 560

    searched = report["search"]
    assert searched["executions"] <= 24
    assert len(searched["history"]) == searched["exploration"] >= 13 - 1  # one may be a pre-flight conflict
    # The best is only ever a promoted candidate with a receipt that verifies.
    best = searched["best"]
    assert best is not None, searched["attempts"]
    assert best in searched["promoted"] and best["speedup"]["ci_low"] > 1.02
    receipt = subprocess.run([sys.executable, "-m", "infrarsi.cli", "receipt", "verify", best["receipt"]],
                             capture_output=True, text=True, timeout=60)
    assert receipt.returncode == 0, receipt.stdout
    body = json.loads(open(best["receipt"]).read())["receipt"]
    assert body["candidate"] == {"knobs": best["knobs"], "patches": best["patches"]}
    assert searched["proposals"].get("catalog:no-checkpoint") == "catalog"

    audited = report["audit"]
    assert audited["chain_ok"] is True and audited["findings"] == [], audited
    assert audited["now_rejected"] == 0

    manifest = json.loads((folder / ".infrarsi" / "manifest.json").read_text())
    with Ledger.open(folder / ".infrarsi" / "ledger.db") as ledger:
        rows = list(ledger.executions())
        assert len(rows) == audited["executions"] == 3 + searched["executions"] + sum(
            1 for r in rows if r["kind"] == "proposal")
        assert ledger.verify_chain(trusted_public_hex=manifest["manifest"]["public_key"]).ok
