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
    assert "warmup_steps  = 2" in text and "measure_steps = 8" in text
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
