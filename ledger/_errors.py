"""The one exception the ledger raises."""

from __future__ import annotations

__all__ = ["LedgerError"]


class LedgerError(Exception):
    """A ledger is missing, unreadable, tampered with, or asked to do something it must refuse.

    Messages name the ledger file (or key folder), what was found and what was expected,
    so the person reading them knows what to fix.
    """
