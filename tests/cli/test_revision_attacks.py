"""Adversarial tests of contract revisions (`infrarsi init --update`).

Each test states the secure behaviour; one that fails shows a hole in today's code (see the
docstrings). The toy workspace is the one of tests/cli/test_revisions.py.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3

import pytest
from cli_testing import edit_contract

from infrarsi._manifest import build_manifest, load_manifest
from infrarsi.contract import load_contract
from infrarsi.ledger import KeyPair, Ledger


def _raw_db(root) -> sqlite3.Connection:
    return sqlite3.connect(root / ".infrarsi" / "ledger.db")


def _insert_raw_blob(root, data: bytes, kind: str) -> str:
    """What anyone who can write the file can do, without the signing key: blobs are content-addressed."""
    digest = hashlib.sha256(data).hexdigest()
    db = _raw_db(root)
    with db:
        db.execute("INSERT INTO blobs (hash, kind, size, data) VALUES (?, ?, ?, ?)", [digest, kind, len(data), data])
    db.close()
    return digest


def _no_traceback(done) -> None:
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


# -- 1. edits that change what the baseline measured but are classified "kept" -------------------


def test_unpin_edit_repin_of_a_protected_file_must_not_keep_the_baseline(cli, baselined):
    """HOLE. The baseline ran with data/protected.txt pinned at one content. Unpinning it is
    "kept" ("no longer protected"), editing it then is invisible, and pinning it again is "kept"
    ("newly pinned"): every revision says the baseline stands, although a file pinned when the
    baseline ran and pinned now differs. classify() only compares consecutive revisions, and
    check_baseline_current() only ORs their flags."""
    root = baselined
    edit_contract(root, 'protected = ["data/**"]', "protected = []")
    first = cli("init", "--update", "--json").json()["revision"]
    assert first["baseline"] == "kept"  # by the letter of the rule: not pinned after
    (root / "data" / "protected.txt").write_text("completely different training data\n")
    edit_contract(root, "protected = []", 'protected = ["data/**"]')
    second = cli("init", "--update", "--json")
    assert second.rc == 0, second

    refused = cli("verify", "--pairs", "0")
    _no_traceback(refused)
    assert refused.rc == 2 and "infrarsi baseline" in refused.stderr, (second.json()["revision"], refused)


def test_unpin_and_edit_in_one_revision_must_not_keep_the_baseline(cli, baselined):
    """HOLE (the one-step form). Taking a file out of [scope] protected and changing it in the same
    edit is classified "kept", so verify judges against a baseline that read other data."""
    root = baselined
    edit_contract(root, 'protected = ["data/**"]', "protected = []")
    (root / "data" / "protected.txt").write_text("completely different training data\n")
    rev = cli("init", "--update", "--json").json()["revision"]
    assert rev["baseline"] == "required", rev


def test_search_resume_must_not_use_a_baseline_a_revision_made_stale(cli, baselined, monkeypatch):
    """HOLE. search checks the LATEST baseline against the revision chain, then `--resume` swaps in
    the baseline the interrupted search started with (meta["baseline_id"]) without checking it.
    Here that baseline ran at speed=normal and the contract's original setup is now speed=fast."""
    root = baselined
    state = root / ".infrarsi"
    with Ledger.open(state / "ledger.db", key=KeyPair.load(state / "keys")) as ledger:
        old_id = ledger.latest_baseline()["id"]
        # What `infrarsi search` writes before its first execution, left unfinished (^C, a crash).
        meta = {"id": "interrupted1", "seed": 0, "budget": 40, "pack": None, "finished": False, "baseline_id": old_id}
        ledger.set_meta("search:current", json.dumps(meta, sort_keys=True))
    edit_contract(
        root,
        '[knobs.speed]\nenv = "TOY_SPEED"\nchoices = ["normal", "fast"]\nbaseline = "normal"',
        '[knobs.speed]\nenv = "TOY_SPEED"\nchoices = ["normal", "fast"]\nbaseline = "fast"',
    )
    assert cli("init", "--update", "--json").json()["revision"]["baseline"] == "required"
    assert cli("baseline", "--runs", "1").rc == 0  # a new baseline: the latest is current now

    from infrarsi._search import _engine
    from infrarsi.errors import UsageError

    used = {}

    def fake_run(session, *args, **kwargs):
        used["baseline_id"] = session.stored["id"] if hasattr(session, "stored") else None
        return "ran"

    monkeypatch.setattr(_engine, "_run", fake_run)
    monkeypatch.chdir(root)
    with pytest.raises(UsageError):
        _engine.search(root / "infrarsi.toml", resume=True)


# -- 2. tampering the audit must see, and crashes instead of clean errors ------------------------


def test_audit_must_recheck_a_signed_revision_that_lies_about_the_baseline(cli, baselined):
    """HOLE. The workspace owner holds the signing key, so a revision can be signed with
    baseline_required = [] although it moved the original setup to speed=fast; verify then
    accepts the stale baseline and `audit` reports a clean chain: it trusts each manifest's own
    classification instead of re-running classify() on the stored contracts and file hashes."""
    root = baselined
    state = root / ".infrarsi"
    edit_contract(
        root,
        '[knobs.speed]\nenv = "TOY_SPEED"\nchoices = ["normal", "fast"]\nbaseline = "normal"',
        '[knobs.speed]\nenv = "TOY_SPEED"\nchoices = ["normal", "fast"]\nbaseline = "fast"',
    )
    key = KeyPair.load(state / "keys")
    contract = load_contract(root / "infrarsi.toml")
    current = load_manifest(state / "manifest.json")
    lie = build_manifest(contract, key, current, ["knob speed changed"], [])
    with Ledger.open(state / "ledger.db", key=key) as ledger:
        ledger.put_blob(contract.text.encode(), "contract")
        ledger.put_blob(lie.to_json().encode(), "manifest")
        ledger.set_meta("manifest_sha256", lie.sha256)
        ledger.set_meta("contract_sha256", contract.sha256)
    (state / "manifest.json").write_text(lie.to_json())
    # verify compares the baseline's own contract with today's, not the flags a signer wrote.
    ran = cli("verify", "--pairs", "0", "--json")
    assert ran.rc == 2 and "changed what the stored baseline measured" in ran.stderr, ran

    audit = cli("audit", ".infrarsi/ledger.db", "--json")
    _no_traceback(audit)
    out = audit.json()
    assert audit.rc == 1 and not out["chain_ok"], out["chain"]
    assert any("says the stored baseline still measures the job" in line for line in out["chain"]), out["chain"]


def test_audit_must_see_every_manifest_taken_out_of_the_ledger(cli, baselined):
    """HOLE. _check_revisions() skips the "executions ran under a manifest not in the ledger" test
    when the ledger has no manifest at all, so deleting EVERY manifest blob (instead of one)
    hides the whole revision chain, although the executions name their manifests."""
    root = baselined
    edit_contract(root, "[numerics]\n", "[numerics]\nloss_rtol = 0.002\n")
    assert cli("init", "--update").rc == 0
    assert cli("verify", "--pairs", "0").rc in (0, 1)
    db = _raw_db(root)
    with db:
        db.execute("DROP TRIGGER blobs_no_delete")
        db.execute("DELETE FROM blobs WHERE kind = 'manifest'")
    db.close()
    audit = cli("audit", ".infrarsi/ledger.db", "--json")
    _no_traceback(audit)
    out = audit.json()
    assert audit.rc == 1 and not out["chain_ok"], out["chain"]


def test_audit_must_see_the_current_revision_taken_out_of_the_ledger(cli, baselined):
    """HOLE (detection only). The newest revision, before anything ran under it, can be deleted
    from the ledger: nothing follows it and no execution names it, so the audit is clean although
    the ledger's own meta manifest_sha256 and manifest.json beside it name a manifest it lacks."""
    root = baselined
    edit_contract(
        root,
        '[knobs.speed]\nenv = "TOY_SPEED"\nchoices = ["normal", "fast"]\nbaseline = "normal"',
        '[knobs.speed]\nenv = "TOY_SPEED"\nchoices = ["normal", "fast"]\nbaseline = "fast"',
    )
    rev = cli("init", "--update", "--json").json()["revision"]
    db = _raw_db(root)
    with db:
        db.execute("DROP TRIGGER blobs_no_delete")
        db.execute(
            "DELETE FROM blobs WHERE hash IN "
            "(SELECT hash FROM blobs WHERE kind = 'manifest' ORDER BY rowid DESC LIMIT 1)"
        )
        (meta,) = db.execute("SELECT value FROM meta WHERE key = 'manifest_sha256'").fetchone()
    db.close()
    assert meta == rev["manifest_sha256"]
    audit = cli("audit", ".infrarsi/ledger.db", "--json")
    _no_traceback(audit)
    assert audit.rc == 1 and not audit.json()["chain_ok"], audit.json()["chain"]


@pytest.mark.parametrize(
    "blob",
    [
        pytest.param(b"[" * 100_000, id="deeply-nested"),
        pytest.param(b'{"manifest": {"public_key": "00", "x": NaN}, "signature": "00"}', id="nan"),
        pytest.param(b'{"manifest": {"public_key": "00", "\\ud800": 1}, "signature": "00"}', id="lone-surrogate"),
    ],
)
def test_a_malformed_manifest_blob_is_reported_not_a_crash(cli, baselined, blob):
    """HOLE. parse_manifest() catches ValueError/KeyError/TypeError around json.loads, but not a
    RecursionError, and canonical_json() in verifies() (outside the try) raises ValueError on NaN
    and UnicodeEncodeError on a lone surrogate. One such blob, inserted without any key, makes
    verify (check_baseline_current -> manifests_in) and audit die with a traceback."""
    root = baselined
    _insert_raw_blob(root, blob, "manifest")
    ran = cli("verify", "--pairs", "0")
    audit = cli("audit", ".infrarsi/ledger.db", "--json")
    crashed = [name for name, done in (("verify", ran), ("audit", audit)) if "Traceback" in done.stderr]
    assert not crashed, (crashed, ran.stderr[-600:], audit.stderr[-600:])
    assert ran.rc in (0, 1, 2), ran
    assert audit.rc == 1 and not audit.json()["chain_ok"], audit


@pytest.mark.parametrize("verb", ["verify", "init", "audit"])
def test_a_manifest_json_with_nan_is_a_clean_error(cli, baselined, verb):
    """HOLE. manifest.json beside the ledger with a NaN anywhere in its body: load_manifest()
    lets canonical_json()'s ValueError escape, so init --update / verify / audit crash with a
    traceback instead of exit 2 (or, for audit, a finding)."""
    root = baselined
    path = root / ".infrarsi" / "manifest.json"
    data = json.loads(path.read_text())
    text = json.dumps(data).replace('"revision": 1', '"revision": NaN')
    assert "NaN" in text
    path.write_text(text)
    args = {
        "verify": ("verify", "--pairs", "0"),
        "init": ("init", "--update"),
        "audit": ("audit", ".infrarsi/ledger.db"),
    }
    done = cli(*args[verb])
    _no_traceback(done)
    assert done.rc in ((1, 2) if verb == "audit" else (2,)), done


# -- what held: probes that pass today -------------------------------------------------------


def test_a_foreign_key_revision_following_the_current_one_is_not_followed_or_trusted(cli, baselined):
    """Holds. A manifest signed by another key, claiming to follow the current one with
    baseline_required = [], is reported by audit; verify never walks it (it starts from the
    workspace-key manifest.json and follows signed `previous` links only)."""
    root = baselined
    state = root / ".infrarsi"
    current = load_manifest(state / "manifest.json")
    forged = build_manifest(load_contract(root / "infrarsi.toml"), KeyPair.generate(), current, [], [])
    _insert_raw_blob(root, forged.to_json().encode(), "manifest")
    assert cli("verify", "--pairs", "0").rc in (0, 1)
    audit = cli("audit", ".infrarsi/ledger.db", "--json")
    assert audit.rc == 1 and any("another key" in line for line in audit.json()["chain"])


def test_a_knob_flag_renamed_or_reordered_at_the_same_baseline_value_requires_a_baseline(cli, baselined):
    """Holds. Renaming a knob's flag, moving a knob, or moving a baseline argument from a knob into
    [task] command all change the original setup's argv and are flagged (or are the same launch)."""
    root = baselined
    edit_contract(root, 'flag = "--mode"', 'flag = "--mode"\nform = "equals"')
    rev = cli("init", "--update", "--json").json()["revision"]
    assert rev["baseline"] == "required"
    assert cli("baseline", "--runs", "1").rc == 0
    # The same launch written differently: the knob's baseline argument moved into the command.
    text = (root / "infrarsi.toml").read_text()
    text = text.replace('command = ["python", "train.py"]', 'command = ["python", "train.py", "--mode=ok"]')
    text = text.replace(
        'flag = "--mode"\nform = "equals"',
        'set = { ok = {}, crash = { args = ["--mode=crash"] }, '
        "hang = {}, child-hang = {}, child-oom = {}, oom = {}, cuda-oom = {}, "
        "cuda-oom-caught = {}, tamper = {}, tamper-framework = {} }",
    )
    (root / "infrarsi.toml").write_text(text)
    rev = cli("init", "--update", "--json")
    assert rev.rc == 0, rev
    assert rev.json()["revision"]["baseline"] == "kept", rev.json()
