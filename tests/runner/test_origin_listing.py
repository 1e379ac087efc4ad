"""The listing of the workspace a sandbox is copied from (runner/_sandbox.py): what a run
changes there reaches every later run's copy, so every change is seen."""

from __future__ import annotations

import os

from infrarsi._hashing import diff_hashes
from infrarsi.runner._sandbox import origin_listing


def test_an_edit_a_new_link_or_a_new_folder_in_the_workspace_is_seen_and_state_is_not(tmp_path):
    (tmp_path / "model.py").write_text("x = 1\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("y = 1\n")
    (tmp_path / ".infrarsi").mkdir()
    before = origin_listing(tmp_path)
    assert sorted(before) == ["model.py", "pkg", "pkg/m.py"]
    (tmp_path / ".infrarsi" / "ledger.db").write_text("rows")  # InfraRSI's own state: not copied, not listed
    (tmp_path / "__pycache__").mkdir()
    assert diff_hashes(before, origin_listing(tmp_path)) == []
    st = (tmp_path / "model.py").stat()
    (tmp_path / "model.py").write_text("x = 9\n")  # same size, its mtime set back
    os.utime(tmp_path / "model.py", ns=(st.st_atime_ns, st.st_mtime_ns))
    os.symlink(tmp_path / "pkg", tmp_path / "model")  # a package folder beats model.py on import
    (tmp_path / "optional_dep").mkdir()  # an empty folder imports as a namespace package
    assert diff_hashes(before, origin_listing(tmp_path)) == ["model", "model.py", "optional_dep"]
