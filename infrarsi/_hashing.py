"""SHA-256 of workspace files and of the installed framework."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from infrarsi._globs import matches_any

__all__ = ["file_sha256", "hash_protected", "hash_framework", "diff_hashes"]

_SKIP_DIRS = {".infrarsi", ".git", "__pycache__"}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _files(root: Path):
    for path in sorted(root.rglob("*")):
        if path.is_file() and not _SKIP_DIRS.intersection(path.relative_to(root).parts):
            yield path


def hash_protected(root: Path, globs) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``root`` matched by ``globs``."""
    return {p.relative_to(root).as_posix(): file_sha256(p)
            for p in _files(root) if matches_any(p.relative_to(root).as_posix(), globs)}


def hash_framework() -> dict[str, str]:
    """``{relative path: sha256}`` of the installed ``infrarsi`` package's own source files."""
    import infrarsi

    root = Path(infrarsi.__file__).parent
    roots = [root]
    # Subpackages mapped from top-level folders (verifiers, auditors, ledger) live elsewhere
    # in an editable install; hash them wherever they are.
    for sub in ("verifiers", "auditors", "ledger", "examples"):
        spec = importlib.util.find_spec(f"infrarsi.{sub}")
        if spec is not None and spec.origin:
            roots.append(Path(spec.origin).parent)
    out: dict[str, str] = {}
    for base in dict.fromkeys(roots):
        if base != root and base.is_relative_to(root):
            continue  # a regular install: already under the package root
        for path in _files(base):
            if path.suffix == ".py":
                out[f"{base.name}/{path.relative_to(base).as_posix()}"] = file_sha256(path)
    return out


def diff_hashes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Paths added, removed or changed between two hash maps, sorted."""
    return sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
