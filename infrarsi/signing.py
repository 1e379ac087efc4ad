"""What signed evidence is, for every part that checks it: the canonical JSON every hash and
signature covers, SHA-256, and the Ed25519 signature check. The ledger signs with these; the
verifiers and the receipts check with them, without importing the ledger."""

from __future__ import annotations

import hashlib
import json

__all__ = ["canonical_json", "sha256_hex", "verify_signature"]


def canonical_json(obj) -> bytes:
    """The one byte string every hash and signature is computed over: sorted keys, no spaces, UTF-8."""
    # allow_nan=False: NaN/Infinity are not JSON, and another reader would not parse them back.
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def sha256_hex(data: bytes) -> str:
    """Lower-case hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def verify_signature(public_hex: str, data: bytes, signature_hex: str) -> bool:
    """True when ``signature_hex`` is ``public_hex``'s signature of ``data``; False for anything else."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        public = Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_hex))
        public.verify(bytes.fromhex(signature_hex), data)
    except Exception:  # noqa: BLE001 - garbage of any shape is simply "does not verify"
        return False
    return True
