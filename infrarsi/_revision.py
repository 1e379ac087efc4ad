"""Contract revisions: `infrarsi init --update` re-pins a changed contract in the next manifest,
signed by the same key and linked to the one before it, in the same ledger.

The stored baseline stays the reference when nothing it measured changed: the original setup's
launch (command, arguments and environment at the knobs' baseline values), the evidence and
its window, the device, the files pinned both before and after. Anything else (patches, search
settings, tolerances, a new knob whose baseline value launches what already ran) keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from infrarsi._manifest import MANIFEST_NAME, Manifest, build_manifest, load_manifest, parse_manifest
from infrarsi._workspace import KEYS_DIR, LEDGER_NAME
from infrarsi.contract import (
    HARDWARE_KEYS,
    Contract,
    hardware_mismatch,
    launch_settings,
    load_contract,
    parse_contract,
)
from infrarsi.errors import ContractError, ManifestError, UsageError
from infrarsi.ledger import KeyPair, Ledger

__all__ = [
    "Revision",
    "revise",
    "classify",
    "manifests_in",
    "check_baseline_current",
    "stale_baseline",
    "stored_contract",
    "contract_name",
    "measured_under",
]

# Contract keys that decide what the baseline measured, beyond the launch itself.
_MEASURING = (
    ("task", "evidence"),
    ("task", "tokens_per_step"),
    ("timing", "warmup_steps"),
    ("timing", "measure_steps"),
    ("resources", "device"),
    # Where it ran: another executor, partition, GPU count or #SBATCH constraint is other hardware.
    *(("executor", key) for key in HARDWARE_KEYS),
)


@dataclass
class Revision:
    """What changed between two contracts, split by whether the stored baseline survives it."""

    number: int = 1
    changed: bool = True  # False: `init --update` found nothing to pin
    previous: str | None = None
    manifest_sha256: str | None = None
    baseline_required: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # changes the baseline survives

    @property
    def changes(self) -> list[str]:
        return self.baseline_required + self.kept

    def to_json(self) -> dict:
        return {
            "number": self.number,
            "changed": self.changed,
            "previous": self.previous,
            "manifest_sha256": self.manifest_sha256,
            "baseline": "required" if self.baseline_required else "kept",
            "baseline_required": self.baseline_required,
            "changes": self.changes,
        }


def classify(
    old: Contract,
    new: Contract,
    old_files: dict[str, str],
    new_files: dict[str, str],
    workspace: Path | None = None,
) -> Revision:
    """Every difference between ``old`` and ``new`` (and the files pinned under each), sorted into
    those that change what the baseline measured and those that don't.

    A file pinned under ``old`` and not under ``new`` keeps the baseline only where it is
    unchanged in ``workspace``; without a workspace (the audit, from the ledger alone) its
    content can't be seen, and it is kept with a note saying so."""
    rev = Revision()
    launch_old = launch_settings(old, old.baseline_knobs())
    launch_new = launch_settings(new, new.baseline_knobs())
    if launch_old[0] != launch_new[0]:
        rev.baseline_required.append(
            f"the original setup's command line: {' '.join(launch_old[0])!r} -> {' '.join(launch_new[0])!r}"
        )
    if launch_old[1] != launch_new[1]:
        rev.baseline_required.append(f"the original setup's knob environment: {launch_old[1]} -> {launch_new[1]}")
    for section, key in _MEASURING:
        before, after = getattr(old, section).values.get(key), getattr(new, section).values.get(key)
        if before != after:
            rev.baseline_required.append(f"[{section}] {key}: {before!r} -> {after!r}")
    if old.log_patterns != new.log_patterns:
        rev.baseline_required.append("[evidence.log] patterns")
    contract_names = {old.path.name, new.path.name}
    for rel in sorted(set(old_files) & set(new_files) - contract_names):
        if old_files[rel] != new_files[rel]:
            rev.baseline_required.append(f"protected file {rel} changed")
    for rel in sorted(set(new_files) - set(old_files) - contract_names):
        rev.kept.append(f"protected file {rel} newly pinned")
    for rel in sorted(set(old_files) - set(new_files) - contract_names):
        if workspace is None:
            rev.kept.append(f"file {rel} no longer protected (its content now not checked)")
        elif _hash_or_none(workspace / rel) == old_files[rel]:
            rev.kept.append(f"file {rel} no longer protected (unchanged)")
        else:
            rev.baseline_required.append(f"protected file {rel} no longer protected, and changed or gone")
    measured = {f"{s}.{k}" for s, k in _MEASURING}
    for section in ("task", "scope", "timing", "numerics", "resources", "search", "executor"):
        before, after = getattr(old, section).values, getattr(new, section).values
        for key in sorted(set(before) | set(after)):
            if f"{section}.{key}" not in measured and key != "command" and before.get(key) != after.get(key):
                rev.kept.append(f"[{section}] {key}: {before.get(key)!r} -> {after.get(key)!r}")
    if old.convergence != new.convergence:  # long runs are taken anew by each verify
        shown = [c.describe() if c else None for c in (old.convergence, new.convergence)]
        rev.kept.append(f"[numerics.convergence]: {shown[0]} -> {shown[1]}")
    for name in sorted(set(old.knobs) | set(new.knobs)):
        if name not in new.knobs:
            rev.kept.append(f"knob {name} removed")
        elif name not in old.knobs:
            rev.kept.append(f"knob {name} added")
        elif old.knobs[name] != new.knobs[name]:
            rev.kept.append(f"knob {name} changed")
    patches_old = {p.name: p for p in old.patches}
    patches_new = {p.name: p for p in new.patches}
    for name in sorted(set(patches_old) | set(patches_new)):
        if name not in patches_new:
            rev.kept.append(f"patch {name} removed")
        elif name not in patches_old:
            rev.kept.append(f"patch {name} added")
        elif patches_old[name] != patches_new[name]:
            rev.kept.append(f"patch {name} changed")
    return rev


def _hash_or_none(path: Path) -> str | None:
    from infrarsi._hashing import file_sha256

    try:
        return file_sha256(path) if path.is_file() else None
    except OSError:
        return None


def manifests_in(ledger: Ledger) -> dict[str, Manifest | str]:
    """Every manifest the ledger keeps, by its sha256; a stored one that does not parse or verify
    is kept by its blob hash with the reason, for `audit` to report."""
    out: dict[str, Manifest | str] = {}
    for digest, data in ledger.blobs_of_kind("manifest"):
        try:
            manifest = parse_manifest(data.decode("utf-8", "replace"), f"manifest blob {digest[:16]}...")
        except ManifestError as exc:
            out[digest] = str(exc)
            continue
        out[manifest.sha256] = manifest
    return out


def revise(contract_path) -> tuple[Manifest, Revision]:
    """`infrarsi init --update`: the changed contract (and protected files) re-pinned in the next
    manifest, signed by the workspace's own key; the ledger, receipts and baselines stay."""
    contract = load_contract(contract_path)
    state = contract.state_dir
    ledger_path = state / LEDGER_NAME
    if not ledger_path.exists():
        raise UsageError(f"{contract.workspace}: not initialised (no {LEDGER_NAME}); run `infrarsi init` first")
    try:
        current = load_manifest(state / MANIFEST_NAME)
    except ManifestError as exc:
        raise UsageError(str(exc)) from None
    key = KeyPair.load(state / KEYS_DIR)
    if key.public_hex != current.public_key:
        raise UsageError(f"{state / KEYS_DIR}: the signing key is not the one the manifest was signed with")
    with Ledger.open(ledger_path, key=key) as ledger:
        old = stored_contract(ledger, current, contract.path)
        if isinstance(old, str):
            raise UsageError(f"{ledger_path}: {old}; `infrarsi init --force` starts a new ledger")
        from infrarsi._hashing import hash_protected

        files = hash_protected(contract.workspace, contract.protected_globs)
        revision = classify(old, contract, current.files, files, contract.workspace)
        if contract.sha256 == current.body["contract_sha256"] and files == current.files:
            revision.number, revision.changed = current.revision, False
            revision.previous, revision.manifest_sha256 = current.previous, current.sha256
            return current, revision  # nothing changed: nothing to sign
        manifest = build_manifest(contract, key, current, revision.changes, revision.baseline_required)
        revision.number, revision.previous, revision.manifest_sha256 = (
            manifest.revision,
            current.sha256,
            manifest.sha256,
        )
        # The ledger first: a manifest file that names a contract the ledger lacks would strand it.
        ledger.put_blob(contract.text.encode(), "contract")
        ledger.put_blob(manifest.to_json().encode(), "manifest")
        ledger.set_meta("manifest_sha256", manifest.sha256)
        ledger.set_meta("contract_sha256", contract.sha256)
    tmp = state / (MANIFEST_NAME + ".tmp")
    tmp.write_text(manifest.to_json())
    tmp.replace(state / MANIFEST_NAME)
    return manifest, revision


def contract_name(manifest: Manifest) -> str:
    """The contract's file name: the pinned file whose hash is the contract's (a named contract,
    ``long.toml``, is not a protected file of its own revision); ``infrarsi.toml`` where none is."""
    digest = manifest.body.get("contract_sha256")
    return next((path for path, sha in manifest.files.items() if sha == digest and "/" not in path), "infrarsi.toml")


def stored_contract(ledger: Ledger, manifest: Manifest, path: Path) -> Contract | str:
    """The contract ``manifest`` pinned, parsed from the ledger's blob as if at ``path``; or why not."""
    data = ledger.get_blob(str(manifest.body.get("contract_sha256")))
    if data is None:
        return f"the contract of manifest revision {manifest.revision} is not in the ledger"
    try:
        return parse_contract(data.decode("utf-8", "replace"), path, check_files=False)
    except ContractError as exc:
        return f"the contract of manifest revision {manifest.revision} does not parse today ({exc})"


def measured_under(ledger: Ledger, baseline: dict) -> str | None:
    """The manifest (sha256) the baseline's runs ran under; None for one with no recorded run."""
    rows = baseline["summary"].get("executions") or []
    first = ledger.get_execution(rows[0]) if rows else None
    return first.get("manifest_hash") if first else None


def stale_baseline(
    ledger: Ledger,
    chain: dict[str, Manifest | str],
    manifest: Manifest,
    contract: Contract | None,
    baseline: dict,
    workspace: Path | None = None,
) -> str | None:
    """Why ``baseline`` does not measure the job of ``manifest`` (``contract``: its parsed contract,
    None to read it from the ledger), or None when it does. The two endpoints are compared
    directly (not the flags each revision on the way recorded, which a signer could set at will)."""
    under = measured_under(ledger, baseline)
    if under is None or under == manifest.sha256:
        return None
    base = chain.get(under)
    if not isinstance(base, Manifest) or base.public_key != manifest.public_key:
        return (
            f"the stored baseline (batch {baseline.get('batch')}) ran under a manifest this ledger does not "
            "hold, signed by this key"
        )
    path = contract.path if contract is not None else Path(contract_name(manifest))
    old, new = stored_contract(ledger, base, path), contract or stored_contract(ledger, manifest, path)
    if isinstance(old, str) or isinstance(new, str):
        return old if isinstance(old, str) else new
    revision = classify(old, new, base.files, manifest.files, workspace)
    if not revision.baseline_required:
        return None
    return (
        f"contract revision {manifest.revision} changed what the stored baseline measured (it ran under "
        f"revision {base.revision}: {'; '.join(revision.baseline_required)})"
    )


def check_baseline_current(ledger: Ledger, current: Manifest, baseline: dict, contract: Contract) -> None:
    """Raise UsageError unless ``baseline`` still measures the job of the ``current`` revision
    (``contract``, the workspace's own, pinned by it)."""
    why = stale_baseline(ledger, manifests_in(ledger), current, contract, baseline, contract.workspace)
    if why is not None:
        raise UsageError(f"{why}: run `infrarsi baseline` for a new one")
    other = hardware_mismatch(contract, baseline["summary"].get("executor_flags"))
    if other:
        raise UsageError(
            f"the stored baseline (batch {baseline.get('batch')}) was measured on other hardware than these "
            f"flags ask for ({'; '.join(other)}): give the flags it was measured with, or run `infrarsi baseline` "
            "with these"
        )
