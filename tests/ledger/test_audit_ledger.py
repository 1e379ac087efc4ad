"""`infrarsi audit`: a real TinyGPT ledger written by `baseline` and `verify`, re-judged and tampered with."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ledger_testing import raw_rows, tamper

import infrarsi
from infrarsi import init
from infrarsi._audit._reaudit import audit_ledger
from infrarsi.ledger import KeyPair, canonical_json

# Alone, never beside another test: its ledgers hold accepted verifies (an A/B).
pytestmark = pytest.mark.serial

TINYGPT = Path(__file__).parents[2] / "examples" / "tinygpt"
CHEATS = Path(__file__).parents[1] / "cheats"
ASSETS = Path(__file__).parents[1] / "assets"


@pytest.fixture(scope="module")
def verified(tmp_path_factory) -> Path:
    """A workspace whose ledger holds 2 baseline runs, the baseline's reference run, and one honest,
    accepted-by-every-run-check verify (execution 4)."""
    folder = tmp_path_factory.mktemp("audit") / "tinygpt"
    shutil.copytree(TINYGPT, folder, ignore=shutil.ignore_patterns(".infrarsi", "__pycache__"))
    contract = folder / "infrarsi.toml"
    contract.write_text(
        contract.read_text()
        .replace("warmup_steps  = 5", "warmup_steps  = 2")
        .replace("measure_steps = 15", "measure_steps = 8")
    )
    init(contract)
    infrarsi.baseline(contract, runs=2)
    outcome = infrarsi.verify(contract, sets={"attention": "sdpa"}, patches=["batched-heads"], pairs=0)
    assert all(c.passed for c in outcome.checks if c.id != "stats.speedup"), [c.to_json() for c in outcome.checks]
    return folder


@pytest.fixture
def copy(verified, tmp_path) -> Path:
    """A private copy of the verified workspace's state, to tamper with."""
    state = tmp_path / "ws" / ".infrarsi"
    shutil.copytree(verified / ".infrarsi", state)
    return state / "ledger.db"


def _cli(*args):
    proc = subprocess.run(
        [sys.executable, "-m", "infrarsi.cli", "audit", *args], capture_output=True, text=True, timeout=300
    )
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.startswith("{") else proc.stdout, proc.stderr


def test_a_ledger_written_by_verify_audits_clean(verified):
    rc, out, err = _cli(str(verified / ".infrarsi" / "ledger.db"), "--json")
    assert rc == 0, (out, err)
    assert out["chain_ok"] is True and out["findings"] == [] and out["changed"] == []
    assert out["executions"] == 4 and out["previously_accepted"] == 1 and out["now_rejected"] == 0
    assert out["trusted_key"], "the manifest beside the ledger supplies the trusted key"
    checks = out["by_check"]
    assert {"numerics.loss", "timing.clock", "audit.timing_boundary", "scope.editable"} <= set(checks)
    assert all(set(counts) == {"pass"} for counts in checks.values()), checks
    assert out["incomplete_batches"] == [], "a --pairs 0 verify planned one run and ran it"


def test_a_verify_killed_before_its_pairs_end_shows_as_incomplete(verified, tmp_path):
    """SIGKILL of `verify` after its candidate run: the batch's plan (in the chained evidence)
    says more runs were due, so the audit names it as a verify that decided nothing."""
    folder = tmp_path / "tinygpt"
    shutil.copytree(verified, folder)
    db = folder / ".infrarsi" / "ledger.db"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "infrarsi.cli",
            "verify",
            "--contract",
            str(folder / "infrarsi.toml"),
            "--set",
            "attention=sdpa",
            "--patch",
            "batched-heads",
            "--pairs",
            "1",
            "--max-pairs",
            "2",
            "--json",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                if conn.execute("SELECT COUNT(*) FROM executions").fetchone()[0] > 4:
                    break
            time.sleep(0.1)
        assert proc.poll() is None, ("verify ended before it could be cut", proc.stderr.read())
        proc.kill()
    finally:
        proc.kill()
        proc.wait()
    rc, out, err = _cli(str(db), "--json")
    assert rc == 0 and out["chain_ok"], (out, err)
    [cut] = out["incomplete_batches"]
    assert cut["planned"] == 5 and 1 <= cut["runs"] < 5, cut  # 1 + 2 x the most pairs
    rc, text, _ = _cli(str(db))
    assert f"stopped after {cut['runs']} of 5 planned runs" in text


def test_a_tighter_contract_rejects_the_stored_acceptance_by_numerics_only(verified):
    stricter = verified / "stricter.toml"
    text = (verified / "infrarsi.toml").read_text()
    assert "loss_rtol      = 1e-3" in text
    stricter.write_text(text.replace("loss_rtol      = 1e-3", "loss_rtol      = 1e-12"))
    report = audit_ledger(verified / ".infrarsi" / "ledger.db", contract_path=stricter)
    assert report.chain_ok and report.previously_accepted == 1
    assert (report.now_rejected, report.rejected_only_by_numerics) == (1, 1)
    verify_row = max(f["execution"] for f in report.findings)
    assert {f["check"] for f in report.findings if f["execution"] == verify_row} == {"numerics.loss"}
    assert any(c["check"] == "numerics.loss" and c["was"] == "pass" and c["now"] == "fail" for c in report.changed)


@pytest.fixture(scope="module")
def with_cheat(verified, tmp_path_factory) -> tuple[Path, int]:
    """The verified workspace plus a cheat the audit rejected before running."""
    folder = tmp_path_factory.mktemp("cheat") / "ws"
    shutil.copytree(verified, folder)
    outcome = infrarsi.verify(folder / "infrarsi.toml", patches=[str(CHEATS / "cheat" / "slow-clock.diff")], pairs=0)
    assert not outcome.accepted
    return folder, outcome.executions[-1]


def test_a_rejection_confirmed_today_is_no_finding(with_cheat):
    folder, cheat = with_cheat
    report = audit_ledger(folder / ".infrarsi" / "ledger.db")
    assert report.clean and report.still_rejected == 1 and report.now_rejected == 0
    assert report.by_check["audit.clock_patched"]["fail"] == 1


def test_a_win_stored_under_older_rules_is_rejudged_and_rejected(with_cheat, tmp_path):
    """The same cheat, stored as accepted by an older rule version: today's audit finds it."""
    from infrarsi.ledger import Ledger

    folder = tmp_path / "ws"
    shutil.copytree(with_cheat[0], folder)
    state = folder / ".infrarsi"
    with Ledger.open(state / "ledger.db", key=KeyPair.load(state / "keys")) as ledger:
        row = ledger.get_execution(with_cheat[1])
        forged = {
            k: row[k]
            for k in (
                "batch",
                "kind",
                "seq",
                "contract_hash",
                "manifest_hash",
                "knobs",
                "patches",
                "sources",
                "baseline_id",
            )
        }
        passing = [dict(v, status="pass") for v in row["verdicts"]]
        source = ledger.get_execution(4)  # the honest verify row: a real run's receipts and clock stamps
        forged.update(
            status="ok",
            detail="",
            verdicts=passing,
            rule_version="verifiers-1+auditors-0",
            receipts_hash=source["receipts_hash"],
            evidence_hash=source["evidence_hash"],
            device_s=1.0,
        )
        execution = ledger.append_execution(forged)
    report = audit_ledger(state / "ledger.db")
    assert report.chain_ok and report.now_rejected == 1
    assert [f["check"] for f in report.findings if f["execution"] == execution] == ["audit.clock_patched"]
    assert any(
        c["execution"] == execution
        and c["check"] == "audit.clock_patched"
        and c["was"] == "pass"
        and c["stored_rule_version"] == "verifiers-1+auditors-0"
        for c in report.changed
    )


def test_stored_source_verdicts_of_todays_rules_are_reused_and_agree_with_a_rejudgement(verified):
    ledger = verified / ".infrarsi" / "ledger.db"
    reused, fresh = audit_ledger(ledger), audit_ledger(ledger, reuse=False)
    assert reused.reused >= 1 and fresh.reused == 0 and fresh.rejudged >= 1
    assert reused.by_check == fresh.by_check and reused.findings == fresh.findings == []


def _rewrite(path: Path, execution_id: int, **values) -> None:
    sets = ", ".join(f"{k} = ?" for k in values)
    tamper(path, f"UPDATE executions SET {sets} WHERE id = ?", params=[(*values.values(), execution_id)])


def _chain(path: Path):
    report = audit_ledger(path)
    return report.chain_ok, report.first_bad, " | ".join(report.chain)


def test_an_edited_row_is_caught_at_that_row(copy):
    _rewrite(copy, 3, step_time_s=0.001)
    ok, first_bad, detail = _chain(copy)
    assert (ok, first_bad) == (False, 3) and "execution 3" in detail


def test_an_inserted_row_is_caught(copy):
    rows = raw_rows(copy)
    forged = dict(rows[1], id=len(rows) + 1, detail="forged")
    tamper(
        copy,
        f"INSERT INTO executions ({', '.join(forged)}) VALUES ({', '.join('?' * len(forged))})",
        params=[tuple(forged.values())],
    )
    ok, first_bad, _ = _chain(copy)
    assert (ok, first_bad) == (False, len(rows) + 1)


def test_reordered_rows_are_caught(copy):
    rows = raw_rows(copy)
    columns = [c for c in rows[0] if c != "id"]
    sets = ", ".join(f"{c} = ?" for c in columns)
    tamper(
        copy,
        *[f"UPDATE executions SET {sets} WHERE id = ?"] * 2,
        params=[tuple(rows[2][c] for c in columns) + (2,), tuple(rows[1][c] for c in columns) + (3,)],
    )
    ok, first_bad, _ = _chain(copy)
    assert (ok, first_bad) == (False, 2)


def test_a_deleted_row_is_caught(copy):
    tamper(copy, "DELETE FROM executions WHERE id = 2")
    ok, first_bad, detail = _chain(copy)
    assert (ok, first_bad) == (False, 2) and "missing" in detail


def test_a_changed_blob_is_caught(copy):
    digest = raw_rows(copy)[2]["receipts_hash"]
    tamper(copy, "UPDATE blobs SET data = ? WHERE hash = ?", params=[(b'{"type": "step"}\n', digest)])
    ok, _, detail = _chain(copy)
    assert not ok and f"blob {digest[:16]}" in detail
    rc, out, _ = _cli(str(copy), "--json")
    assert rc == 1 and out["chain_ok"] is False


def test_a_swapped_key_is_caught_by_the_manifest_beside_the_ledger(copy):
    impostor = KeyPair.generate()
    rows = raw_rows(copy)
    statements = ["UPDATE executions SET signature = ? WHERE id = ?"] * len(rows)
    params = [(impostor.sign(row["row_hash"].encode()), row["id"]) for row in rows]
    head = canonical_json({"count": len(rows), "row_hash": rows[-1]["row_hash"]})
    statements += ["UPDATE meta SET value = ? WHERE key = 'public_key'", "UPDATE head SET signature = ?"]
    params += [(impostor.public_hex,), (impostor.sign(head),)]
    tamper(copy, *statements, params=params)
    ok, first_bad, detail = _chain(copy)
    assert not ok and "key swapped" in detail


def test_a_missing_blob_is_a_finding_not_a_pass(copy):
    digest = raw_rows(copy)[3]["receipts_hash"]
    tamper(copy, "DELETE FROM blobs WHERE hash = ?", params=[(digest,)])
    report = audit_ledger(copy)
    assert report.chain_ok  # the rows are intact; their evidence is not
    missing = {f["check"]: f for f in report.findings if f["execution"] == 4}
    assert (
        missing["numerics.loss"]["status"] == "unchecked" and "not in the ledger" in missing["numerics.loss"]["detail"]
    )
    assert report.now_rejected == 1 and report.rejected_only_by_numerics == 0


def test_the_first_schema_version_migrates_and_audits(tmp_path):
    meta = json.loads((ASSETS / "ledger_v1.json").read_text())
    old = tmp_path / "old.db"
    old.write_bytes((ASSETS / "ledger_v1.sqlite").read_bytes())
    rc, out, err = _cli(str(old), "--json", "--key", meta["public_key"])
    # The synthetic rows name a manifest the file never stored (no `init` wrote it): the only
    # chain finding; the hash chain, signatures and migration hold.
    assert out["chain"] and all("which is not in the ledger" in line for line in out["chain"]), out["chain"]
    assert out["executions"] == meta["executions"]
    # Its synthetic rows hold no stored contract: every judged check says what is missing.
    assert all(f["status"] == "unchecked" for f in out["findings"]) and rc == 1
    versions = [v for (v,) in sqlite3.connect(old).execute("SELECT version FROM migrations ORDER BY version")]
    assert versions == [1, 2]


def test_bad_input_exits_2(tmp_path):
    rc, out, err = _cli(str(tmp_path / "nope.db"))
    assert rc == 2 and "no ledger there" in err and "Traceback" not in err
    (tmp_path / "junk.db").write_text("not sqlite at all")
    rc, out, err = _cli(str(tmp_path / "junk.db"), "--json")
    assert rc == 2 and "Traceback" not in err and out["exit_code"] == 2


def test_an_altered_manifest_beside_the_ledger_breaks_the_chain(copy):
    manifest = copy.parent / "manifest.json"
    data = json.loads(manifest.read_text())
    data["manifest"]["public_key"] = KeyPair.generate().public_hex
    manifest.write_text(json.dumps(data))
    ok, _, detail = _chain(copy)
    assert not ok and "manifest" in detail
