"""libcst source audits of patches and training loops: timing boundary and shortcut rules.

Each rule is one module under ``rules/`` with its ``VALID`` / ``INVALID`` examples;
``audit_source`` judges one file, ``audit_diff`` what a patch adds, and
``check_sources`` turns a candidate's changed files into ``audit.*`` check results.
"""

from infrarsi.errors import SourceError

from ._audit import AUDITOR_VERSION, RULES, audit_check_ids, audit_diff, audit_source, check_sources
from ._rule import AuditContext, Example, Finding, Rule
from ._source import SourceModel

__all__ = [
    "AUDITOR_VERSION",
    "RULES",
    "audit_check_ids",
    "audit_diff",
    "audit_source",
    "check_sources",
    "AuditContext",
    "Example",
    "Finding",
    "Rule",
    "SourceError",
    "SourceModel",
]
