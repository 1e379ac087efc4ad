"""The human summary of a search: the result first, then what it cost and what it learned."""

from __future__ import annotations

from infrarsi._search.strategy._space import atom_label

__all__ = ["search_summary"]


def _name(candidate: dict) -> str:
    knobs = ", ".join(f"{k}={v}" for k, v in sorted(candidate.get("knobs", {}).items()))
    patches = " + ".join(candidate.get("patches") or []) or "no patches"
    return f"{patches}; {knobs}"


def search_summary(outcome) -> str:
    lines = [
        f"search {outcome.search_id}{' (resumed)' if outcome.resumed else ''}: "
        f"{outcome.executions} of {outcome.budget} executions ({outcome.exploration} exploring)"
    ]
    if outcome.best:
        sp = outcome.best["speedup"]
        lines.append(
            f"  BEST: {sp['median']:.2f}x (95% CI {sp['ci_low']:.2f}-{sp['ci_high']:.2f}) {_name(outcome.best)}"
        )
        lines.append(f"        receipt {outcome.best['receipt']}")
    else:
        lines.append("  no candidate earned a receipt: nothing is promoted")
    for attempt in outcome.attempts:
        verdict = (
            "promoted"
            if attempt.get("accepted")
            else "not promoted (" + ", ".join(attempt.get("failed") or ["no receipt"]) + ")"
        )
        sp = attempt.get("speedup")
        for drop in attempt.get("dropped") or []:
            lines.append(f"  dropped {drop['dropped']} before verifying: {drop['why']}")
        lines.append(f"  verify {_name(attempt)}: {verdict}" + (f", {sp['median']:.2f}x" if sp else ""))
    for found in outcome.incompatibilities:
        kind = "incompatible" if found["learned"] else "failed together"
        lines.append(f"  {kind}: {' + '.join(map(atom_label, found['atoms']))} ({found['why'][:90]})")
    for rescue in outcome.rescued:
        partners = " + ".join(map(atom_label, rescue["rescued_by"]))
        lines.append(f"  rescued an out-of-memory candidate with {partners} (execution {rescue['execution']})")
    for codemod in outcome.catalog:
        if codemod["applied"]:
            lines.append(f"  catalog {codemod['codemod']}: proposed for {', '.join(codemod['applied'])}")
        for why in codemod["not_applied"][:3]:
            lines.append(f"  catalog {codemod['codemod']}: not applied: {why}")
    cover = outcome.coverage
    if cover and cover.get("budget_left"):
        stopped = cover.get("exploration_stopped") or "exploration ended"
        lines.append(
            f"  stopped with {cover['budget_left']} of {cover['budget']} executions left "
            f"({cover['untried']} of {cover['points']} points untried): {stopped}"
            + (f"; promotion: {cover['promotion']}" if cover.get("promotion") else "")
        )
    cost = outcome.cost
    lines.append(
        f"  cost: {cost['device_s']:.1f} device-s, {cost['llm_tokens']} LLM tokens "
        f"(${cost['llm_cost']:.4f}); by status {cost['by_status']}"
    )
    lines += [f"  note: {m}" for m in outcome.messages]
    return "\n".join(lines)
