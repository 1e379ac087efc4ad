"""The Python sources a candidate's patches change, before and after, for the source audit."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from infrarsi._candidate import PatchRef
from infrarsi._patch import PatchParseError, parse_patch
from infrarsi._sandbox import Sandbox

__all__ = ["changed_sources", "pre_images"]


def pre_images(workspace: Path, patches: tuple[PatchRef, ...]) -> dict[str, bytes]:
    """The workspace files the patches touch, as they are before patching (ledger evidence)."""
    out: dict[str, bytes] = {}
    for patch in patches:
        try:
            changes = parse_patch(patch.text)
        except PatchParseError:
            continue
        for change in changes:
            if change.old is None:
                continue
            path = workspace / change.old
            if path.is_file() and path.resolve().is_relative_to(workspace.resolve()):
                out[change.old] = path.read_bytes()
    return out


def _read(path: Path) -> str | None:
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None


def changed_sources(workspace: Path, patches: tuple[PatchRef, ...]) -> dict[str, tuple[str | None, str | None]]:
    """Workspace path -> (text before, text after) for every ``.py`` file the patches touch.

    Only the Python parts of the patches are applied (``git apply --include='*.py'``), to a
    scratch copy of just those files, so the workspace is never written. Raises
    PatchRejected when they do not apply.
    """
    touched: set[str] = set()
    for patch in patches:
        for change in parse_patch(patch.text):
            touched.update(p for p in change.paths if p.endswith(".py"))
    if not touched:
        return {}
    box = Sandbox(Path(tempfile.mkdtemp(prefix="infrarsi-audit-")))
    try:
        box.workspace.mkdir()
        box.home.mkdir()
        for rel in touched:
            src = workspace / rel
            if src.is_file():
                (box.workspace / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, box.workspace / rel)
        for patch in patches:
            if any(p.endswith(".py") for c in parse_patch(patch.text) for p in c.paths):
                box.apply(patch.name, patch.text, include="*.py")
        return {rel: (_read(workspace / rel), _read(box.workspace / rel))
                for rel in sorted(touched)}
    finally:
        box.remove()
