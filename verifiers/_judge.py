"""All verifiers of one candidate run, in the order `verify` reports them."""

from __future__ import annotations

from dataclasses import dataclass

from ._evidence import BaselineReference, RunEvidence
from ._integrity import check_run_integrity
from ._numerics import check_grad_norm, check_trajectory
from ._precision import check_precision
from ._result import CheckResult
from ._timing import check_clock, check_window

__all__ = ["Rules", "judge_run", "combine_ranks", "resolve_tolerance", "RULE_VERSION", "UNCALIBRATED"]

# Bumped whenever a verifier's judgement can change for the same evidence; stored with
# every verdict so `infrarsi audit` can say which rule version gave it.
# 2: operator dtypes and per-parameter gradient norms at sampled steps; 3: a warm-up step's tokens may be
# uncounted (None), as its time may be; 4: a job of several ranks is judged rank by rank, its steps
# ended by the slowest rank
RULE_VERSION = "verifiers-5"


@dataclass(frozen=True)
class Rules:
    """The contract's numbers that the verifiers need (plain values: no contract object)."""

    warmup_steps: int
    measure_steps: int
    loss_rtol: float | None  # None: the contract says "calibrated" and no calibration is at hand
    grad_norm_rtol: float | None
    precision: tuple[str, ...]
    require: tuple[str, ...]

    @classmethod
    def from_contract(cls, contract, calibration: dict | None = None) -> "Rules":
        """The contract's rules; a tolerance the contract calls ``"calibrated"`` is taken from
        ``calibration`` (the stored baseline's, `infrarsi baseline --calibrate`)."""
        n = contract.numerics
        return cls(
            contract.timing.warmup_steps,
            contract.timing.measure_steps,
            resolve_tolerance(n.loss_rtol, "loss_rtol", calibration),
            resolve_tolerance(n.grad_norm_rtol, "grad_norm_rtol", calibration),
            tuple(n.precision),
            tuple(n.require),
        )


def resolve_tolerance(value, key: str, calibration: dict | None) -> float | None:
    """A contract tolerance as a number: itself, or for ``"calibrated"`` the calibration's ``key``
    (None where there is none)."""
    if value != "calibrated":
        return float(value)
    found = (calibration or {}).get(key)
    if isinstance(found, bool) or not isinstance(found, (int, float)) or not found > 0:
        return None
    return float(found)


UNCALIBRATED = 'the contract says "calibrated" and the baseline holds no calibration (`infrarsi baseline --calibrate`)'


def judge_run(run: RunEvidence, reference: BaselineReference, rules: Rules) -> list[CheckResult]:
    """integrity.protected/framework, timing.window/clock, numerics.loss/grad_norm/precision.

    A job of several ranks is judged rank by rank against the same rank of the baseline, and
    a check passes only where it passes for every rank; the step time is the job's
    (:func:`merged_steps`), never one rank's."""
    if run.line_ranks is not None:
        per_rank = [_judge_one(run.of_rank(r), reference.rank(r), rules) for r in range(run.ranks)]
        return [*check_run_integrity(run.integrity), *combine_ranks(per_rank)]
    return [*check_run_integrity(run.integrity), *_judge_one(run, reference, rules)]


def _judge_one(run: RunEvidence, reference: BaselineReference, rules: Rules) -> list[CheckResult]:
    steps = run.steps
    total = rules.warmup_steps + rules.measure_steps
    return [
        check_window(run, rules.warmup_steps, rules.measure_steps, reference.tokens_per_step),
        check_clock(run, rules.warmup_steps, rules.measure_steps),
        check_trajectory("loss", steps, reference, rules.loss_rtol, total, "loss" in rules.require)
        if rules.loss_rtol is not None
        else CheckResult("numerics.loss", "unchecked", f"loss_rtol: {UNCALIBRATED}"),
        check_grad_norm(steps, reference, rules.grad_norm_rtol, total, "grad_norm" in rules.require, run.sampled_steps)
        if rules.grad_norm_rtol is not None
        else CheckResult("numerics.grad_norm", "unchecked", f"grad_norm_rtol: {UNCALIBRATED}"),
        check_precision(steps, list(rules.precision), "precision" in rules.require, run.sampled_steps, reference),
    ]


def combine_ranks(per_rank: list[list[CheckResult]]) -> list[CheckResult]:
    """Each check over every rank: it fails where one rank fails, is unchecked where one rank has
    no evidence, and passes where all pass (or is skipped where all skip it). The details name
    the ranks they are about."""
    out = []
    for results in zip(*per_rank):
        first = results[0]
        wrong = [(r, c) for r, c in enumerate(results) if c.status in ("fail", "unchecked")]
        if wrong:
            status = "fail" if any(c.status == "fail" for _, c in wrong) else "unchecked"
            detail = "; ".join(f"rank {r}: {c.detail}" for r, c in wrong)
            out.append(CheckResult(first.id, status, detail, wrong[0][1].evidence))
        elif all(c.status == "skipped" for c in results):
            out.append(first)
        elif any(c.status == "skipped" for c in results):  # some ranks had nothing to judge: not a pass
            skipped = [(r, c) for r, c in enumerate(results) if c.status == "skipped"]
            detail = "; ".join(f"rank {r}: {c.detail}" for r, c in skipped)
            out.append(CheckResult(first.id, "skipped", detail, skipped[0][1].evidence))
        else:
            out.append(
                CheckResult(first.id, "pass", f"every one of {len(results)} ranks: {first.detail}", first.evidence)
            )
    return out
