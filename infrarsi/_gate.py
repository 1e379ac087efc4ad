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

from infrarsi._apply import RECEIPTS_DIR
from infrarsi._candidate import UsageError
from infrarsi._git import GitError, git, toplevel, worktree
from infrarsi.ledger import sha256_hex

__all__ = ["gate", "GateOutcome", "TRUSTED_KEYS_FILE"]

TRUSTED_KEYS_FILE = "infrarsi-trusted-keys"   # in the workspace, read at the base ref
_HEX_KEY = re.compile(r"^[0-9a-f]{64}$")


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
    checks: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # why each carried receipt was or was not enough

    def to_json(self) -> dict:
        return {"passed": self.passed, "mode": self.mode, "base": self.base, "head": self.head,
                "changed": self.changed, "receipt": self.receipt, "receipt_path": self.receipt_path,
                "speedup": self.speedup, "knobs": self.knobs, "checks": self.checks, "notes": self.notes,
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
                         + (f", receipt `{self.receipt}`" if self.receipt else "") + ".")
            lines.append("")
        if self.knobs:
            lines += ["Launch settings the receipt was measured with: "
                      + ", ".join(f"`{k}={v}`" for k, v in sorted(self.knobs.items())), ""]
        if self.changed:
            lines += ["Changed files: " + ", ".join(f"`{c}`" for c in self.changed[:20])
                      + (" ..." if len(self.changed) > 20 else ""), ""]
        if self.checks:
            lines += ["| check | status | detail |", "|---|---|---|"]
            lines += [f"| {c['id']} | {c['status']} | {str(c.get('detail', '')).replace('|', '/')} |"
                      for c in self.checks]
            lines.append("")
        lines += [f"- {n}" for n in self.notes]
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
    ws = contract_file.parent
    top = toplevel(ws)
    if top is None:
        raise UsageError(f"{ws}: not in a git repository (the gate compares two commits)")
    rel = ws.relative_to(top).as_posix()
    base_sha = _commit(top, base or "HEAD")
    with tempfile.TemporaryDirectory(prefix="infrarsi-gate-") as tmp:
        tmp = Path(tmp)
        head_sha = _commit(top, head) if patch is None else _patched_commit(top, base_sha, rel, Path(patch), tmp)
        changed, outside = _changes(top, rel, base_sha, head_sha)
        outcome = GateOutcome(False, "none", base_sha, head_sha, changed)
        if outside:
            outcome.notes.append("changes outside the workspace are covered by no receipt: "
                                 + ", ".join(outside[:10]))
            return outcome
        keys = _trusted_keys(top, rel, base_sha, trusted_keys)
        bundles = _bundles(top, rel, base_sha, head_sha)
        if not rerun:
            for path, raw in bundles:
                problem = _carried(top, rel, contract_file.name, base_sha, head_sha, raw, keys, tmp)
                if problem is None:
                    body = json.loads(raw)
                    outcome.passed, outcome.mode = True, "receipt"
                    outcome.receipt, outcome.receipt_path = body["id"], path
                    outcome.speedup, outcome.knobs = body["receipt"]["speedup"], body["receipt"].get("knobs") or {}
                    outcome.checks = [{k: c.get(k) for k in ("id", "status", "detail")}
                                      for c in body["receipt"].get("checks") or []]
                    outcome.notes.append(f"{path}: verified (trusted key, same contract and code, "
                                         "patch matches the diff)")
                    return outcome
                outcome.notes.append(f"{path}: not enough on its own: {problem}")
            if not bundles:
                outcome.notes.append("the change carries no receipt (infrarsi-receipts/*.json)")
        if not changed and not sets and not bundles:
            outcome.notes.append("no change inside the workspace: nothing to verify")
            return outcome
        knobs = dict(sets or {}) or _carried_knobs(bundles)
        return _rerun(outcome, top, rel, contract_file.name, base_sha, head_sha, knobs, runs, pairs, out, tmp,
                      progress)


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


def _changes(top: Path, rel: str, base: str, head: str) -> tuple[list[str], list[str]]:
    """Workspace-relative paths the change touches (receipt bundles left out), and paths outside it."""
    names = git(["diff", "--name-only", "--no-renames", "-z", base, head], cwd=top).stdout.decode().split("\0")
    inside, outside = [], []
    prefix = "" if rel == "." else rel + "/"
    for name in filter(None, names):
        if not name.startswith(prefix):
            outside.append(name)
            continue
        local = name[len(prefix):]
        if not (local.startswith(RECEIPTS_DIR + "/") and local.endswith(".json")):
            inside.append(local)
    return sorted(inside), sorted(outside)


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


def _bundles(top: Path, rel: str, base: str, head: str) -> list[tuple[str, bytes]]:
    """Receipt bundles the change adds or modifies, ``(repo path, bytes at head)``."""
    where = _repo_path(rel, RECEIPTS_DIR)
    names = git(["diff", "--name-only", "--no-renames", "--diff-filter=AM", "-z", base, head, "--", where],
                cwd=top).stdout.decode().split("\0")
    out = []
    for name in sorted(filter(None, names)):
        if name.endswith(".json"):
            data = _show(top, head, name)
            if data is not None:
                out.append((name, data))
    return out


def _carried_knobs(bundles: list[tuple[str, bytes]]) -> dict[str, str]:
    for _, raw in bundles:
        try:
            knobs = json.loads(raw)["receipt"]["knobs"]
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(knobs, dict) and all(isinstance(v, str) for v in knobs.values()):
            return dict(knobs)
    return {}


def _carried(top: Path, rel: str, contract_name: str, base: str, head: str, raw: bytes, keys: set[str],
             tmp: Path) -> str | None:
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
    if _show(top, head, _repo_path(rel, contract_name)) != contract_at_base:
        return f"the change edits {contract_name}"
    if "sources" not in body or "protected_files" not in body:
        return "the receipt predates signed source hashes: it cannot show what code it measured"
    for local, digest in sorted(body["sources"].items()):
        if sha256_hex(_show(top, base, _repo_path(rel, local)) or b"\0missing") != digest:
            return f"measured on another {local} than the base's"
    for local, digest in sorted(body["protected_files"].items()):
        for commit in (base, head):
            data_at = _show(top, commit, _repo_path(rel, local))
            if data_at is not None and sha256_hex(data_at) != digest:
                return f"protected file {local} at {commit[:12]} is not the one measured"
    texts = data.get("patch_texts")
    patches = body.get("patches") or []
    if not isinstance(texts, list) or len(texts) != len(patches):
        return "the bundle does not carry the receipt's patch texts"
    for signed, carried in zip(patches, texts):
        text = carried.get("text") if isinstance(carried, dict) else None
        if not isinstance(text, str) or sha256_hex(text.encode()) != signed.get("sha256"):
            return f"the text of patch {signed.get('name')!r} is not the one the receipt signs"
    # The receipt's patches on the base must give the head's workspace exactly.
    with worktree(top, base, tmp / f"check-{sha256_hex(raw)[:8]}") as tree:
        prefix = [f"--directory={rel}"] if rel != "." else []
        for carried in texts:
            done = git(["apply", "--whitespace=nowarn", *prefix, "-"], cwd=tree, input=carried["text"].encode(),
                       check=False)
            if done.returncode != 0:
                return f"its patch does not apply to the base: {done.stderr.decode(errors='replace').strip()}"
        git(["add", "-A"], cwd=tree)
        scope = [rel if rel != "." else ".", f":(exclude){_repo_path(rel, RECEIPTS_DIR)}"]
        differ = git(["diff", "--cached", "--quiet", head, "--", *scope], cwd=tree, check=False).returncode
    if differ:
        return "the change is not the receipt's patch (applied to the base, it does not give the head)"
    return None


def _rerun(outcome: GateOutcome, top: Path, rel: str, contract_name: str, base: str, head: str,
           knobs: dict[str, str], runs: int, pairs: int | None, out: str | Path | None, tmp: Path,
           progress) -> GateOutcome:
    """`init`, `baseline` and `verify` of the diff in a work tree at the base, on this machine."""
    from infrarsi._baseline import BaselineFailed, baseline
    from infrarsi._verify import verify
    from infrarsi._workspace import init

    outcome.mode = "rerun"
    scope = ["--", rel if rel != "." else ".", f":(exclude){_repo_path(rel, RECEIPTS_DIR)}"]
    relative = [f"--relative={rel}"] if rel != "." else []
    diff = git(["diff", "--binary", "--no-renames", *relative, base, head, *scope], cwd=top).stdout
    patch_file = tmp / "change.diff"
    patch_file.write_bytes(diff)
    with worktree(top, base, tmp / "base") as tree:
        contract = (tree / rel / contract_name) if rel != "." else tree / contract_name
        init(contract, force=True)   # a throwaway key and ledger, for this check only
        try:
            baseline(contract, runs=runs, progress=progress)
        except BaselineFailed as exc:
            outcome.notes.append(f"the base itself does not run here: {str(exc).splitlines()[0]}")
            return outcome
        result = verify(contract, sets=knobs, patches=[str(patch_file)] if diff.strip() else [], pairs=pairs,
                        progress=progress)
        outcome.passed, outcome.speedup, outcome.knobs = result.accepted, result.speedup, dict(knobs)
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
