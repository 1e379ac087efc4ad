"""SHA-256 of workspace files and of the installed framework."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from pathlib import Path

from infrarsi.contract import matches_any

__all__ = [
    "file_sha256",
    "hash_protected",
    "hash_workspace",
    "hash_framework",
    "diff_hashes",
    "RECEIPTS_DIR",
    "BUNDLE_PATH",
    "LAUNCH_FILE",
    "launch_file_text",
]

_SKIP_DIRS = {".infrarsi", ".git", "__pycache__"}

RECEIPTS_DIR = "infrarsi-receipts"  # beside the contract, in the branch `infrarsi apply` writes
# A receipt bundle as `apply` commits it (its id is the file name): evidence, not code.
BUNDLE_PATH = re.compile(r"^infrarsi-receipts/[0-9a-f]{16}\.json$")
# The launch line of the receipt `apply` committed, for the user's launcher: evidence too, checked
# by `gate` against that receipt's signed `launch`.
LAUNCH_FILE = "infrarsi-launch.txt"


def launch_file_text(receipt_id: str, speedup: float, shell: str) -> str:
    """What `apply` writes to ``LAUNCH_FILE``: a comment naming the receipt, then the line to run."""
    return f"# infrarsi receipt {receipt_id} ({speedup:.3f}x): run the job with this line\n{shell}\n"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _files(root: Path):
    """Files under ``root``, sorted, without descending into the folders of ``_SKIP_DIRS``."""
    found = []
    for folder, dirs, names in os.walk(root, followlinks=False):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS]
        found += [Path(folder) / name for name in names]
    for path in sorted(found):
        if path.is_file():
            yield path


def hash_protected(root: Path, globs) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``root`` matched by ``globs``."""
    return {
        p.relative_to(root).as_posix(): file_sha256(p)
        for p in _files(root)
        if matches_any(p.relative_to(root).as_posix(), globs)
    }


def hash_workspace(root: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file the sandbox copies (no caches, no receipt bundles)."""
    out = {}
    for path in _files(root):
        rel = path.relative_to(root).as_posix()
        if path.suffix != ".pyc" and not BUNDLE_PATH.match(rel) and rel != LAUNCH_FILE:
            out[rel] = file_sha256(path)
    return out


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
