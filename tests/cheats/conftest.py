"""A short-window copy of the bundled TinyGPT, initialised and baselined once for the corpus."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from corpus_labels import TINYGPT

import infrarsi
from infrarsi import init


def short_window(folder: Path) -> Path:
    """The demo's contract with a 2 + 8 step window, so the corpus fits CI's budget."""
    contract = folder / "infrarsi.toml"
    text = contract.read_text()
    text = text.replace("warmup_steps  = 5", "warmup_steps  = 2").replace("measure_steps = 15", "measure_steps = 8")
    # The corpus shares one baseline over a long suite on a shared 2-core machine, whose step
    # time has wandered 17% in a minute: the drift net is widened here and tested on its own
    # (tests/verifiers/test_stats.py, tests/verifiers/test_runner_clock.py).
    text = text.replace("min_speedup       = 1.02", "min_speedup       = 1.02\ndrift_tolerance   = 0.4")
    assert "warmup_steps  = 2" in text and "measure_steps = 8" in text and "drift_tolerance" in text
    contract.write_text(text)
    return contract


@pytest.fixture(scope="session")
def tinygpt_workspace(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus") / "tinygpt"
    shutil.copytree(TINYGPT, folder, ignore=shutil.ignore_patterns(".infrarsi", "__pycache__"))
    contract = short_window(folder)
    init(contract)
    infrarsi.baseline(contract, runs=2)
    return contract
