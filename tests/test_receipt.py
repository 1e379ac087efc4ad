"""`verify_receipt`: signature, id and completeness, on receipts signed here."""

from __future__ import annotations

import json

import pytest

from infrarsi._policy import REQUIRED_CHECKS, required_checks
from infrarsi._receipt import verify_receipt
from infrarsi.ledger import KeyPair, canonical_json, sha256_hex


def _write(path, checks, required=REQUIRED_CHECKS, key=None):
    key = key or KeyPair.generate()
    body = {
        "checks": checks,
        "required_checks": list(required),
        "public_key": key.public_hex,
        "ab": {"baseline_s": [1.0] * 5, "candidate_s": [0.5] * 5},
    }
    path.write_text(
        json.dumps(
            {"id": sha256_hex(canonical_json(body))[:16], "receipt": body, "signature": key.sign(canonical_json(body))}
        )
    )
    return path


def _checks(**status):
    return [{"id": cid, "status": status.get(cid, "pass")} for cid in REQUIRED_CHECKS]


def test_complete_receipt_verifies(tmp_path):
    assert verify_receipt(_write(tmp_path / "r.json", _checks())).ok


def test_a_check_the_contract_did_not_require_may_be_skipped(tmp_path):
    path = _write(
        tmp_path / "r.json",
        _checks(**{"numerics.grad_norm": "skipped"}),
        required=required_checks(["loss", "precision"]),
    )
    assert verify_receipt(path).ok


@pytest.mark.parametrize("cid", ["numerics.grad_norm", "timing.clock"])
def test_a_required_check_that_did_not_pass_is_not_a_receipt(tmp_path, cid):
    path = _write(tmp_path / "r.json", _checks(**{cid: "skipped"}))
    check = verify_receipt(path)
    assert not check.ok and any(cid in p for p in check.problems)


def test_non_numerics_checks_cannot_be_made_optional(tmp_path):
    required = [c for c in REQUIRED_CHECKS if c != "timing.clock"]
    path = _write(tmp_path / "r.json", _checks(**{"timing.clock": "skipped"}), required=required)
    assert not verify_receipt(path).ok


def test_garbage_is_not_a_receipt(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("[1, 2]")
    assert not verify_receipt(path).ok
