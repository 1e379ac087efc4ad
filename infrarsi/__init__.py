"""InfraRSI: faster training setups, promoted only with a full receipt.

Importing the package is cheap: heavy modules (torch, the runner, the ledger)
load only when a public name that needs them is first used.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "ContractError",
    "Contract",
    "load_contract",
    "init",
    "baseline",
    "run",
    "verify",
    "verify_receipt",
    "demo",
]

_LAZY = {
    "ContractError": "infrarsi._contract",
    "Contract": "infrarsi._contract",
    "load_contract": "infrarsi._contract",
    "init": "infrarsi._workspace",
    "baseline": "infrarsi._baseline",
    "run": "infrarsi._workspace",
    "verify": "infrarsi._verify",
    "verify_receipt": "infrarsi._receipt",
    "demo": "infrarsi._demo",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'infrarsi' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
