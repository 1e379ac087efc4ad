"""`infrarsi apply` on a real git repository: a verified candidate as a branch or a patch file,
and every refusal (forged receipt, protected files changed, code changed since measured)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infrarsi.examples.landscape import Landscape, make_workspace

# Beside other tests (the parallel pass): its jobs sleep (a landscape, `timing_sensitive = false`),
# so an A/B resolves on a busy machine; steps of 60 ms keep a scheduler hiccup a small part of one.

CLI = [sys.executable, "-m", "infrarsi.cli"]
PATIENCE_S = 300  # a safety net against a hang, never a performance assertion
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
}


def _cli(*args, cwd: Path):
    done = subprocess.run(CLI + list(args), cwd=cwd, capture_output=True, text=True, timeout=PATIENCE_S)
    payload = json.loads(done.stdout.splitlines()[-1]) if done.stdout.strip() else None
    return done, payload


def _git(*args, cwd: Path) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, env={**os.environ, **GIT_ENV}
    )
    return done.stdout


@pytest.fixture(scope="module")
def verified(tmp_path_factory) -> tuple[Path, dict]:
    """A workspace in a git repository, with one accepted candidate: the `tidy` patch and threads=2."""
    land = Landscape(
        name="apply",
        patches=["tidy"],
        knobs={"threads": (["1", "2"], "1"), "mode": (["a", "b"], "a")},
        base_ms=60.0,
        base_mb=40.0,
        limit_mb=400.0,
        noise=0.01,
        time={"+tidy": 0.6, "threads=2": 0.9},
    )
    root = make_workspace(tmp_path_factory.mktemp("apply") / "repo" / "job", land, ab_pairs=2)
    (root.parent / ".gitignore").write_text(".infrarsi/\n")
    _git("init", "-q", "-b", "main", cwd=root.parent)
    _git("add", "-A", cwd=root.parent)
    _git("commit", "-q", "-m", "the job", cwd=root.parent)
    for verb in (["init"], ["baseline", "--runs", "2"]):
        done, _ = _cli(*verb, "--json", cwd=root)
        assert done.returncode == 0, done.stderr
    done, out = _cli("verify", "--patch", "tidy", "--set", "threads=2", "--json", cwd=root)
    assert done.returncode == 0 and out["accepted"], (done.stderr, out)
    return root, out


def _copy(verified, tmp_path) -> Path:
    root, _ = verified
    shutil.copytree(root.parent, tmp_path / "repo")
    return tmp_path / "repo" / root.name


def test_apply_makes_one_commit_on_a_new_branch_and_leaves_the_checkout_alone(verified, tmp_path):
    root = _copy(verified, tmp_path)
    rid = Path(verified[1]["receipt"]).stem
    before = _git("rev-parse", "HEAD", cwd=root)
    done, out = _cli("apply", "--json", cwd=root)  # no id: the best verified receipt
    assert done.returncode == 0, done.stderr
    assert out["receipt"] == rid and out["branch"] == f"infrarsi/{rid}" and out["patches"] == ["tidy"]
    # The user's checkout: same branch, same commit, nothing modified.
    assert _git("rev-parse", "HEAD", cwd=root) == before
    assert _git("branch", "--show-current", cwd=root).strip() == "main"
    assert _git("status", "--porcelain", cwd=root).strip() == ""
    assert (root / "switches" / "tidy.py").read_text() == "ON = False\n"
    # One commit on top of main: the patched file, the receipt bundle and the launch line, nothing else.
    assert _git("rev-list", "--count", f"main..{out['branch']}", cwd=root).strip() == "1"
    files = _git("diff", "--name-only", "main", out["branch"], cwd=root).split()
    assert sorted(files) == ["job/infrarsi-launch.txt", f"job/infrarsi-receipts/{rid}.json", "job/switches/tidy.py"]
    launch = _git("show", f"{out['branch']}:job/infrarsi-launch.txt", cwd=root).splitlines()
    assert launch[0].startswith(f"# infrarsi receipt {rid} (") and launch[1] == out["launch"]["shell"]
    assert "LAND_THREADS=2" in launch[1]  # the knob that earns part of the speedup travels with the code
    assert _git("show", f"{out['branch']}:job/switches/tidy.py", cwd=root) == "ON = True\n"
    message = _git("log", "-1", "--format=%B", out["branch"], cwd=root)
    assert f"InfraRSI-Receipt: {rid}" in message and f"{out['speedup']['median']:.3f}x" in message
    assert "threads=2" in message and "LAND_THREADS=2 python train.py" in message
    # The bundle in the commit is the signed receipt itself (it verifies) plus the patch text.
    bundle = tmp_path / "bundle.json"
    bundle.write_text(_git("show", f"{out['branch']}:job/infrarsi-receipts/{rid}.json", cwd=root))
    done, check = _cli("receipt", "verify", str(bundle), "--json", cwd=root)
    assert done.returncode == 0 and check["ok"], check
    assert json.loads(bundle.read_text())["patch_texts"][0]["text"].endswith("+ON = True\n")
    assert json.loads(bundle.read_text())["receipt"]["launch"] == out["launch"]  # signed, in the receipt
    # Applying twice to the same branch name is a usage error, and nothing changes.
    done, out2 = _cli("apply", rid[:6], "--json", cwd=root)
    assert done.returncode == 2 and "already exists" in out2["error"]


def test_apply_to_a_patch_file_prints_the_launch_command(verified, tmp_path):
    root = _copy(verified, tmp_path)
    target = tmp_path / "winner.diff"
    done, out = _cli("apply", "--patch-file", str(target), "--json", cwd=root)
    assert done.returncode == 0, done.stderr
    assert out["branch"] is None and out["patch_file"] == str(target)
    # `mode` is a flag and `threads` an environment variable in this contract.
    assert out["launch"]["argv"] == ["python", "train.py", "--mode", "a"]
    assert out["launch"]["env"] == {"LAND_THREADS": "2"}
    assert out["launch"]["shell"] == "LAND_THREADS=2 python train.py --mode a"
    # The file is a patch git applies to the workspace as it is.
    command = shlex.split(out["apply_command"])
    assert command[0] == "git" and "--directory=job" in command  # the workspace is a folder of the repository
    subprocess.run(command, cwd=tmp_path, check=True)
    assert (root / "switches" / "tidy.py").read_text() == "ON = True\n"


def test_apply_refuses_a_forged_receipt_changed_protected_files_and_changed_code(verified, tmp_path):
    root = _copy(verified, tmp_path)
    receipt = Path(verified[1]["receipt"])
    forged = json.loads(receipt.read_text())
    forged["receipt"]["speedup"]["median"] = 5.0
    forged_path = tmp_path / "forged.json"
    forged_path.write_text(json.dumps(forged))
    done, out = _cli("apply", str(forged_path), "--json", cwd=root)
    assert done.returncode == 1 and "does not verify" in out["error"] and out["applied"] is False

    (root / "data" / "landscape.json").write_text((root / "data" / "landscape.json").read_text() + " ")
    done, out = _cli("apply", "--json", cwd=root)
    assert done.returncode == 1 and "data/landscape.json" in out["error"]
    _git("checkout", "--", "data/landscape.json", cwd=root)

    (root / "switches" / "tidy.py").write_text("ON = False\n# edited after the receipt\n")
    done, out = _cli("apply", "--json", cwd=root)
    assert done.returncode == 1 and "switches/tidy.py changed since" in out["error"]
    assert "infrarsi/" not in _git("branch", "--list", cwd=root)  # nothing was made


def test_apply_without_git_or_with_a_dirty_file_explains_itself(verified, tmp_path):
    root = _copy(verified, tmp_path)
    # HEAD moves on, while the working tree keeps the measured file: the branch (made from
    # HEAD) would not be what was measured.
    measured = (root / "switches" / "tidy.py").read_text()
    (root / "switches" / "tidy.py").write_text(measured + "# later\n")
    _git("commit", "-q", "-am", "later", cwd=root)
    (root / "switches" / "tidy.py").write_text(measured)
    done, out = _cli("apply", "--json", cwd=root)
    assert done.returncode == 2 and "switches/tidy.py differ from HEAD" in out["error"], out
    shutil.rmtree(root.parent / ".git")
    done, out = _cli("apply", "--branch", "x", "--json", cwd=root)
    assert done.returncode == 2 and "not in a git work tree" in out["error"]
    done, out = _cli("apply", "--json", cwd=root)  # outside git the default is a patch file
    assert done.returncode == 0 and out["patch_file"].endswith(".diff") and Path(out["patch_file"]).is_file()
    subprocess.run(shlex.split(out["apply_command"]), cwd=tmp_path, check=True)
    assert (root / "switches" / "tidy.py").read_text() == "ON = True\n"


def test_receipt_verify_pins_the_workspace_key_so_a_re_signed_forgery_fails(verified, tmp_path):
    from infrarsi.ledger import KeyPair, canonical_json, sha256_hex

    root = _copy(verified, tmp_path)
    genuine = Path(verified[1]["receipt"]).name
    # A self-consistent forgery: better speedup, re-signed with the forger's own key, id recomputed.
    data = json.loads((root / ".infrarsi" / "receipts" / genuine).read_text())
    body = data["receipt"]
    body["speedup"]["median"] = 4.0
    forger = KeyPair.generate()
    body["public_key"] = forger.public_hex
    forged = {
        "id": sha256_hex(canonical_json(body))[:16],
        "receipt": body,
        "signature": forger.sign(canonical_json(body)),
    }
    inside = root / ".infrarsi" / "receipts" / f"{forged['id']}.json"
    inside.write_text(json.dumps(forged))
    done, out = _cli("receipt", "verify", str(inside), "--json", cwd=root)
    assert done.returncode == 1 and out["key_source"] == "manifest"
    assert "signed by another key than the trusted one" in out["problems"]
    # Away from any workspace it checks only itself, and says so; --key pins one anywhere.
    outside = tmp_path / "loose.json"
    outside.write_text(inside.read_text())
    done, out = _cli("receipt", "verify", str(outside), "--json", cwd=root)
    assert done.returncode == 0 and out["key_source"] == "receipt"
    human = subprocess.run(
        CLI + ["receipt", "verify", str(outside)], cwd=root, capture_output=True, text=True, timeout=PATIENCE_S
    )
    assert human.returncode == 0 and "its own key only" in human.stdout
    manifest = json.loads((root / ".infrarsi" / "manifest.json").read_text())["manifest"]["public_key"]
    done, out = _cli("receipt", "verify", str(outside), "--key", manifest, "--json", cwd=root)
    assert done.returncode == 1 and out["key_source"] == "--key"
    done, out = _cli("receipt", "verify", str(outside), "--key", "nothex", "--json", cwd=root)
    assert done.returncode == 2 and "64 lowercase hex" in out["error"]
    # The genuine receipt still verifies against the pinned key.
    done, out = _cli("receipt", "verify", str(root / ".infrarsi" / "receipts" / genuine), "--json", cwd=root)
    assert done.returncode == 0 and out["ok"], out


def test_apply_carries_new_files_and_refuses_a_dirty_workspace(verified, tmp_path):
    root = _copy(verified, tmp_path)
    patch = tmp_path / "tidy-and-notes.diff"
    patch.write_text(
        (root / "patches" / "tidy.diff").read_text()
        + (
            "diff --git a/switches/notes.py b/switches/notes.py\n"
            "new file mode 100644\n"
            "--- /dev/null\n"
            "+++ b/switches/notes.py\n"
            "@@ -0,0 +1 @@\n"
            "+ON = False\n"
        )
    )
    done, out = _cli("verify", "--patch", str(patch), "--json", cwd=root)
    assert done.returncode == 0 and out["accepted"], (done.stderr, out)
    rid = Path(out["receipt"]).stem
    # Any tracked file changed in the workspace: the branch (made from HEAD) is not what was measured.
    (root / "README.txt").write_text("notes\n")
    _git("add", "README.txt", cwd=root)
    _git("commit", "-q", "-m", "readme", cwd=root)
    (root / "README.txt").write_text("notes, edited\n")
    done, out = _cli("apply", rid, "--json", cwd=root)
    assert done.returncode == 2 and "README.txt differ from HEAD" in out["error"], out
    _git("checkout", "--", "README.txt", cwd=root)
    # A patch that creates a file: the file is in the branch's one commit.
    done, out = _cli("apply", rid, "--branch", "with-notes", "--json", cwd=root)
    assert done.returncode == 0, (done.stderr, out)
    files = _git("diff", "--name-only", "main", "with-notes", cwd=root).split()
    assert sorted(files) == [
        "job/infrarsi-launch.txt",
        f"job/infrarsi-receipts/{rid}.json",
        "job/switches/notes.py",
        "job/switches/tidy.py",
    ]
    assert _git("show", "with-notes:job/switches/notes.py", cwd=root) == "ON = False\n"
    assert not (root / "switches" / "notes.py").exists()  # the checkout is left alone
