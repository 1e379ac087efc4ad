"""The Python sources a candidate's patches change, before and after, for the source audit."""

from __future__ import annotations

import tempfile
from pathlib import Path

from infrarsi._patch import parse_patch
from infrarsi.contract import PatchRef
from infrarsi.errors import PatchParseError
from infrarsi.runner._sandbox import Sandbox

__all__ = ["apply_to", "changed_sources", "pre_images"]


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


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="replace")


def _inside(rel: str) -> bool:
    """A workspace-relative path that stays inside (scope.* rejects the others before this runs)."""
    parts = Path(rel).parts
    return bool(parts) and not Path(rel).is_absolute() and ".." not in parts


def _python_paths(patches: tuple[PatchRef, ...]) -> set[str]:
    return {
        p
        for patch in patches
        for change in parse_patch(patch.text)
        for p in change.paths
        if p.endswith(".py") and _inside(p)
    }


def changed_sources(workspace: Path, patches: tuple[PatchRef, ...]) -> dict[str, tuple[str | None, str | None]]:
    """Workspace path -> (text before, text after) for every ``.py`` file the patches touch.

    Only the Python parts of the patches are applied (``git apply --include='*.py'``), to a
    scratch copy of just those files, so the workspace is never written. Raises
    PatchRejected when they do not apply.
    """
    files = {}
    for rel in _python_paths(patches):
        path = workspace / rel
        if path.is_file():
            files[rel] = path.read_bytes()
    return apply_to(files, patches)


def apply_to(files: dict[str, bytes], patches: tuple[PatchRef, ...]) -> dict[str, tuple[str | None, str | None]]:
    """The same from stored pre-images (``files``: path -> bytes), as ``infrarsi audit`` has them.

    A touched ``.py`` path missing from ``files`` is a file the patch creates.
    """
    touched = _python_paths(patches)
    if not touched:
        return {}
    box = Sandbox(Path(tempfile.mkdtemp(prefix="infrarsi-audit-")))
    try:
        box.workspace.mkdir()
        box.home.mkdir()
        for rel in touched:
            if rel in files:
                (box.workspace / rel).parent.mkdir(parents=True, exist_ok=True)
                (box.workspace / rel).write_bytes(files[rel])
        for patch in patches:
            if _python_paths((patch,)):
                box.apply(patch.name, patch.text, include="*.py")
        after = {
            rel: (box.workspace / rel).read_bytes() if (box.workspace / rel).is_file() else None for rel in touched
        }
        return {rel: (_text(files.get(rel)), _text(after[rel])) for rel in sorted(touched)}
    finally:
        box.remove()
