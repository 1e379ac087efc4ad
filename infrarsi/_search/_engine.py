"""`infrarsi search`: multi-start, model-guided exploration, then promotion through `verify`.

Exploration runs each candidate once, through the same cheap checks and run
judgement as `verify` (``--pairs 0``), so a cheating or numerics-changing candidate
is rejected before it can look fast. The models are refit after every execution.
Promotion sends the best candidates by posterior through the full `verify`
pipeline; only a candidate with a receipt is promoted, and the best promoted one
is the result.

The ledger is the search's memory: every execution is committed the moment it
ends, under the search's batch names, so ``--resume`` rebuilds the state from it.

This module only orchestrates: a `SearchSession` (`_session`) holds what the parts
share; `Proposals`, `Resumption`, `Exploration` and `Promotion` each take it and do
one phase, in that order.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

from infrarsi._revision import check_baseline_current
from infrarsi._search._exploring import Exploration
from infrarsi._search._parallel import ParallelExploration, check_workers
from infrarsi._search._promoting import Promotion
from infrarsi._search._proposing import Proposals
from infrarsi._search._resuming import Resumption
from infrarsi._search._session import META_KEY, SearchSession
from infrarsi._search.strategy._proposers import Proposer
from infrarsi._search.strategy._state import (
    Observation,
    SearchOutcome,
    SearchState,
    exploration_budget,
    long_runs,
    promotion_cost,
)
from infrarsi._workspace import Workspace, open_workspace
from infrarsi.errors import UsageError

__all__ = ["search", "SearchOutcome", "Observation", "SearchState", "promotion_cost", "exploration_budget"]


def _run(
    session: SearchSession, resumed: bool, proposers: list[Proposer] | None, pack: dict | None, promote: bool
) -> SearchOutcome:
    """The whole search: gather proposals, replay a resumed ledger, explore, then promote."""
    meta, contract = session.meta, session.ws.contract
    budget = meta["budget"]
    exploration = budget
    if promote:
        exploration, _ = exploration_budget(
            budget, contract.search.promote_top, contract.search.ab_pairs, contract.ab_max_pairs, long_runs(contract)
        )
    Proposals(session, proposers, pack).gather()
    Resumption(session).replay()
    session.tick("explore")
    if meta.get("phase") != "promote":  # a resume after promotion began does not explore again
        workers = int(meta.get("workers", 1))
        devices = check_workers(session.ws.contract, workers, meta.get("devices"))
        if workers == 1 and devices:  # the one worker's GPUs, for every run of the search
            session.ws.executor.devices = devices[0]
        explorer = ParallelExploration(session, pack, workers, devices) if workers > 1 else Exploration(session, pack)
        explorer.explore(exploration)
    if promote:
        meta["phase"] = "promote"
        session.save()
        Promotion(session).promote(budget)
    meta["finished"] = True
    result = _outcome(session, resumed)
    meta["incompatibilities"] = result.incompatibilities  # for `infrarsi report`
    session.save()
    return result


def _outcome(session: SearchSession, resumed: bool) -> SearchOutcome:
    """What this search found and what it cost, from its ledger rows."""
    rows = session.rows()
    by_status: dict[str, int] = {}
    for r in rows:
        by_status[f"{r.get('kind')}:{r['status']}"] = by_status.get(f"{r.get('kind')}:{r['status']}", 0) + 1
    cost = {
        "device_s": round(sum(r.get("device_s") or 0.0 for r in rows), 3),
        "llm_tokens": int(sum(r.get("llm_tokens") or 0 for r in rows)),
        "llm_cost": round(sum(r.get("llm_cost") or 0.0 for r in rows), 6),
        "executions": sum(1 for r in rows if r.get("kind") != "proposal"),
        "by_status": dict(sorted(by_status.items())),
    }
    promoted = [
        {"knobs": a["knobs"], "patches": a["patches"], "speedup": a["speedup"], "receipt": a["receipt"]}
        for a in session.attempts
        if a.get("accepted") and a.get("receipt")
    ]
    best = max(promoted, key=lambda a: a["speedup"]["median"]) if promoted else None
    proposals = {name: session.origins[name] for name in session.patches}
    state = session.state
    return SearchOutcome(
        session.id,
        best,
        promoted,
        session.attempts,
        cost["executions"],
        sum(1 for r in rows if r.get("kind") == "search"),
        session.meta["budget"],
        cost,
        state.failures.incompatibilities()
        + [
            {"atoms": [f"+{p}" for p in sorted(c)], "learned": True, "why": "the patches do not apply together"}
            for c in state.conflicts
        ],
        state.rescued,
        proposals,
        resumed,
        session.messages,
        session.history,
        session.meta.get("catalog", []),
        _coverage(session, cost["executions"]),
    )


def _coverage(session: SearchSession, executions: int) -> dict:
    """How much of the space was tried, and why the search stopped where it did."""
    space, meta = session.space, session.meta
    tried = len(session.state.tried())
    return {
        "points": space.size,
        "tried": tried,
        "untried": max(space.size - tried, 0),
        "budget": meta["budget"],
        "budget_left": max(meta["budget"] - executions, 0),
        "exploration_stopped": meta.get("explore_stop"),
        "promotion": meta.get("promote_stop"),
    }


def _stored_flags(contract_path: str | Path) -> dict | None:
    """The [executor] flags the unfinished search ran with (None: none, or nothing to resume,
    which opening the workspace then says)."""
    from infrarsi._workspace import LEDGER_NAME
    from infrarsi.contract import load_contract
    from infrarsi.ledger import Ledger

    ledger_path = load_contract(contract_path).state_dir / LEDGER_NAME
    if not ledger_path.exists():
        return None
    with Ledger.open(ledger_path) as ledger:
        previous = ledger.get_meta(META_KEY)
    return json.loads(previous).get("executor_flags") if previous else None


def _check_workspace(ws: Workspace) -> None:
    """The workspace must be the one `init` pinned: otherwise every candidate would fail the same way."""
    from infrarsi._hashing import hash_protected
    from infrarsi.verifiers import check_manifest

    contract = ws.contract
    check = check_manifest(
        ws.manifest.body,
        ws.manifest.signature,
        contract.sha256,
        ws.ledger.public_key,
        hash_protected(contract.workspace, contract.protected_globs),
    )
    if not check.passed:
        raise UsageError(
            f"{contract.workspace}: {check.detail}; restore the protected files, or pin them as they are now "
            f"with `infrarsi init --update` (a contract revision; a new baseline where they changed what it measured)"
        )


def search(
    contract_path: str | Path = "infrarsi.toml",
    budget: int | None = None,
    resume: bool = False,
    pack: str | Path | None = None,
    seed: int | None = None,
    proposers: list[Proposer] | None = None,
    progress: Callable[[str, int, int, str], None] | None = None,
    promote: bool = True,
    workers: int | None = None,
    executor_flags: dict | None = None,
    devices: list[str] | None = None,
) -> SearchOutcome:
    """Search knobs x patches under the contract; only candidates with receipts are promoted.

    ``workers`` explorations run at once (default 1; a resumed search keeps its own unless
    given), where `check_workers` allows it; promotions run one at a time.

    ``promote=False`` spends the whole budget exploring and promotes nothing (so ``best``
    is None): for benchmarks that score exploration alone, never for a result.

    ``devices`` (GPU indexes) give each local worker its own ``CUDA_VISIBLE_DEVICES``, which lets a
    GPU job run several at once (`check_workers`).

    ``executor_flags``: [executor] keys replaced for this search (a resumed one keeps its own
    unless given); the hardware keys must be the baseline's.
    """
    if resume and executor_flags is None:
        executor_flags = _stored_flags(contract_path)
    with open_workspace(contract_path, executor_flags=executor_flags) as ws:
        stored = ws.ledger.latest_baseline()
        if stored is None:
            raise UsageError(f"{ws.contract.path}: no baseline recorded; run `infrarsi baseline` first")
        check_baseline_current(ws.ledger, ws.manifest, stored, ws.contract)
        pack_data = None
        if pack is not None:
            from infrarsi._search._pack import load_pack

            pack_data = load_pack(pack)
        _check_workspace(ws)
        previous = ws.ledger.get_meta(META_KEY)
        if resume:
            if previous is None:
                raise UsageError(f"{ws.contract.path}: --resume: no search has been started in this workspace")
            meta = json.loads(previous)
            if meta.get("finished"):
                raise UsageError(
                    f"--resume: the last search ({meta['id']}) finished; nothing to resume "
                    f"(run `infrarsi search` for a new one)"
                )
            if budget is not None:
                meta["budget"] = budget
            stored = ws.ledger.baseline(meta["baseline_id"]) if "baseline_id" in meta else stored
            if stored is None:
                raise UsageError(f"--resume: the baseline the search started with ({meta['baseline_id']}) is missing")
            check_baseline_current(ws.ledger, ws.manifest, stored, ws.contract)
            if pack_data is None and meta.get("pack"):
                from infrarsi._search._pack import load_pack

                pack_data = load_pack(meta["pack"])
        else:
            meta = {
                "id": uuid.uuid4().hex[:12],
                "seed": ws.contract.search.seed if seed is None else seed,
                "budget": ws.contract.search.budget_executions if budget is None else budget,
                "pack": str(Path(pack).resolve()) if pack else None,
                "finished": False,
                "baseline_id": stored["id"],
            }
        if workers is not None:
            meta["workers"] = workers
        if devices is not None:
            meta["devices"] = list(devices)
        meta["executor_flags"] = ws.contract.executor_flags
        check_workers(ws.contract, int(meta.get("workers", 1)), meta.get("devices"))
        if promote:
            section = ws.contract.search
            exploration_budget(
                meta["budget"], section.promote_top, section.ab_pairs, ws.contract.ab_max_pairs, long_runs(ws.contract)
            )
        ws.ledger.set_meta(META_KEY, json.dumps(meta, sort_keys=True))
        return _run(SearchSession(ws, stored, meta, progress), resume, proposers, pack_data, promote)
