"""Every rejection names its next step (`next` in `verify --json`, `next (...)` lines for people):
the pairs that would resolve a speedup, the step, value, tolerance and key of a numerics failure,
the steps a broken window did receive."""

from __future__ import annotations

import difflib
import math
from pathlib import Path

import numpy as np
import pytest

from infrarsi._next import next_steps, verify_command
from infrarsi.contract import load_contract
from infrarsi.verifiers import CheckResult, pairs_to_resolve
from infrarsi.verifiers._stats import t_quantile


def _diff(root: Path, name: str, *edits: tuple[str, str]) -> Path:
    source = (root / "train.py").read_text()
    changed = source
    for old, new in edits:
        assert changed.count(old) == 1, old
        changed = changed.replace(old, new)
    lines = difflib.unified_diff(source.splitlines(True), changed.splitlines(True), "a/train.py", "b/train.py")
    path = root.parent / f"{name}.diff"
    path.write_text("".join(lines))
    return path


def _next_of(out: dict) -> dict[str, str]:
    return {step["check"]: step["next"] for step in out["next"]}


def test_a_numerics_failure_names_the_step_the_value_the_tolerance_and_the_key(cli, workspace):
    assert cli("baseline", "--runs", "1").rc == 0
    patch = _diff(workspace, "loss", ("p.log(step, loss=2.0 / step,", "p.log(step, loss=2.1 / step,"))
    done = cli("verify", "--patch", str(patch), "--pairs", "0", "--json")
    assert done.rc == 1, done
    out = done.json()
    steps = _next_of(out)
    assert "step 1: loss 2.1 against the baseline's 2, 5.00e-02 apart" in steps["numerics.loss"]
    assert "[numerics] loss_rtol = 0.001" in steps["numerics.loss"] and "infrarsi.toml" in steps["numerics.loss"]
    assert set(steps) == {c["id"] for c in out["checks"] if c["status"] in ("fail", "unchecked")}
    human = cli("verify", "--patch", str(patch), "--pairs", "0")
    assert "next (numerics.loss): step 1: loss 2.1" in human.stdout


def test_a_window_failure_lists_the_steps_that_arrived(cli, workspace):
    assert cli("baseline", "--runs", "1").rc == 0
    patch = _diff(workspace, "short", ("for step in range(1, steps + 1):", "for step in range(1, steps):"))
    done = cli("verify", "--patch", str(patch), "--pairs", "0", "--json")
    assert done.rc == 1, done
    window = _next_of(done.json())["timing.window"]
    assert "steps 1..8" in window and "steps received: 1..7" in window


# -- the texts, from known evidence --------------------------------------------------------


@pytest.fixture
def contract(toyjob):
    return load_contract(toyjob / "infrarsi.toml")


def _speedup(base: list[float], cand: list[float], detail: str = "speedup ...; the lower bound must clear 1.02"):
    return CheckResult("stats.speedup", "fail", detail, {"baseline_s": base, "candidate_s": cand, "median": 1.06})


def test_a_real_but_unresolved_speedup_gets_the_pairs_that_would_resolve_it(contract):
    base = [1.00, 1.04, 0.97, 1.02, 0.99]
    cand = [0.96, 0.95, 0.94, 0.97, 0.90]
    need = pairs_to_resolve(base, cand, 1.02)
    assert need is not None and need > 5
    [step] = next_steps([_speedup(base, cand)], contract, {"speed": "fast", "mode": "ok"}, ["faster"])
    assert step["check"] == "stats.speedup"
    assert f"{need} pairs would resolve the measured 1.060x" in step["next"]
    assert f"`infrarsi verify --set speed=fast --patch faster --pairs {need}`" in step["next"]
    assert f"[search] ab_pairs = {need}" in step["next"]


def test_no_speedup_says_more_pairs_will_not_help(contract):
    same = [1.0, 1.01, 0.99, 1.0, 1.02]
    [step] = next_steps([_speedup(same, list(reversed(same)))], contract, {}, [])
    assert "more pairs are unlikely to help" in step["next"] and "min_speedup = 1.02" in step["next"]


def test_a_drifted_baseline_arm_points_at_the_machine_and_drift_tolerance(contract):
    check = _speedup([1.0] * 3, [0.5] * 3, "speedup 2.0x ..., not trusted: the A/B's baseline arm ...")
    check = CheckResult("stats.speedup", "unchecked", check.detail, check.evidence)
    [step] = next_steps([check], contract, {}, [])
    assert "re-run `infrarsi baseline`" in step["next"] and "drift_tolerance (now 0.15)" in step["next"]


def test_passed_and_skipped_checks_have_no_next_step(contract):
    checks = [CheckResult("numerics.loss", "pass", "ok"), CheckResult("stats.speedup", "skipped", "not run")]
    assert next_steps(checks, contract, {}, []) == []


def test_the_verify_command_names_only_what_differs_from_the_baseline(contract):
    line = verify_command(contract, {"mode": "ok", "speed": "fast"}, ["my patch.diff"], 7)
    assert line == "infrarsi verify --set speed=fast --patch 'my patch.diff' --pairs 7"
    other = load_contract(contract.path.rename(contract.path.with_name("other.toml")))
    assert verify_command(other, {}, [], 2) == f"infrarsi verify --contract {other.path} --pairs 2"


def test_pairs_to_resolve_is_the_smallest_count_that_clears_the_bar():
    base = [1.00, 1.04, 0.97, 1.02, 0.99]
    cand = [0.96, 0.95, 0.94, 0.97, 0.90]
    need = pairs_to_resolve(base, cand, 1.02)
    b, a = np.log(base), np.log(cand)
    d = b - a
    s = max(float(np.std(d, ddof=1)), math.sqrt(float(np.var(b, ddof=1)) + float(np.var(a, ddof=1))))
    margin = float(np.mean(d)) - math.log(1.02)

    def clears(n: int) -> bool:
        return margin >= (t_quantile(0.95, 2 * n - 2) + 0.8416) * s / math.sqrt(n)

    assert clears(need) and not clears(need - 1)
    assert pairs_to_resolve(base, base, 1.02) is None  # A/A: no effect to resolve
    assert pairs_to_resolve([1.0, 3.0, 1.0], [0.95, 0.1, 5.0], 1.02) is None  # beyond 100 pairs at this noise
