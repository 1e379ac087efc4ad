"""scope.*: a patch stays inside the files the contract lets it edit."""

from __future__ import annotations

from infrarsi._patch import parse_patch
from infrarsi.contract import matches_any
from infrarsi.errors import PatchParseError

from ._result import CheckResult

__all__ = ["check_scope"]


def _bad_path(path: str) -> bool:
    return path.startswith("/") or ".." in path.split("/") or "\\" in path


def check_scope(patches: dict[str, str], editable: list[str], protected: list[str]) -> list[CheckResult]:
    """scope.parse, scope.binary, scope.editable, scope.created, scope.protected over all ``patches`` (name -> text)."""
    results: dict[str, list[str]] = {
        "scope.parse": [],
        "scope.binary": [],
        "scope.editable": [],
        "scope.created": [],
        "scope.protected": [],
    }
    for name, text in patches.items():
        try:
            changes = parse_patch(text)
        except PatchParseError as exc:
            results["scope.parse"].append(f"{name}: {exc}")
            continue
        for change in changes:
            if change.binary:
                results["scope.binary"].append(f"{name}: {'/'.join(change.paths)} is a binary change")
            for path in change.paths:
                if _bad_path(path):
                    results["scope.editable"].append(f"{name}: {path} leaves the workspace")
                elif matches_any(path, protected):
                    what = (
                        "deletes"
                        if change.deleted
                        else "renames"
                        if change.rename
                        else "creates"
                        if change.created
                        else "changes"
                    )
                    results["scope.protected"].append(f"{name}: {what} protected {path}")
                elif not matches_any(path, editable):
                    key = "scope.created" if change.created else "scope.editable"
                    verb = "creates" if change.created else "touches"
                    results[key].append(f"{name}: {verb} {path}, outside editable ({', '.join(editable)})")
            if change.mode_change:
                results["scope.editable"].append(f"{name}: changes the mode of {'/'.join(change.paths)}")
    what = {
        "scope.parse": "every patch is a readable unified diff",
        "scope.binary": "no binary changes",
        "scope.editable": "touches only editable files",
        "scope.created": "creates no file outside editable",
        "scope.protected": "leaves protected files alone",
    }
    out = []
    for check, problems in results.items():
        if problems:
            out.append(CheckResult(check, "fail", "; ".join(problems[:5]) + (" ..." if len(problems) > 5 else "")))
        else:
            out.append(CheckResult(check, "pass", what[check] if patches else "no patches"))
    return out
