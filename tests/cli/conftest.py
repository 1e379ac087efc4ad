"""CLI fixtures: the real `infrarsi` in subprocesses against a copy of the toy workspace."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cli_testing import PATIENCE_S, Done, argv, cli_env, kill_workload, processes_under

from infrarsi import init


@pytest.fixture
def sandbox_tmp(tmp_path: Path) -> Path:
    """TMPDIR for `infrarsi`: its sandbox copies land here, so leftovers can be seen."""
    path = tmp_path / "tmp"
    path.mkdir()
    return path


@pytest.fixture
def cli(toyjob: Path, sandbox_tmp: Path):
    """``cli("run", "--json")``: run `infrarsi` to its end, in the workspace unless ``cwd`` says otherwise."""

    def call(*args: str, cwd: Path | None = None, script: bool = False, env: dict | None = None) -> Done:
        proc = subprocess.run(
            argv(*args, script=script),
            cwd=cwd or toyjob,
            env=env or cli_env(sandbox_tmp),
            capture_output=True,
            text=True,
            timeout=PATIENCE_S,
            stdin=subprocess.DEVNULL,
        )
        return Done(proc.returncode, proc.stdout, proc.stderr)

    return call


@pytest.fixture
def workspace(toyjob: Path) -> Path:
    """The toy workspace, initialised (through the library: the verbs under test use the CLI)."""
    init(toyjob / "infrarsi.toml")
    return toyjob


@pytest.fixture
def baselined(cli, workspace: Path) -> Path:
    """The initialised toy workspace with a one-run baseline stored (through the CLI)."""
    assert cli("baseline", "--runs", "1").rc == 0
    return workspace


@pytest.fixture
def workloads(sandbox_tmp: Path):
    """Pids of workloads seen during a test; at the end, any of them still running, and any
    process left working inside this test's sandbox folder, is killed by id."""
    seen: list[int] = []
    yield seen
    for pid in seen + processes_under(sandbox_tmp):
        kill_workload(pid)
