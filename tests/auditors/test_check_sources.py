"""audit.* check results over a candidate's changed files, and the lint verb as a user runs it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from infrarsi.auditors import audit_check_ids, check_sources

TINYGPT = Path(__file__).parents[2] / "examples" / "tinygpt"
TRAIN = (TINYGPT / "train.py").read_text()
MOVED = TRAIN.replace(
    "            opt.step()\n            opt.zero_grad(set_to_none=True)\n",
    "        opt.step()\n        opt.zero_grad(set_to_none=True)\n",
)


def _by_id(results):
    return {r.id: r for r in results}


def test_one_check_per_rule_all_pass_for_an_honest_change():
    results = check_sources(
        {"train.py": (TRAIN, TRAIN.replace("loss_sum = 0.0", "loss_sum = 0.0  # sum"))}, ["fp32"], ["data/**"]
    )
    assert [r.id for r in results] == list(audit_check_ids())
    assert all(r.status == "pass" for r in results), [r.to_json() for r in results if not r.passed]


def test_work_moved_out_of_the_region_fails_with_the_place():
    assert MOVED != TRAIN
    result = _by_id(check_sources({"train.py": (TRAIN, MOVED)}, ["fp32"], []))["audit.timing_boundary"]
    assert result.status == "fail" and "train.py:" in result.detail and "optimizer step" in result.detail
    assert result.evidence["findings"][0]["rule"] == "timing_boundary"


def test_a_created_file_is_audited_alone_and_a_deleted_one_loses_its_work():
    created = _by_id(check_sources({"helper.py": (None, "import time\ntime.time = lambda: 0\n")}, ["fp32"], []))
    assert created["audit.clock_patched"].status == "fail"
    deleted = _by_id(check_sources({"train.py": (TRAIN, None)}, ["fp32"], []))
    assert deleted["audit.timing_boundary"].status == "fail"


def test_unparseable_sources_never_pass():
    broken_patch = check_sources({"train.py": (TRAIN, TRAIN + "\ndef (:\n")}, ["fp32"], [])
    assert {r.status for r in broken_patch} == {"fail"}
    broken_base = check_sources({"train.py": ("def (:\n", TRAIN)}, ["fp32"], [])
    assert {r.status for r in broken_base} == {"unchecked"}


def _lint(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "infrarsi.cli", "lint", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_lint_cli_exit_codes_and_json(tmp_path):
    (tmp_path / "base.py").write_text(TRAIN)
    (tmp_path / "train.py").write_text(MOVED)
    clean = _lint("base.py", cwd=tmp_path)
    assert clean.returncode == 0, clean.stderr
    found = _lint("train.py", "--against", "base.py", "--json", cwd=tmp_path)
    assert found.returncode == 1, found.stderr
    out = json.loads(found.stdout)
    assert out["clean"] is False and {f["rule"] for f in out["findings"]} == {"timing_boundary"}
    assert all({"path", "line", "col", "rule", "message"} <= set(f) for f in out["findings"])
    human = _lint("train.py", "--against", "base.py", cwd=tmp_path)
    moved_line = MOVED.splitlines().index("        opt.step()") + 1  # where the step now sits, column 9
    assert human.returncode == 1 and f"train.py:{moved_line}:9: timing_boundary:" in human.stdout


def test_lint_uses_the_contract_for_precision_and_protected_paths(tmp_path):
    shutil.copytree(TINYGPT, tmp_path, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".infrarsi"))
    (tmp_path / "x.py").write_text("open('data/corpus.txt', 'a').write('!')\nmodel = model.half()\n")
    out = json.loads(_lint("x.py", "--json", cwd=tmp_path).stdout)
    assert {f["rule"] for f in out["findings"]} == {"framework_write", "precision_downgrade"}
    assert out["contract"] == "infrarsi.toml"


def test_lint_bad_input_exits_2_without_a_traceback(tmp_path):
    (tmp_path / "bad.py").write_text("def f(:\n")
    for args in (["missing.py"], ["bad.py"], ["bad.py", "--json"]):
        proc = _lint(*args, cwd=tmp_path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert "error:" in proc.stderr
    assert json.loads(_lint("bad.py", "--json", cwd=tmp_path).stdout)["exit_code"] == 2
