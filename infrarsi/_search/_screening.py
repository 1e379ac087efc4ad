"""Where proposals come from in a search, and the screening each must pass before it joins the space."""

from __future__ import annotations

import os
import subprocess

from infrarsi._search.strategy._proposers import ContractProposer, Proposer
from infrarsi._workspace import Workspace
from infrarsi.auditors import check_sources
from infrarsi.contract import PatchRef
from infrarsi.errors import PatchParseError, PatchRejected
from infrarsi.runner import changed_sources
from infrarsi.verifiers import CheckResult, check_scope

__all__ = ["default_proposers", "screen", "failing_checks"]


def default_proposers(ws: Workspace, messages: list[str]) -> list[Proposer]:
    wanted = ws.contract.search.proposers
    out: list[Proposer] = []
    if "contract" in wanted:
        out.append(ContractProposer())
    if "catalog" in wanted:
        from infrarsi._search.strategy._catalog import CatalogProposer

        out.append(CatalogProposer())
    if "llm" in wanted:
        from infrarsi._search.strategy._llm import LLMProposer, llm_config

        config, why = llm_config(ws.contract.search.values, os.environ)
        messages.append(f"LLM proposer {why}")
        if config is not None:
            out.append(LLMProposer(config))
    return out


def screen(ws: Workspace, patch: PatchRef) -> list[CheckResult]:
    """The cheap checks a proposal must pass before it may join the space: scope and the audit."""
    contract = ws.contract
    checks = check_scope({patch.name: patch.text}, list(contract.scope.editable), list(contract.protected_globs))
    if any(not c.passed for c in checks):
        return checks
    try:
        sources = changed_sources(contract.workspace, (patch,))
    except (PatchRejected, PatchParseError) as exc:
        return checks + [CheckResult("scope.apply", "fail", f"does not apply: {exc}")]
    except (OSError, ValueError, subprocess.SubprocessError) as exc:  # a path too long, git timing out, ...
        return checks + [CheckResult("scope.apply", "fail", f"cannot be applied here: {type(exc).__name__}: {exc}")]
    return checks + check_sources(sources, contract.numerics.precision, contract.protected_globs)


def failing_checks(row: dict) -> list[str]:
    """The ids of a stored row's checks that failed or had no evidence."""
    return [
        v.get("id")
        for v in row.get("verdicts") or []
        if isinstance(v, dict) and v.get("status") in ("fail", "unchecked")
    ]
