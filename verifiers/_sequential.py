"""The sequential A/B: look after every pair from ``min_pairs`` to ``max_pairs``, stop when decided.

A verify on a noisy machine should not give up on a real 2x after five pairs, and should
not spend twenty pairs on a candidate that is plainly faster. So `verify` runs
``min_pairs`` back-to-back pairs, then looks; while the interval still straddles
``min_speedup`` it adds one pair and looks again, up to ``max_pairs``.

Error control across the looks: a Bonferroni split
------------------------------------------------------
Looking several times and stopping at the first pass raises the false-pass rate: each
look is one more chance for noise to clear the bar. The split used here spends the
one-sided error ``alpha = 1 - confidence`` evenly over the ``K = max_pairs - min_pairs + 1``
possible looks, so each look's bound is a one-sided ``1 - alpha / K`` bound (the t bound
of ``_stats``, unchanged otherwise). By the union bound the chance that *any* look
passes a candidate whose true speedup is ``min_speedup`` is at most ``K * alpha / K =
alpha``: the same guarantee a single look at ``confidence`` gives, whatever the
correlation between looks (they share pairs, so they are strongly correlated and the real
rate is well below the bound). It is the simplest always-valid rule; group-sequential
boundaries (Pocock, O'Brien-Fleming) spend the error more efficiently but are derived for
a known variance or rely on the looks' joint normal law, which five pairs of
run times on a shared machine do not give.

The price is a wider bound at each look. It is paid back in power by the later looks: in
the seeded simulation (``tests/verifiers/test_sequential.py``) with looks at 5..10 pairs,
3% lognormal noise per run and ``min_speedup`` 1.02, an A/A comparison passes about 0.1%
of the time (target at most 1%), and a true 1.10x passes more than 99% (target at least
95%), on about 5.3 pairs on average.

Stopping for futility: when a look's median speedup is at or below ``min_speedup``, the
effect measured so far does not clear the bar at all, and more pairs of the same would only
narrow an interval around a value that fails; the A/B stops with a fail. (A stricter rule,
the upper bound below the bar, almost never fires in an A/A comparison, which then spends
every pair up to the maximum.) Stopping to fail never passes anything, so it costs no
error; it costs some power near the bar: a true 1.05x at 3% noise is stopped at its first
look about one time in ten. At ``max_pairs`` an undecided A/B fails.

With ``max_pairs == min_pairs`` there is one look at ``confidence``: the fixed design.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._result import CheckResult
from ._stats import DRIFT_FLOOR, METHOD, SpeedupEstimate, _bad_times, baseline_drift, estimate_speedup

__all__ = ["Look", "SequentialPlan", "Decision", "run_looks", "check_speedup", "SEQUENTIAL_METHOD"]

SEQUENTIAL_METHOD = "looks after each pair from min_pairs to max_pairs, one-sided error split evenly (Bonferroni)"


@dataclass(frozen=True)
class SequentialPlan:
    """The looks a sequential A/B may take and the confidence of each look's bounds."""

    min_pairs: int
    max_pairs: int
    confidence: float = 0.95  # overall one-sided coverage, split over the looks

    def __post_init__(self) -> None:
        if self.min_pairs < 2:
            raise ValueError(f"min_pairs must be >= 2, got {self.min_pairs}")
        if self.max_pairs < self.min_pairs:
            raise ValueError(f"max_pairs ({self.max_pairs}) must be >= min_pairs ({self.min_pairs})")
        if not 0.5 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0.5, 1), got {self.confidence}")

    @property
    def looks(self) -> int:
        return self.max_pairs - self.min_pairs + 1

    @property
    def look_confidence(self) -> float:
        """Each look's one-sided coverage: the error ``1 - confidence`` split evenly over the looks."""
        return 1.0 - (1.0 - self.confidence) / self.looks

    def to_json(self) -> dict:
        return {
            "min_pairs": self.min_pairs,
            "max_pairs": self.max_pairs,
            "confidence": self.confidence,
            "look_confidence": self.look_confidence,
            "method": SEQUENTIAL_METHOD,
        }


@dataclass(frozen=True)
class Look:
    pairs: int
    median: float
    ci_low: float
    ci_high: float
    decision: str  # pass | fail | drift | continue

    def to_json(self) -> dict:
        return {
            "pairs": self.pairs,
            "median": self.median,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "decision": self.decision,
        }


@dataclass(frozen=True)
class Decision:
    """Where the looks ended: ``status`` pass | fail | drift | undecided (more pairs are due)."""

    status: str
    looks: list[Look]
    estimate: SpeedupEstimate | None  # at the deciding (or last) look
    drift: str | None = None

    @property
    def pairs(self) -> int:
        return self.looks[-1].pairs if self.looks else 0


def run_looks(
    baseline_s: list[float],
    candidate_s: list[float],
    min_speedup: float,
    plan: SequentialPlan,
    stored: tuple[float, float | None] | None = None,
    drift_floor: float = DRIFT_FLOOR,
) -> Decision:
    """Take the plan's looks over the pairs given (complete pairs, valid times: the caller checks),
    stopping at the first that decides. Pairs past the deciding look are never looked at: the
    rule is judged on the pairs it had when it stopped, so extra runs can't change a verdict.

    A look decides ``pass`` when its lower bound clears ``min_speedup``, ``fail`` when its median
    ratio is at or below it or it is the last look, and ``drift`` when the baseline arm so far
    strayed from the stored baseline (``stored``: its median step time and CV) beyond what its
    noise allows.
    """
    looks: list[Look] = []
    estimate = None
    n_max = min(len(baseline_s), len(candidate_s), plan.max_pairs)
    for n in range(plan.min_pairs, n_max + 1):
        base, cand = baseline_s[:n], candidate_s[:n]
        estimate = estimate_speedup(base, cand, confidence=plan.look_confidence)
        drifted = baseline_drift(base, *stored, floor=drift_floor) if stored else None
        if drifted:
            decision = "drift"
        elif estimate.ci_low > min_speedup:
            decision = "pass"
        elif estimate.median <= min_speedup or n == plan.max_pairs:
            decision = "fail"
        else:
            decision = "continue"
        looks.append(Look(n, estimate.median, estimate.ci_low, estimate.ci_high, decision))
        if decision != "continue":
            return Decision(decision, looks, estimate, drifted)
    return Decision("undecided", looks, estimate)


def check_speedup(
    baseline_s: list[float],
    candidate_s: list[float],
    min_speedup: float,
    pairs_required: int,
    confidence: float = 0.95,
    stored: tuple[float, float | None] | None = None,
    drift_floor: float = DRIFT_FLOOR,
    max_pairs: int | None = None,
) -> tuple[CheckResult, SpeedupEstimate | None]:
    """``stats.speedup``: passes only when a look's lower bound of the speedup is above ``min_speedup``.

    The looks run from ``pairs_required`` (at least 2) to ``max_pairs``; see the module docstring.
    Without ``max_pairs`` there is one look, at ``confidence``, over every pair given. The result
    is ``unchecked`` (which fails) when the lists differ in length, there are fewer pairs than the
    first look needs, a time is
    non-finite or <= 0, the looks ran out of pairs before deciding, or ``stored`` (the stored
    baseline's median step time and CV, on the same clock) is given and the baseline arm drifted
    from it beyond what that noise (at least ``drift_floor``) allows.
    """
    cid = "stats.speedup"
    baseline_s, candidate_s = list(baseline_s), list(candidate_s)
    base_ev = {"baseline_s": baseline_s, "candidate_s": candidate_s, "method": METHOD}
    need = max(int(pairs_required), 2)
    missing = None
    if len(baseline_s) != len(candidate_s):
        missing = (
            f"{len(baseline_s)} baseline times but {len(candidate_s)} candidate times; runs must come in complete pairs"
        )
    elif len(baseline_s) < need:
        missing = f"{len(baseline_s)} complete A/B pairs, {need} required"
    else:
        missing = _bad_times("baseline_s", baseline_s) or _bad_times("candidate_s", candidate_s)
    if missing:
        return CheckResult(cid, "unchecked", missing, base_ev), None

    if max_pairs is None:  # the fixed design: one look, at every pair given
        plan = SequentialPlan(len(baseline_s), len(baseline_s), confidence)
    else:
        plan = SequentialPlan(need, max(need, int(max_pairs)), confidence)
    decided = run_looks(baseline_s, candidate_s, min_speedup, plan, stored, drift_floor)
    est = decided.estimate
    evidence = {
        **base_ev,
        "ratios": est.ratios,
        "median": est.median,
        "ci_low": est.ci_low,
        "ci_high": est.ci_high,
        "sequential": {**plan.to_json(), "min_speedup": min_speedup},
        "looks": [look.to_json() for look in decided.looks],
        "decision": decided.status,
    }
    at = f"look {len(decided.looks)} of up to {plan.looks}" if plan.looks > 1 else "one look"
    summary = (
        f"speedup {est.median:.3f}x [{est.ci_low:.3f}, {est.ci_high:.3f}]"
        f" ({plan.look_confidence * 100:.3g}% one-sided bounds over {est.pairs} pairs, {at})"
    )
    if decided.status == "drift":
        return CheckResult(cid, "unchecked", f"{summary}, not trusted: {decided.drift}", evidence), est
    if decided.status == "undecided":
        return (
            CheckResult(
                cid,
                "unchecked",
                f"{summary}; undecided with {len(baseline_s)} pairs: the A/B stopped before "
                f"its last look ({plan.max_pairs} pairs)",
                evidence,
            ),
            est,
        )
    if decided.status == "pass":
        return CheckResult(cid, "pass", f"{summary}; the lower bound clears {min_speedup:g}", evidence), est
    why = f"the lower bound must clear {min_speedup:g}"
    if est.median <= min_speedup:
        why += "; the median does not clear it either, so more pairs would not help"
    return CheckResult(cid, "fail", f"{summary}; {why}", evidence), est
