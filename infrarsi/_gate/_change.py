"""What a pull request changes, read from git: the commits, the diff sorted into the workspace's
code, its receipt bundles and the rest, and a `--patch` turned into a commit on the base."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from infrarsi._git import git, worktree
from infrarsi._hashing import BUNDLE_PATH, LAUNCH_FILE
from infrarsi.errors import GitError, UsageError

__all__ = ["Change", "DIFF", "commit", "patched_commit", "changes", "show", "repo_path"]

# Patch text exactly as git makes it, whatever the user's diff settings (external diff
# drivers, textconv filters and prefixes would give a patch `git apply` reads otherwise).
DIFF = ["diff", "--no-ext-diff", "--no-textconv", "--src-prefix=a/", "--dst-prefix=b/", "--no-renames"]
_SPECIAL_MODES = {"120000": "a symbolic link", "160000": "a submodule"}


@dataclass
class Change:
    inside: list[str]  # workspace-relative paths the change touches, receipt bundles left out
    bundles: list[str]  # workspace-relative receipt bundles it adds, changes or deletes
    outside: list[str]  # repository paths outside the workspace
    special: list[str]  # symbolic links and submodules (no receipt covers them)


def commit(top: Path, ref: str) -> str:
    done = git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=top, check=False)
    if done.returncode != 0:
        raise UsageError(f"{ref!r}: not a commit in {top} (expected a branch, tag or commit id)")
    return done.stdout.decode().strip()


def patched_commit(top: Path, base: str, rel: str, patch: Path, tmp: Path) -> str:
    """A commit (on no branch) of ``patch`` applied to the base: the head of a `--patch` gate."""
    try:
        text = patch.read_bytes()
    except OSError as exc:
        raise UsageError(f"--patch {patch}: cannot read it: {exc.strerror or exc}") from None
    with worktree(top, base, tmp / "patched") as tree:
        prefix = [f"--directory={rel}"] if rel != "." else []
        try:
            git(["apply", "--whitespace=nowarn", *prefix, "-"], cwd=tree, input=text)
        except GitError as exc:
            raise UsageError(f"--patch {patch}: does not apply to {base[:12]}: {exc}") from None
        git(["add", "-A"], cwd=tree)
        git(
            [
                "-c",
                "user.name=InfraRSI gate",
                "-c",
                "user.email=infrarsi@localhost",
                "commit",
                "--quiet",
                "--no-verify",
                "--allow-empty",
                "-m",
                f"infrarsi gate: {patch.name}",
            ],
            cwd=tree,
        )
        return git(["rev-parse", "HEAD"], cwd=tree).stdout.decode().strip()


def changes(top: Path, rel: str, base: str, head: str) -> Change:
    """What ``base..head`` touches, sorted into the workspace's code, its receipt bundles and the rest.

    The launch file `apply` writes goes with the bundles here; the gate keeps it aside only
    where it is the line of the knobs it vouches for (`_gate._launch_vouched`), else it is code."""
    raw = git(["diff", "--raw", "-z", "--no-renames", "--no-ext-diff", base, head], cwd=top).stdout
    fields = raw.split(b"\0")
    change = Change([], [], [], [])
    prefix = "" if rel == "." else rel + "/"
    for meta, name in zip(fields[0::2], fields[1::2]):  # ":old new sha sha X" then the path
        modes = meta.decode().lstrip(":").split()[:2]
        name = name.decode("utf-8", "surrogateescape")
        if not name.startswith(prefix):
            change.outside.append(name)
            continue
        local = name[len(prefix) :]
        kinds = [_SPECIAL_MODES[m] for m in modes if m in _SPECIAL_MODES]
        if kinds:
            change.special.append(f"{local} ({kinds[0]})")
        elif is_bundle(top, head, name, local) or local == LAUNCH_FILE:
            change.bundles.append(local)
        else:
            change.inside.append(local)
    for part in (change.inside, change.bundles, change.outside, change.special):
        part.sort()
    return change


def is_bundle(top: Path, head: str, name: str, local: str) -> bool:
    """``infrarsi-receipts/<id>.json`` holding receipt ``<id>`` at the head (or deleted there): not code."""
    if not BUNDLE_PATH.match(local):
        return False
    data = show(top, head, name)
    if data is None:
        return True
    try:
        return json.loads(data).get("id") == Path(local).stem
    except (ValueError, AttributeError, UnicodeDecodeError):
        return False


def show(top: Path, commit: str, path: str) -> bytes | None:
    done = git(["show", f"{commit}:{path}"], cwd=top, check=False)
    return done.stdout if done.returncode == 0 else None


def repo_path(rel: str, local: str) -> str:
    return local if rel == "." else f"{rel}/{local}"
