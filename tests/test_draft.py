"""`infrarsi draft -- python train.py ARGS...`: a contract `init` accepts, for scripts it has never
seen: every bundled example, and each argument style (argparse, HfArgumentParser, --key=value
globals, Hydra)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from infrarsi import draft, init, load_contract
from infrarsi.contract import launch_settings
from infrarsi.errors import UsageError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _example(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    shutil.copytree(EXAMPLES / name, folder, ignore=shutil.ignore_patterns(".infrarsi", "__pycache__"))
    (folder / "infrarsi.toml").unlink()
    return folder


def _cli_draft(folder: Path, *command: str) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "infrarsi.cli", "draft", "--json", "--", *command],
        capture_output=True,
        text=True,
        cwd=folder,
        timeout=120,
    )
    return proc, json.loads(proc.stdout) if proc.stdout.strip() else {}


def _argv(contract_path: Path, **knobs: str) -> list[str]:
    contract = load_contract(contract_path)
    return launch_settings(contract, {**contract.baseline_knobs(), **knobs})[0]


def test_tinygpt_draft_finds_its_flags_and_environment_knobs_and_init_accepts_it(tmp_path):
    folder = _example(tmp_path, "tinygpt")
    proc, out = _cli_draft(folder, "python", "train.py")
    assert proc.returncode == 0, proc.stderr
    assert out["style"] == "argparse" and out["command"] == ["python", "train.py"]
    knobs = out["knobs"]
    assert knobs["attention"]["choices"] == ["manual", "sdpa"] and knobs["attention"]["baseline"] == "manual"
    assert knobs["checkpointing"]["choices"] == ["on", "off"]
    assert knobs["micro_batch"]["choices"] == ["4", "8", "16"] and knobs["micro_batch"]["baseline"] == "16"
    assert knobs["compile"]["choices"] == ["0", "1"]  # TINYGPT_COMPILE, read from os.environ
    assert out["editable"] == ["train.py", "model.py"] and out["protected"] == ["data/**"]
    done = init(folder / "infrarsi.toml")
    assert any(path.startswith("data/") for path in done.pinned)


def test_a_torchrun_launch_drafts_a_launcher_with_its_ranks_and_init_accepts_it(tmp_path):
    folder = _example(tmp_path, "tinygpt")
    proc, out = _cli_draft(
        folder, "torchrun", "--standalone", "--nproc_per_node", "2", "train_ddp.py", "--micro-batch", "8"
    )
    assert proc.returncode == 0, proc.stderr
    assert out["launcher"] == {"kind": "torchrun", "nproc_per_node": 2, "nnodes": 1}
    assert out["command"] == ["python", "train_ddp.py", "--micro-batch", "8"]
    init(folder / "infrarsi.toml")
    contract = load_contract(folder / "infrarsi.toml")
    assert contract.ranks == 2
    assert _argv(folder / "infrarsi.toml") == [
        "torchrun",
        "--nnodes=1",
        "--nproc_per_node=2",
        "train_ddp.py",
        "--micro-batch",
        "8",
    ]
    for bad, words in (
        (["torchrun", "--nnodes=1:4", "--nproc_per_node=2", "train_ddp.py"], "a fixed number of nodes"),
        (["torchrun", "--nproc-per-node=gpu", "train_ddp.py"], "number of ranks"),
    ):
        proc, _ = _cli_draft(folder, *bad)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr


def test_a_torchrun_launch_across_nodes_drafts_the_slurm_executor(tmp_path):
    folder = _example(tmp_path, "tinygpt")
    proc, out = _cli_draft(folder, "torchrun", "--nnodes", "2:2", "--nproc_per_node=2", "train_ddp.py")
    assert proc.returncode == 0, proc.stderr
    assert out["launcher"] == {"kind": "torchrun", "nproc_per_node": 2, "nnodes": 2}
    init(folder / "infrarsi.toml")
    contract = load_contract(folder / "infrarsi.toml")
    assert contract.ranks == 4 and contract.executor.kind == "slurm"
    assert _argv(folder / "infrarsi.toml")[:3] == ["torchrun", "--nnodes=2", "--nproc_per_node=2"]


def test_single_file_gpt_draft_reads_its_config_file_and_key_value_arguments(tmp_path):
    folder = _example(tmp_path, "single-file-gpt")
    proc, out = _cli_draft(
        folder, "python", "train.py", "config/small.py", "--batch_size=8", "--gradient_accumulation_steps=2"
    )
    assert proc.returncode == 0, proc.stderr
    assert out["style"] == "globals"
    # The knob took its two arguments over; the config file stays in the command.
    assert out["command"] == ["python", "train.py", "config/small.py"]
    assert out["knobs"]["micro_batch"]["baseline"] == "8x2" and "4x4" in out["knobs"]["micro_batch"]["choices"]
    assert out["knobs"]["attention"]["choices"] == ["manual", "sdpa"]
    assert out["protected"] == ["config/**"] and out["editable"] == ["train.py"]
    contract = folder / "infrarsi.toml"
    init(contract)
    argv = _argv(contract, micro_batch="4x4")
    assert argv[:3] == ["python", "train.py", "config/small.py"]
    assert {"--batch_size=4", "--gradient_accumulation_steps=4"} <= set(argv) and "--batch_size=16" not in argv
    assert "--attention=sdpa" in _argv(contract, attention="sdpa")
    # Refuses to overwrite what is there.
    again, _ = _cli_draft(folder, "python", "train.py")
    assert again.returncode == 2 and "exists" in again.stderr


def test_hf_argument_parser_script_gets_training_arguments_knobs_with_liger_and_tf32_commented_out(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "train.py").write_text(
        textwrap.dedent(
            """
            from dataclasses import dataclass, field
            from transformers import HfArgumentParser, Trainer, TrainingArguments

            @dataclass
            class ModelArguments:
                attn_implementation: str = field(default="eager")
                hidden_size: int = 64

            parser = HfArgumentParser((ModelArguments, TrainingArguments))
            model_args, training_args = parser.parse_args_into_dataclasses()
            """
        )
    )
    (folder / "data").mkdir()
    args = ["--output_dir", "out", "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2"]
    result = draft(["python", str(folder / "train.py"), *args])
    assert result.style == "hf"
    knobs = {k.name: k for k in result.knobs}
    assert knobs["micro_batch"].baseline == "4x2" and knobs["micro_batch"].sets["8x1"] == [
        "--per_device_train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "1",
    ]
    assert knobs["attention"].choices == ["eager", "sdpa"]
    assert knobs["checkpointing"].option == "--gradient_checkpointing" and knobs["checkpointing"].baseline == "False"
    assert knobs["compile"].option == "--torch_compile"
    assert knobs["optimizer"].choices == ["adamw_torch", "adamw_torch_fused"]
    assert knobs["liger"].disabled and knobs["tf32"].disabled and "precision" in knobs["tf32"].disabled
    assert result.command == ["python", "train.py", "--output_dir", "out"]
    text = result.contract.read_text()
    assert "# [knobs.tf32]" in text and "\n[knobs.liger]" not in text
    contract = load_contract(result.contract)
    assert "tf32" not in contract.knobs and "micro_batch" in contract.knobs


def test_hydra_app_gets_override_knobs_from_its_config(tmp_path):
    folder = tmp_path / "hydra"
    (folder / "conf").mkdir(parents=True)
    (folder / "train.py").write_text(
        textwrap.dedent(
            """
            import hydra

            @hydra.main(config_path="conf", config_name="config", version_base=None)
            def main(cfg):
                pass

            if __name__ == "__main__":
                main()
            """
        )
    )
    (folder / "conf" / "config.yaml").write_text(
        "defaults:\n  - _self_\ntrainer:\n  batch_size: 16  # per device\n  grad_accum: 1\n"
        "  compile: false\nmodel:\n  attention: eager\n  layers: 2\n"
    )
    result = draft(["python", str(folder / "train.py"), "trainer.compile=true"])
    assert result.style == "hydra"
    knobs = {k.name: k for k in result.knobs}
    assert knobs["micro_batch"].sets["4x4"] == ["trainer.batch_size=4", "trainer.grad_accum=4"]
    assert knobs["compile"].form == "override" and knobs["compile"].baseline == "true"
    assert knobs["attention"].option == "model.attention" and knobs["attention"].choices == ["eager", "sdpa"]
    assert result.command == ["python", "train.py"] and result.protected == ["conf/**"]
    init(result.contract)


def test_argparse_switches_become_switch_knobs(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import argparse\np = argparse.ArgumentParser()\n"
        "p.add_argument('--gradient-checkpointing', action='store_true')\n"
        "p.add_argument('--compile', action=argparse.BooleanOptionalAction, default=True)\n"
        "p.add_argument('--num-workers', type=int, default=0)\n"
        "p.parse_args()\n"
    )
    result = draft(["python", str(script), "--gradient-checkpointing"])
    knobs = {k.name: k for k in result.knobs}
    assert knobs["checkpointing"].form == "switch" and knobs["checkpointing"].baseline == "on"
    assert knobs["compile"].negation == "--no-compile" and knobs["compile"].baseline == "on"
    assert knobs["workers"].choices == ["0", "2", "4"]
    assert result.command == ["python", "train.py"]
    argv = _argv(result.contract, checkpointing="off", compile="off", workers="2")
    assert argv == ["python", "train.py", "--no-compile", "--num-workers", "2"], argv
    assert "--gradient-checkpointing" in _argv(result.contract)


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ([], "no command"),
        (["python", "-m", "trainer"], "a module"),
        (["torchrun", "x.sh"], "expected a Python script"),
        (["python", "missing.py"], "no such script"),
    ],
)
def test_bad_commands_are_usage_errors(tmp_path, command, expected):
    with pytest.raises(UsageError, match=expected):
        draft(command, out=tmp_path / "c.toml")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=300))
def test_any_source_text_gives_a_contract_or_a_usage_error(tmp_path, source):
    script = tmp_path / "train.py"
    script.write_text(source, encoding="utf-8")
    try:
        result = draft(["python", str(script)], out=tmp_path / "drafted.toml", force=True)
    except UsageError:
        return
    load_contract(result.contract)  # whatever it found, the contract it wrote is valid


def _script(tmp_path: Path, source: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def test_a_bare_hf_bool_flag_is_true_and_takes_no_value(tmp_path):
    script = _script(tmp_path, "from transformers import HfArgumentParser\nHfArgumentParser(()).parse_args()\n")
    result = draft(["python", str(script), "--gradient_checkpointing", "--output_dir", "out"])
    knobs = {k.name: k for k in result.knobs}
    assert knobs["checkpointing"].baseline == "True"
    assert result.command == ["python", "train.py", "--output_dir", "out"]


def test_training_arguments_built_in_code_are_not_command_line_knobs(tmp_path):
    script = _script(
        tmp_path,
        """
        import argparse
        from transformers import Trainer, TrainingArguments
        p = argparse.ArgumentParser()
        p.add_argument("-b", "--batch-size", type=int, default=8)
        p.add_argument("--checkpoint", type=str, default=None, help="resume from here")
        p.add_argument("--optim", default="adam")
        p.add_argument("--compile", action="store_const", const=True)
        args = p.parse_args()
        TrainingArguments(per_device_train_batch_size=args.batch_size, output_dir="out")
        """,
    )
    result = draft(["python", str(script), "-b", "32", "--checkpoint", "ckpt.pt"])
    assert result.style == "argparse"
    names = {k.name for k in result.knobs}
    assert names.isdisjoint({"checkpointing", "optimizer", "compile", "micro_batch"}), result.knobs
    # The short option is the script's batch size: left in the command, as given.
    assert result.command == ["python", "train.py", "-b", "32", "--checkpoint", "ckpt.pt"]


def test_environment_variables_are_knobs_by_their_last_words_and_only_as_switches(tmp_path):
    script = _script(
        tmp_path,
        """
        import os
        a = os.environ.get("CHECKPOINT_DIR", "/tmp")
        b = os.environ.get("ATTENTION_DROPOUT", 0)
        c = os.environ.get("MY_COMPILE", "0")
        d = os.environ.get("DATALOADER_WORKERS", "4")
        """,
    )
    result = draft(["python", str(script)])
    assert [(k.name, k.option, k.choices) for k in result.knobs] == [("compile", "MY_COMPILE", ["0", "1"])]
    assert result.notes == [], "a variable that is no switch is not a knob, and not a note either"


def test_short_options_and_interpreter_options_are_understood(tmp_path):
    script = _script(
        tmp_path,
        """
        import argparse
        p = argparse.ArgumentParser()
        p.add_argument("-a", "--attention", choices=["math", "flash"], default="math")
        p.add_argument("-w", "--num-workers", default="auto")
        p.parse_args()
        """,
    )
    result = draft(["python", "-W", "ignore", str(script), "-a", "flash", "-w", "auto"])
    knobs = {k.name: k for k in result.knobs}
    assert knobs["attention"].baseline == "flash" and "workers" not in knobs
    assert result.command == ["python", "-W", "ignore", "train.py", "-w", "auto"]
    init(result.contract)


def test_odd_arguments_file_names_and_encodings_still_give_a_valid_contract(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "loader.py").write_text("def load():\n    return []\n")
    (tmp_path / "outside.txt").write_text("x")
    script = tmp_path / "train.py"
    script.write_bytes(
        "# -*- coding: latin-1 -*-\nimport argparse\nfrom data.loader import load\nname = 'caf\xe9'\n"
        "p = argparse.ArgumentParser()\np.add_argument('--attention', default='eager')\np.parse_args()\n".encode(
            "latin-1"
        )
    )
    args = ["--attention", "a\nb \U0001f600", str(tmp_path / "outside.txt"), "../elsewhere.txt", "--tag=\x7f"]
    result = draft(["python", str(script), *args])
    contract = load_contract(result.contract)
    assert contract.knobs["attention"].baseline == "a\nb \U0001f600"
    assert "data/loader.py" not in result.editable and "data/**" in result.protected
    init(result.contract)


@pytest.mark.parametrize(
    ("out", "expected"),
    [("sub/x.toml", "beside the script"), ("train.py", "expected a .toml"), ("folder.toml", "is a folder")],
)
def test_the_output_path_is_a_new_toml_file_beside_the_script(tmp_path, out, expected):
    script = _script(tmp_path, "print('hi')\n")
    (tmp_path / "folder.toml").mkdir()
    with pytest.raises(UsageError, match=expected):
        draft(["python", str(script)], out=tmp_path / out, force=True)
    assert script.read_text() == "print('hi')\n"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(args=["\x00"])  # found by hypothesis: a NUL in an argument once raised from pathlib
@given(
    st.lists(
        st.one_of(
            st.sampled_from(["--batch_size", "--gradient_accumulation_steps", "--compile", "-b", "--attention"]),
            st.text(max_size=12),
        ),
        max_size=8,
    )
)
def test_any_arguments_give_a_contract_or_a_usage_error(tmp_path, args):
    script = tmp_path / "train.py"
    script.write_text(
        "import argparse\np = argparse.ArgumentParser()\np.add_argument('-b', '--batch_size', type=int, default=8)\n"
        "p.add_argument('--gradient_accumulation_steps', type=int, default=2)\n"
        "p.add_argument('--compile', action='store_true')\np.add_argument('--attention', default='eager')\n"
    )
    try:
        result = draft(["python", str(script), *args], out=tmp_path / "drafted.toml", force=True)
    except UsageError:
        return
    load_contract(result.contract)
