"""Contract revisions (`infrarsi init --update`): a changed contract is pinned as the next manifest
in the same ledger, signed by the same key; the stored baseline stays the reference unless the
change alters what it measured; `audit` judges every execution by the contract it ran under."""

from __future__ import annotations

import json

from cli_testing import edit_contract, executions, ledger_state

from infrarsi._manifest import load_manifest
from infrarsi.ledger import Ledger


def test_a_revision_that_keeps_the_baseline_reuses_ledger_key_and_baseline(cli, baselined):
    root = baselined
    public = (root / ".infrarsi" / "keys" / "signing.pub").read_text()
    first = load_manifest(root / ".infrarsi" / "manifest.json")
    rows_before = ledger_state(root).rows
    edit_contract(root, "[numerics]\n", "[numerics]\nloss_rtol = 0.002\n")
    edit_contract(root, '[[patches]]\nname = "broken"', '[search]\nab_pairs = 3\n\n[[patches]]\nname = "broken"')

    refused = cli("verify", "--patch", "faster", "--pairs", "0")
    assert refused.rc == 2 and "infrarsi init --update" in refused.stderr, refused

    done = cli("init", "--update", "--json")
    assert done.rc == 0, done
    rev = done.json()["revision"]
    assert rev["number"] == 2 and rev["previous"] == first.sha256 and rev["baseline"] == "kept"
    assert "[numerics] loss_rtol: 0.001 -> 0.002" in rev["changes"]
    assert "[search] ab_pairs: 5 -> 3" in rev["changes"]
    second = load_manifest(root / ".infrarsi" / "manifest.json")
    assert second.sha256 == rev["manifest_sha256"] and second.previous == first.sha256
    assert second.public_key == first.public_key == public.strip()
    assert (root / ".infrarsi" / "keys" / "signing.pub").read_text() == public
    assert ledger_state(root).rows == rows_before  # nothing recorded is lost

    verified = cli("verify", "--patch", "faster", "--pairs", "0", "--json")
    assert verified.rc in (0, 1) and verified.json()["checks"], verified
    rows = executions(root)
    assert rows[0]["manifest_hash"] == first.sha256 and rows[-1]["manifest_hash"] == second.sha256
    assert rows[0]["contract_hash"] != rows[-1]["contract_hash"]

    audit = cli("audit", ".infrarsi/ledger.db", "--json")
    out = audit.json()
    assert out["chain_ok"], out
    assert audit.rc == 0, audit

    again = cli("init", "--update")
    assert again.rc == 0 and "unchanged" in again.stdout
    same = cli("init", "--update", "--json").json()["revision"]
    assert not same["changed"] and same["number"] == 2 and same["manifest_sha256"] == second.sha256


def test_a_revision_that_changes_what_the_baseline_measured_requires_a_new_one(cli, baselined):
    root = baselined
    edit_contract(
        root,
        '[knobs.speed]\nenv = "TOY_SPEED"\nchoices = ["normal", "fast"]\nbaseline = "normal"',
        '[knobs.speed]\nenv = "TOY_SPEED"\nchoices = ["normal", "fast"]\nbaseline = "fast"',
    )
    done = cli("init", "--update", "--json")
    assert done.rc == 0, done
    rev = done.json()["revision"]
    assert rev["baseline"] == "required"
    assert any("knob environment" in reason and "fast" in reason for reason in rev["baseline_required"]), rev
    human = cli("verify", "--pairs", "0")
    assert human.rc == 2, human
    assert "contract revision 2 changed what the stored baseline measured" in human.stderr
    assert "infrarsi baseline" in human.stderr and "Traceback" not in human.stderr

    assert cli("baseline", "--runs", "1").rc == 0
    after = cli("verify", "--set", "speed=normal", "--pairs", "0", "--json")
    assert after.rc in (0, 1) and after.json()["checks"], after
    assert cli("audit", ".infrarsi/ledger.db").rc == 0


def test_a_new_knob_that_launches_what_already_ran_keeps_the_baseline(cli, baselined):
    root = baselined
    (root / "infrarsi.toml").write_text(
        (root / "infrarsi.toml").read_text()
        + '\n[knobs.fused]\nswitch = "--fused"\nchoices = ["off", "on"]\nbaseline = "off"\n'
    )
    rev = cli("init", "--update", "--json").json()["revision"]
    assert rev["baseline"] == "kept" and "knob fused added" in rev["changes"]
    # One that adds an argument to the original setup's command line cannot keep it.
    edit_contract(root, 'baseline = "off"', 'baseline = "on"')
    rev = cli("init", "--update", "--json").json()["revision"]
    assert rev["number"] == 3 and rev["baseline"] == "required"
    assert any("--fused" in reason for reason in rev["baseline_required"])


def test_a_changed_protected_file_requires_a_new_baseline(cli, baselined):
    root = baselined
    (root / "data" / "protected.txt").write_text("other data\n")
    rev = cli("init", "--update", "--json").json()["revision"]
    assert rev["baseline_required"] == ["protected file data/protected.txt changed"]


def test_audit_sees_a_revision_signed_by_another_key_and_executions_under_an_unknown_manifest(cli, baselined):
    root = baselined
    edit_contract(root, "[numerics]\n", "[numerics]\nloss_rtol = 0.002\n")
    assert cli("init", "--update").rc == 0
    state = root / ".infrarsi"
    from infrarsi._manifest import build_manifest
    from infrarsi.contract import load_contract
    from infrarsi.ledger import KeyPair

    forged = build_manifest(load_contract(root / "infrarsi.toml"), KeyPair.generate())
    with Ledger.open(state / "ledger.db", key=KeyPair.load(state / "keys")) as ledger:
        ledger.put_blob(forged.to_json().encode(), "manifest")
    out = cli("audit", ".infrarsi/ledger.db", "--json")
    assert out.rc == 1
    assert any("signed by another key" in line for line in out.json()["chain"]), out.json()["chain"]


def test_update_and_force_together_or_before_init_are_usage_errors(cli, toyjob):
    before = cli("init", "--update")
    assert before.rc == 2 and "run `infrarsi init` first" in before.stderr
    assert cli("init").rc == 0
    both = cli("init", "--update", "--force")
    assert both.rc == 2 and "choose one" in both.stderr
    assert json.loads((toyjob / ".infrarsi" / "manifest.json").read_text())["manifest"]["revision"] == 1


def test_audit_sees_a_revision_taken_out_of_the_ledger(cli, baselined):
    import sqlite3

    root = baselined
    edit_contract(root, "[numerics]\n", "[numerics]\nloss_rtol = 0.002\n")
    assert cli("init", "--update").rc == 0
    assert cli("verify", "--patch", "faster", "--pairs", "0").rc in (0, 1)
    revised = load_manifest(root / ".infrarsi" / "manifest.json")
    db = sqlite3.connect(root / ".infrarsi" / "ledger.db")
    with db:
        db.execute("DROP TRIGGER blobs_no_delete")  # what an attacker can do; the audit must still see it
        rows = db.execute("SELECT rowid, hash FROM blobs WHERE kind = 'manifest' ORDER BY rowid").fetchall()
        db.execute("DELETE FROM blobs WHERE rowid = ?", [rows[-1][0]])
    db.close()
    assert len(rows) == 2  # the first manifest and the revision; the revision's is gone now
    out = cli("audit", ".infrarsi/ledger.db", "--json")
    assert out.rc == 1
    assert any(
        f"executions ran under manifest {revised.sha256[:16]}..., which is not in the ledger" in line
        for line in out.json()["chain"]
    ), out.json()["chain"]
