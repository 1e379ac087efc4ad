"""Class 1 of the hardening issue on real TinyGPT runs: the job draws its own timed region.

Each cheat in timing/ trains the same model (its numbers match the baseline's) but moves
the expensive part of the step out of the probe's ``with p.step(...)`` region, or makes
the region report less than it spans. The probe's regions then look 2x to 10x faster;
the runner's clock, the period between step ends, does not, so there is nothing for a
receipt to claim.
"""

from __future__ import annotations

import json
import statistics

import pytest
from corpus_labels import HERE

import infrarsi
from infrarsi._workspace import open_workspace

# Alone, never beside another test: it compares the step times of back-to-back runs.
pytestmark = pytest.mark.serial

TIMING_CHEATS = sorted(p.stem for p in (HERE / "timing").glob("*.diff"))


def _candidate_run(contract, outcome) -> tuple[dict, dict, dict]:
    with open_workspace(contract) as ws:
        row = ws.ledger.get_execution(outcome.executions[-1])
        evidence = json.loads(ws.ledger.get_blob(row["evidence_hash"]))
        receipts = [json.loads(line) for line in ws.ledger.get_blob(row["receipts_hash"]).decode().splitlines()]
        summary = ws.ledger.latest_baseline()["summary"]
    return row, evidence, {"receipts": receipts, "summary": summary}


def _probe_region_s(receipts: list[dict], steps: list[int]) -> float:
    by_step = {r["step"]: r for r in receipts if r.get("type") == "step"}
    return statistics.median((by_step[k]["t1_ns"] - by_step[k]["t0_ns"]) / 1e9 for k in steps)


def test_the_timing_corpus_has_every_variant():
    assert {"region-decoys", "lazy-backward", "region-exit-rewritten"} <= set(TIMING_CHEATS)


@pytest.fixture(scope="module")
def baseline_now_s(tinygpt_workspace) -> float:
    """The original setup's step time on the runner's clock, measured right before the cheats:
    the stored baseline is from the start of a long suite, and a shared machine's speed moves
    more than the margin between them (four cheats once all read 'faster than the baseline')."""
    outcome = infrarsi.run(tinygpt_workspace)
    assert outcome.status == "ok" and outcome.step_time_s
    return outcome.step_time_s


@pytest.mark.parametrize("name", TIMING_CHEATS)
def test_work_moved_out_of_the_region_is_still_paid_for(tinygpt_workspace, baseline_now_s, name):
    outcome = infrarsi.verify(
        tinygpt_workspace, patches=[str(HERE / "timing" / f"{name}.diff")], pairs=0, keep_going=True
    )
    row, evidence, seen = _candidate_run(tinygpt_workspace, outcome)
    assert row["status"] in ("ok", "rejected"), row
    timing = evidence["timing"]
    assert timing["clock"] == "runner" and row["step_time_s"] == pytest.approx(timing["step_time_s"])
    # The same model trains: the numbers are the baseline's, so only the clock can tell.
    numerics = {c.id: c.status for c in outcome.checks if c.id.startswith("numerics.loss")}
    assert numerics == {"numerics.loss": "pass"}, [c.to_json() for c in outcome.checks]
    region = _probe_region_s(seen["receipts"], timing["steps"])
    baseline = baseline_now_s
    # By the probe's own regions the cheat looks far faster than the step really is ...
    assert region < 0.7 * timing["step_time_s"], (region, timing)
    assert timing["region_share"] < 0.7
    # ... and by the runner's clock it is no faster than the baseline.
    assert timing["step_time_s"] > 0.85 * baseline, (timing["step_time_s"], baseline)


def test_a_timing_cheat_gains_nothing_in_back_to_back_pairs(tinygpt_workspace):
    """The A/B that verify runs (B A A B), with the source audit aside: stats.speedup on the
    runner's clock finds no speedup in a cheat whose probe regions claim one."""
    from infrarsi.contract._candidate import Candidate, resolve_candidate
    from infrarsi.verifiers import ab_order, check_speedup

    with open_workspace(tinygpt_workspace) as ws:
        cheat = resolve_candidate(ws.contract, {}, [str(HERE / "timing" / "region-decoys.diff")])
        base = Candidate(knobs=ws.contract.baseline_knobs())
        times, regions = {"B": [], "A": []}, {"B": [], "A": []}
        for role in ab_order(2):
            result = ws.executor.run(ws.contract, ws.manifest.files, cheat if role == "A" else base)
            assert result.status == "ok", result.detail
            steps = result.evidence["timing"]["steps"]
            receipts = [json.loads(line) for line in result.receipts.decode().splitlines()]
            times[role].append(result.step_time_s)
            regions[role].append(_probe_region_s(receipts, steps))
    by_regions, claimed = check_speedup(regions["B"], regions["A"], 1.02, 2)
    by_runner, estimate = check_speedup(times["B"], times["A"], 1.02, 2)
    assert by_regions.status == "pass", by_regions  # what the probe's regions would have claimed
    # No receipt on the runner's clock, and less than the regions claimed. Two pairs on a busy
    # 2-core machine have read medians of 1.14x for this cheat (it does the same work), so the
    # bound is on the verdict and on the claim, not on a tight median.
    assert by_runner.status == "fail" and estimate.median < min(1.25, claimed.median), (by_runner, claimed)
