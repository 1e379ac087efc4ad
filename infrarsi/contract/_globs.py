"""Workspace-relative path globs: ``*`` and ``?`` stay inside one path segment,
``**`` spans any number of segments (``data/**`` matches everything under data/)."""

from __future__ import annotations

import re
from functools import lru_cache

__all__ = ["glob_regex", "matches", "matches_any", "check_glob"]


@lru_cache(maxsize=512)
def glob_regex(glob: str) -> re.Pattern[str]:
    parts: list[str] = []
    segments = glob.split("/")
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "**":
            # "a/**" matches a/ and everything below; "**/b" matches b at any depth.
            parts.append(".*" if last else "(?:[^/]+/)*")
            continue
        pattern = ""
        for char in segment:
            if char == "*":
                pattern += "[^/]*"
            elif char == "?":
                pattern += "[^/]"
            else:
                pattern += re.escape(char)
        parts.append(pattern if last else pattern + "/")
    return re.compile("".join(parts) + r"\Z")


def matches(path: str, glob: str) -> bool:
    """Whether workspace-relative POSIX ``path`` is matched by ``glob``."""
    return glob_regex(glob).match(path) is not None


def matches_any(path: str, globs) -> bool:
    return any(matches(path, g) for g in globs)


def check_glob(glob: str) -> str | None:
    """Why ``glob`` is not a usable workspace glob, or None when it is."""
    if not glob:
        return "an empty glob"
    if glob.startswith("/"):
        return "an absolute path (globs are relative to the workspace)"
    if ".." in glob.split("/"):
        return "a path that leaves the workspace ('..')"
    if "\\" in glob:
        return "a backslash (use '/' as the separator)"
    return None
