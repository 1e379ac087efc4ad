"""evidence = "auto" and "log": an unmodified nanoGPT-style script measured through the real runner.

The end-to-end runs are module fixtures: each starts one real workload process,
and several tests read its evidence. The in-process tests drive
:class:`AutoProbe` on small loops for the cases a plain script does not reach
(several optimizers, a GradScaler skipping a step, nested backward, a failing hook).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from infrarsi._hashing import hash_protected
from infrarsi.autoprobe import AutoProbe
from infrarsi.contract._candidate import resolve_candidate
from infrarsi.contract._contract import load_contract
from infrarsi.probe import Probe
from infrarsi.runner._executor import LocalExecutor, build_argv
from infrarsi.runner._receipts import parse_receipts

FIXTURE = Path(__file__).parents[1] / "fixtures" / "nanogpt_style.py"
WARMUP, MEASURE = 2, 4
TOTAL = WARMUP + MEASURE
ITER_LINE = re.compile(r"^iter (\d+): loss ([0-9.]+)")

CONTRACT = """\
[task]
name = "nanogpt-style"
command = {command}
timeout_s = 60
evidence = "{evidence}"

[scope]
editable = ["train.py"]

[timing]
warmup_steps = {warmup}
measure_steps = {measure}

[numerics]
require = ["loss", "grad_norm", "precision"]

[resources]
memory_limit_mb = 3000
peak_tflops = 0.1

[knobs.dtype]
flag = "--dtype"
choices = ["float32", "bfloat16"]
baseline = "float32"

[knobs.accum]
flag = "--gradient_accumulation_steps"
choices = ["1", "2"]
baseline = "1"
{extra}"""

LOG_TABLE = """
[evidence.log]
step = 'iter (\\d+):'
loss = 'loss ([0-9.]+)'
"""


def workspace(root: Path, evidence: str, *args: str, script: str | None = None) -> Path:
    root.mkdir(parents=True)
    if script is None:
        shutil.copy(FIXTURE, root / "train.py")
    else:
        (root / "train.py").write_text(textwrap.dedent(script))
    command = json.dumps(["python", "train.py", *args])
    (root / "infrarsi.toml").write_text(
        CONTRACT.format(
            command=command,
            evidence=evidence,
            warmup=WARMUP,
            measure=MEASURE,
            extra=LOG_TABLE if evidence == "log" else "",
        )
    )
    return root


def execute(root: Path, **knobs: str):
    contract = load_contract(root / "infrarsi.toml")
    pinned = hash_protected(contract.workspace, contract.protected_globs)
    return LocalExecutor().run(contract, pinned, resolve_candidate(contract, knobs, []))


def steps_of(result) -> list[dict]:
    return parse_receipts(result.receipts.decode().splitlines()).steps


@pytest.fixture(scope="module")
def auto_fp32(tmp_path_factory):
    # The script would train for 2000 iterations; the runner asks for TOTAL.
    return execute(workspace(tmp_path_factory.mktemp("auto") / "ws", "auto"))


@pytest.fixture(scope="module")
def auto_bf16_accum(tmp_path_factory):
    return execute(workspace(tmp_path_factory.mktemp("amp") / "ws", "auto"), dtype="bfloat16", accum="2")


@pytest.fixture(scope="module")
def log_run(tmp_path_factory):
    # Log mode cannot stop the job: it is told to train TOTAL iterations (nanoGPT counts 0..max_iters).
    return execute(workspace(tmp_path_factory.mktemp("log") / "ws", "log", f"--max_iters={TOTAL - 1}"))


def printed_losses(result) -> list[float]:
    return [float(m.group(2)) for _, text in result.evidence["stdout"] if (m := ITER_LINE.match(text))]


# -- evidence = "auto" -----------------------------------------------------------------
def test_auto_records_every_step_of_an_unmodified_script(auto_fp32):
    assert auto_fp32.status == "ok", auto_fp32.detail + auto_fp32.stderr_tail
    assert auto_fp32.exit_code == 0
    steps = steps_of(auto_fp32)
    assert [r["step"] for r in steps] == list(range(1, TOTAL + 1))
    assert auto_fp32.step_time_s is not None and auto_fp32.step_time_s > 0
    for rec in steps:
        assert rec["t0_ns"] < rec["t1_ns"]
        assert rec["tokens"] == 8 * 16  # batch x block, counted from the inputs
        assert rec["extra"]["backward_calls"] == 1
        assert rec["peak_mem_bytes"] > 0
    # Steps tile the run: each starts right after the previous one ended.
    for before, after in zip(steps, steps[1:]):
        assert 0 <= after["t0_ns"] - before["t1_ns"] < 50_000_000


def test_auto_losses_are_the_values_the_script_printed(auto_fp32, log_run):
    # The log run is the same script with nothing wrapped: what it printed is what it computed.
    assert log_run.status == "ok", log_run.detail + log_run.stderr_tail
    printed = printed_losses(log_run)
    assert len(printed) == TOTAL
    recorded = [r["loss"] for r in steps_of(auto_fp32)]
    assert recorded == pytest.approx(printed, abs=2e-6)


def test_auto_records_grad_norm_dtypes_and_no_autocast(auto_fp32):
    for rec in steps_of(auto_fp32):
        assert isinstance(rec["grad_norm"], float) and 0 < rec["grad_norm"] < 100
        assert rec["param_dtypes"] == ["float32"]
        assert rec["autocast"] == []
        assert rec["fp32_matmul"] == "highest"


def test_auto_counts_tokens_from_the_integer_inputs_of_training_forwards(auto_fp32, auto_bf16_accum):
    """batch_size 8 x block_size 16 per forward; with accumulation 2, two forwards a step. The
    evaluation at iteration 0 runs without grad and is not counted."""
    assert [r["tokens"] for r in steps_of(auto_fp32)] == [8 * 16] * TOTAL
    assert [r["tokens"] for r in steps_of(auto_bf16_accum)] == [2 * 8 * 16] * TOTAL
    declared = parse_receipts(auto_fp32.receipts.decode().splitlines()).declared()
    assert declared["flops_per_token_estimate"] > 0 and "flops_per_token" not in declared


def test_tokens_given_only_as_keyword_inputs_are_counted_from_the_second_step(recorder):
    """HF-style ``model(input_ids=...)``: the global hook that starts step 1 sees no keywords, so
    step 1 is left uncounted rather than guessed; a float-only input is never a token count."""

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = torch.nn.Embedding(50, 8), torch.nn.Linear(8, 50)

        def forward(self, input_ids=None):
            return self.head(self.emb(input_ids))

    torch.manual_seed(0)
    model = LM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    recorder["start"]()
    for _ in range(3):
        ids = torch.randint(0, 50, (4, 6))
        out = model(input_ids=ids)
        torch.nn.functional.cross_entropy(out.view(-1, 50), ids.view(-1)).backward()
        opt.step()
        opt.zero_grad()
    assert [r["tokens"] for r in recorder["records"]()] == [None, 24, 24]
    model2, x, y = model_and_data()
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.1)
    recorder["auto"].uninstall()
    recorder["start"]()
    for _ in range(2):
        torch.nn.functional.mse_loss(model2(x), y).backward()
        opt2.step()
        opt2.zero_grad()
    assert all(r["tokens"] is None for r in recorder["records"]()[3:])


def test_auto_observes_the_runners_sampled_steps(auto_fp32, auto_bf16_accum):
    sampled = auto_fp32.evidence["sampled_steps"]
    assert len(sampled) == 2 and all(2 <= k <= TOTAL for k in sampled)
    for rec in steps_of(auto_fp32):
        assert ("ops" in rec and "grads" in rec) == (rec["step"] in sampled), rec["step"]
        if rec["step"] in sampled:
            assert "addmm:float32" in rec["ops"] and not [op for op in rec["ops"] if "float32" not in op]
            # Named from the model the script called, as model.named_parameters() names them.
            assert {"wte.weight", "h.0.attn.in_proj_weight", "lm_head.weight"} <= set(rec["grads"])
            assert all(v is None or v > 0 for v in rec["grads"].values())
    bf16 = [r for r in steps_of(auto_bf16_accum) if r["step"] in auto_bf16_accum.evidence["sampled_steps"]]
    assert bf16 and all("addmm:bfloat16" in r["ops"] or "mm:bfloat16" in r["ops"] for r in bf16)


def test_auto_measures_a_script_that_sets_fp32_precision(tmp_path):
    # The backends disagree, so torch.get_float32_matmul_precision() raises: the autoprobe
    # used to lose every receipt after the first step there.
    script = FIXTURE.read_text().replace(
        "import torch\n",
        "import torch\ntorch.backends.cuda.matmul.fp32_precision = 'tf32'\ntorch.backends.fp32_precision = 'ieee'\n",
        1,
    )
    assert script != FIXTURE.read_text()
    root = workspace(tmp_path / "ws", "auto", script=script)
    result = execute(root)
    assert result.status == "ok", result.detail + result.stderr_tail
    steps = steps_of(result)
    assert [r["step"] for r in steps] == list(range(1, TOTAL + 1))
    assert all(r["fp32_matmul"] == "highest" for r in steps)
    assert "adapter_error" not in result.receipts.decode()


def test_auto_stops_the_job_after_the_steps_it_needs(auto_fp32):
    receipts = parse_receipts(auto_fp32.receipts.decode().splitlines())
    assert receipts.ended
    adapter = [m for m in receipts.meta if m.get("adapter") == "autoprobe"]
    assert adapter and "sum" in adapter[0]["loss"]
    # Parameter count, the iter-0 eval, then one line per step: iteration TOTAL never printed.
    assert auto_fp32.evidence["stdout_lines"] == TOTAL + 2
    assert auto_fp32.wall_s < 30


def test_auto_sees_autocast_and_sums_accumulated_losses(auto_bf16_accum):
    result = auto_bf16_accum
    assert result.status == "ok", result.detail + result.stderr_tail
    assert result.evidence["argv"][-4:] == ["--dtype", "bfloat16", "--gradient_accumulation_steps", "2"]
    steps = steps_of(result)
    assert [r["step"] for r in steps] == list(range(1, TOTAL + 1))
    for rec in steps:
        assert rec["autocast"] == ["cpu:bfloat16"]
        assert rec["param_dtypes"] == ["float32"]  # autocast keeps the weights in float32
        assert rec["extra"]["backward_calls"] == 2
        # Each micro-loss is divided by 2 before backward(): their sum is the step's loss,
        # near ln(32) for a fresh 32-token model (a mean would be half of it).
        assert 3.0 < rec["loss"] < 4.0
        assert rec["grad_norm"] > 0


_PROBED = """
import torch
from infrarsi import probe

p = probe.from_env()
steps = p.total_steps or 100
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(8, 4), torch.randn(8, 1)
for step in range(1, steps + 1):
    with p.step(step, tokens=8):
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    p.log(step, loss=loss.item(), grad_norm=gn.item())
p.close()
print("steps", steps)
"""


def test_auto_on_a_script_that_also_uses_the_probe_records_each_step_once(tmp_path):
    result = execute(workspace(tmp_path / "ws", "auto", script=_PROBED))
    assert result.status == "ok", result.stderr_tail
    assert [r["step"] for r in steps_of(result)] == list(range(1, TOTAL + 1))  # once each, not twice


def test_a_script_failing_part_way_is_a_crash_with_the_steps_before_it(tmp_path):
    result = execute(workspace(tmp_path / "ws", "auto", "--crash_at=3"))
    assert result.status == "crash"
    assert result.exit_code == 1
    assert "RuntimeError: diverged at iter 3" in result.stderr_tail
    assert "Traceback" in result.stderr_tail
    receipts = parse_receipts(result.receipts.decode().splitlines())
    assert [r["step"] for r in receipts.steps] == [1, 2, 3]
    assert not receipts.ended


# -- evidence = "log" ------------------------------------------------------------------
def test_log_mode_times_steps_with_the_runners_clock(log_run):
    steps = steps_of(log_run)
    assert [r["step"] for r in steps] == list(range(1, TOTAL + 1))  # iter 0 is step 1
    assert [r["extra"]["log_step"] for r in steps] == list(range(TOTAL))
    assert all(r["clock"] == "runner" for r in steps)
    assert steps[0]["t0_ns"] == log_run.evidence["started_ns"]
    stamps = {text: stamp for stamp, text in log_run.evidence["stdout"]}
    for rec, loss in zip(steps, printed_losses(log_run)):
        assert rec["loss"] == loss
        assert rec["grad_norm"] is None  # the script never prints one
        assert rec["t1_ns"] in stamps.values()
    assert log_run.step_time_s is not None
    assert log_run.evidence["arrivals_ns"] == [r["t1_ns"] for r in steps]


# -- the command line --------------------------------------------------------------------
def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("INFRARSI_")}


def autoprobe(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "infrarsi.autoprobe", *args],
        cwd=cwd,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_without_a_runner_the_script_runs_unchanged(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "helper.py").write_text("GREETING = 'hello from a sibling module'\n")
    (job / "main.py").write_text(
        textwrap.dedent("""
        import sys
        from helper import GREETING
        print(GREETING, sys.argv, __name__, 'torch' in sys.modules)
        raise SystemExit(int(sys.argv[-1]))
    """)
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = autoprobe("../job/main.py", "--flag", "4", cwd=elsewhere)
    assert done.returncode == 4, done.stderr
    assert done.stdout.strip() == "hello from a sibling module ['../job/main.py', '--flag', '4'] __main__ False"


def test_bad_usage_exits_2(tmp_path):
    done = autoprobe(cwd=tmp_path)
    assert done.returncode == 2 and "usage: python -m infrarsi.autoprobe SCRIPT" in done.stderr
    done = autoprobe("missing.py", cwd=tmp_path)
    assert done.returncode == 2 and "can't open file 'missing.py'" in done.stderr


# -- in process: loops a plain script does not reach ---------------------------------------
@pytest.fixture
def recorder(tmp_path):
    """``start(total)`` installs an AutoProbe writing to a file; ``records()`` reads it back."""
    path = tmp_path / "receipts.jsonl"
    state: dict = {"done": 0}

    def on_done():
        state["done"] += 1

    def start(total=None):
        state["auto"] = AutoProbe(Probe(str(path), total_steps=total), total, on_done=on_done).install(torch)
        return state["auto"]

    def records(kind="step"):
        return [r for r in map(json.loads, path.read_text().splitlines()) if r["type"] == kind]

    state["start"], state["records"] = start, records
    originals = (torch.autograd.backward, torch.nn.utils.clip_grad_norm_, torch.amp.GradScaler.step)
    yield state
    if "auto" in state:
        state["auto"].uninstall()
    assert (torch.autograd.backward, torch.nn.utils.clip_grad_norm_, torch.amp.GradScaler.step) == originals


def model_and_data(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return model, torch.randn(16, 4), torch.randn(16, 1)


def test_two_optimizers_stepped_together_make_one_step(recorder):
    model, x, y = model_and_data()
    first = torch.optim.SGD(model[0].parameters(), lr=0.1)
    second = torch.optim.AdamW(model[2].parameters(), lr=0.01)
    recorder["start"]()
    for _ in range(4):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        first.step()
        second.step()
        model.zero_grad(set_to_none=True)
    recs = recorder["records"]()
    # The first iteration ends at the first optimizer (nothing says a second one follows);
    # from then on each step ends at the second.
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    assert all(r["extra"]["backward_calls"] == 1 for r in recs)


def test_grad_norm_without_clipping_is_computed_before_the_step(recorder):
    model, x, y = model_and_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    recorder["start"]()
    expected = []
    for _ in range(3):
        torch.nn.functional.mse_loss(model(x), y).backward()
        expected.append(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()])).item())
        opt.step()
        opt.zero_grad()
    assert [r["grad_norm"] for r in recorder["records"]()] == pytest.approx(expected, rel=1e-5)


def test_a_step_the_grad_scaler_skips_still_ends_a_step_with_the_unscaled_loss(recorder):
    model, x, y = model_and_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    recorder["start"]()
    losses = []
    for i in range(3):
        loss = torch.nn.functional.mse_loss(model(x), y)
        losses.append(loss.item())
        scaler.scale(loss).backward()
        if i == 1:
            next(model.parameters()).grad[0, 0] = float("inf")
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    recs = recorder["records"]()
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert [r["loss"] for r in recs] == pytest.approx(losses)  # not 1024 times larger
    assert "skipped" in recs[1]["extra"] and "skipped" not in recs[0]["extra"]
    assert recs[1]["grad_norm"] == float("inf")


def test_a_norm_given_to_clip_grads_with_norm_is_the_grad_norm(recorder):
    model, x, y = model_and_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    recorder["start"]()
    expected = []
    for _ in range(2):
        torch.nn.functional.mse_loss(model(x), y).backward()
        norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
        torch.nn.utils.clip_grads_with_norm_(model.parameters(), 0.1, norm * 2)
        expected.append(2 * norm.item())
        opt.step()
        opt.zero_grad()
    assert [r["grad_norm"] for r in recorder["records"]()] == pytest.approx(expected)


def test_backward_inside_backward_is_not_a_loss(recorder):
    from torch.utils.checkpoint import checkpoint

    model, x, y = model_and_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    recorder["start"]()
    for _ in range(2):
        # Reentrant checkpointing calls torch.autograd.backward again during the backward pass.
        out = checkpoint(model, x.requires_grad_(), use_reentrant=True)
        torch.nn.functional.mse_loss(out, y).backward()
        opt.step()
        opt.zero_grad()
    assert [r["extra"]["backward_calls"] for r in recorder["records"]()] == [1, 1]


def test_after_the_last_step_it_leaves_at_the_next_training_call(recorder):
    model, x, y = model_and_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    auto = recorder["start"](total=2)
    for i in range(2):
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    assert auto.done and recorder["done"] == 0  # the script may still print its log line
    assert len(recorder["records"]("end")) == 1
    model(x)
    assert recorder["done"] >= 1
    assert len(recorder["records"]()) == 2


def test_a_failing_hook_stops_recording_but_never_the_training(recorder, capfd):
    model, x, y = model_and_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    auto = recorder["start"]()

    def broken(record):
        raise OSError("disk full")

    auto.probe._write_step = broken
    for _ in range(3):
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    assert auto.broken
    assert "stopped recording receipts: OSError: disk full" in capfd.readouterr().err
    assert recorder["records"]() == []
    assert any("disk full" in m.get("adapter_error", "") for m in recorder["records"]("meta"))


def test_auto_keeps_the_interpreters_own_options_before_the_script(tmp_path):
    root = workspace(tmp_path / "ws", "auto")
    contract = root / "infrarsi.toml"
    contract.write_text(
        contract.read_text().replace('["python", "train.py"]', '["python", "-u", "-W", "ignore", "train.py"]')
    )
    argv, _ = build_argv(load_contract(contract), resolve_candidate(load_contract(contract), {}, []))
    assert argv[1:7] == ["-u", "-W", "ignore", "-m", "infrarsi.autoprobe", "train.py"]
    result = execute(root)
    assert result.status == "ok", result.detail + result.stderr_tail
    assert [r["step"] for r in steps_of(result)] == list(range(1, TOTAL + 1))


def test_baseline_tokens_come_from_the_receipts_else_the_contract(auto_fp32, log_run):
    from infrarsi._baseline import summarise

    counted = summarise([auto_fp32], [1], WARMUP, MEASURE, 0.1, tokens_per_step=999)
    assert counted.tokens_source == "receipts" and counted.tokens_per_step == 8 * 16
    assert counted.tokens_per_s == pytest.approx(128 / auto_fp32.step_time_s)
    assert counted.mfu and counted.mfu > 0  # from the autoprobe's 6 x parameters estimate
    from_contract = summarise([log_run], [1], WARMUP, MEASURE, 0.1, tokens_per_step=128)
    assert from_contract.tokens_source == "contract" and from_contract.tokens_per_step == 128
    assert from_contract.tokens_per_s == pytest.approx(128 / log_run.step_time_s)
    unknown = summarise([log_run], [1], WARMUP, MEASURE, 0.1)
    assert unknown.tokens_source is None and unknown.tokens_per_s is None and unknown.mfu is None


def test_tokens_the_contract_states_are_not_held_against_a_candidate(log_run):
    """timing.window compares a candidate's counted tokens with the baseline's; a count that only
    the contract states (the receipts have none) is not evidence to compare with."""
    from infrarsi._baseline import summarise
    from infrarsi.verifiers import BaselineReference

    stated = summarise([log_run], [1], WARMUP, MEASURE, 0.1, tokens_per_step=128).as_record()
    assert BaselineReference.from_summary(stated).tokens_per_step is None
    assert BaselineReference.from_summary({**stated, "tokens_source": "receipts"}).tokens_per_step == 128


def test_the_autoprobe_hooks_resolve_their_globals_by_module_name_as_torch_compile_does(tmp_path):
    """Under `python -m infrarsi.autoprobe` the script is __main__: a hook whose module name is
    __main__ would have torch.compile's tracer look its globals up in the script
    (AttributeError: module '__main__' has no attribute 'weakref', found on a Trainer with
    --torch_compile). Every global hook the autoprobe installs must name its own module."""
    check = (
        "import sys\n"
        "from torch.nn.modules import module as _m\n"
        "for _hook in list(_m._global_forward_pre_hooks.values()):\n"
        "    _fn = getattr(_hook, '__func__', _hook)\n"
        "    _home = sys.modules[_fn.__module__]\n"
        "    if _fn.__globals__ is not vars(_home):\n"
        "        raise SystemExit(f'hook {_fn.__qualname__} claims module {_fn.__module__}')\n"
    )
    script = FIXTURE.read_text().replace('X, Y = get_batch("train")\n', check + 'X, Y = get_batch("train")\n', 1)
    assert script != FIXTURE.read_text()
    result = execute(workspace(tmp_path / "ws", "auto", script=script))
    assert result.status == "ok", result.detail + result.stderr_tail
