"""Canonical JSON, SHA-256 and the Ed25519 signing key the ledger and manifest are signed with."""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from infrarsi.errors import LedgerError
from infrarsi.signing import canonical_json, sha256_hex, verify_signature

__all__ = ["canonical_json", "sha256_hex", "KeyPair", "verify_signature"]

PRIVATE_NAME = "signing.key"
PUBLIC_NAME = "signing.pub"


class KeyPair:
    """An Ed25519 signing key; the public half is what a ledger and a manifest are checked against."""

    def __init__(self, private: Ed25519PrivateKey):
        self._private = private
        self._public_hex = (
            private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()
        )

    @classmethod
    def generate(cls) -> "KeyPair":
        """A fresh random key."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load(cls, directory: str | Path) -> "KeyPair":
        """Read ``signing.key`` (PEM, PKCS8) from ``directory``; ``signing.pub``, if present, must match."""
        directory = Path(directory)
        private_path = directory / PRIVATE_NAME
        try:
            pem = private_path.read_bytes()
        except FileNotFoundError:
            raise LedgerError(
                f"{private_path}: no signing key (expected the {PRIVATE_NAME} written by `infrarsi init`)"
            ) from None
        try:
            private = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError) as exc:
            raise LedgerError(f"{private_path}: not an unencrypted PEM PKCS8 private key ({exc})") from None
        if not isinstance(private, Ed25519PrivateKey):
            raise LedgerError(f"{private_path}: expected an Ed25519 key, found {type(private).__name__}")
        key = cls(private)
        public_path = directory / PUBLIC_NAME
        if public_path.exists():
            stored = public_path.read_text().strip()
            if stored != key.public_hex:
                raise LedgerError(
                    f"{public_path}: public key {stored[:16]}... does not belong to "
                    f"{private_path} (its public key is {key.public_hex[:16]}...)"
                )
        return key

    def save(self, directory: str | Path) -> None:
        """Write ``signing.key`` (mode 0600) and ``signing.pub`` (hex) into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        pem = self._private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        private_path = directory / PRIVATE_NAME
        # Created 0600 from the start: the key is never readable by others, not even briefly.
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(pem)
        os.chmod(private_path, 0o600)  # an existing file keeps its old mode through O_CREAT
        (directory / PUBLIC_NAME).write_text(self.public_hex + "\n")

    @property
    def public_hex(self) -> str:
        """The raw 32-byte public key, hex."""
        return self._public_hex

    def sign(self, data: bytes) -> str:
        """Hex Ed25519 signature of ``data``."""
        return self._private.sign(data).hex()

    def __repr__(self) -> str:
        return f"KeyPair(public={self._public_hex[:16]}...)"
