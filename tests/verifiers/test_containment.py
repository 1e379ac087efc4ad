"""integrity.containment on synthetic records (tests/runner/test_launch_containment.py makes real ones)."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st
from verifier_testing import REFERENCE, RULES, make_run

from infrarsi.verifiers import check_run_integrity, judge_run
from infrarsi.verifiers._integrity import check_containment

CLEAN = {
    "version": 1,
    "subreaper": True,
    "cgroup": "v1-memory",
    "cgroup_peak_bytes": 10 << 20,
    "grace_s": 1.0,
    "strays": [],
    "killed": 0,
    "root_lost": False,
}
DAEMON = {"pid": 4242, "cmd": "python train.py --fast", "first_seen_s": 0.35}
HASHES = {"protected_changed_before_run": [], "protected_changed_by_run": [], "framework_changed": []}


def test_no_stray_passes_and_says_what_held_the_job():
    result = check_containment(CLEAN)
    assert result.status == "pass"
    assert result.detail == "no process outlived the job (subreaper and cgroup v1-memory)"
    assert check_containment({**CLEAN, "cgroup": None}).detail == "no process outlived the job (subreaper)"


def test_a_stray_fails_naming_its_pid_and_command():
    result = check_containment({**CLEAN, "strays": [DAEMON], "killed": 1})
    assert result.status == "fail"
    assert "1 process(es) still running after the job ended, killed" in result.detail
    assert "pid 4242: python train.py --fast" in result.detail


def test_many_strays_are_counted_and_the_first_three_named():
    strays = [{"pid": 100 + i, "cmd": f"worker {i}"} for i in range(5)]
    result = check_containment({**CLEAN, "strays": strays, "killed": 5})
    assert result.status == "fail"
    assert "5 process(es)" in result.detail and "pid 102: worker 2" in result.detail
    assert "pid 103" not in result.detail and "and 2 more" in result.detail


def test_a_long_command_line_is_shortened_to_one_line():
    script = "import os\n" + "x = 1\n" * 100
    result = check_containment({**CLEAN, "strays": [{"pid": 7, "cmd": f"python -c {script}"}]})
    assert result.status == "fail" and "\n" not in result.detail and result.detail.endswith("...")


def test_a_lost_shim_fails_even_with_no_stray():
    result = check_containment({**CLEAN, "root_lost": True})
    assert result.status == "fail" and "shim" in result.detail


def test_nothing_to_contain_with_is_unchecked():
    result = check_containment({**CLEAN, "subreaper": False, "cgroup": None})
    assert result.status == "unchecked" and "no subreaper, no cgroup" in result.detail


def test_an_older_ledger_without_a_record_is_unchecked():
    for integrity in (HASHES, {}, None):
        results = {r.id: r for r in check_run_integrity(integrity)}
        assert results["integrity.containment"].status == "unchecked"
        assert "no containment record" in results["integrity.containment"].detail


def test_check_run_integrity_returns_it_third():
    results = check_run_integrity({**HASHES, "containment": {**CLEAN, "strays": [DAEMON]}})
    assert [r.id for r in results] == ["integrity.protected", "integrity.framework", "integrity.containment"]
    assert [r.status for r in results] == ["pass", "pass", "fail"]


def test_judge_run_reports_it():
    run = make_run(integrity={**HASHES, "containment": {**CLEAN, "strays": [DAEMON]}})
    results = {r.id: r for r in judge_run(run, REFERENCE, RULES)}
    assert results["integrity.containment"].status == "fail"
    clean = {r.id: r for r in judge_run(make_run(integrity={**HASHES, "containment": CLEAN}), REFERENCE, RULES)}
    assert clean["integrity.containment"].status == "pass"


_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["version", "subreaper", "cgroup", "strays", "killed", "root_lost", "x"]), _value, max_size=7
    )
)
def test_any_record_is_judged_without_raising_and_passes_only_when_clean(record):
    result = check_containment(record)
    assert result.status in ("pass", "fail", "unchecked")
    if result.status == "pass":
        assert record["strays"] == []
        assert not record.get("root_lost")
