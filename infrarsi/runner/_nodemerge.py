"""A job across nodes as one execution (runner/_nodes.py runs each node's part).

**Merging** (the driver, once every node's result is in): the receipts of all ranks, each line
with the rank the kernel named on its node and the arrival stamp of that node's runner. A
node's clock is not another's, so nothing compares stamps across nodes: every rank is judged
on its own lines, against its own node's launch (``rank_started_ns``), and the step time is
the slowest rank's window. The largest rank's memory; the integrity records of every node
(a file any node changed, a stray any node killed). The execution is ``oom`` if any node's was,
else the first node's failure; a node stopped because a peer failed is never the cause.
"""

from __future__ import annotations

import dataclasses

from infrarsi.runner._executor import ExecutionResult, conclude
from infrarsi.runner._nodes import PEER_FAILED

__all__ = ["merge_nodes"]

_SEVERITY = {"oom": 0, "timeout": 1, "crash": 2, "rejected": 3}


def merge_nodes(contract, parts: list[ExecutionResult], sample_all: bool) -> ExecutionResult:
    """One ExecutionResult from every node's (``parts``, any order)."""
    parts = sorted(parts, key=lambda p: p.evidence.get("node", {}).get("rank", 0))
    if any("started_ns" not in p.evidence for p in parts):  # a node rejected the patch, or never ran
        return _first_failure(parts)
    per_node = contract.task.nproc_per_node
    lines: list[str] = []
    arrivals: list[int | None] = []
    line_ranks: list[int] = []
    rank_started: dict[str, int] = {}
    nodes = []
    for part in parts:
        ev = part.evidence
        own = part.receipts.decode("utf-8", "replace").split("\n")[:-1] if part.receipts else []
        lines += own
        arrivals += list(ev.get("arrivals_ns") or [])
        line_ranks += list(ev.get("line_ranks") or [])
        first_rank = _rank(part) * per_node
        rank_started.update({str(r): ev["started_ns"] for r in range(first_rank, first_rank + per_node)})
        nodes.append(
            {
                **ev.get("node", {}),
                "slurm_node": (ev.get("slurm") or {}).get("node"),
                "status": part.status,
                "detail": part.detail,
                "exit_code": part.exit_code,
                "started_ns": ev["started_ns"],
                "ended_ns": ev["ended_ns"],
                "peak_rss_bytes": ev["guard"]["peak_rss_bytes"],
                "integrity": ev["integrity"],
                "fingerprint": ev.get("fingerprint"),
            }
        )
    first = parts[0].evidence
    guards = [p.evidence["guard"] for p in parts]
    cause = _cause(parts)
    evidence = {
        **first,
        "ranks": contract.ranks,
        "line_ranks": line_ranks,
        "rank_peak_rss_bytes": {k: v for p in parts for k, v in (p.evidence.get("rank_peak_rss_bytes") or {}).items()},
        "arrivals_ns": arrivals,
        "rank_started_ns": rank_started,
        "stdout_lines": sum(p.evidence.get("stdout_lines", 0) for p in parts),
        "guard": {
            **guards[0],
            "samples": sum(g["samples"] for g in guards),
            "max_gap_ms": max(g["max_gap_ms"] for g in guards),
            "peak_rss_bytes": max(g["peak_rss_bytes"] for g in guards),
            "censored": any(g["censored"] for g in guards),
        },
        "integrity": _merged_integrity([p.evidence["integrity"] for p in parts]),
        "nodes": nodes,
        "fingerprint": {**(first.get("fingerprint") or {}), "slurm_nodes": [n["slurm_node"] for n in nodes]},
    }
    evidence.pop("node", None)
    detail = cause.detail if cause.status == "ok" else f"node {_rank(cause)}: {cause.detail}"
    return conclude(
        contract,
        cause.candidate,
        status=cause.status,
        detail=detail,
        exit_code=cause.exit_code,
        lines=lines,
        evidence=evidence,
        peak_rss_bytes=evidence["guard"]["peak_rss_bytes"],
        wall_s=max(p.wall_s for p in parts),
        device_s=sum(p.device_s for p in parts),
        stderr_tail=_tails(parts, cause),
        sources=parts[0].sources,
        sample_all=sample_all,
    )


def _rank(part) -> int:
    return part.evidence.get("node", {}).get("rank", 0)


def _cause(parts: list):
    """The node whose status the execution takes: oom first, then the first other failure that
    was not a stop for a peer's, else node 0 (every node ok)."""
    failed = [p for p in parts if p.status != "ok" and p.detail != PEER_FAILED]
    if not failed:
        failed = [p for p in parts if p.status != "ok"]
    if not failed:
        return parts[0]
    return min(failed, key=lambda p: (_SEVERITY.get(p.status, 9), _rank(p)))


def _first_failure(parts: list):
    cause = _cause(parts)
    if len(parts) > 1 and cause.status != "ok":
        cause = dataclasses.replace(cause, detail=f"node {_rank(cause)}: {cause.detail}")
    return cause


def _tails(parts: list, cause) -> str:
    """The cause's stderr first, then the others', each under its node."""
    ordered = [cause] + [p for p in parts if p is not cause]
    text = "\n".join(f"--- node {_rank(p)}\n{p.stderr_tail}" for p in ordered if p.stderr_tail)
    return text[:8000]


def _union(values: list) -> list:
    out: list = []
    for items in values:
        for item in items or []:
            if item not in out:
                out.append(item)
    return out


def _merged_integrity(records: list[dict]) -> dict:
    """What any node saw: a protected file changed on one node is changed; one node's stray is a stray."""
    environments = [r.get("environment") or {} for r in records]
    boxes = [r.get("containment") or {} for r in records]
    kinds = {b.get("cgroup") for b in boxes}
    return {
        "protected_changed_before_run": _union([r.get("protected_changed_before_run") for r in records]),
        "protected_changed_by_run": _union([r.get("protected_changed_by_run") for r in records]),
        "workspace_changed_by_run": _union([r.get("workspace_changed_by_run") for r in records]),
        "protected_after": records[0].get("protected_after"),
        "framework_changed": _union([r.get("framework_changed") for r in records]),
        "containment": {
            **boxes[0],
            "subreaper": all(b.get("subreaper") for b in boxes),
            "cgroup": kinds.pop() if len(kinds) == 1 else None,
            "cgroup_peak_bytes": max((b.get("cgroup_peak_bytes") or 0 for b in boxes), default=0) or None,
            "strays": [{**s, "node": i} for i, b in enumerate(boxes) for s in b.get("strays") or []],
            "killed": sum(b.get("killed") or 0 for b in boxes),
            "root_lost": any(b.get("root_lost") for b in boxes),
        },
        "environment": {
            key: _union([e.get(key) for e in environments])
            for key in ("roots", "added", "changed", "deleted", "removed", "caches_removed")
        },
        "environment_changed": _union([r.get("environment_changed") for r in records]),
    }
