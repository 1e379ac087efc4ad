"""The exceptions that mean bad input (exit 2), gathered in one place for the CLI."""

from __future__ import annotations

__all__ = ["usage_errors"]


def usage_errors() -> tuple[type[BaseException], ...]:
    from infrarsi._candidate import UsageError
    from infrarsi._contract import ContractError
    from infrarsi._git import GitError
    from infrarsi._manifest import ManifestError
    from infrarsi.ledger import LedgerError

    return (UsageError, ContractError, ManifestError, LedgerError, GitError)
