"""`infrarsi --help` and `--version` answer without importing anything heavy."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cli_testing import PATIENCE_S, SCRIPT

from infrarsi import __version__

HEAVY = ("torch", "numpy", "rich", "matplotlib", "openai")

# Runs main() in-process so sys.modules can be inspected after argparse has answered.
_MODULES_AFTER = """
import json, sys
import infrarsi.cli
try:
    code = infrarsi.cli.main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def imported_names(stderr: str) -> set[str]:
    """Module names from PYTHONPROFILEIMPORTTIME's report ('import time: self | cumulative | name')."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def heavy_in(names) -> list[str]:
    return sorted(n for n in names if n.split(".")[0] in HEAVY)


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["run", "--help"]], ids=" ".join)
def test_console_script_answers_without_heavy_imports(args, tmp_path):
    assert SCRIPT.is_file(), f"console script not installed next to {sys.executable}"
    proc = subprocess.run(
        [str(SCRIPT), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=PATIENCE_S,
        env={**_env(), "PYTHONPROFILEIMPORTTIME": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    names = imported_names(proc.stderr)
    assert "infrarsi.cli" in names  # the profile really covered the CLI's imports
    assert heavy_in(names) == []
    if args == ["--version"]:
        assert proc.stdout.strip() == f"infrarsi {__version__}"
    else:
        assert "usage: infrarsi" in proc.stdout


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["baseline", "--help"]], ids=" ".join)
def test_modules_loaded_after_parsing_exclude_torch(args, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", _MODULES_AFTER, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=PATIENCE_S,
        env=_env(),
    )
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    assert report["code"] == 0
    assert heavy_in(report["modules"]) == []
    assert "torch" not in report["modules"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPROFILEIMPORTTIME", None)
    return env
