"""The ledger's API: executions, blobs, meta, baselines, keys, opening and migrations."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import pytest
from ledger_testing import execution, tamper

from infrarsi.ledger import SCHEMA_VERSION, KeyPair, Ledger, LedgerError, canonical_json, sha256_hex, verify_signature


def test_append_and_read_roundtrip(tmp_path: Path, key: KeyPair) -> None:
    with Ledger.open(tmp_path / "l.db", key=key, create=True) as ledger:
        first = ledger.append_execution(execution(0))
        second = ledger.append_execution(
            execution(1, status="oom", step_time_s=None, llm_tokens=12, llm_cost=0.5, verdicts=None)
        )
        assert (first, second) == (1, 2)
        assert ledger.count() == 2
        row = ledger.get_execution(2)
        expected = execution(1, status="oom", step_time_s=None, llm_tokens=12, llm_cost=0.5, verdicts=None)
        assert {name: row[name] for name in expected} == expected
        assert row["created_at"].endswith("+00:00")
        assert row["prev_hash"] == ledger.get_execution(1)["row_hash"]
        assert ledger.get_execution(1)["prev_hash"] == "0" * 64
        assert ledger.get_execution(99) is None
        assert [r["id"] for r in ledger.executions()] == [1, 2]
        assert [r["id"] for r in ledger.executions(kind="run")] == [2]
        assert [r["id"] for r in ledger.executions(batch="batch-0", kind="baseline")] == [1]
        assert list(ledger.executions(batch="nope")) == []
    with Ledger.open(tmp_path / "l.db") as reader:  # reading needs no key
        assert reader.get_execution(1)["knobs"] == {"attention": "manual", "compile": "0"}
        assert reader.verify_chain().ok


def test_defaults_and_numeric_coercion(tmp_path: Path, key: KeyPair) -> None:
    with Ledger.open(tmp_path / "l.db", key=key, create=True) as ledger:
        row = ledger.get_execution(ledger.append_execution({"status": "crash", "device_s": 3}))
        assert row["device_s"] == 3.0 and isinstance(row["device_s"], float)
        assert (row["knobs"], row["patches"], row["sources"]) == ({}, [], {})
        assert (row["llm_tokens"], row["llm_cost"], row["verdicts"]) == (0, 0.0, None)
        assert ledger.verify_chain().ok


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"status": "ok", "device_s": 1, "colour": "red"}, "unknown ['colour']"),
        ({"status": "fine", "device_s": 1}, "'fine' is not one of"),
        ({"status": "ok"}, "['device_s'] required"),
        ({"status": "ok", "device_s": 1, "id": 7}, "set by the ledger"),
        ({"status": "ok", "device_s": float("nan")}, "finite"),
        ({"status": "ok", "device_s": 1, "exit_code": True}, "integer"),
        ({"status": "ok", "device_s": 1, "knobs": ["a"]}, "expected a dict"),
        ({"status": "ok", "device_s": 1, "patches": [{"name": "x"}]}, "'name', 'sha256'"),
        ({"status": "ok", "device_s": 1, "verdicts": {"x": object()}}, "not JSON-serialisable"),
    ],
)
def test_bad_fields_are_refused(tmp_path: Path, key: KeyPair, fields: dict, message: str) -> None:
    with Ledger.open(tmp_path / "l.db", key=key, create=True) as ledger:
        with pytest.raises(LedgerError, match=message.replace("[", r"\[").replace("]", r"\]")):
            ledger.append_execution(fields)
        assert ledger.count() == 0


def test_blobs_are_content_addressed_and_idempotent(tmp_path: Path, key: KeyPair) -> None:
    with Ledger.open(tmp_path / "l.db", key=key, create=True) as ledger:
        digest = ledger.put_blob(b"patch text", "patch")
        assert digest == sha256_hex(b"patch text")
        assert ledger.put_blob(b"patch text", "patch") == digest
        assert ledger.get_blob(digest) == b"patch text"
        assert ledger.get_blob("0" * 64) is None
        ledger.append_execution(execution(0), blobs={"a": (b"patch text", "patch"), "b": (b"rx", "receipts")})
        rows = list(ledger.db.query("SELECT hash, kind, size FROM blobs ORDER BY size"))
        assert rows == [
            {"hash": sha256_hex(b"rx"), "kind": "receipts", "size": 2},
            {"hash": digest, "kind": "patch", "size": 10},
        ]


def test_altered_blob_is_reported(tmp_path: Path, key: KeyPair) -> None:
    path = tmp_path / "l.db"
    with Ledger.open(path, key=key, create=True) as ledger:
        digest = ledger.put_blob(b"receipts", "receipts")
    tamper(path, "UPDATE blobs SET data = ? WHERE hash = ?", params=[(b"forged", digest)])
    with Ledger.open(path) as ledger, pytest.raises(LedgerError, match="altered"):
        ledger.get_blob(digest)


def test_a_failed_append_stores_nothing(tmp_path: Path, key: KeyPair) -> None:
    with Ledger.open(tmp_path / "l.db", key=key, create=True) as ledger:
        with pytest.raises(LedgerError):
            ledger.append_execution(execution(0), blobs={"bad": ("not bytes", "receipts")})
        assert ledger.count() == 0 and ledger.db["blobs"].count == 0
        assert ledger.append_execution(execution(0)) == 1


def test_append_only_triggers_refuse_plain_edits(ledger_path: Path) -> None:
    conn = sqlite3.connect(ledger_path)
    try:
        for sql in (
            "UPDATE executions SET status = 'crash'",
            "DELETE FROM executions",
            "UPDATE meta SET value = 'x' WHERE key = 'public_key'",
        ):
            with pytest.raises(sqlite3.IntegrityError):
                conn.execute(sql)
    finally:
        conn.close()


def test_meta(tmp_path: Path, key: KeyPair) -> None:
    with Ledger.open(tmp_path / "l.db", key=key, create=True) as ledger:
        assert ledger.get_meta("public_key") == key.public_hex == ledger.public_key
        assert ledger.get_meta("absent") is None
        ledger.set_meta("manifest_sha256", "a" * 64)
        ledger.set_meta("manifest_sha256", "b" * 64)
        assert ledger.get_meta("manifest_sha256") == "b" * 64
        with pytest.raises(LedgerError, match="cannot change"):
            ledger.set_meta("public_key", KeyPair.generate().public_hex)


def test_open_missing_without_create_errors(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match="no ledger there"):
        Ledger.open(tmp_path / "missing.db")
    assert not (tmp_path / "missing.db").exists()
    with pytest.raises(LedgerError, match="needs a signing key"):
        Ledger.open(tmp_path / "new.db", create=True)


def test_open_refuses_files_that_are_not_ledgers(tmp_path: Path, key: KeyPair) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(LedgerError, match="not a readable SQLite ledger"):
        Ledger.open(garbage)
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    for create in (False, True):
        with pytest.raises(LedgerError, match="not an InfraRSI ledger"):
            Ledger.open(other, key=key, create=create)


def test_writing_needs_the_ledgers_own_key(ledger_path: Path) -> None:
    with Ledger.open(ledger_path, key=KeyPair.generate()) as ledger:
        for write in (
            lambda: ledger.append_execution(execution(9)),
            lambda: ledger.put_blob(b"x", "x"),
            lambda: ledger.set_meta("k", "v"),
            lambda: ledger.append_baseline("b", {}),
        ):
            with pytest.raises(LedgerError, match="is not this ledger's key"):
                write()
        assert ledger.count() == 5  # reading still works
    with Ledger.open(ledger_path) as ledger, pytest.raises(LedgerError, match="read-only"):
        ledger.append_execution(execution(9))


def test_baseline_roundtrip(tmp_path: Path, key: KeyPair) -> None:
    with Ledger.open(tmp_path / "l.db", key=key, create=True) as ledger:
        assert ledger.latest_baseline() is None
        ledger.append_baseline("b1", {"runs": 3, "step_time_s": {"median": 0.1}})
        second = ledger.append_baseline("b2", {"runs": 5, "step_time_s": {"median": 0.2}})
        latest = ledger.latest_baseline()
    assert latest["id"] == second == 2
    assert (latest["batch"], latest["summary"]) == ("b2", {"runs": 5, "step_time_s": {"median": 0.2}})
    assert set(latest) == {"id", "batch", "created_at", "summary"}


@pytest.mark.parametrize(
    "attack, message",
    [
        ("UPDATE baselines SET batch = 'forged'", "signature does not verify"),
        ("UPDATE blobs SET data = X'7b7d' WHERE kind = 'baseline'", "altered"),
        ("DELETE FROM blobs WHERE kind = 'baseline'", "is missing"),
    ],
)
def test_tampered_baseline_is_detected(tmp_path: Path, key: KeyPair, attack: str, message: str) -> None:
    path = tmp_path / "l.db"
    with Ledger.open(path, key=key, create=True) as ledger:
        ledger.append_baseline("b1", {"runs": 3})
    tamper(path, attack)
    with Ledger.open(path) as ledger, pytest.raises(LedgerError, match=message):
        ledger.latest_baseline()


def test_migrations_recorded_once(tmp_path: Path, key: KeyPair) -> None:
    path = tmp_path / "l.db"
    assert SCHEMA_VERSION == 2
    with Ledger.open(path, key=key, create=True) as ledger:
        first = list(ledger.db.query("SELECT * FROM migrations"))
    assert [row["version"] for row in first] == [1, 2]
    for _ in range(2):
        with Ledger.open(path, key=key) as ledger:
            assert list(ledger.db.query("SELECT * FROM migrations")) == first
            assert ledger.get_meta("public_key") == key.public_hex


def test_a_newer_schema_is_refused(tmp_path: Path, key: KeyPair) -> None:
    path = tmp_path / "l.db"
    Ledger.open(path, key=key, create=True).close()
    tamper(path, "INSERT INTO migrations VALUES (99, '2099-01-01')")
    with pytest.raises(LedgerError, match="newer InfraRSI"):
        Ledger.open(path)


def test_key_save_and_load(tmp_path: Path, key: KeyPair) -> None:
    key.save(tmp_path / "keys")
    assert stat.S_IMODE((tmp_path / "keys" / "signing.key").stat().st_mode) == 0o600
    assert (tmp_path / "keys" / "signing.key").read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert (tmp_path / "keys" / "signing.pub").read_text().strip() == key.public_hex
    loaded = KeyPair.load(tmp_path / "keys")
    assert loaded.public_hex == key.public_hex and len(key.public_hex) == 64
    signature = loaded.sign(b"data")
    assert verify_signature(key.public_hex, b"data", signature)
    assert repr(key) == f"KeyPair(public={key.public_hex[:16]}...)"  # nothing private in logs
    with pytest.raises(LedgerError, match="no signing key"):
        KeyPair.load(tmp_path / "elsewhere")
    (tmp_path / "keys" / "signing.pub").write_text(KeyPair.generate().public_hex)
    with pytest.raises(LedgerError, match="does not belong"):
        KeyPair.load(tmp_path / "keys")


@pytest.mark.parametrize(
    "public, data, signature",
    [
        ("zz", b"data", "00"),
        ("", b"", ""),
        (None, b"data", None),
        ("00" * 32, "text", "00" * 64),
        ("a real key", b"data", "00" * 64),  # generated in the test: ids must match across xdist workers
        (123, 456, 789),
    ],
)
def test_verify_signature_never_raises(public, data, signature) -> None:
    if public == "a real key":
        public = KeyPair.generate().public_hex
    assert verify_signature(public, data, signature) is False


def test_canonical_json_shape() -> None:
    assert canonical_json({"b": 1, "a": [1.5, "é"]}) == '{"a":[1.5,"é"],"b":1}'.encode()
    with pytest.raises(ValueError):
        canonical_json({"x": float("inf")})
