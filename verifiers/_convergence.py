"""``numerics.convergence``: the candidate trains the same model as the baseline past the short window.

The short window's checks compare 20-odd steps against the baseline, step by step. A change
can be invisible there and still train a different model later: a learning-rate schedule that
starts to differ at step 40, weight decay, a precision loss that compounds. `verify` trains both
the baseline and the candidate for ``steps`` steps under each of ``seeds`` seeds (run s of
the candidate paired with run s of the baseline: same seed, same data order), and this module
judges the pairs:

- **Equivalence of where they end** (two one-sided tests, TOST): each run's loss averaged over
  its final ``tail`` of steps; the paired differences (candidate minus baseline) get a
  two-sided 90% t interval, which is the pair of one-sided 5% tests. Equivalent when the whole
  interval lies inside ``±margin``. The margin is the contract's (relative to the baseline's
  tail loss) or else the baseline's own seed-to-seed standard deviation of the tail loss (a
  difference as large as changing the seed), never below ``loss_rtol`` of the tail loss (a job
  whose seeds are not wired in has no spread at all).
- **The whole curves**: each run smoothed with a trailing mean over ``steps / 20`` steps, and
  each seed's paired gap at every step (never averaged over seeds: detours that go opposite
  ways under two seeds must not cancel). The largest gap, its step and seed are reported, and
  the step where the curves part (the first where a seed's gap leaves ``±margin``). Curves
  more than ``3 x margin`` apart anywhere fail even where the tails meet again: the candidate
  trained a different model on the way.

It fails both ways: a candidate that trains measurably *better* is not the same job either.

What it does not show: a full run's final quality. ``steps`` is what the contract affords (10x
to 50x the window); a difference that only shows after more steps than that, or only on the
evaluation set, is outside what it covers, and the receipt says how many steps and seeds it did.
"""

from __future__ import annotations

import math
import statistics

from ._evidence import RunEvidence, first_per_step
from ._integrity import check_run_integrity
from ._judge import Rules, combine_ranks
from ._precision import check_precision
from ._result import CheckResult
from ._stats import t_quantile

__all__ = ["run_losses", "judge_long_run", "check_convergence", "CURVE_POINTS"]

CHECK = "numerics.convergence"
CURVE_POINTS = 60  # points of each smoothed curve kept in the evidence (the report plots them)
_APART = 3.0  # curves this many margins apart anywhere fail, whatever the tails say


def run_losses(run: RunEvidence, steps: int) -> list[float] | str:
    """The loss at each step 1..``steps`` (a job of several ranks: the mean over its ranks), or
    why there is none: a step missing, or a loss missing or not finite."""
    per_rank = [run.of_rank(r) for r in range(run.ranks)] if run.line_ranks is not None else [run]
    curves = []
    for rank, one in enumerate(per_rank):
        records = first_per_step(one.steps)
        where = f" (rank {rank})" if len(per_rank) > 1 else ""
        curve = []
        for step in range(1, steps + 1):
            record = records.get(step)
            if record is None:
                return f"no receipt for step {step} of {steps}{where}"
            loss = record.get("loss")
            if isinstance(loss, bool) or not isinstance(loss, (int, float)) or not math.isfinite(loss):
                return f"step {step}{where} has no finite loss ({loss!r})"
            curve.append(float(loss))
        curves.append(curve)
    return [sum(values) / len(values) for values in zip(*curves)]


def judge_long_run(run: RunEvidence, rules: Rules, steps: int) -> list[CheckResult]:
    """One long run's own checks: integrity as any run's, the precision at the runner's sampled
    steps (spread over the whole long run), and ``numerics.convergence`` for a loss at every step
    (the pairs are judged together by :func:`check_convergence`)."""
    per_rank = [run.of_rank(r) for r in range(run.ranks)] if run.line_ranks is not None else [run]
    precision = combine_ranks(
        [
            [check_precision(one.steps, list(rules.precision), "precision" in rules.require, run.sampled_steps)]
            for one in per_rank
        ]
    )
    losses = run_losses(run, steps)
    complete = (
        CheckResult(CHECK, "unchecked", f"a long run of {steps} steps: {losses}")
        if isinstance(losses, str)
        else CheckResult(CHECK, "pass", f"a loss at every one of {steps} steps")
    )
    return [*check_run_integrity(run.integrity), *precision, complete]


def _smooth(curve: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, value in enumerate(curve):
        total += value
        if i >= window:
            total -= curve[i - window]
        out.append(total / min(i + 1, window))
    return out


def _thin(values: list[float], points: int) -> list[list[float]]:
    """[step, value] at about ``points`` evenly spaced steps, the last step always among them."""
    every = max(1, math.ceil(len(values) / points))
    keep = sorted(set(range(every - 1, len(values), every)) | {len(values) - 1})
    return [[i + 1, round(values[i], 6)] for i in keep]


def check_convergence(
    baseline: list[list[float]],
    candidate: list[list[float]],
    tail: float,
    loss_rtol: float,
    margin: float | None = None,
    margin_from: str = "the contract's margin",
) -> CheckResult:
    """Judge paired long runs (``baseline[s]`` and ``candidate[s]`` under seed s, a loss per step)."""
    seeds, steps = len(baseline), len(baseline[0]) if baseline else 0
    if seeds < 2 or len(candidate) != seeds or any(len(c) != steps for c in baseline + candidate):
        return CheckResult(
            CHECK,
            "unchecked",
            f"expected paired long runs of equal length under 2+ seeds, got {seeds} baseline "
            f"and {len(candidate)} candidate runs",
        )
    n_tail = max(2, round(steps * tail))
    base_tail = [statistics.fmean(run[-n_tail:]) for run in baseline]
    cand_tail = [statistics.fmean(run[-n_tail:]) for run in candidate]
    level = abs(statistics.fmean(base_tail))
    spread = statistics.stdev(base_tail)
    if margin is not None:
        bound, source = margin * level, f"{margin_from} ({margin:.3g} of the tail loss)"
    elif spread >= loss_rtol * level:
        bound, source = spread, "the baseline's seed-to-seed spread (1 SD of the tail loss)"
    else:
        bound, source = loss_rtol * level, f"loss_rtol ({loss_rtol:g}) of the tail loss, above the seeds' spread"
    diffs = [c - b for b, c in zip(base_tail, cand_tail)]
    mean = statistics.fmean(diffs)
    half = t_quantile(0.95, seeds - 1) * statistics.stdev(diffs) / math.sqrt(seeds)
    low, high = mean - half, mean + half

    window = max(1, steps // 20)
    smooth_b = [_smooth(run, window) for run in baseline]
    smooth_c = [_smooth(run, window) for run in candidate]
    # Each seed's own gap: detours the other way under another seed must not average away.
    gaps = [[c[i] - b[i] for i in range(steps)] for b, c in zip(smooth_b, smooth_c)]
    seed, widest = max(
        ((s, i) for s in range(seeds) for i in range(window - 1, steps)), key=lambda si: abs(gaps[si[0]][si[1]])
    )
    starts = [next((i + 1 for i in range(window - 1, steps) if abs(g[i]) > bound), None) for g in gaps]
    parted = min((p for p in starts if p is not None), default=None)
    gap = gaps[seed]
    evidence = {
        "steps": steps,
        "seeds": seeds,
        "tail_steps": n_tail,
        "margin": bound,
        "margin_from": source,
        "baseline_tail": base_tail,
        "candidate_tail": cand_tail,
        "spread": spread,
        "difference": mean,
        "ci90": [low, high],
        "max_gap": gap[widest],
        "max_gap_step": widest + 1,
        "max_gap_seed": seed,
        "parted_at": parted,
        "smoothing_steps": window,
        "curves": {
            name: {
                "mean": _thin([statistics.fmean(v) for v in zip(*runs)], CURVE_POINTS),
                "low": _thin([min(v) for v in zip(*runs)], CURVE_POINTS),
                "high": _thin([max(v) for v in zip(*runs)], CURVE_POINTS),
            }
            for name, runs in (("baseline", smooth_b), ("candidate", smooth_c))
        },
    }
    covered = f"{seeds} seeds x {steps} steps"
    ends = (
        f"tail loss (last {n_tail} steps) differs by {mean:+.4g}, 90% CI [{low:+.4g}, {high:+.4g}], "
        f"margin ±{bound:.4g} from {source}"
    )
    curves = f"largest gap of the smoothed curves {gap[widest]:+.4g} at step {widest + 1} (seed {seed})"
    if not (-bound < low and high < bound):
        if low >= bound or high <= -bound:
            verdict = f"the candidate trains measurably {'worse' if mean > 0 else 'better'}"
        else:
            verdict = "the candidate is not shown to train the same (more seeds narrow the interval)"
        at = f"; the curves part at step {parted}" if parted else ""
        return CheckResult(CHECK, "fail", f"{covered}: {verdict}: {ends}; {curves}{at}", evidence)
    if abs(gap[widest]) > _APART * bound:
        return CheckResult(
            CHECK,
            "fail",
            f"{covered}: the tails meet, but the curves part at step {parted}: {curves}, over {_APART:g}x the margin",
            evidence,
        )
    return CheckResult(CHECK, "pass", f"{covered}: equivalent; {ends}; {curves}", evidence)
