"""integrity.*: the job ran on the pinned files, and left them and the framework alone."""

from __future__ import annotations

from ._result import CheckResult

__all__ = ["check_manifest", "check_run_integrity"]


def check_manifest(manifest_body: dict, signature: str, contract_sha256: str, expected_public_key: str | None,
                   current_files: dict[str, str]) -> CheckResult:
    """The manifest signature verifies, it pins this contract, and the workspace matches it now."""
    from infrarsi.ledger import canonical_json, verify_signature

    key = manifest_body.get("public_key")
    if not isinstance(key, str) or not verify_signature(key, canonical_json(manifest_body), signature):
        return CheckResult("integrity.manifest", "fail", "the manifest signature does not verify")
    if expected_public_key is not None and key != expected_public_key:
        return CheckResult("integrity.manifest", "fail", "the manifest is signed by another key than the ledger's")
    if manifest_body.get("contract_sha256") != contract_sha256:
        return CheckResult("integrity.manifest", "fail", "the contract is not the one the manifest pins")
    pinned = manifest_body.get("files") or {}
    changed = sorted(p for p in set(pinned) | set(current_files) if pinned.get(p) != current_files.get(p))
    if changed:
        return CheckResult("integrity.manifest", "fail", f"protected files differ from the manifest: "
                           f"{', '.join(changed[:5])}")
    return CheckResult("integrity.manifest", "pass", f"signature verifies; {len(pinned)} pinned file(s) match")


def check_run_integrity(integrity: dict | None) -> list[CheckResult]:
    """integrity.protected and integrity.framework from the runner's before/after hashes."""
    if not isinstance(integrity, dict) or "protected_changed_by_run" not in integrity:
        return [CheckResult("integrity.protected", "unchecked", "no run-time hashes of the protected files"),
                CheckResult("integrity.framework", "unchecked", "no run-time hashes of the framework")]
    out = []
    before = list(integrity.get("protected_changed_before_run") or [])
    during = list(integrity.get("protected_changed_by_run") or [])
    if before or during:
        out.append(CheckResult("integrity.protected", "fail",
                               "; ".join(([f"differ from the manifest before the run: {', '.join(before)}"] if before else [])
                                         + ([f"changed by the run: {', '.join(during)}"] if during else []))))
    else:
        out.append(CheckResult("integrity.protected", "pass", "protected files match the manifest before and after"))
    if "framework_changed" not in integrity:
        out.append(CheckResult("integrity.framework", "unchecked", "no run-time hashes of the framework"))
    elif integrity["framework_changed"]:
        out.append(CheckResult("integrity.framework", "fail", "the run changed InfraRSI's own files: "
                               + ", ".join(integrity["framework_changed"][:5])))
    else:
        out.append(CheckResult("integrity.framework", "pass", "InfraRSI's installed files unchanged by the run"))
    return out
