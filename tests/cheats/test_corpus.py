"""The adversarial corpus: real runs of every cheat and honest patch against TinyGPT.

Every cheat must be rejected twice over: by the audit.* checks expected.toml lists
(before anything runs), and, with the audit left aside, by the run-time family it
names. Every honest patch must pass every correctness check, audit included. The A/B
stage is left out here (``pairs=0``): correctness is what the corpus is about.
"""

from __future__ import annotations

import pytest
from corpus_labels import AUDIT, EXPECTED, HERE

import infrarsi

CHEATS = sorted(p.stem for p in (HERE / "cheat").glob("*.diff"))
HONEST = sorted(p.stem for p in (HERE / "honest").glob("*.diff"))


def test_corpus_is_large_enough_and_fully_labelled():
    assert len(CHEATS) >= 15 and len(HONEST) >= 5
    assert set(CHEATS) == set(EXPECTED), "every cheat needs an expected family, and only cheats have one"
    audit_only = {p.stem for p in (HERE / "audit_only").glob("*.diff")}
    assert set(AUDIT) <= set(CHEATS) | audit_only and audit_only <= set(AUDIT)


@pytest.mark.parametrize("name", CHEATS)
def test_cheat_is_rejected_by_the_audit_and_by_the_expected_family(tinygpt_workspace, name):
    outcome = infrarsi.verify(
        tinygpt_workspace, patches=[str(HERE / "cheat" / f"{name}.diff")], pairs=0, keep_going=True
    )
    assert not outcome.accepted
    failing = [c for c in outcome.checks if c.status in ("fail", "unchecked")]
    assert failing, f"{name}: nothing failed: {[c.to_json() for c in outcome.checks]}"
    audit_failed = {c.id for c in failing if c.id.startswith("audit.")}
    assert audit_failed == set(AUDIT.get(name, [])), [c.to_json() for c in failing if c.id.startswith("audit.")]
    runtime = [c for c in failing if not c.id.startswith("audit.")]
    assert runtime and runtime[0].id.split(".")[0] == EXPECTED[name], [c.to_json() for c in failing]


def test_the_audit_rejects_before_running(tinygpt_workspace):
    """Without keep_going an audit failure stops verify before the candidate runs."""
    outcome = infrarsi.verify(tinygpt_workspace, patches=[str(HERE / "cheat" / "slow-clock.diff")], pairs=0)
    assert not outcome.accepted and outcome.executions
    by_id = {c.id: c for c in outcome.checks}
    assert by_id["audit.clock_patched"].status == "fail"
    assert by_id["timing.clock"].status == "skipped" and by_id["numerics.loss"].status == "skipped"


@pytest.mark.parametrize("name", HONEST)
def test_honest_patch_passes_every_correctness_check(tinygpt_workspace, name):
    sets = {"attention": "sdpa"} if name == "batched-heads" else {}
    outcome = infrarsi.verify(tinygpt_workspace, sets=sets, patches=[str(HERE / "honest" / f"{name}.diff")], pairs=0)
    judged = {c.id: c for c in outcome.checks if c.id != "stats.speedup"}
    assert all(c.status == "pass" for c in judged.values()), [c.to_json() for c in judged.values() if not c.passed]
    assert outcome.checks[-1].id == "stats.speedup" and outcome.checks[-1].status == "skipped"


AUDIT_ONLY = sorted(p.stem for p in (HERE / "audit_only").glob("*.diff"))


@pytest.mark.parametrize("name", AUDIT_ONLY)
def test_cheat_only_the_source_audit_can_see(tinygpt_workspace, name):
    """Work moved out of the timed region: the numbers and both clocks agree; only the audit sees it."""
    outcome = infrarsi.verify(
        tinygpt_workspace, patches=[str(HERE / "audit_only" / f"{name}.diff")], pairs=0, keep_going=True
    )
    assert not outcome.accepted
    failing = {c.id for c in outcome.checks if c.status in ("fail", "unchecked")}
    assert failing == set(AUDIT[name]), [c.to_json() for c in outcome.checks if not c.passed]


def test_a_candidate_rejected_before_running_keeps_its_evidence(tinygpt_workspace):
    """The ledger row of an audit rejection holds the patch and the source it applied to, for re-audit."""
    from infrarsi._workspace import open_workspace

    outcome = infrarsi.verify(tinygpt_workspace, patches=[str(HERE / "cheat" / "slow-clock.diff")], pairs=0)
    with open_workspace(tinygpt_workspace) as ws:
        row = ws.ledger.get_execution(outcome.executions[-1])
        assert row["status"] == "rejected" and "train.py" in row["sources"]
        assert ws.ledger.get_blob(row["sources"]["train.py"]) == (tinygpt_workspace.parent / "train.py").read_bytes()
        assert any(v["id"] == "audit.clock_patched" and v["status"] == "fail" for v in row["verdicts"])


def test_keep_going_with_a_patch_that_is_not_a_diff_rejects_without_a_traceback(tinygpt_workspace, tmp_path):
    junk = tmp_path / "junk.diff"
    junk.write_text("this is not a unified diff\n")
    outcome = infrarsi.verify(tinygpt_workspace, patches=[str(junk)], pairs=0, keep_going=True)
    by_id = {c.id: c for c in outcome.checks}
    assert not outcome.accepted and by_id["scope.parse"].status == "fail"
    assert by_id["audit.timing_boundary"].status == "fail" and "cannot audit" in by_id["audit.timing_boundary"].detail
