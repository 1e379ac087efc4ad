"""Execution rows: caller fields checked and encoded for storage, decoded back, and hashed.

The row hash is computed over exactly the values SQLite hands back (ints as int,
reals as float, JSON columns as their canonical text), so a hash computed before
the insert is the hash ``verify_chain`` recomputes years later.
"""

from __future__ import annotations

import json
import math
from typing import Any

from infrarsi.errors import LedgerError

from ._crypto import canonical_json, sha256_hex
from ._schema import EXECUTION_COLUMNS, LEDGER_SET, STATUSES, V1_EXECUTION_COLUMNS

__all__ = ["GENESIS_HASH", "encode_fields", "decode_row", "row_digest", "head_body"]

GENESIS_HASH = "0" * 64
_DEFAULTS = {"knobs": {}, "patches": [], "sources": {}, "llm_tokens": 0, "llm_cost": 0.0}
_REQUIRED = ("status", "device_s")


def _int(name: str, value: Any) -> int:
    # bool is an int subclass; True stored as 1 would read back as 1 and silently lose meaning.
    if isinstance(value, bool) or not isinstance(value, int):
        raise LedgerError(f"execution field {name!r}: expected an integer, got {value!r}")
    if not -(2**63) <= value < 2**63:
        raise LedgerError(f"execution field {name!r}: {value} does not fit SQLite's 64-bit integer")
    return value


def _real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LedgerError(f"execution field {name!r}: expected a number, got {value!r}")
    value = float(value)  # SQLite stores 3 in a REAL column as 3.0; hash what comes back
    if not math.isfinite(value):
        raise LedgerError(f"execution field {name!r}: expected a finite number, got {value!r}")
    return value


def _json(name: str, value: Any) -> str:
    if name in ("knobs", "sources") and not isinstance(value, dict):
        raise LedgerError(f"execution field {name!r}: expected a dict, got {type(value).__name__}")
    if name == "sources" and not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise LedgerError(f"execution field 'sources': expected {{path: sha256}} strings, got {value!r}")
    if name == "patches" and not (
        isinstance(value, list) and all(isinstance(p, dict) and set(p) == {"name", "sha256"} for p in value)
    ):
        raise LedgerError(f"execution field 'patches': expected a list of {{'name', 'sha256'}} dicts, got {value!r}")
    try:
        return canonical_json(value).decode()
    except (TypeError, ValueError) as exc:
        raise LedgerError(f"execution field {name!r}: not JSON-serialisable ({exc})") from None


def encode_fields(fields: dict) -> dict:
    """Check a caller's fields and turn them into column values (ledger-set columns left out)."""
    if not isinstance(fields, dict):
        raise LedgerError(f"execution fields: expected a dict, got {type(fields).__name__}")
    unknown = sorted(set(fields) - set(EXECUTION_COLUMNS))
    if unknown:
        raise LedgerError(
            f"execution fields: unknown {unknown} (expected some of {sorted(set(EXECUTION_COLUMNS) - LEDGER_SET)})"
        )
    reserved = sorted(set(fields) & LEDGER_SET)
    if reserved:
        raise LedgerError(f"execution fields: {reserved} are set by the ledger, not by the caller")
    missing = [name for name in _REQUIRED if fields.get(name) is None]
    if missing:
        raise LedgerError(f"execution fields: {missing} required")
    if fields["status"] not in STATUSES:
        raise LedgerError(f"execution field 'status': {fields['status']!r} is not one of {list(STATUSES)}")
    row = {}
    for name, kind in EXECUTION_COLUMNS.items():
        if name in LEDGER_SET:
            continue
        value = fields.get(name, _DEFAULTS.get(name))
        if value is None and name in _DEFAULTS:
            value = _DEFAULTS[name]
        if value is None and kind != "json":
            row[name] = None
        elif kind == "int":
            row[name] = _int(name, value)
        elif kind == "real":
            row[name] = _real(name, value)
        elif kind == "json":
            row[name] = None if value is None else _json(name, value)
        elif not isinstance(value, str):
            raise LedgerError(f"execution field {name!r}: expected a string, got {type(value).__name__}")
        else:
            try:
                value.encode()
            except UnicodeEncodeError as exc:
                raise LedgerError(f"execution field {name!r}: not valid UTF-8 text ({exc})") from None
            row[name] = value
    return row


def decode_row(row: dict) -> dict:
    """A stored row with its JSON columns turned back into Python values."""
    out = dict(row)
    for name, kind in EXECUTION_COLUMNS.items():
        if kind == "json" and out.get(name) is not None:
            out[name] = json.loads(out[name])
    return out


def row_digest(row: dict) -> str:
    """SHA-256 over the canonical JSON of every column but ``row_hash`` and ``signature``."""
    body = {
        name: value
        for name, value in row.items()
        if name not in ("row_hash", "signature") and (name in V1_EXECUTION_COLUMNS or value is not None)
    }
    return sha256_hex(canonical_json(body))


def head_body(count: int, row_hash: str) -> bytes:
    """What the head's signature covers."""
    return canonical_json({"count": count, "row_hash": row_hash})
