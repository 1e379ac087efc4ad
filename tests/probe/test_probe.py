"""The probe: receipts format, precision evidence it observes itself, no-op without a runner."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import os, sys
    import torch
    from infrarsi import probe
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    if os.environ.get("HALF") == "1":
        model = model.to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    p = probe.from_env()
    p.watch(model)
    steps = p.total_steps or 3
    p.meta(params=sum(t.numel() for t in model.parameters()), dtype="fp32")  # a declaration, not evidence
    for step in range(1, steps + 1):
        x = torch.randn(4, 8, dtype=next(model.parameters()).dtype)
        with p.step(step, tokens=4):
            if os.environ.get("AMP") == "1":
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = model(x).float().pow(2).mean()
            else:
                loss = model(x).float().pow(2).mean()
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step(); opt.zero_grad(set_to_none=True)
        p.log(step, loss=loss.item(), grad_norm=gn)
    p.close()
    print("done", steps)
""")


def run_script(tmp_path, **env):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    full_env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("INFRARSI_")}
    full_env.update(env)
    proc = subprocess.run([sys.executable, str(script)], env=full_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_receipts_have_every_field_per_step(tmp_path):
    out = tmp_path / "r.jsonl"
    run_script(tmp_path, INFRARSI_RECEIPTS=str(out), INFRARSI_STEPS="5")
    recs = records(out)
    assert recs[0]["type"] == "meta" and recs[-1]["type"] == "end"
    steps = [r for r in recs if r["type"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]  # INFRARSI_STEPS decides the length
    for prev, rec in zip(steps, steps[1:]):
        assert prev["t1_ns"] <= rec["t0_ns"]
    for rec in steps:
        assert rec["t0_ns"] < rec["t1_ns"]
        assert rec["tokens"] == 4
        assert isinstance(rec["loss"], float) and isinstance(rec["grad_norm"], float)
        assert rec["peak_mem_bytes"] > 10 * 2**20  # the process high-water mark on CPU
        assert rec["param_dtypes"] == ["float32"]
        assert rec["autocast"] == []
        assert rec["fp32_matmul"] == "highest"
    declared = [r for r in recs if r.get("declared")]
    assert declared[0]["declared"]["dtype"] == "fp32"


def test_autocast_inside_the_step_is_observed(tmp_path):
    out = tmp_path / "r.jsonl"
    run_script(tmp_path, INFRARSI_RECEIPTS=str(out), INFRARSI_STEPS="2", AMP="1")
    steps = [r for r in records(out) if r["type"] == "step"]
    assert all(r["autocast"] == ["cpu:bfloat16"] for r in steps)


def test_observed_dtypes_override_what_the_script_declares(tmp_path):
    out = tmp_path / "r.jsonl"
    run_script(tmp_path, INFRARSI_RECEIPTS=str(out), INFRARSI_STEPS="2", HALF="1")
    recs = records(out)
    steps = [r for r in recs if r["type"] == "step"]
    assert all(r["param_dtypes"] == ["bfloat16"] for r in steps)
    assert [r for r in recs if r.get("declared")][0]["declared"]["dtype"] == "fp32"  # the lie stays visible


def test_without_a_runner_the_probe_is_a_no_op(tmp_path):
    proc = run_script(tmp_path)
    assert "done 3" in proc.stdout
    assert not list(tmp_path.glob("*.jsonl"))


def test_importing_the_probe_loads_nothing_heavy():
    code = "import sys; from infrarsi import probe; print(sorted(m for m in ('torch','numpy','rich','sqlite_utils') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.strip() == "[]", proc.stderr


def test_nested_steps_are_refused(tmp_path):
    from infrarsi.probe import Probe

    p = Probe(str(tmp_path / "r.jsonl"))
    with pytest.raises(RuntimeError, match="cannot nest"):
        with p.step(1):
            with p.step(2):
                pass
    p.close()


def test_cuda_is_synchronized_at_both_ends_and_its_peak_is_reported(tmp_path, monkeypatch):
    # No GPU on this machine: torch.cuda's answers are stood in for, the probe is the real one.
    import time

    import torch

    from infrarsi import probe

    events = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: events.append(("sync", time.monotonic_ns())))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 3 * 2**30)
    out = tmp_path / "r.jsonl"
    p = probe.Probe(str(out), total_steps=2)
    for step in (1, 2):
        with p.step(step, tokens=8):
            events.append(("body", time.monotonic_ns()))
        p.log(step, loss=1.0, grad_norm=0.5)
    p.close()
    assert [name for name, _ in events] == ["sync", "body", "sync"] * 2
    steps = [r for r in records(out) if r["type"] == "step"]
    for i, rec in enumerate(steps):
        first_sync, body, last_sync = (stamp for _, stamp in events[3 * i:3 * i + 3])
        assert first_sync <= rec["t0_ns"] <= body <= last_sync <= rec["t1_ns"]
        assert rec["peak_mem_bytes"] == 3 * 2**30  # CUDA max allocated, not the process RSS


def test_cuda_first_initialised_inside_a_step_is_synchronized_from_then_on(tmp_path, monkeypatch):
    import torch

    from infrarsi import probe

    initialised, syncs = [False], []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialised[0])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: syncs.append(1))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 2**30)
    p = probe.Probe(str(tmp_path / "r.jsonl"), total_steps=3)
    with p.step(1):
        initialised[0] = True  # the script's first CUDA call happens in step 1
    assert len(syncs) == 1  # the end of step 1 already waits for the device
    with p.step(2):
        pass
    assert len(syncs) == 3
    p.close()


def test_the_high_water_mark_is_read_fresh_each_time():
    # In a fresh process: this one's high-water mark may already be above anything added here.
    code = textwrap.dedent("""
        from infrarsi.probe import _resident_high_water
        before = _resident_high_water()
        hoard = bytearray(96 * 2**20)
        for i in range(0, len(hoard), 4096):
            hoard[i] = 1
        after = _resident_high_water()
        with open("/proc/self/status") as handle:
            kernel = next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmHWM:"))
        print(before, after, kernel)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    before, after, kernel = map(int, proc.stdout.split())
    assert after - before >= 90 * 2**20
    assert abs(after - kernel) < 2**20


def test_a_large_parents_size_carried_across_exec_is_never_the_jobs_peak():
    # Linux starts a child's ru_maxrss at its parent's size: a 400 MB driver must not make
    # a 30 MB job read 400 MB, and once the job outgrows it the fast path takes over.
    child = textwrap.dedent("""
        import resource
        from infrarsi.probe import _resident_high_water, _vmhwm_kb
        carried = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        first = _resident_high_water()
        hoard = bytearray(600 * 2**20)
        for i in range(0, len(hoard), 4096):
            hoard[i] = 1
        grown = _resident_high_water()
        print(carried, first, grown, _vmhwm_kb() * 1024)
    """)
    parent = textwrap.dedent(f"""
        import subprocess, sys
        hoard = bytearray(400 * 2**20)
        for i in range(0, len(hoard), 4096):
            hoard[i] = 1
        sys.stdout.write(subprocess.run([sys.executable, "-c", {child!r}], capture_output=True, text=True,
                                        check=True).stdout)
    """)
    proc = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    carried, first, grown, kernel = map(int, proc.stdout.split())
    assert carried > 400 * 2**20          # the kernel did carry the parent's size
    assert first < 200 * 2**20            # ...and the probe did not take it for the job's
    assert grown > 600 * 2**20 and abs(grown - kernel) < 2**20


def test_a_script_closing_the_probes_descriptor_costs_one_step_at_most():
    import os

    from infrarsi import probe

    probe._resident_high_water()
    os.close(probe._status_fd)  # e.g. a script that closes every descriptor it did not open
    probe._resident_high_water()  # this step falls back to getrusage
    with open("/proc/self/status") as handle:
        kernel = next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmHWM:"))
    assert abs(probe._resident_high_water() - kernel) < 2**20
