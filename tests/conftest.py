from __future__ import annotations

import shutil
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"

# The parallel pass's longest files (minutes each, measured in CI-style runs), run first: xdist
# hands tests out in collection order, and one of these started last would run on alone while
# the other worker sits idle. Longest first. Order only: every test still runs.
LONGEST_FIRST = (
    "tests/cheats/test_convergence_e2e.py",
    "tests/examples/test_knob_numerics.py",
    "tests/search/test_search.py",
    "tests/search/test_search_convergence.py",
)


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the rest keep their order


@pytest.fixture
def toyjob(tmp_path: Path) -> Path:
    """A fresh copy of the torch-free toy workspace."""
    dest = tmp_path / "toyjob"
    shutil.copytree(FIXTURES / "toyjob", dest)
    return dest
