"""The verify batches of a ledger, re-judged when each ends: ``stats.speedup`` from its A/B rows'
step times (the looks verify took), and ``numerics.convergence`` from its long runs' losses."""

from __future__ import annotations

import json

from infrarsi._audit._stored import Evidence, run_evidence
from infrarsi._longruns import LONG_KINDS, calibrated_margin, margin_source
from infrarsi._verify import stored_step_time
from infrarsi.contract import Contract
from infrarsi.verifiers import (
    UNCALIBRATED,
    CheckResult,
    Rules,
    check_convergence,
    check_speedup,
    run_losses,
    runner_step_time,
)

__all__ = ["Batches"]


class Batches:
    """A/B step times and long-run losses per verify batch, re-judged when the batch ends.

    A verify batch's rows are consecutive (one `verify` at a time writes them), so only
    the current batch is held.
    """

    def __init__(self, ev: Evidence) -> None:
        self.ev = ev
        self.incomplete: list[dict] = []
        self._start(None)

    def _start(self, batch: str | None) -> None:
        self.batch, self.anchor, self.contract, self.anchor_row = batch, None, None, None
        self.planned: int | None = None
        self.plan: dict = {}
        self.rows, self.decided = 0, False
        self.times: dict[str, list[float]] = {"ab-baseline": [], "ab-candidate": []}
        self.untimed = 0
        self.losses: dict[str, list[list[float] | str]] = {kind: [] for kind in LONG_KINDS.values()}
        self.long_failed = False

    def add(self, row: dict, contract) -> list[tuple[int, CheckResult]]:
        done = []
        if row.get("batch") != self.batch:
            done = self.flush()
            self._start(row.get("batch"))
        if row.get("kind") == "verify":
            self.anchor, self.contract, self.anchor_row = row["id"], contract, row
            self.plan = _plan(self.ev, row)
            runs = self.plan.get("runs")
            self.planned = runs if isinstance(runs, int) and runs > 0 else None
        elif row.get("kind") in self.times and row["status"] == "ok" and isinstance(contract, Contract):
            # Today's step time: the mean period on the runner's clock, from the stored stamps
            # (a row recorded when the probe's regions were the step time is timed anew).
            run = run_evidence(self.ev, row)
            step = (
                None
                if isinstance(run, str)
                else runner_step_time(run, contract.timing.warmup_steps, contract.timing.measure_steps)
            )
            if step is not None:
                self.times[row["kind"]].append(step)
            else:
                self.untimed += 1
        elif row.get("kind") in self.losses:
            self._long_run(row, contract)
        if self.anchor is not None:
            self.rows += 1
            cut = row["status"] == "crash" and str(row.get("detail") or "").startswith("interrupted")
            self.decided |= row["status"] != "ok" and not cut
        return done

    def _long_run(self, row: dict, contract) -> None:
        """A long run's losses, for the batch's numerics.convergence (a failed one ended the long runs)."""
        if row["status"] != "ok":
            self.long_failed = True
            return
        conv = contract.convergence if isinstance(contract, Contract) else None
        run = run_evidence(self.ev, row)
        if conv is None or isinstance(run, str):
            self.losses[row["kind"]].append("no [numerics.convergence] in its contract" if conv is None else run)
            return
        self.losses[row["kind"]].append(run_losses(run, conv.steps))

    def flush(self) -> list[tuple[int, CheckResult]]:
        judged = self._judge() + self._convergence()
        # Only a sequential plan can decide before its last pair; a batch of the fixed design
        # (recorded before ab_max_pairs) that has fewer rows than planned was cut.
        decided = (
            bool(judged)
            and "ab_max_pairs" in self.plan
            and judged[0][1].evidence.get("decision") in ("pass", "fail", "drift")
        )
        long_runs = self.plan.get("long_runs") if isinstance(self.plan.get("long_runs"), int) else 0
        taken = sum(len(v) for v in self.losses.values())
        if judged and judged[0][1].evidence.get("decision") == "pass" and 0 < taken < long_runs:
            decided = self.long_failed  # the A/B passed; the long runs were cut unless one failed
        if self.planned and self.rows < self.planned and not (self.decided or decided):
            # Cut short with every run so far passing and the A/B's looks undecided: a verify
            # that never decided, which claims nothing (no receipt before the deciding look).
            self.incomplete.append(
                {"batch": self.batch, "execution": self.anchor, "runs": self.rows, "planned": self.planned}
            )
        return judged

    def _judge(self) -> list[tuple[int, CheckResult]]:
        base, cand = self.times["ab-baseline"], self.times["ab-candidate"]
        if self.anchor is None or not base or not isinstance(self.contract, Contract):
            return []
        pairs = min(len(base), len(cand))
        if self.untimed:
            return [
                (
                    self.anchor,
                    CheckResult(
                        "stats.speedup",
                        "unchecked",
                        f"{self.untimed} A/B run(s) have no complete measured window on the runner's clock",
                    ),
                )
            ]
        stored = stored_step_time(self.ev.summary(self.ev.baseline_for(self.anchor_row)) or {})
        search = self.contract.search
        # The looks the verify planned (a batch recorded before the sequential A/B: one look at every pair).
        first, most = self.plan.get("ab_pairs"), self.plan.get("ab_max_pairs")
        sequential = isinstance(most, int)
        if sequential:  # the looks verify took: from max(ab_pairs, 2) pairs to ab_max_pairs
            first = max(first if isinstance(first, int) else 2, 2)
            most = max(most, first)
        check, _ = check_speedup(
            base[:pairs],
            cand[:pairs],
            float(search.min_speedup),
            first if sequential else pairs,
            stored=stored,
            drift_floor=float(search.drift_tolerance),
            max_pairs=most if sequential else None,
        )
        return [(self.anchor, check)]

    def _convergence(self) -> list[tuple[int, CheckResult]]:
        """numerics.convergence of the batch's long runs, where it has every one of them."""
        base, cand = self.losses["long-baseline"], self.losses["long-candidate"]
        if self.anchor is None or not base or self.long_failed or len(base) != len(cand):
            return []
        conv = self.contract.convergence if isinstance(self.contract, Contract) else None
        bad = next((x for x in base + cand if isinstance(x, str)), None)
        if conv is None or bad is not None or len(base) < conv.seeds:
            why = bad or ("no [numerics.convergence] in the contract" if conv is None else "fewer long runs than seeds")
            return [(self.anchor, CheckResult("numerics.convergence", "unchecked", f"long runs: {why}"))]
        calibration = (self.ev.summary(self.ev.baseline_for(self.anchor_row)) or {}).get("calibration")
        rules = Rules.from_contract(self.contract, calibration)
        if rules.loss_rtol is None:
            return [(self.anchor, CheckResult("numerics.convergence", "unchecked", f"loss_rtol: {UNCALIBRATED}"))]
        margin = calibrated_margin(conv.margin, calibration)
        judged = check_convergence(base, cand, conv.tail, rules.loss_rtol, margin, margin_source(conv.margin))
        return [(self.anchor, judged)]


def _plan(ev: Evidence, row: dict) -> dict:
    """A verify batch's plan (``runs`` = 1 + 2 x the most A/B pairs, ``ab_pairs`` before the first
    look, ``ab_max_pairs``), from its candidate row's evidence; {} where it has none."""
    stored = ev.blob(row.get("evidence_hash"))
    try:
        plan = json.loads(stored).get("plan") if stored else None
    except (ValueError, AttributeError):
        return {}
    return plan if isinstance(plan, dict) else {}
