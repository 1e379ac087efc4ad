"""`infrarsi search --workers N` end to end: real executions of the cheap synthetic job, several in
flight at once (the landscape's contract says `timing_sensitive = false`: its job sleeps)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ledger_rows import evidence, rows

from infrarsi.examples.landscape import Landscape, make_workspace

# Beside other tests (the parallel pass): the jobs sleep (landscapes, `timing_sensitive = false`), so
# several at once and a promotion's A/B resolve on a busy machine.

CLI = [sys.executable, "-m", "infrarsi.cli"]
PATIENCE_S = 300


def _land(name: str, base_ms: float = 120.0) -> Landscape:
    return Landscape(
        name=name,
        patches=["a", "b"],
        knobs={"x": (["0", "1", "2"], "0"), "y": (["0", "1"], "0")},
        base_ms=base_ms,
        base_mb=40.0,
        limit_mb=400.0,
        noise=0.01,
        time={"x=1": 0.6, "x=2": 0.9, "y=1": 0.95, "+a": 0.8, "+b": 1.02, "x=1&+a": 0.9},
    )


def _cli(root: Path, *args: str):
    done = subprocess.run(CLI + list(args), cwd=root, capture_output=True, text=True, timeout=PATIENCE_S)
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    return done, (json.loads(last) if last.startswith("{") else None)


def _workspace(tmp_path: Path, land: Landscape) -> Path:
    root = make_workspace(tmp_path / land.name, land, ab_pairs=3)
    for verb in (["init"], ["baseline", "--runs", "3"]):
        done, _ = _cli(root, *verb, "--json")
        assert done.returncode == 0, done.stderr
    return root


def test_workers_are_refused_where_runs_side_by_side_would_time_each_other(tmp_path):
    root = _workspace(tmp_path, _land("sensitive", base_ms=60.0))
    contract = root / "infrarsi.toml"
    contract.write_text(contract.read_text().replace("timing_sensitive = false", "timing_sensitive = true"))
    assert _cli(root, "init", "--update")[0].returncode == 0
    before = len(rows(root))
    done, out = _cli(root, "search", "--workers", "2", "--json")
    assert done.returncode == 2, done.stderr
    assert "timing_sensitive = false" in out["error"] and "slurm" in out["error"]
    assert len(rows(root)) == before  # nothing ran
    done, out = _cli(root, "search", "--workers", "0", "--json")
    assert done.returncode == 2 and "expected 1 or more" in out["error"]
    # One worker is always allowed; --devices then gives that worker (every run) its GPUs.
    done, out = _cli(root, "search", "--workers", "1", "--devices", "5", "--budget", "9", "--json")
    assert done.returncode in (0, 1), done.stderr
    searched = [r for r in rows(root)[before:]]
    assert searched and all(evidence(root, r).get("devices") == "5" for r in searched), searched


def test_a_kill_with_workers_in_flight_resumes_without_losing_or_repeating(tmp_path):
    root = _workspace(tmp_path, _land("killed", base_ms=250.0))
    proc = subprocess.Popen(
        CLI + ["search", "--workers", "3", "--budget", "16", "--devices", "0,1,2", "--json"],
        cwd=root,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    journals = root / ".infrarsi" / "search"
    deadline = time.monotonic() + PATIENCE_S
    while not (
        sum(1 for r in rows(root) if r["kind"] == "search") >= 3 and len(list(journals.glob("*.inflight*.json"))) >= 2
    ):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = rows(root)
    in_flight = [json.loads(p.read_text()) for p in journals.glob("*.inflight*.json")]
    unrecorded = [
        e
        for e in in_flight
        if not any(r["id"] > e["rows_before"] and json.loads(r["knobs"]) == e["knobs"] for r in before)
    ]

    done, out = _cli(root, "search", "--resume", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    after = rows(root)
    assert after[: len(before)] == before  # nothing recorded before the kill changed
    cut = [r for r in after[len(before) :] if r["status"] == "crash" and r["detail"].startswith("interrupted")]
    assert len(cut) == len(unrecorded) >= 1, (in_flight, cut)
    explored = [
        (r["knobs"], r["patches"]) for r in after if r["kind"] == "search" and not r["detail"].startswith("interrupted")
    ]
    assert len(explored) == len(set(explored)), explored
    assert out["executions"] <= 16 and not list(journals.glob("*.inflight*.json"))
    # Each worker had GPUs of its own (--devices, kept by the resume): runs that overlapped never shared one.
    spans = [
        (seen["started_ns"], seen["ended_ns"], seen["devices"])
        for seen in (evidence(root, r) for r in after if r["kind"] == "search" and r["status"] != "rejected")
        if "started_ns" in seen
    ]
    assert len(spans) >= 3 and {d for *_, d in spans} <= {"0", "1", "2"}, spans
    overlapping = [(a, b) for i, a in enumerate(spans) for b in spans[i + 1 :] if a[0] < b[1] and b[0] < a[1]]
    assert overlapping and all(a[2] != b[2] for a, b in overlapping), overlapping
    audit, report = _cli(root, "audit", str(root / ".infrarsi" / "ledger.db"), "--json")
    assert audit.returncode == 0 and report["chain_ok"], audit.stdout[-2000:]
