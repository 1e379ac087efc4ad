"""A workspace's ledger as the tests read it: its execution rows, and a row's stored evidence."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from infrarsi.ledger import Ledger


def _ledger(root: Path, contract: str | None) -> Path:
    """The workspace's ledger: ``.infrarsi/ledger.db``, or a named contract's own."""
    state = root / ".infrarsi" if contract is None else root / ".infrarsi" / "contracts" / contract
    return state / "ledger.db"


def rows(root: Path, contract: str | None = None) -> list[dict]:
    """Every execution row of ``root``'s ledger (``contract``: a contract file other than
    infrarsi.toml, by its stem), in order."""
    with sqlite3.connect(_ledger(root, contract)) as db:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute("select * from executions order by id")]


def evidence(root: Path, row: dict, contract: str | None = None) -> dict:
    """The runner's evidence stored for ``row`` ({} where it has none)."""
    with Ledger.open(_ledger(root, contract)) as ledger:
        blob = ledger.get_blob(row["evidence_hash"]) if row["evidence_hash"] else None
    return json.loads(blob) if blob else {}
