"""`infrarsi gate`: pass a pull request's speed claim only with a full receipt.

The change is the diff from ``--base`` to ``--head`` inside the workspace (the contract's
folder), receipt bundles (``infrarsi-receipts/*.json``, as `infrarsi apply` commits them)
left out. Two ways to pass, and no other:

1. **The change carries a receipt.** A bundle in the head whose receipt is signed by a
   key the *base* trusts (``infrarsi-trusted-keys`` in the workspace at the base, or
   ``--trusted-keys``), measured under the base's contract on the base's code (its
   signed source and protected-file hashes match the base), and whose patch texts
   (checked by their signed hashes), applied to the base, give exactly the head. No
   rerun.
2. **Else the gate measures it here.** In a temporary work tree at the base: `init`,
   `baseline`, and `verify` of the diff (A/B on this machine). Its receipt is copied to
   ``--out``.

Exit 0 only with a full receipt, 1 otherwise, 2 for bad input. Changes outside the
workspace are covered by no receipt, so they fail the gate (run it on speed changes).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from infrarsi._gate._carried import TRUSTED_KEYS_FILE, carried, carried_knobs, gives_head, trusted_keys_at
from infrarsi._gate._change import DIFF, Change, changes, commit, patched_commit, repo_path, show
from infrarsi._git import git, toplevel, worktree
from infrarsi._hashing import LAUNCH_FILE, RECEIPTS_DIR
from infrarsi.errors import UsageError

__all__ = ["gate", "GateOutcome", "TRUSTED_KEYS_FILE"]


def _md(text: object) -> str:
    """Text safe inside Markdown inline code or a table cell: one line, no backticks or pipes."""
    return " ".join(str(text).split()).replace("`", "'").replace("|", "/")


@dataclass
class GateOutcome:
    passed: bool
    mode: str  # "receipt" (carried, no rerun), "rerun" (measured here), "none"
    base: str
    head: str
    changed: list[str]
    receipt: str | None = None
    receipt_path: str | None = None
    speedup: dict | None = None
    knobs: dict = field(default_factory=dict)
    launch: dict = field(default_factory=dict)  # the knobs that differ from the contract's baseline
    checks: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # why each carried receipt was or was not enough

    def to_json(self) -> dict:
        return {
            "passed": self.passed,
            "mode": self.mode,
            "base": self.base,
            "head": self.head,
            "changed": self.changed,
            "receipt": self.receipt,
            "receipt_path": self.receipt_path,
            "speedup": self.speedup,
            "knobs": self.knobs,
            "launch": self.launch,
            "checks": self.checks,
            "notes": self.notes,
            "summary_markdown": self.markdown(),
        }

    def markdown(self) -> str:
        verdict = "PASSED" if self.passed else "FAILED"
        how = {
            "receipt": "a carried receipt verified: no rerun needed",
            "rerun": "measured on this CI machine (A/B against the base)",
            "none": "nothing could be verified",
        }[self.mode]
        lines = [f"## InfraRSI gate: {verdict}", "", f"`{self.base[:12]}` → `{self.head[:12]}`: {how}.", ""]
        if self.speedup:
            sp = self.speedup
            lines.append(
                f"**Speedup {sp['median']:.3f}x** (95% CI {sp['ci_low']:.3f} to {sp['ci_high']:.3f})"
                + (f", receipt `{_md(self.receipt)}`" if self.receipt else "")
                + "."
            )
            lines.append("")
        if self.launch:
            lines += [
                "**The speedup needs these launch settings** (they are not in the code; launch the job "
                "with them): " + ", ".join(f"`{_md(k)}={_md(v)}`" for k, v in sorted(self.launch.items())),
                "",
            ]
        if self.changed:
            lines += [
                "Changed files: "
                + ", ".join(f"`{_md(c)}`" for c in self.changed[:20])
                + (" ..." if len(self.changed) > 20 else ""),
                "",
            ]
        if self.checks:
            lines += ["| check | status | detail |", "|---|---|---|"]
            lines += [f"| {_md(c['id'])} | {_md(c['status'])} | {_md(c.get('detail', ''))} |" for c in self.checks]
            lines.append("")
        lines += [f"- {_md(n)}" for n in self.notes]
        if not self.passed:
            lines += [
                "",
                "A speed change merges only with a full receipt: every required check passed, "
                "measured back to back against the base.",
            ]
        return "\n".join(lines).rstrip() + "\n"


def gate(
    contract_path: str | Path = "infrarsi.toml",
    base: str | None = None,
    head: str | None = None,
    patch: str | Path | None = None,
    trusted_keys: str | Path | None = None,
    rerun: bool = False,
    runs: int = 3,
    pairs: int | None = None,
    sets: dict[str, str] | None = None,
    out: str | Path | None = None,
    progress=None,
) -> GateOutcome:
    """Judge the change ``base..head`` (or ``patch`` on top of ``base``, default HEAD)."""
    contract_file = Path(contract_path).resolve()
    if not contract_file.is_file():
        raise UsageError(f"{contract_path}: no contract here (expected the workspace's infrarsi.toml; --contract)")
    if patch is not None and head is not None:
        raise UsageError("--patch and --head: give one of them (a patch is judged on top of --base)")
    if patch is None and (base is None or head is None):
        raise UsageError("expected --base REF and --head REF, or --patch FILE")
    from infrarsi.contract import load_contract

    contract = load_contract(contract_file)  # bad contract: exit 2, as everywhere
    ws = contract_file.parent
    top = toplevel(ws)
    if top is None:
        raise UsageError(f"{ws}: not in a git repository (the gate compares two commits)")
    rel = ws.relative_to(top).as_posix()
    base_sha = commit(top, base or "HEAD")
    with tempfile.TemporaryDirectory(prefix="infrarsi-gate-") as tmp:
        tmp = Path(tmp)
        head_sha = commit(top, head) if patch is None else patched_commit(top, base_sha, rel, Path(patch), tmp)
        change = changes(top, rel, base_sha, head_sha)
        outcome = GateOutcome(False, "none", base_sha, head_sha, change.inside)
        refusal = _out_of_bounds(change, contract_file.name)
        if refusal:
            outcome.notes.append(refusal)
            return outcome
        keys = trusted_keys_at(top, rel, base_sha, trusted_keys)
        bundles = [
            (repo_path(rel, b), data)
            for b in change.bundles
            if b != LAUNCH_FILE and (data := show(top, head_sha, repo_path(rel, b))) is not None
        ]
        if not rerun:
            for path, raw in bundles:
                problem = carried(top, rel, contract_file.name, base_sha, head_sha, raw, keys, change, tmp)
                if problem is None and not _launch_vouched(top, rel, head_sha, change, contract, raw_knobs(raw)):
                    problem = f"{LAUNCH_FILE} is not this receipt's launch line"
                    _launch_is_code(change, outcome)
                if problem is None:
                    body = json.loads(raw)
                    outcome.passed, outcome.mode = True, "receipt"
                    outcome.receipt, outcome.receipt_path = body["id"], path
                    outcome.speedup, outcome.knobs = body["receipt"]["speedup"], body["receipt"].get("knobs") or {}
                    outcome.checks = [
                        {k: c.get(k) for k in ("id", "status", "detail")} for c in body["receipt"].get("checks") or []
                    ]
                    outcome.launch = _launch(contract, outcome.knobs)
                    outcome.notes.append(
                        f"{path}: verified (trusted key, same contract and code, patch matches the diff)"
                    )
                    return outcome
                outcome.notes.append(f"{path}: not enough on its own: {problem}")
            if not bundles:
                outcome.notes.append(f"the change carries no receipt ({RECEIPTS_DIR}/<id>.json)")
        if not change.inside and not sets and not bundles:
            outcome.notes.append("no change inside the workspace: nothing to verify")
            return outcome
        knobs = dict(sets or {}) or carried_knobs(bundles, contract, outcome.notes)
        if not _launch_vouched(top, rel, head_sha, change, contract, {**contract.baseline_knobs(), **knobs}):
            _launch_is_code(change, outcome)
        return _rerun(outcome, top, rel, contract, base_sha, head_sha, knobs, change, runs, pairs, out, tmp, progress)


def raw_knobs(raw: bytes) -> dict:
    return dict(json.loads(raw)["receipt"].get("knobs") or {})


def _launch_vouched(top: Path, rel: str, head: str, change: Change, contract, knobs: dict) -> bool:
    """Whether the launch file the change carries (if any) is exactly the line the base's contract
    gives ``knobs``, the settings this gate vouches for. Never a receipt's own ``launch`` text: a
    receipt signed by any key could carry any shell line."""
    from infrarsi.contract import launch_command

    if LAUNCH_FILE not in change.bundles:
        return True
    data = show(top, head, repo_path(rel, LAUNCH_FILE))
    if data is None:
        return True  # deleted: nothing will be launched from it
    lines = data.decode("utf-8", "replace").split("\n")
    try:
        expected = launch_command(contract, knobs)["shell"]
    except (KeyError, TypeError, ValueError):
        return False
    return len(lines) == 3 and lines[0].startswith("# infrarsi receipt ") and lines[1] == expected and lines[2] == ""


def _launch_is_code(change: Change, outcome: GateOutcome) -> None:
    change.bundles.remove(LAUNCH_FILE)
    change.inside.append(LAUNCH_FILE)
    change.inside.sort()
    outcome.notes.append(f"{LAUNCH_FILE}: not the launch line of the settings measured; it is a change to measure")


def _out_of_bounds(change: Change, contract_name: str) -> str | None:
    """Why no receipt can cover this change at all, or None."""
    if change.outside:
        return "changes outside the workspace are covered by no receipt: " + ", ".join(change.outside[:10])
    if change.special:
        return "symbolic links and submodules are covered by no receipt (the sandbox copies files): " + ", ".join(
            change.special[:10]
        )
    judged_by = [p for p in change.inside if p in (contract_name, TRUSTED_KEYS_FILE)]
    if judged_by:
        return (
            f"the change edits {', '.join(judged_by)}: the gate judges a change by the base's contract and "
            "trusted keys, so change those in a pull request of their own"
        )
    return None


def _launch(contract, knobs: dict[str, str]) -> dict[str, str]:
    base = contract.baseline_knobs()
    return {k: v for k, v in sorted(knobs.items()) if base.get(k) != v}


def _rerun(
    outcome: GateOutcome,
    top: Path,
    rel: str,
    contract,
    base: str,
    head: str,
    knobs: dict[str, str],
    change: Change,
    runs: int,
    pairs: int | None,
    out: str | Path | None,
    tmp: Path,
    progress,
) -> GateOutcome:
    """`init`, `baseline` and `verify` of the diff in a work tree at the base, on this machine."""
    from infrarsi._baseline import baseline
    from infrarsi._init import init
    from infrarsi._verify import verify
    from infrarsi.errors import BaselineFailed

    outcome.mode = "rerun"
    scope = ["--", rel] + [f":(exclude){repo_path(rel, b)}" for b in change.bundles]
    relative = [f"--relative={rel}"] if rel != "." else []
    diff = git([*DIFF, "--binary", *relative, base, head, *scope], cwd=top).stdout
    patch_file = tmp / "change.diff"
    patch_file.write_bytes(diff)
    with worktree(top, base, tmp / "replay") as tree:  # the diff must give the head, nothing more or less
        problem = gives_head(
            tree, rel, head, [diff] if diff.strip() else [], change, "the diff does not reproduce the head"
        )
    if problem:
        outcome.notes.append(problem)
        return outcome
    with worktree(top, base, tmp / "base") as tree:
        workspace = tree / rel if rel != "." else tree
        init(workspace / contract.path.name, force=True)  # a throwaway key and ledger, for this check only
        try:
            baseline(workspace / contract.path.name, runs=runs, progress=progress)
        except BaselineFailed as exc:
            outcome.notes.append(f"the base itself does not run here: {str(exc).splitlines()[0]}")
            return outcome
        result = verify(
            workspace / contract.path.name,
            sets=knobs,
            patches=[str(patch_file)] if diff.strip() else [],
            pairs=pairs,
            progress=progress,
        )
        outcome.passed, outcome.speedup, outcome.knobs = result.accepted, result.speedup, dict(knobs)
        outcome.launch = _launch(contract, knobs)
        outcome.checks = [c.to_json() for c in result.checks]
        if result.receipt:
            folder = Path(out) if out is not None else Path.cwd() / "infrarsi-gate"
            folder.mkdir(parents=True, exist_ok=True)
            kept = folder / result.receipt.name
            shutil.copyfile(result.receipt, kept)
            outcome.receipt, outcome.receipt_path = result.receipt.stem, str(kept)
            outcome.notes.append(f"receipt {kept} (signed by this CI run's own key)")
        failed = [c.id for c in result.checks if c.status != "pass" and c.status != "skipped"]
        if failed:
            outcome.notes.append("not accepted: " + ", ".join(failed))
    return outcome
