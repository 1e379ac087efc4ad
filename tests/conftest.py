from __future__ import annotations

import shutil
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def toyjob(tmp_path: Path) -> Path:
    """A fresh copy of the torch-free toy workspace."""
    dest = tmp_path / "toyjob"
    shutil.copytree(FIXTURES / "toyjob", dest)
    return dest
