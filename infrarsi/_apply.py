"""`infrarsi apply`: a verified candidate written into the workspace, as a git branch or a patch file.

`apply` refuses (exit 1) when the receipt does not verify against the key `init` pinned,
when the workspace's protected files changed since `init`, or when the files the patches
change are no longer the ones the receipt measured. It never touches the checkout the
user is on: the branch is built in a temporary git work tree.

The branch has one commit: the patched files and the receipt bundle
``infrarsi-receipts/<id>.json`` (the signed receipt plus its patch texts), which is
what `infrarsi gate` looks for in a pull request. Knob settings are launch settings,
not code: they are in the commit message and the receipt, and `apply` prints the
launch command that uses them.
"""

from __future__ import annotations

import json
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path

from infrarsi._hashing import LAUNCH_FILE, RECEIPTS_DIR, hash_protected, launch_file_text
from infrarsi._patch import parse_patch
from infrarsi._workspace import open_workspace
from infrarsi.contract import PatchRef, changes_from, launch_command
from infrarsi.errors import ApplyRefused, PatchParseError, UsageError
from infrarsi.signing import sha256_hex

__all__ = ["apply", "ApplyOutcome", "RECEIPTS_DIR", "launch_command", "receipt_bundle"]


@dataclass(frozen=True)
class ApplyOutcome:
    receipt: str
    speedup: dict
    knobs: dict[str, str]
    changes: list[str]
    patches: list[str]
    launch: dict
    branch: str | None = None
    commit: str | None = None
    patch_file: str | None = None
    bundle: str | None = None
    apply_command: str | None = None  # how to apply the patch file (paths are workspace-relative)

    def to_json(self) -> dict:
        return {
            "receipt": self.receipt,
            "speedup": self.speedup,
            "knobs": self.knobs,
            "patches": self.patches,
            "changes": self.changes,
            "launch": self.launch,
            "branch": self.branch,
            "commit": self.commit,
            "patch_file": self.patch_file,
            "bundle": self.bundle,
            "apply_command": self.apply_command,
        }


def receipt_bundle(raw: bytes, patches: list[PatchRef]) -> str:
    """The signed receipt with its patch texts beside it (unsigned: each text is checked by its hash)."""
    data = json.loads(raw)
    data["patch_texts"] = [{"name": p.name, "text": p.text} for p in patches]
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def apply(
    contract_path: str | Path = "infrarsi.toml",
    receipt: str | None = None,
    branch: str | None = None,
    patch_file: str | Path | None = None,
) -> ApplyOutcome:
    """Apply the receipt ``receipt`` (an id, a unique id prefix or a receipt file; default: the best one).

    With ``branch``, or by default in a git work tree: a branch (default ``infrarsi/<id>``)
    with one commit. With ``patch_file``, or by default outside git: the combined patch
    written there (default ``.infrarsi/apply/<id>.diff``).
    """
    from infrarsi._receipt import check_receipt, ledger_receipts
    from infrarsi.verifiers import check_manifest

    if branch is not None and patch_file is not None:
        raise UsageError("--branch and --patch-file: give one of them, not both")
    with open_workspace(contract_path) as ws:
        contract = ws.contract
        trusted = ws.manifest.public_key
        raw = _pick(ledger_receipts(ws.ledger), receipt, trusted)
        check = check_receipt(raw, trusted)
        if not check.ok:
            raise ApplyRefused(f"receipt {check.receipt_id or receipt}: does not verify: {'; '.join(check.problems)}")
        body = json.loads(raw)["receipt"]
        rid = check.receipt_id
        if body.get("contract_sha256") != contract.sha256:
            raise ApplyRefused(f"receipt {rid}: measured under another contract than {contract.path.name} now")
        manifest = check_manifest(
            ws.manifest.body, ws.manifest.signature, contract.sha256, ws.ledger.public_key, manifest_files(ws)
        )
        if not manifest.passed:
            raise ApplyRefused(
                f"{contract.workspace}: {manifest.detail} (`infrarsi init` pinned them); "
                "restore them, or pin them with `infrarsi init --update` and measure again"
            )
        if "protected_files" in body and body["protected_files"] != manifest_files(ws):
            raise ApplyRefused(
                f"receipt {rid}: measured with other protected files than the workspace has now; "
                "verify the candidate again"
            )
        patches = _patch_texts(ws.ledger, body, rid)
        _same_sources(contract.workspace, body, ws.ledger, rid)
        knobs = dict(body.get("knobs") or {})
        unknown = [k for k in knobs if k not in contract.knobs]
        if unknown:
            raise ApplyRefused(f"receipt {rid}: knobs {', '.join(unknown)} are not in {contract.path.name}")
        base = contract.baseline_knobs()
        changes = changes_from(base, knobs, [p.name for p in patches])
        launch = launch_command(contract, knobs)
        common = {
            "receipt": rid,
            "speedup": body["speedup"],
            "knobs": knobs,
            "changes": changes,
            "patches": [p.name for p in patches],
            "launch": launch,
        }
        from infrarsi._git import toplevel

        top = toplevel(contract.workspace)
        if patch_file is not None or (branch is None and top is None):
            target = Path(patch_file) if patch_file is not None else contract.state_dir / "apply" / f"{rid}.diff"
            target = _write_patch(target, patches).resolve()
            ws_dir = contract.workspace.resolve()
            # Inside a repository, `git apply` reads paths from the top and silently skips the
            # ones outside the current folder: name the folder the paths are relative to.
            rel = ws_dir.relative_to(top).as_posix() if top is not None else "."
            command = (
                f"git -C {shlex.quote(str(top))} apply --directory={shlex.quote(rel)} {shlex.quote(str(target))}"
                if rel != "."
                else f"git -C {shlex.quote(str(ws_dir))} apply {shlex.quote(str(target))}"
            )
            return ApplyOutcome(**common, patch_file=str(target), apply_command=command)
        if top is None:
            raise UsageError(
                f"{contract.workspace}: not in a git work tree, so no branch can be made; "
                "use --patch-file FILE (or `git init` and commit the workspace first)"
            )
        name = branch or f"infrarsi/{rid}"
        commit, bundle = _branch(top, contract, name, patches, raw, body, changes, launch)
        return ApplyOutcome(**common, branch=name, commit=commit, bundle=bundle)


def manifest_files(ws) -> dict[str, str]:
    """The protected files as they are now, hashed as `init` pins them."""
    return hash_protected(ws.contract.workspace, ws.contract.protected_globs)


def _pick(receipts: dict[str, bytes], wanted: str | None, trusted: str) -> bytes:
    from infrarsi._receipt import check_receipt

    if wanted is not None and Path(wanted).suffix == ".json" and Path(wanted).is_file():
        return Path(wanted).read_bytes()
    if wanted is None:
        valid = []
        for data in receipts.values():
            check = check_receipt(data, trusted)
            if check.ok and check.speedup:
                valid.append((check.speedup.get("median") or 0.0, data))
        if not valid:
            raise UsageError(
                "no verified receipt in this ledger: run `infrarsi search` or `infrarsi verify` first "
                "(or name a receipt)"
            )
        return max(valid, key=lambda v: v[0])[1]
    matches = [rid for rid in receipts if rid.startswith(wanted)] if len(wanted) >= 4 else []
    if len(matches) != 1:
        known = ", ".join(sorted(receipts)) or "none"
        why = "matches several" if matches else "matches none"
        raise UsageError(
            f"receipt {wanted!r}: {why} of this ledger's receipts (expected an id or a unique prefix "
            f"of at least 4 characters, or a receipt .json file; known: {known})"
        )
    return receipts[matches[0]]


def _patch_texts(ledger, body: dict, rid: str) -> list[PatchRef]:
    out = []
    for p in body.get("patches") or []:
        data = ledger.get_blob(p.get("sha256", ""))
        if data is None or sha256_hex(data) != p.get("sha256"):
            raise ApplyRefused(f"receipt {rid}: the text of patch {p.get('name')!r} is not in the ledger")
        out.append(PatchRef(name=p["name"], text=data.decode("utf-8")))
    return out


def _same_sources(workspace: Path, body: dict, ledger, rid: str) -> None:
    """The files the patches change are still the ones measured (signed in the receipt, else the ledger rows)."""
    measured = body.get("sources")
    if measured is None:  # receipts from before they carried sources: the candidate's ledger rows have them
        measured = {}
        for eid in body.get("executions") or []:
            row = ledger.get_execution(int(eid))
            if row and row.get("kind") == "ab-candidate":
                measured.update(row.get("sources") or {})
    for rel, digest in sorted(measured.items()):
        path = workspace / rel
        now = sha256_hex(path.read_bytes()) if path.is_file() else None
        if now != digest:
            raise ApplyRefused(
                f"receipt {rid}: {rel} changed since the receipt measured the patch on it; "
                "verify the candidate again on the code as it is now"
            )


def _write_patch(target: Path, patches: list[PatchRef]) -> Path:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("".join(p.text if p.text.endswith("\n") else p.text + "\n" for p in patches))
    except OSError as exc:
        raise UsageError(f"{target}: cannot write the patch file: {exc.strerror or exc}") from None
    return target


def _touched(patches: list[PatchRef]) -> tuple[list[str], list[str]]:
    """The paths the patches change that exist before them, and the ones they create."""
    existing, created = set(), set()
    for p in patches:
        try:
            for change in parse_patch(p.text):
                if change.old is not None:
                    existing.add(change.old)
                if change.new is not None and change.new != change.old:
                    created.add(change.new)
        except PatchParseError as exc:
            raise ApplyRefused(f"patch {p.name}: {exc}") from None
    return sorted(existing), sorted(created - existing)


def _branch(
    top: Path, contract, name: str, patches: list[PatchRef], raw: bytes, body: dict, changes: list[str], launch: dict
) -> tuple[str, str]:
    from infrarsi._git import git, worktree

    ws = contract.workspace.resolve()
    rel = ws.relative_to(top).as_posix()
    if git(["check-ref-format", "--branch", name], cwd=top, check=False).returncode != 0:
        raise UsageError(f"--branch {name!r}: not a valid git branch name")
    if git(["rev-parse", "--verify", "--quiet", f"refs/heads/{name}"], cwd=top, check=False).returncode == 0:
        raise UsageError(f"--branch {name!r}: the branch already exists (pick another name or delete it)")
    if git(["rev-parse", "--verify", "--quiet", "HEAD"], cwd=top, check=False).returncode != 0:
        raise UsageError(f"{top}: the repository has no commit yet; commit the workspace first")
    existing, created = _touched(patches)
    touched = existing + created
    # The branch starts from HEAD, so the workspace measured must be HEAD's: no tracked file
    # changed, and the files the patches read, the contract and the protected files committed.
    watched = existing + [contract.path.name] + sorted(hash_protected(ws, contract.protected_globs))
    status = git(["status", "--porcelain", "--untracked-files=no", "--", "."], cwd=ws).stdout
    dirty = {line[3:] for line in status.decode("utf-8", "surrogateescape").splitlines() if line.strip()}
    dirty |= {p for p in watched if git(["ls-files", "--error-unmatch", "--", p], cwd=ws, check=False).returncode}
    if dirty:
        raise UsageError(
            f"{ws}: {', '.join(sorted(dirty)[:6])} differ from HEAD (uncommitted or untracked); the "
            "branch starts at HEAD, so commit or stash them first"
        )
    present = [
        p for p in created if git(["cat-file", "-e", f"HEAD:{_repo(rel, p)}"], cwd=top, check=False).returncode == 0
    ]
    if present:
        raise UsageError(f"{ws}: the candidate creates {', '.join(present[:6])}, which HEAD already has")
    rid = json.loads(raw)["id"]
    speedup = body["speedup"]
    message = (
        f"infrarsi: apply receipt {rid}: {speedup['median']:.3f}x "
        f"(95% CI {speedup['ci_low']:.3f}-{speedup['ci_high']:.3f})\n\n"
        f"Changes: {', '.join(changes) or 'none'}\n"
        f"Launch: {launch['shell']}\n\n"
        f"InfraRSI-Receipt: {rid}\n"
        f"InfraRSI-Speedup: {speedup['median']:.4f}\n"
    )
    # The user's own identity where git has one; a named stand-in where it has none (a fresh CI box).
    identity = (
        []
        if git(["config", "user.email"], cwd=top, check=False).returncode == 0
        else ["-c", "user.name=InfraRSI", "-c", "user.email=infrarsi@localhost"]
    )
    bundle_rel = f"{RECEIPTS_DIR}/{rid}.json"
    try:
        with (
            tempfile.TemporaryDirectory(prefix="infrarsi-apply-") as tmp,
            worktree(top, "HEAD", Path(tmp) / "tree", branch=name) as tree,
        ):
            where = tree / rel if rel != "." else tree
            for p in patches:
                prefix = [f"--directory={rel}"] if rel != "." else []
                git(["apply", "--whitespace=nowarn", *prefix, "-"], cwd=tree, input=p.text.encode())
            (where / RECEIPTS_DIR).mkdir(exist_ok=True)
            (where / bundle_rel).write_text(receipt_bundle(raw, patches))
            (where / LAUNCH_FILE).write_text(launch_file_text(rid, speedup["median"], launch["shell"]))
            present = [t for t in touched if (where / t).exists()]
            gone = [t for t in touched if not (where / t).exists()]
            git(["add", "--", *present, bundle_rel, LAUNCH_FILE], cwd=where)
            if gone:
                git(["rm", "--quiet", "--cached", "--ignore-unmatch", "--", *gone], cwd=where)
            git([*identity, "commit", "--quiet", "--no-verify", "-m", message], cwd=where)
            commit = git(["rev-parse", "HEAD"], cwd=tree).stdout.decode().strip()
    except BaseException:
        git(["branch", "-D", name], cwd=top, check=False)  # no half-made branch left behind, whatever stopped it
        raise
    return commit, f"{rel}/{bundle_rel}" if rel != "." else bundle_rel


def _repo(rel: str, local: str) -> str:
    return local if rel == "." else f"{rel}/{local}"
