"""The public Python API: every stage imported from `infrarsi` alone and called on the bundled
workload, as a notebook user would, without a private module in sight."""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

import infrarsi

# Alone, never beside another test: every stage runs, the search's promotion included.
pytestmark = pytest.mark.serial

STAGES = [
    "init",
    "baseline",
    "run",
    "verify",
    "verify_receipt",
    "search",
    "report",
    "apply",
    "gate",
    "audit",
    "lint",
    "export_pack",
    "load_pack",
    "demo",
]


def test_every_public_name_is_documented_and_importing_the_package_stays_cheap():
    for name in STAGES:
        value = getattr(infrarsi, name)
        assert inspect.isfunction(value) and (inspect.getdoc(value) or "").strip(), f"infrarsi.{name}: no docstring"
    assert set(STAGES) <= set(infrarsi.__all__)
    assert all(not name.startswith("_") or name == "__version__" for name in infrarsi.__all__)
    # A fresh interpreter: `import infrarsi` loads no stage, no torch, no ledger.
    probe = (
        "import sys, infrarsi; print(sorted(m for m in sys.modules "
        "if m.startswith(('torch', 'infrarsi.', 'sqlite_utils'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]", loaded


def _synthetic_job(folder: Path) -> Path:
    """A synthetic job (examples/landscape.py: step time and memory from a table, no torch), so
    every stage runs in seconds; TinyGPT goes through the same stages in tests/examples/test_demo.py."""
    from infrarsi.examples.landscape import Landscape, make_workspace

    land = Landscape(
        name="api",
        patches=["tidy"],
        knobs={"threads": (["1", "2"], "1")},
        base_ms=20.0,
        base_mb=40.0,
        limit_mb=400.0,
        noise=0.01,
        time={"+tidy": 0.6, "threads=2": 0.97},
    )
    return make_workspace(folder, land, ab_pairs=3, starts=1) / "infrarsi.toml"


def test_every_stage_runs_from_the_package_on_a_workload(tmp_path):
    from infrarsi import (
        apply,
        audit,
        baseline,
        export_pack,
        gate,
        init,
        lint,
        load_pack,
        report,
        run,
        search,
        verify,
        verify_receipt,
    )

    contract = _synthetic_job(tmp_path / "job")
    done = init(contract)
    assert done.ledger.is_file() and any(path.startswith("data/") for path in done.pinned)

    summary = baseline(contract, runs=2)
    assert summary.runs == 2 and summary.step_time_s["median"] > 0 and summary.self_check["ok"]

    one = run(contract, sets={"threads": "2"})
    assert one.status == "ok" and one.step_time_s > 0

    checked = verify(contract, patches=["tidy"])
    assert checked.accepted, [c for c in checked.checks if c.status != "pass"]
    assert verify_receipt(checked.receipt).ok

    explored = search(contract, budget=2, promote=False)
    assert explored.best is None and explored.executions == 2

    pack_path, pack = export_pack(contract)
    assert load_pack(pack_path)["findings"] == json.loads(pack_path.read_text())["findings"] == pack["findings"]
    assert pack["findings"], "the accepted verify is a verified finding"

    written = report(contract)
    assert written.html.is_file() and written.promoted

    applied = apply(contract, patch_file=tmp_path / "best.diff")
    assert applied.patches == ["tidy"] and (tmp_path / "best.diff").is_file()

    audited = audit(contract.parent / ".infrarsi" / "ledger.db")
    assert audited.chain_ok and audited.previously_accepted >= 1 and audited.now_rejected == 0, audited.to_json()

    # The source audit of a real training script (a source read: no run).
    findings = lint(str(Path(__file__).resolve().parents[1] / "examples" / "tinygpt" / "train.py"))
    assert findings.clean, findings.to_json()

    # The gate on a repository whose head changes nothing: refused without a run.
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "-A"], cwd=tmp_path, check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"], cwd=tmp_path, check=True
    )
    judged = gate(contract, base="HEAD", head="HEAD")
    assert not judged.passed and judged.mode == "none" and judged.changed == []
    assert any("nothing to verify" in note for note in judged.notes), judged.notes


def test_each_public_name_is_the_stage_function_even_after_every_module_is_imported():
    """Importing a stage's module must not shadow the function of the same name on the package."""
    for module, _ in infrarsi._LAZY.values():
        importlib.import_module(module)
    for name in STAGES:
        module, attribute = infrarsi._LAZY[name]
        value = getattr(infrarsi, name)
        assert inspect.isfunction(value), f"infrarsi.{name} is {value!r}"
        assert value is getattr(importlib.import_module(module), attribute), name
