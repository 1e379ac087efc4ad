"""integrity.*: the job ran on the pinned files, left them and the framework alone, and left no process behind."""

from __future__ import annotations

from ._result import CheckResult

__all__ = ["check_containment", "check_manifest", "check_run_integrity"]


def check_manifest(
    manifest_body: dict,
    signature: str,
    contract_sha256: str,
    expected_public_key: str | None,
    current_files: dict[str, str],
) -> CheckResult:
    """The manifest signature verifies, it pins this contract, and the workspace matches it now."""
    from infrarsi.signing import canonical_json, verify_signature

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
        return CheckResult(
            "integrity.manifest", "fail", f"protected files differ from the manifest: {', '.join(changed[:5])}"
        )
    return CheckResult("integrity.manifest", "pass", f"signature verifies; {len(pinned)} pinned file(s) match")


def check_run_integrity(integrity: dict | None) -> list[CheckResult]:
    """integrity.protected and integrity.framework from the runner's before/after hashes, and
    integrity.containment from its record of the processes the job left behind."""
    containment = check_containment(integrity.get("containment") if isinstance(integrity, dict) else None)
    if not isinstance(integrity, dict) or "protected_changed_by_run" not in integrity:
        return [
            CheckResult("integrity.protected", "unchecked", "no run-time hashes of the protected files"),
            CheckResult("integrity.framework", "unchecked", "no run-time hashes of the framework"),
            containment,
        ]
    out = []
    before = list(integrity.get("protected_changed_before_run") or [])
    during = list(integrity.get("protected_changed_by_run") or [])
    # The workspace the sandbox was copied from (recorded since it was watched): a file every
    # later run copies, the A/B's baseline arm included.
    origin = list(integrity.get("workspace_changed_by_run") or [])
    if before or during or origin:
        out.append(
            CheckResult(
                "integrity.protected",
                "fail",
                "; ".join(
                    ([f"differ from the manifest before the run: {', '.join(before)}"] if before else [])
                    + ([f"changed by the run: {', '.join(during)}"] if during else [])
                    + (
                        [f"the run changed the workspace every later run is copied from: {', '.join(origin[:5])}"]
                        if origin
                        else []
                    )
                ),
            )
        )
    else:
        out.append(CheckResult("integrity.protected", "pass", "protected files match the manifest before and after"))
    if "framework_changed" not in integrity:
        out.append(CheckResult("integrity.framework", "unchecked", "no run-time hashes of the framework"))
    elif integrity["framework_changed"]:
        out.append(
            CheckResult(
                "integrity.framework",
                "fail",
                "the run changed InfraRSI's own files: " + ", ".join(integrity["framework_changed"][:5]),
            )
        )
    elif integrity.get("environment_changed"):
        # A .pth file, a sitecustomize or an edited library runs in every later execution,
        # the A/B's baseline arm included: a way to slow the baseline that outlives the job.
        changed = list(integrity["environment_changed"])
        out.append(
            CheckResult(
                "integrity.framework",
                "fail",
                "the run changed the Python environment later runs "
                f"import from: {', '.join(changed[:5])}" + (f" (+{len(changed) - 5} more)" if len(changed) > 5 else ""),
            )
        )
    elif "environment_changed" not in integrity:
        out.append(
            CheckResult(
                "integrity.framework",
                "pass",
                "InfraRSI's installed files unchanged by the run "
                "(the Python environment was not watched when this ran)",
            )
        )
    else:
        out.append(
            CheckResult(
                "integrity.framework",
                "pass",
                "InfraRSI's installed files and the Python environment "
                "(site-packages, the standard library's top level) unchanged by the run",
            )
        )
    out.append(containment)
    return out


def check_containment(record: dict | None) -> CheckResult:
    """No process the job started outlived its main process, and the job left the runner's process-tree root alone."""
    if not isinstance(record, dict) or not isinstance(record.get("strays"), list):
        return CheckResult("integrity.containment", "unchecked", "no containment record (recorded before containment)")
    strays = [s if isinstance(s, dict) else {"cmd": s} for s in record["strays"]]
    problems = []
    if record.get("root_lost"):
        problems.append("the job killed or stopped the runner's process-tree root (the shim)")
    if strays:
        shown = "; ".join(f"pid {s.get('pid')}: {_short(s.get('cmd'))}" for s in strays[:3])
        more = f" and {len(strays) - 3} more" if len(strays) > 3 else ""
        problems.append(f"{len(strays)} process(es) still running after the job ended, killed: {shown}{more}")
    if problems:
        return CheckResult("integrity.containment", "fail", "; ".join(problems))
    if not record.get("subreaper") and not record.get("cgroup"):
        return CheckResult(
            "integrity.containment",
            "unchecked",
            "nothing held the job's processes on this platform (no subreaper, no cgroup)",
        )
    held = "subreaper" + (f" and cgroup {record['cgroup']}" if record.get("cgroup") else "")
    return CheckResult("integrity.containment", "pass", f"no process outlived the job ({held})")


def _short(cmd: object) -> str:
    text = " ".join(str(cmd or "?").split())
    return text if len(text) <= 120 else text[:117] + "..."
