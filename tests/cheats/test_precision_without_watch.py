"""Precision evidence with zero code change: the bundled TinyGPT with its `p.watch(model)` line
taken out (as in DESIGN.md's probe example) still gets `numerics.precision` judged, from the
parameters of the optimizers torch's global step hook sees: an honest patch passes, bf16
weights fail."""

from __future__ import annotations

import shutil

import pytest
from conftest import short_window
from corpus_labels import HERE, TINYGPT

import infrarsi


@pytest.fixture(scope="module")
def unwatched(tmp_path_factory):
    folder = tmp_path_factory.mktemp("unwatched") / "tinygpt"
    shutil.copytree(TINYGPT, folder, ignore=shutil.ignore_patterns(".infrarsi", "__pycache__"))
    train = folder / "train.py"
    text = train.read_text()
    assert text.count("    p.watch(model)\n") == 1
    train.write_text(text.replace("    p.watch(model)\n", ""))
    contract = short_window(folder)
    infrarsi.init(contract)
    infrarsi.baseline(contract, runs=2)
    return contract


def _precision(outcome):
    return next(c for c in outcome.checks if c.id == "numerics.precision")


def test_an_honest_patch_passes_precision_without_watch(unwatched):
    outcome = infrarsi.verify(unwatched, sets={"attention": "sdpa"}, patches=["batched-heads"], pairs=0)
    check = _precision(outcome)
    assert check.status == "pass", check
    assert all(c.status == "pass" for c in outcome.checks if c.id.startswith("numerics.")), outcome.checks


def test_bf16_weights_fail_precision_without_watch(unwatched):
    outcome = infrarsi.verify(unwatched, patches=[str(HERE / "cheat" / "bf16-weights.diff")], pairs=0, keep_going=True)
    check = _precision(outcome)
    assert not outcome.accepted
    assert check.status == "fail" and "bf16" in check.detail, check
