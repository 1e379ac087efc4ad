"""Contract parsing: every error names file, key and expectation; arbitrary TOML never tracebacks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from infrarsi import ContractError, load_contract
from infrarsi.contract._contract import parse_contract

GOOD = """\
[task]
name = "toy"
command = ["python", "train.py"]
timeout_s = 60

[scope]
editable = ["model.py", "train.py"]
protected = ["data/**", "eval.py"]

[timing]
warmup_steps = 2
measure_steps = 5

[numerics]
loss_rtol = 1e-3
precision = ["fp32"]

[resources]
memory_limit_mb = 2048
peak_tflops = 0.5

[knobs.attention]
flag = "--attention"
choices = ["manual", "sdpa"]
baseline = "manual"

[knobs.micro_batch]
flag = "--micro-batch"
choices = [4, 8]
baseline = 8

[knobs.compile]
env = "TOY_COMPILE"
choices = ["0", "1"]
baseline = "0"

[[patches]]
name = "fast"
file = "patches/fast.diff"
"""


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "fast.diff").write_text("--- a/model.py\n+++ b/model.py\n")
    (tmp_path / "model.py").write_text("")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.bin").write_bytes(b"\0")
    return tmp_path


def write(ws: Path, text: str) -> Path:
    path = ws / "infrarsi.toml"
    path.write_text(text)
    return path


def test_good_contract_parses_into_typed_objects(workspace):
    c = load_contract(write(workspace, GOOD))
    assert c.task.command == ("python", "train.py")
    assert c.task.evidence == "probe" and c.task.timeout_s == 60.0
    assert c.total_steps == 7
    assert c.knobs["micro_batch"].choices == ("4", "8") and c.knobs["micro_batch"].baseline == "8"
    assert c.knobs["compile"].env == "TOY_COMPILE" and c.knobs["compile"].flag is None
    assert c.patches[0].name == "fast" and c.patches[0].path.is_file()
    assert c.numerics.require == ("loss", "grad_norm", "precision")  # the default: all required
    assert c.search.ab_pairs == 5 and c.search.min_speedup == 1.02
    assert c.search.ab_max_pairs is None and c.ab_max_pairs == 5  # unset: one look at ab_pairs
    assert "infrarsi.toml" in c.protected_globs
    assert c.state_dir == workspace / ".infrarsi"
    assert c.baseline_knobs() == {"attention": "manual", "micro_batch": "8", "compile": "0"}


ERRORS = [
    # (replace this, with this, key named in the error, words expected in the message)
    ("timeout_s = 60", 'timeout_s = 60\ncolour = "red"', "task.colour", "unknown key"),
    ("[timing]", "[timings]\nx = 1\n[timing]", "timings", "unknown section"),
    ("timeout_s = 60", 'timeout_s = "60"', "task.timeout_s", "expected a finite number"),
    ("warmup_steps = 2", "warmup_steps = 2.5", "timing.warmup_steps", "expected an integer"),
    ("warmup_steps = 2", "warmup_steps = true", "timing.warmup_steps", "expected an integer"),
    ("measure_steps = 5", "measure_steps = 0", "timing.measure_steps", ">= 1"),
    ("timeout_s = 60", "timeout_s = -1", "task.timeout_s", "> 0"),
    ('baseline = "manual"', 'baseline = "flash"', "knobs.attention.baseline", "one of the choices"),
    ('flag = "--attention"', 'flag = "--attention"\nenv = "ATT"', "knobs.attention", "both"),
    ('flag = "--attention"\n', "", "knobs.attention", "neither"),
    ('env = "TOY_COMPILE"', 'env = "INFRARSI_STEPS"', "knobs.compile.env", "INFRARSI_"),
    ('flag = "--micro-batch"', 'flag = "--attention"', "knobs.micro_batch.flag", "already set"),
    ('choices = ["0", "1"]', "choices = []", "knobs.compile.choices", "non-empty"),
    ('choices = ["0", "1"]', 'choices = ["0", "0"]', "knobs.compile.choices", "distinct"),
    ('file = "patches/fast.diff"', 'file = "patches/missing.diff"', "patches.file", "no such file"),
    ('file = "patches/fast.diff"', 'file = "../outside.diff"', "patches.file", "leaves the workspace"),
    (
        'protected = ["data/**", "eval.py"]',
        'protected = ["data/**", "model.py"]',
        "scope.protected",
        "both editable and protected",
    ),
    ('protected = ["data/**", "eval.py"]', 'protected = ["*.py"]', "scope.protected", "can't be both"),
    ('editable = ["model.py", "train.py"]', 'editable = ["*.toml"]', "scope.editable", "always protected"),
    ('editable = ["model.py", "train.py"]', 'editable = ["/etc/passwd"]', "scope.editable", "absolute"),
    ('precision = ["fp32"]', 'precision = ["fp31"]', "numerics.precision", "one of fp32"),
    ("loss_rtol = 1e-3", 'loss_rtol = 1e-3\nrequire = ["loss", "vibes"]', "numerics.require", "one of loss"),
    ("memory_limit_mb = 2048\n", "", "resources.memory_limit_mb", "missing required key"),
    ("peak_tflops = 0.5", "peak_tflops = 0", "resources.peak_tflops", "expected a value > 0"),
    ('command = ["python", "train.py"]', "command = []", "task.command", "non-empty"),
    ('command = ["python", "train.py"]', 'command = "python train.py"', "task.command", "list of strings"),
    ("timeout_s = 60", 'timeout_s = 60\nevidence = "log"', "[evidence.log]", "needs an [evidence.log]"),
    ("timeout_s = 60", 'timeout_s = 60\nevidence = "magic"', "task.evidence", "one of probe"),
    (
        'baseline = "0"\n',
        'baseline = "0"\n[search]\nab_pairs = 6\nab_max_pairs = 5\n',
        "search.ab_max_pairs",
        "at least ab_pairs (6)",
    ),
    ('baseline = "0"\n', 'baseline = "0"\n[executor]\nsbatch = ["qos high"]\n', "executor.sbatch", "--key=value"),
    ('baseline = "0"\n', 'baseline = "0"\n[executor]\nkind = "k8s"\n', "executor.kind", "one of local, slurm"),
    ("timeout_s = 60", "timeout_s = 60\nnproc_per_node = 2", "task.nproc_per_node", "needs a launcher"),
    ("timeout_s = 60", 'timeout_s = 60\nlauncher = "mpirun"', "task.launcher", "one of none, torchrun"),
    ("timeout_s = 60", 'timeout_s = 60\nlauncher = "torchrun"\nnnodes = 2', "task.nnodes", 'kind = "slurm"'),
    (
        'command = ["python", "train.py"]',
        'command = ["python", "-u", "train.py"]\nlauncher = "torchrun"',
        "task.command",
        "torchrun starts the interpreter",
    ),
    (
        'file = "patches/fast.diff"',
        'file = "patches/fast.diff"\n[[patches]]\nname = "fast"\nfile = "patches/fast.diff"',
        "patches.name",
        "duplicate",
    ),
]


@pytest.mark.parametrize("old,new,key,words", ERRORS, ids=[e[2] + ":" + e[3] for e in ERRORS])
def test_every_contract_error_names_file_key_and_expectation(workspace, old, new, key, words):
    assert old in GOOD
    path = write(workspace, GOOD.replace(old, new, 1))
    with pytest.raises(ContractError) as info:
        load_contract(path)
    message = str(info.value)
    assert str(path) in message
    assert key in message, message
    assert words in message, message


def test_error_carries_the_line_of_the_key(workspace):
    text = GOOD.replace("measure_steps = 5", "measure_steps = 0")
    path = write(workspace, text)
    with pytest.raises(ContractError) as info:
        load_contract(path)
    expected = text.splitlines().index("measure_steps = 0") + 1
    assert info.value.line == expected
    assert f"infrarsi.toml:{expected}:" in str(info.value)


def test_log_evidence_patterns_are_validated(workspace):
    base = GOOD.replace("timeout_s = 60", 'timeout_s = 60\nevidence = "log"')
    ok = load_contract(write(workspace, base + "\n[evidence.log]\nstep = 'iter (\\d+)'\nloss = 'loss ([0-9.]+)'\n"))
    assert ok.log_patterns == {"step": r"iter (\d+)", "loss": "loss ([0-9.]+)"}
    with pytest.raises(ContractError, match="exactly one capture group"):
        load_contract(write(workspace, base + "\n[evidence.log]\nstep = 'iter \\d+'\n"))
    with pytest.raises(ContractError, match="evidence.log.loss.*regular expression"):
        load_contract(write(workspace, base + "\n[evidence.log]\nstep = 'iter (\\d+)'\nloss = '(['\n"))


def test_auto_evidence_needs_a_python_script(workspace):
    text = GOOD.replace('command = ["python", "train.py"]', 'command = ["bash", "run.sh"]')
    text = text.replace("timeout_s = 60", 'timeout_s = 60\nevidence = "auto"')
    with pytest.raises(ContractError, match='evidence = "auto" needs'):
        load_contract(write(workspace, text))


def test_a_torchrun_launcher_wraps_the_command_for_the_user_and_the_runner(workspace):
    from infrarsi.contract import Candidate, launch_settings
    from infrarsi.runner import build_argv

    text = GOOD.replace("timeout_s = 60", 'timeout_s = 60\nlauncher = "torchrun"\nnproc_per_node = 4')
    contract = load_contract(write(workspace, text))
    assert contract.ranks == 4
    argv, env = launch_settings(contract, {"attention": "sdpa", "compile": "1"})
    assert argv == ["torchrun", "--nnodes=1", "--nproc_per_node=4", "train.py", "--attention", "sdpa"]
    assert env == {"TOY_COMPILE": "1"}
    run_argv, _ = build_argv(contract, Candidate(knobs={"attention": "sdpa"}))
    assert run_argv[:4] == [sys.executable, "-P", "-m", "torch.distributed.run"]
    assert "--max-restarts=0" in run_argv and run_argv[-3:] == ["train.py", "--attention", "sdpa"]
    auto = load_contract(write(workspace, text.replace("timeout_s = 60", 'timeout_s = 60\nevidence = "auto"')))
    run_argv, _ = build_argv(auto, Candidate(knobs={}))
    assert run_argv[-3:] == ["-m", "infrarsi.autoprobe", "train.py"]
    with pytest.raises(ContractError, match='evidence = "log" reads one process'):
        load_contract(write(workspace, text.replace("timeout_s = 60", 'timeout_s = 60\nevidence = "log"') + LOG_TABLE))


LOG_TABLE = "\n[evidence.log]\nstep = 'iter (\\d+)'\n"


def test_invalid_toml_and_missing_file(workspace):
    with pytest.raises(ContractError, match="not valid TOML.*line 1"):
        load_contract(write(workspace, "[task\nname = 1"))
    with pytest.raises(ContractError, match="no such contract file"):
        load_contract(workspace / "nope.toml")
    (workspace / "infrarsi.toml").write_bytes(b"\xff\xfe[task]")
    with pytest.raises(ContractError, match="UTF-8"):
        load_contract(workspace / "infrarsi.toml")


def test_cli_reports_a_contract_error_with_exit_2_and_no_traceback(workspace):
    path = write(workspace, GOOD.replace('baseline = "manual"', 'baseline = "flash"'))
    proc = subprocess.run(
        [sys.executable, "-m", "infrarsi.cli", "init", "--contract", str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "knobs.attention.baseline" in proc.stderr and "infrarsi.toml" in proc.stderr


_toml_values = st.recursive(
    st.one_of(st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=8)),
    lambda inner: st.lists(inner, max_size=3),
    max_leaves=6,
)


@st.composite
def near_contracts(draw) -> str:
    """Mostly-valid contracts with random keys, sections and values spliced in."""
    lines = GOOD.splitlines()
    for _ in range(draw(st.integers(0, 4))):
        index = draw(st.integers(0, len(lines)))
        key = draw(
            st.sampled_from(
                [
                    "name",
                    "command",
                    "timeout_s",
                    "flag",
                    "env",
                    "choices",
                    "baseline",
                    "editable",
                    "protected",
                    "warmup_steps",
                    "measure_steps",
                    "precision",
                    "require",
                    "file",
                    "memory_limit_mb",
                    "steps",
                    "seeds",
                    "seed_flag",
                    "tail",
                    "margin",
                    "x",
                ]
            )
        )
        value = draw(_toml_values)
        rendered = repr(value).replace("True", "true").replace("False", "false").replace("'", '"')
        lines.insert(
            index,
            draw(
                st.sampled_from(
                    [f"{key} = {rendered}", f"[{key}]", f"[[{key}]]", f"[knobs.{key}]", "[numerics.convergence]"]
                )
            ),
        )
    return "\n".join(lines)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.text(max_size=300), near_contracts()))
def test_arbitrary_toml_never_tracebacks(workspace, text):
    try:
        contract = parse_contract(text, workspace / "infrarsi.toml")
    except ContractError as exc:
        assert str(exc).startswith(str(workspace / "infrarsi.toml"))
    else:
        assert contract.task.command


LONG = GOOD.replace("[resources]", '[numerics.convergence]\nsteps = 70\nseed_flag = "--seed"\n\n[resources]')


def test_a_convergence_table_parses_and_launches_a_long_run_with_its_seed(workspace):
    from infrarsi.contract import Candidate, launch_command, long_run

    contract = load_contract(write(workspace, LONG))
    conv = contract.convergence
    assert (conv.steps, conv.seeds, conv.tail, conv.margin, conv.runs) == (70, 3, 0.2, None, 6)
    assert contract.numerics.loss_rtol == 1e-3  # the table is not a key of [numerics]
    long, who = long_run(contract, Candidate({"attention": "sdpa"}), seed=2)
    assert long.total_steps == 70 and long.timing.warmup_steps == 2
    assert long.task.timeout_s == pytest.approx(60 * 70 / 7)
    assert launch_command(long, who.knobs)["argv"][-4:] == ["--attention", "sdpa", "--seed", "2"]
    # Seed 0 is the job's own launch: no seed argument, as it runs without InfraRSI.
    _, first = long_run(contract, Candidate({"attention": "sdpa"}), seed=0)
    assert launch_command(long, first.knobs)["argv"][-2:] == ["--attention", "sdpa"]
    assert load_contract(write(workspace, GOOD)).convergence is None


@pytest.mark.parametrize(
    "old, new, key, words",
    [
        ("steps = 70", "steps = 7", "numerics.convergence.steps", "more than the short window"),
        ("steps = 70", "steps = 70\ntail = 1.5", "numerics.convergence.tail", "at most 1"),
        ("steps = 70", "steps = 70\nseeds = 1", "numerics.convergence.seeds", ">= 2"),
        ('seed_flag = "--seed"', 'seed_flag = "--attention"', "numerics.convergence.seed_flag", "knob 'attention'"),
        ('seed_flag = "--seed"', 'seed_env = "TOY_COMPILE"', "numerics.convergence.seed_env", "knob 'compile'"),
        ('seed_flag = "--seed"', 'seed_flag = "--seed"\nseed_env = "S"', "numerics.convergence", "exactly one"),
        ("steps = 70", "steps = 70\nmargin = 0", "numerics.convergence.margin", "> 0"),
        ("steps = 70", "stepz = 70", "numerics.convergence.stepz", "unknown key"),
    ],
)
def test_convergence_errors_name_the_key(workspace, old, new, key, words):
    with pytest.raises(ContractError) as err:
        load_contract(write(workspace, LONG.replace(old, new)))
    assert key in str(err.value) and words in str(err.value), str(err.value)


def test_a_tolerance_may_be_calibrated_and_verify_needs_the_calibration(workspace):
    from infrarsi._verify import rules_for
    from infrarsi.errors import UsageError

    text = GOOD.replace("loss_rtol = 1e-3", 'loss_rtol = "calibrated"')
    contract = load_contract(write(workspace, text))
    assert contract.numerics.loss_rtol == "calibrated" and contract.numerics.grad_norm_rtol == 1e-2
    with pytest.raises(UsageError, match="no calibration; run `infrarsi baseline --calibrate`"):
        rules_for(contract, {"step_time_s": {}})
    rules = rules_for(contract, {"calibration": {"loss_rtol": 2e-5, "grad_norm_rtol": 5e-5}})
    assert (rules.loss_rtol, rules.grad_norm_rtol) == (2e-5, 1e-2)  # only what the contract calls calibrated
    for bad in ('"calibrate"', "-1", '"1e-3"'):
        with pytest.raises(ContractError, match='numerics.loss_rtol: expected a finite number or "calibrated"|> 0'):
            load_contract(write(workspace, GOOD.replace("loss_rtol = 1e-3", f"loss_rtol = {bad}")))


def test_contract_reference_is_generated_from_the_schema():
    from pathlib import Path

    from infrarsi.contract._reference import contract_reference

    doc = Path(__file__).parent.parent / "docs" / "contract.md"
    assert doc.read_text() == contract_reference(), "run: python -m infrarsi.contract._reference > docs/contract.md"
