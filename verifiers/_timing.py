"""timing.*: the measured window is what the contract asks for, and its clock is honest.

The probe's clock and the runner's arrival stamps are both CLOCK_MONOTONIC on one
machine, so they can be compared directly. A receipt line is written right after
its step ends (line-buffered), and the runner stamps it when it reads it, so:
``t1 <= arrival`` always, and each step's duration fits between the arrival of
the previous line and its own, up to the reader's wake-up latency.
"""

from __future__ import annotations

from ._evidence import RunEvidence
from ._result import CheckResult

__all__ = ["check_window", "check_clock", "CLOCK_LATENCY_NS", "CLOCK_SPAN_RTOL"]

# Reader wake-up latency allowed per line. The runner's reader thread competes with the
# job for the CPU; on a loaded 2-core machine its latency stays under a few ms (see
# docs/verification.md for the measurement), so 25 ms is generous and still far below
# what a faked clock or receipt lines written after the fact produce.
CLOCK_LATENCY_NS = 25_000_000
# The probe's span over the window may differ from the arrival span by this fraction.
CLOCK_SPAN_RTOL = 0.05


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
        parts = ([f"repeated {dupes[:5]}"] if dupes else []) + ([f"missing {missing[:5]}"] if missing else []) \
            + ([f"outside 1..{total}: {extra[:5]}"] if extra else [])
        if not parts:
            parts = ["out of order"]
        return CheckResult("timing.window", "fail", f"steps must be 1..{total} each once, in order: "
                           + "; ".join(parts))
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
    tokens = {s.get("tokens") for s in steps}
    if baseline_tokens is not None and tokens != {baseline_tokens}:
        return CheckResult("timing.window", "fail", f"tokens per step {sorted(map(str, tokens))} differ from "
                           f"the baseline's {baseline_tokens}: a different amount of work")
    if baseline_tokens is None and tokens != {None}:
        return CheckResult("timing.window", "unchecked", "the baseline recorded no tokens per step to compare with")
    return CheckResult("timing.window", "pass", f"steps 1..{total} once each, in order; measured "
                       f"{warmup + 1}..{total}" + (f"; {baseline_tokens} tokens per step" if baseline_tokens else ""))


def check_clock(run: RunEvidence, warmup: int, measure: int) -> CheckResult:
    """The probe's step times agree with the runner's own clock."""
    if run.evidence_kind == "log":
        return CheckResult("timing.clock", "pass", "log evidence: step times come from the runner's clock itself")
    window = [s for s in run.steps if warmup < s.step <= warmup + measure]
    if len(window) != measure or any(s.arrival_ns is None for s in window):
        return CheckResult("timing.clock", "unchecked", "no runner arrival stamps for the measured window")
    if any(type(s.get("t0_ns")) is not int or type(s.get("t1_ns")) is not int for s in window):
        return CheckResult("timing.clock", "unchecked", "the measured window is not timed")
    for s in window:
        if s.get("t1_ns") > s.arrival_ns:
            return CheckResult("timing.clock", "fail", f"step {s.step} claims to end "
                               f"{(s.get('t1_ns') - s.arrival_ns) / 1e6:.1f} ms after its receipt arrived")
        if run.started_ns is not None and s.get("t0_ns") < run.started_ns:
            return CheckResult("timing.clock", "fail", f"step {s.step} claims to start before the job did")
    for prev, s in zip(window, window[1:]):
        duration = s.get("t1_ns") - s.get("t0_ns")
        room = s.arrival_ns - prev.arrival_ns + CLOCK_LATENCY_NS
        if duration > room:
            return CheckResult("timing.clock", "fail", f"step {s.step} took {duration / 1e6:.1f} ms by the probe, "
                               f"but its receipt arrived {(s.arrival_ns - prev.arrival_ns) / 1e6:.1f} ms after "
                               f"the previous one: receipt lines it did not earn")
    probe_span = window[-1].get("t1_ns") - window[0].get("t1_ns")
    arrival_span = window[-1].arrival_ns - window[0].arrival_ns
    allowed = CLOCK_SPAN_RTOL * arrival_span + 2 * CLOCK_LATENCY_NS
    if abs(probe_span - arrival_span) > allowed:
        return CheckResult("timing.clock", "fail", f"the probe's clock spans {probe_span / 1e6:.1f} ms over steps "
                           f"{window[0].step}..{window[-1].step}, the runner's {arrival_span / 1e6:.1f} ms: "
                           f"the job's clock is not the machine's",
                           {"probe_span_ns": probe_span, "arrival_span_ns": arrival_span})
    return CheckResult("timing.clock", "pass", f"probe and runner clocks agree over the window "
                       f"({probe_span / 1e6:.1f} vs {arrival_span / 1e6:.1f} ms)",
                       {"probe_span_ns": probe_span, "arrival_span_ns": arrival_span})
