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
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from infrarsi._candidate import UsageError
from infrarsi._git import GitError, git, toplevel, worktree
from infrarsi._hashing import BUNDLE_PATH, RECEIPTS_DIR, hash_protected, hash_workspace
from infrarsi.ledger import sha256_hex

__all__ = ["gate", "GateOutcome", "TRUSTED_KEYS_FILE"]

TRUSTED_KEYS_FILE = "infrarsi-trusted-keys"   # in the workspace, read at the base ref
_HEX_KEY = re.compile(r"^[0-9a-f]{64}$")
# Patch text exactly as git makes it, whatever the user's diff settings (external diff
# drivers, textconv filters and prefixes would give a patch `git apply` reads otherwise).
_DIFF = ["diff", "--no-ext-diff", "--no-textconv", "--src-prefix=a/", "--dst-prefix=b/", "--no-renames"]
_SPECIAL_MODES = {"120000": "a symbolic link", "160000": "a submodule"}


def _md(text: object) -> str:
    """Text safe inside Markdown inline code or a table cell: one line, no backticks or pipes."""
    return " ".join(str(text).split()).replace("`", "'").replace("|", "/")


@dataclass
class _Change:
    inside: list[str]     # workspace-relative paths the change touches, receipt bundles left out
    bundles: list[str]    # workspace-relative receipt bundles it adds, changes or deletes
    outside: list[str]    # repository paths outside the workspace
    special: list[str]    # symbolic links and submodules (no receipt covers them)


@dataclass
class GateOutcome:
    passed: bool
    mode: str                         # "receipt" (carried, no rerun), "rerun" (measured here), "none"
    base: str
    head: str
    changed: list[str]
    receipt: str | None = None
    receipt_path: str | None = None
    speedup: dict | None = None
    knobs: dict = field(default_factory=dict)
    launch: dict = field(default_factory=dict)       # the knobs that differ from the contract's baseline
    checks: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # why each carried receipt was or was not enough

    def to_json(self) -> dict:
        return {"passed": self.passed, "mode": self.mode, "base": self.base, "head": self.head,
                "changed": self.changed, "receipt": self.receipt, "receipt_path": self.receipt_path,
                "speedup": self.speedup, "knobs": self.knobs, "launch": self.launch, "checks": self.checks,
                "notes": self.notes,
                "summary_markdown": self.markdown()}

    def markdown(self) -> str:
        verdict = "PASSED" if self.passed else "FAILED"
        how = {"receipt": "a carried receipt verified: no rerun needed",
               "rerun": "measured on this CI machine (A/B against the base)",
               "none": "nothing could be verified"}[self.mode]
        lines = [f"## InfraRSI gate: {verdict}", "",
                 f"`{self.base[:12]}` → `{self.head[:12]}`: {how}.", ""]
        if self.speedup:
            sp = self.speedup
            lines.append(f"**Speedup {sp['median']:.3f}x** (95% CI {sp['ci_low']:.3f} to {sp['ci_high']:.3f})"
                         + (f", receipt `{_md(self.receipt)}`" if self.receipt else "") + ".")
            lines.append("")
        if self.launch:
            lines += ["**The speedup needs these launch settings** (they are not in the code; launch the job "
                      "with them): " + ", ".join(f"`{_md(k)}={_md(v)}`" for k, v in sorted(self.launch.items())),
                      ""]
        if self.changed:
            lines += ["Changed files: " + ", ".join(f"`{_md(c)}`" for c in self.changed[:20])
                      + (" ..." if len(self.changed) > 20 else ""), ""]
        if self.checks:
            lines += ["| check | status | detail |", "|---|---|---|"]
            lines += [f"| {_md(c['id'])} | {_md(c['status'])} | {_md(c.get('detail', ''))} |" for c in self.checks]
            lines.append("")
        lines += [f"- {_md(n)}" for n in self.notes]
        if not self.passed:
            lines += ["", "A speed change merges only with a full receipt: every required check passed, "
                      "measured back to back against the base."]
        return "\n".join(lines).rstrip() + "\n"


def gate(contract_path: str | Path = "infrarsi.toml", base: str | None = None, head: str | None = None,
         patch: str | Path | None = None, trusted_keys: str | Path | None = None, rerun: bool = False,
         runs: int = 3, pairs: int | None = None, sets: dict[str, str] | None = None,
         out: str | Path | None = None, progress=None) -> GateOutcome:
    """Judge the change ``base..head`` (or ``patch`` on top of ``base``, default HEAD)."""
    contract_file = Path(contract_path).resolve()
    if not contract_file.is_file():
        raise UsageError(f"{contract_path}: no contract here (expected the workspace's infrarsi.toml; --contract)")
    if patch is not None and head is not None:
        raise UsageError("--patch and --head: give one of them (a patch is judged on top of --base)")
    if patch is None and (base is None or head is None):
        raise UsageError("expected --base REF and --head REF, or --patch FILE")
    from infrarsi._contract import load_contract

    contract = load_contract(contract_file)   # bad contract: exit 2, as everywhere
    ws = contract_file.parent
    top = toplevel(ws)
    if top is None:
        raise UsageError(f"{ws}: not in a git repository (the gate compares two commits)")
    rel = ws.relative_to(top).as_posix()
    base_sha = _commit(top, base or "HEAD")
    with tempfile.TemporaryDirectory(prefix="infrarsi-gate-") as tmp:
        tmp = Path(tmp)
        head_sha = _commit(top, head) if patch is None else _patched_commit(top, base_sha, rel, Path(patch), tmp)
        change = _changes(top, rel, base_sha, head_sha)
        outcome = GateOutcome(False, "none", base_sha, head_sha, change.inside)
        refusal = _out_of_bounds(change, contract_file.name)
        if refusal:
            outcome.notes.append(refusal)
            return outcome
        keys = _trusted_keys(top, rel, base_sha, trusted_keys)
        bundles = [(_repo_path(rel, b), data) for b in change.bundles
                   if (data := _show(top, head_sha, _repo_path(rel, b))) is not None]
        if not rerun:
            for path, raw in bundles:
                problem = _carried(top, rel, contract_file.name, base_sha, head_sha, raw, keys, change, tmp)
                if problem is None:
                    body = json.loads(raw)
                    outcome.passed, outcome.mode = True, "receipt"
                    outcome.receipt, outcome.receipt_path = body["id"], path
                    outcome.speedup, outcome.knobs = body["receipt"]["speedup"], body["receipt"].get("knobs") or {}
                    outcome.checks = [{k: c.get(k) for k in ("id", "status", "detail")}
                                      for c in body["receipt"].get("checks") or []]
                    outcome.launch = _launch(contract, outcome.knobs)
                    outcome.notes.append(f"{path}: verified (trusted key, same contract and code, "
                                         "patch matches the diff)")
                    return outcome
                outcome.notes.append(f"{path}: not enough on its own: {problem}")
            if not bundles:
                outcome.notes.append(f"the change carries no receipt ({RECEIPTS_DIR}/<id>.json)")
        if not change.inside and not sets and not bundles:
            outcome.notes.append("no change inside the workspace: nothing to verify")
            return outcome
        knobs = dict(sets or {}) or _carried_knobs(bundles, contract, outcome.notes)
        return _rerun(outcome, top, rel, contract, base_sha, head_sha, knobs, change, runs, pairs, out, tmp,
                      progress)


def _out_of_bounds(change: _Change, contract_name: str) -> str | None:
    """Why no receipt can cover this change at all, or None."""
    if change.outside:
        return "changes outside the workspace are covered by no receipt: " + ", ".join(change.outside[:10])
    if change.special:
        return ("symbolic links and submodules are covered by no receipt (the sandbox copies files): "
                + ", ".join(change.special[:10]))
    judged_by = [p for p in change.inside if p in (contract_name, TRUSTED_KEYS_FILE)]
    if judged_by:
        return (f"the change edits {', '.join(judged_by)}: the gate judges a change by the base's contract and "
                "trusted keys, so change those in a pull request of their own")
    return None


def _launch(contract, knobs: dict[str, str]) -> dict[str, str]:
    base = contract.baseline_knobs()
    return {k: v for k, v in sorted(knobs.items()) if base.get(k) != v}


def _commit(top: Path, ref: str) -> str:
    done = git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=top, check=False)
    if done.returncode != 0:
        raise UsageError(f"{ref!r}: not a commit in {top} (expected a branch, tag or commit id)")
    return done.stdout.decode().strip()


def _patched_commit(top: Path, base: str, rel: str, patch: Path, tmp: Path) -> str:
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
        git(["-c", "user.name=InfraRSI gate", "-c", "user.email=infrarsi@localhost", "commit", "--quiet",
             "--no-verify", "--allow-empty", "-m", f"infrarsi gate: {patch.name}"], cwd=tree)
        return git(["rev-parse", "HEAD"], cwd=tree).stdout.decode().strip()


def _changes(top: Path, rel: str, base: str, head: str) -> _Change:
    """What ``base..head`` touches, sorted into the workspace's code, its receipt bundles and the rest."""
    raw = git(["diff", "--raw", "-z", "--no-renames", "--no-ext-diff", base, head], cwd=top).stdout
    fields = raw.split(b"\0")
    change = _Change([], [], [], [])
    prefix = "" if rel == "." else rel + "/"
    for meta, name in zip(fields[0::2], fields[1::2]):   # ":old new sha sha X" then the path
        modes = meta.decode().lstrip(":").split()[:2]
        name = name.decode("utf-8", "surrogateescape")
        if not name.startswith(prefix):
            change.outside.append(name)
            continue
        local = name[len(prefix):]
        kinds = [_SPECIAL_MODES[m] for m in modes if m in _SPECIAL_MODES]
        if kinds:
            change.special.append(f"{local} ({kinds[0]})")
        elif _is_bundle(top, head, name, local):
            change.bundles.append(local)
        else:
            change.inside.append(local)
    for part in (change.inside, change.bundles, change.outside, change.special):
        part.sort()
    return change


def _is_bundle(top: Path, head: str, name: str, local: str) -> bool:
    """``infrarsi-receipts/<id>.json`` holding receipt ``<id>`` at the head (or deleted there): not code."""
    if not BUNDLE_PATH.match(local):
        return False
    data = _show(top, head, name)
    if data is None:
        return True
    try:
        return json.loads(data).get("id") == Path(local).stem
    except (ValueError, AttributeError, UnicodeDecodeError):
        return False


def _show(top: Path, commit: str, path: str) -> bytes | None:
    done = git(["show", f"{commit}:{path}"], cwd=top, check=False)
    return done.stdout if done.returncode == 0 else None


def _repo_path(rel: str, local: str) -> str:
    return local if rel == "." else f"{rel}/{local}"


def _trusted_keys(top: Path, rel: str, base: str, given: str | Path | None) -> set[str]:
    if given is not None:
        try:
            text, where = Path(given).read_text(), str(given)
        except OSError as exc:
            raise UsageError(f"--trusted-keys {given}: cannot read it: {exc.strerror or exc}") from None
    else:
        data = _show(top, base, _repo_path(rel, TRUSTED_KEYS_FILE))
        if data is None:
            return set()
        text, where = data.decode("utf-8", "replace"), f"{_repo_path(rel, TRUSTED_KEYS_FILE)} at {base[:12]}"
    keys = set()
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if not _HEX_KEY.match(line):
            raise UsageError(f"{where}, line {number}: expected an Ed25519 public key as 64 lowercase hex digits "
                             f"(the public_key of .infrarsi/manifest.json), got {line[:20]!r}")
        keys.add(line)
    return keys


def _carried_knobs(bundles: list[tuple[str, bytes]], contract, notes: list[str]) -> dict[str, str]:
    """Launch settings for the rerun from a carried receipt that verifies and names only the contract's choices.

    Its key need not be trusted: the rerun measures everything again, on this machine.
    """
    from infrarsi._receipt import check_receipt

    for path, raw in bundles:
        if not check_receipt(raw).ok:
            continue
        knobs = json.loads(raw)["receipt"].get("knobs")
        valid = isinstance(knobs, dict) and all(
            isinstance(v, str) and k in contract.knobs and v in contract.knobs[k].choices for k, v in knobs.items())
        if valid:
            return dict(knobs)
        notes.append(f"{path}: its launch settings are not among {contract.path.name}'s choices; not used")
    return {}


def _carried(top: Path, rel: str, contract_name: str, base: str, head: str, raw: bytes, keys: set[str],
             change: _Change, tmp: Path) -> str | None:
    """None when this bundle is a full receipt for exactly this change; else why it is not."""
    from infrarsi._receipt import check_receipt

    if not keys:
        return f"no trusted key ({_repo_path(rel, TRUSTED_KEYS_FILE)} at the base, or --trusted-keys)"
    check = check_receipt(raw)
    if not check.ok:
        return "the receipt does not verify: " + "; ".join(check.problems)
    data = json.loads(raw)
    body = data["receipt"]
    if body.get("public_key") not in keys:
        return "signed by a key the base does not trust"
    contract_at_base = _show(top, base, _repo_path(rel, contract_name))
    if contract_at_base is None or sha256_hex(contract_at_base) != body.get("contract_sha256"):
        return f"measured under another {contract_name} than the base's"
    if not all(isinstance(body.get(k), dict) for k in ("sources", "protected_files", "workspace_files")):
        return "the receipt predates signed workspace hashes: it cannot show what code it measured"
    texts = data.get("patch_texts")
    patches = body.get("patches") or []
    if not isinstance(texts, list) or len(texts) != len(patches):
        return "the bundle does not carry the receipt's patch texts"
    for signed, carried in zip(patches, texts):
        text = carried.get("text") if isinstance(carried, dict) else None
        if not isinstance(text, str) or sha256_hex(text.encode()) != signed.get("sha256"):
            return f"the text of patch {signed.get('name')!r} is not the one the receipt signs"
    with worktree(top, base, tmp / f"check-{sha256_hex(raw)[:8]}") as tree:
        stale = _stale(tree / rel if rel != "." else tree, body, contract_name)
        if stale:
            return stale
        return _gives_head(tree, rel, head, [t["text"].encode() for t in texts], change,
                           "the change is not the receipt's patch (applied to the base, it does not give the head)")


def _stale(workspace: Path, body: dict, contract_name: str) -> str | None:
    """Why the base's workspace is not the code the receipt measured, or None.

    Files the measured workspace had beyond the base's (data, ignored files) are not asked for.
    """
    from infrarsi._contract import ContractError, load_contract

    now = hash_workspace(workspace)
    for local, digest in sorted(now.items()):
        measured = body["workspace_files"].get(local)
        if measured is None:
            return f"{local} is in the base but was not in the workspace the receipt measured"
        if measured != digest:
            return f"measured on another {local} than the base's"
    for local, digest in sorted(body["sources"].items()):
        if now.get(local) != digest:
            return f"measured on another {local} than the base's"
    try:
        globs = load_contract(workspace / contract_name).protected_globs
    except ContractError as exc:
        return f"the base's {contract_name} does not load: {exc}"
    protected = hash_protected(workspace, globs)
    if protected != body["protected_files"]:
        differ = sorted(set(protected) ^ set(body["protected_files"]) |
                        {p for p in protected if body["protected_files"].get(p) != protected[p]})
        return f"the protected files at the base are not the ones measured: {', '.join(differ[:6])}"
    return None


def _gives_head(tree: Path, rel: str, head: str, texts: list[bytes], change: _Change, mismatch: str) -> str | None:
    """Apply ``texts`` in ``tree`` (at the base): None when that gives the head's workspace, receipt bundles aside."""
    prefix = [f"--directory={rel}"] if rel != "." else []
    for text in texts:
        done = git(["apply", "--whitespace=nowarn", *prefix, "-"], cwd=tree, input=text, check=False)
        if done.returncode != 0:
            return f"the patch does not apply to the base: {done.stderr.decode(errors='replace').strip()}"
    git(["add", "-A"], cwd=tree)
    names = git(["diff", "--cached", "--name-only", "--no-renames", "-z", head, "--", rel], cwd=tree).stdout
    prefix_path = "" if rel == "." else rel + "/"
    bundles = {prefix_path + b for b in change.bundles}
    differ = [n for n in names.decode("utf-8", "surrogateescape").split("\0") if n and n not in bundles]
    return f"{mismatch}: {', '.join(differ[:6])}" if differ else None


def _rerun(outcome: GateOutcome, top: Path, rel: str, contract, base: str, head: str, knobs: dict[str, str],
           change: _Change, runs: int, pairs: int | None, out: str | Path | None, tmp: Path,
           progress) -> GateOutcome:
    """`init`, `baseline` and `verify` of the diff in a work tree at the base, on this machine."""
    from infrarsi._baseline import BaselineFailed, baseline
    from infrarsi._verify import verify
    from infrarsi._workspace import init

    outcome.mode = "rerun"
    scope = ["--", rel] + [f":(exclude){_repo_path(rel, b)}" for b in change.bundles]
    relative = [f"--relative={rel}"] if rel != "." else []
    diff = git([*_DIFF, "--binary", *relative, base, head, *scope], cwd=top).stdout
    patch_file = tmp / "change.diff"
    patch_file.write_bytes(diff)
    with worktree(top, base, tmp / "replay") as tree:   # the diff must give the head, nothing more or less
        problem = _gives_head(tree, rel, head, [diff] if diff.strip() else [], change,
                              "the diff does not reproduce the head")
    if problem:
        outcome.notes.append(problem)
        return outcome
    with worktree(top, base, tmp / "base") as tree:
        workspace = tree / rel if rel != "." else tree
        init(workspace / contract.path.name, force=True)   # a throwaway key and ledger, for this check only
        try:
            baseline(workspace / contract.path.name, runs=runs, progress=progress)
        except BaselineFailed as exc:
            outcome.notes.append(f"the base itself does not run here: {str(exc).splitlines()[0]}")
            return outcome
        result = verify(workspace / contract.path.name, sets=knobs, patches=[str(patch_file)] if diff.strip() else [],
                        pairs=pairs, progress=progress)
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
