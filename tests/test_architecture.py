"""The rules of the architecture (pyproject.toml's import-linter contracts), checked on the tree.

`lint-imports` analyses one importable package; here `verifiers/`, `auditors/`, `ledger/` and
`examples/` sit beside `infrarsi/` and install into it, so the check runs on a copy laid out
as installed. A planted violation must break it, or the check proves nothing.
"""

from __future__ import annotations

import ast
import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAPPED = ("verifiers", "auditors", "ledger", "examples")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")  # import-linter and ruff are test extras
RUFF = Path(sys.executable).with_name("ruff")


def _installed_layout(dest: Path) -> Path:
    """``dest/infrarsi`` as pip installs it (mapped packages inside), with the project's config."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "tinygpt")
    shutil.copytree(ROOT / "infrarsi", dest / "infrarsi", ignore=ignore)
    for name in MAPPED:
        shutil.copytree(ROOT / name, dest / "infrarsi" / name, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def _lint_imports(layout: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(layout)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=layout, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_import_contracts_hold(tmp_path):
    done = _lint_imports(_installed_layout(tmp_path))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "BROKEN" not in done.stdout and "Contracts: " in done.stdout


@pytest.mark.parametrize(
    "where, line, contract",
    [
        ("verifiers/_timing.py", "import infrarsi.ledger", "verifiers are pure judges"),
        ("infrarsi/probe.py", "import infrarsi.errors", "the probe and autoprobe live inside the job"),
        ("infrarsi/_gate/_gate.py", "import infrarsi.cli", "only the command line knows the command line"),
        ("infrarsi/_search/strategy/_models.py", "import infrarsi._workspace", "the search's strategy runs nothing"),
        ("auditors/_names.py", "import infrarsi.ledger", "auditors read source only"),
        ("ledger/_rows.py", "import infrarsi._verify", "the ledger knows nothing of the search or the stages"),
        ("infrarsi/runner/_sandbox.py", "import infrarsi._search", "the runner does not import the search"),
        ("infrarsi/_policy.py", "import infrarsi._receipt", "no import cycles between the parts of a package"),
    ],
)
def test_a_planted_violation_breaks_its_contract(tmp_path, where, line, contract):
    layout = _installed_layout(tmp_path)
    parts = Path(where).parts
    target = layout / "infrarsi" / Path(*parts[1:]) if parts[0] == "infrarsi" else layout / "infrarsi" / where
    target.write_text(target.read_text() + f"\n{line}  # planted\n")
    done = _lint_imports(layout)
    assert done.returncode == 1, done.stdout[-3000:]
    broken = [ln for ln in done.stdout.splitlines() if ln.endswith("BROKEN")]
    assert any(ln.startswith(contract) for ln in broken), broken


def test_the_installed_package_list_is_every_package_in_the_tree():
    """pyproject.toml names the packages (the mapped folders need it); one left out is missing
    from every wheel, and no editable install would show it."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for folder, dotted in [("infrarsi", "infrarsi"), *((name, f"infrarsi.{name}") for name in MAPPED)]:
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            if "__pycache__" not in rel:
                found.add(".".join((dotted, *rel)))
    assert listed == found, {"not listed": sorted(found - listed), "listed, not in the tree": sorted(listed - found)}


def _module_lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_over_about_400_lines_without_a_reason():
    """STYLE.md: no module over ~400 lines without a reason written at its top (in its docstring)."""
    long = []
    for folder in ("infrarsi", *MAPPED):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "tinygpt" in path.parts or _module_lines(path) <= 420:
                continue
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            if "Why one module" not in doc:
                long.append(f"{path.relative_to(ROOT)} ({_module_lines(path)} lines)")
    assert not long, f"split these, or say at the top why each is one module ('Why one module: ...'): {long}"


def _resolves(dotted: str) -> bool:
    """``infrarsi.a.b.c``: the longest importable module prefix, then attributes for the rest."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(value, name):
                return False
            value = getattr(value, name)
        return True
    return False


def test_every_infrarsi_path_and_module_the_docs_name_exists():
    """The README's tour and docs/ name modules by path and by dotted name; a move must take the
    docs with it."""
    import re

    missing = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        for dotted in set(re.findall(r"(?<![\w./-])(infrarsi(?:\.\w+)+)", text)):
            if not dotted.endswith((".toml", ".db", ".json")) and not _resolves(dotted):
                missing.append(f"{doc.relative_to(ROOT)}: {dotted}")
        for found in re.findall(
            r"(?<![\w./-])((?:infrarsi|verifiers|auditors|ledger|examples|tests|benchmarks)"
            r"/[\w./-]*\w)",
            text,
        ):
            if not (ROOT / found).exists():
                missing.append(f"{doc.relative_to(ROOT)}: {found}")
    assert not missing, missing


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]])
def test_ruff_is_clean(command):
    """The everyday style (pyproject.toml's [tool.ruff]): lint and format, over the whole tree."""
    done = subprocess.run([str(RUFF), *command], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
