"""What a receipt requires: every check that must `pass`, and the version of the rules that judged it.

Shared by `verify` (which judges), the receipt (which records and re-checks), `audit` (which
re-judges) and `report`; it judges nothing itself.
"""

from __future__ import annotations

from pathlib import Path

from infrarsi.auditors import AUDITOR_VERSION, audit_check_ids
from infrarsi.verifiers import RULE_VERSION

__all__ = [
    "REQUIRED_CHECKS",
    "OPTIONAL_NUMERICS",
    "VERDICT_VERSION",
    "CONVERGENCE",
    "required_checks",
    "contract_requires",
]

# Every check a receipt must hold, each `pass`.
REQUIRED_CHECKS = (
    "scope.parse",
    "scope.binary",
    "scope.editable",
    "scope.created",
    "scope.protected",
    "integrity.manifest",
    *audit_check_ids(),
    "integrity.protected",
    "integrity.framework",
    "integrity.containment",
    "timing.window",
    "timing.clock",
    "numerics.loss",
    "numerics.grad_norm",
    "numerics.precision",
    "stats.speedup",
)


def _rules_digest() -> str:
    """SHA-256 (12 hex) of the verifiers' and auditors' source: any change to a rule changes it."""
    import hashlib
    import importlib.util

    digest = hashlib.sha256()
    for package in ("infrarsi.verifiers", "infrarsi.auditors"):
        root = Path(importlib.util.find_spec(package).origin).parent
        for path in sorted(root.rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


# Which rules gave a stored verdict: the verifiers' and the auditors' versions, and the digest
# of their code, so `infrarsi audit` can tell a verdict today's code would give from an old one.
VERDICT_VERSION = f"{RULE_VERSION}+{AUDITOR_VERSION}@{_rules_digest()}"

# The numerics checks a contract may leave out of `require`; everything else is always required.
OPTIONAL_NUMERICS = {"loss": "numerics.loss", "grad_norm": "numerics.grad_norm", "precision": "numerics.precision"}


# Required only where the contract asks for it with a [numerics.convergence] table.
CONVERGENCE = "numerics.convergence"


def required_checks(require, convergence: bool = False) -> tuple[str, ...]:
    """The checks that must `pass` under a contract whose [numerics] require is ``require``
    (and, with ``convergence``, that has a ``[numerics.convergence]`` table)."""
    dropped = {cid for name, cid in OPTIONAL_NUMERICS.items() if name not in require}
    return tuple(cid for cid in REQUIRED_CHECKS if cid not in dropped) + ((CONVERGENCE,) if convergence else ())


def contract_requires(contract) -> tuple[str, ...]:
    """The checks a receipt under ``contract`` must hold, each `pass`."""
    return required_checks(contract.numerics.require, contract.convergence is not None)
