"""Helpers for the ledger tests: plausible records, and raw-SQL tampering as an attacker would."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def execution(i: int = 0, **overrides) -> dict:
    """A plausible execution record; ``i`` varies it so rows differ."""
    fields = {
        "batch": f"batch-{i // 2}",
        "kind": "run" if i % 2 else "baseline",
        "seq": i,
        "contract_hash": "c" * 64,
        "manifest_hash": "m" * 64,
        "knobs": {"attention": "sdpa" if i % 2 else "manual", "compile": "0"},
        "patches": [{"name": "fused-qkv", "sha256": "p" * 64}] if i % 2 else [],
        "sources": {"model.py": "s" * 64},
        "status": "ok",
        "detail": f"run {i}",
        "exit_code": 0,
        "step_time_s": 0.1 + i / 100,
        "peak_mem_mb": 512,
        "device_s": 2.5 + i,
        "wall_s": 3.0 + i,
        "stderr_tail": "",
        "verdicts": [{"id": "numerics.loss", "status": "pass", "detail": ""}],
        "rule_version": "1",
    }
    fields.update(overrides)
    return fields


def tamper(path: Path, *statements: str, params: list[tuple] | None = None) -> None:
    """Run raw SQL on a ledger with its append-only triggers dropped, as an attacker with the file can."""
    conn = sqlite3.connect(path)
    try:
        for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
            conn.execute(f"DROP TRIGGER {name}")
        for index, sql in enumerate(statements):
            conn.execute(sql, params[index] if params else ())
        conn.commit()
    finally:
        conn.close()


def raw_rows(path: Path) -> list[dict]:
    """Every execution row exactly as stored."""
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(row) for row in conn.execute("SELECT * FROM executions ORDER BY id")]
    finally:
        conn.close()
