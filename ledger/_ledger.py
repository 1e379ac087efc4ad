"""The ledger: an append-only, hash-chained, Ed25519-signed SQLite store of every execution.

Each write is one ``BEGIN IMMEDIATE`` transaction committed before the call returns,
so killing the process at any instant leaves whole rows only, and a second writer
waits its turn instead of forking the chain.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlite_utils

from infrarsi.errors import LedgerError

from ._crypto import KeyPair, canonical_json, sha256_hex, verify_signature
from ._rows import GENESIS_HASH, decode_row, encode_fields, head_body, row_digest
from ._schema import applied_versions, migrate, utc_now
from ._verify import ChainReport, verify_chain

__all__ = ["Ledger"]

BUSY_TIMEOUT_S = 10.0
PUBLIC_KEY = "public_key"


class Ledger:
    """An open ledger file. Reads need no key; every write needs the ledger's own signing key.

    ``db`` is the underlying ``sqlite_utils.Database``, for ad-hoc read-only queries.
    """

    def __init__(self, path: Path, db: sqlite_utils.Database, key: KeyPair | None):
        self.path = path
        self.db = db
        self._key = key

    @classmethod
    def open(cls, path: str | Path, key: KeyPair | None = None, create: bool = False) -> "Ledger":
        """Open the ledger at ``path``, migrating its schema; ``create=True`` makes a new one."""
        path = Path(path)
        exists = path.exists() and path.stat().st_size > 0
        if not exists and not create:
            raise LedgerError(
                f"{path}: no ledger there (expected an existing ledger file; `infrarsi init` creates one)"
            )
        if create and key is None:
            raise LedgerError(f"{path}: creating a ledger needs a signing key (its public key is stored)")
        try:
            conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S)
        except sqlite3.Error as exc:
            raise LedgerError(f"{path}: cannot open ({exc})") from None
        try:
            ledger = cls(path, cls._prepare(conn, path, exists, create, key), key)
        except BaseException:
            conn.close()
            raise
        return ledger

    @staticmethod
    def _prepare(
        conn: sqlite3.Connection, path: Path, exists: bool, create: bool, key: KeyPair | None
    ) -> sqlite_utils.Database:
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            # FULL: a committed execution survives power loss too, not just a killed process.
            conn.execute("PRAGMA synchronous = FULL")
            db = sqlite_utils.Database(conn)
            if exists and not applied_versions(db):
                raise LedgerError(f"{path}: a SQLite file, but not an InfraRSI ledger (no migrations table)")
            migrate(db, str(path))
            if create and key is not None:
                _initialise(db, key)
            if _meta(db, PUBLIC_KEY) is None:
                raise LedgerError(
                    f"{path}: ledger has no stored public key (an interrupted create?); "
                    f"make a new one with `infrarsi init --force`"
                )
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"{path}: not a readable SQLite ledger ({exc})") from None
        return db

    def close(self) -> None:
        """Close the connection; every write is already committed."""
        self.db.close()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- keys and transactions -------------------------------------------------------------

    @property
    def public_key(self) -> str:
        """The hex public key stored when the ledger was created."""
        return _meta(self.db, PUBLIC_KEY)

    def _writer(self) -> KeyPair:
        if self._key is None:
            raise LedgerError(
                f"{self.path}: opened without a signing key, so it is read-only "
                f"(writing needs the key with public key {self.public_key[:16]}...)"
            )
        if self._key.public_hex != self.public_key:
            raise LedgerError(
                f"{self.path}: signing key {self._key.public_hex[:16]}... is not this "
                f"ledger's key (expected public key {self.public_key[:16]}...)"
            )
        return self._key

    @contextmanager
    def _transaction(self) -> Iterator[KeyPair]:
        key = self._writer()
        self.db.conn.execute("BEGIN IMMEDIATE")  # take the write lock before reading the head
        try:
            yield key
        except BaseException:
            self.db.conn.rollback()
            raise
        self.db.conn.commit()

    # -- blobs and meta --------------------------------------------------------------------

    def put_blob(self, data: bytes, kind: str) -> str:
        """Store ``data`` under its SHA-256 (a no-op when already there); returns the hash."""
        with self._transaction():
            return self._put_blob(data, kind)

    def _put_blob(self, data: bytes, kind: str) -> str:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise LedgerError(f"blob of kind {kind!r}: expected bytes, got {type(data).__name__}")
        data = bytes(data)
        digest = sha256_hex(data)
        self.db["blobs"].insert({"hash": digest, "kind": kind, "size": len(data), "data": data}, ignore=True)
        return digest

    def get_blob(self, digest: str) -> bytes | None:
        """The blob stored under ``digest``, or None; LedgerError if its content no longer matches."""
        row = self.db.execute("SELECT data FROM blobs WHERE hash = ?", [digest]).fetchone()
        if row is None:
            return None
        data = bytes(row[0])
        if sha256_hex(data) != digest:
            raise LedgerError(
                f"{self.path}: blob {digest[:16]}... has been altered "
                f"(its content hashes to {sha256_hex(data)[:16]}...)"
            )
        return data

    def blobs_of_kind(self, kind: str) -> Iterator[tuple[str, bytes]]:
        """``(hash, data)`` of every blob stored with label ``kind`` (few: manifests, contracts), unchecked."""
        for digest, data in self.db.execute("SELECT hash, data FROM blobs WHERE kind = ? ORDER BY rowid", [kind]):
            yield digest, bytes(data)

    def set_meta(self, key: str, value: str) -> None:
        """Record a string under ``key`` (replacing an earlier value); the public key is fixed."""
        if key == PUBLIC_KEY:
            raise LedgerError(f"{self.path}: meta {PUBLIC_KEY!r} is set at creation and cannot change")
        if not isinstance(value, str):
            raise LedgerError(f"meta {key!r}: expected a string value, got {type(value).__name__}")
        with self._transaction():
            self.db["meta"].upsert({"key": key, "value": value}, pk="key")

    def get_meta(self, key: str) -> str | None:
        """The string stored under ``key``, or None."""
        return _meta(self.db, key)

    # -- executions ------------------------------------------------------------------------

    def append_execution(self, fields: dict, blobs: dict[str, tuple[bytes, str]] | None = None) -> int:
        """Record one execution with its evidence blobs, chained and signed; returns its id."""
        row = encode_fields(fields)
        with self._transaction() as key:
            for data, kind in (blobs or {}).values():  # labels are the caller's bookkeeping only
                self._put_blob(data, kind)
            count, prev_hash = self._checked_head(key)
            row.update(id=count + 1, created_at=utc_now(), prev_hash=prev_hash)
            row["row_hash"] = row_digest(row)
            row["signature"] = key.sign(row["row_hash"].encode())
            self.db["executions"].insert(row)
            stored = self.db.execute("SELECT * FROM executions WHERE id = ?", [row["id"]])
            names = [d[0] for d in stored.description]
            # Belt and braces: the hash must be reproducible from what SQLite actually kept.
            if row_digest(dict(zip(names, stored.fetchone()))) != row["row_hash"]:
                raise LedgerError(f"{self.path}: execution {row['id']} did not read back as written")
            self._set_head(key, row["id"], row["row_hash"])
        return row["id"]

    def _checked_head(self, key: KeyPair) -> tuple[int, str]:
        # Appending onto a cut or edited tail would sign over the damage; refuse instead.
        head = self.db.execute("SELECT count, row_hash, signature FROM head WHERE id = 1").fetchone()
        last = self.db.execute("SELECT id, row_hash FROM executions ORDER BY id DESC LIMIT 1").fetchone()
        last_id, last_hash = last if last else (0, GENESIS_HASH)
        if (
            head is None
            or not verify_signature(key.public_hex, head_body(head[0], head[1]), head[2])
            or (head[0], head[1]) != (last_id, last_hash)
        ):
            raise LedgerError(
                f"{self.path}: the signed head does not match the last execution "
                f"(the ledger was tampered with); run `infrarsi audit` to see where"
            )
        return head[0], head[1]

    def _set_head(self, key: KeyPair, count: int, row_hash: str) -> None:
        self.db["head"].upsert(
            {"id": 1, "count": count, "row_hash": row_hash, "signature": key.sign(head_body(count, row_hash))}, pk="id"
        )

    def executions(self, kind: str | None = None, batch: str | None = None) -> Iterator[dict]:
        """Executions in id order, decoded, streamed from the database a row at a time."""
        where, params = [], []
        for column, value in (("kind", kind), ("batch", batch)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        sql = "SELECT * FROM executions" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
        for row in self.db.query(sql, params):
            yield decode_row(row)

    def get_execution(self, execution_id: int) -> dict | None:
        """One execution, decoded, or None."""
        for row in self.db.query("SELECT * FROM executions WHERE id = ?", [execution_id]):
            return decode_row(row)
        return None

    def manifest_hashes(self) -> set[str]:
        """The manifests (by sha256) the executions ran under."""
        return {row[0] for row in self.db.execute("SELECT DISTINCT manifest_hash FROM executions") if row[0]}

    def judged_against(self) -> set[tuple[str, int]]:
        """``(manifest_hash, baseline_id)`` of the judged executions: which baseline each manifest's runs met."""
        sql = (
            "SELECT DISTINCT manifest_hash, baseline_id FROM executions "
            "WHERE baseline_id IS NOT NULL AND manifest_hash IS NOT NULL"
        )
        return {(row[0], int(row[1])) for row in self.db.execute(sql)}

    def count(self) -> int:
        """How many executions are stored."""
        return self.db.execute("SELECT count(*) FROM executions").fetchone()[0]

    # -- baselines -------------------------------------------------------------------------

    def append_baseline(self, batch: str, summary: dict) -> int:
        """Record a baseline summary (stored as a blob), signed; returns its id."""
        try:
            body = canonical_json(summary)
        except (TypeError, ValueError) as exc:
            raise LedgerError(f"baseline {batch!r}: summary is not JSON-serialisable ({exc})") from None
        with self._transaction() as key:
            last = self.db.execute("SELECT max(id) FROM baselines").fetchone()[0] or 0
            row = {
                "id": last + 1,
                "batch": batch,
                "created_at": utc_now(),
                "summary_hash": self._put_blob(body, "baseline"),
            }
            row["signature"] = key.sign(_baseline_body(row))
            self.db["baselines"].insert(row)
        return row["id"]

    def latest_baseline(self) -> dict | None:
        """The newest baseline ``{id, batch, created_at, summary}``, its signature checked; or None."""
        rows = list(self.db.query("SELECT * FROM baselines ORDER BY id DESC LIMIT 1"))
        return self._baseline(rows[0]) if rows else None

    def baseline(self, baseline_id: int) -> dict | None:
        """One baseline by id, its signature checked; or None."""
        rows = list(self.db.query("SELECT * FROM baselines WHERE id = ?", [baseline_id]))
        return self._baseline(rows[0]) if rows else None

    def baseline_ids(self) -> list[tuple[int, str, str]]:
        """``(id, batch, created_at)`` of every baseline, oldest first (small: one per `baseline`)."""
        return [
            (r["id"], r["batch"], r["created_at"])
            for r in self.db.query("SELECT id, batch, created_at FROM baselines ORDER BY id")
        ]

    def altered_blobs(self) -> Iterator[tuple[str, str]]:
        """``(hash, kind)`` of every blob whose content no longer hashes to its key, streamed."""
        for digest, kind, data in self.db.execute("SELECT hash, kind, data FROM blobs"):
            if sha256_hex(bytes(data)) != digest:
                yield digest, kind

    def _baseline(self, row: dict) -> dict:
        if not verify_signature(self.public_key, _baseline_body(row), row["signature"]):
            raise LedgerError(
                f"{self.path}: baseline {row['id']} (batch {row['batch']!r}): "
                f"signature does not verify (the row was altered)"
            )
        data = self.get_blob(row["summary_hash"])
        if data is None:
            raise LedgerError(
                f"{self.path}: baseline {row['id']}: summary blob {row['summary_hash'][:16]}... is missing"
            )
        return {"id": row["id"], "batch": row["batch"], "created_at": row["created_at"], "summary": json.loads(data)}

    # -- audit -----------------------------------------------------------------------------

    def verify_chain(self, trusted_public_hex: str | None = None) -> ChainReport:
        """Re-check every execution and the head; pass the key trusted from elsewhere to catch a swap."""
        return verify_chain(self.db.conn, _meta(self.db, PUBLIC_KEY), trusted_public_hex)


def _baseline_body(row: dict) -> bytes:
    # The signed fields are fixed, so a column added by a later schema leaves old signatures valid.
    return canonical_json({name: row[name] for name in ("id", "batch", "created_at", "summary_hash")})


def _meta(db: sqlite_utils.Database, key: str) -> str | None:
    row = db.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
    return row[0] if row else None


def _initialise(db: sqlite_utils.Database, key: KeyPair) -> None:
    # Public key and the genesis head together: a ledger never exists with one and not the other.
    db.conn.execute("BEGIN IMMEDIATE")
    try:
        if _meta(db, PUBLIC_KEY) is None:
            db["meta"].insert({"key": PUBLIC_KEY, "value": key.public_hex})
            db["head"].insert(
                {"id": 1, "count": 0, "row_hash": GENESIS_HASH, "signature": key.sign(head_body(0, GENESIS_HASH))}
            )
    except BaseException:
        db.conn.rollback()
        raise
    db.conn.commit()
