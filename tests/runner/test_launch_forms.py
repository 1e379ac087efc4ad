"""Every launch form a knob can name, from the contract to the job's own argv: parsed, built
into the command line, and received by a real job that reads them the way single-file trainers
and Hydra apps do (tests/fixtures/keyvalue_job)."""

from __future__ import annotations

import random
import shutil
import string
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from infrarsi.contract import load_contract, parse_contract, resolve_candidate
from infrarsi.contract._launch import argument_key
from infrarsi.errors import ContractError
from infrarsi.runner import LocalExecutor, build_argv, parse_receipts

JOB = Path(__file__).resolve().parents[1] / "fixtures" / "keyvalue_job"


@pytest.fixture
def keyvalue(tmp_path) -> Path:
    dest = tmp_path / "keyvalue_job"
    shutil.copytree(JOB, dest)
    return dest / "infrarsi.toml"


@pytest.mark.parametrize(
    "settings_, argv, env",
    [
        (
            {},
            ["--lr=0.001", "trainer.precision=32-true", "--fused", "--batch_size=16", "--grad_accum=1"],
            {"KV_THREADS": "1"},
        ),
        (
            {
                "lr": "0.003",
                "precision": "bf16-mixed",
                "checkpointing": "on",
                "fused": "off",
                "threads": "2",
                "micro_batch": "4x4",
            },
            [
                "--lr=0.003",
                "trainer.precision=bf16-mixed",
                "--gradient_checkpointing",
                "--no-fused",
                "--batch_size=4",
                "--grad_accum=4",
            ],
            {"KV_THREADS": "2", "KV_ALLOC": "small"},
        ),
    ],
)
def test_each_form_builds_its_arguments(keyvalue, settings_, argv, env):
    contract = load_contract(keyvalue)
    built, variables = build_argv(contract, resolve_candidate(contract, settings_))
    assert built[1:] == ["train.py", *argv] and variables == env


def test_every_form_reaches_a_job_that_reads_key_value_arguments(keyvalue):
    """The job ends on any argument it can't read: a finished run is the proof, its meta the detail."""
    contract = load_contract(keyvalue)
    chosen = {
        "lr": "0.003",
        "precision": "bf16-mixed",
        "checkpointing": "on",
        "fused": "off",
        "threads": "2",
        "micro_batch": "4x4",
    }
    result = LocalExecutor().run(contract, {}, resolve_candidate(contract, chosen))
    assert result.status == "ok", result.detail
    meta = parse_receipts(result.receipts.decode().splitlines()).declared()
    assert meta["config"] == {
        "batch_size": 4,
        "grad_accum": 4,
        "lr": 0.003,
        "gradient_checkpointing": True,
        "fused": False,
        "overrides": {"trainer.precision": "bf16-mixed"},
    }
    assert meta["env"] == {"KV_THREADS": "2", "KV_ALLOC": "small"}


BASE = '[task]\nname = "t"\ncommand = ["python", "train.py"]\n[resources]\nmemory_limit_mb = 100\npeak_tflops = 1\n'
_TARGETS = ["--a", "--b", "--c", "x.y", "z"]  # few names, so knobs collide often
_ENVS = ["E1", "E2"]


@st.composite
def _knob(draw, index: int) -> str:
    form = draw(st.sampled_from(["flag", "equals", "override", "env", "switch", "set"]))
    choices = (
        ["on", "off"]
        if form == "switch"
        else draw(st.lists(st.sampled_from(["1", "2", "3", "4"]), min_size=1, max_size=3, unique=True))
    )
    lines = [f"[knobs.k{index}]", f"choices = {choices!r}".replace("'", '"'), f'baseline = "{choices[0]}"']
    flag = draw(st.sampled_from([t for t in _TARGETS if t.startswith("-")]))
    if form in ("flag", "equals"):
        lines.append(f'flag = "{flag}"' + ('\nform = "equals"' if form == "equals" else ""))
    elif form == "override":
        lines.append(f'override = "{draw(st.sampled_from(["x.y", "z"]))}"')
    elif form == "env":
        lines.append(f'env = "{draw(st.sampled_from(_ENVS))}"')
    elif form == "switch":
        lines.append(f'switch = "{flag}"')
        if draw(st.booleans()):
            lines.append(f'negation = "--no{flag[1:]}"')
    else:
        for choice in choices:
            args = draw(st.lists(st.sampled_from(_TARGETS), max_size=2, unique=True))
            rendered = ", ".join(
                f'"{a}={choice}"' if not a.startswith("-") or draw(st.booleans()) else f'"{a}", "{choice}"'
                for a in args
            )
            env = draw(st.sampled_from(["", f'env = {{ {draw(st.sampled_from(_ENVS))} = "{choice}" }}']))
            lines.append(f'set."{choice}" = {{ args = [{rendered}]' + (f", {env}" if env else "") + " }")
    return "\n".join(lines) + "\n"


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_same_settings_same_argv_and_no_two_knobs_set_one_argument(tmp_path_factory, data):
    count = data.draw(st.integers(1, 4))
    text = BASE + "".join(data.draw(_knob(i)) for i in range(count))
    folder = tmp_path_factory.mktemp("forms")
    (folder / "train.py").write_text("")
    try:
        contract = parse_contract(text, folder / "infrarsi.toml")
    except ContractError as exc:
        assert exc.key and exc.key.startswith("knobs.k"), exc  # a clear error naming the knob
        return
    chosen = {name: data.draw(st.sampled_from(knob.choices)) for name, knob in contract.knobs.items()}
    shuffled = dict(random.Random(data.draw(st.integers())).sample(sorted(chosen.items()), len(chosen)))
    first = build_argv(contract, resolve_candidate(contract, chosen))
    assert build_argv(contract, resolve_candidate(contract, shuffled)) == first
    owner: dict[str, str] = {}
    for name, knob in contract.knobs.items():
        args, env = knob.settings(chosen[name])
        for key in [k for k in map(argument_key, args) if k] + [f"${v}" for v in env]:
            assert owner.setdefault(key, name) == name, f"{key} set by {owner[key]} and {name}"


@pytest.mark.parametrize(
    "knob, key, message",
    [
        ('flag = "--x"\nenv = "X"', "knobs.k.env", "exactly one of"),
        ('choices = ["1"]', "knobs.k", "exactly one of"),
        ('switch = "--x"', "knobs.k.choices", '"on" and "off"'),
        ('flag = "--x"\nnegation = "--no-x"', "knobs.k.negation", "only with `switch`"),
        ('env = "X"\nform = "equals"', "knobs.k.form", "only with `flag`"),
        ('flag = "--x"\nform = "joined"', "knobs.k.form", "separate, equals"),
        ('flag = "x"', "knobs.k.flag", "a flag like --name"),
        ('override = "--x"', "knobs.k.override", "a key like"),
        ('set."1" = { args = ["--a=1"] }', "knobs.k.set", "missing ['2']"),
        ('set."1" = { args = ["--a=1", "--a=2"] }\nset."2" = {}', "knobs.k.set.1.args", "the same argument twice"),
        ('set."1" = { env = { INFRARSI_X = "1" } }\nset."2" = {}', "knobs.k.set.1.env", "INFRARSI_"),
        ('set."1" = { args = "--a" }\nset."2" = {}', "knobs.k.set.1.args", "a list of non-empty strings"),
    ],
)
def test_a_bad_launch_form_is_an_error_naming_the_key(tmp_path, knob, key, message):
    choices = "" if "choices" in knob else 'choices = ["1", "2"]\n'
    if "switch" in knob:
        choices = 'choices = ["1", "2"]\n'
    text = BASE + f'[knobs.k]\n{choices}baseline = "1"\n{knob}\n'
    (tmp_path / "train.py").write_text("")
    with pytest.raises(ContractError) as caught:
        parse_contract(text, tmp_path / "infrarsi.toml")
    assert caught.value.key == key and message in str(caught.value), str(caught.value)


def test_argument_keys():
    assert [argument_key(t) for t in ["--lr", "--lr=3", "3", "trainer.lr=3", "+trainer.lr=3", "~trainer.lr", "-x"]] == [
        "--lr",
        "--lr",
        None,
        "trainer.lr",
        "trainer.lr",
        "trainer.lr",
        "-x",
    ]
    assert all(argument_key(f"--{name}=v") == f"--{name}" for name in string.ascii_lowercase)
