"""`infrarsi verify` and `infrarsi receipt verify` as a user runs them, on real TinyGPT runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from corpus_labels import HERE

from infrarsi._policy import REQUIRED_CHECKS
from infrarsi.ledger import Ledger

# Alone, never beside another test: a real speedup is accepted and a no-op rejected on the A/B alone.
pytestmark = pytest.mark.serial

CLI = [sys.executable, "-m", "infrarsi.cli"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=900)


def test_real_speed_patch_is_accepted_with_a_receipt_that_detects_any_byte_change(tinygpt_workspace, tmp_path):
    proc = _cli(
        "verify",
        "--contract",
        str(tinygpt_workspace),
        "--set",
        "attention=sdpa",
        "--patch",
        "batched-heads",
        "--pairs",
        "3",
        "--json",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["accepted"] is True
    assert out["candidate"] == {
        "knobs": {**out["candidate"]["knobs"], "attention": "sdpa"},
        "patches": ["batched-heads"],
    }
    assert {c["id"] for c in out["checks"]} == set(REQUIRED_CHECKS)
    assert all(c["status"] == "pass" for c in out["checks"])
    assert out["speedup"]["ci_low"] > 1.02 and out["speedup"]["median"] >= out["speedup"]["ci_low"]

    receipt = Path(out["receipt"])
    check = _cli("receipt", "verify", str(receipt), "--json")
    assert check.returncode == 0, check.stdout
    assert json.loads(check.stdout)["ok"] is True

    data = receipt.read_bytes()
    for offset in (len(data) // 3, len(data) // 2, len(data) - 10):
        tampered = tmp_path / f"tampered-{offset}.json"
        flipped = bytearray(data)
        flipped[offset] = ord("7") if flipped[offset] != ord("7") else ord("3")
        tampered.write_bytes(bytes(flipped))
        bad = _cli("receipt", "verify", str(tampered), "--json")
        assert bad.returncode == 1, (offset, bad.stdout, bad.stderr)
        assert json.loads(bad.stdout)["ok"] is False

    with Ledger.open(tinygpt_workspace.parent / ".infrarsi" / "ledger.db") as ledger:
        assert ledger.verify_chain().ok
        batch = [r for r in ledger.executions() if r["id"] in json.loads(receipt.read_text())["receipt"]["executions"]]
        assert len(batch) == 1 + 2 * 3  # the candidate run, then 3 A/B pairs
        assert all(r["verdicts"] and r["rule_version"] for r in batch)


def test_no_op_patch_is_rejected_on_stats_alone(tinygpt_workspace):
    # Two pairs, then one look more (not the contract's 5 to 8): a no-op has nothing to show in any number.
    patch = str(HERE / "honest" / "comment-only.diff")
    proc = _cli(
        "verify", "--contract", str(tinygpt_workspace), "--patch", patch, "--pairs", "2", "--max-pairs", "3", "--json"
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["accepted"] is False and out["receipt"] is None
    failing = [c["id"] for c in out["checks"] if c["status"] != "pass"]
    assert failing == ["stats.speedup"], out["checks"]
    assert out["speedup"]["ci_low"] <= 1.02


def test_receipt_missing_a_required_check_is_not_a_receipt(tinygpt_workspace, tmp_path):
    from infrarsi._receipt import verify_receipt
    from infrarsi.ledger import KeyPair, canonical_json, sha256_hex

    key = KeyPair.generate()
    body = {
        "checks": [{"id": cid, "status": "pass"} for cid in REQUIRED_CHECKS if cid != "numerics.grad_norm"],
        "ab": {"baseline_s": [1.0] * 5, "candidate_s": [0.5] * 5},
        "public_key": key.public_hex,
    }
    path = tmp_path / "r.json"
    path.write_text(
        json.dumps(
            {"id": sha256_hex(canonical_json(body))[:16], "receipt": body, "signature": key.sign(canonical_json(body))}
        )
    )
    check = verify_receipt(path)
    assert not check.ok and any("numerics.grad_norm" in p for p in check.problems)


def test_verify_bad_input_exits_2(tinygpt_workspace):
    proc = _cli("verify", "--contract", str(tinygpt_workspace), "--set", "attention=flash")
    assert proc.returncode == 2 and "expected one of" in proc.stderr and "Traceback" not in proc.stderr
    proc = _cli("receipt", "verify", str(tinygpt_workspace.parent / "nope.json"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
