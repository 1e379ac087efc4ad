"""Shared ledger fixtures: real SQLite files in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest
from ledger_testing import execution

from infrarsi.ledger import KeyPair, Ledger


@pytest.fixture
def key() -> KeyPair:
    return KeyPair.generate()


@pytest.fixture
def ledger_path(tmp_path: Path, key: KeyPair) -> Path:
    """A ledger holding five executions 1..5."""
    path = tmp_path / "ledger.db"
    with Ledger.open(path, key=key, create=True) as ledger:
        for i in range(5):
            ledger.append_execution(execution(i), blobs={"receipts": (f"receipts {i}".encode(), "receipts")})
    return path
