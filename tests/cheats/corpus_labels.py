"""Where the corpus lives and what each cheat must be rejected by (expected.toml)."""

from __future__ import annotations

import tomllib
from pathlib import Path

HERE = Path(__file__).parent
TINYGPT = HERE.parents[1] / "examples" / "tinygpt"
_LABELS = tomllib.loads((HERE / "expected.toml").read_text())
EXPECTED, AUDIT = _LABELS["rejected_by"], _LABELS["audit"]
