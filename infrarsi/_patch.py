"""Reading unified diffs: which files a patch touches, and how.

This is only a reader for evidence and scope; applying is left to ``git apply``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from infrarsi.errors import PatchParseError

__all__ = ["FileChange", "parse_patch"]

_DIFF_GIT = re.compile(r"^diff --git (\S+) (\S+)$")


@dataclass(frozen=True)
class FileChange:
    """One file in a diff; ``old``/``new`` are workspace-relative, None for /dev/null."""

    old: str | None
    new: str | None
    binary: bool = False
    rename: bool = False
    mode_change: bool = False

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(p for p in dict.fromkeys((self.old, self.new)) if p is not None)

    @property
    def created(self) -> bool:
        return self.old is None and self.new is not None

    @property
    def deleted(self) -> bool:
        return self.new is None and self.old is not None


def _strip(path: str) -> str | None:
    path = path.split("\t", 1)[0].strip()
    if path.startswith('"') and path.endswith('"'):
        path = path[1:-1]
    if path == "/dev/null":
        return None
    # git apply strips one leading component by default (-p1).
    return path.split("/", 1)[1] if "/" in path else path


def parse_patch(text: str) -> list[FileChange]:
    """The files a unified diff (git or plain) touches; raises PatchParseError if none."""
    changes: list[FileChange] = []
    current: dict | None = None

    def finish() -> None:
        nonlocal current
        if current is not None:
            if current["old"] is None and current["new"] is None:
                raise PatchParseError("a file change with /dev/null on both sides")
            changes.append(
                FileChange(current["old"], current["new"], current["binary"], current["rename"], current["mode"])
            )
        current = None

    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        git = _DIFF_GIT.match(line)
        if git:
            finish()
            current = {
                "old": _strip(git.group(1)),
                "new": _strip(git.group(2)),
                "binary": False,
                "rename": False,
                "mode": False,
                "git": True,
            }
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = _strip(line[4:]), _strip(lines[i + 1][4:])
            if current is None or not current.get("git") or current.get("hunks"):
                finish()
                current = {"old": old, "new": new, "binary": False, "rename": False, "mode": False}
            else:
                current["old"], current["new"] = old, new
            current["hunks"] = True
            i += 1
        elif current is not None:
            if line.startswith("new file mode"):
                current["old"] = None
            elif line.startswith("deleted file mode"):
                current["new"] = None
            elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
                current["rename"] = True
            elif line.startswith(("old mode ", "new mode ")):
                current["mode"] = True
            elif line.startswith("GIT binary patch") or (line.startswith("Binary files ") and line.endswith(" differ")):
                current["binary"] = True
        i += 1
    finish()
    if not changes:
        raise PatchParseError("no file changes found (expected a unified diff with ---/+++ or diff --git headers)")
    return changes
