"""What a report shows, read from the ledger alone: baseline, receipts, attempts, costs.

Receipts come from the ledger's own copies (blobs of kind ``receipt``) and, for
ledgers written before it kept them, the ``receipts/`` folder beside it. Each one is
checked against the ledger's public key; one that does not verify is listed as such
and never shown as a promotion.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from infrarsi.contract import changes_from
from infrarsi.ledger import Ledger

__all__ = ["ReportData", "Promotion", "load_report_data", "RESOURCE_KINDS"]

# Executions that measure a candidate (what the search and `verify` launched), not the baseline.
RESOURCE_KINDS = (
    "search",
    "run",
    "verify",
    "ab-baseline",
    "ab-candidate",
    "long-baseline",
    "long-candidate",
    "proposal",
)


@dataclass
class Promotion:
    """One accepted candidate: its receipt, its changes and what they bought."""

    receipt_id: str
    knobs: dict[str, str]
    changes: list[str]  # knob=value settings that differ from the baseline, then patch names
    patches: list[dict]  # {name, sha256, text}
    speedup: dict
    checks: list[dict]
    executions: list[int]
    ab: dict
    mfu_before: float | None
    mfu_after: float | None
    step_before_s: float | None
    step_after_s: float | None
    convergence: dict | None = None  # the receipt's long-run claim, with its curves (numerics.convergence)


@dataclass
class ReportData:
    ledger: Path
    chain_ok: bool
    chain_detail: str
    contract_name: str
    memory_limit_mb: float | None
    baseline: dict | None
    baseline_knobs: dict[str, str]
    rows: list[dict]
    promotions: list[Promotion]
    bad_receipts: list[dict] = field(default_factory=list)
    incompatibilities: list[dict] = field(default_factory=list)

    @property
    def best(self) -> Promotion | None:
        return max(self.promotions, key=lambda p: p.speedup["median"], default=None)

    def changes(self, row: dict) -> list[str]:
        """A row's knob settings that differ from the baseline, then its patches."""
        knobs = row.get("knobs") or {}
        return changes_from(self.baseline_knobs, knobs, [p["name"] for p in row.get("patches") or []])

    def attempts(self) -> list[dict]:
        """Executions that tried a candidate or re-measured one, proposals (screening only) left out."""
        return [r for r in self.rows if r.get("kind") in RESOURCE_KINDS and r.get("kind") != "proposal"]

    def resources(self) -> dict:
        """Executions by kind and status, device-seconds, LLM tokens and cost; failures included."""
        table: dict[tuple[str, str], dict] = {}
        for r in self.rows:
            cell = table.setdefault((r.get("kind") or "?", r["status"]), {"executions": 0, "device_s": 0.0})
            cell["executions"] += 1
            cell["device_s"] += r.get("device_s") or 0.0
        spent = [r for r in self.rows if r.get("kind") in RESOURCE_KINDS]
        by_status: dict[str, int] = {}
        for r in spent:
            by_status[r["status"]] = by_status.get(r["status"], 0) + 1
        return {
            "table": [{"kind": k, "status": s, **v} for (k, s), v in sorted(table.items())],
            "executions": len(self.rows),
            "device_s": sum(r.get("device_s") or 0.0 for r in self.rows),
            "search_device_s": sum(r.get("device_s") or 0.0 for r in spent),
            "search_by_status": by_status,
            "llm_tokens": int(sum(r.get("llm_tokens") or 0 for r in self.rows)),
            "llm_cost": float(sum(r.get("llm_cost") or 0.0 for r in self.rows)),
        }

    def net(self) -> dict | None:
        """The search's device-seconds against the time the best candidate saves per step."""
        best, base = self.best, self.baseline
        if best is None or not base:
            return None
        step = base["step_time_s"]["median"]
        saving = step * (1.0 - 1.0 / best.speedup["median"])
        cost = self.resources()["search_device_s"]
        return {
            "search_device_s": cost,
            "saving_per_step_s": saving,
            "baseline_step_s": step,
            "break_even_steps": (cost / saving) if saving > 0 else None,
        }

    def best_so_far(self) -> list[tuple[int, float]]:
        """(executions launched so far, best verified speedup by then) after each attempt."""
        receipted = sorted((max(p.executions), p.speedup["median"]) for p in self.promotions if p.executions)
        out, best, i = [], 1.0, 0
        for n, row in enumerate(self.attempts(), start=1):
            while i < len(receipted) and receipted[i][0] <= row["id"]:
                best = max(best, receipted[i][1])
                i += 1
            out.append((n, best))
        return out

    def failures(self) -> list[dict]:
        """Crashes and timeouts, with the changes that were running and why they stopped."""
        return [
            {
                "execution": r["id"],
                "status": r["status"],
                "changes": self.changes(r),
                "detail": (r.get("detail") or "").strip(),
            }
            for r in self.attempts()
            if r["status"] in ("crash", "timeout")
        ]


def _contract_facts(ledger: Ledger) -> tuple[str, float | None]:
    """The task name and memory limit from the contract `init` stored (tolerant of an odd one)."""
    import tomllib

    digest = ledger.get_meta("contract_sha256")
    data = ledger.get_blob(digest) if digest else None
    try:
        raw = tomllib.loads(data.decode()) if data else {}
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        raw = {}
    limit = (raw.get("resources") or {}).get("memory_limit_mb")
    name = (raw.get("task") or {}).get("name")
    return (
        str(name) if name else "unnamed task",
        float(limit) if isinstance(limit, (int, float)) and not isinstance(limit, bool) else None,
    )


def _promotion(ledger: Ledger, body: dict, receipt_id: str, baseline_knobs: dict, mfu: float | None) -> Promotion:
    knobs = dict(body.get("knobs") or {})
    patches = []
    for p in body.get("patches") or []:
        text = ledger.get_blob(p.get("sha256", ""))
        patches.append(
            {
                "name": p.get("name"),
                "sha256": p.get("sha256"),
                "text": text.decode("utf-8", "replace") if text else None,
            }
        )
    ab = body.get("ab") or {}
    before = statistics.median(ab["baseline_s"]) if ab.get("baseline_s") else None
    after = statistics.median(ab["candidate_s"]) if ab.get("candidate_s") else None
    speedup = body.get("speedup") or {}
    # The same work per step (numerics held), so utilisation scales with the step time.
    mfu_after = mfu * speedup["median"] if mfu is not None and speedup.get("median") else None
    changes = changes_from(baseline_knobs, knobs, [p["name"] for p in patches])
    return Promotion(
        receipt_id,
        knobs,
        changes,
        patches,
        speedup,
        list(body.get("checks") or []),
        [int(e) for e in body.get("executions") or []],
        ab,
        mfu,
        mfu_after,
        before,
        after,
        body.get("convergence") if isinstance(body.get("convergence"), dict) else None,
    )


def _incompatibilities(ledger: Ledger) -> list[dict]:
    """What the last search learned cannot run together (kept in its meta state, with the rows)."""
    raw = ledger.get_meta("search:current")
    try:
        state = json.loads(raw) if raw else {}
    except ValueError:
        return []
    found = state.get("incompatibilities") if isinstance(state, dict) else None
    return [f for f in found or [] if isinstance(f, dict) and isinstance(f.get("atoms"), list)]


def load_report_data(ledger_path: str | Path) -> ReportData:
    """Read everything the report shows from the ledger at ``ledger_path`` (never written to)."""
    from infrarsi._manifest import trusted_key
    from infrarsi._receipt import check_receipt, ledger_receipts

    path = Path(ledger_path)
    found = trusted_key(path.parent)
    trusted, problem = found.key, found.problem
    with Ledger.open(path) as ledger:
        chain = ledger.verify_chain(trusted)
        chain_ok, chain_detail = chain.ok and problem is None, chain.detail
        if problem:
            chain_detail = f"{chain_detail}; {problem}"
        elif trusted is None:
            chain_detail += " (checked with the key the ledger itself holds: no manifest beside it pins one)"
        name, limit = _contract_facts(ledger)
        stored = ledger.latest_baseline()
        summary = stored["summary"] if stored else None
        baseline_knobs = dict((summary or {}).get("knobs") or {})
        rows = [
            {k: v for k, v in r.items() if k not in ("sources", "verdicts", "stderr_tail", "signature")}
            for r in ledger.executions()
        ]
        promotions, bad = [], []
        for receipt_id, data in ledger_receipts(ledger).items():
            check = check_receipt(data, trusted or ledger.public_key)
            if not check.ok:
                bad.append({"receipt": receipt_id, "problems": check.problems})
                continue
            body = json.loads(data)["receipt"]
            promotions.append(_promotion(ledger, body, receipt_id, baseline_knobs, (summary or {}).get("mfu")))
        promotions.sort(key=lambda p: -p.speedup["median"])
        return ReportData(
            path,
            chain_ok,
            chain_detail,
            name,
            limit,
            summary,
            baseline_knobs,
            rows,
            promotions,
            bad,
            _incompatibilities(ledger),
        )
