"""`infrarsi audit LEDGER.db`: the chain, every blob and signature re-verified, and every stored
execution re-judged from its stored evidence alone with today's rules."""

from infrarsi._audit._reaudit import AuditReport, audit_ledger

__all__ = ["AuditReport", "audit_ledger"]
