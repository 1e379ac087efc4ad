"""``[evidence.log]``: the regexes that read a job's own log lines as receipts (``evidence = "log"``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from infrarsi.contract._schema import LOG_FIELDS
from infrarsi.errors import ContractError

__all__ = ["log_patterns_of"]


def log_patterns_of(raw: Any, kind: str, file: str, section: Callable, fail: Callable) -> dict[str, str] | None:
    """The validated patterns, or None without the table; ``section`` and ``fail`` are the parser's."""
    if raw is None:
        if kind == "log":
            raise ContractError(
                file,
                "[evidence.log]",
                'evidence = "log" needs an [evidence.log] table with at least a `step` regex',
            )
        return None
    if not isinstance(raw, dict) or set(raw) - {"log"}:
        fail(None, "evidence", "expected only the table [evidence.log]")
    if kind != "log":
        fail("evidence.log", None, f'[evidence.log] is only used with evidence = "log" (task.evidence is {kind!r})')
    values = section("evidence.log", raw.get("log", {}), LOG_FIELDS)
    patterns = {k: v for k, v in values.items() if v is not None}
    for key, pattern in patterns.items():
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            fail("evidence.log", key, f"expected a regular expression, got {pattern!r}: {exc}")
        if compiled.groups != 1:
            fail(
                "evidence.log",
                key,
                f"expected a regex with exactly one capture group, got {compiled.groups} in {pattern!r}",
            )
    return patterns
