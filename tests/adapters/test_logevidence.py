"""Receipts from stdout lines: the runner's stamps, the contract's regexes, and lines that are garbage."""

from __future__ import annotations

import json
import math
import re

import pytest
from hypothesis import given, settings, strategies as st

from infrarsi.runner._logevidence import compile_patterns, receipts_from_log
from infrarsi.runner._receipts import parse_receipts

PATTERNS = {"step": r"iter (\d+)", "loss": r"loss ([0-9.eE+-]+|nan|inf)", "grad_norm": r"grad_norm (\S+)"}


def stamped(*texts: str, start: int = 1000, every: int = 10) -> list[tuple[int, str]]:
    return [(start + every * (i + 1), text) for i, text in enumerate(texts)]


def test_each_step_line_ends_its_step_on_the_runners_clock():
    recs = receipts_from_log(
        stamped("iter 1: loss 2.5 grad_norm 0.9", "iter 2: loss 2.25 grad_norm 0.8"), PATTERNS, start_ns=1000
    )
    assert recs == [
        {
            "type": "step",
            "step": 1,
            "t0_ns": 1000,
            "t1_ns": 1010,
            "tokens": None,
            "loss": 2.5,
            "grad_norm": 0.9,
            "peak_mem_bytes": None,
            "clock": "runner",
            "extra": {"log_step": 1},
        },
        {
            "type": "step",
            "step": 2,
            "t0_ns": 1010,
            "t1_ns": 1020,
            "tokens": None,
            "loss": 2.25,
            "grad_norm": 0.8,
            "peak_mem_bytes": None,
            "clock": "runner",
            "extra": {"log_step": 2},
        },
    ]


def test_values_on_later_lines_belong_to_the_last_step_line():
    recs = receipts_from_log(
        stamped(
            "warming up, loss 99", "iter 1", "  loss 2.5", "  grad_norm 0.5", "  loss 7.0", "iter 2", "grad_norm 0.4"
        ),
        PATTERNS,
        0,
    )
    assert [(r["step"], r["loss"], r["grad_norm"]) for r in recs] == [(1, 2.5, 0.5), (2, None, 0.4)]


def test_a_log_counting_from_zero_is_shifted_to_the_runners_steps():
    recs = receipts_from_log(stamped("iter 0: loss 3", "iter 1: loss 2", "iter 2: loss 1"), PATTERNS, 0)
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert [r["extra"]["log_step"] for r in recs] == [0, 1, 2]


def test_a_repeated_step_keeps_the_first_line_and_its_boundary():
    recs = receipts_from_log(
        stamped("iter 1: loss 2", "iter 2: loss 1.5", "iter 2: loss 9", "loss 8", "iter 3: loss 1"), PATTERNS, 0
    )
    assert [(r["step"], r["loss"]) for r in recs] == [(1, 2.0), (2, 1.5), (3, 1.0)]
    assert recs[2]["t0_ns"] == recs[1]["t1_ns"]


def test_a_sparse_log_leaves_gaps_instead_of_inventing_steps():
    recs = receipts_from_log(stamped("iter 10: loss 2", "iter 20: loss 1"), PATTERNS, 0)
    assert [r["step"] for r in recs] == [10, 20]
    assert parse_receipts([json.dumps(r) for r in recs]).step_times(0, 20) is None


@pytest.mark.parametrize(
    "text, expected",
    [
        ("loss 1.5.5", None),
        ("loss ..", None),
        ("loss -", None),
        ("loss 1e999", math.inf),
        ("loss 2.5.", 2.5),
        ("loss 1e-3", 1e-3),
        ("loss inf", math.inf),
    ],
)
def test_numbers_that_do_not_parse_are_null(text, expected):
    [rec] = receipts_from_log([(5, f"iter 1 {text}")], PATTERNS, 0)
    assert rec["loss"] == expected


def test_nan_is_kept_a_diverged_loss_is_evidence():
    [rec] = receipts_from_log([(5, "iter 1 loss nan")], PATTERNS, 0)
    assert math.isnan(rec["loss"])


def test_a_step_number_that_does_not_parse_is_not_a_step():
    patterns = {"step": r"step (\S+)", "loss": r"loss (\S+)"}
    recs = receipts_from_log(
        stamped("step 1 loss 3", "step x loss 2", "step 2.0 loss 1", "step 3.5 loss 0"), patterns, 0
    )
    assert [(r["step"], r["loss"]) for r in recs] == [(1, 3.0), (2, 1.0)]


def test_tokens_and_compiled_patterns():
    patterns = compile_patterns({"step": r"it=(\d+)", "tokens": r"tok=(\S+)", "loss": re.compile(r"l=(\S+)")})
    assert all(isinstance(p, re.Pattern) for p in patterns.values())
    recs = receipts_from_log(stamped("it=1 tok=4096 l=2", "it=2 tok=lots l=1"), patterns, 0)
    assert [(r["tokens"], r["loss"]) for r in recs] == [(4096, 2.0), (None, 1.0)]


def test_step_pattern_is_required():
    with pytest.raises(ValueError, match="step"):
        compile_patterns({"loss": r"loss (\S+)"})


def test_records_survive_the_runners_json_round_trip():
    recs = receipts_from_log(stamped("iter 1 loss nan", "iter 2 loss 1.0 grad_norm 0.1"), PATTERNS, 0)
    receipts = parse_receipts([json.dumps(r, separators=(",", ":")) for r in recs])
    assert receipts.bad_lines == 0 and [r["step"] for r in receipts.steps] == [1, 2]
    assert receipts.trajectory("loss", 2) == [None, 1.0]


lines_strategy = st.lists(
    st.tuples(
        st.integers(min_value=-(2**63), max_value=2**63),
        st.one_of(st.text(), st.from_regex(r"iter -?\d{1,30}( loss \S*)?( grad_norm \S*)?", fullmatch=True)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(lines=lines_strategy, start=st.integers(min_value=0, max_value=2**62))
def test_arbitrary_lines_never_raise(lines, start):
    recs = receipts_from_log(lines, PATTERNS, start)
    steps = [r["step"] for r in recs]
    assert all(isinstance(s, int) for s in steps) and len(steps) == len(set(steps))
    for rec in recs:
        assert rec["type"] == "step" and rec["clock"] == "runner"
        assert isinstance(rec["t0_ns"], int) and isinstance(rec["t1_ns"], int)
        assert rec["loss"] is None or isinstance(rec["loss"], float)
        assert rec["grad_norm"] is None or isinstance(rec["grad_norm"], float)
    parse_receipts([json.dumps(r) for r in recs])
