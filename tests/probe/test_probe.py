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
    if os.environ.get("NO_WATCH") != "1":
        p.watch(model)
    steps = p.total_steps or 3
    p.meta(params=sum(t.numel() for t in model.parameters()), dtype="fp32")  # a declaration, not evidence
    start = int(os.environ.get("START", "1"))  # a loop may count from 0
    for step in range(start, start + steps):
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


@pytest.mark.parametrize("start", [0, 1])
def test_a_loop_counting_from_0_or_1_gives_receipts_counting_from_1(tmp_path, start):
    out = tmp_path / "r.jsonl"
    run_script(tmp_path, INFRARSI_RECEIPTS=str(out), INFRARSI_STEPS="4", INFRARSI_SAMPLE="1,3", START=str(start))
    recs = records(out)
    steps = [r for r in recs if r["type"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert all(r["t0_ns"] is not None and r["loss"] is not None for r in steps)  # log() met its step()
    assert [r["counted_from"] for r in recs if "counted_from" in r] == [start]
    # The sampled steps are the receipts' 1 and 3, whatever the loop called them.
    assert [r["step"] for r in steps if "ops" in r] == [1, 3]


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
    code = (
        "import sys; from infrarsi import probe; "
        "print(sorted(m for m in ('torch','numpy','rich','sqlite_utils') if m in sys.modules))"
    )
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
        first_sync, body, last_sync = (stamp for _, stamp in events[3 * i : 3 * i + 3])
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
    assert carried > 400 * 2**20  # the kernel did carry the parent's size
    assert first < 200 * 2**20  # ...and the probe did not take it for the job's
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


# -- the runner's sampled steps: operator dtypes, per-parameter gradients, fp32_precision ---------

SAMPLED_SCRIPT = textwrap.dedent("""
    import os, subprocess, sys
    import torch
    from infrarsi import probe
    torch.manual_seed(0)
    flags = set(os.environ.get("FLAGS", "").split(","))
    if "ieee" in flags:   # honest: plain fp32 through the newer API
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.fp32_precision = "ieee"
    if "mixed" in flags:  # backends that disagree: the legacy getter raises
        torch.backends.cuda.matmul.fp32_precision = "tf32"
    if "tf32" in flags:
        torch.backends.fp32_precision = "tf32"
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    unused = torch.nn.Linear(2, 2)   # in the optimizer, never in the loss: no gradient
    if "compile" in flags:
        forward = torch.compile(model, backend="eager")
    else:
        forward = model
    opt = torch.optim.SGD(list(model.parameters()) + list(unused.parameters()), lr=0.1)
    p = probe.from_env()
    p.watch(model)
    print("sample env:", os.environ.get("INFRARSI_SAMPLE"),
          subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('INFRARSI_SAMPLE'))"],
                         capture_output=True, text=True).stdout.strip())
    for step in range(1, p.total_steps + 1):
        x = torch.randn(4, 8)
        with p.step(step, tokens=4):
            if "cast" in flags:
                h = model[1](model[0](x)).to(getattr(torch, "bfloat" + "16"))
                loss = torch.nn.functional.linear(h, model[2].weight.to(h.dtype), model[2].bias.to(h.dtype))
                loss = loss.float().pow(2).mean()
            elif "late" not in flags:
                loss = forward(x).pow(2).mean()
        if "late" in flags:  # the work moved out of the region: still inside the window
            loss = forward(x).pow(2).mean()
        loss.backward()
        opt.step(); opt.zero_grad(set_to_none=True)
        p.log(step, loss=loss.item(), grad_norm=1.0)
    p.close()
""")


def sampled_run(tmp_path, sample="2,4", steps=5, flags=""):
    script = tmp_path / "sampled_job.py"
    script.write_text(SAMPLED_SCRIPT)
    out = tmp_path / "r.jsonl"
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("INFRARSI_")}
    env.update(INFRARSI_RECEIPTS=str(out), INFRARSI_STEPS=str(steps), INFRARSI_SAMPLE=sample, FLAGS=flags)
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc, {r["step"]: r for r in records(out) if r["type"] == "step"}


def test_sampled_steps_carry_operators_gradients_and_settings_and_others_do_not(tmp_path):
    proc, steps = sampled_run(tmp_path)
    assert "sample env: None None" in proc.stdout  # taken out of the job's environment and its children's
    for k, rec in steps.items():
        observed = {"ops", "grads", "grad_min_rows", "fp32_precision"} & set(rec)
        assert observed == ({"ops", "grads", "grad_min_rows", "fp32_precision"} if k in (2, 4) else set()), k
    rec = steps[2]
    # Forward (addmm) and backward (mm for the weight gradients) both seen, in the dtype they ran in.
    assert "addmm:float32" in rec["ops"] and "mm:float32" in rec["ops"]
    # Named from the watched model, else optimizer.group.index[shape]; no gradient: null.
    assert set(rec["grads"]) == {"0.weight", "0.bias", "2.weight", "2.bias", "0.0.4[2x2]", "0.0.5[2]"}
    assert rec["grads"]["0.0.4[2x2]"] is None and rec["grads"]["0.weight"] > 0
    assert set(rec["grad_min_rows"]) == {"0.weight", "2.weight"}
    assert 0 <= rec["grad_min_rows"]["0.weight"] <= rec["grads"]["0.weight"]  # a dead ReLU unit's row is 0
    assert rec["grad_min_rows"]["2.weight"] == pytest.approx(rec["grads"]["2.weight"], rel=1e-6)  # one row
    assert rec["fp32_precision"]["legacy_matmul"] == "highest" and "mkldnn.matmul" in rec["fp32_precision"]
    assert not any(key.startswith(("cuda", "cudnn")) for key in rec["fp32_precision"])  # CPU job


def test_every_step_is_observed_under_all(tmp_path):
    _, steps = sampled_run(tmp_path, sample="all", steps=3)
    assert all("ops" in rec and "grads" in rec for rec in steps.values())


def test_work_moved_outside_the_probes_region_is_still_observed(tmp_path):
    _, steps = sampled_run(tmp_path, flags="late")
    assert "addmm:float32" in steps[4]["ops"] and steps[4]["grads"]["2.weight"] > 0


def test_an_explicit_cast_and_the_math_it_feeds_are_observed(tmp_path):
    _, steps = sampled_run(tmp_path, flags="cast")
    ops = steps[2]["ops"]
    assert "_to_copy:bfloat16" in ops and "addmm:bfloat16" in ops and "addmm:float32" in ops


@pytest.mark.parametrize("flags", ["ieee", "mixed"])
def test_an_honest_job_using_the_fp32_precision_api_is_measured(tmp_path, flags):
    # torch.get_float32_matmul_precision() raises once the backends disagree ("mixed"): the probe
    # used to crash the job there.
    _, steps = sampled_run(tmp_path, flags=flags)
    assert all(rec["fp32_matmul"] == "highest" for rec in steps.values())  # CUDA's setting: not a CPU job's
    if flags == "ieee":
        assert steps[2]["fp32_precision"]["backends"] == "ieee"


def test_a_lowered_fp32_precision_is_recorded(tmp_path):
    _, steps = sampled_run(tmp_path, flags="tf32")
    assert steps[2]["fp32_precision"]["backends"] == "tf32" and steps[2]["fp32_precision"]["legacy_matmul"] == "high"
    assert all(rec["fp32_matmul"] == "high" for rec in steps.values())


def test_a_compiled_model_is_observed_eagerly_and_says_so(tmp_path):
    # Dynamo skips compiled frames under a dispatch mode: the sampled steps run the model eagerly.
    _, steps = sampled_run(tmp_path, flags="compile")
    assert "addmm:float32" in steps[4]["ops"]
    assert "compiled frames ran eagerly" in steps[4]["ops_note"]


def test_a_mode_the_job_pushes_inside_the_window_stays_on_the_stack():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

    from infrarsi.probe import Probe

    class Counting(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Counting.calls += 1
            return func(*args, **(kwargs or {}))

    import os
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        p = Probe(os.path.join(folder, "r.jsonl"), total_steps=3, sample=frozenset({2}))
        p.log(1, loss=1.0)  # the window for step 2 opens
        mine = Counting().__enter__()  # the job's own mode, entered inside it and kept open
        torch.ones(2) @ torch.ones(2)
        p.log(2, loss=1.0)  # the window closes under it
        assert _get_current_dispatch_mode() is mine
        mine.__exit__(None, None, None)
        assert _get_current_dispatch_mode() is None
        p.close()
        steps = {r["step"]: r for r in records(__import__("pathlib").Path(folder) / "r.jsonl") if r["type"] == "step"}
    assert steps[2]["ops"] == ["dot:float32"] and Counting.calls >= 1


def test_the_sample_plan_is_read_once_and_parsed_leniently():
    from infrarsi.probe import ALL_STEPS, _parse_plan

    assert _parse_plan("3,17") == frozenset({3, 17}) and _parse_plan(" all ") == ALL_STEPS
    assert _parse_plan("") is None and _parse_plan("x,0,-2") is None and _parse_plan("4,x") == frozenset({4})


@pytest.mark.parametrize("half, dtypes", [("0", ["float32"]), ("1", ["bfloat16"])])
def test_parameter_dtypes_without_watch_come_from_the_optimizers_that_step(tmp_path, half, dtypes):
    """DESIGN.md's example has no watch(): torch's global optimizer step hook gives the parameters."""
    out = tmp_path / "r.jsonl"
    run_script(tmp_path, INFRARSI_RECEIPTS=str(out), INFRARSI_STEPS="3", NO_WATCH="1", HALF=half)
    steps = [r for r in records(out) if r["type"] == "step"]
    assert [r["param_dtypes"] for r in steps] == [dtypes] * 3
