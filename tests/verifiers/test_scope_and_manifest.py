"""scope.* over real diffs, and integrity.manifest over a real signed manifest."""

from __future__ import annotations

from infrarsi.ledger import KeyPair, canonical_json
from infrarsi.verifiers import check_manifest, check_scope

EDITABLE, PROTECTED = ["model.py", "train.py"], ["data/**", "infrarsi.toml"]


def _diff(path, old="a\n", new="b\n", header=""):
    return f"diff --git a/{path} b/{path}\n{header}--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-{old}+{new}"


def _status(patches):
    return {r.id: r.status for r in check_scope(patches, EDITABLE, PROTECTED)}


def test_in_scope_patch_passes_every_scope_check():
    assert set(_status({"p": _diff("model.py")}).values()) == {"pass"}


def test_no_patches_pass():
    assert set(_status({}).values()) == {"pass"}


def test_outside_editable_fails():
    assert _status({"p": _diff("eval.py")})["scope.editable"] == "fail"


def test_protected_change_fails():
    assert _status({"p": _diff("data/corpus.txt")})["scope.protected"] == "fail"
    assert _status({"p": _diff("infrarsi.toml")})["scope.protected"] == "fail"


def test_new_file_outside_editable_fails():
    new = (
        "diff --git a/helper.py b/helper.py\nnew file mode 100644\n--- /dev/null\n+++ b/helper.py\n@@ -0,0 +1 @@\n+x\n"
    )
    assert _status({"p": new})["scope.created"] == "fail"


def test_delete_and_rename_of_protected_fail():
    gone = (
        "diff --git a/data/c.txt b/data/c.txt\ndeleted file mode 100644\n"
        "--- a/data/c.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n"
    )
    moved = "diff --git a/data/c.txt b/model2.py\nsimilarity index 100%\nrename from data/c.txt\nrename to model2.py\n"
    assert _status({"p": gone})["scope.protected"] == "fail"
    assert _status({"p": moved})["scope.protected"] == "fail"


def test_binary_and_unreadable_patches_fail():
    binary = "diff --git a/model.py b/model.py\nGIT binary patch\nliteral 0\n"
    assert _status({"p": binary})["scope.binary"] == "fail"
    assert _status({"p": "not a diff"})["scope.parse"] == "fail"


def test_path_escaping_the_workspace_fails():
    assert _status({"p": _diff("../model.py")})["scope.editable"] == "fail"


def _manifest(files):
    key = KeyPair.generate()
    body = {"version": 1, "contract_sha256": "c" * 64, "files": files, "public_key": key.public_hex}
    return key, body, key.sign(canonical_json(body))


def test_manifest_passes_when_signed_and_matching():
    key, body, sig = _manifest({"data/x": "1" * 64})
    assert check_manifest(body, sig, "c" * 64, key.public_hex, {"data/x": "1" * 64}).status == "pass"


def test_manifest_failures():
    key, body, sig = _manifest({"data/x": "1" * 64})
    files = {"data/x": "1" * 64}
    assert check_manifest({**body, "files": {}}, sig, "c" * 64, None, files).status == "fail"  # edited body
    assert check_manifest(body, sig, "d" * 64, None, files).status == "fail"  # another contract
    assert check_manifest(body, sig, "c" * 64, KeyPair.generate().public_hex, files).status == "fail"
    assert check_manifest(body, sig, "c" * 64, None, {"data/x": "2" * 64}).status == "fail"
    assert check_manifest(body, sig, "c" * 64, None, {**files, "data/new": "3" * 64}).status == "fail"
