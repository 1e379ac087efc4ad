"""The ledger's tables, and the ordered migrations that build them.

A ledger records in ``migrations`` every schema version applied to it. Opening a
ledger applies the missing versions in order, each in its own transaction, so a
ledger written by an older InfraRSI keeps working. Migrations are frozen once
released: a later version appends a function (new columns, new tables) and never
edits an earlier one, because old ledgers were built by the old text.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import sqlite_utils

from infrarsi.errors import LedgerError

__all__ = [
    "SCHEMA_VERSION",
    "MIGRATIONS",
    "EXECUTION_COLUMNS",
    "V1_EXECUTION_COLUMNS",
    "STATUSES",
    "LEDGER_SET",
    "migrate",
    "applied_versions",
    "utc_now",
]

STATUSES = ("ok", "oom", "crash", "timeout", "rejected")

# Every executions column -> how a value is checked and stored: "int", "real", "text", or
# "json" (a Python value kept as canonical JSON text). A later migration that adds a column
# adds it here too.
EXECUTION_COLUMNS: dict[str, str] = {
    "id": "int",
    "batch": "text",
    "kind": "text",
    "seq": "int",
    "created_at": "text",
    "contract_hash": "text",
    "manifest_hash": "text",
    "knobs": "json",
    "patches": "json",
    "sources": "json",
    "status": "text",
    "detail": "text",
    "exit_code": "int",
    "step_time_s": "real",
    "peak_mem_mb": "real",
    "device_s": "real",
    "wall_s": "real",
    "receipts_hash": "text",
    "evidence_hash": "text",
    "stderr_tail": "text",
    "llm_tokens": "int",
    "llm_cost": "real",
    "verdicts": "json",
    "rule_version": "text",
    "prev_hash": "text",
    "row_hash": "text",
    "signature": "text",
    "baseline_id": "int",  # v2: the baseline a judged execution was compared with
}
# The row hash always covers these, NULLs included; a column added later is covered only
# where it holds a value, so rows written before it existed keep their hashes.
V1_EXECUTION_COLUMNS = tuple(c for c in EXECUTION_COLUMNS if c != "baseline_id")
# Set by the ledger, never by a caller.
LEDGER_SET = frozenset({"id", "created_at", "prev_hash", "row_hash", "signature"})


def utc_now() -> str:
    """ISO 8601 UTC with microseconds: the ledger's one timestamp format."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _append_only(db: sqlite_utils.Database, table: str) -> None:
    # Guards against accidents and careless tools, not against an attacker (who can drop
    # the triggers): tampering is what the hash chain and signatures are for.
    for action in ("UPDATE", "DELETE"):
        db.execute(
            f"CREATE TRIGGER {table}_no_{action.lower()} BEFORE {action} ON {table} "
            f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"
        )


def _v1(db: sqlite_utils.Database) -> None:
    db["meta"].create({"key": str, "value": str}, pk="key")
    db.execute(
        "CREATE TRIGGER meta_public_key_fixed BEFORE UPDATE ON meta WHEN OLD.key = 'public_key' "
        "BEGIN SELECT RAISE(ABORT, 'the ledger public key cannot change'); END"
    )
    db.execute(
        "CREATE TRIGGER meta_public_key_kept BEFORE DELETE ON meta WHEN OLD.key = 'public_key' "
        "BEGIN SELECT RAISE(ABORT, 'the ledger public key cannot be removed'); END"
    )
    db["blobs"].create(
        {"hash": str, "kind": str, "size": int, "data": bytes}, pk="hash", not_null={"kind", "size", "data"}
    )
    _append_only(db, "blobs")
    # Explicit DDL: sqlite-utils cannot declare AUTOINCREMENT or CHECK constraints.
    statuses = ", ".join(f"'{s}'" for s in STATUSES)
    db.execute(f"""
        CREATE TABLE executions (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            batch TEXT, kind TEXT, seq INTEGER,
            created_at TEXT NOT NULL,
            contract_hash TEXT, manifest_hash TEXT,
            knobs TEXT, patches TEXT, sources TEXT,
            status TEXT NOT NULL CHECK (status IN ({statuses})),
            detail TEXT, exit_code INTEGER,
            step_time_s REAL, peak_mem_mb REAL, device_s REAL NOT NULL, wall_s REAL,
            receipts_hash TEXT, evidence_hash TEXT, stderr_tail TEXT,
            llm_tokens INTEGER NOT NULL DEFAULT 0, llm_cost REAL NOT NULL DEFAULT 0,
            verdicts TEXT, rule_version TEXT,
            prev_hash TEXT NOT NULL, row_hash TEXT NOT NULL, signature TEXT NOT NULL
        )""")
    db["executions"].create_index(["batch"])
    db["executions"].create_index(["kind"])
    _append_only(db, "executions")
    # One row, id 1: the signed count and last row hash, so cutting trailing rows shows.
    db.execute(
        "CREATE TABLE head (id INTEGER PRIMARY KEY CHECK (id = 1), count INTEGER NOT NULL, "
        "row_hash TEXT NOT NULL, signature TEXT NOT NULL)"
    )
    db.execute("""
        CREATE TABLE baselines (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            batch TEXT NOT NULL, created_at TEXT NOT NULL,
            summary_hash TEXT NOT NULL, signature TEXT NOT NULL
        )""")
    _append_only(db, "baselines")


def _v2(db: sqlite_utils.Database) -> None:
    # Which baseline a judged execution was compared with, so `infrarsi audit` re-judges it
    # against the same one. Rows written before v2 hold NULL (and their hashes don't cover it).
    db.execute("ALTER TABLE executions ADD COLUMN baseline_id INTEGER")


MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [_v1, _v2]
SCHEMA_VERSION = len(MIGRATIONS)


def applied_versions(db: sqlite_utils.Database) -> list[int]:
    """Schema versions recorded in ``migrations``, ascending; empty for a blank database."""
    if not db["migrations"].exists():
        return []
    return [row["version"] for row in db.query("SELECT version FROM migrations ORDER BY version")]


def migrate(db: sqlite_utils.Database, where: str) -> list[int]:
    """Apply every migration the ledger lacks, in order; returns the versions applied now."""
    applied_now = []
    for version, migration in enumerate(MIGRATIONS, start=1):
        # IMMEDIATE: a second process opening the same new ledger waits here, then sees
        # the version already applied, instead of both creating the tables.
        db.conn.execute("BEGIN IMMEDIATE")
        try:
            db["migrations"].create({"version": int, "applied_at": str}, pk="version", if_not_exists=True)
            done = applied_versions(db)
            if done and done[-1] > SCHEMA_VERSION:
                raise LedgerError(
                    f"{where}: written by a newer InfraRSI (schema version {done[-1]}; "
                    f"this one knows up to {SCHEMA_VERSION}): upgrade InfraRSI to open it"
                )
            if version not in done:
                migration(db)
                db["migrations"].insert({"version": version, "applied_at": utc_now()})
                applied_now.append(version)
        except BaseException:
            db.conn.rollback()
            raise
        db.conn.commit()
    return applied_now
