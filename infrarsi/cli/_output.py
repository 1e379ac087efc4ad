"""What every verb shares on the way out: exit codes, one JSON object or the human text, progress bars."""

from __future__ import annotations

import json
import sys

__all__ = ["EXIT_OK", "EXIT_REJECTED", "EXIT_USAGE", "emit", "progress_bar", "pct", "num"]

# DESIGN.md: 0 success / accepted / clean, 1 rejected / findings / a run that did not succeed, 2 bad input.
EXIT_OK, EXIT_REJECTED, EXIT_USAGE = 0, 1, 2


def emit(args, payload: dict, human: str) -> None:
    """``payload`` as one JSON object under --json, else the human text."""
    if args.json:
        print(json.dumps(payload, sort_keys=True))
    else:
        print(human)


def progress_bar(args, label: str):
    """A rich progress bar on a TTY; None (quiet) under --json or when piped."""
    if args.json or not sys.stderr.isatty():
        return None
    from infrarsi.cli._progress import ProgressBar

    return ProgressBar(label)


def pct(value) -> str:
    return "n/a" if value is None else f"{value * 100:.2f}%"


def num(value, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)
