"""Receipts from stdout (``evidence = "log"``): the contract's regexes over stamped lines.

Times come from the runner's clock, not the job's: each line that matches the
``step`` regex ends that step at the moment the runner read it, and the step
began when the previous step line arrived (the process start for the first).
``loss``, ``grad_norm`` and ``tokens`` are taken from the step line itself or
from later lines before the next step line; the first value seen wins.

Step numbers are the job's own. A log that counts from 0 (the first step line
says 0) is shifted by one, so that its steps line up with the runner's 1-based
window; the printed number is kept in ``extra.log_step``. A log that prints
every k-th step gives records k steps apart, which leave the measured window
incomplete instead of passing off k steps as one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

__all__ = ["compile_patterns", "receipts_from_log"]

_VALUE_KEYS = ("loss", "grad_norm", "tokens")
_TRAILING = " \t,;:."


def compile_patterns(patterns: Mapping[str, str | re.Pattern]) -> dict[str, re.Pattern]:
    """The contract's ``[evidence.log]`` table as compiled regexes (compiled ones pass through)."""
    if "step" not in patterns:
        raise ValueError("[evidence.log] needs a `step` regex")
    return {key: re.compile(pattern) for key, pattern in patterns.items() if pattern is not None}


def receipts_from_log(
    lines: Iterable[tuple[int, str]], patterns: Mapping[str, str | re.Pattern], start_ns: int
) -> list[dict]:
    """Step records, in arrival order, from ``(stamp_ns, text)`` lines; never raises on their content."""
    compiled = compile_patterns(patterns)
    step_re = compiled["step"]
    value_res = [(key, compiled[key]) for key in _VALUE_KEYS if key in compiled]
    records: list[dict] = []
    seen: set[int] = set()
    current: dict | None = None  # the record that later lines may still fill in
    previous_ns = start_ns
    offset: int | None = None
    for stamp, text in lines:
        found = step_re.search(text)
        number = _int(_group(found)) if found else None
        if number is not None:
            if offset is None:
                offset = 1 if number == 0 else 0
            if number + offset in seen:
                current = None  # a repeat (an eval line, a resumed log): the first one stands
                continue
            seen.add(number + offset)
            current = {
                "type": "step",
                "step": number + offset,
                "t0_ns": previous_ns,
                "t1_ns": stamp,
                "tokens": None,
                "loss": None,
                "grad_norm": None,
                "peak_mem_bytes": None,
                "clock": "runner",
                "extra": {"log_step": number},
            }
            records.append(current)
            previous_ns = stamp
        if current is None:
            continue
        for key, regex in value_res:
            if current[key] is None and (match := regex.search(text)):
                current[key] = _int(_group(match)) if key == "tokens" else _float(_group(match))
    return records


def _group(match: re.Match) -> str | None:
    try:
        return match.group(1)
    except IndexError:  # a pattern without a group: the contract loader forbids it, be safe anyway
        return match.group(0)


def _float(text: str | None) -> float | None:
    """The number in ``text`` (NaN and inf kept: a diverged loss is evidence), else None."""
    if text is None:
        return None
    for candidate in (text, text.strip().rstrip(_TRAILING)):
        try:
            return float(candidate)
        except (ValueError, OverflowError):
            continue
    return None


def _int(text: str | None) -> int | None:
    """A whole number in ``text`` ("12", "1_000", "12.0", "1e3"), else None."""
    if text is None:
        return None
    try:
        return int(text.strip().rstrip(_TRAILING))
    except ValueError:
        pass
    value = _float(text)
    if value is None or value != value or value in (float("inf"), float("-inf")) or value != int(value):
        return None
    return int(value)
