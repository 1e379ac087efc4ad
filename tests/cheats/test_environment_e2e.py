"""A job that leaves no process but changes the interpreter every later run imports from.

The cheat (found by red-teaming the containment work) writes a ``.pth`` file and a module
into site-packages; Python runs it at the start of every later ``python train.py``, where it
slows the optimizer step of any script that is not the candidate's: the A/B's baseline arm.
Its candidate does the same work as the baseline, and before the environment was watched it
earned a 1.31x receipt. Now the run fails ``integrity.framework`` naming the files, and the
files it added are gone again when the run ends.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from corpus_labels import HERE

import infrarsi
import infrarsi.probe
from infrarsi.runner._interpreter import _honest_bytecode

# Alone, never beside another test: it writes a startup hook into site-packages, which every run beside it would see.
pytestmark = pytest.mark.serial

PLANTED = ("tinygpt_startup.pth", "_tinygpt_startup.py")


def _one_run(contract, cheat: str):
    """The cheat's candidate run alone (no A/B), every layer judged: (outcome, checks by id)."""
    outcome = infrarsi.verify(contract, patches=[str(HERE / "environment" / cheat)], pairs=0, keep_going=True)
    return outcome, {c.id: c for c in outcome.checks}


def test_a_startup_hook_left_in_site_packages_fails_integrity_and_is_removed(tinygpt_workspace):
    site_packages = Path(sysconfig.get_paths()["purelib"])
    try:
        outcome, by_id = _one_run(tinygpt_workspace, "startup-hook-slows-the-baseline.diff")
        framework = by_id["integrity.framework"]
        assert not outcome.accepted
        assert framework.status == "fail" and "tinygpt_startup.pth (added, removed again)" in framework.detail, (
            framework
        )
        assert by_id["numerics.loss"].status == "pass"  # the same model trains: only the environment tells
        assert not any((site_packages / name).exists() for name in PLANTED)
    finally:
        for name in PLANTED:
            (site_packages / name).unlink(missing_ok=True)


def test_a_forged_bytecode_cache_of_the_probe_fails_integrity_and_is_removed(tinygpt_workspace):
    """Found red-teaming the multi-node work: the job writes a ``.pyc`` for InfraRSI's own
    probe.py, stamped with the source's modification time and size (so Python trusts it) but
    holding code that slows every step of any script that is not the candidate's. No ``.py``
    changes. On two Slurm nodes it earned a 1.38x receipt before bytecode caches were checked
    against their source."""
    cache = Path(importlib.util.cache_from_source(infrarsi.probe.__file__))
    outcome, by_id = _one_run(tinygpt_workspace, "forged-probe-bytecode-slows-the-baseline.diff")
    framework = by_id["integrity.framework"]
    assert not outcome.accepted
    assert framework.status == "fail" and "probe." in framework.detail and "removed again" in framework.detail, (
        framework
    )
    # What later runs import is the probe's own code again: the forged cache is gone (or, if
    # something imported the probe since, what Python wrote for its source).
    assert not cache.exists() or _honest_bytecode(str(cache))


def test_a_run_that_edits_the_workspace_every_run_copies_fails_integrity(tinygpt_workspace):
    """Found red-teaming the environment watch: the job finds the folder its sandbox was
    copied from (an ancestor process holds the ledger open there) and appends, to an editable
    file there, code that slows every run but the candidate's. Every later copy, the A/B's
    baseline arm included, starts from the edited file, and no protected file changed.

    Through the CLI, as a user runs it: its process is the nearest ancestor holding a ledger
    (this test process may hold others open, which the cheat would find first)."""
    model = tinygpt_workspace.parent / "model.py"
    original = model.read_text()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "infrarsi.cli", "verify", "--contract", str(tinygpt_workspace), "--json"]
            + ["--patch", str(HERE / "environment" / "edit-the-workspace-every-run-copies.diff")]
            + ["--pairs", "0", "--keep-going"],
            cwd=tinygpt_workspace.parent,
            capture_output=True,
            text=True,
            timeout=600,
        )
        out = json.loads(done.stdout.splitlines()[-1])
        assert "workspace-seeded" in model.read_text(), done.stderr[-2000:]  # the cheat reached the original
        protected = {c["id"]: c for c in out["checks"]}["integrity.protected"]
        assert done.returncode == 1 and not out["accepted"]
        assert protected["status"] == "fail" and "every later run is copied from: model.py" in protected["detail"]
    finally:
        model.write_text(original)
