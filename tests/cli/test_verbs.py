"""`init`, `baseline` and `run` through the real command line, checked against the files and ledger they leave."""

from __future__ import annotations

import hashlib
import json
import stat
import subprocess

import pytest
from cli_testing import PATIENCE_S, argv, cli_env, executions, file_sha256, ledger_state

from infrarsi import run as run_in_process
from infrarsi._manifest import load_manifest
from infrarsi.ledger import Ledger

RUN_KEYS = {"execution", "status", "step_time_s", "peak_mem_mb"}


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# -- init ------------------------------------------------------------------------------------


def test_init_creates_ledger_key_and_signed_manifest(cli, toyjob):
    done = cli("init", "--json")
    assert done.rc == 0, done
    out = done.json()
    state = toyjob / ".infrarsi"
    assert out["state_dir"] == str(state) and out["archived"] is None
    assert out["ledger"] == str(state / "ledger.db") and out["manifest"] == str(state / "manifest.json")

    key_file = state / "keys" / "signing.key"
    assert key_file.is_file() and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    public = (state / "keys" / "signing.pub").read_text().strip()

    manifest = load_manifest(state / "manifest.json")  # raises unless the signature verifies
    assert manifest.verifies() and manifest.public_key == public
    assert manifest.sha256 == out["manifest_sha256"]
    expected = {
        rel: hashlib.sha256((toyjob / rel).read_bytes()).hexdigest() for rel in ("data/protected.txt", "infrarsi.toml")
    }
    assert manifest.files == expected == out["pinned"]

    with Ledger.open(state / "ledger.db") as ledger:
        assert ledger.public_key == public
        assert ledger.count() == 0
        assert ledger.get_meta("manifest_sha256") == manifest.sha256
        assert ledger.verify_chain(trusted_public_hex=public).ok


def test_git_add_all_after_init_stages_no_private_key(cli, toyjob):
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=toyjob, capture_output=True, text=True, check=True).stdout

    git("init", "--quiet")
    assert cli("init").rc == 0
    git("add", "-A")
    staged = git("diff", "--cached", "--name-only").split()
    assert "infrarsi.toml" in staged  # the contract is committed, as it should be
    assert not [path for path in staged if path.startswith(".infrarsi/")], staged
    # A .gitignore the user already had is kept, with the keys added when it let them through.
    git("rm", "-r", "--cached", "--quiet", ".")
    ignore = toyjob / ".infrarsi" / ".gitignore"
    ignore.write_text("receipts/")
    assert cli("init", "--force").rc == 0
    assert ignore.read_text() == "receipts/\nkeys/\n"
    git("add", "-A")
    assert not [p for p in git("diff", "--cached", "--name-only").split() if p.startswith(".infrarsi/keys")]


def test_init_human_output_names_what_it_made(cli, toyjob):
    done = cli("init")
    assert done.rc == 0, done
    assert "initialised" in done.stdout and "ledger.db" in done.stdout and "infrarsi baseline" in done.stdout


def test_second_init_refuses_and_leaves_the_state_untouched(cli, workspace):
    run_in_process(workspace / "infrarsi.toml")
    state = workspace / ".infrarsi"
    files = ["ledger.db", "manifest.json", "keys/signing.key", "keys/signing.pub"]
    before = {name: file_sha256(state / name) for name in files}
    rows = ledger_state(workspace)

    done = cli("init", "--json")
    assert done.rc == 2, done
    assert "already exists" in done.stderr and "--force" in done.stderr
    assert "Traceback" not in done.stderr
    assert {name: file_sha256(state / name) for name in files} == before
    assert ledger_state(workspace) == rows and len(rows.rows) == 1
    assert not (state / "archive").exists()


def test_init_force_archives_the_old_state_whole(cli, workspace):
    run_in_process(workspace / "infrarsi.toml")
    state = workspace / ".infrarsi"
    old = ledger_state(workspace)
    old_public = (state / "keys" / "signing.pub").read_text()
    old_manifest = (state / "manifest.json").read_text()

    done = cli("init", "--force", "--json")
    assert done.rc == 0, done
    archived = done.json()["archived"]
    assert archived is not None
    archive = state / "archive"
    assert [p.name for p in archive.iterdir()] == [archived.rsplit("/", 1)[-1]]
    moved = archive / archived.rsplit("/", 1)[-1]
    assert (moved / "manifest.json").read_text() == old_manifest
    assert (moved / "keys" / "signing.pub").read_text() == old_public
    # The archived ledger still holds its executions and verifies against its own manifest's key.
    with Ledger.open(moved / "ledger.db") as ledger:
        rows = tuple((row["id"], row["row_hash"]) for row in ledger.executions())
        report = ledger.verify_chain(trusted_public_hex=json.loads(old_manifest)["manifest"]["public_key"])
    assert rows == old.rows and report.ok

    new = ledger_state(workspace)
    assert new.rows == () and new.chain_ok
    assert (state / "keys" / "signing.pub").read_text() != old_public
    # The fresh state is usable at once.
    done = cli("run", "--json")
    assert done.rc == 0 and done.json()["execution"] == 1, done


# -- baseline --------------------------------------------------------------------------------


def test_baseline_json_has_the_design_shape_and_records_every_run(cli, workspace):
    done = cli("baseline", "--runs", "2", "--json")
    assert done.rc == 0, done
    out = done.json()
    # The DESIGN.md keys, and what MFU was measured against.
    assert set(out) == {"runs", "step_time_s", "tokens_per_s", "peak_mem_mb", "mfu", "mfu_peak", "mfu_warning"}
    assert out["mfu_peak"] == {"tflops": 0.1, "source": "contract", "device": None, "precision": None}
    assert out["runs"] == 2 and not isinstance(out["runs"], bool)
    assert set(out["step_time_s"]) == {"median", "cv", "mad"}
    assert all(is_number(v) for v in out["step_time_s"].values())
    assert out["step_time_s"]["median"] > 0
    assert out["step_time_s"]["cv"] >= 0 and out["step_time_s"]["mad"] >= 0
    # The toy job declares tokens per step and flops per token, so none of these is unknown.
    for key in ("tokens_per_s", "peak_mem_mb", "mfu"):
        assert is_number(out[key]) and out[key] > 0, key

    rows = executions(workspace)
    # Two timed runs, then the reference run that observes every step closely (its timing unused).
    assert [(r["kind"], r["status"], r["seq"]) for r in rows] == [
        ("baseline", "ok", 0),
        ("baseline", "ok", 1),
        ("baseline", "ok", 2),
    ]
    assert rows[0]["batch"] == rows[1]["batch"] == rows[2]["batch"]
    assert rows[0]["knobs"] == {"mode": "ok", "speed": "normal"}
    state = ledger_state(workspace)
    assert state.chain_ok, state.chain_detail
    with Ledger.open(workspace / ".infrarsi" / "ledger.db") as ledger:
        stored = ledger.latest_baseline()
    assert stored["batch"] == rows[0]["batch"]
    assert stored["summary"]["executions"] == [1, 2] and stored["summary"]["reference_execution"] == 3
    assert stored["summary"]["step_time_s"] == out["step_time_s"]


def test_baseline_that_fails_exits_1_and_keeps_the_failed_run(cli, toyjob):
    contract = toyjob / "infrarsi.toml"
    contract.write_text(contract.read_text().replace('baseline = "ok"', 'baseline = "crash"'))
    assert cli("init").rc == 0

    done = cli("baseline", "--runs", "2", "--json")
    assert done.rc == 1, done
    out = done.json()
    assert out["runs"] == 0 and "crash" in out["error"]
    assert {k: out[k] for k in ("step_time_s", "tokens_per_s", "peak_mem_mb", "mfu")} == dict.fromkeys(
        ("step_time_s", "tokens_per_s", "peak_mem_mb", "mfu")
    )  # the DESIGN.md keys, null
    assert "baseline failed" in done.stderr and "crash" in done.stderr
    assert "Traceback" not in done.stderr
    rows = executions(toyjob)
    assert [(r["kind"], r["status"]) for r in rows] == [("baseline", "crash")]  # stopped at the first
    assert "about to fail" in rows[0]["stderr_tail"]
    with Ledger.open(toyjob / ".infrarsi" / "ledger.db") as ledger:
        assert ledger.latest_baseline() is None
    assert ledger_state(toyjob).chain_ok


# -- run -------------------------------------------------------------------------------------


def run_json(cli, *args, rc):
    done = cli("run", "--json", *args)
    assert done.rc == rc, done
    out = done.json()
    assert set(out) == RUN_KEYS
    assert isinstance(out["execution"], int)
    return out


def test_run_ok(cli, workspace):
    out = run_json(cli, rc=0)
    assert out["status"] == "ok"
    assert is_number(out["step_time_s"]) and out["step_time_s"] > 0
    assert is_number(out["peak_mem_mb"]) and out["peak_mem_mb"] > 0
    (row,) = executions(workspace)
    assert row["id"] == out["execution"] and row["kind"] == "run" and row["status"] == "ok"
    assert row["knobs"] == {"mode": "ok", "speed": "normal"} and row["patches"] == []
    assert row["step_time_s"] == out["step_time_s"] and row["peak_mem_mb"] == out["peak_mem_mb"]


def test_run_set_reaches_the_ledger_and_human_output(cli, workspace):
    done = cli("run", "--set", "speed=fast")
    assert done.rc == 0, done
    assert done.stdout.startswith("execution 1: ok")
    (row,) = executions(workspace)
    assert row["knobs"] == {"mode": "ok", "speed": "fast"}


def test_run_that_crashes_exits_1_with_its_stderr_kept(cli, workspace):
    out = run_json(cli, "--set", "mode=crash", rc=1)
    assert out["status"] == "crash" and out["step_time_s"] is None
    (row,) = executions(workspace)
    assert row["status"] == "crash" and row["exit_code"] == 3
    assert "about to fail" in row["stderr_tail"]


@pytest.mark.parametrize("ref, name", [("faster", "faster"), ("patches/faster.diff", "patches/faster.diff")])
def test_run_patch_by_name_or_file(cli, workspace, ref, name):
    out = run_json(cli, "--patch", ref, rc=0)
    assert out["status"] == "ok"
    (row,) = executions(workspace)
    text = (workspace / "patches" / "faster.diff").read_bytes()
    assert row["patches"] == [{"name": name, "sha256": hashlib.sha256(text).hexdigest()}]
    assert set(row["sources"]) == {"train.py"}


def test_run_patch_file_relative_to_the_workspace_from_another_folder(cli, workspace, tmp_path):
    out = run_json(
        cli,
        "--contract",
        str(workspace / "infrarsi.toml"),
        "--patch",
        "patches/faster.diff",
        "--set",
        "speed=fast",
        rc=0,
    )
    assert out["status"] == "ok"
    (row,) = executions(workspace)
    assert [p["name"] for p in row["patches"]] == ["patches/faster.diff"]
    assert row["knobs"]["speed"] == "fast"


def test_run_rejected_patch_exits_1_and_is_recorded(cli, workspace):
    out = run_json(cli, "--patch", "broken", rc=1)
    assert out == {"execution": 1, "status": "rejected", "step_time_s": None, "peak_mem_mb": None}
    (row,) = executions(workspace)
    assert row["status"] == "rejected" and row["device_s"] == 0.0
    assert "does not apply" in row["detail"]
    assert ledger_state(workspace).chain_ok


def test_concurrent_runs_both_commit_on_one_chain(workspace, sandbox_tmp):
    procs = [
        subprocess.Popen(
            argv("run", "--json"),
            cwd=workspace,
            env=cli_env(sandbox_tmp),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=PATIENCE_S) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    ids = sorted(json.loads(out)["execution"] for out, _ in outs)
    assert ids == [1, 2]
    state = ledger_state(workspace)
    assert state.chain_ok and [i for i, _ in state.rows] == [1, 2], state.chain_detail


def test_init_force_leaves_another_contracts_state_alone(cli, toyjob):
    (toyjob / "keys.toml").write_text((toyjob / "infrarsi.toml").read_text())
    assert cli("init").rc == 0
    assert cli("init", "--contract", "keys.toml").rc == 0
    assert cli("run", "--contract", "keys.toml", "--json").rc == 0
    assert cli("init", "--force").rc == 0
    done = cli("run", "--contract", "keys.toml", "--json")
    assert done.rc == 0, done
    assert done.json()["execution"] == 2
