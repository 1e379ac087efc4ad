"""A job of several ranks as the verifiers see it: each rank's lines by the runner's channel
tag, the job's steps ended by the slowest rank, every check held for every rank."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from verifier_testing import REFERENCE, RULES, TOKENS, TOTAL, make_run

from infrarsi.verifiers import RunEvidence, judge_run, merged_steps, runner_step_time


def two_ranks(slow_ms=80.0, fast_ms=50.0, mutate_rank1=None, drop_rank1_steps=()) -> RunEvidence:
    """Rank 0 steps every ``fast_ms``, rank 1 every ``slow_ms``; lines interleaved by arrival."""
    rank0 = make_run(step_ms=fast_ms)
    rank1 = make_run(step_ms=slow_ms, mutate=mutate_rank1)
    tagged = [(a, 0, line) for a, line in zip(rank0.arrivals_ns, rank0.receipt_lines)]
    tagged += [
        (a, 1, line)
        for a, line in zip(rank1.arrivals_ns, rank1.receipt_lines)
        if json.loads(line).get("step") not in drop_rank1_steps
    ]
    tagged.sort(key=lambda t: t[0])
    return RunEvidence.from_stored(
        [line for _, _, line in tagged],
        {
            "arrivals_ns": [a for a, _, _ in tagged],
            "started_ns": rank0.started_ns,
            "ended_ns": max(rank0.ended_ns, rank1.ended_ns),
            "integrity": rank0.integrity,
            "ranks": 2,
            "line_ranks": [r for _, r, _ in tagged],
        },
    )


def per_rank_reference():
    return replace(REFERENCE, per_rank=(REFERENCE, REFERENCE))


def test_the_slowest_rank_ends_each_step_and_the_job_trains_on_every_rank_s_tokens():
    run = two_ranks()
    assert [s.step for s in run.steps] == list(range(1, TOTAL + 1))
    assert all(s.get("tokens") == 2 * TOKENS for s in run.steps)
    # ~81 ms a step (rank 1's 80 plus the gap between steps), never rank 0's ~51 ms.
    assert runner_step_time(run, RULES.warmup_steps, RULES.measure_steps) == pytest.approx(0.081, rel=0.02)
    assert runner_step_time(run.of_rank(0), RULES.warmup_steps, RULES.measure_steps) == pytest.approx(0.051, rel=0.02)


def test_every_check_passes_for_every_rank():
    checks = judge_run(two_ranks(), per_rank_reference(), RULES)
    judged = [c for c in checks if c.id.startswith(("timing", "numerics"))]
    assert judged and all(c.status == "pass" and c.detail.startswith("every one of 2 ranks") for c in judged), [
        c.to_json() for c in judged
    ]


def test_one_rank_training_differently_fails_and_is_named():
    def drift(rec):
        return {**rec, "loss": rec["loss"] * 1.05} if rec["step"] >= 4 else rec

    checks = {c.id: c for c in judge_run(two_ranks(mutate_rank1=drift), per_rank_reference(), RULES)}
    assert checks["numerics.loss"].status == "fail"
    assert checks["numerics.loss"].detail.startswith("rank 1:") and "rank 0" not in checks["numerics.loss"].detail


def test_a_rank_that_misses_a_step_leaves_the_job_without_that_step():
    run = two_ranks(drop_rank1_steps=(5,))
    assert 5 not in [s.step for s in run.steps]
    assert runner_step_time(run, RULES.warmup_steps, RULES.measure_steps) is None
    window = {c.id: c for c in judge_run(run, per_rank_reference(), RULES)}["timing.window"]
    assert window.status == "fail" and window.detail.startswith("rank 1:")


def test_a_baseline_without_the_rank_leaves_its_numerics_unchecked():
    checks = {c.id: c for c in judge_run(two_ranks(), replace(REFERENCE, per_rank=(REFERENCE,)), RULES)}
    assert checks["numerics.loss"].status in ("fail", "unchecked")
    assert "rank 1:" in checks["numerics.loss"].detail


def test_channel_tags_that_are_not_ranks_put_lines_in_no_rank():
    honest = two_ranks()
    stored = {
        "arrivals_ns": honest.arrivals_ns,
        "started_ns": honest.started_ns,
        "ranks": 2,
        "line_ranks": ["0"] * len(honest.receipt_lines),
    }
    run = RunEvidence.from_stored(honest.receipt_lines, stored)
    assert run.of_rank(0).receipt_lines == [] and run.steps == []


def test_merging_nothing_is_nothing():
    assert merged_steps([]) == []


def test_a_line_separator_inside_a_line_moves_no_line_off_its_rank():
    """Stored receipts split at "\\n" only, as the runner read them: a U+2028 inside rank 0's JSON
    string (where JSON allows it raw) must not shift rank 1's lines onto other tags."""
    from infrarsi.verifiers import receipt_lines

    honest = two_ranks()
    lines = list(honest.receipt_lines)
    first = next(i for i, line in enumerate(lines) if '"step": 1' in line)
    lines[first] = lines[first][:-1] + ', "note": "a\u2028b"}'
    stored = ("\n".join(lines) + "\n").encode()
    evidence = {
        "arrivals_ns": honest.arrivals_ns,
        "started_ns": honest.started_ns,
        "ranks": 2,
        "line_ranks": list(honest.line_ranks),
    }
    run = RunEvidence.from_stored(receipt_lines(stored), evidence)
    assert [len(run.of_rank(r).steps) for r in (0, 1)] == [TOTAL, TOTAL]


def test_a_check_some_ranks_skip_is_skipped_and_names_them():
    from infrarsi.verifiers import CheckResult, combine_ranks

    passed = CheckResult("numerics.precision", "pass", "observed fp32")
    skipped = CheckResult("numerics.precision", "skipped", "nothing observed")
    (combined,) = combine_ranks([[passed], [skipped]])
    assert combined.status == "skipped" and combined.detail == "rank 1: nothing observed"
