"""Tamper evidence: each way of rewriting a ledger file is caught at the right execution."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from ledger_testing import execution, raw_rows, tamper

from infrarsi.ledger import KeyPair, Ledger, LedgerError, canonical_json, sha256_hex

ASSETS = Path(__file__).parents[1] / "assets"


def _report(path: Path, trusted: str | None = None):
    with Ledger.open(path) as ledger:
        return ledger.verify_chain(trusted)


# Columns added by later schema versions are hashed only where they hold a value, so rows
# written before they existed keep their hashes.
_LATER_COLUMNS = {"baseline_id"}


def _row_hash(row: dict) -> str:
    # Written out independently of the ledger's code: the hashing rule is a format, not an accident.
    body = {
        k: v
        for k, v in row.items()
        if k not in ("row_hash", "signature") and (k not in _LATER_COLUMNS or v is not None)
    }
    return sha256_hex(canonical_json(body))


def _insert(path: Path, row: dict) -> None:
    columns = ", ".join(row)
    tamper(
        path, f"INSERT INTO executions ({columns}) VALUES ({', '.join('?' * len(row))})", params=[tuple(row.values())]
    )


def test_an_untouched_ledger_verifies(ledger_path: Path, key: KeyPair) -> None:
    report = _report(ledger_path, key.public_hex)
    assert (report.ok, report.rows, report.first_bad) == (True, 5, None)
    assert all(_row_hash(row) == row["row_hash"] for row in raw_rows(ledger_path))


def test_empty_ledger_verifies(tmp_path: Path, key: KeyPair) -> None:
    Ledger.open(tmp_path / "l.db", key=key, create=True).close()
    assert _report(tmp_path / "l.db").ok


def test_edited_row(ledger_path: Path) -> None:
    tamper(ledger_path, "UPDATE executions SET status = 'crash' WHERE id = 3")
    report = _report(ledger_path)
    assert (report.ok, report.rows, report.first_bad) == (False, 2, 3)
    assert "row_hash" in report.detail


def test_edited_row_with_recomputed_hash(ledger_path: Path) -> None:
    row = raw_rows(ledger_path)[2]
    row["status"] = "crash"
    tamper(ledger_path, "UPDATE executions SET status = 'crash', row_hash = ? WHERE id = 3", params=[(_row_hash(row),)])
    report = _report(ledger_path)
    assert (report.ok, report.first_bad) == (False, 3)
    assert "signature" in report.detail


def test_row_inserted_in_the_middle(ledger_path: Path) -> None:
    rows = raw_rows(ledger_path)
    forged = dict(rows[1], id=3, prev_hash=rows[1]["row_hash"], detail="forged")
    forged["row_hash"] = _row_hash(forged)
    forged["signature"] = KeyPair.generate().sign(forged["row_hash"].encode())
    # Shift 3..5 up to 4..6 (via a detour, so the primary key never collides), then fill the hole.
    tamper(
        ledger_path,
        "UPDATE executions SET id = id + 100 WHERE id >= 3",
        "UPDATE executions SET id = id - 99 WHERE id >= 100",
    )
    _insert(ledger_path, forged)
    report = _report(ledger_path)
    assert (report.ok, report.rows, report.first_bad) == (False, 2, 3)


def test_row_appended_behind_the_ledgers_back(ledger_path: Path) -> None:
    last = raw_rows(ledger_path)[-1]
    forged = dict(last, id=6, prev_hash=last["row_hash"])
    forged["row_hash"] = _row_hash(forged)
    _insert(ledger_path, forged)  # the signature copied from row 5 covers another hash
    report = _report(ledger_path)
    assert (report.ok, report.rows, report.first_bad) == (False, 5, 6)


def test_reordered_rows(ledger_path: Path) -> None:
    rows = raw_rows(ledger_path)
    columns = [name for name in rows[0] if name != "id"]
    assignments = ", ".join(f"{name} = ?" for name in columns)
    tamper(
        ledger_path,
        *[f"UPDATE executions SET {assignments} WHERE id = ?"] * 2,
        params=[tuple(rows[3][c] for c in columns) + (2,), tuple(rows[1][c] for c in columns) + (4,)],
    )
    report = _report(ledger_path)
    assert (report.ok, report.rows, report.first_bad) == (False, 1, 2)


def test_deleted_middle_row(ledger_path: Path) -> None:
    tamper(ledger_path, "DELETE FROM executions WHERE id = 3")
    report = _report(ledger_path)
    assert (report.ok, report.rows, report.first_bad) == (False, 2, 3)
    assert "execution 3 is missing" in report.detail


def test_deleted_last_row(ledger_path: Path, key: KeyPair) -> None:
    tamper(ledger_path, "DELETE FROM executions WHERE id = 5")
    report = _report(ledger_path)
    assert (report.ok, report.rows, report.first_bad) == (False, 4, 5)
    assert "deleted" in report.detail
    # Nor will the ledger sign new rows over the cut.
    with Ledger.open(ledger_path, key=key) as ledger, pytest.raises(LedgerError, match="tampered"):
        ledger.append_execution(execution(9))


def test_rolled_back_head_is_caught(ledger_path: Path) -> None:
    tamper(
        ledger_path,
        "DELETE FROM executions WHERE id = 5",
        "UPDATE head SET count = 4, row_hash = (SELECT row_hash FROM executions WHERE id = 4)",
    )
    report = _report(ledger_path)
    assert (report.ok, report.first_bad) == (False, None)
    assert "head" in report.detail


def test_swapped_key(ledger_path: Path, key: KeyPair) -> None:
    impostor = KeyPair.generate()
    rows = raw_rows(ledger_path)
    statements = ["UPDATE executions SET signature = ? WHERE id = ?"] * len(rows)
    params = [(impostor.sign(row["row_hash"].encode()), row["id"]) for row in rows]
    head = canonical_json({"count": 5, "row_hash": rows[-1]["row_hash"]})
    statements += ["UPDATE meta SET value = ? WHERE key = 'public_key'", "UPDATE head SET signature = ?"]
    params += [(impostor.public_hex,), (impostor.sign(head),)]
    tamper(ledger_path, *statements, params=params)
    assert _report(ledger_path).ok  # self-consistent: only an outside key exposes it
    report = _report(ledger_path, trusted=key.public_hex)
    assert (report.ok, report.rows, report.first_bad) == (False, 0, 1)
    assert report.detail.startswith("key swapped")


def test_killed_writer_leaves_whole_rows(tmp_path: Path, key: KeyPair) -> None:
    path = tmp_path / "l.db"
    key.save(tmp_path / "keys")
    Ledger.open(path, key=key, create=True).close()
    writer = """
import os, sys
from infrarsi.ledger import KeyPair, Ledger, sha256_hex
ledger = Ledger.open(sys.argv[1], key=KeyPair.load(sys.argv[2]))
i = 0
while True:
    receipts = os.urandom(20000)
    ledger.append_execution({"status": "ok", "device_s": 1.0, "seq": i, "stderr_tail": "x" * 4000,
                             "receipts_hash": sha256_hex(receipts)}, blobs={"r": (receipts, "receipts")})
    i += 1
    if i == 1:
        print("ready", flush=True)
"""
    proc = subprocess.Popen(
        [sys.executable, "-c", writer, str(path), str(tmp_path / "keys")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        time.sleep(0.5)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    with Ledger.open(path, key=key) as ledger:
        report = ledger.verify_chain(key.public_hex)
        assert report.ok, report.detail
        assert report.rows == ledger.count() > 0
        # Each row's evidence committed with it, in the same transaction.
        assert all(ledger.get_blob(row["receipts_hash"]) for row in ledger.executions())
        ledger.append_execution(execution(0))  # and the chain carries on
        assert ledger.verify_chain().ok


def test_concurrent_writers_take_turns(tmp_path: Path, key: KeyPair) -> None:
    # A search and a notebook may append to one ledger at once: the chain must not fork.
    path = tmp_path / "l.db"
    key.save(tmp_path / "keys")
    Ledger.open(path, key=key, create=True).close()
    writer = """
import sys
from infrarsi.ledger import KeyPair, Ledger
with Ledger.open(sys.argv[1], key=KeyPair.load(sys.argv[2])) as ledger:
    for i in range(25):
        ledger.append_execution({"status": "ok", "device_s": 1.0, "batch": sys.argv[3], "seq": i})
"""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", writer, str(path), str(tmp_path / "keys"), name], stderr=subprocess.PIPE, text=True
        )
        for name in ("a", "b")
    ]
    for proc in procs:
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    with Ledger.open(path) as ledger:
        report = ledger.verify_chain(key.public_hex)
        assert (report.ok, report.rows) == (True, 50), report.detail
        assert [r["seq"] for r in ledger.executions(batch="a")] == list(range(25))


def test_ledger_from_schema_v1_still_verifies(tmp_path: Path) -> None:
    # Written by schema version 1 and kept as is: any change to the hashing rule, the
    # signing or a migration that breaks old ledgers fails here.
    meta = json.loads((ASSETS / "ledger_v1.json").read_text())
    copy = tmp_path / "old.db"
    copy.write_bytes((ASSETS / "ledger_v1.sqlite").read_bytes())
    with Ledger.open(copy) as ledger:
        report = ledger.verify_chain(meta["public_key"])
        assert (report.ok, report.rows) == (True, meta["executions"]), report.detail
        assert ledger.latest_baseline()["summary"] == meta["baseline_summary"]


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def shared_ledger(tmp_path_factory: pytest.TempPathFactory):
    key = KeyPair.generate()
    with Ledger.open(tmp_path_factory.mktemp("hyp") / "l.db", key=key, create=True) as ledger:
        yield ledger


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knobs=st.dictionaries(st.text(max_size=10), _json, max_size=6))
def test_knob_hashing_is_stable(shared_ledger: Ledger, knobs: dict) -> None:
    shuffled = dict(reversed(list(knobs.items())))
    assert canonical_json(shuffled) == canonical_json(knobs)
    assert canonical_json(json.loads(canonical_json(knobs))) == canonical_json(knobs)
    execution_id = shared_ledger.append_execution(execution(1, knobs=shuffled))
    row = shared_ledger.get_execution(execution_id)
    assert canonical_json(row["knobs"]) == canonical_json(knobs)
    stored = next(r for r in shared_ledger.db.query("SELECT * FROM executions WHERE id = ?", [execution_id]))
    assert _row_hash(stored) == stored["row_hash"]
