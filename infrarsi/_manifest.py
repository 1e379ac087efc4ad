"""The signed manifest: SHA-256 of the contract and every protected file, pinned at init."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

from infrarsi._hashing import hash_protected
from infrarsi.contract import Contract
from infrarsi.errors import ManifestError, UsageError
from infrarsi.ledger import KeyPair, canonical_json, sha256_hex, verify_signature

__all__ = [
    "Manifest",
    "build_manifest",
    "load_manifest",
    "parse_manifest",
    "MANIFEST_NAME",
    "TrustedKey",
    "trusted_key",
    "is_public_key",
]

MANIFEST_NAME = "manifest.json"
_PUBLIC_KEY = re.compile(r"[0-9a-f]{64}")


def is_public_key(text: str) -> bool:
    """An Ed25519 public key as InfraRSI writes it: 64 lowercase hex digits."""
    return bool(_PUBLIC_KEY.fullmatch(text))


@dataclass(frozen=True)
class TrustedKey:
    """The public key evidence must be signed by: ``key`` (None when nothing pins one), where it
    came from (``"given"``, ``"manifest"``, ``"none"``), and why a manifest could not supply it."""

    key: str | None
    source: str
    problem: str | None = None


def trusted_key(state_dir: Path, given: str | None = None) -> TrustedKey:
    """The one trusted-key lookup (receipt verify, audit, report): the key given (64 lowercase hex
    digits, else UsageError), else the one the signed manifest in ``state_dir`` (a workspace's
    ``.infrarsi/``) pins."""
    if given is not None:
        if not is_public_key(given):
            raise UsageError(f"--key {given[:20]!r}: expected an Ed25519 public key as 64 lowercase hex digits")
        return TrustedKey(given, "given")
    path = Path(state_dir) / MANIFEST_NAME
    if not path.is_file():
        return TrustedKey(None, "none")
    try:
        return TrustedKey(load_manifest(path).public_key, "manifest")
    except ManifestError as exc:
        return TrustedKey(None, "manifest", f"the manifest at {path} cannot supply a trusted key: {exc}")


@dataclass(frozen=True)
class Manifest:
    body: dict
    signature: str

    @property
    def files(self) -> dict[str, str]:
        """Every pinned file (the contract included) -> sha256."""
        return dict(self.body["files"])

    @property
    def sha256(self) -> str:
        return sha256_hex(canonical_json(self.body))

    @property
    def public_key(self) -> str:
        return self.body["public_key"]

    @property
    def revision(self) -> int:
        """1 for the manifest `infrarsi init` wrote; each `init --update` adds one."""
        value = self.body.get("revision", 1)
        return value if isinstance(value, int) and not isinstance(value, bool) else 1

    @property
    def previous(self) -> str | None:
        """The sha256 of the revision this one replaced (None for the first)."""
        value = self.body.get("previous")
        return value if isinstance(value, str) else None

    @property
    def baseline_required(self) -> list[str]:
        """Why this revision needs a new baseline (empty: the stored one stays the reference)."""
        value = self.body.get("baseline_required")
        return [str(v) for v in value] if isinstance(value, list) else []

    def verifies(self) -> bool:
        return verify_signature(self.public_key, canonical_json(self.body), self.signature)

    def to_json(self) -> str:
        return json.dumps({"manifest": self.body, "signature": self.signature}, indent=2, sort_keys=True)


def build_manifest(
    contract: Contract,
    key: KeyPair,
    previous: Manifest | None = None,
    changes: list[str] | None = None,
    baseline_required: list[str] | None = None,
) -> Manifest:
    """Pin the contract and the protected files of the workspace as they are now; with
    ``previous``, as the next revision of that manifest (what changed, and whether the stored
    baseline still measures this contract's job)."""
    files = hash_protected(contract.workspace, contract.protected_globs)
    body = {
        "version": 1,
        "revision": previous.revision + 1 if previous else 1,
        "previous": previous.sha256 if previous else None,
        "changes": list(changes or []),
        "baseline_required": list(baseline_required or []),
        "contract": contract.path.name,
        "contract_sha256": contract.sha256,
        "files": files,
        "protected_globs": list(contract.protected_globs),
        "public_key": key.public_hex,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return Manifest(body, key.sign(canonical_json(body)))


def load_manifest(path: Path) -> Manifest:
    """Read a manifest file; raises ManifestError if it is unreadable or its signature fails."""
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        raise ManifestError(f"{path}: no manifest (run `infrarsi init` first)") from None
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read the manifest ({exc.strerror or exc})") from None
    return parse_manifest(text, str(path))


MAX_MANIFEST_BYTES = 16 * 2**20  # far above any real one (a hash per protected file)


def parse_manifest(text: str, where: str) -> Manifest:
    """A manifest from its JSON text; raises ManifestError if it is malformed (whatever is wrong
    with it: nesting, NaN, text that is not UTF-8, the size) or its signature fails."""
    if len(text) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{where}: {len(text)} characters, more than a manifest holds")
    try:
        data = json.loads(text)
        manifest = Manifest(data["manifest"], data["signature"])
        if not isinstance(manifest.body, dict) or not is_public_key(str(manifest.public_key)):
            raise ValueError("no manifest body with a public key")
        verified = manifest.verifies()
    except (ValueError, KeyError, TypeError, RecursionError, UnicodeError) as exc:
        raise ManifestError(f"{where}: not a manifest written by `infrarsi init` ({type(exc).__name__})") from None
    if not verified:
        raise ManifestError(f"{where}: the manifest signature does not verify")
    return manifest
