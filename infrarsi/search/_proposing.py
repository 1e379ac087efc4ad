"""The search's proposals: ask every proposer once, screen what came from outside the contract.

Screened proposals join the search space as patches; the raw and the screened lists are
kept in the search's meta, so a resume (which asks no LLM again) sees the same space.
"""

from __future__ import annotations

from infrarsi._candidate import Candidate, PatchRef
from infrarsi._runner import ExecutionResult
from infrarsi._sources import pre_images
from infrarsi.search._proposers import ContractProposer, Proposal, ProposalContext, editable_sources
from infrarsi.search._screening import default_proposers, screen


class Proposing:
    """A mixin of the search driver (`_engine._Search`): it uses the driver's ws, meta,
    space, state, patches, origins, messages, batch, journal, executor and bookkeeping."""

    def gather(self) -> None:
        """Ask the proposers once per search, then screen what they proposed.

        The raw proposals are saved before screening and the screened ones after, both in
        the order they came (so a resume, which asks no LLM again, sees the same space).
        """
        if "raw_proposals" not in self.meta:
            self.meta["raw_proposals"] = [[p.patch.name, p.patch.text, p.origin, p.llm_tokens, p.llm_cost]
                                          for p in self._ask()]
            self._save()
        if "proposals" not in self.meta:
            accepted: list[list[str]] = []
            names, texts = set(), set()
            for name, text, origin, tokens, cost in self.meta["raw_proposals"]:
                if text in texts:
                    continue
                texts.add(text)
                if name in names:
                    self.messages.append(f"proposal {name} ({origin}): a patch of that name is already in; skipped")
                    continue
                patch = PatchRef(name, text)
                if origin != "contract" and not self._screened_in(patch, tokens, cost):
                    continue
                names.add(name)
                accepted.append([name, text, origin])
            self.meta["proposals"] = accepted
            self._save()
        for name, text, origin in self.meta["proposals"]:
            self.patches[name] = PatchRef(name, text)
            self.origins[name] = origin
            self.space.add_patch(name)
        self.state.baseline.point = self.space.baseline()
        if self.pack:
            from infrarsi.search._pack import prior_runs

            self.state.priors = prior_runs(self.pack, self.space, self.state.baseline.step_time_s,
                                           self.meta.get("pack_aliases"))

    def _ask(self) -> list[Proposal]:
        context = ProposalContext(self.ws.contract.workspace, self.ws.contract,
                                  editable_sources(self.ws.contract), dict(self.summary))
        found: list[Proposal] = []
        proposers = self._proposers if self._proposers is not None else default_proposers(self.ws, self.messages)
        for proposer in proposers:
            name = getattr(proposer, "name", type(proposer).__name__)
            try:
                proposed = list(proposer.propose(context))
            except Exception as exc:  # a proposer is outside code: its failure is a message, not a crash
                self.messages.append(f"proposer {name} failed: {type(exc).__name__}: {exc}")
                continue
            trusted = isinstance(proposer, ContractProposer)  # only the contract's own patches skip screening
            for proposal in proposed:
                # Text from outside (an LLM, a pack) may hold what UTF-8 cannot: replaced, not fatal.
                text = str(proposal.patch.text).encode("utf-8", "replace").decode("utf-8")
                found.append(Proposal(PatchRef(str(proposal.patch.name), text), "contract" if trusted
                                      else (proposal.origin if proposal.origin != "contract" else name),
                                      proposal.rationale, int(proposal.llm_tokens), float(proposal.llm_cost)))
        if self.pack:
            from infrarsi.search._pack import pack_patches

            by_text = {p.patch.text: p.patch.name for p in found}
            aliases = {}
            for name, text in pack_patches(self.pack).items():
                text = text.encode("utf-8", "replace").decode("utf-8")
                if text in by_text:   # the same patch under this search's own name
                    aliases[name] = by_text[text]
                else:
                    found.append(Proposal(PatchRef(name, text), "pack", "used by a verified finding of the pack"))
            self.meta["pack_aliases"] = aliases
        return found

    def _screened_in(self, patch: PatchRef, tokens: int, cost: float) -> bool:
        """Screen one proposal and record the screening (with the LLM tokens it took) as a row."""
        checks = screen(self.ws, patch)
        failed = [c for c in checks if not c.passed]
        detail = ("proposal rejected: " + "; ".join(f"{c.id}: {c.detail}" for c in failed) if failed
                  else "proposal screened in (scope and audit pass); its runs are separate executions")
        try:
            sources = pre_images(self.ws.contract.workspace, (patch,))
        except (OSError, ValueError):
            sources = {}
        result = ExecutionResult(Candidate(knobs=self.ws.contract.baseline_knobs(), patches=(patch,)),
                                 "rejected" if failed else "ok", detail=detail, sources=sources)
        self.ws.record(result, kind="proposal", batch=self.batch + "-proposals",
                       verdicts=[c.to_json() for c in checks], llm_tokens=tokens, llm_cost=cost)
        return not failed
