"""`infrarsi lint`: the source audit of one file, alone or against the baseline it patches."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from infrarsi.errors import UsageError

__all__ = ["LintReport", "lint"]


@dataclass
class LintReport:
    file: str
    against: str | None
    contract: str | None
    findings: list

    @property
    def clean(self) -> bool:
        return not self.findings

    def to_json(self) -> dict:
        return {
            "file": self.file,
            "against": self.against,
            "contract": self.contract,
            "findings": [f.to_json() for f in self.findings],
            "clean": self.clean,
        }


def _read(path: str, what: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{path}: {what} not found (expected a Python source file)")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: {what} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def lint(file: str, against: str | None = None, contract: str | None = None) -> LintReport:
    """Audit ``file``; with ``against``, only what it adds over that baseline (and the timing boundary).

    The contract gives the allowed precisions and the protected globs. Without one,
    ``./infrarsi.toml`` is used when it exists, else the strictest defaults: fp32 only,
    nothing protected beyond the contract file itself.
    """
    from infrarsi.auditors import SourceError, audit_diff, audit_source

    precision, protected = ("fp32",), ()
    if contract is None and Path("infrarsi.toml").is_file():
        contract = "infrarsi.toml"
    if contract is not None:
        from infrarsi.contract import load_contract

        loaded = load_contract(contract)
        precision, protected = tuple(loaded.numerics.precision), tuple(loaded.protected_globs)
    text = _read(file, "file to lint")
    try:
        if against is None:
            findings = audit_source(text, file, precision, protected)
        else:
            findings = audit_diff(_read(against, "baseline (--against)"), text, file, precision, protected)
    except SourceError as exc:
        raise UsageError(str(exc)) from None
    findings.sort(key=lambda f: (f.line, f.col, f.rule))
    return LintReport(file, against, contract, findings)
