"""Proposers: where the patches a search may combine come from, behind one protocol.

A proposer sees a :class:`ProposalContext` (the editable sources, the baseline's
diagnosis, the contract) and returns :class:`Proposal` objects, each one unified diff
relative to the workspace. Proposers are not trusted: the search screens every
proposal (scope, the source audit) before it can run, records the ones that fail as
``rejected`` executions (with the LLM tokens and cost they took), and runs the rest
only in sandbox copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from infrarsi.contract import Contract, PatchRef, matches_any

__all__ = ["Proposal", "ProposalContext", "Proposer", "ContractProposer", "editable_sources"]


@dataclass(frozen=True)
class Proposal:
    """One proposed patch. ``patch.name`` is ``<origin>:<short name>``, e.g. ``catalog:sdpa``."""

    patch: PatchRef
    origin: str  # the proposer's name: contract, catalog, llm
    rationale: str = ""
    llm_tokens: int = 0
    llm_cost: float = 0.0


@dataclass(frozen=True)
class ProposalContext:
    workspace: Path
    contract: Contract
    editable: dict[str, str]  # workspace-relative posix path -> text, the editable .py files
    diagnosis: dict = field(default_factory=dict)  # the baseline summary (step time, noise, memory, MFU)


class Proposer(Protocol):
    name: str

    def propose(self, context: ProposalContext) -> list[Proposal]:
        """Patches worth trying; may be empty. Must not write the workspace."""
        ...


class ContractProposer:
    """The patches the contract declares, under their own names."""

    name = "contract"

    def propose(self, context: ProposalContext) -> list[Proposal]:
        out = []
        for spec in context.contract.patches:
            text = spec.path.read_text(encoding="utf-8")
            out.append(Proposal(PatchRef(spec.name, text), self.name, f"declared in {context.contract.path.name}"))
        return out


def editable_sources(contract: Contract) -> dict[str, str]:
    """The workspace's editable Python files (outside ``.infrarsi/``), by relative path."""
    root = contract.workspace
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(".infrarsi/") or not matches_any(rel, contract.scope.editable):
            continue
        if matches_any(rel, contract.protected_globs):
            continue
        try:
            out[rel] = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
    return out
