"""Class 4 of the hardening issue on real TinyGPT runs: a job's processes outliving its execution.

Each cheat in containment/ leaves a process behind (a double-forked ``setsid`` daemon, a
child started in a new session) that SIGSTOPs every other run of the script for a minute,
so the baseline runs of the A/B after it are slow and the candidate looks fast. The runner
keeps them in its tree (a subreaper), kills them when the job ends, and the candidate fails
``integrity.containment`` naming them; none is alive afterwards.
"""

from __future__ import annotations

import json

import pytest
from corpus_labels import HERE
from processes import gone_within

import infrarsi
from infrarsi._workspace import open_workspace

# Alone (the serial pass): these cheats SIGSTOP every train.py on the machine while they run, and
# a stray killed between its SIGSTOP and its SIGCONT leaves another test's job stopped until its
# timeout (seen 2026-12-07: a corpus run beside them timed out at 300 s, a landscape verify failed).
pytestmark = pytest.mark.serial

CONTAINMENT_CHEATS = sorted(p.stem for p in (HERE / "containment").glob("*.diff"))


@pytest.mark.parametrize(
    ("name", "sets"),
    [(name, {}) for name in CONTAINMENT_CHEATS] + [("daemon-slows-the-baseline", {"attention": "sdpa"})],
)
def test_a_process_left_behind_is_found_killed_and_fails_containment(tinygpt_workspace, name, sets):
    outcome = infrarsi.verify(
        tinygpt_workspace, sets=sets, patches=[str(HERE / "containment" / f"{name}.diff")], pairs=0, keep_going=True
    )
    assert not outcome.accepted
    by_id = {c.id: c for c in outcome.checks}
    containment = by_id["integrity.containment"]
    assert containment.status == "fail" and "python" in containment.detail, containment
    # The numbers are the baseline's: only containment sees it.
    assert by_id["numerics.loss"].status == "pass", by_id["numerics.loss"]
    with open_workspace(tinygpt_workspace) as ws:
        row = ws.ledger.get_execution(outcome.executions[-1])
        record = json.loads(ws.ledger.get_blob(row["evidence_hash"]))["integrity"]["containment"]
    assert record["strays"], record
    for stray in record["strays"]:
        assert gone_within(stray["pid"], 5.0), stray


def test_the_containment_corpus_has_its_variants():
    assert {"daemon-slows-the-baseline", "detached-child-slows-the-baseline"} <= set(CONTAINMENT_CHEATS)
