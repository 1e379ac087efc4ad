"""Sandbox copies of the workspace, and patches applied to them with ``git apply``."""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from infrarsi.errors import PatchRejected

__all__ = ["Sandbox", "make_sandbox", "origin_listing"]

_SKIPPED = (".infrarsi", ".git", "__pycache__", "*.pyc")
_LEAVE_OUT = shutil.ignore_patterns(*_SKIPPED)


def origin_listing(workspace: Path) -> dict[str, tuple]:
    """{relative path: what it is} for everything the sandbox copies from ``workspace``: a
    file's (size, mtime_ns, ctime_ns), a link's target and times, a folder's presence.

    Listed before and after every run: a job can find the folder it was copied from (the
    driver holds the ledger open there) and edit a file every later run copies, the A/B's
    baseline arm included; or add a link or a folder there that a later run imports (a
    package folder beats a module of the same name). The inode change time catches an edit
    whose modification time was set back. What is behind a link that was there before (a
    data folder linked in) is shared by every run and not listed: see docs/runner.md."""
    out: dict[str, tuple] = {}
    for folder, dirs, names in os.walk(workspace, followlinks=False):
        dirs[:] = [d for d in dirs if not any(fnmatch.fnmatch(d, pattern) for pattern in _SKIPPED)]
        for name in [*dirs, *names]:
            if any(fnmatch.fnmatch(name, pattern) for pattern in _SKIPPED):
                continue
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
                if os.path.islink(path):
                    entry: tuple = ("link", os.readlink(path), st.st_mtime_ns, st.st_ctime_ns)
                elif name in dirs:
                    entry = ("folder",)
                else:
                    entry = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            except OSError:
                continue
            out[os.path.relpath(path, workspace)] = entry
    return out


@dataclass
class Sandbox:
    """A run folder outside the workspace: ``ws/`` (the copy), ``home/``, the receipts FIFO."""

    root: Path

    @property
    def workspace(self) -> Path:
        return self.root / "ws"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def receipts(self) -> Path:
        return self.root / "receipts.fifo"

    @property
    def receipts_socket(self) -> Path:
        """A job of several ranks: the socket every rank's receipts arrive on."""
        return self.root / "receipts.sock"

    def apply(self, name: str, text: str, include: str | None = None) -> None:
        """Apply one unified diff to the copy; raises PatchRejected with git's message.

        ``include`` (a git path pattern) applies only the files that match it.
        """
        env = {
            "PATH": os.environ.get("PATH", os.defpath),
            "HOME": str(self.home),
            # Never let git find a repository above the sandbox.
            "GIT_CEILING_DIRECTORIES": str(self.root),
            "GIT_CONFIG_NOSYSTEM": "1",
        }
        try:
            only = [f"--include={include}"] if include else []
            proc = subprocess.run(
                ["git", "apply", "--whitespace=nowarn", *only, "-"],
                input=text.encode(),
                cwd=self.workspace,
                env=env,
                capture_output=True,
                timeout=60,
            )
        except FileNotFoundError:
            raise PatchRejected(name, "git is not installed (needed for `git apply`)") from None
        if proc.returncode != 0:
            message = proc.stderr.decode("utf-8", "replace").strip() or f"git apply exit {proc.returncode}"
            raise PatchRejected(name, message)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def make_sandbox(workspace: Path) -> Sandbox:
    """Copy ``workspace`` (without .infrarsi/, .git/, caches) into a fresh folder outside it."""
    root = Path(tempfile.mkdtemp(prefix="infrarsi-run-"))
    box = Sandbox(root)
    shutil.copytree(workspace, box.workspace, ignore=_LEAVE_OUT, symlinks=True)
    box.home.mkdir()
    return box
