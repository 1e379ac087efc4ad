"""InfraRSI: faster training setups, promoted only with a full receipt.

The stages, callable from Python as the command line calls them (``from infrarsi import verify``):

- define: :func:`init`; diagnose: :func:`baseline`; one execution: :func:`run`;
- the full check of one candidate: :func:`verify` (and :func:`verify_receipt` later);
- :func:`search`, :func:`report`, :func:`apply`; CI: :func:`gate`;
- re-audit a ledger: :func:`audit`; the source audit alone: :func:`lint`;
- experience packs: :func:`export_pack`, :func:`load_pack`; the walkthrough: :func:`demo`.

Every error they raise is in :mod:`infrarsi.errors`. Importing the package is cheap: a stage
(and torch, the runner, the ledger behind it) loads only when its name is first used.
"""

from __future__ import annotations

__version__ = "0.1.0"

# public name -> (module, attribute): loaded on first use.
_LAZY = {
    "draft": ("infrarsi._draft", "draft"),
    "init": ("infrarsi._init", "init"),
    "baseline": ("infrarsi._baseline", "baseline"),
    "run": ("infrarsi._run", "run"),
    "verify": ("infrarsi._verify", "verify"),
    "verify_receipt": ("infrarsi._receipt", "verify_receipt"),
    "search": ("infrarsi._search", "search"),
    "report": ("infrarsi._report", "report"),
    "apply": ("infrarsi._apply", "apply"),
    "gate": ("infrarsi._gate", "gate"),
    "audit": ("infrarsi._audit", "audit_ledger"),
    "lint": ("infrarsi._lint", "lint"),
    "export_pack": ("infrarsi._search", "export_pack"),
    "load_pack": ("infrarsi._search", "load_pack"),
    "demo": ("infrarsi._demo", "demo"),
    "Contract": ("infrarsi.contract", "Contract"),
    "load_contract": ("infrarsi.contract", "load_contract"),
    "ContractError": ("infrarsi.errors", "ContractError"),
    "UsageError": ("infrarsi.errors", "UsageError"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'infrarsi' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(where[0]), where[1])
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
