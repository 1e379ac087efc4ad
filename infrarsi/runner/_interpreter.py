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
restored and are reported.

**Bytecode caches.** Python trusts a ``__pycache__/*.pyc`` whose header carries its
source's modification time and size, and never looks at the source again: a job that writes
such a file holding other code changes every later run without touching a ``.py`` (found
red-teaming: a forged cache of InfraRSI's own probe that slowed every run but the
candidate's earned a receipt). Comparing a cache with its source is not enough (code objects
compare equal with other specialised opcodes, inline caches or stack sizes; marshal's bytes
differ between compiles), so every cache a run added or changed is removed after it, and
Python writes the honest one again at the next import. Jobs run with
``PYTHONDONTWRITEBYTECODE=1``, so an honest job writes none; one that is not even its
source's code (``_honest_bytecode``) is also reported as a change. The framework's own folders are
watched too where they are not under site-packages (an editable install).

Edits inside the standard library's packages are not listed (a full listing costs about
0.7 s a run here against 0.2 s; site-packages with torch and transformers, 45,000 files,
lists in about 0.23 s with one scandir per folder, 0.30 s with os.walk).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import marshal
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

__all__ = ["EnvironmentWatch", "import_roots"]

Listing = dict[str, tuple[int, int, int]]  # path -> (size, mtime_ns, ctime_ns)


def import_roots() -> tuple[list[Path], list[Path]]:
    """(folders listed whole: site-packages, and InfraRSI's own package folders where they are
    elsewhere; folders listed at the top only: the standard library's, every other folder on
    the import path (lib-dynload, ``PYTHONPATH``, what a ``.pth`` file adds, the folder a zip
    on the path would be created in), and the interpreter's own (its ``bin``, the venv's
    ``pyvenv.cfg``, the shared library's folder)) of the interpreter the job runs under (the
    one infrarsi runs under)."""
    paths = sysconfig.get_paths()
    packages = {Path(p) for p in (paths.get("purelib"), paths.get("platlib")) if p}
    packages.update(Path(p) for p in site.getsitepackages())
    if site.ENABLE_USER_SITE and site.getusersitepackages():
        packages.add(Path(site.getusersitepackages()))
    whole = sorted(p for p in packages if p.is_dir())
    framework = [f for f in _framework_folders() if not any(f.is_relative_to(w) for w in whole)]
    whole += framework
    top: list[Path] = []
    candidates = [paths.get("stdlib"), paths.get("platstdlib"), *_job_path()]
    candidates += [os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(sys.executable)), sys.prefix]
    candidates.append(sysconfig.get_config_var("LIBDIR"))
    for entry in candidates:
        if not entry:  # '' on sys.path: the current folder, which is the job's own sandbox
            continue
        folder = Path(entry).resolve()
        if not folder.is_dir():  # a zip on the path: watch the folder it would be created in
            folder = folder.parent
        if folder.is_dir() and not any(folder.is_relative_to(w) for w in whole) and folder not in top:
            top.append(folder)
    return whole, top


@functools.lru_cache(maxsize=8)
def _path_of(executable: str, pythonpath: str | None) -> tuple[str, ...]:
    probe = [executable, "-c", "import sys, json; print(json.dumps(sys.path[1:]))"]
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30, env=env, cwd="/")
        found = json.loads(done.stdout)
        if isinstance(found, list) and all(isinstance(p, str) for p in found):
            return tuple(found)
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return tuple(sys.path[1:])


def _job_path() -> list[str]:
    """The import path a job's interpreter starts with (``PYTHONPATH`` and ``.pth`` files
    included; not the script's own folder, which is the sandbox), asked of the interpreter
    itself. The driver's own path is not the job's: ``python -m`` puts the driver's current
    folder first, and a test runner adds its own folders."""
    return list(_path_of(sys.executable, os.environ.get("PYTHONPATH")))


def _framework_folders() -> list[Path]:
    """The folders of infrarsi and the subpackages mapped from the source tree's top-level
    folders (an editable install keeps them there), each once."""
    out: list[Path] = []
    for name in ("infrarsi", "infrarsi.verifiers", "infrarsi.auditors", "infrarsi.ledger"):
        spec = importlib.util.find_spec(name)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            path = Path(folder).resolve()
            if path.is_dir() and not any(path.is_relative_to(o) for o in out):
                out.append(path)
    return out


def _list(whole: list[Path], top: list[Path]) -> Listing:
    out: Listing = {}
    # The top of each top root: files, links and folders (a new folder there is a new package
    # that may shadow one imported later on the path); not its bytecode cache folder, nor a
    # folder that holds a whole root (listed file by file below).
    holding = {str(a) for w in whole for a in (w, *w.parents)}
    for root in top:
        try:
            entries = os.scandir(root)
        except OSError:
            continue
        with entries:
            for entry in entries:
                if entry.name == "__pycache__" or entry.path in holding:
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
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


def _bytecode_cache(path: str) -> bool:
    return path.endswith(".pyc") and os.path.basename(os.path.dirname(path)) == "__pycache__"


def _honest_bytecode(path: str) -> bool:
    """Whether ``path`` (``pkg/__pycache__/mod.TAG[.opt-N].pyc``) is what this interpreter
    writes for ``pkg/mod.py``: the header's magic number and source stamp (modification time
    and size, or the source's hash) match, and its code object equals the source's compiled
    now. Anything unreadable or unmatched is not."""
    parts = os.path.basename(path).split(".")
    if not (3 <= len(parts) <= 4 and parts[1] == sys.implementation.cache_tag):
        return False
    optimize = 0
    if len(parts) == 4:
        if not (parts[2].startswith("opt-") and parts[2][4:].isdigit()):
            return False
        optimize = int(parts[2][4:])
    source = os.path.join(os.path.dirname(os.path.dirname(path)), parts[0] + ".py")
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        with open(source, "rb") as handle:
            text = handle.read()
        stamp = os.stat(source)
        if data[:4] != importlib.util.MAGIC_NUMBER:
            return False
        flags = int.from_bytes(data[4:8], "little")
        if flags == 0:
            if data[8:16] != (
                (int(stamp.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
                + (stamp.st_size & 0xFFFFFFFF).to_bytes(4, "little")
            ):
                return False
        elif flags not in (1, 3) or data[8:16] != importlib.util.source_hash(text):
            return False
        return marshal.loads(data[16:]) == compile(text, source, "exec", dont_inherit=True, optimize=optimize)
    except (OSError, ValueError, EOFError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


class EnvironmentWatch:
    """The import roots' listing, taken once, then compared after every run."""

    def __init__(self, whole: list[Path] | None = None, top: list[Path] | None = None) -> None:
        found = import_roots() if whole is None else (whole, top or [])
        self.whole, self.top = found
        self.roots = [*self.whole, *self.top]
        self._listing = _list(self.whole, self.top)

    def after_run(self) -> dict:
        """What the run changed in the environment; files it added are removed again.

        ``{"roots": [...], "added": [...], "changed": [...], "deleted": [...], "removed": [...],
        "caches_removed": [...]}``, paths relative to their root's parent so they read like
        ``site-packages/x.pth``; ``caches_removed``: bytecode caches the run wrote that look
        like their source's (not a change, removed all the same).
        """
        now = _list(self.whole, self.top)
        before = self._listing
        new = now.keys() - before.keys()
        moved = {p for p in now.keys() & before.keys() if now[p] != before[p]}
        # Every bytecode cache a run added or changed is removed (Python writes it again from
        # the source at the next import): no cache a run wrote reaches a later run, however it
        # was forged. One that is not even its source's code is also reported as a change.
        caches = sorted(p for p in new | moved if _bytecode_cache(p))
        forged = {p for p in caches if not _honest_bytecode(p)}
        added = sorted(p for p in new if not _bytecode_cache(p) or p in forged)
        changed = sorted(p for p in moved if not _bytecode_cache(p) or p in forged)
        deleted = sorted(before.keys() - now.keys())
        removed, caches_removed = [], []
        # What the run added goes, and every cache it wrote. Other changes can't be undone
        # and are only reported.
        for path in list(dict.fromkeys(added + caches)):
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
                (removed if path in added or path in forged else caches_removed).append(path)
                del now[path]
            except OSError:
                continue
        # A removal changes its folder's times: listed folders start the next run as they are now.
        for path in removed + caches_removed:
            folder = os.path.dirname(path)
            if folder in now:
                st = os.lstat(folder)
                now[folder] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        self._listing = now
        return {
            "roots": [str(r) for r in self.roots],
            "added": [self._short(p) for p in added],
            "changed": [self._short(p) for p in changed],
            "deleted": [self._short(p) for p in deleted],
            "removed": [self._short(p) for p in removed],
            "caches_removed": [self._short(p) for p in caches_removed],
        }

    def _short(self, path: str) -> str:
        for root in self.roots:
            if path.startswith(str(root) + os.sep):
                return os.path.relpath(path, root.parent)
        return path


if __name__ == "__main__":  # pragma: no cover - a quick look at what is watched
    watch = EnvironmentWatch()
    print(sys.executable, [str(r) for r in watch.roots], len(watch._listing), "files")
