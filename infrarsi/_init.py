"""`infrarsi init` (define): validate the contract, pin the protected files in a signed manifest,
create the signing key and the ledger. A second init archives the old state whole."""

from __future__ import annotations

import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from infrarsi._manifest import MANIFEST_NAME, build_manifest
from infrarsi._workspace import KEYS_DIR, LEDGER_NAME, STATE_ENTRIES
from infrarsi.contract import load_contract
from infrarsi.errors import UsageError
from infrarsi.ledger import KeyPair, Ledger

__all__ = ["InitResult", "init", "GITIGNORE"]

# The state folder is this machine's record; above all, keys/ holds the private signing key.
GITIGNORE = """\
# Written by `infrarsi init`. Everything here stays out of git: keys/ holds the private
# signing key, and the ledger, receipts and sandboxes are this machine's record.
# What a commit carries: infrarsi.toml, infrarsi-trusted-keys (public keys) and the
# receipt bundles `infrarsi apply` commits as infrarsi-receipts/<id>.json.
*
"""


@dataclass(frozen=True)
class InitResult:
    state_dir: Path
    ledger: Path
    manifest: Path
    manifest_sha256: str
    pinned: dict[str, str]
    archived: Path | None
    revision: dict | None = None  # with --update: Revision.to_json(); None for a new ledger

    def to_json(self) -> dict:
        return {
            "revision": self.revision,
            "state_dir": str(self.state_dir),
            "ledger": str(self.ledger),
            "manifest": str(self.manifest),
            "manifest_sha256": self.manifest_sha256,
            "pinned": self.pinned,
            "archived": str(self.archived) if self.archived else None,
        }


def init(contract_path: str | Path = "infrarsi.toml", force: bool = False, update: bool = False) -> InitResult:
    """Validate the contract, pin protected files in a signed manifest, create key and ledger.

    ``update`` keeps the ledger and key and pins a changed contract as the next revision
    (see _revision); ``force`` archives everything and starts a new ledger with a new key."""
    if update and force:
        raise UsageError("--update and --force: choose one (--update keeps the ledger, --force starts a new one)")
    if update:
        from infrarsi._revision import revise

        manifest, revision = revise(contract_path)
        contract = load_contract(contract_path)
        state = contract.state_dir
        _keep_out_of_git(state)  # a workspace initialised before `init` wrote one gets it now
        return InitResult(
            state, state / LEDGER_NAME, state / MANIFEST_NAME, manifest.sha256, manifest.files, None, revision.to_json()
        )
    contract = load_contract(contract_path)
    state = contract.state_dir
    ledger_path = state / LEDGER_NAME
    archived = None
    if ledger_path.exists():
        if not force:
            raise UsageError(
                f"{ledger_path} already exists: this workspace is initialised (use --update to pin a changed "
                f"contract as a revision of this ledger, or --force to start a new ledger; the old one is archived)"
            )
        # Nothing recorded is lost: the old state moves aside, whole.
        archived = state / "archive" / f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
        archived.mkdir(parents=True)
        for name in STATE_ENTRIES:
            if (state / name).exists():
                shutil.move(str(state / name), str(archived / name))
    state.mkdir(parents=True, exist_ok=True)
    _keep_out_of_git(state)
    key = KeyPair.generate()
    key.save(state / KEYS_DIR)
    manifest = build_manifest(contract, key)
    manifest_path = state / MANIFEST_NAME
    manifest_path.write_text(manifest.to_json())
    with Ledger.open(ledger_path, key=key, create=True) as ledger:
        ledger.put_blob(manifest.to_json().encode(), "manifest")
        ledger.put_blob(contract.text.encode(), "contract")
        ledger.set_meta("manifest_sha256", manifest.sha256)
        ledger.set_meta("contract_sha256", contract.sha256)
    return InitResult(state, ledger_path, manifest_path, manifest.sha256, manifest.files, archived)


def _keep_out_of_git(state: Path) -> None:
    """A ``.gitignore`` that keeps the whole state folder (the private key first) out of ``git add -A``;
    one the user wrote is left as it is unless it lets the keys through."""
    path = state / ".gitignore"
    if not path.exists():
        path.write_text(GITIGNORE)
        return
    text = path.read_text(errors="replace")
    lines = {line.strip() for line in text.splitlines()}
    if not lines & {"*", "keys", "keys/", "/keys", "/keys/"}:
        path.write_text(text + ("" if text.endswith("\n") or not text else "\n") + "keys/\n")
