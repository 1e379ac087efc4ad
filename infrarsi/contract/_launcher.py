"""A job of several ranks: what `[task] launcher` asks of the command, how many ranks report,
and the launch a user sees (`torchrun --nnodes=N --nproc_per_node=M SCRIPT ...`).

The runner turns that launch into torchrun under its own interpreter (runner/_executor.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ["check_launcher", "check_nodes", "ranks", "launched"]


def check_launcher(task: Any, fail: Callable[..., Any]) -> None:
    """The launcher keys against the rest of ``[task]``; ``fail(table, key, message)`` raises."""
    if task.launcher == "none":
        for key in ("nproc_per_node", "nnodes"):
            if task.values[key] != 1:
                fail("task", key, f'{key} = {task.values[key]} needs a launcher (launcher = "torchrun")')
        return
    command = task.command
    script_form = len(command) >= 2 and command[0] == "python" and not command[1].startswith("-")
    module_form = len(command) >= 3 and command[:2] == ["python", "-m"]
    if not (script_form or module_form):
        fail(
            "task",
            "command",
            f'launcher = "{task.launcher}" needs a command of the form ["python", "SCRIPT", ...] or '
            f'["python", "-m", "MODULE", ...] (torchrun starts the interpreter itself), got {command!r}',
        )
    if task.evidence == "auto" and not script_form:
        fail("task", "command", 'evidence = "auto" runs a script: expected ["python", "SCRIPT", ...], not a module')
    if not sys.platform.startswith("linux"):
        fail("task", "launcher", "a launcher needs Linux: the kernel names the process (so the rank) of each receipt")
    if task.evidence == "log":
        fail(
            "task",
            "evidence",
            f'evidence = "log" reads one process\'s stdout; with launcher = "{task.launcher}" use "probe" or "auto"',
        )


def check_nodes(task: Any, executor: Any, fail: Callable[..., Any]) -> None:
    """``nnodes > 1`` needs the Slurm executor: the local one runs a job on this machine only."""
    if task.nnodes > 1 and executor.kind != "slurm":
        fail(
            "task",
            "nnodes",
            f'nnodes = {task.nnodes}: a job across several nodes needs [executor] kind = "slurm" '
            f"(or --executor slurm); the {executor.kind} executor runs a job on this machine only",
        )


def ranks(task: Any) -> int:
    """How many processes report receipts: 1, or every rank the launcher starts on every node."""
    return 1 if task.launcher == "none" else task.nproc_per_node * task.nnodes


def launched(task: Any, argv: list[str]) -> list[str]:
    """The contract's ``python SCRIPT ...`` as the launcher starts it (unchanged without one)."""
    if task.launcher != "torchrun":
        return argv
    return ["torchrun", f"--nnodes={task.nnodes}", f"--nproc_per_node={task.nproc_per_node}"] + argv[1:]
