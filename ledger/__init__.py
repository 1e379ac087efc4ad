"""The tamper-evident ledger: every execution, baseline and evidence blob, hash-chained and signed.

``Ledger.open(path, key)`` for writing, ``Ledger.open(path)`` to read or audit;
``verify_chain`` re-checks every row without trusting the writer.
"""

from infrarsi.errors import LedgerError

from ._crypto import KeyPair, canonical_json, sha256_hex, verify_signature
from ._ledger import Ledger
from ._schema import SCHEMA_VERSION
from ._verify import ChainReport

__all__ = [
    "canonical_json",
    "sha256_hex",
    "KeyPair",
    "verify_signature",
    "LedgerError",
    "SCHEMA_VERSION",
    "Ledger",
    "ChainReport",
]
