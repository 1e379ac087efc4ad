"""timing.*: the measured window is what the contract asks for, and its clock is honest.

**The step time is the runner's.** Each receipt line is stamped by the runner the
moment it arrives; a step's time is the *period* between the arrival of the previous
step's line and its own, and a run's step time is the mean period over the measured
window (steps ``warmup+1 .. warmup+measure``), the steps the runner sampled for close
observation left out (observing costs time). Work a job moves outside its
``with p.step(...)`` region, or runs lazily later, still falls in some period, so it
is paid for. The mean, not the median: a job that releases its lines in bursts
shortens some periods and lengthens others, and only the total is beyond its reach.

The probe's own ``t0``/``t1`` are a diagnostic and a cross-check. Both clocks are
CLOCK_MONOTONIC on one machine, so they can be compared directly: ``t1 <= arrival``
always, and each step's region fits between the arrival of the previous line and its
own, up to the reader's wake-up latency.
"""

from __future__ import annotations

from ._evidence import RunEvidence, first_per_step
from ._result import CheckResult

__all__ = [
    "check_window",
    "check_clock",
    "window_periods",
    "runner_step_time",
    "region_share",
    "CLOCK_LATENCY_NS",
    "CLOCK_SPAN_RTOL",
    "BURST_FRACTION",
]

# Reader wake-up latency allowed per line. The runner's reader thread competes with the
# job for the CPU; on a loaded 2-core machine its latency stays under a few ms (see
# docs/verification.md for the measurement), so 25 ms is generous and still far below
# what a faked clock or receipt lines written after the fact produce.
CLOCK_LATENCY_NS = 25_000_000
# The probe's span over the window may differ from the arrival span by this fraction. The step
# time is the runner's, so this only asks that the probe's clock be the machine's (a job that
# halves its clock is off by 50%); work a job does outside its region moves t1 against the
# arrivals by however long that work takes each step, which on a loaded machine varies.
CLOCK_SPAN_RTOL = 0.25
# A measured period shorter than this fraction of the window's mean is a burst of lines
# released together, not a step (checked where the mean is well above the reader's latency).
BURST_FRACTION = 0.25


def window_periods(run: RunEvidence, warmup: int, measure: int) -> tuple[list[int], list[float]] | str:
    """(steps, seconds) of each measured period on the runner's clock, sampled steps left out; or why not.

    Step k's period runs from the arrival of step k-1's line (the job's start when k is 1)
    to the arrival of step k's. The first line a step number got counts.

    A job of several ranks is as slow as its slowest rank: each rank's window is timed on its
    own arrivals and the one with the largest mean period counts. (Merged arrivals would let
    ranks take turns: one waiting out the warm-up, then running its window while the other
    still finishes each step late, every step end the fast rank's.)
    """
    if run.line_ranks is not None:
        windows = []
        for rank in range(run.ranks):
            found = window_periods(run.of_rank(rank), warmup, measure)
            if isinstance(found, str):
                return f"rank {rank}: {found}"
            windows.append(found)
        return max(windows, key=lambda w: sum(w[1]) / len(w[1]))
    by_step = first_per_step(run.steps)
    sampled = set(run.sampled_steps or ())
    steps, periods = [], []
    for k in range(warmup + 1, warmup + measure + 1):
        here = by_step.get(k)
        before = run.started_ns if k == 1 else getattr(by_step.get(k - 1), "arrival_ns", None)
        if here is None or here.arrival_ns is None or before is None:
            return f"no runner arrival stamp for step {k if here is None or here.arrival_ns is None else k - 1}"
        if k in sampled:
            continue
        steps.append(k)
        periods.append((here.arrival_ns - before) / 1e9)
    if not periods:
        return "every measured step was sampled: no period is left to time"
    return steps, periods


def runner_step_time(run: RunEvidence, warmup: int, measure: int) -> float | None:
    """The run's step time on the runner's clock: the mean measured period (None if incomplete)."""
    found = window_periods(run, warmup, measure)
    if isinstance(found, str):
        return None
    return sum(found[1]) / len(found[1])


def region_share(run: RunEvidence, warmup: int, measure: int) -> float | None:
    """The share of the measured periods that the probe's own regions cover (a diagnostic;
    a job of several ranks: the smallest rank's)."""
    if run.line_ranks is not None:
        shares = [region_share(run.of_rank(r), warmup, measure) for r in range(run.ranks)]
        return None if None in shares else min(shares)
    found = window_periods(run, warmup, measure)
    if isinstance(found, str):
        return None
    by_step = first_per_step(run.steps)
    covered = 0
    for k in found[0]:
        t0, t1 = by_step[k].get("t0_ns"), by_step[k].get("t1_ns")
        if type(t0) is not int or type(t1) is not int or t1 < t0:
            return None
        covered += t1 - t0
    total = sum(found[1])
    return covered / 1e9 / total if total > 0 else None


def check_window(run: RunEvidence, warmup: int, measure: int, baseline_tokens: int | None) -> CheckResult:
    """Steps 1..N once each, in order, monotonic, same tokens as the baseline, window fully timed."""
    steps = run.steps
    total = warmup + measure
    numbers = [s.step for s in steps]
    if not steps:
        return CheckResult("timing.window", "unchecked", "no step receipts at all")
    if numbers != list(range(1, total + 1)):
        dupes = sorted({n for n in numbers if numbers.count(n) > 1})
        missing = sorted(set(range(1, total + 1)) - set(numbers))
        extra = sorted(set(numbers) - set(range(1, total + 1)))
        parts = (
            ([f"repeated {dupes[:5]}"] if dupes else [])
            + ([f"missing {missing[:5]}"] if missing else [])
            + ([f"outside 1..{total}: {extra[:5]}"] if extra else [])
        )
        if not parts:
            parts = ["out of order"]
        return CheckResult(
            "timing.window", "fail", f"steps must be 1..{total} each once, in order: " + "; ".join(parts)
        )
    previous_t1 = None
    for s in steps:
        t0, t1 = s.get("t0_ns"), s.get("t1_ns")
        measured = s.step > warmup
        if t0 is None and t1 is None and not measured:
            continue  # a warm-up step may be untimed
        if type(t0) is not int or type(t1) is not int:
            return CheckResult("timing.window", "fail", f"step {s.step}: not timed (t0_ns/t1_ns missing)")
        if t1 < t0 or (previous_t1 is not None and t0 < previous_t1):
            return CheckResult("timing.window", "fail", f"step {s.step}: timestamps are not monotonic")
        previous_t1 = t1
    # Every measured step's tokens; a warm-up step's where it counted them (an autoprobe can't see
    # the first forward's keyword inputs, as a warm-up step may be untimed).
    tokens = {s.get("tokens") for s in steps if s.step > warmup or s.get("tokens") is not None}
    if baseline_tokens is not None and tokens != {baseline_tokens}:
        return CheckResult(
            "timing.window",
            "fail",
            f"tokens per step {sorted(map(str, tokens))} differ from "
            f"the baseline's {baseline_tokens}: a different amount of work",
        )
    if baseline_tokens is None and tokens != {None}:
        return CheckResult("timing.window", "unchecked", "the baseline recorded no tokens per step to compare with")
    return CheckResult(
        "timing.window",
        "pass",
        f"steps 1..{total} once each, in order; measured "
        f"{warmup + 1}..{total}" + (f"; {baseline_tokens} tokens per step" if baseline_tokens else ""),
    )


def _bursts(run: RunEvidence, warmup: int, measure: int) -> CheckResult | None:
    """A fail when the window's first lines came in a burst: the job held back the line that
    opens the window (step ``warmup``'s) and let the next ones go together.

    Lines bunched later in the window don't shorten it (the total is what counts), and an
    honest stall of the reader bunches lines only *after* a long period; so the test is on
    the cumulative time from the window's start: after ``i`` lines it must be at least
    ``BURST_FRACTION * i`` mean periods, less one reader's latency (a stamp is never early).
    """
    by_step = first_per_step(run.steps)
    stamps = [getattr(by_step.get(k), "arrival_ns", None) for k in range(warmup, warmup + measure + 1)]
    if warmup == 0:
        stamps[0] = run.started_ns
    if any(stamp is None for stamp in stamps):
        return CheckResult("timing.clock", "unchecked", "no runner arrival stamps for the measured window")
    mean = (stamps[-1] - stamps[0]) / measure
    for i in range(1, measure + 1):
        elapsed = stamps[i] - stamps[0]
        if elapsed < BURST_FRACTION * i * mean - CLOCK_LATENCY_NS:
            return CheckResult(
                "timing.clock",
                "fail",
                f"{i} line(s) of the window arrived within "
                f"{elapsed / 1e6:.1f} ms of its start, against a mean period of {mean / 1e6:.1f} ms: "
                "receipt lines held back and released in a burst, not as the steps ended",
            )
    return None


def check_clock(run: RunEvidence, warmup: int, measure: int) -> CheckResult:
    """The runner's periods are steps, not bursts, and the probe's step times agree with them."""
    burst = _bursts(run, warmup, measure)
    if burst is not None:
        return burst
    if run.evidence_kind == "log":
        return CheckResult("timing.clock", "pass", "log evidence: step times come from the runner's clock itself")
    window = [s for s in run.steps if warmup < s.step <= warmup + measure]
    if len(window) != measure or any(s.arrival_ns is None for s in window):
        return CheckResult("timing.clock", "unchecked", "no runner arrival stamps for the measured window")
    if any(type(s.get("t0_ns")) is not int or type(s.get("t1_ns")) is not int for s in window):
        return CheckResult("timing.clock", "unchecked", "the measured window is not timed")
    for s in window:
        if s.get("t1_ns") > s.arrival_ns:
            return CheckResult(
                "timing.clock",
                "fail",
                f"step {s.step} claims to end {(s.get('t1_ns') - s.arrival_ns) / 1e6:.1f} ms after its receipt arrived",
            )
        if run.started_ns is not None and s.get("t0_ns") < run.started_ns:
            return CheckResult("timing.clock", "fail", f"step {s.step} claims to start before the job did")
    for prev, s in zip(window, window[1:]):
        duration = s.get("t1_ns") - s.get("t0_ns")
        room = s.arrival_ns - prev.arrival_ns + CLOCK_LATENCY_NS
        if duration > room:
            return CheckResult(
                "timing.clock",
                "fail",
                f"step {s.step} took {duration / 1e6:.1f} ms by the probe, "
                f"but its receipt arrived {(s.arrival_ns - prev.arrival_ns) / 1e6:.1f} ms after "
                f"the previous one: receipt lines it did not earn",
            )
    probe_span = window[-1].get("t1_ns") - window[0].get("t1_ns")
    arrival_span = window[-1].arrival_ns - window[0].arrival_ns
    allowed = CLOCK_SPAN_RTOL * arrival_span + 2 * CLOCK_LATENCY_NS
    if abs(probe_span - arrival_span) > allowed:
        return CheckResult(
            "timing.clock",
            "fail",
            f"the probe's clock spans {probe_span / 1e6:.1f} ms over steps "
            f"{window[0].step}..{window[-1].step}, the runner's {arrival_span / 1e6:.1f} ms: "
            f"the job's clock is not the machine's",
            {"probe_span_ns": probe_span, "arrival_span_ns": arrival_span},
        )
    share = region_share(run, warmup, measure)
    return CheckResult(
        "timing.clock",
        "pass",
        f"probe and runner clocks agree over the window "
        f"({probe_span / 1e6:.1f} vs {arrival_span / 1e6:.1f} ms)"
        + (f"; the probe's regions cover {share:.0%} of the runner's periods" if share else ""),
        {"probe_span_ns": probe_span, "arrival_span_ns": arrival_span, "region_share": share},
    )
