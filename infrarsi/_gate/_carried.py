"""A receipt the pull request carries: signed by a key the base trusts, measured under the base's
contract on the base's code, and whose patches, applied to the base, give exactly the head."""

from __future__ import annotations

import json
from pathlib import Path

from infrarsi._gate._change import Change, repo_path, show
from infrarsi._git import git, worktree
from infrarsi._hashing import hash_protected, hash_workspace
from infrarsi._manifest import is_public_key
from infrarsi.errors import UsageError
from infrarsi.signing import sha256_hex

__all__ = ["TRUSTED_KEYS_FILE", "trusted_keys_at", "carried", "carried_knobs", "gives_head"]

TRUSTED_KEYS_FILE = "infrarsi-trusted-keys"  # in the workspace, read at the base ref


def trusted_keys_at(top: Path, rel: str, base: str, given: str | Path | None) -> set[str]:
    if given is not None:
        try:
            text, where = Path(given).read_text(), str(given)
        except OSError as exc:
            raise UsageError(f"--trusted-keys {given}: cannot read it: {exc.strerror or exc}") from None
    else:
        data = show(top, base, repo_path(rel, TRUSTED_KEYS_FILE))
        if data is None:
            return set()
        text, where = data.decode("utf-8", "replace"), f"{repo_path(rel, TRUSTED_KEYS_FILE)} at {base[:12]}"
    keys = set()
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if not is_public_key(line):
            raise UsageError(
                f"{where}, line {number}: expected an Ed25519 public key as 64 lowercase hex digits "
                f"(the public_key of .infrarsi/manifest.json), got {line[:20]!r}"
            )
        keys.add(line)
    return keys


def carried_knobs(bundles: list[tuple[str, bytes]], contract, notes: list[str]) -> dict[str, str]:
    """Launch settings for the rerun from a carried receipt that verifies and names only the contract's choices.

    Its key need not be trusted: the rerun measures everything again, on this machine.
    """
    from infrarsi._receipt import check_receipt

    for path, raw in bundles:
        if not check_receipt(raw).ok:
            continue
        knobs = json.loads(raw)["receipt"].get("knobs")
        valid = isinstance(knobs, dict) and all(
            isinstance(v, str) and k in contract.knobs and v in contract.knobs[k].choices for k, v in knobs.items()
        )
        if valid:
            return dict(knobs)
        notes.append(f"{path}: its launch settings are not among {contract.path.name}'s choices; not used")
    return {}


def carried(
    top: Path, rel: str, contract_name: str, base: str, head: str, raw: bytes, keys: set[str], change: Change, tmp: Path
) -> str | None:
    """None when this bundle is a full receipt for exactly this change; else why it is not."""
    from infrarsi._receipt import check_receipt

    if not keys:
        return f"no trusted key ({repo_path(rel, TRUSTED_KEYS_FILE)} at the base, or --trusted-keys)"
    check = check_receipt(raw)
    if not check.ok:
        return "the receipt does not verify: " + "; ".join(check.problems)
    data = json.loads(raw)
    body = data["receipt"]
    if body.get("public_key") not in keys:
        return "signed by a key the base does not trust"
    contract_at_base = show(top, base, repo_path(rel, contract_name))
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
        return gives_head(
            tree,
            rel,
            head,
            [t["text"].encode() for t in texts],
            change,
            "the change is not the receipt's patch (applied to the base, it does not give the head)",
        )


def _stale(workspace: Path, body: dict, contract_name: str) -> str | None:
    """Why the base's workspace is not the code the receipt measured, or None.

    Files the measured workspace had beyond the base's (data, ignored files) are not asked for.
    """
    from infrarsi.contract import load_contract
    from infrarsi.errors import ContractError

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
        differ = sorted(
            set(protected) ^ set(body["protected_files"])
            | {p for p in protected if body["protected_files"].get(p) != protected[p]}
        )
        return f"the protected files at the base are not the ones measured: {', '.join(differ[:6])}"
    return None


def gives_head(tree: Path, rel: str, head: str, texts: list[bytes], change: Change, mismatch: str) -> str | None:
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
