"""The little of git that `apply` and `gate` need, run as the real `git` binary."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from infrarsi.errors import GitError

__all__ = ["git", "toplevel", "worktree"]


def git(args: list[str], cwd: Path, input: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """``git ARGS`` in ``cwd``, bytes out; raises GitError (with git's stderr) when ``check`` and it fails."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}  # no caller's index or dir
    env.update({"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"})
    try:
        done = subprocess.run(["git", *args], cwd=cwd, input=input, capture_output=True, env=env, timeout=120)
    except FileNotFoundError:
        raise GitError("git is not installed") from None
    except subprocess.TimeoutExpired:
        raise GitError(f"git {' '.join(args[:2])}: no answer in 120 s (a lock held, or a hook waiting?)") from None
    if check and done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip() or f"exit {done.returncode}"
        raise GitError(f"git {' '.join(args[:2])}: {message}")
    return done


def toplevel(path: Path) -> Path | None:
    """The work tree ``path`` is in, or None outside any git repository."""
    done = git(["rev-parse", "--show-toplevel"], cwd=path, check=False)
    return Path(done.stdout.decode("utf-8", "surrogateescape").strip()).resolve() if done.returncode == 0 else None


class worktree:
    """A temporary extra work tree of ``repo`` at ``ref`` (optionally on a new branch), removed on exit."""

    def __init__(self, repo: Path, ref: str, where: Path, branch: str | None = None) -> None:
        self.repo, self.ref, self.path, self.branch = repo, ref, where, branch

    def __enter__(self) -> Path:
        args = ["worktree", "add", "--quiet"] + (["-b", self.branch] if self.branch else ["--detach"])
        git(args + [str(self.path), self.ref], cwd=self.repo)
        return self.path

    def __exit__(self, *exc) -> None:
        git(["worktree", "remove", "--force", str(self.path)], cwd=self.repo, check=False)
        git(["worktree", "prune"], cwd=self.repo, check=False)
