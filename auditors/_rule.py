"""The rule framework: a rule, its examples, the context it judges in, what it finds."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ._source import SourceModel

__all__ = ["AuditContext", "Example", "Finding", "Rule"]


@dataclass(frozen=True)
class Finding:
    """One place where a rule fires."""

    rule: str
    message: str
    path: str
    line: int
    col: int
    code: str = ""

    def to_json(self) -> dict:
        return {
            "rule": self.rule,
            "path": self.path,
            "line": self.line,
            "col": self.col,
            "message": self.message,
            "code": self.code,
        }

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.rule}: {self.message}"

    @property
    def key(self) -> tuple[str, str, str]:
        """What makes two findings the same across a baseline and a patch (not the line)."""
        return (self.rule, self.message, " ".join(self.code.split()))


@dataclass(frozen=True)
class AuditContext:
    """What the contract says that rules need: allowed precisions, protected globs."""

    precision: tuple[str, ...] = ("fp32",)
    protected: tuple[str, ...] = ()
    baseline: SourceModel | None = None

    def allows(self, precision: str) -> bool:
        return precision in self.precision


@dataclass(frozen=True)
class Example:
    """A source snippet a rule must accept (VALID) or flag (INVALID), in a context.

    ``baseline`` makes it a diff-aware example: the snippet is the patched source.
    """

    code: str
    precision: tuple[str, ...] = ("fp32",)
    protected: tuple[str, ...] = ()
    baseline: str | None = None
    note: str = ""


def as_example(item: "Example | str") -> Example:
    return item if isinstance(item, Example) else Example(item)


class Rule:
    """Base for one audit rule: a module under ``rules/`` subclasses it and sets these."""

    id: str = ""
    message: str = ""
    needs_baseline = False  # diff-aware: judges a patched source against its baseline
    VALID: list["Example | str"] = []
    INVALID: list["Example | str"] = []

    def check(self, source: SourceModel, ctx: AuditContext) -> list[Finding]:  # pragma: no cover - abstract
        raise NotImplementedError

    def finding(self, source: SourceModel, node: cst.CSTNode, message: str | None = None) -> Finding:
        line, col = source.position(node)
        code = source.code(source.statement_of(node)).splitlines()
        return Finding(self.id, message or self.message, source.path, line, col, code[0] if code else "")
