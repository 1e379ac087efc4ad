"""`infrarsi audit`'s check of the contract revisions (`infrarsi init --update`): the stored manifests,
their order, what each claims about the baseline, and which baseline each revision's runs met."""

from __future__ import annotations

from pathlib import Path

from infrarsi.ledger import Ledger, LedgerError

__all__ = ["revision_problems"]


def revision_problems(ledger: Ledger, key: str, state: Path) -> list[str]:
    """The contract revisions: every stored manifest signed by the trusted key, one line of them
    (each following the one before, numbered in order), each revision's claim about the baseline
    re-derived from the stored contracts, every execution run under one of them, and every judged
    execution met a baseline that still measured its revision's job."""
    from infrarsi._revision import classify, contract_name, manifests_in, stale_baseline, stored_contract

    problems: list[str] = []
    chain = manifests_in(ledger)
    manifests = {d: m for d, m in chain.items() if not isinstance(m, str)}
    problems += [m for m in chain.values() if isinstance(m, str)]
    followers: dict[str, list] = {}
    for digest, manifest in manifests.items():
        if manifest.public_key != key:
            problems.append(f"manifest revision {manifest.revision} ({digest[:16]}...) is signed by another key")
            continue
        if manifest.previous is None:
            continue
        followers.setdefault(manifest.previous, []).append(manifest)
        before = manifests.get(manifest.previous)
        if before is None:
            problems.append(
                f"manifest revision {manifest.revision} ({digest[:16]}...) follows {manifest.previous[:16]}..., "
                "which is not in the ledger"
            )
            continue
        if manifest.revision != before.revision + 1:
            problems.append(f"manifest revision {manifest.revision} follows revision {before.revision}")
        old, new = (
            stored_contract(ledger, before, Path(contract_name(before))),
            stored_contract(ledger, manifest, Path(contract_name(manifest))),
        )
        if isinstance(old, str) or isinstance(new, str):
            problems.append(old if isinstance(old, str) else new)
            continue
        needed = classify(old, new, before.files, manifest.files).baseline_required
        if needed and not manifest.baseline_required:
            problems.append(
                f"manifest revision {manifest.revision} says the stored baseline still measures the job, "
                f"but: {'; '.join(needed)}"
            )
    for previous, after in followers.items():
        if len(after) > 1:
            problems.append(f"{len(after)} manifests follow {previous[:16]}...: the revisions fork")
    named = {"the ledger's meta": ledger.get_meta("manifest_sha256")}
    beside = state / "manifest.json"
    if beside.is_file():
        from infrarsi._manifest import load_manifest
        from infrarsi.errors import ManifestError

        try:
            named["manifest.json beside it"] = load_manifest(beside).sha256
        except ManifestError as exc:
            problems.append(str(exc))
    for where, digest in named.items():
        if digest and digest not in manifests:
            problems.append(f"{where} names manifest {digest[:16]}..., which is not in the ledger")
    for digest in sorted(ledger.manifest_hashes() - set(manifests)):
        problems.append(f"executions ran under manifest {digest[:16]}..., which is not in the ledger")
    for digest, baseline_id in sorted(ledger.judged_against()):
        manifest = manifests.get(digest)
        try:
            baseline = ledger.baseline(baseline_id)
        except LedgerError:
            continue  # the baselines' own check reports it
        if manifest is None or baseline is None:
            continue
        why = stale_baseline(ledger, chain, manifest, None, baseline)
        if why:
            problems.append(
                f"executions under manifest revision {manifest.revision} were judged against "
                f"baseline {baseline_id}, which no longer measured their job: {why}"
            )
    return problems
