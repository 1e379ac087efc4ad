"""The search's proposals: ask every proposer once, screen what came from outside the contract.

Screened proposals join the search space as patches; the raw and the screened lists are
kept in the search's meta, so a resume (which asks no LLM again) sees the same space.
"""

from __future__ import annotations

from infrarsi._search._screening import default_proposers, screen
from infrarsi._search._session import SearchSession
from infrarsi._search.strategy._proposers import ContractProposer, Proposal, ProposalContext, Proposer, editable_sources
from infrarsi.contract import Candidate, PatchRef
from infrarsi.runner import ExecutionResult, pre_images

__all__ = ["Proposals"]


class Proposals:
    """The search's patches: asked of the proposers (None: the contract's choice) once, then screened."""

    def __init__(
        self, session: SearchSession, proposers: list[Proposer] | None = None, pack: dict | None = None
    ) -> None:
        self.session, self.proposers, self.pack = session, proposers, pack

    def gather(self) -> None:
        """Ask the proposers once per search, screen what they proposed, and add it to the space.

        The raw proposals are saved before screening and the screened ones after, both in
        the order they came (so a resume, which asks no LLM again, sees the same space).
        """
        session, meta = self.session, self.session.meta
        if "raw_proposals" not in meta:
            meta["raw_proposals"] = [
                [p.patch.name, p.patch.text, p.origin, p.llm_tokens, p.llm_cost] for p in self._ask()
            ]
            session.save()
        if "proposals" not in meta:
            accepted: list[list[str]] = []
            names, texts = set(), set()
            for name, text, origin, tokens, cost in meta["raw_proposals"]:
                if text in texts:
                    continue
                texts.add(text)
                if name in names:
                    session.messages.append(f"proposal {name} ({origin}): a patch of that name is already in; skipped")
                    continue
                patch = PatchRef(name, text)
                if origin != "contract" and not self._screened_in(patch, tokens, cost):
                    continue
                names.add(name)
                accepted.append([name, text, origin])
            meta["proposals"] = accepted
            session.save()
        for name, text, origin in meta["proposals"]:
            session.patches[name] = PatchRef(name, text)
            session.origins[name] = origin
            session.space.add_patch(name)
        state = session.state
        state.baseline.point = session.space.baseline()
        if self.pack:
            from infrarsi._search._pack import prior_runs

            state.priors = prior_runs(self.pack, session.space, state.baseline.step_time_s, meta.get("pack_aliases"))

    def _ask(self) -> list[Proposal]:
        session = self.session
        contract = session.ws.contract
        context = ProposalContext(contract.workspace, contract, editable_sources(contract), dict(session.summary))
        found: list[Proposal] = []
        proposers = self.proposers if self.proposers is not None else default_proposers(session.ws, session.messages)
        for proposer in proposers:
            name = getattr(proposer, "name", type(proposer).__name__)
            try:
                proposed = list(proposer.propose(context))
            except Exception as exc:  # a proposer is outside code: its failure is a message, not a crash
                session.messages.append(f"proposer {name} failed: {type(exc).__name__}: {exc}")
                continue
            if isinstance(getattr(proposer, "explained", None), list):
                session.meta["catalog"] = proposer.explained
            trusted = isinstance(proposer, ContractProposer)  # only the contract's own patches skip screening
            for proposal in proposed:
                # Text from outside (an LLM, a pack) may hold what UTF-8 cannot: replaced, not fatal.
                text = str(proposal.patch.text).encode("utf-8", "replace").decode("utf-8")
                found.append(
                    Proposal(
                        PatchRef(str(proposal.patch.name), text),
                        "contract" if trusted else (proposal.origin if proposal.origin != "contract" else name),
                        proposal.rationale,
                        int(proposal.llm_tokens),
                        float(proposal.llm_cost),
                    )
                )
        if self.pack:
            from infrarsi._search._pack import pack_patches

            by_text = {p.patch.text: p.patch.name for p in found}
            aliases = {}
            for name, text in pack_patches(self.pack).items():
                text = text.encode("utf-8", "replace").decode("utf-8")
                if text in by_text:  # the same patch under this search's own name
                    aliases[name] = by_text[text]
                else:
                    found.append(Proposal(PatchRef(name, text), "pack", "used by a verified finding of the pack"))
            session.meta["pack_aliases"] = aliases
        return found

    def _screened_in(self, patch: PatchRef, tokens: int, cost: float) -> bool:
        """Screen one proposal and record the screening (with the LLM tokens it took) as a row."""
        ws = self.session.ws
        checks = screen(ws, patch)
        failed = [c for c in checks if not c.passed]
        detail = (
            "proposal rejected: " + "; ".join(f"{c.id}: {c.detail}" for c in failed)
            if failed
            else "proposal screened in (scope and audit pass); its runs are separate executions"
        )
        try:
            sources = pre_images(ws.contract.workspace, (patch,))
        except (OSError, ValueError):
            sources = {}
        result = ExecutionResult(
            Candidate(knobs=ws.contract.baseline_knobs(), patches=(patch,)),
            "rejected" if failed else "ok",
            detail=detail,
            sources=sources,
        )
        ws.record(
            result,
            kind="proposal",
            batch=self.session.batch + "-proposals",
            verdicts=[c.to_json() for c in checks],
            llm_tokens=tokens,
            llm_cost=cost,
        )
        return not failed
