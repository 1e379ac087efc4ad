"""Receipts: the signed record of an accepted candidate, and checking one later."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from infrarsi.signing import canonical_json, sha256_hex, verify_signature

__all__ = ["write_receipt", "verify_receipt", "check_receipt", "ledger_receipts", "ReceiptCheck", "RECEIPT_VERSION"]

RECEIPT_VERSION = 1


def _looks(checks) -> dict:
    """The sequential A/B's plan and looks, from the ``stats.speedup`` check's evidence."""
    evidence = next((c.evidence for c in checks if c.id == "stats.speedup"), None) or {}
    return {key: evidence[key] for key in ("sequential", "looks") if key in evidence}


def _convergence(checks) -> dict | None:
    """How far the receipt shows the candidate trains the same model: steps, seeds, the margin and
    the tails' difference (``numerics.convergence``'s evidence), or None where it was not asked for."""
    evidence = next((c.evidence for c in checks if c.id == "numerics.convergence"), None)
    if not evidence:
        return None
    keys = ("steps", "seeds", "tail_steps", "margin", "margin_from", "difference", "ci90", "max_gap", "max_gap_step")
    # with the smoothed curves (thinned; the seeds' band) the report plots
    return {key: evidence.get(key) for key in (*keys, "curves")}


def write_receipt(
    ws, candidate, checks, estimate, base_times, cand_times, executions, fingerprint, baseline_summary
) -> Path:
    """Sign and write ``.infrarsi/receipts/<id>.json`` (and keep a copy in the ledger); returns its path."""
    from infrarsi._hashing import hash_workspace
    from infrarsi._policy import VERDICT_VERSION, contract_requires
    from infrarsi.contract import launch_command
    from infrarsi.runner import pre_images

    body = {
        "version": RECEIPT_VERSION,
        "contract_sha256": ws.contract.sha256,
        "manifest_sha256": ws.manifest.sha256,
        "candidate": candidate.describe(),
        "patches": [{"name": p.name, "sha256": p.sha256} for p in candidate.patches],
        "patch_text_sha256": sha256_hex("".join(p.text for p in candidate.patches).encode()),
        # What the patches were measured on, so `apply` and `gate` can tell the same code from other code.
        "sources": {
            path: sha256_hex(data)
            for path, data in sorted(pre_images(ws.contract.workspace, candidate.patches).items())
        },
        "protected_files": ws.manifest.files,
        # Every file of the workspace as measured, so `gate` can tell a stale receipt from a fresh one.
        "workspace_files": hash_workspace(ws.contract.workspace),
        "knobs": dict(candidate.knobs),
        # The ready-to-run line for those knobs: the speedup depends on it as much as on the patches.
        "launch": launch_command(ws.contract, dict(candidate.knobs)),
        "environment": fingerprint,
        "checks": [{**c.to_json(), "evidence_sha256": sha256_hex(canonical_json(c.evidence))} for c in checks],
        "required_checks": list(contract_requires(ws.contract)),
        # clock "runner": the step times are the mean periods between step ends on InfraRSI's own clock.
        # Every pair run, and the sequential A/B's looks over them (which one decided).
        "ab": {
            "order": "BAAB",
            "clock": "runner",
            "baseline_s": base_times,
            "candidate_s": cand_times,
            **_looks(checks),
        },
        "speedup": estimate.to_json(),
        "baseline": {
            "step_time_s": baseline_summary.get("step_time_s"),
            "executions": baseline_summary.get("executions"),
        },
        "executions": executions,
        "rule_version": VERDICT_VERSION,
        "public_key": ws.key.public_hex,
    }
    claim = _convergence(checks)
    if claim is not None:
        body["convergence"] = claim
    receipt_id = sha256_hex(canonical_json(body))[:16]
    signed = {"id": receipt_id, "receipt": body, "signature": ws.key.sign(canonical_json(body))}
    folder = ws.contract.state_dir / "receipts"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{receipt_id}.json"
    text = json.dumps(signed, indent=2, sort_keys=True) + "\n"
    path.write_text(text)
    # The ledger keeps the receipt too, so `infrarsi report` and `audit` need the ledger file alone.
    ws.ledger.put_blob(text.encode(), "receipt")
    return path


@dataclass(frozen=True)
class ReceiptCheck:
    ok: bool
    problems: list[str]
    receipt_id: str | None
    speedup: dict | None

    def to_json(self) -> dict:
        return {"ok": self.ok, "problems": self.problems, "receipt": self.receipt_id, "speedup": self.speedup}


def verify_receipt(path: str | Path, trusted_public_hex: str | None = None) -> ReceiptCheck:
    """Signature, id and completeness: every required check present and `pass`."""
    from infrarsi.errors import UsageError

    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the receipt: {exc.strerror or exc}") from None
    return check_receipt(raw, trusted_public_hex)


def check_receipt(raw: bytes, trusted_public_hex: str | None = None) -> ReceiptCheck:
    """:func:`verify_receipt` of a receipt's bytes (as the ledger keeps them)."""
    from infrarsi._policy import OPTIONAL_NUMERICS, REQUIRED_CHECKS

    try:
        data = json.loads(raw)
        body, signature, receipt_id = data["receipt"], data["signature"], data["id"]
        if not isinstance(body, dict) or not isinstance(signature, str):
            raise TypeError("receipt/signature of the wrong type")
    except (ValueError, KeyError, TypeError) as exc:
        return ReceiptCheck(False, [f"not a receipt written by `infrarsi verify` ({exc})"], None, None)
    problems = []
    key = body.get("public_key")
    try:
        signed = isinstance(key, str) and verify_signature(key, canonical_json(body), signature)
    except (TypeError, ValueError):
        signed = False
    if not signed:
        problems.append("the signature does not verify")
    if trusted_public_hex is not None and key != trusted_public_hex:
        problems.append("signed by another key than the trusted one")
    if receipt_id != sha256_hex(canonical_json(body))[:16]:
        problems.append("the id does not match the content")
    checks = {c.get("id"): c.get("status") for c in body.get("checks", []) if isinstance(c, dict)}
    # The checks required when the receipt was issued (a receipt from before a rule existed
    # doesn't lack it); `infrarsi audit` re-judges the executions under today's rules.
    missing = [cid for cid in (body.get("required_checks") or REQUIRED_CHECKS) if cid not in checks]
    if missing:
        problems.append(f"required checks missing: {', '.join(missing)}")
    # A numerics check the contract did not require may be `skipped`; every other must pass.
    always = set(REQUIRED_CHECKS) - set(OPTIONAL_NUMERICS.values())
    required = set(body.get("required_checks") or REQUIRED_CHECKS) | always
    failed = [cid for cid, status in checks.items() if status != "pass" and (cid in required or status != "skipped")]
    if failed:
        problems.append(f"checks not passed: {', '.join(failed)}")
    ab = body.get("ab") or {}
    if not ab.get("baseline_s") or len(ab.get("baseline_s", [])) != len(ab.get("candidate_s", [])):
        problems.append("no back-to-back A/B samples")
    return ReceiptCheck(
        not problems, problems, receipt_id if isinstance(receipt_id, str) else None, body.get("speedup")
    )


def ledger_receipts(ledger) -> dict[str, bytes]:
    """Every receipt a ledger holds (its own copies), and any in the ``receipts/`` folder beside it, by id.

    Ledgers written before they kept receipts have them only in the folder. Nothing is
    checked here: callers run :func:`check_receipt` on each.
    """
    found: dict[str, bytes] = {}
    for (digest,) in ledger.db.execute("SELECT hash FROM blobs WHERE kind = 'receipt' ORDER BY rowid"):
        data = ledger.get_blob(digest)
        found[_receipt_id(data) or digest] = data
    for path in sorted((Path(ledger.path).parent / "receipts").glob("*.json")):
        data = path.read_bytes()
        found.setdefault(_receipt_id(data) or path.name, data)
    return found


def _receipt_id(data: bytes) -> str | None:
    try:
        value = json.loads(data).get("id")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None
