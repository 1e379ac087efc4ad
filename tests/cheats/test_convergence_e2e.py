"""``numerics.convergence`` on real TinyGPT runs: `examples/tinygpt/long.toml` trains the baseline and
the candidate (here 80 steps) under seeds 0 and 1. An honest speed patch is accepted with a receipt that
says how far the claim goes; a learning-rate schedule that starts at step 40 (tests/cheats/late/)
passes every short-window check and is caught there, with the step where the curves part; the
audit re-judges both from the ledger alone."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from corpus_labels import HERE, TINYGPT

CLI = [sys.executable, "-m", "infrarsi.cli"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def long_workspace(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("long") / "tinygpt"
    shutil.copytree(TINYGPT, folder, ignore=shutil.ignore_patterns(".infrarsi", "__pycache__"))
    for name in ("late-lr-decay", "seed-flag-late-decay"):
        shutil.copy(HERE / "late" / f"{name}.diff", folder / "patches" / f"{name}.diff")
    contract = folder / "long.toml"
    text = contract.read_text()
    # Run beside other tests: the A/B's baseline arm may wander further from the stored baseline.
    text = text.replace("min_speedup  = 1.02", "min_speedup  = 1.02\ndrift_tolerance = 0.5")
    # 80 steps, not the example's 150 (CI's time): 4x the window, and the drift starts at 40.
    text = text.replace("steps     = 150", "steps     = 80")
    assert "steps     = 80" in text
    # The margin from `baseline`'s calibration: the baseline's own long runs under each seed.
    text = text.replace("tail      = 0.2", 'tail      = 0.2\nmargin    = "calibrated"')
    assert 'margin    = "calibrated"' in text
    # And the per-step tolerances from the job's own noise (`baseline` then calibrates by itself).
    text = text.replace("loss_rtol      = 1e-3", 'loss_rtol      = "calibrated"')
    text = text.replace("grad_norm_rtol = 1e-2", 'grad_norm_rtol = "calibrated"')
    assert text.count('"calibrated"') == 3
    for name in ("late-lr-decay", "seed-flag-late-decay"):
        text += f'\n[[patches]]\nname = "{name}"\nfile = "patches/{name}.diff"\n'
    contract.write_text(text)
    for args in (("init",), ("baseline", "--runs", "2", "--json")):
        proc = _cli(*args, "--contract", str(contract))
        assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    (folder / "calibration.json").write_text(json.dumps(json.loads(proc.stdout)["calibration"]))
    return contract


def _checks(out: dict) -> dict[str, dict]:
    return {c["id"]: c for c in out["checks"]}


def _an_honest_patch_is_accepted_with_the_convergence_claim_in_its_receipt(long_workspace):
    proc = _cli(
        "verify", "--contract", str(long_workspace), "--patch", "batched-heads", "--set", "attention=sdpa", "--json"
    )
    out = json.loads(proc.stdout)
    assert proc.returncode == 0 and out["accepted"], json.dumps(out["checks"], indent=1)
    conv = _checks(out)["numerics.convergence"]
    assert conv["status"] == "pass" and conv["detail"].startswith("2 seeds x 80 steps: equivalent")
    assert "the calibrated margin" in conv["detail"], conv["detail"]

    receipt = json.loads(Path(out["receipt"]).read_text())["receipt"]
    assert "numerics.convergence" in receipt["required_checks"]
    claim = receipt["convergence"]
    assert claim["steps"] == 80 and claim["seeds"] == 2 and claim["tail_steps"] == 16
    assert -claim["margin"] < claim["ci90"][0] <= claim["ci90"][1] < claim["margin"]
    # 1 candidate run + the A/B's pairs + 2 seeds x (baseline, candidate) long runs, all cited
    assert len(receipt["executions"]) == 1 + 2 * len(receipt["ab"]["baseline_s"]) + 4

    # The report plots the long runs' curves with their seed band, beside the A/B's looks.
    out_dir = long_workspace.parent / "report"
    proc = _cli("report", "--contract", str(long_workspace), "--out", str(out_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    html = next(out_dir.glob("*.html")).read_text()
    rid = json.loads(Path(out["receipt"]).read_text())["id"]
    assert "Long runs (2 seeds x 80 steps)" in html and html.count("<svg") >= 2
    assert any(p.name == f"long-{rid}.svg" for p in out_dir.rglob("*.svg"))


def _a_schedule_change_past_the_window_passes_the_short_checks_and_fails_convergence(long_workspace):
    proc = _cli("verify", "--contract", str(long_workspace), "--patch", "late-lr-decay", "--pairs", "0", "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    checks = _checks(json.loads(proc.stdout))
    short = ("numerics.loss", "numerics.grad_norm", "numerics.precision", "timing.window", "integrity.protected")
    assert all(checks[cid]["status"] == "pass" for cid in short), {cid: checks[cid] for cid in short}
    conv = checks["numerics.convergence"]
    assert conv["status"] == "fail", conv
    assert "trains measurably worse" in conv["detail"], conv["detail"]
    parted = int(conv["detail"].rsplit("the curves part at step ", 1)[1])
    assert 40 < parted <= 80  # the schedule first differs after step 40; the window is 20 steps

    ledger = long_workspace.parent / ".infrarsi" / "contracts" / "long" / "ledger.db"
    audit = _cli("audit", str(ledger), "--json")
    report = json.loads(audit.stdout)
    assert audit.returncode == 0 and report["chain_ok"] and not report["findings"], audit.stdout[-3000:]
    # Re-judged from the stored long runs: the honest verify's pass (when it ran first) and this fail.
    # (each long run's own numerics.convergence only says it has a loss at every step: never `fail`)
    assert report["by_check"]["numerics.convergence"].get("fail", 0) == 1


def _a_schedule_kept_off_whenever_a_seed_is_given_fails_convergence(long_workspace):
    """Red-teamed (2026-12-07): the decay runs only when no --seed is given, as in production. Seed
    0's long run is launched without a seed argument, so its pair shows the decay."""
    proc = _cli(
        "verify", "--contract", str(long_workspace), "--patch", "seed-flag-late-decay", "--pairs", "0", "--json"
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    checks = _checks(json.loads(proc.stdout))
    assert all(checks[cid]["status"] == "pass" for cid in ("numerics.loss", "numerics.grad_norm")), checks
    conv = checks["numerics.convergence"]
    assert conv["status"] == "fail" and "(seed 0)" in conv["detail"], conv


def _a_numerics_cheat_fails_under_the_calibrated_tolerances(long_workspace):
    calibration = json.loads((long_workspace.parent / "calibration.json").read_text())
    # This CPU job reproduces itself bit for bit under every perturbation: the floor is picked,
    # far under the hand-set 1e-3 and 1e-2 (benchmarks/calibration.py: every honest change and
    # numerics cheat of the corpus, docs/benchmarks.md).
    assert calibration["loss_rtol"] == calibration["grad_norm_rtol"] == 1e-5, calibration
    assert set(calibration["perturbations"]) == {"rerun", "threads", "deterministic"}
    assert 0 < calibration["margin"] < 0.05, calibration  # the seeds' spread of the tail loss
    cheat = str(HERE / "cheat" / "uniform-attention.diff")
    proc = _cli("verify", "--contract", str(long_workspace), "--patch", cheat, "--pairs", "0", "--keep-going", "--json")
    checks = _checks(json.loads(proc.stdout))
    assert proc.returncode == 1 and "fail" in (
        checks["numerics.loss"]["status"],
        checks["numerics.grad_norm"]["status"],
    )


def test_long_runs_accept_the_honest_patch_and_catch_the_late_changes(long_workspace):
    """One test over the module's one workspace (xdist would set it up once per worker). The
    contract's tolerances and margin are calibrated: the honest patch passes under them."""
    _an_honest_patch_is_accepted_with_the_convergence_claim_in_its_receipt(long_workspace)
    _a_numerics_cheat_fails_under_the_calibrated_tolerances(long_workspace)
    _a_schedule_change_past_the_window_passes_the_short_checks_and_fails_convergence(long_workspace)
    _a_schedule_kept_off_whenever_a_seed_is_given_fails_convergence(long_workspace)
