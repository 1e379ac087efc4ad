"""The Python environment every execution imports from, watched for changes a job leaves behind.

A job that writes a ``.pth`` file or a ``sitecustomize`` into site-packages, or edits
torch's installed source, changes what every later execution runs, the A/B's baseline
arm included: a process-free way to slow the baseline that containment (which ends
processes) can't see. So the runner lists every file in site-packages (all of it) and at
the top of the standard library's folders (where ``sitecustomize`` and friends are found)
by size, modification time and inode change time after each run, and compares with the
listing before it. The change time is the kernel's: a job that edits a file and sets its
modification time back (``os.utime``) can't set it back too.
Files a run *added* are removed again (recorded); files it changed or deleted can't be
restored and are reported. Bytecode caches Python writes on first import (a new ``.pyc``
under ``__pycache__``) are not a change. Edits inside the standard library's packages are
not listed (a full listing costs about 0.7 s a run here against 0.2 s; site-packages with torch and
transformers, 45,000 files, lists in about 0.23 s with one scandir per folder, 0.30 s with os.walk).
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from pathlib import Path

__all__ = ["EnvironmentWatch", "import_roots"]

Listing = dict[str, tuple[int, int, int]]  # path -> (size, mtime_ns, ctime_ns)


def import_roots() -> tuple[list[Path], list[Path]]:
    """(site-packages folders, listed whole; standard-library folders, listed at the top only)
    of the interpreter the job runs under (the one infrarsi runs under)."""
    paths = sysconfig.get_paths()
    packages = {Path(p) for p in (paths.get("purelib"), paths.get("platlib")) if p}
    packages.update(Path(p) for p in site.getsitepackages())
    if site.ENABLE_USER_SITE and site.getusersitepackages():
        packages.add(Path(site.getusersitepackages()))
    stdlib = {Path(p) for p in (paths.get("stdlib"), paths.get("platstdlib")) if p}
    return sorted(p for p in packages if p.is_dir()), sorted(p for p in stdlib if p.is_dir())


def _list(whole: list[Path], top: list[Path]) -> Listing:
    out: Listing = {}
    for root in top:
        with os.scandir(root) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    out[entry.path] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    # Every file under the whole roots (symlinks listed, never followed). One scandir per folder and
    # the entry's own lstat: half the cost of os.walk with a join and an lstat per name, and the
    # listing runs after every execution.
    folders = [str(root) for root in whole]
    while folders:
        try:
            entries = os.scandir(folders.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(entry.path)
                        continue
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                out[entry.path] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return out


def _first_import_cache(path: str) -> bool:
    return path.endswith(".pyc") and os.path.basename(os.path.dirname(path)) == "__pycache__"


class EnvironmentWatch:
    """The import roots' listing, taken once, then compared after every run."""

    def __init__(self, whole: list[Path] | None = None, top: list[Path] | None = None) -> None:
        found = import_roots() if whole is None else (whole, top or [])
        self.whole, self.top = found
        self.roots = [*self.whole, *self.top]
        self._listing = _list(self.whole, self.top)

    def after_run(self) -> dict:
        """What the run changed in the environment; files it added are removed again.

        ``{"roots": [...], "added": [...], "changed": [...], "deleted": [...], "removed": [...]}``,
        paths relative to their root's parent so they read like ``site-packages/x.pth``.
        """
        now = _list(self.whole, self.top)
        before = self._listing
        added = sorted(p for p in now.keys() - before.keys() if not _first_import_cache(p))
        changed = sorted(p for p in now.keys() & before.keys() if now[p] != before[p])
        deleted = sorted(before.keys() - now.keys())
        removed = []
        for path in added:
            try:
                os.unlink(path)
                removed.append(path)
                del now[path]
            except OSError:
                continue
        self._listing = now
        return {
            "roots": [str(r) for r in self.roots],
            "added": [self._short(p) for p in added],
            "changed": [self._short(p) for p in changed],
            "deleted": [self._short(p) for p in deleted],
            "removed": [self._short(p) for p in removed],
        }

    def _short(self, path: str) -> str:
        for root in self.roots:
            if path.startswith(str(root) + os.sep):
                return os.path.relpath(path, root.parent)
        return path


if __name__ == "__main__":  # pragma: no cover - a quick look at what is watched
    watch = EnvironmentWatch()
    print(sys.executable, [str(r) for r in watch.roots], len(watch._listing), "files")
