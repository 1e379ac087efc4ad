"""`infrarsi draft -- python train.py ARGS...`: a commented contract for a script never seen before.
A job launched as ``torchrun --nproc_per_node=N train.py ARGS`` gets ``launcher = "torchrun"``.

The script is read with libcst, never run: its argument style, the well-known training
settings it reads (the catalog), the local modules it imports. The draft proposes knobs with
their real choices, guesses the scope (the script and its local modules editable; data, eval
and config files protected), chooses ``evidence = "auto"`` with a window, and says what it
guessed and why. `infrarsi init` then validates it as any contract.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from infrarsi._draft._catalog import Knob, propose
from infrarsi._draft._reading import read_script
from infrarsi._draft._render import render
from infrarsi._draft._scope import guess_scope
from infrarsi.errors import UsageError
from infrarsi.runner import OPTIONS_WITH_VALUE

__all__ = ["Draft", "draft"]


@dataclass
class Draft:
    contract: Path
    script: str  # relative to the workspace
    style: str
    command: list[str]
    knobs: list[Knob]
    editable: list[str]
    protected: list[str]
    why: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    launcher: str = "none"  # "torchrun" where the job was launched by torchrun
    ranks: int = 1  # its nproc_per_node
    nodes: int = 1  # its nnodes (more than one: the Slurm executor)

    def to_json(self) -> dict:
        return {
            "contract": str(self.contract),
            "launcher": {"kind": self.launcher, "nproc_per_node": self.ranks, "nnodes": self.nodes}
            if self.launcher != "none"
            else None,
            "style": self.style,
            "command": self.command,
            "knobs": {
                k.name: {"choices": k.choices, "baseline": k.baseline, "enabled": not k.disabled, "why": k.why}
                for k in self.knobs
            },
            "editable": self.editable,
            "protected": self.protected,
            "why": self.why,
            "notes": self.notes,
        }


_TORCHRUN_FLAGS = frozenset({"--standalone", "--no-python", "--no_python", "--run-path", "--run_path"})


def _torchrun(words: list[str]) -> tuple[int, int, list[str]]:
    """(ranks a node, nodes, the rest) of ``torchrun [OPTIONS] SCRIPT ARGS`` (or ``python -m
    torch.distributed.run``); (0, 1, words) for any other command. The rest starts at the
    script, as ``python`` would run it."""
    if words and Path(words[0]).name == "torchrun":
        rest = words[1:]
    elif len(words) >= 3 and Path(words[0]).name.startswith("python") and words[1:3] == ["-m", "torch.distributed.run"]:
        rest = words[3:]
    else:
        return 0, 1, words
    ranks, nodes = 1, 1
    while rest and rest[0].startswith("-") and rest[0] not in ("-m", "--module"):
        option = rest.pop(0)
        name, _, value = option.partition("=")
        if not value and name not in _TORCHRUN_FLAGS and rest:
            value = rest.pop(0)
        if name in ("--nproc_per_node", "--nproc-per-node"):
            if not value.isdigit() or int(value) < 1:
                raise UsageError(f"draft: torchrun {name} {value!r}: expected a number of ranks on this node")
            ranks = int(value)
        elif name == "--nnodes":
            low, _, high = value.partition(":")
            if not low.isdigit() or int(low) < 1 or (high and high != low):
                raise UsageError(
                    f"draft: torchrun --nnodes {value!r}: expected a fixed number of nodes "
                    "(an elastic range is not one job InfraRSI can time)"
                )
            nodes = int(low)
    return ranks, nodes, ["python", *rest]


def _split_command(command: list[str]) -> tuple[list[str], Path, list[str], int, int]:
    """(interpreter words, the script, its arguments, torchrun's ranks a node or 0, its nodes) of
    ``python [-u] train.py ARGS`` or ``torchrun [OPTIONS] train.py ARGS``."""
    words = list(command)
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        raise UsageError("draft: no command given: expected `infrarsi draft -- python train.py ARGS...`")
    ranks, nodes, words = _torchrun(words)
    head = []
    if Path(words[0]).name.startswith("python"):
        head.append("python")
        words = words[1:]
        while words and words[0].startswith("-") and words[0] != "-m":
            option = words.pop(0)
            head.append(option)
            if option in OPTIONS_WITH_VALUE and words:
                head.append(words.pop(0))
    if not words or words[0] == "-m" or not words[0].endswith(".py"):
        raise UsageError(
            f"draft: {' '.join(command)!r}: expected a Python script (`python train.py ARGS...`); "
            "a module (`-m`) or another program can't be read"
        )
    if ranks and head != ["python"]:
        raise UsageError(
            f"draft: {' '.join(command)!r}: torchrun starts the interpreter itself; no options before the script"
        )
    return head or ["python"], Path(words[0]), words[1:], ranks, nodes


def _output_path(out: Path, script: Path, force: bool) -> Path:
    """Where the contract goes: in the script's folder (the workspace), never over a source file."""
    if not out.is_absolute() and out.parent == Path("."):
        out = script.parent / out
    out = out.resolve()
    if out.parent != script.parent:
        raise UsageError(
            f"draft: --out {out}: the contract must be written beside the script ({script.parent}), "
            "whose folder is the workspace its command and scope are relative to"
        )
    if out.is_dir():
        raise UsageError(f"draft: --out {out} is a folder; expected a file name such as infrarsi.toml")
    if out.suffix != ".toml":
        raise UsageError(f"draft: --out {out.name}: expected a .toml file name")
    if out.exists() and not force:
        raise UsageError(f"draft: {out} exists; pass --force to overwrite it")
    return out


def _apply_config_files(facts, args: list[str]) -> None:
    """A configurator script exec's the config files it is given over its globals: their literal
    assignments are the values the run starts from (before any --key=value)."""
    import ast

    for arg in args:
        path = facts.script.parent / arg
        if arg.startswith("-") or not arg.endswith(".py") or not path.is_file():
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            facts.why.append(f"{arg}: not valid Python; its settings are not read")
            continue
        changed = []
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                setting = facts.settings.get(node.targets[0].id)
                try:
                    value = ast.literal_eval(node.value)
                except (ValueError, SyntaxError, TypeError):
                    continue
                if setting is not None and isinstance(value, (bool, int, float, str)):
                    setting.default, setting.origin = str(value), f"{arg} over globals"
                    changed.append(setting.name)
        if changed:
            facts.why.append(f"{arg} (exec'd by the script) sets {', '.join(changed)}")


def draft(command: list[str], out: str | Path = "infrarsi.toml", force: bool = False) -> Draft:
    """Read the script of ``command`` and write a commented contract to ``out``.

    The workspace is the script's folder; ``out`` is written there unless it is absolute or
    names another folder. Refuses to overwrite ``out`` unless ``force``.
    """
    if any(0xD800 <= ord(ch) <= 0xDFFF or ch == "\x00" for word in command for ch in word):
        raise UsageError("draft: the command has bytes that are not text (a NUL, or undecodable file names)")
    head, script_arg, args, ranks, nodes = _split_command(command)
    script = script_arg.resolve()
    if not script.is_file():
        raise UsageError(f"draft: {script_arg}: no such script (expected a Python file to read)")
    out = _output_path(Path(out), script, force)
    try:
        facts = read_script(script)
    except cst.ParserSyntaxError as exc:
        raise UsageError(f"draft: {script}: not valid Python ({exc.message} at line {exc.raw_line})") from exc
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:  # UnicodeDecodeError is a ValueError
        raise UsageError(f"draft: {script}: can't be read as Python source ({exc})") from exc
    if facts.style == "globals":
        _apply_config_files(facts, args)
    knobs, notes, consumed = propose(facts, args)
    kept = [a for i, a in enumerate(args) if i not in consumed]
    rel_script = script.relative_to(script.parent).as_posix()
    task_command = [*head, rel_script, *kept]
    editable, protected, scope_why = guess_scope(script, facts.local_imports, kept)
    why = list(facts.why) + [k.why for k in knobs] + scope_why
    if ranks and nodes > 1:
        why.append(
            f"launched by torchrun with {ranks} rank(s) on each of {nodes} nodes: "
            '[executor] kind = "slurm" runs it (docs/cluster.md)'
        )
    elif ranks:
        why.append(f'launched by torchrun with {ranks} rank(s) on one node: launcher = "torchrun"')
    launcher = "torchrun" if ranks else "none"
    result = Draft(
        out,
        rel_script,
        facts.style,
        task_command,
        knobs,
        editable,
        protected,
        why,
        notes,
        launcher,
        max(ranks, 1),
        nodes if ranks else 1,
    )
    out.write_text(render(result, script.parent.name or "job"), encoding="utf-8")
    return result
