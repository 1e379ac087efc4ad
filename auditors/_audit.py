"""Running the rules: one source, a baseline/patch pair, or a candidate's changed files."""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections import Counter

from infrarsi.errors import SourceError
from infrarsi.verifiers import CheckResult

from . import rules as _rules_package
from ._rule import AuditContext, Finding, Rule
from ._source import SourceModel

__all__ = ["AUDITOR_VERSION", "RULES", "audit_source", "audit_diff", "check_sources", "audit_check_ids"]

# Bump when a rule changes what it finds, so stored verdicts say which rules gave them.
AUDITOR_VERSION = "auditors-2"


def _load_rules() -> dict[str, Rule]:
    found: dict[str, Rule] = {}
    for info in sorted(pkgutil.iter_modules(_rules_package.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{_rules_package.__name__}.{info.name}")
        rule = getattr(module, "RULE", None)
        if not isinstance(rule, Rule) or rule.id != info.name:
            raise RuntimeError(f"auditors/rules/{info.name}.py must define RULE, a Rule with id {info.name!r}")
        found[rule.id] = rule
    return found


RULES: dict[str, Rule] = _load_rules()


def audit_check_ids() -> tuple[str, ...]:
    """The ``audit.*`` check ids, one per rule."""
    return tuple(f"audit.{rule_id}" for rule_id in RULES)


@functools.lru_cache(maxsize=4)
def _model(text: str, path: str) -> SourceModel:
    """Parsed sources are immutable here, so a baseline audited against many patches is parsed once."""
    return SourceModel(text, path)


@functools.lru_cache(maxsize=4)
def _plain_findings(text: str, path: str, rule_id: str, precision: tuple, protected: tuple) -> tuple[Finding, ...]:
    return tuple(RULES[rule_id].check(_model(text, path), _context(precision, protected)))


def _context(precision, protected, baseline=None) -> AuditContext:
    return AuditContext(tuple(precision), tuple(protected), baseline)


def audit_source(text: str, path: str = "<string>", precision=("fp32",), protected=()) -> list[Finding]:
    """Every rule that needs no baseline, over one source; raises SourceError if it does not parse."""
    source = SourceModel(text, path)
    ctx = _context(precision, protected)
    return [f for rule in RULES.values() if not rule.needs_baseline for f in rule.check(source, ctx)]


def audit_diff(
    baseline_text: str, patched_text: str, path: str = "<string>", precision=("fp32",), protected=()
) -> list[Finding]:
    """The findings a patch introduces: diff-aware rules, plus shortcut findings the baseline lacks.

    A shortcut the baseline already has is the user's own code, not the candidate's doing;
    findings are matched by rule, message and source text, not by line, so moved code stays matched.
    """
    precision, protected = tuple(precision), tuple(protected)
    before = _model(baseline_text, path)
    after = SourceModel(patched_text, path)
    plain, diff = _context(precision, protected), _context(precision, protected, before)
    findings: list[Finding] = []
    for rule in RULES.values():
        if rule.needs_baseline:
            findings += rule.check(after, diff)
            continue
        already = Counter(f.key for f in _plain_findings(baseline_text, path, rule.id, precision, protected))
        for f in rule.check(after, plain):
            if already[f.key] > 0:
                already[f.key] -= 1
            else:
                findings.append(f)
    return findings


def check_sources(sources: dict[str, tuple[str | None, str | None]], precision, protected) -> list[CheckResult]:
    """One ``audit.<rule>`` CheckResult per rule over a candidate's changed Python files.

    ``sources`` maps a workspace path to (baseline text or None if created, patched text or
    None if deleted). A baseline that does not parse leaves the audit without evidence
    (``unchecked``); a patched file that does not parse fails.
    """
    ids = audit_check_ids()
    by_rule: dict[str, list[Finding]] = {rule_id: [] for rule_id in RULES}
    for path, (before, after) in sorted(sources.items()):
        try:
            if before is not None:
                _model(before, path)
        except SourceError as exc:
            return [CheckResult(cid, "unchecked", f"the baseline's {exc}") for cid in ids]
        try:
            if before is None:
                found = audit_source(after or "", path, precision, protected)
            else:
                found = audit_diff(before, after or "", path, precision, protected)
        except SourceError as exc:
            return [CheckResult(cid, "fail", f"the patched {exc}") for cid in ids]
        for f in found:
            by_rule[f.rule].append(f)
    audited = ", ".join(sorted(sources)) or "no Python file changed"
    results = []
    for rule_id, cid in zip(RULES, ids):
        found = by_rule[rule_id]
        if found:
            shown = "; ".join(str(f) for f in found[:3]) + (f" (+{len(found) - 3} more)" if len(found) > 3 else "")
            results.append(CheckResult(cid, "fail", shown, {"findings": [f.to_json() for f in found]}))
        else:
            results.append(CheckResult(cid, "pass", f"{RULES[rule_id].message}: not found ({audited})"))
    return results
