"""Checks across the keys of one table, beyond each key's own type and range: ``[search]``'s
A/B looks and ``[executor]``'s `#SBATCH` options. ``fail(table, key, message)`` raises."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

__all__ = ["check_search", "check_executor"]

_SBATCH_OPTION = re.compile(r"--[A-Za-z][\w-]*(=\S.*)?")  # long options: submitit writes each as --key=value


def check_search(search: Any, fail: Callable[..., Any]) -> None:
    if search.ab_max_pairs is not None and search.ab_max_pairs < search.ab_pairs:
        fail(
            "search",
            "ab_max_pairs",
            f"expected at least ab_pairs ({search.ab_pairs}), the A/B's first look, got {search.ab_max_pairs}",
        )


def check_executor(executor: Any, fail: Callable[..., Any]) -> None:
    for option in executor.sbatch:
        if not _SBATCH_OPTION.fullmatch(option):
            fail("executor", "sbatch", f'expected options of the form "--key=value", got {option!r}')
