"""Every error InfraRSI raises, in one place: what each means and how the command line ends on it.

Bad input (``USAGE_ERRORS``) ends a command with exit 2 and a message naming what, where and
what was expected; a refusal or a failed measurement ends it with exit 1. This module imports
nothing, so any part (the ledger, the verifiers, the probe's neighbours) can raise these.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "UsageError",
    "ContractError",
    "ManifestError",
    "LedgerError",
    "GitError",
    "PatchParseError",
    "PatchRejected",
    "SourceError",
    "BaselineFailed",
    "BaselineRejected",
    "ApplyRefused",
    "ExecutionInterrupted",
    "USAGE_ERRORS",
]


class UsageError(Exception):
    """Bad input on the command line or in a call: the CLI exits 2."""


class ContractError(Exception):
    """A contract that cannot be used: which file, which key, what was expected."""

    def __init__(self, file: str, key: str | None, message: str, line: int | None = None) -> None:
        self.file, self.key, self.line, self.message = file, key, line, message
        where = file if line is None else f"{file}:{line}"
        super().__init__(f"{where}: {key}: {message}" if key else f"{where}: {message}")


class ManifestError(Exception):
    """The manifest is missing, unreadable, or its signature does not verify."""


class LedgerError(Exception):
    """A ledger is missing, unreadable, tampered with, or asked to do something it must refuse.

    Messages name the ledger file (or key folder), what was found and what was expected,
    so the person reading them knows what to fix.
    """


class GitError(Exception):
    """A git command failed; the message has git's own words."""


class PatchParseError(ValueError):
    """The text is not a unified diff we can read."""


class PatchRejected(Exception):
    """A patch did not apply; ``message`` is git's own."""

    def __init__(self, patch: str, message: str) -> None:
        self.patch, self.message = patch, message
        super().__init__(f"patch {patch!r} does not apply: {message}")


class SourceError(ValueError):
    """The text is not Python that libcst can parse."""


class BaselineFailed(Exception):
    """A baseline run did not finish with a complete measured window: nothing to compare against."""


class BaselineRejected(BaselineFailed):
    """The baseline ran but can't support verification (its self-check found problems): not stored.

    ``summary`` is what was measured (its ``self_check`` holds the problems); every run is in the ledger.
    """

    def __init__(self, summary, problems: list):
        self.summary = summary
        self.problems = problems
        lines = [f"  - {p.check} [{p.key or 'the script'}]: {p.message}" for p in problems]
        super().__init__(
            "the baseline can't support verification, so it is not stored as the reference "
            "(`infrarsi baseline --force` stores it anyway, marked):\n" + "\n".join(lines)
        )


class ApplyRefused(Exception):
    """The receipt or the workspace does not allow the candidate to be applied (exit 1)."""


class ExecutionInterrupted(KeyboardInterrupt):
    """infrarsi was stopped (^C, SIGTERM) while a workload ran: the workload is gone, and
    ``result`` is the execution as far as it got (an ``ExecutionResult``), for the ledger,
    before the interrupt goes on."""

    def __init__(self, result: Any) -> None:
        super().__init__(result.detail)
        self.result = result


# The errors that mean bad input: the command line prints the message and exits 2.
USAGE_ERRORS: tuple[type[BaseException], ...] = (UsageError, ContractError, ManifestError, LedgerError, GitError)
