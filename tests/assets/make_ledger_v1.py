"""How ``ledger_v1.sqlite`` was made (kept for the record; the asset itself must never be regenerated).

The point of the asset is that it was written by schema version 1 of the ledger: if a
later InfraRSI can no longer verify it, old ledgers in the field are broken too.
Run: python tests/assets/make_ledger_v1.py
"""

from __future__ import annotations

import json
from pathlib import Path

from infrarsi.ledger import SCHEMA_VERSION, KeyPair, Ledger, canonical_json, sha256_hex

HERE = Path(__file__).parent


def main() -> None:
    assert SCHEMA_VERSION == 1, "the v1 asset is made by schema version 1 only"
    path = HERE / "ledger_v1.sqlite"
    path.unlink(missing_ok=True)
    key = KeyPair.generate()
    summary = {"runs": 3, "step_time_s": {"median": 0.125, "cv": 0.01, "mad": 0.001}, "peak_mem_mb": 300.5}
    with Ledger.open(path, key=key, create=True) as ledger:
        ledger.set_meta("manifest_sha256", "a" * 64)
        for i, status in enumerate(("ok", "ok", "oom", "crash", "timeout", "rejected")):
            receipts = f'{{"step": {i}, "loss": 2.5}}\n'.encode()
            evidence = canonical_json({"steps": i, "note": "ünïcode"})
            ledger.append_execution({
                "batch": f"batch-{i // 2}", "kind": "baseline" if i < 2 else "run", "seq": i,
                "contract_hash": "c" * 64, "manifest_hash": "a" * 64,
                "knobs": {"attention": "sdpa", "compile": str(i % 2)},
                "patches": [{"name": "fused-qkv", "sha256": sha256_hex(b"diff")}] if i % 2 else [],
                "sources": {"model.py": sha256_hex(b"source")},
                "status": status, "detail": f"execution {i}", "exit_code": None if status == "timeout" else i,
                "step_time_s": 0.125 + i / 1000 if status == "ok" else None, "peak_mem_mb": 300 + i,
                "device_s": 1.5 * i, "wall_s": 2.0 * i, "receipts_hash": sha256_hex(receipts),
                "evidence_hash": sha256_hex(evidence), "stderr_tail": "Traceback ..." if status == "crash" else "",
                "llm_tokens": 10 * i, "llm_cost": 0.01 * i,
                "verdicts": [{"id": "numerics.loss", "status": "pass", "detail": ""}] if i % 2 else None,
                "rule_version": "1",
            }, blobs={"receipts": (receipts, "receipts"), "evidence": (evidence, "evidence"),
                      "patch": (b"diff", "patch"), "source": (b"source", "source")})
        ledger.append_baseline("batch-0", summary)
        count = ledger.count()
    (HERE / "ledger_v1.json").write_text(json.dumps(
        {"public_key": key.public_hex, "executions": count, "baseline_summary": summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
