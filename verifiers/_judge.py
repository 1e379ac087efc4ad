"""All verifiers of one candidate run, in the order `verify` reports them."""

from __future__ import annotations

from dataclasses import dataclass

from ._evidence import BaselineReference, RunEvidence
from ._integrity import check_run_integrity
from ._numerics import check_grad_norm, check_trajectory
from ._precision import check_precision
from ._result import CheckResult
from ._timing import check_clock, check_window

__all__ = ["Rules", "judge_run", "RULE_VERSION"]

# Bumped whenever a verifier's judgement can change for the same evidence; stored with
# every verdict so `infrarsi audit` can say which rule version gave it.
# 2: operator dtypes and per-parameter gradient norms at sampled steps; 3: a warm-up step's tokens may be
# uncounted (None), as its time may be
RULE_VERSION = "verifiers-3"


@dataclass(frozen=True)
class Rules:
    """The contract's numbers that the verifiers need (plain values: no contract object)."""

    warmup_steps: int
    measure_steps: int
    loss_rtol: float
    grad_norm_rtol: float
    precision: tuple[str, ...]
    require: tuple[str, ...]

    @classmethod
    def from_contract(cls, contract) -> "Rules":
        n = contract.numerics
        return cls(
            contract.timing.warmup_steps,
            contract.timing.measure_steps,
            float(n.loss_rtol),
            float(n.grad_norm_rtol),
            tuple(n.precision),
            tuple(n.require),
        )


def judge_run(run: RunEvidence, reference: BaselineReference, rules: Rules) -> list[CheckResult]:
    """integrity.protected/framework, timing.window/clock, numerics.loss/grad_norm/precision."""
    steps = run.steps
    total = rules.warmup_steps + rules.measure_steps
    return [
        *check_run_integrity(run.integrity),
        check_window(run, rules.warmup_steps, rules.measure_steps, reference.tokens_per_step),
        check_clock(run, rules.warmup_steps, rules.measure_steps),
        check_trajectory("loss", steps, reference, rules.loss_rtol, total, "loss" in rules.require),
        check_grad_norm(steps, reference, rules.grad_norm_rtol, total, "grad_norm" in rules.require, run.sampled_steps),
        check_precision(steps, list(rules.precision), "precision" in rules.require, run.sampled_steps, reference),
    ]
