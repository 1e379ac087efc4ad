"""Helpers shared by the tests of the bundled scripts nobody wrote for InfraRSI (single-file-gpt,
hf-trainer): the CLI with --json, a workspace through init and a baseline, a cheat as a diff."""

from __future__ import annotations

import difflib
import json
import shutil
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def cli(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "infrarsi.cli", *args, "--json"], capture_output=True, text=True, cwd=cwd, timeout=1200
    )
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return proc, json.loads(proc.stdout)


def baselined_workspace(folder: Path, example: str) -> tuple[Path, dict]:
    """A copy of ``example`` through `init` and a 2-run `baseline` (its self-check passed).

    A shorter search (2 A/B pairs); the drift net opened wide: a shared CI machine's step time has
    moved 40% between a baseline and the verify right after it (the net is tested on its own in
    tests/verifiers/).
    """
    root = folder / example
    shutil.copytree(EXAMPLES / example, root, ignore=shutil.ignore_patterns(".infrarsi", "__pycache__", "out"))
    contract = root / "infrarsi.toml"
    text = contract.read_text().replace("ab_pairs          = 5", "ab_pairs          = 2")
    contract.write_text(text.replace("min_speedup       = 1.02", "min_speedup       = 1.02\ndrift_tolerance   = 3.0"))
    done, _ = cli("init", cwd=root)
    assert done.returncode == 0, done.stderr
    done, out = cli("baseline", "--runs", "2", cwd=root)
    assert done.returncode == 0, done.stderr  # the self-check passed: the baseline is stored
    return root, out


def cheat(root: Path, name: str, old: str, new: str) -> Path:
    """The workspace's train.py with ``old`` replaced by ``new``, as a unified diff beside it."""
    source = (root / "train.py").read_text()
    assert source.count(old) == 1, old
    diff = difflib.unified_diff(
        source.splitlines(True), source.replace(old, new).splitlines(True), "a/train.py", "b/train.py"
    )
    path = root.parent / f"{name}.diff"
    path.write_text("".join(diff))
    return path


def failing(out: dict) -> dict[str, str]:
    return {c["id"]: c["status"] for c in out["checks"] if c["status"] in ("fail", "unchecked")}
