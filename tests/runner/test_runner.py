"""The runner with real subprocesses: every status, secrets, memory guard, tamper evidence."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from processes import gone_within

from infrarsi._hashing import hash_protected
from infrarsi.contract._candidate import resolve_candidate
from infrarsi.contract._contract import load_contract
from infrarsi.runner._executor import LocalExecutor, build_argv
from infrarsi.runner._receipts import parse_receipts


@pytest.fixture
def contract(toyjob):
    return load_contract(toyjob / "infrarsi.toml")


@pytest.fixture(scope="module")
def executor():
    return LocalExecutor()


def execute(executor, contract, sets=None, patches=None):
    pinned = hash_protected(contract.workspace, contract.protected_globs)
    return executor.run(contract, pinned, resolve_candidate(contract, sets or {}, patches or []))


def receipts_of(result):
    return parse_receipts(result.receipts.decode().splitlines())


def test_a_probe_loop_counting_from_0_is_measured(executor, toyjob):
    train = toyjob / "train.py"
    text = train.read_text()
    for old, new in (
        ("for step in range(1, steps + 1):", "for step in range(steps):"),
        ("p.log(step, loss=2.0 / step,", "p.log(step, loss=2.0 / (step + 1),"),
    ):
        assert old in text
        text = text.replace(old, new)
    train.write_text(text)
    result = execute(executor, load_contract(toyjob / "infrarsi.toml"))
    assert result.status == "ok" and result.step_time_s is not None, result.detail
    receipts = receipts_of(result)
    assert [r["step"] for r in receipts.steps] == list(range(1, 9))
    assert receipts.trajectory("loss", 8) == [2.0 / k for k in range(1, 9)]
    assert [m["counted_from"] for m in receipts.meta if "counted_from" in m] == [0]


def test_ok_run_has_complete_receipts_and_external_clock(executor, contract):
    result = execute(executor, contract)
    assert result.status == "ok", result.detail + result.stderr_tail
    receipts = receipts_of(result)
    assert [r["step"] for r in receipts.steps] == list(range(1, 9))
    assert result.step_time_s == pytest.approx(0.005, rel=0.8)
    assert result.peak_mem_mb and result.peak_mem_mb > 1
    assert result.device_s > 0 and result.device_s == result.wall_s
    arrivals = result.evidence["arrivals_ns"]
    lines = result.receipts.decode().splitlines()
    assert len(arrivals) == len(lines)
    # The runner's clock stamps each step line after the probe closed that step.
    for line, arrival in zip(lines, arrivals):
        rec = json.loads(line)
        if rec["type"] == "step":
            assert rec["t1_ns"] <= arrival
    assert arrivals == sorted(arrivals)
    guard = result.evidence["guard"]
    assert guard["samples"] >= 2
    # The longest wait between two memory samples is recorded (benchmarks/guard_interval.py times it).
    assert 0 < guard["max_gap_ms"] <= result.wall_s * 1000


def test_knobs_reach_the_job_as_flag_and_env(contract):
    argv, env = build_argv(contract, resolve_candidate(contract, {"mode": "crash", "speed": "fast"}))
    assert argv[0] == sys.executable  # "python" is the interpreter infrarsi runs under
    assert argv[1:] == ["train.py", "--mode", "crash"]
    assert env == {"TOY_SPEED": "fast"}


def test_secrets_never_reach_the_workload(executor, contract, monkeypatch):
    for name in (
        "OPENAI_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "GITHUB_TOKEN",
        "MY_SERVICE_TOKEN",
        "DB_PASSWORD",
        "HF_TOKEN",
        "SOME_SECRET",
        "INFRARSI_SIGNING_KEY",
        "TORCH_API_KEY",
    ):
        monkeypatch.setenv(name, "hunter2")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    result = execute(executor, contract, {"speed": "fast"})
    assert result.status == "ok"
    declared = receipts_of(result).declared()
    names = set(declared["env_names"])
    assert not names & {
        "OPENAI_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "GITHUB_TOKEN",
        "MY_SERVICE_TOKEN",
        "DB_PASSWORD",
        "HF_TOKEN",
        "SOME_SECRET",
        "INFRARSI_SIGNING_KEY",
        "TORCH_API_KEY",
    }
    assert {"INFRARSI_RECEIPTS", "INFRARSI_STEPS", "OMP_NUM_THREADS", "TOY_SPEED"} <= names
    assert declared["speed"] == "fast"
    assert declared["home"] != os.environ.get("HOME")


def test_crash_keeps_stderr_tail(executor, contract):
    result = execute(executor, contract, {"mode": "crash"})
    assert result.status == "crash"
    assert result.exit_code == 3
    assert "about to fail" in result.stderr_tail and "exit code 3" in result.detail
    assert result.device_s > 0


def test_timeout_kills_the_process_group(executor, toyjob):
    text = (toyjob / "infrarsi.toml").read_text().replace("timeout_s = 20", "timeout_s = 1.5")
    (toyjob / "infrarsi.toml").write_text(text)
    contract = load_contract(toyjob / "infrarsi.toml")
    result = execute(executor, contract, {"mode": "child-hang"})
    assert result.status == "timeout"
    assert 1.5 <= result.wall_s < 10
    assert "timeout" in result.detail
    assert result.device_s > 0
    # The job's own child went with it: the whole process group was killed.
    child = receipts_of(result).declared()["child_pid"]
    assert gone_within(child, 5.0), f"child {child} outlived the timeout"


def test_memory_guard_kills_and_records_a_lower_bound(executor, contract):
    result = execute(executor, contract, {"mode": "oom"})
    assert result.status == "oom", result.detail
    assert result.peak_mem_mb is None  # a lower bound, not a value
    assert "needs more than the limit of 400 MB" in result.detail
    assert result.evidence["guard"]["censored"] is True
    assert result.evidence["guard"]["peak_rss_bytes"] > 400 * 2**20
    # Killed long before the job could have allocated its whole hoard (8 x 64 MB = 512 MB > 400).
    assert result.wall_s < 15
    assert result.device_s > 0


def test_memory_guard_counts_the_whole_process_tree(executor, contract):
    # The job itself stays small; a child it starts hoards the memory.
    result = execute(executor, contract, {"mode": "child-oom"})
    assert result.status == "oom", result.detail + result.stderr_tail
    assert "needs more than the limit of 400 MB" in result.detail
    assert result.evidence["guard"]["peak_rss_bytes"] > 400 * 2**20
    child = receipts_of(result).declared()["child_pid"]
    assert gone_within(child, 5.0)


def test_the_sandbox_holds_no_infrarsi_folder(executor, contract):
    # .infrarsi/ holds the ledger and the signing key: the workload never sees it.
    secret = contract.workspace / ".infrarsi" / "keys" / "signing.key"
    secret.parent.mkdir(parents=True)
    secret.write_text("not for the workload")
    result = execute(executor, contract)
    assert result.status == "ok"
    declared = receipts_of(result).declared()
    assert declared["sees_infrarsi"] is False and declared["sees_train_py"] is True


def test_an_out_of_memory_error_the_job_raises_is_oom_not_crash(executor, contract):
    # What a CUDA job prints when the allocator gives up: no GPU here, so the toy job raises
    # torch's own OutOfMemoryError; the memory guard never fires (the job stays small).
    result = execute(executor, contract, {"mode": "cuda-oom"})
    assert result.status == "oom", result.detail + result.stderr_tail
    assert result.exit_code == 1
    assert "reported out of memory" in result.detail and "CUDA out of memory" in result.detail
    assert "needs more than the limit" not in result.detail  # the job's own report, not the guard's kill
    assert result.peak_mem_mb is None  # the job needed more than it had: no measured peak
    assert result.device_s > 0


def test_an_out_of_memory_error_the_job_caught_and_survived_is_ok(executor, contract):
    result = execute(executor, contract, {"mode": "cuda-oom-caught"})
    assert result.status == "ok", result.detail
    assert "CUDA out of memory" in result.stderr_tail and result.step_time_s is not None


def test_patch_that_does_not_apply_is_rejected_with_gits_message(executor, contract):
    result = execute(executor, contract, patches=["broken"])
    assert result.status == "rejected"
    # git's own words, kept in the evidence: which file and line it could not match.
    assert "error: patch failed: train.py:12" in result.evidence["rejected"]
    assert result.evidence["rejected"] in result.detail
    assert result.device_s == 0.0


def test_patch_applies_in_the_sandbox_only(executor, contract):
    before = (contract.workspace / "train.py").read_text()
    slow = execute(executor, contract)
    fast = execute(executor, contract, patches=["faster"])
    assert fast.status == "ok"
    assert fast.step_time_s < slow.step_time_s
    assert (contract.workspace / "train.py").read_text() == before
    assert set(fast.sources) == {"train.py"} and fast.sources["train.py"] == before.encode()


def test_protected_file_changed_at_run_time_is_recorded(executor, contract):
    result = execute(executor, contract, {"mode": "tamper"})
    integrity = result.evidence["integrity"]
    assert integrity["protected_changed_by_run"] == ["data/protected.txt"]
    assert integrity["protected_changed_before_run"] == []
    assert "changed at run time: data/protected.txt" in result.detail
    assert (contract.workspace / "data" / "protected.txt").read_text() == "pinned data\n"


DRIVER = """
import json, sys
from infrarsi.contract._candidate import resolve_candidate
from infrarsi.contract._contract import load_contract
from infrarsi._hashing import hash_protected
from infrarsi.runner._executor import LocalExecutor
contract = load_contract(sys.argv[1])
pinned = hash_protected(contract.workspace, contract.protected_globs)
result = LocalExecutor().run(contract, pinned, resolve_candidate(contract, {"mode": sys.argv[2]}, []))
print(json.dumps({"status": result.status, "detail": result.detail,
                  "changed": result.evidence["integrity"]["framework_changed"]}))
"""


def test_the_installed_framework_changed_at_run_time_is_recorded(tmp_path, contract):
    # infrarsi imported from a copy laid out as a regular install, so the job can change it
    # without touching this checkout; the job changes only a copy that carries the marker.
    import infrarsi

    source = Path(infrarsi.__file__).parent
    package = tmp_path / "site" / "infrarsi"
    shutil.copytree(source, package, ignore=shutil.ignore_patterns("__pycache__"))
    for sub in ("verifiers", "auditors", "ledger"):
        shutil.copytree(source.parent / sub, package / sub, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "COPY_FOR_TEST").write_text("")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}

    def drive(mode):  # run from tmp_path: with -c, the current folder (this checkout) is first on sys.path
        proc = subprocess.run(
            [sys.executable, "-c", DRIVER, str(contract.workspace / "infrarsi.toml"), mode],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    untouched = drive("ok")
    assert untouched["status"] == "ok" and untouched["changed"] == []
    tampered = drive("tamper-framework")
    assert tampered["changed"] == ["infrarsi/probe.py"]
    assert "changed at run time: infrarsi/infrarsi/probe.py" in tampered["detail"]
    assert (package / "probe.py").read_text().endswith("# changed by the workload\n")
    assert not (source / "probe.py").read_text().endswith("# changed by the workload\n")
