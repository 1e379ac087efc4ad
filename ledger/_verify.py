"""Re-verifying a ledger's chain: every row hash, link, id, signature, and the signed head."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from ._crypto import verify_signature
from ._rows import GENESIS_HASH, head_body, row_digest

__all__ = ["ChainReport", "verify_chain"]


@dataclass(frozen=True)
class ChainReport:
    """The outcome of :meth:`Ledger.verify_chain`.

    ``rows`` counts the executions that verified before the first break (all of them
    when ``ok``). ``first_bad`` is the id of the first execution that is wrong or
    missing (one past the last row when trailing rows were cut), or None when the
    problem is the head or key alone.
    """

    ok: bool
    rows: int
    first_bad: int | None
    detail: str


def verify_chain(conn: sqlite3.Connection, stored_public: str | None, trusted_public: str | None = None) -> ChainReport:
    """Walk ``executions`` in id order, one row at a time, then check the head."""
    if trusted_public is None and stored_public is None:
        return ChainReport(False, 0, None, "no public key stored in meta: the ledger cannot be verified")
    key = trusted_public or stored_public
    report = _walk(conn, key)
    if trusted_public is not None and trusted_public != stored_public:
        # Re-signing everything with another key makes a self-consistent ledger; only a
        # key the verifier trusts from elsewhere (the manifest, a published hex) shows it.
        return ChainReport(
            False,
            report.rows,
            report.first_bad,
            f"key swapped: the ledger stores public key {str(stored_public)[:16]}..., "
            f"not the trusted {trusted_public[:16]}...; {report.detail}",
        )
    return report


def _walk(conn: sqlite3.Connection, key: str) -> ChainReport:
    cursor = conn.execute("SELECT * FROM executions ORDER BY id")
    names = [d[0] for d in cursor.description]
    prev_hash, verified = GENESIS_HASH, 0
    for values in cursor:
        row = dict(zip(names, values))
        expected = verified + 1
        if row["id"] != expected:
            return ChainReport(
                False,
                verified,
                expected,
                f"execution {expected} is missing: id {row['id']} follows "
                f"{'the start' if expected == 1 else f'id {expected - 1}'}",
            )
        if row_digest(row) != row["row_hash"]:
            return ChainReport(
                False, verified, expected, f"execution {expected}: contents do not match its row_hash (edited or moved)"
            )
        if row["prev_hash"] != prev_hash:
            return ChainReport(
                False,
                verified,
                expected,
                f"execution {expected}: prev_hash does not link to "
                f"{'the genesis hash' if expected == 1 else f'execution {expected - 1}'}",
            )
        if not verify_signature(key, row["row_hash"].encode(), row["signature"]):
            return ChainReport(
                False, verified, expected, f"execution {expected}: signature does not verify with key {key[:16]}..."
            )
        prev_hash, verified = row["row_hash"], expected
    return _check_head(conn, key, verified, prev_hash)


def _check_head(conn: sqlite3.Connection, key: str, rows: int, last_hash: str) -> ChainReport:
    head = conn.execute("SELECT count, row_hash, signature FROM head WHERE id = 1").fetchone()
    if head is None:
        return ChainReport(False, rows, None, "the head row is missing")
    count, head_hash, signature = head
    if not verify_signature(key, head_body(count, head_hash), signature):
        return ChainReport(False, rows, None, f"the head's signature does not verify with key {key[:16]}...")
    if count > rows:
        return ChainReport(
            False,
            rows,
            rows + 1,
            f"the signed head records {count} executions, only {rows} are present: "
            f"executions {rows + 1}..{count} were deleted",
        )
    if count < rows:
        return ChainReport(
            False,
            count,
            count + 1,
            f"the signed head records {count} executions, {rows} are present: "
            f"executions {count + 1}..{rows} are not covered by the head",
        )
    if head_hash != last_hash:
        return ChainReport(False, rows, None, "the head's row_hash is not the last execution's row_hash")
    return ChainReport(True, rows, None, f"{rows} executions verified")
