"""A workspace's ledger as the tests read it: its execution rows, and a row's stored evidence."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from infrarsi.ledger import Ledger


def rows(root: Path) -> list[dict]:
    """Every execution row of ``root``'s ledger (``.infrarsi/ledger.db``), in order."""
    with sqlite3.connect(root / ".infrarsi" / "ledger.db") as db:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute("select * from executions order by id")]


def evidence(root: Path, row: dict) -> dict:
    """The runner's evidence stored for ``row`` ({} where it has none)."""
    with Ledger.open(root / ".infrarsi" / "ledger.db") as ledger:
        blob = ledger.get_blob(row["evidence_hash"]) if row["evidence_hash"] else None
    return json.loads(blob) if blob else {}
