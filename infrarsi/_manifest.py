"""The signed manifest: SHA-256 of the contract and every protected file, pinned at init."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from infrarsi._contract import Contract
from infrarsi._hashing import hash_protected
from infrarsi.ledger import KeyPair, canonical_json, sha256_hex, verify_signature

__all__ = ["Manifest", "ManifestError", "build_manifest", "load_manifest", "MANIFEST_NAME"]

MANIFEST_NAME = "manifest.json"


class ManifestError(Exception):
    """The manifest is missing, unreadable, or its signature does not verify."""


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

    def verifies(self) -> bool:
        return verify_signature(self.public_key, canonical_json(self.body), self.signature)

    def to_json(self) -> str:
        return json.dumps({"manifest": self.body, "signature": self.signature}, indent=2, sort_keys=True)


def build_manifest(contract: Contract, key: KeyPair) -> Manifest:
    """Pin the contract and the protected files of the workspace as they are now."""
    files = hash_protected(contract.workspace, contract.protected_globs)
    body = {
        "version": 1,
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
        data = json.loads(Path(path).read_text())
        manifest = Manifest(data["manifest"], data["signature"])
        manifest.public_key  # noqa: B018 - must exist
    except FileNotFoundError:
        raise ManifestError(f"{path}: no manifest (run `infrarsi init` first)") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ManifestError(f"{path}: not a manifest written by `infrarsi init` ({exc})") from None
    if not manifest.verifies():
        raise ManifestError(f"{path}: the manifest signature does not verify")
    return manifest
