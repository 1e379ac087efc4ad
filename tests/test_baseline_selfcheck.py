"""`infrarsi baseline` judges itself against the contract: each problem that would fail every
candidate is named with the key to change, exits 1 and is not stored (``--force`` stores it,
marked). Real runs of a small torch job (tests/fixtures/selfcheck_job) whose knobs break it."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from infrarsi import init
from infrarsi._selfcheck import tolerance_that_holds
from infrarsi.ledger import Ledger

FIXTURE = Path(__file__).parent / "fixtures" / "selfcheck_job"


def _workspace(tmp_path: Path, edit=lambda text: text) -> Path:
    folder = tmp_path / "job"
    shutil.copytree(FIXTURE, folder)
    contract = folder / "infrarsi.toml"
    contract.write_text(edit(contract.read_text()))
    init(contract)
    return contract


def _baseline_knob(name: str, value: str):
    def edit(text: str) -> str:
        block = f'[knobs.{name}]\nenv = "{"JOB_" + name.upper()}"\nchoices = ["0", "1"]\nbaseline = "0"'
        assert block in text
        return text.replace(block, block.replace('baseline = "0"', f'baseline = "{value}"'))

    return edit


def _cli(contract: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "infrarsi.cli", "baseline", "--contract", str(contract), "--json", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc, json.loads(proc.stdout)


def _stored_baselines(contract: Path) -> int:
    with sqlite3.connect(contract.parent / ".infrarsi" / "ledger.db") as db:
        return db.execute("SELECT count(*) FROM baselines").fetchone()[0]


def _executions(contract: Path) -> int:
    with sqlite3.connect(contract.parent / ".infrarsi" / "ledger.db") as db:
        return db.execute("SELECT count(*) FROM executions").fetchone()[0]


def test_an_honest_baseline_passes_its_self_check_with_precision_seen_without_watch(tmp_path):
    contract = _workspace(tmp_path)
    human = subprocess.run(
        [sys.executable, "-m", "infrarsi.cli", "baseline", "--contract", str(contract), "--runs", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert human.returncode == 0 and "self-check  passed" in human.stdout, human.stdout + human.stderr
    assert "one timed run shows no run-to-run spread" in human.stdout
    assert _stored_baselines(contract) == 1


def test_tf32_under_an_fp32_contract_is_refused_and_names_numerics_precision(tmp_path):
    contract = _workspace(tmp_path, _baseline_knob("tf32", "1"))
    proc, out = _cli(contract, "--runs", "1")
    assert proc.returncode == 1
    problems = out["self_check"]["problems"]
    assert [p["check"] for p in problems] == ["numerics.precision"], problems
    assert problems[0]["key"] == "[numerics] precision" and "tf32" in problems[0]["message"]
    assert "set_float32_matmul_precision" in problems[0]["message"]
    assert out["runs"] == 1 and out["step_time_s"]["median"] > 0, "what was measured is still shown"
    assert "not stored as the reference" in proc.stderr and "--force" in proc.stderr
    # Nothing stored as the reference; every run is in the ledger all the same.
    assert _stored_baselines(contract) == 0 and _executions(contract) == 2


def test_missing_required_evidence_is_refused_and_names_numerics_require(tmp_path):
    contract = _workspace(tmp_path, _baseline_knob("no_grad_norm", "1"))
    proc, out = _cli(contract, "--runs", "1")
    assert proc.returncode == 1
    problems = {p["check"]: p for p in out["self_check"]["problems"]}
    assert set(problems) == {"numerics.grad_norm"}, problems
    assert problems["numerics.grad_norm"]["key"] == "[numerics] require"
    assert "drop 'grad_norm'" in problems["numerics.grad_norm"]["message"]


def test_loss_spread_above_tolerance_says_which_tolerance_would_hold_and_force_stores_it_marked(tmp_path):
    contract = _workspace(tmp_path, _baseline_knob("noisy", "1"))
    proc, out = _cli(contract, "--runs", "2")
    assert proc.returncode == 1
    problems = {p["check"]: p for p in out["self_check"]["problems"]}
    assert "numerics.loss" in problems, out["self_check"]
    loss = problems["numerics.loss"]
    assert loss["key"] == "[numerics] loss_rtol" and "loss_rtol = " in loss["message"]
    suggested = float(loss["message"].split("loss_rtol = ")[1].split()[0])
    assert suggested > 1e-3, "the default tolerance is what failed"
    assert _stored_baselines(contract) == 0

    # --force stores it, marked, and says so; exit 0 since the user asked. (One timed run: the
    # reference run's own seed still puts its per-parameter gradients apart.)
    forced, out = _cli(contract, "--runs", "1", "--force")
    assert forced.returncode == 0, forced.stderr
    assert out["self_check"]["forced"] is True and out["self_check"]["problems"]
    assert _stored_baselines(contract) == 1
    stored = Ledger.open(contract.parent / ".infrarsi" / "ledger.db").latest_baseline()["summary"]
    assert stored["self_check"]["forced"] is True and stored["self_check"]["problems"]


@pytest.mark.parametrize(
    ("spread", "expected"), [(4e-4, 1e-3), (5e-4, 1e-3), (6e-4, 2e-3), (2.4e-3, 5e-3), (0.3, 1.0), (0.0, 1e-12)]
)
def test_the_tolerance_that_holds_is_round_and_at_least_twice_the_spread(spread, expected):
    assert tolerance_that_holds(spread) == pytest.approx(expected)
    assert tolerance_that_holds(spread) >= 2 * spread


def test_a_spread_that_is_not_finite_is_a_problem_without_a_suggestion():
    from infrarsi._selfcheck import _spread_problem

    problem = _spread_problem("numerics.loss", "[numerics] loss_rtol", 1e-3, float("inf"), "loss")
    assert "not a finite number" in problem.message and "=" not in problem.message


def test_per_parameter_spread_is_judged_with_the_candidates_floor_for_near_zero_gradients():
    from infrarsi._selfcheck import _grads_hold

    reference = {"param_grad_norms": {"3": {"w": 1.0, "b": 3e-9}}, "param_grad_min_rows": {}}
    # b's gradient is mathematically zero (run-to-run 1e-9 vs 3e-9): a candidate passes, so must the baseline.
    assert _grads_hold([{"param_grad_norms": {"3": {"w": 1.0, "b": 1e-9}}}], reference, 1e-2)
    assert not _grads_hold([{"param_grad_norms": {"3": {"w": 1.5, "b": 1e-9}}}], reference, 1e-2)
    assert _grads_hold([{"param_grad_norms": {"3": {"w": 1.5, "b": 1e-9}}}], reference, 1.0)
