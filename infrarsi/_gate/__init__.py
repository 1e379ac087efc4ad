"""`infrarsi gate`: pass a pull request's speed claim only with a full receipt, carried or measured here."""

from infrarsi._gate._gate import TRUSTED_KEYS_FILE, GateOutcome, gate

__all__ = ["gate", "GateOutcome", "TRUSTED_KEYS_FILE"]
